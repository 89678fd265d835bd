//! The broker's replication endpoint: QUIC with mutual TLS, one stream per
//! edge topic, driving `tributary_proto::replication::ingest::IngestStream`.
//!
//! Every connection must present a certificate chaining to the cluster CA
//! (rustls enforces it in the handshake); its identity must be an edge id
//! (broker certificates are refused here), and each stream may only write to
//! the namespace named like that identity. Batches are appended verbatim
//! with `append_at` and pipelined: the stream keeps reading and enqueuing
//! while earlier batches are being made durable, and acknowledgements leave
//! in order, each once its batch is durable per the topic's sync mode (one
//! cumulative `Ack` for every batch found durable together), on
//! the stream and, for an edge whose Hello asks for it, repeated in a QUIC
//! datagram
//! ([`AckDatagram`](tributary_proto::replication::frame::AckDatagram)) that a
//! lost stream packet cannot hold up; the newest datagram is sent again a
//! few times unless a newer one replaces it
//! ([`AckRepeats`](tributary_proto::replication::ack_repeat::AckRepeats)). A
//! refused stream gets an `Error` frame and is finished; nothing from it is
//! stored, and every other stream carries on. A revoked edge's connection
//! is closed right after the handshake, with the reason
//! ([`super::revocation`]).
//!
//! Every connection is registered with the [`Fleet`] (logged when it starts
//! and ends); each stream reports its topic's acknowledged offset and,
//! from an edge that offers them (`ProgressRequest` after the `Welcome`),
//! the edge's own high-water mark.

use std::sync::Arc;
use std::time::Instant;

use broker_core::tls::peer_identity;
use broker_core::wal::{AppendAtOutcome, BatchId, PendingAppend, Wal, WalError};
use bytes::{Bytes, BytesMut};
use tokio::sync::mpsc;
use tracing::{debug, info, warn};
use tributary_proto::keys::{TopicName, is_broker_identity};
use tributary_proto::limits::Limits;
use tributary_proto::replication::ack_repeat::AckRepeats;
use tributary_proto::replication::frame::{self, ErrorCode, Frame};
use tributary_proto::replication::ingest::{Acknowledger, IngestAction, IngestStream};

use super::damage::{DamageService, RouteGuard};
use super::receive_budget::{MIN_CONNECTION_WINDOW, ReceiveBudget, var_int};
use super::revocation::EdgeGate;
use super::stages::{FrameClock, INGEST_STAGES, Stage};
use super::stream_checks::{deleted_centrally, ownership_lost};
use super::topics::{TopicError, TopicStore};
use crate::fleet::{EdgeConnection, Fleet, TopicProgress};

/// Initial capacity of a stream's frame buffer, bytes: small, so thousands
/// of idle edge streams cost little; a bulk stream's buffer grows to its
/// frames' size on its own.
const READ_BUFFER_BYTES: usize = 16 * 1024;
/// Received chunks taken from a stream per read.
const READ_CHUNKS: usize = 64;
/// Appends in flight per stream before the reader waits for the writer.
const PIPELINE_DEPTH: usize = 256;

