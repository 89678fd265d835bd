//! The record batch: one format for disk, wire and archive.
//!
//! Layout (all integers little-endian; full diagram in `FORMAT.md`):
//!
//! ```text
//! 0   4  magic "TRIB"
//! 4   4  batch_length   u32, whole batch in bytes, header included
//! 8   4  crc32c         over bytes [12, batch_length)
//! 12  1  version        1
//! 13  1  codec          0 = none, 1 = zstd
//! 14  2  reserved       0
//! 16  8  base_offset    u64
//! 24  4  record_count   u32, >= 1
//! 28  8  first_timestamp_ms  i64, ms since the Unix epoch
//! 36  8  max_timestamp_ms    i64
//! 44  4  records_bytes  u32, size of the records section before compression
//! 48  .. records section (compressed when codec != none)
//! ```
//!
//! Each record: varint offset_delta, zigzag varint timestamp_delta (against
//! `first_timestamp_ms`), varint key_length+1 (0 = no key) and key, varint
//! header_count and per header varint name_length, UTF-8 name, varint
//! value_length and value, then varint value_length and value.
//!
//! Decoding validates everything and never panics; the only allocations are
//! bounded by [`Limits::max_batch_bytes`].

use bytes::{Bytes, BytesMut};

use crate::limits::{BATCH_HEADER_BYTES, LimitError, LimitName, Limits, RECORD_BYTES_MIN};
use crate::varint::{self, VarintError};

/// The four magic bytes that start every batch.
pub const MAGIC: [u8; 4] = *b"TRIB";
/// Current format version.
pub const VERSION: u8 = 1;

// Field positions, each derived from the previous one.
const MAGIC_AT: usize = 0;
const LENGTH_AT: usize = MAGIC_AT + 4;
const CRC_AT: usize = LENGTH_AT + 4;
/// First byte covered by the CRC.
pub const CRC_START: usize = CRC_AT + 4;
const VERSION_AT: usize = CRC_START;
const CODEC_AT: usize = VERSION_AT + 1;
const RESERVED_AT: usize = CODEC_AT + 1;
const BASE_OFFSET_AT: usize = RESERVED_AT + 2;
const RECORD_COUNT_AT: usize = BASE_OFFSET_AT + 8;
const FIRST_TS_AT: usize = RECORD_COUNT_AT + 4;
const MAX_TS_AT: usize = FIRST_TS_AT + 8;
const RECORDS_BYTES_AT: usize = MAX_TS_AT + 8;
const HEADER_END: usize = RECORDS_BYTES_AT + 4;
/// Header size in bytes, as `usize`.
pub const HEADER_LEN: usize = BATCH_HEADER_BYTES as usize;
const _: () = assert!(HEADER_END == HEADER_LEN);

/// Compression of a batch's records section.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Codec {
    /// Stored as is.
    #[default]
    None,
    /// zstd (level 3 when encoding).
    Zstd,
}

impl Codec {
    fn to_byte(self) -> u8 {
        match self {
            Codec::None => 0,
            Codec::Zstd => 1,
        }
    }

    fn from_byte(byte: u8) -> Result<Self, DecodeError> {
        match byte {
            0 => Ok(Codec::None),
            1 => Ok(Codec::Zstd),
            other => Err(DecodeError::UnknownCodec(other)),
        }
    }
}

/// One record as a producer hands it over or a consumer reads it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Record {
    /// Milliseconds since the Unix epoch.
    pub timestamp_ms: i64,
    /// Optional key (for partitioning and per-key ordering).
    pub key: Option<Bytes>,
    /// Ordered headers, name → bytes. Names are UTF-8; duplicates are kept.
    pub headers: Vec<(String, Bytes)>,
    /// The payload.
    pub value: Bytes,
}

/// A decoded batch: records with contiguous offsets starting at
/// `base_offset`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordBatch {
    /// Offset of `records[0]`; `records[i]` has offset `base_offset + i`.
    pub base_offset: u64,
    /// Compression used when encoding.
    pub codec: Codec,
    /// At least one record.
    pub records: Vec<Record>,
}

