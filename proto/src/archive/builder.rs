//! Writing: [`ArchiveBuilder`] streams a sealed segment's bytes and produces
//! the [`ArchiveTail`] (index and footer) that follows them in the object.

use super::walker::{BatchWalker, Walked};
use super::{
    ArchiveError, ArchiveIndex, ENTRY_MAX_TS_AT, ENTRY_POSITION_AT, ENTRY_RELATIVE_OFFSET_AT,
    FOOTER_BYTES, Footer, HoleRange, INDEX_ENTRY_BYTES, IndexEntry, MAX_BATCHES_BYTES, MAX_HOLES,
    MAX_INDEX_ENTRIES, MIN_INDEX_INTERVAL_BYTES, holes, index_interval_for, put_u32, put_u64,
};
use crate::limits::Limits;

/// The bytes that follow the batches region (index, holes, footer), and
/// the footer they end with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchiveTail {
    /// The footer.
    pub footer: Footer,
    /// The index entries.
    pub entries: Vec<IndexEntry>,
    /// The declared holes the object carries (the batches step over them).
    pub holes: Vec<HoleRange>,
    /// Index region, holes region, footer: append to the batches region.
    pub bytes: Vec<u8>,
}

/// Builds an archive object from a segment's bytes, streamed in chunks of
/// any size: push every byte of the segment file (they are the batches
/// region, uploaded as they are), then [`ArchiveBuilder::finish`] for the
/// index and footer to append.
///
/// Every batch is checked (header, CRC, offset continuity from the expected
/// base offset) as it passes, so a damaged segment is refused before its
/// object is completed. A gap between batches (or after the last one) is
/// accepted only when it is exactly declared holes given to
/// [`ArchiveBuilder::with_holes`]; the object then carries them (format
/// version 2). Memory: a 48-byte header, running CRCs and at most
/// [`MAX_INDEX_ENTRIES`] index entries.
#[derive(Debug, Clone)]
pub struct ArchiveBuilder {
    walker: BatchWalker,
    base_offset: u64,
    batches_bytes: u64,
    interval: u32,
    batches_crc: u32,
    batch_count: u64,
    first_timestamp_ms: i64,
    max_timestamp_ms: i64,
    entries: Vec<IndexEntry>,
    /// Declared holes given, ascending and disjoint.
    declared: Vec<HoleRange>,
    /// Invariant: after an error every later call returns it again.
    failed: Option<ArchiveError>,
}

impl ArchiveBuilder {
    /// A builder for a segment whose first record is `base_offset` and whose
    /// file is `batches_bytes` long (the sealed segment's size; the index
    /// interval is derived from it). Batches are checked against `limits`.
    ///
    /// # Errors
    /// [`ArchiveError::TooLarge`] over [`MAX_BATCHES_BYTES`],
    /// [`ArchiveError::Empty`] for an empty segment.
    pub fn new(
        base_offset: u64,
        batches_bytes: u64,
        limits: Limits,
    ) -> Result<ArchiveBuilder, ArchiveError> {
        ArchiveBuilder::with_interval(
            base_offset,
            batches_bytes,
            index_interval_for(batches_bytes),
            limits,
        )
    }

    pub(super) fn with_interval(
        base_offset: u64,
        batches_bytes: u64,
        interval: u32,
        limits: Limits,
    ) -> Result<ArchiveBuilder, ArchiveError> {
        if batches_bytes > MAX_BATCHES_BYTES {
            return Err(ArchiveError::TooLarge {
                bytes: batches_bytes,
            });
        }
        if batches_bytes == 0 {
            return Err(ArchiveError::Empty);
        }
        Ok(ArchiveBuilder {
            walker: BatchWalker::new(base_offset, 0, limits),
            base_offset,
            batches_bytes,
            interval: interval.max(MIN_INDEX_INTERVAL_BYTES),
            batches_crc: 0,
            batch_count: 0,
            first_timestamp_ms: i64::MAX,
            max_timestamp_ms: i64::MIN,
            entries: Vec::new(),
            declared: Vec::new(),
            failed: None,
        })
    }

