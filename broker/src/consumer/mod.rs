//! Central consumers: subscriptions on the broker's topic WALs, served over
//! HTTP ([`http`], `docs/consumer-api.md`).
//!
//! Each loaded subscription is a [`Dispatcher`] (broker-core, no I/O) plus
//! its consumer sessions; this module is the shell that feeds it the clock,
//! the WAL's high-water mark and Raft, and carries out its actions (copy to
//! the dead-letter topic, persist the cursor).
//!
//! Semantics (seed pages `002_3b2157864a3f5448.txt` for subscriptions,
//! cursors and leases, `000_d502aacc865e81b1.txt` for failure policies):
//! - **Created on first attach** with a start position (earliest, latest,
//!   offset, timestamp). **Durable** subscriptions store
//!   `/topics/{ns}/{topic}/subscriptions/{sub}` (type, paused), `…/cursor`
//!   and `…/failure_policy` (inherited from the topic's intent on first
//!   attach, never overwritten by a later attach). **Ephemeral** ones store
//!   nothing and disappear when their last consumer session ends.
//! - **Types**: exclusive (one live consumer), shared (every consumer
//!   leases), failover (only the oldest live session receives).
//! - **Sessions** end after `session_timeout_ms` without a call, or on
//!   detach; their leases are redelivered at once.
//! - **Cursor persistence** is batched (`cursor_persist_every_acks` acks or
//!   `cursor_persist_interval_ms`, whichever first, and at shutdown, seek,
//!   pause): after a crash a subscription resumes at the persisted cursor,
//!   so at most what was acknowledged since is delivered again.
//! - **Failure policy changes** made through the admin API are picked up
//!   within `policy_refresh_ms`; a change lifts a `block`.
//!
//! A topic is consumed on the broker that holds its WAL (single-node
//! deployments, or the broker the edge replicates to).

pub mod http;
pub mod records;
pub mod tiered;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use broker_core::catalog::{Catalog, CatalogError};
use broker_core::metadata::{MetadataError, MetadataStore, Txn, TxnOutcome};
use broker_core::wal::Wal;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::{Mutex, Notify};
use tracing::{error, info, warn};
use tributary_api::admin::PolicySource;
use tributary_api::consumer::{
    AckResponse, AckUpToResponse, AttachRequest, AttachResponse, ConsumerState, Message,
    NackRequest, NackResponse, ReceiveResponse, ReplayResponse, StartPosition, SubscriptionState,
    SubscriptionType, ValueEncoding,
};
use tributary_proto::Record;
use tributary_proto::dispatch::{AckOutcome, Action, DispatchError, Dispatcher, PersistPolicy};
use tributary_proto::intent::{PoisonPolicy, SubscriptionFailurePolicy};
use tributary_proto::keys::{self, SubscriptionName, TopicName};

use crate::replication::topics::{TopicError, TopicStore};

use self::records::ReadError;

/// Consumer settings (`[consumers]` in the broker configuration).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConsumerConfig {
    /// Write a subscription's cursor after this many acknowledgements.
    /// Default 1000 (seed).
    pub cursor_persist_every_acks: u32,
    /// … or after this long, ms. Default 5000 (seed).
    pub cursor_persist_interval_ms: u64,
    /// A consumer session ends this long after its last call, ms. Default
    /// 30000.
    pub session_timeout_ms: u64,
    /// How often expired leases and sessions are processed, ms. Default 250.
    pub tick_ms: u64,
    /// How often stored failure policies are re-read, ms. Default 2000.
    pub policy_refresh_ms: u64,
}

impl Default for ConsumerConfig {
    fn default() -> Self {
        ConsumerConfig {
            cursor_persist_every_acks: 1000,
            cursor_persist_interval_ms: 5000,
            session_timeout_ms: 30_000,
            tick_ms: 250,
            policy_refresh_ms: 2000,
        }
    }
}

/// Errors of consumer operations, each with an HTTP status in [`http`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConsumerError {
    /// Bad input naming the field (400).
    #[error("{field}: {message}")]
    Invalid {
        /// The request field.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// An offset outside what the topic holds (400).
    #[error("offset {offset} is outside [{log_start}, {high_water_mark}]")]
    OffsetOutOfRange {
        /// Requested.
        offset: u64,
        /// First stored offset.
        log_start: u64,
        /// The high-water mark.
        high_water_mark: u64,
    },
    /// Unknown topic, subscription or consumer session (404).
    #[error("{0}")]
    NotFound(String),
    /// The request contradicts the subscription's state (409): busy
    /// exclusive subscription, type mismatch, a lease held by another
    /// consumer, a topic written by an edge.
    #[error("{message}")]
    Conflict {
        /// `subscription_busy`, `type_mismatch`, `not_leased`,
        /// `writer_conflict`.
        kind: &'static str,
        /// Details.
        message: String,
    },
    /// Records over the size limits (413); nothing stored.
    #[error("{0}")]
    TooLarge(String),
    /// Storage or metadata failure (500).
    #[error("{0}")]
    Internal(String),
    /// The offset was tiered and trimmed locally, and the broker has no
    /// `[archive]` configured to read it from (503).
    #[error("{0}")]
    ArchiveNotConfigured(String),
}

