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

use std::fmt;

use bytes::{Bytes, BytesMut};
use serde::{Deserialize, Serialize};

use crate::batch::{BatchHeader, CRC_START, DecodeError, EncodedBatch, HEADER_LEN};
use crate::limits::{BATCH_BYTES_CEILING, BATCH_HEADER_BYTES, Limits};

/// Magic bytes at the start of the footer: "TRAR" (Tributary ARchive).
pub const FOOTER_MAGIC: [u8; 4] = *b"TRAR";
/// Archive object format version written by this build.
pub const FORMAT_VERSION: u16 = 1;

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
const RESERVED_A_AT: usize = INDEX_INTERVAL_AT + 4;
const FIRST_TS_AT: usize = RESERVED_A_AT + 4;
const MAX_TS_AT: usize = FIRST_TS_AT + 8;
const BATCHES_CRC_AT: usize = MAX_TS_AT + 8;
const INDEX_CRC_AT: usize = BATCHES_CRC_AT + 4;
const OBJECT_BYTES_AT: usize = INDEX_CRC_AT + 4;
const RESERVED_B_AT: usize = OBJECT_BYTES_AT + 8;
const FOOTER_CRC_AT: usize = RESERVED_B_AT + 4;
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

/// Most index entries in one object: bounds the tail read.
pub const MAX_INDEX_ENTRIES: u32 = 4096;
/// Largest index region, bytes (64 KiB).
pub const MAX_INDEX_BYTES: usize = MAX_INDEX_ENTRIES as usize * INDEX_ENTRY_BYTES;
/// Smallest distance between index entries, bytes.
pub const MIN_INDEX_INTERVAL_BYTES: u32 = 4096;
/// Largest batches region, bytes: positions are `u32` (as in the WAL, whose
/// `segment_max_bytes` is at most `u32::MAX`).
pub const MAX_BATCHES_BYTES: u64 = u32::MAX as u64;
/// A suffix read of this many bytes always holds the footer and the whole
/// index: the first of the two reads that reach any offset.
pub const TAIL_READ_BYTES: u64 = (FOOTER_BYTES + MAX_INDEX_BYTES) as u64;

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
// Errors
// ---------------------------------------------------------------------------

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
    #[error("not a Tributary archive object: footer magic {found:02x?}")]
    BadMagic {
        /// What was found.
        found: [u8; 4],
    },
    /// A format version this build cannot read.
    #[error("unsupported archive format version {found} (this build reads {FORMAT_VERSION})")]
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
    /// A valid batch that does not continue the offsets.
    #[error("batch at byte {position} starts at offset {found}, expected {expected}")]
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

// ---------------------------------------------------------------------------
// Footer
// ---------------------------------------------------------------------------

/// The fixed-size footer at the end of every archive object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Footer {
    /// Offset of the first record.
    pub base_offset: u64,
    /// Offset just past the last record.
    pub next_offset: u64,
    /// Number of record batches.
    pub batch_count: u64,
    /// Size of the batches region, bytes (also the index position).
    pub batches_bytes: u64,
    /// Number of index entries, at least 1.
    pub index_entry_count: u32,
    /// Minimum distance between index entries used by the writer, bytes.
    pub index_interval_bytes: u32,
    /// Smallest batch first-timestamp, ms since the Unix epoch.
    pub first_timestamp_ms: i64,
    /// Largest record timestamp, ms since the Unix epoch.
    pub max_timestamp_ms: i64,
    /// CRC-32C of the batches region.
    pub batches_crc32c: u32,
    /// CRC-32C of the index region.
    pub index_crc32c: u32,
}

impl Footer {
    /// Records in the object.
    pub fn record_count(&self) -> u64 {
        self.next_offset - self.base_offset
    }

    /// Last offset (inclusive), as in the object key.
    pub fn end_offset(&self) -> u64 {
        self.next_offset - 1
    }

    /// Byte position of the index region.
    pub fn index_position(&self) -> u64 {
        self.batches_bytes
    }

    /// Size of the index region, bytes.
    pub fn index_bytes(&self) -> u64 {
        u64::from(self.index_entry_count) * INDEX_ENTRY_BYTES as u64
    }

    /// Size of the whole object, bytes.
    pub fn object_bytes(&self) -> u64 {
        self.batches_bytes + self.index_bytes() + FOOTER_BYTES as u64
    }

    /// Bytes at the end of the object holding the index and the footer.
    pub fn tail_bytes(&self) -> u64 {
        self.index_bytes() + FOOTER_BYTES as u64
    }

    /// The footer bytes, CRC included.
    pub fn encode(&self) -> [u8; FOOTER_BYTES] {
        let mut out = [0u8; FOOTER_BYTES];
        out[MAGIC_AT..MAGIC_AT + 4].copy_from_slice(&FOOTER_MAGIC);
        put_u16(&mut out, VERSION_AT, FORMAT_VERSION);
        put_u16(&mut out, FOOTER_BYTES_AT, FOOTER_BYTES as u16);
        put_u64(&mut out, BASE_OFFSET_AT, self.base_offset);
        put_u64(&mut out, NEXT_OFFSET_AT, self.next_offset);
        put_u64(
            &mut out,
            RECORD_COUNT_AT,
            self.next_offset.wrapping_sub(self.base_offset),
        );
        put_u64(&mut out, BATCH_COUNT_AT, self.batch_count);
        put_u64(&mut out, BATCHES_BYTES_AT, self.batches_bytes);
        put_u64(&mut out, INDEX_POSITION_AT, self.batches_bytes);
        put_u32(
            &mut out,
            INDEX_BYTES_AT,
            self.index_entry_count
                .wrapping_mul(INDEX_ENTRY_BYTES as u32),
        );
        put_u32(&mut out, INDEX_ENTRY_COUNT_AT, self.index_entry_count);
        put_u32(&mut out, INDEX_INTERVAL_AT, self.index_interval_bytes);
        put_u64(&mut out, FIRST_TS_AT, self.first_timestamp_ms as u64);
        put_u64(&mut out, MAX_TS_AT, self.max_timestamp_ms as u64);
        put_u32(&mut out, BATCHES_CRC_AT, self.batches_crc32c);
        put_u32(&mut out, INDEX_CRC_AT, self.index_crc32c);
        put_u64(&mut out, OBJECT_BYTES_AT, self.object_bytes());
        let crc = crc32c::crc32c(&out[..FOOTER_CRC_AT]);
        put_u32(&mut out, FOOTER_CRC_AT, crc);
        out
    }

