//! WAL behaviour on real files (tempdir, real fsync) and on the simulated
//! power-cut disk. Each recovery-table row of `recovery.rs` has a test here.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use rand::{RngExt, SeedableRng, rngs::StdRng};

use super::mark::MARK_FILE_NAME;
use super::segment::{index_file_name, log_file_name};
use super::sim::SimStorage;
use crate::clock::{Clock, ManualClock};

use super::*;
use tributary_proto::batch::{Codec, EncodedBatch, Record, RecordBatch};
use tributary_proto::limits::Limits;

pub(super) fn record(id: &str) -> Record {
    Record {
        timestamp_ms: 1_700_000_000_000,
        key: Some(Bytes::from(format!("k-{id}"))),
        headers: vec![("h".into(), Bytes::from_static(b"v"))],
        value: Bytes::from(format!("value-{id}")),
    }
}

pub(super) fn small_config(mode: SyncMode) -> WalConfig {
    WalConfig {
        sync_mode: mode,
        segment_max_bytes: 1024,
        index_interval_bytes: 128,
        limits: Limits {
            max_record_bytes: 1024 - 48,
            max_batch_bytes: 1024,
        },
        max_pending_bytes: 4096,
        ..WalConfig::default()
    }
}

pub(super) fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// Every record from the log start, as (offset, value).
fn read_all(wal: &Wal) -> Vec<(u64, Bytes)> {
    let mut out = Vec::new();
    let mut from = wal.log_start_offset();
    loop {
        let batches = wal.read(from, 64 * 1024).expect("read");
        if batches.is_empty() {
            return out;
        }
        for batch in batches {
            let decoded = batch.decode(&wal.config().limits).expect("decode");
            for (i, r) in decoded.records.into_iter().enumerate() {
                let offset = decoded.base_offset + i as u64;
                if offset >= from {
                    out.push((offset, r.value));
                }
            }
            from = batch.next_offset();
        }
    }
}

fn assert_contiguous(records: &[(u64, Bytes)], start: u64) {
    for (i, (offset, _)) in records.iter().enumerate() {
        assert_eq!(*offset, start + i as u64, "offsets must be contiguous");
    }
}

#[test]
fn appends_get_contiguous_offsets_and_read_back_byte_exact() {
    let dir = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let wal = Wal::open(dir.path(), small_config(SyncMode::FsyncBatch)).unwrap();
        let a = wal
            .append(vec![record("0"), record("1")], Codec::None)
            .await
            .unwrap();
        let b = wal.append(vec![record("2")], Codec::Zstd).await.unwrap();
        assert_eq!((a.base_offset, a.next_offset), (0, 2));
        assert_eq!((b.base_offset, b.next_offset), (2, 3));
        assert_eq!(wal.high_water_mark(), 3);
        let all = read_all(&wal);
        assert_eq!(
            all,
            vec![
                (0, Bytes::from("value-0")),
                (1, Bytes::from("value-1")),
                (2, Bytes::from("value-2"))
            ]
        );
        wal.close().await.unwrap();
        // Offsets continue after a clean restart.
        let wal = Wal::open(dir.path(), small_config(SyncMode::FsyncBatch)).unwrap();
        assert_eq!(wal.high_water_mark(), 3);
        let c = wal.append(vec![record("3")], Codec::None).await.unwrap();
        assert_eq!(c.base_offset, 3);
    });
}

#[test]
fn append_at_accepts_only_the_next_offset() {
    let dir = tempfile::tempdir().unwrap();
    let limits = small_config(SyncMode::FsyncBatch).limits;
    let batch_at = |base: u64, n: usize| {
        RecordBatch::new(base, (0..n).map(|i| record(&i.to_string())).collect())
            .encode(&limits)
            .unwrap()
    };
    rt().block_on(async {
        let wal = Wal::open(dir.path(), small_config(SyncMode::FsyncBatch)).unwrap();
        let first = batch_at(0, 3);
        assert_eq!(
            wal.append_at(first.clone()).await.unwrap(),
            AppendAtOutcome::Appended(AppendAck {
                base_offset: 0,
                next_offset: 3
            })
        );
        // The same range again: duplicate, nothing written.
        let size = wal.size_bytes();
        assert_eq!(
            wal.append_at(first).await.unwrap(),
            AppendAtOutcome::Duplicate(AppendAck {
                base_offset: 0,
                next_offset: 3
            })
        );
        // Offsets already stored, but not the stored batch: another log's
        // records (two devices under one edge id). Refused, not a duplicate.
        assert!(matches!(
            wal.append_at(batch_at(1, 1)).await,
            Err(WalError::NotStoredBatch {
                base: 1,
                next: 2,
                ..
            })
        ));
        let other = RecordBatch::new(0, vec![record("x"), record("y"), record("z")])
            .encode(&limits)
            .unwrap();
        let refused = wal.append_at(other).await.unwrap_err();
        assert!(
            matches!(
                refused,
                WalError::NotStoredBatch {
                    base: 0,
                    next: 3,
                    ..
                }
            ),
            "{refused}"
        );
        assert_eq!(wal.size_bytes(), size);
        assert!(matches!(
            wal.append_at(batch_at(5, 1)).await,
            Err(WalError::Gap {
                expected: 3,
                got: 5
            })
        ));
        assert!(matches!(
            wal.append_at(batch_at(2, 2)).await,
            Err(WalError::Overlap {
                expected: 3,
                base: 2,
                next: 4
            })
        ));
        assert_eq!(wal.high_water_mark(), 3);
        // Stored verbatim: the bytes read back are the bytes given.
        let next = batch_at(3, 2);
        wal.append_at(next.clone()).await.unwrap();
        let read = wal.read(3, 1 << 20).unwrap();
        assert_eq!(read[0].as_bytes(), next.as_bytes());
    });
}

#[test]
fn oversized_batches_are_refused_with_the_limit_named() {
    let dir = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let wal = Wal::open(dir.path(), small_config(SyncMode::FsyncBatch)).unwrap();
        let big = Record {
            value: Bytes::from(vec![0u8; 1000]),
            ..Record::default()
        };
        let err = wal.append(vec![big], Codec::None).await.unwrap_err();
        assert!(err.to_string().contains("max_record_bytes"), "{err}");
        let many: Vec<Record> = (0..4)
            .map(|_| Record {
                value: Bytes::from(vec![0u8; 300]),
                ..Record::default()
            })
            .collect();
        let err = wal.append(many, Codec::None).await.unwrap_err();
        assert!(err.to_string().contains("max_batch_bytes"), "{err}");
        assert_eq!(wal.high_water_mark(), 0);
        assert_eq!(wal.size_bytes(), 0);
    });
}

