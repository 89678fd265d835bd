//! The holes of a topic recorded in Raft (`/topics/{ns}/{topic}/holes/`):
//! declared by an edge or by an operator skipping a damaged range, and
//! re-applied to the WAL when the topic is opened.

use broker_core::catalog::CatalogError;
use broker_core::metadata::MetadataStore;
use broker_core::wal::Wal;
use tributary_proto::keys::TopicName;
use tributary_proto::replication::frame::HoleCause;
use tributary_proto::replication::hole::HoleRecord;

use super::{TopicError, TopicStore};

/// The holes declared for `topic` in `store`, by first offset (entries
/// that do not decode are skipped with a warning).
///
/// # Errors
/// Metadata errors.
pub async fn list_holes(
    store: &dyn MetadataStore,
    topic: &TopicName,
) -> Result<Vec<HoleRecord>, TopicError> {
    let prefix = tributary_proto::keys::topics::holes_prefix(topic);
    let entries = store.list(&prefix).await.map_err(CatalogError::from)?;
    Ok(entries
        .into_iter()
        .filter_map(|(key, value)| match serde_json::from_value(value) {
            Ok(hole) => Some(hole),
            Err(e) => {
                tracing::warn!(%key, error = %e, "skipping a hole record that does not decode");
                None
            }
        })
        .collect())
}

impl TopicStore {
    /// Records the hole an edge declared in Raft at
    /// `/topics/{ns}/{topic}/holes/{first_offset:020}`. Idempotent: a hole
    /// already recorded with the same range (the edge declared it again
    /// after a reconnect, before the WAL skipped it) keeps its first record.
    ///
    /// # Errors
    /// [`TopicError::Conflict`] if another range is recorded at the same
    /// first offset; metadata errors.
    pub async fn record_hole(
        &self,
        topic: &TopicName,
        hole: &HoleRecord,
    ) -> Result<(), TopicError> {
        let key = tributary_proto::keys::topics::hole(topic, hole.first_offset);
        let value = serde_json::to_value(hole).map_err(|e| {
            CatalogError::from(broker_core::metadata::MetadataError::Encode {
                key: key.clone(),
                source: e,
            })
        })?;
        let txn = broker_core::metadata::Txn::new()
            .when_absent(key.clone())
            .put(key.clone(), value);
        match self.store.txn(txn).await.map_err(CatalogError::from)? {
            broker_core::metadata::TxnOutcome::Applied => Ok(()),
            broker_core::metadata::TxnOutcome::ConditionFailed { current, .. } => {
                let known: Option<HoleRecord> =
                    current.and_then(|v| serde_json::from_value(v).ok());
                match known {
                    Some(known) if known.same_range(hole) => Ok(()),
                    other => Err(TopicError::Conflict {
                        topic: topic.clone(),
                        central: format!("a recorded hole {other:?}"),
                        edge: format!("a hole {}..{}", hole.first_offset, hole.end_offset),
                    }),
                }
            }
        }
    }

    /// The holes declared for `topic`, by first offset (entries that do
    /// not decode are skipped with a warning).
    ///
    /// # Errors
    /// Metadata errors.
    pub async fn holes(&self, topic: &TopicName) -> Result<Vec<HoleRecord>, TopicError> {
        list_holes(self.store.as_ref(), topic).await
    }

    /// Makes the WAL read every hole recorded with cause `damaged` as a
    /// declared hole: damaged ranges an operator skipped
    /// (`tribctl topics skip-damaged`) stay skipped across restarts, and a
    /// segment still holding their bytes (a crash right after the Raft
    /// record) is rewritten without them. (For a hole an edge declared,
    /// the WAL holds no bytes: nothing is rewritten.)
    pub(super) async fn reapply_skipped(
        &self,
        topic: &TopicName,
        wal: &Wal,
    ) -> Result<(), TopicError> {
        for hole in self.holes(topic).await? {
            if hole.cause == HoleCause::Damaged.as_str()
                && hole.end_offset > wal.log_start_offset()
                && let Err(e) = wal.skip_damaged(hole.first_offset, hole.end_offset).await
            {
                tracing::warn!(%topic, first_offset = hole.first_offset, end_offset = hole.end_offset, error = %e, "a skipped damaged range reads as a hole, but its segment could not be rewritten");
            }
        }
        Ok(())
    }
}
