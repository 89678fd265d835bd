//! Tributary's core library: the record batch format shared by disk, wire and
//! archive ([`batch`]), its explicit size limits ([`limits`]) and the
//! per-topic segmented write-ahead log ([`wal`]).
//!
//! The byte layouts are documented in `broker-core/FORMAT.md`; the
//! architecture in `../shared/DESIGN.md`.
// One reviewed exception: `libc::sync_file_range` in the WAL's file storage
// (no safe binding exists in libc, nix or rustix).
#![deny(unsafe_code)]

pub mod archive;
pub mod batch;
pub mod catalog;
pub mod consumer_api;
#[cfg(feature = "consumer-client")]
pub mod consumer_client;
#[cfg(feature = "dev-certs")]
pub mod dev_certs;
pub mod dispatch;
pub mod intent;
pub mod keys;
pub mod limits;
pub mod metadata;
pub mod replication;
pub mod service;
pub mod tls;
pub mod varint;
pub mod wal;

pub use batch::{Codec, DecodeError, EncodeError, EncodedBatch, Record, RecordBatch};
pub use limits::Limits;
