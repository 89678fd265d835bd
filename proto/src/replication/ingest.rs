//! The broker side of one topic's replication stream, without I/O.
//!
//! Calling contract (the broker's ingest driver):
//! 1. feed every received frame to [`IngestStream::on_frame`] and carry out
//!    the returned [`IngestAction`];
//! 2. for [`IngestAction::Open`]: first, when
//!    [`IngestStream::wants_cluster_id`], send
//!    [`IngestStream::cluster_id`]'s frame with the cluster's committed id
//!    (refuse with `Unavailable` while the broker does not know it yet:
//!    sending nothing would look like an older broker); then load or create
//!    the central topic with the edge's settings, then send
//!    [`IngestStream::welcome`] with the topic's high-water mark;
//! 3. for [`IngestAction::Append`]: `Wal::append_at` the batch (verbatim),
//!    then, once it is durable, send what [`Acknowledger::on_stored`] returns
//!    (the `Ack` frame, and the datagram copy if the edge asked for it); the
//!    [`Acknowledger`] comes from [`IngestStream::acknowledger`] and may live
//!    in another task than the stream (the one that waits for durability);
//! 4. for [`IngestAction::Refuse`]: send the error frame, finish the stream,
//!    store nothing;
//! 5. for [`IngestAction::DeclareHole`]: record the hole (in metadata, so it
//!    can be listed, then `Wal::skip_to(end_offset)`), then, once durable,
//!    send what [`Acknowledger::on_stored`]`(end_offset)` returns. A hole is
//!    accepted only at exactly the next expected offset; the next batch must
//!    start at its end;
//! 6. to repair a damaged range of the central WAL, send the frame
//!    [`IngestStream::refetch`] returns; the edge's answers come back as
//!    [`IngestAction::Repair`] (one verified batch of the range each, the
//!    last with `complete`: then rewrite the segment with them) or
//!    [`IngestAction::RefetchUnavailable`] (drop what was collected; try
//!    the archive). Neither is acknowledged.
//! 7. after the welcome, send [`IngestStream::progress_request`]'s frame
//!    when it returns one (the edge's Hello offered `Progress` frames); the
//!    edge's answers come back as [`IngestAction::Progress`] with its own
//!    high-water mark (for the edge's lag: fleet visibility).

use super::frame::{
    AckDatagram, BatchFrameError, ErrorCode, Frame, Hello, HoleCause, PROTOCOL_VERSION, Redirect,
    WireCodec, open_batch,
};
use crate::batch::DecodeError;
use crate::batch::EncodedBatch;
use crate::cluster::ClusterId;
use crate::keys::TopicName;
use crate::limits::Limits;

/// What the driver must do after a frame.
#[derive(Debug)]
#[must_use]
pub enum IngestAction {
    /// Open (creating if needed) `topic` with the edge's settings, then send
    /// [`IngestStream::welcome`].
    Open(Hello, TopicName),
    /// Append this verified batch at its own offsets.
    Append(EncodedBatch),
    /// Send this error frame and close; nothing was stored.
    Refuse(Frame),
    /// The edge declares offsets it holds no record for: record the hole
    /// and skip the central WAL to its end, then acknowledge `end_offset`.
    DeclareHole(DeclaredHole),
    /// One verified batch re-sent for a refetch request.
    Repair(RepairBatch),
    /// The edge holds no readable copy of a requested range.
    RefetchUnavailable {
        /// First offset of the requested range.
        first_offset: u64,
        /// Its exclusive end.
        end_offset: u64,
        /// The edge WAL's first offset.
        log_start: u64,
    },
    /// The edge's WAL for the topic stands at this high-water mark (a
    /// `Progress` frame after the broker's `ProgressRequest`); nothing to
    /// store or acknowledge.
    Progress {
        /// The edge's high-water mark.
        high_water_mark: u64,
    },
}

/// A batch the edge re-sent for the refetch of
/// `first_offset..end_offset`, checked to continue the answer exactly.
#[derive(Debug, Clone, PartialEq)]
pub struct RepairBatch {
    /// First offset of the requested range.
    pub first_offset: u64,
    /// Its exclusive end.
    pub end_offset: u64,
    /// The batch (CRC-verified, records walked).
    pub batch: EncodedBatch,
    /// This batch ends the range: every batch of it has arrived.
    pub complete: bool,
}

/// A hole the edge declared with a `Hole` frame, accepted at the stream's
/// next expected offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeclaredHole {
    /// First offset (the next expected offset when it was accepted).
    pub first_offset: u64,
    /// Exclusive end: the next batch starts here.
    pub end_offset: u64,
    /// Why the edge cannot send the range.
    pub cause: HoleCause,
    /// The edge's detail.
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    AwaitHello,
    AwaitOpen,
    Streaming { expected: u64 },
    Closed,
}

