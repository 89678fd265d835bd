//! One topic's replication stream on an established connection (the tokio
//! glue around `tributary_proto::replication::edge::EdgeStream`): the
//! read-ahead task that reads and compresses WAL batches, the sending loop
//! (window, pacing, acknowledgements from `Ack` frames and datagrams), and
//! the checkpoint task (acknowledged and archived offsets). [`replicate_topic`] returns only after every task
//! it started has ended, so no WAL or topic-manager handle outlives it.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use broker_core::wal::Wal;
use bytes::BytesMut;
use tokio::sync::{mpsc, watch};
use tracing::{debug, info, warn};
use tributary_proto::replication::compress::BatchCompressor;
use tributary_proto::replication::edge::{EdgeError, EdgeEvent, EdgeStream, RefetchAnswer};
use tributary_proto::replication::frame::{self, AckDatagram, ErrorCode};

use super::pacing::Pacer;
use super::read_ahead::{Outgoing, Prepared, READ_AHEAD_FRAMES, READ_STEP_BYTES, read_ahead_loop};
use super::stages::{SentTimes, Stage};
use super::targets::Routing;
use super::{ReplicationStats, ReplicatorConfig, StreamError};
use crate::manager::TopicManager;
use crate::topic::Topic;

/// The acknowledgement datagrams of one connection, routed to the stream
/// tasks by QUIC stream id. Each route keeps only the highest offset seen,
/// so a stream task that is busy sending misses nothing it needs.
#[derive(Default)]
pub(super) struct AckRoutes(std::sync::Mutex<HashMap<u64, watch::Sender<u64>>>);

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
pub(super) struct BrokerConnection {
    pub(super) conn: quinn::Connection,
    pub(super) ack_routes: Arc<AckRoutes>,
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
pub(super) async fn route_ack_datagrams(conn: quinn::Connection, routes: Arc<AckRoutes>) {
    while let Ok(datagram) = conn.read_datagram().await {
        match AckDatagram::decode(&datagram) {
            Ok(ack) => routes.deliver(ack),
            Err(e) => debug!(error = %e, "skipping a datagram from the broker"),
        }
    }
}

/// Replicates one topic on one connection until the connection ends or the
/// broker refuses, then ends the tasks it started (the read-ahead is told
/// to stop, the checkpoint task records the last acknowledgement) and
/// returns once they have: no WAL or topic-manager handle outlives it.
///
/// Three stages run concurrently, so reading, sending and bookkeeping
/// overlap: the read-ahead task reads WAL batches and compresses them on a
/// blocking thread (bounded by its byte budget); this task writes
/// frames while the window admits them and reads acknowledgements; a
/// checkpoint task records acknowledged and archived offsets (coalesced,
/// so a slow retention pass never holds up sending).
#[allow(clippy::too_many_arguments)]
pub(super) async fn replicate_topic(
    connection: &BrokerConnection,
    topic: &Arc<Topic>,
    wal: &Arc<Wal>,
    topics: &Arc<TopicManager>,
    config: &ReplicatorConfig,
    stats: &Arc<ReplicationStats>,
    pacer: Option<Arc<Pacer>>,
    routing: &Routing,
) -> Result<(), StreamError> {
    // Acknowledged and archived offsets go to the checkpoint task; it ends
    // once the sender is dropped, after recording the last ones.
    let (acked_tx, acked_rx) = watch::channel(Progress::default());
    let recorder = tokio::spawn(record_acknowledgements(
        topics.clone(),
        topic.clone(),
        acked_rx,
    ));
    // Started once the broker's Welcome says where to resume.
    let mut read_ahead = None;
    let result = drive_stream(
        connection,
        topic,
        wal,
        topics,
        config,
        stats,
        pacer,
        routing,
        &acked_tx,
        &mut read_ahead,
    )
    .await;
    drop(acked_tx);
    if let Some(read_ahead) = read_ahead {
        read_ahead.stop().await;
    }
    // A panic in the checkpoint task is the runtime's to report.
    let _ = recorder.await;
    result
}

/// The read-ahead task of a stream and the receiving end of its frames.
struct ReadAhead {
    frames: mpsc::Receiver<Result<Outgoing, StreamError>>,
    task: tokio::task::JoinHandle<()>,
}

impl ReadAhead {
    /// Tells the task to stop (its receiver goes away, releasing the frames
    /// it held and their budget) and waits until it has, with its WAL
    /// handle.
    async fn stop(self) {
        drop(self.frames);
        let _ = self.task.await;
    }
}

/// The sending loop of [`replicate_topic`].
#[allow(clippy::too_many_arguments)]
async fn drive_stream(
    connection: &BrokerConnection,
    topic: &Arc<Topic>,
    wal: &Arc<Wal>,
    topics: &Arc<TopicManager>,
    config: &ReplicatorConfig,
    stats: &Arc<ReplicationStats>,
    pacer: Option<Arc<Pacer>>,
    routing: &Routing,
    acked_tx: &watch::Sender<Progress>,
    read_ahead: &mut Option<ReadAhead>,
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
    )
    .with_tip_check()
    .with_cluster_check();
    send.write_all(&stream.hello().to_bytes())
        .await
        .map_err(|e| conn_err(&e))?;
    let limits = wal.config().limits;
    let mut inbox = BytesMut::new();
    // When quinn took each batch in flight, for its `ack` stage.
    let mut sent = SentTimes::with_capacity(config.window.batches);
    let acked_stage = |took: Duration| stats.stages.observe(Stage::Ack, took);
    // A frame taken from the read-ahead that waits for the bandwidth cap's
    // tokens, and when it may go; acknowledgements are read meanwhile.
    let mut paced: Option<(Outgoing, tokio::time::Instant)> = None;
    // When the next `Progress` frame may go (the broker asked for them).
    let mut progress_at: Option<tokio::time::Instant> = None;
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
                    let event = match stream.on_frame(frame, start, hwm) {
                        Err(EdgeError::BrokerAhead { broker, local }) => {
                            super::history::adopt_broker_offset(&mut stream, topic, wal, broker, local).await?
                        }
                        Err(EdgeError::LocalDataMissing { broker, local_start }) => {
                            super::history::resume_over_missing(&mut stream, topic, wal, broker, local_start)?
                        }
                        other => other?,
                    };
                    match event {
                        EdgeEvent::Resumed { from } => {
                            routing.resumed(topic.name().as_str());
                            stats.resumed(topic.name().as_str());
                            topic.mark_resumed();
                            info!(topic = %topic.name(), from, local_hwm = hwm, "replication resumed");
                            let checkpoint = topic.acknowledged_offset();
                            if from < checkpoint {
                                // A new owner after a failover starts at the
                                // archive's end: the retained log has the
                                // rest, same offsets, same bytes.
                                info!(
                                    topic = %topic.name(),
                                    from,
                                    checkpoint,
                                    "broker resumes at {from} below the checkpoint {checkpoint} (new owner); resending {} records",
                                    checkpoint - from
                                );
                            }
                            let (tx, frames) = mpsc::channel(READ_AHEAD_FRAMES);
                            let task = tokio::spawn(read_ahead_loop(
                                wal.clone(),
                                from,
                                config.compress,
                                stats.clone(),
                                tx,
                            ));
                            // `Resumed` comes once per stream (a second
                            // Welcome is a protocol error).
                            *read_ahead = Some(ReadAhead { frames, task });
                            // The broker holds everything below `from`
                            // durably: that is an acknowledgement too. Without
                            // it, records acknowledged just before a crash of
                            // the edge (before its checkpoint was written)
                            // would stay "unacknowledged" until the next
                            // record is sent, and forever if none comes.
                            acked_tx.send_modify(|p| p.acked = Some(from));
                        }
                        EdgeEvent::Acked { next_offset } => {
                            sent.on_acked(next_offset, Instant::now(), acked_stage);
                            stats.stream_acks.fetch_add(1, Ordering::Relaxed);
                            acked_tx.send_modify(|p| p.acked = Some(next_offset));
                        }
                        EdgeEvent::Archived { archived_offset } => {
                            debug!(topic = %topic.name(), archived_offset, "broker reports the topic archived");
                            acked_tx.send_modify(|p| p.archived = Some(archived_offset));
                        }
                        EdgeEvent::AlreadyAcked => {}
                        EdgeEvent::Refetch { first_offset, end_offset } => {
                            info!(topic = %topic.name(), first_offset, end_offset, "broker asks to re-send a range its copy of is damaged");
                            answer_refetches(&mut send, &mut stream, wal, config.compress).await?;
                        }
                        EdgeEvent::ClusterId { id } => {
                            // Before the next frame: nothing of another
                            // cluster (Welcome, Ack, Archived) is applied.
                            let broker = connection.conn.remote_address().to_string();
                            stats.cluster.check(topics.store(), id, &broker).await?;
                        }
                        EdgeEvent::Tip { base_offset, next_offset, crc32c } => {
                            let wal = Arc::clone(wal);
                            let mismatch = tokio::task::spawn_blocking(move || {
                                super::history::tip_mismatch(&wal, base_offset, next_offset, crc32c)
                            })
                            .await
                            .map_err(|e| StreamError::Wal(format!("tip check task failed: {e}")))?;
                            if let Some(reason) = mismatch {
                                return Err(StreamError::Edge(EdgeError::Diverged {
                                    base_offset,
                                    next_offset,
                                    reason,
                                }));
                            }
                        }
                        EdgeEvent::ProgressRequested { .. } => {
                            // The first report at once, the next ones on
                            // the requested interval.
                            progress_at = Some(tokio::time::Instant::now());
                        }
                    }
                }
            }
            Ok(()) = datagram_acks.changed() => {
                let next_offset = *datagram_acks.borrow_and_update();
                if let EdgeEvent::Acked { next_offset } = stream.on_datagram_ack(next_offset)? {
                    sent.on_acked(next_offset, Instant::now(), acked_stage);
                    stats.datagram_acks.fetch_add(1, Ordering::Relaxed);
                    acked_tx.send_modify(|p| p.acked = Some(next_offset));
                }
            }
            prepared = async {
                match read_ahead.as_mut() {
                    Some(read_ahead) => read_ahead.frames.recv().await,
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
                    send_frame(&mut send, &mut stream, stats, &mut sent, prepared).await?;
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
                    send_frame(&mut send, &mut stream, stats, &mut sent, prepared).await?;
                }
            }
            () = async {
                match progress_at {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            }, if progress_at.is_some() => {
                // The local high-water mark, for the broker's view of this
                // edge's lag (`tribctl edges list`); only when it changed.
                if let Some(frame) = stream.progress(wal.high_water_mark()) {
                    send.write_all(&frame.to_bytes())
                        .await
                        .map_err(|e| conn_err(&e))?;
                }
                let interval = stream.progress_interval_ms().unwrap_or(1_000);
                progress_at = Some(
                    tokio::time::Instant::now() + Duration::from_millis(u64::from(interval)),
                );
            }
        }
    }
}