/// Serves edges on `endpoint` until it is closed. Each open stream takes
/// the refetch requests of `damage` for its topic (module
/// [`super::damage`]); `gate` refuses (and later closes) the connections
/// of revoked edges (module [`super::revocation`]); each admitted
/// connection is registered with `fleet` and takes its connection window
/// from `budget` (module [`super::receive_budget`]; the endpoint's
/// transport config should grant
/// [`MIN_CONNECTION_WINDOW`](super::receive_budget::MIN_CONNECTION_WINDOW)
/// in the handshake, [`ingest_transport`]).
pub async fn serve(
    endpoint: quinn::Endpoint,
    damage: Arc<DamageService>,
    gate: Arc<EdgeGate>,
    fleet: Arc<Fleet>,
    budget: Arc<ReceiveBudget>,
    limits: Limits,
) {
    let topics = damage.topics().clone();
    while let Some(incoming) = endpoint.accept().await {
        let topics = topics.clone();
        let damage = damage.clone();
        let gate = gate.clone();
        let fleet = fleet.clone();
        let budget = budget.clone();
        tokio::spawn(async move {
            let conn = match incoming.await {
                Ok(conn) => conn,
                Err(e) => {
                    // No certificate, a certificate from another CA, wrong
                    // ALPN: rustls refused the handshake.
                    info!(error = %e, "edge handshake refused");
                    return;
                }
            };
            let identity = match peer_identity(&conn) {
                // A broker's certificate, or one named like a broker's (no
                // edge may have such an id), is no edge's.
                Some(identity) if !is_broker_identity(&identity) => identity,
                other => {
                    warn!(
                        peer = %conn.remote_address(),
                        identity = other.as_deref().unwrap_or(""),
                        "refusing a connection without an edge identity"
                    );
                    conn.close(1u32.into(), b"certificate has no edge identity");
                    return;
                }
            };
            let _admission = match gate.admit(&conn, &identity) {
                Ok(admission) => admission,
                Err(reason) => {
                    info!(edge = %identity, peer = %conn.remote_address(), %reason, "refused a revoked edge");
                    return;
                }
            };
            let connection = Arc::new(fleet.connected(&identity, conn.remote_address()));
            let progress_interval_ms = fleet.config().progress_interval_ms;
            let mut seat = budget.admit();
            let ended = loop {
                conn.set_receive_window(var_int(*seat.window.borrow_and_update()));
                let accepted = tokio::select! {
                    accepted = conn.accept_bi() => accepted,
                    // Another connection came or went: a new share. (The
                    // seat holds the budget, and so its sender.)
                    Ok(()) = seat.window.changed() => continue,
                };
                match accepted {
                    Ok((send, recv)) => {
                        tokio::spawn(handle_stream(
                            conn.clone(),
                            send,
                            recv,
                            identity.clone(),
                            topics.clone(),
                            damage.clone(),
                            StreamFleet {
                                connection: connection.clone(),
                                progress_interval_ms,
                            },
                            limits,
                        ));
                    }
                    Err(e) => break e,
                }
            };
            connection.closed(&ended.to_string());
        });
    }
}

/// The ingest endpoint's transport settings: `base` with a handshake
/// connection window of
/// [`MIN_CONNECTION_WINDOW`](super::receive_budget::MIN_CONNECTION_WINDOW)
/// bytes, which [`serve`] raises to the connection's share of the receive
/// budget once it is admitted (credit granted cannot be taken back, so it
/// starts small).
pub fn ingest_transport(mut base: quinn::TransportConfig) -> quinn::TransportConfig {
    base.receive_window(var_int(MIN_CONNECTION_WINDOW));
    base
}

/// What the stream's writer task sends, in order.
enum Out {
    /// Acknowledge from now on as this says (the accepted Hello decided
    /// whether datagrams repeat the `Ack` frames).
    Acknowledger(Acknowledger),
    /// An answer frame.
    Frame(Frame),
    /// An acknowledgement once this append is durable; when the WAL took
    /// it (the start of its `durable` stage, module [`super::stages`]). A
    /// duplicate was compared with the stored batch before
    /// ([`check_duplicate`]).
    Ack(PendingAppend, Instant),
    /// An acknowledgement of everything below this offset, already durable
    /// (a declared hole).
    Stored(u64),
    /// From now on acknowledge only while this broker serves `topic` at
    /// `epoch` (cluster ownership): a broker whose lease is no longer
    /// fresh, or that lost the topic, stops acknowledging.
    Gate(Arc<crate::cluster::Cluster>, TopicName, u64),
    /// Report every acknowledgement sent to this topic's fleet progress.
    Progress(Arc<TopicProgress>),
}

/// What a stream reports to the fleet: its connection, and the interval to
/// ask the edge's `Progress` frames at.
struct StreamFleet {
    connection: Arc<EdgeConnection>,
    progress_interval_ms: u32,
}

/// Longest wait for a topic to open for an edge's `Hello` (metadata reads
/// and writes through Raft, the first owner's assignment): past it the
/// stream is refused as `Unavailable` and the edge tries again.
const OPEN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// How often an open stream re-checks its topic's ownership and the
/// committed archive's end (`Archived` frames), besides ownership changes.
pub(super) const ARCHIVE_CHECK: std::time::Duration = std::time::Duration::from_secs(1);

pub(super) fn refusal(code: ErrorCode, message: impl Into<String>) -> Frame {
    Frame::Error {
        code,
        message: message.into(),
    }
}

