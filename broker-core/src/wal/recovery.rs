//! Opening a WAL directory after a clean stop or a crash.
//!
//! Decision table (one named test per row in `wal/tests.rs`):
//!
//! | what is found | decision |
//! |---|---|
//! | empty directory | create segment `initial_offset` |
//! | `*.tmp` file | interrupted atomic write: delete |
//! | `.index` without its `.log` | retention was interrupted after deleting the data: delete the index |
//! | sealed segment (valid `.index`, file length matches) | trust it; its batches are verified when read |
//! | sealed segment whose file length differs from its index | error `Corrupt`: sealed data changed |
//! | non-last segment without a valid `.index` | scan it; clean → seal it now; damaged → error `Corrupt` |
//! | gap or overlap between consecutive segments | error `MissingRange` |
//! | last segment sealed | crash between seal and creating the next segment: create it at the sealed end |
//! | last segment, clean end | continue at its next offset |
//! | last segment, partial header or batch at the end | torn write: truncate there |
//! | last segment, bad batch, only zeros after it | file extended, data never written: truncate |
//! | last segment, bad batch, nothing valid after it | torn write: truncate |
//! | last segment, bad batch, valid data after it within one group-commit write | torn out-of-order write of an unacknowledged group: truncate |
//! | last segment, bad batch, valid data after it beyond one group-commit write | error `Corrupt`: acknowledged data is damaged; never silently dropped |
//!
//! Offsets never restart: the first offset of every segment is its file name
//! (made durable by a directory fsync when the segment is created), and the
//! active segment is never deleted, so the next offset is always its base plus
//! its valid records.

use std::collections::BTreeMap;
use std::path::Path;

use tracing::{info, warn};

use super::scan::{ReadAhead, Step, find_next_valid, read_batch, rest_is_zero};
use super::segment::{SegmentMeta, WalFile, index_file_name, log_file_name, parse_file_name};
use super::storage::{AppendFile, Storage, read_file, write_file_atomic};
use super::{WalConfig, WalError, io_err};

/// What recovery found and did, for logs and tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Bytes cut from the end of the active segment (torn write), with the
    /// position of the cut.
    pub truncated: Option<TornTail>,
    /// Segments that were sealed during recovery (crash while sealing).
    pub sealed_on_open: Vec<u64>,
    /// Files deleted as leftovers (`.tmp`, orphan `.index`).
    pub removed_leftovers: Vec<String>,
    /// Set when recovery created a new active segment.
    pub created_segment: Option<u64>,
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
}

enum ScanEnd {
    Clean,
    Torn { position: u64, reason: String },
    Corrupt(WalError),
}

/// Scans a whole segment file from byte 0.
fn scan_segment(
    storage: &dyn Storage,
    path: &Path,
    base_offset: u64,
    config: &WalConfig,
) -> Result<(SegmentMeta, ScanEnd), WalError> {
    let file = storage.open_read(path).map_err(io_err("open", path))?;
    let len = file.size_bytes().map_err(io_err("stat", path))?;
    let mut window = ReadAhead::new(file.as_ref(), len);
    let mut meta = SegmentMeta::empty(base_offset);
    let limits = &config.limits;
    loop {
        let pos = meta.bytes;
        let bad = match read_batch(&mut window, pos, limits).map_err(io_err("read", path))? {
            Step::End => return Ok((meta, ScanEnd::Clean)),
            Step::Batch(batch) if batch.base_offset() == meta.next_offset => {
                meta.note_batch(batch.header(), pos, config.index_interval_bytes);
                continue;
            }
            Step::Batch(batch) => format!(
                "batch at byte {pos} has base offset {}, expected {}",
                batch.base_offset(),
                meta.next_offset
            ),
            Step::Bad(e) => e.to_string(),
        };
        if rest_is_zero(&mut window, pos).map_err(io_err("read", path))? {
            return Ok((
                meta,
                ScanEnd::Torn {
                    position: pos,
                    reason: format!("zero-filled tail ({bad})"),
                },
            ));
        }
        let next = find_next_valid(&mut window, pos, meta.next_offset, limits)
            .map_err(io_err("read", path))?;
        let end = match next {
            Some((valid_at, valid_base)) if len - pos > config.torn_write_window_bytes() => {
                ScanEnd::Corrupt(WalError::Corrupt {
                    segment_base: base_offset,
                    first_offset: meta.next_offset,
                    end_offset: valid_base,
                    position: pos,
                    reason: format!("{bad}; valid data resumes at byte {valid_at}"),
                })
            }
            _ => ScanEnd::Torn {
                position: pos,
                reason: bad,
            },
        };
        return Ok((meta, end));
    }
}

