//! Scrubbing and repairing damaged sealed segments (`repair.rs`): a scrub
//! finds a flip made while the WAL is open (once), a repair with the
//! original batches restores the segment byte for byte wherever the damage
//! is, a crash at every step of the rewrite leaves the old or the new
//! segment, and a skipped range reads as a hole.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;

use super::sim::SimStorage;
use super::storage::{AppendFile, OverwriteFile, ReadFile, Storage};
use super::tests::{record, rt, small_config};
use super::*;
use tributary_proto::batch::{Codec, EncodedBatch};

/// Appends `n` one-record batches to a WAL on `storage` in `dir`, closed.
fn fill_on(storage: Arc<dyn Storage>, dir: &Path, n: usize) {
    rt().block_on(async {
        let wal = Wal::open_with(storage, dir, small_config(SyncMode::FsyncBatch)).unwrap();
        for i in 0..n {
            wal.append(vec![record(&format!("{i:03}"))], Codec::None)
                .await
                .unwrap();
        }
        wal.close().await.unwrap();
    });
}

/// The batches of a segment file of one-record batches, in order.
fn batches_of(bytes: &[u8]) -> Vec<EncodedBatch> {
    let limits = small_config(SyncMode::FsyncBatch).limits;
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < bytes.len() {
        let header =
            tributary_proto::batch::BatchHeader::parse(&bytes[pos..], &limits).expect("header");
        let len = header.batch_length as usize;
        let batch =
            EncodedBatch::from_bytes(Bytes::copy_from_slice(&bytes[pos..pos + len]), &limits)
                .expect("batch");
        out.push(batch);
        pos += len;
    }
    out
}

/// Every record from the log start as (offset, value), and the unreadable
/// ranges stepped over.
fn read_around(wal: &Wal) -> (Vec<(u64, Bytes)>, Vec<UnreadableRange>) {
    let mut records = Vec::new();
    let mut ranges = Vec::new();
    let mut from = wal.log_start_offset();
    while from < wal.high_water_mark() {
        match wal.read(from, 64 * 1024) {
            Ok(batches) => {
                for batch in batches {
                    let decoded = batch.decode(&wal.config().limits).expect("decode");
                    for (i, r) in decoded.records.into_iter().enumerate() {
                        records.push((decoded.base_offset + i as u64, r.value));
                    }
                    from = batch.next_offset();
                }
            }
            Err(WalError::Unreadable(range)) => {
                from = range.end_offset;
                ranges.push(range);
            }
            Err(e) => panic!("read at {from}: {e}"),
        }
    }
    (records, ranges)
}

fn assert_all_intact(wal: &Wal, total: u64) {
    let (records, ranges) = read_around(wal);
    assert!(ranges.is_empty(), "{ranges:?}");
    let offsets: Vec<u64> = records.iter().map(|(o, _)| *o).collect();
    assert_eq!(offsets, (0..total).collect::<Vec<_>>());
    for (offset, value) in records {
        assert_eq!(value, Bytes::from(format!("value-{offset:03}")));
    }
}

