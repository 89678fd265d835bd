//! The replicator: one QUIC connection (mutual TLS) to the broker, one
//! long-lived stream per durable topic, driving
//! `broker_core::replication::edge::EdgeStream`.
//!
//! - On every (re)connect the broker's `Welcome` says where to resume; the
//!   local checkpoint is only a record of what was acknowledged.
//! - Batches are the WAL's record batches sent verbatim (zstd on the wire
//!   when smaller), pipelined up to a window of batches/bytes in flight.
//! - Acknowledgements go to `TopicManager::on_acknowledged` (checkpoint at
//!   `/edge/checkpoints/{ns}/{topic}`, then WAL retention).
//! - Reconnects back off exponentially with jitter (backon), capped at 30 s.
//! - Backlog drain order: streams get QUIC priorities by intent, so audit_log
//!   data leaves before task_queue, then event_stream; keepalives are QUIC
//!   PING frames and never wait behind stream data.
//! - An optional bandwidth cap (bytes/s) paces all streams together.
//! - Realtime topics (in-memory rings) are not replicated: they are a local
//!   live fan-out, lost on restart by design.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use broker_core::replication::edge::{EdgeError, EdgeEvent, EdgeStream, Window};
use broker_core::replication::frame::{self, ErrorCode, Frame};
use broker_core::tls::{ALPN_REPLICATION, BROKER_SERVER_NAME, TlsIdentity};
use broker_core::wal::Wal;
use bytes::BytesMut;
use tokio::sync::{Mutex, watch};
use tracing::{debug, info, warn};

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
/// to one second's worth.
struct Pacer {
    rate: u64,
    state: Mutex<(f64, tokio::time::Instant)>,
}

impl Pacer {
    fn new(rate: u64) -> Pacer {
        Pacer {
            rate,
            state: Mutex::new((rate as f64, tokio::time::Instant::now())),
        }
    }

