//! [`Footer`]: the fixed-size, CRC-protected tail of an archive object;
//! its encoding and its checked decoding.

use super::{
    ArchiveError, BASE_OFFSET_AT, BATCH_COUNT_AT, BATCHES_BYTES_AT, BATCHES_CRC_AT, FIRST_TS_AT,
    FOOTER_BYTES, FOOTER_BYTES_AT, FOOTER_CRC_AT, FOOTER_MAGIC, FORMAT_VERSION,
    FORMAT_VERSION_NO_HOLES, HOLE_COUNT_AT, HOLE_ENTRY_BYTES, HOLES_CRC_AT, INDEX_BYTES_AT,
    INDEX_CRC_AT, INDEX_ENTRY_BYTES, INDEX_ENTRY_COUNT_AT, INDEX_INTERVAL_AT, INDEX_POSITION_AT,
    MAGIC_AT, MAX_BATCHES_BYTES, MAX_HOLES, MAX_INDEX_ENTRIES, MAX_TS_AT, MIN_INDEX_INTERVAL_BYTES,
    NEXT_OFFSET_AT, OBJECT_BYTES_AT, RECORD_COUNT_AT, VERSION_AT, put_u16, put_u32, put_u64,
    read_u16, read_u32, read_u64,
};
use crate::limits::BATCH_HEADER_BYTES;

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
    /// Declared holes in the holes region (version 2; 0 in version 1).
    pub hole_count: u32,
    /// Offsets inside the declared holes: `next_offset - base_offset -
    /// record_count` (0 in version 1).
    pub hole_offsets: u64,
    /// CRC-32C of the holes region (0, the CRC of no bytes, without holes).
    pub holes_crc32c: u32,
}

impl Footer {
    /// Records in the object: its offsets minus those in declared holes.
    pub fn record_count(&self) -> u64 {
        self.offset_span() - self.hole_offsets
    }

    /// Offsets the object covers, `next_offset - base_offset` (records and
    /// declared holes).
    pub fn offset_span(&self) -> u64 {
        self.next_offset - self.base_offset
    }

    /// The format version of this footer: 2 with declared holes, else 1.
    pub fn format_version(&self) -> u16 {
        if self.hole_count == 0 {
            FORMAT_VERSION_NO_HOLES
        } else {
            FORMAT_VERSION
        }
    }

    /// Size of the holes region, bytes.
    pub fn holes_bytes(&self) -> u64 {
        u64::from(self.hole_count) * HOLE_ENTRY_BYTES as u64
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
        self.batches_bytes + self.tail_bytes()
    }

    /// Bytes at the end of the object holding the index, the holes and
    /// the footer.
    pub fn tail_bytes(&self) -> u64 {
        self.index_bytes() + self.holes_bytes() + FOOTER_BYTES as u64
    }

    /// The footer bytes, CRC included.
    pub fn encode(&self) -> [u8; FOOTER_BYTES] {
        let mut out = [0u8; FOOTER_BYTES];
        out[MAGIC_AT..MAGIC_AT + 4].copy_from_slice(&FOOTER_MAGIC);
        put_u16(&mut out, VERSION_AT, self.format_version());
        put_u16(&mut out, FOOTER_BYTES_AT, FOOTER_BYTES as u16);
        put_u64(&mut out, BASE_OFFSET_AT, self.base_offset);
        put_u64(&mut out, NEXT_OFFSET_AT, self.next_offset);
        put_u64(
            &mut out,
            RECORD_COUNT_AT,
            self.next_offset
                .wrapping_sub(self.base_offset)
                .wrapping_sub(self.hole_offsets),
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
        put_u32(&mut out, HOLE_COUNT_AT, self.hole_count);
        put_u64(&mut out, FIRST_TS_AT, self.first_timestamp_ms as u64);
        put_u64(&mut out, MAX_TS_AT, self.max_timestamp_ms as u64);
        put_u32(&mut out, BATCHES_CRC_AT, self.batches_crc32c);
        put_u32(&mut out, INDEX_CRC_AT, self.index_crc32c);
        put_u64(&mut out, OBJECT_BYTES_AT, self.object_bytes());
        put_u32(&mut out, HOLES_CRC_AT, self.holes_crc32c);
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
        if !(FORMAT_VERSION_NO_HOLES..=FORMAT_VERSION).contains(&version) {
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
            hole_count: read_u32(input, HOLE_COUNT_AT),
            hole_offsets: 0,
            holes_crc32c: read_u32(input, HOLES_CRC_AT),
        };
        let mut footer = footer;
        let invalid = |reason| Err(ArchiveError::FooterInvalid(reason));
        if usize::from(read_u16(input, FOOTER_BYTES_AT)) != FOOTER_BYTES {
            return invalid("footer_bytes is not 112");
        }
        if footer.next_offset <= footer.base_offset {
            return invalid("next_offset is not above base_offset");
        }
        let stored_records = read_u64(input, RECORD_COUNT_AT);
        if version == FORMAT_VERSION_NO_HOLES {
            if footer.hole_count != 0 || footer.holes_crc32c != 0 {
                return invalid("reserved fields are not zero");
            }
            if stored_records != footer.offset_span() {
                return invalid("record_count is not next_offset - base_offset");
            }
        } else {
            if footer.hole_count == 0 || footer.hole_count > MAX_HOLES {
                return invalid("hole_count outside [1, 1024] in a version-2 object");
            }
            if stored_records >= footer.offset_span()
                || footer.offset_span() - stored_records < u64::from(footer.hole_count)
            {
                return invalid("record_count leaves no room for the declared holes");
            }
            footer.hole_offsets = footer.offset_span() - stored_records;
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
