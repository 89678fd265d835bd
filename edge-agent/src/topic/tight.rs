//! Giving back an active segment whose records are all safe when a disk
//! budget is too tight for another batch.
//!
//! Retention deletes sealed segments only, and a segment is sized from the
//! budget it was created under (up to 64 MiB without one). After the
//! budget was lowered below what the active segment held, every publish
//! was refused for good although the broker (and the archive) had every
//! record (the config trial: 200,000 bytes allowed, 305,215 used, all
//! acknowledged and archived). So when every record of the log is below
//! the safe offset and the topic's or the agent's budget cannot take one
//! more `max_batch_bytes` batch, the active segment is sealed and deleted
//! like any safe sealed segment.

use std::sync::Arc;

use broker_core::wal::{Wal, WalError};
use tracing::info;

use super::Topic;

impl Topic {
    /// Seals and deletes the active segment of `wal` when all of the log
    /// is below [`Topic::safe_offset`] and a budget is tight (module doc).
    /// Returns the bytes freed (0 when nothing was done).
    ///
    /// # Errors
    /// [`WalError`] from sealing or retention.
    pub(crate) async fn release_safe_active_segment(
        &self,
        wal: &Arc<Wal>,
    ) -> Result<u64, WalError> {
        let batch = u64::from(self.limits.max_batch_bytes);
        let tight = [&self.budget, &self.agent_budget].into_iter().any(|b| {
            b.limit_bytes()
                .is_some_and(|limit| b.used_bytes().saturating_add(batch) > limit)
        });
        let high_water_mark = wal.high_water_mark();
        let active_start = wal
            .sealed_segments()
            .last()
            .map_or(wal.log_start_offset(), |s| s.next_offset);
        if !tight || active_start >= high_water_mark || high_water_mark > self.safe_offset() {
            return Ok(0);
        }
        wal.roll().await?;
        let report = self.delete_sealed_below(wal, self.safe_offset()).await?;
        let freed: u64 = report.deleted.iter().map(|&(_, _, bytes)| bytes).sum();
        if freed > 0 {
            info!(
                topic = %self.name,
                freed_bytes = freed,
                safe_offset = self.safe_offset(),
                "disk budget tight: sealed and deleted the active segment, every record of which the broker holds"
            );
        }
        Ok(freed)
    }
}
