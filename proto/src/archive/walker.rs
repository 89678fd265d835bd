//! Incremental batch walking: the batch-boundary state machine the
//! builder and the verifier share; it holds one batch header,
//! never a whole batch.

use super::{ArchiveError, HoleRange, holes};
use crate::batch::{BatchHeader, CRC_START, DecodeError, HEADER_LEN};
use crate::limits::{BATCH_HEADER_BYTES, Limits};

/// A batch the walker finished and verified.
#[derive(Debug, Clone, Copy)]
pub(super) struct Walked {
    pub(super) header: BatchHeader,
    pub(super) position: u64,
}

/// Parses back-to-back batches from pushed bytes without buffering a batch:
/// it keeps the 48-byte header and a running CRC of the body.
#[derive(Debug, Clone)]
pub(super) struct BatchWalker {
    limits: Limits,
    /// Bytes consumed so far (object position).
    pub(super) position: u64,
    /// Offset the next batch must start at.
    pub(super) next_offset: u64,
    header: [u8; HEADER_LEN],
    header_fill: usize,
    body: Option<Body>,
    /// Declared holes a gap may be (ascending, disjoint).
    holes: Vec<HoleRange>,
    /// The holes stepped over so far, ascending.
    pub(super) crossed: Vec<HoleRange>,
}

#[derive(Debug, Clone, Copy)]
struct Body {
    header: BatchHeader,
    start: u64,
    remaining: u32,
    crc: u32,
}

impl BatchWalker {
    pub(super) fn new(base_offset: u64, position: u64, limits: Limits) -> BatchWalker {
        BatchWalker {
            limits,
            position,
            next_offset: base_offset,
            header: [0; HEADER_LEN],
            header_fill: 0,
            body: None,
            holes: Vec::new(),
            crossed: Vec::new(),
        }
    }

    /// The same walker, stepping over gaps that are exactly declared holes
    /// of `holes` (ascending and disjoint).
    pub(super) fn with_holes(mut self, holes: Vec<HoleRange>) -> BatchWalker {
        self.holes = holes;
        self
    }

    /// Steps from the next offset to `to` if `[next_offset, to)` is exactly
    /// a run of declared holes; false (nothing changed) otherwise.
    pub(super) fn cross_to(&mut self, to: u64) -> bool {
        match holes::chain(&self.holes, self.next_offset, to) {
            Some(run) => {
                self.crossed.extend_from_slice(&self.holes[run]);
                self.next_offset = to;
                true
            }
            None => false,
        }
    }

    /// Steps over the declared holes that start at the next offset, one
    /// after the other (holes at the end of a segment).
    pub(super) fn cross_trailing(&mut self) {
        while let Some(h) = self
            .holes
            .iter()
            .find(|h| h.first_offset == self.next_offset)
            .copied()
        {
            self.crossed.push(h);
            self.next_offset = h.end_offset;
        }
    }

    /// Position where the batch being parsed started.
    pub(super) fn batch_start(&self) -> u64 {
        match &self.body {
            Some(body) => body.start,
            None => self.position - self.header_fill as u64,
        }
    }

    pub(super) fn at_boundary(&self) -> bool {
        self.body.is_none() && self.header_fill == 0
    }

    /// Consumes a prefix of `chunk`; returns bytes consumed and a batch if
    /// one completed. Call again with the rest.
    pub(super) fn step(&mut self, chunk: &[u8]) -> Result<(usize, Option<Walked>), ArchiveError> {
        let fail = |walker: &BatchWalker, source| ArchiveError::Batch {
            position: walker.batch_start(),
            offset: walker.next_offset,
            source,
        };
        match self.body {
            None => {
                let take = (HEADER_LEN - self.header_fill).min(chunk.len());
                self.header[self.header_fill..self.header_fill + take]
                    .copy_from_slice(&chunk[..take]);
                self.header_fill += take;
                self.position += take as u64;
                if self.header_fill < HEADER_LEN {
                    return Ok((take, None));
                }
                let header =
                    BatchHeader::parse(&self.header, &self.limits).map_err(|e| fail(self, e))?;
                let start = self.position - HEADER_LEN as u64;
                if header.base_offset != self.next_offset && !self.cross_to(header.base_offset) {
                    return Err(ArchiveError::Discontinuity {
                        position: start,
                        expected: self.next_offset,
                        found: header.base_offset,
                    });
                }
                let body = Body {
                    header,
                    start,
                    remaining: header.batch_length - BATCH_HEADER_BYTES,
                    crc: crc32c::crc32c(&self.header[CRC_START..]),
                };
                self.header_fill = 0;
                self.body = Some(body);
                self.finish_body_if_done().map(|done| (take, done))
            }
            Some(mut body) => {
                let take = (body.remaining as usize).min(chunk.len());
                body.crc = crc32c::crc32c_append(body.crc, &chunk[..take]);
                body.remaining -= take as u32;
                self.position += take as u64;
                self.body = Some(body);
                self.finish_body_if_done().map(|done| (take, done))
            }
        }
    }

    pub(super) fn finish_body_if_done(&mut self) -> Result<Option<Walked>, ArchiveError> {
        let Some(body) = self.body else {
            return Ok(None);
        };
        if body.remaining > 0 {
            return Ok(None);
        }
        if body.crc != body.header.crc {
            return Err(ArchiveError::Batch {
                position: body.start,
                offset: self.next_offset,
                source: DecodeError::CrcMismatch {
                    expected: body.header.crc,
                    actual: body.crc,
                },
            });
        }
        self.body = None;
        self.next_offset = body.header.next_offset();
        Ok(Some(Walked {
            header: body.header,
            position: body.start,
        }))
    }
}
