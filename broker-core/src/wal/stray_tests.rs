//! Recovery never takes damage, a misnamed file or a stray file for a torn
//! write (`recovery_scan.rs`): the three reproductions of the fresh-user
//! trial, on real files. Every byte is kept; an acknowledged offset reads
//! back its own bytes or is reported, and no offset is handed out twice.

use std::path::Path;

use super::tests::{fill, record, rt, segment_path, small_config};
use super::*;
use tributary_proto::batch::Codec;

/// One active segment for every batch of these tests.
fn one_segment() -> WalConfig {
    WalConfig {
        segment_max_bytes: 1 << 20,
        ..small_config(SyncMode::FsyncBatch)
    }
}

/// `n` bytes that no WAL file holds (a fixed xorshift stream).
fn noise(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// Records as `(offset, value)`.
type Values = Vec<(u64, String)>;

/// Every offset readable from the log start: `(offset, value)`, and the
/// unreadable ranges stepped over as `(first, end)`.
fn read_all(wal: &Wal) -> (Values, Vec<(u64, u64)>) {
    let mut records = Vec::new();
    let mut ranges = Vec::new();
    let mut from = wal.log_start_offset();
    while from < wal.high_water_mark() {
        match wal.read(from, 1 << 20) {
            Ok(batches) => {
                for batch in batches {
                    let decoded = batch.decode(&wal.config().limits).unwrap();
                    for (i, r) in decoded.records.into_iter().enumerate() {
                        let value = String::from_utf8(r.value.to_vec()).unwrap();
                        records.push((decoded.base_offset + i as u64, value));
                    }
                    from = batch.next_offset();
                }
            }
            Err(WalError::Unreadable(range)) => {
                ranges.push((range.first_offset, range.end_offset));
                from = range.end_offset;
            }
            Err(e) => panic!("read at {from}: {e}"),
        }
    }
    (records, ranges)
}

fn values(offsets: &[u64]) -> Values {
    offsets
        .iter()
        .map(|&o| (o, format!("value-{o:03}")))
        .collect()
}

fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let name = e.file_name().into_string().unwrap();
            (name, std::fs::read(e.path()).unwrap())
        })
        .filter(|(name, _)| name != mark::MARK_FILE_NAME)
        .collect();
    out.sort();
    out
}

/// Reproduction 1: a segment renamed (`0.log` to `1.log`) is a misnamed
/// file, not a torn write: the open fails naming it, every byte stays, and
/// renaming it back restores every record.
#[test]
fn a_renamed_segment_is_refused_and_kept_not_truncated() {
    let dir = tempfile::tempdir().unwrap();
    let config = one_segment();
    fill(dir.path(), &config, 3);
    let original = segment_path(dir.path(), 0);
    let renamed = segment_path(dir.path(), 1);
    let bytes = std::fs::read(&original).unwrap();
    std::fs::rename(&original, &renamed).unwrap();
    let before = files(dir.path());

    match Wal::open(dir.path(), config.clone()) {
        Err(WalError::StraySegment { path, reason }) => {
            assert_eq!(path, renamed, "{reason}");
            assert!(reason.contains("offsets 0..1"), "{reason}");
        }
        other => panic!("expected a stray segment error, got {other:?}"),
    }
    assert_eq!(files(dir.path()), before, "nothing was changed");
    assert_eq!(std::fs::read(&renamed).unwrap(), bytes);

    std::fs::rename(&renamed, &original).unwrap();
    let wal = Wal::open(dir.path(), config).unwrap();
    assert_eq!(wal.recovery_report().truncated, None);
    assert_eq!(wal.recovery_report().unreadable, vec![]);
    assert_eq!(wal.high_water_mark(), 3);
    assert_eq!(read_all(&wal), (values(&[0, 1, 2]), vec![]));
}

