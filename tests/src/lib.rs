//! Helpers shared by Tributary's end-to-end tests and their child processes.

pub mod cluster;
pub mod crash;
pub mod demo;
pub mod enroll;
pub mod fleet;
pub mod mqtt;
pub mod solo;
pub mod swarm;
