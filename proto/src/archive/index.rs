//! [`ArchiveIndex`]: the sparse offset/position/timestamp index before the
//! footer, and the lookups that turn an offset or timestamp into a [`Block`]
//! to read.

use super::{
    ArchiveError, ENTRY_MAX_TS_AT, ENTRY_POSITION_AT, ENTRY_RELATIVE_OFFSET_AT, FOOTER_BYTES,
    Footer, HoleRange, INDEX_ENTRY_BYTES, holes, read_u32, read_u64,
};

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
    /// Offset a reader of the block starts at: the base offset of the
    /// batch at `position`, except in the first block, which starts at the
    /// object's first offset (before any leading holes).
    pub base_offset: u64,
}

/// The decoded, checked index of one object, with its declared holes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchiveIndex {
    footer: Footer,
    pub(super) entries: Vec<IndexEntry>,
    holes: Vec<HoleRange>,
}

impl ArchiveIndex {
    /// Parses the index and the holes region from `tail`, a suffix of the
    /// object at least [`Footer::tail_bytes`] long (index, holes, footer).
    ///
    /// # Errors
    /// [`ArchiveError::TailTruncated`] if `tail` is too short (read
    /// more), [`ArchiveError::IndexCrc`], [`ArchiveError::IndexInvalid`],
    /// [`ArchiveError::HolesCrc`], [`ArchiveError::HolesInvalid`].
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

    /// Parses exactly the bytes between the batches region and the footer
    /// (the index region, then the holes region) of the object whose footer
    /// is `footer`.
    ///
    /// # Errors
    /// As [`ArchiveIndex::decode_from_tail`].
    pub fn decode(footer: &Footer, region: &[u8]) -> Result<ArchiveIndex, ArchiveError> {
        let wanted = footer.index_bytes() + footer.holes_bytes();
        if region.len() as u64 != wanted {
            return Err(ArchiveError::TailTruncated {
                needed: wanted,
                available: region.len() as u64,
            });
        }
        let (bytes, hole_bytes) = region.split_at(footer.index_bytes() as usize);
        let computed = crc32c::crc32c(bytes);
        if computed != footer.index_crc32c {
            return Err(ArchiveError::IndexCrc {
                stored: footer.index_crc32c,
                computed,
            });
        }
        let holes = holes::decode(footer, hole_bytes)?;
        // The first batch starts at base_offset, or after the declared
        // holes the object starts with.
        let mut first_batch = footer.base_offset;
        for h in &holes {
            if h.first_offset == first_batch {
                first_batch = h.end_offset;
            }
        }
        let first_relative = first_batch - footer.base_offset;
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
                None if u64::from(entry.relative_offset) != first_relative
                    || entry.position != 0 =>
                {
                    return Err(invalid(
                        "the first entry is not (0, 0) (or, after leading holes, (their length, 0))",
                    ));
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
                || u64::from(entry.relative_offset) >= footer.offset_span()
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
            holes,
        })
    }

    /// The entries, ascending.
    pub fn entries(&self) -> &[IndexEntry] {
        &self.entries
    }

    /// The declared holes the object carries, ascending (none in a
    /// version-1 object): offsets with no record, on purpose.
    pub fn holes(&self) -> &[HoleRange] {
        &self.holes
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
            // The first block starts at the object's first offset, also
            // when leading holes come before its first batch (that entry is
            // then (their length, 0)): a reader from there crosses them and
            // reports them, as it does holes between batches.
            base_offset: if entry == 0 {
                self.footer.base_offset
            } else {
                self.footer.base_offset + u64::from(e.relative_offset)
            },
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