#[test]
fn invalid_config_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let config = WalConfig {
        segment_max_bytes: 100,
        ..small_config(SyncMode::FsyncBatch)
    };
    let err = Wal::open(dir.path(), config).unwrap_err();
    assert!(err.to_string().contains("segment_max_bytes"), "{err}");
}

/// A record batch of exactly `size` bytes (one record).
pub(super) fn batch_of_size(size: usize) -> Vec<Record> {
    // 48 header + 4 fixed record bytes + 2-byte value length varint.
    let value_len = size - 48 - 4 - 2;
    vec![Record {
        timestamp_ms: 5,
        value: Bytes::from(vec![b'z'; value_len]),
        ..Record::default()
    }]
}

#[test]
fn segments_roll_at_the_size_limit_and_seal() {
    let dir = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let wal = Wal::open(dir.path(), small_config(SyncMode::OsCacheFlush)).unwrap();
        // A batch exactly segment_max_bytes fills a segment on its own.
        wal.append(batch_of_size(1024), Codec::None).await.unwrap();
        // Two 500-byte batches share the next; the third rolls.
        for _ in 0..3 {
            wal.append(batch_of_size(500), Codec::None).await.unwrap();
        }
        let sealed = wal.sealed_segments();
        let ranges: Vec<(u64, u64, u64)> = sealed
            .iter()
            .map(|s| (s.base_offset, s.next_offset, s.bytes))
            .collect();
        assert_eq!(ranges, vec![(0, 1, 1024), (1, 3, 1000)]);
        assert!(sealed.iter().all(|s| s.index_path.exists()));
        // The tier service's view from another process agrees.
        assert_eq!(list_sealed_segments(dir.path()).unwrap(), sealed);
        // Reads at the first and last offset of each segment.
        for offset in [0, 1, 2, 3] {
            let batches = wal.read(offset, 1).unwrap();
            assert_eq!(batches.len(), 1);
            assert_eq!(batches[0].base_offset(), offset);
        }
    });
}

#[test]
fn index_lookup_finds_every_offset_in_a_large_segment() {
    let dir = tempfile::tempdir().unwrap();
    let config = WalConfig {
        segment_max_bytes: 1 << 20,
        index_interval_bytes: 256,
        ..small_config(SyncMode::OsCacheFlush)
    };
    rt().block_on(async {
        let wal = Wal::open(dir.path(), config).unwrap();
        for i in 0..500 {
            let n = i % 3 + 1;
            let records = (0..n).map(|j| record(&format!("{i}-{j}"))).collect();
            wal.append(records, Codec::None).await.unwrap();
        }
        let hwm = wal.high_water_mark();
        let all = read_all(&wal);
        assert_eq!(all.len() as u64, hwm);
        for offset in (0..hwm).step_by(7).chain([hwm - 1]) {
            let batches = wal.read(offset, 1).unwrap();
            let b = &batches[0];
            assert!(b.base_offset() <= offset && offset < b.next_offset());
        }
        assert!(wal.read(hwm, 1).unwrap().is_empty());
    });
}

#[test]
fn segments_roll_by_age() {
    let dir = tempfile::tempdir().unwrap();
    let config = WalConfig {
        segment_max_age: Some(Duration::from_millis(30)),
        ..small_config(SyncMode::FsyncBatch)
    };
    rt().block_on(async {
        let wal = Wal::open(dir.path(), config).unwrap();
        wal.append(vec![record("a")], Codec::None).await.unwrap();
        // Bounded wait for the writer's age timer (no busy loop: 10 ms steps).
        for _ in 0..200 {
            if !wal.sealed_segments().is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let sealed = wal.sealed_segments();
        assert_eq!(sealed.len(), 1);
        assert_eq!((sealed[0].base_offset, sealed[0].next_offset), (0, 1));
        // An empty active segment never rolls by age.
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(wal.sealed_segments().len(), 1);
    });
}

#[test]
fn explicit_roll_seals_and_empty_roll_is_a_no_op() {
    let dir = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let wal = Wal::open(dir.path(), small_config(SyncMode::Async)).unwrap();
        wal.roll().await.unwrap();
        assert!(wal.sealed_segments().is_empty());
        wal.append(vec![record("a")], Codec::None).await.unwrap();
        wal.roll().await.unwrap();
        assert_eq!(wal.sealed_segments().len(), 1);
        assert_eq!(wal.sealed_segments()[0].next_offset, 1);
        wal.roll().await.unwrap();
        assert_eq!(wal.sealed_segments().len(), 1);
    });
}

#[test]
fn retention_deletes_only_safe_segments_and_only_when_a_limit_asks() {
    let dir = tempfile::tempdir().unwrap();
    let config = WalConfig {
        retention_max_bytes: Some(1500),
        ..small_config(SyncMode::FsyncBatch)
    };
    rt().block_on(async {
        let wal = Wal::open(dir.path(), config).unwrap();
        for _ in 0..4 {
            wal.append(batch_of_size(1024), Codec::None).await.unwrap();
        }
        // Segments [0,1) [1,2) [2,3) sealed, [3,4) active: 4096 bytes.
        assert_eq!(wal.sealed_segments().len(), 3);
        // Nothing is safe: nothing deleted, however far over the limit.
        assert_eq!(wal.apply_retention(0, 0).unwrap().deleted, vec![]);
        // Only the first segment is safe.
        let report = wal.apply_retention(1, 0).unwrap();
        assert_eq!(report.deleted, vec![(0, 1, 1024)]);
        assert_eq!(report.log_start, 1);
        assert!(!dir.path().join(log_file_name(0)).exists());
        assert!(!dir.path().join(index_file_name(0)).exists());
        assert!(matches!(
            wal.read(0, 10),
            Err(WalError::OffsetBelowLogStart {
                requested: 0,
                log_start: 1
            })
        ));
        // Everything is safe: deletes down to the limit, never the active one.
        let report = wal.apply_retention(u64::MAX, 0).unwrap();
        assert_eq!(report.deleted, vec![(1, 2, 1024), (2, 3, 1024)]);
        assert_eq!(wal.log_start_offset(), 3);
        assert_eq!(wal.apply_retention(u64::MAX, 0).unwrap().deleted, vec![]);
        wal.close().await.unwrap();
        // The high-water mark and log start survive the restart.
        let wal = Wal::open(dir.path(), small_config(SyncMode::FsyncBatch)).unwrap();
        assert_eq!((wal.log_start_offset(), wal.high_water_mark()), (3, 4));
    });
}

