//! Tributary's pure core: the formats and protocols every other crate speaks,
//! with no runtime, socket, file system or clock.
//!
//! - [`batch`], [`varint`], [`limits`]: the record batch, the unit on disk,
//!   on the wire and in the archive, and its explicit size limits.
//! - [`archive`]: the self-describing segment object the tier service writes
//!   and every archive reader parses.
//! - [`keys`]: every metadata key path (`seeds/001_4a7643a8a6858094.txt`);
//!   no other code formats a key string.
//! - [`intent`], [`SyncMode`]: stream intents and their expanded settings
//!   (`seeds/000_d502aacc865e81b1.txt`).
//! - [`replication`]: the edge → broker wire frames and the two per-stream
//!   state machines ([`replication::edge::EdgeStream`], [`replication::ingest::IngestStream`]).
//! - [`cluster`]: topic ownership values under `/cluster/*` and the load
//!   manager's placement rules.
//! - [`dispatch`]: which consumer of a subscription gets which message.
//! - [`fleet`]: the brokers' records of their edges and the cluster-wide
//!   view of them (`tribctl edges list`).
//!
//! Everything here takes time as an argument (`now: Instant`, `now_ms: u64`)
//! and bytes as slices; `clippy.toml` beside this crate forbids reading the
//! clock or touching files, so a test can drive every rule deterministically.
//! The byte layouts are documented in `FORMAT.md` at the repository root.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod archive;
pub mod batch;
pub mod cluster;
pub mod dispatch;
pub mod fleet;
pub mod intent;
pub mod keys;
pub mod limits;
pub mod replication;
mod sync_mode;
pub mod varint;

pub use batch::{Codec, DecodeError, EncodeError, EncodedBatch, Record, RecordBatch};
pub use limits::Limits;
pub use sync_mode::SyncMode;
