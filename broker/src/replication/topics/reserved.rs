//! The offsets central writers have taken, kept in Raft so that no owner
//! hands one out twice.
//!
//! A centrally written topic (consumer-API publishes, dead-letter copies,
//! DLQ replay) has no edge copy: an owner that dies before the tier service
//! archived its tail takes those records with it, and the next owner starts
//! at the archive's end. Without a record of what the dead owner had
//! assigned, the new owner would hand the same offsets out again, to other
//! records — a consumer that had read offset 1812 would find another record
//! there, and a retried `Idempotency-Key` publish would be answered with
//! offsets that hold someone else's records.
//!
//! So before a central append takes offsets past what is reserved, the
//! owner raises `reserved_end` in the central writer's marker
//! (`/topics/{ns}/{topic}/producers/1` = `{"kind": "central",
//! "reserved_end": N}`) in a Raft transaction fenced by its ownership:
//! every offset ever handed out is below `reserved_end`. It reserves
//! [`RESERVE_AHEAD`] offsets beyond the append, so one Raft write serves
//! many appends. A new owner whose start offset (the archive's end) is
//! below `reserved_end` records `start..reserved_end` as a declared hole
//! (cause `lost`) and skips its WAL past it: consumers get one gap notice,
//! the archive shows the hole, and offsets continue at `reserved_end`. The
//! hole may include offsets that were reserved but never used.

use broker_core::catalog::CatalogError;
use broker_core::metadata::{Txn, TxnOutcome};
use serde_json::{Value, json};
use tributary_proto::keys::TopicName;
use tributary_proto::replication::frame::HoleCause;
use tributary_proto::replication::hole::HoleRecord;

use super::{TopicError, TopicStore, Writer};

/// Offsets one reservation takes beyond the append that needs it.
pub const RESERVE_AHEAD: u64 = 4096;

/// `reserved_end` of a central writer marker's value (0 when absent: a
/// marker written before reservations existed).
fn reserved_end(marker: Option<&Value>) -> u64 {
    marker
        .and_then(|v| v.get("reserved_end"))
        .and_then(Value::as_u64)
        .unwrap_or(0)
}

impl TopicStore {
    /// Makes sure `count` offsets from `next` (the WAL's next offset) are
    /// reserved before a central append of `topic` takes them; called
    /// under [`TopicStore::central_order`], so `next` is where the append
    /// lands. A no-op without a cluster (nobody else could take the topic
    /// over) and, after the first reservation, for every append inside it.
    ///
    /// # Errors
    /// [`TopicError::NoOwner`] when this broker no longer owns `topic` at
    /// the epoch its WAL was opened under (nothing was appended); metadata
    /// errors.
    pub async fn reserve_central(
        &self,
        topic: &TopicName,
        next: u64,
        count: u64,
    ) -> Result<(), TopicError> {
        let Some(cluster) = self.cluster.get() else {
            return Ok(());
        };
        let Some(epoch) = self.epoch_of(topic) else {
            return Ok(());
        };
        let end = next.saturating_add(count);
        if self.reserved_cached(topic, epoch).is_some_and(|r| end <= r) {
            return Ok(());
        }
        let key = Writer::Central.marker_key(topic);
        for _ in 0..3 {
            let current = self.store.get(&key).await.map_err(CatalogError::from)?;
            let stored = reserved_end(current.as_ref());
            if end <= stored {
                self.cache_reserved(topic, epoch, stored);
                return Ok(());
            }
            let fence = cluster.fence(topic, epoch).ok_or_else(|| {
                TopicError::NoOwner(format!(
                    "broker {} no longer owns {topic} at epoch {epoch}",
                    cluster.me()
                ))
            })?;
            let fence_key = fence.key.clone();
            let new_end = end.saturating_add(RESERVE_AHEAD);
            let mut txn = Txn::new();
            txn.preconditions.push(fence);
            let txn = match current {
                Some(v) => txn.when_equals(key.clone(), v),
                None => txn.when_absent(key.clone()),
            }
            .put(
                key.clone(),
                json!({"kind": Writer::Central.as_str(), "reserved_end": new_end}),
            );
            match self.store.txn(txn).await.map_err(CatalogError::from)? {
                TxnOutcome::Applied => {
                    self.cache_reserved(topic, epoch, new_end);
                    return Ok(());
                }
                TxnOutcome::ConditionFailed { key, .. } if key == fence_key => {
                    return Err(TopicError::NoOwner(format!(
                        "broker {} lost ownership of {topic} ({key} changed); nothing was appended",
                        cluster.me()
                    )));
                }
                TxnOutcome::ConditionFailed { .. } => {}
            }
        }
        Err(TopicError::NoOwner(format!(
            "the offset reservation of {topic} kept changing; nothing was appended, retry"
        )))
    }

    /// For a new owner of `topic` starting a fresh WAL at `start` at
    /// `epoch`: the end of the offsets an earlier owner may have handed
    /// out, when it lies past `start`, after recording `start..end` as a
    /// declared hole (cause `lost`) in Raft. The caller skips the WAL to
    /// it before serving. `None` when nothing was reserved past `start`.
    ///
    /// # Errors
    /// Metadata errors; [`TopicError::Conflict`] if a recorded hole
    /// disagrees.
    pub(super) async fn takeover_hole(
        &self,
        topic: &TopicName,
        start: u64,
        epoch: u64,
    ) -> Result<Option<u64>, TopicError> {
        if self.cluster.get().is_none() {
            return Ok(None);
        }
        let marker = self
            .store
            .get(&Writer::Central.marker_key(topic))
            .await
            .map_err(CatalogError::from)?;
        let reserved = reserved_end(marker.as_ref());
        if reserved <= start {
            return Ok(None);
        }
        // An earlier takeover may have recorded part of it already (from
        // the same start): record only what follows the recorded chain.
        let mut covered = start;
        for hole in self.holes(topic).await? {
            if hole.first_offset <= covered && hole.end_offset > covered {
                covered = hole.end_offset;
            }
        }
        if covered < reserved {
            let reason = format!(
                "offsets an earlier owner of this centrally written topic reserved before epoch {epoch} and the archive does not hold (lost with that owner's copy, or never used)"
            );
            let now = broker_core::clock::now_ms();
            self.record_hole(
                topic,
                &HoleRecord::new(covered, reserved, HoleCause::Lost, reason, now),
            )
            .await?;
        }
        tracing::warn!(%topic, epoch, first_offset = start, end_offset = reserved, "a centrally written topic's earlier owner reserved offsets the archive does not hold: they are a declared hole, and offsets continue after it (none is handed out twice)");
        self.cache_reserved(topic, epoch, reserved);
        Ok(Some(reserved))
    }

    fn epoch_of(&self, topic: &TopicName) -> Option<u64> {
        self.epochs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(topic)
            .copied()
    }

    fn reserved_cached(&self, topic: &TopicName, epoch: u64) -> Option<u64> {
        self.reserved
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(topic)
            .and_then(|&(e, end)| (e == epoch).then_some(end))
    }

    fn cache_reserved(&self, topic: &TopicName, epoch: u64, end: u64) {
        self.reserved
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(topic.clone(), (epoch, end));
    }
}