#[test]
fn retention_by_age_uses_the_newest_record_timestamp() {
    let dir = tempfile::tempdir().unwrap();
    let config = WalConfig {
        retention_max_age: Some(Duration::from_secs(60)),
        ..small_config(SyncMode::FsyncBatch)
    };
    rt().block_on(async {
        let wal = Wal::open(dir.path(), config).unwrap();
        for _ in 0..3 {
            wal.append(batch_of_size(1024), Codec::None).await.unwrap();
        }
        // Records carry timestamp 5 ms; at 60 s + 5 ms they are exactly 60 s old.
        assert_eq!(
            wal.apply_retention(u64::MAX, 60_005).unwrap().deleted,
            vec![]
        );
        let report = wal.apply_retention(u64::MAX, 60_006).unwrap();
        assert_eq!(report.deleted, vec![(0, 1, 1024), (1, 2, 1024)]);
    });
}

#[test]
fn tailing_read_wakes_on_append_without_polling() {
    let dir = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let wal = Arc::new(Wal::open(dir.path(), small_config(SyncMode::FsyncBatch)).unwrap());
        let reader = {
            let wal = wal.clone();
            tokio::spawn(async move { wal.wait_for_offset(0).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!reader.is_finished());
        wal.append(vec![record("x")], Codec::None).await.unwrap();
        let hwm = tokio::time::timeout(Duration::from_secs(5), reader)
            .await
            .expect("reader woke")
            .unwrap()
            .unwrap();
        assert_eq!(hwm, 1);
    });
}

#[test]
fn concurrent_appends_share_fdatasync_calls() {
    let storage = SimStorage::new();
    rt().block_on(async {
        let wal = Arc::new(
            Wal::open_with(
                Arc::new(storage.clone()),
                "/wal",
                WalConfig {
                    flush_interval: Duration::from_millis(20),
                    ..small_config(SyncMode::FsyncBatch)
                },
            )
            .unwrap(),
        );
        let tasks: Vec<_> = (0..16)
            .map(|i| {
                let wal = wal.clone();
                tokio::spawn(
                    async move { wal.append(vec![record(&i.to_string())], Codec::None).await },
                )
            })
            .collect();
        let mut offsets = Vec::new();
        for t in tasks {
            offsets.push(t.await.unwrap().unwrap().base_offset);
        }
        offsets.sort_unstable();
        assert_eq!(offsets, (0..16).collect::<Vec<_>>());
        // 16 appends within one 20 ms window: far fewer syncs than appends
        // (segment rolls add a sync each).
        let syncs = storage.sync_count();
        assert!(syncs < 8, "{syncs} fdatasync calls for 16 appends");
    });
}

/// Appends `batches` batches of one 512 KiB record each to a WAL on `storage`
/// in `mode` (default segment size, 64 MiB).
fn append_half_mib_batches(storage: &SimStorage, mode: SyncMode, batches: usize) {
    rt().block_on(async {
        let wal = Wal::open_with(
            Arc::new(storage.clone()),
            "/wal",
            WalConfig {
                sync_mode: mode,
                ..WalConfig::default()
            },
        )
        .unwrap();
        for i in 0..batches {
            let value = Bytes::from(vec![i as u8; 512 * 1024]);
            let rec = Record {
                value,
                ..record(&i.to_string())
            };
            wal.append(vec![rec], Codec::None).await.unwrap();
        }
        wal.close().await.unwrap();
    });
}

#[test]
fn writeback_starts_behind_the_writer_without_per_group_fdatasync() {
    // 40 batches of ~512 KiB: ~20 MiB in one segment. Write-behind every
    // 8 MiB: two ranges, back to back from the start of the file.
    let storage = SimStorage::new();
    append_half_mib_batches(&storage, SyncMode::OsCacheFlush, 40);
    let ranges = storage.writeback_ranges();
    assert_eq!(ranges.len(), 2, "{ranges:?}");
    assert_eq!(ranges[0].0, 0);
    assert_eq!(ranges[1].0, ranges[0].1, "contiguous: {ranges:?}");
    for (_, len) in &ranges {
        assert!((8 << 20..9 << 20).contains(len), "{ranges:?}");
    }
    // fsync_batch syncs every group: nothing to write behind.
    let storage = SimStorage::new();
    append_half_mib_batches(&storage, SyncMode::FsyncBatch, 40);
    assert_eq!(storage.writeback_ranges(), vec![]);
}

#[test]
fn large_and_small_batches_keep_their_order_offsets_and_bytes_across_a_reopen() {
    // Large batches (>= 16 KiB) reach the file from the caller's buffer,
    // re-addressed in place; small ones are copied. Interleaved, in both
    // sync modes that write differently, they must read back in order with
    // the offsets the WAL assigned, before and after a reopen (which
    // verifies every CRC).
    for mode in [SyncMode::OsCacheFlush, SyncMode::FsyncBatch] {
        let dir = tempfile::tempdir().unwrap();
        let sizes = [40_000usize, 10, 70_000, 20, 30, 16_384, 100_000, 5];
        let config = WalConfig {
            sync_mode: mode,
            ..WalConfig::default()
        };
        rt().block_on(async {
            let wal = Wal::open(dir.path(), config.clone()).unwrap();
            for (i, &size) in sizes.iter().enumerate() {
                let rec = Record {
                    value: Bytes::from(vec![i as u8; size]),
                    ..record(&i.to_string())
                };
                let ack = wal
                    .append(vec![rec.clone(), rec], Codec::None)
                    .await
                    .unwrap();
                assert_eq!(ack.base_offset, 2 * i as u64);
            }
            wal.close().await.unwrap();
        });
        let wal = Wal::open(dir.path(), config).unwrap();
        let batches = wal.read(0, usize::MAX).unwrap();
        assert_eq!(batches.len(), sizes.len(), "{mode:?}");
        for (i, batch) in batches.iter().enumerate() {
            let decoded = batch.decode(&Limits::default()).unwrap();
            assert_eq!(decoded.base_offset, 2 * i as u64, "{mode:?}");
            assert_eq!(decoded.records.len(), 2);
            for rec in &decoded.records {
                assert_eq!(
                    rec.value,
                    Bytes::from(vec![i as u8; sizes[i]]),
                    "{mode:?} batch {i}"
                );
            }
        }
        rt().block_on(wal.close()).unwrap();
    }
}