/// Reproduction 2: with an undecodable `wal.mark`, one flipped byte in an
/// acknowledged batch that valid batches follow is damage (kept, reported:
/// offset 1 only), not a torn write; the records after it and the next
/// offset stay. Only a final region with nothing valid after it is cut.
#[test]
fn without_a_valid_mark_damage_before_valid_batches_is_kept_and_offsets_never_reused() {
    for mark_bytes in [noise(128, 7), Vec::new()] {
        let dir = tempfile::tempdir().unwrap();
        let config = one_segment();
        fill(dir.path(), &config, 5);
        let path = segment_path(dir.path(), 0);
        let mut bytes = std::fs::read(&path).unwrap();
        let one = bytes.len() / 5;
        bytes[one + 30] ^= 0x01;
        // An unfinished write at the very end: half a batch.
        let intact_len = bytes.len() as u64;
        let tail = bytes[..one / 2].to_vec();
        bytes.extend_from_slice(&tail);
        std::fs::write(&path, &bytes).unwrap();
        std::fs::write(dir.path().join(mark::MARK_FILE_NAME), &mark_bytes).unwrap();

        let wal = Wal::open(dir.path(), config.clone()).unwrap();
        let report = wal.recovery_report().clone();
        let cut = report.truncated.as_ref().expect("the half batch is cut");
        assert_eq!(
            (cut.position, cut.bytes_removed),
            (intact_len, (one / 2) as u64)
        );
        assert_eq!(report.unreadable.len(), 1, "{report:?}");
        let range = &report.unreadable[0];
        assert_eq!((range.first_offset, range.end_offset), (1, 2));
        match &range.kind {
            UnreadableKind::Damaged {
                segment_base,
                position,
                bytes,
                ..
            } => assert_eq!(
                (*segment_base, *position, *bytes),
                (0, one as u64, one as u64)
            ),
            UnreadableKind::Hole => panic!("damage, not a hole: {range}"),
        }
        assert_eq!(wal.high_water_mark(), 5);
        assert_eq!(read_all(&wal), (values(&[0, 2, 3, 4]), vec![(1, 2)]));
        // The damaged bytes are still there, byte for byte.
        assert_eq!(
            std::fs::read(&path).unwrap(),
            bytes[..intact_len as usize].to_vec()
        );
        let next = rt().block_on(async {
            let receipt = wal.append(vec![record("new")], Codec::None).await.unwrap();
            wal.close().await.unwrap();
            receipt.base_offset
        });
        assert_eq!(next, 5, "offset 1 is never handed out again");
    }
}

/// Reproduction 3: a garbage file named like a segment past the end of the
/// log is not adopted as the active segment: the open fails naming it, it
/// is not truncated, no hole is invented, and the segment before it is not
/// sealed over the gap. Moving it away opens the log as it was.
#[test]
fn a_garbage_segment_past_the_end_is_refused_not_truncated_into_a_hole() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config(SyncMode::FsyncBatch);
    fill(dir.path(), &config, 16);
    let stray = segment_path(dir.path(), 100);
    let garbage = noise(3000, 11);
    std::fs::write(&stray, &garbage).unwrap();
    let before = files(dir.path());

    match Wal::open(dir.path(), config.clone()) {
        Err(WalError::StraySegment { path, reason }) => {
            assert_eq!(path, stray, "{reason}");
            assert!(reason.contains("ends at offset 16"), "{reason}");
        }
        other => panic!("expected a stray segment error, got {other:?}"),
    }
    assert_eq!(files(dir.path()), before, "nothing was changed");
    assert_eq!(std::fs::read(&stray).unwrap(), garbage);

    std::fs::rename(&stray, dir.path().join("stray.bin")).unwrap();
    let wal = Wal::open(dir.path(), config).unwrap();
    assert_eq!(wal.recovery_report().truncated, None);
    assert_eq!(wal.recovery_report().unreadable, vec![]);
    assert_eq!(wal.high_water_mark(), 16);
    let all: Vec<u64> = (0..16).collect();
    assert_eq!(read_all(&wal), (values(&all), vec![]));
}

/// A stray file inside the log's range (it starts below the end of the
/// segment before it) is refused with an error naming it.
#[test]
fn a_stray_file_inside_the_range_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config(SyncMode::FsyncBatch);
    fill(dir.path(), &config, 16);
    let stray = segment_path(dir.path(), 1);
    std::fs::write(&stray, noise(500, 3)).unwrap();
    let before = files(dir.path());
    let err = Wal::open(dir.path(), config).unwrap_err();
    match &err {
        WalError::MissingRange {
            found_base: 1,
            path,
            ..
        } => assert_eq!(path, &stray),
        other => panic!("expected MissingRange, got {other:?}"),
    }
    assert!(
        err.to_string().contains("00000000000000000001.log"),
        "{err}"
    );
    assert_eq!(files(dir.path()), before, "nothing was changed");
}

/// A `wal.mark` that is there but does not decode (garbage, empty) is an
/// error of its own for recovery to warn about, naming the file, not the
/// same as no mark.
#[test]
fn an_undecodable_mark_is_told_from_a_missing_one() {
    let dir = tempfile::tempdir().unwrap();
    let storage = storage::FsStorage;
    assert!(mark::read(&storage, dir.path()).unwrap().is_none());
    for bytes in [noise(128, 5), Vec::new()] {
        std::fs::write(dir.path().join(mark::MARK_FILE_NAME), &bytes).unwrap();
        let err = mark::read(&storage, dir.path()).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidData, "{err}");
    }
}
