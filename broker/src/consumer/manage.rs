//! Operations on a subscription as a whole (seek, pause and resume,
//! unsubscribe, state) and on a topic without one (central publish, peek).

use broker_core::catalog::{Catalog, CatalogError};
use broker_core::metadata::Txn;
use tracing::info;
use tributary_api::consumer::{
    Message, ReceiveResponse, StartPosition, SubscriptionState, ValueEncoding,
};
use tributary_proto::Record;
use tributary_proto::keys::{self, SubscriptionName, TopicName};

use super::{
    ConsumerError, ConsumerService, SubscriptionMeta, invalid, records, subscription_name, tiered,
};

impl ConsumerService {
    /// Moves the cursor of `subscription` to `offset` or the first message
    /// at `timestamp_ms`; forgets leases and redeliveries and lifts a block.
    /// The cursor is written to Raft at once.
    ///
    /// # Errors
    /// [`ConsumerError::Invalid`] unless exactly one is given, or for a
    /// timestamp out of range (negative, or beyond year 9999: the rule of
    /// record timestamps); [`ConsumerError::OffsetOutOfRange`] (naming the
    /// whole readable range, archive included);
    /// [`ConsumerError::NotFound`].
    pub async fn seek(
        &self,
        topic: &TopicName,
        subscription: &str,
        offset: Option<u64>,
        timestamp_ms: Option<i64>,
    ) -> Result<u64, ConsumerError> {
        let name = subscription_name(subscription)?;
        let start = match (offset, timestamp_ms) {
            (Some(o), None) => StartPosition::Offset(o),
            (None, Some(t)) => StartPosition::Timestamp(
                tributary_proto::limits::check_timestamp_ms(t)
                    .map_err(|why| invalid("timestamp_ms", format!("timestamp_ms: {why}")))?,
            ),
            _ => {
                return Err(invalid(
                    "offset",
                    "give exactly one of offset and timestamp_ms",
                ));
            }
        };
        let loaded = self.loaded_fresh(topic, &name).await?;
        match loaded {
            Some(sub) => {
                let cursor = self.start_cursor(&sub.topic, &sub.wal(), start).await?;
                let mut st = sub.state.lock().await;
                st.seek(cursor);
                self.persist(&sub, &mut st, true).await;
                sub.changed.notify_waiters();
                info!(%topic, subscription = %name, cursor, "seek");
                Ok(cursor)
            }
            None => {
                self.stored_meta(topic, &name).await?;
                let wal = self.topics.open_existing(topic, false).await?;
                let cursor = self.start_cursor(topic, &wal, start).await?;
                // A seek forgets what was finished above the old cursor.
                self.put_cursor(topic, &name, cursor, &[]).await?;
                info!(%topic, subscription = %name, cursor, "seek (subscription not loaded)");
                Ok(cursor)
            }
        }
    }

    async fn stored_meta(
        &self,
        topic: &TopicName,
        name: &SubscriptionName,
    ) -> Result<SubscriptionMeta, ConsumerError> {
        let key = keys::topics::subscription(topic, name);
        match self.store.get(&key).await? {
            Some(v) => serde_json::from_value(v)
                .map_err(|e| ConsumerError::Internal(format!("stored subscription at {key}: {e}"))),
            None => Err(self.no_subscription(topic, name).await),
        }
    }

    /// The 404 for a subscription that does not exist: naming the topic
    /// when that does not exist either (it named the subscription only).
    async fn no_subscription(&self, topic: &TopicName, name: &SubscriptionName) -> ConsumerError {
        let missing_topic = matches!(
            Catalog::new(self.store.as_ref())
                .partition_count(topic)
                .await,
            Err(CatalogError::TopicNotFound { .. })
        );
        ConsumerError::NotFound(if missing_topic {
            format!("topic {topic} does not exist")
        } else {
            format!("subscription {name} of {topic} does not exist")
        })
    }