#[test]
fn a_scrub_finds_a_flip_made_after_open_once_and_a_repair_restores_the_segment_byte_for_byte() {
    for which in ["start", "middle", "end"] {
        let dir = tempfile::tempdir().unwrap();
        fill_on(Arc::new(FsStorage), dir.path(), 30);
        let wal = Wal::open(dir.path(), small_config(SyncMode::FsyncBatch)).unwrap();
        let seg = wal.sealed_segments()[1].clone();
        let original = std::fs::read(&seg.log_path).unwrap();
        let batches = batches_of(&original);
        let count = batches.len();
        assert!(count >= 3, "{count}");
        let n = match which {
            "start" => 0,
            "middle" => count / 2,
            _ => count - 1,
        };
        let position: usize = batches[..n].iter().map(EncodedBatch::len).sum();
        let mut flipped = original.clone();
        for byte in &mut flipped[position + 20..position + 36] {
            *byte ^= 0xff;
        }
        // Flipped while the WAL is open: no read has touched it yet.
        std::fs::write(&seg.log_path, &flipped).unwrap();
        assert!(wal.damaged_ranges().is_empty());
        let bad = seg.base_offset + n as u64;
        let report = wal.scrub_segment(seg.base_offset).unwrap();
        assert_eq!(report.bytes, original.len() as u64);
        assert_eq!(report.damaged.len(), 1, "{which}");
        let range = report.damaged[0].clone();
        assert_eq!(
            (range.first_offset, range.end_offset),
            (bad, bad + 1),
            "{which}"
        );
        assert_eq!(wal.damaged_ranges(), vec![range.clone()]);
        // Found again by a second scrub and by a read: still one range.
        wal.scrub_segment(seg.base_offset).unwrap();
        assert!(matches!(wal.read(bad, 1 << 20), Err(WalError::Unreadable(r)) if r == range));
        assert_eq!(wal.damaged_ranges().len(), 1);

        // Batches that do not cover the range exactly are refused.
        let wrong = if n + 1 < count {
            &batches[n..n + 2]
        } else {
            &batches[n - 1..=n]
        };
        let wrong = rt().block_on(wal.repair_range(bad, wrong));
        assert!(
            matches!(wrong, Err(WalError::RepairMismatch { .. })),
            "{wrong:?}"
        );
        assert!(matches!(
            rt().block_on(wal.repair_range(bad + 100, &batches[n..=n])),
            Err(WalError::NotDamaged { .. })
        ));

        let repaired = rt()
            .block_on(wal.repair_range(bad, &batches[n..=n]))
            .unwrap();
        assert_eq!((repaired.first_offset, repaired.end_offset), (bad, bad + 1));
        assert_eq!(repaired.bytes_after, original.len() as u64);
        assert!(wal.damaged_ranges().is_empty(), "{which}");
        assert_eq!(std::fs::read(&seg.log_path).unwrap(), original, "{which}");
        assert_all_intact(&wal, 30);
        assert_eq!(wal.scrub_segment(seg.base_offset).unwrap().damaged, vec![]);
        assert!(matches!(
            rt().block_on(wal.repair_range(bad, &batches[n..=n])),
            Err(WalError::NotDamaged { .. })
        ));
        drop(wal);
        // The rewrite is durable with its index: a reopen finds it sealed
        // and intact.
        let wal = Wal::open(dir.path(), small_config(SyncMode::FsyncBatch)).unwrap();
        assert!(wal.recovery_report().sealed_on_open.is_empty());
        assert_all_intact(&wal, 30);
        assert_eq!(wal.scrub_segment(seg.base_offset).unwrap().damaged, vec![]);
    }
}

