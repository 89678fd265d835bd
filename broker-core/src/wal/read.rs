//! The read path: [`Wal::read`] of CRC-verified batches below the
//! high-water mark, across segments, with reusable buffers, and
//! [`Wal::wait_for_offset`] for tailing readers.

use std::io;

use tributary_proto::batch::EncodedBatch;

use super::scan::{ReadAhead, Step, find_next_valid, read_batch};
use super::segment::log_file_name;
use super::{ReadBuffers, UnreadableKind, UnreadableRange, Wal, WalError, io_err};

/// Smallest refill of a [`Wal::read`], bytes: small batches near the end of
/// a budget still share one `pread`.
const MIN_READ_REFILL_BYTES: usize = 64 * 1024;
/// Largest refill of a [`Wal::read`], bytes. Batches are zero-copy slices of
/// the refill buffer, which stays allocated while any of them is alive.
const MAX_READ_REFILL_BYTES: usize = 8 * 1024 * 1024;

impl Wal {
    /// Waits until a record at `offset` is readable (the high-water mark is
    /// above it) and returns the new high-water mark. Does not poll: it is
    /// woken by the writer.
    ///
    /// # Errors
    /// [`WalError::Closed`] or [`WalError::PreviousIo`] if the WAL stops
    /// first.
    pub async fn wait_for_offset(&self, offset: u64) -> Result<u64, WalError> {
        let mut rx = self.shared.progress.subscribe();
        let progress = rx
            .wait_for(|p| p.high_water_mark > offset || p.failure.is_some() || p.closed)
            .await
            .map_err(|_| WalError::Closed)?;
        if progress.high_water_mark > offset {
            return Ok(progress.high_water_mark);
        }
        match &progress.failure {
            Some(failure) => Err(WalError::PreviousIo(failure.clone())),
            None => Err(WalError::Closed),
        }
    }

    /// Reads whole batches starting with the one that holds `from_offset`,
    /// up to about `max_bytes` (at least one batch if any is readable), never
    /// past the high-water mark. Every batch is CRC-verified. The first batch
    /// may start before `from_offset`; records below it are the caller's to
    /// skip. A read stops before an unreadable range (damaged bytes or a
    /// declared hole) and returns the good batches before it; a read that
    /// starts in one returns [`WalError::Unreadable`] naming it, and the
    /// caller continues at its `end_offset`.
    ///
    /// # Errors
    /// [`WalError::OffsetBelowLogStart`] if retention deleted `from_offset`,
    /// [`WalError::Unreadable`] if `from_offset` is in an unreadable range,
    /// I/O errors.
    pub fn read(&self, from_offset: u64, max_bytes: usize) -> Result<Vec<EncodedBatch>, WalError> {
        self.read_with(from_offset, max_bytes, &mut ReadBuffers::new())
    }

