//! Opening a WAL directory after a clean stop or a crash.
//!
//! Decision table (one named test per row, in `wal/tests.rs` and, for
//! damage and stray files, `wal/damage_tests.rs` and `wal/stray_tests.rs`;
//! the scan's rules are in `recovery_scan.rs`). "The mark" is the sync mark
//! (`mark.rs`): where the active segment stood when its last group was
//! acknowledged. Bytes before the mark's position were acknowledged, so
//! they are never a torn write. A torn write is only ever at the true end
//! of the log: without a mark that describes the active segment (none, one
//! that does not decode, which is warned about naming the file, or one of
//! an earlier segment), bad bytes are torn only when no valid batch follows
//! them, and without any valid mark (a WAL from before marks) only within
//! the last group-commit window of the file.
//!
//! | what is found | decision |
//! |---|---|
//! | empty directory | create segment `initial_offset` (or the mark's next offset, or `min_next_offset`) and record it as the log start (`wal.tip`) |
//! | `*.tmp` file | interrupted atomic write: delete |
//! | `.index` without its `.log` | the data was lost (retention removes the index first): keep the index, report the segment in [`RecoveryReport::lost_segments`] and log an error; when its range is known and lies before the last segment, it is a sealed segment of 0 bytes whose whole range is damaged (repairable like any damaged range) |
//! | sealed segment (valid `.index`, file length matches) | trust it; its batches are verified when read, and a read reports damage as an unreadable range |
//! | sealed segment longer than its index says | bytes past the index's end are not part of the log: ignored (logged) |
//! | sealed segment shorter than its index says (or empty) | its end was lost: rescan it; the missing end (up to the index's end) is a damaged range, kept and reported at every open (the index stays until a repair rewrites both) |
//! | non-last segment without a valid `.index` | scan it; damaged ranges (also a damaged end, up to the next segment's base) are kept and reported; seal it now |
//! | gap between consecutive segments (both files of a segment gone) | like a lost segment: a sealed segment of 0 bytes over the gap, its whole range damaged (repairable); logged as an error |
//! | overlap between consecutive segments | error `MissingRange`, naming the file that starts too low; nothing changed |
//! | a segment past the end of the one before it (a gap the mark does not account for) whose bytes do not begin with a valid batch at its named base | a stray file: error `StraySegment` naming it; nothing is truncated, sealed or declared a hole |
//! | a segment whose first batch is CRC-valid with a base offset below its name | a misnamed file: error `StraySegment` naming it; nothing changed |
//! | the first segment starts past the log start retention left (`wal.tip`) | the same as a gap: the first segments were deleted by something else |
//! | a batch whose base offset is past the expected one | a declared hole: report it, continue |
//! | last segment sealed | crash between seal and creating the next segment: create it at the sealed end |
//! | last segment, clean end | continue at its next offset |
//! | last segment, bad bytes past the mark, nothing valid after them (partial batch, zeros, garbage) | torn write: truncate |
//! | last segment, bad bytes past the mark, valid data after them | torn out-of-order write of an unacknowledged group: truncate |
//! | last segment without a mark describing it, bad bytes, valid data after them | damage: keep, report, continue after it (no trusted position says they are unacknowledged) |
//! | a CRC-valid batch inside a segment whose base offset is below the expected one | never a torn write: damage, kept and reported |
//! | last segment, bad bytes before the mark, valid data after them | damage: keep the bytes, report the range, continue after it |
//! | last segment, bad bytes before the mark, nothing valid after them | damaged end: keep the bytes; the log continues after them at the mark's next offset |
//! | last segment shorter than the mark's position | its end was lost: truncate to the last valid batch; the lost offsets are a hole |
//! | the mark's next offset past the last batch | those offsets were handed out (or declared a hole): never again; report a hole |
//! | `min_next_offset` past the last batch | the same: acknowledged before and held elsewhere (an edge's checkpoint) |
//!
//! Damage is never repaired and never silently skipped: each range is in
//! [`RecoveryReport::unreadable`] and [`super::Wal::damaged_ranges`], and a
//! read that reaches it returns [`WalError::Unreadable`].
//!
//! Offsets never restart: the first offset of every segment is its file name
//! (made durable by a directory fsync when the segment is created), and the
//! active segment is never deleted, so the next offset is always its base plus
//! its valid records.

