//! Central publishes without duplicates: `POST /v1/topics/{ns}/{topic}/records`
//! with an `Idempotency-Key` header stores its records once per topic and
//! key for 24 h; a retry with the same key and body gets the original
//! offsets, another body with a used key is `409 idempotency_key_reused`.
//!
//! The entry `/topics/{ns}/{topic}/idempotency/{hex key}` (Raft, TTL 24 h,
//! every write fenced by the topic's ownership) goes through two states:
//!
//! 1. `pending` `{fingerprint, from, count, records_digest}`, committed
//!    before the append, `from` being the WAL's next offset then;
//! 2. the records are appended *at* `from` only ([`Wal::enqueue_at`]: a
//!    conditional append), the topic's other central appends held back
//!    from the marker's commit until then
//!    ([`TopicStore::central_order`]);
//! 3. `done` `{fingerprint, base_offset, next_offset}` once durable.
//!
//! A request that finds `pending` (its first attempt crashed, lost its
//! client, or its owner died between the steps) settles it: the records
//! at `from..from + count` (local WAL or archive) are the request's when
//! their digest is `records_digest` (only this request could append at
//! `from`), and the retry is answered with them; otherwise nothing of it
//! was stored and it is stored now. Requests with one key run one after
//! the other on the owner, and run to their end when the client goes.
//!
//! [`Wal::enqueue_at`]: broker_core::wal::Wal::enqueue_at
//! [`TopicStore::central_order`]: crate::replication::topics::TopicStore::central_order

use std::sync::{Arc, LazyLock};

use broker_core::idempotency::{KeyLocks, WINDOW_MS, records_digest};
use broker_core::metadata::TxnOutcome;
use broker_core::wal::{AppendAtOutcome, WalError};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tracing::warn;
use tributary_proto::Record;
use tributary_proto::batch::RecordBatch;
use tributary_proto::keys::{self, TopicName};

use super::records::ReadError;
use super::{ConsumerError, ConsumerService};
use crate::replication::topics::TopicError;

/// Same-key requests of this broker, one after the other.
static LOCKS: LazyLock<KeyLocks> = LazyLock::new(KeyLocks::default);

/// The stored entry of a key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case", deny_unknown_fields)]
enum Entry {
    /// Committed before the append: where the records go and what they are.
    Pending {
        fingerprint: String,
        from: u64,
        count: u64,
        records_digest: String,
    },
    /// The answer.
    Done {
        fingerprint: String,
        base_offset: u64,
        next_offset: u64,
    },
}

/// What a keyed publish answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyedPublish {
    /// First offset of the records.
    pub base_offset: u64,
    /// One past the last.
    pub next_offset: u64,
    /// True when nothing was stored by this request: an earlier one with
    /// the key stored these records.
    pub replayed: bool,
}

fn reused(topic: &TopicName, key: &str, base_offset: u64) -> ConsumerError {
    ConsumerError::Conflict {
        kind: "idempotency_key_reused",
        message: format!(
            "idempotency-key {key:?} was used on {topic} for another request within the last 24 h (its records start at offset {base_offset}); nothing stored"
        ),
    }
}

fn internal(e: impl std::fmt::Display) -> ConsumerError {
    ConsumerError::Internal(e.to_string())
}

impl ConsumerService {
    /// Publishes `records` to `topic` once per `key` (see the module doc);
    /// `fingerprint` identifies the request (its body). The work runs on
    /// its own task, so it finishes when the caller is dropped.
    ///
    /// # Errors
    /// `409 idempotency_key_reused`, `409 contended`, and those of a
    /// publish ([`ConsumerService::publish`]).
    pub async fn publish_idempotent(
        self: &Arc<Self>,
        topic: &TopicName,
        key: &str,
        fingerprint: String,
        records: Vec<Record>,
    ) -> Result<KeyedPublish, ConsumerError> {
        let this = self.clone();
        let (topic, key) = (topic.clone(), key.to_owned());
        tokio::spawn(async move { this.publish_keyed(&topic, &key, fingerprint, records).await })
            .await
            .map_err(internal)?
    }