    /// The same builder, told the declared holes of the topic that lie in
    /// the segment's offsets (those recorded in Raft under
    /// `/topics/{ns}/{topic}/holes/`): a gap between batches, or after the
    /// last batch, that is exactly a run of them is stepped over and
    /// recorded in the object. Give only holes inside the segment's
    /// offsets: [`ArchiveBuilder::finish`] refuses a given hole that the
    /// batches do not skip.
    ///
    /// # Errors
    /// [`ArchiveError::HolesInvalid`] if `holes` are empty ranges, not
    /// ascending, or overlap.
    pub fn with_holes(mut self, holes: &[HoleRange]) -> Result<ArchiveBuilder, ArchiveError> {
        holes::check_sorted(holes)?;
        self.declared = holes.to_vec();
        self.walker = self.walker.with_holes(holes.to_vec());
        Ok(self)
    }

    /// Bytes pushed so far.
    pub fn position(&self) -> u64 {
        self.walker.position
    }

    /// Offset the next batch must start at.
    pub fn next_offset(&self) -> u64 {
        self.walker.next_offset
    }

    /// Feeds the next bytes of the segment.
    ///
    /// # Errors
    /// [`ArchiveError::Batch`] or [`ArchiveError::Discontinuity`] naming
    /// the byte position and offset, [`ArchiveError::Mismatch`] if more
    /// bytes arrive than announced. The builder is unusable afterwards.
    pub fn push(&mut self, chunk: &[u8]) -> Result<(), ArchiveError> {
        if let Some(err) = &self.failed {
            return Err(err.clone());
        }
        let result = self.push_inner(chunk);
        if let Err(err) = &result {
            self.failed = Some(err.clone());
        }
        result
    }

    fn push_inner(&mut self, chunk: &[u8]) -> Result<(), ArchiveError> {
        let after = self.walker.position + chunk.len() as u64;
        if after > self.batches_bytes {
            return Err(ArchiveError::Mismatch {
                field: "segment bytes",
                expected: self.batches_bytes,
                actual: after,
            });
        }
        self.batches_crc = crc32c::crc32c_append(self.batches_crc, chunk);
        let mut rest = chunk;
        while !rest.is_empty() {
            let (used, done) = self.walker.step(rest)?;
            rest = &rest[used..];
            if let Some(batch) = done {
                self.note(batch)?;
            }
        }
        Ok(())
    }

    fn note(&mut self, batch: Walked) -> Result<(), ArchiveError> {
        let header = batch.header;
        let relative = header.base_offset - self.base_offset;
        let due = self.entries.last().is_none_or(|last| {
            batch.position - u64::from(last.position) >= u64::from(self.interval)
        });
        if due {
            let relative_offset = u32::try_from(relative).map_err(|_| ArchiveError::Mismatch {
                field: "records in one segment",
                expected: u64::from(u32::MAX),
                actual: relative,
            })?;
            // `position < batches_bytes <= u32::MAX` (checked in `new` and `push`).
            self.entries.push(IndexEntry {
                relative_offset,
                position: batch.position as u32,
                max_timestamp_ms: header.max_timestamp_ms,
            });
        } else if let Some(last) = self.entries.last_mut() {
            last.max_timestamp_ms = last.max_timestamp_ms.max(header.max_timestamp_ms);
        }
        if self.entries.len() > MAX_INDEX_ENTRIES as usize {
            // Unreachable with the interval of `new`; a CRC-valid footer
            // with a too small interval can ask for it when verifying.
            return Err(ArchiveError::Mismatch {
                field: "index entries",
                expected: u64::from(MAX_INDEX_ENTRIES),
                actual: self.entries.len() as u64,
            });
        }
        self.batch_count += 1;
        self.first_timestamp_ms = self.first_timestamp_ms.min(header.first_timestamp_ms);
        self.max_timestamp_ms = self.max_timestamp_ms.max(header.max_timestamp_ms);
        Ok(())
    }