use std::collections::BTreeMap;
use std::path::Path;

use tracing::{info, warn};

use super::mark::{self, SyncMark};
use super::recovery_scan::{ScanEnd, Tear, check_follows, damaged, hole, scan_segment};
use super::segment::{SegmentMeta, WalFile, index_file_name, log_file_name, parse_file_name};
use super::storage::{AppendFile, Storage, read_file, write_file_atomic};
use super::{UnreadableKind, UnreadableRange, WalConfig, WalError, io_err};

/// What recovery found and did, for logs and tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Bytes cut from the end of the active segment (torn write), with the
    /// position of the cut.
    pub truncated: Option<TornTail>,
    /// Segments that were sealed during recovery (crash while sealing).
    pub sealed_on_open: Vec<u64>,
    /// Files deleted as leftovers (`.tmp` files of interrupted atomic
    /// writes).
    pub removed_leftovers: Vec<String>,
    /// Segments whose `.index` is here but whose `.log` is gone: their data
    /// was lost (retention removes the index first, so it never leaves
    /// one behind). `(base_offset, next_offset)`, the end from the index
    /// when it is readable. The index is kept as evidence; a lost segment
    /// before the last one is also in [`RecoveryReport::unreadable`] as a
    /// damaged range (see `lost_segments` in this module).
    pub lost_segments: Vec<(u64, Option<u64>)>,
    /// Set when recovery created a new active segment.
    pub created_segment: Option<u64>,
    /// Offset ranges recovery found unreadable: damaged bytes it kept, and
    /// acknowledged offsets missing from the file, which it will never hand
    /// out again. Oldest first.
    pub unreadable: Vec<UnreadableRange>,
}

/// A torn tail cut by recovery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TornTail {
    /// Base offset of the segment.
    pub segment_base: u64,
    /// Byte position of the cut (new file length).
    pub position: u64,
    /// Bytes removed.
    pub bytes_removed: u64,
    /// Why the bytes at `position` were not a valid batch.
    pub reason: String,
}

pub(crate) struct Recovered {
    pub segments: BTreeMap<u64, SegmentMeta>,
    pub report: RecoveryReport,
    /// Sequence number of the sync mark read (0 without one).
    pub mark_seq: u64,
}

/// The segments whose `.index` is here but whose `.log` is gone: their
/// data was lost (retention removes the index first, so it never leaves
/// one behind). Each is logged as an error and listed in
/// [`RecoveryReport::lost_segments`]; its index is kept as evidence. One
/// whose offsets are known (from its index, or up to the next segment when
/// the index is unreadable) and that lies before the last data file comes
/// back as a sealed segment of 0 bytes whose whole range is damaged
/// (returned, and in [`RecoveryReport::unreadable`]): reads report it like
/// any damaged range, and a repair ([`super::Wal::repair_range`]) writes it
/// again from batches the edge or the archive still holds. Any other lost
/// segment (past the last data file, or whose range overlaps the next
/// segment) is only reported.
fn lost_segments(
    storage: &dyn Storage,
    dir: &Path,
    logs: &[u64],
    indexes: &[u64],
    report: &mut RecoveryReport,
) -> Vec<SegmentMeta> {
    let orphans: Vec<u64> = indexes
        .iter()
        .copied()
        .filter(|base| logs.binary_search(base).is_err())
        .collect();
    let last_log = logs.last().copied();
    let mut out = Vec::new();
    for &base in &orphans {
        let index = load_sealed(storage, dir, base).ok().flatten();
        let end = index.as_ref().map(|meta| meta.next_offset);
        tracing::error!(
            dir = %dir.display(),
            base_offset = base,
            end_offset = end,
            "a WAL segment's data file is gone but its index is here (retention never leaves \
             one so): its offsets are unreadable here, reported as a damaged range and \
             re-fetched from the edge or the archive when one still holds them; the index is \
             kept as evidence until then"
        );
        report.lost_segments.push((base, end));
        let next_base = logs
            .iter()
            .chain(&orphans)
            .copied()
            .filter(|&b| b > base)
            .min();
        let Some(next_base) = next_base.filter(|_| last_log.is_some_and(|last| last > base)) else {
            continue;
        };
        let next_offset = end.unwrap_or(next_base);
        if next_offset <= base || next_offset > next_base {
            warn!(dir = %dir.display(), base_offset = base, end_offset = next_offset, next_base, "a lost segment's index does not fit before the next segment; only reported");
            continue;
        }
        let mut meta = SegmentMeta::empty(base);
        meta.next_offset = next_offset;
        meta.sealed = true;
        meta.first_timestamp_ms = index.as_ref().and_then(|m| m.first_timestamp_ms);
        meta.max_timestamp_ms = index.as_ref().and_then(|m| m.max_timestamp_ms);
        let index_bytes = index.as_ref().map_or(0, |m| m.bytes);
        report.unreadable.push(damaged(
            base,
            next_offset,
            base,
            0,
            0,
            format!(
                "the segment's data file {} is missing (its index says {index_bytes} bytes)",
                log_file_name(base)
            ),
        ));
        out.push(meta);
    }
    out
}

