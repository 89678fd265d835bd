//! [`SegmentDescriptor`]: what Raft records about one archived segment, and
//! its checks against the object's footer.

use serde::{Deserialize, Serialize};

use super::{
    FOOTER_BYTES, FORMAT_VERSION, FORMAT_VERSION_NO_HOLES, Footer, HOLE_ENTRY_BYTES,
    INDEX_ENTRY_BYTES,
};

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
    /// Records: `end_offset - start_offset + 1` in a version-1 object; in
    /// a version-2 object, that minus the offsets in its declared holes
    /// (listed in the object's holes region).
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
            format_version: footer.format_version(),
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
        let span = self.end_offset - self.start_offset + 1;
        match self.format_version {
            FORMAT_VERSION_NO_HOLES if self.record_count != span => {
                return Err("record_count is not end_offset - start_offset + 1");
            }
            FORMAT_VERSION if self.record_count == 0 || self.record_count > span => {
                return Err("record_count outside [1, end_offset - start_offset + 1]");
            }
            FORMAT_VERSION_NO_HOLES | FORMAT_VERSION => {}
            _ => return Err("unsupported format_version"),
        }
        // Version 2: the holes region (16 bytes a hole) lies between the
        // index and the footer.
        let fixed = self.batches_bytes + self.index_bytes + FOOTER_BYTES as u64;
        let holes_bytes = self.size.checked_sub(fixed);
        let holes_ok = match (self.format_version, holes_bytes) {
            (FORMAT_VERSION_NO_HOLES, Some(0)) => true,
            (FORMAT_VERSION, Some(n)) => n.is_multiple_of(HOLE_ENTRY_BYTES as u64),
            _ => false,
        };
        if self.index_position != self.batches_bytes || !holes_ok {
            return Err("size, batches_bytes, index_bytes and the holes region disagree");
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
