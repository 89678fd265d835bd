//! The metadata store: key → JSON value, with compare-and-swap, atomic
//! multi-key writes, prefix listing, prefix watches and keys with a TTL.
//!
//! Keys are built by [`tributary_proto::keys`] only. The central implementation is
//! the broker's openraft state machine; the edge agent and tests use the
//! embedded [`redb::RedbStore`]. One behavioural suite for any
//! implementation lives in `tributary_test_support::metadata_suite`.
//!
//! # Contract of every implementation
//! - **Values are [`serde_json::Value`]s.** JSON is the stored form (the
//!   redb store keeps compact JSON bytes), so values are readable with any
//!   tool and typed access goes through [`MetadataStoreExt`]. Equality in
//!   preconditions is `serde_json::Value` equality (`1` and `1.0` differ).
//!   `null` is a value: a key holding `null` exists.
//! - **Keys** start with `/`, are at most [`MAX_KEY_BYTES`] bytes and
//!   contain no control characters; values are at most
//!   [`MAX_VALUE_BYTES`] bytes of compact JSON. A violation is an error
//!   before anything is written.
//! - **Acknowledged means durable.** A write's future resolves `Ok` only
//!   after the write survives a crash of the process (and, for the redb
//!   store, power loss). A write whose future is dropped may or may not be
//!   applied.
//! - **Linearizable.** Writes apply one at a time in a single total order;
//!   a read that starts after a write resolved sees it (or a later value).
//! - **Transactions are all or nothing.** Every precondition is checked
//!   against the state before the transaction; if all hold, every op
//!   applies in order, else none does. At most [`MAX_TXN_OPS`] ops plus
//!   preconditions.
//! - **Listing** returns live keys starting with the prefix (a plain string
//!   prefix, so `/a/b` also matches `/a/bc`; end prefixes with `/` to list a
//!   directory), sorted by key bytes.
//! - **Watches** deliver, in commit order, a [`WatchEvent`] for every put
//!   and every removal of a stored entry under the prefix by a write that
//!   commits after `watch` resolved; the events of a write are queued before
//!   the write's future resolves. Transactions produce one event per op, in
//!   op order; a delete of a missing key produces none. Watchers that fall
//!   more than [`WATCH_CHANNEL_CAPACITY`] events behind get
//!   [`WatchError::Lagged`] and should re-list. To miss nothing, watch first,
//!   then list.
//! - **TTL.** `put_with_ttl` stores `expires_at_ms = now + ttl_ms` using the
//!   store's [`crate::clock::Clock`]. From `expires_at_ms` on, the key is
//!   absent for get, list, compare-and-swap and preconditions. It is physically removed,
//!   with a [`WatchEvent::Delete`], by [`MetadataStore::purge_expired`]
//!   (which the owner calls periodically) or by a later write to the key. A
//!   plain put removes a key's TTL. Expired keys are purged in key order.

pub mod redb;
mod txn;
mod watch;

use std::future::Future;
use std::pin::Pin;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

pub use txn::{CasOutcome, EncodedOp, Precondition, Txn, TxnOutcome, ValidatedTxn, WriteOp};
pub use watch::{Watch, WatchError, WatchEvent, WatchHub};

/// Longest key, bytes.
pub const MAX_KEY_BYTES: usize = 1024;
/// Largest value as compact JSON, bytes (1 MiB).
pub const MAX_VALUE_BYTES: usize = 1024 * 1024;
/// Most preconditions plus ops in one transaction. Large enough to create a
/// topic with hundreds of partitions in one write.
pub const MAX_TXN_OPS: usize = 4096;
/// Events a watcher may fall behind before it lags.
pub const WATCH_CHANNEL_CAPACITY: usize = 8192;
// An idle watcher never lags on a single transaction.
const _: () = assert!(WATCH_CHANNEL_CAPACITY >= 2 * MAX_TXN_OPS);

/// A boxed, sendable future: what the dyn-compatible trait methods return.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

