//! The replicator: one QUIC connection (mutual TLS) to a bootstrap broker,
//! one more per distinct owner a topic was redirected to, and one
//! long-lived stream per durable topic, driving
//! `tributary_proto::replication::edge::EdgeStream`.
//!
//! - `brokers = [...]` is a bootstrap list. A broker that does not own a
//!   topic answers its `Hello` with a `Redirect` naming the owner's ingest
//!   address; the topic's stream then runs on a connection to that address
//!   (one per distinct address, shared by the topics routed there). Where
//!   each topic runs, how many hops it may follow and the fallback to the
//!   bootstrap connection are decided by the I/O-free [`routes`] table;
//!   `targets` is the tokio shell around the owner connections.
//! - Keep-alive 1 s and idle timeout 5 s by default
//!   (`[replication] keep_alive_ms`, `idle_timeout_ms`): a dead broker is
//!   noticed within seconds. A stream refused for a retryable reason
//!   (`Unavailable`: no owner yet, lease lost) is retried after
//!   [`link::RETRYABLE_RESTART`] (1 s), so a failover is quick.
//! - On every (re)connect the broker's `Welcome` says where to resume; the
//!   local checkpoint is only a record of what was acknowledged.
//! - Batches are the WAL's record batches sent verbatim (zstd on the wire
//!   when smaller), pipelined up to a window of batches/bytes in flight.
//! - Acknowledgements go to `TopicManager::on_acknowledged` (checkpoint at
//!   `/edge/checkpoints/{ns}/{topic}`, then WAL retention). The broker sends
//!   each one twice: as an `Ack` frame on the topic's stream and as a QUIC
//!   datagram ([`AckDatagram`]) that one task per connection routes to the
//!   stream by its QUIC stream id; whichever arrives first counts. On a lossy
//!   link a lost stream packet holds up every later `Ack` frame until it is
//!   resent, while the next datagram gets through.
//! - Reconnects back off exponentially with jitter, capped at 30 s; a
//!   handshake gets at most [`CONNECT_TIMEOUT`]. Broker rotation, backoff,
//!   the "working connection" rule and which failures warn are decided by
//!   the I/O-free [`link::Link`]; this module is the tokio shell around it. A broker that restarts on
//!   the same address resets the old connection at once (its stateless
//!   reset key survives restarts), so the edge does not wait out the idle
//!   timeout.
//! - Backlog drain order: streams get QUIC priorities by intent, so audit_log
//!   data leaves before task_queue, then event_stream; keepalives are QUIC
//!   PING frames and never wait behind stream data.
//! - An optional bandwidth cap (bytes/s) paces all streams together.
//! - Realtime topics (in-memory rings) are not replicated: they are a local
//!   live fan-out, lost on restart by design.//! - Shutdown ends everything: the connection is closed and every stream
//!   task, and the tasks each started, is awaited before [`run`] returns, so
//!   no WAL or metadata-store handle outlives the replicator.
//!
//! Modules: [`cluster`] (which central cluster the checkpoints belong
//! to), [`link`] (the per-link state machine), [`routes`] (where each
//! topic runs), `targets` (the owner connections), [`pacing`] (the
//! bandwidth cap's token bucket), `stream` (one topic's stream: read-ahead,
//! sending, checkpoints, archived offsets), [`stages`] (where each batch
//! spends its time, for `/metrics`).

pub mod cluster;
mod history;
pub mod link;
mod pacing;
mod read_ahead;
pub mod routes;
pub mod stages;
mod stream;
mod targets;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use broker_core::client_cert::SwappableClientCert;
use broker_core::tls::{ALPN_REPLICATION, BROKER_SERVER_NAME, TlsIdentity};
use tokio::sync::watch;
use tracing::{debug, info, warn};
use tributary_proto::replication::edge::{EdgeError, Window};

use self::link::{AttemptReport, Jitter, Link, RETRYABLE_RESTART, STREAM_RESTART, StreamReports};
use self::pacing::Pacer;
use self::routes::RedirectDecision;
use self::stream::{AckRoutes, BrokerConnection, replicate_topic, route_ack_datagrams};
use self::targets::Routing;
use crate::config::CongestionController;
use crate::declared_rate::DeclaredRateFactory;
use crate::manager::TopicManager;

