//! The broker's central topic WALs: one per topic under
//! `{data_dir}/topics/{namespace}/{topic}/`, always opened with the sync mode
//! persisted in the topic's metadata (never a client's flag).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use broker_core::catalog::{Catalog, CatalogError, TopicSpec};
use broker_core::metadata::MetadataStore;
use broker_core::wal::{SyncMode, Wal, WalConfig, WalError};
use tokio::sync::Mutex;
use tracing::info;
use tributary_proto::intent::ExpandedStreamSettings;
use tributary_proto::keys::TopicName;
use tributary_proto::limits::Limits;

mod central;
mod hole_records;
mod reserved;

pub use central::{CENTRAL_PRODUCER_ID, EDGE_PRODUCER_ID, Writer};
pub use hole_records::list_holes;
pub use reserved::RESERVE_AHEAD;

/// Why a topic could not be opened for an edge.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TopicError {
    /// Metadata lookup or creation failed (retryable).
    #[error("topic metadata: {0}")]
    Catalog(#[from] CatalogError),
    /// The WAL could not be opened (storage problem).
    #[error("topic WAL: {0}")]
    Wal(#[from] WalError),
    /// Another broker owns the topic (cluster ownership): redirect there.
    #[error("topic owned by broker {} (epoch {}) at {}", .0.broker_id, .0.epoch, .0.ingest_addr)]
    NotOwner(crate::cluster::Owner),
    /// Nobody serves the topic now (no owner yet, the owner's lease
    /// lapsed, or this broker's own lease is not fresh): retry shortly.
    #[error("no owner: {0}")]
    NoOwner(String),
    /// The central topic exists with other settings than the edge's.
    #[error(
        "topic {topic} exists centrally with intent {central}, the edge sends {edge}; \
         recreate one side so both run the same settings"
    )]
    Conflict {
        /// The topic.
        topic: TopicName,
        /// Central intent summary.
        central: String,
        /// The edge's intent summary.
        edge: String,
    },
    /// The topic is written by the other kind of writer (edge replication
    /// or central publishes), which would take the offsets this one needs.
    #[error("topic {topic}: {reason}")]
    WriterConflict {
        /// The topic.
        topic: TopicName,
        /// Who writes it and what to do.
        reason: String,
    },
}

/// Open central topic WALs, by topic.
pub struct TopicStore {
    dir: PathBuf,
    store: Arc<dyn MetadataStore>,
    limits: Limits,
    segment_max_age: Option<std::time::Duration>,
    open: Mutex<HashMap<TopicName, Arc<Wal>>>,
    /// The un-archived byte budget, when `[budget]` sets one.
    budget: std::sync::OnceLock<Arc<crate::budget::Budget>>,
    /// Topic ownership; without it (single-process tests) every topic is
    /// this broker's.
    cluster: std::sync::OnceLock<Arc<crate::cluster::Cluster>>,
    /// The epoch each open WAL was opened under.
    epochs: std::sync::Mutex<HashMap<TopicName, u64>>,
    /// Ownership markers and quarantine beside `dir`.
    layout: super::takeover::Layout,
    /// Where the committed archive's end (`segments/cur`) is read.
    storage_keys: tributary_proto::keys::StorageKeys,
    /// The cluster's id (`/cluster/id`), sent to edges that ask.
    identity: crate::cluster::identity::ClusterIdentity,
    /// Per topic, the order in which central appends take their offsets
    /// ([`TopicStore::central_order`]).
    central_order: broker_core::idempotency::KeyLocks,
    /// Per centrally written topic, the epoch and the `reserved_end` known
    /// to be in Raft ([`TopicStore::reserve_central`]).
    reserved: std::sync::Mutex<HashMap<TopicName, (u64, u64)>>,
}

/// Longest wait for a topic's first owner when it is opened.
const OWNER_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Longest wait of a broker that has just started for its first lease
/// before it answers an edge's `Hello` (then it refuses as it would without
/// a lease).
const FIRST_LEASE_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