/// Answers the broker's waiting refetch requests from the local WAL: the
/// batches of each range as `Repair` frames, or `RefetchUnavailable` when
/// the WAL no longer starts at or below the range or cannot read all of it
/// (FORMAT.md, "Replication stream").
async fn answer_refetches(
    send: &mut quinn::SendStream,
    stream: &mut EdgeStream,
    wal: &Arc<Wal>,
    compress: bool,
) -> Result<(), StreamError> {
    let conn_err = |e: &dyn std::fmt::Display| StreamError::Connection(e.to_string());
    while let Some(answer) = stream.answer_refetch(wal.log_start_offset()) {
        let (first_offset, end_offset) = match answer {
            RefetchAnswer::Resend {
                first_offset,
                end_offset,
            } => (first_offset, end_offset),
            RefetchAnswer::Unavailable(frame) => {
                if let frame::Frame::RefetchUnavailable {
                    first_offset,
                    end_offset,
                    log_start,
                } = &frame
                {
                    warn!(
                        first_offset,
                        end_offset,
                        log_start,
                        "cannot re-send a range the broker asks for: the local WAL no longer holds it"
                    );
                }
                send.write_all(&frame.to_bytes())
                    .await
                    .map_err(|e| conn_err(&e))?;
                continue;
            }
        };
        let reader = wal.clone();
        let batches = tokio::task::spawn_blocking(move || {
            read_exact_range(&reader, first_offset, end_offset)
        })
        .await
        .map_err(|e| StreamError::Wal(format!("refetch read failed: {e}")))?;
        match batches {
            Ok(batches) => {
                let mut compressor = BatchCompressor::new(compress);
                for batch in &batches {
                    let frame = match compressor.frame(batch) {
                        frame::Frame::Batch { codec, payload } => {
                            frame::Frame::Repair { codec, payload }
                        }
                        other => other,
                    };
                    send.write_all(&frame.to_bytes())
                        .await
                        .map_err(|e| conn_err(&e))?;
                    stream.on_repair_sent(batch.header());
                }
                info!(
                    first_offset,
                    end_offset,
                    batches = batches.len(),
                    "re-sent a range the broker found damaged"
                );
            }
            Err(why) => {
                warn!(first_offset, end_offset, %why, "cannot re-send a range the broker asks for");
                if let Some(frame) = stream.refetch_unavailable(wal.log_start_offset()) {
                    send.write_all(&frame.to_bytes())
                        .await
                        .map_err(|e| conn_err(&e))?;
                }
            }
        }
    }
    Ok(())
}

