//! Central appends (consumer API publishes, dead-letter copies, DLQ
//! replay): which kind of writer feeds a topic, the checks before a
//! central append, and the order in which central appends take offsets.

use std::sync::Arc;

use broker_core::catalog::{Catalog, CatalogError};
use broker_core::metadata::MetadataStore;
use broker_core::wal::{Wal, WalError};
use tokio::sync::Mutex;
use tributary_proto::keys::TopicName;

use super::{TopicError, TopicStore};

/// Producer id of the writer marker of a topic fed by edge replication
/// (`/topics/{ns}/{topic}/producers/0`).
pub const EDGE_PRODUCER_ID: u64 = 0;
/// Producer id of the writer marker of a topic written centrally
/// (`/topics/{ns}/{topic}/producers/1`).
pub const CENTRAL_PRODUCER_ID: u64 = 1;

/// Who appends to a topic; a topic has one kind (see
/// [`TopicStore::claim_writer`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Writer {
    /// An edge replicates into it (offsets assigned by the edge).
    Edge,
    /// The broker appends (consumer API publish, dead-letter copies, replay).
    Central,
}

impl Writer {
    /// `edge_replication` or `central`.
    pub fn as_str(self) -> &'static str {
        match self {
            Writer::Edge => "edge_replication",
            Writer::Central => "central",
        }
    }

    /// This kind's writer marker of `topic`:
    /// `/topics/{ns}/{topic}/producers/{`[`EDGE_PRODUCER_ID`]` or `[`CENTRAL_PRODUCER_ID`]`}`.
    pub fn marker_key(self, topic: &TopicName) -> String {
        let id = match self {
            Writer::Edge => EDGE_PRODUCER_ID,
            Writer::Central => CENTRAL_PRODUCER_ID,
        };
        tributary_proto::keys::topics::producer(topic, id)
    }

    /// Whether this kind writes `topic` (its marker is stored).
    ///
    /// # Errors
    /// Metadata errors.
    pub async fn writes(
        self,
        store: &dyn MetadataStore,
        topic: &TopicName,
    ) -> Result<bool, broker_core::metadata::MetadataError> {
        Ok(store.get(&self.marker_key(topic)).await?.is_some())
    }
}

impl TopicStore {
    /// Records in Raft which kind of writer feeds `topic`, refusing the other
    /// kind: an edge assigns a topic's offsets itself and the broker stores
    /// its batches only at the next expected offset, so a record appended
    /// centrally in between would make the edge's batch at that offset look
    /// like a duplicate and be dropped. The marker is
    /// `/topics/{ns}/{topic}/producers/{id}` with id [`EDGE_PRODUCER_ID`] or
    /// [`CENTRAL_PRODUCER_ID`]; one Raft transaction writes it only while
    /// the other is absent.
    ///
    /// # Errors
    /// [`TopicError::Conflict`] when the other kind already writes the
    /// topic; metadata errors.
    pub async fn claim_writer(&self, topic: &TopicName, writer: Writer) -> Result<(), TopicError> {
        let other = match writer {
            Writer::Edge => Writer::Central,
            Writer::Central => Writer::Edge,
        };
        let own_key = writer.marker_key(topic);
        let other_key = other.marker_key(topic);
        let conflict = |topic: &TopicName| {
            TopicError::WriterConflict {
            topic: topic.clone(),
            reason: match writer {
                Writer::Edge => "it holds records published centrally (consumer API, dead-letter copies), so an edge cannot replicate into it: give the edge's topic another name".into(),
                Writer::Central => "an edge replicates into it, so it takes no central publish (the edge assigns its offsets): publish at the edge, or to another topic".into(),
            },
        }
        };
        for _ in 0..3 {
            if writer
                .writes(self.store.as_ref(), topic)
                .await
                .map_err(CatalogError::from)?
            {
                return Ok(());
            }
            let txn = broker_core::metadata::Txn::new()
                .when_absent(other_key.clone())
                .when_absent(own_key.clone())
                .put(
                    own_key.clone(),
                    serde_json::json!({"kind": writer.as_str()}),
                );
            match self.store.txn(txn).await.map_err(CatalogError::from)? {
                broker_core::metadata::TxnOutcome::Applied => return Ok(()),
                broker_core::metadata::TxnOutcome::ConditionFailed { key, .. }
                    if key == other_key =>
                {
                    return Err(conflict(topic));
                }
                broker_core::metadata::TxnOutcome::ConditionFailed { .. } => {}
            }
        }
        Ok(())
    }