impl TopicStore {
    /// Topics under `dir`, metadata in `store`, batches limited by `limits`.
    pub fn new(dir: PathBuf, store: Arc<dyn MetadataStore>, limits: Limits) -> TopicStore {
        TopicStore {
            layout: super::takeover::Layout::beside(&dir),
            dir,
            limits,
            segment_max_age: None,
            open: Mutex::default(),
            budget: std::sync::OnceLock::new(),
            cluster: std::sync::OnceLock::new(),
            epochs: std::sync::Mutex::default(),
            storage_keys: tributary_proto::keys::StorageKeys::default(),
            identity: crate::cluster::identity::ClusterIdentity::new(store.clone()),
            central_order: Default::default(),
            reserved: std::sync::Mutex::default(),
            store,
        }
    }

    /// Reads the committed archive's end under `keys` (the `[archive]`
    /// prefix) when a new owner starts a topic.
    #[must_use]
    pub fn with_storage_keys(mut self, keys: tributary_proto::keys::StorageKeys) -> TopicStore {
        self.storage_keys = keys;
        self
    }

    /// The cluster's id, as edges are told it.
    pub fn identity(&self) -> &crate::cluster::identity::ClusterIdentity {
        &self.identity
    }

    /// The metadata store.
    pub fn store(&self) -> &Arc<dyn MetadataStore> {
        &self.store
    }

    /// The storage keys of the archive.
    pub fn storage_keys(&self) -> &tributary_proto::keys::StorageKeys {
        &self.storage_keys
    }

    /// Serves only the topics `cluster` says this broker owns; `false`
    /// (and nothing changes) when one is installed already.
    pub fn set_cluster(&self, cluster: Arc<crate::cluster::Cluster>) -> bool {
        self.cluster.set(cluster).is_ok()
    }

    /// The installed ownership state, if any.
    pub fn cluster(&self) -> Option<&Arc<crate::cluster::Cluster>> {
        self.cluster.get()
    }

    /// The epoch under which this broker serves `topic`: `None` without
    /// cluster ownership; waits up to [`OWNER_WAIT`] for a new topic's
    /// first owner (queuing it for the load manager, with this broker
    /// preferred when `prefer_self`: a topic written centrally, such as a
    /// dead-letter topic, then lives where it is written).
    ///
    /// # Errors
    /// [`TopicError::NotOwner`], [`TopicError::NoOwner`].
    pub async fn owned_epoch(
        &self,
        topic: &TopicName,
        prefer_self: bool,
    ) -> Result<Option<u64>, TopicError> {
        let Some(cluster) = self.cluster.get() else {
            return Ok(None);
        };
        if let crate::cluster::Route::Local { epoch } = cluster.route(topic) {
            return Ok(Some(epoch));
        }
        let prefer = prefer_self.then(|| cluster.me());
        if cluster.owner(topic).is_none()
            && let Err(e) = cluster.ensure_placed(topic, prefer, "new_topic").await
        {
            return Err(TopicError::NoOwner(e.to_string()));
        }
        match cluster.wait_route(topic, OWNER_WAIT).await {
            crate::cluster::Route::Local { epoch } => Ok(Some(epoch)),
            crate::cluster::Route::Remote(owner) => Err(TopicError::NotOwner(owner)),
            crate::cluster::Route::Unassigned { reason } => Err(TopicError::NoOwner(reason)),
        }
    }

    /// The epoch the open WAL of `topic` was opened under.
    pub fn opened_epoch(&self, topic: &TopicName) -> Option<u64> {
        self.epochs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(topic)
            .copied()
    }

