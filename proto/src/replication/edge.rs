//! The edge side of one topic's replication stream, without I/O.
//!
//! Calling contract (the driver in the edge agent):
//! 1. open a stream, send [`EdgeStream::hello`];
//! 2. feed every received frame to [`EdgeStream::on_frame`];
//! 3. while [`EdgeStream::next_to_send`] returns an offset, read the WAL
//!    batch starting exactly there, send it, and report it with
//!    [`EdgeStream::on_sent`];
//!    When the local WAL cannot read the range at that offset (damaged
//!    bytes or offsets lost at the edge), send
//!    [`EdgeStream::hole`] for it instead: it is tracked like a sent batch
//!    and acknowledged like one, and sending continues after it;
//! 4. after an [`EdgeEvent::Acked`], record the checkpoint (an acknowledged
//!    hole counts as replicated);
//! 5. feed acknowledgements that arrive in QUIC datagrams
//!    ([`AckDatagram`](super::frame::AckDatagram)) to
//!    [`EdgeStream::on_datagram_ack`]: whichever copy of an acknowledgement
//!    comes first advances the stream, the other is
//!    [`EdgeEvent::AlreadyAcked`].
//!
//! 6. after an [`EdgeEvent::Refetch`] (the broker's copy of an acknowledged
//!    range is damaged), ask [`EdgeStream::answer_refetch`]: for
//!    [`RefetchAnswer::Resend`] read the range from the local WAL and send
//!    each batch as [`Frame::repair`], reporting it with
//!    [`EdgeStream::on_repair_sent`]; if the WAL cannot read all of it, or
//!    for [`RefetchAnswer::Unavailable`], send
//!    [`EdgeStream::refetch_unavailable`]'s frame. Requests are answered in
//!    the order they came; repairs take no room in the window and are not
//!    acknowledged.
//!
//! 7. after an [`EdgeEvent::ProgressRequested`], send
//!    [`EdgeStream::progress`]'s frame (when it returns one) at once and
//!    then at most once per the requested interval: the broker learns the
//!    local high-water mark, so it can show this edge's lag.
//!
//! 8. after an [`EdgeEvent::ClusterId`] (streams made
//!    [`EdgeStream::with_cluster_check`]), compare the id with the one the
//!    edge keeps (storing it durably when there is none yet) *before*
//!    feeding the next frame: on a mismatch stop with
//!    [`EdgeError::OtherCluster`], so no `Welcome`, `Ack` or `Archived` of
//!    that cluster is ever applied.
//!
//! A new connection starts a new `EdgeStream`: the broker's `Welcome` is
//! authoritative for where to resume.

use std::collections::VecDeque;

use super::frame::{ErrorCode, Frame, Hello, HoleCause, PROTOCOL_VERSION, Redirect};
use crate::batch::BatchHeader;
use crate::cluster::ClusterId;
use crate::intent::ExpandedStreamSettings;

/// What an unacknowledged `Hole` frame counts for in the window, bytes.
const HOLE_WINDOW_BYTES: usize = 64;

/// Limits on what is in flight: batches sent but not yet acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// Most batches in flight.
    pub batches: usize,
    /// Most bytes in flight (a single larger batch is still sent alone).
    pub bytes: usize,
}

impl Default for Window {
    fn default() -> Self {
        Window {
            batches: 64,
            bytes: 8 * 1024 * 1024,
        }
    }
}