/// Offsets `base..next_base` between two segments, whose files (`.log` and
/// `.index`) are both gone: something other than retention deleted them
/// (retention deletes only from the start). Like a lost segment they stay
/// in the log as a sealed segment of 0 bytes whose whole range is damaged
/// (reported, re-fetched from the edge or the archive, rewritten), not an
/// error that makes the topic unusable.
fn missing_segment(
    dir: &Path,
    base: u64,
    next_base: u64,
    report: &mut RecoveryReport,
) -> SegmentMeta {
    tracing::error!(
        dir = %dir.display(),
        base_offset = base,
        end_offset = next_base,
        "WAL segment files are missing between two segments (both the data file and the index are gone): the offsets are reported as a damaged range and re-fetched from the edge or the archive when one still holds them"
    );
    report.lost_segments.push((base, Some(next_base)));
    report.unreadable.push(damaged(
        base,
        next_base,
        base,
        0,
        0,
        format!(
            "the segment {} and its index are missing",
            log_file_name(base)
        ),
    ));
    let mut meta = SegmentMeta::empty(base);
    meta.next_offset = next_base;
    meta.sealed = true;
    meta
}

pub(super) fn load_sealed(
    storage: &dyn Storage,
    dir: &Path,
    base: u64,
) -> Result<Option<SegmentMeta>, WalError> {
    let path = dir.join(index_file_name(base));
    let bytes = match read_file(storage, &path, 64 * 1024 * 1024) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_err("read", &path)(e)),
    };
    match SegmentMeta::decode_index(base, &bytes) {
        Ok(meta) => Ok(Some(meta)),
        Err(why) => {
            warn!(path = %path.display(), why, "ignoring invalid seal index; rescanning the segment");
            Ok(None)
        }
    }
}

fn log_len(storage: &dyn Storage, path: &Path) -> Result<u64, WalError> {
    storage
        .open_read(path)
        .and_then(|f| f.size_bytes())
        .map_err(io_err("stat", path))
}

/// Writes the seal index of `meta` (which must be complete and synced).
pub(crate) fn write_seal(
    storage: &dyn Storage,
    dir: &Path,
    meta: &SegmentMeta,
) -> Result<(), WalError> {
    let path = dir.join(index_file_name(meta.base_offset));
    write_file_atomic(storage, &path, &meta.encode_index()).map_err(io_err("seal", &path))
}

/// Creates an empty segment file at `base`, makes its name durable and
/// returns it opened for appending.
pub(crate) fn create_segment(
    storage: &dyn Storage,
    dir: &Path,
    base: u64,
) -> Result<Box<dyn AppendFile>, WalError> {
    let path = dir.join(log_file_name(base));
    let file = storage
        .open_append(&path)
        .map_err(io_err("create", &path))?;
    storage.sync_dir(dir).map_err(io_err("fsync dir", dir))?;
    Ok(file)
}

