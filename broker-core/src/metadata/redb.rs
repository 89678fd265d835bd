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
//! acknowledged write survives a process crash and power loss. Transactions
//! whose preconditions fail, and purges that find nothing, are aborted and
//! cost no `fsync`. After an I/O error redb refuses further writes until
//! the file is reopened (fail-stop).
//!
//! # Threads
//! redb calls block (disk reads, `fsync`), so every operation runs in
//! [`tokio::task::spawn_blocking`]; tables and access guards live only
//! inside that closure, within their transaction. Writers are serialized by
//! a mutex held from `begin_write` through publishing the watch events, so
//! events go out in commit order and a watch subscribed under the same
//! mutex sees exactly the writes committed after it.

use crate::clock::Clock;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use ::redb::{
    Database, Durability, ReadableDatabase, ReadableTable, TableDefinition, WriteTransaction,
};
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
    db: Database,
    clock: Arc<dyn Clock>,
    hub: WatchHub,
    /// Serializes writers and watch subscriptions (see the module doc).
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
}

impl std::fmt::Debug for RedbStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedbStore").finish_non_exhaustive()
    }
}

impl RedbStore {
    /// Opens the store at `path`, creating the file if needed, and checks
    /// its format version. `clock` drives TTLs.
    ///
    /// Blocking: opening reads the file and, after a crash, repairs it. Call
    /// it before serving, or inside `spawn_blocking`.
    ///
    /// # Errors
    /// [`MetadataError::Backend`] when the file cannot be opened (missing
    /// directory, held by another process, damaged),
    /// [`MetadataError::UnsupportedFormat`] for another format version.
    pub fn open(path: impl AsRef<Path>, clock: Arc<dyn Clock>) -> Result<RedbStore, MetadataError> {
        let db = Database::create(path.as_ref()).map_err(backend("open the database"))?;
        let mut txn = db.begin_write().map_err(backend("begin a write"))?;
        txn.set_durability(Durability::Immediate)
            .map_err(backend("set durability"))?;
        {
            let mut meta = txn.open_table(META).map_err(backend("open a table"))?;
            let found = meta
                .get(FORMAT_VERSION_KEY)
                .map_err(backend("read the format version"))?
                .map(|g| g.value());
            match found {
                Some(FORMAT_VERSION) => {}
                Some(found) => {
                    return Err(MetadataError::UnsupportedFormat {
                        found,
                        expected: FORMAT_VERSION,
                    });
                }
                None => {
                    meta.insert(FORMAT_VERSION_KEY, FORMAT_VERSION)
                        .map_err(backend("write the format version"))?;
                }
            }
            // Create the tables so read transactions always find them.
            txn.open_table(KV).map_err(backend("open a table"))?;
            txn.open_table(EXPIRY).map_err(backend("open a table"))?;
        }
        txn.commit().map_err(backend("commit"))?;
        Ok(RedbStore {
            inner: Arc::new(Inner {
                db,
                clock,
                hub: WatchHub::new(),
                write_lock: Mutex::new(()),
            }),
        })
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

/// Begins a durable write transaction.
fn begin_write(inner: &Inner) -> Result<WriteTransaction, MetadataError> {
    let mut txn = inner.db.begin_write().map_err(backend("begin a write"))?;
    txn.set_durability(Durability::Immediate)
        .map_err(backend("set durability"))?;
    Ok(txn)
}

/// Checks the preconditions and applies the ops in one redb transaction,
/// then publishes the events. Called on the blocking pool.
fn apply(inner: &Inner, prepared: ValidatedTxn) -> Result<Applied, MetadataError> {
    let _writer = inner.lock_writes();
    let now_ms = inner.clock.now_ms();
    let txn = begin_write(inner)?;
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
    let now_ms = inner.clock.now_ms();
    let txn = begin_write(inner)?;
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
            let now_ms = inner.clock.now_ms();
            let txn = inner.db.begin_read().map_err(backend("begin a read"))?;
            let kv = txn.open_table(KV).map_err(backend("open a table"))?;
            let expiry = txn.open_table(EXPIRY).map_err(backend("open a table"))?;
            live_value(&kv, &expiry, &key, now_ms)
        })
    }

    fn txn(&self, txn: Txn) -> BoxFuture<'_, Result<TxnOutcome, MetadataError>> {
        let prepared = match txn.validate() {
            Ok(prepared) => prepared,
            Err(err) => return Box::pin(async move { Err(err) }),
        };
        let applied = self.blocking("txn", move |inner| apply(inner, prepared));
        Box::pin(async move { Ok(applied.await?.outcome) })
    }

    fn delete<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<bool, MetadataError>> {
        let prepared = match Txn::new().delete(key).validate() {
            Ok(prepared) => prepared,
            Err(err) => return Box::pin(async move { Err(err) }),
        };
        let applied = self.blocking("delete", move |inner| apply(inner, prepared));
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
            let now_ms = inner.clock.now_ms();
            let txn = inner.db.begin_read().map_err(backend("begin a read"))?;
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
mod tests {
    use std::collections::BTreeSet;
    use std::io::{BufRead, BufReader};
    use std::path::PathBuf;
    use std::pin::pin;
    use std::process::{Command, Stdio};
    use std::sync::mpsc;
    use std::task::{Context, Poll, Waker};
    use std::time::{Duration, Instant};

    use rand::{RngExt, SeedableRng, rngs::StdRng};
    use serde_json::json;

    use super::*;
    use crate::clock::{ManualClock, SystemClock};

    /// The clock reading the tests start at, ms since the Unix epoch.
    const START_MS: u64 = 1_700_000_000_000;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime")
    }

    #[test]
    fn acknowledged_writes_survive_drop_and_reopen() {
        const KEYS: usize = 200;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta.redb");
        let clock = Arc::new(ManualClock::new(START_MS));
        rt().block_on(async {
            let store = RedbStore::open(&path, clock.clone()).unwrap();
            for i in 0..KEYS {
                store
                    .put(&format!("/durable/{i:04}"), json!({"i": i}))
                    .await
                    .unwrap();
            }
            store
                .put_with_ttl("/durable/ttl", json!("t"), 1000)
                .await
                .unwrap();
            assert!(store.delete("/durable/0000").await.unwrap());
        });
        // The runtime and the store are gone; reopen the file.
        rt().block_on(async {
            let store = RedbStore::open(&path, clock.clone()).unwrap();
            let entries = store.list("/durable/").await.unwrap();
            assert_eq!(entries.len(), KEYS);
            for (i, (key, value)) in (1..KEYS).zip(&entries) {
                assert_eq!(key, &format!("/durable/{i:04}"));
                assert_eq!(value, &json!({"i": i}));
            }
            assert_eq!(entries.last().unwrap().0, "/durable/ttl");
            // The TTL survived the reopen as an absolute expiry.
            clock.advance(1000);
            assert_eq!(store.get("/durable/ttl").await.unwrap(), None);
            assert_eq!(store.purge_expired().await.unwrap(), 1);
        });
    }

    #[test]
    fn a_file_of_another_format_version_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta.redb");
        {
            let db = Database::create(&path).unwrap();
            let txn = db.begin_write().unwrap();
            txn.open_table(META)
                .unwrap()
                .insert(FORMAT_VERSION_KEY, FORMAT_VERSION + 1)
                .unwrap();
            txn.commit().unwrap();
        }
        match RedbStore::open(&path, Arc::new(SystemClock)) {
            Err(MetadataError::UnsupportedFormat { found, expected }) => {
                assert_eq!((found, expected), (FORMAT_VERSION + 1, FORMAT_VERSION));
            }
            other => panic!("expected UnsupportedFormat, got {other:?}"),
        }
    }

    #[test]
    fn a_file_held_by_another_store_is_a_backend_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta.redb");
        let _first = RedbStore::open(&path, Arc::new(SystemClock)).unwrap();
        assert!(matches!(
            RedbStore::open(&path, Arc::new(SystemClock)),
            Err(MetadataError::Backend { .. })
        ));
        assert!(matches!(
            RedbStore::open(
                dir.path().join("no/such/dir/meta.redb"),
                Arc::new(SystemClock)
            ),
            Err(MetadataError::Backend { .. })
        ));
    }

    #[test]
    fn corrupt_stored_json_is_reported_not_panicked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta.redb");
        drop(RedbStore::open(&path, Arc::new(SystemClock)).unwrap());
        {
            let db = Database::create(&path).unwrap();
            let txn = db.begin_write().unwrap();
            txn.open_table(KV)
                .unwrap()
                .insert("/bad", b"{not json".as_slice())
                .unwrap();
            txn.commit().unwrap();
        }
        let store = RedbStore::open(&path, Arc::new(SystemClock)).unwrap();
        rt().block_on(async {
            assert!(matches!(
                store.get("/bad").await,
                Err(MetadataError::Corrupt { .. })
            ));
            assert!(matches!(
                store.list("/").await,
                Err(MetadataError::Corrupt { .. })
            ));
        });
    }

    #[test]
    fn operations_outside_a_runtime_fail_cleanly() {
        let dir = tempfile::tempdir().unwrap();
        let store = RedbStore::open(dir.path().join("meta.redb"), Arc::new(SystemClock)).unwrap();
        let mut cx = Context::from_waker(Waker::noop());
        let mut get = pin!(store.get("/k"));
        assert!(matches!(
            get.as_mut().poll(&mut cx),
            Poll::Ready(Err(MetadataError::NoRuntime))
        ));
    }

    // ---- crash test: SIGKILL a writer, reopen, find every acknowledged key --

    /// Set in the child: the database path to write to.
    const CRASH_CHILD_PATH_ENV: &str = "TRIBUTARY_METADATA_CRASH_CHILD_PATH";
    /// Set in the child: the round, used in key names.
    const CRASH_CHILD_ROUND_ENV: &str = "TRIBUTARY_METADATA_CRASH_CHILD_ROUND";
    /// Stdout marker before an acknowledged key. Searched anywhere in a
    /// line: libtest prints the first one after `test <name> ... `.
    const ACK: &str = "@@ACK@@ ";
    /// Most keys a child writes.
    const CHILD_KEYS_MAX: u32 = 100_000;
    /// Longest a child runs.
    const CHILD_TIME_MAX: Duration = Duration::from_secs(30);
    /// Longest the parent waits for the child's first acknowledgement.
    const FIRST_ACK_WAIT: Duration = Duration::from_secs(30);
    const CRASH_ROUNDS: u64 = 3;
    const CRASH_SEED: u64 = 0x6d65_7461_6461_7461;

    /// The child half of [`sigkill_loses_no_acknowledged_write`]; does
    /// nothing unless started by it.
    #[test]
    fn crash_child_writer() {
        let Ok(path) = std::env::var(CRASH_CHILD_PATH_ENV) else {
            return;
        };
        let round = std::env::var(CRASH_CHILD_ROUND_ENV).unwrap_or_default();
        let store = RedbStore::open(PathBuf::from(path), Arc::new(SystemClock)).unwrap();
        let started = Instant::now();
        rt().block_on(async {
            for i in 0..CHILD_KEYS_MAX {
                if started.elapsed() > CHILD_TIME_MAX {
                    break;
                }
                let key = format!("/crash/{round}/{i:06}");
                // Alternate single puts and two-key transactions.
                if i % 2 == 0 {
                    store.put(&key, json!(i)).await.unwrap();
                } else {
                    let txn = Txn::new()
                        .when_absent(key.as_str())
                        .put(key.as_str(), json!(i))
                        .put(format!("{key}/pair"), json!(i));
                    assert!(store.txn(txn).await.unwrap().applied());
                }
                // stdout is line-buffered: the line is out once println returns.
                println!("{ACK}{key}");
            }
        });
    }

    #[test]
    fn sigkill_loses_no_acknowledged_write() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta.redb");
        let exe = std::env::current_exe().unwrap();
        let mut rng = StdRng::seed_from_u64(CRASH_SEED);
        // Acknowledged keys of earlier rounds: later crashes must not lose them.
        let mut earlier: Vec<String> = Vec::new();
        for round in 0..CRASH_ROUNDS {
            let delay = Duration::from_millis(rng.random_range(0..300));
            let mut child = Command::new(&exe)
                .args([
                    "metadata::redb::tests::crash_child_writer",
                    "--exact",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(CRASH_CHILD_PATH_ENV, &path)
                .env(CRASH_CHILD_ROUND_ENV, round.to_string())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            let stdout = child.stdout.take().unwrap();
            let (lines_tx, lines_rx) = mpsc::channel();
            let reader = std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    if let Some((_, key)) = line.split_once(ACK)
                        && lines_tx.send(key.to_owned()).is_err()
                    {
                        break;
                    }
                }
            });
            let mut acked = vec![lines_rx.recv_timeout(FIRST_ACK_WAIT).unwrap_or_else(|err| {
                panic!(
                    "seed {CRASH_SEED:#x} round {round}: no acknowledgement from the child: {err}"
                )
            })];
            std::thread::sleep(delay);
            child.kill().unwrap();
            child.wait().unwrap();
            reader.join().unwrap();
            acked.extend(lines_rx.try_iter());

            let store = RedbStore::open(&path, Arc::new(SystemClock)).unwrap();
            rt().block_on(async {
                let stored: BTreeSet<String> = store
                    .list(&format!("/crash/{round}/"))
                    .await
                    .unwrap()
                    .into_iter()
                    .map(|(key, _)| key)
                    .collect();
                for key in &acked {
                    assert!(
                        stored.contains(key),
                        "seed {CRASH_SEED:#x} round {round}: acknowledged {key} lost \
                         ({} acknowledged, {} stored)",
                        acked.len(),
                        stored.len()
                    );
                    let i: u64 = key.rsplit('/').next().unwrap().parse().unwrap();
                    if i % 2 == 1 {
                        // Both keys of a transaction, or neither.
                        assert!(stored.contains(&format!("{key}/pair")), "{key}/pair lost");
                    }
                }
                // Everything stored was written by this round's child, in
                // order: at most one unacknowledged write at the end.
                let singles = stored.iter().filter(|k| !k.ends_with("/pair")).count();
                println!(
                    "round {round}: killed after {delay:?}, {} acknowledged, {singles} stored",
                    acked.len()
                );
                assert!(
                    singles == acked.len() || singles == acked.len() + 1,
                    "round {round}: {singles} stored vs {} acknowledged",
                    acked.len()
                );
                for key in &earlier {
                    assert!(
                        store.get(key).await.unwrap().is_some(),
                        "round {round}: {key} of an earlier round lost"
                    );
                }
            });
            drop(store);
            earlier.extend(acked);
        }
    }
}
