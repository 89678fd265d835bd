//! Explicit, configurable size limits. Every limit has a name that appears in
//! the error when it is exceeded, so an operator can find the knob.

use std::fmt;

/// Fixed size of a record batch header, in bytes (see `FORMAT.md`).
pub const BATCH_HEADER_BYTES: u32 = 48;

/// Hard ceiling for [`Limits::max_batch_bytes`]: 64 MiB. The on-disk length
/// field is a `u32`, and a ceiling keeps one corrupted length field from
/// asking for gigabytes.
pub const BATCH_BYTES_CEILING: u32 = 64 * 1024 * 1024;

/// Smallest possible encoded record, in bytes: offset delta, timestamp delta,
/// key marker, header count and value length are one byte each at minimum.
pub const RECORD_BYTES_MIN: u32 = 5;

const _: () = assert!(BATCH_HEADER_BYTES < BATCH_BYTES_CEILING);

/// Latest record timestamp a producer may give, ms since the Unix epoch:
/// 9999-12-31T23:59:59.999Z, the last instant every reader renders (ISO
/// 8601 years have four digits; JSON lines, CSV, Parquet readers and DuckDB
/// all show it as a date).
pub const MAX_TIMESTAMP_MS: i64 = 253_402_300_799_999;

/// Checks a record timestamp a producer gave: ms since the Unix epoch, from
/// 0 (1970-01-01) to [`MAX_TIMESTAMP_MS`].
///
/// # Errors
/// The rule and the value, for a 400 naming the field.
pub fn check_timestamp_ms(timestamp_ms: i64) -> Result<i64, String> {
    if (0..=MAX_TIMESTAMP_MS).contains(&timestamp_ms) {
        Ok(timestamp_ms)
    } else {
        Err(format!(
            "must be ms since the Unix epoch, from 0 (1970-01-01) to {MAX_TIMESTAMP_MS} \
             (9999-12-31T23:59:59.999Z); got {timestamp_ms}"
        ))
    }
}

/// Size limits applied when encoding and decoding record batches.
///
/// Both limits are in bytes of the encoded form. A decoder never allocates
/// more than `max_batch_bytes` for one batch, including the decompressed
/// records of a compressed batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest encoded record (key, headers, value and their framing), in
    /// bytes. Default 1 MiB.
    pub max_record_bytes: u32,
    /// Largest encoded batch including its 48-byte header, in bytes; also the
    /// largest decompressed records section. Default 8 MiB.
    pub max_batch_bytes: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_record_bytes: 1024 * 1024,
            max_batch_bytes: 8 * 1024 * 1024,
        }
    }
}

impl Limits {
    /// Checks that the limits relate sensibly to each other.
    ///
    /// # Errors
    /// [`LimitError`] naming the offending limit when `max_batch_bytes` exceeds
    /// [`BATCH_BYTES_CEILING`] or cannot hold one record of `max_record_bytes`.
    pub fn validate(&self) -> Result<(), LimitError> {
        if self.max_batch_bytes > BATCH_BYTES_CEILING {
            return Err(LimitError {
                limit: LimitName::BatchBytesCeiling,
                actual: u64::from(self.max_batch_bytes),
                max: u64::from(BATCH_BYTES_CEILING),
            });
        }
        let room = self.max_batch_bytes.saturating_sub(BATCH_HEADER_BYTES);
        if self.max_record_bytes < RECORD_BYTES_MIN || self.max_record_bytes > room {
            return Err(LimitError {
                limit: LimitName::MaxRecordBytes,
                actual: u64::from(self.max_record_bytes),
                max: u64::from(room),
            });
        }
        Ok(())
    }
}

/// The name of a limit, as it appears in configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitName {
    /// [`Limits::max_record_bytes`].
    MaxRecordBytes,
    /// [`Limits::max_batch_bytes`].
    MaxBatchBytes,
    /// [`BATCH_BYTES_CEILING`].
    BatchBytesCeiling,
    /// The WAL's `segment_max_bytes`.
    SegmentMaxBytes,
    /// Records per batch (bounded by `u32`).
    RecordsPerBatch,
}

impl fmt::Display for LimitName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LimitName::MaxRecordBytes => "max_record_bytes",
            LimitName::MaxBatchBytes => "max_batch_bytes",
            LimitName::BatchBytesCeiling => "batch_bytes_ceiling",
            LimitName::SegmentMaxBytes => "segment_max_bytes",
            LimitName::RecordsPerBatch => "records_per_batch",
        })
    }
}

/// A size over its limit. `actual` and `max` are in bytes (records for
/// [`LimitName::RecordsPerBatch`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{limit} exceeded: {actual} > {max}")]
pub struct LimitError {
    /// Which limit.
    pub limit: LimitName,
    /// The size found.
    pub actual: u64,
    /// The configured maximum.
    pub max: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_limits_are_valid() {
        assert_eq!(Limits::default().validate(), Ok(()));
    }

    #[test]
    fn record_limit_must_fit_in_a_batch() {
        let limits = Limits {
            max_record_bytes: 1000,
            max_batch_bytes: 1000,
        };
        let err = limits.validate().unwrap_err();
        assert_eq!(err.limit, LimitName::MaxRecordBytes);
        assert_eq!(err.max, 1000 - u64::from(BATCH_HEADER_BYTES));
        assert!(err.to_string().contains("max_record_bytes"));
    }

    #[test]
    fn batch_limit_has_a_ceiling() {
        let limits = Limits {
            max_record_bytes: 1000,
            max_batch_bytes: BATCH_BYTES_CEILING + 1,
        };
        assert_eq!(
            limits.validate().unwrap_err().limit,
            LimitName::BatchBytesCeiling
        );
    }
}
