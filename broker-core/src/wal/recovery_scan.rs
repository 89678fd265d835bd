//! Recovery's scan of one segment file, and the rules that tell a torn
//! write from damage and a segment from a stray file (`recovery.rs` has the
//! table).
//!
//! A torn write is an unfinished write at the true end of the log, so:
//!
//! - bytes the sync mark covers are never torn (acknowledged: damage);
//! - without a mark that describes the segment (none, undecodable, or one
//!   of an earlier segment), bad bytes are torn only when no valid batch
//!   follows them: a valid batch after them proves they are not the end;
//! - a CRC-valid batch whose base offset is below the one its position
//!   requires was never a torn write: at byte 0 the file is misnamed (an
//!   error, nothing changed), later in the file it is damage (kept);
//! - bytes of a segment before the last one are never torn.

use std::path::Path;

use super::mark::SyncMark;
use super::scan::{ReadAhead, Step, find_next_valid, read_batch, rest_is_zero};
use super::segment::SegmentMeta;
use super::storage::Storage;
use super::{UnreadableKind, UnreadableRange, WalConfig, WalError, io_err};

/// How a scanned segment file ends.
pub(super) enum ScanEnd {
    /// Every byte is part of a valid batch (or a damaged range before one).
    Clean,
    /// From `position` on, no valid batch follows (or only one past a
    /// mark's position), and the bytes may be a torn write: cut them.
    Torn { position: u64, reason: String },
    /// From `position` on, no valid batch follows, and the bytes were
    /// written and acknowledged: damage to keep, up to the end of the file.
    DamagedTail { position: u64, reason: String },
}

pub(super) struct Scan {
    pub(super) meta: SegmentMeta,
    /// Damaged ranges before valid data, and holes between batches.
    pub(super) unreadable: Vec<UnreadableRange>,
    pub(super) end: ScanEnd,
    /// File length, bytes.
    pub(super) len: u64,
}

/// Where a torn write may be in a scanned file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Tear {
    /// Nowhere: the file was complete before a later segment existed.
    Never,
    /// At or past `from`, the first byte the valid sync mark of this
    /// segment does not cover: bad bytes there are cut even when a valid
    /// batch follows them (an unacknowledged group written out of order).
    PastMark { from: u64 },
    /// No trustworthy position (no mark, an undecodable one, or one of an
    /// earlier segment): only bad bytes at or past `from` with no valid
    /// batch after them are cut.
    TailOnly { from: u64 },
}

impl Tear {
    /// The rule for the active segment `base` of a file of `len` bytes.
    pub(super) fn for_active(mark: Option<SyncMark>, base: u64, len: u64, window: u64) -> Tear {
        match mark {
            Some(m) if m.segment_base == base => Tear::PastMark { from: m.position },
            // Nothing here was acknowledged by a mark yet, but a mark
            // lags: trust no position.
            Some(m) if m.segment_base < base => Tear::TailOnly { from: 0 },
            _ => Tear::TailOnly {
                from: len.saturating_sub(window),
            },
        }
    }
}

pub(super) fn damaged(
    first: u64,
    end: u64,
    base: u64,
    position: u64,
    bytes: u64,
    reason: String,
) -> UnreadableRange {
    UnreadableRange {
        first_offset: first,
        end_offset: end,
        kind: UnreadableKind::Damaged {
            segment_base: base,
            position,
            bytes,
            reason,
        },
    }
}

pub(super) fn hole(first: u64, end: u64) -> UnreadableRange {
    UnreadableRange {
        first_offset: first,
        end_offset: end,
        kind: UnreadableKind::Hole,
    }
}