/// What a received frame meant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum EdgeEvent {
    /// The broker holds everything below `from`; sending resumes there.
    Resumed {
        /// First offset to send.
        from: u64,
    },
    /// Everything below `next_offset` is durable centrally.
    Acked {
        /// Exclusive end of the acknowledged range.
        next_offset: u64,
    },
    /// An acknowledgement already known from its other copy (the `Ack`
    /// frame after the datagram, or the reverse) or superseded by a later
    /// one: nothing to record.
    AlreadyAcked,
    /// Everything below `archived_offset` is committed in the archive
    /// (clamped to what this stream saw acknowledged): local retention may
    /// delete below it. It only rises; a lower value is not reported again.
    Archived {
        /// Exclusive end of the archived range.
        archived_offset: u64,
    },
    /// The broker's copy of `first_offset..end_offset` (acknowledged) is
    /// damaged: answer with [`EdgeStream::answer_refetch`].
    Refetch {
        /// First offset of the damaged range.
        first_offset: u64,
        /// Its exclusive end.
        end_offset: u64,
    },
    /// The broker asks for the local high-water mark: send
    /// [`EdgeStream::progress`]'s frames, at most once per `interval_ms`.
    ProgressRequested {
        /// Shortest time between two `Progress` frames, ms.
        interval_ms: u32,
    },
    /// Before its `Welcome` (streams made [`EdgeStream::with_tip_check`]):
    /// the central log's last batch. The driver reads the local batch at
    /// `base_offset`; when the local WAL holds that offset but no batch
    /// starts there with this CRC, the broker's records are not this
    /// edge's: stop with [`EdgeError::Diverged`].
    Tip {
        /// The central batch's base offset.
        base_offset: u64,
        /// Its next offset.
        next_offset: u64,
        /// Its CRC-32C.
        crc32c: u32,
    },
    /// Before anything else of the stream (streams made
    /// [`EdgeStream::with_cluster_check`], from a broker that knows the
    /// field): the id of the cluster the broker belongs to. The driver
    /// checks it against the edge's own record before the next frame.
    ClusterId {
        /// The broker's cluster id.
        id: ClusterId,
    },
}

/// How the edge answers a [`EdgeEvent::Refetch`].
#[derive(Debug, Clone, PartialEq)]
#[must_use]
pub enum RefetchAnswer {
    /// Read `first_offset..end_offset` from the local WAL and send each
    /// batch as a `Repair` frame.
    Resend {
        /// First offset to read (a batch starts exactly here).
        first_offset: u64,
        /// Exclusive end (the last batch ends exactly here).
        end_offset: u64,
    },
    /// The local WAL no longer holds the range: send this
    /// `RefetchUnavailable` frame.
    Unavailable(Frame),
}

/// Replication failures seen by the edge.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EdgeError {
    /// The broker refused or closed the stream.
    #[error("broker refused ({code:?}): {message}")]
    Refused {
        /// Its code.
        code: ErrorCode,
        /// Its message.
        message: String,
    },
    /// The broker claims more records than this edge ever wrote: the edge's
    /// log was lost or replaced. Needs an operator.
    #[error("broker holds offsets up to {broker} but the local log ends at {local}")]
    BrokerAhead {
        /// Broker high-water mark.
        broker: u64,
        /// Local high-water mark.
        local: u64,
    },
    /// The central log's last batch (a [`EdgeEvent::Tip`]) is not the
    /// local batch at the same offset: the broker's records there came
    /// from another log (a second device with this identity, or this
    /// device's log replaced). Nothing is sent or acknowledged; the local
    /// records stay. Needs an operator.
    #[error(
        "the broker's records at offsets {base_offset}..{next_offset} are not this edge's ({reason}): \
         another device replicates this topic with the same edge id, or this device's log was \
         replaced; nothing is sent and the local records are kept"
    )]
    Diverged {
        /// Base offset of the central batch.
        base_offset: u64,
        /// Its next offset.
        next_offset: u64,
        /// What the local log holds there instead.
        reason: String,
    },
    /// The broker belongs to another cluster than the one this edge's
    /// checkpoints and archived offsets came from (its `brokers` now name
    /// another cluster). Nothing is sent, no acknowledgement is applied,
    /// the local records and checkpoints stay. Needs an operator.
    #[error(
        "the broker at {broker} belongs to cluster {found}, but this edge's checkpoints and archived \
         offsets came from cluster {expected}: nothing is sent or acknowledged and the local records \
         and checkpoints are kept. Point `brokers` back at cluster {expected}; to move this edge to \
         cluster {found} on purpose, let it drain to {expected} first, then start it with a fresh \
         data directory (docs/edge-agent.md, \"Moving an edge to another cluster\")"
    )]
    OtherCluster {
        /// The cluster id the edge keeps (`/edge/cluster`).
        expected: ClusterId,
        /// The id the broker sent.
        found: ClusterId,
        /// The broker's address, as the edge reached it.
        broker: String,
    },
    /// The broker needs records the edge already deleted (only possible if
    /// the central topic lost data or `drop_oldest` dropped unreplicated
    /// records).
    #[error("broker resumes at {broker} but the local log starts at {local_start}")]
    LocalDataMissing {
        /// Broker high-water mark.
        broker: u64,
        /// First local offset.
        local_start: u64,
    },
    /// The broker does not own the topic; `Redirect` names the broker
    /// that does. Not a failure: open the topic's stream there.
    #[error("topic owned by broker {} at {} (epoch {})", .0.broker_id, .0.ingest_addr, .0.epoch)]
    Redirected(Redirect),
    /// The broker broke the protocol.
    #[error("protocol violation: {0}")]
    Protocol(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    AwaitWelcome,
    Streaming,
}