/// Settings of the replicator.
#[derive(Debug, Clone)]
pub struct ReplicatorConfig {
    /// Bootstrap broker ingest addresses (`host:port`), tried in order.
    pub brokers: Vec<String>,
    /// QUIC keep-alive interval. Default 1 s.
    pub keep_alive: Duration,
    /// QUIC idle timeout (the connection uses the smaller of this and the
    /// broker's). Default 5 s.
    pub idle_timeout: Duration,
    /// Batches/bytes in flight per stream.
    pub window: Window,
    /// Compress batches with zstd on the wire when smaller.
    pub compress: bool,
    /// Optional cap on bytes sent per second, over all streams.
    pub bandwidth_cap_bytes_per_s: Option<u64>,
    /// Longest wait between reconnect attempts. Default 30 s.
    pub max_backoff: Duration,
    /// Congestion controller of the connection. Default Cubic.
    pub congestion_controller: CongestionController,
}

impl ReplicatorConfig {
    /// Defaults for `brokers`.
    pub fn new(brokers: Vec<String>) -> ReplicatorConfig {
        ReplicatorConfig {
            brokers,
            keep_alive: Duration::from_millis(crate::config::DEFAULT_KEEP_ALIVE_MS),
            idle_timeout: Duration::from_millis(crate::config::DEFAULT_IDLE_TIMEOUT_MS),
            window: Window::default(),
            compress: true,
            bandwidth_cap_bytes_per_s: None,
            max_backoff: Duration::from_secs(30),
            congestion_controller: CongestionController::Cubic,
        }
    }
}

/// Replication counters (for `/metrics` and tests).
#[derive(Debug, Default)]
pub struct ReplicationStats {
    /// Successful connections made.
    pub connects: std::sync::atomic::AtomicU64,
    /// Record-batch bytes sent before wire compression.
    pub raw_bytes_sent: std::sync::atomic::AtomicU64,
    /// Batch frame bytes actually sent.
    pub wire_bytes_sent: std::sync::atomic::AtomicU64,
    /// Established connections lost, by [`LossReason`] (indexed by
    /// `LossReason as usize`).
    pub connections_lost: [std::sync::atomic::AtomicU64; LossReason::ALL.len()],
    /// Acknowledgements that advanced a topic's acknowledged offset and
    /// arrived first as an `Ack` frame on the stream.
    pub stream_acks: std::sync::atomic::AtomicU64,
    /// Acknowledgements that advanced a topic's acknowledged offset and
    /// arrived first as a QUIC datagram.
    pub datagram_acks: std::sync::atomic::AtomicU64,
    /// `Redirect`s followed to a topic's owner.
    pub redirects_followed: std::sync::atomic::AtomicU64,
    /// Redirect loops (more than [`routes::MAX_REDIRECT_HOPS`] hops without
    /// a `Welcome`) that held a topic back.
    pub redirect_loops: std::sync::atomic::AtomicU64,
    /// The bootstrap connection's state, for `/health`.
    pub link: std::sync::Mutex<LinkStatus>,
    /// Connections to brokers open now (bootstrap and owners): records can
    /// leave the device while this is above 0 ([`crate::health`]).
    pub open_connections: std::sync::atomic::AtomicU64,
    /// Time batches spent in each stage, from the WAL to the
    /// acknowledgement ([`stages`]).
    pub stages: stages::StageTimes,
    /// Topics whose stream last ended for a reason an operator must look
    /// at on the broker's side (a refusal that is not retryable, a broker
    /// ahead of the local log, another log's records at the broker, a
    /// protocol violation): the reason and when; removed when the topic's
    /// stream resumes. `/health` reports them (local WAL failures are its
    /// `faults`).
    pub stopped: std::sync::Mutex<std::collections::BTreeMap<String, (String, std::time::Instant)>>,
    /// The central cluster this edge is bound to (`/edge/cluster`) and the
    /// streams stopped because their broker belongs to another.
    pub cluster: cluster::ClusterBinding,
}