/// Checks a batch the WAL took as a duplicate against the batch stored at
/// its offsets, once they are written (off the runtime: it reads the WAL).
/// A re-sent batch of the same log is the stored batch byte for byte; any
/// other is another log's (two devices under one edge id) and is refused
/// ([`WalError::NotStoredBatch`], a `Conflict`). The read loop waits for
/// this before it takes the stream's next batch, so nothing that follows
/// a refused duplicate is stored either.
async fn check_duplicate(wal: &Arc<Wal>, id: BatchId) -> Result<(), WalError> {
    wal.wait_for_offset(id.next_offset.saturating_sub(1))
        .await?;
    let wal = Arc::clone(wal);
    tokio::task::spawn_blocking(move || wal.verify_stored(&id))
        .await
        .map_err(|e| WalError::Config(format!("duplicate check task failed: {e}")))?
}

/// The `Error` frame for a failed append. A full file system under the
/// topic's WAL (`ENOSPC`, `EDQUOT`) is `Unavailable` (the edge keeps its
/// records and retries with its backoff) with a message starting
/// `disk_full:`, so the edge's log and operators can tell it from other
/// storage failures.
fn wal_refusal(e: &WalError) -> Frame {
    let code = match e {
        WalError::Gap { .. } => ErrorCode::Gap,
        WalError::Overlap { .. } => ErrorCode::Overlap,
        WalError::Limit(_) => ErrorCode::TooLarge,
        WalError::NotStoredBatch { .. } => ErrorCode::Conflict,
        _ => ErrorCode::Unavailable,
    };
    if e.is_disk_full() {
        return refusal(code, format!("disk_full: {e}"));
    }
    refusal(code, e.to_string())
}

async fn write_loop(
    conn: quinn::Connection,
    mut send: quinn::SendStream,
    mut out: mpsc::Receiver<Out>,
    mut acks: Acknowledger,
) {
    let mut repeats = AckRepeats::default();
    let mut bytes = BytesMut::new();
    let mut gate: Option<(Arc<crate::cluster::Cluster>, TopicName, u64)> = None;
    let mut progress: Option<Arc<TopicProgress>> = None;
    // An item taken from `out` by `fold_durable` and not folded.
    let mut peeked: Option<Out> = None;
    loop {
        let repeat_due = repeats.next_due();
        let item = match peeked.take() {
            Some(item) => item,
            None => tokio::select! {
                item = out.recv() => match item {
                    Some(item) => item,
                    None => break,
                },
                () = sleep_until(repeat_due), if repeat_due.is_some() => {
                    if let Some(datagram) = repeats.due(now()) {
                        let _ = conn.send_datagram(datagram.to_bytes());
                    }
                    continue;
                }
            },
        };
        // When the batches acknowledged by `frame` were seen durable, and
        // how many it acknowledges.
        let mut durable_at = None;
        let frame = match item {
            Out::Acknowledger(new) => {
                acks = new;
                continue;
            }
            Out::Gate(cluster, topic, epoch) => {
                gate = Some((cluster, topic, epoch));
                continue;
            }
            Out::Progress(handle) => {
                progress = Some(handle);
                continue;
            }
            Out::Frame(frame) => frame,
            Out::Ack(pending, issued) => {
                match pending.durable().await {
                    Ok(AppendAtOutcome::Appended(a) | AppendAtOutcome::Duplicate(a)) => {
                        let durable = Instant::now();
                        INGEST_STAGES
                            .observe(Stage::Durable, durable.saturating_duration_since(issued));
                        let (next_offset, folded, next) =
                            fold_durable(&mut out, a.next_offset, durable);
                        durable_at = Some((durable, 1 + folded));
                        peeked = next;
                        let ack = acks.on_stored(next_offset);
                        if let Some(datagram) = ack.datagram {
                            // Best effort: a full datagram buffer or a lost
                            // datagram leaves the Ack frame below to do the work.
                            let _ = conn.send_datagram(datagram.to_bytes());
                            repeats.on_sent(datagram, now(), conn.rtt());
                        }
                        ack.frame
                    }
                    Err(e) => wal_refusal(&e),
                }
            }
            Out::Stored(next_offset) => {
                let ack = acks.on_stored(next_offset);
                if let Some(datagram) = ack.datagram {
                    let _ = conn.send_datagram(datagram.to_bytes());
                    repeats.on_sent(datagram, now(), conn.rtt());
                }
                ack.frame
            }
        };
        if matches!(frame, Frame::Ack { .. })
            && let Some((cluster, topic, epoch)) = &gate
            && cluster.route(topic) != (crate::cluster::Route::Local { epoch: *epoch })
        {
            // Not acknowledged: the edge keeps the batch and re-sends it to
            // whoever owns the topic next.
            let frame = refusal(
                ErrorCode::Unavailable,
                format!(
                    "broker {} no longer serves {topic} at epoch {epoch}: {:?}",
                    cluster.me(),
                    cluster.route(topic)
                ),
            );
            warn!(%topic, epoch, "stopped acknowledging: this broker no longer holds the topic or a fresh lease");
            bytes.clear();
            frame.encode(&mut bytes);
            let _ = send.write_all(&bytes).await;
            break;
        }
        let last = matches!(frame, Frame::Error { .. } | Frame::Redirect(_));
        if let (Frame::Ack { next_offset }, Some(progress)) = (&frame, &progress) {
            progress.acknowledged(*next_offset);
        }
        bytes.clear();
        frame.encode(&mut bytes);
        if send.write_all(&bytes).await.is_err() {
            return;
        }
        if let Some((durable, batches)) = durable_at {
            let took = durable.elapsed();
            for _ in 0..batches {
                INGEST_STAGES.observe(Stage::Ack, took);
            }
        }
        if last {
            break;
        }
    }
    let _ = send.finish();
    // Let the peer read everything before the stream is dropped.
    let _ = send.stopped().await;
}