#[derive(Debug, Clone, Copy)]
struct InFlight {
    next_offset: u64,
    bytes: usize,
}

/// One topic's stream, edge side.
#[derive(Debug)]
pub struct EdgeStream {
    topic: String,
    settings: Option<ExpandedStreamSettings>,
    window: Window,
    state: State,
    next_send: u64,
    /// Highest acknowledgement from either path.
    acked: u64,
    /// Highest `Ack` frame on the stream (which must rise strictly).
    stream_acked: u64,
    /// Highest archived offset the broker reported on this stream.
    archived: u64,
    in_flight: VecDeque<InFlight>,
    in_flight_bytes: usize,
    /// The Hello asks for the central log's last batch ([`Frame::Tip`]).
    tip_check: bool,
    /// The Hello asks for the cluster's id ([`Frame::ClusterId`]).
    cluster_check: bool,
    /// A `ClusterId` frame arrived, or another frame did first (an older
    /// broker): none may come any more.
    cluster_id_closed: bool,
    /// Refetch requests not yet answered, oldest first, with the next
    /// offset of the answer.
    refetches: VecDeque<(u64, u64, u64)>,
    /// The broker asked for `Progress` frames, at most one per this many ms.
    progress_interval_ms: Option<u32>,
    /// The high-water mark the last `Progress` frame carried.
    progress_sent: Option<u64>,
}

impl EdgeStream {
    /// A stream for `topic` (`/{ns}/{topic}`) with the topic's intent
    /// settings (`None` for an implicitly created topic).
    pub fn new(
        topic: String,
        settings: Option<ExpandedStreamSettings>,
        window: Window,
    ) -> EdgeStream {
        EdgeStream {
            topic,
            settings,
            window,
            state: State::AwaitWelcome,
            next_send: 0,
            acked: 0,
            stream_acked: 0,
            archived: 0,
            in_flight: VecDeque::new(),
            in_flight_bytes: 0,
            tip_check: false,
            cluster_check: false,
            cluster_id_closed: false,
            refetches: VecDeque::new(),
            progress_interval_ms: None,
            progress_sent: None,
        }
    }

    /// The same stream, asking the broker for the central log's last batch
    /// before its `Welcome` ([`EdgeEvent::Tip`]), which the driver must
    /// check against the local WAL.
    #[must_use]
    pub fn with_tip_check(mut self) -> EdgeStream {
        self.tip_check = true;
        self
    }

    /// The same stream, asking the broker for its cluster's id before
    /// anything else ([`EdgeEvent::ClusterId`]), which the driver must
    /// check against the id the edge keeps.
    #[must_use]
    pub fn with_cluster_check(mut self) -> EdgeStream {
        self.cluster_check = true;
        self
    }

    /// The first frame to send. It asks for acknowledgement datagrams (the
    /// driver must feed them to [`EdgeStream::on_datagram_ack`]) and offers
    /// `Progress` frames (see [`EdgeEvent::ProgressRequested`]).
    pub fn hello(&self) -> Frame {
        Frame::Hello(Hello {
            protocol: PROTOCOL_VERSION,
            topic: self.topic.clone(),
            settings: self.settings.clone(),
            ack_datagrams: true,
            progress: true,
            tip: self.tip_check,
            cluster_id: self.cluster_check,
        })
    }

