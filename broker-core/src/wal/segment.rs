//! Segment files, their names and the seal index.
//!
//! A topic's WAL directory holds, per segment, `{base:020}.log` (record
//! batches back to back) and, once sealed, `{base:020}.index`: the sparse
//! offset → position index plus a summary of the segment, written atomically.
//! A segment is sealed if and only if its `.index` file exists and is valid;
//! sealed segments never change again. Layout of the index file in
//! `FORMAT.md`.

use std::path::{Path, PathBuf};
use std::time::Instant;

/// File name suffix of segment data files.
pub const LOG_SUFFIX: &str = ".log";
/// File name suffix of seal index files.
pub const INDEX_SUFFIX: &str = ".index";
/// Magic bytes of a seal index file.
pub const INDEX_MAGIC: [u8; 4] = *b"TRIX";
/// Seal index format version.
pub const INDEX_VERSION: u8 = 1;
/// Size of the seal index header, bytes.
pub const INDEX_HEADER_BYTES: usize = 56;
/// Size of one index entry (u32 relative offset, u32 position), bytes.
pub const INDEX_ENTRY_BYTES: usize = 8;

/// Name of the data file of the segment starting at `base_offset`.
pub fn log_file_name(base_offset: u64) -> String {
    format!("{base_offset:020}{LOG_SUFFIX}")
}

/// Name of the seal index file of the segment starting at `base_offset`.
pub fn index_file_name(base_offset: u64) -> String {
    format!("{base_offset:020}{INDEX_SUFFIX}")
}

/// What a directory entry is, parsed from its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WalFile {
    /// `{base:020}.log`
    Log(u64),
    /// `{base:020}.index`
    Index(u64),
    /// A leftover `*.tmp` from an interrupted atomic write.
    Temporary,
    /// `wal.mark`, the sync mark (see `mark.rs`).
    Mark,
    /// `wal.tip`, the last batch retention deleted (see `tip.rs`).
    Tip,
}

/// Parses a WAL directory entry name; `None` for names the WAL does not own.
pub fn parse_file_name(name: &str) -> Option<WalFile> {
    if name.ends_with(".tmp") {
        return Some(WalFile::Temporary);
    }
    if name == super::mark::MARK_FILE_NAME {
        return Some(WalFile::Mark);
    }
    if name == super::tip::TIP_FILE_NAME {
        return Some(WalFile::Tip);
    }
    let (stem, kind): (&str, fn(u64) -> WalFile) = if let Some(s) = name.strip_suffix(LOG_SUFFIX) {
        (s, WalFile::Log)
    } else if let Some(s) = name.strip_suffix(INDEX_SUFFIX) {
        (s, WalFile::Index)
    } else {
        return None;
    };
    if stem.len() != 20 || !stem.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    stem.parse().ok().map(kind)
}

/// One sparse index entry: the batch starting at `base_offset + relative_offset`
/// begins at byte `position` of the segment file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexEntry {
    /// Batch base offset minus the segment base offset.
    pub relative_offset: u32,
    /// Byte position of the batch in the segment file.
    pub position: u32,
}

/// In-memory description of one segment.
#[derive(Debug, Clone)]
pub struct SegmentMeta {
    /// Offset of the first record (also in the file name).
    pub base_offset: u64,
    /// Offset just past the last record written to the file.
    pub next_offset: u64,
    /// Bytes written to the file (all visible to readers once the writer has
    /// published them; see `Wal::high_water_mark`).
    pub bytes: u64,
    /// Sparse index, ascending.
    pub index: Vec<IndexEntry>,
    /// Smallest batch first-timestamp seen, ms since the Unix epoch.
    pub first_timestamp_ms: Option<i64>,
    /// Largest record timestamp, ms since the Unix epoch.
    pub max_timestamp_ms: Option<i64>,
    /// Sealed: immutable, `.index` written.
    pub sealed: bool,
    /// When this process first wrote to the segment (for `segment_max_age`).
    pub first_write_at: Option<Instant>,
}

impl SegmentMeta {
    /// A new empty segment at `base_offset`.
    pub fn empty(base_offset: u64) -> SegmentMeta {
        SegmentMeta {
            base_offset,
            next_offset: base_offset,
            bytes: 0,
            index: Vec::new(),
            first_timestamp_ms: None,
            max_timestamp_ms: None,
            sealed: false,
            first_write_at: None,
        }
    }

