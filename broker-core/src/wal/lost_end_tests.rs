//! A log that lost its end or its start to something other than the WAL,
//! and stored batches read after the limits were lowered (edge trial,
//! 2026-12-05): offsets acknowledged elsewhere are never handed out again,
//! lost ranges are reported instead of cutting the log silently, and a
//! batch stored under a larger `max_batch_bytes` stays readable.

use std::path::Path;

use bytes::Bytes;
use tributary_proto::batch::Codec;
use tributary_proto::limits::Limits;

use super::mark::MARK_FILE_NAME;
use super::tests::{batch_of_size, fill, rt, segment_path, small_config};
use super::{SyncMode, UnreadableKind, Wal, WalConfig};

/// Every record from the log start, decoded with the format's ceiling.
fn values(wal: &Wal) -> Vec<(u64, Bytes)> {
    let limits = super::scan::STORED;
    let mut out = Vec::new();
    let mut from = wal.log_start_offset();
    loop {
        let batches = wal.read(from, 1 << 20).expect("read");
        if batches.is_empty() {
            return out;
        }
        for batch in batches {
            let decoded = batch.decode(&limits).expect("decode");
            for (i, r) in decoded.records.into_iter().enumerate() {
                out.push((decoded.base_offset + i as u64, r.value));
            }
            from = batch.next_offset();
        }
    }
}

/// Byte positions where each batch of segment `base` starts.
fn batch_starts(dir: &Path, base: u64) -> Vec<usize> {
    let bytes = std::fs::read(segment_path(dir, base)).unwrap();
    let mut starts = Vec::new();
    let mut at = 0;
    while at + 8 <= bytes.len() {
        starts.push(at);
        let len = u32::from_le_bytes(bytes[at + 4..at + 8].try_into().unwrap()) as usize;
        at += len;
    }
    starts
}

fn ranges(wal: &Wal) -> Vec<(u64, u64)> {
    wal.damaged_ranges()
        .iter()
        .map(|r| (r.first_offset, r.end_offset))
        .collect()
}

/// The trial's removed topic directory: the agent's checkpoint said the
/// broker held 0..2100 and the new log started at 0 again, answering five
/// publishes with offsets the broker had for other records.
#[test]
fn an_empty_directory_starts_past_the_acknowledged_offsets() {
    let dir = tempfile::tempdir().unwrap();
    let config = WalConfig {
        min_next_offset: 2100,
        ..small_config(SyncMode::FsyncBatch)
    };
    let wal = Wal::open(dir.path(), config).unwrap();
    assert_eq!(wal.high_water_mark(), 2100);
    assert_eq!(wal.log_start_offset(), 2100);
    assert_eq!(wal.recovery_report().created_segment, Some(2100));
}

/// The trial's truncated active segment with an unreadable sync mark: the
/// log ended at 3 though 0..5 were acknowledged by the broker; it went on
/// at 3, handing 3 and 4 out again.
#[test]
fn a_log_whose_end_was_lost_continues_past_the_acknowledged_offsets() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config(SyncMode::FsyncBatch);
    fill(dir.path(), &config, 5);
    let starts = batch_starts(dir.path(), 0);
    assert_eq!(starts.len(), 5, "one segment of five one-record batches");
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(segment_path(dir.path(), 0))
        .unwrap();
    file.set_len(starts[3] as u64).unwrap();
    drop(file);
    std::fs::remove_file(dir.path().join(MARK_FILE_NAME)).unwrap();

    let wal = Wal::open(
        dir.path(),
        WalConfig {
            min_next_offset: 5,
            ..config
        },
    )
    .unwrap();
    assert_eq!(wal.high_water_mark(), 5);
    let holes: Vec<_> = wal
        .recovery_report()
        .unreadable
        .iter()
        .filter(|r| r.kind == UnreadableKind::Hole)
        .map(|r| (r.first_offset, r.end_offset))
        .collect();
    assert_eq!(holes, vec![(3, 5)]);
    rt().block_on(async {
        let ack = wal.append(batch_of_size(100), Codec::None).await.unwrap();
        assert_eq!(ack.base_offset, 5, "never an acknowledged offset again");
    });
}