/// The stored bytes of each batch, copied out.
fn contents(batches: &[EncodedBatch]) -> Vec<Vec<u8>> {
    batches.iter().map(|b| b.as_bytes().to_vec()).collect()
}

#[test]
fn read_buffers_are_reused_only_once_nothing_refers_to_them() {
    let dir = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let wal = Wal::open(dir.path(), WalConfig::default()).unwrap();
        for i in 0..10 {
            wal.append(vec![record(&format!("{i:03}"))], Codec::None)
                .await
                .unwrap();
        }
        let mut buffers = ReadBuffers::new();
        let first = wal.read_with(0, 1 << 20, &mut buffers).unwrap();
        let first_bytes = contents(&first);
        assert_eq!(first.len(), 10);
        // `first` still holds its buffer: a read from elsewhere must not
        // overwrite it.
        let second = wal.read_with(5, 1 << 20, &mut buffers).unwrap();
        assert_eq!(second[0].base_offset(), 5);
        assert_ne!(second[0].as_bytes().as_ptr(), first[5].as_bytes().as_ptr());
        assert_eq!(contents(&first), first_bytes);
        let first_at = first[0].as_bytes().as_ptr();
        drop(first);
        drop(second);
        // Nothing refers to the buffers any more: the next read reuses the
        // first one, and reads the same bytes into it.
        let third = wal.read_with(0, 1 << 20, &mut buffers).unwrap();
        assert_eq!(third[0].as_bytes().as_ptr(), first_at);
        assert_eq!(contents(&third), first_bytes);
        assert_eq!(buffers.len(), 2);
        buffers.clear();
        assert!(buffers.is_empty());
        wal.close().await.unwrap();
    });
}

// ---- recovery table rows -------------------------------------------------

pub(super) fn segment_path(dir: &Path, base: u64) -> PathBuf {
    dir.join(log_file_name(base))
}

/// Appends `n` one-record batches, returning the WAL closed.
pub(super) fn fill(dir: &Path, config: &WalConfig, n: usize) {
    rt().block_on(async {
        let wal = Wal::open(dir, config.clone()).unwrap();
        for i in 0..n {
            wal.append(vec![record(&format!("{i:03}"))], Codec::None)
                .await
                .unwrap();
        }
        wal.close().await.unwrap();
    });
}

#[test]
fn recovery_empty_directory_starts_at_initial_offset() {
    let dir = tempfile::tempdir().unwrap();
    let config = WalConfig {
        initial_offset: 1000,
        ..small_config(SyncMode::FsyncBatch)
    };
    let wal = Wal::open(dir.path(), config).unwrap();
    assert_eq!(wal.high_water_mark(), 1000);
    assert_eq!(wal.recovery_report().created_segment, Some(1000));
}

#[test]
fn recovery_removes_tmp_files_and_reports_and_keeps_orphan_indexes() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config(SyncMode::FsyncBatch);
    fill(dir.path(), &config, 3);
    std::fs::write(dir.path().join("00000000000000000009.index.tmp"), b"junk").unwrap();
    std::fs::write(dir.path().join(index_file_name(77)), b"orphan").unwrap();
    let wal = Wal::open(dir.path(), config).unwrap();
    let report = wal.recovery_report();
    assert_eq!(
        report.removed_leftovers,
        vec!["00000000000000000009.index.tmp".to_string()]
    );
    // An index whose data is gone: lost data, reported, its index kept.
    assert_eq!(report.lost_segments, vec![(77, None)]);
    assert!(dir.path().join(index_file_name(77)).exists());
    assert_eq!(wal.high_water_mark(), 3);
}

#[test]
fn a_deleted_oldest_segment_is_reported_lost_and_damaged_and_retention_leaves_no_orphan() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config(SyncMode::FsyncBatch);
    fill(dir.path(), &config, 45);
    let wal = Wal::open(dir.path(), config.clone()).unwrap();
    let sealed = wal.sealed_segments();
    assert!(sealed.len() >= 3, "{sealed:?}");
    drop(wal);
    // The oldest segment's data deleted by someone else: reported with the
    // range its index names.
    std::fs::remove_file(&sealed[0].log_path).unwrap();
    let wal = Wal::open(dir.path(), config.clone()).unwrap();
    assert_eq!(
        wal.recovery_report().lost_segments,
        vec![(sealed[0].base_offset, Some(sealed[0].next_offset))]
    );
    // Its range is damaged (re-fetched by the broker), not cut off.
    assert_eq!(wal.log_start_offset(), sealed[0].base_offset);
    assert_eq!(
        wal.damaged_ranges()
            .iter()
            .map(|r| (r.first_offset, r.end_offset))
            .collect::<Vec<_>>(),
        vec![(sealed[0].base_offset, sealed[0].next_offset)]
    );
    assert!(sealed[0].index_path.exists(), "the evidence is kept");
    drop(wal);
    std::fs::remove_file(&sealed[0].index_path).unwrap();
    // Both files gone by hand: the range is still missing from the log's
    // recorded start; retention then removes it and the next segment, and
    // what retention removed is not reported.
    let wal = Wal::open(
        dir.path(),
        WalConfig {
            retention_max_bytes: Some(1),
            ..config.clone()
        },
    )
    .unwrap();
    let deleted = wal.apply_retention(sealed[1].next_offset, 0).unwrap();
    assert_eq!(deleted.deleted.len(), 2);
    assert!(!sealed[1].index_path.exists() && !sealed[1].log_path.exists());
    drop(wal);
    let wal = Wal::open(dir.path(), config).unwrap();
    assert_eq!(wal.recovery_report().lost_segments, vec![]);
    assert_eq!(wal.log_start_offset(), sealed[2].base_offset);
}

