//! Telling one log's batch from another's at the same offsets.
//!
//! Batches travel verbatim from the edge's WAL to the broker's and to the
//! archive, so a batch is identified everywhere by its offsets and its CRC
//! ([`BatchId`]). Two checks rely on it: a re-sent batch whose offsets the
//! WAL already holds is a duplicate only if it *is* the stored batch
//! ([`Wal::verify_stored`]; otherwise two logs, such as two devices under
//! one edge id, wrote those offsets), and the `Tip` a broker sends when an
//! edge stream opens ([`Wal::batch_ending_at`]).
//!
//! The log start is recorded when a log is created (no batch yet), and
//! retention deletes whole segments; where it left the log start, and the
//! last batch it deleted, are kept in `wal.tip` so that both checks still
//! work when everything below the active segment was archived and trimmed
//! (an empty active segment has no batch to show). Layout, 32 bytes,
//! little-endian:
//!
//! ```text
//! 0   8  log_start    u64, the log start retention left
//! 8   8  base_offset  u64, the last deleted batch (0 and 0: not known,
//! 16  8  next_offset  u64,  e.g. the segment ended in a hole or damage)
//! 24  4  crc          u32, that batch's CRC32C
//! 28  4  crc32c       over bytes [0, 28)
//! ```
//!
//! It is written atomically (`.tmp`, `fdatasync`, rename) before the
//! segments are removed. It is a hint: a missing or damaged file only means
//! those checks cannot be made below the log start, never an error.
//! Recovery reports segments gone from the start of the log past
//! `log_start` (deleted by something other than retention) as a damaged
//! range.

use tracing::warn;
use tributary_proto::batch::BatchHeader;

use super::storage::{read_file, write_file_atomic};
use super::{Wal, WalError};

/// Name of the tip file in a WAL directory.
pub const TIP_FILE_NAME: &str = "wal.tip";
const TIP_BYTES: usize = 32;

/// What `wal.tip` holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct TipRecord {
    /// The log start retention left.
    log_start: u64,
    /// The last batch it deleted, when known.
    batch: Option<BatchId>,
}

impl TipRecord {
    fn encode(&self) -> [u8; TIP_BYTES] {
        let mut out = [0u8; TIP_BYTES];
        out[0..8].copy_from_slice(&self.log_start.to_le_bytes());
        if let Some(batch) = self.batch {
            out[8..16].copy_from_slice(&batch.base_offset.to_le_bytes());
            out[16..24].copy_from_slice(&batch.next_offset.to_le_bytes());
            out[24..28].copy_from_slice(&batch.crc32c.to_le_bytes());
        }
        let crc = crc32c::crc32c(&out[..28]);
        out[28..32].copy_from_slice(&crc.to_le_bytes());
        out
    }

    fn decode(bytes: &[u8]) -> Option<TipRecord> {
        use super::mark::{u32_at, u64_at};
        if bytes.len() != TIP_BYTES || crc32c::crc32c(&bytes[..28]) != u32_at(bytes, 28)? {
            return None;
        }
        let batch = BatchId {
            base_offset: u64_at(bytes, 8)?,
            next_offset: u64_at(bytes, 16)?,
            crc32c: u32_at(bytes, 24)?,
        };
        Some(TipRecord {
            log_start: u64_at(bytes, 0)?,
            batch: (batch.base_offset < batch.next_offset).then_some(batch),
        })
    }
}

/// A record batch's identity: its offsets and its stored CRC32C.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchId {
    /// Offset of its first record.
    pub base_offset: u64,
    /// Offset just past its last record.
    pub next_offset: u64,
    /// The batch's CRC32C (FORMAT.md, "Record batch").
    pub crc32c: u32,
}

impl BatchId {
    /// The identity of the batch with this header.
    pub fn of(header: &BatchHeader) -> BatchId {
        BatchId {
            base_offset: header.base_offset,
            next_offset: header.next_offset(),
            crc32c: header.crc,
        }
    }
}