/// The fixed header of a batch, parsed and sanity-checked but not yet
/// CRC-verified (see [`BatchHeader::parse`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchHeader {
    /// Total encoded size, bytes, header included.
    pub batch_length: u32,
    /// Stored CRC32C of bytes `[12, batch_length)`.
    pub crc: u32,
    /// Records section codec.
    pub codec: Codec,
    /// Offset of the first record.
    pub base_offset: u64,
    /// Number of records, at least 1.
    pub record_count: u32,
    /// Timestamp of the first record, ms since the Unix epoch.
    pub first_timestamp_ms: i64,
    /// Largest record timestamp, ms since the Unix epoch.
    pub max_timestamp_ms: i64,
    /// Uncompressed size of the records section, bytes.
    pub records_bytes: u32,
}

impl BatchHeader {
    /// Offset of the last record.
    pub fn last_offset(&self) -> u64 {
        self.base_offset + u64::from(self.record_count) - 1
    }

    /// Offset just past the last record.
    pub fn next_offset(&self) -> u64 {
        self.base_offset + u64::from(self.record_count)
    }

    /// Parses and checks the 48 header bytes at the front of `input`.
    ///
    /// Checks magic, version, codec, reserved bits, that `batch_length` lies
    /// in `[48, limits.max_batch_bytes]`, that `record_count >= 1`, that the
    /// records section is large enough for the declared count and that the
    /// offsets do not overflow. The CRC is not checked here (the rest of the
    /// batch may not be read yet); [`EncodedBatch::from_bytes`] does.
    ///
    /// # Errors
    /// A [`DecodeError`] naming the first failed check.
    pub fn parse(input: &[u8], limits: &Limits) -> Result<BatchHeader, DecodeError> {
        if input.len() < HEADER_LEN {
            return Err(DecodeError::Truncated {
                needed: HEADER_LEN,
                available: input.len(),
            });
        }
        let magic = [input[0], input[1], input[2], input[3]];
        if magic != MAGIC {
            return Err(DecodeError::BadMagic { found: magic });
        }
        let batch_length = read_u32(input, LENGTH_AT);
        if batch_length < BATCH_HEADER_BYTES || batch_length > limits.max_batch_bytes {
            return Err(DecodeError::LengthOutOfBounds {
                length: batch_length,
                max: limits.max_batch_bytes,
            });
        }
        if input[VERSION_AT] != VERSION {
            return Err(DecodeError::UnsupportedVersion(input[VERSION_AT]));
        }
        let codec = Codec::from_byte(input[CODEC_AT])?;
        if input[RESERVED_AT] != 0 || input[RESERVED_AT + 1] != 0 {
            return Err(DecodeError::Malformed("reserved bytes are not zero"));
        }
        let header = BatchHeader {
            batch_length,
            crc: read_u32(input, CRC_AT),
            codec,
            base_offset: read_u64(input, BASE_OFFSET_AT),
            record_count: read_u32(input, RECORD_COUNT_AT),
            first_timestamp_ms: read_u64(input, FIRST_TS_AT) as i64,
            max_timestamp_ms: read_u64(input, MAX_TS_AT) as i64,
            records_bytes: read_u32(input, RECORDS_BYTES_AT),
        };
        if header.record_count == 0 {
            return Err(DecodeError::Malformed("record_count is zero"));
        }
        if header.records_bytes > limits.max_batch_bytes {
            return Err(DecodeError::Limit(LimitError {
                limit: LimitName::MaxBatchBytes,
                actual: u64::from(header.records_bytes),
                max: u64::from(limits.max_batch_bytes),
            }));
        }
        if u64::from(header.record_count) * u64::from(RECORD_BYTES_MIN)
            > u64::from(header.records_bytes)
        {
            return Err(DecodeError::Malformed(
                "record_count does not fit in records_bytes",
            ));
        }
        if codec == Codec::None && header.records_bytes != batch_length - BATCH_HEADER_BYTES {
            return Err(DecodeError::Malformed(
                "records_bytes disagrees with batch_length",
            ));
        }
        if header
            .base_offset
            .checked_add(u64::from(header.record_count))
            .is_none()
        {
            return Err(DecodeError::Malformed("offsets overflow u64"));
        }
        if header.max_timestamp_ms < header.first_timestamp_ms {
            return Err(DecodeError::Malformed(
                "max_timestamp_ms below first_timestamp_ms",
            ));
        }
        Ok(header)
    }
}