pub(crate) fn recover(
    storage: &dyn Storage,
    dir: &Path,
    config: &WalConfig,
) -> Result<Recovered, WalError> {
    storage
        .create_dir_all(dir)
        .map_err(io_err("create dir", dir))?;
    let names = storage.list(dir).map_err(io_err("list", dir))?;
    let mut report = RecoveryReport::default();
    let mut logs = Vec::new();
    let mut indexes = Vec::new();
    for name in names {
        match parse_file_name(&name) {
            Some(WalFile::Log(base)) => logs.push(base),
            Some(WalFile::Index(base)) => indexes.push(base),
            Some(WalFile::Temporary) => report.removed_leftovers.push(name),
            Some(WalFile::Mark | WalFile::Tip) => {}
            None => warn!(dir = %dir.display(), name, "ignoring a file the WAL does not own"),
        }
    }
    logs.sort_unstable();
    indexes.sort_unstable();
    let lost = lost_segments(storage, dir, &logs, &indexes, &mut report);
    for name in &report.removed_leftovers {
        let path = dir.join(name);
        storage.remove(&path).map_err(io_err("remove", &path))?;
    }
    if !report.removed_leftovers.is_empty() {
        storage.sync_dir(dir).map_err(io_err("fsync dir", dir))?;
    }

    let (mark_seq, mark) = match mark::read(storage, dir) {
        Ok(Some((seq, mark))) => (seq, Some(mark)),
        Ok(None) => (0, None),
        Err(e) => {
            let path = dir.join(mark::MARK_FILE_NAME);
            warn!(
                path = %path.display(),
                error = %e,
                "cannot read the sync mark: recovering without it (no position is trusted: \
                 only bad bytes with no valid batch after them at the end of the log are cut)"
            );
            (0, None)
        }
    };

    let mut segments = BTreeMap::new();
    let Some((&last, earlier)) = logs.split_last() else {
        let base = config
            .initial_offset
            .max(config.min_next_offset)
            .max(mark.map_or(0, |m| m.next_offset));
        create_segment(storage, dir, base)?;
        // The log's start, so that segments deleted from it by anything but
        // retention are found at the next open (as after a trim).
        super::tip::record_log_start(storage, dir, base);
        report.created_segment = Some(base);
        segments.insert(base, SegmentMeta::empty(base));
        return Ok(Recovered {
            segments,
            report,
            mark_seq,
        });
    };

    for (i, &base) in earlier.iter().enumerate() {
        let path = dir.join(log_file_name(base));
        let sealed = match load_sealed(storage, dir, base)? {
            Some(meta) => {
                let len = log_len(storage, &path)?;
                if len > meta.bytes {
                    // Sealed data never grows: what lies past the index's
                    // end is not part of the log (the batches the index
                    // covers are read and verified as always).
                    warn!(
                        path = %path.display(),
                        len,
                        index_bytes = meta.bytes,
                        "sealed segment longer than its index: the bytes past the index's end are not part of the log and are ignored"
                    );
                }
                if len < meta.bytes {
                    // Its end was lost (a truncated file): rescanned below
                    // like a segment whose seal was interrupted; what is
                    // missing is reported as its damaged end, up to the
                    // index's end, and the index is kept.
                    warn!(
                        path = %path.display(),
                        len,
                        index_bytes = meta.bytes,
                        "sealed segment shorter than its index: its end was lost"
                    );
                    Err(Some((meta.next_offset, len, meta.bytes)))
                } else {
                    Ok(meta)
                }
            }
            None => Err(None),
        };
        let meta = match sealed {
            Ok(meta) => {
                let next_log = logs[i + 1];
                if !lost
                    .iter()
                    .any(|m| m.base_offset > base && m.base_offset < next_log)
                {
                    check_follows(storage, dir, meta.next_offset, next_log, mark)?;
                }
                meta
            }
            Err(lost_end) => {
                let sealed_end = lost_end.map_or(base, |(end, _, _)| end);
                // Crash while sealing (or a lost end): everything in it was
                // written before the next segment existed, so none of it is
                // a torn write.
                let next_base = lost
                    .iter()
                    .map(|m| m.base_offset)
                    .filter(|&b| b > base)
                    .fold(logs[i + 1], u64::min)
                    .max(sealed_end);
                let scan = scan_segment(storage, &path, base, |_| Tear::Never, config)?;
                if next_base == logs[i + 1] {
                    let end = scan.meta.next_offset.max(sealed_end);
                    check_follows(storage, dir, end, next_base, mark)?;
                }
                let mut meta = scan.meta;
                report.unreadable.extend(scan.unreadable);
                if let ScanEnd::DamagedTail { position, reason }
                | ScanEnd::Torn { position, reason } = scan.end
                {
                    report.unreadable.push(damaged(
                        meta.next_offset,
                        next_base.max(meta.next_offset),
                        base,
                        position,
                        scan.len - position,
                        format!("damaged end of a non-last segment: {reason}"),
                    ));
                    meta.bytes = scan.len;
                } else if let Some((_, len, index_bytes)) = lost_end
                    && meta.next_offset < next_base
                {
                    // Cut at a batch boundary: the batches after it are
                    // gone without a trace in the file.
                    report.unreadable.push(damaged(
                        meta.next_offset,
                        next_base,
                        base,
                        len,
                        0,
                        format!(
                            "end of a sealed segment lost: the file is {len} bytes, its index \
                             said {index_bytes}"
                        ),
                    ));
                }
                if meta.bytes == 0 && lost_end.is_none() && next_base > base {
                    // Emptied by something else (its offsets were handed
                    // out: a later segment exists): damaged like a lost
                    // segment, not an error that stops every topic.
                    report.unreadable.push(damaged(
                        base,
                        next_base,
                        base,
                        0,
                        0,
                        "empty segment before the last one".into(),
                    ));
                }
                if next_base > meta.next_offset {
                    meta.next_offset = next_base;
                }
                if lost_end.is_none() {
                    write_seal(storage, dir, &meta)?;
                    report.sealed_on_open.push(base);
                }
                // A segment whose end was lost keeps its index, the evidence
                // of what it held: every open finds the loss again until a
                // repair rewrites the segment and its index.
                meta.sealed = true;
                meta
            }
        };
        segments.insert(base, meta);
    }
    for meta in lost {
        segments.insert(meta.base_offset, meta);
    }

    let last_path = dir.join(log_file_name(last));
    let sealed_last = match load_sealed(storage, dir, last)? {
        Some(meta) if log_len(storage, &last_path)? == meta.bytes => Some(meta),
        Some(_) => {
            // A seal index whose data file does not match: the index is
            // rewritten after scanning.
            None
        }
        None => None,
    };
    let next_base = match sealed_last {
        Some(meta) => {
            let next = meta.next_offset;
            segments.insert(last, meta);
            create_segment(storage, dir, next)?;
            report.created_segment = Some(next);
            segments.insert(next, SegmentMeta::empty(next));
            None
        }
        None => Some(last),
    };
    if let Some(base) = next_base {
        let meta = recover_active(storage, &last_path, base, mark, config, &mut report)?;
        // A stale index for an unsealed segment would claim it is sealed.
        let stale = dir.join(index_file_name(base));
        if storage.open_read(&stale).is_ok() {
            storage.remove(&stale).map_err(io_err("remove", &stale))?;
            storage.sync_dir(dir).map_err(io_err("fsync dir", dir))?;
        }
        segments.insert(base, meta);
    }
    // Offsets the mark says were handed out are never handed out again,
    // even if their bytes are gone.
    if let Some(mark) = mark
        && let Some(active) = segments.values_mut().next_back()
        && !active.sealed
        && mark.next_offset > active.next_offset
        && mark.segment_base <= active.base_offset
    {
        report
            .unreadable
            .push(hole(active.next_offset, mark.next_offset));
        active.next_offset = mark.next_offset;
    }
    // Offsets handed out before and held elsewhere (an edge's checkpoint)
    // are never handed out again either.
    if let Some(active) = segments.values_mut().next_back()
        && !active.sealed
        && config.min_next_offset > active.next_offset
    {
        warn!(
            dir = %dir.display(),
            end = active.next_offset,
            min_next_offset = config.min_next_offset,
            "the log ends below offsets acknowledged before (its end was lost here); it continues after them"
        );
        report
            .unreadable
            .push(hole(active.next_offset, config.min_next_offset));
        active.next_offset = config.min_next_offset;
    }
    for range in &report.unreadable {
        if range.kind == UnreadableKind::Hole {
            // Declared (a gap the edge or the broker skipped, a reflashed
            // edge continuing at the broker's mark) or the offsets of a
            // torn tail, whose truncation was warned about above: not news
            // at every start.
            info!(dir = %dir.display(), %range, "WAL hole: these offsets hold no record here and are never reused");
        } else {
            warn!(dir = %dir.display(), %range, "WAL range unreadable; kept, reported, and never reused");
        }
    }

    // Retention records the log start it leaves (`wal.tip`) before it
    // deletes: a log starting past it lost its first segments to something
    // else.
    let mut expected: Option<u64> = super::tip::trimmed_log_start(storage, dir)
        .filter(|&end| segments.keys().next().is_some_and(|&first| first > end));
    let mut gaps = Vec::new();
    for meta in segments.values() {
        if let Some(expected) = expected
            && meta.base_offset != expected
        {
            if meta.base_offset < expected {
                return Err(WalError::MissingRange {
                    expected_base: expected,
                    found_base: meta.base_offset,
                    path: dir.join(log_file_name(meta.base_offset)),
                });
            }
            let mut gap = missing_segment(dir, expected, meta.base_offset, &mut report);
            // Unknown: the next segment's, so that age retention keeps the
            // range as long as that one (not at once) while it waits for
            // a repair.
            gap.first_timestamp_ms = meta.first_timestamp_ms;
            gap.max_timestamp_ms = meta.max_timestamp_ms;
            gaps.push(gap);
        }
        expected = Some(meta.next_offset);
    }
    for meta in gaps {
        segments.insert(meta.base_offset, meta);
    }
    if report != RecoveryReport::default() {
        info!(
            dir = %dir.display(),
            truncated_segment = report.truncated.as_ref().map(|t| t.segment_base),
            truncated_at = report.truncated.as_ref().map(|t| t.position),
            truncated_bytes = report.truncated.as_ref().map(|t| t.bytes_removed),
            sealed_on_open = report.sealed_on_open.len(),
            removed_leftovers = report.removed_leftovers.join(","),
            lost_segments = report.lost_segments.len(),
            created_segment = report.created_segment,
            unreadable = report
                .unreadable
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; "),
            "WAL recovered"
        );
    }
    Ok(Recovered {
        segments,
        report,
        mark_seq,
    })
}

