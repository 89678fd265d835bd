//! Disk faults under the embedded store: a full filesystem (a real,
//! loop-mounted ext4 from `tributary_test_support::loop_fs`; these tests
//! need root, mkfs.ext4, mount and losetup and FAIL without them) and a
//! damaged file (bytes overwritten in the middle, truncated, emptied,
//! deleted).

use std::io::{Seek, SeekFrom, Write};
use std::path::Path;
use std::sync::Arc;

use serde_json::json;
use tributary_test_support::loop_fs::LoopFs;

use super::*;
use crate::clock::ManualClock;
use crate::metadata::MetadataStore;

/// The clock reading the tests start at, ms since the Unix epoch.
const START_MS: u64 = 1_700_000_000_000;
/// Keys written before the fault.
const KEYS: usize = 300;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

fn clock() -> Arc<ManualClock> {
    Arc::new(ManualClock::new(START_MS))
}

/// A store at `path` holding [`KEYS`] small keys, written one commit each.
fn populate(path: &Path) {
    let store = RedbStore::open(path, clock()).unwrap();
    rt().block_on(async {
        for i in 0..KEYS {
            store
                .put(&format!("/edge/checkpoints/e/t{i:04}"), json!(i * 100))
                .await
                .unwrap();
        }
    });
}

/// Puts 256 KiB values until one fails; returns that error.
async fn write_until_failure(store: &RedbStore) -> MetadataError {
    let big = json!("x".repeat(256 * 1024));
    for i in 0..1000 {
        if let Err(e) = store.put(&format!("/big/{i}"), big.clone()).await {
            return e;
        }
    }
    panic!("1000 writes of 256 KiB fitted on a full 16 MiB filesystem");
}

#[test]
fn an_initialised_store_opens_and_reads_on_a_full_filesystem() {
    let dir = tempfile::tempdir().unwrap();
    let fs = LoopFs::create(dir.path(), 16 * 1024 * 1024);
    let path = fs.path().join("metadata.redb");
    populate(&path);
    // A copy taken while a store has the file open is what a crash leaves
    // (redb must repair it at open).
    let crashed = fs.path().join("crashed.redb");
    {
        let _open = RedbStore::open(&path, clock()).unwrap();
        std::fs::copy(&path, &crashed).unwrap();
    }
    fs.fill();
    assert_eq!(fs.available_bytes(), 0);
    for file in [&path, &crashed] {
        let store = RedbStore::open(file, clock())
            .unwrap_or_else(|e| panic!("{} on a full filesystem: {e}", file.display()));
        rt().block_on(async {
            let entries = store.list("/edge/checkpoints/").await.unwrap();
            assert_eq!(entries.len(), KEYS, "{}", file.display());
            assert_eq!(entries[7].1, json!(700));
        });
    }
}

#[test]
fn writes_fail_typed_on_a_full_filesystem_and_resume_once_space_is_freed() {
    let dir = tempfile::tempdir().unwrap();
    let fs = LoopFs::create(dir.path(), 16 * 1024 * 1024);
    let path = fs.path().join("metadata.redb");
    populate(&path);
    let store = RedbStore::open(&path, clock()).unwrap();
    fs.fill();
    rt().block_on(async {
        let err = write_until_failure(&store).await;
        assert!(
            err.is_disk_full(),
            "expected a full-filesystem error, got {err}"
        );
        let text = err.to_string();
        assert!(text.contains(&path.display().to_string()), "{text}");
        assert!(text.contains("no space left"), "{text}");
        assert!(store.is_faulted());
        // Still full: the next write reopens the file, and fails again, typed.
        let again = store.put("/k", json!(1)).await;
        assert!(
            matches!(&again, Err(e) if e.is_disk_full()),
            "second write on the full filesystem: {again:?}"
        );
        // Reads keep working meanwhile.
        assert_eq!(
            store.get("/edge/checkpoints/e/t0003").await.unwrap(),
            Some(json!(300))
        );
        fs.free();
        // The very next write succeeds, on the same handle.
        store.put("/after", json!("free")).await.unwrap();
        assert!(!store.is_faulted());
        assert_eq!(store.get("/after").await.unwrap(), Some(json!("free")));
        assert_eq!(store.list("/edge/checkpoints/").await.unwrap().len(), KEYS);
    });
    drop(store);
    // What was acknowledged is in the file.
    let store = RedbStore::open(&path, clock()).unwrap();
    rt().block_on(async {
        assert_eq!(store.get("/after").await.unwrap(), Some(json!("free")));
    });
}

