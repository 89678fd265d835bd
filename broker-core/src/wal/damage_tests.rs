//! Damaged bytes, torn tails and declared holes: one named test per row of
//! the recovery table that is about them (`recovery.rs`), in every sync
//! mode, for the active and for sealed segments. The promise checked
//! everywhere: exactly the damaged batches are reported, every other
//! acknowledged record reads back with its own bytes, and no offset is ever
//! handed out twice.

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;

use super::sim::SimStorage;
use super::tests::{fill, record, rt, segment_path, small_config};
use super::*;
use tributary_proto::batch::Codec;
use tributary_proto::limits::Limits;

const MODES: [SyncMode; 3] = [
    SyncMode::FsyncBatch,
    SyncMode::OsCacheFlush,
    SyncMode::Async,
];

/// One active segment large enough for 40 small batches.
fn big_active(mode: SyncMode) -> WalConfig {
    WalConfig {
        segment_max_bytes: 1 << 20,
        flush_max_batch_bytes: 256,
        limits: Limits {
            max_record_bytes: 200,
            max_batch_bytes: 256,
        },
        ..small_config(mode)
    }
}

/// Everything readable from the log start: records as (offset, value), and
/// the unreadable ranges stepped over.
fn read_around(wal: &Wal) -> (Vec<(u64, Bytes)>, Vec<UnreadableRange>) {
    let mut records = Vec::new();
    let mut ranges = Vec::new();
    let mut from = wal.log_start_offset();
    while from < wal.high_water_mark() {
        match wal.read(from, 64 * 1024) {
            Ok(batches) => {
                assert!(!batches.is_empty(), "a read below the HWM returns data");
                for batch in batches {
                    let decoded = batch.decode(&wal.config().limits).expect("decode");
                    for (i, r) in decoded.records.into_iter().enumerate() {
                        let offset = decoded.base_offset + i as u64;
                        if offset >= from {
                            records.push((offset, r.value));
                        }
                    }
                    from = batch.next_offset();
                }
            }
            Err(WalError::Unreadable(range)) => {
                assert_eq!(range.first_offset, from, "the range starts where asked");
                assert!(range.end_offset > from, "{range}");
                from = range.end_offset;
                ranges.push(range);
            }
            Err(e) => panic!("read at {from}: {e}"),
        }
    }
    (records, ranges)
}

/// Flips one byte `into` bytes inside batch `n` of a file of equal batches.
fn damage_batch(path: &Path, batches: usize, n: usize, into: usize) -> u64 {
    let mut bytes = std::fs::read(path).unwrap();
    let one = bytes.len() / batches;
    bytes[one * n + into] ^= 0x01;
    std::fs::write(path, &bytes).unwrap();
    (one * n) as u64
}

fn damaged_at(range: &UnreadableRange) -> (u64, u64) {
    match &range.kind {
        UnreadableKind::Damaged {
            segment_base,
            position,
            ..
        } => (*segment_base, *position),
        UnreadableKind::Hole => panic!("expected damage, got a hole: {range}"),
    }
}

/// Every record is its own (`value-NNN` at offset NNN), except `missing`.
fn assert_intact(records: &[(u64, Bytes)], total: u64, missing: std::ops::Range<u64>) {
    let expected: Vec<u64> = (0..total).filter(|o| !missing.contains(o)).collect();
    let got: Vec<u64> = records
        .iter()
        .map(|(o, _)| *o)
        .filter(|o| *o < total)
        .collect();
    assert_eq!(got, expected);
    for (offset, value) in records {
        if *offset < total {
            assert_eq!(value, &Bytes::from(format!("value-{offset:03}")));
        }
    }
}

/// Appends one record and waits until it is readable: in `async` the
/// append returns on enqueue, before the writer raised the high-water mark.
fn append_one(wal: &Wal, id: &str) -> u64 {
    rt().block_on(async {
        let base = wal
            .append(vec![record(id)], Codec::None)
            .await
            .unwrap()
            .base_offset;
        wal.wait_for_offset(base).await.unwrap();
        base
    })
}