    /// Appends `records` to `topic` with offsets assigned here (central
    /// publish, dead-letter copies, DLQ replay) once durable per the topic's
    /// sync mode. Refused for a partitioned topic (its partitions take the
    /// records), for a topic an edge replicates into (see
    /// [`TopicStore::claim_writer`]), and for a topic that already holds
    /// records but has no writer marker (written by an edge before markers
    /// existed).
    ///
    /// # Errors
    /// [`TopicError::Conflict`], [`TopicError::Catalog`] (unknown topic
    /// unless `create_implicit`), [`TopicError::Wal`].
    pub async fn append_central(
        &self,
        topic: &TopicName,
        records: Vec<tributary_proto::Record>,
        create_implicit: bool,
    ) -> Result<broker_core::wal::AppendAck, TopicError> {
        let wal = self.central_wal(topic, create_implicit).await?;
        let count = records.len() as u64;
        let batch = tributary_proto::batch::RecordBatch {
            base_offset: 0,
            codec: tributary_proto::Codec::None,
            records,
        }
        .encode(&wal.config().limits)
        .map_err(WalError::from)?;
        let order = self.central_order(topic);
        let held = order.lock().await;
        self.reserve_central(topic, wal.next_offset(), count)
            .await?;
        let pending = wal.enqueue_encoded(batch).await?;
        drop(held);
        match pending.durable().await? {
            broker_core::wal::AppendAtOutcome::Appended(ack)
            | broker_core::wal::AppendAtOutcome::Duplicate(ack) => Ok(ack),
        }
    }

    /// The lock every central append of `topic` holds while it takes its
    /// offsets (not while it waits for durability): a publish with an
    /// `Idempotency-Key` holds it from the commit of its marker, which
    /// names the next offset, until its batch is enqueued at exactly that
    /// offset, so no other central append lands there in between.
    pub fn central_order(&self, topic: &TopicName) -> Arc<Mutex<()>> {
        self.central_order.get(topic.as_ref())
    }

    /// The WAL of `topic` for an append with offsets assigned here, after
    /// the checks of [`TopicStore::append_central`] (and the central writer
    /// claimed).
    ///
    /// # Errors
    /// As [`TopicStore::append_central`].
    pub async fn central_wal(
        &self,
        topic: &TopicName,
        create_implicit: bool,
    ) -> Result<Arc<Wal>, TopicError> {
        let marked = Writer::Central
            .writes(self.store.as_ref(), topic)
            .await
            .map_err(CatalogError::from)?;
        if !marked {
            // Checked once, before the first central write claims the
            // topic (the writer marker) and before its WAL is opened.
            let partitions = match Catalog::new(self.store.as_ref())
                .partition_count(topic)
                .await
            {
                Err(CatalogError::TopicNotFound { .. }) if create_implicit => 0,
                other => other?,
            };
            if partitions > 0 {
                return Err(TopicError::WriterConflict {
                    topic: topic.clone(),
                    reason: format!(
                        "it is partitioned into {partitions}: publish to one of its partitions {} … {} (chosen by key, for example), not to the topic itself",
                        topic
                            .partition(0)
                            .map_or_else(|_| "-part-0".into(), |p| p.to_string()),
                        topic.partition(partitions - 1).map_or_else(
                            |_| format!("-part-{}", partitions - 1),
                            |p| p.to_string()
                        ),
                    ),
                });
            }
        }
        let wal = self.open_existing(topic, create_implicit).await?;
        if !marked && wal.high_water_mark() > 0 {
            return Err(TopicError::WriterConflict {
                topic: topic.clone(),
                reason: format!(
                    "this broker holds {} records of it that no central publish wrote (an edge's, or those of a deleted topic of the same name, whose local copy stays): it takes no central publish; publish to another topic",
                    wal.high_water_mark()
                ),
            });
        }
        self.claim_writer(topic, Writer::Central).await?;
        Ok(wal)
    }
}