/// One topic's stream, broker side.
#[derive(Debug)]
pub struct IngestStream {
    identity: String,
    limits: Limits,
    state: State,
    /// The accepted Hello asked for acknowledgement datagrams.
    ack_datagrams: bool,
    /// The accepted Hello offered `Progress` frames.
    progress_offered: bool,
    /// The Hello asked for the central log's last batch (`Tip`).
    tip_offered: bool,
    /// The Hello asked for the cluster's id and it was not sent yet.
    cluster_id_wanted: bool,
    /// A `ProgressRequest` was sent: `Progress` frames are welcome.
    progress_requested: bool,
    /// Refetch requests sent and not fully answered, oldest first:
    /// `(first_offset, end_offset, next offset of the answer)`.
    refetches: std::collections::VecDeque<(u64, u64, u64)>,
}

/// How one stream's durable batches are acknowledged: always with an `Ack`
/// frame on the stream, and with an [`AckDatagram`] too when the edge's
/// Hello asked for them. `Copy`, so the task that waits for durability
/// holds its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Acknowledger {
    stream_id: u64,
    datagrams: bool,
}

/// What to send once a batch is durable.
#[derive(Debug, Clone, PartialEq)]
#[must_use]
pub struct Acknowledgement {
    /// The `Ack` frame, on the stream.
    pub frame: Frame,
    /// Its copy as a QUIC datagram (best effort), if the edge reads them.
    pub datagram: Option<AckDatagram>,
}

impl Acknowledger {
    /// The answer once a batch ending at `next_offset` is durable (appended
    /// or found to be a duplicate).
    pub fn on_stored(&self, next_offset: u64) -> Acknowledgement {
        Acknowledgement {
            frame: Frame::Ack { next_offset },
            datagram: self.datagrams.then_some(AckDatagram {
                stream_id: self.stream_id,
                next_offset,
            }),
        }
    }
}

fn refuse(code: ErrorCode, message: impl Into<String>) -> IngestAction {
    IngestAction::Refuse(Frame::Error {
        code,
        message: message.into(),
    })
}

impl IngestStream {
    /// A stream from the edge whose verified certificate identity is
    /// `identity` (it may write only to the namespace of the same name).
    pub fn new(identity: String, limits: Limits) -> IngestStream {
        IngestStream {
            identity,
            limits,
            state: State::AwaitHello,
            ack_datagrams: false,
            progress_offered: false,
            tip_offered: false,
            cluster_id_wanted: false,
            progress_requested: false,
            refetches: std::collections::VecDeque::new(),
        }
    }

    /// Handles one frame from the edge.
    pub fn on_frame(&mut self, frame: Frame) -> IngestAction {
        let action = self.handle(frame);
        if matches!(action, IngestAction::Refuse(_)) {
            self.state = State::Closed;
        }
        action
    }

