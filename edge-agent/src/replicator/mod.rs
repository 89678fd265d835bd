//! The replicator: one QUIC connection (mutual TLS) to the broker, one
//! long-lived stream per durable topic, driving
//! `tributary_proto::replication::edge::EdgeStream`.
//!
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
//! Modules: [`link`] (the per-link state machine), [`pacing`] (the
//! bandwidth cap's token bucket), `stream` (one topic's stream: read-ahead,
//! sending, checkpoints).

pub mod link;
mod pacing;
mod stream;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use broker_core::tls::{ALPN_REPLICATION, BROKER_SERVER_NAME, TlsIdentity};
use tokio::sync::watch;
use tracing::{debug, info, warn};
use tributary_proto::replication::edge::{EdgeError, Window};

use self::link::{AttemptReport, Jitter, Link, STREAM_RESTART, StreamReports};
use self::pacing::Pacer;
use self::stream::{AckRoutes, BrokerConnection, replicate_topic, route_ack_datagrams};
use crate::config::CongestionController;
use crate::declared_rate::DeclaredRateFactory;
use crate::manager::TopicManager;

/// Settings of the replicator.
#[derive(Debug, Clone)]
pub struct ReplicatorConfig {
    /// Broker ingest addresses (`host:port`), tried in order.
    pub brokers: Vec<String>,
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
}

/// Why an established connection to the broker ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LossReason {
    /// The broker answered with a stateless reset (RFC 9000 §10.3): it
    /// restarted and no longer knows the connection.
    Reset,
    /// No packet from the broker within the idle timeout (30 s): the link
    /// or the broker is gone.
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
    #[error(transparent)]
    Edge(#[from] EdgeError),
    #[error("wal: {0}")]
    Wal(String),
}

/// Runs the replicator until `shutdown` turns true.
pub async fn run(
    config: ReplicatorConfig,
    tls: TlsIdentity,
    topics: Arc<TopicManager>,
    stats: Arc<ReplicationStats>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut transport = broker_core::tls::transport_config();
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
    let client = match tls.quic_client_with_transport(ALPN_REPLICATION, transport) {
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
    let mut link = Link::new(config.brokers.clone(), config.max_backoff, Jitter::Random);
    loop {
        if *shutdown.borrow() {
            break;
        }
        let Some(addr) = link.next_broker().map(str::to_owned) else {
            warn!("no broker address; not replicating");
            break;
        };
        let mut connected_at = None;
        let outcome = connect_and_replicate(
            &endpoint,
            &addr,
            &config,
            &topics,
            &stats,
            pacer.clone(),
            &mut connected_at,
            &mut shutdown,
        )
        .await;
        let outcome = match outcome {
            Ok(Ended::Shutdown) => break,
            Ok(Ended::TopicsGone) => Ok(()),
            Err(e) => Err(e),
        };
        let reason = outcome.as_ref().err().map(ToString::to_string);
        let retry = link.attempt_ended(
            tokio::time::Instant::now().into_std(),
            connected_at.map(tokio::time::Instant::into_std),
            reason.as_deref(),
        );
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
        }
    }
    endpoint.close(0u32.into(), b"edge shutting down");
    endpoint.wait_idle().await;
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
/// topic (restarting those that ended every [`STREAM_RESTART`], starting
/// new topics' at once) until the connection is lost or shutdown begins.
/// Either way every stream task has ended when it returns.
#[allow(clippy::too_many_arguments)]
async fn connect_and_replicate(
    endpoint: &quinn::Endpoint,
    addr: &str,
    config: &ReplicatorConfig,
    topics: &Arc<TopicManager>,
    stats: &Arc<ReplicationStats>,
    pacer: Option<Arc<Pacer>>,
    connected_at: &mut Option<tokio::time::Instant>,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<Ended, StreamError> {
    let conn = tokio::select! {
        conn = connect(endpoint, addr) => conn?,
        () = stopped(shutdown) => return Ok(Ended::Shutdown),
    };
    *connected_at = Some(tokio::time::Instant::now());
    stats.connects.fetch_add(1, Ordering::Relaxed);
    info!(broker = %addr, "connected to broker");
    let routes = Arc::new(AckRoutes::default());
    let datagrams = tokio::spawn(route_ack_datagrams(conn.clone(), routes.clone()));
    let mut running: HashMap<String, tokio::task::JoinHandle<Result<(), StreamError>>> =
        HashMap::new();
    let mut reports = StreamReports::default();
    let mut topic_changes = topics.watch_topics();
    let ended = loop {
        for topic in topics.topics() {
            let Some(wal) = topic.wal() else {
                continue; // realtime: not replicated
            };
            let name = topic.name().as_str().to_string();
            if running.get(&name).is_some_and(|h| !h.is_finished()) {
                continue;
            }
            if let Some(ended) = running.remove(&name) {
                match ended.await {
                    Ok(Ok(())) | Err(_) => {}
                    Ok(Err(e)) => report_stream_end(&name, &e, &mut reports),
                }
            }
            let connection = BrokerConnection {
                conn: conn.clone(),
                ack_routes: routes.clone(),
            };
            let (manager, config, stats, pacer) =
                (topics.clone(), config.clone(), stats.clone(), pacer.clone());
            let task = tokio::spawn(async move {
                replicate_topic(&connection, &topic, &wal, &manager, &config, &stats, pacer).await
            });
            running.insert(name, task);
        }
        tokio::select! {
            reason = conn.closed() => {
                let loss = LossReason::of(&reason);
                stats.connections_lost[loss as usize].fetch_add(1, Ordering::Relaxed);
                info!(broker = %addr, reason = loss.label(), error = %reason, "connection to broker lost");
                break Err(StreamError::Connection(reason.to_string()));
            }
            changed = topic_changes.changed() => {
                if changed.is_err() {
                    break Ok(Ended::TopicsGone);
                }
            }
            // Restart streams that ended (refused for a retryable reason).
            () = tokio::time::sleep(STREAM_RESTART) => {}
            () = stopped(shutdown) => break Ok(Ended::Shutdown),
        }
    };
    // Every stream ends once the connection is closed; wait for them (and
    // so for their read-ahead and checkpoint tasks) before returning.
    conn.close(0u32.into(), b"edge shutting down");
    for (_, task) in running.drain() {
        let _ = task.await;
    }
    let _ = datagrams.await;
    ended
}

/// Logs why a topic's stream ended. What needs an operator (a refusal, a
/// broker ahead of the local log, local data missing, a protocol or WAL
/// failure) is a warning, once per distinct error and connection
/// ([`StreamReports`]); the stream is retried every 5 s meanwhile. A lost
/// connection is reported by the connection, not by each stream.
fn report_stream_end(topic: &str, error: &StreamError, reports: &mut StreamReports) {
    let needs_operator = match error {
        StreamError::Connection(_) => false,
        StreamError::Edge(EdgeError::Refused { code, .. }) => !code.is_retryable(),
        StreamError::Edge(_) | StreamError::Wal(_) => true,
    };
    let text = error.to_string();
    if reports.stream_ended(topic, needs_operator, &text) {
        warn!(topic, error = %text, "replication of the topic stopped; retrying every 5 s");
    } else {
        debug!(topic, error = %text, "topic stream ended");
    }
}