    /// The CRC-32C stored in the encoded footer: the object's checksum as
    /// recorded in the descriptor (it covers the batches and index CRCs).
    pub fn footer_crc32c(&self) -> u32 {
        read_u32(&self.encode(), FOOTER_CRC_AT)
    }

    /// Parses the footer from the last [`FOOTER_BYTES`] of `tail` (any suffix
    /// of the object at least that long).
    ///
    /// # Errors
    /// The first failed check: length, magic, version, CRC, then field
    /// consistency ([`ArchiveError::FooterInvalid`]).
    pub fn decode_from_tail(tail: &[u8]) -> Result<Footer, ArchiveError> {
        if tail.len() < FOOTER_BYTES {
            return Err(ArchiveError::TailTruncated {
                needed: FOOTER_BYTES as u64,
                available: tail.len() as u64,
            });
        }
        let input = &tail[tail.len() - FOOTER_BYTES..];
        let magic = [input[0], input[1], input[2], input[3]];
        if magic != FOOTER_MAGIC {
            return Err(ArchiveError::BadMagic { found: magic });
        }
        let version = read_u16(input, VERSION_AT);
        if version != FORMAT_VERSION {
            return Err(ArchiveError::UnsupportedVersion { found: version });
        }
        let stored = read_u32(input, FOOTER_CRC_AT);
        let computed = crc32c::crc32c(&input[..FOOTER_CRC_AT]);
        if stored != computed {
            return Err(ArchiveError::FooterCrc { stored, computed });
        }
        let footer = Footer {
            base_offset: read_u64(input, BASE_OFFSET_AT),
            next_offset: read_u64(input, NEXT_OFFSET_AT),
            batch_count: read_u64(input, BATCH_COUNT_AT),
            batches_bytes: read_u64(input, BATCHES_BYTES_AT),
            index_entry_count: read_u32(input, INDEX_ENTRY_COUNT_AT),
            index_interval_bytes: read_u32(input, INDEX_INTERVAL_AT),
            first_timestamp_ms: read_u64(input, FIRST_TS_AT) as i64,
            max_timestamp_ms: read_u64(input, MAX_TS_AT) as i64,
            batches_crc32c: read_u32(input, BATCHES_CRC_AT),
            index_crc32c: read_u32(input, INDEX_CRC_AT),
        };
        let invalid = |reason| Err(ArchiveError::FooterInvalid(reason));
        if usize::from(read_u16(input, FOOTER_BYTES_AT)) != FOOTER_BYTES {
            return invalid("footer_bytes is not 112");
        }
        if read_u32(input, RESERVED_A_AT) != 0 || read_u32(input, RESERVED_B_AT) != 0 {
            return invalid("reserved fields are not zero");
        }
        if footer.next_offset <= footer.base_offset {
            return invalid("next_offset is not above base_offset");
        }
        if read_u64(input, RECORD_COUNT_AT) != footer.record_count() {
            return invalid("record_count is not next_offset - base_offset");
        }
        if footer.batch_count == 0 || footer.batch_count > footer.record_count() {
            return invalid("batch_count outside [1, record_count]");
        }
        if footer.batches_bytes < u64::from(BATCH_HEADER_BYTES) * footer.batch_count
            || footer.batches_bytes > MAX_BATCHES_BYTES
        {
            return invalid("batches_bytes outside [48 * batch_count, 2^32 - 1]");
        }
        if read_u64(input, INDEX_POSITION_AT) != footer.batches_bytes {
            return invalid("index_position is not batches_bytes");
        }
        if footer.index_entry_count == 0
            || footer.index_entry_count > MAX_INDEX_ENTRIES
            || u64::from(footer.index_entry_count) > footer.batch_count
        {
            return invalid("index_entry_count outside [1, min(4096, batch_count)]");
        }
        if u64::from(read_u32(input, INDEX_BYTES_AT)) != footer.index_bytes() {
            return invalid("index_bytes is not 16 * index_entry_count");
        }
        if footer.index_interval_bytes < MIN_INDEX_INTERVAL_BYTES {
            return invalid("index_interval_bytes below 4096");
        }
        if footer.max_timestamp_ms < footer.first_timestamp_ms {
            return invalid("max_timestamp_ms below first_timestamp_ms");
        }
        if read_u64(input, OBJECT_BYTES_AT) != footer.object_bytes() {
            return invalid("object_bytes disagrees with the region sizes");
        }
        Ok(footer)
    }
}

// ---------------------------------------------------------------------------
// Index
// ---------------------------------------------------------------------------

/// One index entry: the batch starting at `base_offset + relative_offset`
/// begins at byte `position`; `max_timestamp_ms` is the largest record
/// timestamp from that batch up to the next entry's batch (its block).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexEntry {
    /// Batch base offset minus the object's base offset.
    pub relative_offset: u32,
    /// Byte position of the batch in the object.
    pub position: u32,
    /// Largest record timestamp in this entry's block, ms since the epoch.
    pub max_timestamp_ms: i64,
}