    fn handle(&mut self, frame: Frame) -> IngestAction {
        match (&self.state, frame) {
            (State::AwaitHello, Frame::Hello(hello)) => {
                if hello.protocol != PROTOCOL_VERSION {
                    return refuse(
                        ErrorCode::UnsupportedProtocol,
                        format!(
                            "the edge speaks replication protocol {} and this broker {PROTOCOL_VERSION}; \
                             upgrade the {} (protocol 2 carries topic ownership and the archived offset)",
                            hello.protocol,
                            if hello.protocol < PROTOCOL_VERSION {
                                "edge agent"
                            } else {
                                "broker"
                            }
                        ),
                    );
                }
                let topic = match TopicName::new(&hello.topic) {
                    Ok(topic) => topic,
                    Err(e) => return refuse(ErrorCode::InvalidTopic, e.to_string()),
                };
                if let Some(why) = crate::keys::reserved_edge_id(&self.identity) {
                    return refuse(
                        ErrorCode::NotOwner,
                        format!("edge {:?} may not replicate: {why}", self.identity),
                    );
                }
                if topic.namespace() != self.identity {
                    return refuse(
                        ErrorCode::NotOwner,
                        format!(
                            "edge {:?} may write only to namespace {:?}, not {:?}",
                            self.identity,
                            self.identity,
                            topic.namespace()
                        ),
                    );
                }
                self.state = State::AwaitOpen;
                self.ack_datagrams = hello.ack_datagrams;
                self.progress_offered = hello.progress;
                self.tip_offered = hello.tip;
                self.cluster_id_wanted = hello.cluster_id;
                IngestAction::Open(hello, topic)
            }
            (State::Streaming { .. }, Frame::Batch { codec, payload }) => {
                self.verify_batch(codec, payload)
            }
            (
                &State::Streaming { expected },
                Frame::Hole {
                    first_offset,
                    end_offset,
                    cause,
                    reason,
                },
            ) => {
                if first_offset > expected {
                    return refuse(
                        ErrorCode::Gap,
                        format!("gap: expected offset {expected}, hole starts at {first_offset}"),
                    );
                }
                if first_offset < expected {
                    return refuse(
                        ErrorCode::Overlap,
                        format!(
                            "hole {first_offset}..{end_offset} starts below the next expected offset {expected}"
                        ),
                    );
                }
                self.state = State::Streaming {
                    expected: end_offset,
                };
                IngestAction::DeclareHole(DeclaredHole {
                    first_offset,
                    end_offset,
                    cause,
                    reason,
                })
            }
            (State::Streaming { .. }, Frame::Repair { codec, payload }) => {
                self.verify_repair(codec, payload)
            }
            (
                State::Streaming { .. },
                Frame::RefetchUnavailable {
                    first_offset,
                    end_offset,
                    log_start,
                },
            ) => match self.refetches.front() {
                Some(&(first, end, _)) if (first, end) == (first_offset, end_offset) => {
                    self.refetches.pop_front();
                    IngestAction::RefetchUnavailable {
                        first_offset,
                        end_offset,
                        log_start,
                    }
                }
                other => refuse(
                    ErrorCode::Malformed,
                    format!(
                        "refetch_unavailable for {first_offset}..{end_offset}, oldest request {other:?}"
                    ),
                ),
            },
            (State::Streaming { .. }, Frame::Progress { high_water_mark })
                if self.progress_requested =>
            {
                IngestAction::Progress { high_water_mark }
            }
            (_, Frame::Error { code, message }) => {
                refuse(code, format!("edge closed the stream: {message}"))
            }
            (state, _) => refuse(
                ErrorCode::Malformed,
                format!("unexpected frame in state {state:?}"),
            ),
        }
    }

    fn verify_batch(&mut self, codec: WireCodec, payload: bytes::Bytes) -> IngestAction {
        let State::Streaming { expected } = self.state else {
            return refuse(ErrorCode::Malformed, "batch before welcome");
        };
        let batch = match open_batch(codec, payload, &self.limits) {
            Ok(batch) => batch,
            Err(e) => {
                let code = match &e {
                    BatchFrameError::Batch(
                        DecodeError::Limit(_) | DecodeError::LengthOutOfBounds { .. },
                    ) => ErrorCode::TooLarge,
                    _ => ErrorCode::Corrupt,
                };
                return refuse(code, e.to_string());
            }
        };
        // Walk the records too: a CRC-valid batch can still hold a record
        // over `max_record_bytes` or a malformed records section.
        if let Err(e) = batch.decode(&self.limits) {
            let code = match e {
                DecodeError::Limit(_) => ErrorCode::TooLarge,
                _ => ErrorCode::Corrupt,
            };
            return refuse(code, e.to_string());
        }
        if batch.base_offset() > expected {
            return refuse(
                ErrorCode::Gap,
                format!(
                    "gap: expected offset {expected}, batch starts at {}",
                    batch.base_offset()
                ),
            );
        }
        // Batches are enqueued in order before earlier ones are durable
        // (pipelining), so the expectation moves on acceptance.
        self.state = State::Streaming {
            expected: expected.max(batch.next_offset()),
        };
        IngestAction::Append(batch)
    }

    fn verify_repair(&mut self, codec: WireCodec, payload: bytes::Bytes) -> IngestAction {
        let Some(&(first_offset, end_offset, next)) = self.refetches.front() else {
            return refuse(
                ErrorCode::Malformed,
                "repair batch without a refetch request",
            );
        };
        let batch = match open_batch(codec, payload, &self.limits) {
            Ok(batch) => batch,
            Err(e) => return refuse(ErrorCode::Corrupt, format!("repair batch: {e}")),
        };
        if let Err(e) = batch.decode(&self.limits) {
            return refuse(ErrorCode::Corrupt, format!("repair batch: {e}"));
        }
        if batch.base_offset() != next || batch.next_offset() > end_offset {
            return refuse(
                ErrorCode::Malformed,
                format!(
                    "repair batch {}..{} does not continue the answer to {first_offset}..{end_offset} at {next}",
                    batch.base_offset(),
                    batch.next_offset()
                ),
            );
        }
        let complete = batch.next_offset() == end_offset;
        if complete {
            self.refetches.pop_front();
        } else if let Some(front) = self.refetches.front_mut() {
            front.2 = batch.next_offset();
        }
        IngestAction::Repair(RepairBatch {
            first_offset,
            end_offset,
            batch,
            complete,
        })
    }

