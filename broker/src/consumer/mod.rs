//! Central consumers: subscriptions on the broker's topic WALs, served over
//! HTTP ([`http`], `docs/consumer-api.md`).
//!
//! Each loaded subscription is a `session::Subscription`: an I/O-free
//! state machine of its consumer sessions around a
//! [`Dispatcher`](tributary_proto::dispatch::Dispatcher). This module and
//! its children are the shell that feeds it the injected [`Clock`], the
//! WAL's high-water mark and Raft, and carries out its decisions: `attach`
//! (sessions, start positions), `delivery` (receive, read, ack, nack and
//! their long polls), `dead_letter` (copies to the dead-letter topic, made
//! with the subscription lock released; replay), `manage` (seek, pause,
//! unsubscribe, state, publish, peek).
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
//! - **Sessions** end after `session_timeout_ms` without a call, on a
//!   take-over by `consumer_name`, or on detach; their leases are
//!   redelivered at once, counted as failed deliveries except on detach
//!   (so a message that crashes its consumer reaches the poison policy).
//! - **Cursor persistence** is batched (`cursor_persist_every_acks` acks or
//!   `cursor_persist_interval_ms`, whichever first, and at shutdown, seek,
//!   pause): after a crash a subscription resumes at the persisted cursor,
//!   so at most what was acknowledged since is delivered again.
//! - **Failure policy changes** made through the admin API are picked up
//!   within `policy_refresh_ms`; a change lifts a `block`.
//!
//! A topic is consumed on the broker that holds its WAL (single-node
//! deployments, or the broker the edge replicates to).

mod attach;
mod damage;
mod dead_letter;
mod delivery;
mod fence;
pub mod http;
mod idempotent;
mod manage;
pub mod records;
mod session;
pub mod tiered;

pub use idempotent::KeyedPublish;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use broker_core::catalog::{Catalog, CatalogError};
use broker_core::clock::Clock;
use broker_core::metadata::{MetadataError, MetadataStore};
use broker_core::wal::Wal;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::{Mutex, MutexGuard, Notify};
use tracing::{error, info, warn};
use tributary_api::consumer::SubscriptionType;
use tributary_proto::dispatch::{Action, PersistPolicy};
use tributary_proto::keys::{self, SubscriptionName, TopicName};

use crate::replication::topics::{TopicError, TopicStore};

use self::records::ReadError;
use self::session::{SessionError, SessionTimings, Subscription};

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
    /// How long a subscription waits at a damaged range (re-reading it:
    /// the broker may heal it by re-fetching it from the edge) before the
    /// poison policy applies (`dead_letter`: a dead-letter entry and a gap
    /// notice; `block`: halted until it heals or is skipped), ms. Default
    /// 60000.
    pub damage_wait_ms: u64,
}

impl Default for ConsumerConfig {
    fn default() -> Self {
        ConsumerConfig {
            cursor_persist_every_acks: 1000,
            cursor_persist_interval_ms: 5000,
            session_timeout_ms: 30_000,
            tick_ms: 250,
            policy_refresh_ms: 2000,
            damage_wait_ms: 60_000,
        }
    }
}