    async fn take(&self, bytes: usize) {
        let mut state = self.state.lock().await;
        let now = tokio::time::Instant::now();
        let (tokens, last) = *state;
        let refill = now.duration_since(last).as_secs_f64() * self.rate as f64;
        let mut tokens = (tokens + refill).min(self.rate as f64) - bytes as f64;
        if tokens < 0.0 {
            let wait = Duration::from_secs_f64(-tokens / self.rate as f64);
            tokio::time::sleep(wait).await;
            tokens = 0.0;
        }
        *state = (tokens, tokio::time::Instant::now());
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
    let client = match tls.quic_client(ALPN_REPLICATION) {
        Ok(client) => client,
        Err(e) => {
            warn!(error = %e, "replicator TLS configuration unusable; not replicating");
            return;
        }
    };
    let endpoint = match quinn::Endpoint::client(SocketAddr::from(([0, 0, 0, 0], 0))) {
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
        .map(|r| Arc::new(Pacer::new(r.max(1))));
    let mut backoff = new_backoff(&config);
    let mut broker_index = 0usize;
    loop {
        if *shutdown.borrow() {
            break;
        }
        let addr = config.brokers[broker_index % config.brokers.len().max(1)].clone();
        broker_index += 1;
        let mut connected = false;
        let outcome = tokio::select! {
            result = connect_and_replicate(&endpoint, &addr, &config, &topics, &stats, pacer.clone(), &mut connected) => result,
            _ = shutdown.changed() => break,
        };
        if connected {
            // The backoff measures failures to connect, not connection
            // lifetimes: after a working connection, start small again.
            backoff = new_backoff(&config);
        }
        if let Err(e) = outcome {
            debug!(broker = %addr, error = %e, "replication connection ended");
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
    connected: &mut bool,
) -> Result<(), StreamError> {
    let socket = tokio::net::lookup_host(addr)
        .await
        .map_err(|e| StreamError::Connection(e.to_string()))?
        .next()
        .ok_or_else(|| StreamError::Connection(format!("{addr}: no address")))?;
    let conn = endpoint
        .connect(socket, BROKER_SERVER_NAME)
        .map_err(|e| StreamError::Connection(e.to_string()))?
        .await
        .map_err(|e| StreamError::Connection(e.to_string()))?;
    *connected = true;
    stats
        .connects
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    info!(broker = %addr, "connected to broker");
    let mut running: HashMap<String, tokio::task::JoinHandle<()>> = HashMap::new();
    let mut topic_changes = topics.watch_topics();
    loop {
        for topic in topics.topics() {
            let Some(wal) = topic.wal() else {
                continue; // realtime: not replicated
            };
            let name = topic.name().as_str().to_string();
            let finished = running.get(&name).is_none_or(|h| h.is_finished());
            if finished {
                let task = tokio::spawn(stream_task(
                    conn.clone(),
                    topic.clone(),
                    wal,
                    topics.clone(),
                    config.clone(),
                    stats.clone(),
                    pacer.clone(),
                ));
                running.insert(name, task);
            }
        }
        tokio::select! {
            reason = conn.closed() => {
                for task in running.values() {
                    task.abort();
                }
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

async fn stream_task(
    conn: quinn::Connection,
    topic: Arc<Topic>,
    wal: Arc<Wal>,
    topics: Arc<TopicManager>,
    config: ReplicatorConfig,
    stats: Arc<ReplicationStats>,
    pacer: Option<Arc<Pacer>>,
) {
    let name = topic.name().clone();
    match replicate_topic(&conn, &topic, &wal, &topics, &config, &stats, pacer).await {
        Ok(()) => {}
        Err(StreamError::Edge(EdgeError::Refused { code, message })) if !code.is_retryable() => {
            warn!(topic = %name, ?code, message, "broker refused the topic; retrying in 5 s");
        }
        Err(e) => debug!(topic = %name, error = %e, "topic stream ended"),
    }
}

/// Replicates one topic on one connection until the connection ends or the
/// broker refuses.
async fn replicate_topic(
    conn: &quinn::Connection,
    topic: &Arc<Topic>,
    wal: &Arc<Wal>,
    topics: &Arc<TopicManager>,
    config: &ReplicatorConfig,
    stats: &Arc<ReplicationStats>,
    pacer: Option<Arc<Pacer>>,
) -> Result<(), StreamError> {
    let conn_err = |e: &dyn std::fmt::Display| StreamError::Connection(e.to_string());
    let (mut send, mut recv) = conn.open_bi().await.map_err(|e| conn_err(&e))?;
    // Lower drain rank = more valuable = higher QUIC priority.
    let _ = send.set_priority(3 - i32::from(topic.drain_rank().min(3)));
    let mut stream = EdgeStream::new(
        topic.name().as_str().to_string(),
        topic.settings().intent.clone(),
        config.window,
    );
    let mut out = BytesMut::new();
    stream.hello().encode(&mut out);
    send.write_all(&out).await.map_err(|e| conn_err(&e))?;
    let limits = wal.config().limits;
    let mut inbox = BytesMut::new();
    loop {
        // Send what the window and the log allow.
        let hwm = wal.high_water_mark();
        while let Some(offset) = stream.next_to_send(hwm) {
            // Read no more than the window admits: the rest would be read
            // again after the next acknowledgement.
            let batches = wal
                .read(offset, stream.window_room_bytes())
                .map_err(|e| StreamError::Wal(e.to_string()))?;
            let mut sent_any = false;
            for batch in batches {
                if stream.next_to_send(hwm) != Some(batch.base_offset()) {
                    break;
                }
                let frame = Frame::batch(&batch, config.compress);
                out.clear();
                frame.encode(&mut out);
                if let Some(pacer) = &pacer {
                    pacer.take(out.len()).await;
                }
                send.write_all(&out).await.map_err(|e| conn_err(&e))?;
                stats
                    .raw_bytes_sent
                    .fetch_add(batch.len() as u64, std::sync::atomic::Ordering::Relaxed);
                stats
                    .wire_bytes_sent
                    .fetch_add(out.len() as u64, std::sync::atomic::Ordering::Relaxed);
                stream.on_sent(batch.header(), batch.len());
                sent_any = true;
            }
            if !sent_any {
                // The WAL's first batch at `offset` does not start there: the
                // broker resumed inside a batch, which verbatim replication
                // never produces.
                return Err(StreamError::Edge(EdgeError::Protocol(format!(
                    "no local batch starts at offset {offset}"
                ))));
            }
        }
        // Wait for an answer from the broker or for new local records.
        let can_send_more = stream.next_to_send(u64::MAX).is_some();
        tokio::select! {
            chunk = recv.read_chunk(64 * 1024, true) => {
                match chunk.map_err(|e| conn_err(&e))? {
                    Some(chunk) => inbox.extend_from_slice(&chunk.bytes),
                    None => return Err(StreamError::Connection("broker finished the stream".into())),
                }
                loop {
                    let frame = match frame::decode(&mut inbox, &limits) {
                        Ok(Some(frame)) => frame,
                        Ok(None) => break,
                        Err(e) => {
                            return Err(StreamError::Edge(EdgeError::Refused {
                                code: ErrorCode::Malformed,
                                message: e.to_string(),
                            }));
                        }
                    };
                    let start = wal.log_start_offset();
                    let hwm = wal.high_water_mark();
                    match stream.on_frame(frame, start, hwm)? {
                        EdgeEvent::Resumed { from } => {
                            info!(topic = %topic.name(), from, local_hwm = hwm, "replication resumed");
                        }
                        EdgeEvent::Acked { next_offset } => {
                            if let Err(e) = topics.on_acknowledged(topic.name(), next_offset).await {
                                warn!(topic = %topic.name(), error = %e, "recording the acknowledgement");
                            }
                        }
                    }
                }
            }
            result = wal.wait_for_offset(hwm), if can_send_more => {
                result.map_err(|e| StreamError::Wal(e.to_string()))?;
            }
        }
    }
}