    /// Pauses (`true`) or resumes a subscription; stored for durable ones.
    ///
    /// # Errors
    /// [`ConsumerError::NotFound`].
    pub async fn set_paused(
        &self,
        topic: &TopicName,
        subscription: &str,
        paused: bool,
    ) -> Result<(), ConsumerError> {
        let name = subscription_name(subscription)?;
        let loaded = self.loaded_fresh(topic, &name).await?;
        let durable = match &loaded {
            Some(sub) => sub.durable,
            None => {
                self.stored_meta(topic, &name).await?;
                true
            }
        };
        if durable {
            let key = keys::topics::subscription(topic, &name);
            let mut meta = self.stored_meta(topic, &name).await?;
            meta.paused = paused;
            let value =
                serde_json::to_value(&meta).map_err(|e| ConsumerError::Internal(e.to_string()))?;
            self.store.put(&key, value).await?;
        }
        if let Some(sub) = loaded {
            sub.state.lock().await.set_paused(paused);
            sub.changed.notify_waiters();
        }
        info!(%topic, subscription = %name, paused, "subscription paused/resumed");
        Ok(())
    }

    /// Removes a subscription: its keys in Raft and its consumers' sessions.
    ///
    /// # Errors
    /// [`ConsumerError::NotFound`].
    pub async fn unsubscribe(
        &self,
        topic: &TopicName,
        subscription: &str,
    ) -> Result<(), ConsumerError> {
        let name = subscription_name(subscription)?;
        let loaded = self
            .subs
            .lock()
            .await
            .remove(&(topic.clone(), name.clone()));
        let meta_key = keys::topics::subscription(topic, &name);
        let stored = self.store.get(&meta_key).await?.is_some();
        if loaded.is_none() && !stored {
            return Err(self.no_subscription(topic, &name).await);
        }
        if let Some(sub) = loaded {
            sub.state.lock().await.remove();
            sub.changed.notify_waiters();
        }
        if stored {
            let txn = Txn::new()
                .delete(meta_key)
                .delete(keys::topics::subscription_cursor(topic, &name))
                .delete(keys::topics::subscription_acked(topic, &name))
                .delete(keys::topics::subscription_failure_policy(topic, &name))
                .delete(keys::topics::subscription_dispatch_config(topic, &name));
            let _ = self.store.txn(txn).await?;
        }
        info!(%topic, subscription = %name, "unsubscribed");
        Ok(())
    }

    /// The state of a subscription (loaded, or as stored).
    ///
    /// # Errors
    /// [`ConsumerError::NotFound`].
    pub async fn state(
        &self,
        topic: &TopicName,
        subscription: &str,
    ) -> Result<SubscriptionState, ConsumerError> {
        let name = subscription_name(subscription)?;
        let loaded = self.loaded_fresh(topic, &name).await?;
        if let Some(sub) = loaded {
            let st = sub.state.lock().await;
            let dispatcher = st.dispatcher();
            let (blocked_at, damaged) = self.halt_view(&st);
            return Ok(SubscriptionState {
                topic: topic.to_string(),
                subscription: name.to_string(),
                subscription_type: st.meta().subscription_type,
                durable: sub.durable,
                paused: st.meta().paused,
                cursor: dispatcher.cursor(),
                persisted_cursor: dispatcher.persisted_cursor(),
                high_water_mark: sub.wal().high_water_mark(),
                in_flight: dispatcher.in_flight() as u64,
                blocked_at,
                damaged,
                dead_letter_refused: st.dead_letter_refused().map(str::to_owned),
                consumers: st.consumers(),
                failure_policy: dispatcher.policy().clone(),
            });
        }
        let meta = self.stored_meta(topic, &name).await?;
        let cursor = self
            .store
            .get(&keys::topics::subscription_cursor(topic, &name))
            .await?
            .and_then(|v| v.as_u64())
            .unwrap_or(0);
        let wal = self.topics.open_existing(topic, false).await?;
        let policy = Catalog::new(self.store.as_ref())
            .failure_policy(topic, &name)
            .await?
            .policy;
        Ok(SubscriptionState {
            topic: topic.to_string(),
            subscription: name.to_string(),
            subscription_type: meta.subscription_type,
            durable: true,
            paused: meta.paused,
            cursor,
            persisted_cursor: cursor,
            high_water_mark: wal.high_water_mark(),
            in_flight: 0,
            blocked_at: None,
            damaged: None,
            dead_letter_refused: None,
            consumers: Vec::new(),
            failure_policy: policy,
        })
    }

