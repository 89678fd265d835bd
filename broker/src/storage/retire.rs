//! Cold retention: [`retire_descriptor`] removes the oldest committed
//! descriptor (never the `cur` one) and raises the retired low mark.

use broker_core::metadata::{MetadataStore, Txn, TxnOutcome};
use serde_json::json;
use tributary_proto::keys::{StorageKeys, TopicName};

use super::{StorageError, list_descriptors, tiered_state};

/// Cold retention: removes the descriptor at `start`, which must be the
/// oldest committed one and not the one `segments/cur` points to (the
/// newest segment is always kept, so the tiered offset stays defined and
/// the committed range stays contiguous). Guarded by a transaction on the
/// descriptor's value and `cur`. Returns the start offset of the oldest
/// descriptor left. The caller deletes the object afterwards (descriptor
/// first: a descriptor never points at a deleted object; a crash in
/// between leaves an orphan object below the oldest descriptor, which the
/// tier service's reconciliation deletes).
///
/// # Errors
/// [`StorageError::NotFound`], [`StorageError::Refused`] (`not_oldest`,
/// `is_cur`), [`StorageError::Contended`]; metadata errors.
pub async fn retire_descriptor(
    store: &dyn MetadataStore,
    keys: &StorageKeys,
    topic: &TopicName,
    start: u64,
) -> Result<u64, StorageError> {
    let key = keys.segment_descriptor(topic, start);
    let descriptors = list_descriptors(store, keys, topic).await?;
    let Some(position) = descriptors.iter().position(|d| d.start_offset == start) else {
        return Err(StorageError::NotFound { key });
    };
    if position != 0 {
        return Err(StorageError::Refused {
            kind: "not_oldest",
            message: format!(
                "the oldest committed segment starts at {}; cold retention removes segments oldest first",
                descriptors[0].start_offset
            ),
        });
    }
    let cur_key = keys.segments_cur(topic);
    let cur_value = store.get(&cur_key).await?;
    let tiered = tiered_state(store, keys, topic).await?;
    if tiered.cur == Some(start) || descriptors.len() == 1 {
        return Err(StorageError::Refused {
            kind: "is_cur",
            message: format!("{key} is the newest committed segment (segments/cur); it is kept"),
        });
    }
    let value = store
        .get(&key)
        .await?
        .ok_or_else(|| StorageError::NotFound { key: key.clone() })?;
    let txn = match cur_value {
        Some(v) => Txn::new().when_equals(cur_key, v),
        None => Txn::new().when_absent(cur_key),
    }
    .when_equals(key.clone(), value)
    .delete(key)
    .put(
        keys.retired(topic),
        json!({ "below_offset": descriptors[0].next_offset() }),
    );
    match store.txn(txn).await? {
        TxnOutcome::Applied => Ok(descriptors[1].start_offset),
        TxnOutcome::ConditionFailed { .. } => Err(StorageError::Contended),
    }
}