    /// Handles a frame from the broker. `local_start` and `local_hwm` are
    /// the local WAL's first offset and high-water mark.
    ///
    /// # Errors
    /// [`EdgeError`]; the stream must then be closed.
    pub fn on_frame(
        &mut self,
        frame: Frame,
        local_start: u64,
        local_hwm: u64,
    ) -> Result<EdgeEvent, EdgeError> {
        // The id comes first or never (an older broker sends none).
        let cluster_id_open = self.cluster_check && !self.cluster_id_closed;
        self.cluster_id_closed = true;
        match (self.state, frame) {
            (State::AwaitWelcome, Frame::ClusterId { id }) if cluster_id_open => {
                Ok(EdgeEvent::ClusterId { id })
            }
            (State::AwaitWelcome, Frame::Welcome { high_water_mark }) => {
                if high_water_mark > local_hwm {
                    return Err(EdgeError::BrokerAhead {
                        broker: high_water_mark,
                        local: local_hwm,
                    });
                }
                if high_water_mark < local_start {
                    return Err(EdgeError::LocalDataMissing {
                        broker: high_water_mark,
                        local_start,
                    });
                }
                Ok(self.resume(high_water_mark))
            }
            (
                State::AwaitWelcome,
                Frame::Tip {
                    base_offset,
                    next_offset,
                    crc32c,
                },
            ) if self.tip_check => Ok(EdgeEvent::Tip {
                base_offset,
                next_offset,
                crc32c,
            }),
            (State::AwaitWelcome, Frame::Redirect(redirect)) => {
                Err(EdgeError::Redirected(redirect))
            }
            (State::Streaming, Frame::Archived { archived_offset }) => {
                // An `Ack` still in flight on the other path may be below
                // it: count only what this stream saw acknowledged.
                let archived_offset = archived_offset.min(self.acked);
                if archived_offset <= self.archived {
                    return Ok(EdgeEvent::AlreadyAcked);
                }
                self.archived = archived_offset;
                Ok(EdgeEvent::Archived { archived_offset })
            }
            (State::Streaming, Frame::Ack { next_offset }) => {
                if next_offset <= self.stream_acked || next_offset > self.sent_end() {
                    return Err(EdgeError::Protocol(format!(
                        "ack {next_offset} outside ({}, {}]",
                        self.stream_acked,
                        self.sent_end()
                    )));
                }
                self.stream_acked = next_offset;
                Ok(self.advance(next_offset))
            }
            (
                State::Streaming,
                Frame::Refetch {
                    first_offset,
                    end_offset,
                },
            ) => {
                if end_offset > self.acked {
                    return Err(EdgeError::Protocol(format!(
                        "refetch of {first_offset}..{end_offset}, beyond the acknowledged {}",
                        self.acked
                    )));
                }
                self.refetches
                    .push_back((first_offset, end_offset, first_offset));
                Ok(EdgeEvent::Refetch {
                    first_offset,
                    end_offset,
                })
            }
            (State::Streaming, Frame::ProgressRequest { interval_ms }) => {
                self.progress_interval_ms = Some(interval_ms);
                Ok(EdgeEvent::ProgressRequested { interval_ms })
            }
            (_, Frame::Error { code, message }) => Err(EdgeError::Refused { code, message }),
            (state, frame) => Err(EdgeError::Protocol(format!(
                "unexpected {} in state {state:?}",
                frame_name(&frame)
            ))),
        }
    }

    /// Handles an acknowledgement that arrived in a QUIC datagram
    /// ([`AckDatagram`](super::frame::AckDatagram)) for this stream.
    /// Datagrams may come late, twice or out of order: one at or below what
    /// is already acknowledged is [`EdgeEvent::AlreadyAcked`].
    ///
    /// # Errors
    /// [`EdgeError::Protocol`] before the `Welcome` or for an offset beyond
    /// what was sent; the stream must then be closed.
    pub fn on_datagram_ack(&mut self, next_offset: u64) -> Result<EdgeEvent, EdgeError> {
        if self.state != State::Streaming || next_offset > self.sent_end() {
            return Err(EdgeError::Protocol(format!(
                "ack datagram {next_offset} in state {:?} with offsets below {} sent",
                self.state,
                self.sent_end()
            )));
        }
        Ok(self.advance(next_offset))
    }