/// Errors of consumer operations, each with an HTTP status in [`http`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConsumerError {
    /// An `ack=archived` publish whose records were lost with their owner:
    /// another broker took the topic over before they were archived (503
    /// `owner_changed`, re-publish).
    #[error("{0}")]
    OwnerChanged(String),
    /// Bad input naming the field (400).
    #[error("{message}")]
    Invalid {
        /// The request field.
        field: String,
        /// What is wrong, starting with the field's name
        /// (`subscription: ...`).
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
    /// Another broker took the topic during the request (`409
    /// not_owner` with `owner`, `epoch` and `owner_url`): retry, and the
    /// next request is redirected to it. (Ownership is checked before a
    /// request runs; this is the race with a move.)
    #[error(
        "the topic moved to broker {} (epoch {}) during the request: retry (its admin API is {})",
        .0.broker_id, .0.epoch, .0.admin_url
    )]
    MovedTo(crate::cluster::Owner),
    /// Records over the size limits (413); nothing stored.
    #[error("{0}")]
    TooLarge(String),
    /// A read that reached a damaged range before any good record (503,
    /// `damaged_range`; it may heal: retry). Peek only: subscriptions wait
    /// at the range and report it in the response.
    #[error("offsets {first_offset}..{end_offset} are damaged: {reason}")]
    Damaged {
        /// First damaged offset.
        first_offset: u64,
        /// Exclusive end.
        end_offset: u64,
        /// What the WAL said.
        reason: String,
    },
    /// The broker's un-archived WAL budget is reached (507,
    /// `budget_exceeded`): nothing was stored; retry with backoff.
    #[error("{0}")]
    BudgetExceeded(String),
    /// The broker's disk is full (507, `disk_full`): nothing was stored;
    /// retry with backoff (the topic's WAL is reopened by the next write
    /// once space is free).
    #[error("disk_full: {0}")]
    DiskFull(String),
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
            TopicError::Wal(e) if e.is_disk_full() => ConsumerError::DiskFull(format!(
                "the broker's disk is full, nothing was stored; retry with backoff ({e})"
            )),
            e @ (TopicError::Conflict { .. } | TopicError::WriterConflict { .. }) => ConsumerError::Conflict {
                kind: "writer_conflict",
                message: e.to_string(),
            },
            TopicError::NotOwner(owner) => ConsumerError::MovedTo(owner),
            e @ TopicError::NoOwner(_) => ConsumerError::Conflict {
                kind: "not_owner",
                message: e.to_string(),
            },
            // The topic was closed here under the request: its ownership
            // moved (the new owner starts at the archive's end) or the
            // broker is stopping. Nothing was acknowledged; retry.
            TopicError::Wal(broker_core::wal::WalError::Closed) => ConsumerError::Conflict {
                kind: "not_owner",
                message: "the topic was closed on this broker during the request (its ownership moved, or the broker is stopping): nothing was acknowledged, retry".into(),
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

/// One loaded subscription: what never changes, the topic's WAL handle,
/// and its session machine behind the subscription lock.
struct Sub {
    topic: TopicName,
    name: SubscriptionName,
    /// The topic's WAL handle; replaced when the topic is reopened under
    /// the same ownership epoch ([`ConsumerService::fresh`]).
    wal: std::sync::Mutex<Arc<Wal>>,
    /// The ownership epoch the WAL was opened under when the subscription
    /// was loaded (`None` without a cluster).
    epoch: Option<u64>,
    durable: bool,
    /// The cursor this broker last found stored or wrote for the
    /// subscription (`None`: none stored): what a hand-over
    /// ([`ConsumerService::hand_off`]) compares before it writes.
    written: std::sync::Mutex<Option<u64>>,
    producer_id: String,
    state: Mutex<Subscription>,
    /// Wakes long polls when the subscription changes.
    changed: Notify,
}

impl Sub {
    /// The topic's WAL handle now.
    fn wal(&self) -> Arc<Wal> {
        self.wal
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

type SubKey = (TopicName, SubscriptionName);

/// How long after a topic moved here from a live broker a subscription
/// waits before it is loaded (the old owner's hand-over), ms.
const HAND_OVER_GRACE_MS: i64 = 2_000;

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
    /// Topic ownership: fences cursor writes and dead-letter copies
    /// ([`ConsumerService::set_cluster`]).
    cluster: std::sync::OnceLock<Arc<crate::cluster::Cluster>>,
    /// Every timing rule (sessions, leases, long polls, cursor batching)
    /// reads this.
    clock: Arc<dyn Clock>,
    /// Set when the broker stops ([`ConsumerService::stop_long_polls`]).
    stopping: std::sync::atomic::AtomicBool,
}

impl ConsumerService {
    /// Ends every long poll (`receive`, `read`) within its next wake-up
    /// (at most 250 ms): each answers what it has, usually nothing, as at
    /// the end of its `max_wait_ms`, and later ones do not wait. Called
    /// when the broker stops, so open polls are answered before the HTTPS
    /// listener's drain instead of being cut off at its end.
    pub fn stop_long_polls(&self) {
        self.stopping
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether [`ConsumerService::stop_long_polls`] was called.
    pub(crate) fn stopping(&self) -> bool {
        self.stopping.load(std::sync::atomic::Ordering::SeqCst)
    }
}

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
    /// `x-original-producer-id` of centrally published records; `clock`
    /// times sessions, leases and long polls (production: `SystemClock`).
    pub fn new(
        topics: Arc<TopicStore>,
        store: Arc<dyn MetadataStore>,
        config: ConsumerConfig,
        broker_addr: String,
        node_id: u64,
        clock: Arc<dyn Clock>,
    ) -> Arc<ConsumerService> {
        // Session ids never repeat across restarts of this broker.
        let first_id = clock.now_ms().saturating_mul(1000);
        Arc::new(ConsumerService {
            topics,
            store,
            config,
            broker_addr,
            node_id,
            subs: Mutex::default(),
            stopping: std::sync::atomic::AtomicBool::new(false),
            next_consumer: AtomicU64::new(first_id),
            archive: std::sync::OnceLock::new(),
            cluster: std::sync::OnceLock::new(),
            clock,
        })
    }

    /// Now on the injected clock, ms since the Unix epoch.
    fn now_ms(&self) -> i64 {
        i64::try_from(self.clock.now_ms()).unwrap_or(i64::MAX)
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

    fn session_timings(&self) -> SessionTimings {
        SessionTimings {
            session_timeout_ms: i64::try_from(self.config.session_timeout_ms).unwrap_or(i64::MAX),
            policy_refresh_ms: i64::try_from(self.config.policy_refresh_ms).unwrap_or(i64::MAX),
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
            if let Some(now) = self.stale_epoch(&sub) {
                // No stale lease expiry, dead-letter copy or cursor write.
                self.unload_stale(&sub, now).await;
                continue;
            }
            if let Some((owner, epoch)) = self.taken_over(&sub) {
                self.hand_off(&sub, owner, epoch).await;
                continue;
            }
            if self.deleted(&sub).await {
                self.forget(&sub).await;
                info!(topic = %sub.topic, subscription = %sub.name, "the subscription (or its topic) was deleted: it is unloaded and its consumer sessions end");
                continue;
            }
            let now = self.now_ms();
            let mut st = sub.state.lock().await;
            let Some(tick) = st.tick(now) else {
                continue;
            };
            for (id, released) in tick.expired {
                info!(topic = %sub.topic, subscription = %sub.name, consumer = id, released, "consumer session expired; its leases are redelivered");
                sub.changed.notify_waiters();
            }
            log_actions(&sub, &tick.actions);
            let mut st = self.flush_dead_letters(&sub, st).await;
            if tick.refresh_policy {
                let catalog = Catalog::new(self.store.as_ref());
                match catalog.failure_policy(&sub.topic, &sub.name).await {
                    Ok(view) => {
                        if view.persisted && st.set_policy(view.policy) {
                            info!(topic = %sub.topic, subscription = %sub.name, "failure policy changed; applying it");
                            sub.changed.notify_waiters();
                        }
                    }
                    Err(e) => {
                        warn!(topic = %sub.topic, subscription = %sub.name, error = %e, "re-reading the failure policy")
                    }
                }
            }
            self.persist(&sub, &mut st, false).await;
            if st.end_if_unused() {
                drop(st);
                self.subs
                    .lock()
                    .await
                    .remove(&(sub.topic.clone(), sub.name.clone()));
                info!(topic = %sub.topic, subscription = %sub.name, "ephemeral subscription removed: its last consumer session ended");
            }
        }
    }

    /// Writes the cursor of every durable subscription of `topic` loaded
    /// here now (before a planned move hands the topic over).
    pub async fn persist_topic(&self, topic: &TopicName) {
        let subs: Vec<Arc<Sub>> = self
            .subs
            .lock()
            .await
            .values()
            .filter(|s| &s.topic == topic)
            .cloned()
            .collect();
        for sub in subs {
            let mut st = sub.state.lock().await;
            self.persist(&sub, &mut st, true).await;
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

    /// Writes the cursor to Raft if the batching policy (or `force`) says
    /// so. Runs under the subscription lock, so cursor writes stay in order.
    /// Nothing is written for a subscription loaded under another ownership
    /// epoch than the one this broker serves the topic under now: another
    /// broker may have served it since (it is unloaded by the next call
    /// that reaches it, [`ConsumerService::fresh`]).
    async fn persist(&self, sub: &Sub, st: &mut Subscription, force: bool) {
        if self.stale_epoch(sub).is_some() {
            return;
        }
        if let Some(cursor) = st.poll_persist(self.now_ms(), force) {
            if self.deleted(sub).await {
                return;
            }
            let done_above = st.dispatcher().done_above();
            match self
                .put_cursor(&sub.topic, &sub.name, cursor, &done_above)
                .await
            {
                Ok(()) => {
                    *sub.written
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(cursor);
                }
                Err(e) => {
                    error!(topic = %sub.topic, subscription = %sub.name, cursor, error = %e, "persisting the cursor failed; it is retried with the next acknowledgement");
                }
            }
        }
    }

    /// The ownership epoch this broker owns `sub`'s topic under now, if
    /// `sub` was loaded under another one (`None` without a cluster, and
    /// while another broker owns it: those writes are fenced in Raft).
    fn stale_epoch(&self, sub: &Sub) -> Option<u64> {
        match self.cluster.get()?.route(&sub.topic) {
            crate::cluster::Route::Local { epoch } if sub.epoch.is_some_and(|e| e != epoch) => {
                Some(epoch)
            }
            _ => None,
        }
    }

    /// Another broker's ownership of `sub`'s topic (owner, epoch), once
    /// Raft says the topic moved away from the epoch `sub` was loaded
    /// under (a move, a rebalance, a takeover after this broker's lease
    /// lapsed).
    fn taken_over(&self, sub: &Sub) -> Option<(u64, u64)> {
        let cluster = self.cluster.get()?;
        let loaded_at = sub.epoch?;
        cluster
            .owner(&sub.topic)
            .filter(|(owner, epoch)| *owner != cluster.me() && *epoch != loaded_at)
    }

    /// Hands `sub` over to the topic's new owner: the acknowledged
    /// progress not yet persisted (batched) is written, but only if the
    /// stored cursor is still the one this broker last found or wrote, so
    /// nothing the new owner wrote since (a seek, its own progress) is
    /// overwritten; then the subscription is unloaded here (its sessions
    /// end, the consumers attach again and are sent to the new owner).
    /// Without it a planned move redelivered everything acknowledged in
    /// the last persist interval.
    async fn hand_off(&self, sub: &Arc<Sub>, owner: u64, epoch: u64) {
        let (cursor, done_above) = {
            let st = sub.state.lock().await;
            (st.dispatcher().cursor(), st.dispatcher().done_above())
        };
        let written = *sub
            .written
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if sub.durable && (written != Some(cursor) || !done_above.is_empty()) {
            let key = keys::topics::subscription_cursor(&sub.topic, &sub.name);
            let txn = match written {
                Some(w) => broker_core::metadata::Txn::new().when_equals(key.clone(), json!(w)),
                None => broker_core::metadata::Txn::new().when_absent(key.clone()),
            };
            let txn = fence::with_cursor(txn, &sub.topic, &sub.name, cursor, &done_above);
            match self.store.txn(txn).await {
                Ok(outcome) if outcome.applied() => {
                    info!(topic = %sub.topic, subscription = %sub.name, cursor, owner, epoch, "the topic moved: this broker's acknowledged progress is stored for the new owner");
                }
                Ok(_) => {
                    info!(topic = %sub.topic, subscription = %sub.name, cursor, owner, epoch, "the topic moved and the new owner already wrote the cursor: this broker's progress is not written over it");
                }
                Err(e) => {
                    warn!(topic = %sub.topic, subscription = %sub.name, cursor, error = %e, "the topic moved: storing this broker's acknowledged progress failed; the new owner redelivers from the stored cursor");
                }
            }
        }
        self.forget(sub).await;
    }

    /// The subscription if it is loaded on this broker (a consumer attached).
    async fn loaded(&self, topic: &TopicName, name: &SubscriptionName) -> Option<Arc<Sub>> {
        self.subs
            .lock()
            .await
            .get(&(topic.clone(), name.clone()))
            .cloned()
    }

    /// The loaded subscription a call naming a consumer session works on,
    /// after [`ConsumerService::current`].
    async fn sub(
        &self,
        topic: &TopicName,
        name: &SubscriptionName,
    ) -> Result<Arc<Sub>, ConsumerError> {
        let sub = self.loaded(topic, name).await.ok_or_else(|| {
            ConsumerError::NotFound(format!(
                "subscription {name} of {topic} has no consumer attached on this broker: attach first"
            ))
        })?;
        self.current(sub).await
    }

    /// The subscription if it is loaded here, after [`ConsumerService::fresh`]
    /// (`None` also when it was just unloaded).
    async fn loaded_fresh(
        &self,
        topic: &TopicName,
        name: &SubscriptionName,
    ) -> Result<Option<Arc<Sub>>, ConsumerError> {
        match self.loaded(topic, name).await {
            Some(sub) => self.fresh(sub).await,
            None => Ok(None),
        }
    }

    /// [`ConsumerService::fresh`], with an unloaded subscription refused:
    /// `404`, "attach again".
    async fn current(&self, sub: Arc<Sub>) -> Result<Arc<Sub>, ConsumerError> {
        let (topic, name) = (sub.topic.clone(), sub.name.clone());
        self.fresh(sub).await?.ok_or_else(|| {
            ConsumerError::NotFound(format!(
                "subscription {name} of {topic} was unloaded: the topic was reopened under another ownership epoch, which ended its consumer sessions; attach again (delivery resumes at the stored cursor)"
            ))
        })
    }

    /// `sub` as long as its WAL handle is the topic's current one. A
    /// handle whose writer stopped means the topic was closed here (its
    /// ownership moved, its lease lapsed) or its WAL latched a failure, and
    /// it may have been opened again: a subscription still reading the old
    /// handle would never see another record. So it takes the handle the
    /// topic store holds now, opening the topic if none is open (or naming
    /// the owner: `409 not_owner`, and the next request is redirected),
    /// and:
    /// - under the same ownership epoch (a latched WAL reopened) the
    ///   subscription takes the new handle and keeps its sessions, leases
    ///   and cursor;
    /// - under another epoch the local WAL is a new log (a takeover starts
    ///   it at the archive's end) and another broker may have served the
    ///   subscription meanwhile, so what this broker holds in memory is
    ///   stale: the subscription is unloaded (`None`), its sessions end,
    ///   and the next attach loads the stored cursor.
    async fn fresh(&self, sub: Arc<Sub>) -> Result<Option<Arc<Sub>>, ConsumerError> {
        let old = sub.wal();
        if !old.writer_stopped() {
            return Ok(Some(sub));
        }
        let wal = match self.topics.get(&sub.topic).await {
            Some(current) if !Arc::ptr_eq(&current, &old) => current,
            // Latched, and not reopened yet: its records stay readable
            // through it, and the topic's next write reopens it (a read
            // never does: on a disk still full that would be a failing
            // recovery per long-poll round).
            Some(_) => return Ok(Some(sub)),
            None => self.topics.open_existing(&sub.topic, false).await?,
        };
        if let Some(now) = self.stale_epoch(&sub) {
            self.unload_stale(&sub, now).await;
            return Ok(None);
        }
        *sub.wal
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = wal;
        info!(topic = %sub.topic, subscription = %sub.name, "the topic's WAL was reopened; the subscription reads the new handle");
        Ok(Some(sub))
    }

    /// Removes `sub` from this broker: its sessions end, nothing more is
    /// written for it, the next attach loads it anew.
    async fn forget(&self, sub: &Arc<Sub>) {
        {
            let mut subs = self.subs.lock().await;
            let key = (sub.topic.clone(), sub.name.clone());
            if subs.get(&key).is_some_and(|s| Arc::ptr_eq(s, sub)) {
                subs.remove(&key);
            }
        }
        sub.state.lock().await.remove();
        sub.changed.notify_waiters();
    }

    /// Forgets `sub`, loaded under an ownership epoch other than `now`
    /// (the one its topic is served under here now): its sessions end,
    /// nothing more is written for it, the next attach loads it anew.
    async fn unload_stale(&self, sub: &Arc<Sub>, now: u64) {
        self.forget(sub).await;
        warn!(topic = %sub.topic, subscription = %sub.name, was = sub.epoch, now, "the topic is served here under another ownership epoch than when the subscription was loaded; it is unloaded and its consumers must attach again");
    }

    /// The subscription lock of `sub`, once `consumer`'s session is known
    /// live; the call keeps that session alive.
    async fn session<'a>(
        &self,
        sub: &'a Sub,
        consumer: u64,
    ) -> Result<MutexGuard<'a, Subscription>, ConsumerError> {
        let mut st = sub.state.lock().await;
        match st.touch(self.now_ms(), consumer) {
            Ok(()) => Ok(st),
            Err(SessionError::Removed) => Err(ConsumerError::NotFound(format!(
                "subscription {} of {} was removed",
                sub.name, sub.topic
            ))),
            Err(SessionError::NoSession) => Err(ConsumerError::NotFound(format!(
                "consumer {consumer} has no session on subscription {} (expired or never attached): attach again",
                sub.name
            ))),
        }
    }
}

/// Logs the poison decisions that need no further work (dead-letter copies
/// are made by [`ConsumerService::flush_dead_letters`]).
fn log_actions(sub: &Sub, actions: &[Action]) {
    for action in actions {
        match action {
            Action::DeadLetter { .. } => {}
            Action::Blocked { offset } => {
                warn!(topic = %sub.topic, subscription = %sub.name, offset, "poison message: delivery halts here (poison policy block) until it is acknowledged, the policy changes or an admin seeks past it");
            }
            Action::Dropped { offset } => {
                warn!(topic = %sub.topic, subscription = %sub.name, offset, "poison message dropped (poison policy none)");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A move that lands during a request names the new owner's admin
    /// API, not its QUIC ingest address (which a consumer cannot use).
    #[test]
    fn a_topic_moved_during_a_request_is_a_not_owner_naming_the_admin_url() {
        let owner = crate::cluster::Owner {
            broker_id: 3,
            epoch: 6,
            ingest_addr: "127.0.0.1:23023".into(),
            admin_url: "https://127.0.0.1:23003".into(),
        };
        let api = crate::http::ApiError::from(ConsumerError::from(TopicError::NotOwner(owner)));
        let response = axum::response::IntoResponse::into_response(api);
        assert_eq!(response.status(), axum::http::StatusCode::CONFLICT);
        let body = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(axum::body::to_bytes(response.into_body(), 4096))
            .unwrap();
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            body,
            json!({
                "error": "the topic moved to broker 3 (epoch 6) during the request: retry (its admin API is https://127.0.0.1:23003)",
                "kind": "not_owner",
                "owner": 3,
                "epoch": 6,
                "owner_url": "https://127.0.0.1:23003",
            })
        );
    }

    #[test]
    fn a_wal_closed_under_a_request_is_a_retryable_not_owner() {
        let e = ConsumerError::from(TopicError::Wal(broker_core::wal::WalError::Closed));
        match e {
            ConsumerError::Conflict { kind, message } => {
                assert_eq!(kind, "not_owner");
                assert!(
                    message.contains("nothing was acknowledged, retry"),
                    "{message}"
                );
            }
            other => panic!("{other:?}"),
        }
    }
}
