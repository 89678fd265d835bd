//! What Tributary's tests share (`tributary_test_support`). Never a
//! dependency of a shipped binary.
//!
//! - [`ports`]: free loopback ports;
//! - [`process`]: child processes of the real binaries (logs, readiness,
//!   SIGTERM, SIGKILL, bounded waits);
//! - [`certs`]: development certificates and identities;
//! - [`relay`]: the seeded lossy UDP relay (loss, delay, link cuts);
//! - [`loop_fs`]: a small ext4 file system on a loop device (a full disk);
//! - [`fault_proxy`]: an HTTP proxy in front of the S3 server that injects
//!   object-store faults;
//! - [`moto`]: the moto S3 server (`TRIB_TEST_MOTO_SERVER`), failing loudly
//!   when it is missing;
//! - [`python`]: a python with pyarrow and duckdb (`TRIB_TEST_PYTHON`)
//!   for reading Parquet back, failing loudly when it is missing;
//! - [`metadata_suite`]: the behaviour suite every `MetadataStore` passes;
//! - [`openmetrics`]: parses and checks a daemon's `/metrics` (OpenMetrics
//!   text, HELP sentences, one label set per family);
//! - [`loop_fs`]: a small loop-mounted ext4 filesystem to fill until
//!   `ENOSPC` and free again (needs root, mkfs.ext4, mount, losetup).
#![warn(missing_docs)]

pub mod certs;
pub mod fault_proxy;
pub mod loop_fs;
pub mod metadata_suite;
pub mod moto;
pub mod openmetrics;
pub mod ports;
pub mod process;
pub mod python;
pub mod relay;
pub mod tree;
