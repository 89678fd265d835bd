//! Unloading a topic: the sealed mobility marker ([`TopicState`] at
//! `{prefix}/storage/topics/{ns}/{topic}/state`), written by
//! [`unload_step`] once everything the broker stored is committed.

use broker_core::metadata::{MetadataStore, Precondition, TxnOutcome};
use serde::{Deserialize, Serialize};
use tributary_proto::keys::{StorageKeys, TopicName};

use super::commit::{check_fence, fenced};
use super::{StorageError, tiered_state};

/// The sealed mobility marker of a topic, at
/// `{prefix}/storage/topics/{ns}/{topic}/state` (JSON, field names from the
/// metadata seed), written when a topic is unloaded: every record the
/// broker stored is in committed segments, so another broker can continue
/// at `next_offset`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicState {
    /// Always true when written by an unload.
    pub sealed: bool,
    /// The last offset stored and committed (inclusive); `None` when the
    /// topic never held a record.
    pub last_committed_offset: Option<u64>,
    /// Where another broker continues: `last_committed_offset + 1`, or 0.
    pub next_offset: u64,
    /// Raft node id of the broker that unloaded the topic.
    pub broker_id: u64,
    /// When, ms since the Unix epoch.
    pub timestamp: i64,
}

/// The outcome of [`unload_step`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UnloadOutcome {
    /// Every local record is committed: the state marker was written.
    Unloaded(TopicState),
    /// Sealed, but the tier service has not committed everything yet.
    Waiting {
        /// Offset just past the last local record.
        sealed_offset: u64,
        /// The committed tiered offset.
        tiered_offset: Option<u64>,
    },
}

/// One step of an unload: with the local WAL sealed up to `local_next`
/// (`None`: no local WAL), writes the `state` marker once the committed
/// tiered offset reaches it, guarded by `segments/cur` so a concurrent
/// commit cannot slip in between the check and the write, and by `fence`
/// (the owner's assignment) when given.
///
/// # Errors
/// [`StorageError::Contended`] if `segments/cur` moved meanwhile (call
/// again); [`StorageError::Refused`] `not_owner` when the fence fails;
/// metadata errors.
pub async fn unload_step(
    store: &dyn MetadataStore,
    keys: &StorageKeys,
    topic: &TopicName,
    local_next: Option<u64>,
    broker_id: u64,
    now_ms: i64,
    fence: Option<&Precondition>,
) -> Result<UnloadOutcome, StorageError> {
    let cur_key = keys.segments_cur(topic);
    let cur_value = store.get(&cur_key).await?;
    let tiered = tiered_state(store, keys, topic).await?;
    let tiered_offset = tiered.tiered_offset.unwrap_or(0);
    let local = local_next.unwrap_or(0);
    if tiered_offset < local {
        return Ok(UnloadOutcome::Waiting {
            sealed_offset: local,
            tiered_offset: tiered.tiered_offset,
        });
    }
    let next_offset = tiered_offset.max(local);
    let state = TopicState {
        sealed: true,
        last_committed_offset: next_offset.checked_sub(1),
        next_offset,
        broker_id,
        timestamp: now_ms,
    };
    let value = serde_json::to_value(&state).map_err(|e| StorageError::Invalid(e.to_string()))?;
    let txn = fenced(fence);
    let txn = match cur_value {
        Some(v) => txn.when_equals(cur_key, v),
        None => txn.when_absent(cur_key),
    }
    .put(keys.topic_state(topic), value);
    match store.txn(txn).await? {
        TxnOutcome::Applied => Ok(UnloadOutcome::Unloaded(state)),
        TxnOutcome::ConditionFailed { key, .. } => {
            check_fence(fence, &key, topic)?;
            Err(StorageError::Contended)
        }
    }
}
