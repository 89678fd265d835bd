//! The embedded [`MetadataStore`] on redb 4: one file, one process.
//!
//! # File layout (format version [`FORMAT_VERSION`])
//! | table | key | value |
//! |---|---|---|
//! | `meta` | `"format_version"` | `u64`, [`FORMAT_VERSION`] |
//! | `kv` | metadata key (`&str`) | the value as compact JSON bytes |
//! | `kv_expiry` | metadata key of a TTL entry | `expires_at_ms: u64`, ms since the Unix epoch |
//!
//! Invariant: every `kv_expiry` key is also a `kv` key; a write or delete
//! of a key updates both tables in the same transaction.
//!
//! # Durability
//! Every write is one redb write transaction committed with
//! [`Durability::Immediate`] (redb's default, set explicitly): `commit`
//! returns after the data and the new root are `fsync`ed, so an
//! acknowledged write survives a process crash and power loss. The one
//! exception is [`RedbStore::txn_unsynced`], asked for by name, for writes
//! a caller redoes after a crash. Transactions
//! whose preconditions fail, and purges that find nothing, are aborted and
//! cost no `fsync`.
//!
//! # Opening, damage and I/O failures
//! Opening is read-only first ([`open`]): an initialised file is only read
//! (with redb's integrity check), so it opens on a full filesystem; a write
//! transaction runs only for a new file. A damaged file is
//! [`MetadataError::Damaged`]; [`RedbStore::open_or_recover`] moves it
//! aside and starts a fresh store ([`recover`]). After a write fails with
//! an I/O error (e.g. `ENOSPC`) redb refuses every later write of that
//! handle, so the store reopens its file by itself at the next write
//! attempt; meanwhile writes fail with [`MetadataError::Storage`] naming the
//! file, and each failure episode is logged once.
//!
//! # Threads
//! redb calls block (disk reads, `fsync`), so every operation runs in
//! [`tokio::task::spawn_blocking`]; tables and access guards live only
//! inside that closure, within their transaction. Writers are serialized by
//! a mutex held from `begin_write` through publishing the watch events, so
//! events go out in commit order and a watch subscribed under the same
//! mutex sees exactly the writes committed after it. A reopen also runs
//! under that mutex, and waits for the reads in progress.

mod open;
mod recover;

use crate::clock::Clock;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use ::redb::{
    Database, Durability, ReadableDatabase, ReadableTable, TableDefinition, WriteTransaction,
};

pub use recover::StoreOpenReport;
use serde_json::Value;

use super::{
    BoxFuture, EncodedOp, MetadataError, MetadataStore, Txn, TxnOutcome, ValidatedTxn, Watch,
    WatchEvent, WatchHub, validate_key, validate_prefix,
};

/// On-disk format version written to and required in the `meta` table.
pub const FORMAT_VERSION: u64 = 1;

const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const FORMAT_VERSION_KEY: &str = "format_version";
const KV: TableDefinition<&str, &[u8]> = TableDefinition::new("kv");
const EXPIRY: TableDefinition<&str, u64> = TableDefinition::new("kv_expiry");

/// Wraps any redb error as [`MetadataError::Backend`].
fn backend<E: Into<::redb::Error>>(op: &'static str) -> impl FnOnce(E) -> MetadataError {
    move |err| MetadataError::Backend {
        op,
        source: Box::new(err.into()),
    }
}

fn decode(key: &str, bytes: &[u8]) -> Result<Value, MetadataError> {
    serde_json::from_slice(bytes).map_err(|source| MetadataError::Corrupt {
        key: key.to_owned(),
        source,
    })
}

/// Whether an entry with this expiry is live at `now_ms`.
fn is_live(expires_at_ms: Option<u64>, now_ms: u64) -> bool {
    expires_at_ms.is_none_or(|at| now_ms < at)
}

/// The live value of `key` in a pair of tables of one transaction.
fn live_value(
    kv: &impl ReadableTable<&'static str, &'static [u8]>,
    expiry: &impl ReadableTable<&'static str, u64>,
    key: &str,
    now_ms: u64,
) -> Result<Option<Value>, MetadataError> {
    let Some(guard) = kv.get(key).map_err(backend("read a value"))? else {
        return Ok(None);
    };
    let expires_at_ms = expiry
        .get(key)
        .map_err(backend("read an expiry"))?
        .map(|g| g.value());
    if !is_live(expires_at_ms, now_ms) {
        return Ok(None);
    }
    decode(key, guard.value()).map(Some)
}