/// Recovers the active (last, unsealed) segment at `path`: keeps damage,
/// cuts a torn write, and reports both.
fn recover_active(
    storage: &dyn Storage,
    path: &Path,
    base: u64,
    mark: Option<SyncMark>,
    config: &WalConfig,
    report: &mut RecoveryReport,
) -> Result<SegmentMeta, WalError> {
    // Where a torn write may be: past the mark's position when the mark
    // describes this segment; otherwise (no usable mark, or one of an
    // earlier segment) only a final region with nothing valid after it,
    // within one group-commit window of the end when there is no mark.
    let window = config.torn_write_window_bytes();
    let tear = |len: u64| Tear::for_active(mark, base, len, window);
    let scan = scan_segment(storage, path, base, tear, config)?;
    let mut meta = scan.meta;
    report.unreadable.extend(scan.unreadable);
    // A file shorter than its mark lost its end (truncated): the bytes are
    // gone, so there is nothing to keep. Cut to the last valid batch; the
    // offsets it held become a hole (below).
    let lost_end = mark.is_some_and(|m| m.segment_base == base && scan.len < m.position);
    let end = match scan.end {
        ScanEnd::DamagedTail { position, reason } if lost_end => ScanEnd::Torn {
            position,
            reason: format!("file shorter than its sync mark: {reason}"),
        },
        end => end,
    };
    match end {
        ScanEnd::Clean => {}
        ScanEnd::DamagedTail { position, reason } => {
            // Acknowledged bytes no longer read back: keep them; the log
            // continues after them, at the offset the mark says comes next.
            let end = mark
                .filter(|m| m.segment_base == base)
                .map_or(meta.next_offset, |m| m.next_offset.max(meta.next_offset));
            report.unreadable.push(damaged(
                meta.next_offset,
                end,
                base,
                position,
                scan.len - position,
                reason,
            ));
            meta.next_offset = end;
            meta.bytes = scan.len;
        }
        ScanEnd::Torn { position, reason } => {
            warn!(
                segment = %path.display(),
                position,
                bytes_removed = scan.len - position,
                reason,
                "truncating a torn write at the end of the active segment"
            );
            let mut file = storage.open_append(path).map_err(io_err("open", path))?;
            file.truncate(position)
                .and_then(|()| file.sync_data())
                .map_err(io_err("truncate", path))?;
            report.truncated = Some(TornTail {
                segment_base: base,
                position,
                bytes_removed: scan.len - position,
                reason,
            });
        }
    }
    Ok(meta)
}