impl Wal {
    /// The stored batch holding `base_offset`, if this WAL can say: from the
    /// segments when it holds the offset (the batch may start earlier: the
    /// caller compares), else from `wal.tip` when that records a batch
    /// starting there. `None` when the offset is not stored (not yet,
    /// trimmed without a tip, a hole) or cannot be read (damage is reported
    /// by reads and `damaged_ranges`).
    pub fn stored_batch(&self, base_offset: u64) -> Option<BatchId> {
        if base_offset >= self.log_start_offset() {
            if base_offset >= self.high_water_mark() {
                return None;
            }
            let batches = self.read(base_offset, 1).ok()?;
            return batches.first().map(|b| BatchId::of(b.header()));
        }
        self.recorded_tip()
            .filter(|tip| tip.base_offset == base_offset)
    }

    /// The stored batch that ends exactly at `next_offset` (the high-water
    /// mark a stream resumes at): what the broker sends as its `Tip`
    /// (FORMAT.md, "Replication stream"). `None` when there is none or it
    /// cannot be read, or a declared hole ends there.
    pub fn batch_ending_at(&self, next_offset: u64) -> Option<BatchId> {
        let last = next_offset.checked_sub(1)?;
        let found = if last >= self.log_start_offset() {
            let batches = self.read(last, 1).ok()?;
            BatchId::of(batches.first()?.header())
        } else {
            self.recorded_tip()?
        };
        (found.next_offset == next_offset).then_some(found)
    }

    /// Why the stored batch at `id.base_offset` is not `id`, or `None` when
    /// it is, or when this WAL cannot say (see [`Wal::stored_batch`]).
    pub fn mismatch(&self, id: &BatchId) -> Option<String> {
        let stored = self.stored_batch(id.base_offset)?;
        if stored.base_offset != id.base_offset {
            return Some(format!(
                "the stored batch holding offset {} starts at {}",
                id.base_offset, stored.base_offset
            ));
        }
        (stored != *id).then(|| {
            format!(
                "the stored batch at {} ends at {} with CRC {:#010x}, the other ends at {} with CRC {:#010x}",
                id.base_offset, stored.next_offset, stored.crc32c, id.next_offset, id.crc32c
            )
        })
    }

    /// Checks that a batch [`Wal::append_at`] reported as a duplicate is the
    /// stored one. Reads the WAL: call it off the async runtime, after the
    /// duplicate's range is durable (`PendingAppend::durable`).
    ///
    /// # Errors
    /// [`WalError::NotStoredBatch`] when the WAL holds another batch there.
    pub fn verify_stored(&self, id: &BatchId) -> Result<(), WalError> {
        match self.mismatch(id) {
            None => Ok(()),
            Some(reason) => Err(WalError::NotStoredBatch {
                base: id.base_offset,
                next: id.next_offset,
                reason,
            }),
        }
    }

    /// Records `next_offset` as the log start and the batch ending there
    /// in `wal.tip` (retention, before it deletes the segments below
    /// `next_offset`). Failure is logged: the tip is a hint.
    pub(super) fn record_tip(&self, next_offset: u64) {
        let record = TipRecord {
            log_start: next_offset,
            batch: self.batch_ending_at(next_offset),
        };
        let path = self.shared.dir.join(TIP_FILE_NAME);
        let storage = self.shared.storage.as_ref();
        if let Err(e) = write_file_atomic(storage, &path, &record.encode()) {
            // An older tip would name a log start below the one about to
            // be left, which the next open reports as segments lost. No tip
            // only means "unknown" (removing needs no free space, unlike
            // the write, which fails on a full disk).
            warn!(path = %path.display(), error = %e, "could not record the log start retention leaves; removing the old record");
            let removed = storage
                .remove(&path)
                .and_then(|()| storage.sync_dir(&self.shared.dir));
            if let Err(e) = removed
                && e.kind() != std::io::ErrorKind::NotFound
            {
                warn!(path = %path.display(), error = %e, "could not remove the old tip record");
            }
        }
    }

    fn recorded_tip(&self) -> Option<BatchId> {
        read_tip(self.shared.storage.as_ref(), &self.shared.dir)?.batch
    }
}