impl ReplicationStats {
    /// The topics in [`ReplicationStats::stopped`], with their reasons and
    /// when they stopped.
    pub fn stopped_topics(&self) -> Vec<(String, String, std::time::Instant)> {
        let stopped = self.stopped.lock().unwrap_or_else(|p| p.into_inner());
        stopped
            .iter()
            .map(|(topic, (why, at))| (topic.clone(), why.clone(), *at))
            .collect()
    }

    /// The stream of `topic` runs again.
    pub(crate) fn resumed(&self, topic: &str) {
        let mut stopped = self.stopped.lock().unwrap_or_else(|p| p.into_inner());
        stopped.remove(topic);
    }
}

/// Counts one open connection in [`ReplicationStats::open_connections`]
/// until dropped.
struct OpenConnection<'a>(&'a ReplicationStats);

impl<'a> OpenConnection<'a> {
    fn new(stats: &'a ReplicationStats) -> OpenConnection<'a> {
        stats.open_connections.fetch_add(1, Ordering::Relaxed);
        OpenConnection(stats)
    }
}

impl Drop for OpenConnection<'_> {
    fn drop(&mut self) {
        self.0.open_connections.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What `/health` says about replication.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LinkStatus {
    /// The broker the replicator is connected to now, if any.
    pub connected_broker: Option<String>,
    /// The last connection failure (`broker: error`), kept after a
    /// reconnect until the next failure replaces it.
    pub last_error: Option<String>,
    /// When `last_error` happened (monotonic: a device clock set late
    /// does not change its age).
    pub last_error_at: Option<std::time::Instant>,
}

impl ReplicationStats {
    /// A copy of the link state.
    pub fn link_status(&self) -> LinkStatus {
        self.link.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn set_link(&self, f: impl FnOnce(&mut LinkStatus)) {
        f(&mut self.link.lock().unwrap_or_else(|p| p.into_inner()));
    }
}

/// Why an established connection to the broker ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LossReason {
    /// The broker answered with a stateless reset (RFC 9000 §10.3): it
    /// restarted and no longer knows the connection.
    Reset,
    /// No packet from the broker within the idle timeout (5 s by
    /// default): the link or the broker is gone.
    TimedOut,
    /// The broker closed the connection (shutdown, refusal).
    Closed,
    /// Anything else (a protocol or transport error).
    Other,
}

impl LossReason {
    /// Every reason, in index order.
    pub const ALL: [LossReason; 4] = [
        LossReason::Reset,
        LossReason::TimedOut,
        LossReason::Closed,
        LossReason::Other,
    ];

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            LossReason::Reset => "reset",
            LossReason::TimedOut => "timed_out",
            LossReason::Closed => "closed",
            LossReason::Other => "other",
        }
    }

    fn of(error: &quinn::ConnectionError) -> LossReason {
        match error {
            quinn::ConnectionError::Reset => LossReason::Reset,
            quinn::ConnectionError::TimedOut => LossReason::TimedOut,
            quinn::ConnectionError::ApplicationClosed(_)
            | quinn::ConnectionError::ConnectionClosed(_) => LossReason::Closed,
            _ => LossReason::Other,
        }
    }
}