#[test]
fn a_skipped_damaged_range_reads_as_a_hole_and_its_bytes_are_removed_from_the_segment() {
    for which in ["middle", "end"] {
        let dir = tempfile::tempdir().unwrap();
        fill_on(Arc::new(FsStorage), dir.path(), 30);
        let wal = Wal::open(dir.path(), small_config(SyncMode::FsyncBatch)).unwrap();
        let seg = wal.sealed_segments()[0].clone();
        let original = std::fs::read(&seg.log_path).unwrap();
        let batches = batches_of(&original);
        let n = if which == "end" { batches.len() - 1 } else { 3 };
        let position: usize = batches[..n].iter().map(EncodedBatch::len).sum();
        let mut bytes = original.clone();
        bytes[position + 30] ^= 0x01;
        std::fs::write(&seg.log_path, &bytes).unwrap();
        let range = wal.scrub_segment(seg.base_offset).unwrap().damaged[0].clone();
        assert_eq!(range.first_offset, seg.base_offset + n as u64);
        assert!(
            rt().block_on(wal.skip_damaged(range.first_offset, range.end_offset))
                .unwrap()
        );
        let hole = UnreadableRange {
            kind: UnreadableKind::Hole,
            ..range.clone()
        };
        assert_eq!(wal.damaged_ranges(), vec![hole.clone()], "{which}");
        assert!(
            matches!(wal.read(range.first_offset, 1 << 20), Err(WalError::Unreadable(r)) if r == hole)
        );
        // The segment holds every other batch verbatim, and no garbage.
        let mut expected = original[..position].to_vec();
        expected.extend_from_slice(&original[position + batches[n].len()..]);
        assert_eq!(std::fs::read(&seg.log_path).unwrap(), expected, "{which}");
        assert_eq!(wal.scrub_segment(seg.base_offset).unwrap().damaged, vec![]);
        assert_eq!(wal.damaged_ranges(), vec![hole.clone()]);
        // Skipping again rewrites nothing; a repair is refused.
        assert!(
            !rt()
                .block_on(wal.skip_damaged(range.first_offset, range.end_offset))
                .unwrap()
        );
        assert!(matches!(
            rt().block_on(wal.repair_range(range.first_offset, &batches[n..=n])),
            Err(WalError::NotDamaged { .. })
        ));
        drop(wal);
        // After a reopen the offsets are a gap: a hole, everything else intact.
        let wal = Wal::open(dir.path(), small_config(SyncMode::FsyncBatch)).unwrap();
        let (records, ranges) = read_around(&wal);
        assert_eq!(ranges, vec![hole], "{which}");
        assert_eq!(records.len(), 29);
        assert!(
            records.iter().all(|(o, v)| *o != range.first_offset
                && v.as_ref() == format!("value-{o:03}").as_bytes())
        );
    }
}

/// A [`SimStorage`] that fails every mutating call (write, sync, truncate,
/// remove, rename, directory sync) once `budget` of them have run: the
/// process "crashes" there, and a power cut of the inner disk shows what
/// survived.
#[derive(Clone)]
struct CrashAfter {
    inner: SimStorage,
    budget: Arc<AtomicU64>,
}

impl CrashAfter {
    fn step(&self) -> io::Result<()> {
        let left = self.budget.load(Ordering::SeqCst);
        if left == 0 {
            return Err(io::Error::other("simulated crash"));
        }
        self.budget.store(left - 1, Ordering::SeqCst);
        Ok(())
    }
}

struct CrashFile {
    crash: CrashAfter,
    inner: Box<dyn AppendFile>,
}

impl AppendFile for CrashFile {
    fn append(&mut self, buf: &[u8]) -> io::Result<()> {
        self.crash.step()?;
        self.inner.append(buf)
    }
    fn sync_data(&mut self) -> io::Result<()> {
        self.crash.step()?;
        self.inner.sync_data()
    }
    fn truncate(&mut self, len: u64) -> io::Result<()> {
        self.crash.step()?;
        self.inner.truncate(len)
    }
}

impl Storage for CrashAfter {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        self.inner.create_dir_all(dir)
    }
    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        self.inner.list(dir)
    }
    fn open_append(&self, path: &Path) -> io::Result<Box<dyn AppendFile>> {
        self.step()?;
        Ok(Box::new(CrashFile {
            crash: self.clone(),
            inner: self.inner.open_append(path)?,
        }))
    }
    fn open_overwrite(&self, path: &Path) -> io::Result<Box<dyn OverwriteFile>> {
        self.step()?;
        self.inner.open_overwrite(path)
    }
    fn open_read(&self, path: &Path) -> io::Result<Box<dyn ReadFile>> {
        self.inner.open_read(path)
    }
    fn remove(&self, path: &Path) -> io::Result<()> {
        self.step()?;
        self.inner.remove(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.step()?;
        self.inner.rename(from, to)
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.step()?;
        self.inner.sync_dir(dir)
    }
}

