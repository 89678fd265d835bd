//! The archived offset of a durable topic and what it lets retention
//! delete: with `retain_until = "archived"` (the default) a sealed segment
//! stays on the edge until the broker reports it committed in the archive
//! (`Archived` frames), so a broker whose disk is lost before its tier
//! service archived a range costs nothing; the edge still holds it.

use std::sync::atomic::Ordering;

use tracing::debug;

use super::{AckError, Topic, TopicLog};
use crate::config::RetainUntil;

impl Topic {
    /// Offset below which the broker reported everything committed in the
    /// archive; only grows.
    pub fn archived_offset(&self) -> u64 {
        self.archived.load(Ordering::SeqCst)
    }

    /// Offset below which local retention may delete sealed segments:
    /// `min(acknowledged, archived)` with `retain_until = "archived"`, the
    /// acknowledged offset with `"acknowledged"`.
    pub fn safe_offset(&self) -> u64 {
        let acknowledged = self.acknowledged_offset();
        match self.policy.retain_until {
            RetainUntil::Archived => acknowledged.min(self.archived_offset()),
            RetainUntil::Acknowledged => acknowledged,
        }
    }

    /// Records that everything below `archived_offset` is committed in the
    /// archive (the broker's `Archived` frame): raises the archived offset
    /// (written to `/edge/archived/{ns}/{topic}` with the checkpoints) and,
    /// with `retain_until = "archived"`, deletes the sealed segments that
    /// are now entirely below [`Topic::safe_offset`]. A lower offset than
    /// the current one changes nothing. Returns the bytes deleted.
    ///
    /// # Errors
    /// [`AckError::Wal`] if retention failed (the offset is raised).
    pub async fn archive(&self, archived_offset: u64) -> Result<u64, AckError> {
        let previous = self.archived.fetch_max(archived_offset, Ordering::SeqCst);
        if archived_offset <= previous {
            return Ok(0);
        }
        self.archived_dirty.store(true, Ordering::SeqCst);
        if self.policy.retain_until != RetainUntil::Archived
            || !matches!(self.log, TopicLog::Wal(_))
        {
            return Ok(0);
        }
        let Some(wal) = self.wal() else {
            return Ok(0);
        };
        let report = self
            .delete_sealed_below(&wal, self.safe_offset())
            .await
            .map_err(|source| AckError::Wal {
                topic: self.name.clone(),
                source,
            })?;
        let mut freed = 0;
        for &(start, end, bytes) in &report.deleted {
            debug!(topic = %self.name, start, end, bytes, "deleted an archived segment");
            freed += bytes;
        }
        freed += self
            .release_safe_active_segment(&wal)
            .await
            .map_err(|source| AckError::Wal {
                topic: self.name.clone(),
                source,
            })?;
        Ok(freed)
    }

    /// The archived offset if it changed since the last call (for the
    /// checkpoint writer); clears the flag.
    pub(crate) fn take_dirty_archived(&self) -> Option<u64> {
        self.archived_dirty
            .swap(false, Ordering::SeqCst)
            .then(|| self.archived_offset())
    }

    /// Marks the archived offset as not yet written (a failed write).
    pub(crate) fn mark_archived_dirty(&self) {
        self.archived_dirty.store(true, Ordering::SeqCst);
    }
}