    /// Ends the batches region (stepping over declared holes that start
    /// where the last batch ends) and returns the index, holes and footer
    /// to append.
    ///
    /// # Errors
    /// An earlier push error, [`ArchiveError::BatchesTruncated`] if the
    /// bytes end inside a batch, [`ArchiveError::Mismatch`] if fewer bytes
    /// than announced arrived, [`ArchiveError::Empty`],
    /// [`ArchiveError::HoleNotInSegment`] for a given hole inside the
    /// object's offsets that the batches do not skip,
    /// [`ArchiveError::HolesInvalid`] for more than [`MAX_HOLES`] holes.
    pub fn finish(mut self) -> Result<ArchiveTail, ArchiveError> {
        if let Some(err) = self.failed {
            return Err(err);
        }
        if self.walker.at_boundary() {
            self.walker.cross_trailing();
        }
        if !self.walker.at_boundary() {
            return Err(ArchiveError::BatchesTruncated {
                position: self.walker.batch_start(),
                offset: self.walker.next_offset,
            });
        }
        if self.walker.position != self.batches_bytes {
            return Err(ArchiveError::Mismatch {
                field: "segment bytes",
                expected: self.batches_bytes,
                actual: self.walker.position,
            });
        }
        if self.batch_count == 0 {
            return Err(ArchiveError::Empty);
        }
        let (base, next) = (self.base_offset, self.walker.next_offset);
        let crossed = std::mem::take(&mut self.walker.crossed);
        if let Some(h) = self
            .declared
            .iter()
            .find(|h| h.overlaps(base, next) && !crossed.contains(h))
        {
            return Err(ArchiveError::HoleNotInSegment {
                first_offset: h.first_offset,
                end_offset: h.end_offset,
            });
        }
        if crossed.len() > MAX_HOLES as usize {
            return Err(ArchiveError::HolesInvalid {
                entry: MAX_HOLES,
                reason: "more than 1024 declared holes in one segment",
            });
        }
        let mut bytes = Vec::with_capacity(self.entries.len() * INDEX_ENTRY_BYTES + FOOTER_BYTES);
        for entry in &self.entries {
            let mut raw = [0u8; INDEX_ENTRY_BYTES];
            put_u32(&mut raw, ENTRY_RELATIVE_OFFSET_AT, entry.relative_offset);
            put_u32(&mut raw, ENTRY_POSITION_AT, entry.position);
            put_u64(&mut raw, ENTRY_MAX_TS_AT, entry.max_timestamp_ms as u64);
            bytes.extend_from_slice(&raw);
        }
        let index_crc32c = crc32c::crc32c(&bytes);
        let hole_bytes = holes::encode(&crossed);
        bytes.extend_from_slice(&hole_bytes);
        let footer = Footer {
            base_offset: self.base_offset,
            next_offset: self.walker.next_offset,
            batch_count: self.batch_count,
            batches_bytes: self.batches_bytes,
            index_entry_count: self.entries.len() as u32,
            index_interval_bytes: self.interval,
            first_timestamp_ms: self.first_timestamp_ms,
            max_timestamp_ms: self.max_timestamp_ms,
            batches_crc32c: self.batches_crc,
            index_crc32c,
            hole_count: crossed.len() as u32,
            hole_offsets: crossed.iter().map(HoleRange::len).sum(),
            holes_crc32c: crc32c::crc32c(&hole_bytes),
        };
        bytes.extend_from_slice(&footer.encode());
        // Pair assertion: what was written reads back.
        let check = Footer::decode_from_tail(&bytes)
            .and_then(|f| ArchiveIndex::decode_from_tail(&f, &bytes).map(|_| f));
        assert_eq!(check, Ok(footer), "archive invariant: a built tail decodes");
        Ok(ArchiveTail {
            footer,
            entries: self.entries,
            holes: crossed,
            bytes,
        })
    }
}