/// Takes from `out` the acknowledgements queued behind one about to be
/// sent whose batches are durable already, so that one cumulative `Ack`
/// (and one datagram) answers them all: under load a stream's batches
/// often become durable together (one group write), and an `Ack` each
/// cost the broker and the edge a packet each. Returns the offset to
/// acknowledge, how many batches were folded, and the first item not
/// folded (a batch not durable yet, a failed one, or anything else), to be
/// handled next in order.
fn fold_durable(
    out: &mut mpsc::Receiver<Out>,
    mut next_offset: u64,
    durable: Instant,
) -> (u64, usize, Option<Out>) {
    let mut folded = 0;
    loop {
        match out.try_recv() {
            Ok(Out::Ack(pending, issued)) => match pending.durable_now() {
                Some(Ok(AppendAtOutcome::Appended(a) | AppendAtOutcome::Duplicate(a))) => {
                    INGEST_STAGES
                        .observe(Stage::Durable, durable.saturating_duration_since(issued));
                    next_offset = next_offset.max(a.next_offset);
                    folded += 1;
                }
                _ => return (next_offset, folded, Some(Out::Ack(pending, issued))),
            },
            Ok(other) => return (next_offset, folded, Some(other)),
            Err(_) => return (next_offset, folded, None),
        }
    }
}

/// The runtime's clock (paused in tests that pause it), for [`AckRepeats`].
fn now() -> std::time::Instant {
    tokio::time::Instant::now().into_std()
}

/// Sleeps until `at` on the runtime's clock (forever when `None`).
async fn sleep_until(at: Option<std::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await,
        None => std::future::pending().await,
    }
}

