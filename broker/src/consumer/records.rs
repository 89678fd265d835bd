//! Reading records out of a topic WAL for consumers: a range from an offset,
//! a set of offsets (leases hand out scattered redeliveries), the first
//! offset at a timestamp, and the JSON form of a record.

use std::collections::BTreeMap;
use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use broker_core::wal::{UnreadableKind, UnreadableRange, Wal, WalError};
use bytes::Bytes;
use tributary_api::consumer::{Gap, GapKind, Message, MessageHeader, ValueEncoding};
use tributary_proto::Record;

/// Bytes read from the WAL per step.
const READ_STEP_BYTES: usize = 1 << 20;
/// Gaps one range read steps over at most before it returns.
const MAX_GAPS_PER_READ: usize = 64;

/// The gap notice for `range`, from `from` (a read inside it) on.
pub fn gap_for(from: u64, range: &UnreadableRange) -> Gap {
    Gap {
        first_offset: from.max(range.first_offset),
        end_offset: range.end_offset,
        kind: match range.kind {
            UnreadableKind::Damaged { .. } => GapKind::Damaged,
            UnreadableKind::Hole => GapKind::Hole,
        },
        reason: range.detail(),
    }
}

/// Whether `range` is damaged bytes (which may heal) rather than a hole.
fn is_damaged(range: &UnreadableRange) -> bool {
    matches!(range.kind, UnreadableKind::Damaged { .. })
}

/// Why records could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The WAL refused (deleted by retention, damaged, I/O).
    #[error(transparent)]
    Wal(#[from] WalError),
    /// A stored batch that does not decode.
    #[error("stored batch at offset {offset} does not decode: {reason}")]
    Decode {
        /// Its base offset.
        offset: u64,
        /// Why.
        reason: String,
    },
    /// The blocking read task failed.
    #[error("read task: {0}")]
    Task(String),
    /// The offset is below the local WAL (its segment was tiered and
    /// trimmed) and the broker has no `[archive]` to read it from.
    #[error(
        "offset {offset} was tiered to the archive (the local WAL starts at {log_start}) and no archive is configured: set [archive] in the broker configuration"
    )]
    Tiered {
        /// Requested.
        offset: u64,
        /// The local WAL's first offset.
        log_start: u64,
    },
    /// Below the local WAL and not in the archive either (removed by cold
    /// retention, or never tiered).
    #[error(
        "offset {offset} is below the local WAL (which starts at {log_start}) and not in the archive"
    )]
    NotArchived {
        /// Requested.
        offset: u64,
        /// The local WAL's first offset.
        log_start: u64,
    },
    /// Reading the archive failed (store error, damaged object).
    #[error("archive: {0}")]
    Archive(String),
}

fn decode_into(
    wal: &Wal,
    batch: &tributary_proto::EncodedBatch,
) -> Result<tributary_proto::RecordBatch, ReadError> {
    batch
        .decode(&wal.config().limits)
        .map_err(|e| ReadError::Decode {
            offset: batch.base_offset(),
            reason: e.to_string(),
        })
}

/// Most record bytes (keys, header values, values) one range read
/// returns: 64 MiB. The read stops before the record that would pass it,
/// returning at least one, so a peek or replay of 1,000 records of 1 MiB
/// answers about 64 of them (the next call goes on) instead of holding a
/// gigabyte.
pub const MAX_READ_BYTES: usize = 64 << 20;

/// A record's bytes for [`MAX_READ_BYTES`].
pub(super) fn record_bytes(record: &Record) -> usize {
    let headers: usize = record.headers.iter().map(|(n, v)| n.len() + v.len()).sum();
    record.value.len() + record.key.as_ref().map_or(0, |k| k.len()) + headers
}

