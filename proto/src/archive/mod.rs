//! The archive object format: a sealed WAL segment as one self-describing
//! object in object storage, and the segment descriptor recorded in Raft.
//!
//! Pure code: no I/O, no clock, no object store. The tier service and
//! `tribctl archive` feed it bytes and carry out the reads it asks for.
//! Byte layouts: `FORMAT.md` ("Archive object") and, for readers
//! in other languages, `docs/archive-format.md`.
//!
//! # Layout
//! ```text
//! [0, batches_bytes)                      batches region: the segment's .log bytes, verbatim
//! [batches_bytes, +16 * index_entry_count) index region: sparse offset/position/timestamp index
//! [.., +16 * hole_count)                  holes region (version 2): declared holes
//! [object_bytes - 112, object_bytes)      footer: fixed size, CRC-32C protected
//! ```
//! The batches region is byte-identical to the sealed segment file, so a
//! record keeps one offset and one encoding from the edge to the archive, and
//! index positions are also positions in the segment file.
//!
//! # Reads
//! Reaching the first record at an offset (or timestamp) takes at most two
//! ranged reads: one suffix read of [`TAIL_READ_BYTES`] (footer and the whole
//! index, which is capped at [`MAX_INDEX_ENTRIES`] entries), then one read
//! of the batch range from the index entry at or below the offset.
//!
//! # Checks, and who makes them
//! | what | detected by |
//! |---|---|
//! | any byte of the footer | footer CRC (plus magic, version, field consistency) |
//! | any byte of the index | index CRC stored in the footer |
//! | any byte of a batch | the batch's own CRC (magic and length: header checks) |
//! | any byte of the batches region | batches CRC stored in the footer |
//! | a truncated or extended object | `object_bytes` in the footer vs the object size |
//!
//! Writing ([`ArchiveBuilder`]) streams: it keeps one 48-byte batch header,
//! running CRCs and the index (at most 64 KiB), never a whole batch or
//! segment. Verifying ([`SegmentVerifier`]) rebuilds the tail from the
//! batches and compares, and reports damaged offset ranges.
//!
//! # Files
//! This file holds the layout constants (field positions, sizes, caps); the
//! rest is one concern per file: `error` ([`ArchiveError`]), `footer`
//! ([`Footer`]), `holes` ([`HoleRange`], the declared holes an object
//! carries), `index` ([`ArchiveIndex`]), `walker` (the batch walk the
//! builder and verifier share), `builder` ([`ArchiveBuilder`]), `splitter`
//! ([`BatchSplitter`]), `verify` ([`SegmentVerifier`]) and `descriptor`
//! ([`SegmentDescriptor`]).

use crate::limits::{BATCH_BYTES_CEILING, BATCH_HEADER_BYTES, Limits};

mod builder;
mod descriptor;
mod error;
mod footer;
mod holes;
mod index;
mod splitter;
mod verify;
mod walker;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_holes;

pub use builder::{ArchiveBuilder, ArchiveTail};
pub use descriptor::SegmentDescriptor;
pub use error::ArchiveError;
pub use footer::Footer;
pub use holes::{HoleRange, holes_cover_exactly};
pub use index::{ArchiveIndex, Block, IndexEntry};
pub use splitter::BatchSplitter;
pub use verify::{Damage, SegmentVerifier, VerifyReport};

/// Magic bytes at the start of the footer: "TRAR" (Tributary ARchive).
pub const FOOTER_MAGIC: [u8; 4] = *b"TRAR";
/// Newest archive object format version this build reads and writes:
/// version 2 adds the holes region. An object without declared holes is
/// still written as version 1 (byte for byte the version-1 layout), so
/// readers that predate version 2 read every object that has no hole.
pub const FORMAT_VERSION: u16 = 2;
/// The version of an object without declared holes.
pub const FORMAT_VERSION_NO_HOLES: u16 = 1;

// Footer field positions, each derived from the previous one.
const MAGIC_AT: usize = 0;
const VERSION_AT: usize = MAGIC_AT + 4;
const FOOTER_BYTES_AT: usize = VERSION_AT + 2;
const BASE_OFFSET_AT: usize = FOOTER_BYTES_AT + 2;
const NEXT_OFFSET_AT: usize = BASE_OFFSET_AT + 8;
const RECORD_COUNT_AT: usize = NEXT_OFFSET_AT + 8;
const BATCH_COUNT_AT: usize = RECORD_COUNT_AT + 8;
const BATCHES_BYTES_AT: usize = BATCH_COUNT_AT + 8;
const INDEX_POSITION_AT: usize = BATCHES_BYTES_AT + 8;
const INDEX_BYTES_AT: usize = INDEX_POSITION_AT + 8;
const INDEX_ENTRY_COUNT_AT: usize = INDEX_BYTES_AT + 4;
const INDEX_INTERVAL_AT: usize = INDEX_ENTRY_COUNT_AT + 4;
// Reserved (0) in version 1.
const HOLE_COUNT_AT: usize = INDEX_INTERVAL_AT + 4;
const FIRST_TS_AT: usize = HOLE_COUNT_AT + 4;
const MAX_TS_AT: usize = FIRST_TS_AT + 8;
const BATCHES_CRC_AT: usize = MAX_TS_AT + 8;
const INDEX_CRC_AT: usize = BATCHES_CRC_AT + 4;
const OBJECT_BYTES_AT: usize = INDEX_CRC_AT + 4;
// Reserved (0) in version 1.
const HOLES_CRC_AT: usize = OBJECT_BYTES_AT + 8;
const FOOTER_CRC_AT: usize = HOLES_CRC_AT + 4;
/// Size of the footer, bytes.
pub const FOOTER_BYTES: usize = FOOTER_CRC_AT + 4;
const _: () = assert!(FOOTER_BYTES == 112);