/// Why a stream or connection ended.
#[derive(Debug, thiserror::Error)]
enum StreamError {
    #[error("connection: {0}")]
    Connection(String),
    /// An established connection that heard nothing from the broker for
    /// the idle timeout: the broker (or the way to it) is gone.
    #[error("connection: {0}")]
    Silent(String),
    #[error(transparent)]
    Edge(#[from] EdgeError),
    #[error("wal: {0}")]
    Wal(String),
    #[error("local metadata: {0}")]
    Metadata(String),
}

/// The certificate the replicator presents: what rustls resolves at each
/// handshake, and a receiver that changes when a rotation swapped it
/// ([`crate::cert_reload`]): a disconnected replicator then dials again at
/// once instead of waiting out its backoff.
#[derive(Debug, Clone)]
pub struct ClientCert {
    /// The certificate presented at each handshake.
    pub resolver: Arc<SwappableClientCert>,
    /// Changes after every swap.
    pub changes: watch::Receiver<u64>,
}

/// Runs the replicator until `shutdown` turns true. Connections verify
/// brokers against `tls`'s CA and present the certificate `client_cert`
/// holds at their handshake.
pub async fn run(
    config: ReplicatorConfig,
    tls: TlsIdentity,
    client_cert: ClientCert,
    topics: Arc<TopicManager>,
    stats: Arc<ReplicationStats>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut transport =
        broker_core::tls::transport_config_with(config.keep_alive, config.idle_timeout);
    match (
        config.congestion_controller,
        config.bandwidth_cap_bytes_per_s,
    ) {
        (CongestionController::Cubic, _) => {}
        (CongestionController::Bbr, _) => {
            transport
                .congestion_controller_factory(Arc::new(quinn::congestion::BbrConfig::default()));
        }
        (CongestionController::DeclaredRate, Some(rate)) => {
            transport.congestion_controller_factory(Arc::new(DeclaredRateFactory { rate }));
        }
        (CongestionController::DeclaredRate, None) => {
            // The configuration refuses this; a library caller may not.
            warn!("declared_rate without bandwidth_cap_bytes_per_s: using cubic");
        }
    }
    let mut cert_changes = client_cert.changes;
    let client =
        match tls.quic_client_with_resolver(ALPN_REPLICATION, transport, client_cert.resolver) {
            Ok(client) => client,
            Err(e) => {
                warn!(error = %e, "replicator TLS configuration unusable; not replicating");
                return;
            }
        };
    let endpoint = match broker_core::tls::client_endpoint(SocketAddr::from(([0, 0, 0, 0], 0))) {
        Ok(mut endpoint) => {
            endpoint.set_default_client_config(client);
            endpoint
        }
        Err(e) => {
            warn!(error = %e, "replicator socket unusable; not replicating");
            return;
        }
    };
    let pacer = config
        .bandwidth_cap_bytes_per_s
        .map(|r| Arc::new(Pacer::new(r.max(1), tokio::time::Instant::now())));
    let shared = Shared {
        endpoint: endpoint.clone(),
        config: config.clone(),
        topics,
        stats,
        pacer,
        routing: Arc::new(Routing::default()),
    };
    let owners = tokio::spawn(targets::supervise(shared.clone(), shutdown.clone()));
    let mut link = Link::new(config.brokers.clone(), config.max_backoff, Jitter::Random);
    loop {
        if *shutdown.borrow() {
            break;
        }
        // This attempt presents the current certificate: only a swap
        // after it cuts a later backoff short.
        cert_changes.borrow_and_update();
        let Some(addr) = link
            .next_broker(tokio::time::Instant::now().into_std())
            .map(str::to_owned)
        else {
            warn!("no broker address; not replicating");
            break;
        };
        let mut connected_at = None;
        let outcome =
            connect_and_replicate(&shared, &addr, None, &mut connected_at, &mut shutdown).await;
        let outcome = match outcome {
            Ok(Ended::Shutdown) => break,
            Ok(Ended::TopicsGone | Ended::Unneeded) => Ok(()),
            Err(e) => Err(e),
        };
        let reason = outcome.as_ref().err().map(ToString::to_string);
        let ended_at = tokio::time::Instant::now().into_std();
        let retry = link.attempt_ended(
            ended_at,
            connected_at.map(tokio::time::Instant::into_std),
            reason.as_deref(),
        );
        if matches!(outcome, Err(StreamError::Silent(_))) {
            link.broker_went_silent(ended_at);
        }
        shared.topics.set_link_up(false);
        shared.stats.set_link(|l| {
            l.connected_broker = None;
            if let Some(reason) = &reason {
                l.last_error = Some(format!("{addr}: {reason}"));
                l.last_error_at = Some(std::time::Instant::now());
            }
        });
        let reason = reason.unwrap_or_default();
        match retry.report {
            AttemptReport::NewFailure => {
                warn!(broker = %addr, error = %reason, "replication connection failed; retrying with backoff");
            }
            AttemptReport::RepeatedFailure => {
                debug!(broker = %addr, error = %reason, "replication connection failed");
            }
            AttemptReport::Ended => {
                debug!(broker = %addr, error = %reason, "replication connection ended");
            }
            AttemptReport::Quiet => {}
        }
        tokio::select! {
            () = tokio::time::sleep_until(retry.at.into()) => {}
            () = stopped(&mut shutdown) => break,
            Ok(()) = cert_changes.changed() => {
                info!("new client certificate: dialing the brokers again now");
                link.certificate_changed();
            }
        }
    }
    if !*shutdown.borrow() {
        // No bootstrap broker: nothing can be redirected either.
        owners.abort();
    }
    let _ = owners.await;
    endpoint.close(0u32.into(), b"edge shutting down");
    endpoint.wait_idle().await;
}

/// What every connection of the replicator shares.
#[derive(Clone)]
struct Shared {
    endpoint: quinn::Endpoint,
    config: ReplicatorConfig,
    topics: Arc<TopicManager>,
    stats: Arc<ReplicationStats>,
    pacer: Option<Arc<Pacer>>,
    routing: Arc<Routing>,
}

/// Resolves once shutdown began (or the agent that would signal it is
/// gone).
async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|&stop| stop).await;
}