#[test]
fn a_crash_at_every_step_of_the_rewrite_leaves_the_old_or_the_new_segment() {
    let dir = PathBuf::from("/wal");
    let mut steps = 0;
    let mut saw_old = false;
    loop {
        let sim = SimStorage::new();
        fill_on(Arc::new(sim.clone()), &dir, 30);
        let seg_path = dir.join(segment::log_file_name(0));
        let original = sim.read_live(&seg_path).unwrap();
        let batches = batches_of(&original);
        let n = batches.len() / 2;
        let position: usize = batches[..n].iter().map(EncodedBatch::len).sum();
        let mut flipped = original.clone();
        for byte in &mut flipped[position + 20..position + 36] {
            *byte ^= 0xff;
        }
        sim.overwrite(&seg_path, flipped);
        let crash = CrashAfter {
            inner: sim.clone(),
            budget: Arc::new(AtomicU64::new(u64::MAX)),
        };
        let wal = Wal::open_with(
            Arc::new(crash.clone()),
            &dir,
            small_config(SyncMode::FsyncBatch),
        )
        .unwrap();
        let range = wal.scrub_segment(0).unwrap().damaged[0].clone();
        crash.budget.store(steps, Ordering::SeqCst);
        let result = rt().block_on(wal.repair_range(range.first_offset, &batches[n..=n]));
        drop(wal);
        for seed in 0..4 {
            let after = sim.power_cut(seed * 7 + steps);
            let wal = Wal::open_with(
                Arc::new(after.clone()),
                &dir,
                small_config(SyncMode::FsyncBatch),
            )
            .unwrap();
            let on_disk = after.read_live(&seg_path).unwrap();
            if on_disk == original {
                assert_all_intact(&wal, 30);
            } else {
                assert!(
                    result.is_err(),
                    "step {steps}: repair returned Ok, segment not new"
                );
                saw_old = true;
                // The old segment, damage and all: found by a scrub, and
                // every other record intact.
                let found = wal.scrub_segment(0).unwrap().damaged;
                assert_eq!(
                    found
                        .iter()
                        .map(|r| (r.first_offset, r.end_offset))
                        .collect::<Vec<_>>(),
                    vec![(range.first_offset, range.end_offset)],
                    "step {steps}"
                );
                let (records, ranges) = read_around(&wal);
                assert_eq!(ranges.len(), 1, "step {steps}");
                assert_eq!(records.len(), 29, "step {steps}");
            }
        }
        if result.is_ok() {
            break;
        }
        steps += 1;
        assert!(steps < 50, "the repair never completed");
    }
    assert!(saw_old && steps >= 6, "steps {steps}");
}

