//! The Tributary broker as a library (the `broker` binary is a thin shell
//! over it, and the tests drive it directly).

pub mod raft;
pub mod store;
pub mod config;
