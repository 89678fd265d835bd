//! [`HoleRange`]: a declared hole an archive object carries (version 2),
//! the encoding of the holes region, and the rule that lets a walk over
//! the batches step over a gap only when it is exactly declared holes.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::{
    ArchiveError, Footer, HOLE_END_AT, HOLE_ENTRY_BYTES, HOLE_FIRST_AT, put_u64, read_u64,
};

/// Offsets `[first_offset, end_offset)` that hold no record because they
/// were declared a hole (`Hole` frame, recorded in Raft at
/// `/topics/{ns}/{topic}/holes/{first_offset:020}`), not because bytes are
/// missing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct HoleRange {
    /// First offset of the hole.
    pub first_offset: u64,
    /// Exclusive end: the offset of the next record.
    pub end_offset: u64,
}

impl HoleRange {
    /// Offsets in the hole.
    pub fn len(&self) -> u64 {
        self.end_offset.saturating_sub(self.first_offset)
    }

    /// True for a range holding no offset (never a valid hole).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True if the hole shares an offset with `[first, end)`.
    pub fn overlaps(&self, first: u64, end: u64) -> bool {
        self.first_offset < end && first < self.end_offset
    }
}

impl fmt::Display for HoleRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}..{}", self.first_offset, self.end_offset)
    }
}

/// Checks that `holes` are non-empty, ascending and do not overlap.
///
/// # Errors
/// [`ArchiveError::HolesInvalid`] naming the first bad entry.
pub(super) fn check_sorted(holes: &[HoleRange]) -> Result<(), ArchiveError> {
    let mut prev_end: Option<u64> = None;
    for (i, h) in holes.iter().enumerate() {
        let invalid = |reason| ArchiveError::HolesInvalid {
            entry: i as u32,
            reason,
        };
        if h.is_empty() {
            return Err(invalid("a hole holds no offset"));
        }
        if prev_end.is_some_and(|end| h.first_offset < end) {
            return Err(invalid("holes are not ascending and disjoint"));
        }
        prev_end = Some(h.end_offset);
    }
    Ok(())
}

/// Whether `holes` (ascending, disjoint) cover exactly `[from, to)`, one
/// after the other: the rule by which a gap in a segment's offsets is
/// accepted as declared holes (the builder, readers, and the tier service
/// for a skipped lost segment).
pub fn holes_cover_exactly(holes: &[HoleRange], from: u64, to: u64) -> bool {
    chain(holes, from, to).is_some()
}

/// The holes of `holes` (ascending, disjoint) that, one after the other,
/// cover exactly `[from, to)`, as an index range; `None` if `[from, to)`
/// is not exactly a run of declared holes (an undeclared gap).
pub(super) fn chain(holes: &[HoleRange], from: u64, to: u64) -> Option<std::ops::Range<usize>> {
    if to <= from {
        return None;
    }
    let start = holes.partition_point(|h| h.first_offset < from);
    let mut at = from;
    let mut i = start;
    while at < to {
        match holes.get(i) {
            Some(h) if h.first_offset == at && h.end_offset <= to => {
                at = h.end_offset;
                i += 1;
            }
            _ => return None,
        }
    }
    Some(start..i)
}

/// The holes region: 16 bytes per hole (u64 first offset, u64 end offset).
pub(super) fn encode(holes: &[HoleRange]) -> Vec<u8> {
    let mut out = vec![0u8; holes.len() * HOLE_ENTRY_BYTES];
    for (raw, h) in out.chunks_exact_mut(HOLE_ENTRY_BYTES).zip(holes) {
        put_u64(raw, HOLE_FIRST_AT, h.first_offset);
        put_u64(raw, HOLE_END_AT, h.end_offset);
    }
    out
}

/// Parses and checks the holes region `bytes` of the object whose footer
/// is `footer`: its CRC, each hole inside `[base_offset, next_offset)`,
/// ascending and disjoint, and together exactly the footer's hole offsets.
///
/// # Errors
/// [`ArchiveError::HolesCrc`], [`ArchiveError::HolesInvalid`].
pub(super) fn decode(footer: &Footer, bytes: &[u8]) -> Result<Vec<HoleRange>, ArchiveError> {
    let computed = crc32c::crc32c(bytes);
    if computed != footer.holes_crc32c {
        return Err(ArchiveError::HolesCrc {
            stored: footer.holes_crc32c,
            computed,
        });
    }
    let holes: Vec<HoleRange> = bytes
        .chunks_exact(HOLE_ENTRY_BYTES)
        .map(|raw| HoleRange {
            first_offset: read_u64(raw, HOLE_FIRST_AT),
            end_offset: read_u64(raw, HOLE_END_AT),
        })
        .collect();
    check_sorted(&holes)?;
    for (i, h) in holes.iter().enumerate() {
        if h.first_offset < footer.base_offset || h.end_offset > footer.next_offset {
            return Err(ArchiveError::HolesInvalid {
                entry: i as u32,
                reason: "a hole lies outside the object's offsets",
            });
        }
    }
    let total: u64 = holes.iter().map(HoleRange::len).sum();
    if total != footer.hole_offsets {
        return Err(ArchiveError::HolesInvalid {
            entry: holes.len() as u32,
            reason: "the holes do not add up to next_offset - base_offset - record_count",
        });
    }
    Ok(holes)
}
