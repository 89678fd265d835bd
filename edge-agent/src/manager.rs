//! The topic manager: opens every known topic at start, creates topics
//! implicitly on first publish, persists their settings and checkpoints in
//! the local metadata store, and closes them at shutdown.
//!
//! # Local metadata (the embedded [`RedbStore`])
//! The agent keeps the same layout as the central cluster, through the same
//! [`Catalog`]:
//!
//! | key | value |
//! |---|---|
//! | `/topics/{ns}/{topic}` and `/namespaces/{ns}/topics/{ns}/{topic}` | marker, `0` |
//! | `/topics/{ns}/{topic}/intent` | [`tributary_proto::intent::ExpandedStreamSettings`] (configured topics) |
//! | `/topics/{ns}/{topic}/delivery` | `"Reliable"` / `"NonReliable"` |
//! | `/edge/checkpoints/{ns}/{topic}` | next offset acknowledged by the broker (JSON number) |
//! | `/edge/archived/{ns}/{topic}` | offset below which the broker reported everything archived (JSON number); with `retain_until = "archived"` retention deletes only below the smaller of it and the checkpoint |
//! | `/edge/cluster` | id of the central cluster the checkpoints and archived offsets came from (JSON string; `crate::replicator::cluster`) |
//!
//! A configured topic is created with its intent on first start; an unknown
//! topic is created on its first publish with the broker fallback (no
//! `/intent`, sync mode [`tributary_proto::intent::CLUSTER_DEFAULT_WAL_SYNC`],
//! `NonReliable`), kept in a WAL. On every start each topic is reopened with
//! its *stored* settings ([`Catalog::load_settings`]), never with a flag; a
//! configured intent that differs from the stored one stops the start
//! ([`OpenError::IntentConflict`]).
//!
//! # Namespace
//! The agent only accepts topics in its own namespace (the edge id): the
//! broker refuses any other, so refusing locally at publish time
//! ([`TopicError::ForeignNamespace`]) keeps such records from piling up in
//! a WAL that can never drain.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use broker_core::catalog::{Catalog, CatalogError, TopicLoadSettings, TopicSpec};
use broker_core::metadata::redb::RedbStore;
use broker_core::metadata::{MetadataError, MetadataStore, MetadataStoreExt, Txn};

use broker_core::clock::Clock;
use broker_core::wal::{Wal, WalConfig, WalError};
use serde::Serialize;
use tokio::sync::watch;
use tracing::{info, warn};
use tributary_proto::intent::Persistence;
use tributary_proto::keys::{self, NameError, TopicName};
use tributary_proto::{Limits, Record};

use crate::budget::{self, BudgetScope, ByteBudget};
use crate::config::AgentConfig;
use crate::recovery::FaultReport;
use crate::topic::{
    AckError, AckRelease, PublishAck, PublishError, Topic, TopicParts, TopicPolicy, TopicStats,
};

mod rebuild;
mod ring_state;
use ring_state::{read_ring_state, write_ring_state};

use self::rebuild::recreate_wal_topics;

/// Subdirectory of the data directory holding `{ns}/{topic}/` per topic.
pub const TOPICS_DIR: &str = "topics";
/// File in a realtime topic's directory holding the ring's next offset at
/// the last clean shutdown.
pub const RING_STATE_FILE: &str = "ring.json";
/// How often the agent looks for faulted topics whose WAL reopen is due
/// ([`TopicManager::recover_faulted`]); the delays themselves come from
/// each topic's backoff.
pub const RECOVERY_TICK: std::time::Duration = std::time::Duration::from_millis(100);
/// Checkpoint writes per metadata transaction.
const CHECKPOINTS_PER_TXN: usize = 1000;

