//! [`HoleRecord`]: a hole an edge declared (`Hole` frame), as the broker
//! keeps it in metadata at `/topics/{ns}/{topic}/holes/{first_offset:020}`
//! ([`crate::keys::topics::hole`]) so consumers, the archive and operators
//! can list it.

use serde::{Deserialize, Serialize};

use super::frame::HoleCause;

/// The JSON value of a declared hole.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HoleRecord {
    /// First offset no record is stored for.
    pub first_offset: u64,
    /// Exclusive end: the next record's offset.
    pub end_offset: u64,
    /// `"damaged"` (bytes at the edge failed verification) or `"lost"`
    /// (the edge stored nothing for the range).
    pub cause: String,
    /// What the edge's WAL reported.
    pub reason: String,
    /// When the broker first recorded it, ms since the Unix epoch.
    pub declared_at_ms: i64,
}

impl HoleRecord {
    /// A record of `first_offset..end_offset` declared at `declared_at_ms`.
    pub fn new(
        first_offset: u64,
        end_offset: u64,
        cause: HoleCause,
        reason: String,
        declared_at_ms: i64,
    ) -> HoleRecord {
        HoleRecord {
            first_offset,
            end_offset,
            cause: cause.as_str().to_string(),
            reason,
            declared_at_ms,
        }
    }

    /// Whether `other` declares the same range (a re-declaration after a
    /// reconnect, whatever its time or reason).
    pub fn same_range(&self, other: &HoleRecord) -> bool {
        self.first_offset == other.first_offset && self.end_offset == other.end_offset
    }
}
