//! Publishing to a topic: encoding a batch, the disk budgets (dropping
//! the oldest sealed segments under `drop_oldest`), the WAL append, and
//! the marker step of a publish with a retry check ([`Mark`],
//! `claims.rs`).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use broker_core::wal::{AppendAtOutcome, Wal, WalError};
use tracing::debug;
use tributary_proto::batch::EncodeError;
use tributary_proto::{Codec, EncodedBatch, Record, RecordBatch};

use super::{PublishAck, PublishError, Topic, TopicFull, TopicLog};
use crate::budget::{self, BudgetExceeded, FullPolicy};

/// What a marked publish runs once its content is claimed and before its
/// batch is enqueued: given the WAL's next offset (`from`), it commits the
/// request's marker ([`crate::pending`]); an error stops the publish.
pub type Mark<'a> = Box<
    dyn FnOnce(
            u64,
        ) -> std::pin::Pin<
            Box<
                dyn std::future::Future<Output = Result<(), broker_core::metadata::MetadataError>>
                    + Send
                    + 'a,
            >,
        > + Send
        + 'a,
>;

impl Topic {
    /// Publishes `records` as one batch: all are stored, with contiguous
    /// offsets, or none. Returns once durable per the sync mode.
    ///
    /// # Errors
    /// [`PublishError::Empty`], [`PublishError::TooLarge`] naming
    /// `max_record_bytes` (with the record index) or `max_batch_bytes`,
    /// [`PublishError::Full`] (budget), [`PublishError::Closed`],
    /// [`PublishError::Wal`].
    pub async fn publish(&self, records: Vec<Record>) -> Result<PublishAck, PublishError> {
        self.publish_marked(records, None).await
    }

    /// [`Topic::publish`], running `mark` first when given ([`Mark`]):
    /// no batch with the same records is enqueued between `mark`'s
    /// `from` and this batch (see `topic/claims.rs`).
    ///
    /// # Errors
    /// As [`Topic::publish`], and [`PublishError::Marker`].
    pub async fn publish_marked(
        &self,
        records: Vec<Record>,
        mark: Option<Mark<'_>>,
    ) -> Result<PublishAck, PublishError> {
        let count = records.len() as u64;
        let batch = RecordBatch {
            base_offset: 0,
            codec: Codec::None,
            records,
        };
        let encoded = batch.encode(&self.limits).map_err(|e| match e {
            EncodeError::Empty => PublishError::Empty,
            EncodeError::Limit {
                record_index,
                error,
            } => PublishError::TooLarge {
                record_index,
                limit: error,
            },
            other => PublishError::Wal {
                topic: self.name.clone(),
                source: WalError::Encode(other),
            },
        })?;
        let bytes = encoded.len() as u64;
        let ack = match &self.log {
            TopicLog::Ring(ring) => {
                if let Some(mark) = mark {
                    mark(ring.next_offset())
                        .await
                        .map_err(|source| PublishError::Marker {
                            topic: self.name.clone(),
                            source,
                        })?;
                }
                let push = ring.push(batch.records);
                if let Some((from, to)) = push.dropped {
                    debug!(topic = %self.name, from, to, "realtime ring full: dropped the oldest records");
                }
                PublishAck {
                    base_offset: push.base_offset,
                    next_offset: push.next_offset,
                    count,
                }
            }
            TopicLog::Wal(_) => self.append(encoded, count, mark).await?,
        };
        self.counters.records_in.fetch_add(count, Ordering::Relaxed);
        self.counters.bytes_in.fetch_add(bytes, Ordering::Relaxed);
        Ok(ack)
    }