    /// The open WAL of `topic` if it is healthy and was opened under
    /// `epoch`; a WAL of another epoch, or a latched one, is dropped from
    /// `open` and its writer ended before this returns, so the caller may
    /// open the directory again: holders of the old handle (a stream being
    /// torn down, a consumer) keep reading it, but nothing writes through
    /// it any more.
    async fn current(
        &self,
        open: &mut HashMap<TopicName, Arc<Wal>>,
        topic: &TopicName,
        epoch: Option<u64>,
    ) -> Option<Arc<Wal>> {
        let stale = if epoch.is_some() && self.opened_epoch(topic) != epoch {
            let stale = open.remove(topic);
            if stale.is_some() {
                info!(%topic, epoch, "reopening the topic under a new ownership epoch");
            }
            stale
        } else {
            match healthy(open, topic) {
                Ok(wal) => return Some(wal),
                Err(stale) => stale,
            }
        };
        if let Some(stale) = stale {
            end_writer(topic, &stale).await;
        }
        None
    }

    /// Closes the WALs of topics this broker no longer serves (another
    /// owner, or a lapsed lease) and quarantines local copies of topics
    /// another broker owns at a later epoch. Called on every ownership
    /// change.
    pub async fn release_lost(&self) {
        let Some(cluster) = self.cluster.get() else {
            return;
        };
        let mut open = self.open.lock().await;
        let lost: Vec<TopicName> = open
            .keys()
            .filter(|t| {
                !matches!(cluster.route(t), crate::cluster::Route::Local { epoch } if Some(epoch) == self.opened_epoch(t))
            })
            .cloned()
            .collect();
        // Their writers end concurrently (each flushes and syncs what it
        // holds) but before the map is unlocked: nobody opens one of these
        // directories again while its old writer may still write.
        let lost: Vec<(TopicName, Arc<Wal>)> = lost
            .into_iter()
            .filter_map(|topic| open.remove(&topic).map(|wal| (topic, wal)))
            .collect();
        futures::future::join_all(lost.iter().map(|(topic, wal)| async move {
            end_writer(topic, wal).await;
            info!(%topic, high_water_mark = wal.high_water_mark(), "this broker no longer serves the topic; its WAL is closed");
        }))
        .await;
        for (topic, marked) in self.layout.marked_topics() {
            if open.contains_key(&topic) {
                continue;
            }
            if let Some((owner, epoch)) = cluster.owner(&topic)
                && owner != cluster.me()
                && epoch > marked
            {
                self.quarantine(
                    &topic,
                    Some(marked),
                    &format!("broker {owner} owns it at epoch {epoch}"),
                );
            }
        }
    }

    fn quarantine(&self, topic: &TopicName, stale_epoch: Option<u64>, why: &str) {
        let now = broker_core::clock::now_ms().max(0) as u64;
        match self.layout.quarantine(topic, stale_epoch, now) {
            Ok(to) => {
                tracing::warn!(%topic, stale_epoch, quarantined = %to.display(), "{why}: this broker's local copy is stale; quarantined it (never served, uploaded or resumed)")
            }
            Err(e) => {
                tracing::error!(%topic, error = %e, "{why}: quarantining the stale local copy failed")
            }
        }
    }

    /// Topics with local data from before ownership existed: queued for
    /// the load manager with this broker preferred (the upgrade path), so
    /// the broker holding a topic's only central copy keeps it.
    pub async fn place_unmarked(&self) {
        let Some(cluster) = self.cluster.get() else {
            return;
        };
        for topic in self.layout.unmarked_topics() {
            if cluster.owner(&topic).is_none() {
                let archived =
                    crate::storage::tiered_offset(self.store.as_ref(), &self.storage_keys, &topic)
                        .await
                        .ok()
                        .flatten()
                        .unwrap_or(0);
                tracing::warn!(%topic, archived_offset = archived, "local data from before topic ownership (upgrade): this broker asks to own the topic and keeps its copy; edges of the old version may already have deleted what lies above the archived offset, so until the tier service archives it this broker holds the only copy");
                if let Err(e) = cluster
                    .ensure_placed(&topic, Some(cluster.me()), "local_data")
                    .await
                {
                    tracing::warn!(%topic, error = %e, "queuing a topic with local data failed");
                }
            }
        }
    }

    /// Installs the un-archived byte budget new batches are checked
    /// against; `false` (and nothing changes) when one is installed already.
    pub fn set_budget(&self, budget: Arc<crate::budget::Budget>) -> bool {
        self.budget.set(budget).is_ok()
    }

