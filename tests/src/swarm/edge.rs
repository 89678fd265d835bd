//! One simulated edge: its QUIC connection (its own client certificate),
//! reconnecting until every topic is acknowledged, and one replication
//! stream per topic driven by `EdgeStream`, the edge agent's own protocol
//! state machine. The records come from [`TopicLog`], not from a WAL.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use broker_core::tls::BROKER_SERVER_NAME;
use bytes::BytesMut;
use tokio::sync::watch;
use tributary_proto::intent::ExpandedStreamSettings;
use tributary_proto::limits::Limits;
use tributary_proto::replication::edge::{EdgeEvent, EdgeStream, Window};
use tributary_proto::replication::frame::{self, AckDatagram, Frame};

use super::log::TopicLog;
use super::measure::TransportTotals;

/// What every edge of a swarm shares.
#[derive(Debug, Clone)]
pub struct EdgeContext {
    /// The broker's ingest address.
    pub broker: SocketAddr,
    /// The topics' intent settings, sent in each `Hello`.
    pub settings: Option<ExpandedStreamSettings>,
    /// The in-flight window of each stream.
    pub window: Window,
    /// Batch and record limits (the broker's defaults).
    pub limits: Limits,
    /// Nothing is attempted after it.
    pub deadline: Instant,
    /// With `Some`, an edge whose topics are all acknowledged keeps its
    /// connection and streams open (idle) until this turns `true`.
    pub hold: Option<watch::Receiver<bool>>,
    /// Topics acknowledged in full (and welcomed) so far, across the swarm.
    pub topics_done: Arc<AtomicUsize>,
    /// Topics that had their first `Welcome`, across the swarm.
    pub topics_welcomed: Arc<AtomicUsize>,
    /// When production starts (`None` until then): once every topic was
    /// welcomed, so what is measured is ingest, not connection set-up.
    pub go: watch::Receiver<Option<Instant>>,
}

/// One simulated edge and what happened to it.
#[derive(Debug)]
pub struct SimEdge {
    /// Its id (and namespace), the identity of its certificate.
    pub id: String,
    client: quinn::ClientConfig,
    /// Its topics.
    pub topics: Vec<TopicLog>,
    /// The first connection's handshake time.
    pub setup: Option<Duration>,
    /// Connections established.
    pub connects: u64,
    /// Connection attempts that failed.
    pub connect_failures: u64,
    /// The last connection or stream error.
    pub last_error: Option<String>,
    /// The broker's high-water mark of each topic, asked with a fresh
    /// `Hello` once the topic was done (`None`: not asked or no answer).
    pub broker_hwm: Vec<Option<u64>>,
    /// Transport counters of its connections that carried production
    /// (the warm-up connection before the swarm's go is left out).
    pub transport: TransportTotals,
}

/// Acknowledgement datagrams of one connection, routed by stream id: each
/// route keeps only the highest offset seen.
#[derive(Default)]
struct AckRoutes(Mutex<HashMap<u64, watch::Sender<u64>>>);

impl AckRoutes {
    fn register(&self, stream_id: u64) -> watch::Receiver<u64> {
        let (tx, rx) = watch::channel(0);
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(stream_id, tx);
        rx
    }

    fn deliver(&self, ack: AckDatagram) {
        let routes = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(tx) = routes.get(&ack.stream_id) {
            tx.send_if_modified(|highest| {
                let higher = ack.next_offset > *highest;
                *highest = (*highest).max(ack.next_offset);
                higher
            });
        }
    }
}

async fn route_datagrams(conn: quinn::Connection, routes: Arc<AckRoutes>) {
    while let Ok(datagram) = conn.read_datagram().await {
        if let Ok(ack) = AckDatagram::decode(&datagram) {
            routes.deliver(ack);
        }
    }
}

impl SimEdge {
    /// An edge with certificate `client` (a QUIC client config presenting
    /// it) and `topics`.
    pub fn new(id: String, client: quinn::ClientConfig, topics: Vec<TopicLog>) -> SimEdge {
        let count = topics.len();
        SimEdge {
            id,
            client,
            topics,
            setup: None,
            connects: 0,
            connect_failures: 0,
            last_error: None,
            broker_hwm: vec![None; count],
            transport: TransportTotals::default(),
        }
    }

    fn all_done(&self) -> bool {
        self.topics.iter().all(TopicLog::is_done)
    }

