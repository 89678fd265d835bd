//! Verifying: [`SegmentVerifier`] rebuilds the tail from the batches, compares
//! it with the stored one, and reports damaged offset ranges.

use std::fmt;

use super::walker::BatchWalker;
use super::{ArchiveBuilder, ArchiveError, ArchiveIndex, Footer};
use crate::limits::Limits;

/// An unreadable offset range of one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Damage {
    /// First unreadable offset.
    pub first_offset: u64,
    /// First offset readable again (exclusive end).
    pub end_offset: u64,
    /// Byte position where the damage was found.
    pub position: u64,
    /// What is wrong.
    pub reason: String,
}

impl fmt::Display for Damage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "offsets {}..{} unreadable (byte {}): {}",
            self.first_offset, self.end_offset, self.position, self.reason
        )
    }
}

/// The verdict on one object's batches region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyReport {
    /// Damaged ranges, ascending; empty when the object is intact.
    pub damage: Vec<Damage>,
    /// Batches that verified.
    pub batches_ok: u64,
    /// Records in batches that verified.
    pub records_ok: u64,
}

impl VerifyReport {
    /// True when nothing is damaged.
    pub fn is_intact(&self) -> bool {
        self.damage.is_empty()
    }
}

/// Verifies an object's batches region (streamed in chunks of any size)
/// against its footer and index: every batch CRC and offset, the batches
/// CRC, and that the batches rebuild exactly the stored index and footer.
///
/// After a damaged batch it skips to the next index entry and goes on, so
/// the report names each unreadable offset range. The object's declared
/// holes ([`ArchiveIndex::holes`]) are not damage: the batches step over
/// them; any other gap in the offsets is.
#[derive(Debug)]
pub struct SegmentVerifier {
    footer: Footer,
    index: ArchiveIndex,
    limits: Limits,
    /// Rebuilds index and footer while no damage was found.
    builder: Option<ArchiveBuilder>,
    walker: BatchWalker,
    /// Some(resume position) while skipping damaged bytes.
    skipping_to: Option<u64>,
    position: u64,
    batches_crc: u32,
    report: VerifyReport,
}

impl SegmentVerifier {
    /// A verifier for the object with this footer and index.
    pub fn new(index: &ArchiveIndex, limits: Limits) -> SegmentVerifier {
        let footer = *index.footer();
        let holes = index.holes().to_vec();
        let builder = ArchiveBuilder::with_interval(
            footer.base_offset,
            footer.batches_bytes,
            footer.index_interval_bytes,
            limits,
        )
        .and_then(|b| b.with_holes(&holes))
        .ok();
        SegmentVerifier {
            footer,
            index: index.clone(),
            limits,
            builder,
            walker: BatchWalker::new(footer.base_offset, 0, limits).with_holes(holes),
            skipping_to: None,
            position: 0,
            batches_crc: 0,
            report: VerifyReport {
                damage: Vec::new(),
                batches_ok: 0,
                records_ok: 0,
            },
        }
    }

    /// Bytes of the batches region seen so far.
    pub fn position(&self) -> u64 {
        self.position
    }

    /// Feeds the next bytes of the batches region (never more than
    /// `batches_bytes` in total; extra bytes are ignored).
    pub fn push(&mut self, chunk: &[u8]) {
        let room = self.footer.batches_bytes.saturating_sub(self.position);
        let chunk = &chunk[..chunk.len().min(room as usize)];
        self.batches_crc = crc32c::crc32c_append(self.batches_crc, chunk);
        if let Some(builder) = &mut self.builder
            && builder.push(chunk).is_err()
        {
            self.builder = None;
        }
        let mut rest = chunk;
        while !rest.is_empty() {
            if let Some(resume) = self.skipping_to {
                let skip = ((resume - self.position) as usize).min(rest.len());
                rest = &rest[skip..];
                self.position += skip as u64;
                if self.position == resume {
                    self.skipping_to = None;
                }
                continue;
            }
            match self.walker.step(rest) {
                Ok((used, done)) => {
                    rest = &rest[used..];
                    self.position += used as u64;
                    if let Some(batch) = done {
                        self.report.batches_ok += 1;
                        self.report.records_ok += u64::from(batch.header.record_count);
                    }
                }
                Err(err) => {
                    let at = self.walker.position;
                    let consumed = (at - self.position) as usize;
                    rest = &rest[consumed.min(rest.len())..];
                    self.position = at;
                    self.damaged(&err);
                }
            }
        }
    }