    /// Like [`Wal::read`], taking read buffers from `buffers` and leaving
    /// them there for the next call: a reader that reads the log
    /// continuously (the edge's replicator) reuses memory instead of
    /// allocating it per read.
    ///
    /// # Errors
    /// As [`Wal::read`].
    pub fn read_with(
        &self,
        from_offset: u64,
        max_bytes: usize,
        buffers: &mut ReadBuffers,
    ) -> Result<Vec<EncodedBatch>, WalError> {
        let hwm = self.high_water_mark();
        let rewrites = self
            .shared
            .rewrites
            .load(std::sync::atomic::Ordering::SeqCst);
        let mut out = Vec::new();
        if from_offset >= hwm {
            return Ok(out);
        }
        let plan: Vec<SegmentPlan> = {
            let segments = self.shared.segments();
            let log_start = segments.values().next().map_or(0, |s| s.base_offset);
            if from_offset < log_start {
                return Err(WalError::OffsetBelowLogStart {
                    requested: from_offset,
                    log_start,
                });
            }
            let first = segments.range(..=from_offset).next_back();
            first
                .map(|(&base, meta)| (base, meta, meta.scan_start_at(from_offset)))
                .into_iter()
                .chain(
                    segments
                        .range(from_offset + 1..)
                        .map(|(&base, meta)| (base, meta, (0, base))),
                )
                .map(|(base, meta, (start, start_offset))| SegmentPlan {
                    base,
                    start,
                    start_offset,
                    visible: meta.bytes,
                    next_offset: meta.next_offset,
                })
                .collect()
        };
        let mut budget = max_bytes;
        let mut wanted = from_offset;
        // Either the batches read so far, or the unreadable range where
        // `wanted` is.
        let stop = |out: Vec<EncodedBatch>, range: UnreadableRange| {
            if out.is_empty() {
                Err(WalError::Unreadable(range))
            } else {
                Ok(out)
            }
        };
        for segment in plan {
            let SegmentPlan {
                base,
                start,
                start_offset,
                visible,
                next_offset: segment_next,
            } = segment;
            let path = self.shared.dir.join(log_file_name(base));
            let file = match self.shared.storage.open_read(&path) {
                Ok(f) => f,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    // A lost segment (recovery found its index without its
                    // data file): its whole range is a damaged range.
                    if let Some(range) = self.lost_range(base) {
                        let range = UnreadableRange {
                            first_offset: range.first_offset.max(wanted),
                            ..range
                        };
                        return stop(out, range);
                    }
                    if self.rewritten_since(rewrites) {
                        // Repaired since this read planned.
                        return self.read_with(from_offset, max_bytes, buffers);
                    }
                    return Err(WalError::OffsetBelowLogStart {
                        requested: from_offset,
                        log_start: self.log_start_offset(),
                    });
                }
                Err(e) => return Err(io_err("open", &path)(e)),
            };
            let mut window =
                ReadAhead::with_buffers(file.as_ref(), visible, std::mem::take(buffers));
            let mut pos = start;
            // The offset the batch at `pos` should start with.
            let mut expected = start_offset;
            let limits = &super::scan::STORED;
            // `Some` once the read ends (budget, high-water mark or an
            // unreadable range) with this result.
            let done = loop {
                // Read ahead no further than the budget can use (at least a
                // batch header, and enough for small batches to share a pread).
                window.set_refill(budget.clamp(MIN_READ_REFILL_BYTES, MAX_READ_REFILL_BYTES));
                let reason = match read_batch(&mut window, pos, limits)
                    .map_err(io_err("read", &path))?
                {
                    Step::End => {
                        // Offsets the segment covers with no batch: a hole,
                        // unless the segment was rewritten since this read
                        // planned (a lost segment written again, say).
                        let end = segment_next.min(hwm);
                        if wanted < end && expected < end {
                            if self.rewritten_since(rewrites) {
                                *buffers = window.into_buffers();
                                return self.read_with(from_offset, max_bytes, buffers);
                            }
                            let range = self.note_unreadable(hole(expected.max(wanted), end));
                            break Some(stop(std::mem::take(&mut out), range));
                        }
                        break None;
                    }
                    Step::Batch(batch) if batch.base_offset() >= expected => {
                        if batch.base_offset() >= hwm {
                            break Some(Ok(std::mem::take(&mut out)));
                        }
                        if batch.base_offset() > expected && batch.base_offset() > wanted {
                            let range = self
                                .note_unreadable(hole(expected.max(wanted), batch.base_offset()));
                            break Some(stop(std::mem::take(&mut out), range));
                        }
                        pos += batch.len() as u64;
                        expected = batch.next_offset();
                        if batch.next_offset() <= wanted {
                            continue;
                        }
                        if !out.is_empty() && batch.len() > budget {
                            break Some(Ok(std::mem::take(&mut out)));
                        }
                        budget = budget.saturating_sub(batch.len());
                        wanted = batch.next_offset();
                        out.push(batch);
                        if budget == 0 {
                            break Some(Ok(std::mem::take(&mut out)));
                        }
                        continue;
                    }
                    Step::Batch(b) => format!(
                        "batch at byte {pos} has base offset {}, expected {expected}",
                        b.base_offset()
                    ),
                    Step::Bad(e) => e.to_string(),
                };
                // Bad bytes at `pos`: the unreadable range runs to the next
                // valid batch, or to the end of the segment.
                if self.rewritten_since(rewrites) {
                    // A segment was rewritten (repaired or skipped) since
                    // this read planned: its bytes may have moved. Read
                    // again with the new layout.
                    *buffers = window.into_buffers();
                    return self.read_with(from_offset, max_bytes, buffers);
                }
                let resumes = find_next_valid(&mut window, pos, expected, limits)
                    .map_err(io_err("read", &path))?;
                let (end_offset, resume_at) = match resumes {
                    Some((at, base_offset)) => (base_offset, at),
                    None => (segment_next.max(expected), visible),
                };
                let range = self.note_unreadable(UnreadableRange {
                    first_offset: expected,
                    end_offset,
                    kind: UnreadableKind::Damaged {
                        segment_base: base,
                        position: pos,
                        bytes: resume_at - pos,
                        reason,
                    },
                });
                if end_offset <= wanted {
                    // Damage wholly before what is wanted: step over it.
                    pos = resume_at;
                    expected = end_offset;
                    continue;
                }
                let range = UnreadableRange {
                    first_offset: range.first_offset.max(wanted),
                    ..range
                };
                break Some(stop(std::mem::take(&mut out), range));
            };
            *buffers = window.into_buffers();
            if let Some(result) = done {
                return result;
            }
        }
        Ok(out)
    }
}

impl Wal {
    /// Whether a segment was rewritten (repaired or skipped) since
    /// `rewrites` was read from the counter.
    fn rewritten_since(&self, rewrites: u64) -> bool {
        self.shared
            .rewrites
            .load(std::sync::atomic::Ordering::SeqCst)
            != rewrites
    }

    /// The unreadable range of the lost segment at `base` (recovery found
    /// its index without its data file and holds it as 0 bytes): its whole
    /// range, damaged, or a hole once an operator skipped it.
    fn lost_range(&self, base: u64) -> Option<UnreadableRange> {
        let lost = self
            .shared
            .segments()
            .get(&base)
            .is_some_and(|m| m.sealed && m.bytes == 0);
        if !lost {
            return None;
        }
        self.shared.unreadable().get(&base).cloned()
    }
}

/// One segment a read visits: where to start and what it held when the
/// read began.
struct SegmentPlan {
    base: u64,
    /// Byte position to start scanning at.
    start: u64,
    /// Base offset of the batch at `start`.
    start_offset: u64,
    /// Bytes readers may see.
    visible: u64,
    /// The segment's next offset (past any declared hole at its end).
    next_offset: u64,
}

fn hole(first_offset: u64, end_offset: u64) -> UnreadableRange {
    UnreadableRange {
        first_offset,
        end_offset,
        kind: UnreadableKind::Hole,
    }
}