/// Longest wait for a QUIC handshake. Without it an attempt made while the
/// broker is down lasts the whole idle timeout (30 s), and the client's
/// exponentially spaced Initial retransmissions (about 1, 3, 7, 15 s after
/// the start) can reach a broker that came back only many seconds later; a
/// new attempt starts their spacing over. 15 s leaves a handshake over a
/// 64 kbit/s, 600 ms, 20 %-loss link (several seconds, more when a flight
/// is lost twice) room to finish.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

/// How a connection that did not fail ended.
enum Ended {
    /// Shutdown began; every stream task has ended.
    Shutdown,
    /// The topic manager is gone (nothing left to replicate).
    TopicsGone,
    /// An owner connection no topic is routed to any more.
    Unneeded,
}

/// Dials `addr` and completes the handshake (at most [`CONNECT_TIMEOUT`]).
async fn connect(endpoint: &quinn::Endpoint, addr: &str) -> Result<quinn::Connection, StreamError> {
    let socket = tokio::net::lookup_host(addr)
        .await
        .map_err(|e| StreamError::Connection(e.to_string()))?
        .next()
        .ok_or_else(|| StreamError::Connection(format!("{addr}: no address")))?;
    let connecting = endpoint
        .connect(socket, BROKER_SERVER_NAME)
        .map_err(|e| StreamError::Connection(e.to_string()))?;
    tokio::time::timeout(CONNECT_TIMEOUT, connecting)
        .await
        .map_err(|_| StreamError::Connection(format!("no handshake within {CONNECT_TIMEOUT:?}")))?
        .map_err(|e| StreamError::Connection(e.to_string()))
}