/// The batches of `first_offset..end_offset` exactly, or why not (a batch
/// boundary that differs, or offsets the local WAL cannot read).
fn read_exact_range(
    wal: &Wal,
    first_offset: u64,
    end_offset: u64,
) -> Result<Vec<tributary_proto::batch::EncodedBatch>, String> {
    let mut out = Vec::new();
    let mut next = first_offset;
    while next < end_offset {
        let batches = wal.read(next, READ_STEP_BYTES).map_err(|e| e.to_string())?;
        if batches.is_empty() {
            return Err(format!("nothing readable at {next}"));
        }
        for batch in batches {
            if batch.base_offset() != next {
                return Err(format!("no local batch starts at offset {next}"));
            }
            if batch.next_offset() > end_offset {
                return Err(format!(
                    "local batch {}..{} straddles the range end {end_offset}",
                    batch.base_offset(),
                    batch.next_offset()
                ));
            }
            next = batch.next_offset();
            out.push(batch);
            if next == end_offset {
                break;
            }
        }
    }
    Ok(out)
}

/// Hands a frame to quinn and records it as sent (a batch's `queue` and
/// `send` stages, and the start of its `ack` stage in `sent`).
async fn send_frame(
    send: &mut quinn::SendStream,
    stream: &mut EdgeStream,
    stats: &ReplicationStats,
    sent: &mut SentTimes,
    outgoing: Outgoing,
) -> Result<(), StreamError> {
    let prepared = match outgoing {
        Outgoing::Batch(prepared) => prepared,
        Outgoing::Hole {
            first_offset,
            end_offset,
            cause,
            reason,
        } => {
            warn!(
                first_offset,
                end_offset,
                cause = cause.as_str(),
                %reason,
                "declaring offsets the local WAL cannot read to the broker as a hole"
            );
            let frame = stream.hole(first_offset, end_offset, cause, reason);
            return send
                .write_all(&frame.to_bytes())
                .await
                .map_err(|e| StreamError::Connection(e.to_string()));
        }
    };
    let wire_len = prepared.wire_len();
    let Prepared {
        batch_header,
        raw_len,
        mut chunks,
        prepared_at,
        _permit,
    } = prepared;
    let writing = Instant::now();
    send.write_all_chunks(&mut chunks)
        .await
        .map_err(|e| StreamError::Connection(e.to_string()))?;
    let taken = Instant::now();
    stats
        .stages
        .observe(Stage::Queue, writing.saturating_duration_since(prepared_at));
    stats.stages.observe(Stage::Send, taken - writing);
    sent.on_sent(batch_header.next_offset(), taken);
    stats
        .raw_bytes_sent
        .fetch_add(raw_len as u64, Ordering::Relaxed);
    stats
        .wire_bytes_sent
        .fetch_add(wire_len as u64, Ordering::Relaxed);
    stream.on_sent(&batch_header, raw_len);
    Ok(())
}

