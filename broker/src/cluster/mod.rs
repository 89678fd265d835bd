//! Topic ownership across brokers: membership leases, the owner of every
//! topic with its epoch, the load manager, and the fencing precondition
//! central writes carry. Values and placement rules are in
//! [`tributary_proto::cluster`]; this module is the tokio shell around them.
//!
//! - [`lease`]: this broker's `/cluster/brokers/{id}/state`, put with a TTL
//!   every heartbeat. The broker serves its topics only while its lease is
//!   *fresh*: less than `lease_ttl − lease_margin` since the start of the
//!   last successful renewal (monotonic clock). The load manager may
//!   reassign a topic only once the key expired, `lease_ttl` after that
//!   renewal was proposed, by the leader's wall clock; so as long as the
//!   brokers' clocks agree within `lease_margin` (default 1.5 s; NTP keeps
//!   them within milliseconds), a broker stops acknowledging before anyone
//!   else may own its topics.
//! - [`view`]: `/cluster/*` as watched.
//! - [`manager`]: the load manager, run by the Raft leader.
//! - [`identity`]: the cluster's id at `/cluster/id`, created once.
//!
//! A stale owner is fenced in Raft regardless of timing: descriptor
//! commits, cursor writes and unload `state` carry
//! [`Cluster::fence`]'s precondition (the owner's exact assignment value).

pub mod identity;
pub mod lease;
pub mod manager;
pub mod view;

use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use broker_core::clock::Clock;
use broker_core::metadata::{
    MetadataError, MetadataStore, Precondition, Txn, WatchError, WatchEvent,
};
use serde::Serialize;
use tokio::sync::watch;
use tributary_proto::cluster::{Assignment, BrokerLifecycle, BrokerState, Unassigned};
use tributary_proto::keys::{TopicName, cluster as keys};

use self::view::View;

/// Default [`ClusterConfig::restart_hold_ms`].
pub const DEFAULT_RESTART_HOLD_MS: u64 = 60_000;

/// Lease and heartbeat settings (`[cluster]` in the broker configuration).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterConfig {
    /// How long a lease lives without renewal, ms. Default 5000.
    pub lease_ttl_ms: u64,
    /// How often the lease is renewed and the load manager runs, ms.
    /// Default 1000.
    pub heartbeat_ms: u64,
    /// How long before its lease could lapse a broker stops serving its
    /// topics, ms: the clock skew tolerated between brokers. Default 1500.
    pub lease_margin_ms: u64,
    /// The ingest address edges are redirected to (`host:port`).
    pub ingest_addr: String,
    /// The admin API base URL consumers are redirected to.
    pub admin_url: String,
    /// How long a broker stopped gracefully (SIGTERM) holds the topics it
    /// kept (centrally written ones, which have no edge copy) before they
    /// are taken over at the archive's end, ms. Default 60000; 0: only
    /// the lease.
    pub restart_hold_ms: u64,
}

impl ClusterConfig {
    /// Defaults with these addresses.
    pub fn new(ingest_addr: String, admin_url: String) -> ClusterConfig {
        ClusterConfig {
            lease_ttl_ms: 5000,
            heartbeat_ms: 1000,
            lease_margin_ms: 1500,
            ingest_addr,
            admin_url,
            restart_hold_ms: DEFAULT_RESTART_HOLD_MS,
        }
    }
}

/// Where requests for a topic go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// This broker owns the topic at `epoch` and holds a fresh lease.
    Local {
        /// The ownership epoch.
        epoch: u64,
    },
    /// Another broker owns it and holds its lease.
    Remote(Owner),
    /// Nobody serves it now: unassigned, its owner's lease lapsed, or this
    /// broker owns it but its own lease is not fresh.
    Unassigned {
        /// Why, for the error message.
        reason: String,
    },
}

/// Another broker that owns a topic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Owner {
    /// Its node id.
    pub broker_id: u64,
    /// The ownership epoch.
    pub epoch: u64,
    /// Its ingest address, `host:port`.
    pub ingest_addr: String,
    /// Its admin API base URL.
    pub admin_url: String,
}

/// A broker as `tribctl cluster status` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BrokerStatus {
    /// Node id.
    pub broker_id: u64,
    /// Ingest address.
    pub ingest_addr: String,
    /// Admin API base URL.
    pub admin_url: String,
    /// Whether its lease is held now.
    pub live: bool,
    /// `active` or `draining`.
    pub lifecycle: BrokerLifecycle,
    /// Ms since its last renewal (wall clock).
    pub lease_age_ms: u64,
    /// Topics assigned to it.
    pub topics_owned: usize,
    /// Bytes per second appended, as it last reported.
    pub bytes_in_per_s: u64,
}