    async fn publish_keyed(
        &self,
        topic: &TopicName,
        key: &str,
        fingerprint: String,
        records: Vec<Record>,
    ) -> Result<KeyedPublish, ConsumerError> {
        let store_key = keys::topics::idempotency(topic, key);
        let lock = LOCKS.get(&store_key);
        let _one_at_a_time = lock.lock().await;
        let stored = self.store.get(&store_key).await?;
        // An entry this version cannot read counts as absent (as at the edge).
        let entry = stored
            .clone()
            .and_then(|v| serde_json::from_value::<Entry>(v).ok());
        match entry {
            Some(Entry::Done {
                fingerprint: f,
                base_offset,
                next_offset,
            }) => {
                if f != fingerprint {
                    return Err(reused(topic, key, base_offset));
                }
                // Opened first: a new owner declares what it lost when it
                // opens the topic, and a retry may come before anything
                // else opened it (the trial of the fixes: 10 of 10 retries
                // answered with lost offsets).
                self.topics.open_existing(topic, false).await?;
                if !self.lost(topic, base_offset, next_offset).await? {
                    return Ok(KeyedPublish {
                        base_offset,
                        next_offset,
                        replayed: true,
                    });
                }
                warn!(%topic, base_offset, next_offset, "a keyed publish's records were lost with an earlier owner (a declared hole): stored again at new offsets");
            }
            Some(Entry::Pending {
                fingerprint: f,
                from,
                count,
                records_digest: digest,
            }) => {
                if f != fingerprint {
                    return Err(reused(topic, key, from));
                }
                if self.stored_at(topic, from, count, &digest).await? {
                    let next_offset = from + count;
                    self.answer(topic, &store_key, &fingerprint, from, next_offset)
                        .await?;
                    return Ok(KeyedPublish {
                        base_offset: from,
                        next_offset,
                        replayed: true,
                    });
                }
            }
            None => {}
        }
        self.topics
            .check_budget(topic)
            .await
            .map_err(|e| ConsumerError::BudgetExceeded(e.to_string()))?;
        let wal = self.topics.central_wal(topic, false).await?;
        // No other central append takes offsets while this one holds the
        // topic's order (every central append does: publishes, dead-letter
        // copies, replay), so its batch lands at `from`; the append is
        // conditional all the same, so nothing could land anywhere else.
        let order = self.topics.central_order(topic);
        let held = order.lock().await;
        let from = wal.next_offset();
        self.topics
            .reserve_central(topic, from, records.len() as u64)
            .await?;
        let pending = serde_json::to_value(Entry::Pending {
            fingerprint: fingerprint.clone(),
            from,
            count: records.len() as u64,
            records_digest: records_digest(&records),
        })
        .map_err(internal)?;
        self.claim(topic, &store_key, stored, pending).await?;
        let batch = RecordBatch {
            base_offset: from,
            codec: tributary_proto::Codec::None,
            records,
        }
        .encode(&wal.config().limits)
        .map_err(|e| ConsumerError::TooLarge(e.to_string()))?;
        let enqueued = wal.enqueue_at(batch).await;
        drop(held);
        let appended = match enqueued {
            Ok(pending) => pending.durable().await,
            Err(e) => Err(e),
        };
        match appended {
            Ok(AppendAtOutcome::Appended(ack)) => {
                self.answer(
                    topic,
                    &store_key,
                    &fingerprint,
                    ack.base_offset,
                    ack.next_offset,
                )
                .await?;
                Ok(KeyedPublish {
                    base_offset: ack.base_offset,
                    next_offset: ack.next_offset,
                    replayed: false,
                })
            }
            // Something took `from` after all: nothing of this request is
            // stored; its marker is settled by the retry.
            Ok(AppendAtOutcome::Duplicate(_))
            | Err(WalError::Overlap { .. } | WalError::Gap { .. }) => {
                Err(ConsumerError::Conflict {
                    kind: "contended",
                    message: format!(
                        "another append took offset {from} of {topic}; nothing stored, retry"
                    ),
                })
            }
            Err(e) => Err(TopicError::Wal(e).into()),
        }
    }