/// The trial's first segment deleted with its index before anything was
/// trimmed: the log silently started at the second segment and the
/// broker, which had nothing yet, could never be given offset 0 (the
/// topic's replication stopped for good). The new log's start is recorded
/// when it is created, so the missing range is reported as damaged.
#[test]
fn a_first_segment_removed_with_its_index_is_a_damaged_range() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config(SyncMode::FsyncBatch);
    fill(dir.path(), &config, 45);
    let wal = Wal::open(dir.path(), config.clone()).unwrap();
    let sealed = wal.sealed_segments();
    assert!(sealed.len() >= 2, "{sealed:?}");
    drop(wal);
    std::fs::remove_file(&sealed[0].log_path).unwrap();
    std::fs::remove_file(&sealed[0].index_path).unwrap();

    let wal = Wal::open(dir.path(), config).unwrap();
    assert_eq!(wal.log_start_offset(), 0);
    assert_eq!(ranges(&wal), vec![(0, sealed[0].next_offset)]);
    assert!(wal.read(0, 1 << 20).is_err(), "a read of the range says so");
    let after = wal.read(sealed[0].next_offset, 1 << 20).unwrap();
    assert_eq!(after[0].base_offset(), sealed[0].next_offset);
    assert_eq!(wal.high_water_mark(), 45);
}

/// A sealed segment emptied (truncated to 0 bytes) stopped the whole edge
/// agent at start (`Corrupt`); it is a lost end like a shorter file: its
/// range is damaged, the rest of the log reads.
#[test]
fn an_emptied_sealed_segment_is_a_damaged_range() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config(SyncMode::FsyncBatch);
    fill(dir.path(), &config, 45);
    let wal = Wal::open(dir.path(), config.clone()).unwrap();
    let sealed = wal.sealed_segments();
    drop(wal);
    std::fs::write(&sealed[1].log_path, b"").unwrap();

    let wal = Wal::open(dir.path(), config).unwrap();
    assert_eq!(
        ranges(&wal),
        vec![(sealed[1].base_offset, sealed[1].next_offset)]
    );
    assert_eq!(wal.high_water_mark(), 45);
}

/// Lowering `max_batch_bytes` made every stored batch above the new limit
/// "damaged": the edge declared them a hole and 101 acknowledged records
/// were lost at the broker and in the archive. They stay readable; the
/// lower limit applies to new appends.
#[test]
fn batches_stored_under_a_larger_limit_stay_readable_after_it_is_lowered() {
    let dir = tempfile::tempdir().unwrap();
    let large = WalConfig {
        limits: Limits {
            max_record_bytes: 4096 - 48,
            max_batch_bytes: 4096,
        },
        segment_max_bytes: 64 * 1024,
        ..small_config(SyncMode::FsyncBatch)
    };
    rt().block_on(async {
        let wal = Wal::open(dir.path(), large.clone()).unwrap();
        wal.append(batch_of_size(3000), Codec::None).await.unwrap();
        wal.append(batch_of_size(200), Codec::None).await.unwrap();
        wal.close().await.unwrap();
    });

    let small = WalConfig {
        segment_max_bytes: 64 * 1024,
        ..small_config(SyncMode::FsyncBatch)
    };
    let wal = Wal::open(dir.path(), small).unwrap();
    assert_eq!(ranges(&wal), vec![]);
    let stored = values(&wal);
    assert_eq!(stored.len(), 2);
    assert_eq!(stored[0].1.len(), 3000 - 48 - 4 - 2);
    rt().block_on(async {
        assert!(
            wal.append(batch_of_size(3000), Codec::None).await.is_err(),
            "new appends keep the lower limit"
        );
    });
}