    /// Connects (again and again) until every topic is acknowledged and
    /// its broker high-water mark read, or the deadline passes.
    pub async fn run(&mut self, endpoint: quinn::Endpoint, ctx: &EdgeContext) {
        let mut backoff = Duration::from_millis(100);
        while Instant::now() < ctx.deadline {
            let started = Instant::now();
            let remaining = ctx.deadline.saturating_duration_since(started);
            let conn =
                match endpoint.connect_with(self.client.clone(), ctx.broker, BROKER_SERVER_NAME) {
                    Ok(connecting) => match tokio::time::timeout(remaining, connecting).await {
                        Ok(Ok(conn)) => Ok(conn),
                        Ok(Err(e)) => Err(e.to_string()),
                        Err(_) => Err("deadline passed while connecting".to_string()),
                    },
                    Err(e) => Err(e.to_string()),
                };
            let conn = match conn {
                Ok(conn) => conn,
                Err(e) => {
                    self.connect_failures += 1;
                    self.last_error = Some(format!("connect: {e}"));
                    tokio::time::sleep(
                        backoff.min(ctx.deadline.saturating_duration_since(Instant::now())),
                    )
                    .await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                    continue;
                }
            };
            self.connects += 1;
            self.setup.get_or_insert(started.elapsed());
            backoff = Duration::from_millis(100);
            let routes = Arc::new(AckRoutes::default());
            let router = tokio::spawn(route_datagrams(conn.clone(), routes.clone()));
            let streams = self
                .topics
                .iter_mut()
                .zip(self.broker_hwm.iter_mut())
                .filter(|(topic, hwm)| !topic.is_done() || hwm.is_none())
                .map(|(topic, hwm)| drive_topic(&conn, &routes, topic, hwm, ctx));
            let errors: Vec<String> = futures::future::join_all(streams)
                .await
                .into_iter()
                .filter_map(Result::err)
                .collect();
            let finished = errors.is_empty() && self.all_done();
            if ctx.go.borrow().is_some() {
                self.transport.add(&conn.stats());
            }
            conn.close(0u32.into(), if finished { b"done" } else { b"again" });
            router.abort();
            if finished {
                return;
            }
            if let Some(e) = errors.into_iter().next() {
                self.last_error = Some(e);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// Replicates `topic` on one stream of `conn` until the broker acknowledged
/// every record, then (after the hold, if any) asks the broker's
/// high-water mark on a second stream and stores it in `hwm`.
async fn drive_topic(
    conn: &quinn::Connection,
    routes: &AckRoutes,
    topic: &mut TopicLog,
    hwm: &mut Option<u64>,
    ctx: &EdgeContext,
) -> Result<(), String> {
    let result = stream_topic(conn, routes, topic, ctx).await;
    if let Err(e) = &result {
        topic.stream_failures += 1;
        topic.last_error = Some(e.clone());
        return result;
    }
    *hwm = Some(broker_hwm(conn, topic, ctx).await?);
    Ok(())
}

/// The broker's high-water mark of `topic`: the `Welcome` to a new stream's
/// `Hello`. The stream is finished right after.
async fn broker_hwm(
    conn: &quinn::Connection,
    topic: &TopicLog,
    ctx: &EdgeContext,
) -> Result<u64, String> {
    let (mut send, mut recv) = conn.open_bi().await.map_err(|e| e.to_string())?;
    let stream = EdgeStream::new(topic.name.clone(), ctx.settings.clone(), ctx.window);
    send.write_all(&stream.hello().to_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut inbox = BytesMut::new();
    loop {
        if let Some(frame) = frame::decode(&mut inbox, &ctx.limits).map_err(|e| e.to_string())? {
            let _ = send.finish();
            return match frame {
                Frame::Welcome { high_water_mark } => Ok(high_water_mark),
                other => Err(format!("asking the high-water mark: {other:?}")),
            };
        }
        match recv
            .read_chunk(64 * 1024, true)
            .await
            .map_err(|e| e.to_string())?
        {
            Some(chunk) => inbox.extend_from_slice(&chunk.bytes),
            None => return Err("broker finished the stream before its Welcome".into()),
        }
    }
}

/// One stream of `topic`: `Hello`, then batches as the window and the
/// production allow, until every record is acknowledged (and the hold, if
/// any, is released).
async fn stream_topic(
    conn: &quinn::Connection,
    routes: &AckRoutes,
    topic: &mut TopicLog,
    ctx: &EdgeContext,
) -> Result<(), String> {
    let (mut send, mut recv) = conn.open_bi().await.map_err(|e| e.to_string())?;
    let mut datagram_acks = routes.register(u64::from(send.id()));
    let mut stream = EdgeStream::new(topic.name.clone(), ctx.settings.clone(), ctx.window);
    send.write_all(&stream.hello().to_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut inbox = BytesMut::new();
    let mut welcomed = false;
    let mut hold = ctx.hold.clone();
    let mut go = ctx.go.clone();
    loop {
        let now = Instant::now();
        if let Some(at) = *go.borrow_and_update() {
            topic.start(at);
        }
        if welcomed && topic.is_done() {
            if !topic.counted_done {
                topic.counted_done = true;
                ctx.topics_done
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            let released = hold.as_ref().is_none_or(|h| *h.borrow());
            if released {
                let _ = send.finish();
                return Ok(());
            }
        }
        let produced = topic.produced(now);
        while let Some(from) = stream.next_to_send(produced) {
            let batch = topic
                .batch(from, produced, &ctx.limits)
                .map_err(|e| e.to_string())?;
            let frame = Frame::batch(&batch, false).to_bytes();
            send.write_all(&frame).await.map_err(|e| e.to_string())?;
            stream.on_sent(batch.header(), batch.len());
            topic.sent(batch.next_offset(), Instant::now());
        }
        let next_production = topic.next_production(now).unwrap_or(ctx.deadline);
        tokio::select! {
            chunk = recv.read_chunk(64 * 1024, true) => {
                match chunk.map_err(|e| e.to_string())? {
                    Some(chunk) => inbox.extend_from_slice(&chunk.bytes),
                    None => return Err("broker finished the stream".into()),
                }
                while let Some(frame) = frame::decode(&mut inbox, &ctx.limits).map_err(|e| e.to_string())? {
                    // Every record of the topic exists (made up from its
                    // offset) even before it is "produced": an earlier run
                    // may have sent some.
                    match stream.on_frame(frame, 0, topic.total()).map_err(|e| e.to_string())? {
                        EdgeEvent::Resumed { from } => {
                            welcomed = true;
                            if topic.first_welcome.is_none() {
                                ctx.topics_welcomed.fetch_add(1, Ordering::Relaxed);
                            }
                            topic.resumed(from, Instant::now());
                        }
                        EdgeEvent::Acked { next_offset } => {
                            topic.ack_frames += 1;
                            topic.acknowledged(next_offset, Instant::now());
                        }
                        // Progress reports (13 bytes per topic and second
                        // at most) are left out of the swarm's load.
                        // The swarm does not ask for the tip or the
                        // cluster id (no `with_tip_check`,
                        // `with_cluster_check`), so none comes.
                        EdgeEvent::AlreadyAcked
                        | EdgeEvent::Archived { .. }
                        | EdgeEvent::ProgressRequested { .. }
                        | EdgeEvent::Tip { .. }
                        | EdgeEvent::ClusterId { .. } => {}
                        EdgeEvent::Refetch { first_offset, end_offset } => {
                            return Err(format!("the broker asks to re-send {first_offset}..{end_offset}: the swarm does not answer refetches"));
                        }
                    }
                }
            }
            Ok(()) = datagram_acks.changed() => {
                let next_offset = *datagram_acks.borrow_and_update();
                if let EdgeEvent::Acked { next_offset } = stream.on_datagram_ack(next_offset).map_err(|e| e.to_string())? {
                    topic.acknowledged(next_offset, Instant::now());
                }
            }
            Ok(()) = go.changed(), if !topic.is_started() => {}
            Ok(()) = async {
                match hold.as_mut() {
                    Some(h) => h.changed().await,
                    None => std::future::pending().await,
                }
            } => {}
            () = tokio::time::sleep_until(next_production.into()) => {
                if Instant::now() >= ctx.deadline {
                    if welcomed && topic.is_done() {
                        // A hold that outlasted the run: done all the same.
                        let _ = send.finish();
                        return Ok(());
                    }
                    return Err(format!("deadline passed with {} of {} records acknowledged", topic.acked, topic.total()));
                }
            }
        }
    }
}