    /// The `Refetch` frame asking the edge to re-send
    /// `first_offset..end_offset` (a damaged range of the central WAL),
    /// recorded as waiting for its answer. `None` (send nothing) before the
    /// `Welcome`, for an empty range, for a range past what the stream has
    /// accepted, or while the same range already waits.
    pub fn refetch(&mut self, first_offset: u64, end_offset: u64) -> Option<Frame> {
        let State::Streaming { expected } = self.state else {
            return None;
        };
        if end_offset <= first_offset
            || end_offset > expected
            || self
                .refetches
                .iter()
                .any(|&(f, e, _)| (f, e) == (first_offset, end_offset))
        {
            return None;
        }
        self.refetches
            .push_back((first_offset, end_offset, first_offset));
        Some(Frame::Refetch {
            first_offset,
            end_offset,
        })
    }

    /// Refetch requests sent and not fully answered.
    pub fn pending_refetches(&self) -> usize {
        self.refetches.len()
    }

    /// The `Redirect` frame to send instead of the welcome when another
    /// broker owns the topic; the stream is then closed (finish it after
    /// sending).
    pub fn redirect(&mut self, redirect: Redirect) -> Frame {
        self.state = State::Closed;
        Frame::Redirect(redirect)
    }

    /// The `Archived` frame telling the edge that everything below
    /// `archived_offset` is committed in the archive; `None` before the
    /// welcome or above what the stream accepted (the edge would refuse it:
    /// an archive end above a new owner's high-water mark is clamped by the
    /// caller).
    pub fn archived(&self, archived_offset: u64) -> Option<Frame> {
        match self.state {
            State::Streaming { expected } if archived_offset <= expected => {
                Some(Frame::Archived { archived_offset })
            }
            _ => None,
        }
    }

    /// The `ProgressRequest` frame asking the edge for its high-water mark
    /// at most once per `interval_ms` (at least 1), when its Hello offered
    /// `Progress` frames and none was asked for yet; `None` (send nothing)
    /// before the welcome, for an edge that did not offer them (it
    /// predates them and would refuse the frame), or when already asked.
    pub fn progress_request(&mut self, interval_ms: u32) -> Option<Frame> {
        if !matches!(self.state, State::Streaming { .. })
            || !self.progress_offered
            || self.progress_requested
        {
            return None;
        }
        self.progress_requested = true;
        Some(Frame::ProgressRequest {
            interval_ms: interval_ms.max(1),
        })
    }

    /// The `Tip` frame naming the central log's last batch (`base_offset`,
    /// `next_offset`, `crc32c`), to send just before the welcome; `None`
    /// (send nothing) when the Hello did not ask for it (an edge that
    /// predates it would refuse the frame) or after the welcome.
    pub fn tip(&self, base_offset: u64, next_offset: u64, crc32c: u32) -> Option<Frame> {
        self.wants_tip().then_some(Frame::Tip {
            base_offset,
            next_offset,
            crc32c,
        })
    }

    /// Whether [`IngestStream::tip`] would return a frame: the Hello asked
    /// for it and the welcome was not sent yet.
    pub fn wants_tip(&self) -> bool {
        self.tip_offered && !matches!(self.state, State::Streaming { .. })
    }

    /// The `ClusterId` frame naming the cluster this broker belongs to, to
    /// send first after an accepted Hello (before `Tip`, `Welcome` or
    /// `Redirect`); `None` (send nothing) when the Hello did not ask for it
    /// (an edge that predates it would refuse the frame), before the Hello,
    /// or when it was sent already.
    pub fn cluster_id(&mut self, id: ClusterId) -> Option<Frame> {
        if !self.wants_cluster_id() {
            return None;
        }
        self.cluster_id_wanted = false;
        Some(Frame::ClusterId { id })
    }

    /// Whether [`IngestStream::cluster_id`] would return a frame: the
    /// accepted Hello asked for the id, nothing was sent on the stream yet.
    pub fn wants_cluster_id(&self) -> bool {
        self.cluster_id_wanted && self.state == State::AwaitOpen
    }

    /// The welcome frame once the topic is open with `high_water_mark`.
    pub fn welcome(&mut self, high_water_mark: u64) -> Frame {
        self.state = State::Streaming {
            expected: high_water_mark,
        };
        Frame::Welcome { high_water_mark }
    }

    /// How batches of this stream (QUIC stream id `stream_id`, which the
    /// datagrams name) are acknowledged: with datagrams too once an accepted
    /// Hello asked for them, with frames only before that.
    pub fn acknowledger(&self, stream_id: u64) -> Acknowledger {
        Acknowledger {
            stream_id,
            datagrams: self.ack_datagrams,
        }
    }
}