/// Errors of metadata operations.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MetadataError {
    /// A key or prefix that breaks the key rules.
    #[error("invalid metadata key {key:?}: {reason}")]
    InvalidKey {
        /// The key.
        key: String,
        /// Which rule.
        reason: &'static str,
    },
    /// A value over [`MAX_VALUE_BYTES`].
    #[error("value of {key:?} is {bytes} bytes of JSON; at most {max}")]
    ValueTooLarge {
        /// The key.
        key: String,
        /// Encoded size, bytes.
        bytes: usize,
        /// The limit, bytes.
        max: usize,
    },
    /// A TTL of 0 ms.
    #[error("ttl of {key:?} must be above 0 ms")]
    ZeroTtl {
        /// The key.
        key: String,
    },
    /// A transaction over [`MAX_TXN_OPS`].
    #[error("transaction has {count} preconditions and ops; at most {max}")]
    TooManyOps {
        /// Preconditions plus ops.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// A typed value that does not encode as JSON.
    #[error("value for {key:?} does not encode as JSON: {source}")]
    Encode {
        /// The key.
        key: String,
        /// The serde error.
        source: serde_json::Error,
    },
    /// A stored value that does not decode as the requested type.
    #[error("value of {key:?} does not decode as the requested type: {source}")]
    Decode {
        /// The key.
        key: String,
        /// The serde error.
        source: serde_json::Error,
    },
    /// Stored bytes that are not JSON: the store is damaged.
    #[error("stored value of {key:?} is not valid JSON: {source}")]
    Corrupt {
        /// The key.
        key: String,
        /// The parse error.
        source: serde_json::Error,
    },
    /// The store's on-disk format is not this version's.
    #[error("metadata store format version {found} is not supported (this build reads {expected})")]
    UnsupportedFormat {
        /// Version found in the file.
        found: u64,
        /// Version this build reads and writes.
        expected: u64,
    },
    /// The storage backend failed (corruption found while reading,
    /// consensus, a lock held by another process). I/O failures of the redb
    /// store are [`MetadataError::Storage`].
    #[error("metadata backend failed to {op}: {source}")]
    Backend {
        /// What was attempted.
        op: &'static str,
        /// The backend's error.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The store's file could not be written (or read): its filesystem is
    /// full (`disk_full`) or an I/O operation failed. The embedded redb
    /// store reopens its file by itself at the next write after such a
    /// failure, so writes resume once the cause is gone (space freed); reads
    /// keep working meanwhile wherever the file can still be read.
    #[error(
        "metadata store {}: {} while trying to {op}: {source}",
        path.display(),
        if *disk_full { "no space left on the filesystem" } else { "I/O failure" }
    )]
    Storage {
        /// The store's file.
        path: std::path::PathBuf,
        /// What was attempted.
        op: &'static str,
        /// Whether the cause is a full filesystem (`ENOSPC`, or a quota).
        disk_full: bool,
        /// The backend's error.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The store's file is damaged: it cannot be opened (bad header,
    /// truncated, checksums that do not match), or it opens but its tables
    /// cannot be read. Opening with
    /// [`redb::RedbStore::open_or_recover`] moves such a file aside and
    /// starts a fresh one.
    #[error("metadata store {} is damaged: {reason}", path.display())]
    Damaged {
        /// The store's file.
        path: std::path::PathBuf,
        /// What was found.
        reason: String,
    },
    /// The store's file is open in another process: redb holds a lock on
    /// it, so a second agent (or broker) started on the same data directory
    /// stops here.
    #[error(
        "metadata store {} is in use by another process (another edge-agent or broker on the same data directory?): one process per data directory",
        path.display()
    )]
    InUse {
        /// The store's file.
        path: std::path::PathBuf,
    },
    /// An operation polled outside a tokio runtime.
    #[error("metadata operations must run inside a tokio runtime")]
    NoRuntime,
    /// The blocking task running an operation panicked or was cancelled.
    #[error("metadata {op} task failed: {reason}")]
    Task {
        /// The operation.
        op: &'static str,
        /// Why.
        reason: String,
    },
}

