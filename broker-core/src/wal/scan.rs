//! Walking the batches of a segment file: used by recovery (to find the last
//! valid batch) and by reads (to find a batch and verify it).

use std::io;

use bytes::{Bytes, BytesMut};

use super::storage::ReadFile;
use tributary_proto::batch::{BatchHeader, DecodeError, EncodedBatch, HEADER_LEN, MAGIC};
use tributary_proto::limits::Limits;

/// The limits stored batches are read with: the format's ceiling, not the
/// configured `max_batch_bytes` / `max_record_bytes`. Those limit what is
/// appended from now on; a batch stored under an earlier, larger setting
/// stays a valid batch after the setting is lowered (read as damage, it
/// would become a hole in the central log: records lost).
pub(crate) const STORED: Limits = Limits {
    max_record_bytes: tributary_proto::limits::BATCH_BYTES_CEILING
        - tributary_proto::limits::BATCH_HEADER_BYTES,
    max_batch_bytes: tributary_proto::limits::BATCH_BYTES_CEILING,
};

/// Bytes read from the file per refill when scanning (recovery), unless the
/// caller sets another size with [`ReadAhead::set_refill`].
const READ_AHEAD_BYTES: usize = 1024 * 1024;

/// Most buffers a [`ReadBuffers`] keeps.
const MAX_SPARE_BUFFERS: usize = 12;

/// Read buffers kept from one [`super::Wal::read_with`] call for the next.
///
/// A read hands out batches as zero-copy slices of its buffers, so a buffer
/// can be reused only once every slice of it is gone (a replicator sends a
/// batch, then the transport releases it when the peer acknowledged it). A
/// reader that reads continuously keeps its buffers here, and a refill takes
/// one that is free again instead of allocating: no fresh pages to fault in
/// and zero per read. Holds at most 12 buffers (each up to the refill size
/// of the reads, 8 MiB at most); [`ReadBuffers::clear`] returns their memory.
#[derive(Debug, Default)]
pub struct ReadBuffers {
    spare: Vec<Bytes>,
}

impl ReadBuffers {
    /// An empty set.
    pub fn new() -> ReadBuffers {
        ReadBuffers::default()
    }

    /// Drops every kept buffer (a reader about to idle calls it, so an idle
    /// process does not hold read memory).
    pub fn clear(&mut self) {
        self.spare.clear();
    }

    /// Buffers kept.
    pub fn len(&self) -> usize {
        self.spare.len()
    }

    /// Whether no buffer is kept.
    pub fn is_empty(&self) -> bool {
        self.spare.is_empty()
    }

    /// The oldest kept buffer that nothing else refers to any more, if it
    /// holds at least `len` bytes (a smaller free one is dropped); `None` if
    /// none is free.
    fn take_free(&mut self, len: usize) -> Option<BytesMut> {
        let at = self.spare.iter().position(Bytes::is_unique)?;
        let buffer = self.spare.swap_remove(at).try_into_mut().ok()?;
        (buffer.capacity() >= len).then_some(buffer)
    }

    /// Keeps `buffer` for a later refill (dropping the oldest kept one when
    /// full: slices of it may still be in use elsewhere, which is fine).
    fn keep(&mut self, buffer: Bytes) {
        if buffer.is_empty() {
            return;
        }
        if self.spare.len() >= MAX_SPARE_BUFFERS {
            self.spare.remove(0);
        }
        self.spare.push(buffer);
    }
}

/// A read-ahead window over a file, so a scan costs one `pread` per MiB
/// rather than two per batch.
pub(crate) struct ReadAhead<'a> {
    file: &'a dyn ReadFile,
    /// Bytes of the file that may be read (the scan never looks past it).
    end: u64,
    start: u64,
    /// Bytes a refill reads at least (bounded by `end`).
    refill: usize,
    /// The loaded bytes. Batches handed out are zero-copy slices of it, so a
    /// refill takes another buffer while any of them is alive: a free one
    /// from `buffers` (possibly this one), else a new one.
    buf: Bytes,
    /// Where refills look for a free buffer before allocating.
    buffers: ReadBuffers,
}

impl<'a> ReadAhead<'a> {
    pub(crate) fn new(file: &'a dyn ReadFile, end: u64) -> ReadAhead<'a> {
        ReadAhead {
            file,
            end,
            start: 0,
            refill: READ_AHEAD_BYTES,
            buf: Bytes::new(),
            buffers: ReadBuffers::new(),
        }
    }

    /// Like [`ReadAhead::new`], refilling from `buffers` when one is free.
    pub(crate) fn with_buffers(
        file: &'a dyn ReadFile,
        end: u64,
        buffers: ReadBuffers,
    ) -> ReadAhead<'a> {
        ReadAhead {
            buffers,
            ..ReadAhead::new(file, end)
        }
    }