#[test]
fn recovery_creates_the_next_segment_after_a_crash_between_seal_and_create() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config(SyncMode::FsyncBatch);
    rt().block_on(async {
        let wal = Wal::open(dir.path(), config.clone()).unwrap();
        wal.append(batch_of_size(1024), Codec::None).await.unwrap();
        wal.append(batch_of_size(100), Codec::None).await.unwrap();
        wal.close().await.unwrap();
    });
    // Undo "create the next segment": only the sealed segment remains, and
    // the sync mark still describes it (no group reached segment 1 yet).
    std::fs::remove_file(segment_path(dir.path(), 1)).unwrap();
    std::fs::remove_file(dir.path().join(MARK_FILE_NAME)).unwrap();
    let wal = Wal::open(dir.path(), config).unwrap();
    assert_eq!(wal.recovery_report().created_segment, Some(1));
    assert_eq!(wal.high_water_mark(), 1);
    assert_eq!(wal.sealed_segments().len(), 1);
}

#[test]
fn recovery_seals_a_non_last_segment_left_without_index() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config(SyncMode::FsyncBatch);
    rt().block_on(async {
        let wal = Wal::open(dir.path(), config.clone()).unwrap();
        wal.append(batch_of_size(1024), Codec::None).await.unwrap();
        wal.append(batch_of_size(100), Codec::None).await.unwrap();
        wal.close().await.unwrap();
    });
    std::fs::remove_file(dir.path().join(index_file_name(0))).unwrap();
    let wal = Wal::open(dir.path(), config).unwrap();
    assert_eq!(wal.recovery_report().sealed_on_open, vec![0]);
    assert_eq!(wal.high_water_mark(), 2);
    assert!(dir.path().join(index_file_name(0)).exists());
}

#[test]
fn recovery_ignores_bytes_appended_to_a_sealed_segment() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config(SyncMode::FsyncBatch);
    rt().block_on(async {
        let wal = Wal::open(dir.path(), config.clone()).unwrap();
        wal.append(batch_of_size(1024), Codec::None).await.unwrap();
        wal.append(batch_of_size(100), Codec::None).await.unwrap();
        wal.close().await.unwrap();
    });
    // Longer than its index says (a shorter one has lost its end: see
    // `repair_tests`): the topic opens (it stopped the whole edge agent),
    // every record is there and the junk is no part of the log.
    let path = segment_path(dir.path(), 0);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes.extend_from_slice(&[0x5a; 100]);
    std::fs::write(&path, &bytes).unwrap();
    let wal = Wal::open(dir.path(), config).unwrap();
    assert_eq!(wal.high_water_mark(), 2);
    assert_eq!(wal.damaged_ranges(), vec![]);
    let records = read_all(&wal);
    assert_eq!(records.len(), 2);
    assert_contiguous(&records, 0);
}

#[test]
fn recovery_truncates_a_zero_filled_tail() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config(SyncMode::FsyncBatch);
    fill(dir.path(), &config, 2);
    let path = segment_path(dir.path(), 0);
    let len = std::fs::metadata(&path).unwrap().len();
    let mut bytes = std::fs::read(&path).unwrap();
    bytes.extend_from_slice(&[0u8; 300]);
    std::fs::write(&path, &bytes).unwrap();
    let wal = Wal::open(dir.path(), config).unwrap();
    let torn = wal.recovery_report().truncated.clone().unwrap();
    assert_eq!((torn.position, torn.bytes_removed), (len, 300));
    assert_eq!(std::fs::metadata(&path).unwrap().len(), len);
    assert_eq!(wal.high_water_mark(), 2);
}

// ---- torn tails ------------------------------------------------------------

#[test]
fn torn_tail_truncation_and_bit_flips_recover_to_the_last_valid_batch() {
    let config = small_config(SyncMode::FsyncBatch);
    let base = tempfile::tempdir().unwrap();
    fill(base.path(), &config, 6);
    let pristine = std::fs::read(segment_path(base.path(), 0)).unwrap();
    let boundaries: Vec<usize> = {
        // Batch end positions in the pristine active segment.
        let wal = Wal::open(base.path(), config.clone()).unwrap();
        let batches = wal.read(0, 1 << 20).unwrap();
        let mut at = 0;
        batches
            .iter()
            .map(|b| {
                at += b.len();
                at
            })
            .collect()
    };
    assert_eq!(*boundaries.last().unwrap(), pristine.len());
    let mut rng = StdRng::seed_from_u64(0x7041_1a11);
    for case in 0..200 {
        let dir = tempfile::tempdir().unwrap();
        let mut bytes = pristine.clone();
        let last_start = boundaries[boundaries.len() - 2];
        if case % 2 == 0 {
            bytes.truncate(rng.random_range(0..pristine.len()));
        } else {
            for _ in 0..rng.random_range(1..4) {
                let at = rng.random_range(last_start..pristine.len());
                bytes[at] ^= 1 << rng.random_range(0..8);
            }
        }
        std::fs::write(segment_path(dir.path(), 0), &bytes).unwrap();
        let expected_batches = boundaries.iter().filter(|&&end| end <= bytes.len()).count();
        let expected_batches = if case % 2 == 1 {
            boundaries.len() - 1
        } else {
            expected_batches
        };
        let wal = Wal::open(dir.path(), config.clone()).unwrap();
        assert_eq!(
            wal.high_water_mark(),
            expected_batches as u64,
            "case {case}"
        );
        let all = read_all(&wal);
        assert_contiguous(&all, 0);
        for (offset, value) in &all {
            assert_eq!(value, &Bytes::from(format!("value-{offset:03}")));
        }
        // Offsets continue from the last valid batch.
        let ack = rt()
            .block_on(wal.append(vec![record("new")], Codec::None))
            .unwrap();
        assert_eq!(ack.base_offset, expected_batches as u64, "case {case}");
    }
}

// ---- power cuts ------------------------------------------------------------

#[test]
fn fsync_batch_survives_200_power_cuts() {
    survive_power_cuts(1, WriterPool::shared(), 0x00c0_ffee);
}

/// Four WALs on one disk share a pool of two writer threads: groups of
/// different topics are written and synced by whichever thread is free, and
/// the cut hits all of them at once.
#[test]
fn fsync_batch_survives_200_power_cuts_with_4_topics_on_2_writer_threads() {
    let pool = WriterPool::new(2).unwrap();
    survive_power_cuts(4, pool, 0x0bad_cafe);
}

