//! Reading records: [`BatchSplitter`] cuts a ranged read of the batches
//! region into checked record batches.

use bytes::{Bytes, BytesMut};

use super::{ArchiveError, HoleRange, holes};
use crate::batch::{BatchHeader, EncodedBatch, HEADER_LEN};
use crate::limits::Limits;

/// Splits a stream of batch bytes, starting at a batch boundary, into
/// CRC-verified [`EncodedBatch`]es with contiguous offsets (a gap is
/// accepted only when it is exactly declared holes given to
/// [`BatchSplitter::with_holes`]). Buffers at most one batch (bounded by
/// the limits).
#[derive(Debug)]
pub struct BatchSplitter {
    limits: Limits,
    position: u64,
    next_offset: u64,
    buf: BytesMut,
    holes: Vec<HoleRange>,
    crossed: Vec<HoleRange>,
    /// The error that stopped the split, returned by every later call (the
    /// whole batches before it were returned first).
    failed: Option<ArchiveError>,
}

impl BatchSplitter {
    /// Batches starting at byte `position` with first offset `base_offset`
    /// (a [`super::Block`]'s fields).
    pub fn new(position: u64, base_offset: u64, limits: Limits) -> BatchSplitter {
        BatchSplitter {
            limits,
            position,
            next_offset: base_offset,
            buf: BytesMut::new(),
            holes: Vec::new(),
            crossed: Vec::new(),
            failed: None,
        }
    }

    /// The same splitter, stepping over gaps that are exactly declared
    /// holes of `holes` (an object's [`super::ArchiveIndex::holes`]).
    pub fn with_holes(mut self, holes: &[HoleRange]) -> BatchSplitter {
        self.holes = holes.to_vec();
        self
    }

    /// The declared holes stepped over since the last call, ascending.
    pub fn take_crossed(&mut self) -> Vec<HoleRange> {
        std::mem::take(&mut self.crossed)
    }

    /// Steps from the next offset to `to` if `[next_offset, to)` is exactly
    /// declared holes (holes at the end of an object); true if the next
    /// offset is then `to`.
    pub fn skip_holes_to(&mut self, to: u64) -> bool {
        if self.next_offset == to {
            return true;
        }
        match holes::chain(&self.holes, self.next_offset, to) {
            Some(run) => {
                self.crossed.extend_from_slice(&self.holes[run]);
                self.next_offset = to;
                true
            }
            None => false,
        }
    }

    /// Offset the next batch must start at.
    pub fn next_offset(&self) -> u64 {
        self.next_offset
    }

    /// Feeds bytes; returns the batches completed by them. When bytes turn
    /// out bad after whole batches of the same chunk, those batches are
    /// returned and the error comes from the next call (`push`,
    /// [`BatchSplitter::check`] or [`BatchSplitter::finish`]): a reader
    /// gets every intact batch before damage.
    ///
    /// # Errors
    /// [`ArchiveError::Batch`] or [`ArchiveError::Discontinuity`] with the
    /// byte position and offset.
    pub fn push(&mut self, chunk: &[u8]) -> Result<Vec<EncodedBatch>, ArchiveError> {
        self.check()?;
        self.buf.extend_from_slice(chunk);
        let mut out = Vec::new();
        match self.split(&mut out) {
            Ok(()) => Ok(out),
            Err(e) if out.is_empty() => {
                self.failed = Some(e.clone());
                Err(e)
            }
            Err(e) => {
                self.failed = Some(e);
                Ok(out)
            }
        }
    }

    /// The error that stopped the split, if any.
    ///
    /// # Errors
    /// That error.
    pub fn check(&self) -> Result<(), ArchiveError> {
        match &self.failed {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    fn split(&mut self, out: &mut Vec<EncodedBatch>) -> Result<(), ArchiveError> {
        while self.buf.len() >= HEADER_LEN {
            let header =
                BatchHeader::parse(&self.buf[..HEADER_LEN], &self.limits).map_err(|source| {
                    ArchiveError::Batch {
                        position: self.position,
                        offset: self.next_offset,
                        source,
                    }
                })?;
            let len = header.batch_length as usize;
            if self.buf.len() < len {
                self.buf.reserve(len - self.buf.len());
                break;
            }
            let bytes: Bytes = self.buf.split_to(len).freeze();
            let batch = EncodedBatch::from_bytes(bytes, &self.limits).map_err(|source| {
                ArchiveError::Batch {
                    position: self.position,
                    offset: self.next_offset,
                    source,
                }
            })?;
            if batch.base_offset() != self.next_offset && !self.skip_holes_to(batch.base_offset()) {
                return Err(ArchiveError::Discontinuity {
                    position: self.position,
                    expected: self.next_offset,
                    found: batch.base_offset(),
                });
            }
            self.position += len as u64;
            self.next_offset = batch.next_offset();
            out.push(batch);
        }
        Ok(())
    }

    /// Ends the stream.
    ///
    /// # Errors
    /// The error that stopped the split; [`ArchiveError::BatchesTruncated`]
    /// if bytes of an incomplete batch remain.
    pub fn finish(self) -> Result<(), ArchiveError> {
        self.check()?;
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(ArchiveError::BatchesTruncated {
                position: self.position,
                offset: self.next_offset,
            })
        }
    }
}