    /// Publishes `records` to `topic` centrally.
    ///
    /// # Errors
    /// [`ConsumerError::NotFound`], [`ConsumerError::Conflict`]
    /// (`writer_conflict`: an edge replicates into the topic),
    /// [`ConsumerError::BudgetExceeded`] (nothing stored),
    /// [`ConsumerError::DiskFull`].
    pub async fn publish(
        &self,
        topic: &TopicName,
        records: Vec<Record>,
    ) -> Result<(u64, u64), ConsumerError> {
        self.topics
            .check_budget(topic)
            .await
            .map_err(|e| ConsumerError::BudgetExceeded(e.to_string()))?;
        let ack = self.topics.append_central(topic, records, false).await?;
        Ok((ack.base_offset, ack.next_offset))
    }

    /// The ownership epoch this broker writes `topic` under now (`None`
    /// without cluster ownership): what [`Self::wait_archived`] compares.
    pub fn write_epoch(&self, topic: &TopicName) -> Option<u64> {
        self.topics.opened_epoch(topic)
    }

    /// Waits until the committed archive of `topic` (`segments/cur`)
    /// reaches `next_offset`, at most `limit`: the `ack=archived` publish
    /// of a central-written topic, which has no edge copy. Returns whether
    /// it did.
    ///
    /// # Errors
    /// [`ConsumerError::Internal`] for a malformed `segments/cur`.
    ///
    /// `epoch` is the ownership epoch the records were appended under
    /// ([`Self::write_epoch`]): once the topic has another epoch, a new
    /// owner took it over at the archive's end, so records not archived by
    /// then are not stored anywhere: [`ConsumerError::OwnerChanged`].
    pub async fn wait_archived(
        &self,
        topic: &TopicName,
        base_offset: u64,
        next_offset: u64,
        epoch: Option<u64>,
        limit: std::time::Duration,
    ) -> Result<bool, ConsumerError> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            // The epoch first, then the archive: an archive read after the
            // change is the one the new owner started from.
            let moved_to = match (epoch, self.topics.cluster()) {
                (Some(epoch), Some(cluster)) => {
                    cluster.owner(topic).filter(|(_, now)| *now != epoch)
                }
                _ => None,
            };
            let archived = crate::storage::tiered_offset(
                self.topics.store().as_ref(),
                self.topics.storage_keys(),
                topic,
            )
            .await
            .map_err(|e| ConsumerError::Internal(e.to_string()))?
            .unwrap_or(0);
            if archived >= next_offset {
                return Ok(true);
            }
            if let Some((owner, now_epoch)) = moved_to {
                return Err(ConsumerError::OwnerChanged(format!(
                    "records {base_offset}..{next_offset} of {topic} were not archived (the archive ends at {archived}) when broker {owner} took the topic over at epoch {now_epoch} (they were written at epoch {}): they are not stored, re-publish them",
                    epoch.unwrap_or_default()
                )));
            }
            if tokio::time::Instant::now() >= deadline {
                return Ok(false);
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    }

    /// Up to `max` records of `topic` from `offset` (default: the log start).
    ///
    /// # Errors
    /// [`ConsumerError::NotFound`], [`ConsumerError::OffsetOutOfRange`].
    pub async fn peek(
        &self,
        topic: &TopicName,
        offset: Option<u64>,
        max: u32,
        encoding: ValueEncoding,
    ) -> Result<ReceiveResponse, ConsumerError> {
        let wal = self.topics.open_existing(topic, false).await?;
        let hwm = wal.high_water_mark();
        let log_start = tiered::log_start(&wal, self.archive(), topic).await?;
        let from = offset.unwrap_or(log_start);
        if from < log_start || from > hwm {
            return Err(ConsumerError::OffsetOutOfRange {
                offset: from,
                log_start,
                high_water_mark: hwm,
            });
        }
        let limit = max as usize;
        let mut gaps = Vec::new();
        let found = tiered::read_range(&wal, self.archive(), topic, from, limit, &mut gaps).await?;
        // A damaged range ends the read: the good records before it, or,
        // when the read starts in it, a typed error naming it.
        super::damage::refuse_a_read_that_starts_damaged(found.is_empty(), &mut gaps)?;
        let messages: Vec<Message> = found
            .iter()
            .map(|(o, r)| records::to_message(*o, r, encoding))
            .collect();
        let next = messages
            .last()
            .map_or(from, |m| m.offset + 1)
            .max(gaps.last().map_or(from, |g| g.end_offset));
        Ok(ReceiveResponse {
            messages,
            cursor: next,
            high_water_mark: hwm,
            active: true,
            paused: false,
            blocked_at: None,
            gaps,
            damaged: None,
        })
    }
}
