//! The Tributary broker as a library (the `broker` binary is a thin shell
//! over it, and the tests drive it directly).
//!
//! HTTP: [`admin`] (namespaces, topics, failure policies, manifests and
//! `apply`, cluster status), [`storage`] (the endpoints the tier service
//! calls, and local retention), [`consumer`] (the consumer API); request
//! parsing, the bearer-token check and the JSON error response are shared
//! in `http/`.
//!
//! Edges: [`replication`] (the QUIC ingest endpoint and the central topic
//! WALs it appends to), [`enroll`] (certificate enrollment and edge
//! revocation), [`fleet`] (which edges are connected, their offsets and
//! lag, shared through Raft).

pub mod admin;
pub mod auth;
pub mod budget;
pub mod check;
pub mod cluster;
pub mod config;
pub mod consumer;
pub mod enroll;
pub mod fleet;
mod http;
pub mod metrics;
pub mod raft;
pub mod replication;
pub mod server;
pub mod storage;
pub mod store;
