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

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::sync::broadcast;

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
// Operations and outcomes
// ---------------------------------------------------------------------------

/// A condition of a transaction on one key's current live value.
#[derive(Debug, Clone, PartialEq)]
pub struct Precondition {
    /// The key.
    pub key: String,
    /// `Some(v)`: the key must hold exactly `v`; `None`: it must be absent.
    pub expected: Option<Value>,
}

/// One write of a transaction.
#[derive(Debug, Clone, PartialEq)]
pub enum WriteOp {
    /// Store `value` at `key`; with `ttl_ms`, the key expires `ttl_ms` after
    /// the transaction applies; without, any earlier TTL is removed.
    Put {
        /// The key.
        key: String,
        /// The value.
        value: Value,
        /// Time to live, ms, above 0.
        ttl_ms: Option<u64>,
    },
    /// Remove `key` (no effect if absent).
    Delete {
        /// The key.
        key: String,
    },
}

impl WriteOp {
    /// The key written.
    pub fn key(&self) -> &str {
        match self {
            WriteOp::Put { key, .. } | WriteOp::Delete { key } => key,
        }
    }
}

/// An atomic multi-key write: preconditions, then ops.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Txn {
    /// All must hold for any op to apply.
    pub preconditions: Vec<Precondition>,
    /// Applied in order when the preconditions hold.
    pub ops: Vec<WriteOp>,
}

impl Txn {
    /// An empty transaction.
    pub fn new() -> Txn {
        Txn::default()
    }

    /// Requires `key` to hold `value`.
    pub fn when_equals(mut self, key: impl Into<String>, value: Value) -> Txn {
        self.preconditions.push(Precondition {
            key: key.into(),
            expected: Some(value),
        });
        self
    }

    /// Requires `key` to be absent.
    pub fn when_absent(mut self, key: impl Into<String>) -> Txn {
        self.preconditions.push(Precondition {
            key: key.into(),
            expected: None,
        });
        self
    }

    /// Adds a put.
    pub fn put(mut self, key: impl Into<String>, value: Value) -> Txn {
        self.ops.push(WriteOp::Put {
            key: key.into(),
            value,
            ttl_ms: None,
        });
        self
    }

    /// Adds a put with a TTL, ms.
    pub fn put_with_ttl(mut self, key: impl Into<String>, value: Value, ttl_ms: u64) -> Txn {
        self.ops.push(WriteOp::Put {
            key: key.into(),
            value,
            ttl_ms: Some(ttl_ms),
        });
        self
    }

    /// Adds a delete.
    pub fn delete(mut self, key: impl Into<String>) -> Txn {
        self.ops.push(WriteOp::Delete { key: key.into() });
        self
    }

    /// Checks sizes, keys, values and TTLs, and encodes every put's value as
    /// compact JSON: what an implementation applies.
    ///
    /// # Errors
    /// [`MetadataError::TooManyOps`], [`MetadataError::InvalidKey`],
    /// [`MetadataError::ValueTooLarge`] or [`MetadataError::ZeroTtl`].
    pub fn validate(self) -> Result<ValidatedTxn, MetadataError> {
        let count = self.preconditions.len() + self.ops.len();
        if count > MAX_TXN_OPS {
            return Err(MetadataError::TooManyOps {
                count,
                max: MAX_TXN_OPS,
            });
        }
        for precondition in &self.preconditions {
            validate_key(&precondition.key)?;
        }
        let ops = self
            .ops
            .into_iter()
            .map(|op| {
                validate_key(op.key())?;
                Ok(match op {
                    WriteOp::Put { key, value, ttl_ms } => {
                        if ttl_ms == Some(0) {
                            return Err(MetadataError::ZeroTtl { key });
                        }
                        let json = encode_value(&key, &value)?;
                        EncodedOp::Put {
                            key,
                            value,
                            json,
                            ttl_ms,
                        }
                    }
                    WriteOp::Delete { key } => EncodedOp::Delete { key },
                })
            })
            .collect::<Result<_, MetadataError>>()?;
        Ok(ValidatedTxn {
            preconditions: self.preconditions,
            ops,
        })
    }
}

/// A [`Txn`] that passed [`Txn::validate`].
#[derive(Debug, Clone, PartialEq)]
pub struct ValidatedTxn {
    /// As in the transaction.
    pub preconditions: Vec<Precondition>,
    /// The ops, puts with their encoded value.
    pub ops: Vec<EncodedOp>,
}

/// A validated [`WriteOp`].
#[derive(Debug, Clone, PartialEq)]
pub enum EncodedOp {
    /// A put.
    Put {
        /// The key.
        key: String,
        /// The value (for watch events).
        value: Value,
        /// `value` as compact JSON, at most [`MAX_VALUE_BYTES`].
        json: Vec<u8>,
        /// Time to live, ms, above 0.
        ttl_ms: Option<u64>,
    },
    /// A delete.
    Delete {
        /// The key.
        key: String,
    },
}

