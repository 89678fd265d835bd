//! Runs a broker: the Raft metadata node and the admin API, until a shutdown
//! signal, then stops both cleanly. The admin, consumer and storage APIs
//! share one listener: HTTPS with the broker's certificate
//! ([`crate::http::tls`]), or plain HTTP when `admin_plain_http` is set on a
//! loopback address.

use std::future::Future;
use std::sync::Arc;

use broker_core::clock::SystemClock;
use broker_core::tls::ALPN_REPLICATION;
use tracing::info;
use tributary_proto::limits::Limits;

use crate::admin::{AdminState, router};
use crate::config::BrokerConfig;
use crate::raft::node::{MetaNode, NodeConfig};
use crate::replication::topics::TopicStore;
use crate::storage::with_local_segments;
use crate::store::RaftMetadataStore;

/// Why the broker could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// Bad configuration.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// TLS files unusable.
    #[error(transparent)]
    Tls(#[from] broker_core::tls::TlsError),
    /// The Raft node failed to start.
    #[error(transparent)]
    Node(#[from] crate::raft::node::NodeError),
    /// The `[enroll]` CA is unusable.
    #[error(transparent)]
    Enroll(#[from] crate::enroll::SignerError),
    /// The ingest endpoint could not be set up.
    #[error("ingest: {0}")]
    Ingest(#[from] crate::replication::quic::QuicEndpointError),
    /// The data directory holds topic WALs but no Raft state: starting
    /// would initialize a new, empty cluster over them.
    #[error(
        "{raft} is missing or empty, but {topics} holds topic WALs: this broker's metadata \
         (topics, owners, tokens, subscriptions) is lost, and starting would initialize a new, \
         empty cluster over the old data; refusing. Restore {raft} from a backup, or move \
         {topics} away to start over"
    )]
    MetadataLost {
        /// `{data_dir}/raft/raft.redb`.
        raft: std::path::PathBuf,
        /// `{data_dir}/topics`.
        topics: std::path::PathBuf,
    },
    /// The data directory is another node's or another component's, or its
    /// identity file is unreadable (see [`broker_core::data_dir`]).
    #[error(transparent)]
    DataDir(#[from] broker_core::data_dir::IdentityError),
    /// A listener could not be bound or failed.
    #[error("{what} listener on {addr}: {source}")]
    Listen {
        /// `admin`.
        what: &'static str,
        /// Listen address.
        addr: std::net::SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
}

/// Starts the broker described by `config` and runs it until `shutdown`
/// resolves; then stops accepting admin requests, shuts Raft down and
/// returns.
///
/// # Errors
/// [`ServerError`] if anything fails to start.
pub async fn run(
    mut config: BrokerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    config.resolve_secrets()?;
    config.validate()?;
    let tls_paths = config
        .tls
        .clone()
        .ok_or(crate::config::ConfigError::Invalid {
            field: "tls",
            reason: "missing".into(),
        })?;
    let tls = tls_paths.load_identity("tls")?;
    crate::check::own_identity(&config, &tls_paths, &tls)?;
    let node_config = NodeConfig {
        node_id: config.node_id,
        data_dir: config.data_dir.join("raft"),
        listen: config.raft_listen,
        members: config.effective_members(),
        heartbeat_ms: config.raft.heartbeat_ms,
        election_timeout_ms: (
            config.raft.election_timeout_min_ms,
            config.raft.election_timeout_max_ms,
        ),
        snapshot_every: config.raft.snapshot_every,
        logs_kept_after_snapshot: config.raft.logs_kept_after_snapshot,
    };
    // Whose the directory is comes first (an edge agent's directory is
    // refused as such, not for its missing Raft state); the file is written
    // only once nothing else refuses the directory.
    broker_core::data_dir::inspect(&config.data_dir, &data_dir_owner(&config))?;
    refuse_lost_metadata(&config.data_dir)?;
    claim_data_dir(&config)?;
    refuse_taken_addresses(&config)?;
    let node = MetaNode::start(node_config, &tls).await?;
    let store = RaftMetadataStore::new(node.clone(), Arc::new(SystemClock));
    let store: Arc<dyn broker_core::metadata::MetadataStore> = Arc::new(store);
    let state = AdminState {
        auth: crate::auth::AuthState::new(store.clone(), config.admin_token.clone()),
        store,
        cluster: Arc::new(node.clone()),
    };
    let topics = Arc::new(
        TopicStore::new(
            config.data_dir.join("topics"),
            state.store.clone(),
            Limits::default(),
        )
        .with_segment_max_age(Some(std::time::Duration::from_millis(
            config
                .wal
                .segment_max_age_ms
                .unwrap_or(crate::config::DEFAULT_SEGMENT_MAX_AGE_MS),
        )))
        .with_storage_keys(match &config.archive {
            Some(archive) => {
                tributary_proto::keys::StorageKeys::new(&archive.prefix).map_err(|e| {
                    crate::config::ConfigError::Invalid {
                        field: "archive.prefix",
                        reason: e.to_string(),
                    }
                })?
            }
            None => tributary_proto::keys::StorageKeys::default(),
        }),
    );
    // Topic ownership: this broker's lease, the view of `/cluster/*`, the
    // load manager (acting only while this node leads Raft).
    let cluster = crate::cluster::Cluster::new(
        config.node_id,
        state.store.clone(),
        Arc::new(SystemClock),
        crate::cluster::ClusterConfig {
            lease_ttl_ms: config.cluster.lease_ttl_ms,
            heartbeat_ms: config.cluster.heartbeat_ms,
            lease_margin_ms: config.cluster.lease_margin_ms,
            restart_hold_ms: config.cluster.restart_hold_ms,
            ingest_addr: config
                .cluster
                .advertised_ingest
                .clone()
                .unwrap_or_else(|| config.ingest_listen.to_string()),
            admin_url: config
                .cluster
                .advertised_admin_url
                .clone()
                .unwrap_or_else(|| {
                    let scheme = if config.admin_plain_http {
                        "http"
                    } else {
                        "https"
                    };
                    format!("{scheme}://{}", config.admin_listen)
                }),
        },
    );
    topics.set_cluster(cluster.clone());
    // The cluster's id: created once (put-if-absent), then read back.
    let identity_task = topics.identity().spawn_load();
    let cluster_tasks = {
        let leader_node = node.clone();
        let me = config.node_id;
        let is_leader: crate::cluster::manager::IsLeader =
            Arc::new(move || leader_node.status().leader == Some(me));
        let silent_node = node.clone();
        let unreachable: crate::cluster::manager::Unreachable =
            Arc::new(move || silent_node.unanswered_members());
        let follower = tokio::spawn(cluster.clone().follow());
        let lease = tokio::spawn(crate::cluster::lease::run(cluster.clone()));
        let manager = tokio::spawn(crate::cluster::manager::run(
            cluster.clone(),
            is_leader,
            unreachable,
        ));
        let releaser = {
            let (cluster, topics) = (cluster.clone(), topics.clone());
            tokio::spawn(async move {
                let mut changes = cluster.subscribe();
                topics.place_unmarked().await;
                loop {
                    topics.release_lost().await;
                    if changes.changed().await.is_err() {
                        break;
                    }
                    // Coalesce bursts of changes.
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            })
        };
        [follower, lease, manager, releaser]
    };
    let mut ingest_server = tls.quic_server(ALPN_REPLICATION)?;
    ingest_server.transport_config(Arc::new(crate::replication::ingest::ingest_transport(
        broker_core::tls::transport_config(),
    )));
    let receive_budget =
        crate::replication::receive_budget::ReceiveBudget::new(config.ingest.receive_budget());
    let receive_thread = crate::replication::quic::ReceiveThread::start()?;
    let ingest =
        receive_thread.server_endpoint(ingest_server, config.ingest_listen, &config.data_dir)?;
    let damage = crate::replication::damage::DamageService::new(
        topics.clone(),
        config
            .wal
            .scrub_bytes_per_sec
            .unwrap_or(crate::replication::damage::DEFAULT_SCRUB_BYTES_PER_SEC),
        config.wal.damage_check_interval_ms.map_or(
            crate::replication::damage::DEFAULT_CHECK_INTERVAL,
            std::time::Duration::from_millis,
        ),
    );
    if let Some(archive) = &config.archive {
        damage.set_archive(crate::consumer::tiered::open_archive(
            archive,
            state.store.clone(),
        )?);
    }
    let damage_task = damage.spawn();
    let gate = crate::replication::revocation::EdgeGate::new(state.auth.cache().clone());
    let gate_task = gate.spawn_watch();
    // Which edges are connected, shared through Raft (`GET /v1/edges`).
    let fleet =
        crate::fleet::Fleet::new(config.node_id, Arc::new(SystemClock), config.fleet.clone());
    let state_store = state.store.clone();
    let fleet_task = tokio::spawn(crate::fleet::report::run(
        fleet.clone(),
        state_store.clone(),
    ));
    tokio::spawn(crate::replication::ingest::serve(
        ingest.clone(),
        damage.clone(),
        gate,
        fleet.clone(),
        receive_budget,
        Limits::default(),
    ));
    // `[enroll]`: the CA that signs enrolling edges (checked against
    // tls.ca); without it `/v1/enroll` answers 503 enrollment_disabled.
    let signer = match &config.enroll {
        Some(enroll) => {
            let signer = crate::enroll::Signer::load(enroll, &tls_paths.ca)?;
            info!(ca = %enroll.ca_cert.display(), "enrollment enabled: signing edge certificates");
            Some(Arc::new(signer))
        }
        None => None,
    };
    let listener = tokio::net::TcpListener::bind(config.admin_listen)
        .await
        .map_err(|source| ServerError::Listen {
            what: "admin",
            addr: config.admin_listen,
            source,
        })?;
    info!(
        node_id = config.node_id,
        raft = %config.raft_listen,
        admin = %config.admin_listen,
        ingest = %config.ingest_listen,
        "broker started"
    );
    broker_core::service::notify_ready();
    let watchdog = tokio::spawn(broker_core::service::watchdog_loop());
    let consumers = crate::consumer::ConsumerService::new(
        topics.clone(),
        state.store.clone(),
        config.consumers.clone(),
        config.admin_listen.to_string(),
        config.node_id,
        Arc::new(SystemClock),
    );
    let archive = match &config.archive {
        Some(archive) => Some(crate::consumer::tiered::open_archive(
            archive,
            state.store.clone(),
        )?),
        None => None,
    };
    if let Some(archive) = &archive {
        consumers.set_archive(archive.clone());
    }
    // Cursor writes and dead-letter copies are fenced by ownership.
    consumers.set_cluster(cluster.clone());
    let ticker = consumers.spawn_ticker();
    let _budget = if config.budget.enabled() {
        let budget =
            crate::budget::Budget::new(config.budget.clone(), &topics, state.store.clone());
        budget.refresh().await;
        crate::budget::Budget::install(budget)
    } else {
        None
    };
    let retention = config.retention.interval_ms.map(|ms| {
        crate::storage::retention::spawn(
            topics.clone(),
            state.store.clone(),
            ms,
            config.retention.max_age_ms,
        )
    });
    // The audit log of admin actions: this broker's own central topic,
    // created in the background (start-up does not wait for a leader).
    let audit_task = match crate::auth::audit::audit_topic(config.node_id) {
        Ok(topic) => {
            info!(%topic, "audit log of admin actions");
            let (sink, task) =
                crate::auth::audit::AuditSink::spawn(state.store.clone(), topics.clone(), topic);
            state.auth.set_audit(sink);
            Some(task)
        }
        Err(error) => {
            tracing::error!(%error, "audit log: invalid topic name; admin actions are not audited");
            None
        }
    };
    let consumer_routes = crate::consumer::http::router(consumers.clone(), state.auth.clone());
    // Open long polls answer as soon as the broker stops, before the
    // listener drains its connections.
    let shutdown = {
        let consumers = consumers.clone();
        async move {
            shutdown.await;
            consumers.stop_long_polls();
        }
    };
    let metrics = crate::metrics::router(crate::metrics::MetricsState {
        cluster: state.cluster.clone(),
        store: state.store.clone(),
        topics: topics.clone(),
        fleet: Some(fleet.clone()),
    });
    // The tier service's trim requests reach the central WALs through this.
    let enroll_routes = crate::enroll::enroll_router(crate::enroll::EnrollService::new(
        state.store.clone(),
        state.auth.clone(),
        signer,
    ));
    let mut app = with_local_segments(
        router(state)
            .merge(metrics)
            .merge(consumer_routes)
            .merge(enroll_routes),
        topics.clone(),
    )
    .layer(axum::Extension(damage.clone()))
    .layer(axum::Extension(consumers.clone()))
    .layer(axum::Extension(cluster.clone()))
    .layer(axum::Extension(fleet.clone()))
    .layer(axum::Extension(topics.identity().clone()))
    .layer(axum::middleware::map_response(crate::http::json_rejections));
    // Descriptor commits and trims check objects in the archive; without
    // `[archive]` both are refused (`archive_not_configured`).
    match archive {
        Some(archive) => app = crate::storage::with_storage_archive(app, archive),
        None => tracing::warn!(
            "no [archive] section: the storage API refuses descriptor commits and trims (archive_not_configured)"
        ),
    }
    let served = if config.admin_plain_http {
        // validate() allows this on a loopback address only.
        tracing::warn!(admin = %config.admin_listen, "admin API over plain HTTP on loopback");
        axum::serve(listener, app)
            .with_graceful_shutdown(shutdown)
            .await
    } else {
        info!(admin = %config.admin_listen, "admin API over HTTPS");
        crate::http::tls::serve_https(listener, Arc::new(tls.https_server()?), app, shutdown).await
    };
    let result = served.map_err(|source| ServerError::Listen {
        what: "admin",
        addr: config.admin_listen,
        source,
    });
    info!("shutting down");
    broker_core::service::notify_stopping();
    // Cursors first, while this broker still owns its topics (the writes
    // are fenced by ownership: after the hand-over they would be refused).
    consumers.persist_all().await;
    // Hand this broker's topics to the others before going (bounded): edges
    // are redirected and consumers follow, instead of waiting out the lease.
    match tokio::time::timeout(std::time::Duration::from_secs(5), cluster.drain()).await {
        Ok(Ok(0)) => {}
        Ok(Ok(moved)) => info!(moved, "handed topics over to other brokers"),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "handing topics over failed; they move when the lease lapses")
        }
        Err(_) => {
            tracing::warn!("handing topics over timed out; the rest move when the lease lapses")
        }
    }
    for task in cluster_tasks {
        task.abort();
    }
    // What it keeps (centrally written topics) waits for its restart, not
    // only for its lease (bounded: without a leader the lease lapses).
    match tokio::time::timeout(
        std::time::Duration::from_secs(2),
        cluster.hold_for_restart(),
    )
    .await
    {
        Ok(Ok(0)) => {}
        Ok(Ok(held)) => {
            info!(
                held,
                hold_ms = cluster.config().restart_hold_ms,
                "the topics this broker keeps wait for its restart ([cluster] restart_hold_ms) before another broker takes them over at the archive's end"
            )
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "holding the kept topics for the restart failed; they move when the lease lapses")
        }
        Err(_) => tracing::warn!(
            "holding the kept topics for the restart timed out; they move when the lease lapses"
        ),
    }
    watchdog.abort();
    identity_task.abort();
    ingest.close(0u32.into(), b"broker shutting down");
    // Record the edges' disconnects while Raft still runs (bounded: without
    // a leader the next start rewrites them).
    fleet_task.abort();
    fleet.close_all("broker shutting down");
    let _ = tokio::time::timeout(
        std::time::Duration::from_secs(2),
        crate::fleet::report::flush(&fleet, state_store.as_ref()),
    )
    .await;
    ticker.abort();
    damage_task.abort();
    gate_task.abort();
    if let Some(audit_task) = audit_task {
        audit_task.abort();
    }
    if let Some(retention) = retention {
        retention.abort();
    }
    topics.close_all().await;
    node.shutdown().await;
    result
}

/// This broker as the owner of its data directory.
fn data_dir_owner(config: &BrokerConfig) -> broker_core::data_dir::Owner {
    broker_core::data_dir::Owner::Broker {
        node_id: config.node_id,
    }
}

/// Claims the data directory for this broker (`identity.json`, written on
/// first start and on a directory from before identity files), or refuses
/// it: another `node_id`'s, an edge agent's, an unreadable file.
///
/// # Errors
/// [`ServerError::DataDir`].
/// Binds the admin (TCP) and ingest (UDP) addresses once and lets them go
/// again, before Raft starts: an address in use is then the start's one
/// error line. (Found only when bound, after Raft had started, its
/// shutdown logged openraft errors before it.)
fn refuse_taken_addresses(config: &BrokerConfig) -> Result<(), ServerError> {
    std::net::TcpListener::bind(config.admin_listen).map_err(|source| ServerError::Listen {
        what: "admin",
        addr: config.admin_listen,
        source,
    })?;
    std::net::UdpSocket::bind(config.ingest_listen).map_err(|source| {
        ServerError::Ingest(crate::replication::quic::QuicEndpointError::Bind {
            addr: config.ingest_listen,
            source,
        })
    })?;
    Ok(())
}

fn claim_data_dir(config: &BrokerConfig) -> Result<(), ServerError> {
    let found = broker_core::data_dir::claim(&config.data_dir, &data_dir_owner(config))?;
    if found == broker_core::data_dir::Found::Adopted {
        info!(
            path = %broker_core::data_dir::identity_path(&config.data_dir).display(),
            node_id = config.node_id,
            "data directory from before identity files: identity file written from the configuration"
        );
    }
    Ok(())
}

/// Refuses to start on a data directory whose Raft database
/// (`raft/raft.redb`) is missing or empty while `topics/` holds WALs: the
/// metadata that names those topics, their owners and epochs is gone (a
/// deleted or truncated file, a restore that missed it), and a Raft node
/// that lost its persisted state must not take part again. Opening would
/// otherwise create an empty database and initialize a new cluster over the
/// old WALs. A damaged, non-empty database is refused when it is opened.
///
/// # Errors
/// [`ServerError::MetadataLost`].
fn refuse_lost_metadata(data_dir: &std::path::Path) -> Result<(), ServerError> {
    let raft = data_dir.join("raft").join("raft.redb");
    let topics = data_dir.join("topics");
    let raft_empty = match std::fs::metadata(&raft) {
        Ok(meta) => meta.len() == 0,
        Err(e) => e.kind() == std::io::ErrorKind::NotFound,
    };
    let has_topics = std::fs::read_dir(&topics).is_ok_and(|mut entries| entries.next().is_some());
    if raft_empty && has_topics {
        return Err(ServerError::MetadataLost { raft, topics });
    }
    Ok(())
}