/// Why an ownership operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterError {
    /// The metadata store failed.
    #[error(transparent)]
    Metadata(#[from] MetadataError),
    /// The placement rules refuse the move.
    #[error(transparent)]
    Move(#[from] tributary_proto::cluster::placement::MoveError),
    /// The topic is written centrally (no edge copy): a new owner would
    /// start at the archive's end and strand what is not archived yet, so
    /// it moves only when its owner dies (see `docs/architecture.md`).
    #[error(
        "topic {0} is written centrally (consumer-API appends, dead-letter copies): it has no edge copy, \
         and a new owner would start at the archive's end, stranding records not archived yet; \
         it is not moved while its owner lives"
    )]
    CentralWritten(TopicName),
    /// Another writer changed the topic's ownership first.
    #[error("ownership of {0} changed meanwhile; retry")]
    Contended(TopicName),
    /// No such topic.
    #[error("topic {0} does not exist")]
    TopicNotFound(TopicName),
}

/// This broker's ownership state.
pub struct Cluster {
    me: u64,
    store: Arc<dyn MetadataStore>,
    clock: Arc<dyn Clock>,
    config: ClusterConfig,
    view: RwLock<View>,
    /// Start of the last successful lease renewal.
    renewed: Mutex<Option<Instant>>,
    /// Bumped on every change of the view or the lease.
    changes: watch::Sender<u64>,
    lifecycle: Mutex<BrokerLifecycle>,
    /// Bytes appended to central WALs, for the load report.
    pub(crate) bytes_in: std::sync::atomic::AtomicU64,
    /// Timestamp (ms) of the last rebalancing-history entry this broker
    /// wrote: each entry gets its own key even when many moves are made in
    /// one millisecond ([`Cluster::history_timestamp`]).
    last_history_ms: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("me", &self.me)
            .finish_non_exhaustive()
    }
}