    /// Records that a batch was written at the end of the segment, adding an
    /// index entry when `index_interval_bytes` have passed since the last one.
    /// The batch may start past `next_offset` (the offsets between are a
    /// declared hole) and past `bytes` (the bytes between are a damaged
    /// range recovery keeps).
    pub fn note_batch(
        &mut self,
        header: &tributary_proto::batch::BatchHeader,
        position: u64,
        index_interval_bytes: u64,
    ) {
        assert!(
            header.base_offset >= self.next_offset,
            "WAL invariant: offsets in a segment grow"
        );
        assert!(
            position >= self.bytes,
            "WAL invariant: batches do not overlap"
        );
        let due = match self.index.last() {
            None => true,
            Some(last) => position - u64::from(last.position) >= index_interval_bytes,
        };
        if due {
            self.index.push(IndexEntry {
                relative_offset: (header.base_offset - self.base_offset) as u32,
                position: position as u32,
            });
        }
        self.next_offset = header.next_offset();
        self.bytes = position + u64::from(header.batch_length);
        self.first_timestamp_ms = Some(
            self.first_timestamp_ms
                .map_or(header.first_timestamp_ms, |t| {
                    t.min(header.first_timestamp_ms)
                }),
        );
        self.max_timestamp_ms = Some(
            self.max_timestamp_ms
                .map_or(header.max_timestamp_ms, |t| t.max(header.max_timestamp_ms)),
        );
    }

    /// Byte position from which to scan for `offset`: the last index entry at
    /// or below it.
    pub fn scan_start(&self, offset: u64) -> u64 {
        self.scan_start_at(offset).0
    }

    /// Like [`SegmentMeta::scan_start`], with the base offset of the batch
    /// that starts there.
    pub fn scan_start_at(&self, offset: u64) -> (u64, u64) {
        let relative = offset.saturating_sub(self.base_offset);
        let at = self
            .index
            .partition_point(|e| u64::from(e.relative_offset) <= relative);
        match at {
            0 => (0, self.base_offset),
            n => {
                let entry = self.index[n - 1];
                (
                    u64::from(entry.position),
                    self.base_offset + u64::from(entry.relative_offset),
                )
            }
        }
    }

    /// Number of records in the segment.
    pub fn record_count(&self) -> u64 {
        self.next_offset - self.base_offset
    }

    /// Serializes the seal index file (see `FORMAT.md`).
    pub fn encode_index(&self) -> Vec<u8> {
        let mut out =
            Vec::with_capacity(INDEX_HEADER_BYTES + self.index.len() * INDEX_ENTRY_BYTES + 4);
        out.extend_from_slice(&INDEX_MAGIC);
        out.push(INDEX_VERSION);
        out.extend_from_slice(&[0; 3]);
        out.extend_from_slice(&self.base_offset.to_le_bytes());
        out.extend_from_slice(&self.next_offset.to_le_bytes());
        out.extend_from_slice(&self.bytes.to_le_bytes());
        out.extend_from_slice(&self.first_timestamp_ms.unwrap_or(0).to_le_bytes());
        out.extend_from_slice(&self.max_timestamp_ms.unwrap_or(0).to_le_bytes());
        out.extend_from_slice(&(self.index.len() as u32).to_le_bytes());
        out.extend_from_slice(&[0; 4]);
        debug_assert_eq!(out.len(), INDEX_HEADER_BYTES);
        for entry in &self.index {
            out.extend_from_slice(&entry.relative_offset.to_le_bytes());
            out.extend_from_slice(&entry.position.to_le_bytes());
        }
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// Parses a seal index file for the segment at `base_offset`.
    ///
    /// # Errors
    /// A description of the first failed check (magic, version, CRC, base
    /// offset, entry count, ordering).
    pub fn decode_index(base_offset: u64, bytes: &[u8]) -> Result<SegmentMeta, &'static str> {
        if bytes.len() < INDEX_HEADER_BYTES + 4 {
            return Err("index file truncated");
        }
        let (body, crc) = bytes.split_at(bytes.len() - 4);
        if crc32c::crc32c(body).to_le_bytes() != crc {
            return Err("index file crc mismatch");
        }
        if body[0..4] != INDEX_MAGIC {
            return Err("index file bad magic");
        }
        if body[4] != INDEX_VERSION {
            return Err("index file unsupported version");
        }
        let u64_at = |at: usize| {
            let mut raw = [0u8; 8];
            raw.copy_from_slice(&body[at..at + 8]);
            u64::from_le_bytes(raw)
        };
        let u32_at = |at: usize| {
            let mut raw = [0u8; 4];
            raw.copy_from_slice(&body[at..at + 4]);
            u32::from_le_bytes(raw)
        };
        if u64_at(8) != base_offset {
            return Err("index file names another segment");
        }
        let next_offset = u64_at(16);
        let bytes_len = u64_at(24);
        let count = u32_at(48) as usize;
        if body.len() != INDEX_HEADER_BYTES + count * INDEX_ENTRY_BYTES {
            return Err("index file entry count disagrees with its size");
        }
        if next_offset <= base_offset || bytes_len == 0 {
            return Err("index file describes an empty segment");
        }
        let mut index = Vec::with_capacity(count);
        for i in 0..count {
            let at = INDEX_HEADER_BYTES + i * INDEX_ENTRY_BYTES;
            index.push(IndexEntry {
                relative_offset: u32_at(at),
                position: u32_at(at + 4),
            });
        }
        let ordered = index
            .windows(2)
            .all(|w| w[0].relative_offset < w[1].relative_offset && w[0].position < w[1].position);
        let in_range = index
            .last()
            .is_none_or(|e| base_offset + u64::from(e.relative_offset) < next_offset);
        if !ordered || !in_range {
            return Err("index file entries out of order or out of range");
        }
        Ok(SegmentMeta {
            base_offset,
            next_offset,
            bytes: bytes_len,
            index,
            first_timestamp_ms: Some(u64_at(32) as i64),
            max_timestamp_ms: Some(u64_at(40) as i64),
            sealed: true,
            first_write_at: None,
        })
    }
}