#[test]
fn a_sealed_segment_cut_short_is_reported_as_its_lost_end_and_a_repair_restores_it() {
    // Cut inside the last two batches, and exactly at a batch boundary.
    for cut_inside in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        fill_on(Arc::new(FsStorage), dir.path(), 30);
        let wal = Wal::open(dir.path(), small_config(SyncMode::FsyncBatch)).unwrap();
        let seg = wal.sealed_segments()[1].clone();
        drop(wal);
        let original = std::fs::read(&seg.log_path).unwrap();
        let batches = batches_of(&original);
        let count = batches.len();
        assert!(count >= 3, "{count}");
        let kept: usize = batches[..count - 2].iter().map(EncodedBatch::len).sum();
        let cut = if cut_inside { kept + 10 } else { kept };
        std::fs::write(&seg.log_path, &original[..cut]).unwrap();

        // Opens (the topic is not blocked), with the lost end reported.
        let wal = Wal::open(dir.path(), small_config(SyncMode::FsyncBatch)).unwrap();
        let lost = seg.base_offset + count as u64 - 2;
        let ranges = wal.damaged_ranges();
        assert_eq!(ranges.len(), 1, "{cut_inside}: {ranges:?}");
        assert_eq!(
            (ranges[0].first_offset, ranges[0].end_offset),
            (lost, seg.next_offset),
            "{cut_inside}"
        );
        let (records, unreadable) = read_around(&wal);
        assert_eq!(unreadable, ranges, "{cut_inside}");
        let offsets: Vec<u64> = records.iter().map(|(o, _)| *o).collect();
        let expected: Vec<u64> = (0..30)
            .filter(|o| !(lost..seg.next_offset).contains(o))
            .collect();
        assert_eq!(offsets, expected, "{cut_inside}");
        assert_eq!(wal.high_water_mark(), 30, "no offset is handed out again");
        // Found again after a restart before the repair.
        drop(wal);
        let wal = Wal::open(dir.path(), small_config(SyncMode::FsyncBatch)).unwrap();
        let (_, again) = read_around(&wal);
        let span = |r: &[UnreadableRange]| -> Vec<(u64, u64)> {
            r.iter().map(|r| (r.first_offset, r.end_offset)).collect()
        };
        assert_eq!(span(&again), span(&ranges), "{cut_inside}");

        // The re-fetched batches restore the segment byte for byte.
        rt().block_on(wal.repair_range(lost, &batches[count - 2..]))
            .unwrap();
        assert_eq!(
            std::fs::read(&seg.log_path).unwrap(),
            original,
            "{cut_inside}"
        );
        assert_all_intact(&wal, 30);
        drop(wal);
        let wal = Wal::open(dir.path(), small_config(SyncMode::FsyncBatch)).unwrap();
        assert!(wal.damaged_ranges().is_empty());
        assert_all_intact(&wal, 30);
    }
}

#[test]
fn a_lost_segment_file_is_a_damaged_range_and_a_repair_writes_it_again() {
    // The oldest and a middle segment, with the index readable; a middle
    // segment whose index is unreadable too, or gone with it (its range
    // runs to the next segment).
    for (which, index) in [
        (0, "readable"),
        (1, "readable"),
        (1, "garbage"),
        (1, "gone"),
    ] {
        let case = format!("segment {which}, index {index}");
        let dir = tempfile::tempdir().unwrap();
        fill_on(Arc::new(FsStorage), dir.path(), 30);
        let wal = Wal::open(dir.path(), small_config(SyncMode::FsyncBatch)).unwrap();
        let seg = wal.sealed_segments()[which].clone();
        drop(wal);
        let original = std::fs::read(&seg.log_path).unwrap();
        let original_index = std::fs::read(&seg.index_path).unwrap();
        let batches = batches_of(&original);
        std::fs::remove_file(&seg.log_path).unwrap();
        match index {
            "garbage" => std::fs::write(&seg.index_path, b"not an index").unwrap(),
            "gone" => std::fs::remove_file(&seg.index_path).unwrap(),
            _ => {}
        }

        // Opens, with the whole segment reported as one damaged range.
        let wal = Wal::open(dir.path(), small_config(SyncMode::FsyncBatch)).unwrap();
        let end = (index != "garbage").then_some(seg.next_offset);
        assert_eq!(
            wal.recovery_report().lost_segments,
            vec![(seg.base_offset, end)],
            "{case}"
        );
        assert_eq!(wal.log_start_offset(), 0, "{case}");
        let ranges = wal.damaged_ranges();
        assert_eq!(ranges.len(), 1, "{case}: {ranges:?}");
        assert_eq!(
            (ranges[0].first_offset, ranges[0].end_offset),
            (seg.base_offset, seg.next_offset),
            "{case}"
        );
        assert!(
            matches!(&ranges[0].kind, UnreadableKind::Damaged { segment_base, bytes: 0, reason, .. }
                if *segment_base == seg.base_offset && reason.contains("missing")),
            "{case}: {ranges:?}"
        );
        let (records, unreadable) = read_around(&wal);
        assert_eq!(unreadable, ranges, "{case}");
        let offsets: Vec<u64> = records.iter().map(|(o, _)| *o).collect();
        let expected: Vec<u64> = (0..30)
            .filter(|o| !(seg.base_offset..seg.next_offset).contains(o))
            .collect();
        assert_eq!(offsets, expected, "{case}");
        // A read from inside the lost range names the rest of it.
        let inside = seg.base_offset + 1;
        match wal.read(inside, 1024) {
            Err(WalError::Unreadable(r)) => {
                assert_eq!((r.first_offset, r.end_offset), (inside, seg.next_offset));
            }
            other => panic!("{case}: {other:?}"),
        }
        assert_eq!(wal.high_water_mark(), 30, "no offset is handed out again");
        // A scrub finds nothing new; the index is kept as evidence.
        assert!(
            wal.scrub_segment(seg.base_offset)
                .unwrap()
                .damaged
                .is_empty()
        );
        assert_eq!(seg.index_path.exists(), index != "gone", "{case}");
        // Found again after a restart before the repair.
        drop(wal);
        let wal = Wal::open(dir.path(), small_config(SyncMode::FsyncBatch)).unwrap();
        assert_eq!(wal.damaged_ranges(), ranges, "{case}");

        // A repair with the wrong batches changes nothing.
        let err = rt()
            .block_on(wal.repair_range(seg.base_offset, &batches[1..]))
            .unwrap_err();
        assert!(
            matches!(err, WalError::RepairMismatch { .. }),
            "{case}: {err}"
        );
        assert!(!seg.log_path.exists(), "{case}");
        // The re-fetched batches write the segment again, byte for byte.
        rt().block_on(wal.repair_range(seg.base_offset, &batches))
            .unwrap();
        assert_eq!(std::fs::read(&seg.log_path).unwrap(), original, "{case}");
        assert_eq!(
            std::fs::read(&seg.index_path).unwrap(),
            original_index,
            "{case}"
        );
        assert_all_intact(&wal, 30);
        drop(wal);
        let wal = Wal::open(dir.path(), small_config(SyncMode::FsyncBatch)).unwrap();
        assert!(wal.damaged_ranges().is_empty(), "{case}");
        assert!(wal.recovery_report().lost_segments.is_empty(), "{case}");
        assert_all_intact(&wal, 30);
    }
}