/// The embedded metadata store. Cheap to clone; clones share the file.
#[derive(Clone)]
pub struct RedbStore {
    inner: Arc<Inner>,
}

struct Inner {
    /// The store's file.
    path: PathBuf,
    /// The open database; `None` only while a reopen after an I/O failure
    /// has not succeeded yet (see [`open`]).
    db: RwLock<Option<Database>>,
    /// The current failure episode of writes, if any.
    fault: Mutex<Option<open::Fault>>,
    clock: Arc<dyn Clock>,
    hub: WatchHub,
    /// Serializes writers, reopens and watch subscriptions (see the module
    /// doc).
    write_lock: Mutex<()>,
}

impl Inner {
    fn lock_writes(&self) -> MutexGuard<'_, ()> {
        // The mutex guards no data, so a panic while holding it leaves
        // nothing inconsistent.
        self.write_lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn db_slot(&self) -> RwLockReadGuard<'_, Option<Database>> {
        // Only `reopen` writes the slot, and it leaves `None` or a handle.
        self.db.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn db_slot_mut(&self) -> RwLockWriteGuard<'_, Option<Database>> {
        self.db.write().unwrap_or_else(PoisonError::into_inner)
    }
}

impl std::fmt::Debug for RedbStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedbStore").finish_non_exhaustive()
    }
}

impl RedbStore {
    /// Applies `txn` as [`MetadataStore::txn`] does, but commits without
    /// an `fsync` (redb's [`Durability::None`]): visible at once (reads,
    /// watches), on disk with the next synced commit. A crash before that
    /// loses it whole: the store reopens with the state before it. Only
    /// for writes a caller can redo after a crash (the edge's publish
    /// answers, whose committed marker is settled again at start).
    ///
    /// # Errors
    /// As [`MetadataStore::txn`].
    pub fn txn_unsynced(&self, txn: Txn) -> BoxFuture<'_, Result<TxnOutcome, MetadataError>> {
        let prepared = match txn.validate() {
            Ok(prepared) => prepared,
            Err(err) => return Box::pin(async move { Err(err) }),
        };
        let applied = self.blocking("txn", move |inner| apply(inner, prepared, Durability::None));
        Box::pin(async move { Ok(applied.await?.outcome) })
    }

    /// Opens the store at `path`, creating the file if it does not exist,
    /// and checks its format version and that its tables can be read.
    /// Writes to the file only if it is new (or a table is missing), so an
    /// initialised store opens on a full filesystem. `clock` drives TTLs.
    ///
    /// Blocking: opening reads the whole file (redb's integrity check) and,
    /// after a crash, repairs it. Call it before serving, or inside
    /// `spawn_blocking`.
    ///
    /// # Errors
    /// [`MetadataError::Damaged`] for a damaged file (see
    /// [`RedbStore::open_or_recover`]), [`MetadataError::Storage`] for a
    /// full filesystem or an I/O failure (a missing directory too),
    /// [`MetadataError::InUse`] when the file is held by another process,
    /// [`MetadataError::UnsupportedFormat`] for another format version.
    pub fn open(path: impl AsRef<Path>, clock: Arc<dyn Clock>) -> Result<RedbStore, MetadataError> {
        Ok(RedbStore::open_file(path.as_ref(), clock)?.0)
    }

    /// [`RedbStore::open`], also saying whether the open created the file
    /// or its tables.
    fn open_file(path: &Path, clock: Arc<dyn Clock>) -> Result<(RedbStore, bool), MetadataError> {
        let opened = open::open_file(path)?;
        let store = RedbStore {
            inner: Arc::new(Inner {
                path: path.to_path_buf(),
                db: RwLock::new(Some(opened.db)),
                fault: Mutex::new(None),
                clock,
                hub: WatchHub::new(),
                write_lock: Mutex::new(()),
            }),
        };
        Ok((store, opened.initialised))
    }

    /// The store's file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Whether the last write failed with [`MetadataError::Storage`] (a
    /// full filesystem or an I/O failure) and no write has succeeded since.
    pub fn is_faulted(&self) -> bool {
        self.inner.is_faulted()
    }

    /// Runs `f` on the blocking pool.
    fn blocking<T, F>(&self, op: &'static str, f: F) -> BoxFuture<'static, Result<T, MetadataError>>
    where
        T: Send + 'static,
        F: FnOnce(&Inner) -> Result<T, MetadataError> + Send + 'static,
    {
        let inner = Arc::clone(&self.inner);
        Box::pin(async move {
            let handle =
                tokio::runtime::Handle::try_current().map_err(|_| MetadataError::NoRuntime)?;
            handle
                .spawn_blocking(move || f(&inner))
                .await
                .map_err(|err| MetadataError::Task {
                    op,
                    reason: err.to_string(),
                })?
        })
    }
}