/// A whole encoded batch whose header and CRC have been verified. This is the
/// unit the WAL stores, the replicator sends and the archive keeps, verbatim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncodedBatch {
    header: BatchHeader,
    bytes: Bytes,
}

impl EncodedBatch {
    /// Verifies `bytes` as exactly one batch: header checks as in
    /// [`BatchHeader::parse`], `batch_length == bytes.len()` and the CRC.
    /// The records section is not decoded (see [`EncodedBatch::decode`]).
    ///
    /// # Errors
    /// [`DecodeError::Truncated`] if `bytes` is shorter than the declared
    /// length, [`DecodeError::TrailingBytes`] if longer,
    /// [`DecodeError::CrcMismatch`] if the checksum disagrees, or the header
    /// error.
    pub fn from_bytes(bytes: Bytes, limits: &Limits) -> Result<EncodedBatch, DecodeError> {
        let header = BatchHeader::parse(&bytes, limits)?;
        let declared = header.batch_length as usize;
        if bytes.len() < declared {
            return Err(DecodeError::Truncated {
                needed: declared,
                available: bytes.len(),
            });
        }
        if bytes.len() > declared {
            return Err(DecodeError::TrailingBytes {
                extra: bytes.len() - declared,
            });
        }
        let actual = crc32c::crc32c(&bytes[CRC_START..]);
        if actual != header.crc {
            return Err(DecodeError::CrcMismatch {
                expected: header.crc,
                actual,
            });
        }
        Ok(EncodedBatch { header, bytes })
    }

    /// The verified header.
    pub fn header(&self) -> &BatchHeader {
        &self.header
    }

    /// Offset of the first record.
    pub fn base_offset(&self) -> u64 {
        self.header.base_offset
    }

    /// Number of records.
    pub fn record_count(&self) -> u32 {
        self.header.record_count
    }

    /// Offset just past the last record.
    pub fn next_offset(&self) -> u64 {
        self.header.next_offset()
    }

    /// Encoded size in bytes.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Always false: a batch holds at least its header.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The encoded bytes, exactly as stored and sent.
    pub fn as_bytes(&self) -> &Bytes {
        &self.bytes
    }

    /// Consumes the batch, returning its bytes.
    pub fn into_bytes(self) -> Bytes {
        self.bytes
    }

    /// Returns the same records re-addressed to start at `base_offset`: the
    /// header field and CRC are rewritten, the records section is untouched.
    pub fn with_base_offset(self, base_offset: u64) -> EncodedBatch {
        let mut bytes = BytesMut::from(self.bytes);
        set_base_offset(&mut bytes, base_offset);
        let mut header = self.header;
        header.base_offset = base_offset;
        header.crc = read_u32(&bytes, CRC_AT);
        EncodedBatch {
            header,
            bytes: bytes.freeze(),
        }
    }

    /// Decodes all records.
    ///
    /// # Errors
    /// [`DecodeError`] if the records section is malformed, a record exceeds
    /// `limits.max_record_bytes`, or decompression fails or would exceed
    /// `limits.max_batch_bytes`.
    pub fn decode(&self, limits: &Limits) -> Result<RecordBatch, DecodeError> {
        let body = self.bytes.slice(HEADER_LEN..);
        let records_section = match self.header.codec {
            Codec::None => body,
            Codec::Zstd => {
                // `records_bytes <= max_batch_bytes` was checked by `parse`;
                // the decompressor stops at that capacity.
                let decompressed =
                    zstd::bulk::decompress(&body, self.header.records_bytes as usize)
                        .map_err(|e| DecodeError::Decompress(e.to_string()))?;
                if decompressed.len() != self.header.records_bytes as usize {
                    return Err(DecodeError::Malformed(
                        "decompressed size disagrees with records_bytes",
                    ));
                }
                Bytes::from(decompressed)
            }
        };
        decode_records(&self.header, records_section, limits)
    }
}