/// Errors opening the topics at start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// A configured intent differs from the one stored for the topic.
    #[error(
        "topics[{index}].intent: {source}; a topic keeps the settings it was created with: configure its stored intent again (a topic created by a publish has none: leave it out of [[topics]]), or give the new intent another topic name"
    )]
    IntentConflict {
        /// Index in the configured topics.
        index: usize,
        /// The catalog's conflict, naming the differing fields.
        source: CatalogError,
    },
    /// The local metadata store failed.
    #[error("local metadata: {0}")]
    Catalog(#[from] CatalogError),
    /// A topic's WAL could not be opened (recovery found damage, I/O).
    #[error("topic {topic}: opening its WAL in {}: {source}", dir.display())]
    Wal {
        /// The topic.
        topic: TopicName,
        /// Its WAL directory.
        dir: PathBuf,
        /// The WAL error.
        source: WalError,
    },
    /// A realtime topic's ring state file is unreadable.
    #[error("{}: {reason}", path.display())]
    RingState {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

/// Errors of topic operations.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TopicError {
    /// Not a valid topic name (HTTP 400).
    #[error("topic: {0}")]
    InvalidName(#[from] NameError),
    /// A topic outside this agent's namespace (HTTP 403).
    #[error(
        "topic {topic} is outside this edge's namespace {namespace:?}: edge {namespace:?} may only write to /{namespace}/..."
    )]
    ForeignNamespace {
        /// The topic.
        topic: TopicName,
        /// This agent's namespace (the edge id).
        namespace: String,
    },
    /// No such topic (HTTP 404).
    #[error("topic {topic} does not exist")]
    NotFound {
        /// The topic.
        topic: TopicName,
    },
    /// Creating it would pass `max_topics` (HTTP 403).
    #[error("topic {topic} cannot be created: the agent has {count} topics, max_topics = {max}")]
    TooManyTopics {
        /// The topic.
        topic: TopicName,
        /// Topics the agent has.
        count: usize,
        /// The limit.
        max: u32,
    },
    /// The agent is shutting down (HTTP 503).
    #[error("the agent is shutting down")]
    ShuttingDown,
    /// Publishing failed.
    #[error(transparent)]
    Publish(#[from] PublishError),
    /// An acknowledgement was refused.
    #[error(transparent)]
    Ack(#[from] AckError),
    /// Creating or opening the topic failed (HTTP 500).
    #[error(transparent)]
    Open(#[from] OpenError),
    /// The local metadata store failed (HTTP 500).
    #[error("local metadata: {0}")]
    Metadata(#[from] MetadataError),
}

/// Agent-wide counters, as `GET /v1/topics` shows them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AgentStats {
    /// The edge id (the agent's namespace).
    pub edge_id: String,
    /// The agent-wide budget, bytes.
    pub disk_budget_bytes: Option<u64>,
    /// Bytes counted against it.
    pub disk_used_bytes: u64,
    /// Every topic, by name.
    pub topics: Vec<TopicStats>,
}

/// The agent's topics. Shared as `Arc<TopicManager>`; all methods take
/// `&self`.
pub struct TopicManager {
    config: Arc<AgentConfig>,
    store: RedbStore,
    clock: Arc<dyn Clock>,
    agent_budget: Arc<ByteBudget>,
    topics: RwLock<BTreeMap<TopicName, Arc<Topic>>>,
    /// Serializes creation so a topic is opened once.
    create: tokio::sync::Mutex<()>,
    closing: AtomicBool,
    /// Bumped whenever a topic is added.
    generation: watch::Sender<u64>,
    /// Whether the replicator has a broker connection ([`Self::set_link_up`]).
    link_up: AtomicBool,
    /// What the start found missing from the metadata store and rebuilt.
    rebuild: MetadataRebuild,
}

/// What [`TopicManager::open`] found missing from the local metadata store
/// and rebuilt from what remains true (the WAL directories).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MetadataRebuild {
    /// Topics found as WAL directories under `{data_dir}/topics/{ns}/` with
    /// no stored settings: recreated with the implicit-topic defaults (sync
    /// mode `CLUSTER_DEFAULT_WAL_SYNC`, `NonReliable`, no intent).
    pub topics: Vec<TopicName>,
    /// Durable topics whose WAL holds records but that have no stored
    /// checkpoint: the broker's high-water mark on the next connection says
    /// where replication resumes.
    pub checkpoints_missing: Vec<TopicName>,
}

impl std::fmt::Debug for TopicManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TopicManager")
            .field("edge_id", &self.config.edge_id)
            .field("topics", &self.read().len())
            .finish_non_exhaustive()
    }
}