/// A byte range of the batches region that starts at a batch boundary: what
/// to read (second read) to reach an offset or a timestamp.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    /// Entry number.
    pub entry: usize,
    /// First byte (a batch start).
    pub position: u64,
    /// Byte just past the block (the next entry's position, or the end of
    /// the batches region).
    pub end: u64,
    /// Base offset of the batch at `position`.
    pub base_offset: u64,
}

/// The decoded, checked index of one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchiveIndex {
    footer: Footer,
    entries: Vec<IndexEntry>,
}

impl ArchiveIndex {
    /// Parses the index from `tail`, a suffix of the object at least
    /// [`Footer::tail_bytes`] long (index then footer).
    ///
    /// # Errors
    /// [`ArchiveError::TailTruncated`] if `tail` is too short (read
    /// more), [`ArchiveError::IndexCrc`], [`ArchiveError::IndexInvalid`].
    pub fn decode_from_tail(footer: &Footer, tail: &[u8]) -> Result<ArchiveIndex, ArchiveError> {
        let needed = footer.tail_bytes();
        if (tail.len() as u64) < needed {
            return Err(ArchiveError::TailTruncated {
                needed,
                available: tail.len() as u64,
            });
        }
        let start = tail.len() - needed as usize;
        let bytes = &tail[start..tail.len() - FOOTER_BYTES];
        ArchiveIndex::decode(footer, bytes)
    }

    /// Parses exactly the index region `bytes` of the object whose footer is
    /// `footer`.
    ///
    /// # Errors
    /// As [`ArchiveIndex::decode_from_tail`].
    pub fn decode(footer: &Footer, bytes: &[u8]) -> Result<ArchiveIndex, ArchiveError> {
        if bytes.len() as u64 != footer.index_bytes() {
            return Err(ArchiveError::TailTruncated {
                needed: footer.index_bytes(),
                available: bytes.len() as u64,
            });
        }
        let computed = crc32c::crc32c(bytes);
        if computed != footer.index_crc32c {
            return Err(ArchiveError::IndexCrc {
                stored: footer.index_crc32c,
                computed,
            });
        }
        let mut entries: Vec<IndexEntry> = Vec::with_capacity(footer.index_entry_count as usize);
        for (i, raw) in bytes.chunks_exact(INDEX_ENTRY_BYTES).enumerate() {
            let entry = IndexEntry {
                relative_offset: read_u32(raw, ENTRY_RELATIVE_OFFSET_AT),
                position: read_u32(raw, ENTRY_POSITION_AT),
                max_timestamp_ms: read_u64(raw, ENTRY_MAX_TS_AT) as i64,
            };
            let invalid = |reason| ArchiveError::IndexInvalid {
                entry: i as u32,
                reason,
            };
            match entries.last() {
                None if entry.relative_offset != 0 || entry.position != 0 => {
                    return Err(invalid("the first entry is not (0, 0)"));
                }
                Some(prev)
                    if entry.relative_offset <= prev.relative_offset
                        || entry.position <= prev.position =>
                {
                    return Err(invalid("entries are not strictly increasing"));
                }
                _ => {}
            }
            if u64::from(entry.position) >= footer.batches_bytes
                || u64::from(entry.relative_offset) >= footer.record_count()
            {
                return Err(invalid("entry points past the batches"));
            }
            if entry.max_timestamp_ms > footer.max_timestamp_ms {
                return Err(invalid("block timestamp above the object's maximum"));
            }
            entries.push(entry);
        }
        Ok(ArchiveIndex {
            footer: *footer,
            entries,
        })
    }

    /// The entries, ascending.
    pub fn entries(&self) -> &[IndexEntry] {
        &self.entries
    }

    /// The footer this index belongs to.
    pub fn footer(&self) -> &Footer {
        &self.footer
    }

    fn block(&self, entry: usize) -> Block {
        let e = self.entries[entry];
        let end = self
            .entries
            .get(entry + 1)
            .map_or(self.footer.batches_bytes, |n| u64::from(n.position));
        Block {
            entry,
            position: u64::from(e.position),
            end,
            base_offset: self.footer.base_offset + u64::from(e.relative_offset),
        }
    }

    /// The block holding `offset`: read from its `position` to find the
    /// record. `None` outside `[base_offset, next_offset)`.
    pub fn block_for_offset(&self, offset: u64) -> Option<Block> {
        if offset < self.footer.base_offset || offset >= self.footer.next_offset {
            return None;
        }
        let relative = offset - self.footer.base_offset;
        let at = self
            .entries
            .partition_point(|e| u64::from(e.relative_offset) <= relative);
        // The first entry is (0, 0), so `at >= 1`.
        Some(self.block(at.max(1) - 1))
    }

    /// The first block holding a record with timestamp `>= timestamp_ms`:
    /// the first such record (by offset) is in it. `None` if no record is
    /// that recent.
    pub fn block_for_timestamp(&self, timestamp_ms: i64) -> Option<Block> {
        self.entries
            .iter()
            .position(|e| e.max_timestamp_ms >= timestamp_ms)
            .map(|i| self.block(i))
    }
}

// ---------------------------------------------------------------------------
// Incremental batch walking
// ---------------------------------------------------------------------------

/// A batch the walker finished and verified.
#[derive(Debug, Clone, Copy)]
struct Walked {
    header: BatchHeader,
    position: u64,
}