/// Rewrites the base offset of the encoded batch in `bytes` and recomputes
/// its CRC. `bytes` must hold exactly one batch whose header was verified.
pub fn set_base_offset(bytes: &mut [u8], base_offset: u64) {
    assert!(bytes.len() >= HEADER_LEN, "set_base_offset on a non-batch");
    bytes[BASE_OFFSET_AT..BASE_OFFSET_AT + 8].copy_from_slice(&base_offset.to_le_bytes());
    let crc = crc32c::crc32c(&bytes[CRC_START..]);
    bytes[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_le_bytes());
}

impl RecordBatch {
    /// A batch of `records` at `base_offset` with no compression.
    pub fn new(base_offset: u64, records: Vec<Record>) -> RecordBatch {
        RecordBatch {
            base_offset,
            codec: Codec::None,
            records,
        }
    }

    /// Encodes the batch, enforcing `limits`.
    ///
    /// # Errors
    /// [`EncodeError::Empty`] for no records, [`EncodeError::Limit`] naming
    /// `max_record_bytes` (with the record index), `max_batch_bytes` or
    /// `records_per_batch`, [`EncodeError::OffsetOverflow`] if the offsets
    /// would pass `u64::MAX`.
    pub fn encode(&self, limits: &Limits) -> Result<EncodedBatch, EncodeError> {
        let first = self.records.first().ok_or(EncodeError::Empty)?;
        let record_count = u32::try_from(self.records.len()).map_err(|_| EncodeError::Limit {
            record_index: None,
            error: LimitError {
                limit: LimitName::RecordsPerBatch,
                actual: self.records.len() as u64,
                max: u64::from(u32::MAX),
            },
        })?;
        if self
            .base_offset
            .checked_add(u64::from(record_count))
            .is_none()
        {
            return Err(EncodeError::OffsetOverflow);
        }
        let first_ts = first.timestamp_ms;
        let max_ts = self
            .records
            .iter()
            .map(|r| r.timestamp_ms)
            .max()
            .unwrap_or(first_ts);
        let max_batch = limits.max_batch_bytes as usize;
        let mut records = Vec::with_capacity(
            self.records
                .iter()
                .map(|r| r.value.len() + 16)
                .sum::<usize>()
                .min(max_batch),
        );
        for (index, record) in self.records.iter().enumerate() {
            let start = records.len();
            encode_record(&mut records, index as u64, first_ts, record);
            let size = records.len() - start;
            if size > limits.max_record_bytes as usize {
                return Err(EncodeError::Limit {
                    record_index: Some(index),
                    error: LimitError {
                        limit: LimitName::MaxRecordBytes,
                        actual: size as u64,
                        max: u64::from(limits.max_record_bytes),
                    },
                });
            }
            if records.len() > max_batch {
                return Err(batch_too_large(HEADER_LEN + records.len(), limits));
            }
        }
        let records_bytes = records.len() as u32;
        let body = match self.codec {
            Codec::None => records,
            Codec::Zstd => zstd::bulk::compress(&records, 3)
                .map_err(|e| EncodeError::Compress(e.to_string()))?,
        };
        let total = HEADER_LEN + body.len();
        if total > max_batch {
            return Err(batch_too_large(total, limits));
        }
        let mut out = Vec::with_capacity(total);
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&(total as u32).to_le_bytes());
        out.extend_from_slice(&[0; 4]); // CRC, filled below
        out.push(VERSION);
        out.push(self.codec.to_byte());
        out.extend_from_slice(&[0; 2]);
        out.extend_from_slice(&self.base_offset.to_le_bytes());
        out.extend_from_slice(&record_count.to_le_bytes());
        out.extend_from_slice(&first_ts.to_le_bytes());
        out.extend_from_slice(&max_ts.to_le_bytes());
        out.extend_from_slice(&records_bytes.to_le_bytes());
        debug_assert_eq!(out.len(), HEADER_LEN);
        out.extend_from_slice(&body);
        let crc = crc32c::crc32c(&out[CRC_START..]);
        out[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_le_bytes());
        let header = BatchHeader {
            batch_length: total as u32,
            crc,
            codec: self.codec,
            base_offset: self.base_offset,
            record_count,
            first_timestamp_ms: first_ts,
            max_timestamp_ms: max_ts,
            records_bytes,
        };
        Ok(EncodedBatch {
            header,
            bytes: Bytes::from(out),
        })
    }

    /// Offset just past the last record.
    pub fn next_offset(&self) -> u64 {
        self.base_offset + self.records.len() as u64
    }
}

