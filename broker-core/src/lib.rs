//! What the edge agent and the broker both run (`broker_core`): the I/O
//! layer over the pure formats of [`tributary_proto`].
//!
//! - [`wal`]: the per-topic segmented write-ahead log (group commit,
//!   `fdatasync`, recovery, seal, retention);
//! - [`metadata`]: the `MetadataStore` trait and its embedded redb
//!   implementation (the broker's Raft store implements the same trait);
//! - [`catalog`]: creating, loading and describing intent-backed topics over
//!   any metadata store;
//! - [`clock`]: injected time (monotonic and wall clock) and a manual test clock;
//! - [`data_dir`]: whose a data directory is (`identity.json`), checked at
//!   start so a changed `node_id`/`edge_id` or another component's
//!   directory is refused;
//! - [`secrets`]: token and key files refused when world-readable,
//!   `$CREDENTIALS_DIRECTORY`;
//! - [`tls`]: certificates, identities and the rustls/quinn configurations;
//! - [`service`]: daemon helpers (logging, SIGTERM/SIGINT, systemd notify
//!   and watchdog);
//! - [`dev_certs`] (feature `dev-certs`): a development CA.
//!
//! The byte layouts are documented in `FORMAT.md` at the repository root;
//! the architecture in `docs/architecture.md`.
// One reviewed exception: `libc::sync_file_range` in the WAL's file storage
// (no safe binding exists in libc, nix or rustix).
#![deny(unsafe_code)]

pub mod catalog;
pub mod check;
pub mod client_cert;
pub mod clock;
pub mod data_dir;
#[cfg(feature = "dev-certs")]
pub mod dev_certs;
pub mod idempotency;
pub mod metadata;
pub mod secrets;
pub mod service;
pub mod tls;
pub mod wal;