#[test]
fn damage_at_the_start_middle_and_end_of_the_active_segment_is_kept_reported_and_never_reused() {
    for mode in MODES {
        for (n, name) in [(0usize, "start"), (17, "middle"), (39, "end")] {
            let dir = tempfile::tempdir().unwrap();
            let config = big_active(mode);
            fill(dir.path(), &config, 40);
            let path = segment_path(dir.path(), 0);
            let len = std::fs::metadata(&path).unwrap().len();
            let position = damage_batch(&path, 40, n, 30);
            let case = format!("{mode:?}, damage at the {name}");

            let wal = Wal::open(dir.path(), config.clone()).unwrap();
            let report = wal.recovery_report().clone();
            assert_eq!(report.truncated, None, "{case}: nothing is cut");
            assert_eq!(report.unreadable.len(), 1, "{case}: {report:?}");
            let range = &report.unreadable[0];
            let n = n as u64;
            assert_eq!((range.first_offset, range.end_offset), (n, n + 1), "{case}");
            assert_eq!(damaged_at(range), (0, position), "{case}");
            assert_eq!(
                std::fs::metadata(&path).unwrap().len(),
                len,
                "{case}: bytes kept"
            );
            assert_eq!(wal.high_water_mark(), 40, "{case}");
            assert_eq!(wal.damaged_ranges(), report.unreadable, "{case}");

            // The next offset is past everything acknowledged.
            assert_eq!(append_one(&wal, "new"), 40, "{case}");
            let (records, ranges) = read_around(&wal);
            assert_intact(&records, 40, n..n + 1);
            assert_eq!(records.last().unwrap().1, Bytes::from("value-new"));
            assert_eq!(ranges.len(), 1, "{case}");
            assert_eq!((ranges[0].first_offset, ranges[0].end_offset), (n, n + 1));
            drop(wal);

            // And again after another restart: the same range, the same data.
            let wal = Wal::open(dir.path(), config).unwrap();
            assert_eq!(wal.high_water_mark(), 41, "{case}");
            let (records, ranges) = read_around(&wal);
            assert_eq!(records.len(), 40, "{case}");
            assert_eq!(ranges.len(), 1, "{case}");
        }
    }
}

#[test]
fn damage_at_the_start_middle_and_end_of_a_sealed_segment_is_reported_by_reads_and_stepped_over() {
    for mode in MODES {
        for which in ["start", "middle", "end"] {
            let dir = tempfile::tempdir().unwrap();
            let config = small_config(mode);
            fill(dir.path(), &config, 30);
            let wal = Wal::open(dir.path(), config.clone()).unwrap();
            let sealed = wal.sealed_segments();
            drop(wal);
            let seg = &sealed[1];
            let count = (seg.next_offset - seg.base_offset) as usize;
            assert!(count >= 3);
            let n = match which {
                "start" => 0,
                "middle" => count / 2,
                _ => count - 1,
            };
            let position = damage_batch(&seg.log_path, count, n, 30);
            let bad = seg.base_offset + n as u64;
            let case = format!("{mode:?}, sealed damage at the {which}");

            let wal = Wal::open(dir.path(), config.clone()).unwrap();
            assert_eq!(wal.high_water_mark(), 30, "{case}");
            // A read from before the damage returns the good batches first.
            if n > 0 {
                let before = wal.read(seg.base_offset, 1 << 20).unwrap();
                assert_eq!(before.last().unwrap().next_offset(), bad, "{case}");
            }
            match wal.read(bad, 1 << 20) {
                Err(WalError::Unreadable(range)) => {
                    assert_eq!((range.first_offset, range.end_offset), (bad, bad + 1));
                    assert_eq!(damaged_at(&range), (seg.base_offset, position), "{case}");
                }
                other => panic!("{case}: expected Unreadable, got {other:?}"),
            }
            let (records, ranges) = read_around(&wal);
            assert_intact(&records, 30, bad..bad + 1);
            assert_eq!(ranges.len(), 1, "{case}");
            assert_eq!(wal.damaged_ranges(), ranges, "{case}");
            assert_eq!(append_one(&wal, "new"), 30, "{case}");
        }
    }
}

#[test]
fn a_truncated_active_segment_is_cut_at_its_last_batch_and_its_lost_offsets_become_a_hole() {
    for mode in MODES {
        let dir = tempfile::tempdir().unwrap();
        let config = big_active(mode);
        fill(dir.path(), &config, 40);
        let path = segment_path(dir.path(), 0);
        let bytes = std::fs::read(&path).unwrap();
        let one = bytes.len() / 40;
        // Cut in the middle of batch 37: 37, 38 and 39 are gone.
        std::fs::write(&path, &bytes[..one * 37 + 10]).unwrap();

        let wal = Wal::open(dir.path(), config).unwrap();
        let torn = wal.recovery_report().truncated.clone().unwrap();
        assert_eq!(torn.position, (one * 37) as u64, "{mode:?}");
        assert_eq!(
            wal.damaged_ranges(),
            vec![UnreadableRange {
                first_offset: 37,
                end_offset: 40,
                kind: UnreadableKind::Hole
            }],
            "{mode:?}"
        );
        assert_eq!(wal.high_water_mark(), 40, "{mode:?}");
        assert_eq!(
            append_one(&wal, "new"),
            40,
            "{mode:?}: offsets never reused"
        );
        let (records, ranges) = read_around(&wal);
        assert_intact(&records, 40, 37..40);
        assert_eq!(ranges.len(), 1);
    }
}

#[test]
fn garbage_past_the_sync_mark_is_a_torn_write_and_is_cut() {
    for mode in MODES {
        let dir = tempfile::tempdir().unwrap();
        let config = big_active(mode);
        fill(dir.path(), &config, 40);
        let path = segment_path(dir.path(), 0);
        let mut bytes = std::fs::read(&path).unwrap();
        let len = bytes.len() as u64;
        // Half a batch of an unacknowledged group, then garbage.
        let tail = bytes[..60].to_vec();
        bytes.extend_from_slice(&tail);
        bytes.extend_from_slice(&[0xa5; 37]);
        std::fs::write(&path, &bytes).unwrap();

        let wal = Wal::open(dir.path(), config).unwrap();
        let torn = wal.recovery_report().truncated.clone().unwrap();
        assert_eq!((torn.position, torn.bytes_removed), (len, 97), "{mode:?}");
        assert!(wal.damaged_ranges().is_empty(), "{mode:?}");
        assert_eq!(append_one(&wal, "new"), 40, "{mode:?}");
    }
}

