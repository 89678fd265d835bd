//! The read path: [`Wal::read`] of CRC-verified batches below the
//! high-water mark, across segments, with reusable buffers, and
//! [`Wal::wait_for_offset`] for tailing readers.

use std::io;

use tributary_proto::batch::EncodedBatch;

use super::scan::{ReadAhead, Step, find_next_valid, read_batch};
use super::segment::log_file_name;
use super::{ReadBuffers, Wal, WalError, io_err};

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
    /// skip.
    ///
    /// # Errors
    /// [`WalError::OffsetBelowLogStart`] if retention deleted `from_offset`,
    /// [`WalError::Corrupt`] naming the unreadable range if a batch on the way
    /// is damaged, I/O errors.
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
        let mut out = Vec::new();
        if from_offset >= hwm {
            return Ok(out);
        }
        let plan: Vec<(u64, u64, u64)> = {
            let segments = self.shared.segments();
            let log_start = segments.values().next().map_or(0, |s| s.base_offset);
            if from_offset < log_start {
                return Err(WalError::OffsetBelowLogStart {
                    requested: from_offset,
                    log_start,
                });
            }
            segments
                .range(..=from_offset)
                .next_back()
                .into_iter()
                .chain(segments.range(from_offset + 1..))
                .map(|(&base, meta)| (base, meta.scan_start(from_offset), meta.bytes))
                .collect()
        };
        let mut budget = max_bytes;
        let mut wanted = from_offset;
        for (i, (base, start, visible)) in plan.into_iter().enumerate() {
            let start = if i == 0 { start } else { 0 };
            let path = self.shared.dir.join(log_file_name(base));
            let file = match self.shared.storage.open_read(&path) {
                Ok(f) => f,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
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
            // `true` once the budget or the high-water mark ends the read.
            let done = loop {
                // Read ahead no further than the budget can use (at least a
                // batch header, and enough for small batches to share a pread).
                window.set_refill(budget.clamp(MIN_READ_REFILL_BYTES, MAX_READ_REFILL_BYTES));
                match read_batch(&mut window, pos, &self.shared.config.limits)
                    .map_err(io_err("read", &path))?
                {
                    Step::End => break false,
                    Step::Batch(batch) => {
                        if batch.base_offset() >= hwm {
                            break true;
                        }
                        pos += batch.len() as u64;
                        if batch.next_offset() <= wanted {
                            continue;
                        }
                        if !out.is_empty() && batch.len() > budget {
                            break true;
                        }
                        budget = budget.saturating_sub(batch.len());
                        wanted = batch.next_offset();
                        out.push(batch);
                        if budget == 0 {
                            break true;
                        }
                    }
                    Step::Bad(reason) => {
                        let resumes =
                            find_next_valid(&mut window, pos, wanted, &self.shared.config.limits)
                                .map_err(io_err("read", &path))?;
                        let end_offset = match resumes {
                            Some((_, base)) => base,
                            None => self
                                .shared
                                .segments()
                                .get(&base)
                                .map_or(wanted, |m| m.next_offset),
                        };
                        return Err(WalError::Corrupt {
                            segment_base: base,
                            first_offset: wanted,
                            end_offset,
                            position: pos,
                            reason: reason.to_string(),
                        });
                    }
                }
            };
            *buffers = window.into_buffers();
            if done {
                return Ok(out);
            }
        }
        Ok(out)
    }
}