fn batch_too_large(actual: usize, limits: &Limits) -> EncodeError {
    EncodeError::Limit {
        record_index: None,
        error: LimitError {
            limit: LimitName::MaxBatchBytes,
            actual: actual as u64,
            max: u64::from(limits.max_batch_bytes),
        },
    }
}

fn encode_record(out: &mut Vec<u8>, offset_delta: u64, first_ts: i64, record: &Record) {
    varint::put_u64(out, offset_delta);
    varint::put_i64(out, record.timestamp_ms.wrapping_sub(first_ts));
    match &record.key {
        None => varint::put_u64(out, 0),
        Some(key) => {
            varint::put_u64(out, key.len() as u64 + 1);
            out.extend_from_slice(key);
        }
    }
    varint::put_u64(out, record.headers.len() as u64);
    for (name, value) in &record.headers {
        varint::put_u64(out, name.len() as u64);
        out.extend_from_slice(name.as_bytes());
        varint::put_u64(out, value.len() as u64);
        out.extend_from_slice(value);
    }
    varint::put_u64(out, record.value.len() as u64);
    out.extend_from_slice(&record.value);
}

/// A cursor over the records section that never reads past its end.
struct Reader {
    buf: Bytes,
    pos: usize,
}

impl Reader {
    fn varint(&mut self) -> Result<u64, DecodeError> {
        let (value, used) = varint::get_u64(&self.buf[self.pos..]).map_err(|e| match e {
            VarintError::Truncated => DecodeError::Malformed("record varint truncated"),
            VarintError::Overflow => DecodeError::Malformed("record varint overflows"),
        })?;
        self.pos += used;
        Ok(value)
    }

    fn bytes(&mut self, len: u64) -> Result<Bytes, DecodeError> {
        let remaining = (self.buf.len() - self.pos) as u64;
        if len > remaining {
            return Err(DecodeError::Malformed("record field longer than the batch"));
        }
        let end = self.pos + len as usize;
        let out = self.buf.slice(self.pos..end);
        self.pos = end;
        Ok(out)
    }
}

