//! [`commit_descriptor`]: committing a segment descriptor the tier service
//! uploaded, with `segments/cur`, in one transaction, and only when it
//! continues the committed segments.

use broker_core::metadata::{MetadataStore, Precondition, Txn, TxnOutcome};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tributary_proto::archive::SegmentDescriptor;
use tributary_proto::keys::{StorageKeys, TopicName};

use super::{
    StorageError, TieredState, decode_descriptor, list_descriptors, retired_below, tiered_state,
};

/// The outcome of [`commit_descriptor`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CommitOutcome {
    /// Descriptor (and `cur`, when it moved) written in one transaction.
    Committed,
    /// The same object's descriptor was already committed: nothing written.
    Unchanged,
}

/// Most attempts of [`commit_descriptor`] when concurrent commits move
/// `segments/cur` under it.
const COMMIT_ATTEMPTS_MAX: usize = 8;

/// Commits `descriptor` of `topic`: the descriptor at
/// `segments/{start:020}` and, when it extends the committed range,
/// `segments/cur`, in one transaction.
///
/// Rules:
/// - the descriptor is self-consistent and its `object_id` is the
///   deterministic object key of its range;
/// - a descriptor of the same object already committed is
///   [`CommitOutcome::Unchanged`] (idempotent redo); a different one is a
///   [`StorageError::Conflict`];
/// - a descriptor past `cur` must start exactly at the `cur`
///   descriptor's next offset (no gap, no overlap), so every offset below
///   the tiered offset is in a committed segment; one below `cur` (a
///   repair) must not overlap its neighbours and leaves `cur` alone;
/// - with a `fence` (the owner's assignment,
///   [`crate::cluster::Cluster::fence`]), the transaction applies only
///   while it holds: a broker that lost the topic commits nothing.
///
/// # Errors
/// [`StorageError`] as above; [`StorageError::Refused`] with kind
/// `not_owner` when the fence fails; metadata errors.
pub async fn commit_descriptor(
    store: &dyn MetadataStore,
    keys: &StorageKeys,
    topic: &TopicName,
    descriptor: &SegmentDescriptor,
    fence: Option<&Precondition>,
) -> Result<(CommitOutcome, TieredState), StorageError> {
    descriptor
        .validate()
        .map_err(|e| StorageError::Invalid(e.to_owned()))?;
    let expected_object =
        keys.segment_object(topic, descriptor.start_offset, descriptor.end_offset);
    if descriptor.object_id != expected_object {
        return Err(StorageError::Invalid(format!(
            "object_id {:?} is not the segment's object key {expected_object:?}",
            descriptor.object_id
        )));
    }
    let key = keys.segment_descriptor(topic, descriptor.start_offset);
    let cur_key = keys.segments_cur(topic);
    let value =
        serde_json::to_value(descriptor).map_err(|e| StorageError::Invalid(e.to_string()))?;
    if let Some(below) = retired_below(store, keys, topic).await?
        && descriptor.start_offset < below
    {
        return Err(StorageError::Refused {
            kind: "retired",
            message: format!(
                "offsets below {below} were removed by cold retention; segment {}..={} is not committed again",
                descriptor.start_offset, descriptor.end_offset
            ),
        });
    }
    for _ in 0..COMMIT_ATTEMPTS_MAX {
        if let Some(existing) = store.get(&key).await? {
            let existing = decode_descriptor(&key, existing)?;
            if existing.same_object(descriptor) {
                return Ok((
                    CommitOutcome::Unchanged,
                    tiered_state(store, keys, topic).await?,
                ));
            }
            return Err(StorageError::Conflict {
                key,
                committed: Box::new(existing),
            });
        }
        let state = tiered_state(store, keys, topic).await?;
        let cur_value = store.get(&cur_key).await?;
        let not_contiguous = |reason: String| StorageError::NotContiguous {
            start: descriptor.start_offset,
            end: descriptor.end_offset,
            reason,
        };
        let moves_cur = match (state.cur, state.tiered_offset) {
            (Some(cur), Some(tiered)) if descriptor.start_offset > cur => {
                if descriptor.start_offset != tiered {
                    return Err(not_contiguous(format!(
                        "the committed segments end at offset {tiered}"
                    )));
                }
                true
            }
            (Some(_), _) => {
                // A repair below `cur`: must fit between its neighbours.
                for other in list_descriptors(store, keys, topic).await? {
                    if other.start_offset <= descriptor.end_offset
                        && descriptor.start_offset <= other.end_offset
                    {
                        return Err(not_contiguous(format!(
                            "overlaps committed segment {}..={}",
                            other.start_offset, other.end_offset
                        )));
                    }
                }
                false
            }
            (None, _) => true,
        };
        let mut txn = fenced(fence).when_absent(key.clone());
        txn = match &cur_value {
            Some(v) => txn.when_equals(cur_key.clone(), v.clone()),
            None => txn.when_absent(cur_key.clone()),
        };
        txn = txn.put(key.clone(), value.clone());
        if moves_cur {
            txn = txn.put(
                cur_key.clone(),
                Value::String(StorageKeys::segments_cur_value(descriptor.start_offset)),
            );
        }
        match store.txn(txn).await? {
            TxnOutcome::Applied => {
                let state = if moves_cur {
                    TieredState {
                        cur: Some(descriptor.start_offset),
                        tiered_offset: Some(descriptor.next_offset()),
                    }
                } else {
                    state
                };
                return Ok((CommitOutcome::Committed, state));
            }
            TxnOutcome::ConditionFailed { key: failed, .. } => {
                check_fence(fence, &failed, topic)?;
                continue;
            }
        }
    }
    Err(StorageError::Contended)
}