    /// The installed un-archived byte budget, if any.
    pub fn budget(&self) -> Option<&Arc<crate::budget::Budget>> {
        self.budget.get()
    }

    /// Whether a new batch for `topic` may be accepted (always, without a
    /// budget).
    ///
    /// # Errors
    /// [`crate::budget::BudgetExceeded`] naming the scope that is full.
    pub async fn check_budget(
        &self,
        topic: &TopicName,
    ) -> Result<(), crate::budget::BudgetExceeded> {
        match self.budget.get() {
            Some(budget) => budget.admit(topic).await,
            None => Ok(()),
        }
    }

    /// Seals every topic's active segment this long after its first write
    /// (`WalConfig::segment_max_age`); `None` (the default) seals only by
    /// size.
    #[must_use]
    pub fn with_segment_max_age(mut self, age: Option<std::time::Duration>) -> TopicStore {
        self.segment_max_age = age;
        self
    }

    fn wal_dir(&self, topic: &TopicName) -> PathBuf {
        self.dir.join(topic.namespace()).join(topic.topic())
    }

    /// The WAL of `topic` for an edge sending `settings`: creates the
    /// central topic with those settings on first contact (through Raft;
    /// implicitly, with the broker fallback, when the edge's topic is itself
    /// implicit), checks them against the persisted ones otherwise, and
    /// opens the WAL with the persisted sync mode.
    ///
    /// # Errors
    /// [`TopicError::Conflict`] if the central topic has another intent;
    /// metadata and WAL errors.
    pub async fn open_for_edge(
        &self,
        topic: &TopicName,
        settings: Option<&ExpandedStreamSettings>,
    ) -> Result<Arc<Wal>, TopicError> {
        // Decided locally first: a redirect, or a broker without a fresh
        // lease, answers without a Raft round trip (which a broker cut off
        // from the majority could not finish).
        if let Some(cluster) = self.cluster.get() {
            cluster.wait_first_lease(FIRST_LEASE_WAIT).await;
            match cluster.route(topic) {
                crate::cluster::Route::Remote(owner) => return Err(TopicError::NotOwner(owner)),
                crate::cluster::Route::Unassigned { reason } if !cluster.lease_fresh() => {
                    return Err(TopicError::NoOwner(reason));
                }
                _ => {}
            }
        }
        let catalog = Catalog::new(self.store.as_ref());
        let loaded = match catalog.load_settings(topic).await {
            Ok(loaded) => loaded,
            Err(CatalogError::TopicNotFound { .. }) => {
                match settings {
                    Some(settings) => {
                        let spec = TopicSpec::new(topic.clone(), settings.intent, 0)?;
                        catalog.create_topic(&spec).await?;
                    }
                    None => {
                        catalog.create_implicit(topic, true).await?;
                    }
                }
                info!(%topic, intent = settings.map(|s| s.intent.as_str()), "created central topic on first contact");
                catalog.load_settings(topic).await?
            }
            Err(e) => return Err(e.into()),
        };
        if loaded.intent.as_ref() != settings {
            let describe = |s: Option<&ExpandedStreamSettings>| match s {
                Some(s) => s.summary(topic),
                None => "none (implicit topic)".to_string(),
            };
            return Err(TopicError::Conflict {
                topic: topic.clone(),
                central: describe(loaded.intent.as_ref()),
                edge: describe(settings),
            });
        }
        self.claim_writer(topic, Writer::Edge).await?;
        let epoch = self.owned_epoch(topic, false).await?;
        let mut open = self.open.lock().await;
        if let Some(wal) = self.current(&mut open, topic, epoch).await {
            return Ok(wal);
        }
        let wal = Arc::new(self.open_wal(topic, loaded.wal_sync_mode, epoch).await?);
        self.reapply_skipped(topic, &wal).await?;
        open.insert(topic.clone(), wal.clone());
        Ok(wal)
    }