/// A sealed segment as another process (the tier service) sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SealedSegment {
    /// First offset.
    pub base_offset: u64,
    /// Offset just past the last record.
    pub next_offset: u64,
    /// Size of the data file, bytes.
    pub bytes: u64,
    /// Smallest first-timestamp of its batches, ms since the Unix epoch.
    pub first_timestamp_ms: i64,
    /// Largest record timestamp, ms since the Unix epoch.
    pub max_timestamp_ms: i64,
    /// Path of the `.log` data file.
    pub log_path: PathBuf,
    /// Path of the `.index` seal file.
    pub index_path: PathBuf,
}

impl SealedSegment {
    pub(crate) fn from_meta(dir: &Path, meta: &SegmentMeta) -> SealedSegment {
        SealedSegment {
            base_offset: meta.base_offset,
            next_offset: meta.next_offset,
            bytes: meta.bytes,
            first_timestamp_ms: meta.first_timestamp_ms.unwrap_or(0),
            max_timestamp_ms: meta.max_timestamp_ms.unwrap_or(0),
            log_path: dir.join(log_file_name(meta.base_offset)),
            index_path: dir.join(index_file_name(meta.base_offset)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_sort_by_offset() {
        let a = log_file_name(9);
        let b = log_file_name(10);
        assert_eq!(a, "00000000000000000009.log");
        assert!(a < b);
        assert_eq!(parse_file_name(&a), Some(WalFile::Log(9)));
        assert_eq!(
            parse_file_name(&index_file_name(u64::MAX)),
            Some(WalFile::Index(u64::MAX))
        );
        assert_eq!(parse_file_name("x.log"), None);
        assert_eq!(parse_file_name("0000000000000000000a.log"), None);
        assert_eq!(parse_file_name("99999999999999999999.log"), None);
        assert_eq!(parse_file_name("a.index.tmp"), Some(WalFile::Temporary));
    }

    #[test]
    fn index_file_round_trips_and_rejects_damage() {
        let meta = SegmentMeta {
            base_offset: 100,
            next_offset: 150,
            bytes: 9000,
            index: vec![
                IndexEntry {
                    relative_offset: 0,
                    position: 0,
                },
                IndexEntry {
                    relative_offset: 20,
                    position: 4100,
                },
            ],
            first_timestamp_ms: Some(5),
            max_timestamp_ms: Some(9),
            sealed: true,
            first_write_at: None,
        };
        let bytes = meta.encode_index();
        let back = SegmentMeta::decode_index(100, &bytes).unwrap();
        assert_eq!(back.index, meta.index);
        assert_eq!((back.next_offset, back.bytes), (150, 9000));
        assert_eq!(back.scan_start(119), 0);
        assert_eq!(back.scan_start(120), 4100);
        assert_eq!(back.scan_start(149), 4100);
        assert!(SegmentMeta::decode_index(101, &bytes).is_err());
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x10;
            assert!(SegmentMeta::decode_index(100, &bad).is_err(), "flip at {i}");
        }
        assert!(SegmentMeta::decode_index(100, &bytes[..bytes.len() - 1]).is_err());
    }
}