/// A transaction whose first precondition is `fence`, if any.
pub(crate) fn fenced(fence: Option<&Precondition>) -> Txn {
    let mut txn = Txn::new();
    txn.preconditions.extend(fence.cloned());
    txn
}

/// `Err(Refused{kind: "not_owner"})` when the precondition that failed on
/// `failed_key` is the ownership `fence`.
pub(crate) fn check_fence(
    fence: Option<&Precondition>,
    failed_key: &str,
    topic: &TopicName,
) -> Result<(), StorageError> {
    match fence {
        Some(fence) if fence.key == failed_key => Err(StorageError::Refused {
            kind: "not_owner",
            message: format!(
                "this broker no longer owns {topic} at the epoch it wrote with ({failed_key} changed); nothing was written"
            ),
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use broker_core::metadata::MetadataStore;
    use serde_json::json;

    use super::*;
    use crate::storage::tiered_offset;

    fn descriptor(
        keys: &StorageKeys,
        topic: &TopicName,
        start: u64,
        end: u64,
    ) -> SegmentDescriptor {
        let batches_bytes = 1000 + start;
        SegmentDescriptor {
            start_offset: start,
            end_offset: end,
            record_count: end - start + 1,
            size: batches_bytes + 16 + 112,
            object_id: keys.segment_object(topic, start, end),
            format_version: tributary_proto::archive::FORMAT_VERSION,
            checksum_crc32c: 7,
            batches_crc32c: 8,
            batches_bytes,
            index_position: batches_bytes,
            index_bytes: 16,
            first_timestamp_ms: 1,
            max_timestamp_ms: 2,
            created_at_ms: 3,
        }
    }

    #[test]
    fn descriptor_commits_are_idempotent_contiguous_and_move_cur() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let store = broker_core::metadata::redb::RedbStore::open(
            dir.path().join("m.redb"),
            Arc::new(broker_core::clock::ManualClock::new(1)),
        )
        .unwrap();
        let keys = StorageKeys::default();
        let topic = TopicName::new("/ns/t").unwrap();
        runtime.block_on(async {
            assert_eq!(tiered_offset(&store, &keys, &topic).await.unwrap(), None);
            let first = descriptor(&keys, &topic, 0, 99);
            let (outcome, state) = commit_descriptor(&store, &keys, &topic, &first, None)
                .await
                .unwrap();
            assert_eq!(outcome, CommitOutcome::Committed);
            assert_eq!((state.cur, state.tiered_offset), (Some(0), Some(100)));
            // A redo with another created_at is the same object.
            let mut again = first.clone();
            again.created_at_ms = 99;
            let (outcome, _) = commit_descriptor(&store, &keys, &topic, &again, None)
                .await
                .unwrap();
            assert_eq!(outcome, CommitOutcome::Unchanged);
            // Another object at the same start is a conflict.
            let mut other = first.clone();
            other.batches_crc32c ^= 1;
            assert!(matches!(
                commit_descriptor(&store, &keys, &topic, &other, None).await,
                Err(StorageError::Conflict { .. })
            ));
            // Gaps and overlaps past cur are refused.
            for (start, end) in [(101, 150), (50, 150)] {
                let d = descriptor(&keys, &topic, start, end);
                assert!(
                    matches!(
                        commit_descriptor(&store, &keys, &topic, &d, None).await,
                        Err(StorageError::NotContiguous { .. })
                    ),
                    "{start}..={end}"
                );
            }
            let second = descriptor(&keys, &topic, 100, 149);
            let (_, state) = commit_descriptor(&store, &keys, &topic, &second, None)
                .await
                .unwrap();
            assert_eq!(state.tiered_offset, Some(150));
            assert_eq!(
                store.get(&keys.segments_cur(&topic)).await.unwrap(),
                Some(json!("00000000000000000100"))
            );
            assert_eq!(
                list_descriptors(&store, &keys, &topic).await.unwrap(),
                vec![first.clone(), second]
            );
            // The object key must be the deterministic one.
            let mut wrong = descriptor(&keys, &topic, 150, 199);
            wrong.object_id = "elsewhere.seg".into();
            assert!(matches!(
                commit_descriptor(&store, &keys, &topic, &wrong, None).await,
                Err(StorageError::Invalid(_))
            ));
        });
    }
}