/// Applies `damage` to a populated store and opens it with
/// `open_or_recover`: the damaged file is moved aside, the new store is
/// empty and writable. Returns the report.
fn recover_after(name: &str, damage: impl FnOnce(&Path)) -> StoreOpenReport {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("metadata.redb");
    populate(&path);
    let original = std::fs::read(&path).unwrap();
    damage(&path);
    let clock = clock();
    assert!(
        matches!(
            RedbStore::open(&path, clock.clone()),
            Err(MetadataError::Damaged { .. })
        ),
        "{name}: a plain open must report the damage"
    );
    let (store, report) = RedbStore::open_or_recover(&path, clock).unwrap();
    assert!(report.created, "{name}");
    let aside = report.moved_aside.clone().expect("moved aside");
    assert_eq!(
        aside,
        dir.path()
            .join(format!("metadata.redb.damaged-{}", START_MS / 1000)),
        "{name}"
    );
    // The damaged bytes are kept as they were.
    let kept = std::fs::read(&aside).unwrap();
    assert!(kept.len() <= original.len(), "{name}");
    assert!(report.damage.is_some(), "{name}");
    rt().block_on(async {
        assert!(store.list("/").await.unwrap().is_empty(), "{name}");
        store.put("/fresh", json!(1)).await.unwrap();
        assert_eq!(store.get("/fresh").await.unwrap(), Some(json!(1)));
    });
    report
}

#[test]
fn a_store_damaged_in_the_middle_is_moved_aside_and_replaced() {
    let report = recover_after("middle", |path| {
        let len = std::fs::metadata(path).unwrap().len();
        let mut file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
        // Every other page from the middle on: some of them are in use.
        let mut at = len / 2;
        while at + 512 < len {
            file.seek(SeekFrom::Start(at)).unwrap();
            file.write_all(&[0xAB; 512]).unwrap();
            at += 8192;
        }
        file.sync_all().unwrap();
    });
    println!("{report:?}");
}

#[test]
fn a_truncated_store_is_moved_aside_and_replaced() {
    recover_after("half", |path| {
        let len = std::fs::metadata(path).unwrap().len();
        std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .unwrap()
            .set_len(len / 2)
            .unwrap();
    });
    recover_after("header only", |path| {
        std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .unwrap()
            .set_len(100)
            .unwrap();
    });
    recover_after("empty", |path| {
        std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .unwrap()
            .set_len(0)
            .unwrap();
    });
}

#[test]
fn a_store_with_a_bad_header_is_moved_aside_and_replaced() {
    recover_after("header", |path| {
        let mut file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
        file.write_all(&[0u8; 64]).unwrap();
    });
}

#[test]
fn a_store_holding_a_value_that_is_not_json_is_moved_aside() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("metadata.redb");
    populate(&path);
    {
        let db = Database::open(&path).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(KV)
            .unwrap()
            .insert("/bad", b"{not json".as_slice())
            .unwrap();
        txn.commit().unwrap();
    }
    let (_store, report) = RedbStore::open_or_recover(&path, clock()).unwrap();
    assert!(report.recovered());
    assert!(report.damage.unwrap().contains("/bad"));
}

#[test]
fn a_deleted_or_intact_store_is_not_moved_aside() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("metadata.redb");
    let (store, report) = RedbStore::open_or_recover(&path, clock()).unwrap();
    assert!(report.created && !report.recovered());
    drop(store);
    populate(&path);
    let (store, report) = RedbStore::open_or_recover(&path, clock()).unwrap();
    assert!(!report.created && !report.recovered(), "{report:?}");
    rt().block_on(async {
        assert_eq!(store.list("/").await.unwrap().len(), KEYS);
    });
    // Held by another store is not damage: refused, file untouched.
    assert!(matches!(
        RedbStore::open_or_recover(&path, clock()),
        Err(MetadataError::InUse { .. })
    ));
    drop(store);
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("metadata.redb")]);
}