impl Cluster {
    /// Ownership state of broker `me` over `store`.
    pub fn new(
        me: u64,
        store: Arc<dyn MetadataStore>,
        clock: Arc<dyn Clock>,
        config: ClusterConfig,
    ) -> Arc<Cluster> {
        Arc::new(Cluster {
            me,
            store,
            clock,
            config,
            view: RwLock::default(),
            renewed: Mutex::new(None),
            changes: watch::channel(0).0,
            lifecycle: Mutex::new(BrokerLifecycle::Active),
            bytes_in: std::sync::atomic::AtomicU64::new(0),
            last_history_ms: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// The key timestamp of a new `/cluster/rebalancing_history/{ts}`
    /// entry (seed 001: one entry per move): now, or one past the last
    /// entry this broker wrote if that is not earlier, so a burst of moves
    /// (a fleet's first contact assigns hundreds of topics at once) keeps
    /// one entry each, in order, spread over consecutive milliseconds.
    fn history_timestamp(&self, now_ms: u64) -> u64 {
        use std::sync::atomic::Ordering;
        let mut last = self.last_history_ms.load(Ordering::Relaxed);
        loop {
            let ts = now_ms.max(last + 1);
            match self.last_history_ms.compare_exchange_weak(
                last,
                ts,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return ts,
                Err(seen) => last = seen,
            }
        }
    }

    /// This broker's id.
    pub fn me(&self) -> u64 {
        self.me
    }

    /// The settings.
    pub fn config(&self) -> &ClusterConfig {
        &self.config
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, View> {
        self.view
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn bump(&self) {
        self.changes.send_modify(|v| *v += 1);
    }

    /// A receiver that changes whenever the view or the lease does.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Whether this broker's lease is fresh now.
    pub fn lease_fresh(&self) -> bool {
        let renewed = *self
            .renewed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let fresh_for = Duration::from_millis(
            self.config
                .lease_ttl_ms
                .saturating_sub(self.config.lease_margin_ms),
        );
        renewed.is_some_and(|at| self.clock.now().saturating_duration_since(at) < fresh_for)
    }

    /// Waits, at most `timeout`, for this broker's first lease after it
    /// started; returns at once once any lease was ever renewed (a lease
    /// that lapsed later is a partition or an overload, refused without
    /// waiting). An edge that connects while a broker is still starting is
    /// then served instead of being refused and reconnecting.
    pub async fn wait_first_lease(&self, timeout: Duration) {
        let mut changes = self.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let ever = self
                .renewed
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .is_some();
            if ever {
                return;
            }
            if tokio::time::timeout_at(deadline, changes.changed())
                .await
                .map_or(true, |r| r.is_err())
            {
                return;
            }
        }
    }

    pub(crate) fn lease_renewed(&self, started: Instant) {
        let was_fresh = self.lease_fresh();
        *self
            .renewed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(started);
        if !was_fresh {
            self.bump();
        }
    }

    pub(crate) fn lifecycle(&self) -> BrokerLifecycle {
        *self
            .lifecycle
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Marks this broker draining: it gets no new topics.
    pub fn set_draining(&self) {
        *self
            .lifecycle
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = BrokerLifecycle::Draining;
    }

    /// Where requests for `topic` go now.
    pub fn route(&self, topic: &TopicName) -> Route {
        let now = self.clock.now_ms();
        let view = self.read();
        let Some((owner, assignment)) = view.owners.get(topic) else {
            return Route::Unassigned {
                reason: format!("topic {topic} has no owner yet"),
            };
        };
        if *owner == self.me {
            return if self.lease_fresh() {
                Route::Local {
                    epoch: assignment.epoch,
                }
            } else {
                Route::Unassigned {
                    reason: format!(
                        "broker {} owns {topic} but cannot renew its lease (no Raft majority?)",
                        self.me
                    ),
                }
            };
        }
        match view.brokers.get(owner) {
            Some(state) if view.is_live(*owner, now) => Route::Remote(Owner {
                broker_id: *owner,
                epoch: assignment.epoch,
                ingest_addr: state.ingest_addr.clone(),
                admin_url: state.admin_url.clone(),
            }),
            _ => Route::Unassigned {
                reason: format!(
                    "the owner of {topic}, broker {owner}, holds no lease; it is being reassigned"
                ),
            },
        }
    }

    /// The owner and epoch of `topic`, live or not.
    pub fn owner(&self, topic: &TopicName) -> Option<(u64, u64)> {
        self.read().owners.get(topic).map(|(b, a)| (*b, a.epoch))
    }

    /// The assignment of `topic` to this broker, if it owns it.
    pub fn own_assignment(&self, topic: &TopicName) -> Option<Assignment> {
        match self.read().owners.get(topic) {
            Some((owner, a)) if *owner == self.me => Some(a.clone()),
            _ => None,
        }
    }

    /// The precondition that makes a central write valid only while this
    /// broker owns `topic` at `epoch`: its exact assignment value. `None`
    /// when it does not own the topic at that epoch.
    pub fn fence(&self, topic: &TopicName, epoch: u64) -> Option<Precondition> {
        let assignment = self.own_assignment(topic).filter(|a| a.epoch == epoch)?;
        Some(Precondition {
            key: keys::broker_assignment(self.me, topic),
            expected: Some(serde_json::to_value(assignment).ok()?),
        })
    }

    /// Every broker known, with lease and load.
    pub fn brokers(&self) -> Vec<BrokerStatus> {
        let now = self.clock.now_ms();
        let view = self.read();
        view.brokers
            .iter()
            .map(|(id, s)| BrokerStatus {
                broker_id: *id,
                ingest_addr: s.ingest_addr.clone(),
                admin_url: s.admin_url.clone(),
                live: view.is_live(*id, now),
                lifecycle: s.lifecycle,
                lease_age_ms: now.saturating_sub(s.renewed_at_ms),
                topics_owned: view.owned_by(*id),
                bytes_in_per_s: s.bytes_in_per_s,
            })
            .collect()
    }

    /// Topics this broker owns, with their epochs.
    pub fn owned(&self) -> Vec<(TopicName, u64)> {
        self.read()
            .owners
            .iter()
            .filter(|(_, (b, _))| *b == self.me)
            .map(|(t, (_, a))| (t.clone(), a.epoch))
            .collect()
    }

    /// Puts `topic` in the unassigned queue unless it is owned or queued
    /// already (first contact, or a topic from before ownership existed;
    /// `prefer` names a broker holding its local data).
    ///
    /// # Errors
    /// Metadata errors.
    pub async fn ensure_placed(
        &self,
        topic: &TopicName,
        prefer: Option<u64>,
        reason: &str,
    ) -> Result<(), ClusterError> {
        let known_brokers: Vec<u64> = {
            let view = self.read();
            if view.owners.contains_key(topic) || view.unassigned.contains_key(topic) {
                return Ok(());
            }
            view.brokers.keys().copied().collect()
        };
        let key = keys::unassigned(topic);
        let value = Unassigned {
            last_epoch: 0,
            last_owner: None,
            prefer,
            since_ms: self.clock.now_ms(),
            reason: reason.to_owned(),
        };
        let mut txn = Txn::new().when_absent(key.clone());
        for id in known_brokers.into_iter().chain([self.me]) {
            txn = txn.when_absent(keys::broker_assignment(id, topic));
        }
        let value = serde_json::to_value(value).map_err(|source| MetadataError::Encode {
            key: key.clone(),
            source,
        })?;
        // A failed precondition means someone placed it meanwhile: fine.
        let _ = self.store.txn(txn.put(key, value)).await?;
        Ok(())
    }

    /// Waits until `topic` routes somewhere other than `Unassigned`, at
    /// most `timeout`; returns the last route.
    pub async fn wait_route(&self, topic: &TopicName, timeout: Duration) -> Route {
        let mut changes = self.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let route = self.route(topic);
            if !matches!(route, Route::Unassigned { .. }) {
                return route;
            }
            if tokio::time::timeout_at(deadline, changes.changed())
                .await
                .map_or(true, |r| r.is_err())
            {
                return self.route(topic);
            }
        }
    }

    /// Keeps the view current from a watch on `/cluster/` until the store
    /// ends; re-lists after a lagged watch.
    pub async fn follow(self: Arc<Self>) {
        loop {
            let mut watch = match self.store.watch("/cluster/").await {
                Ok(watch) => watch,
                Err(e) => {
                    tracing::warn!(error = %e, "watching /cluster/ failed; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            };
            match self.store.list("/cluster/").await {
                Ok(entries) => {
                    let mut view = View::default();
                    for (key, value) in &entries {
                        view.apply(key, Some(value));
                    }
                    *self
                        .view
                        .write()
                        .unwrap_or_else(std::sync::PoisonError::into_inner) = view;
                    self.bump();
                }
                Err(e) => {
                    tracing::debug!(error = %e, "listing /cluster/ failed; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
            }
            loop {
                match watch.recv().await {
                    Ok(event) => {
                        {
                            let mut view = self
                                .view
                                .write()
                                .unwrap_or_else(std::sync::PoisonError::into_inner);
                            match &event {
                                WatchEvent::Put { key, value } => view.apply(key, Some(value)),
                                WatchEvent::Delete { key } => view.apply(key, None),
                            }
                        }
                        self.bump();
                    }
                    Err(WatchError::Lagged { .. }) => break,
                    Err(_) => return,
                }
            }
        }
    }

    /// Carries out one placement change as one transaction: the previous
    /// key must still hold exactly its value (and, for an `owner_dead`
    /// takeover, the previous owner's lease must have lapsed); it is
    /// removed and the new assignment written, with a history entry.
    ///
    /// # Errors
    /// [`ClusterError::Contended`] when the previous value changed;
    /// metadata errors.
    pub async fn apply_change(
        &self,
        change: &tributary_proto::cluster::placement::Change,
    ) -> Result<(), ClusterError> {
        use tributary_proto::cluster::placement::Previous;
        let (previous_key, previous_value) = match &change.previous {
            Previous::Unassigned(u) => (keys::unassigned(&change.topic), to_value(u)?),
            Previous::Owner(owner, a) => {
                (keys::broker_assignment(*owner, &change.topic), to_value(a)?)
            }
        };
        let now = self.clock.now_ms();
        let new_key = keys::broker_assignment(change.to, &change.topic);
        let history = serde_json::json!({
            "topic": change.topic.as_str(),
            "from": change.previous_owner(),
            "to": change.to,
            "epoch": change.assignment.epoch,
            "reason": change.assignment.reason,
        });
        let mut txn = Txn::new()
            .when_equals(previous_key.clone(), previous_value)
            .delete(previous_key)
            .put(new_key, to_value(&change.assignment)?)
            // History entries live a day.
            .put_with_ttl(
                keys::rebalancing_history(self.history_timestamp(now)),
                history,
                24 * 3600 * 1000,
            );
        if !matches!(change.previous, Previous::Unassigned(_)) {
            txn = txn.delete(keys::unassigned(&change.topic));
        }
        // A takeover from a dead owner needs its lease key lapsed (expired
        // keys read as absent) when the transaction applies: the load
        // manager plans from its watched view, and an owner that renewed
        // since (a restart shorter than the lease, a slow election) keeps
        // its topics instead of losing them to a needless new epoch.
        if let Previous::Owner(owner, _) = &change.previous
            && change.assignment.reason == tributary_proto::cluster::placement::OWNER_DEAD
        {
            txn = txn.when_absent(keys::broker_state(*owner));
        }
        if self.store.txn(txn).await?.applied() {
            tracing::info!(topic = %change.topic, from = change.previous_owner(), to = change.to, epoch = change.assignment.epoch, reason = %change.assignment.reason, "topic assigned");
            Ok(())
        } else {
            Err(ClusterError::Contended(change.topic.clone()))
        }
    }

    /// Moves `topic` to broker `to` (`tribctl topics move`): the edge is
    /// redirected on its next stream, the new owner opens the topic at the
    /// archive's end, the edge re-sends the rest from its retained log.
    ///
    /// # Errors
    /// [`ClusterError::Move`] when the rules refuse; as [`Cluster::apply_change`].
    pub async fn move_topic(&self, topic: &TopicName, to: u64) -> Result<u64, ClusterError> {
        let change = self.check_move(topic, to).await?;
        self.apply_move(&change).await
    }

    /// The change [`Cluster::move_topic`] would make to move `topic` to
    /// `to` now (nothing is written; [`Cluster::apply_move`] writes it, on
    /// the condition that the topic's ownership did not change meanwhile).
    ///
    /// # Errors
    /// [`ClusterError::TopicNotFound`], [`ClusterError::Move`],
    /// [`ClusterError::CentralWritten`], metadata errors.
    pub async fn check_move(
        &self,
        topic: &TopicName,
        to: u64,
    ) -> Result<tributary_proto::cluster::placement::Change, ClusterError> {
        if self.owner(topic).is_none()
            && self
                .store
                .get(&tributary_proto::keys::topics::marker(topic))
                .await?
                .is_none()
        {
            return Err(ClusterError::TopicNotFound(topic.clone()));
        }
        if let Some(broker) = tributary_proto::cluster::pinned_broker(topic) {
            return Err(ClusterError::Move(
                tributary_proto::cluster::placement::MoveError::Pinned {
                    topic: topic.clone(),
                    broker,
                },
            ));
        }
        if self.is_central_written(topic).await? {
            return Err(ClusterError::CentralWritten(topic.clone()));
        }
        self.plan_move(topic, to)
    }

    /// Writes a move planned by [`Cluster::check_move`]; returns the new
    /// epoch.
    ///
    /// # Errors
    /// As [`Cluster::apply_change`].
    pub async fn apply_move(
        &self,
        change: &tributary_proto::cluster::placement::Change,
    ) -> Result<u64, ClusterError> {
        self.apply_change(change).await?;
        Ok(change.assignment.epoch)
    }

    /// The placement rules' move of `topic` to `to` on the current view.
    fn plan_move(
        &self,
        topic: &TopicName,
        to: u64,
    ) -> Result<tributary_proto::cluster::placement::Change, ClusterError> {
        let now = self.clock.now_ms();
        let snapshot = self.read().snapshot(now);
        Ok(tributary_proto::cluster::placement::plan_move(
            &snapshot, topic, to, "move", now,
        )?)
    }

    /// [`Cluster::move_topic`] without the check for centrally written
    /// topics: the new owner starts at the archive's end and what the old
    /// owner had not archived stays in its quarantine. For tests that need
    /// a stale owner, and operators who accept that.
    ///
    /// # Errors
    /// As [`Cluster::move_topic`], never [`ClusterError::CentralWritten`].
    pub async fn move_topic_forced(&self, topic: &TopicName, to: u64) -> Result<u64, ClusterError> {
        let change = self.plan_move(topic, to)?;
        self.apply_move(&change).await
    }

    /// The moves that would even out topic counts (at most `max_moves`),
    /// leaving centrally written topics where they are; carried out unless
    /// `dry_run`.
    ///
    /// # Errors
    /// As [`Cluster::apply_change`].
    pub async fn rebalance(
        &self,
        dry_run: bool,
        max_moves: usize,
    ) -> Result<Vec<tributary_proto::cluster::placement::Change>, ClusterError> {
        let now = self.clock.now_ms();
        let snapshot = self.read().snapshot(now);
        let mut stay = std::collections::BTreeSet::new();
        for topic in snapshot.assignments.keys() {
            if self.is_central_written(topic).await? {
                stay.insert(topic.clone());
            }
        }
        let changes =
            tributary_proto::cluster::placement::plan_rebalance(&snapshot, now, max_moves, &stay);
        if !dry_run {
            for change in &changes {
                self.apply_change(change).await?;
            }
        }
        Ok(changes)
    }

    /// Hands every topic of this broker to the others (SIGTERM): marks it
    /// draining and applies [`tributary_proto::cluster::placement::plan_drain`],
    /// except to centrally written topics (they stay, and move only if the
    /// broker stays down past its lease). Returns how many topics moved.
    ///
    /// # Errors
    /// As [`Cluster::apply_change`].
    pub async fn drain(&self) -> Result<usize, ClusterError> {
        self.set_draining();
        let now = self.clock.now_ms();
        let snapshot = self.read().snapshot(now);
        let changes = tributary_proto::cluster::placement::plan_drain(&snapshot, self.me, now);
        let mut moved = 0;
        for change in &changes {
            if self.is_central_written(&change.topic).await? {
                tracing::info!(topic = %change.topic, "keeping a centrally written topic through the restart: it moves only if this broker stays down past its hold");
                continue;
            }
            // A topic whose dead-letter topic stays here (centrally
            // written) stays with it: moved alone, the restart left them
            // apart for good and its poison messages waited (the trial of
            // the fixes). Its edge keeps its records meanwhile.
            if let Ok(dlq) = TopicName::new(&format!("{}-dlq", change.topic))
                && self.owner(&dlq).is_some_and(|(owner, _)| owner == self.me)
                && self.is_central_written(&dlq).await?
            {
                tracing::info!(topic = %change.topic, dead_letter_topic = %dlq, "keeping a topic with its dead-letter topic through the restart");
                continue;
            }
            match self.apply_change(change).await {
                Ok(()) => moved += 1,
                Err(ClusterError::Contended(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(moved)
    }
}

impl Cluster {
    /// After [`Cluster::drain`] and with the lease task stopped: when this
    /// broker still owns topics (the centrally written ones it keeps, or
    /// moves that failed), writes its lease once more, draining, to live
    /// [`ClusterConfig::restart_hold_ms`]: a restart within that time finds
    /// them where they were, with everything it acknowledged. Without it a
    /// restart longer than the lease (the consumer trial: 8 s after a
    /// SIGTERM) had them taken over at the archive's end, and what the
    /// archive did not hold yet was lost. Returns how many topics are held.
    ///
    /// # Errors
    /// Metadata errors.
    pub async fn hold_for_restart(&self) -> Result<usize, ClusterError> {
        let held = self.owned().len();
        let hold_ms = self.config.restart_hold_ms;
        if held == 0 || hold_ms <= self.config.lease_ttl_ms {
            return Ok(0);
        }
        let now = self.clock.now_ms();
        let state = BrokerState {
            broker_id: self.me,
            ingest_addr: self.config.ingest_addr.clone(),
            admin_url: self.config.admin_url.clone(),
            lifecycle: BrokerLifecycle::Draining,
            topics_owned: held as u64,
            bytes_in_per_s: 0,
            lease_ttl_ms: hold_ms,
            renewed_at_ms: now,
            started_at_ms: now,
        };
        let txn = Txn::new().put_with_ttl(keys::broker_state(self.me), to_value(&state)?, hold_ms);
        let _unconditional = self.store.txn(txn).await?;
        Ok(held)
    }

    /// Whether `topic` is written centrally (its central writer marker
    /// `/topics/{ns}/{topic}/producers/1` exists).
    async fn is_central_written(&self, topic: &TopicName) -> Result<bool, ClusterError> {
        Ok(crate::replication::topics::Writer::Central
            .writes(self.store.as_ref(), topic)
            .await?)
    }
}

fn to_value<T: Serialize>(value: &T) -> Result<serde_json::Value, MetadataError> {
    serde_json::to_value(value).map_err(|source| MetadataError::Encode {
        key: "/cluster/".into(),
        source,
    })
}

#[cfg(test)]
mod tests;