impl From<CatalogError> for ConsumerError {
    fn from(e: CatalogError) -> Self {
        match e {
            CatalogError::TopicNotFound { .. } => ConsumerError::NotFound(e.to_string()),
            CatalogError::InvalidName { field, .. } => ConsumerError::Invalid {
                field: field.into(),
                message: e.to_string(),
            },
            other => ConsumerError::Internal(other.to_string()),
        }
    }
}

impl From<MetadataError> for ConsumerError {
    fn from(e: MetadataError) -> Self {
        ConsumerError::Internal(format!("metadata: {e}"))
    }
}

impl From<TopicError> for ConsumerError {
    fn from(e: TopicError) -> Self {
        match e {
            TopicError::Catalog(c) => c.into(),
            TopicError::Wal(
                e @ (broker_core::wal::WalError::Limit(_) | broker_core::wal::WalError::Encode(_)),
            ) => ConsumerError::TooLarge(e.to_string()),
            e @ TopicError::Conflict { .. } => ConsumerError::Conflict {
                kind: "writer_conflict",
                message: e.to_string(),
            },
            other => ConsumerError::Internal(other.to_string()),
        }
    }
}

impl From<ReadError> for ConsumerError {
    fn from(e: ReadError) -> Self {
        match e {
            e @ ReadError::Tiered { .. } => ConsumerError::ArchiveNotConfigured(e.to_string()),
            e => ConsumerError::Internal(format!("reading records: {e}")),
        }
    }
}

/// What is stored at `/topics/{ns}/{topic}/subscriptions/{sub}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubscriptionMeta {
    /// Type.
    #[serde(rename = "type")]
    pub subscription_type: SubscriptionType,
    /// Always true when stored (ephemeral subscriptions store nothing).
    pub durable: bool,
    /// Paused: nothing is delivered.
    #[serde(default)]
    pub paused: bool,
    /// Creation time, ms since the Unix epoch.
    pub created_ms: i64,
}

struct Session {
    name: Option<String>,
    last_seen_ms: i64,
}

struct SubState {
    dispatcher: Dispatcher,
    meta: SubscriptionMeta,
    sessions: BTreeMap<u64, Session>,
    /// Dead-letter copies not yet confirmed (retried on the tick).
    pending_dead_letters: Vec<(u64, u32, String)>,
    last_policy_refresh_ms: i64,
    removed: bool,
}

impl SubState {
    fn active_consumer(&self) -> Option<u64> {
        self.sessions.keys().next().copied()
    }

    fn is_active(&self, consumer: u64) -> bool {
        match self.meta.subscription_type {
            SubscriptionType::Failover | SubscriptionType::Exclusive => {
                self.active_consumer() == Some(consumer)
            }
            SubscriptionType::Shared => true,
        }
    }
}

/// The end of a long poll of `max_wait_ms` from now (Unix ms).
fn deadline_after(max_wait_ms: u64) -> i64 {
    now_ms().saturating_add(i64::try_from(max_wait_ms).unwrap_or(i64::MAX))
}

/// One wait of a long poll: until the subscription changes, the WAL's
/// high-water mark passes `offset`, or `wake_at` (Unix ms) — at most 250 ms
/// after `now`, so lease expiries and deadlines are seen on time.
async fn wait_for_change(sub: &Sub, offset: u64, now: i64, wake_at: i64) {
    let wait_ms = wake_at.min(now + 250).saturating_sub(now);
    let sleep = Duration::from_millis(u64::try_from(wait_ms).unwrap_or(0).max(1));
    tokio::select! {
        _ = sub.changed.notified() => {}
        _ = sub.wal.wait_for_offset(offset) => {}
        _ = tokio::time::sleep(sleep) => {}
    }
}

struct Sub {
    topic: TopicName,
    name: SubscriptionName,
    wal: Arc<Wal>,
    durable: bool,
    producer_id: String,
    state: Mutex<SubState>,
    changed: Notify,
}

type SubKey = (TopicName, SubscriptionName);

/// The broker's subscriptions and consumer sessions.
pub struct ConsumerService {
    topics: Arc<TopicStore>,
    store: Arc<dyn MetadataStore>,
    config: ConsumerConfig,
    broker_addr: String,
    node_id: u64,
    subs: Mutex<HashMap<SubKey, Arc<Sub>>>,
    next_consumer: AtomicU64,
    /// The archive for tiered reads ([`ConsumerService::set_archive`]).
    archive: std::sync::OnceLock<tributary_archive::Archive>,
}

/// Now, ms since the Unix epoch.
pub use broker_core::clock::now_ms;

fn invalid(field: &str, message: impl Into<String>) -> ConsumerError {
    ConsumerError::Invalid {
        field: field.into(),
        message: message.into(),
    }
}

fn subscription_name(name: &str) -> Result<SubscriptionName, ConsumerError> {
    SubscriptionName::new(name).map_err(|e| invalid("subscription", format!("subscription: {e}")))
}

impl ConsumerService {
    /// A service over `topics` and `store`; `broker_addr` is what
    /// `x-original-broker-addr` says, `node_id` names this broker in
    /// `x-original-producer-id` of centrally published records.
    pub fn new(
        topics: Arc<TopicStore>,
        store: Arc<dyn MetadataStore>,
        config: ConsumerConfig,
        broker_addr: String,
        node_id: u64,
    ) -> Arc<ConsumerService> {
        // Session ids never repeat across restarts of this broker.
        let first_id = u64::try_from(now_ms()).unwrap_or(1).saturating_mul(1000);
        Arc::new(ConsumerService {
            topics,
            store,
            config,
            broker_addr,
            node_id,
            subs: Mutex::default(),
            next_consumer: AtomicU64::new(first_id),
            archive: std::sync::OnceLock::new(),
        })
    }

