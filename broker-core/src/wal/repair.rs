//! Damaged sealed segments: the background check of their CRCs
//! ([`Wal::scrub_segment`]), their atomic rewrite with re-fetched batches
//! ([`Wal::repair_range`]), and damaged ranges an operator gave up on
//! ([`Wal::mark_skipped`], read as a declared hole from then on).
//!
//! # The rewrite
//! A sealed segment never changes in place. [`Wal::repair_range`] writes the
//! whole new segment (the intact batches as they are, the re-fetched
//! batches in place of the damaged bytes) to `{base:020}.log.tmp`,
//! `fdatasync`s it, scans it back (every batch CRC-verified, offsets
//! exactly those of the old segment, the repaired range readable), then:
//! removes the old `.index` and fsyncs the directory, renames the new file
//! over the `.log` and fsyncs the directory, and writes the new `.index`
//! atomically. A crash at any step leaves the old segment or the new one:
//! before the rename, recovery removes the `.tmp` and finds the old `.log`
//! (without an index it rescans and reseals it, finding the damage again);
//! after it, recovery finds the new `.log`, and reseals it if the index was
//! not written yet.

use std::io;

use tributary_proto::batch::EncodedBatch;

use super::scan::{ReadAhead, Step, find_next_valid, read_batch};
use super::segment::{SegmentMeta, index_file_name, log_file_name};
use super::storage::{ReadFile, read_file};
use super::{UnreadableKind, UnreadableRange, Wal, WalConfig, WalError, io_err};

/// What [`Wal::scrub_segment`] checked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScrubReport {
    /// Bytes read and CRC-checked.
    pub bytes: u64,
    /// Damaged ranges in the segment (new or already known), oldest first.
    pub damaged: Vec<UnreadableRange>,
}

/// What [`Wal::repair_range`] rewrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepairReport {
    /// Base offset of the rewritten segment.
    pub segment_base: u64,
    /// The range that is readable again.
    pub first_offset: u64,
    /// Its exclusive end.
    pub end_offset: u64,
    /// Size of the segment file before and after, bytes.
    pub bytes_before: u64,
    /// Size after the rewrite, bytes.
    pub bytes_after: u64,
}

/// A segment's bytes held in memory, readable like a file.
struct MemFile(Vec<u8>);

impl ReadFile for MemFile {
    fn read_exact_at(&self, buf: &mut [u8], pos: u64) -> io::Result<()> {
        let start = usize::try_from(pos).map_err(|_| io::ErrorKind::InvalidInput)?;
        let src = self
            .0
            .get(start..start + buf.len())
            .ok_or(io::ErrorKind::UnexpectedEof)?;
        buf.copy_from_slice(src);
        Ok(())
    }

    fn size_bytes(&self) -> io::Result<u64> {
        Ok(self.0.len() as u64)
    }
}

/// Scans the `len` bytes of a sealed segment at `base` whose records end at
/// `next_offset`: the segment's metadata rebuilt from its valid batches, and
/// its damaged ranges (bad bytes up to the next valid batch, or to
/// `next_offset` at the end).
fn scan_sealed(
    file: &dyn ReadFile,
    base: u64,
    len: u64,
    next_offset: u64,
    config: &WalConfig,
) -> io::Result<(SegmentMeta, Vec<UnreadableRange>)> {
    let mut window = ReadAhead::new(file, len);
    let mut meta = SegmentMeta::empty(base);
    let mut damaged = Vec::new();
    let limits = &super::scan::STORED;
    let mut pos = 0;
    loop {
        let reason = match read_batch(&mut window, pos, limits)? {
            Step::End => break,
            Step::Batch(batch) if batch.base_offset() >= meta.next_offset => {
                meta.note_batch(batch.header(), pos, config.index_interval_bytes);
                pos += batch.len() as u64;
                continue;
            }
            Step::Batch(batch) => format!(
                "batch at byte {pos} has base offset {}, expected {}",
                batch.base_offset(),
                meta.next_offset
            ),
            Step::Bad(e) => e.to_string(),
        };
        let (end_offset, resume_at) =
            match find_next_valid(&mut window, pos, meta.next_offset, limits)? {
                Some((at, base_offset)) => (base_offset, at),
                None => (next_offset.max(meta.next_offset), len),
            };
        damaged.push(UnreadableRange {
            first_offset: meta.next_offset,
            end_offset,
            kind: UnreadableKind::Damaged {
                segment_base: base,
                position: pos,
                bytes: resume_at - pos,
                reason,
            },
        });
        meta.next_offset = end_offset;
        meta.bytes = resume_at;
        pos = resume_at;
    }
    meta.next_offset = meta.next_offset.max(next_offset);
    meta.bytes = len;
    meta.sealed = true;
    Ok((meta, damaged))
}