fn decode_records(
    header: &BatchHeader,
    section: Bytes,
    limits: &Limits,
) -> Result<RecordBatch, DecodeError> {
    let count = header.record_count as usize;
    // `parse` guaranteed count * RECORD_BYTES_MIN <= records_bytes <= max_batch_bytes.
    let mut records = Vec::with_capacity(count);
    let mut reader = Reader {
        buf: section,
        pos: 0,
    };
    let mut max_seen = i64::MIN;
    for index in 0..count {
        let start = reader.pos;
        let offset_delta = reader.varint()?;
        if offset_delta != index as u64 {
            return Err(DecodeError::Malformed("offset_delta is not contiguous"));
        }
        let ts_delta = varint::unzigzag(reader.varint()?);
        let timestamp_ms = header.first_timestamp_ms.wrapping_add(ts_delta);
        if index == 0 && ts_delta != 0 {
            return Err(DecodeError::Malformed(
                "first record timestamp delta is not zero",
            ));
        }
        let key = match reader.varint()? {
            0 => None,
            n => Some(reader.bytes(n - 1)?),
        };
        let header_count = reader.varint()?;
        let header_room = ((reader.buf.len() - reader.pos) / 2) as u64;
        if header_count > header_room {
            return Err(DecodeError::Malformed("header count larger than the batch"));
        }
        let mut headers = Vec::with_capacity(header_count as usize);
        for _ in 0..header_count {
            let name_len = reader.varint()?;
            let name = reader.bytes(name_len)?;
            let name = String::from_utf8(name.to_vec())
                .map_err(|_| DecodeError::Malformed("header name is not UTF-8"))?;
            let value_len = reader.varint()?;
            headers.push((name, reader.bytes(value_len)?));
        }
        let value_len = reader.varint()?;
        let value = reader.bytes(value_len)?;
        let size = reader.pos - start;
        if size > limits.max_record_bytes as usize {
            return Err(DecodeError::Limit(LimitError {
                limit: LimitName::MaxRecordBytes,
                actual: size as u64,
                max: u64::from(limits.max_record_bytes),
            }));
        }
        max_seen = max_seen.max(timestamp_ms);
        records.push(Record {
            timestamp_ms,
            key,
            headers,
            value,
        });
    }
    if reader.pos != reader.buf.len() {
        return Err(DecodeError::Malformed("bytes left after the last record"));
    }
    if max_seen != header.max_timestamp_ms {
        return Err(DecodeError::Malformed(
            "max_timestamp_ms disagrees with the records",
        ));
    }
    Ok(RecordBatch {
        base_offset: header.base_offset,
        codec: header.codec,
        records,
    })
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

/// Why bytes are not a valid batch. Every variant is a refusal: nothing
/// partially decoded is returned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// Fewer bytes than the header or the declared length need.
    #[error("batch truncated: need {needed} bytes, have {available}")]
    Truncated {
        /// Bytes required.
        needed: usize,
        /// Bytes present.
        available: usize,
    },
    /// More bytes than the declared length.
    #[error("{extra} bytes after the end of the batch")]
    TrailingBytes {
        /// Bytes past `batch_length`.
        extra: usize,
    },
    /// The first four bytes are not `TRIB`.
    #[error("bad magic {found:02x?}")]
    BadMagic {
        /// What was found.
        found: [u8; 4],
    },
    /// A version this build cannot read.
    #[error("unsupported batch version {0}")]
    UnsupportedVersion(u8),
    /// An unknown compression codec byte.
    #[error("unknown codec {0}")]
    UnknownCodec(u8),
    /// `batch_length` outside `[48, max_batch_bytes]`.
    #[error("batch_length {length} outside [48, {max}] (max_batch_bytes)")]
    LengthOutOfBounds {
        /// Declared length, bytes.
        length: u32,
        /// `max_batch_bytes`.
        max: u32,
    },
    /// The CRC32C stored in the header disagrees with the bytes.
    #[error("crc mismatch: stored {expected:#010x}, computed {actual:#010x}")]
    CrcMismatch {
        /// Stored value.
        expected: u32,
        /// Computed value.
        actual: u32,
    },
    /// A configured limit is exceeded.
    #[error(transparent)]
    Limit(#[from] LimitError),
    /// The zstd section does not decompress within the limits.
    #[error("decompression failed: {0}")]
    Decompress(String),
    /// Structurally invalid content (a CRC-valid batch from a faulty encoder).
    #[error("malformed batch: {0}")]
    Malformed(&'static str),
}

/// Why records could not be encoded into a batch.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EncodeError {
    /// A batch needs at least one record.
    #[error("a record batch needs at least one record")]
    Empty,
    /// A limit is exceeded; `record_index` names the record for
    /// `max_record_bytes`.
    #[error("{error}{}", record_index.map(|i| format!(" (record {i})")).unwrap_or_default())]
    Limit {
        /// The record at fault, if one.
        record_index: Option<usize>,
        /// Which limit, the size found and the maximum.
        error: LimitError,
    },
    /// `base_offset + record_count` would pass `u64::MAX`.
    #[error("offsets overflow u64")]
    OffsetOverflow,
    /// zstd failed.
    #[error("compression failed: {0}")]
    Compress(String),
}

#[cfg(test)]
mod tests;