    /// Serves offsets below the local WAL from `archive` (tiered read,
    /// [`tiered`]). Without it such reads fail with
    /// [`ConsumerError::ArchiveNotConfigured`]. Only the first call counts.
    pub fn set_archive(&self, archive: tributary_archive::Archive) {
        let _ = self.archive.set(archive);
    }

    fn archive(&self) -> Option<&tributary_archive::Archive> {
        self.archive.get()
    }

    /// The configuration in force.
    pub fn config(&self) -> &ConsumerConfig {
        &self.config
    }

    fn persist_policy(&self) -> PersistPolicy {
        PersistPolicy {
            every_acks: self.config.cursor_persist_every_acks.max(1),
            interval_ms: i64::try_from(self.config.cursor_persist_interval_ms).unwrap_or(i64::MAX),
        }
    }

    /// Runs the periodic work (expired leases and sessions, dead-letter
    /// retries, batched cursor writes, policy refresh) until the service is
    /// dropped by everyone else.
    pub fn spawn_ticker(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let weak = Arc::downgrade(self);
        let tick = Duration::from_millis(self.config.tick_ms.max(10));
        tokio::spawn(async move {
            let mut interval = tokio::time::interval(tick);
            interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                interval.tick().await;
                let Some(service) = weak.upgrade() else {
                    return;
                };
                service.tick().await;
            }
        })
    }

    async fn tick(&self) {
        let subs: Vec<Arc<Sub>> = self.subs.lock().await.values().cloned().collect();
        for sub in subs {
            let now = now_ms();
            let mut st = sub.state.lock().await;
            if st.removed {
                continue;
            }
            let timeout = i64::try_from(self.config.session_timeout_ms).unwrap_or(i64::MAX);
            let expired: Vec<u64> = st
                .sessions
                .iter()
                .filter(|(_, s)| now.saturating_sub(s.last_seen_ms) > timeout)
                .map(|(&id, _)| id)
                .collect();
            for id in expired {
                st.sessions.remove(&id);
                let released = st.dispatcher.release(id, now);
                info!(topic = %sub.topic, subscription = %sub.name, consumer = id, released, "consumer session expired; its leases are redelivered");
                sub.changed.notify_waiters();
            }
            let actions = st.dispatcher.on_timeout(now);
            self.handle_actions(&sub, &mut st, actions).await;
            self.retry_dead_letters(&sub, &mut st).await;
            if sub.durable
                && now.saturating_sub(st.last_policy_refresh_ms)
                    >= i64::try_from(self.config.policy_refresh_ms).unwrap_or(i64::MAX)
            {
                st.last_policy_refresh_ms = now;
                let catalog = Catalog::new(self.store.as_ref());
                match catalog.failure_policy(&sub.topic, &sub.name).await {
                    Ok(view) if view.persisted && &view.policy != st.dispatcher.policy() => {
                        info!(topic = %sub.topic, subscription = %sub.name, "failure policy changed; applying it");
                        st.dispatcher.set_policy(view.policy);
                        sub.changed.notify_waiters();
                    }
                    Ok(_) => {}
                    Err(e) => {
                        warn!(topic = %sub.topic, subscription = %sub.name, error = %e, "re-reading the failure policy")
                    }
                }
            }
            self.persist(&sub, &mut st, false).await;
            if !sub.durable && st.sessions.is_empty() {
                st.removed = true;
                drop(st);
                self.subs
                    .lock()
                    .await
                    .remove(&(sub.topic.clone(), sub.name.clone()));
                info!(topic = %sub.topic, subscription = %sub.name, "ephemeral subscription removed: its last consumer session ended");
            }
        }
    }

    /// Writes every durable subscription's cursor now (shutdown).
    pub async fn persist_all(&self) {
        let subs: Vec<Arc<Sub>> = self.subs.lock().await.values().cloned().collect();
        for sub in subs {
            let mut st = sub.state.lock().await;
            self.persist(&sub, &mut st, true).await;
        }
    }

    async fn persist(&self, sub: &Sub, st: &mut SubState, force: bool) {
        if !sub.durable || st.removed {
            return;
        }
        if let Some(cursor) = st.dispatcher.poll_persist(now_ms(), force) {
            let key = keys::topics::subscription_cursor(&sub.topic, &sub.name);
            if let Err(e) = self.store.put(&key, json!(cursor)).await {
                error!(topic = %sub.topic, subscription = %sub.name, cursor, error = %e, "persisting the cursor failed; it is retried with the next acknowledgement");
            }
        }
    }

    async fn sub(
        &self,
        topic: &TopicName,
        name: &SubscriptionName,
    ) -> Result<Arc<Sub>, ConsumerError> {
        self.subs
            .lock()
            .await
            .get(&(topic.clone(), name.clone()))
            .cloned()
            .ok_or_else(|| {
                ConsumerError::NotFound(format!(
                    "subscription {name} of {topic} has no consumer attached on this broker: attach first"
                ))
            })
    }

    async fn session<'a>(
        &self,
        sub: &'a Sub,
        consumer: u64,
    ) -> Result<tokio::sync::MutexGuard<'a, SubState>, ConsumerError> {
        let mut st = sub.state.lock().await;
        if st.removed {
            return Err(ConsumerError::NotFound(format!(
                "subscription {} of {} was removed",
                sub.name, sub.topic
            )));
        }
        match st.sessions.get_mut(&consumer) {
            Some(session) => {
                session.last_seen_ms = now_ms();
                Ok(st)
            }
            None => Err(ConsumerError::NotFound(format!(
                "consumer {consumer} has no session on subscription {} (expired or never attached): attach again",
                sub.name
            ))),
        }
    }

    /// The cursor for `start`. `earliest` and the lower bound of an offset
    /// are the first archived offset when an archive is configured (tiered
    /// read), else the WAL's log start.
    async fn start_cursor(
        &self,
        topic: &TopicName,
        wal: &Arc<Wal>,
        start: StartPosition,
    ) -> Result<u64, ConsumerError> {
        let hwm = wal.high_water_mark();
        Ok(match start {
            StartPosition::Earliest => tiered::log_start(wal, self.archive(), topic).await?,
            StartPosition::Latest => hwm,
            StartPosition::Offset(offset) => {
                let log_start = if offset < wal.log_start_offset() {
                    tiered::log_start(wal, self.archive(), topic).await?
                } else {
                    wal.log_start_offset()
                };
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
            && (label.len() > 255 || label.chars().any(char::is_control))
        {
            return Err(invalid(
                "consumer_name",
                "consumer_name: at most 255 bytes without control characters",
            ));
        }
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
        // A stored policy (an operator's override) wins; a consumer joining
        // never replaces it (seed 000, "Existing subscription policies are
        // preserved").
        let view = if sub.durable {
            catalog.attach_subscription(topic, &name).await?
        } else {
            catalog.failure_policy(topic, &name).await?
        };
        let mut st = sub.state.lock().await;
        if &view.policy != st.dispatcher.policy() {
            st.dispatcher.set_policy(view.policy.clone());
        }
        if st.meta.subscription_type != request.subscription_type {
            return Err(ConsumerError::Conflict {
                kind: "type_mismatch",
                message: format!(
                    "subscription {name} of {topic} is {}, not {}",
                    st.meta.subscription_type.as_str(),
                    request.subscription_type.as_str()
                ),
            });
        }
        if st.meta.subscription_type == SubscriptionType::Exclusive && !st.sessions.is_empty() {
            return Err(ConsumerError::Conflict {
                kind: "subscription_busy",
                message: format!(
                    "subscription {name} of {topic} is exclusive and consumer {} is attached",
                    st.active_consumer().unwrap_or_default()
                ),
            });
        }
        let consumer_id = self.next_consumer.fetch_add(1, Ordering::Relaxed);
        st.sessions.insert(
            consumer_id,
            Session {
                name: request.consumer_name.clone(),
                last_seen_ms: now_ms(),
            },
        );
        info!(%topic, subscription = %name, consumer = consumer_id, created, "consumer attached");
        let policy = st.dispatcher.policy().clone();
        let source = source.unwrap_or(view.source);
        Ok(AttachResponse {
            topic: topic.to_string(),
            subscription: name.to_string(),
            consumer_id,
            subscription_type: st.meta.subscription_type,
            durable: sub.durable,
            created,
            cursor: st.dispatcher.cursor(),
            high_water_mark: sub.wal.high_water_mark(),
            active: st.is_active(consumer_id),
            session_timeout_ms: self.config.session_timeout_ms,
            failure_policy: policy,
            policy_source: source,
        })
    }

    async fn load_or_create(
        &self,
        topic: &TopicName,
        name: &SubscriptionName,
        request: &AttachRequest,
    ) -> Result<(Arc<Sub>, bool, PolicySource), ConsumerError> {
        let wal = self.topics.open_existing(topic, false).await?;
        let catalog = Catalog::new(self.store.as_ref());
        let meta_key = keys::topics::subscription(topic, name);
        let cursor_key = keys::topics::subscription_cursor(topic, name);
        let now = now_ms();
        let stored: Option<SubscriptionMeta> = match self.store.get(&meta_key).await? {
            Some(value) => Some(serde_json::from_value(value).map_err(|e| {
                ConsumerError::Internal(format!("stored subscription at {meta_key}: {e}"))
            })?),
            None => None,
        };
        let (meta, cursor, (policy, source), durable, created) = match stored {
            Some(meta) => {
                let cursor = match self.store.get(&cursor_key).await? {
                    Some(value) => value.as_u64().ok_or_else(|| {
                        ConsumerError::Internal(format!("stored cursor at {cursor_key} is {value}"))
                    })?,
                    None => self.start_cursor(topic, &wal, request.start).await?,
                };
                let view = catalog.attach_subscription(topic, name).await?;
                (meta, cursor, (view.policy, view.source), true, false)
            }
            None if request.durable => {
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
                let txn = Txn::new()
                    .when_absent(meta_key.clone())
                    .put(meta_key.clone(), meta_json)
                    .put(cursor_key.clone(), json!(cursor));
                match self.store.txn(txn).await? {
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
        let edge_fed = self
            .store
            .get(&keys::topics::producer(
                topic,
                crate::replication::topics::EDGE_PRODUCER_ID,
            ))
            .await?
            .is_some();
        let producer_id = if edge_fed {
            format!("edge:{}", topic.namespace())
        } else {
            format!("broker:{}", self.node_id)
        };
        let sub = Sub {
            topic: topic.clone(),
            name: name.clone(),
            wal,
            durable,
            producer_id,
            state: Mutex::new(SubState {
                dispatcher: Dispatcher::new(cursor, policy, self.persist_policy(), now),
                meta,
                sessions: BTreeMap::new(),
                pending_dead_letters: Vec::new(),
                last_policy_refresh_ms: now,
                removed: false,
            }),
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
        st.sessions.remove(&consumer);
        let released = st.dispatcher.release(consumer, now_ms());
        info!(%topic, subscription = %name, consumer, released, "consumer detached");
        sub.changed.notify_waiters();
        Ok(())
    }

    /// Leases up to `max` messages to `consumer`, waiting up to `max_wait_ms`
    /// for the first one.
    ///
    /// # Errors
    /// [`ConsumerError::NotFound`] for an unknown subscription or session.
    pub async fn receive(
        &self,
        topic: &TopicName,
        subscription: &str,
        consumer: u64,
        max: u32,
        max_wait_ms: u64,
        encoding: ValueEncoding,
    ) -> Result<ReceiveResponse, ConsumerError> {
        let name = subscription_name(subscription)?;
        let sub = self.sub(topic, &name).await?;
        let deadline = deadline_after(max_wait_ms);
        loop {
            let now = now_ms();
            let (deliveries, active, paused, blocked_at, cursor, next_due, hwm) = {
                let mut st = self.session(&sub, consumer).await?;
                let hwm = sub.wal.high_water_mark();
                let active = st.is_active(consumer);
                let paused = st.meta.paused;
                let mut deliveries = Vec::new();
                if active && !paused {
                    let (leased, actions) = st.dispatcher.lease(now, consumer, max as usize, hwm);
                    deliveries = leased;
                    self.handle_actions(&sub, &mut st, actions).await;
                }
                (
                    deliveries,
                    active,
                    paused,
                    st.dispatcher.blocked_at(),
                    st.dispatcher.cursor(),
                    st.dispatcher.poll_timeout(),
                    hwm,
                )
            };
            if !deliveries.is_empty() || now >= deadline {
                let offsets: Vec<u64> = deliveries.iter().map(|d| d.offset).collect();
                let found =
                    tiered::read_offsets(&sub.wal, self.archive(), &sub.topic, &offsets).await?;
                let messages = deliveries
                    .iter()
                    .filter_map(|d| {
                        found.get(&d.offset).map(|record| {
                            let mut m = records::to_message(d.offset, record, encoding);
                            m.attempt = d.attempt;
                            m.lease_deadline_ms = Some(d.deadline_ms);
                            m
                        })
                    })
                    .collect();
                return Ok(ReceiveResponse {
                    messages,
                    cursor,
                    high_water_mark: hwm,
                    active,
                    paused,
                    blocked_at,
                });
            }
            let wake = next_due.unwrap_or(deadline).min(deadline);
            wait_for_change(&sub, hwm, now, wake).await;
        }
    }

    /// Cursor read: up to `max` records from the cursor, without leases; the
    /// same records come back until acknowledged with
    /// [`ConsumerService::ack_up_to`].
    ///
    /// # Errors
    /// As [`ConsumerService::receive`].
    pub async fn read(
        &self,
        topic: &TopicName,
        subscription: &str,
        consumer: u64,
        max: u32,
        max_wait_ms: u64,
        encoding: ValueEncoding,
    ) -> Result<ReceiveResponse, ConsumerError> {
        let name = subscription_name(subscription)?;
        let sub = self.sub(topic, &name).await?;
        let deadline = deadline_after(max_wait_ms);
        loop {
            let (cursor, active, paused, blocked_at) = {
                let st = self.session(&sub, consumer).await?;
                (
                    st.dispatcher.cursor(),
                    st.is_active(consumer),
                    st.meta.paused,
                    st.dispatcher.blocked_at(),
                )
            };
            let hwm = sub.wal.high_water_mark();
            let now = now_ms();
            if (active && !paused && cursor < hwm) || now >= deadline {
                let records = if active && !paused {
                    let limit = max as usize;
                    tiered::read_range(&sub.wal, self.archive(), &sub.topic, cursor, limit).await?
                } else {
                    Vec::new()
                };
                return Ok(ReceiveResponse {
                    messages: records
                        .iter()
                        .map(|(offset, record)| records::to_message(*offset, record, encoding))
                        .collect(),
                    cursor,
                    high_water_mark: hwm,
                    active,
                    paused,
                    blocked_at,
                });
            }
            wait_for_change(&sub, cursor.max(hwm), now, deadline).await;
        }
    }

    /// Acknowledges leased messages one by one.
    ///
    /// # Errors
    /// [`ConsumerError::Invalid`] for an offset at or beyond the high-water
    /// mark (nothing acknowledged); [`ConsumerError::Conflict`]
    /// (`not_leased`) at the first offset leased to another consumer (the
    /// offsets before it stay acknowledged).
    pub async fn ack(
        &self,
        topic: &TopicName,
        subscription: &str,
        consumer: u64,
        offsets: &[u64],
    ) -> Result<AckResponse, ConsumerError> {
        let name = subscription_name(subscription)?;
        let sub = self.sub(topic, &name).await?;
        let mut st = self.session(&sub, consumer).await?;
        let hwm = sub.wal.high_water_mark();
        if let Some(bad) = offsets.iter().find(|&&o| o >= hwm) {
            return Err(invalid(
                "offsets",
                format!(
                    "offsets: {bad} is at or beyond the high-water mark {hwm}; nothing was acknowledged"
                ),
            ));
        }
        let mut acked = Vec::new();
        let mut no_op = Vec::new();
        for &offset in offsets {
            match st.dispatcher.ack_by(consumer, offset) {
                Ok(AckOutcome::Acked { .. }) => acked.push(offset),
                Ok(AckOutcome::NoOp) => no_op.push(offset),
                Err(e) => {
                    self.persist(&sub, &mut st, false).await;
                    sub.changed.notify_waiters();
                    return Err(ConsumerError::Conflict {
                        kind: "not_leased",
                        message: format!(
                            "{e}: another consumer holds its lease; acknowledged before it: {acked:?}"
                        ),
                    });
                }
            }
        }
        self.persist(&sub, &mut st, false).await;
        sub.changed.notify_waiters();
        Ok(AckResponse {
            acked,
            no_op,
            cursor: st.dispatcher.cursor(),
        })
    }

    /// Cursor-read acknowledgement of everything up to and including
    /// `offset`; an older offset is a no-op.
    ///
    /// # Errors
    /// [`ConsumerError::Invalid`] for an offset at or beyond the high-water
    /// mark.
    pub async fn ack_up_to(
        &self,
        topic: &TopicName,
        subscription: &str,
        consumer: u64,
        offset: u64,
    ) -> Result<AckUpToResponse, ConsumerError> {
        let name = subscription_name(subscription)?;
        let sub = self.sub(topic, &name).await?;
        let mut st = self.session(&sub, consumer).await?;
        let hwm = sub.wal.high_water_mark();
        let end = offset.saturating_add(1);
        let outcome = st.dispatcher.ack_up_to(end, hwm).map_err(|e| match e {
            DispatchError::BeyondEnd { .. } => invalid(
                "offset",
                format!("offset: {offset} is at or beyond the high-water mark {hwm}"),
            ),
            other => ConsumerError::Internal(other.to_string()),
        })?;
        self.persist(&sub, &mut st, false).await;
        sub.changed.notify_waiters();
        Ok(AckUpToResponse {
            acked: matches!(outcome, AckOutcome::Acked { .. }),
            cursor: st.dispatcher.cursor(),
        })
    }

    /// Negative acknowledgement: redelivery after the backoff (or
    /// `delay_ms`), or the poison policy once attempts exceed the limit.
    ///
    /// # Errors
    /// [`ConsumerError::Conflict`] (`not_leased`) at the first offset the
    /// consumer does not hold (those before it are nacked).
    pub async fn nack(
        &self,
        topic: &TopicName,
        subscription: &str,
        request: &NackRequest,
    ) -> Result<NackResponse, ConsumerError> {
        let name = subscription_name(subscription)?;
        let sub = self.sub(topic, &name).await?;
        let mut st = self.session(&sub, request.consumer_id).await?;
        let reason = request.reason.clone().unwrap_or_else(|| "nack".into());
        if reason.len() > 1024 {
            return Err(invalid("reason", "reason: at most 1024 bytes"));
        }
        let mut response = NackResponse {
            redelivery: Vec::new(),
            dead_lettered: Vec::new(),
            dropped: Vec::new(),
            blocked_at: None,
            cursor: 0,
        };
        let now = now_ms();
        for &offset in &request.offsets {
            match st
                .dispatcher
                .nack(now, request.consumer_id, offset, request.delay_ms, &reason)
            {
                Ok(None) => response.redelivery.push(offset),
                Ok(Some(action)) => {
                    match &action {
                        Action::DeadLetter { offset, .. } => response.dead_lettered.push(*offset),
                        Action::Dropped { offset } => response.dropped.push(*offset),
                        Action::Blocked { .. } => {}
                    }
                    self.handle_actions(&sub, &mut st, vec![action]).await;
                }
                Err(e) => {
                    sub.changed.notify_waiters();
                    return Err(ConsumerError::Conflict {
                        kind: "not_leased",
                        message: format!("{e}; nacked before it: {:?}", response.redelivery),
                    });
                }
            }
        }
        // Copies that failed stay pending (retried on the tick).
        response
            .dead_lettered
            .retain(|o| !st.pending_dead_letters.iter().any(|(p, _, _)| p == o));
        response.blocked_at = st.dispatcher.blocked_at();
        response.cursor = st.dispatcher.cursor();
        self.persist(&sub, &mut st, false).await;
        sub.changed.notify_waiters();
        Ok(response)
    }

    async fn handle_actions(&self, sub: &Sub, st: &mut SubState, actions: Vec<Action>) {
        for action in actions {
            match action {
                Action::DeadLetter {
                    offset,
                    attempt,
                    reason,
                } => {
                    st.pending_dead_letters.push((offset, attempt, reason));
                }
                Action::Blocked { offset } => {
                    warn!(topic = %sub.topic, subscription = %sub.name, offset, "poison message: delivery halts here (poison policy block) until it is acknowledged, the policy changes or an admin seeks past it");
                }
                Action::Dropped { offset } => {
                    warn!(topic = %sub.topic, subscription = %sub.name, offset, "poison message dropped (poison policy none)");
                }
            }
        }
        self.retry_dead_letters(sub, st).await;
    }

    fn dead_letter_topic(
        &self,
        sub: &Sub,
        policy: &SubscriptionFailurePolicy,
    ) -> Result<TopicName, ConsumerError> {
        match &policy.dead_letter_topic {
            Some(name) => TopicName::new(name)
                .map_err(|e| ConsumerError::Internal(format!("dead_letter_topic {name}: {e}"))),
            None => sub.topic.with_suffix("-dlq").map_err(|e| {
                ConsumerError::Internal(format!("dead-letter topic of {}: {e}", sub.topic))
            }),
        }
    }

    async fn retry_dead_letters(&self, sub: &Sub, st: &mut SubState) {
        let pending = std::mem::take(&mut st.pending_dead_letters);
        for (offset, attempt, reason) in pending {
            match self
                .copy_to_dead_letter(sub, st, offset, attempt, &reason)
                .await
            {
                Ok(dlq_offset) => {
                    let _ = st.dispatcher.dead_lettered(offset);
                    info!(topic = %sub.topic, subscription = %sub.name, offset, attempt, dlq_offset, "poison message copied to the dead-letter topic");
                }
                Err(e) => {
                    error!(topic = %sub.topic, subscription = %sub.name, offset, error = %e, "copy to the dead-letter topic failed; retrying");
                    st.pending_dead_letters.push((offset, attempt, reason));
                }
            }
        }
    }

    async fn copy_to_dead_letter(
        &self,
        sub: &Sub,
        st: &SubState,
        offset: u64,
        attempt: u32,
        reason: &str,
    ) -> Result<u64, ConsumerError> {
        let dlq = self.dead_letter_topic(sub, st.dispatcher.policy())?;
        let found = tiered::read_offsets(&sub.wal, self.archive(), &sub.topic, &[offset]).await?;
        let Some(original) = found.get(&offset) else {
            return Err(ConsumerError::Internal(format!(
                "offset {offset} not readable"
            )));
        };
        let mut record = original.clone();
        let policy = match st.dispatcher.policy().poison_policy {
            PoisonPolicy::DeadLetter => "dead_letter",
            PoisonPolicy::Block => "block",
            PoisonPolicy::None => "none",
        };
        let values = [
            sub.topic.to_string(),
            sub.name.to_string(),
            offset.to_string(),
            sub.producer_id.clone(),
            self.broker_addr.clone(),
            policy.to_string(),
            attempt.to_string(),
            reason.to_string(),
        ];
        for (name, value) in tributary_api::consumer::DEAD_LETTER_HEADERS
            .iter()
            .zip(values)
        {
            record
                .headers
                .push(((*name).to_string(), Bytes::from(value)));
        }
        let ack = self.topics.append_central(&dlq, vec![record], true).await?;
        Ok(ack.base_offset)
    }

    /// Moves the cursor of `subscription` to `offset` or the first message
    /// at `timestamp_ms`; forgets leases and redeliveries and lifts a block.
    /// The cursor is written to Raft at once.
    ///
    /// # Errors
    /// [`ConsumerError::Invalid`] unless exactly one is given;
    /// [`ConsumerError::OffsetOutOfRange`]; [`ConsumerError::NotFound`].
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
            (None, Some(t)) => StartPosition::Timestamp(t),
            _ => {
                return Err(invalid(
                    "offset",
                    "give exactly one of offset and timestamp_ms",
                ));
            }
        };
        let loaded = self
            .subs
            .lock()
            .await
            .get(&(topic.clone(), name.clone()))
            .cloned();
        match loaded {
            Some(sub) => {
                let cursor = self.start_cursor(&sub.topic, &sub.wal, start).await?;
                let mut st = sub.state.lock().await;
                st.dispatcher.seek(cursor);
                self.persist(&sub, &mut st, true).await;
                sub.changed.notify_waiters();
                info!(%topic, subscription = %name, cursor, "seek");
                Ok(cursor)
            }
            None => {
                self.stored_meta(topic, &name).await?;
                let wal = self.topics.open_existing(topic, false).await?;
                let cursor = self.start_cursor(topic, &wal, start).await?;
                self.store
                    .put(
                        &keys::topics::subscription_cursor(topic, &name),
                        json!(cursor),
                    )
                    .await?;
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
            None => Err(ConsumerError::NotFound(format!(
                "subscription {name} of {topic} does not exist"
            ))),
        }
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
        let loaded = self
            .subs
            .lock()
            .await
            .get(&(topic.clone(), name.clone()))
            .cloned();
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
            sub.state.lock().await.meta.paused = paused;
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
            return Err(ConsumerError::NotFound(format!(
                "subscription {name} of {topic} does not exist"
            )));
        }
        if let Some(sub) = loaded {
            sub.state.lock().await.removed = true;
            sub.changed.notify_waiters();
        }
        if stored {
            let txn = Txn::new()
                .delete(meta_key)
                .delete(keys::topics::subscription_cursor(topic, &name))
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
        let loaded = self
            .subs
            .lock()
            .await
            .get(&(topic.clone(), name.clone()))
            .cloned();
        if let Some(sub) = loaded {
            let st = sub.state.lock().await;
            let active = st.active_consumer();
            return Ok(SubscriptionState {
                topic: topic.to_string(),
                subscription: name.to_string(),
                subscription_type: st.meta.subscription_type,
                durable: sub.durable,
                paused: st.meta.paused,
                cursor: st.dispatcher.cursor(),
                persisted_cursor: st.dispatcher.persisted_cursor(),
                high_water_mark: sub.wal.high_water_mark(),
                in_flight: st.dispatcher.in_flight() as u64,
                blocked_at: st.dispatcher.blocked_at(),
                consumers: st
                    .sessions
                    .iter()
                    .map(|(&id, s)| ConsumerState {
                        consumer_id: id,
                        consumer_name: s.name.clone(),
                        active: match st.meta.subscription_type {
                            SubscriptionType::Shared => true,
                            _ => active == Some(id),
                        },
                        last_seen_ms: s.last_seen_ms,
                    })
                    .collect(),
                failure_policy: st.dispatcher.policy().clone(),
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
            consumers: Vec::new(),
            failure_policy: policy,
        })
    }

    /// Publishes `records` to `topic` centrally.
    ///
    /// # Errors
    /// [`ConsumerError::NotFound`], [`ConsumerError::Conflict`]
    /// (`writer_conflict`: an edge replicates into the topic).
    pub async fn publish(
        &self,
        topic: &TopicName,
        records: Vec<Record>,
    ) -> Result<(u64, u64), ConsumerError> {
        let ack = self.topics.append_central(topic, records, false).await?;
        Ok((ack.base_offset, ack.next_offset))
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
        let found = tiered::read_range(&wal, self.archive(), topic, from, limit).await?;
        let messages: Vec<Message> = found
            .iter()
            .map(|(o, r)| records::to_message(*o, r, encoding))
            .collect();
        let next = messages.last().map_or(from, |m| m.offset + 1);
        Ok(ReceiveResponse {
            messages,
            cursor: next,
            high_water_mark: hwm,
            active: true,
            paused: false,
            blocked_at: None,
        })
    }

    /// Moves the messages `subscription` dead-lettered from the dead-letter
    /// topic back to `topic` (appended as new records without the
    /// `x-original-*`/poison headers, with `x-replayed-from` =
    /// `{dlq}@{offset}`). Progress through the dead-letter topic is a
    /// durable cursor at `/topics/{dlq}/subscriptions/replay.{sub}/cursor`,
    /// so a message is replayed once (at least once across a crash).
    ///
    /// # Errors
    /// [`ConsumerError::NotFound`], [`ConsumerError::Conflict`]
    /// (`writer_conflict` for a topic an edge writes).
    pub async fn replay_dlq(
        &self,
        topic: &TopicName,
        subscription: &str,
    ) -> Result<ReplayResponse, ConsumerError> {
        let name = subscription_name(subscription)?;
        let policy = Catalog::new(self.store.as_ref())
            .failure_policy(topic, &name)
            .await?
            .policy;
        let dlq = match &policy.dead_letter_topic {
            Some(t) => TopicName::new(t)
                .map_err(|e| ConsumerError::Internal(format!("dead_letter_topic {t}: {e}")))?,
            None => topic
                .with_suffix("-dlq")
                .map_err(|e| invalid("topic", e.to_string()))?,
        };
        let replay_name = SubscriptionName::new(&format!("replay.{name}")).map_err(|e| {
            invalid(
                "subscription",
                format!("subscription: too long to replay: {e}"),
            )
        })?;
        let dlq_wal = match self.topics.open_existing(&dlq, false).await {
            Ok(wal) => wal,
            Err(TopicError::Catalog(CatalogError::TopicNotFound { .. })) => {
                return Ok(ReplayResponse {
                    dead_letter_topic: dlq.to_string(),
                    replayed: 0,
                    offsets: Vec::new(),
                    dead_letter_cursor: 0,
                });
            }
            Err(e) => return Err(e.into()),
        };
        let cursor_key = keys::topics::subscription_cursor(&dlq, &replay_name);
        let from = self
            .store
            .get(&cursor_key)
            .await?
            .and_then(|v| v.as_u64())
            .unwrap_or(0)
            .max(dlq_wal.log_start_offset());
        let found = records::blocking(&dlq_wal, move |w| {
            records::read_range_blocking(w, from, 10_000)
        })
        .await?;
        let end = found.last().map_or(from, |(o, _)| o + 1);
        let topic_text = topic.to_string();
        let sub_text = name.to_string();
        let mut replay = Vec::new();
        for (offset, record) in found {
            let header = |n: &str| {
                record
                    .headers
                    .iter()
                    .find(|(k, _)| k == n)
                    .map(|(_, v)| v.clone())
            };
            if header("x-original-topic").as_deref() != Some(topic_text.as_bytes())
                || header("x-original-subscription").as_deref() != Some(sub_text.as_bytes())
            {
                continue;
            }
            let mut record = record;
            record.headers.retain(|(k, _)| {
                !tributary_api::consumer::DEAD_LETTER_HEADERS.contains(&k.as_str())
            });
            record.headers.push((
                "x-replayed-from".into(),
                Bytes::from(format!("{dlq}@{offset}")),
            ));
            replay.push(record);
        }
        let mut offsets = Vec::new();
        if !replay.is_empty() {
            let count = replay.len() as u64;
            let ack = self.topics.append_central(topic, replay, false).await?;
            offsets = (ack.base_offset..ack.base_offset + count).collect();
        }
        self.store.put(&cursor_key, json!(end)).await?;
        info!(%topic, subscription = %name, dlq = %dlq, replayed = offsets.len(), "replayed dead-lettered messages");
        Ok(ReplayResponse {
            dead_letter_topic: dlq.to_string(),
            replayed: offsets.len() as u64,
            offsets,
            dead_letter_cursor: end,
        })
    }
}
