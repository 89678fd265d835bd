//! Attaching and detaching consumer sessions, and loading or creating a
//! subscription on first attach (stored metadata, cursor, failure policy,
//! start position).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use broker_core::catalog::{Catalog, CatalogError};
use broker_core::metadata::TxnOutcome;
use broker_core::wal::Wal;
use serde_json::json;
use tokio::sync::{Mutex, Notify};
use tracing::{info, warn};
use tributary_api::admin::PolicySource;
use tributary_api::consumer::{AttachRequest, AttachResponse, StartPosition};
use tributary_proto::dispatch::Dispatcher;
use tributary_proto::keys::{self, SubscriptionName, TopicName};

use super::session::{AttachRefusal, Subscription};
use super::{
    ConsumerError, ConsumerService, Sub, SubscriptionMeta, invalid, subscription_name, tiered,
};

impl ConsumerService {
    /// The cursor for `start`. `earliest` and the lower bound of an offset
    /// are the first archived offset when an archive is configured (tiered
    /// read), else the WAL's log start.
    pub(super) async fn start_cursor(
        &self,
        topic: &TopicName,
        wal: &Arc<Wal>,
        start: StartPosition,
    ) -> Result<u64, ConsumerError> {
        let hwm = wal.high_water_mark();
        Ok(match start {
            StartPosition::Earliest => tiered::log_start(wal, self.archive(), topic).await?,
            StartPosition::Latest => hwm,
            StartPosition::Offset(offset) if (wal.log_start_offset()..=hwm).contains(&offset) => {
                offset
            }
            StartPosition::Offset(offset) => {
                // Outside the local WAL: the archive may hold it, and a
                // refusal names the whole readable range, archive included.
                let log_start = tiered::log_start(wal, self.archive(), topic).await?;
                if offset < log_start || offset > hwm {
                    return Err(ConsumerError::OffsetOutOfRange {
                        offset,
                        log_start,
                        high_water_mark: hwm,
                    });
                }
                offset
            }
            StartPosition::Timestamp(ts) => {
                tiered::offset_for_timestamp(wal, self.archive(), topic, ts).await?
            }
        })
    }

    /// Attaches a consumer to `subscription` of `topic`, creating the
    /// subscription on first attach.
    ///
    /// # Errors
    /// [`ConsumerError::NotFound`] (topic), [`ConsumerError::Conflict`]
    /// (`subscription_busy`, `type_mismatch`),
    /// [`ConsumerError::OffsetOutOfRange`], [`ConsumerError::Invalid`].
    pub async fn attach(
        &self,
        topic: &TopicName,
        subscription: &str,
        request: &AttachRequest,
    ) -> Result<AttachResponse, ConsumerError> {
        let name = subscription_name(subscription)?;
        if let Some(label) = &request.consumer_name
            && (label.is_empty() || label.len() > 255 || label.chars().any(char::is_control))
        {
            return Err(invalid(
                "consumer_name",
                "consumer_name: 1 to 255 bytes without control characters",
            ));
        }
        if let StartPosition::Timestamp(ts) = request.start {
            tributary_proto::limits::check_timestamp_ms(ts)
                .map_err(|why| invalid("start.timestamp", format!("start.timestamp: {why}")))?;
        }
        // A partitioned topic holds no records itself (they go to its
        // partitions): a subscription of it would wait for ever.
        let partitions = match Catalog::new(self.store.as_ref())
            .partition_count(topic)
            .await
        {
            Err(CatalogError::TopicNotFound { .. }) => 0, // refused below
            other => other?,
        };
        if partitions > 0 {
            return Err(ConsumerError::Conflict {
                kind: "partitioned",
                message: format!(
                    "{topic} is partitioned into {partitions} and holds no records itself: attach to each of its partitions {topic}-part-0 … {topic}-part-{}; nothing was created",
                    partitions - 1
                ),
            });
        }
        // A subscription loaded before its topic was reopened under another
        // ownership epoch is unloaded here, so this attach loads it anew.
        self.loaded_fresh(topic, &name).await?;
        let mut subs = self.subs.lock().await;
        let key = (topic.clone(), name.clone());
        let mut created = false;
        let catalog = Catalog::new(self.store.as_ref());
        let (sub, source) = match subs.get(&key) {
            Some(sub) => (sub.clone(), None),
            None => {
                let (sub, was_created, source) = self.load_or_create(topic, &name, request).await?;
                created = was_created;
                subs.insert(key, sub.clone());
                (sub, Some(source))
            }
        };
        drop(subs);
        if let Some(asked) = request.durable
            && asked != sub.durable
        {
            let kind = |durable: bool| if durable { "durable" } else { "ephemeral" };
            return Err(ConsumerError::Conflict {
                kind: "durability_mismatch",
                message: format!(
                    "subscription {name} of {topic} is {}, not {} (omit \"durable\" to join it as it is)",
                    kind(sub.durable),
                    kind(asked)
                ),
            });
        }
        // A stored policy (an operator's override) wins; a consumer joining
        // never replaces it (seed 000, "Existing subscription policies are
        // preserved").
        let view = if sub.durable {
            catalog.attach_subscription(topic, &name).await?
        } else {
            catalog.failure_policy(topic, &name).await?
        };
        let mut st = sub.state.lock().await;
        let _ = st.set_policy(view.policy.clone());
        let attached = st.attach(
            self.now_ms(),
            request.subscription_type,
            request.consumer_name.clone(),
            || self.next_consumer.fetch_add(1, Ordering::Relaxed),
        );
        let attached = attached.map_err(|refusal| match refusal {
            AttachRefusal::TypeMismatch { existing } => ConsumerError::Conflict {
                kind: "type_mismatch",
                message: format!(
                    "subscription {name} of {topic} is {}, not {}",
                    existing.as_str(),
                    request.subscription_type.as_str()
                ),
            },
            AttachRefusal::Busy {
                holder,
                holder_name,
                expires_in_ms,
            } => ConsumerError::Conflict {
                kind: "subscription_busy",
                message: format!(
                    "subscription {name} of {topic} is exclusive and held by consumer session {holder} (consumer_name {}); that session expires in {expires_in_ms} ms unless it calls again (a consumer re-attaching with the holder's consumer_name takes over at once)",
                    holder_name.as_deref().map_or_else(|| "none".to_owned(), |n| format!("{n:?}"))
                ),
            },
        })?;
        let consumer_id = attached.consumer_id;
        let active = attached.active;
        if let Some((old, released)) = attached.replaced {
            info!(%topic, subscription = %name, consumer = consumer_id, replaced = old, released, "consumer re-attached under its name: its earlier session ended and its leases are redelivered");
            sub.changed.notify_waiters();
        }
        info!(%topic, subscription = %name, consumer = consumer_id, created, "consumer attached");
        let policy = st.dispatcher().policy().clone();
        let source = source.unwrap_or(view.source);
        Ok(AttachResponse {
            topic: topic.to_string(),
            subscription: name.to_string(),
            consumer_id,
            subscription_type: st.meta().subscription_type,
            durable: sub.durable,
            created,
            cursor: st.dispatcher().cursor(),
            high_water_mark: sub.wal().high_water_mark(),
            active,
            session_timeout_ms: self.config.session_timeout_ms,
            failure_policy: policy,
            policy_source: source,
        })
    }