/// Parses back-to-back batches from pushed bytes without buffering a batch:
/// it keeps the 48-byte header and a running CRC of the body.
#[derive(Debug, Clone)]
struct BatchWalker {
    limits: Limits,
    /// Bytes consumed so far (object position).
    position: u64,
    /// Offset the next batch must start at.
    next_offset: u64,
    header: [u8; HEADER_LEN],
    header_fill: usize,
    body: Option<Body>,
}

#[derive(Debug, Clone, Copy)]
struct Body {
    header: BatchHeader,
    start: u64,
    remaining: u32,
    crc: u32,
}

impl BatchWalker {
    fn new(base_offset: u64, position: u64, limits: Limits) -> BatchWalker {
        BatchWalker {
            limits,
            position,
            next_offset: base_offset,
            header: [0; HEADER_LEN],
            header_fill: 0,
            body: None,
        }
    }

    /// Position where the batch being parsed started.
    fn batch_start(&self) -> u64 {
        match &self.body {
            Some(body) => body.start,
            None => self.position - self.header_fill as u64,
        }
    }

    fn at_boundary(&self) -> bool {
        self.body.is_none() && self.header_fill == 0
    }

    /// Consumes a prefix of `chunk`; returns bytes consumed and a batch if
    /// one completed. Call again with the rest.
    fn step(&mut self, chunk: &[u8]) -> Result<(usize, Option<Walked>), ArchiveError> {
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
                if header.base_offset != self.next_offset {
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

    fn finish_body_if_done(&mut self) -> Result<Option<Walked>, ArchiveError> {
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

// ---------------------------------------------------------------------------
// Writing
// ---------------------------------------------------------------------------

/// The bytes that follow the batches region (index then footer), and the
/// footer they end with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchiveTail {
    /// The footer.
    pub footer: Footer,
    /// The index entries.
    pub entries: Vec<IndexEntry>,
    /// Index region followed by the footer: append to the batches region.
    pub bytes: Vec<u8>,
}

/// Builds an archive object from a segment's bytes, streamed in chunks of
/// any size: push every byte of the segment file (they are the batches
/// region, uploaded as they are), then [`ArchiveBuilder::finish`] for the
/// index and footer to append.
///
/// Every batch is checked (header, CRC, offset continuity from the expected
/// base offset) as it passes, so a damaged segment is refused before its
/// object is completed. Memory: a 48-byte header, running CRCs and at most
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

    fn with_interval(
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
            failed: None,
        })
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

    /// Ends the batches region and returns the index and footer to append.
    ///
    /// # Errors
    /// An earlier push error, [`ArchiveError::BatchesTruncated`] if the
    /// bytes end inside a batch, [`ArchiveError::Mismatch`] if fewer bytes
    /// than announced arrived, [`ArchiveError::Empty`].
    pub fn finish(self) -> Result<ArchiveTail, ArchiveError> {
        if let Some(err) = self.failed {
            return Err(err);
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
        let mut bytes = Vec::with_capacity(self.entries.len() * INDEX_ENTRY_BYTES + FOOTER_BYTES);
        for entry in &self.entries {
            let mut raw = [0u8; INDEX_ENTRY_BYTES];
            put_u32(&mut raw, ENTRY_RELATIVE_OFFSET_AT, entry.relative_offset);
            put_u32(&mut raw, ENTRY_POSITION_AT, entry.position);
            put_u64(&mut raw, ENTRY_MAX_TS_AT, entry.max_timestamp_ms as u64);
            bytes.extend_from_slice(&raw);
        }
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
            index_crc32c: crc32c::crc32c(&bytes),
        };
        bytes.extend_from_slice(&footer.encode());
        // Pair assertion: what was written reads back.
        let check = Footer::decode_from_tail(&bytes)
            .and_then(|f| ArchiveIndex::decode_from_tail(&f, &bytes).map(|_| f));
        assert_eq!(check, Ok(footer), "archive invariant: a built tail decodes");
        Ok(ArchiveTail {
            footer,
            entries: self.entries,
            bytes,
        })
    }
}

// ---------------------------------------------------------------------------
// Reading records
// ---------------------------------------------------------------------------

/// Splits a stream of batch bytes, starting at a batch boundary, into
/// CRC-verified [`EncodedBatch`]es with contiguous offsets. Buffers at most
/// one batch (bounded by the limits).
#[derive(Debug)]
pub struct BatchSplitter {
    limits: Limits,
    position: u64,
    next_offset: u64,
    buf: BytesMut,
}

impl BatchSplitter {
    /// Batches starting at byte `position` with first offset `base_offset`
    /// (a [`Block`]'s fields).
    pub fn new(position: u64, base_offset: u64, limits: Limits) -> BatchSplitter {
        BatchSplitter {
            limits,
            position,
            next_offset: base_offset,
            buf: BytesMut::new(),
        }
    }

    /// Offset the next batch must start at.
    pub fn next_offset(&self) -> u64 {
        self.next_offset
    }

