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
//! - Reconnects back off exponentially with jitter (backon), capped at 30 s;
//!   a handshake gets at most [`CONNECT_TIMEOUT`]. A broker that restarts on
//!   the same address resets the old connection at once (its stateless
//!   reset key survives restarts), so the edge does not wait out the idle
//!   timeout.
//! - Backlog drain order: streams get QUIC priorities by intent, so audit_log
//!   data leaves before task_queue, then event_stream; keepalives are QUIC
//!   PING frames and never wait behind stream data.
//! - An optional bandwidth cap (bytes/s) paces all streams together.
//! - Realtime topics (in-memory rings) are not replicated: they are a local
//!   live fan-out, lost on restart by design.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use broker_core::tls::{ALPN_REPLICATION, BROKER_SERVER_NAME, TlsIdentity};
use broker_core::wal::{ReadBuffers, Wal};
use bytes::{Bytes, BytesMut};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch};
use tracing::{debug, info, warn};
use tributary_proto::batch::BatchHeader;
use tributary_proto::replication::compress::BatchCompressor;
use tributary_proto::replication::edge::{EdgeError, EdgeEvent, EdgeStream, Window};
use tributary_proto::replication::frame::{self, AckDatagram, ErrorCode};

use crate::config::CongestionController;
use crate::declared_rate::DeclaredRateFactory;
use crate::manager::TopicManager;
use crate::topic::Topic;

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

/// The acknowledgement datagrams of one connection, routed to the stream
/// tasks by QUIC stream id. Each route keeps only the highest offset seen,
/// so a stream task that is busy sending misses nothing it needs.
#[derive(Default)]
struct AckRoutes(std::sync::Mutex<HashMap<u64, watch::Sender<u64>>>);

impl AckRoutes {
    fn routes(&self) -> std::sync::MutexGuard<'_, HashMap<u64, watch::Sender<u64>>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Routes datagrams for `stream_id` to the returned receiver until the
    /// guard is dropped.
    fn register(self: &Arc<Self>, stream_id: u64) -> (watch::Receiver<u64>, AckRoute) {
        let (tx, rx) = watch::channel(0);
        self.routes().insert(stream_id, tx);
        let route = AckRoute {
            routes: self.clone(),
            stream_id,
        };
        (rx, route)
    }

    fn deliver(&self, ack: AckDatagram) {
        if let Some(tx) = self.routes().get(&ack.stream_id) {
            tx.send_if_modified(|highest| {
                let higher = ack.next_offset > *highest;
                if higher {
                    *highest = ack.next_offset;
                }
                higher
            });
        }
    }
}

/// An established connection and its acknowledgement-datagram routes, as
/// the stream tasks share it.
#[derive(Clone)]
struct BrokerConnection {
    conn: quinn::Connection,
    ack_routes: Arc<AckRoutes>,
}

/// Removes a stream's route when dropped.
struct AckRoute {
    routes: Arc<AckRoutes>,
    stream_id: u64,
}

impl Drop for AckRoute {
    fn drop(&mut self) {
        self.routes.routes().remove(&self.stream_id);
    }
}