/// The result of a transaction.
#[derive(Debug, Clone, PartialEq)]
#[must_use]
pub enum TxnOutcome {
    /// Every op applied.
    Applied,
    /// Nothing applied: the first precondition that did not hold.
    ConditionFailed {
        /// Its position in [`Txn::preconditions`].
        index: usize,
        /// Its key.
        key: String,
        /// The key's live value at the time.
        current: Option<Value>,
    },
}

impl TxnOutcome {
    /// Whether the transaction applied.
    pub fn applied(&self) -> bool {
        matches!(self, TxnOutcome::Applied)
    }
}

/// The result of a compare-and-swap.
#[derive(Debug, Clone, PartialEq)]
#[must_use]
pub struct CasOutcome {
    /// Whether the new value was stored.
    pub applied: bool,
    /// The key's value afterwards: the new value when applied, else the
    /// value that did not match (`None`: absent).
    pub current: Option<Value>,
}

/// A change under a watched prefix.
#[derive(Debug, Clone, PartialEq)]
pub enum WatchEvent {
    /// `key` now holds `value`.
    Put {
        /// The key.
        key: String,
        /// Its new value.
        value: Value,
    },
    /// `key` was removed (deleted or purged after expiry).
    Delete {
        /// The key.
        key: String,
    },
}

impl WatchEvent {
    /// The key changed.
    pub fn key(&self) -> &str {
        match self {
            WatchEvent::Put { key, .. } | WatchEvent::Delete { key } => key,
        }
    }
}

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
    /// The storage backend failed (I/O, corruption, consensus). After an
    /// I/O failure the redb store fails every later write until reopened.
    #[error("metadata backend failed to {op}: {source}")]
    Backend {
        /// What was attempted.
        op: &'static str,
        /// The backend's error.
        source: Box<dyn std::error::Error + Send + Sync>,
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

/// Why a watch returned no event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WatchError {
    /// The watcher fell behind and `missed` events (under any prefix) were
    /// dropped for it; re-list the prefix, then continue receiving.
    #[error("watch lagged: {missed} events missed; re-list")]
    Lagged {
        /// Events dropped.
        missed: u64,
    },
    /// The store was dropped.
    #[error("metadata store closed")]
    Closed,
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
// Watches
// ---------------------------------------------------------------------------

/// A stream of changes under one prefix. See the module contract.
#[derive(Debug)]
pub struct Watch {
    prefix: String,
    receiver: broadcast::Receiver<Arc<WatchEvent>>,
}

impl Watch {
    /// A watch filtering `receiver` by `prefix` (for implementations; see
    /// [`WatchHub`]).
    pub fn new(prefix: String, receiver: broadcast::Receiver<Arc<WatchEvent>>) -> Watch {
        Watch { prefix, receiver }
    }

    /// The watched prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The next change under the prefix, waiting for one.
    ///
    /// # Errors
    /// [`WatchError::Lagged`] (then call again to continue) or
    /// [`WatchError::Closed`].
    pub async fn recv(&mut self) -> Result<WatchEvent, WatchError> {
        loop {
            match self.receiver.recv().await {
                Ok(event) if event.key().starts_with(&self.prefix) => return Ok((*event).clone()),
                Ok(_) => {}
                Err(broadcast::error::RecvError::Lagged(missed)) => {
                    return Err(WatchError::Lagged { missed });
                }
                Err(broadcast::error::RecvError::Closed) => return Err(WatchError::Closed),
            }
        }
    }

    /// The next change under the prefix if one is queued, without waiting.
    ///
    /// # Errors
    /// As [`Watch::recv`].
    pub fn try_recv(&mut self) -> Result<Option<WatchEvent>, WatchError> {
        loop {
            match self.receiver.try_recv() {
                Ok(event) if event.key().starts_with(&self.prefix) => {
                    return Ok(Some((*event).clone()));
                }
                Ok(_) => {}
                Err(broadcast::error::TryRecvError::Empty) => return Ok(None),
                Err(broadcast::error::TryRecvError::Lagged(missed)) => {
                    return Err(WatchError::Lagged { missed });
                }
                Err(broadcast::error::TryRecvError::Closed) => return Err(WatchError::Closed),
            }
        }
    }
}

/// The fan-out of committed changes to watches, for implementations:
/// publish a write's events in commit order, before its future resolves.
#[derive(Debug)]
pub struct WatchHub {
    sender: broadcast::Sender<Arc<WatchEvent>>,
}

impl Default for WatchHub {
    fn default() -> Self {
        WatchHub::new()
    }
}

impl WatchHub {
    /// A hub with [`WATCH_CHANNEL_CAPACITY`].
    pub fn new() -> WatchHub {
        let (sender, _) = broadcast::channel(WATCH_CHANNEL_CAPACITY);
        WatchHub { sender }
    }

    /// A watch receiving every event published from now on.
    pub fn subscribe(&self, prefix: &str) -> Watch {
        Watch::new(prefix.to_owned(), self.sender.subscribe())
    }

    /// Queues `events` to every watch.
    pub fn publish(&self, events: impl IntoIterator<Item = WatchEvent>) {
        for event in events {
            // An error only means there is no watch at the moment.
            let _ = self.sender.send(Arc::new(event));
        }
    }
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
