//! The Tributary tier service as a library (`tributary_tier`): moves sealed
//! WAL segments of a broker into object storage and records each one in
//! Raft through the broker, and reads the resulting archive.
//!
//! - [`archive format`](tributary_proto::archive): the object layout (pure,
//!   in broker-core), documented in `docs/archive-format.md`;
//! - [`bucket`]: a local directory or an S3-compatible bucket
//!   (`object_store`), with request counters;
//! - [`upload`]: streamed upload of a segment and verification of the
//!   stored object (steps 2–3 of the commit order);
//! - [`tiering`]: the commit order for every sealed segment (steps 1–5);
//! - [`cold`]: cold retention (age/size limits on the archive);
//! - [`owner`]: the archive prefix's owner cluster, claimed at start-up
//!   before anything else touches the bucket;
//! - [`reconcile`]: the start-up pass that makes bucket and descriptors
//!   agree;
//! - [`audit`]: the continuous archive audit (missing or damaged objects,
//!   marked in Raft and uploaded again from the local WAL where it can);
//! - [`broker_api`]: the broker admin API's storage endpoints;
//! - [`service`]: the process (lock, reconciliation, passes, shutdown);
//! - [`faults`]: crash injection for tests (`TRIB_TIER_FAULT`);
//! - [`metrics`]: `GET /metrics` (Prometheus) on `metrics_listen`.
//! - [`check`]: `tier-service check-config`.
//!
//! # Safety argument
//! A local segment is deleted only by the broker's retention, whose safe
//! offset the broker reads from Raft (the committed tiered offset), and a
//! descriptor is committed only after its object was stored and verified.
//! So every offset is, at every instant, in a local sealed segment, in a
//! committed object, or both. Object keys are deterministic and every step
//! is idempotent, so a crash between any two steps is repaired by running
//! again; reconciliation removes what a crash left half done.
#![forbid(unsafe_code)]

pub mod audit;
pub mod broker_api;
pub mod check;
pub mod cold;
pub mod config;
pub mod error;
pub mod faults;
pub mod lakehouse;
pub mod metrics;
pub mod owner;
pub mod reconcile;
pub mod service;
pub mod tiering;
pub mod upload;

pub use config::TierConfig;
pub use error::TierError;
pub use tiering::Tiering;