impl TopicManager {
    /// Creates the configured topics in `store` (first start), then opens
    /// every topic stored for this namespace with its stored settings.
    ///
    /// # Errors
    /// [`OpenError::IntentConflict`], [`OpenError::Wal`],
    /// [`OpenError::Catalog`], [`OpenError::RingState`].
    pub async fn open(
        config: Arc<AgentConfig>,
        store: RedbStore,
        clock: Arc<dyn Clock>,
    ) -> Result<TopicManager, OpenError> {
        let (generation, _) = watch::channel(0);
        let mut manager = TopicManager {
            agent_budget: Arc::new(ByteBudget::new(
                BudgetScope::Agent,
                config.disk_budget_bytes,
                0,
            )),
            config,
            store,
            clock,
            topics: RwLock::new(BTreeMap::new()),
            create: tokio::sync::Mutex::new(()),
            closing: AtomicBool::new(false),
            link_up: AtomicBool::new(false),
            generation,
            rebuild: MetadataRebuild::default(),
        };
        let mut rebuild = MetadataRebuild::default();
        let catalog = Catalog::new(&manager.store);
        for (index, topic) in manager.config.topics.iter().enumerate() {
            let spec = TopicSpec::new(topic.name.clone(), topic.intent, 0)?;
            match catalog.create_topic(&spec).await {
                Ok(outcome) => {
                    info!(topic = %topic.name, intent = %topic.intent, action = %outcome.action, "configured topic");
                }
                Err(source @ CatalogError::TopicConflict { .. }) => {
                    return Err(OpenError::IntentConflict { index, source });
                }
                Err(e) => return Err(e.into()),
            }
        }
        rebuild.topics = recreate_wal_topics(&manager.config, &catalog).await?;
        let namespace = &manager.config.edge_id;
        for entry in catalog.list_topics(None).await? {
            if entry.name.namespace() != namespace.as_str() {
                warn!(topic = %entry.name, namespace = %namespace, "stored topic outside this edge's namespace is not opened");
                continue;
            }
            let settings = catalog.load_settings(&entry.name).await?;
            let implicit = settings.intent.is_none();
            let topic = manager.open_topic(&entry.name, settings, implicit).await?;
            if let Some(wal) = topic.wal()
                && wal.high_water_mark() > 0
                && manager
                    .store
                    .get(&keys::edge::checkpoint(&entry.name))
                    .await
                    .map_err(CatalogError::from)?
                    .is_none()
            {
                // (`drop_oldest` deletes segments nobody acknowledged.)
                if wal.log_start_offset() > 0
                    && topic.policy().full_policy == crate::budget::FullPolicy::Refuse
                {
                    warn!(
                        topic = %entry.name,
                        log_start_offset = wal.log_start_offset(),
                        high_water_mark = wal.high_water_mark(),
                        "no checkpoint stored although WAL segments were deleted after acknowledgement: \
                         the metadata store lost it; replication resumes where the broker's high-water mark says"
                    );
                }
                rebuild.checkpoints_missing.push(entry.name.clone());
            }
            manager.write().insert(entry.name.clone(), Arc::new(topic));
        }
        manager.rebuild = rebuild;
        info!(
            topics = manager.read().len(),
            used_bytes = manager.agent_budget.used_bytes(),
            "topics opened"
        );
        Ok(manager)
    }

    /// What the start found missing from the metadata store and rebuilt.
    pub fn metadata_rebuild(&self) -> &MetadataRebuild {
        &self.rebuild
    }

    fn read(&self) -> RwLockReadGuard<'_, BTreeMap<TopicName, Arc<Topic>>> {
        // Poisoning means a panic while holding the lock; the map is only
        // changed by single inserts.
        self.topics.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, BTreeMap<TopicName, Arc<Topic>>> {
        self.topics.write().unwrap_or_else(|p| p.into_inner())
    }