/// Scans a whole segment file from byte 0. Bad bytes followed by a valid
/// batch are a damaged range (kept, the scan continues after it) unless
/// `tear` says they may be a torn write; bad bytes with nothing valid after
/// them end the scan as [`ScanEnd::Torn`] or [`ScanEnd::DamagedTail`] by the
/// same rule.
///
/// # Errors
/// I/O errors, and [`WalError::StraySegment`] when the first batch of the
/// file is CRC-valid but has a base offset below the file's name (a
/// misnamed file: nothing is changed).
pub(super) fn scan_segment(
    storage: &dyn Storage,
    path: &Path,
    base_offset: u64,
    tear: impl FnOnce(u64) -> Tear,
    config: &WalConfig,
) -> Result<Scan, WalError> {
    let file = storage.open_read(path).map_err(io_err("open", path))?;
    let len = file.size_bytes().map_err(io_err("stat", path))?;
    let tear = tear(len);
    let mut window = ReadAhead::new(file.as_ref(), len);
    let mut meta = SegmentMeta::empty(base_offset);
    let mut unreadable = Vec::new();
    let limits = &super::scan::STORED;
    let mut pos = 0;
    let read = io_err("read", path);
    loop {
        let (bad, misplaced) = match read_batch(&mut window, pos, limits) {
            Err(e) => return Err(read(e)),
            Ok(Step::End) => {
                return Ok(Scan {
                    meta,
                    unreadable,
                    end: ScanEnd::Clean,
                    len,
                });
            }
            Ok(Step::Batch(batch)) if batch.base_offset() >= meta.next_offset => {
                if batch.base_offset() > meta.next_offset {
                    unreadable.push(hole(meta.next_offset, batch.base_offset()));
                }
                meta.note_batch(batch.header(), pos, config.index_interval_bytes);
                pos += batch.len() as u64;
                continue;
            }
            Ok(Step::Batch(batch)) if pos == 0 => {
                return Err(WalError::StraySegment {
                    path: path.to_path_buf(),
                    reason: format!(
                        "its first batch holds offsets {}..{}, but its name says it starts at \
                         {base_offset} (a misnamed file?); every byte is kept",
                        batch.base_offset(),
                        batch.next_offset()
                    ),
                });
            }
            Ok(Step::Batch(batch)) => (
                format!(
                    "batch at byte {pos} has base offset {}, expected {}",
                    batch.base_offset(),
                    meta.next_offset
                ),
                true,
            ),
            Ok(Step::Bad(e)) => (e.to_string(), false),
        };
        let next = if rest_is_zero(&mut window, pos).map_err(io_err("read", path))? {
            None
        } else {
            find_next_valid(&mut window, pos, meta.next_offset, limits)
                .map_err(io_err("read", path))?
        };
        // A valid batch at the wrong offset is no unfinished write.
        let torn = !misplaced
            && match tear {
                Tear::Never => false,
                Tear::PastMark { from } => pos >= from,
                Tear::TailOnly { from } => pos >= from && next.is_none(),
            };
        let end = match next {
            _ if torn => ScanEnd::Torn {
                position: pos,
                reason: bad,
            },
            Some((valid_at, valid_base)) => {
                unreadable.push(damaged(
                    meta.next_offset,
                    valid_base,
                    base_offset,
                    pos,
                    valid_at - pos,
                    bad,
                ));
                meta.next_offset = valid_base;
                pos = valid_at;
                continue;
            }
            None => ScanEnd::DamagedTail {
                position: pos,
                reason: bad,
            },
        };
        return Ok(Scan {
            meta,
            unreadable,
            end,
            len,
        });
    }
}

/// Checks that the segment file `next_base` may follow a segment ending at
/// `prev_end`. When it leaves a gap, its bytes must begin with a valid
/// batch at its named base offset, or the mark must account for the gap
/// (a hole declared at the end of the previous segment, or the mark
/// describes this very segment); otherwise it is a stray file, and
/// adopting it would truncate it away or invent a hole.
///
/// # Errors
/// [`WalError::MissingRange`] naming the file when it starts below
/// `prev_end`, [`WalError::StraySegment`] naming it when it does not
/// continue the log; I/O errors.
pub(super) fn check_follows(
    storage: &dyn Storage,
    dir: &Path,
    prev_end: u64,
    next_base: u64,
    mark: Option<SyncMark>,
) -> Result<(), WalError> {
    let path = dir.join(super::segment::log_file_name(next_base));
    if prev_end > next_base {
        return Err(WalError::MissingRange {
            expected_base: prev_end,
            found_base: next_base,
            path,
        });
    }
    if prev_end == next_base {
        return Ok(());
    }
    let explained = mark.is_some_and(|m| {
        m.segment_base == next_base || (m.segment_base < next_base && m.next_offset >= next_base)
    });
    if explained {
        return Ok(());
    }
    let file = storage.open_read(&path).map_err(io_err("open", &path))?;
    let len = file.size_bytes().map_err(io_err("stat", &path))?;
    let mut window = ReadAhead::new(file.as_ref(), len);
    let first = read_batch(&mut window, 0, &super::scan::STORED).map_err(io_err("read", &path))?;
    let found = match first {
        Step::Batch(batch) if batch.base_offset() == next_base => return Ok(()),
        Step::Batch(batch) => format!(
            "its first batch holds offsets {}..{}",
            batch.base_offset(),
            batch.next_offset()
        ),
        Step::End => "it is empty".to_string(),
        Step::Bad(e) => format!("its {len} bytes do not begin with a valid batch ({e})"),
    };
    Err(WalError::StraySegment {
        path,
        reason: format!(
            "the log ends at offset {prev_end} before it, and {found}, so it does not continue \
             the log at {next_base} (a stray file?); every byte is kept, move it away to open \
             the log"
        ),
    })
}
