//! Local retention of a central topic WAL when no tier service runs
//! (issue 6 "Retention"): a sealed segment is deleted only when every
//! durable subscription has acknowledged it (its end is at or below the
//! minimum persisted cursor: compaction to the minimum cursor), or when a
//! declared retention limit (`max_age_ms`) expires it. Each deletion is
//! logged with the rule that allowed it.
//!
//! With a tier service the safe offset is the committed tiered offset
//! instead (`POST /v1/storage/.../trim`, [`crate::storage`]); the two are not
//! meant to run on the same topic.

use broker_core::metadata::{MetadataError, MetadataStore};
use broker_core::wal::{Wal, WalError};
use tracing::info;
use tributary_proto::keys::{self, SubscriptionKey, TopicName};

/// Why local retention failed.
#[derive(Debug, thiserror::Error)]
pub enum RetentionError {
    /// Reading the subscriptions' cursors failed.
    #[error("metadata: {0}")]
    Metadata(#[from] MetadataError),
    /// A stored cursor that is not an offset.
    #[error("stored cursor at {key} is {value}")]
    BadCursor {
        /// The key.
        key: String,
        /// What is stored.
        value: String,
    },
    /// Deleting segments failed.
    #[error(transparent)]
    Wal(#[from] WalError),
    /// The blocking task failed.
    #[error("retention task: {0}")]
    Task(String),
}

/// Which rule allowed a deletion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// Below the minimum persisted cursor of the durable subscriptions.
    MinimumCursor,
    /// Newest record older than the declared `max_age_ms`.
    MaxAge,
}

impl Rule {
    /// Its name in logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Rule::MinimumCursor => "minimum_cursor",
            Rule::MaxAge => "max_age",
        }
    }
}

/// What one run did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Outcome {
    /// The minimum persisted cursor over durable subscriptions (None: no
    /// durable subscription, so the cursor rule deletes nothing).
    pub min_cursor: Option<u64>,
    /// `(base_offset, next_offset, rule)` of each deleted segment.
    pub deleted: Vec<(u64, u64, Rule)>,
    /// First offset still stored afterwards.
    pub log_start: u64,
}

/// The minimum persisted cursor of `topic`'s durable subscriptions.
///
/// # Errors
/// [`RetentionError::Metadata`], [`RetentionError::BadCursor`].
pub async fn min_cursor(
    store: &dyn MetadataStore,
    topic: &TopicName,
) -> Result<Option<u64>, RetentionError> {
    let mut min: Option<u64> = None;
    for (key, value) in store
        .list(&keys::topics::subscriptions_prefix(topic))
        .await?
    {
        let Ok((_, _, SubscriptionKey::Cursor)) = keys::parse_subscription_key(&key) else {
            continue;
        };
        let cursor = value.as_u64().ok_or_else(|| RetentionError::BadCursor {
            key: key.clone(),
            value: value.to_string(),
        })?;
        min = Some(min.map_or(cursor, |m| m.min(cursor)));
    }
    Ok(min)
}

/// Applies local retention to `wal` of `topic` at `now_ms` (ms since the
/// Unix epoch): deletes the oldest sealed segments that end at or below
/// the minimum persisted cursor, or whose newest record is older than
/// `max_age_ms`, oldest first (a segment is kept, with everything after
/// it, as soon as neither rule allows it). The WAL must be opened with
/// `retention_max_bytes = Some(0)` (as [`crate::replication::topics::TopicStore`]
/// does), so the safe offset computed here decides alone.
///
/// # Errors
/// [`RetentionError`]; segments deleted before an error stay deleted.
pub async fn apply(
    store: &dyn MetadataStore,
    topic: &TopicName,
    wal: std::sync::Arc<Wal>,
    max_age_ms: Option<u64>,
    now_ms: i64,
) -> Result<Outcome, RetentionError> {
    let min_cursor = min_cursor(store, topic).await?;
    let expired_before =
        max_age_ms.map(|age| now_ms.saturating_sub(i64::try_from(age).unwrap_or(i64::MAX)));
    let mut safe = wal.log_start_offset();
    let mut rules = Vec::new();
    for segment in wal.sealed_segments() {
        let rule = if min_cursor.is_some_and(|c| segment.next_offset <= c) {
            Rule::MinimumCursor
        } else if expired_before.is_some_and(|t| segment.max_timestamp_ms < t) {
            Rule::MaxAge
        } else {
            break;
        };
        rules.push((segment.base_offset, segment.next_offset, rule));
        safe = segment.next_offset;
    }
    let report = tokio::task::spawn_blocking(move || wal.apply_retention(safe, now_ms))
        .await
        .map_err(|e| RetentionError::Task(e.to_string()))??;
    let mut deleted = Vec::new();
    for (base, next, _) in report.deleted {
        let rule = rules
            .iter()
            .find(|(b, _, _)| *b == base)
            .map_or(Rule::MinimumCursor, |(_, _, r)| *r);
        info!(%topic, base, next, rule = rule.as_str(), min_cursor, max_age_ms, "local retention (no tier service) deleted a sealed segment");
        deleted.push((base, next, rule));
    }
    Ok(Outcome {
        min_cursor,
        deleted,
        log_start: report.log_start,
    })
}

/// Runs [`apply`] on every open topic of `topics` every `interval_ms`
/// until the task is aborted; errors are logged and retried next time.
pub fn spawn(
    topics: std::sync::Arc<crate::replication::topics::TopicStore>,
    store: std::sync::Arc<dyn MetadataStore>,
    interval_ms: u64,
    max_age_ms: Option<u64>,
) -> tokio::task::JoinHandle<()> {
    info!(
        interval_ms,
        max_age_ms, "local retention without a tier service: minimum cursor rule, declared max age"
    );
    tokio::spawn(async move {
        let mut interval = tokio::time::interval(std::time::Duration::from_millis(interval_ms));
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            interval.tick().await;
            for (topic, wal) in topics.open_topics().await {
                let now = broker_core::clock::now_ms();
                if let Err(e) = apply(store.as_ref(), &topic, wal, max_age_ms, now).await {
                    tracing::warn!(%topic, error = %e, "local retention failed; retried next time");
                }
            }
        }
    })
}