    /// The WAL of an existing topic, opened with its persisted sync mode
    /// (shared with the ingest path: one writer per topic). With
    /// `create_implicit`, a missing topic is created implicitly with
    /// reliable delivery (dead-letter topics).
    ///
    /// # Errors
    /// [`TopicError::Catalog`] with [`CatalogError::TopicNotFound`] for an
    /// unknown topic; metadata and WAL errors.
    pub async fn open_existing(
        &self,
        topic: &TopicName,
        create_implicit: bool,
    ) -> Result<Arc<Wal>, TopicError> {
        // A topic that does not exist gets no owner: placing it would leave
        // an ownership entry in Raft for any name a request carried.
        if !create_implicit && !self.open.lock().await.contains_key(topic) {
            Catalog::new(self.store.as_ref())
                .load_settings(topic)
                .await?;
        }
        let epoch = self.owned_epoch(topic, true).await?;
        if let Some(wal) = self
            .current(&mut *self.open.lock().await, topic, epoch)
            .await
        {
            return Ok(wal);
        }
        let catalog = Catalog::new(self.store.as_ref());
        let loaded = match catalog.load_settings(topic).await {
            Err(CatalogError::TopicNotFound { .. }) if create_implicit => {
                catalog.create_implicit(topic, true).await?;
                info!(%topic, "created topic implicitly for central writes");
                catalog.load_settings(topic).await?
            }
            other => other?,
        };
        let mut open = self.open.lock().await;
        if let Some(wal) = self.current(&mut open, topic, epoch).await {
            return Ok(wal);
        }
        let wal = Arc::new(self.open_wal(topic, loaded.wal_sync_mode, epoch).await?);
        self.reapply_skipped(topic, &wal).await?;
        open.insert(topic.clone(), wal.clone());
        Ok(wal)
    }

    /// Opens the WAL of `topic`; as owner at `epoch`, first decides what
    /// to do with the local copy ([`super::takeover`]).
    async fn open_wal(
        &self,
        topic: &TopicName,
        sync_mode: SyncMode,
        epoch: Option<u64>,
    ) -> Result<Wal, TopicError> {
        let mut initial_offset = 0;
        let mut hole_end = None;
        let mut mark = None;
        if let Some(epoch) = epoch {
            use super::takeover::Decision;
            let has_data = self.layout.has_data(topic);
            let marker = self.layout.marker(topic);
            let decision = super::takeover::decide(has_data, marker, epoch);
            if let Decision::Quarantine { stale_epoch } = decision {
                self.quarantine(
                    topic,
                    stale_epoch,
                    &format!("opening as owner at epoch {epoch}"),
                );
            }
            if matches!(decision, Decision::Fresh | Decision::Quarantine { .. }) {
                let dir = self.wal_dir(topic);
                if dir.exists() {
                    // No segment in it: only a leftover mark or index.
                    std::fs::remove_dir_all(&dir).map_err(|e| WalError::Io {
                        op: "remove stale dir",
                        path: dir.clone(),
                        source: e,
                    })?;
                }
                initial_offset =
                    super::takeover::start_offset(self.store.as_ref(), &self.storage_keys, topic)
                        .await
                        .map_err(|e| {
                            TopicError::NoOwner(format!("reading the archive's end: {e}"))
                        })?;
                info!(%topic, epoch, start_offset = initial_offset, "taking over the topic: a new local WAL starts at the committed archive's end");
                hole_end = self.takeover_hole(topic, initial_offset, epoch).await?;
            } else if decision == Decision::Adopt {
                info!(%topic, epoch, "adopting local data from before topic ownership");
            }
            if decision != Decision::Resume {
                mark = Some(epoch);
            }
            self.epochs
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .insert(topic.clone(), epoch);
        }
        let config = WalConfig {
            initial_offset,
            sync_mode,
            limits: self.limits,
            // Local retention deletes a sealed segment as soon as it is
            // safe, and "safe" is only ever the committed tiered offset the
            // tier service reports (`POST /v1/storage/.../trim`): without a
            // tier service nothing is deleted.
            retention_max_bytes: Some(0),
            segment_max_age: self.segment_max_age,
            ..WalConfig::default()
        };
        let wal = Wal::open(self.wal_dir(topic), config)?;
        if let Some(end) = hole_end {
            wal.skip_to(end).await?;
        }
        // The marker last: a crash before it leaves a copy that is not
        // resumed (started again, hole included), never a WAL resumed
        // below offsets an earlier owner handed out.
        if let Some(epoch) = mark {
            self.layout
                .write_marker(topic, epoch)
                .map_err(|e| WalError::Io {
                    op: "write ownership marker",
                    path: self.dir.clone(),
                    source: e,
                })?;
        }
        Ok(wal)
    }