    /// The directory of `topic`'s WAL: `{data_dir}/topics/{ns}/{topic}/`.
    pub fn topic_dir(&self, topic: &TopicName) -> PathBuf {
        topic_dir(&self.config.data_dir, topic)
    }

    async fn open_topic(
        &self,
        name: &TopicName,
        settings: TopicLoadSettings,
        implicit: bool,
    ) -> Result<Topic, OpenError> {
        let configured = self.config.topic(name);
        let policy = TopicPolicy {
            disk_budget_bytes: configured.and_then(|t| t.disk_budget_bytes),
            full_policy: configured.map(|t| t.full_policy).unwrap_or_default(),
            ring_records: configured
                .and_then(|t| t.realtime_ring_records)
                .unwrap_or(self.config.realtime_ring_records),
            retain_until: self.config.retain_until(name),
        };
        let checkpoint: Option<u64> = self
            .store
            .get_as(&keys::edge::checkpoint(name))
            .await
            .map_err(CatalogError::from)?;
        let acknowledged = checkpoint.unwrap_or(0);
        let archived: Option<u64> = self
            .store
            .get_as(&keys::edge::archived(name))
            .await
            .map_err(CatalogError::from)?;
        let archived = archived.unwrap_or(0);
        let persistence = settings
            .intent
            .as_ref()
            .map_or(Persistence::Wal, |s| s.persistence);
        let parts = TopicParts {
            name: name.clone(),
            settings,
            implicit,
            policy,
            agent_budget: self.agent_budget.clone(),
            limits: self.config.limits,
            clock: self.clock.clone(),
            acknowledged,
            archived,
        };
        let dir = self.topic_dir(name);
        if persistence == Persistence::InMemory {
            let path = dir.join(RING_STATE_FILE);
            let saved = read_ring_state(&path)?;
            let next_offset = saved.unwrap_or(0).max(acknowledged);
            info!(topic = %name, next_offset, "realtime topic opened (in memory)");
            return Ok(Topic::open_ring(parts, next_offset));
        }
        let mut wal_config = wal_config_for(
            &parts.settings,
            &policy,
            self.config.disk_budget_bytes,
            &self.config.limits,
        );
        // The broker holds everything below the checkpoint: a log whose
        // end was lost here (a removed directory, a truncated segment)
        // continues past it, so no acknowledged offset is handed out again.
        wal_config.min_next_offset = acknowledged.max(archived);
        let wal_dir = dir.clone();
        let wal = tokio::task::spawn_blocking(move || Wal::open(wal_dir, wal_config))
            .await
            .map_err(|e| WalError::Config(format!("open task failed: {e}")))
            .and_then(|r| r)
            .map_err(|source| OpenError::Wal {
                topic: name.clone(),
                dir: dir.clone(),
                source,
            })?;
        info!(
            topic = %name,
            sync_mode = %wal.config().sync_mode,
            segment_max_bytes = wal.config().segment_max_bytes,
            high_water_mark = wal.high_water_mark(),
            acknowledged,
            archived,
            retain_until = policy.retain_until.as_str(),
            bytes = wal.size_bytes(),
            "durable topic opened"
        );
        let topic = Topic::open_wal(parts, wal);
        // Segments acknowledged before a crash may still be on disk.
        if acknowledged > 0 && acknowledged <= topic.high_water_mark() {
            topic.acknowledge(acknowledged).await.map_err(|e| match e {
                AckError::Wal { source, .. } => OpenError::Wal {
                    topic: name.clone(),
                    dir,
                    source,
                },
                other => OpenError::Catalog(CatalogError::Inconsistent {
                    key: keys::edge::checkpoint(name),
                    reason: other.to_string(),
                }),
            })?;
        }
        Ok(topic)
    }

    /// The agent configuration.
    pub fn config(&self) -> &AgentConfig {
        &self.config
    }