/// 200 rounds of: reopen every WAL of `topics` on the same simulated disk,
/// check that every acknowledgement before any earlier cut is there once at
/// its offset, run producers on random topics, cut the power after a random
/// number of acknowledgements.
fn survive_power_cuts(topics: usize, writers: WriterPool, seed: u64) {
    let config = WalConfig {
        flush_interval: Duration::from_micros(200),
        writers,
        ..small_config(SyncMode::FsyncBatch)
    };
    let mut storage = SimStorage::new();
    let mut rng = StdRng::seed_from_u64(seed);
    // Every acknowledged record per topic: offset → value, over all cuts.
    let mut acked_total: Vec<HashMap<u64, Bytes>> = vec![HashMap::new(); topics];
    let runtime = rt();
    for cut in 0..200u64 {
        let wals: Vec<Arc<Wal>> = (0..topics)
            .map(|t| {
                let dir = format!("/topic-{t}");
                Arc::new(
                    Wal::open_with(Arc::new(storage.clone()), dir, config.clone())
                        .unwrap_or_else(|e| panic!("cut {cut}, topic {t}: reopen failed: {e}")),
                )
            })
            .collect();
        // 1. Everything acknowledged before any earlier cut is there, byte
        //    for byte, once, at its offset.
        for (t, wal) in wals.iter().enumerate() {
            let all = read_all(wal);
            assert_contiguous(&all, 0);
            let on_disk: HashMap<u64, Bytes> = all.iter().cloned().collect();
            for (offset, value) in &acked_total[t] {
                assert_eq!(
                    on_disk.get(offset),
                    Some(value),
                    "cut {cut}, topic {t}: offset {offset} lost"
                );
            }
            let mut seen = std::collections::HashSet::new();
            for (_, value) in &all {
                assert!(
                    seen.insert(value.clone()),
                    "cut {cut}, topic {t}: duplicate {value:?}"
                );
            }
        }
        // 2. Appenders run; the power is cut after a random number of acks.
        let acked: Arc<Mutex<Vec<(usize, u64, Bytes)>>> = Arc::default();
        let cut_after = rng.random_range(1..40usize) + topics;
        let producers = rng.random_range(1..6u64) + topics as u64 - 1;
        let snapshot = runtime.block_on(async {
            let mut tasks = Vec::new();
            for p in 0..producers {
                let wals = wals.clone();
                let acked = acked.clone();
                tasks.push(tokio::spawn(async move {
                    for i in 0..1000u64 {
                        let t = ((p + i) % wals.len() as u64) as usize;
                        let id = format!("c{cut}-p{p}-{i}");
                        let value = Bytes::from(format!("value-{id}"));
                        match wals[t].append(vec![record(&id)], Codec::None).await {
                            Ok(ack) => acked.lock().unwrap().push((t, ack.base_offset, value)),
                            Err(_) => return,
                        }
                    }
                }));
            }
            loop {
                if acked.lock().unwrap().len() >= cut_after {
                    break;
                }
                tokio::time::sleep(Duration::from_micros(100)).await;
            }
            // Acks observed before the cut must survive it.
            let before_cut = acked.lock().unwrap().clone();
            let after = storage.power_cut(rng.random());
            for t in &tasks {
                t.abort();
            }
            (before_cut, after)
        });
        let (before_cut, after) = snapshot;
        for (t, offset, value) in before_cut {
            acked_total[t].insert(offset, value);
        }
        drop(wals);
        storage = after;
    }
    for (t, acked) in acked_total.iter().enumerate() {
        assert!(
            acked.len() >= 100,
            "topic {t}: {} acknowledged",
            acked.len()
        );
    }
}

// ---- the writer pool ---------------------------------------------------

/// One writer thread, one topic that always has a group pending: another
/// topic's append is still written, because a WAL yields its thread after
/// one group when another waits.
#[test]
fn a_busy_topic_does_not_starve_another_on_one_writer_thread() {
    let pool = WriterPool::new(1).unwrap();
    // Real files: each group waits for a real fdatasync, during which the
    // busy topic's 32 producers queue the next group.
    let dir = tempfile::tempdir().unwrap();
    let config = WalConfig {
        writers: pool,
        ..small_config(SyncMode::FsyncBatch)
    };
    rt().block_on(async {
        let busy = Arc::new(Wal::open(dir.path().join("busy"), config.clone()).unwrap());
        let quiet = Wal::open(dir.path().join("quiet"), config).unwrap();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut producers = Vec::new();
        for p in 0..32 {
            let busy = busy.clone();
            let stop = stop.clone();
            producers.push(tokio::spawn(async move {
                let mut acked = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) && acked < 1_000_000 {
                    busy.append(vec![record(&format!("p{p}"))], Codec::None)
                        .await
                        .unwrap();
                    acked += 1;
                }
                acked
            }));
        }
        // Let the busy topic fill the thread's time first.
        while busy.high_water_mark() < 100 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let ack = tokio::time::timeout(
            Duration::from_secs(10),
            quiet.append(vec![record("quiet")], Codec::None),
        )
        .await
        .expect("the quiet topic's append was written while the busy one kept appending")
        .unwrap();
        assert_eq!((ack.base_offset, ack.next_offset), (0, 1));
        assert_eq!(quiet.high_water_mark(), 1);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let mut total = 0;
        for p in producers {
            total += p.await.unwrap();
        }
        assert_eq!(
            busy.high_water_mark(),
            total,
            "every busy append acknowledged once"
        );
    });
}

// ---- injected clock ----------------------------------------------------

