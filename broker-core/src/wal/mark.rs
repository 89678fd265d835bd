//! The sync mark (`wal.mark`): how far the active segment was written when
//! its last group was acknowledged, so recovery can tell a torn write from
//! damage and never hands out an acknowledged offset again.
//!
//! The writer overwrites the mark after every group: in `fsync_batch` after
//! the group's `fdatasync` (so the mark never claims more than is durable),
//! in the other modes after the group's `write`. The mark itself is
//! `fdatasync`ed when a hole is declared, when the WAL closes, and in
//! `fsync_batch` at most once per [`MARK_SYNC_INTERVAL`]; after a power cut
//! it may therefore lag by that long, never lead.
//!
//! File layout (two 64-byte slots; a write goes to slot `seq % 2`, so a torn
//! mark write leaves the other slot intact; recovery takes the valid slot with
//! the higher `seq`). Each slot, little-endian:
//!
//! ```text
//! 0   4  magic "TMRK"
//! 4   1  version 1
//! 5   1  flags: bit 0 = durable (written after an fdatasync of the data)
//! 6   2  reserved 0
//! 8   8  seq            u64, grows by one per write
//! 16  8  segment_base   u64, the active segment the mark describes
//! 24  8  position       u64, bytes of that segment written and acknowledged
//! 32  8  next_offset    u64, next offset to hand out (past any declared hole)
//! 40  4  crc32c         over bytes [0, 40)
//! 44 20  zero padding
//! ```

use std::io;
use std::path::Path;
use std::time::{Duration, Instant};

use super::storage::{OverwriteFile, Storage};

/// Name of the mark file in a WAL directory.
pub const MARK_FILE_NAME: &str = "wal.mark";
/// Longest time an `fsync_batch` WAL's mark goes without an `fdatasync`.
pub const MARK_SYNC_INTERVAL: Duration = Duration::from_secs(1);

const MAGIC: [u8; 4] = *b"TMRK";
const VERSION: u8 = 1;
const SLOT_BYTES: usize = 64;
const BODY_BYTES: usize = 40;
const FLAG_DURABLE: u8 = 1;

/// What the mark says about the active segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyncMark {
    /// Base offset of the segment the mark describes.
    pub segment_base: u64,
    /// Bytes of that segment that were written (and, if `durable`, synced)
    /// when the last group was acknowledged.
    pub position: u64,
    /// The next offset the WAL would hand out: offsets below it were
    /// acknowledged or declared a hole, and are never handed out again.
    pub next_offset: u64,
    /// Whether `position` was reached by an `fdatasync` (`fsync_batch`).
    pub durable: bool,
}

fn encode(mark: &SyncMark, seq: u64) -> [u8; SLOT_BYTES] {
    let mut slot = [0u8; SLOT_BYTES];
    slot[0..4].copy_from_slice(&MAGIC);
    slot[4] = VERSION;
    slot[5] = if mark.durable { FLAG_DURABLE } else { 0 };
    slot[8..16].copy_from_slice(&seq.to_le_bytes());
    slot[16..24].copy_from_slice(&mark.segment_base.to_le_bytes());
    slot[24..32].copy_from_slice(&mark.position.to_le_bytes());
    slot[32..40].copy_from_slice(&mark.next_offset.to_le_bytes());
    let crc = crc32c::crc32c(&slot[..BODY_BYTES]);
    slot[40..44].copy_from_slice(&crc.to_le_bytes());
    slot
}

/// The little-endian `u64` at byte `at` of `bytes`, if it is all there.
pub(super) fn u64_at(bytes: &[u8], at: usize) -> Option<u64> {
    bytes
        .get(at..at + 8)
        .and_then(|b| b.try_into().ok())
        .map(u64::from_le_bytes)
}

/// The little-endian `u32` at byte `at` of `bytes`, if it is all there.
pub(super) fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    bytes
        .get(at..at + 4)
        .and_then(|b| b.try_into().ok())
        .map(u32::from_le_bytes)
}

fn decode(slot: &[u8]) -> Option<(u64, SyncMark)> {
    if slot.len() < 44 || slot[0..4] != MAGIC || slot[4] != VERSION {
        return None;
    }
    let crc = u32::from_le_bytes(slot[40..44].try_into().ok()?);
    if crc != crc32c::crc32c(&slot[..BODY_BYTES]) {
        return None;
    }
    let mark = SyncMark {
        segment_base: u64_at(slot, 16)?,
        position: u64_at(slot, 24)?,
        next_offset: u64_at(slot, 32)?,
        durable: slot[5] & FLAG_DURABLE != 0,
    };
    Some((u64_at(slot, 8)?, mark))
}