    /// Records damage found by the walker and arranges to resume at the
    /// next index entry past it.
    fn damaged(&mut self, err: &ArchiveError) {
        let (position, first_offset) = match err {
            ArchiveError::Batch {
                position, offset, ..
            } => (*position, *offset),
            ArchiveError::Discontinuity {
                position, expected, ..
            } => (*position, *expected),
            _ => (self.walker.batch_start(), self.walker.next_offset),
        };
        let resume =
            self.index.entries().iter().find(|e| {
                u64::from(e.position) > position && u64::from(e.position) >= self.position
            });
        let (resume_position, end_offset) = match resume {
            Some(e) => (
                u64::from(e.position),
                self.footer.base_offset + u64::from(e.relative_offset),
            ),
            None => (self.footer.batches_bytes, self.footer.next_offset),
        };
        self.push_damage(Damage {
            first_offset,
            end_offset: end_offset.max(first_offset),
            position,
            reason: err.to_string(),
        });
        self.walker = BatchWalker::new(end_offset, resume_position, self.limits)
            .with_holes(self.index.holes().to_vec());
        if resume_position > self.position {
            self.skipping_to = Some(resume_position);
        }
    }

    fn push_damage(&mut self, damage: Damage) {
        match self.report.damage.last_mut() {
            Some(last) if last.end_offset >= damage.first_offset => {
                last.end_offset = last.end_offset.max(damage.end_offset);
            }
            _ => self.report.damage.push(damage),
        }
    }

    /// Ends the batches region and returns the verdict.
    pub fn finish(mut self) -> VerifyReport {
        let (base_offset, next_offset) = (self.footer.base_offset, self.footer.next_offset);
        let whole = |reason: String, position| Damage {
            first_offset: base_offset,
            end_offset: next_offset,
            position,
            reason,
        };
        if self.position < self.footer.batches_bytes {
            let d = Damage {
                first_offset: self.walker.next_offset,
                end_offset: self.footer.next_offset,
                position: self.position,
                reason: format!(
                    "batches region ends at byte {}, the footer says {}",
                    self.position, self.footer.batches_bytes
                ),
            };
            self.push_damage(d);
            return self.report;
        }
        if self.skipping_to.is_none() && !self.walker.at_boundary() {
            let d = Damage {
                first_offset: self.walker.next_offset,
                end_offset: self.footer.next_offset,
                position: self.walker.batch_start(),
                reason: "the last batch is incomplete".into(),
            };
            self.push_damage(d);
        }
        if !self.report.damage.is_empty() {
            return self.report;
        }
        if self.batches_crc != self.footer.batches_crc32c {
            let err = ArchiveError::BatchesCrc {
                stored: self.footer.batches_crc32c,
                computed: self.batches_crc,
            };
            self.report.damage.push(whole(err.to_string(), 0));
            return self.report;
        }
        let rebuilt = self.builder.take().map(ArchiveBuilder::finish);
        let problem = match rebuilt {
            Some(Ok(tail))
                if tail.footer == self.footer
                    && tail.entries == self.index.entries
                    && tail.holes == self.index.holes() =>
            {
                None
            }
            Some(Ok(tail)) => Some(describe_difference(&self.footer, &tail.footer)),
            Some(Err(err)) => Some(err.to_string()),
            None => Some("batches do not rebuild the stored index".to_owned()),
        };
        if let Some(reason) = problem {
            self.report.damage.push(whole(
                format!("footer or index disagrees with the batches: {reason}"),
                self.footer.batches_bytes,
            ));
        }
        self.report
    }
}

fn describe_difference(stored: &Footer, rebuilt: &Footer) -> String {
    let fields: [(&str, u64, u64); 6] = [
        ("next_offset", stored.next_offset, rebuilt.next_offset),
        ("batch_count", stored.batch_count, rebuilt.batch_count),
        (
            "first_timestamp_ms",
            stored.first_timestamp_ms as u64,
            rebuilt.first_timestamp_ms as u64,
        ),
        (
            "max_timestamp_ms",
            stored.max_timestamp_ms as u64,
            rebuilt.max_timestamp_ms as u64,
        ),
        (
            "index_entry_count",
            u64::from(stored.index_entry_count),
            u64::from(rebuilt.index_entry_count),
        ),
        (
            "index_crc32c",
            u64::from(stored.index_crc32c),
            u64::from(rebuilt.index_crc32c),
        ),
    ];
    fields.iter().find(|(_, a, b)| a != b).map_or_else(
        || "index entries differ".to_owned(),
        |(name, a, b)| format!("{name}: stored {a}, rebuilt {b}"),
    )
}
