//! [`Agent`]: the running edge agent — local metadata store, topics, the
//! local HTTP API and the checkpoint writer — with an orderly shutdown.
//!
//! Shutdown order ([`Agent::shutdown`]): stop accepting connections and
//! finish the requests in flight (axum graceful shutdown), stop the
//! checkpoint task and the replicator (which ends every stream task and
//! the tasks they started), then [`TopicManager::close`]: write pending
//! checkpoints and the rings' next offsets, and close every WAL (flush and
//! sync). Every task that held the topic manager (and so the metadata
//! store and the WALs) has ended when `shutdown` returns, and it drops the
//! last handle: the same data directory can be opened again at once (a
//! certificate reload or an in-process restart does that).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::replicator::{self, ReplicationStats, ReplicatorConfig};
use broker_core::metadata::MetadataError;
use broker_core::metadata::redb::{RedbStore, StoreOpenReport};

use broker_core::clock::{Clock, SystemClock};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{error, info, warn};

use crate::api;
use crate::config::AgentConfig;
use crate::health::{StallWatch, TopicProgress};
use crate::manager::{MetadataRebuild, OpenError, TopicError, TopicManager};

/// File name of the local metadata store in the data directory.
pub const METADATA_FILE: &str = "metadata.redb";

/// Errors starting or stopping the agent.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AgentError {
    /// The data directory could not be created.
    #[error("data_dir {}: {source}", path.display())]
    DataDir {
        /// The directory.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The data directory is another edge's or another component's, or its
    /// identity file is unreadable (see [`broker_core::data_dir`]).
    #[error(transparent)]
    Identity(#[from] broker_core::data_dir::IdentityError),
    /// The local metadata store could not be opened (held by another agent,
    /// another format version, an I/O failure). A damaged store is not an
    /// error: it is moved aside and replaced (see
    /// [`RedbStore::open_or_recover`]).
    #[error("{}", metadata_message(path, source))]
    Metadata {
        /// The store file.
        path: PathBuf,
        /// The store error.
        source: MetadataError,
    },
    /// Opening the topics failed.
    #[error(transparent)]
    Open(#[from] OpenError),
    /// The MQTT listener could not start.
    #[error(transparent)]
    Mqtt(#[from] crate::mqtt::MqttError),
    /// The local API address could not be bound.
    #[error("local_api {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// The HTTP server failed.
    #[error("local API server: {0}")]
    Server(std::io::Error),
    /// The TLS files for replication are unusable.
    #[error("replication TLS: {0}")]
    Tls(#[from] broker_core::tls::TlsError),
    /// The local API's `[local_api_tls]` files are unusable (the error
    /// names the setting).
    #[error("{0}")]
    LocalApiTls(broker_core::tls::TlsError),
    /// The HTTP publishes a crash left unanswered could not be settled
    /// ([`crate::pending::settle_all`]): the local metadata store failed.
    #[error("settling the publishes a crash left unanswered: {0}")]
    Settle(MetadataError),
    /// Closing the topics failed.
    #[error("shutdown: {0}")]
    Close(#[from] TopicError),
}

/// `local metadata store PATH: ERROR`, without naming the path twice when
/// the store's error names it already.
fn metadata_message(path: &std::path::Path, source: &MetadataError) -> String {
    match source {
        MetadataError::Storage { .. }
        | MetadataError::Damaged { .. }
        | MetadataError::InUse { .. } => {
            format!("local {source}")
        }
        _ => format!("local metadata store {}: {source}", path.display()),
    }
}

/// Logs what opening the metadata store and the topics found missing and
/// rebuilt: one `error!` line when a damaged store was replaced (what is
/// lost, how it is rebuilt, where the damaged file is), a `warn!` when an
/// existing data directory came with no store or no checkpoints.
fn log_metadata_recovery(report: &StoreOpenReport, rebuild: &MetadataRebuild) {
    let rebuilt_topics: Vec<&str> = rebuild.topics.iter().map(|t| t.as_str()).collect();
    let checkpoints_missing: Vec<&str> = rebuild
        .checkpoints_missing
        .iter()
        .map(|t| t.as_str())
        .collect();
    if let Some(aside) = &report.moved_aside {
        error!(
            path = %report.path.display(),
            moved_to = %aside.display(),
            damage = report.damage.as_deref().unwrap_or(""),
            rebuilt_topics = rebuilt_topics.join(","),
            checkpoints_missing = checkpoints_missing.join(","),
            "local metadata store was DAMAGED: moved aside and replaced by a fresh store. Lost: every \
             stored topic setting and replication checkpoint. Rebuilt: configured topics from the \
             configuration, topics found as WAL directories with the implicit-topic defaults \
             (rebuilt_topics); checkpoints are re-learned from the broker's high-water mark on the \
             next connection. No WAL record is lost. The moved_to file can be deleted after inspection"
        );
    } else if !rebuild.topics.is_empty() || (report.created && !checkpoints_missing.is_empty()) {
        warn!(
            path = %report.path.display(),
            store_created = report.created,
            rebuilt_topics = rebuilt_topics.join(","),
            checkpoints_missing = checkpoints_missing.join(","),
            "local metadata store is missing what the WAL directories hold (deleted or lost): topics \
             recreated with the implicit-topic defaults (rebuilt_topics); checkpoints are re-learned \
             from the broker's high-water mark on the next connection"
        );
    } else if !checkpoints_missing.is_empty() {
        info!(
            checkpoints_missing = checkpoints_missing.join(","),
            "topics with records and no checkpoint yet: the broker's high-water mark says where replication resumes"
        );
    }
}

/// A running agent.
#[derive(Debug)]
pub struct Agent {
    manager: Arc<TopicManager>,
    local_addr: SocketAddr,
    shutdown: watch::Sender<bool>,
    server: JoinHandle<std::io::Result<()>>,
    checkpoints: JoinHandle<()>,
    recovery: JoinHandle<()>,
    replicator: Option<JoinHandle<()>>,
    cert_reload: Option<JoinHandle<()>>,
    replication: Arc<ReplicationStats>,
    /// The replication stall watch and its ticker (replication configured).
    stall: Option<(SharedStall, JoinHandle<()>)>,
    mqtt: Option<crate::mqtt::MqttServer>,
}

/// The [`StallWatch`] as the agent's tasks share it.
pub type SharedStall = Arc<std::sync::Mutex<StallWatch>>;

/// Feeds `watch` what replication looks like about five times per
/// `unhealthy_after` (at least every 100 ms, at most every second) until
/// shutdown.
fn spawn_stall_watch(
    watch: SharedStall,
    manager: Arc<TopicManager>,
    replication: Arc<ReplicationStats>,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    let tick = {
        let after = watch
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .unhealthy_after();
        (after / 5).clamp(Duration::from_millis(100), Duration::from_secs(1))
    };
    tokio::spawn(async move {
        loop {
            tokio::select! {
                () = tokio::time::sleep(tick) => {}
                _ = stop.wait_for(|&s| s) => return,
            }
            let topics: Vec<(String, u64, u64)> = manager
                .topics()
                .iter()
                .filter(|t| t.wal().is_some())
                .map(|t| {
                    (
                        t.name().as_str().to_owned(),
                        t.high_water_mark(),
                        t.acknowledged_offset(),
                    )
                })
                .collect();
            let connected = replication.open_connections.load(Ordering::Relaxed) > 0;
            watch
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .observe(
                    Instant::now(),
                    connected,
                    topics.iter().map(|(name, hwm, acked)| TopicProgress {
                        name,
                        high_water_mark: *hwm,
                        acknowledged_offset: *acked,
                    }),
                );
        }
    })
}

/// Claims the data directory for this edge (`identity.json`, written on
/// first start and on a directory from before identity files whose topics
/// are all of this `edge_id`), or refuses it: another `edge_id`'s (its
/// unreplicated backlog would be stranded), a broker's, an unreadable file.
fn claim_data_dir(config: &AgentConfig) -> Result<(), AgentError> {
    let owner = broker_core::data_dir::Owner::EdgeAgent {
        edge_id: config.edge_id.as_str().to_owned(),
    };
    let found = broker_core::data_dir::claim(&config.data_dir, &owner)?;
    if found == broker_core::data_dir::Found::Adopted {
        info!(
            path = %broker_core::data_dir::identity_path(&config.data_dir).display(),
            edge_id = config.edge_id.as_str(),
            "data directory from before identity files: identity file written from the configuration"
        );
    }
    Ok(())
}

impl Agent {
    /// Starts an agent with the system clock; see [`Agent::start_with_clock`].
    ///
    /// # Errors
    /// As [`Agent::start_with_clock`].
    pub async fn start(config: AgentConfig) -> Result<Agent, AgentError> {
        Agent::start_with_clock(config, Arc::new(SystemClock)).await
    }

    /// Creates the data directory, claims it for this `edge_id` or refuses
    /// it ([`broker_core::data_dir::claim`]), opens the local metadata store
    /// (`{data_dir}/metadata.redb`) and every topic, binds the local API
    /// (port 0 picks a free port; see [`Agent::local_addr`]) and starts
    /// serving. `clock` stamps records published without a timestamp.
    ///
    /// # Errors
    /// [`AgentError::DataDir`], [`AgentError::Identity`],
    /// [`AgentError::Metadata`], [`AgentError::Open`], [`AgentError::Bind`].
    pub async fn start_with_clock(
        config: AgentConfig,
        clock: Arc<dyn Clock>,
    ) -> Result<Agent, AgentError> {
        let data_dir = config.data_dir.clone();
        std::fs::create_dir_all(&data_dir).map_err(|source| AgentError::DataDir {
            path: data_dir.clone(),
            // "File exists" said nothing about what was wrong.
            source: if data_dir.exists() && !data_dir.is_dir() {
                std::io::Error::new(std::io::ErrorKind::NotADirectory, "not a directory")
            } else {
                source
            },
        })?;
        claim_data_dir(&config)?;
        let path = data_dir.join(METADATA_FILE);
        let (store, store_report) = {
            let (file, clock) = (path.clone(), clock.clone());
            tokio::task::spawn_blocking(move || RedbStore::open_or_recover(file, clock))
                .await
                .map_err(|e| MetadataError::Task {
                    op: "open",
                    reason: e.to_string(),
                })
                .and_then(|r| r)
                .map_err(|source| AgentError::Metadata { path, source })?
        };
        let config = Arc::new(config);
        let manager = Arc::new(TopicManager::open(config.clone(), store, clock).await?);
        log_metadata_recovery(&store_report, manager.metadata_rebuild());
        // Before the local API, the MQTT listener or the replicator can
        // append to or delete from a WAL (crate::pending).
        let settled = crate::pending::settle_all(&manager)
            .await
            .map_err(AgentError::Settle)?;
        if settled != crate::pending::Settled::default() {
            info!(
                stored = settled.stored,
                not_stored = settled.not_stored,
                unreadable = settled.unreadable,
                realtime_answers_forgotten = settled.realtime_answers,
                "settled the HTTP publishes a crash left unanswered (a retry of a stored one gets its offsets)"
            );
        }
        // Loaded before any task starts, so a refusal leaves nothing
        // running. Refuses a key that is not the certificate's, so the
        // agent does not take records it could never send.
        let replication_tls = match (&config.tls, config.brokers.is_empty()) {
            (Some(paths), false) => {
                let tls = paths.load_identity("tls").map_err(AgentError::Tls)?;
                // Rotation: SIGHUP or changed files swap the certificate
                // the replicator presents (crate::cert_reload).
                let reloader = crate::cert_reload::CertReloader::new(
                    paths.clone(),
                    config.edge_id.as_str(),
                    &tls,
                )
                .map_err(AgentError::Tls)?;
                Some((Arc::new(reloader), tls))
            }
            _ => None,
        };
        let local_api_tls = match &config.local_api_security.tls {
            Some(tls) => {
                Some(crate::api_access::server_config(tls).map_err(AgentError::LocalApiTls)?)
            }
            None => None,
        };
        let listener = tokio::net::TcpListener::bind(config.local_api)
            .await
            .map_err(|source| AgentError::Bind {
                addr: config.local_api,
                source,
            })?;
        let local_addr = listener.local_addr().map_err(|source| AgentError::Bind {
            addr: config.local_api,
            source,
        })?;
        let (shutdown, _) = watch::channel(false);
        let replication = Arc::new(ReplicationStats::default());
        let stall: Option<SharedStall> = replication_tls.as_ref().map(|_| {
            Arc::new(std::sync::Mutex::new(StallWatch::new(
                config.replication.unhealthy_after,
                Instant::now(),
            )))
        });
        let mqtt = match &config.mqtt {
            Some(mqtt) => Some(
                crate::mqtt::MqttServer::start(mqtt.clone(), manager.clone(), shutdown.subscribe())
                    .await?,
            ),
            None => None,
        };
        let server = {
            let mut stop = shutdown.subscribe();
            // `/metrics` reads the replication (and MQTT) counters from
            // these extensions.
            let mut app = api::router(&manager).layer(axum::Extension(replication.clone()));
            if let Some(mqtt) = &mqtt {
                app = app.layer(axum::Extension(mqtt.stats.clone()));
            }
            if let Some(stall) = &stall {
                app = app.layer(axum::Extension(stall.clone()));
            }
            if let Some(token) = &config.local_api_security.token {
                app = app.layer(axum::middleware::from_fn_with_state(
                    Arc::new(token.clone()),
                    crate::api_access::require_token,
                ));
            }
            let stopped = async move {
                let _ = stop.wait_for(|&s| s).await;
            };
            match local_api_tls {
                Some(tls) => {
                    let listener =
                        crate::api_access::TlsListener::new(listener, tls).map_err(|source| {
                            AgentError::Bind {
                                addr: config.local_api,
                                source,
                            }
                        })?;
                    tokio::spawn(crate::api_access::serve(listener, app, stopped))
                }
                None => tokio::spawn(crate::api_access::serve(listener, app, stopped)),
            }
        };
        let checkpoints = {
            let mut stop = shutdown.subscribe();
            let manager = manager.clone();
            let interval = config.checkpoint_interval;
            tokio::spawn(async move {
                // Failed flushes in a row: one warning per episode, not one
                // per interval (a full disk can last hours).
                let mut failing = 0u64;
                loop {
                    tokio::select! {
                        _ = tokio::time::sleep(interval) => {}
                        _ = stop.wait_for(|&s| s) => return,
                    }
                    match manager.flush_checkpoints().await {
                        Err(e) if failing == 0 => {
                            failing = 1;
                            warn!(error = %e, "writing checkpoints failed; retrying every checkpoint interval (logged again once it works)");
                        }
                        Err(_) => failing += 1,
                        Ok(_) if failing > 0 => {
                            info!(failed_attempts = failing, "writing checkpoints works again");
                            failing = 0;
                        }
                        Ok(_) => {}
                    }
                }
            })
        };
        // Reopens WALs latched by an I/O failure (a full disk), with each
        // topic's backoff.
        let recovery = {
            let mut stop = shutdown.subscribe();
            let manager = manager.clone();
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        _ = tokio::time::sleep(crate::manager::RECOVERY_TICK) => {}
                        _ = stop.wait_for(|&s| s) => return,
                    }
                    manager.recover_faulted().await;
                }
            })
        };
        let mut cert_reload = None;
        let replicator = match replication_tls {
            Some((reloader, tls)) => {
                let client_cert = reloader.client_cert();
                cert_reload = Some(tokio::spawn(crate::cert_reload::run(
                    reloader,
                    config.tls_check_interval,
                    shutdown.subscribe(),
                )));
                let mut replicator_config = ReplicatorConfig::new(config.brokers.clone());
                replicator_config.bandwidth_cap_bytes_per_s = config.bandwidth_cap_bytes_per_s;
                replicator_config.congestion_controller = config.congestion_controller;
                replicator_config.keep_alive = config.replication.keep_alive;
                replicator_config.idle_timeout = config.replication.idle_timeout;
                Some(tokio::spawn(replicator::run(
                    replicator_config,
                    tls,
                    client_cert,
                    manager.clone(),
                    replication.clone(),
                    shutdown.subscribe(),
                )))
            }
            _ => {
                warn!("no broker address: records are kept locally, not replicated");
                None
            }
        };
        let stall = stall.map(|watch| {
            let task = spawn_stall_watch(
                watch.clone(),
                manager.clone(),
                replication.clone(),
                shutdown.subscribe(),
            );
            (watch, task)
        });
        info!(
            edge_id = %config.edge_id,
            local_api = %local_addr,
            local_api_tls = config.local_api_security.tls.is_some(),
            local_api_token = config.local_api_security.token.is_some(),
            data_dir = %data_dir.display(),
            "edge agent started"
        );
        Ok(Agent {
            manager,
            local_addr,
            shutdown,
            server,
            checkpoints,
            recovery,
            replicator,
            cert_reload,
            replication,
            stall,
            mqtt,
        })
    }

    /// The topic manager: enumerate topics, get WAL handles and rings,
    /// report acknowledgements.
    pub fn topics(&self) -> &Arc<TopicManager> {
        &self.manager
    }

    /// Address of the MQTT listener, when `[mqtt]` is configured.
    pub fn mqtt_addr(&self) -> Option<SocketAddr> {
        self.mqtt.as_ref().map(|m| m.local_addr)
    }

    /// Replication counters: connections, raw and wire bytes sent.
    pub fn replication_stats(&self) -> &Arc<ReplicationStats> {
        &self.replication
    }

    /// The configuration in force.
    pub fn config(&self) -> &AgentConfig {
        self.manager.config()
    }

    /// The bound address of the local API.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// A receiver that turns `true` when shutdown begins (for tasks such as
    /// the replicator, which should then stop and drop their WAL handles).
    pub fn shutdown_signal(&self) -> watch::Receiver<bool> {
        self.shutdown.subscribe()
    }

    /// Stops serving (requests in flight complete), stops replicating,
    /// writes checkpoints and closes every topic. Returns once every task
    /// that held the metadata store or a WAL has ended, and closes the
    /// store (the agent's handle on the topic manager is the last one
    /// unless the caller cloned [`Agent::topics`]).
    ///
    /// # Errors
    /// [`AgentError::Server`] if the server had failed,
    /// [`AgentError::Close`] if a checkpoint or WAL flush failed (every
    /// topic is still closed).
    pub async fn shutdown(self) -> Result<(), AgentError> {
        info!("edge agent shutting down");
        self.shutdown.send_replace(true);
        let served = match self.server.await {
            Ok(result) => result.map_err(AgentError::Server),
            Err(e) => Err(AgentError::Server(std::io::Error::other(e))),
        };
        if let Some(mqtt) = self.mqtt {
            mqtt.join().await;
        }
        let _ = self.checkpoints.await;
        let _ = self.recovery.await;
        if let Some((_, task)) = self.stall {
            let _ = task.await;
        }
        if let Some(replicator) = self.replicator {
            // It stops on the shutdown signal and drops its WAL handles.
            let _ = replicator.await;
        }
        if let Some(cert_reload) = self.cert_reload {
            let _ = cert_reload.await;
        }
        let closed = self.manager.close().await.map_err(AgentError::from);
        // Every task that held the manager has ended: this is the last
        // handle (unless the caller kept one), and dropping it closes the
        // metadata store.
        if let Err(manager) = Arc::try_unwrap(self.manager) {
            warn!(
                holders = Arc::strong_count(&manager) - 1,
                "the topic manager is still held after shutdown; the metadata store stays open"
            );
        }
        served?;
        closed?;
        info!("edge agent stopped");
        Ok(())
    }
}