/// Reads the connection's datagrams and routes acknowledgements until the
/// connection ends. A datagram that does not parse (a newer broker's kind)
/// is skipped: the `Ack` frames on the streams stay authoritative.
async fn route_ack_datagrams(conn: quinn::Connection, routes: Arc<AckRoutes>) {
    while let Ok(datagram) = conn.read_datagram().await {
        match AckDatagram::decode(&datagram) {
            Ok(ack) => routes.deliver(ack),
            Err(e) => debug!(error = %e, "skipping a datagram from the broker"),
        }
    }
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

/// A token bucket shared by all streams: `rate` bytes per second, bursts up
/// to one second's worth. A stream reserves the bytes of a frame and then
/// waits the time the bucket names, while it goes on reading
/// acknowledgements.
struct Pacer {
    rate: u64,
    /// Tokens (negative: owed by reservations still waiting) and when they
    /// were counted.
    state: std::sync::Mutex<(f64, tokio::time::Instant)>,
}

impl Pacer {
    /// A full bucket at `now`.
    fn new(rate: u64, now: tokio::time::Instant) -> Pacer {
        Pacer {
            rate,
            state: std::sync::Mutex::new((rate as f64, now)),
        }
    }

    /// Takes `bytes` tokens at `now` and returns how long to wait before
    /// sending them (zero when the bucket held them). Reservations queue:
    /// each one waits for the tokens of those before it.
    fn reserve(&self, bytes: usize, now: tokio::time::Instant) -> Duration {
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (tokens, last) = *state;
        let rate = self.rate as f64;
        let refill = now.saturating_duration_since(last).as_secs_f64() * rate;
        let tokens = (tokens + refill).min(rate) - bytes as f64;
        *state = (tokens, now.max(last));
        if tokens < 0.0 {
            Duration::from_secs_f64(-tokens / rate)
        } else {
            Duration::ZERO
        }
    }
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
    let mut backoff = new_backoff(&config);
    let mut last_failure: Option<String> = None;
    let mut broker_index = 0usize;
    loop {
        if *shutdown.borrow() {
            break;
        }
        let addr = config.brokers[broker_index % config.brokers.len().max(1)].clone();
        broker_index += 1;
        let mut connected_at = None;
        let outcome = tokio::select! {
            result = connect_and_replicate(&endpoint, &addr, &config, &topics, &stats, pacer.clone(), &mut connected_at) => result,
            _ = shutdown.changed() => break,
        };
        // The backoff measures failures to connect, not connection
        // lifetimes: after a working connection, start small again. A
        // connection closed right after its handshake did not work: a
        // broker refusing this edge's certificate does so only after the
        // handshake (TLS 1.3), and must not be retried in a tight loop.
        let worked =
            connected_at.is_some_and(|at: tokio::time::Instant| at.elapsed() >= WORKING_CONNECTION);
        if worked {
            backoff = new_backoff(&config);
            last_failure = None;
        }
        match outcome {
            Err(e) if !worked => {
                // Once per distinct reason, so an operator sees why nothing
                // replicates without a line per retry.
                let reason = e.to_string();
                if last_failure.as_deref() == Some(reason.as_str()) {
                    debug!(broker = %addr, error = %reason, "replication connection failed");
                } else {
                    warn!(broker = %addr, error = %reason, "replication connection failed; retrying with backoff");
                    last_failure = Some(reason);
                }
            }
            Err(e) => debug!(broker = %addr, error = %e, "replication connection ended"),
            Ok(()) => {}
        }
        let delay = backoff.next().unwrap_or(config.max_backoff);
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            _ = shutdown.changed() => break,
        }
    }
    endpoint.close(0u32.into(), b"edge shutting down");
    endpoint.wait_idle().await;
}

/// Longest wait for a QUIC handshake. Without it an attempt made while the
/// broker is down lasts the whole idle timeout (30 s), and the client's
/// exponentially spaced Initial retransmissions (about 1, 3, 7, 15 s after
/// the start) can reach a broker that came back only many seconds later; a
/// new attempt starts their spacing over. 15 s leaves a handshake over a
/// 64 kbit/s, 600 ms, 20 %-loss link (several seconds, more when a flight
/// is lost twice) room to finish.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

/// A connection that lasted this long worked: the reconnect backoff starts
/// small again after it.
const WORKING_CONNECTION: Duration = Duration::from_secs(10);

fn new_backoff(config: &ReplicatorConfig) -> backon::ExponentialBackoff {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(100))
        .with_max_delay(config.max_backoff)
        .with_jitter()
        .without_max_times()
        .build()
}