    /// The buffers for the next window, with this window's own.
    pub(crate) fn into_buffers(mut self) -> ReadBuffers {
        let current = std::mem::take(&mut self.buf);
        self.buffers.keep(current);
        self.buffers
    }

    /// Sets how many bytes the next refills read at least (at least 1).
    /// Readers that stop after a byte budget set it to what is left of the
    /// budget, so a refill does not read what will not be used.
    pub(crate) fn set_refill(&mut self, bytes: usize) {
        self.refill = bytes.max(1);
    }

    /// Length of the readable part of the file.
    pub(crate) fn end(&self) -> u64 {
        self.end
    }

    /// `len` bytes at `pos`, or `None` if they pass `end`.
    pub(crate) fn get(&mut self, pos: u64, len: usize) -> io::Result<Option<&[u8]>> {
        Ok(self.load(pos, len)?.map(|at| &self.buf[at..at + len]))
    }

    /// Like [`ReadAhead::get`], as a zero-copy slice of the window's buffer.
    pub(crate) fn get_bytes(&mut self, pos: u64, len: usize) -> io::Result<Option<Bytes>> {
        Ok(self.load(pos, len)?.map(|at| self.buf.slice(at..at + len)))
    }

    /// Makes `len` bytes at `pos` resident; returns their index in `buf`.
    /// A refill is one `pread` of at least the refill size.
    fn load(&mut self, pos: u64, len: usize) -> io::Result<Option<usize>> {
        if pos + len as u64 > self.end {
            return Ok(None);
        }
        let loaded_end = self.start + self.buf.len() as u64;
        if pos < self.start || pos + len as u64 > loaded_end {
            let want = (len.max(self.refill) as u64).min(self.end - pos) as usize;
            let previous = std::mem::take(&mut self.buf);
            self.buffers.keep(previous);
            let mut fresh = self
                .buffers
                .take_free(want)
                .unwrap_or_else(|| BytesMut::with_capacity(want));
            // A reused buffer's bytes are initialized already: only bytes it
            // never held need zeroing before the read overwrites them.
            if fresh.len() >= want {
                fresh.truncate(want);
            } else {
                fresh.resize(want, 0);
            }
            self.file.read_exact_at(&mut fresh, pos)?;
            self.buf = fresh.freeze();
            self.start = pos;
        }
        Ok(Some((pos - self.start) as usize))
    }
}

/// Result of trying to read one batch at a position.
pub(crate) enum Step {
    /// A CRC-valid batch.
    Batch(EncodedBatch),
    /// The readable part of the file ends exactly here.
    End,
    /// The bytes here are not a valid batch.
    Bad(DecodeError),
}

/// Reads and verifies the batch at `pos`.
pub(crate) fn read_batch(
    window: &mut ReadAhead<'_>,
    pos: u64,
    limits: &Limits,
) -> io::Result<Step> {
    if pos == window.end() {
        return Ok(Step::End);
    }
    let available = (window.end() - pos) as usize;
    let Some(head) = window.get(pos, HEADER_LEN.min(available))? else {
        return Ok(Step::End);
    };
    let header = match BatchHeader::parse(head, limits) {
        Ok(h) => h,
        Err(e) => return Ok(Step::Bad(e)),
    };
    let len = header.batch_length as usize;
    let Some(bytes) = window.get_bytes(pos, len)? else {
        return Ok(Step::Bad(DecodeError::Truncated {
            needed: len,
            available,
        }));
    };
    match EncodedBatch::from_bytes(bytes, limits) {
        Ok(batch) => Ok(Step::Batch(batch)),
        Err(e) => Ok(Step::Bad(e)),
    }
}

/// Looks for the first CRC-valid batch starting after `pos` whose base offset
/// is at least `min_base`: evidence that the damage at `pos` is followed by
/// real data. Returns its position and base offset.
pub(crate) fn find_next_valid(
    window: &mut ReadAhead<'_>,
    pos: u64,
    min_base: u64,
    limits: &Limits,
) -> io::Result<Option<(u64, u64)>> {
    let mut at = pos + 1;
    while at + HEADER_LEN as u64 <= window.end() {
        let is_magic = window.get(at, 4)?.is_some_and(|m| m == MAGIC);
        if is_magic
            && let Step::Batch(batch) = read_batch(window, at, limits)?
            && batch.base_offset() >= min_base
        {
            return Ok(Some((at, batch.base_offset())));
        }
        at += 1;
    }
    Ok(None)
}

/// True if every byte from `pos` to the end of the window is zero (a file
/// extended by the file system whose data never reached the disk).
pub(crate) fn rest_is_zero(window: &mut ReadAhead<'_>, pos: u64) -> io::Result<bool> {
    let mut at = pos;
    while at < window.end() {
        let len = ((window.end() - at) as usize).min(READ_AHEAD_BYTES);
        match window.get(at, len)? {
            Some(chunk) if chunk.iter().all(|&b| b == 0) => at += len as u64,
            _ => return Ok(false),
        }
    }
    Ok(true)
}