    /// The agent clock now, ms since the Unix epoch (record timestamps).
    pub fn now_ms(&self) -> i64 {
        i64::try_from(self.clock.now_ms()).unwrap_or(i64::MAX)
    }

    /// The local metadata store.
    pub fn store(&self) -> &RedbStore {
        &self.store
    }

    /// The agent-wide budget counter.
    pub fn agent_budget(&self) -> &ByteBudget {
        &self.agent_budget
    }

    /// Every topic, sorted by name.
    pub fn topics(&self) -> Vec<Arc<Topic>> {
        self.read().values().cloned().collect()
    }

    /// The topic `name`, if it exists.
    pub fn topic(&self, name: &TopicName) -> Option<Arc<Topic>> {
        self.read().get(name).cloned()
    }

    /// A receiver that changes whenever a topic is added (the value counts
    /// additions); the replicator watches it to pick up implicit topics.
    pub fn watch_topics(&self) -> watch::Receiver<u64> {
        self.generation.subscribe()
    }

    /// Builds and checks the topic name `/{namespace}/{topic}`.
    ///
    /// # Errors
    /// [`TopicError::InvalidName`], [`TopicError::ForeignNamespace`].
    pub fn topic_name(&self, namespace: &str, topic: &str) -> Result<TopicName, TopicError> {
        let name = TopicName::new(&format!("/{namespace}/{topic}"))?;
        self.check_namespace(&name)?;
        Ok(name)
    }

    fn check_namespace(&self, name: &TopicName) -> Result<(), TopicError> {
        if name.namespace() != self.config.edge_id.as_str() {
            return Err(TopicError::ForeignNamespace {
                topic: name.clone(),
                namespace: self.config.edge_id.as_str().to_owned(),
            });
        }
        Ok(())
    }

    /// The topic `name`, created implicitly (broker fallback settings) if
    /// it does not exist.
    ///
    /// # Errors
    /// [`TopicError::ForeignNamespace`], [`TopicError::TooManyTopics`],
    /// [`TopicError::ShuttingDown`], [`TopicError::Open`].
    pub async fn get_or_create(&self, name: &TopicName) -> Result<Arc<Topic>, TopicError> {
        self.check_namespace(name)?;
        if let Some(topic) = self.topic(name) {
            return Ok(topic);
        }
        let _create = self.create.lock().await;
        if self.closing.load(Ordering::SeqCst) {
            return Err(TopicError::ShuttingDown);
        }
        if let Some(topic) = self.topic(name) {
            return Ok(topic);
        }
        let (max, count) = (self.config.max_topics, self.read().len());
        if count >= max as usize {
            return Err(TopicError::TooManyTopics {
                topic: name.clone(),
                count,
                max,
            });
        }
        let outcome = Catalog::new(&self.store)
            .create_implicit(name, false)
            .await
            .map_err(OpenError::from)?;
        let implicit = outcome.settings.intent.is_none();
        let topic = Arc::new(self.open_topic(name, outcome.settings, implicit).await?);
        self.write().insert(name.clone(), topic.clone());
        self.generation.send_modify(|g| *g += 1);
        info!(topic = %name, created = outcome.created, "topic created implicitly on first publish");
        drop(_create);
        // A reflashed device's new topic may exist centrally: while a broker
        // is reachable, wait (bounded) for the Welcome so that the log starts
        // at the broker's high-water mark, not at offsets the broker holds.
        if outcome.created && topic.high_water_mark() == 0 && self.link_up.load(Ordering::SeqCst) {
            topic.wait_resumed(crate::topic::FIRST_WELCOME_WAIT).await;
        }
        Ok(topic)
    }

    /// The replicator's report: a broker connection is open (`true`) or
    /// none is.
    pub fn set_link_up(&self, up: bool) {
        self.link_up.store(up, Ordering::SeqCst);
    }

    /// Publishes `records` to `name` as one batch (creating the topic
    /// implicitly); returns once durable per the topic's sync mode.
    ///
    /// # Errors
    /// Those of [`TopicManager::get_or_create`] and [`Topic::publish`]
    /// (as [`TopicError::Publish`]).
    pub async fn publish(
        &self,
        name: &TopicName,
        records: Vec<Record>,
    ) -> Result<PublishAck, TopicError> {
        self.publish_marked(name, records, None).await
    }