async fn connect_and_replicate(
    endpoint: &quinn::Endpoint,
    addr: &str,
    config: &ReplicatorConfig,
    topics: &Arc<TopicManager>,
    stats: &Arc<ReplicationStats>,
    pacer: Option<Arc<Pacer>>,
    connected_at: &mut Option<tokio::time::Instant>,
) -> Result<(), StreamError> {
    let socket = tokio::net::lookup_host(addr)
        .await
        .map_err(|e| StreamError::Connection(e.to_string()))?
        .next()
        .ok_or_else(|| StreamError::Connection(format!("{addr}: no address")))?;
    let connecting = endpoint
        .connect(socket, BROKER_SERVER_NAME)
        .map_err(|e| StreamError::Connection(e.to_string()))?;
    let conn = tokio::time::timeout(CONNECT_TIMEOUT, connecting)
        .await
        .map_err(|_| StreamError::Connection(format!("no handshake within {CONNECT_TIMEOUT:?}")))?
        .map_err(|e| StreamError::Connection(e.to_string()))?;
    *connected_at = Some(tokio::time::Instant::now());
    stats
        .connects
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    info!(broker = %addr, "connected to broker");
    let routes = Arc::new(AckRoutes::default());
    let _datagrams = AbortOnDrop(tokio::spawn(route_ack_datagrams(
        conn.clone(),
        routes.clone(),
    )));
    let mut running: HashMap<String, tokio::task::JoinHandle<Result<(), StreamError>>> =
        HashMap::new();
    // The last error each topic's stream ended with, so a stream that keeps
    // failing the same way is reported once per connection.
    let mut stream_errors: HashMap<String, String> = HashMap::new();
    let mut topic_changes = topics.watch_topics();
    loop {
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
                    Ok(Err(e)) => report_stream_end(&name, &e, &mut stream_errors),
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
                for task in running.values() {
                    task.abort();
                }
                let loss = LossReason::of(&reason);
                stats.connections_lost[loss as usize].fetch_add(1, Ordering::Relaxed);
                info!(broker = %addr, reason = loss.label(), error = %reason, "connection to broker lost");
                return Err(StreamError::Connection(reason.to_string()));
            }
            changed = topic_changes.changed() => {
                if changed.is_err() {
                    return Ok(());
                }
            }
            // Restart streams that ended (refused for a retryable reason).
            () = tokio::time::sleep(Duration::from_secs(5)) => {}
        }
    }
}

/// Logs why a topic's stream ended. What needs an operator (a refusal, a
/// broker ahead of the local log, local data missing, a protocol or WAL
/// failure) is a warning, once per distinct error and connection; the
/// stream is retried every 5 s meanwhile. A lost connection is reported by
/// the connection, not by each stream.
fn report_stream_end(topic: &str, error: &StreamError, last: &mut HashMap<String, String>) {
    let needs_operator = match error {
        StreamError::Connection(_) => false,
        StreamError::Edge(EdgeError::Refused { code, .. }) => !code.is_retryable(),
        StreamError::Edge(_) | StreamError::Wal(_) => true,
    };
    let text = error.to_string();
    if needs_operator && last.get(topic) != Some(&text) {
        warn!(topic, error = %text, "replication of the topic stopped; retrying every 5 s");
        last.insert(topic.to_string(), text);
    } else {
        debug!(topic, error = %text, "topic stream ended");
    }
}

/// Bytes of WAL one read-ahead step reads at most (at least one batch).
const READ_STEP_BYTES: usize = 2 * 1024 * 1024;
/// Bytes of prepared frames the read-ahead may hold before the stream takes
/// them (a single larger frame is still admitted alone).
const READ_AHEAD_BYTES: usize = 4 * 1024 * 1024;
/// Frames the read-ahead may hold.
const READ_AHEAD_FRAMES: usize = 256;

/// A batch frame ready to send: its header and payload as separate chunks,
/// so the WAL bytes reach quinn without another copy.
struct Prepared {
    batch_header: BatchHeader,
    /// Stored bytes of the batch (before wire compression).
    raw_len: usize,
    chunks: [Bytes; 2],
    /// Read-ahead budget held until the frame is handed to quinn.
    _permit: OwnedSemaphorePermit,
}