/// Records `log_start` as the start of the brand-new log in `dir` (no batch
/// deleted yet), so that recovery finds its first segments if something
/// other than retention deletes them. Failure is logged: the tip is a hint.
pub(super) fn record_log_start(
    storage: &dyn super::storage::Storage,
    dir: &std::path::Path,
    log_start: u64,
) {
    let record = TipRecord {
        log_start,
        batch: None,
    };
    let path = dir.join(TIP_FILE_NAME);
    if let Err(e) = write_file_atomic(storage, &path, &record.encode()) {
        warn!(path = %path.display(), error = %e, "could not record the new log's start");
    }
}

/// What `dir`'s `wal.tip` records, if the file is there and valid.
fn read_tip(storage: &dyn super::storage::Storage, dir: &std::path::Path) -> Option<TipRecord> {
    let path = dir.join(TIP_FILE_NAME);
    let bytes = read_file(storage, &path, TIP_BYTES as u64 + 1).ok()?;
    TipRecord::decode(&bytes)
}

/// The log start retention left in `dir` (from `wal.tip`), if recorded.
/// A tip file that is there but does not decode is warned about (naming
/// the file) and counts as not recorded.
pub(super) fn trimmed_log_start(
    storage: &dyn super::storage::Storage,
    dir: &std::path::Path,
) -> Option<u64> {
    let path = dir.join(TIP_FILE_NAME);
    match read_file(storage, &path, TIP_BYTES as u64 + 1) {
        Ok(bytes) => {
            let tip = TipRecord::decode(&bytes);
            if tip.is_none() {
                warn!(
                    path = %path.display(),
                    bytes = bytes.len(),
                    "the log start record does not decode (damaged or foreign): ignored, the \
                     log start is not checked"
                );
            }
            tip.map(|t| t.log_start)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => {
            warn!(path = %path.display(), error = %e, "cannot read the log start record: ignored");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wal::tests::{record, rt, small_config};
    use crate::wal::{AppendAtOutcome, SyncMode, WalConfig};
    use tributary_proto::batch::{Codec, RecordBatch};

    /// Everything archived and trimmed: the active segment is empty, yet the
    /// batch ending at the high-water mark is known (the broker's `Tip`),
    /// across a reopen, and a re-sent batch from another log at the trimmed
    /// offsets is still told from the stored one.
    #[test]
    fn the_last_trimmed_batch_is_still_known() {
        let dir = tempfile::tempdir().unwrap();
        let config = WalConfig {
            retention_max_bytes: Some(0),
            ..small_config(SyncMode::FsyncBatch)
        };
        let limits = config.limits;
        let batch = |base: u64, tag: &str| {
            let records = (0..3).map(|i| record(&format!("{tag}{i}"))).collect();
            RecordBatch::new(base, records).encode(&limits).unwrap()
        };
        rt().block_on(async {
            let wal = Wal::open(dir.path(), config.clone()).unwrap();
            wal.append(vec![record("a")], Codec::None).await.unwrap();
            let last = batch(1, "b");
            let last_id = BatchId::of(last.header());
            wal.append_at(last.clone()).await.unwrap();
            assert_eq!(wal.batch_ending_at(4), Some(last_id));
            wal.roll().await.unwrap();
            let report = wal.apply_retention(u64::MAX, 0).unwrap();
            assert_eq!(report.log_start, 4, "{report:?}");
            assert!(dir.path().join(TIP_FILE_NAME).exists());
            assert_eq!(wal.batch_ending_at(4), Some(last_id));
            assert_eq!(wal.batch_ending_at(3), None);
            drop(wal);

            let wal = Wal::open(dir.path(), config.clone()).unwrap();
            assert_eq!(wal.log_start_offset(), 4);
            assert_eq!(wal.batch_ending_at(4), Some(last_id));
            assert!(matches!(
                wal.append_at(last.clone()).await,
                Ok(AppendAtOutcome::Duplicate(_))
            ));
            assert!(matches!(
                wal.append_at(batch(1, "other")).await,
                Err(WalError::NotStoredBatch {
                    base: 1,
                    next: 4,
                    ..
                })
            ));
            // Below the tip nothing can be told: a duplicate, as before.
            assert!(matches!(
                wal.append_at(batch(0, "z")).await,
                Ok(AppendAtOutcome::Duplicate(_))
            ));
            drop(wal);

            // A damaged tip file is no tip, never an error.
            let path = dir.path().join(TIP_FILE_NAME);
            let mut bytes = std::fs::read(&path).unwrap();
            bytes[3] ^= 1;
            std::fs::write(&path, &bytes).unwrap();
            let wal = Wal::open(dir.path(), config).unwrap();
            assert_eq!(wal.batch_ending_at(4), None);
            assert!(matches!(
                wal.append_at(batch(1, "other")).await,
                Ok(AppendAtOutcome::Duplicate(_))
            ));
        });
    }

    /// Segments deleted from the start of the log by something other than
    /// retention (past the end `wal.tip` records) are a damaged range at
    /// the next open, not a log that silently starts later.
    #[test]
    fn segments_gone_from_the_start_past_the_tip_are_a_damaged_range() {
        use crate::wal::tests::batch_of_size;
        let dir = tempfile::tempdir().unwrap();
        let config = WalConfig {
            retention_max_bytes: Some(3100),
            ..small_config(SyncMode::FsyncBatch)
        };
        rt().block_on(async {
            let wal = Wal::open(dir.path(), config.clone()).unwrap();
            for _ in 0..5 {
                wal.append(batch_of_size(1024), Codec::None).await.unwrap();
            }
            // Segments [0,1) .. [3,4) sealed, [4,5) active; retention
            // keeps 3100 bytes: it deletes [0,1) and [1,2).
            let report = wal.apply_retention(u64::MAX, 0).unwrap();
            assert_eq!(report.log_start, 2, "{report:?}");
        });
        let reopened = Wal::open(dir.path(), config.clone()).unwrap();
        assert!(reopened.damaged_ranges().is_empty());
        assert_eq!(reopened.log_start_offset(), 2);
        drop(reopened);
        // Someone deletes the oldest remaining segment, index and all.
        for name in [
            crate::wal::segment::log_file_name(2),
            crate::wal::segment::index_file_name(2),
        ] {
            std::fs::remove_file(dir.path().join(name)).unwrap();
        }
        let wal = Wal::open(dir.path(), config).unwrap();
        assert_eq!(wal.log_start_offset(), 2, "the log still starts at 2");
        let ranges = wal.damaged_ranges();
        assert_eq!(ranges.len(), 1, "{ranges:?}");
        assert_eq!((ranges[0].first_offset, ranges[0].end_offset), (2, 3));
        assert_eq!(wal.recovery_report().lost_segments, vec![(2, Some(3))]);
        assert!(matches!(wal.read(2, 1024), Err(WalError::Unreadable(_))));
        assert_eq!(wal.read(3, 1024).unwrap()[0].base_offset(), 3);
    }

    #[test]
    fn a_tip_round_trips_and_damage_is_no_tip() {
        let tip = TipRecord {
            log_start: 9,
            batch: Some(BatchId {
                base_offset: 7,
                next_offset: 9,
                crc32c: 0xdead_beef,
            }),
        };
        let bytes = tip.encode();
        assert_eq!(TipRecord::decode(&bytes), Some(tip));
        for i in 0..TIP_BYTES {
            let mut damaged = bytes;
            damaged[i] ^= 0x40;
            assert_eq!(TipRecord::decode(&damaged), None, "byte {i}");
        }
        assert_eq!(TipRecord::decode(&bytes[..31]), None);
        assert_eq!(TipRecord::decode(&[]), None);
        // A log start without a known batch (a segment ending in a hole).
        let start_only = TipRecord {
            log_start: 12,
            batch: None,
        };
        assert_eq!(TipRecord::decode(&start_only.encode()), Some(start_only));
    }
}
