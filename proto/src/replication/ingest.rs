//! The broker side of one topic's replication stream, without I/O.
//!
//! Calling contract (the broker's ingest driver):
//! 1. feed every received frame to [`IngestStream::on_frame`] and carry out
//!    the returned [`IngestAction`];
//! 2. for [`IngestAction::Open`]: load or create the central topic with the
//!    edge's settings, then send [`IngestStream::welcome`] with the topic's
//!    high-water mark;
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
//!    start at its end.

use super::frame::{
    AckDatagram, BatchFrameError, ErrorCode, Frame, Hello, HoleCause, PROTOCOL_VERSION, WireCodec,
    open_batch,
};
use crate::batch::DecodeError;
use crate::batch::EncodedBatch;
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
                        ErrorCode::Malformed,
                        format!(
                            "protocol {} not supported (this broker speaks {PROTOCOL_VERSION})",
                            hello.protocol
                        ),
                    );
                }
                let topic = match TopicName::new(&hello.topic) {
                    Ok(topic) => topic,
                    Err(e) => return refuse(ErrorCode::InvalidTopic, e.to_string()),
                };
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