    /// Every open topic with its WAL (for `/metrics`).
    pub async fn open_topics(&self) -> Vec<(TopicName, Arc<Wal>)> {
        let open = self.open.lock().await;
        let mut out: Vec<_> = open.iter().map(|(t, w)| (t.clone(), w.clone())).collect();
        out.sort_by(|a, b| a.0.as_str().cmp(b.0.as_str()));
        out
    }

    /// Topics with a local copy (an ownership marker) that this broker
    /// serves but has not opened: after a restart nothing reads them until
    /// an edge, a consumer or a publish comes, so the background scrub
    /// opens them one at a time ([`super::damage`]). Empty without a cluster.
    pub async fn served_unopened(&self) -> Vec<TopicName> {
        let Some(cluster) = self.cluster.get() else {
            return Vec::new();
        };
        let marked = self.layout.marked_topics();
        // The open-map lock only for the membership test: openers wait on it.
        let unopened: Vec<TopicName> = {
            let open = self.open.lock().await;
            (marked.into_iter())
                .filter_map(|(t, _)| (!open.contains_key(&t)).then_some(t))
                .collect()
        };
        let mut out: Vec<TopicName> = (unopened.into_iter())
            .filter(|t| matches!(cluster.route(t), crate::cluster::Route::Local { .. }))
            .collect();
        out.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        out
    }

    /// An already open topic's WAL.
    pub async fn get(&self, topic: &TopicName) -> Option<Arc<Wal>> {
        self.open.lock().await.get(topic).cloned()
    }

    /// Closes every WAL (flushing and syncing), for shutdown.
    pub async fn close_all(&self) {
        let wals: Vec<(TopicName, Arc<Wal>)> = self.open.lock().await.drain().collect();
        for (topic, wal) in wals {
            // Also when a stream being torn down, or a consumer, still
            // holds the handle: its writer ends here.
            if let Err(e) = wal.close_writer().await {
                tracing::error!(%topic, error = %e, "closing topic WAL");
            }
        }
    }
}

/// The open WAL of `topic`, unless it stopped after an I/O failure (a full
/// disk): then it is dropped from `open`, so the caller opens the directory
/// again and recovery decides what is on disk. That is the controlled
/// reopen of a latched WAL: it happens when the next edge stream or central
/// write for the topic arrives (an edge retries every few seconds), and the
/// stopped writer of the old handle writes nothing more; readers that still
/// hold the old handle read what it had. `Err` holds the handle dropped
/// from `open` (`None`: the topic was not open).
fn healthy(
    open: &mut HashMap<TopicName, Arc<Wal>>,
    topic: &TopicName,
) -> Result<Arc<Wal>, Option<Arc<Wal>>> {
    let Some(wal) = open.get(topic) else {
        return Err(None);
    };
    match wal.failure() {
        None => Ok(wal.clone()),
        Some(failure) => {
            tracing::warn!(%topic, %failure, "reopening the topic's WAL after a latched I/O failure");
            Err(open.remove(topic))
        }
    }
}

/// Ends the writer of a WAL handle dropped from `open` (see
/// [`Wal::close_writer`]); a latched WAL's writer has ended already.
async fn end_writer(topic: &TopicName, wal: &Wal) {
    if let Err(e) = wal.close_writer().await
        && wal.failure().is_none()
    {
        tracing::warn!(%topic, error = %e, "ending the writer of a topic's old WAL handle");
    }
}