/// What the broker reported on a stream, for the checkpoint task.
#[derive(Debug, Clone, Copy, Default)]
struct Progress {
    /// Highest acknowledged offset (`Welcome`, `Ack`, datagram).
    acked: Option<u64>,
    /// Highest archived offset (`Archived`).
    archived: Option<u64>,
}

/// Records each acknowledged and archived offset (the newest ones when
/// several arrive while previous ones are being recorded): checkpoint,
/// archived offset, then local WAL retention.
async fn record_acknowledgements(
    topics: Arc<TopicManager>,
    topic: Arc<Topic>,
    mut progress: watch::Receiver<Progress>,
) {
    let mut recorded = Progress::default();
    loop {
        let closed = progress.changed().await.is_err();
        let now = *progress.borrow_and_update();
        if let Some(next_offset) = now.acked
            && now.acked != recorded.acked
        {
            recorded.acked = now.acked;
            if let Err(e) = topics.on_acknowledged(topic.name(), next_offset).await {
                warn!(topic = %topic.name(), error = %e, "recording the acknowledgement");
            }
        }
        if let Some(archived_offset) = now.archived
            && now.archived != recorded.archived
        {
            recorded.archived = now.archived;
            if let Err(e) = topics.on_archived(topic.name(), archived_offset).await {
                warn!(topic = %topic.name(), error = %e, "recording the archived offset");
            }
        }
        if closed {
            return;
        }
    }
}