/// Polls `done` until it holds (panics after 10 s of real time): for state a
/// writer thread reaches on its own, never for a timer.
fn wait_until(what: &str, done: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting: {what}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Wakes the writer as an append would and returns once it has looked at
/// the state again (reading the clock as it is now) and gone idle.
fn nudge_writer(wal: &Wal) {
    let passes = {
        let mut state = wal.shared.state();
        wal.shared.wake(&mut state);
        state.idle_passes
    };
    wait_until("the writer to go idle", || {
        let state = wal.shared.state();
        state.idle_passes > passes && state.sched == super::pool::Sched::Idle
    });
}

#[test]
fn group_commit_window_is_timed_by_the_injected_clock() {
    let storage = SimStorage::new();
    let clock = Arc::new(ManualClock::new(0));
    let config = WalConfig {
        // An hour: only the manual clock can close this window in a test.
        flush_interval: Duration::from_secs(3600),
        clock: clock.clone(),
        ..small_config(SyncMode::FsyncBatch)
    };
    let limits = config.limits;
    let batch_at = |base: u64, id: &str| {
        RecordBatch::new(base, vec![record(id)])
            .encode(&limits)
            .unwrap()
    };
    rt().block_on(async {
        let wal = Wal::open_with(Arc::new(storage.clone()), "/wal", config).unwrap();
        let opened_at = clock.now();
        let a = wal.enqueue_at(batch_at(0, "a")).await.unwrap();
        let b = wal.enqueue_at(batch_at(1, "b")).await.unwrap();
        // The window opened at the injected clock's reading.
        assert_eq!(wal.shared.state().oldest_pending_at, Some(opened_at));
        let syncs = storage.sync_count();
        nudge_writer(&wal);
        assert_eq!(wal.high_water_mark(), 0, "the window is open");
        clock.advance(3_600_000 - 1);
        nudge_writer(&wal);
        assert_eq!(wal.high_water_mark(), 0, "1 ms before the window closes");
        assert_eq!(storage.sync_count(), syncs);
        assert!(a.durable_now().is_none(), "not durable: no answer yet");
        clock.advance(1);
        nudge_writer(&wal);
        assert_eq!(wal.high_water_mark(), 2, "the window closed: one group");
        assert!(
            matches!(b.durable_now(), Some(Ok(AppendAtOutcome::Appended(x))) if x.next_offset == 2),
            "durable now, without waiting: {:?}",
            b.durable_now()
        );
        assert_eq!(storage.sync_count(), syncs + 1, "one fdatasync for both");
        let durable = tokio::time::timeout(Duration::from_secs(10), async {
            (a.durable().await, b.durable().await)
        })
        .await
        .expect("acknowledged once the high-water mark passed them");
        assert!(matches!(durable, (Ok(_), Ok(_))), "{durable:?}");
    });
}

#[test]
fn segment_age_is_timed_by_the_injected_clock() {
    let clock = Arc::new(ManualClock::new(0));
    let config = WalConfig {
        segment_max_age: Some(Duration::from_secs(3600)),
        clock: clock.clone(),
        ..small_config(SyncMode::FsyncBatch)
    };
    rt().block_on(async {
        let wal = Wal::open_with(Arc::new(SimStorage::new()), "/wal", config).unwrap();
        wal.append(vec![record("a")], Codec::None).await.unwrap();
        nudge_writer(&wal);
        clock.advance(3_600_000 - 1);
        nudge_writer(&wal);
        assert!(
            wal.sealed_segments().is_empty(),
            "1 ms before the age limit"
        );
        clock.advance(1);
        nudge_writer(&wal);
        let sealed = wal.sealed_segments();
        assert_eq!(sealed.len(), 1, "rolled at the age limit");
        assert_eq!((sealed[0].base_offset, sealed[0].next_offset), (0, 1));
        // An empty active segment never rolls by age.
        clock.advance(2 * 3_600_000);
        nudge_writer(&wal);
        assert_eq!(wal.sealed_segments().len(), 1);
    });
}

// ---- injected I/O failures (fail-stop) ---------------------------------

/// Every call that needs the writer after a failed write or fdatasync
/// returns [`WalError::PreviousIo`]; reads below the high-water mark still
/// work (those bytes were durable).
async fn assert_stopped(wal: &Wal, durable: &[(u64, Bytes)]) {
    let is_previous_io = |r: Result<(), WalError>| matches!(r, Err(WalError::PreviousIo(_)));
    let limits = wal.config().limits;
    let next = RecordBatch::new(wal.high_water_mark(), vec![record("later")])
        .encode(&limits)
        .unwrap();
    assert!(is_previous_io(
        wal.append(vec![record("later")], Codec::None)
            .await
            .map(drop)
    ));
    assert!(is_previous_io(wal.append_at(next.clone()).await.map(drop)));
    assert!(is_previous_io(wal.enqueue_at(next).await.map(drop)));
    assert!(is_previous_io(wal.roll().await));
    assert!(is_previous_io(
        wal.wait_for_offset(wal.high_water_mark()).await.map(drop)
    ));
    assert_eq!(wal.high_water_mark(), durable.len() as u64);
    assert_eq!(read_all(wal), durable);
}

/// Appends "a", injects a fault with `inject`, appends "b" (which fails
/// with the injected error's message), checks the WAL is stopped, then
/// reopens the same disk and finds exactly "a".
fn fail_stop_then_reopen(mode: SyncMode, inject: impl FnOnce(&SimStorage), op: &str) {
    let storage = SimStorage::new();
    let config = small_config(mode);
    rt().block_on(async {
        let wal = Wal::open_with(Arc::new(storage.clone()), "/wal", config.clone()).unwrap();
        wal.append(vec![record("a")], Codec::None).await.unwrap();
        let durable = read_all(&wal);
        inject(&storage);
        let err = wal
            .append(vec![record("b")], Codec::None)
            .await
            .expect_err("the append that hit the fault fails");
        match &err {
            WalError::PreviousIo(message) => {
                assert!(message.starts_with(op), "{message}");
                assert!(message.ends_with("injected fault"), "{message}");
            }
            other => panic!("expected PreviousIo, got {other:?}"),
        }
        assert_stopped(&wal, &durable).await;
        assert!(matches!(wal.close().await, Err(WalError::PreviousIo(_))));

        let wal = Wal::open_with(Arc::new(storage.clone()), "/wal", config).unwrap();
        assert_eq!(wal.next_offset(), 1, "only the durable batch is recovered");
        assert_eq!(read_all(&wal), durable);
        let ack = wal.append(vec![record("c")], Codec::None).await.unwrap();
        assert_eq!(ack.base_offset, 1);
        let values: Vec<Bytes> = read_all(&wal).into_iter().map(|(_, v)| v).collect();
        assert_eq!(values, vec![Bytes::from("value-a"), Bytes::from("value-c")]);
    });
}

#[test]
fn a_failed_fdatasync_stops_the_wal_until_reopened() {
    fail_stop_then_reopen(
        SyncMode::FsyncBatch,
        |disk| disk.fail_next_sync(std::io::Error::other("injected fault")),
        "fdatasync /wal/",
    );
}

#[test]
fn a_failed_write_stops_the_wal_until_reopened() {
    fail_stop_then_reopen(
        SyncMode::OsCacheFlush,
        |disk| disk.fail_next_write(std::io::Error::other("injected fault")),
        "write /wal/",
    );
}

/// An `os_cache_flush` WAL whose records were sent on (the edge) after
/// `mark_durable_through`: whatever a power cut takes of the unsynced
/// tail, those offsets are never handed out again (the lost ones are a
/// hole). Without the call some power cut gives a new record an offset
/// already sent (the control half).
#[test]
fn offsets_made_durable_in_the_mark_survive_any_power_cut() {
    let config = WalConfig {
        segment_max_bytes: 1 << 20,
        ..small_config(SyncMode::OsCacheFlush)
    };
    // The disk after a power cut at 64 random points of the unsynced tail,
    // taken while the WAL is still open (a close would sync everything).
    let cuts = |sync_mark: bool| -> Vec<SimStorage> {
        let storage = SimStorage::new();
        rt().block_on(async {
            let wal = Wal::open_with(Arc::new(storage.clone()), "/wal", config.clone()).unwrap();
            for i in 0..10 {
                wal.append(vec![record(&i.to_string())], Codec::None)
                    .await
                    .unwrap();
            }
            assert_eq!(wal.high_water_mark(), 10);
            if sync_mark {
                let syncs = storage.mark_sync_count();
                wal.mark_durable_through(10).await.unwrap();
                // Already covered: no second sync.
                wal.mark_durable_through(7).await.unwrap();
                assert_eq!(storage.mark_sync_count(), syncs + 1);
            }
            (0..64).map(|seed| storage.power_cut(seed)).collect()
        })
    };
    let next_after = |cut: SimStorage| {
        rt().block_on(async {
            let wal = Wal::open_with(Arc::new(cut), "/wal", config.clone()).unwrap();
            let ack = wal.append(vec![record("new")], Codec::None).await.unwrap();
            ack.base_offset
        })
    };
    for (seed, cut) in cuts(true).into_iter().enumerate() {
        let next = next_after(cut);
        assert!(next >= 10, "seed {seed}: a new record got offset {next}");
    }
    let reused = cuts(false)
        .into_iter()
        .filter(|cut| next_after(cut.clone()) < 10)
        .count();
    assert!(reused > 0, "the control never lost its tail");
}

/// `sync_through` in an `os_cache_flush` WAL: the records below it survive
/// a power cut at any point of what follows; without it some power cut
/// loses them (the control half). One `fdatasync` serves a covered call.
#[test]
fn records_synced_through_survive_any_power_cut_in_os_cache_flush() {
    let config = WalConfig {
        segment_max_bytes: 1 << 20,
        ..small_config(SyncMode::OsCacheFlush)
    };
    let cuts = |sync: bool| -> Vec<SimStorage> {
        let storage = SimStorage::new();
        rt().block_on(async {
            let wal = Wal::open_with(Arc::new(storage.clone()), "/wal", config.clone()).unwrap();
            for i in 0..10 {
                wal.append(vec![record(&i.to_string())], Codec::None)
                    .await
                    .unwrap();
            }
            if sync {
                let syncs = storage.sync_count();
                wal.sync_through(10).await.unwrap();
                wal.sync_through(4).await.unwrap();
                assert_eq!(storage.sync_count(), syncs + 1, "one fdatasync");
            }
            // More records after it, unsynced: the cut may take them.
            for i in 10..20 {
                wal.append(vec![record(&i.to_string())], Codec::None)
                    .await
                    .unwrap();
            }
            (0..64).map(|seed| storage.power_cut(seed)).collect()
        })
    };
    let survivors = |cut: SimStorage| {
        rt().block_on(async {
            let wal = Wal::open_with(Arc::new(cut), "/wal", config.clone()).unwrap();
            // The readable records below 10 (a lost tail reads as a hole).
            let mut out = Vec::new();
            let mut from = 0;
            while from < 10
                && let Ok(batches) = wal.read(from, 64 * 1024)
                && !batches.is_empty()
            {
                for batch in batches {
                    let decoded = batch.decode(&wal.config().limits).unwrap();
                    for (i, r) in decoded.records.into_iter().enumerate() {
                        out.push((decoded.base_offset + i as u64, r.value));
                    }
                    from = batch.next_offset();
                }
            }
            out.retain(|(offset, _)| *offset < 10);
            out
        })
    };
    for (seed, cut) in cuts(true).into_iter().enumerate() {
        let first = survivors(cut);
        let want: Vec<_> = (0..10u64)
            .map(|i| (i, Bytes::from(format!("value-{i}"))))
            .collect();
        assert_eq!(first, want, "seed {seed}");
    }
    let lost = cuts(false)
        .into_iter()
        .filter(|cut| survivors(cut.clone()).len() < 10)
        .count();
    assert!(lost > 0, "the control never lost a synced-through record");
}

/// A handle whose writer was ended (`close_writer`) stays readable, refuses
/// appends, and writes nothing more, also when it is dropped after another
/// handle opened the directory and wrote: the broker ends an old handle's
/// writer before it opens a topic again (an ownership change) while a
/// stream or a consumer may still hold the old one.
#[test]
fn a_handle_whose_writer_ended_writes_nothing_more() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config(SyncMode::FsyncBatch);
    rt().block_on(async {
        let old = Wal::open(dir.path(), config.clone()).unwrap();
        old.append(vec![record("a")], Codec::None).await.unwrap();
        old.close_writer().await.unwrap();
        assert!(matches!(
            old.append(vec![record("x")], Codec::None).await,
            Err(WalError::Closed)
        ));
        assert_eq!(read_all(&old).len(), 1);
        // Nor does it delete or rewrite files (retention, repair).
        assert!(matches!(
            old.apply_retention(u64::MAX, 0),
            Err(WalError::Closed)
        ));

        let new = Wal::open(dir.path(), config.clone()).unwrap();
        new.append(vec![record("b")], Codec::None).await.unwrap();
        new.close_writer().await.unwrap();
        let mark = std::fs::read(dir.path().join(MARK_FILE_NAME)).unwrap();
        let log = std::fs::read(segment_path(dir.path(), 0)).unwrap();
        drop(old);
        assert_eq!(
            std::fs::read(dir.path().join(MARK_FILE_NAME)).unwrap(),
            mark
        );
        assert_eq!(std::fs::read(segment_path(dir.path(), 0)).unwrap(), log);
        drop(new);
    });
    let wal = Wal::open(dir.path(), config).unwrap();
    let values: Vec<Bytes> = read_all(&wal).into_iter().map(|(_, v)| v).collect();
    assert_eq!(values, vec![Bytes::from("value-a"), Bytes::from("value-b")]);
    assert!(wal.damaged_ranges().is_empty());
}