impl MetadataError {
    /// Whether the error says the store's filesystem is full (HTTP 507
    /// material rather than 500).
    pub fn is_disk_full(&self) -> bool {
        matches!(
            self,
            MetadataError::Storage {
                disk_full: true,
                ..
            }
        )
    }
}

/// Checks a key: starts with `/`, at most [`MAX_KEY_BYTES`], no control
/// characters.
///
/// # Errors
/// [`MetadataError::InvalidKey`] naming the rule.
pub fn validate_key(key: &str) -> Result<(), MetadataError> {
    let reason = if !key.starts_with('/') {
        "must start with '/'"
    } else if key.len() > MAX_KEY_BYTES {
        "longer than 1024 bytes"
    } else if key.chars().any(char::is_control) {
        "contains a control character"
    } else {
        return Ok(());
    };
    Err(MetadataError::InvalidKey {
        key: key.to_owned(),
        reason,
    })
}

/// Checks a list or watch prefix: at most [`MAX_KEY_BYTES`]; empty means
/// every key.
///
/// # Errors
/// [`MetadataError::InvalidKey`].
pub fn validate_prefix(prefix: &str) -> Result<(), MetadataError> {
    if prefix.len() > MAX_KEY_BYTES {
        return Err(MetadataError::InvalidKey {
            key: prefix.to_owned(),
            reason: "prefix longer than 1024 bytes",
        });
    }
    Ok(())
}

/// Encodes a value as compact JSON within [`MAX_VALUE_BYTES`].
///
/// # Errors
/// [`MetadataError::ValueTooLarge`] or [`MetadataError::Encode`].
pub fn encode_value(key: &str, value: &Value) -> Result<Vec<u8>, MetadataError> {
    let bytes = serde_json::to_vec(value).map_err(|source| MetadataError::Encode {
        key: key.to_owned(),
        source,
    })?;
    if bytes.len() > MAX_VALUE_BYTES {
        return Err(MetadataError::ValueTooLarge {
            key: key.to_owned(),
            bytes: bytes.len(),
            max: MAX_VALUE_BYTES,
        });
    }
    Ok(bytes)
}

// ---------------------------------------------------------------------------
// The trait
// ---------------------------------------------------------------------------

/// A metadata store; see the module doc for the contract every
/// implementation keeps. Dyn-compatible: use it as `Arc<dyn MetadataStore>`.
///
/// Every method may fail with [`MetadataError::Backend`],
/// [`MetadataError::NoRuntime`] or [`MetadataError::Task`]; other errors are
/// listed per method.
pub trait MetadataStore: Send + Sync {
    /// The live value of `key`, `None` when absent or expired.
    ///
    /// Errors: [`MetadataError::InvalidKey`], [`MetadataError::Corrupt`].
    fn get<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Value>, MetadataError>>;

    /// Applies `txn` atomically; see [`Txn`].
    ///
    /// Errors: those of [`Txn::validate`], [`MetadataError::Corrupt`].
    fn txn(&self, txn: Txn) -> BoxFuture<'_, Result<TxnOutcome, MetadataError>>;

    /// Removes `key`; true when it held a live value (an expired, not yet
    /// purged entry is removed too, with an event, but reports false).
    ///
    /// Errors: [`MetadataError::InvalidKey`].
    fn delete<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<bool, MetadataError>>;