    /// [`TopicManager::publish`] with a marker step ([`crate::topic::Mark`],
    /// [`crate::topic::Topic::publish_marked`]).
    ///
    /// # Errors
    /// As [`TopicManager::publish`].
    pub async fn publish_marked(
        &self,
        name: &TopicName,
        records: Vec<Record>,
        mark: Option<crate::topic::Mark<'_>>,
    ) -> Result<PublishAck, TopicError> {
        if self.closing.load(Ordering::SeqCst) {
            return Err(TopicError::ShuttingDown);
        }
        let topic = self.get_or_create(name).await?;
        Ok(topic.publish_marked(records, mark).await?)
    }

    /// The replicator's report: the broker durably holds every record of
    /// `name` below `next_offset`. Raises the checkpoint (persisted at
    /// `/edge/checkpoints/{ns}/{topic}` by the next
    /// [`TopicManager::flush_checkpoints`]) and deletes the WAL segments
    /// entirely below it.
    ///
    /// # Errors
    /// [`TopicError::NotFound`], [`TopicError::Ack`].
    pub async fn on_acknowledged(
        &self,
        name: &TopicName,
        next_offset: u64,
    ) -> Result<AckRelease, TopicError> {
        let topic = self.topic(name).ok_or_else(|| TopicError::NotFound {
            topic: name.clone(),
        })?;
        Ok(topic.acknowledge(next_offset).await?)
    }

    /// The replicator's report: the broker says every record of `name`
    /// below `archived_offset` is committed in the archive. Raises the
    /// archived offset (persisted at `/edge/archived/{ns}/{topic}` by the
    /// next [`TopicManager::flush_checkpoints`]) and, with
    /// `retain_until = "archived"`, deletes the WAL segments now entirely
    /// below the smaller of it and the checkpoint. Returns the bytes freed.
    ///
    /// # Errors
    /// [`TopicError::NotFound`], [`TopicError::Ack`].
    pub async fn on_archived(
        &self,
        name: &TopicName,
        archived_offset: u64,
    ) -> Result<u64, TopicError> {
        let topic = self.topic(name).ok_or_else(|| TopicError::NotFound {
            topic: name.clone(),
        })?;
        Ok(topic.archive(archived_offset).await?)
    }

    /// Writes every checkpoint and archived offset that changed since the
    /// last call, batched into few metadata transactions; returns how many
    /// were written.
    ///
    /// # Errors
    /// [`TopicError::Metadata`]; the unwritten values stay pending.
    pub async fn flush_checkpoints(&self) -> Result<usize, TopicError> {
        let dirty: Vec<(Arc<Topic>, Option<u64>, Option<u64>)> = self
            .topics()
            .into_iter()
            .filter_map(|t| {
                let checkpoint = t.take_dirty_checkpoint();
                let archived = t.take_dirty_archived();
                (checkpoint.is_some() || archived.is_some()).then_some((t, checkpoint, archived))
            })
            .collect();
        let mut written = 0;
        for (i, chunk) in dirty.chunks(CHECKPOINTS_PER_TXN).enumerate() {
            let txn = chunk
                .iter()
                .fold(Txn::new(), |mut txn, (topic, checkpoint, archived)| {
                    if let Some(offset) = checkpoint {
                        txn = txn.put(
                            keys::edge::checkpoint(topic.name()),
                            serde_json::json!(offset),
                        );
                    }
                    if let Some(offset) = archived {
                        txn = txn.put(
                            keys::edge::archived(topic.name()),
                            serde_json::json!(offset),
                        );
                    }
                    txn
                });
            if let Err(e) = self.store.txn(txn).await.map(drop) {
                for (topic, checkpoint, archived) in &dirty[i * CHECKPOINTS_PER_TXN..] {
                    if checkpoint.is_some() {
                        topic.mark_checkpoint_dirty();
                    }
                    if archived.is_some() {
                        topic.mark_archived_dirty();
                    }
                }
                return Err(e.into());
            }
            written += chunk.len();
        }
        Ok(written)
    }