    /// Feeds bytes; returns the batches completed by them.
    ///
    /// # Errors
    /// [`ArchiveError::Batch`] or [`ArchiveError::Discontinuity`] with the
    /// byte position and offset.
    pub fn push(&mut self, chunk: &[u8]) -> Result<Vec<EncodedBatch>, ArchiveError> {
        self.buf.extend_from_slice(chunk);
        let mut out = Vec::new();
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
            if batch.base_offset() != self.next_offset {
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
        Ok(out)
    }

    /// Ends the stream.
    ///
    /// # Errors
    /// [`ArchiveError::BatchesTruncated`] if bytes of an incomplete batch
    /// remain.
    pub fn finish(self) -> Result<(), ArchiveError> {
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

// ---------------------------------------------------------------------------
// Verifying
// ---------------------------------------------------------------------------

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
/// the report names each unreadable offset range.
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
        let builder = ArchiveBuilder::with_interval(
            footer.base_offset,
            footer.batches_bytes,
            footer.index_interval_bytes,
            limits,
        )
        .ok();
        SegmentVerifier {
            footer,
            index: index.clone(),
            limits,
            builder,
            walker: BatchWalker::new(footer.base_offset, 0, limits),
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
        self.walker = BatchWalker::new(end_offset, resume_position, self.limits);
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
            Some(Ok(tail)) if tail.footer == self.footer && tail.entries == self.index.entries => {
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

// ---------------------------------------------------------------------------
// Descriptor
// ---------------------------------------------------------------------------

/// The durable segment descriptor stored in Raft at
/// `{prefix}/storage/topics/{ns}/{topic}/segments/{start:020}` (JSON).
///
/// Everything but `created_at_ms` follows from the object, so two
/// descriptors of the same object are [`SegmentDescriptor::same_object`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentDescriptor {
    /// First offset.
    pub start_offset: u64,
    /// Last offset, inclusive (as in the object key).
    pub end_offset: u64,
    /// Records (`end_offset - start_offset + 1`).
    pub record_count: u64,
    /// Object size, bytes.
    pub size: u64,
    /// Object key in the bucket.
    pub object_id: String,
    /// Archive format version of the object.
    pub format_version: u16,
    /// The object's checksum: its footer CRC-32C (which covers the batches
    /// and index CRCs).
    pub checksum_crc32c: u32,
    /// CRC-32C of the batches region.
    pub batches_crc32c: u32,
    /// Size of the batches region, bytes.
    pub batches_bytes: u64,
    /// Byte position of the index region.
    pub index_position: u64,
    /// Size of the index region, bytes.
    pub index_bytes: u64,
    /// Smallest batch first-timestamp, ms since the Unix epoch.
    pub first_timestamp_ms: i64,
    /// Largest record timestamp, ms since the Unix epoch.
    pub max_timestamp_ms: i64,
    /// When the descriptor was made, ms since the Unix epoch.
    pub created_at_ms: i64,
}

impl SegmentDescriptor {
    /// The descriptor of the object `object_id` whose footer is `footer`.
    pub fn from_footer(footer: &Footer, object_id: String, created_at_ms: i64) -> Self {
        SegmentDescriptor {
            start_offset: footer.base_offset,
            end_offset: footer.end_offset(),
            record_count: footer.record_count(),
            size: footer.object_bytes(),
            object_id,
            format_version: FORMAT_VERSION,
            checksum_crc32c: footer.footer_crc32c(),
            batches_crc32c: footer.batches_crc32c,
            batches_bytes: footer.batches_bytes,
            index_position: footer.index_position(),
            index_bytes: footer.index_bytes(),
            first_timestamp_ms: footer.first_timestamp_ms,
            max_timestamp_ms: footer.max_timestamp_ms,
            created_at_ms,
        }
    }

    /// Offset just past the last record.
    pub fn next_offset(&self) -> u64 {
        self.end_offset.saturating_add(1)
    }

    /// True if both describe the same object (all fields but
    /// `created_at_ms` equal).
    pub fn same_object(&self, other: &SegmentDescriptor) -> bool {
        let mut a = self.clone();
        a.created_at_ms = other.created_at_ms;
        a == *other
    }

    /// True if `footer` is the footer of the object this describes.
    pub fn matches_footer(&self, footer: &Footer) -> bool {
        self.same_object(&SegmentDescriptor::from_footer(
            footer,
            self.object_id.clone(),
            self.created_at_ms,
        ))
    }

    /// Checks the fields against each other.
    ///
    /// # Errors
    /// The first inconsistent field.
    pub fn validate(&self) -> Result<(), &'static str> {
        if self.end_offset < self.start_offset {
            return Err("end_offset below start_offset");
        }
        if self.record_count != self.end_offset - self.start_offset + 1 {
            return Err("record_count is not end_offset - start_offset + 1");
        }
        if self.format_version != FORMAT_VERSION {
            return Err("unsupported format_version");
        }
        if self.index_position != self.batches_bytes
            || self.size != self.batches_bytes + self.index_bytes + FOOTER_BYTES as u64
        {
            return Err("size, batches_bytes and index_bytes disagree");
        }
        if self.index_bytes == 0 || !self.index_bytes.is_multiple_of(INDEX_ENTRY_BYTES as u64) {
            return Err("index_bytes is not a positive multiple of 16");
        }
        if self.max_timestamp_ms < self.first_timestamp_ms {
            return Err("max_timestamp_ms below first_timestamp_ms");
        }
        Ok(())
    }
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

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::batch::{Codec, Record, RecordBatch};

    /// Encodes `records_per_batch` into contiguous batches from `base`.
    fn segment(base: u64, batches: &[Vec<Record>], codec: Codec) -> (Vec<u8>, Vec<EncodedBatch>) {
        let limits = Limits::default();
        let mut offset = base;
        let mut bytes = Vec::new();
        let mut encoded = Vec::new();
        for records in batches {
            let batch = RecordBatch {
                base_offset: offset,
                codec,
                records: records.clone(),
            }
            .encode(&limits)
            .unwrap();
            offset = batch.next_offset();
            bytes.extend_from_slice(batch.as_bytes());
            encoded.push(batch);
        }
        (bytes, encoded)
    }

    fn record(ts: i64, value: &[u8]) -> Record {
        Record {
            timestamp_ms: ts,
            key: Some(Bytes::from_static(b"k")),
            headers: vec![("h".into(), Bytes::from_static(b"v"))],
            value: Bytes::copy_from_slice(value),
        }
    }

    /// A segment of `n` single-record batches of about `value_len` bytes,
    /// timestamps 1000, 1001, ...
    fn simple_segment(base: u64, n: usize, value_len: usize) -> (Vec<u8>, Vec<EncodedBatch>) {
        let batches: Vec<Vec<Record>> = (0..n)
            .map(|i| vec![record(1000 + i as i64, &vec![b'x'; value_len])])
            .collect();
        segment(base, &batches, Codec::None)
    }

    fn build(base: u64, bytes: &[u8], chunk: usize) -> Result<(Vec<u8>, Footer), ArchiveError> {
        let mut builder = ArchiveBuilder::new(base, bytes.len() as u64, Limits::default())?;
        for piece in bytes.chunks(chunk.max(1)) {
            builder.push(piece)?;
        }
        let tail = builder.finish()?;
        let mut object = bytes.to_vec();
        object.extend_from_slice(&tail.bytes);
        Ok((object, tail.footer))
    }

    fn open(object: &[u8]) -> Result<(Footer, ArchiveIndex), ArchiveError> {
        let footer = Footer::decode_from_tail(object)?;
        if footer.object_bytes() != object.len() as u64 {
            return Err(ArchiveError::ObjectSize {
                expected: footer.object_bytes(),
                actual: object.len() as u64,
            });
        }
        let index = ArchiveIndex::decode_from_tail(&footer, object)?;
        Ok((footer, index))
    }

    fn verify(object: &[u8], chunk: usize) -> VerifyReport {
        let (footer, index) = open(object).unwrap();
        let mut verifier = SegmentVerifier::new(&index, reader_limits());
        for piece in object[..footer.batches_bytes as usize].chunks(chunk.max(1)) {
            verifier.push(piece);
        }
        verifier.finish()
    }

    fn split_all(object: &[u8], position: u64, base: u64) -> Vec<EncodedBatch> {
        let footer = Footer::decode_from_tail(object).unwrap();
        let mut splitter = BatchSplitter::new(position, base, reader_limits());
        let batches = splitter
            .push(&object[position as usize..footer.batches_bytes as usize])
            .unwrap();
        splitter.finish().unwrap();
        batches
    }

    #[test]
    fn footer_layout_matches_format_md() {
        assert_eq!(
            (
                BASE_OFFSET_AT,
                NEXT_OFFSET_AT,
                RECORD_COUNT_AT,
                BATCH_COUNT_AT
            ),
            (8, 16, 24, 32)
        );
        assert_eq!(
            (
                BATCHES_BYTES_AT,
                INDEX_POSITION_AT,
                INDEX_BYTES_AT,
                INDEX_ENTRY_COUNT_AT
            ),
            (40, 48, 56, 60)
        );
        assert_eq!(
            (INDEX_INTERVAL_AT, RESERVED_A_AT, FIRST_TS_AT, MAX_TS_AT),
            (64, 68, 72, 80)
        );
        assert_eq!(
            (
                BATCHES_CRC_AT,
                INDEX_CRC_AT,
                OBJECT_BYTES_AT,
                RESERVED_B_AT,
                FOOTER_CRC_AT
            ),
            (88, 92, 96, 104, 108)
        );
        assert_eq!(TAIL_READ_BYTES, 112 + 65536);
        let (bytes, _) = simple_segment(7, 3, 10);
        let (object, footer) = build(7, &bytes, 1000).unwrap();
        let tail = &object[object.len() - FOOTER_BYTES..];
        assert_eq!(&tail[0..4], b"TRAR");
        assert_eq!(read_u16(tail, 4), 1);
        assert_eq!(read_u16(tail, 6), 112);
        assert_eq!(read_u64(tail, 8), 7);
        assert_eq!(read_u64(tail, 16), 10);
        assert_eq!(read_u64(tail, 24), 3);
        assert_eq!(read_u64(tail, 96), object.len() as u64);
        assert_eq!(footer.index_entry_count, 1);
        assert_eq!(
            read_u32(tail, 108),
            crc32c::crc32c(&tail[..108]),
            "footer crc covers bytes 0..108"
        );
    }

    #[test]
    fn index_interval_bounds_the_entry_count() {
        assert_eq!(index_interval_for(0), MIN_INDEX_INTERVAL_BYTES);
        assert_eq!(index_interval_for(64 * 1024 * 1024), 16389);
        assert_eq!(index_interval_for(MAX_BATCHES_BYTES), 1_048_833);
        // About 4100 batches of ~4.2 KiB: more batches than index entries
        // allowed, and the interval above the minimum.
        let (bytes, batches) = simple_segment(0, 4100, 4150);
        assert!(index_interval_for(bytes.len() as u64) > MIN_INDEX_INTERVAL_BYTES);
        let (object, footer) = build(0, &bytes, 1 << 20).unwrap();
        assert!(footer.index_entry_count <= MAX_INDEX_ENTRIES);
        assert!(footer.index_entry_count > 2000);
        assert!(footer.tail_bytes() <= TAIL_READ_BYTES);
        let (_, index) = open(&object).unwrap();
        for (i, batch) in batches.iter().enumerate().step_by(97) {
            let block = index.block_for_offset(batch.base_offset()).unwrap();
            let found = split_all(&object, block.position, block.base_offset);
            assert!(
                found.iter().any(|b| b.base_offset() == batch.base_offset()),
                "batch {i}"
            );
        }
        assert!(verify(&object, 1 << 16).is_intact());
    }

    #[test]
    fn lookups_by_offset_and_timestamp() {
        // 40 batches of 3 records, ~1 KiB each: several index blocks.
        let batches: Vec<Vec<Record>> = (0..40)
            .map(|i| {
                (0..3)
                    .map(|j| record(10_000 + i * 10 - j, &[b'a'; 300]))
                    .collect()
            })
            .collect();
        let (bytes, encoded) = segment(500, &batches, Codec::None);
        let (object, footer) = build(500, &bytes, 333).unwrap();
        let (_, index) = open(&object).unwrap();
        assert!(index.entries().len() > 3);
        assert_eq!((footer.base_offset, footer.next_offset), (500, 620));
        assert_eq!(footer.first_timestamp_ms, 10_000);
        assert_eq!(footer.max_timestamp_ms, 10_390);
        assert_eq!(index.block_for_offset(499), None);
        assert_eq!(index.block_for_offset(620), None);
        for offset in 500..620 {
            let block = index.block_for_offset(offset).unwrap();
            assert!(block.base_offset <= offset);
            let found = split_all(&object, block.position, block.base_offset);
            let holder = found
                .iter()
                .find(|b| b.base_offset() <= offset && offset < b.next_offset())
                .unwrap();
            // The holding batch lies inside the block.
            assert!(found.iter().position(|b| b == holder).unwrap() < 40);
        }
        // Timestamps: records go 10000, 9999, 9998, 10010, ...
        let all: Vec<(u64, i64)> = encoded
            .iter()
            .flat_map(|b| {
                let base = b.base_offset();
                b.decode(&Limits::default())
                    .unwrap()
                    .records
                    .into_iter()
                    .enumerate()
                    .map(move |(i, r)| (base + i as u64, r.timestamp_ms))
            })
            .collect();
        for t in [0, 9_998, 10_000, 10_001, 10_155, 10_390] {
            let expected = all.iter().find(|(_, ts)| *ts >= t).map(|(o, _)| *o);
            let block = index.block_for_timestamp(t).unwrap();
            let found = split_all(&object, block.position, block.base_offset);
            let first = found.iter().find_map(|b| {
                let base = b.base_offset();
                b.decode(&Limits::default())
                    .unwrap()
                    .records
                    .iter()
                    .position(|r| r.timestamp_ms >= t)
                    .map(|i| base + i as u64)
            });
            assert_eq!(first, expected, "timestamp {t}");
        }
        assert_eq!(index.block_for_timestamp(10_391), None);
    }

    #[test]
    fn every_flipped_footer_or_index_byte_is_detected() {
        let (bytes, _) = simple_segment(42, 60, 200);
        let (object, _) = build(42, &bytes, 4096).unwrap();
        let (footer, _) = open(&object).unwrap();
        assert!(footer.index_entry_count >= 2);
        let tail_start = object.len() - footer.tail_bytes() as usize;
        for at in tail_start..object.len() {
            for flip in [0x01u8, 0x80, 0xff] {
                let mut bad = object.clone();
                bad[at] ^= flip;
                assert!(
                    open(&bad).is_err(),
                    "flip {flip:#x} at byte {at} not detected"
                );
            }
        }
        // Truncated or extended objects.
        assert!(open(&object[1..]).is_err());
        let mut longer = object.clone();
        longer.insert(0, 0);
        assert!(open(&longer).is_err());
    }

    #[test]
    fn every_flipped_batch_byte_is_reported_with_its_offset_range() {
        let (bytes, encoded) = simple_segment(1000, 50, 150);
        let (object, footer) = build(1000, &bytes, 4096).unwrap();
        let clean = verify(&object, 777);
        assert!(clean.is_intact(), "{clean:?}");
        assert_eq!((clean.batches_ok, clean.records_ok), (50, 50));
        let mut starts = Vec::new();
        let mut at = 0u64;
        for batch in &encoded {
            starts.push((at, at + batch.len() as u64, batch.base_offset()));
            at += batch.len() as u64;
        }
        for pos in 0..footer.batches_bytes {
            let mut bad = object.clone();
            bad[pos as usize] ^= 0x20;
            let report = verify(&bad, 1000);
            assert!(!report.is_intact(), "flip at byte {pos} not detected");
            let (_, _, offset) = *starts
                .iter()
                .find(|(s, e, _)| *s <= pos && pos < *e)
                .unwrap();
            assert!(
                report
                    .damage
                    .iter()
                    .any(|d| d.first_offset <= offset && offset < d.end_offset),
                "flip at byte {pos} (offset {offset}): {:?}",
                report.damage
            );
            for d in &report.damage {
                assert!(d.first_offset >= 1000 && d.end_offset <= 1050, "{d}");
            }
        }
    }

    #[test]
    fn damage_skips_to_the_next_index_entry() {
        let (bytes, _) = simple_segment(0, 200, 100);
        let (object, _) = build(0, &bytes, 4096).unwrap();
        let (_, index) = open(&object).unwrap();
        let second = index.entries()[1];
        let third = index.entries()[2];
        let mut bad = object.clone();
        bad[second.position as usize + 60] ^= 1;
        let report = verify(&bad, 512);
        assert_eq!(report.damage.len(), 1, "{:?}", report.damage);
        let d = &report.damage[0];
        assert_eq!(d.position, u64::from(second.position));
        assert_eq!(d.end_offset, u64::from(third.relative_offset));
        assert!(d.first_offset >= u64::from(second.relative_offset));
        assert_eq!(report.records_ok, 200 - (d.end_offset - d.first_offset));
    }

    #[test]
    fn batches_crc_catches_what_batch_crcs_do_not() {
        let (bytes, _) = simple_segment(0, 5, 10);
        let (object, mut footer) = build(0, &bytes, 4096).unwrap();
        // A footer claiming another batches CRC (re-sealed with a valid
        // footer CRC): every batch verifies, the region does not.
        footer.batches_crc32c ^= 1;
        let mut forged = object[..object.len() - FOOTER_BYTES].to_vec();
        forged.extend_from_slice(&footer.encode());
        let report = verify(&forged, 100);
        assert_eq!(report.damage.len(), 1);
        assert_eq!(
            (report.damage[0].first_offset, report.damage[0].end_offset),
            (0, 5)
        );
        assert!(
            report.damage[0].reason.contains("batches region crc"),
            "{:?}",
            report.damage
        );
    }

    #[test]
    fn builder_refuses_damaged_segments() {
        let (bytes, _) = simple_segment(10, 5, 20);
        let limits = Limits::default();
        // Wrong base offset.
        let mut b = ArchiveBuilder::new(11, bytes.len() as u64, limits).unwrap();
        assert!(matches!(
            b.push(&bytes),
            Err(ArchiveError::Discontinuity {
                position: 0,
                expected: 11,
                found: 10
            })
        ));
        assert!(b.push(&[]).is_err(), "errors are sticky");
        // Truncated.
        let short = &bytes[..bytes.len() - 1];
        let mut b = ArchiveBuilder::new(10, short.len() as u64, limits).unwrap();
        b.push(short).unwrap();
        assert!(matches!(
            b.finish(),
            Err(ArchiveError::BatchesTruncated { .. })
        ));
        // More or fewer bytes than announced.
        let mut b = ArchiveBuilder::new(10, bytes.len() as u64 - 5, limits).unwrap();
        assert!(matches!(b.push(&bytes), Err(ArchiveError::Mismatch { .. })));
        let mut b = ArchiveBuilder::new(10, bytes.len() as u64 + 5, limits).unwrap();
        b.push(&bytes).unwrap();
        assert!(matches!(b.finish(), Err(ArchiveError::Mismatch { .. })));
        // Damaged batch: position and offset named.
        let mut bad = bytes.clone();
        let second = EncodedBatch::from_bytes(Bytes::copy_from_slice(&bytes), &limits);
        assert!(second.is_err(), "several batches are not one");
        let first_len = read_u32(&bytes, 4) as usize;
        bad[first_len + 50] ^= 1;
        let mut b = ArchiveBuilder::new(10, bad.len() as u64, limits).unwrap();
        match b.push(&bad) {
            Err(ArchiveError::Batch {
                position, offset, ..
            }) => assert_eq!((position, offset), (first_len as u64, 11)),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            ArchiveBuilder::new(0, 0, limits),
            Err(ArchiveError::Empty)
        ));
        assert!(matches!(
            ArchiveBuilder::new(0, MAX_BATCHES_BYTES + 1, limits),
            Err(ArchiveError::TooLarge { .. })
        ));
    }

    #[test]
    fn descriptor_follows_the_footer() {
        let (bytes, _) = simple_segment(5, 4, 10);
        let (object, footer) = build(5, &bytes, 64).unwrap();
        let d = SegmentDescriptor::from_footer(&footer, "k".into(), 77);
        d.validate().unwrap();
        assert_eq!((d.start_offset, d.end_offset, d.record_count), (5, 8, 4));
        assert_eq!(d.size, object.len() as u64);
        assert_eq!(d.next_offset(), 9);
        assert!(d.matches_footer(&footer));
        let mut later = d.clone();
        later.created_at_ms = 99;
        assert!(d.same_object(&later));
        later.batches_crc32c ^= 1;
        assert!(!d.same_object(&later));
        let json = serde_json::to_value(&d).unwrap();
        assert_eq!(json["object_id"], "k");
        let back: SegmentDescriptor = serde_json::from_value(json).unwrap();
        assert_eq!(back, d);
        let mut bad = d.clone();
        bad.record_count += 1;
        assert!(bad.validate().is_err());
    }

    fn arb_records() -> impl Strategy<Value = Vec<Vec<Record>>> {
        let record = (0i64..5_000, proptest::collection::vec(any::<u8>(), 0..300))
            .prop_map(|(ts, value)| record(1_700_000_000_000 + ts, &value));
        proptest::collection::vec(proptest::collection::vec(record, 1..6), 1..60)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn round_trip(
            base in 0u64..1 << 60,
            batches in arb_records(),
            zstd in any::<bool>(),
            chunk in 1usize..5000,
        ) {
            let codec = if zstd { Codec::Zstd } else { Codec::None };
            let (bytes, encoded) = segment(base, &batches, codec);
            let (object, footer) = build(base, &bytes, chunk).unwrap();
            let (read_footer, index) = open(&object).unwrap();
            prop_assert_eq!(read_footer, footer);
            prop_assert_eq!(&object[..bytes.len()], &bytes[..]);
            let records: u64 = batches.iter().map(|b| b.len() as u64).sum();
            prop_assert_eq!(footer.record_count(), records);
            prop_assert_eq!(footer.batch_count, batches.len() as u64);
            let all = split_all(&object, 0, base);
            prop_assert_eq!(&all, &encoded);
            // Every offset: its block holds it.
            for offset in (base..base + records).step_by(7) {
                let block = index.block_for_offset(offset).unwrap();
                let found = split_all(&object, block.position, block.base_offset);
                prop_assert!(found.iter().any(|b| b.base_offset() <= offset && offset < b.next_offset()));
            }
            let report = verify(&object, chunk);
            prop_assert!(report.is_intact(), "{:?}", report);
            prop_assert_eq!(report.records_ok, records);
        }
    }
}