    /// Live entries whose key starts with `prefix`, sorted by key.
    ///
    /// Errors: [`MetadataError::InvalidKey`] (prefix too long),
    /// [`MetadataError::Corrupt`].
    fn list<'a>(
        &'a self,
        prefix: &'a str,
    ) -> BoxFuture<'a, Result<Vec<(String, Value)>, MetadataError>>;

    /// Changes under `prefix` committed after this resolves.
    ///
    /// Errors: [`MetadataError::InvalidKey`] (prefix too long).
    fn watch<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Watch, MetadataError>>;

    /// Removes every expired entry, with a delete event each (in key
    /// order); returns how many.
    fn purge_expired(&self) -> BoxFuture<'_, Result<usize, MetadataError>>;

    /// The value of `key` as this node's copy holds it now, without
    /// waiting to be current (a replicated store may be behind the
    /// latest commit): for values that never change once written, where
    /// "not there yet" is an acceptable answer. Default: [`MetadataStore::get`].
    ///
    /// Errors: as [`MetadataStore::get`].
    fn get_local<'a>(
        &'a self,
        key: &'a str,
    ) -> BoxFuture<'a, Result<Option<Value>, MetadataError>> {
        self.get(key)
    }

    /// Stores `value` at `key` without a TTL.
    ///
    /// Errors: [`MetadataError::InvalidKey`], [`MetadataError::ValueTooLarge`].
    fn put<'a>(&'a self, key: &'a str, value: Value) -> BoxFuture<'a, Result<(), MetadataError>> {
        Box::pin(async move { self.txn(Txn::new().put(key, value)).await.map(drop) })
    }

    /// Stores `value` at `key`, expiring `ttl_ms` after it applies.
    ///
    /// Errors: as [`MetadataStore::put`], and [`MetadataError::ZeroTtl`].
    fn put_with_ttl<'a>(
        &'a self,
        key: &'a str,
        value: Value,
        ttl_ms: u64,
    ) -> BoxFuture<'a, Result<(), MetadataError>> {
        Box::pin(async move {
            self.txn(Txn::new().put_with_ttl(key, value, ttl_ms))
                .await
                .map(drop)
        })
    }

    /// Stores `new` at `key` if its live value is `expected` (`None`:
    /// absent). The stored value has no TTL.
    ///
    /// Errors: as [`MetadataStore::put`].
    fn compare_and_swap<'a>(
        &'a self,
        key: &'a str,
        expected: Option<Value>,
        new: Value,
    ) -> BoxFuture<'a, Result<CasOutcome, MetadataError>> {
        Box::pin(async move {
            let txn = match expected {
                Some(value) => Txn::new().when_equals(key, value),
                None => Txn::new().when_absent(key),
            }
            .put(key, new.clone());
            Ok(match self.txn(txn).await? {
                TxnOutcome::Applied => CasOutcome {
                    applied: true,
                    current: Some(new),
                },
                TxnOutcome::ConditionFailed { current, .. } => CasOutcome {
                    applied: false,
                    current,
                },
            })
        })
    }
}

/// Typed access on top of any [`MetadataStore`].
pub trait MetadataStoreExt: MetadataStore {
    /// The value of `key` decoded as `T`.
    ///
    /// # Errors
    /// As [`MetadataStore::get`], and [`MetadataError::Decode`].
    fn get_as<'a, T: DeserializeOwned + 'a>(
        &'a self,
        key: &'a str,
    ) -> BoxFuture<'a, Result<Option<T>, MetadataError>> {
        Box::pin(async move {
            self.get(key)
                .await?
                .map(|value| {
                    serde_json::from_value(value).map_err(|source| MetadataError::Decode {
                        key: key.to_owned(),
                        source,
                    })
                })
                .transpose()
        })
    }

    /// Stores `value` encoded as JSON.
    ///
    /// # Errors
    /// As [`MetadataStore::put`], and [`MetadataError::Encode`].
    fn put_as<'a, T: Serialize + Sync + 'a>(
        &'a self,
        key: &'a str,
        value: &'a T,
    ) -> BoxFuture<'a, Result<(), MetadataError>> {
        Box::pin(async move {
            let value = serde_json::to_value(value).map_err(|source| MetadataError::Encode {
                key: key.to_owned(),
                source,
            })?;
            self.put(key, value).await
        })
    }
}

impl<S: MetadataStore + ?Sized> MetadataStoreExt for S {}