    /// Counters of the agent and every topic.
    pub fn stats(&self) -> AgentStats {
        AgentStats {
            edge_id: self.config.edge_id.as_str().to_owned(),
            disk_budget_bytes: self.agent_budget.limit_bytes(),
            disk_used_bytes: self.agent_budget.used_bytes(),
            topics: self.topics().iter().map(|t| t.stats()).collect(),
        }
    }

    /// Reopens the WAL of every faulted topic whose next attempt is due
    /// ([`Topic::recover_if_due`]); returns how many were reopened. The
    /// agent calls it every [`RECOVERY_TICK`].
    pub async fn recover_faulted(&self) -> usize {
        if self.is_closing() {
            return 0;
        }
        let mut reopened = 0;
        for topic in self.topics() {
            if topic.recover_if_due().await {
                reopened += 1;
            }
        }
        reopened
    }

    /// Topics whose WAL is latched after an I/O failure (a full disk or
    /// another), by name, with what `/health` shows of it.
    pub fn faults(&self) -> Vec<(TopicName, FaultReport)> {
        self.topics()
            .iter()
            .filter_map(|t| t.fault().map(|f| (t.name().clone(), f)))
            .collect()
    }

    /// Whether [`TopicManager::close`] has begun.
    pub fn is_closing(&self) -> bool {
        self.closing.load(Ordering::SeqCst)
    }

    /// Stops accepting publishes, writes pending checkpoints and the rings'
    /// next offsets, and closes (flushes and syncs) every WAL. Tries every
    /// topic and returns the first error.
    ///
    /// # Errors
    /// [`TopicError::Metadata`], [`TopicError::Open`] (ring state file or
    /// a WAL's final flush).
    pub async fn close(&self) -> Result<(), TopicError> {
        self.closing.store(true, Ordering::SeqCst);
        let _create = self.create.lock().await;
        let mut first_error = self.flush_checkpoints().await.err();
        for topic in self.topics() {
            let result = match topic.ring() {
                Some(ring) => write_ring_state(&self.topic_dir(topic.name()), ring.next_offset()),
                None => topic.close().await.map_err(|source| OpenError::Wal {
                    topic: topic.name().clone(),
                    dir: self.topic_dir(topic.name()),
                    source,
                }),
            };
            if let Err(e) = result {
                warn!(topic = %topic.name(), error = %e, "closing the topic failed");
                first_error.get_or_insert(e.into());
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// `{data_dir}/topics/{ns}/{topic}/`. Topic names hold only `[A-Za-z0-9._-]`
/// parts and never `.` or `..`, so the path cannot leave the data
/// directory.
pub fn topic_dir(data_dir: &Path, topic: &TopicName) -> PathBuf {
    data_dir
        .join(TOPICS_DIR)
        .join(topic.namespace())
        .join(topic.topic())
}

/// The WAL configuration of a durable topic: the stored sync mode, the
/// agent's limits, segments of at most 1 % of the tightest budget
/// ([`budget::segment_max_bytes_for`]) and size retention at 0 so every
/// acknowledged sealed segment is deleted when retention runs.
pub fn wal_config_for(
    settings: &TopicLoadSettings,
    policy: &TopicPolicy,
    agent_budget_bytes: Option<u64>,
    limits: &Limits,
) -> WalConfig {
    let defaults = WalConfig::default();
    let tightest = match (policy.disk_budget_bytes, agent_budget_bytes) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    WalConfig {
        sync_mode: settings.wal_sync_mode,
        segment_max_bytes: budget::segment_max_bytes_for(
            tightest,
            limits.max_batch_bytes,
            defaults.segment_max_bytes,
        ),
        max_pending_bytes: defaults
            .max_pending_bytes
            .max(limits.max_batch_bytes as usize),
        retention_max_bytes: Some(0),
        limits: *limits,
        ..defaults
    }
}
