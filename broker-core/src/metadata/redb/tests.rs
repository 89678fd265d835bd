//! Tests of the embedded store: durability across reopen and SIGKILL
//! (unsynced transactions included),
//! format versions, locking, damaged JSON, runtime misuse.

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
use crate::metadata::MetadataStore;

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
fn a_file_held_by_another_store_is_in_use_a_missing_dir_a_storage_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("meta.redb");
    let _first = RedbStore::open(&path, Arc::new(SystemClock)).unwrap();
    match RedbStore::open(&path, Arc::new(SystemClock)) {
        Err(e @ MetadataError::InUse { .. }) => assert_eq!(
            e.to_string(),
            format!(
                "metadata store {} is in use by another process (another edge-agent or broker on the same data directory?): one process per data directory",
                path.display()
            )
        ),
        other => panic!("expected InUse, got {:?}", other.err()),
    }
    assert!(matches!(
        RedbStore::open(
            dir.path().join("no/such/dir/meta.redb"),
            Arc::new(SystemClock)
        ),
        Err(MetadataError::Storage {
            disk_full: false,
            ..
        })
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
            // Unsynced: on disk with the next synced write, or lost whole.
            let unsynced = Txn::new().put(format!("{key}/unsynced"), json!(i));
            assert!(store.txn_unsynced(unsynced).await.unwrap().applied());
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
            panic!("seed {CRASH_SEED:#x} round {round}: no acknowledgement from the child: {err}")
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
            // An unsynced write reaches the disk with the next synced one:
            // every one followed by an acknowledged write is there.
            for key in acked.iter().rev().skip(1) {
                assert!(
                    stored.contains(&format!("{key}/unsynced")),
                    "seed {CRASH_SEED:#x} round {round}: {key}/unsynced lost though a later synced write was acknowledged"
                );
            }
            // Everything stored was written by this round's child, in
            // order: at most one unacknowledged write at the end.
            let singles = stored
                .iter()
                .filter(|k| !k.ends_with("/pair") && !k.ends_with("/unsynced"))
                .count();
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
