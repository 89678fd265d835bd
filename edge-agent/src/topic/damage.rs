//! [`DamagedRange`]: how the topics API, `/health` and the metrics show an
//! offset range the topic's WAL cannot read (damaged bytes kept on disk, or
//! a hole), from [`broker_core::wal::Wal::damaged_ranges`].

use serde::Serialize;

use broker_core::wal::{UnreadableKind, UnreadableRange};

/// An unreadable offset range of a topic's WAL, as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DamagedRange {
    /// First offset of the range.
    pub first_offset: u64,
    /// First offset after it (exclusive).
    pub end_offset: u64,
    /// `damaged` (bytes kept on disk that fail their checks) or `hole` (no
    /// bytes: offsets acknowledged earlier and missing after a restart).
    pub kind: &'static str,
    /// Where and why: segment, byte position and the failed check.
    pub reason: String,
}

impl From<&UnreadableRange> for DamagedRange {
    fn from(range: &UnreadableRange) -> DamagedRange {
        let reason = match &range.kind {
            UnreadableKind::Damaged {
                segment_base,
                position,
                bytes,
                reason,
            } => format!("{bytes} bytes at byte {position} of segment {segment_base}: {reason}"),
            UnreadableKind::Hole => "no record is stored for these offsets".to_string(),
        };
        DamagedRange {
            first_offset: range.first_offset,
            end_offset: range.end_offset,
            kind: range.kind_name(),
            reason,
        }
    }
}

impl DamagedRange {
    /// Offsets in the range.
    pub fn len(&self) -> u64 {
        self.end_offset.saturating_sub(self.first_offset)
    }

    /// Whether the range holds no offset.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