/// The offset after the last batch of `file`, the segment at `base`, when
/// every byte is a valid batch in order (`base` for an empty file,
/// `u64::MAX` otherwise).
fn batches_end(file: &MemFile, base: u64) -> u64 {
    let mut window = ReadAhead::new(file, file.0.len() as u64);
    let (mut pos, mut end) = (0, base);
    loop {
        match read_batch(&mut window, pos, &super::scan::STORED) {
            Ok(Step::End) => return end,
            Ok(Step::Batch(batch)) if batch.base_offset() >= end => {
                pos += batch.len() as u64;
                end = batch.next_offset();
            }
            _ => return u64::MAX,
        }
    }
}

impl Wal {
    /// Reads the sealed segment at `base` end to end and verifies every
    /// batch's CRC, header and offsets; every damaged range found is
    /// recorded (once: logged when first found) in
    /// [`Wal::damaged_ranges`]. The broker calls it in the background at a
    /// bounded rate (`[wal] scrub_bytes_per_sec`). A segment that is not
    /// sealed (or no longer exists) is skipped with an empty report.
    ///
    /// # Errors
    /// I/O errors reading the segment.
    pub fn scrub_segment(&self, base: u64) -> Result<ScrubReport, WalError> {
        let rewrites = self
            .shared
            .rewrites
            .load(std::sync::atomic::Ordering::SeqCst);
        let Some((bytes, next_offset)) = self
            .shared
            .segments()
            .get(&base)
            .filter(|m| m.sealed)
            .map(|m| (m.bytes, m.next_offset))
        else {
            return Ok(ScrubReport::default());
        };
        let path = self.shared.dir.join(log_file_name(base));
        let file = match self.shared.storage.open_read(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(ScrubReport::default()),
            Err(e) => return Err(io_err("open", &path)(e)),
        };
        let (_, found) = scan_sealed(file.as_ref(), base, bytes, next_offset, &self.shared.config)
            .map_err(io_err("read", &path))?;
        // A segment rewritten by a repair while this scan ran: the scan saw
        // the old file; its findings are stale.
        if self
            .shared
            .rewrites
            .load(std::sync::atomic::Ordering::SeqCst)
            != rewrites
        {
            return Ok(ScrubReport::default());
        }
        let damaged = found
            .into_iter()
            .map(|range| self.note_unreadable(range))
            .collect();
        Ok(ScrubReport { bytes, damaged })
    }

    /// Replaces the damaged range starting at `first_offset` (as listed by
    /// [`Wal::damaged_ranges`]) with `batches`, re-fetched from the edge or
    /// the archive, and rewrites its segment atomically (see the module
    /// doc). `batches` must be CRC-valid (an [`EncodedBatch`] is) and cover
    /// exactly the damaged range, contiguously. A range in the active
    /// segment is sealed first ([`Wal::roll`]), then repaired. Afterwards
    /// the range reads like any other and is no longer listed.
    ///
    /// # Errors
    /// [`WalError::NotDamaged`] if no damaged range starts at
    /// `first_offset`; [`WalError::RepairMismatch`] if `batches` do not
    /// cover it exactly or the rewritten segment does not verify (nothing
    /// is changed then); I/O errors (the WAL keeps the old or the new
    /// segment, see the module doc).
    pub async fn repair_range(
        &self,
        first_offset: u64,
        batches: &[EncodedBatch],
    ) -> Result<RepairReport, WalError> {
        let range = self.damaged_at(first_offset)?;
        let UnreadableKind::Damaged { segment_base, .. } = range.kind else {
            return Err(WalError::NotDamaged { first_offset });
        };
        let mut expected = range.first_offset;
        for batch in batches {
            if batch.base_offset() != expected {
                return Err(WalError::RepairMismatch {
                    first_offset,
                    end_offset: range.end_offset,
                    reason: format!(
                        "batch starts at {}, expected {expected}",
                        batch.base_offset()
                    ),
                });
            }
            expected = batch.next_offset();
        }
        if expected != range.end_offset {
            return Err(WalError::RepairMismatch {
                first_offset,
                end_offset: range.end_offset,
                reason: format!("batches end at {expected}"),
            });
        }
        let result = self
            .rewrite(segment_base, first_offset, range.end_offset, batches)
            .await;
        if matches!(result, Ok(_) | Err(WalError::NotDamaged { .. })) {
            self.shared.unreadable().remove(&first_offset);
        }
        result
    }