#[test]
fn a_valid_batch_past_the_sync_mark_after_garbage_is_an_unacknowledged_torn_group_and_is_cut() {
    let dir = tempfile::tempdir().unwrap();
    let config = big_active(SyncMode::FsyncBatch);
    fill(dir.path(), &config, 40);
    let path = segment_path(dir.path(), 0);
    let mut bytes = std::fs::read(&path).unwrap();
    let len = bytes.len();
    let one = len / 40;
    // A group of two batches written out of order: the first never reached
    // the disk (zeros), the second did (a copy of batch 39 renumbered is not
    // needed: any valid batch at a higher offset counts as "valid after").
    bytes.extend_from_slice(&vec![0u8; one]);
    let last = bytes[len - one..len].to_vec();
    bytes.extend_from_slice(&last);
    std::fs::write(&path, &bytes).unwrap();
    let wal = Wal::open(dir.path(), config).unwrap();
    let torn = wal.recovery_report().truncated.clone().unwrap();
    assert_eq!(torn.position, len as u64);
    assert_eq!(wal.high_water_mark(), 40);
    assert!(wal.damaged_ranges().is_empty());
}

#[test]
fn a_declared_hole_survives_a_power_cut_and_the_log_continues_after_it() {
    for mode in MODES {
        let storage = SimStorage::new();
        let config = big_active(mode);
        let hole = UnreadableRange {
            first_offset: 10,
            end_offset: 25,
            kind: UnreadableKind::Hole,
        };
        {
            let wal = Wal::open_with(Arc::new(storage.clone()), "/t", config.clone()).unwrap();
            rt().block_on(async {
                for i in 0..10 {
                    wal.append(vec![record(&format!("{i:03}"))], Codec::None)
                        .await
                        .unwrap();
                }
                // Only from the next offset the caller saw.
                assert!(!wal.skip_to_from(9, 25).await.unwrap());
                assert_eq!(wal.next_offset(), 10);
                assert!(wal.skip_to_from(10, 25).await.unwrap());
                wal.skip_to(20).await.unwrap(); // already past: a no-op
            });
            assert_eq!((wal.high_water_mark(), wal.next_offset()), (25, 25));
            assert_eq!(wal.damaged_ranges(), vec![hole.clone()]);
        }
        // Only what was synced survives; in `fsync_batch` that is all ten
        // records, in the other modes possibly none: the hole survives in
        // every mode, because skip_to returns once it is durable.
        let storage = storage.power_cut(7);
        let wal = Wal::open_with(Arc::new(storage.clone()), "/t", config.clone()).unwrap();
        assert_eq!(wal.high_water_mark(), 25, "{mode:?}: the hole is durable");
        assert_eq!(wal.next_offset(), 25, "{mode:?}");
        assert_eq!(append_one(&wal, "after"), 25, "{mode:?}");
        let (records, ranges) = read_around(&wal);
        assert_eq!(records.last().map(|r| r.0), Some(25), "{mode:?}");
        assert!(
            ranges.iter().any(|r| r.end_offset == 25),
            "{mode:?}: {ranges:?}"
        );
        drop(wal);
        // With a batch after it, the hole is in the data itself.
        let wal = Wal::open_with(Arc::new(storage), "/t", config).unwrap();
        let (_, again) = read_around(&wal);
        assert_eq!(again, ranges, "{mode:?}");
        assert_eq!(wal.high_water_mark(), 26);
    }
}

#[test]
fn an_unsealed_non_last_segment_with_a_damaged_end_is_sealed_with_its_damage_reported() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config(SyncMode::FsyncBatch);
    fill(dir.path(), &config, 30);
    let wal = Wal::open(dir.path(), config.clone()).unwrap();
    let seg = wal.sealed_segments()[0].clone();
    drop(wal);
    let count = (seg.next_offset - seg.base_offset) as usize;
    // Crash while sealing: no index; and the last batch damaged.
    std::fs::remove_file(&seg.index_path).unwrap();
    damage_batch(&seg.log_path, count, count - 1, 30);
    let wal = Wal::open(dir.path(), config).unwrap();
    assert_eq!(wal.recovery_report().sealed_on_open, vec![seg.base_offset]);
    let last = seg.next_offset - 1;
    let ranges = wal.damaged_ranges();
    assert_eq!(ranges.len(), 1);
    assert_eq!(
        (ranges[0].first_offset, ranges[0].end_offset),
        (last, seg.next_offset)
    );
    let (records, _) = read_around(&wal);
    assert_intact(&records, 30, last..last + 1);
}
