//! The Tributary archive, read side (`tributary_archive`): where the tier
//! service's objects live and how anyone reads them back with no broker
//! running. Shared by the tier service (which writes through [`Bucket`]),
//! the broker (tiered reads for consumers) and `tribctl archive`.
//!
//! - [`bucket`]: a local directory or an S3-compatible bucket
//!   (`object_store`), with request counters;
//! - [`reader`]: listing, reading and verifying a bucket's segment objects;
//! - [`error`]: why a request failed ([`BucketError`]).
//!
//! The object layout itself is pure and lives in
//! [`tributary_proto::archive`]; it is documented in
//! `docs/archive-format.md`.
#![forbid(unsafe_code)]

pub mod bucket;
pub mod error;
pub mod owner;
pub mod reader;

pub use bucket::{Bucket, StoreConfig, install_crypto_provider};
pub use error::BucketError;
pub use reader::Archive;