    async fn append(
        &self,
        encoded: EncodedBatch,
        count: u64,
        mark: Option<Mark<'_>>,
    ) -> Result<PublishAck, PublishError> {
        let closed = || PublishError::Closed {
            topic: self.name.clone(),
        };
        let wal = self.wal().ok_or_else(closed)?;
        if let Some(refusal) = self.fault_refusal(&wal) {
            self.count_refusal(&refusal, count);
            return Err(refusal);
        }
        let bytes = encoded.len() as u64;
        if let Err(exceeded) = self.reserve(&wal, bytes).await {
            self.counters
                .refused_records
                .fetch_add(count, Ordering::Relaxed);
            return Err(exceeded);
        }
        let key = (encoded.header().crc, encoded.len());
        let enqueued = match mark {
            None => {
                let _passage = self.claims.pass(key).await;
                wal.enqueue_encoded(encoded).await
            }
            Some(mark) => {
                let _claim = self.claims.claim(key).await;
                if let Err(source) = mark(wal.next_offset()).await {
                    budget::release(&self.budget, &self.agent_budget, bytes);
                    let topic = self.name.clone();
                    return Err(PublishError::Marker { topic, source });
                }
                wal.enqueue_encoded(encoded).await
            }
        };
        let durable = match enqueued {
            Ok(pending) => pending.durable().await,
            Err(e) => Err(e),
        };
        match durable {
            Ok(AppendAtOutcome::Appended(ack) | AppendAtOutcome::Duplicate(ack)) => {
                Ok(PublishAck {
                    base_offset: ack.base_offset,
                    next_offset: ack.next_offset,
                    count,
                })
            }
            Err(source) => {
                budget::release(&self.budget, &self.agent_budget, bytes);
                let refusal = match source {
                    WalError::Closed => closed(),
                    source => self.note_failure(&wal, source),
                };
                self.count_refusal(&refusal, count);
                Err(refusal)
            }
        }
    }

    /// Reserves `bytes` against both budgets, dropping the oldest sealed
    /// segments first under `drop_oldest`.
    async fn reserve(&self, wal: &Arc<Wal>, bytes: u64) -> Result<(), PublishError> {
        let refused = |e: BudgetExceeded| {
            PublishError::Full(TopicFull {
                topic: self.name.clone(),
                scope: e.scope,
                limit_bytes: e.limit_bytes,
                used_bytes: e.used_bytes,
                batch_bytes: bytes,
                policy: self.policy.full_policy,
            })
        };
        let exceeded = match budget::reserve(&self.budget, &self.agent_budget, bytes) {
            Ok(()) => return Ok(()),
            Err(e) => e,
        };
        if self.policy.full_policy == FullPolicy::Refuse {
            // An active segment whose records are all safe gives its room
            // back (a budget lowered below what it holds); then once more.
            let freed = self
                .release_safe_active_segment(wal)
                .await
                .map_err(|source| PublishError::Wal {
                    topic: self.name.clone(),
                    source,
                })?;
            if freed > 0 && budget::reserve(&self.budget, &self.agent_budget, bytes).is_ok() {
                return Ok(());
            }
            return Err(refused(exceeded));
        }
        let _room = self.room.lock().await;
        // Nothing is dropped for a batch that would not fit even with this
        // topic empty (other topics fill the agent's budget).
        if !budget::fits_without_topic(&self.budget, &self.agent_budget, bytes) {
            return Err(refused(exceeded));
        }
        let mut rolled = false;
        let mut idle_steps = 0;
        loop {
            let exceeded = match budget::reserve(&self.budget, &self.agent_budget, bytes) {
                Ok(()) => return Ok(()),
                Err(e) => e,
            };
            let Some(oldest) = wal.sealed_segments().into_iter().next() else {
                // Everything is in the active segment: seal it once so it
                // can be dropped; after that, nothing is left to drop.
                if rolled || wal.size_bytes() == 0 {
                    return Err(refused(exceeded));
                }
                rolled = true;
                wal.roll().await.map_err(|source| PublishError::Wal {
                    topic: self.name.clone(),
                    source,
                })?;
                continue;
            };
            let report = self
                .delete_sealed_below(wal, oldest.next_offset)
                .await
                .map_err(|source| PublishError::Wal {
                    topic: self.name.clone(),
                    source,
                })?;
            if report.deleted.is_empty() {
                // Someone else deleted it (an acknowledgement) and the
                // next reservation sees the space; twice in a row means
                // retention deletes nothing, so stop rather than spin.
                idle_steps += 1;
                if idle_steps > 1 {
                    return Err(refused(exceeded));
                }
            }
            self.record_drops(&report);
        }
    }
}