    /// Right after a topic moved here from a live broker (a move, a
    /// rebalance, a drain), waits until [`super::HAND_OVER_GRACE_MS`] after the
    /// assignment before a subscription is loaded: the old owner writes its
    /// last acknowledged cursor within a tick of seeing the move
    /// ([`ConsumerService::hand_off`]), and a load before that would
    /// deliver those messages again.
    async fn await_hand_over(&self, topic: &TopicName) {
        let Some(cluster) = self.cluster.get() else {
            return;
        };
        let Some(assignment) = cluster.own_assignment(topic) else {
            return;
        };
        if assignment.previous_owner.is_none()
            || !matches!(assignment.reason.as_str(), "move" | "rebalance" | "drain")
        {
            return;
        }
        let until = i64::try_from(assignment.assigned_at_ms)
            .unwrap_or(i64::MAX)
            .saturating_add(super::HAND_OVER_GRACE_MS);
        let wait = until
            .saturating_sub(self.now_ms())
            .clamp(0, super::HAND_OVER_GRACE_MS);
        if wait > 0 {
            tokio::time::sleep(Duration::from_millis(wait.unsigned_abs())).await;
        }
    }

    async fn load_or_create(
        &self,
        topic: &TopicName,
        name: &SubscriptionName,
        request: &AttachRequest,
    ) -> Result<(Arc<Sub>, bool, PolicySource), ConsumerError> {
        let wal = self.topics.open_existing(topic, false).await?;
        self.await_hand_over(topic).await;
        let catalog = Catalog::new(self.store.as_ref());
        let meta_key = keys::topics::subscription(topic, name);
        let cursor_key = keys::topics::subscription_cursor(topic, name);
        let now = self.now_ms();
        let stored: Option<SubscriptionMeta> = match self.store.get(&meta_key).await? {
            Some(value) => Some(serde_json::from_value(value).map_err(|e| {
                ConsumerError::Internal(format!("stored subscription at {meta_key}: {e}"))
            })?),
            None => None,
        };
        if stored.is_none() {
            super::dead_letter::check_replayable(name)?;
        }
        let stored_cursor = self.store.get(&cursor_key).await?.and_then(|v| v.as_u64());
        let edge_fed = crate::replication::topics::Writer::Edge
            .writes(self.store.as_ref(), topic)
            .await?;
        let mut done_above = Vec::new();
        let (meta, cursor, (policy, source), durable, created) = match stored {
            Some(meta) => {
                let cursor = match self.store.get(&cursor_key).await? {
                    Some(value) => value.as_u64().ok_or_else(|| {
                        ConsumerError::Internal(format!("stored cursor at {cursor_key} is {value}"))
                    })?,
                    None => self.start_cursor(topic, &wal, request.start).await?,
                };
                // A new owner continues at the archive's end. On a
                // central-written topic a cursor stored past its high-water
                // mark (records the old owner acknowledged but lost) would
                // skip the records appended next: clamp it. An edge re-sends
                // the rest of its topic at the same offsets: keep it (those
                // records were acknowledged; clamping delivered them again).
                let hwm = wal.high_water_mark();
                let cursor = if cursor > hwm && !edge_fed {
                    warn!(%topic, subscription = %name, stored = cursor, high_water_mark = hwm, "stored cursor is past the high-water mark (records lost with a previous owner?); clamped to the high-water mark");
                    hwm
                } else {
                    if cursor > hwm {
                        info!(%topic, subscription = %name, stored = cursor, high_water_mark = hwm, "stored cursor is past the high-water mark of an edge-fed topic (its edge is re-sending to a new owner): delivery resumes at the cursor");
                    }
                    cursor
                };
                let view = catalog.attach_subscription(topic, name).await?;
                let acked = self
                    .store
                    .get(&keys::topics::subscription_acked(topic, name))
                    .await?;
                done_above = super::fence::acked_above(acked.as_ref(), cursor);
                (meta, cursor, (view.policy, view.source), true, false)
            }
            None if request.durable.unwrap_or(true) => {
                let cursor = self.start_cursor(topic, &wal, request.start).await?;
                let view = catalog.attach_subscription(topic, name).await?;
                let meta = SubscriptionMeta {
                    subscription_type: request.subscription_type,
                    durable: true,
                    paused: false,
                    created_ms: now,
                };
                let meta_json = serde_json::to_value(&meta)
                    .map_err(|e| ConsumerError::Internal(e.to_string()))?;
                let (txn, fence_key) = self.fenced_txn(topic)?;
                let txn = txn
                    .when_absent(meta_key.clone())
                    .put(meta_key.clone(), meta_json)
                    .put(cursor_key.clone(), json!(cursor));
                let outcome = self.store.txn(txn).await?;
                Self::check_fenced(topic, &outcome, fence_key.as_deref())?;
                match outcome {
                    TxnOutcome::Applied => {}
                    TxnOutcome::ConditionFailed { .. } => {
                        return Err(ConsumerError::Conflict {
                            kind: "concurrent_attach",
                            message: format!("subscription {name} was created concurrently; retry"),
                        });
                    }
                }
                info!(%topic, subscription = %name, cursor, kind = request.subscription_type.as_str(), "durable subscription created");
                (meta, cursor, (view.policy, view.source), true, true)
            }
            None => {
                let view = catalog.failure_policy(topic, name).await?;
                let cursor = self.start_cursor(topic, &wal, request.start).await?;
                let meta = SubscriptionMeta {
                    subscription_type: request.subscription_type,
                    durable: false,
                    paused: false,
                    created_ms: now,
                };
                info!(%topic, subscription = %name, cursor, "ephemeral subscription created");
                (meta, cursor, (view.policy, view.source), false, true)
            }
        };
        let producer_id = if edge_fed {
            format!("edge:{}", topic.namespace())
        } else {
            format!("broker:{}", self.node_id)
        };
        let written = if created && durable {
            Some(cursor)
        } else {
            stored_cursor
        };
        let mut dispatcher = Dispatcher::new(cursor, policy, self.persist_policy(), now);
        if !done_above.is_empty() {
            let ranges: Vec<String> = (done_above.iter())
                .map(|(first, end)| format!("{first}..{end}"))
                .collect();
            info!(%topic, subscription = %name, cursor, ranges = %ranges.join(","), "offsets finished above the stored cursor are not delivered again");
            dispatcher.restore_done(&done_above);
        }
        let sub = Sub {
            topic: topic.clone(),
            name: name.clone(),
            written: std::sync::Mutex::new(written),
            wal: std::sync::Mutex::new(wal),
            epoch: self.topics.opened_epoch(topic),
            durable,
            producer_id,
            state: Mutex::new(Subscription::new(
                dispatcher,
                meta,
                durable,
                self.session_timings(),
                now,
            )),
            changed: Notify::new(),
        };
        Ok((Arc::new(sub), created, source))
    }

    /// Ends a session; its leases are redelivered at once.
    ///
    /// # Errors
    /// [`ConsumerError::NotFound`].
    pub async fn detach(
        &self,
        topic: &TopicName,
        subscription: &str,
        consumer: u64,
    ) -> Result<(), ConsumerError> {
        let name = subscription_name(subscription)?;
        let sub = self.sub(topic, &name).await?;
        let mut st = self.session(&sub, consumer).await?;
        let released = st.detach(self.now_ms(), consumer);
        info!(%topic, subscription = %name, consumer, released, "consumer detached");
        sub.changed.notify_waiters();
        Ok(())
    }
}