    /// Writes `value` at `store_key` if it still holds `current` (the
    /// value read, `None` for absent), fenced by ownership.
    async fn claim(
        &self,
        topic: &TopicName,
        store_key: &str,
        current: Option<Value>,
        value: Value,
    ) -> Result<(), ConsumerError> {
        let (txn, fence_key) = self.fenced_txn(topic)?;
        let txn = match current {
            Some(v) => txn.when_equals(store_key.to_owned(), v),
            None => txn.when_absent(store_key.to_owned()),
        }
        .put_with_ttl(store_key, value, WINDOW_MS);
        let outcome = self.store.txn(txn).await?;
        Self::check_fenced(topic, &outcome, fence_key.as_deref())?;
        match outcome {
            TxnOutcome::Applied => Ok(()),
            TxnOutcome::ConditionFailed { .. } => Err(ConsumerError::Conflict {
                kind: "contended",
                message: format!(
                    "another request with this idempotency-key on {topic} is being stored (by another broker?); nothing stored, retry"
                ),
            }),
        }
    }

    /// Records the answer (the marker becomes `done`), fenced. The records
    /// are durable already: if only the metadata write fails, the answer
    /// still goes out and the marker left is settled into the same answer
    /// by a retry; if the topic moved, the records are not served by the
    /// new owner (it started at the archive's end), so the request fails.
    async fn answer(
        &self,
        topic: &TopicName,
        store_key: &str,
        fingerprint: &str,
        base_offset: u64,
        next_offset: u64,
    ) -> Result<(), ConsumerError> {
        let done = serde_json::to_value(Entry::Done {
            fingerprint: fingerprint.to_owned(),
            base_offset,
            next_offset,
        })
        .map_err(internal)?;
        let (txn, fence_key) = self.fenced_txn(topic)?;
        let txn = txn.put_with_ttl(store_key, done, WINDOW_MS);
        match self.store.txn(txn).await {
            Ok(outcome) => Self::check_fenced(topic, &outcome, fence_key.as_deref()),
            Err(e) => {
                warn!(%topic, error = %e, base_offset, next_offset, "stored a keyed publish but could not record its answer; a retry settles it");
                Ok(())
            }
        }
    }

    /// Whether a declared hole of cause `lost` overlaps `base..next` of
    /// `topic`: the records an entry answered with were lost with an
    /// earlier owner before the archive had them (the new owner declared
    /// the offsets a hole), so the entry's answer no longer holds.
    ///
    /// # Errors
    /// Metadata errors.
    async fn lost(&self, topic: &TopicName, base: u64, next: u64) -> Result<bool, ConsumerError> {
        let lost = tributary_proto::replication::frame::HoleCause::Lost.as_str();
        Ok(self
            .topics
            .holes(topic)
            .await?
            .iter()
            .any(|h| h.cause == lost && h.first_offset < next && base < h.end_offset))
    }

    /// Whether `from..from + count` of `topic` holds records whose digest
    /// is `digest` (read from the WAL, or the archive below it). Records
    /// no copy holds (lost with a previous owner before the archive had
    /// them) are not stored.
    ///
    /// # Errors
    /// Read failures other than offsets that are gone.
    async fn stored_at(
        &self,
        topic: &TopicName,
        from: u64,
        count: u64,
        digest: &str,
    ) -> Result<bool, ConsumerError> {
        let wal = self.topics.open_existing(topic, false).await?;
        if from.saturating_add(count) > wal.high_water_mark() {
            return Ok(false);
        }
        let want = usize::try_from(count).map_err(internal)?;
        let mut gaps = Vec::new();
        let read =
            super::tiered::read_range(&wal, self.archive(), topic, from, want, &mut gaps).await;
        let got = match read {
            Ok(got) => got,
            Err(ReadError::NotArchived { .. } | ReadError::Tiered { .. }) => return Ok(false),
            Err(e) => return Err(e.into()),
        };
        let offsets_match = got.len() == want
            && got
                .iter()
                .zip(from..)
                .all(|((offset, _), expected)| *offset == expected);
        let records: Vec<Record> = got.into_iter().map(|(_, r)| r).collect();
        Ok(offsets_match && records_digest(&records) == digest)
    }
}