// Index entry field positions.
const ENTRY_RELATIVE_OFFSET_AT: usize = 0;
const ENTRY_POSITION_AT: usize = ENTRY_RELATIVE_OFFSET_AT + 4;
const ENTRY_MAX_TS_AT: usize = ENTRY_POSITION_AT + 4;
/// Size of one index entry, bytes.
pub const INDEX_ENTRY_BYTES: usize = ENTRY_MAX_TS_AT + 8;
const _: () = assert!(INDEX_ENTRY_BYTES == 16);

// Hole entry field positions (holes region, version 2).
const HOLE_FIRST_AT: usize = 0;
const HOLE_END_AT: usize = HOLE_FIRST_AT + 8;
/// Size of one hole entry, bytes.
pub const HOLE_ENTRY_BYTES: usize = HOLE_END_AT + 8;
const _: () = assert!(HOLE_ENTRY_BYTES == 16);
/// Most declared holes in one object: bounds the tail read.
pub const MAX_HOLES: u32 = 1024;
/// Largest holes region, bytes (16 KiB).
pub const MAX_HOLES_BYTES: usize = MAX_HOLES as usize * HOLE_ENTRY_BYTES;

/// Most index entries in one object: bounds the tail read.
pub const MAX_INDEX_ENTRIES: u32 = 4096;
/// Largest index region, bytes (64 KiB).
pub const MAX_INDEX_BYTES: usize = MAX_INDEX_ENTRIES as usize * INDEX_ENTRY_BYTES;
/// Smallest distance between index entries, bytes.
pub const MIN_INDEX_INTERVAL_BYTES: u32 = 4096;
/// Largest batches region, bytes: positions are `u32` (as in the WAL, whose
/// `segment_max_bytes` is at most `u32::MAX`).
pub const MAX_BATCHES_BYTES: u64 = u32::MAX as u64;
/// A suffix read of this many bytes always holds the footer, the whole
/// index and the holes region: the first of the two reads that reach any
/// offset.
pub const TAIL_READ_BYTES: u64 = (FOOTER_BYTES + MAX_INDEX_BYTES + MAX_HOLES_BYTES) as u64;

// An object's smallest batches region is one batch header; positions and
// the index bound fit their fields.
const _: () = assert!(MIN_INDEX_INTERVAL_BYTES >= BATCH_HEADER_BYTES);
const _: () = assert!(MAX_INDEX_BYTES <= u32::MAX as usize);

/// Limits for reading archived batches: the format's ceilings, so an
/// archive written under any broker configuration stays readable. A reader
/// still never allocates more than [`BATCH_BYTES_CEILING`] for one batch.
pub fn reader_limits() -> Limits {
    Limits {
        max_record_bytes: BATCH_BYTES_CEILING - BATCH_HEADER_BYTES,
        max_batch_bytes: BATCH_BYTES_CEILING,
    }
}

/// The index interval the writer uses for a batches region of
/// `batches_bytes`: at least [`MIN_INDEX_INTERVAL_BYTES`], and large enough
/// that the index never has more than [`MAX_INDEX_ENTRIES`] entries.
pub fn index_interval_for(batches_bytes: u64) -> u32 {
    let spread = batches_bytes.div_ceil(u64::from(MAX_INDEX_ENTRIES - 1));
    u32::try_from(spread)
        .unwrap_or(u32::MAX)
        .max(MIN_INDEX_INTERVAL_BYTES)
}

// ---------------------------------------------------------------------------
// Little-endian helpers
// ---------------------------------------------------------------------------

fn put_u16(out: &mut [u8], at: usize, v: u16) {
    out[at..at + 2].copy_from_slice(&v.to_le_bytes());
}

fn put_u32(out: &mut [u8], at: usize, v: u32) {
    out[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put_u64(out: &mut [u8], at: usize, v: u64) {
    out[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

fn read_u16(input: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([input[at], input[at + 1]])
}

fn read_u32(input: &[u8], at: usize) -> u32 {
    let mut raw = [0u8; 4];
    raw.copy_from_slice(&input[at..at + 4]);
    u32::from_le_bytes(raw)
}

fn read_u64(input: &[u8], at: usize) -> u64 {
    let mut raw = [0u8; 8];
    raw.copy_from_slice(&input[at..at + 8]);
    u64::from_le_bytes(raw)
}