/// What an applied write did besides its outcome.
struct Applied {
    outcome: TxnOutcome,
    /// Per delete op in order: whether it removed a live value.
    deleted_live: Vec<bool>,
}

/// Begins a write transaction committed with `durability`.
fn begin_write(db: &Database, durability: Durability) -> Result<WriteTransaction, MetadataError> {
    let mut txn = db.begin_write().map_err(backend("begin a write"))?;
    txn.set_durability(durability)
        .map_err(backend("set durability"))?;
    Ok(txn)
}

/// Checks the preconditions and applies the ops in one redb transaction
/// committed with `durability`, then publishes the events. Called on the
/// blocking pool.
fn apply(
    inner: &Inner,
    prepared: ValidatedTxn,
    durability: Durability,
) -> Result<Applied, MetadataError> {
    let _writer = inner.lock_writes();
    inner.write_with("write", |db| apply_on(inner, db, prepared, durability))
}

/// [`apply`] on the open database, under the write lock.
fn apply_on(
    inner: &Inner,
    db: &Database,
    prepared: ValidatedTxn,
    durability: Durability,
) -> Result<Applied, MetadataError> {
    let now_ms = inner.clock.now_ms();
    let txn = begin_write(db, durability)?;
    let mut events = Vec::with_capacity(prepared.ops.len());
    let mut deleted_live = Vec::new();
    let failed = {
        let mut kv = txn.open_table(KV).map_err(backend("open a table"))?;
        let mut expiry = txn.open_table(EXPIRY).map_err(backend("open a table"))?;
        let mut failed = None;
        for (index, precondition) in prepared.preconditions.into_iter().enumerate() {
            let current = live_value(&kv, &expiry, &precondition.key, now_ms)?;
            if current != precondition.expected {
                failed = Some(TxnOutcome::ConditionFailed {
                    index,
                    key: precondition.key,
                    current,
                });
                break;
            }
        }
        if failed.is_none() {
            for op in prepared.ops {
                match op {
                    EncodedOp::Put {
                        key,
                        value,
                        json,
                        ttl_ms,
                    } => {
                        kv.insert(key.as_str(), json.as_slice())
                            .map_err(backend("write a value"))?;
                        match ttl_ms {
                            Some(ttl_ms) => {
                                expiry
                                    .insert(key.as_str(), now_ms.saturating_add(ttl_ms))
                                    .map_err(backend("write an expiry"))?;
                            }
                            None => {
                                expiry
                                    .remove(key.as_str())
                                    .map_err(backend("remove an expiry"))?;
                            }
                        }
                        events.push(WatchEvent::Put { key, value });
                    }
                    EncodedOp::Delete { key } => {
                        let existed = kv
                            .remove(key.as_str())
                            .map_err(backend("remove a value"))?
                            .is_some();
                        let expires_at_ms = expiry
                            .remove(key.as_str())
                            .map_err(backend("remove an expiry"))?
                            .map(|g| g.value());
                        deleted_live.push(existed && is_live(expires_at_ms, now_ms));
                        if existed {
                            events.push(WatchEvent::Delete { key });
                        }
                    }
                }
            }
        }
        failed
    };
    if let Some(outcome) = failed {
        txn.abort().map_err(backend("abort"))?;
        return Ok(Applied {
            outcome,
            deleted_live,
        });
    }
    txn.commit().map_err(backend("commit"))?;
    inner.hub.publish(events);
    Ok(Applied {
        outcome: TxnOutcome::Applied,
        deleted_live,
    })
}

/// Removes every expired entry. Called on the blocking pool.
fn purge(inner: &Inner) -> Result<usize, MetadataError> {
    let _writer = inner.lock_writes();
    inner.write_with("purge expired keys", |db| purge_on(inner, db))
}