impl Prepared {
    /// Bytes the frame takes on the stream.
    fn wire_len(&self) -> usize {
        self.chunks.iter().map(Bytes::len).sum()
    }
}

/// Replicates one topic on one connection until the connection ends or the
/// broker refuses.
///
/// Three stages run concurrently, so reading, sending and bookkeeping
/// overlap: the read-ahead task reads WAL batches and compresses them on a
/// blocking thread (bounded by [`READ_AHEAD_BYTES`]); this task writes
/// frames while the window admits them and reads acknowledgements; a
/// checkpoint task records acknowledged offsets (coalesced, so a slow
/// retention pass never holds up sending).
async fn replicate_topic(
    connection: &BrokerConnection,
    topic: &Arc<Topic>,
    wal: &Arc<Wal>,
    topics: &Arc<TopicManager>,
    config: &ReplicatorConfig,
    stats: &Arc<ReplicationStats>,
    pacer: Option<Arc<Pacer>>,
) -> Result<(), StreamError> {
    let conn_err = |e: &dyn std::fmt::Display| StreamError::Connection(e.to_string());
    let (mut send, mut recv) = connection.conn.open_bi().await.map_err(|e| conn_err(&e))?;
    // Lower drain rank = more valuable = higher QUIC priority.
    let _ = send.set_priority(3 - i32::from(topic.drain_rank().min(3)));
    let (mut datagram_acks, _route) = connection.ack_routes.register(u64::from(send.id()));
    let mut stream = EdgeStream::new(
        topic.name().as_str().to_string(),
        topic.settings().intent.clone(),
        config.window,
    );
    send.write_all(&stream.hello().to_bytes())
        .await
        .map_err(|e| conn_err(&e))?;
    let limits = wal.config().limits;
    let mut inbox = BytesMut::new();

    // Acknowledged offsets go to the checkpoint task; it ends when this
    // function returns (the sender is dropped) after recording the last one.
    let (acked_tx, acked_rx) = watch::channel(None::<u64>);
    tokio::spawn(record_acknowledgements(
        topics.clone(),
        topic.clone(),
        acked_rx,
    ));
    // Started once the broker's Welcome says where to resume; aborted when
    // this function returns.
    let mut read_ahead: Option<(mpsc::Receiver<Result<Prepared, StreamError>>, AbortOnDrop)> = None;
    // A frame taken from the read-ahead that waits for the bandwidth cap's
    // tokens, and when it may go; acknowledgements are read meanwhile.
    let mut paced: Option<(Prepared, tokio::time::Instant)> = None;
    loop {
        let window_open = stream.next_to_send(u64::MAX).is_some();
        let paced_until = paced.as_ref().map(|(_, at)| *at);
        tokio::select! {
            chunk = recv.read_chunk(64 * 1024, true) => {
                match chunk.map_err(|e| conn_err(&e))? {
                    Some(chunk) => inbox.extend_from_slice(&chunk.bytes),
                    None => return Err(StreamError::Connection("broker finished the stream".into())),
                }
                while let Some(frame) = frame::decode(&mut inbox, &limits).map_err(|e| {
                    StreamError::Edge(EdgeError::Refused {
                        code: ErrorCode::Malformed,
                        message: e.to_string(),
                    })
                })? {
                    let start = wal.log_start_offset();
                    let hwm = wal.high_water_mark();
                    match stream.on_frame(frame, start, hwm)? {
                        EdgeEvent::Resumed { from } => {
                            info!(topic = %topic.name(), from, local_hwm = hwm, "replication resumed");
                            let (tx, rx) = mpsc::channel(READ_AHEAD_FRAMES);
                            let task = tokio::spawn(read_ahead_loop(
                                wal.clone(),
                                from,
                                config.compress,
                                tx,
                            ));
                            read_ahead = Some((rx, AbortOnDrop(task)));
                            // The broker holds everything below `from`
                            // durably: that is an acknowledgement too. Without
                            // it, records acknowledged just before a crash of
                            // the edge (before its checkpoint was written)
                            // would stay "unacknowledged" until the next
                            // record is sent, and forever if none comes.
                            acked_tx.send_replace(Some(from));
                        }
                        EdgeEvent::Acked { next_offset } => {
                            stats.stream_acks.fetch_add(1, Ordering::Relaxed);
                            acked_tx.send_replace(Some(next_offset));
                        }
                        EdgeEvent::AlreadyAcked => {}
                    }
                }
            }
            Ok(()) = datagram_acks.changed() => {
                let next_offset = *datagram_acks.borrow_and_update();
                if let EdgeEvent::Acked { next_offset } = stream.on_datagram_ack(next_offset)? {
                    stats.datagram_acks.fetch_add(1, Ordering::Relaxed);
                    acked_tx.send_replace(Some(next_offset));
                }
            }
            prepared = async {
                match read_ahead.as_mut() {
                    Some((rx, _)) => rx.recv().await,
                    None => std::future::pending().await,
                }
            }, if window_open && paced.is_none() => {
                let Some(prepared) = prepared else {
                    return Err(StreamError::Wal("read-ahead ended".into()));
                };
                let prepared = prepared?;
                let now = tokio::time::Instant::now();
                let wait = pacer
                    .as_ref()
                    .map_or(Duration::ZERO, |p| p.reserve(prepared.wire_len(), now));
                if wait.is_zero() {
                    send_frame(&mut send, &mut stream, stats, prepared).await?;
                } else {
                    paced = Some((prepared, now + wait));
                }
            }
            () = async {
                match paced_until {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            }, if paced_until.is_some() => {
                if let Some((prepared, _)) = paced.take() {
                    send_frame(&mut send, &mut stream, stats, prepared).await?;
                }
            }
        }
    }
}

/// Hands a frame to quinn and records it as sent.
async fn send_frame(
    send: &mut quinn::SendStream,
    stream: &mut EdgeStream,
    stats: &ReplicationStats,
    prepared: Prepared,
) -> Result<(), StreamError> {
    let wire_len = prepared.wire_len();
    let Prepared {
        batch_header,
        raw_len,
        mut chunks,
        _permit,
    } = prepared;
    send.write_all_chunks(&mut chunks)
        .await
        .map_err(|e| StreamError::Connection(e.to_string()))?;
    stats
        .raw_bytes_sent
        .fetch_add(raw_len as u64, Ordering::Relaxed);
    stats
        .wire_bytes_sent
        .fetch_add(wire_len as u64, Ordering::Relaxed);
    stream.on_sent(&batch_header, raw_len);
    Ok(())
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Reads the WAL from `from` onwards, batch after batch, and prepares their
/// frames, until the receiver goes away or the WAL fails. Waits for new
/// records at the end of the log.
async fn read_ahead_loop(
    wal: Arc<Wal>,
    from: u64,
    compress: bool,
    tx: mpsc::Sender<Result<Prepared, StreamError>>,
) {
    let budget = Arc::new(Semaphore::new(READ_AHEAD_BYTES));
    // The compressor and the read buffers move to the blocking thread for
    // each step and come back with its result.
    let mut tools = Some((BatchCompressor::new(compress), ReadBuffers::new()));
    let mut next = from;
    loop {
        if wal.high_water_mark() <= next {
            if let Some((_, buffers)) = tools.as_mut() {
                // Caught up: an idle agent keeps no read memory.
                buffers.clear();
            }
            if let Err(e) = wal.wait_for_offset(next).await {
                let _ = tx.send(Err(StreamError::Wal(e.to_string()))).await;
                return;
            }
        }
        let Some((mut taken, mut buffers)) = tools.take() else {
            return;
        };
        let reader = wal.clone();
        let step = tokio::task::spawn_blocking(move || {
            let frames = reader
                .read_with(next, READ_STEP_BYTES, &mut buffers)
                .map_err(|e| e.to_string())
                .map(|batches| {
                    batches
                        .into_iter()
                        .map(|batch| {
                            let (codec, payload) = taken.encode(&batch);
                            let head = frame::batch_frame_header(codec, payload.len());
                            (
                                *batch.header(),
                                batch.len(),
                                [Bytes::copy_from_slice(&head), payload],
                            )
                        })
                        .collect::<Vec<_>>()
                });
            (frames, (taken, buffers))
        })
        .await;
        let frames = match step {
            Ok((frames, taken)) => {
                tools = Some(taken);
                frames
            }
            Err(e) => Err(format!("read-ahead task failed: {e}")),
        };
        let frames = match frames {
            Ok(frames) => frames,
            Err(e) => {
                let _ = tx.send(Err(StreamError::Wal(e))).await;
                return;
            }
        };
        for (batch_header, raw_len, chunks) in frames {
            if batch_header.base_offset != next {
                // Verbatim replication only ever resumes at a batch
                // boundary; anything else means the logs disagree.
                let _ = tx
                    .send(Err(StreamError::Edge(EdgeError::Protocol(format!(
                        "no local batch starts at offset {next}"
                    )))))
                    .await;
                return;
            }
            next = batch_header.next_offset();
            let wire_len: usize = chunks.iter().map(Bytes::len).sum();
            let permits = u32::try_from(wire_len.min(READ_AHEAD_BYTES)).unwrap_or(u32::MAX);
            let Ok(permit) = budget.clone().acquire_many_owned(permits).await else {
                return;
            };
            let prepared = Prepared {
                batch_header,
                raw_len,
                chunks,
                _permit: permit,
            };
            if tx.send(Ok(prepared)).await.is_err() {
                return;
            }
        }
    }
}

/// Records each acknowledged offset (the newest one when several arrive
/// while a previous one is being recorded): checkpoint, then local WAL
/// retention.
async fn record_acknowledgements(
    topics: Arc<TopicManager>,
    topic: Arc<Topic>,
    mut acked: watch::Receiver<Option<u64>>,
) {
    loop {
        let closed = acked.changed().await.is_err();
        let next_offset = *acked.borrow_and_update();
        if let Some(next_offset) = next_offset
            && let Err(e) = topics.on_acknowledged(topic.name(), next_offset).await
        {
            warn!(topic = %topic.name(), error = %e, "recording the acknowledgement");
        }
        if closed {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pacer_names_the_wait_and_queues_reservations_behind_each_other() {
        let t0 = tokio::time::Instant::now();
        let pacer = Pacer::new(1000, t0);
        // A full bucket: one second's worth goes at once.
        assert_eq!(pacer.reserve(400, t0), Duration::ZERO);
        assert_eq!(pacer.reserve(600, t0), Duration::ZERO);
        // Empty: 500 bytes wait half a second, the next 1000 wait for them.
        assert_eq!(pacer.reserve(500, t0), Duration::from_millis(500));
        assert_eq!(pacer.reserve(1000, t0), Duration::from_millis(1500));
        // 2.5 s later the debt is paid and the bucket refilled by 1000.
        let later = t0 + Duration::from_millis(2500);
        assert_eq!(pacer.reserve(1000, later), Duration::ZERO);
        assert_eq!(pacer.reserve(1, later), Duration::from_millis(1));
    }

    #[test]
    fn an_idle_pacer_never_holds_more_than_one_second_of_tokens() {
        let t0 = tokio::time::Instant::now();
        let pacer = Pacer::new(1000, t0);
        let later = t0 + Duration::from_secs(3600);
        assert_eq!(pacer.reserve(1000, later), Duration::ZERO);
        assert_eq!(pacer.reserve(100, later), Duration::from_millis(100));
    }
}