fn load_sealed(
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
            None => warn!(dir = %dir.display(), name, "ignoring a file the WAL does not own"),
        }
    }
    logs.sort_unstable();
    for index in indexes {
        if logs.binary_search(&index).is_err() {
            report.removed_leftovers.push(index_file_name(index));
        }
    }
    for name in &report.removed_leftovers {
        let path = dir.join(name);
        storage.remove(&path).map_err(io_err("remove", &path))?;
    }
    if !report.removed_leftovers.is_empty() {
        storage.sync_dir(dir).map_err(io_err("fsync dir", dir))?;
    }

    let mut segments = BTreeMap::new();
    let Some((&last, earlier)) = logs.split_last() else {
        create_segment(storage, dir, config.initial_offset)?;
        report.created_segment = Some(config.initial_offset);
        segments.insert(
            config.initial_offset,
            SegmentMeta::empty(config.initial_offset),
        );
        return Ok(Recovered { segments, report });
    };

    for &base in earlier {
        let path = dir.join(log_file_name(base));
        let meta = match load_sealed(storage, dir, base)? {
            Some(meta) => {
                let len = log_len(storage, &path)?;
                if len != meta.bytes {
                    return Err(WalError::Corrupt {
                        segment_base: base,
                        first_offset: base,
                        end_offset: meta.next_offset,
                        position: len.min(meta.bytes),
                        reason: format!(
                            "sealed segment is {len} bytes, its index says {}",
                            meta.bytes
                        ),
                    });
                }
                meta
            }
            None => {
                let (mut meta, end) = scan_segment(storage, &path, base, config)?;
                match end {
                    ScanEnd::Clean if meta.bytes > 0 => {}
                    ScanEnd::Clean => {
                        return Err(WalError::Corrupt {
                            segment_base: base,
                            first_offset: base,
                            end_offset: base,
                            position: 0,
                            reason: "empty segment before the last one".into(),
                        });
                    }
                    ScanEnd::Corrupt(e) => return Err(e),
                    ScanEnd::Torn { position, reason } => {
                        return Err(WalError::Corrupt {
                            segment_base: base,
                            first_offset: meta.next_offset,
                            end_offset: meta.next_offset,
                            position,
                            reason: format!("damaged end of a non-last segment: {reason}"),
                        });
                    }
                }
                write_seal(storage, dir, &meta)?;
                meta.sealed = true;
                report.sealed_on_open.push(base);
                meta
            }
        };
        segments.insert(base, meta);
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
        let (meta, end) = scan_segment(storage, &last_path, base, config)?;
        match end {
            ScanEnd::Clean => {}
            ScanEnd::Corrupt(e) => return Err(e),
            ScanEnd::Torn { position, reason } => {
                let len = log_len(storage, &last_path)?;
                warn!(
                    segment = %last_path.display(),
                    position,
                    bytes_removed = len - position,
                    reason,
                    "truncating a torn write at the end of the active segment"
                );
                let mut file = storage
                    .open_append(&last_path)
                    .map_err(io_err("open", &last_path))?;
                file.truncate(position)
                    .and_then(|()| file.sync_data())
                    .map_err(io_err("truncate", &last_path))?;
                report.truncated = Some(TornTail {
                    segment_base: base,
                    position,
                    bytes_removed: len - position,
                    reason,
                });
            }
        }
        // A stale index for an unsealed segment would claim it is sealed.
        let stale = dir.join(index_file_name(base));
        if storage.open_read(&stale).is_ok() {
            storage.remove(&stale).map_err(io_err("remove", &stale))?;
            storage.sync_dir(dir).map_err(io_err("fsync dir", dir))?;
        }
        segments.insert(base, meta);
    }

    let mut expected: Option<u64> = None;
    for meta in segments.values() {
        if let Some(expected) = expected
            && meta.base_offset != expected
        {
            return Err(WalError::MissingRange {
                expected_base: expected,
                found_base: meta.base_offset,
            });
        }
        expected = Some(meta.next_offset);
    }
    if report != RecoveryReport::default() {
        info!(dir = %dir.display(), ?report, "WAL recovered");
    }
    Ok(Recovered { segments, report })
}
