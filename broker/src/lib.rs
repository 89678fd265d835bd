//! The Tributary broker as a library (the `broker` binary is a thin shell
//! over it, and the tests drive it directly).

pub mod admin;
pub mod config;
pub mod consumer;
mod http;
pub mod metrics;
pub mod raft;
pub mod replication;
pub mod server;
pub mod storage;
pub mod store;
