//! [`ArchiveError`]: every way an archive object, or the bytes fed to a
//! builder, splitter or verifier, can be refused.

use super::{FORMAT_VERSION, MAX_BATCHES_BYTES};
use crate::batch::DecodeError;

/// Why bytes are not a valid archive object (or not the expected one).
/// Every variant is a refusal: nothing partially checked is returned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ArchiveError {
    /// Fewer bytes than the footer (or footer plus index) needs.
    #[error("archive tail truncated: need {needed} bytes, have {available}")]
    TailTruncated {
        /// Bytes needed.
        needed: u64,
        /// Bytes given.
        available: u64,
    },
    /// The footer does not start with `TRAR`.
    #[error(
        "no archive footer in the object's last 112 bytes (magic {found:02x?}, not \"TRAR\"): not a Tributary archive object, or truncated or extended"
    )]
    BadMagic {
        /// What was found.
        found: [u8; 4],
    },
    /// A format version this build cannot read.
    #[error("unsupported archive format version {found} (this build reads 1 to {FORMAT_VERSION})")]
    UnsupportedVersion {
        /// The stored version.
        found: u16,
    },
    /// The footer CRC disagrees with the footer bytes.
    #[error("footer crc mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    FooterCrc {
        /// Stored value.
        stored: u32,
        /// Computed value.
        computed: u32,
    },
    /// A CRC-valid footer whose fields contradict each other.
    #[error("invalid footer: {0}")]
    FooterInvalid(&'static str),
    /// The object is not as long as its footer says.
    #[error("object is {actual} bytes, its footer says {expected}")]
    ObjectSize {
        /// From the footer.
        expected: u64,
        /// Observed.
        actual: u64,
    },
    /// The index CRC disagrees with the index bytes.
    #[error("index crc mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    IndexCrc {
        /// Stored value.
        stored: u32,
        /// Computed value.
        computed: u32,
    },
    /// A CRC-valid index whose entries break the ordering rules.
    #[error("invalid index entry {entry}: {reason}")]
    IndexInvalid {
        /// Entry number.
        entry: u32,
        /// The rule.
        reason: &'static str,
    },
    /// The holes region CRC disagrees with its bytes.
    #[error("holes region crc mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    HolesCrc {
        /// Stored value.
        stored: u32,
        /// Computed value.
        computed: u32,
    },
    /// A declared hole that breaks the rules (empty, out of order,
    /// overlapping, outside the object, or more than [`super::MAX_HOLES`]).
    #[error("invalid declared hole {entry}: {reason}")]
    HolesInvalid {
        /// Hole number.
        entry: u32,
        /// The rule.
        reason: &'static str,
    },
    /// A hole declared inside the segment's offsets whose offsets the
    /// segment holds records for (or only partly skips).
    #[error("declared hole {first_offset}..{end_offset} is not a gap in the segment's batches")]
    HoleNotInSegment {
        /// First offset of the declared hole.
        first_offset: u64,
        /// Its exclusive end.
        end_offset: u64,
    },
    /// The bytes at `position` are not a valid batch.
    #[error("bad batch at byte {position} (expected offset {offset}): {source}")]
    Batch {
        /// Byte position of the batch in the object (and segment file).
        position: u64,
        /// Offset the batch should start at.
        offset: u64,
        /// What is wrong.
        source: DecodeError,
    },
    /// A valid batch that does not continue the offsets, and whose gap is
    /// not exactly declared holes.
    #[error(
        "batch at byte {position} starts at offset {found}, expected {expected} (no declared hole covers the gap)"
    )]
    Discontinuity {
        /// Byte position of the batch.
        position: u64,
        /// Offset expected.
        expected: u64,
        /// Offset found.
        found: u64,
    },
    /// The batches region ends inside a batch.
    #[error("batches end inside the batch at byte {position} (expected offset {offset})")]
    BatchesTruncated {
        /// Byte position of the incomplete batch.
        position: u64,
        /// Its expected first offset.
        offset: u64,
    },
    /// The batches CRC in the footer disagrees with the batches region.
    #[error("batches region crc mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    BatchesCrc {
        /// Stored value.
        stored: u32,
        /// Computed value.
        computed: u32,
    },
    /// A field differs from what was expected (the sealed segment's summary,
    /// or what the batches rebuild to).
    #[error("{field}: expected {expected}, found {actual}")]
    Mismatch {
        /// Which field.
        field: &'static str,
        /// Expected value.
        expected: u64,
        /// Found value.
        actual: u64,
    },
    /// The object is intact but is not the one committed for its key: its
    /// footer disagrees with the segment descriptor in the metadata (an
    /// object written over a committed one, a wrong backup restored).
    #[error(
        "not the object committed for this key: its batches CRC-32C is {found:#010x}, the committed descriptor's {committed:#010x}"
    )]
    NotCommitted {
        /// The descriptor's batches CRC-32C.
        committed: u32,
        /// The object footer's batches CRC-32C.
        found: u32,
    },
    /// No batch at all.
    #[error("an archive object holds at least one batch")]
    Empty,
    /// The batches region is over [`MAX_BATCHES_BYTES`].
    #[error("batches region of {bytes} bytes is over the {MAX_BATCHES_BYTES}-byte maximum")]
    TooLarge {
        /// Size, bytes.
        bytes: u64,
    },
}