    /// Exclusive end of what was sent.
    fn sent_end(&self) -> u64 {
        self.in_flight.back().map_or(self.acked, |f| f.next_offset)
    }

    /// Moves the acknowledged offset up to `next_offset` (validated by the
    /// caller) and releases the window.
    fn advance(&mut self, next_offset: u64) -> EdgeEvent {
        if next_offset <= self.acked {
            return EdgeEvent::AlreadyAcked;
        }
        while let Some(front) = self.in_flight.front() {
            if front.next_offset > next_offset {
                break;
            }
            self.in_flight_bytes -= front.bytes;
            self.in_flight.pop_front();
        }
        self.acked = next_offset;
        EdgeEvent::Acked { next_offset }
    }

    /// The offset whose batch should be sent next, if the window allows and
    /// the local log has it (`local_hwm` is the local high-water mark).
    pub fn next_to_send(&self, local_hwm: u64) -> Option<u64> {
        let window_open = self.in_flight.is_empty()
            || (self.in_flight.len() < self.window.batches
                && self.in_flight_bytes < self.window.bytes);
        (self.state == State::Streaming && window_open && self.next_send < local_hwm)
            .then_some(self.next_send)
    }

    /// Records that the batch with `header` (`bytes` on the wire) was sent.
    ///
    /// # Panics
    /// If the batch does not start at the offset [`EdgeStream::next_to_send`]
    /// named: sending anything else would corrupt the central log.
    pub fn on_sent(&mut self, header: &BatchHeader, bytes: usize) {
        assert_eq!(
            header.base_offset, self.next_send,
            "replication invariant: batches are sent contiguously"
        );
        self.next_send = header.next_offset();
        self.in_flight.push_back(InFlight {
            next_offset: self.next_send,
            bytes,
        });
        self.in_flight_bytes += bytes;
    }

    /// After [`EdgeError::LocalDataMissing`] for the `Welcome` at
    /// `high_water_mark`: resumes there anyway, the driver having found
    /// that the offsets from there to the local log's start were never
    /// acknowledged and are gone locally (dropped under
    /// `full_policy = "drop_oldest"`, or lost). It must declare them first,
    /// with [`EdgeStream::hole`] at [`EdgeStream::next_to_send`].
    ///
    /// # Errors
    /// [`EdgeError::Protocol`] unless the stream awaits its `Welcome`;
    /// [`EdgeError::BrokerAhead`] past `local_hwm`.
    pub fn resume_over_missing(
        &mut self,
        high_water_mark: u64,
        local_hwm: u64,
    ) -> Result<EdgeEvent, EdgeError> {
        if self.state != State::AwaitWelcome {
            return Err(EdgeError::Protocol(
                "resume without a pending Welcome".into(),
            ));
        }
        if high_water_mark > local_hwm {
            return Err(EdgeError::BrokerAhead {
                broker: high_water_mark,
                local: local_hwm,
            });
        }
        Ok(self.resume(high_water_mark))
    }

    fn resume(&mut self, high_water_mark: u64) -> EdgeEvent {
        self.state = State::Streaming;
        self.next_send = high_water_mark;
        self.acked = high_water_mark;
        self.stream_acked = high_water_mark;
        EdgeEvent::Resumed {
            from: high_water_mark,
        }
    }

    /// The `Hole` frame declaring `next_to_send..end_offset` (offsets the
    /// local WAL cannot read) to the broker, recorded as sent: the broker
    /// acknowledges it like a batch, and the next batch sent starts at
    /// `end_offset`.
    ///
    /// # Panics
    /// If `first_offset` is not the offset [`EdgeStream::next_to_send`]
    /// named or the range is empty: the broker accepts a hole only at its
    /// next expected offset.
    pub fn hole(
        &mut self,
        first_offset: u64,
        end_offset: u64,
        cause: HoleCause,
        reason: String,
    ) -> Frame {
        assert_eq!(
            first_offset, self.next_send,
            "replication invariant: a hole starts where the last batch ended"
        );
        assert!(
            end_offset > first_offset,
            "a hole holds at least one offset"
        );
        self.next_send = end_offset;
        self.in_flight.push_back(InFlight {
            next_offset: end_offset,
            bytes: HOLE_WINDOW_BYTES,
        });
        self.in_flight_bytes += HOLE_WINDOW_BYTES;
        Frame::Hole {
            first_offset,
            end_offset,
            cause,
            reason,
        }
    }