/// Up to `max_count` records from `from` (below the high-water mark), by
/// offset, at most `max_bytes` of them (at least one; see
/// [`MAX_READ_BYTES`]). Declared holes are stepped over and each is added
/// to `gaps` (at most [`MAX_GAPS_PER_READ`] per call): never skipped
/// silently. A damaged range ends the read: it is added to `gaps` (kind
/// `damaged`, always the last entry) and nothing at or after it is
/// returned.
///
/// # Errors
/// [`ReadError`].
pub fn read_range_blocking(
    wal: &Wal,
    from: u64,
    max_count: usize,
    max_bytes: usize,
    gaps: &mut Vec<Gap>,
) -> Result<Vec<(u64, Record)>, ReadError> {
    let mut out = Vec::new();
    let mut next = from;
    let mut stepped = 0;
    let mut bytes = 0usize;
    'read: while out.len() < max_count {
        let batches = match wal.read(next, READ_STEP_BYTES) {
            Ok(batches) => batches,
            Err(WalError::Unreadable(range)) if range.end_offset > next => {
                gaps.push(gap_for(next, &range));
                if is_damaged(&range) {
                    // May heal: the read stops here (the caller waits).
                    break;
                }
                next = range.end_offset;
                stepped += 1;
                if stepped >= MAX_GAPS_PER_READ {
                    break;
                }
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        if batches.is_empty() {
            break;
        }
        for batch in &batches {
            let decoded = decode_into(wal, batch)?;
            for (i, record) in decoded.records.into_iter().enumerate() {
                let offset = decoded.base_offset + i as u64;
                if offset >= next && out.len() < max_count {
                    let size = record_bytes(&record);
                    if !out.is_empty() && bytes.saturating_add(size) > max_bytes {
                        break 'read;
                    }
                    bytes = bytes.saturating_add(size);
                    out.push((offset, record));
                }
            }
            next = next.max(batch.next_offset());
        }
    }
    Ok(out)
}

/// The records at `offsets` (each below the high-water mark), by offset.
/// An offset in a declared hole has no record; the range is added to
/// `gaps`. A damaged range ends the read: it is added to `gaps` (kind
/// `damaged`, the last entry) and no offset at or after it is returned.
///
/// # Errors
/// [`ReadError`].
pub fn read_offsets_blocking(
    wal: &Wal,
    offsets: &[u64],
    gaps: &mut Vec<Gap>,
) -> Result<BTreeMap<u64, Record>, ReadError> {
    let mut wanted: Vec<u64> = offsets.to_vec();
    wanted.sort_unstable();
    wanted.dedup();
    let mut out = BTreeMap::new();
    let mut i = 0;
    while i < wanted.len() {
        let offset = wanted[i];
        let batches = match wal.read(offset, 1) {
            Ok(batches) => batches,
            Err(WalError::Unreadable(range)) if range.end_offset > offset => {
                // The whole range, not just the leased part of it.
                gaps.push(gap_for(range.first_offset, &range));
                if is_damaged(&range) {
                    // May heal: nothing at or after it is returned.
                    break;
                }
                while i < wanted.len() && wanted[i] < range.end_offset {
                    i += 1;
                }
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        let Some(batch) = batches.first() else {
            return Err(ReadError::Decode {
                offset,
                reason: "offset not readable (beyond the high-water mark)".into(),
            });
        };
        let decoded = decode_into(wal, batch)?;
        let end = batch.next_offset();
        let base = decoded.base_offset;
        let mut records: Vec<Option<Record>> = decoded.records.into_iter().map(Some).collect();
        while i < wanted.len() && wanted[i] < end {
            let index = usize::try_from(wanted[i] - base).unwrap_or(usize::MAX);
            if let Some(record) = records.get_mut(index).and_then(Option::take) {
                out.insert(wanted[i], record);
            }
            i += 1;
        }
    }
    Ok(out)
}

/// The first offset whose record has a timestamp at or after `timestamp_ms`
/// (the high-water mark if none), scanning from the log start.
///
/// # Errors
/// [`ReadError`].
pub fn offset_for_timestamp_blocking(wal: &Wal, timestamp_ms: i64) -> Result<u64, ReadError> {
    let mut next = wal.log_start_offset();
    loop {
        let batches = wal.read(next, READ_STEP_BYTES)?;
        if batches.is_empty() {
            return Ok(wal.high_water_mark().max(next));
        }
        for batch in &batches {
            if batch.header().max_timestamp_ms >= timestamp_ms {
                let decoded = decode_into(wal, batch)?;
                for (i, record) in decoded.records.iter().enumerate() {
                    let offset = decoded.base_offset + i as u64;
                    if offset >= next && record.timestamp_ms >= timestamp_ms {
                        return Ok(offset);
                    }
                }
            }
            next = next.max(batch.next_offset());
        }
    }
}

/// Runs a blocking WAL read on the blocking pool.
///
/// # Errors
/// [`ReadError`], [`ReadError::Task`] if the task panicked.
pub async fn blocking<T: Send + 'static>(
    wal: &Arc<Wal>,
    f: impl FnOnce(&Wal) -> Result<T, ReadError> + Send + 'static,
) -> Result<T, ReadError> {
    let wal = wal.clone();
    tokio::task::spawn_blocking(move || f(&wal))
        .await
        .map_err(|e| ReadError::Task(e.to_string()))?
}

fn text_or_b64(bytes: &Bytes, encoding: ValueEncoding) -> (Option<String>, Option<String>) {
    match (encoding, std::str::from_utf8(bytes)) {
        (ValueEncoding::Text, Ok(text)) => (Some(text.to_owned()), None),
        _ => (None, Some(B64.encode(bytes))),
    }
}

/// The JSON form of the record at `offset`.
pub fn to_message(offset: u64, record: &Record, encoding: ValueEncoding) -> Message {
    let (value, value_b64) = text_or_b64(&record.value, encoding);
    let (key, key_b64) = match &record.key {
        Some(key) => text_or_b64(key, encoding),
        None => (None, None),
    };
    Message {
        offset,
        timestamp_ms: record.timestamp_ms,
        key,
        key_b64,
        headers: record
            .headers
            .iter()
            .map(|(name, value)| {
                let (value, value_b64) = text_or_b64(value, encoding);
                MessageHeader {
                    name: name.clone(),
                    value,
                    value_b64,
                }
            })
            .collect(),
        value,
        value_b64,
        attempt: 0,
        lease_deadline_ms: None,
    }
}

/// Decodes base64 input, naming `field` on failure.
///
/// # Errors
/// The field and what is wrong.
pub fn decode_b64(field: &str, text: &str) -> Result<Bytes, String> {
    B64.decode(text)
        .map(Bytes::from)
        .map_err(|e| format!("{field}: not valid base64: {e}"))
}

/// Merges the gap notices of one answer that overlap or touch and are of
/// one kind into the first of them (in offset order): reads made in steps
/// name each step's part of one hole, and a consumer is told of a range
/// once.
pub(super) fn merge_gaps(gaps: &mut Vec<Gap>) {
    gaps.sort_by_key(|g| (g.first_offset, g.end_offset));
    let mut merged: Vec<Gap> = Vec::with_capacity(gaps.len());
    for gap in gaps.drain(..) {
        match merged.last_mut() {
            Some(last) if last.kind == gap.kind && gap.first_offset <= last.end_offset => {
                last.end_offset = last.end_offset.max(gap.end_offset);
            }
            _ => merged.push(gap),
        }
    }
    *gaps = merged;
}

#[cfg(test)]
mod tests {
    use super::*;
    use broker_core::wal::WalConfig;
    use bytes::Bytes;

    /// A range read stops before the record that would pass its byte
    /// budget, with at least one record, and the next read goes on from
    /// there: nothing is skipped.
    #[tokio::test]
    async fn a_range_read_stops_at_its_byte_budget_and_the_next_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let wal = Wal::open(dir.path(), WalConfig::default()).unwrap();
        let record = |i: u8| Record {
            timestamp_ms: 0,
            key: None,
            headers: Vec::new(),
            value: Bytes::from(vec![i; 1000]),
        };
        wal.append((0..10).map(record).collect(), tributary_proto::Codec::None)
            .await
            .unwrap();
        let mut gaps = Vec::new();
        let first = read_range_blocking(&wal, 0, 100, 3500, &mut gaps).unwrap();
        assert_eq!(first.iter().map(|(o, _)| *o).collect::<Vec<_>>(), [0, 1, 2]);
        let rest = read_range_blocking(&wal, 3, 100, 3500, &mut gaps).unwrap();
        assert_eq!(rest.iter().map(|(o, _)| *o).collect::<Vec<_>>(), [3, 4, 5]);
        // A record over the whole budget is still returned, alone.
        let one = read_range_blocking(&wal, 6, 100, 10, &mut gaps).unwrap();
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].1.value, vec![6u8; 1000]);
        assert!(gaps.is_empty());
    }
}