/// [`purge`] on the open database, under the write lock.
fn purge_on(inner: &Inner, db: &Database) -> Result<usize, MetadataError> {
    let now_ms = inner.clock.now_ms();
    let txn = begin_write(db, Durability::Immediate)?;
    let expired = {
        let mut kv = txn.open_table(KV).map_err(backend("open a table"))?;
        let mut expiry = txn.open_table(EXPIRY).map_err(backend("open a table"))?;
        let mut expired = Vec::new();
        for entry in expiry.iter().map_err(backend("scan expiries"))? {
            let (key, at) = entry.map_err(backend("scan expiries"))?;
            if !is_live(Some(at.value()), now_ms) {
                expired.push(key.value().to_owned());
            }
        }
        for key in &expired {
            kv.remove(key.as_str()).map_err(backend("remove a value"))?;
            expiry
                .remove(key.as_str())
                .map_err(backend("remove an expiry"))?;
        }
        expired
    };
    if expired.is_empty() {
        txn.abort().map_err(backend("abort"))?;
        return Ok(0);
    }
    txn.commit().map_err(backend("commit"))?;
    let count = expired.len();
    inner
        .hub
        .publish(expired.into_iter().map(|key| WatchEvent::Delete { key }));
    Ok(count)
}

impl MetadataStore for RedbStore {
    fn get<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Value>, MetadataError>> {
        if let Err(err) = validate_key(key) {
            return Box::pin(async move { Err(err) });
        }
        let key = key.to_owned();
        self.blocking("get", move |inner| {
            inner.read_with("read a value", |db| {
                let now_ms = inner.clock.now_ms();
                let txn = db.begin_read().map_err(backend("begin a read"))?;
                let kv = txn.open_table(KV).map_err(backend("open a table"))?;
                let expiry = txn.open_table(EXPIRY).map_err(backend("open a table"))?;
                live_value(&kv, &expiry, &key, now_ms)
            })
        })
    }

    fn txn(&self, txn: Txn) -> BoxFuture<'_, Result<TxnOutcome, MetadataError>> {
        let prepared = match txn.validate() {
            Ok(prepared) => prepared,
            Err(err) => return Box::pin(async move { Err(err) }),
        };
        let applied = self.blocking("txn", move |inner| {
            apply(inner, prepared, Durability::Immediate)
        });
        Box::pin(async move { Ok(applied.await?.outcome) })
    }

    fn delete<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<bool, MetadataError>> {
        let prepared = match Txn::new().delete(key).validate() {
            Ok(prepared) => prepared,
            Err(err) => return Box::pin(async move { Err(err) }),
        };
        let applied = self.blocking("delete", move |inner| {
            apply(inner, prepared, Durability::Immediate)
        });
        Box::pin(async move {
            Ok(applied
                .await?
                .deleted_live
                .first()
                .copied()
                .unwrap_or(false))
        })
    }

    fn list<'a>(
        &'a self,
        prefix: &'a str,
    ) -> BoxFuture<'a, Result<Vec<(String, Value)>, MetadataError>> {
        if let Err(err) = validate_prefix(prefix) {
            return Box::pin(async move { Err(err) });
        }
        let prefix = prefix.to_owned();
        self.blocking("list", move |inner| {
            inner.read_with("list values", |db| {
                let now_ms = inner.clock.now_ms();
                let txn = db.begin_read().map_err(backend("begin a read"))?;
                let kv = txn.open_table(KV).map_err(backend("open a table"))?;
                let expiry = txn.open_table(EXPIRY).map_err(backend("open a table"))?;
                let mut entries = Vec::new();
                for entry in kv
                    .range::<&str>(prefix.as_str()..)
                    .map_err(backend("scan values"))?
                {
                    let (key, value) = entry.map_err(backend("scan values"))?;
                    let key = key.value();
                    if !key.starts_with(prefix.as_str()) {
                        break;
                    }
                    let expires_at_ms = expiry
                        .get(key)
                        .map_err(backend("read an expiry"))?
                        .map(|g| g.value());
                    if is_live(expires_at_ms, now_ms) {
                        entries.push((key.to_owned(), decode(key, value.value())?));
                    }
                }
                Ok(entries)
            })
        })
    }

    fn watch<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Watch, MetadataError>> {
        if let Err(err) = validate_prefix(prefix) {
            return Box::pin(async move { Err(err) });
        }
        let prefix = prefix.to_owned();
        // Subscribing waits for a running write to publish its events, so
        // the watch starts exactly between two writes.
        self.blocking("watch", move |inner| {
            let _writer = inner.lock_writes();
            Ok(inner.hub.subscribe(&prefix))
        })
    }

    fn purge_expired(&self) -> BoxFuture<'_, Result<usize, MetadataError>> {
        self.blocking("purge_expired", purge)
    }
}

#[cfg(test)]
mod fault_tests;
#[cfg(test)]
mod tests;