    /// How to answer the oldest unanswered refetch request, given the local
    /// WAL's first offset: re-send it if the WAL still starts at or below
    /// it, else say it is gone. `None` if no request waits.
    pub fn answer_refetch(&mut self, local_start: u64) -> Option<RefetchAnswer> {
        let &(first_offset, end_offset, _) = self.refetches.front()?;
        if local_start <= first_offset {
            return Some(RefetchAnswer::Resend {
                first_offset,
                end_offset,
            });
        }
        Some(RefetchAnswer::Unavailable(
            self.refetch_unavailable(local_start)?,
        ))
    }

    /// Records that the batch with `header` was sent as a `Repair` frame for
    /// the oldest refetch request; the request is answered once its end is
    /// reached.
    ///
    /// # Panics
    /// If the batch does not continue the answer exactly: the broker would
    /// refuse the stream.
    pub fn on_repair_sent(&mut self, header: &BatchHeader) {
        let front = self
            .refetches
            .front_mut()
            .expect("replication invariant: a repair answers a refetch request");
        assert!(
            header.base_offset == front.2 && header.next_offset() <= front.1,
            "replication invariant: repair batches cover the requested range contiguously"
        );
        front.2 = header.next_offset();
        if front.2 == front.1 {
            self.refetches.pop_front();
        }
    }

    /// The `RefetchUnavailable` frame answering the oldest refetch request
    /// (the local WAL starts at `local_start` or cannot read the range);
    /// the request is answered. `None` if no request waits.
    pub fn refetch_unavailable(&mut self, local_start: u64) -> Option<Frame> {
        let (first_offset, end_offset, _) = self.refetches.pop_front()?;
        Some(Frame::RefetchUnavailable {
            first_offset,
            end_offset,
            log_start: local_start,
        })
    }

    /// The `Progress` frame reporting `local_hwm` (the local WAL's
    /// high-water mark), if the broker asked for them and the value changed
    /// since the last one; recorded as sent. The driver calls it at most
    /// once per [`EdgeStream::progress_interval_ms`].
    pub fn progress(&mut self, local_hwm: u64) -> Option<Frame> {
        self.progress_interval_ms?;
        if self.progress_sent == Some(local_hwm) {
            return None;
        }
        self.progress_sent = Some(local_hwm);
        Some(Frame::Progress {
            high_water_mark: local_hwm,
        })
    }

    /// The interval the broker asked `Progress` frames at, ms; `None` until
    /// it asked (an older broker never does).
    pub fn progress_interval_ms(&self) -> Option<u32> {
        self.progress_interval_ms
    }

    /// Refetch requests not yet answered.
    pub fn pending_refetches(&self) -> usize {
        self.refetches.len()
    }

    /// Everything below this is durable centrally (as far as this stream
    /// knows).
    pub fn acked(&self) -> u64 {
        self.acked
    }

    /// Batches sent and not yet acknowledged.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Bytes the window still admits (at least 1, so one batch can always
    /// be read when the window is open).
    pub fn window_room_bytes(&self) -> usize {
        self.window
            .bytes
            .saturating_sub(self.in_flight_bytes)
            .max(1)
    }
}

fn frame_name(frame: &Frame) -> &'static str {
    match frame {
        Frame::Hello(_) => "hello",
        Frame::Welcome { .. } => "welcome",
        Frame::Batch { .. } => "batch",
        Frame::Ack { .. } => "ack",
        Frame::Error { .. } => "error",
        Frame::Hole { .. } => "hole",
        Frame::Refetch { .. } => "refetch",
        Frame::Repair { .. } => "repair",
        Frame::RefetchUnavailable { .. } => "refetch_unavailable",
        Frame::Redirect(_) => "redirect",
        Frame::Archived { .. } => "archived",
        Frame::ProgressRequest { .. } => "progress_request",
        Frame::Progress { .. } => "progress",
        Frame::Tip { .. } => "tip",
        Frame::ClusterId { .. } => "cluster_id",
    }
}