#[test]
fn retention_deletes_a_lost_segment_and_its_index_and_a_skip_reads_it_as_a_hole() {
    let dir = tempfile::tempdir().unwrap();
    fill_on(Arc::new(FsStorage), dir.path(), 30);
    let wal = Wal::open(dir.path(), small_config(SyncMode::FsyncBatch)).unwrap();
    let sealed = wal.sealed_segments();
    drop(wal);
    for seg in &sealed[..2] {
        std::fs::remove_file(&seg.log_path).unwrap();
    }
    let wal = Wal::open(
        dir.path(),
        WalConfig {
            retention_max_bytes: Some(1),
            ..small_config(SyncMode::FsyncBatch)
        },
    )
    .unwrap();
    assert_eq!(wal.damaged_ranges().len(), 2);
    // The oldest (archived, say) goes the way of any segment.
    let report = wal.apply_retention(sealed[0].next_offset, 0).unwrap();
    assert_eq!(
        report.deleted,
        vec![(sealed[0].base_offset, sealed[0].next_offset, 0)]
    );
    assert!(!sealed[0].index_path.exists());
    assert_eq!(wal.log_start_offset(), sealed[1].base_offset);
    // The next one, skipped by an operator: a declared hole for readers.
    // Nothing is rewritten (a segment of nothing cannot be written).
    let (first, end) = (sealed[1].base_offset, sealed[1].next_offset);
    assert!(rt().block_on(wal.skip_damaged(first, end)).is_err());
    match wal.read(first, 1024) {
        Err(WalError::Unreadable(r)) => {
            assert_eq!(
                (r.first_offset, r.end_offset, r.kind),
                (first, end, UnreadableKind::Hole)
            );
        }
        other => panic!("{other:?}"),
    }
    let (records, _) = read_around(&wal);
    assert_eq!(records.len() as u64, 30 - end);
}
