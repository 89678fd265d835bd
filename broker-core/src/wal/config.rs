//! [`WalConfig`]: the settings of one topic's WAL (durability, group
//! commit, segment size and age, retention, limits, clock) and their checks.

use std::sync::Arc;
use std::time::Duration;

use tributary_proto::limits::{LimitError, LimitName, Limits};

use super::{SyncMode, WalError, WriterPool};
use crate::clock::{Clock, SystemClock};

/// Configuration of one topic's WAL.
#[derive(Debug, Clone)]
pub struct WalConfig {
    /// Durability of an acknowledged append. Default `fsync_batch`.
    pub sync_mode: SyncMode,
    /// Group-commit window: how long the writer waits after the first
    /// pending append for others to join its group. Default 0 (flush as soon
    /// as the writer is free; appends arriving during a flush form the next
    /// group).
    pub flush_interval: Duration,
    /// Group size that is flushed without waiting, bytes. Default 1 MiB.
    pub flush_max_batch_bytes: usize,
    /// Appends wait (backpressure) while this many bytes are pending in
    /// memory. Default 16 MiB; at least `limits.max_batch_bytes`.
    pub max_pending_bytes: usize,
    /// Roll the active segment before it would pass this size, bytes.
    /// Default 64 MiB; at least `limits.max_batch_bytes`, at most `u32::MAX`.
    pub segment_max_bytes: u64,
    /// Roll the active segment this long after its first write in this
    /// process. Default none.
    pub segment_max_age: Option<Duration>,
    /// Sparse index density: one entry per this many bytes. Default 4 KiB.
    pub index_interval_bytes: u64,
    /// Retention by size: delete the oldest safe sealed segments while the
    /// WAL is larger than this, bytes. Default none.
    pub retention_max_bytes: Option<u64>,
    /// Retention by age: delete safe sealed segments whose newest record is
    /// older than this. Default none.
    pub retention_max_age: Option<Duration>,
    /// Record and batch size limits.
    pub limits: Limits,
    /// Offset of the first record of a brand-new (empty) WAL directory.
    pub initial_offset: u64,
    /// Offsets below this were handed out before and are held elsewhere
    /// (an edge's checkpoint: the broker acknowledged them). Recovery never
    /// continues the log below it: an empty directory starts here, and a
    /// log whose end was lost below it (a removed directory, a truncated
    /// active segment) continues here, the offsets between reported as a
    /// hole. Default 0.
    pub min_next_offset: u64,
    /// The monotonic time the WAL reads ([`Clock::now`]): when an append
    /// started waiting (the group-commit window) and when the active
    /// segment was first written (its age). Default [`SystemClock`]; tests
    /// move a [`crate::clock::ManualClock`] instead of sleeping.
    pub clock: Arc<dyn Clock>,
    /// The threads that write this WAL's files. Default
    /// [`WriterPool::shared`], one pool for the whole process.
    pub writers: WriterPool,
}

impl Default for WalConfig {
    fn default() -> Self {
        WalConfig {
            sync_mode: SyncMode::FsyncBatch,
            flush_interval: Duration::ZERO,
            flush_max_batch_bytes: 1024 * 1024,
            max_pending_bytes: 16 * 1024 * 1024,
            segment_max_bytes: 64 * 1024 * 1024,
            segment_max_age: None,
            index_interval_bytes: 4096,
            retention_max_bytes: None,
            retention_max_age: None,
            limits: Limits::default(),
            initial_offset: 0,
            min_next_offset: 0,
            clock: Arc::new(SystemClock),
            writers: WriterPool::shared(),
        }
    }
}

impl WalConfig {
    /// Checks the limits against each other.
    ///
    /// # Errors
    /// [`WalError::Limit`] naming the offending setting.
    pub fn validate(&self) -> Result<(), WalError> {
        self.limits.validate()?;
        let max_batch = u64::from(self.limits.max_batch_bytes);
        if self.segment_max_bytes < max_batch || self.segment_max_bytes > u64::from(u32::MAX) {
            return Err(WalError::Limit(LimitError {
                limit: LimitName::SegmentMaxBytes,
                actual: self.segment_max_bytes,
                max: u64::from(u32::MAX).max(max_batch),
            }));
        }
        if (self.max_pending_bytes as u64) < max_batch || self.flush_max_batch_bytes == 0 {
            return Err(WalError::Config(
                "max_pending_bytes must be at least max_batch_bytes and flush_max_batch_bytes above 0"
                    .into(),
            ));
        }
        Ok(())
    }

    /// Bytes at the end of the active segment that one unacknowledged group
    /// write can span: damage confined to this tail is a torn write.
    pub(crate) fn torn_write_window_bytes(&self) -> u64 {
        2 * (self.flush_max_batch_bytes as u64).max(u64::from(self.limits.max_batch_bytes))
    }
}