// One stream's context, passed whole from the accept loop.
#[allow(clippy::too_many_arguments)]
async fn handle_stream(
    conn: quinn::Connection,
    send: quinn::SendStream,
    mut recv: quinn::RecvStream,
    identity: String,
    topics: Arc<TopicStore>,
    damage: Arc<DamageService>,
    fleet: StreamFleet,
    limits: Limits,
) {
    let (out, out_rx) = mpsc::channel::<Out>(PIPELINE_DEPTH);
    // The topic's fleet progress, once it is open.
    let mut progress: Option<Arc<TopicProgress>> = None;
    // A broker whose lease is stale closes the edge's whole connection (not
    // only this stream), so the edge tries its next bootstrap broker
    // instead of asking this one again and again: the owner it could name
    // is unknown to it, cut off from the Raft majority.
    let connection = conn.clone();
    let lease_stale = |topics: &TopicStore| topics.cluster().is_some_and(|c| !c.lease_fresh());
    let mut close_connection = false;
    let mut ingest = IngestStream::new(identity.clone(), limits);
    let stream_id = u64::from(send.id());
    let writer = tokio::spawn(write_loop(
        conn,
        send,
        out_rx,
        ingest.acknowledger(stream_id),
    ));
    let mut wal: Option<Arc<Wal>> = None;
    let mut opened_topic = None;
    // The edge's settings (its `Hello`) of the opened topic.
    let mut opened_settings = None;
    // Refetch requests for this stream's topic, once it is open.
    let mut refetches: Option<(mpsc::Receiver<(u64, u64)>, RouteGuard)> = None;
    // Batches re-sent so far for the oldest refetch request.
    let mut repairs: Vec<tributary_proto::batch::EncodedBatch> = Vec::new();
    // Cluster ownership of the open topic: its epoch, and ownership changes.
    let mut ownership: Option<(
        Arc<crate::cluster::Cluster>,
        u64,
        tokio::sync::watch::Receiver<u64>,
    )> = None;
    // When to check the committed archive's end next, and the last end sent.
    let mut archive_due: Option<tokio::time::Instant> = None;
    let mut archived_sent = 0u64;
    let mut buf = BytesMut::with_capacity(READ_BUFFER_BYTES);
    // The `receive` stage of the frame being read.
    let mut frame_clock = FrameClock::default();
    let mut chunks: [Bytes; READ_CHUNKS] = std::array::from_fn(|_| Bytes::new());
    let refused = 'stream: loop {
        loop {
            let decoding = Instant::now();
            let frame = match frame::decode(&mut buf, &limits) {
                Ok(Some(frame)) => frame,
                Ok(None) => break,
                Err(e) => {
                    let code = match e {
                        frame::FrameError::TooLarge { .. } => ErrorCode::TooLarge,
                        _ => ErrorCode::Malformed,
                    };
                    break 'stream Some(refusal(code, e.to_string()));
                }
            };
            let received = frame_clock.on_frame(buf.is_empty());
            let action = ingest.on_frame(frame);
            let decoded = Instant::now();
            match action {
                IngestAction::Open(hello, topic) => {
                    // The cluster's id first, when asked: an edge whose
                    // checkpoints belong to another cluster stops before
                    // it takes anything of this one's. Not knowing it yet
                    // is retryable; sending nothing would pass for an
                    // older broker.
                    let first = topics.identity().frame_for(&mut ingest, OPEN_TIMEOUT);
                    match first.await {
                        Ok(Some(frame)) => {
                            if out.send(Out::Frame(frame)).await.is_err() {
                                break 'stream None;
                            }
                        }
                        Ok(None) => {}
                        Err(refused) => break 'stream Some(refused),
                    }
                    let opened = tokio::time::timeout(
                        OPEN_TIMEOUT,
                        topics.open_for_edge(&topic, hello.settings.as_ref()),
                    )
                    .await
                    .unwrap_or_else(|_| {
                        Err(TopicError::NoOwner(format!(
                            "opening {topic} took over {OPEN_TIMEOUT:?} (metadata unavailable?)"
                        )))
                    });
                    match opened {
                        Ok(opened) => {
                            let resume = opened.high_water_mark();
                            let tip = if ingest.wants_tip() {
                                let wal = Arc::clone(&opened);
                                tokio::task::spawn_blocking(move || wal.batch_ending_at(resume))
                                    .await
                                    .ok()
                                    .flatten()
                                    .and_then(|t| {
                                        ingest.tip(t.base_offset, t.next_offset, t.crc32c)
                                    })
                            } else {
                                None
                            };
                            let welcome = ingest.welcome(resume);
                            info!(edge = %identity, %topic, resume, "edge stream opened");
                            wal = Some(opened);
                            refetches = Some(damage.register_stream(&topic));
                            opened_topic = Some(topic.clone());
                            opened_settings = hello.settings.clone();
                            let acks = Out::Acknowledger(ingest.acknowledger(stream_id));
                            if out.send(acks).await.is_err() {
                                break 'stream None;
                            }
                            if let Some(tip) = tip
                                && out.send(Out::Frame(tip)).await.is_err()
                            {
                                break 'stream None;
                            }
                            if out.send(Out::Frame(welcome)).await.is_err() {
                                break 'stream None;
                            }
                            let handle = fleet.connection.topic(&topic);
                            handle.acknowledged(resume);
                            progress = Some(handle.clone());
                            if out.send(Out::Progress(handle)).await.is_err() {
                                break 'stream None;
                            }
                            if let Some(request) =
                                ingest.progress_request(fleet.progress_interval_ms)
                                && out.send(Out::Frame(request)).await.is_err()
                            {
                                break 'stream None;
                            }
                            if let (Some(cluster), Some(epoch)) =
                                (topics.cluster(), topics.opened_epoch(&topic))
                            {
                                let gate = Out::Gate(cluster.clone(), topic.clone(), epoch);
                                if out.send(gate).await.is_err() {
                                    break 'stream None;
                                }
                                ownership = Some((cluster.clone(), epoch, cluster.subscribe()));
                            }
                            archive_due = Some(tokio::time::Instant::now());
                        }
                        Err(TopicError::NotOwner(owner)) => {
                            info!(edge = %identity, %topic, owner = owner.broker_id, epoch = owner.epoch, "redirecting an edge stream to the topic's owner");
                            let redirect =
                                ingest.redirect(tributary_proto::replication::frame::Redirect {
                                    broker_id: owner.broker_id,
                                    ingest_addr: owner.ingest_addr,
                                    epoch: owner.epoch,
                                });
                            let _ = out.send(Out::Frame(redirect)).await;
                            break 'stream None;
                        }
                        Err(
                            e @ (TopicError::Conflict { .. } | TopicError::WriterConflict { .. }),
                        ) => {
                            break 'stream Some(refusal(ErrorCode::Conflict, e.to_string()));
                        }
                        Err(e @ TopicError::NoOwner(_)) if lease_stale(&topics) => {
                            close_connection = true;
                            break 'stream Some(refusal(ErrorCode::Unavailable, e.to_string()));
                        }
                        Err(e) => {
                            break 'stream Some(refusal(ErrorCode::Unavailable, e.to_string()));
                        }
                    }
                }
                IngestAction::Append(batch) => {
                    let Some(wal) = &wal else {
                        break 'stream Some(refusal(ErrorCode::Malformed, "batch before open"));
                    };
                    INGEST_STAGES.observe(Stage::Receive, received);
                    INGEST_STAGES.observe(Stage::Decode, decoded - decoding);
                    crate::metrics::INGEST.on_batch(batch.header().record_count, batch.len());
                    if let Some(cluster) = topics.cluster() {
                        // The load the lease reports (`bytes_in_per_s`).
                        cluster
                            .bytes_in
                            .fetch_add(batch.len() as u64, std::sync::atomic::Ordering::Relaxed);
                    }
                    // The un-archived byte budget (`crate::budget`): refused
                    // before it is written; the edge keeps it and retries.
                    if let Some(topic) = &opened_topic
                        && let Err(e) = topics.check_budget(topic).await
                    {
                        break 'stream Some(refusal(ErrorCode::Unavailable, e.to_string()));
                    }
                    let id = BatchId::of(batch.header());
                    match wal.enqueue_at(batch).await {
                        Ok(pending) => {
                            let issued = Instant::now();
                            INGEST_STAGES.observe(Stage::Append, issued - decoded);
                            if matches!(pending.outcome(), AppendAtOutcome::Duplicate(_))
                                && let Err(e) = check_duplicate(wal, id).await
                            {
                                break 'stream Some(wal_refusal(&e));
                            }
                            if out.send(Out::Ack(pending, issued)).await.is_err() {
                                break 'stream None;
                            }
                        }
                        Err(e) => break 'stream Some(wal_refusal(&e)),
                    }
                }
                IngestAction::Refuse(frame) => break 'stream Some(frame),
                IngestAction::DeclareHole(hole) => {
                    let (Some(wal), Some(topic)) = (&wal, &opened_topic) else {
                        break 'stream Some(refusal(ErrorCode::Malformed, "hole before open"));
                    };
                    match super::holes::declare(&topics, topic, wal, hole).await {
                        Ok(end) => {
                            if out.send(Out::Stored(end)).await.is_err() {
                                break 'stream None;
                            }
                        }
                        Err(frame) => break 'stream Some(frame),
                    }
                }
                IngestAction::Repair(part) => {
                    let (Some(wal), Some(topic)) = (&wal, &opened_topic) else {
                        break 'stream Some(refusal(ErrorCode::Malformed, "repair before open"));
                    };
                    repairs.push(part.batch);
                    if part.complete {
                        let batches = std::mem::take(&mut repairs);
                        damage
                            .repair_from_edge(topic, wal, part.first_offset, &batches)
                            .await;
                    }
                }
                IngestAction::Progress { high_water_mark } => {
                    if let Some(progress) = &progress {
                        progress.edge_reports(high_water_mark);
                    }
                }
                IngestAction::RefetchUnavailable {
                    first_offset,
                    log_start,
                    ..
                } => {
                    repairs.clear();
                    if let Some(topic) = &opened_topic {
                        damage.edge_unavailable(topic, first_offset, log_start);
                    }
                }
            }
        }
        let read = tokio::select! {
            read = recv.read_chunks(&mut chunks) => read,
            Some((first_offset, end_offset)) = async {
                match refetches.as_mut() {
                    Some((requests, _)) => requests.recv().await,
                    None => std::future::pending().await,
                }
            } => {
                if let Some(frame) = ingest.refetch(first_offset, end_offset)
                    && out.send(Out::Frame(frame)).await.is_err()
                {
                    break None;
                }
                continue;
            }
            changed = async {
                match ownership.as_mut() {
                    Some((_, _, changes)) => changes.changed().await,
                    None => std::future::pending().await,
                }
            } => {
                if changed.is_err() {
                    ownership = None;
                }
                if let Some((frame, stale)) = ownership_lost(ownership.as_ref(), opened_topic.as_ref()) {
                    close_connection = stale;
                    break Some(frame);
                }
                continue;
            }
            () = async {
                match archive_due {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            } => {
                archive_due = Some(tokio::time::Instant::now() + ARCHIVE_CHECK);
                // A lease goes stale with time, not only with a change.
                if let Some((frame, stale)) = ownership_lost(ownership.as_ref(), opened_topic.as_ref()) {
                    close_connection = stale;
                    break Some(frame);
                }
                if let Some(topic) = &opened_topic
                    && let Some(frame) =
                        deleted_centrally(topics.store().as_ref(), topic, opened_settings.as_ref()).await
                {
                    break Some(frame);
                }
                // Bounded: a broker cut off from the Raft majority must
                // keep noticing that it lost the topic.
                if let Some(topic) = &opened_topic
                    && let Ok(Ok(Some(end))) = tokio::time::timeout(
                        ARCHIVE_CHECK,
                        crate::storage::tiered_offset(topics.store().as_ref(), topics.storage_keys(), topic),
                    )
                    .await
                    && end > archived_sent
                    && let Some(frame) = ingest.archived(end)
                {
                    archived_sent = end;
                    if out.send(Out::Frame(frame)).await.is_err() {
                        break None;
                    }
                }
                continue;
            }
        };
        // Many chunks per call: each chunk is about one packet's payload,
        // and every call takes the connection's lock.
        match read {
            Ok(Some(n)) => {
                frame_clock.on_read(Instant::now());
                for chunk in &mut chunks[..n] {
                    buf.extend_from_slice(chunk);
                    *chunk = Bytes::new();
                }
            }
            Ok(None) if buf.is_empty() => break None,
            Ok(None) => {
                break Some(refusal(
                    ErrorCode::Malformed,
                    format!("stream ended inside a frame ({} bytes)", buf.len()),
                ));
            }
            Err(e) => {
                debug!(edge = %identity, error = %e, "edge stream reset");
                break None;
            }
        }
    };
    if let Some(frame) = refused {
        // Budget refusals repeat with every retry of the edge; the budget
        // logs once per episode (`crate::budget`).
        let (code, message) = match &frame {
            Frame::Error { code, message } => (format!("{code:?}"), message.as_str()),
            _ => (String::new(), ""),
        };
        if message.starts_with("budget_exceeded:") {
            debug!(edge = %identity, code, message, "refusing an edge stream");
        } else {
            warn!(edge = %identity, code, message, "refusing an edge stream");
        }
        let _ = out.send(Out::Frame(frame)).await;
        let _ = recv.stop(0u32.into());
    }
    drop(out);
    let _ = writer.await;
    if close_connection {
        connection.close(2u32.into(), b"broker lost its lease");
    }
}

#[cfg(test)]
#[path = "ingest_tests.rs"]
mod tests;
