//! The Tributary broker as a library (the `broker` binary is a thin shell
//! over it, and the tests drive it directly).

pub mod admin;
pub mod config;
pub mod consumer;
pub mod metrics;
pub mod raft;
pub mod replication;
pub mod retention;
pub mod server;
pub mod store;

// `admin.rs` and `retention.rs` still name `crate::topics`; they are being
// re-cut on another branch. Drop this alias once they name
// `crate::replication::topics`.
pub(crate) use replication::topics;