/// One connection: dials `addr`, then runs one stream task per durable
/// topic routed to it (`target`: the owner address it was dialled as;
/// `None`: the bootstrap connection, for the topics with no route),
/// restarting those that ended ([`RETRYABLE_RESTART`] after a retryable
/// refusal, else [`STREAM_RESTART`]) and starting new topics' at once,
/// until the connection is lost, shutdown begins or (an owner connection)
/// no topic is routed to it any more. Every stream task has ended when it
/// returns.
async fn connect_and_replicate(
    shared: &Shared,
    addr: &str,
    target: Option<&str>,
    connected_at: &mut Option<tokio::time::Instant>,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<Ended, StreamError> {
    let conn = tokio::select! {
        conn = connect(&shared.endpoint, addr) => conn?,
        () = stopped(shutdown) => return Ok(Ended::Shutdown),
    };
    *connected_at = Some(tokio::time::Instant::now());
    shared.stats.connects.fetch_add(1, Ordering::Relaxed);
    let _open = OpenConnection::new(&shared.stats);
    if target.is_none() {
        shared.topics.set_link_up(true);
        shared
            .stats
            .set_link(|l| l.connected_broker = Some(addr.to_owned()));
    }
    info!(broker = %addr, owner_connection = target.is_some(), "connected to broker");
    let routes = Arc::new(AckRoutes::default());
    let datagrams = tokio::spawn(route_ack_datagrams(conn.clone(), routes.clone()));
    // The stream tasks, and which topic each one runs: a task that ends is
    // seen at once (a redirect is followed without waiting for a tick).
    let mut running: tokio::task::JoinSet<Result<(), StreamError>> = tokio::task::JoinSet::new();
    let mut running_topics: HashMap<tokio::task::Id, String> = HashMap::new();
    let mut not_before: HashMap<String, tokio::time::Instant> = HashMap::new();
    let mut reports = StreamReports::default();
    let mut topic_changes = shared.topics.watch_topics();
    let mut route_changes = shared.routing.subscribe();
    let ended = loop {
        let now = tokio::time::Instant::now();
        for topic in shared.topics.topics() {
            let Some(wal) = topic.wal() else {
                continue; // realtime: not replicated
            };
            let name = topic.name().as_str().to_string();
            if running_topics.values().any(|t| *t == name) {
                continue;
            }
            if !shared.routing.runs_on(&name, target, now.into_std())
                || not_before.get(&name).is_some_and(|at| now < *at)
            {
                continue;
            }
            not_before.remove(&name);
            let connection = BrokerConnection {
                conn: conn.clone(),
                ack_routes: routes.clone(),
            };
            let (manager, config, stats, pacer, routing) = (
                shared.topics.clone(),
                shared.config.clone(),
                shared.stats.clone(),
                shared.pacer.clone(),
                shared.routing.clone(),
            );
            let task = running.spawn(async move {
                replicate_topic(
                    &connection,
                    &topic,
                    &wal,
                    &manager,
                    &config,
                    &stats,
                    pacer,
                    &routing,
                )
                .await
            });
            running_topics.insert(task.id(), name);
        }
        if let Some(target) = target
            && running.is_empty()
            && !shared.routing.is_wanted(target)
        {
            break Ok(Ended::Unneeded);
        }
        tokio::select! {
            Some(joined) = running.join_next_with_id() => {
                // A panicked task is the runtime's to report; its topic
                // starts again at the next pass.
                let (id, result) = match joined {
                    Ok((id, result)) => (id, Some(result)),
                    Err(e) => (e.id(), None),
                };
                if let Some(name) = running_topics.remove(&id)
                    && let Some(Err(e)) = result
                {
                    let wait = on_stream_end(shared, &name, &e, target, &mut reports);
                    not_before.insert(name, tokio::time::Instant::now() + wait);
                }
            }
            reason = conn.closed() => {
                let loss = LossReason::of(&reason);
                shared.stats.connections_lost[loss as usize].fetch_add(1, Ordering::Relaxed);
                info!(broker = %addr, reason = loss.label(), error = %reason, "connection to broker lost");
                break Err(if loss == LossReason::TimedOut {
                    StreamError::Silent(reason.to_string())
                } else {
                    StreamError::Connection(reason.to_string())
                });
            }
            changed = topic_changes.changed() => {
                if changed.is_err() {
                    break Ok(Ended::TopicsGone);
                }
            }
            _ = route_changes.changed() => {}
            // Restart streams whose wait is over.
            () = tokio::time::sleep(RETRYABLE_RESTART) => {}
            () = stopped(shutdown) => break Ok(Ended::Shutdown),
        }
    };
    // Every stream ends once the connection is closed; wait for them (and
    // so for their read-ahead and checkpoint tasks) before returning.
    conn.close(0u32.into(), b"edge shutting down");
    while running.join_next().await.is_some() {}
    let _ = datagrams.await;
    ended
}

/// A topic's stream on the connection dialled as `target` ended with
/// `error`: follows a redirect, sends the topic back to the bootstrap
/// connection when its owner refused it for a retryable reason, logs the
/// rest ([`report_stream_end`]). Returns how long to wait before the
/// stream starts again on this connection.
fn on_stream_end(
    shared: &Shared,
    topic: &str,
    error: &StreamError,
    target: Option<&str>,
    reports: &mut StreamReports,
) -> Duration {
    let now = tokio::time::Instant::now().into_std();
    match error {
        StreamError::Edge(EdgeError::Redirected(redirect)) => {
            let decision = shared
                .routing
                .with(|t| t.on_redirect(topic, redirect.broker_id, &redirect.ingest_addr, now));
            match decision {
                RedirectDecision::Follow { addr, announce } => {
                    shared
                        .stats
                        .redirects_followed
                        .fetch_add(1, Ordering::Relaxed);
                    if announce {
                        info!(
                            topic,
                            broker_id = redirect.broker_id,
                            epoch = redirect.epoch,
                            "topic owned by broker {} at {addr}; replicating there",
                            redirect.broker_id
                        );
                    } else {
                        debug!(topic, broker_id = redirect.broker_id, %addr, "redirected to the owner");
                    }
                }
                RedirectDecision::Loop { loops, delay, .. } => {
                    shared.stats.redirect_loops.fetch_add(1, Ordering::Relaxed);
                    if loops == 1 {
                        warn!(
                            topic,
                            last_owner = redirect.broker_id,
                            "more than {} redirects without a Welcome (brokers disagree on the owner, or the owner keeps failing); retrying from the bootstrap brokers in {delay:?}",
                            routes::MAX_REDIRECT_HOPS
                        );
                    } else {
                        debug!(
                            topic,
                            loops,
                            delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                            "redirect loop again"
                        );
                    }
                }
            }
            Duration::ZERO
        }
        StreamError::Edge(EdgeError::Refused { code, message })
            if code.is_retryable() && target.is_some() =>
        {
            if shared.routing.with(|t| t.fall_back(topic)) {
                info!(topic, owner = target.unwrap_or_default(), %message, "the owner refused the topic for now; back to the bootstrap brokers");
            }
            Duration::ZERO
        }
        StreamError::Edge(EdgeError::Refused { code, .. }) if code.is_retryable() => {
            report_stream_end(&shared.stats, topic, error, reports);
            RETRYABLE_RESTART
        }
        _ => {
            report_stream_end(&shared.stats, topic, error, reports);
            STREAM_RESTART
        }
    }
}

/// Logs why a topic's stream ended. What needs an operator (a refusal, a
/// broker ahead of the local log, local data missing, a protocol or WAL
/// failure) is a warning, once per distinct error and connection
/// ([`StreamReports`]); the stream is retried every 5 s meanwhile (1 s
/// after a retryable refusal, which is a debug line). A lost
/// connection is reported by the connection, not by each stream.
fn report_stream_end(
    stats: &ReplicationStats,
    topic: &str,
    error: &StreamError,
    reports: &mut StreamReports,
) {
    let needs_operator = match error {
        StreamError::Connection(_) | StreamError::Silent(_) => false,
        StreamError::Edge(EdgeError::Refused { code, .. }) => !code.is_retryable(),
        StreamError::Edge(_) | StreamError::Wal(_) | StreamError::Metadata(_) => true,
    };
    let text = error.to_string();
    // A local WAL failure is in `/health`'s `faults` already (and clears
    // with it); what is recorded here is the broker's side.
    if needs_operator && matches!(error, StreamError::Edge(_) | StreamError::Metadata(_)) {
        let mut stopped = stats.stopped.lock().unwrap_or_else(|p| p.into_inner());
        stopped.insert(topic.to_owned(), (text.clone(), std::time::Instant::now()));
    }
    if reports.stream_ended(topic, needs_operator, &text) {
        warn!(topic, error = %text, "replication of the topic stopped; retrying every 5 s");
    } else {
        debug!(topic, error = %text, "topic stream ended");
    }
}
