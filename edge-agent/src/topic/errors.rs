//! The errors of a topic: [`PublishError`] (with [`TopicFull`], a disk
//! budget, and [`PublishError::DiskFull`], the file system) and
//! [`AckError`].

use std::path::PathBuf;

use broker_core::wal::WalError;
use tributary_proto::keys::TopicName;
use tributary_proto::limits::LimitError;

use crate::budget::{BudgetScope, FullPolicy};

/// A batch refused because a disk budget is full (HTTP 507).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "topic {topic} is full: {} = {limit_bytes} bytes, {used_bytes} used, a batch of {batch_bytes} bytes does not fit; nothing was stored (full_policy = {policy}{})",
    limit_name(*scope),
    if *policy == FullPolicy::DropOldest { ", nothing left to drop" } else { "" }
)]
pub struct TopicFull {
    /// The topic.
    pub topic: TopicName,
    /// Which budget is full.
    pub scope: BudgetScope,
    /// Its limit, bytes.
    pub limit_bytes: u64,
    /// Bytes used when the batch was refused.
    pub used_bytes: u64,
    /// The encoded batch, bytes.
    pub batch_bytes: u64,
    /// The topic's policy.
    pub policy: FullPolicy,
}

fn limit_name(scope: BudgetScope) -> &'static str {
    match scope {
        BudgetScope::Topic => "the topic's disk_budget_bytes",
        BudgetScope::Agent => "the agent's disk_budget_bytes",
    }
}

/// Why a publish failed. Nothing of the batch is stored in any case but
/// [`PublishError::Wal`] and [`PublishError::DiskFull`] after the WAL
/// stopped (fail-stop): then whole batches of the group being written may
/// have reached the disk and are kept by recovery (never acknowledged).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PublishError {
    /// A record or the batch is over a size limit (HTTP 413).
    #[error("{limit}{}", record_index.map(|i| format!(" (record {i})")).unwrap_or_default())]
    TooLarge {
        /// The record at fault (0-based) for `max_record_bytes`.
        record_index: Option<usize>,
        /// Which limit, the size found and the maximum.
        limit: LimitError,
    },
    /// The batch holds no record (HTTP 400).
    #[error("no records to publish")]
    Empty,
    /// A disk budget is full (HTTP 507).
    #[error(transparent)]
    Full(#[from] TopicFull),
    /// The agent is shutting down (HTTP 503).
    #[error("topic {topic} is closed: the agent is shutting down")]
    Closed {
        /// The topic.
        topic: TopicName,
    },
    /// The file system holding the topic's WAL is full (`ENOSPC`,
    /// `EDQUOT`; HTTP 507 `disk_full`). The topic refuses publishes until
    /// its WAL is reopened, which the agent retries by itself.
    #[error(
        "topic {topic}: the file system holding {} is full ({detail}); the batch was not acknowledged; the agent frees acknowledged segments and reopens the WAL by itself",
        path.display()
    )]
    DiskFull {
        /// The topic.
        topic: TopicName,
        /// The topic's WAL directory.
        path: PathBuf,
        /// The failure as the WAL reported it.
        detail: String,
    },
    /// The WAL stopped after another I/O failure (HTTP 500); the agent
    /// reopens it by itself.
    #[error("topic {topic}: WAL stopped after an I/O failure in {} ({detail}); the agent reopens it by itself", path.display())]
    WalStopped {
        /// The topic.
        topic: TopicName,
        /// The topic's WAL directory.
        path: PathBuf,
        /// The failure as the WAL reported it.
        detail: String,
    },
    /// The marker of a publish with a retry check could not be committed
    /// ([`crate::pending`]; HTTP 500): nothing was appended.
    #[error("topic {topic}: the retry marker could not be stored, nothing appended: {source}")]
    Marker {
        /// The topic.
        topic: TopicName,
        /// The metadata store's error.
        source: broker_core::metadata::MetadataError,
    },
    /// The WAL failed (HTTP 500).
    #[error("topic {topic}: {source}")]
    Wal {
        /// The topic.
        topic: TopicName,
        /// The WAL error.
        source: WalError,
    },
}

/// Why an acknowledgement was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AckError {
    /// The acknowledged offset is past what the topic holds: the broker
    /// claims records this agent never wrote.
    #[error(
        "topic {topic}: acknowledged offset {next_offset} is past the high-water mark {high_water_mark}"
    )]
    BeyondEnd {
        /// The topic.
        topic: TopicName,
        /// The acknowledged next offset.
        next_offset: u64,
        /// The topic's high-water mark.
        high_water_mark: u64,
    },
    /// Retention failed (the checkpoint is recorded anyway).
    #[error("topic {topic}: retention after acknowledgement failed: {source}")]
    Wal {
        /// The topic.
        topic: TopicName,
        /// The WAL error.
        source: WalError,
    },
}