/// Parses a mark file: the valid slot with the highest sequence number, and
/// that number. `None` if no slot is valid (missing, torn or foreign file).
pub(crate) fn parse(bytes: &[u8]) -> Option<(u64, SyncMark)> {
    bytes
        .chunks(SLOT_BYTES)
        .take(2)
        .filter_map(decode)
        .max_by_key(|(seq, _)| *seq)
}

/// Reads the mark of the WAL in `dir`: `None` when there is no mark file.
///
/// # Errors
/// I/O errors other than "not found", and [`io::ErrorKind::InvalidData`]
/// when the file is there but no slot decodes (damaged, foreign, or empty
/// after a crash before the writer's first mark): recovery must then not
/// trust any position, and says so.
pub(crate) fn read(storage: &dyn Storage, dir: &Path) -> io::Result<Option<(u64, SyncMark)>> {
    let path = dir.join(MARK_FILE_NAME);
    match super::storage::read_file(storage, &path, 4096) {
        Ok(bytes) => match parse(&bytes) {
            Some(found) => Ok(Some(found)),
            None => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "no valid mark slot in its {} bytes (damaged, foreign, or empty)",
                    bytes.len()
                ),
            )),
        },
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// The WAL writer's handle on the mark file.
pub(crate) struct MarkWriter {
    file: Box<dyn OverwriteFile>,
    seq: u64,
    last: Option<SyncMark>,
    synced: bool,
    last_sync_at: Option<Instant>,
}

impl MarkWriter {
    /// Opens (creating) the mark file of `dir`; `seq` continues the one
    /// recovery read. A new file's name is made durable at once.
    pub(crate) fn open(storage: &dyn Storage, dir: &Path, seq: u64) -> io::Result<MarkWriter> {
        let path = dir.join(MARK_FILE_NAME);
        let existed = storage.open_read(&path).is_ok();
        let file = storage.open_overwrite(&path)?;
        if !existed {
            storage.sync_dir(dir)?;
        }
        Ok(MarkWriter {
            file,
            seq,
            last: None,
            synced: true,
            last_sync_at: None,
        })
    }

    /// Writes `mark` into the next slot (without syncing), unless it is the
    /// mark already written.
    pub(crate) fn write(&mut self, mark: SyncMark) -> io::Result<()> {
        if self.last == Some(mark) {
            return Ok(());
        }
        self.seq += 1;
        let slot = encode(&mark, self.seq);
        let at = (self.seq % 2) * SLOT_BYTES as u64;
        self.file.write_at(&slot, at)?;
        self.last = Some(mark);
        self.synced = false;
        Ok(())
    }

    /// `fdatasync`s the mark if it changed since the last sync.
    pub(crate) fn sync(&mut self, now: Instant) -> io::Result<()> {
        if !self.synced {
            self.file.sync_data()?;
            self.synced = true;
        }
        self.last_sync_at = Some(now);
        Ok(())
    }

    /// Syncs the mark if the last sync is [`MARK_SYNC_INTERVAL`] old.
    pub(crate) fn sync_if_due(&mut self, now: Instant) -> io::Result<()> {
        let due = self
            .last_sync_at
            .is_none_or(|at| now.saturating_duration_since(at) >= MARK_SYNC_INTERVAL);
        if due { self.sync(now) } else { Ok(()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mark(position: u64) -> SyncMark {
        SyncMark {
            segment_base: 100,
            position,
            next_offset: 100 + position / 10,
            durable: true,
        }
    }

    #[test]
    fn the_newest_valid_slot_wins_and_a_torn_slot_falls_back_to_the_other() {
        let mut file = vec![0u8; 2 * SLOT_BYTES];
        file[SLOT_BYTES..].copy_from_slice(&encode(&mark(10), 1));
        file[..SLOT_BYTES].copy_from_slice(&encode(&mark(20), 2));
        assert_eq!(parse(&file), Some((2, mark(20))));
        file[20] ^= 0xff; // tear the newer slot
        assert_eq!(parse(&file), Some((1, mark(10))));
        file[SLOT_BYTES + 30] ^= 0xff;
        assert_eq!(parse(&file), None);
        assert_eq!(parse(b"short"), None);
        assert_eq!(parse(&[]), None);
    }

    #[test]
    fn flags_and_fields_round_trip() {
        let m = SyncMark {
            segment_base: u64::MAX - 1,
            position: 7,
            next_offset: u64::MAX,
            durable: false,
        };
        assert_eq!(parse(&encode(&m, 9)), Some((9, m)));
    }
}