    /// Skips the damaged range `first_offset..end_offset` for good (an
    /// operator's decision, `tribctl topics skip-damaged`): reads return
    /// [`UnreadableKind::Hole`] for it from now on ([`Wal::mark_skipped`]),
    /// and its segment is rewritten atomically without the damaged bytes
    /// (as [`Wal::repair_range`] does), so the offsets become a gap like
    /// any declared hole and the segment verifies again (the tier service
    /// can archive it with the hole). Returns whether the segment was
    /// rewritten: `false` when no such damaged bytes are stored (already
    /// rewritten, or an edge-declared hole that never had bytes).
    ///
    /// # Errors
    /// [`WalError::RepairMismatch`] if the segment would be empty or does
    /// not verify (the range is still read as a hole); I/O errors.
    pub async fn skip_damaged(&self, first_offset: u64, end_offset: u64) -> Result<bool, WalError> {
        // Damage in the active segment is known from recovery or a read;
        // without it, nothing to rewrite (and no reason to roll).
        let known_damage = self.damaged_at(first_offset).is_ok();
        self.mark_skipped(first_offset, end_offset);
        let Some((segment_base, sealed)) = self
            .shared
            .segments()
            .range(..=first_offset)
            .next_back()
            .map(|(&base, meta)| (base, meta.sealed))
        else {
            return Ok(false);
        };
        if !sealed && !known_damage {
            return Ok(false);
        }
        match self
            .rewrite(segment_base, first_offset, end_offset, &[])
            .await
        {
            Ok(_) => Ok(true),
            Err(WalError::NotDamaged { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Rewrites the segment at `segment_base` with `batches` in place of its
    /// damaged bytes for `first_offset..end_offset` (none: the offsets
    /// become a gap), atomically (module doc). [`WalError::NotDamaged`] if
    /// a scan of the segment finds no such damaged range.
    async fn rewrite(
        &self,
        segment_base: u64,
        first_offset: u64,
        end_offset: u64,
        batches: &[EncodedBatch],
    ) -> Result<RepairReport, WalError> {
        let sealed = self
            .shared
            .segments()
            .get(&segment_base)
            .is_some_and(|m| m.sealed);
        if !sealed {
            self.roll().await?;
        }
        let range = UnreadableRange {
            first_offset,
            end_offset,
            kind: UnreadableKind::Hole,
        };
        let mismatch = |why: String| WalError::RepairMismatch {
            first_offset,
            end_offset,
            reason: why,
        };
        let shared = &self.shared;
        let dir = &shared.dir;
        let storage = shared.storage.as_ref();
        let path = dir.join(log_file_name(segment_base));
        let mut tmp_name = log_file_name(segment_base);
        tmp_name.push_str(".tmp");
        let tmp = dir.join(tmp_name);
        // Segments stay locked for the rewrite: no reader plans a read of
        // this segment from metadata that is about to change.
        let mut segments = shared.segments_mut();
        // As in retention: a handle whose writer ended changes no file.
        if shared.state().closing {
            return Err(WalError::Closed);
        }
        let Some(old) = segments.get(&segment_base).filter(|m| m.sealed).cloned() else {
            return Err(WalError::NotDamaged { first_offset });
        };
        // A lost segment (recovery found its index without its data file)
        // is held as 0 bytes: there is nothing to read.
        let bytes = match read_file(storage, &path, old.bytes) {
            Err(e) if e.kind() == io::ErrorKind::NotFound && old.bytes == 0 => Vec::new(),
            read => read.map_err(io_err("read", &path))?,
        };
        let current = MemFile(bytes);
        let (_, damage) = scan_sealed(
            &current,
            segment_base,
            old.bytes,
            old.next_offset,
            &shared.config,
        )
        .map_err(io_err("read", &path))?;
        let found = damage.iter().find_map(|d| match d.kind {
            UnreadableKind::Damaged {
                position, bytes, ..
            } if d.first_offset == first_offset && d.end_offset == range.end_offset => {
                Some((position, bytes))
            }
            _ => None,
        });
        // The lost end of a segment cut at a batch boundary leaves no bytes
        // to find: its batches end at `first_offset`, its index said
        // `end_offset` (recovery reported it), and the re-fetched batches
        // go at the end of the file. A lost data file is the same with no
        // batches at all.
        let lost_end = || {
            let index_says_more = old.bytes == 0
                || super::recovery::load_sealed(storage, dir, segment_base)
                    .ok()
                    .flatten()
                    .is_some_and(|index| index.bytes > old.bytes);
            (index_says_more
                && end_offset == old.next_offset
                && batches_end(&current, segment_base) == first_offset)
                .then_some((old.bytes, 0))
        };
        let Some((position, length)) = found.or_else(lost_end) else {
            // Already healed or skipped (a scan finds no such damage).
            return Err(WalError::NotDamaged { first_offset });
        };
        let damage_left = damage.len() - usize::from(found.is_some());
        let (start, end) = (position as usize, (position + length) as usize);
        let mut new = Vec::with_capacity(
            current.0.len() - (end - start) + batches.iter().map(EncodedBatch::len).sum::<usize>(),
        );
        new.extend_from_slice(&current.0[..start]);
        for batch in batches {
            new.extend_from_slice(batch.as_bytes());
        }
        new.extend_from_slice(&current.0[end..]);
        let new = MemFile(new);
        let new_len = new.0.len() as u64;
        if new_len == 0 {
            return Err(mismatch("the segment would be empty".into()));
        }
        let (mut meta, left) =
            scan_sealed(&new, segment_base, new_len, old.next_offset, &shared.config)
                .map_err(io_err("verify", &tmp))?;
        if meta.next_offset != old.next_offset
            || left
                .iter()
                .any(|d| d.first_offset < range.end_offset && d.end_offset > range.first_offset)
            || left.len() != damage_left
        {
            return Err(mismatch("the rewritten segment does not verify".into()));
        }
        meta.first_write_at = old.first_write_at;
        {
            let mut file = storage.open_append(&tmp).map_err(io_err("create", &tmp))?;
            file.truncate(0).map_err(io_err("truncate", &tmp))?;
            file.append(&new.0).map_err(io_err("write", &tmp))?;
            file.sync_data().map_err(io_err("fdatasync", &tmp))?;
        }
        let index = dir.join(index_file_name(segment_base));
        match storage.remove(&index) {
            // A segment recovery found missing altogether (no `.index`).
            Err(e) if e.kind() == io::ErrorKind::NotFound && old.bytes == 0 => {}
            removed => removed.map_err(io_err("remove", &index))?,
        }
        storage.sync_dir(dir).map_err(io_err("fsync dir", dir))?;
        shared
            .rewrites
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        storage
            .rename(&tmp, &path)
            .map_err(io_err("rename", &tmp))?;
        storage.sync_dir(dir).map_err(io_err("fsync dir", dir))?;
        super::recovery::write_seal(storage, dir, &meta)?;
        segments.insert(segment_base, meta);
        drop(segments);
        tracing::info!(
            dir = %dir.display(),
            segment_base,
            first_offset,
            end_offset = range.end_offset,
            bytes_before = old.bytes,
            bytes_after = new_len,
            "rewrote a segment: its damaged range replaced by re-fetched batches, or removed (skipped)"
        );
        Ok(RepairReport {
            segment_base,
            first_offset,
            end_offset: range.end_offset,
            bytes_before: old.bytes,
            bytes_after: new_len,
        })
    }

    /// The damaged range starting at `first_offset`.
    fn damaged_at(&self, first_offset: u64) -> Result<UnreadableRange, WalError> {
        self.shared
            .unreadable()
            .get(&first_offset)
            .filter(|r| matches!(r.kind, UnreadableKind::Damaged { .. }))
            .cloned()
            .ok_or(WalError::NotDamaged { first_offset })
    }

    /// Declares `first_offset..end_offset` a hole that an operator skipped
    /// (`tribctl topics skip-damaged`): from now on reads return
    /// [`UnreadableKind::Hole`] for it, whatever bytes are stored there.
    /// Held in memory: the broker records the hole in Raft and applies it
    /// again after every open. Replaces a damaged range listed at the same
    /// first offset.
    pub fn mark_skipped(&self, first_offset: u64, end_offset: u64) {
        if end_offset <= first_offset {
            return;
        }
        self.shared.unreadable().insert(
            first_offset,
            UnreadableRange {
                first_offset,
                end_offset,
                kind: UnreadableKind::Hole,
            },
        );
    }
}
