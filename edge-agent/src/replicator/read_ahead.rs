//! The read-ahead of a replication stream: reads the topic's WAL from where
//! the broker resumes, batch after batch on a blocking thread, prepares
//! each batch's frame (zstd attempt, header) and hands them to the sending
//! loop in offset order, with a `Hole` for offsets the local WAL cannot
//! read or no longer holds.

use std::sync::Arc;
use std::time::Instant;

use broker_core::wal::{ReadBuffers, UnreadableKind, UnreadableRange, Wal, WalError};
use bytes::Bytes;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tributary_proto::batch::BatchHeader;
use tributary_proto::replication::compress::BatchCompressor;
use tributary_proto::replication::edge::EdgeError;
use tributary_proto::replication::frame::{self, HoleCause};

use super::stages::Stage;
use super::{ReplicationStats, StreamError};

/// Bytes of WAL one read-ahead step reads at most (at least one batch).
pub(super) const READ_STEP_BYTES: usize = 2 * 1024 * 1024;
/// Bytes of prepared frames the read-ahead may hold before the stream takes
/// them (a single larger frame is still admitted alone).
const READ_AHEAD_BYTES: usize = 4 * 1024 * 1024;
/// Frames the read-ahead may hold.
pub(super) const READ_AHEAD_FRAMES: usize = 256;

/// A batch frame ready to send: its header and payload as separate chunks,
/// so the WAL bytes reach quinn without another copy.
pub(super) struct Prepared {
    pub(super) batch_header: BatchHeader,
    /// Stored bytes of the batch (before wire compression).
    pub(super) raw_len: usize,
    pub(super) chunks: [Bytes; 2],
    /// When the frame was ready (the start of its [`Stage::Queue`]).
    pub(super) prepared_at: Instant,
    /// Read-ahead budget held until the frame is handed to quinn.
    pub(super) _permit: OwnedSemaphorePermit,
}

impl Prepared {
    /// Bytes the frame takes on the stream.
    pub(super) fn wire_len(&self) -> usize {
        self.chunks.iter().map(Bytes::len).sum()
    }
}

/// What the read-ahead hands to the sending loop, in offset order.
pub(super) enum Outgoing {
    /// A batch frame.
    Batch(Prepared),
    /// Offsets `first_offset..end_offset` the local WAL cannot read (and the
    /// broker does not hold): declared to the broker with a `Hole` frame.
    Hole {
        first_offset: u64,
        end_offset: u64,
        cause: HoleCause,
        reason: String,
    },
}

impl Outgoing {
    /// Bytes the frame takes on the stream (for the bandwidth cap).
    pub(super) fn wire_len(&self) -> usize {
        match self {
            Outgoing::Batch(prepared) => prepared.wire_len(),
            Outgoing::Hole { reason, .. } => frame::FRAME_HEADER_BYTES + 17 + reason.len(),
        }
    }
}

/// The `Hole` the edge declares for `range` when a read at `next` (inside
/// it) fails: from `next`, since the broker holds everything below it.
fn hole_for(next: u64, range: &UnreadableRange) -> Outgoing {
    let cause = match range.kind {
        UnreadableKind::Damaged { .. } => HoleCause::Damaged,
        UnreadableKind::Hole => HoleCause::Lost,
    };
    Outgoing::Hole {
        first_offset: next,
        end_offset: range.end_offset,
        cause,
        reason: range.to_string(),
    }
}

/// Reads the WAL from `from` onwards, batch after batch, and prepares their
/// frames, until the receiver goes away or the WAL fails. Waits for new
/// records at the end of the log (and stops waiting when the receiver goes
/// away). A read step on the blocking thread is always awaited, so the task
/// ends with every handle on the WAL. Each step's `read` and each batch's
/// `compress` time go to `stats`.
pub(super) async fn read_ahead_loop(
    wal: Arc<Wal>,
    from: u64,
    compress: bool,
    stats: Arc<ReplicationStats>,
    tx: mpsc::Sender<Result<Outgoing, StreamError>>,
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
            let waited = tokio::select! {
                waited = wal.wait_for_offset(next) => waited,
                // The stream ended: stop now rather than at the next record.
                () = tx.closed() => return,
            };
            if let Err(e) = waited {
                let _ = tx.send(Err(StreamError::Wal(e.to_string()))).await;
                return;
            }
        }
        let Some((mut taken, mut buffers)) = tools.take() else {
            return;
        };
        let reader = wal.clone();
        let step_stats = stats.clone();
        let step = tokio::task::spawn_blocking(move || {
            let reading = Instant::now();
            let frames = reader
                .read_with(next, READ_STEP_BYTES, &mut buffers)
                .map(|batches| {
                    let mut boundary = Instant::now();
                    step_stats.stages.observe(Stage::Read, boundary - reading);
                    batches
                        .into_iter()
                        .map(|batch| {
                            let (codec, payload) = taken.encode(&batch);
                            let head = frame::batch_frame_header(codec, payload.len());
                            let ready = Instant::now();
                            step_stats.stages.observe(Stage::Compress, ready - boundary);
                            boundary = ready;
                            (
                                *batch.header(),
                                batch.len(),
                                [Bytes::copy_from_slice(&head), payload],
                                ready,
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
            Err(e) => {
                let message = format!("read-ahead task failed: {e}");
                let _ = tx.send(Err(StreamError::Wal(message))).await;
                return;
            }
        };
        let frames = match frames {
            Ok(frames) => frames,
            Err(WalError::Unreadable(range)) if range.end_offset > next => {
                // Damaged bytes or lost offsets where `next` is. The broker
                // holds everything below `from` (its Welcome) and `next` is
                // at or past it, so the broker needs the range: declare it
                // a hole and carry on after it. (A range the broker already
                // holds lies below `from` and is never read.)
                if range.end_offset > from
                    && tx.send(Ok(hole_for(next.max(from), &range))).await.is_err()
                {
                    return;
                }
                next = range.end_offset;
                continue;
            }
            Err(WalError::OffsetBelowLogStart { log_start, .. }) if log_start > next => {
                // Offsets the local log no longer holds, which the broker
                // does not hold either (it resumed at or below `next`):
                // never acknowledged, so dropped under the disk budget
                // (`full_policy = "drop_oldest"`) or lost. Declared a hole,
                // so replication goes on after them.
                let hole = Outgoing::Hole {
                    first_offset: next,
                    end_offset: log_start,
                    cause: HoleCause::Lost,
                    reason: format!(
                        "offsets {next}..{log_start} are no longer in the edge's log (dropped under its disk budget before they were acknowledged, or lost)"
                    ),
                };
                if tx.send(Ok(hole)).await.is_err() {
                    return;
                }
                next = log_start;
                continue;
            }
            Err(e) => {
                let _ = tx.send(Err(StreamError::Wal(e.to_string()))).await;
                return;
            }
        };
        // Nothing leaves the device before a durable sync mark covers it: a
        // power cut that takes the unsynced tail of an `os_cache_flush`
        // topic must not let new records take offsets the broker holds
        // (FORMAT.md, "Sync mark"). One mark `fdatasync` per read step.
        if let Some(end) = frames.last().map(|f| f.0.next_offset())
            && let Err(e) = wal.mark_durable_through(end).await
        {
            let _ = tx.send(Err(StreamError::Wal(e.to_string()))).await;
            return;
        }
        for (batch_header, raw_len, chunks, prepared_at) in frames {
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
                prepared_at,
                _permit: permit,
            };
            if tx.send(Ok(Outgoing::Batch(prepared))).await.is_err() {
                return;
            }
        }
    }
}
