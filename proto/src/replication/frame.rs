//! Replication frames: what edge and broker say to each other on one QUIC
//! stream per topic. Layout in `FORMAT.md` ("Replication stream").
//!
//! ```text
//! frame = u32 length (of type + payload, little-endian) | u8 type | payload
//! 1 Hello    JSON {"protocol":1,"topic":"/ns/t","settings":{ExpandedStreamSettings}|null,
//!            "ack_datagrams":true (optional),"progress":true (optional)}
//! 2 Welcome  u64 high_water_mark: the broker's next offset for the topic
//! 3 Batch    u8 wire codec (0 none, 1 zstd) | the record batch, verbatim
//!            (zstd-compressed as a whole when the codec is 1)
//! 4 Ack      u64 next_offset: everything below it is durable centrally
//! 5 Error    u16 code | UTF-8 message; the sender then finishes the stream
//! 6 Hole     u64 first_offset | u64 end_offset | u8 cause (0 damaged, 1 lost)
//!            | UTF-8 reason: the edge holds no record for
//!            [first_offset, end_offset) and never will
//! 7 Refetch  u64 first_offset | u64 end_offset (broker → edge): the broker's
//!            copy of this acknowledged range is damaged; send it again
//! 8 Repair   u8 wire codec | the record batch, as in Batch (edge → broker):
//!            one batch of a requested range, re-sent from the edge's WAL
//! 9 RefetchUnavailable u64 first_offset | u64 end_offset | u64 log_start
//!            (edge → broker): the edge holds no readable copy of the range
//!            (its log starts at log_start, or its own copy is damaged)
//! 10 Redirect JSON {"broker_id":2,"ingest_addr":"host:port","epoch":7}
//!            (broker → edge, instead of Welcome): another broker owns the
//!            topic; open the stream there. The stream then ends.
//! 11 Archived u64 archived_offset (broker → edge, any time after Welcome):
//!            everything below it is committed in the archive; the edge may
//!            delete its local copy below it
//! 12 ProgressRequest u32 interval_ms (broker → edge, after Welcome, only
//!            when the Hello set "progress"): report the local high-water
//!            mark in Progress frames, at most once per interval
//! 13 Progress u64 high_water_mark (edge → broker, only after a
//!            ProgressRequest): the edge WAL's next offset for the topic
//! 14 Tip      u64 base_offset | u64 next_offset | u32 crc32c (broker → edge,
//!            just before Welcome, only when the Hello set "tip"): the
//!            central log's last batch, so the edge can check that the
//!            records the broker holds are its own
//! 15 ClusterId 16 bytes: the cluster's id (broker → edge, first frame
//!            after the Hello, only when the Hello set "cluster_id"): the
//!            central cluster this stream's acknowledgements come from
//! ```
//!
//! Protocol version 2 added `Redirect`, `Archived` and the
//! `UnsupportedProtocol` error code. A broker refuses a `Hello` of another
//! version with `Error` code 10 (`UnsupportedProtocol`) naming both
//! versions, so an old edge stops with a clear error instead of trimming
//! its log on acknowledgements alone; a version-1 broker refuses a
//! version-2 `Hello` with its own "protocol 2 not supported".
//!
//! A `Refetch` names exactly a damaged range of the central WAL, below what
//! the broker acknowledged. The edge answers each, in the order asked, with
//! the `Repair` batches covering the range exactly (verbatim from its WAL,
//! so byte for byte what the broker first stored) or with one
//! `RefetchUnavailable`; neither is acknowledged and neither takes room in
//! the window. The broker verifies the batches and rewrites its segment.
//!
//! A `Hole` (edge → broker) takes the place of the batches of an offset range
//! the edge's WAL cannot read (damaged bytes, or acknowledged offsets
//! recovery found missing): it must start exactly at the broker's next
//! expected offset, the broker records it (WAL and Raft) and acknowledges
//! `end_offset` like a batch, and replication carries on after it. Offsets
//! are never reused: the range stays a declared hole from device to archive.
//!
//! Besides the stream, the broker repeats each acknowledgement in a QUIC
//! datagram (RFC 9221) on the same connection ([`AckDatagram`]) when the
//! edge's Hello says it reads them (`ack_datagrams`): unreliable
//! and unordered, so a lost one costs nothing and a later one is not held up
//! behind a lost stream packet. The `Ack` frame on the stream stays the
//! reliable path.
//!
//! `ProgressRequest` and `Progress` (fleet visibility: the broker learns the
//! edge's own high-water mark, so it can show the edge's lag) are an
//! addition within protocol 2, negotiated like the datagrams: an edge that
//! sends `Progress` frames says so in its `Hello` (`"progress":true`, which
//! older brokers ignore), and sends them only once the broker asked with a
//! `ProgressRequest`, which a broker sends only to such an edge. Neither
//! side ever receives a frame type it does not know.
//!
//! `Tip` (negotiated the same way): the central log's last batch, before
//! the `Welcome`; an edge whose own batch there differs (another device
//! under its identity) stops instead of taking those records for its own.
//!
//! `ClusterId` (negotiated the same way, `"cluster_id":true`): the id of
//! the central cluster ([`ClusterId`]), before anything else the broker
//! sends on the stream; an edge whose checkpoints belong to another
//! cluster stops instead of taking this one's offsets for them.
//!
//! Decoding is bounded: a frame longer than the decoder's limit is refused
//! before anything is allocated, and a zstd batch may not inflate beyond
//! `max_batch_bytes`.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use serde::{Deserialize, Serialize};

use crate::batch::{DecodeError, EncodedBatch};
use crate::cluster::{CLUSTER_ID_BYTES, ClusterId};
use crate::intent::ExpandedStreamSettings;
use crate::limits::Limits;

pub use super::datagram::{ACK_DATAGRAM_BYTES, AckDatagram};
pub use super::error_code::ErrorCode;

/// Protocol version carried in `Hello`: 2 since topic ownership
/// (`Redirect`, `Archived`).
pub const PROTOCOL_VERSION: u32 = 2;
/// Bytes of the frame header (length + type).
pub const FRAME_HEADER_BYTES: usize = 5;
/// Room for non-batch payload in a frame, bytes (Hello JSON, error text).
const CONTROL_FRAME_BYTES: u32 = 64 * 1024;

const HELLO: u8 = 1;
const WELCOME: u8 = 2;
const BATCH: u8 = 3;
const ACK: u8 = 4;
const ERROR: u8 = 5;
const HOLE: u8 = 6;
const REFETCH: u8 = 7;
const REPAIR: u8 = 8;
const REFETCH_UNAVAILABLE: u8 = 9;
const REDIRECT: u8 = 10;
const ARCHIVED: u8 = 11;
const PROGRESS_REQUEST: u8 = 12;
const PROGRESS: u8 = 13;
const TIP: u8 = 14;
const CLUSTER_ID: u8 = 15;
/// Bytes of a `Hole` payload before its reason.
const HOLE_FIXED_BYTES: usize = 17;

/// Why the edge declares a hole (the `cause` byte of a `Hole` frame).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoleCause {
    /// 0: the edge stores bytes for the range but they fail verification
    /// (CRC, header or offset checks).
    Damaged,
    /// 1: the edge stores nothing for the range: it was acknowledged locally
    /// and then lost (recovery found it missing), declared a hole earlier,
    /// or dropped under `full_policy = "drop_oldest"` before the broker had
    /// it.
    Lost,
}

impl HoleCause {
    fn to_u8(self) -> u8 {
        match self {
            HoleCause::Damaged => 0,
            HoleCause::Lost => 1,
        }
    }

    fn from_u8(byte: u8) -> Option<HoleCause> {
        match byte {
            0 => Some(HoleCause::Damaged),
            1 => Some(HoleCause::Lost),
            _ => None,
        }
    }

    /// `"damaged"` or `"lost"`, as recorded in metadata and shown by APIs.
    pub fn as_str(self) -> &'static str {
        match self {
            HoleCause::Damaged => "damaged",
            HoleCause::Lost => "lost",
        }
    }
}

/// The opening request of an edge for one topic.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hello {
    /// Always [`PROTOCOL_VERSION`].
    pub protocol: u32,
    /// `/{namespace}/{topic}`.
    pub topic: String,
    /// The edge topic's expanded intent settings, so the central topic is
    /// created with the same sync mode and policies; `None` for a topic the
    /// edge created implicitly (the broker creates it implicitly too, with
    /// the same broker fallback settings).
    pub settings: Option<ExpandedStreamSettings>,
    /// The edge reads acknowledgement datagrams ([`AckDatagram`]): the
    /// broker sends them for this stream only then. Absent (false) from
    /// edges that predate them, which never read datagrams; quinn would
    /// buffer them for such an edge until the connection ends.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ack_datagrams: bool,
    /// The edge reports its local high-water mark in `Progress` frames once
    /// the broker asks with a `ProgressRequest` (which the broker sends
    /// only then). Absent (false) from edges that predate them; older
    /// brokers ignore the field and never ask.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub progress: bool,
    /// The edge checks the central log's last batch against its own
    /// ([`Frame::Tip`], sent only then). Absent (false) from edges that
    /// predate it; older brokers ignore the field and send no `Tip`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tip: bool,
    /// The edge checks which cluster it replicates to
    /// ([`Frame::ClusterId`], sent only then). Absent (false) from edges
    /// that predate it; older brokers ignore the field and send none.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cluster_id: bool,
}

/// Where the owner of a topic takes its stream: the payload of
/// [`Frame::Redirect`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Redirect {
    /// The owning broker's id.
    pub broker_id: u64,
    /// Its ingest address, `host:port` (as it registered it at
    /// `/cluster/brokers/{id}/state`).
    pub ingest_addr: String,
    /// The ownership epoch of that assignment.
    pub epoch: u64,
}

/// How a batch travels on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WireCodec {
    /// The batch bytes as stored.
    None,
    /// The batch bytes compressed as one zstd frame.
    Zstd,
}

/// One frame.
#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    /// Edge → broker, first frame of a stream.
    Hello(Hello),
    /// Broker → edge: resume from this offset.
    Welcome {
        /// The broker's next offset for the topic.
        high_water_mark: u64,
    },
    /// Edge → broker: one record batch (wire form).
    Batch {
        /// How `payload` is encoded.
        codec: WireCodec,
        /// The batch bytes (compressed when `codec` is zstd).
        payload: Bytes,
    },
    /// Broker → edge: everything below `next_offset` is durable centrally.
    Ack {
        /// Exclusive end of the acknowledged range.
        next_offset: u64,
    },
    /// Either side: the stream ends with this error.
    Error {
        /// What kind of error.
        code: ErrorCode,
        /// Human-readable detail.
        message: String,
    },
    /// Edge → broker: no record exists, or ever will, for offsets
    /// `first_offset..end_offset`; the next batch starts at `end_offset`.
    Hole {
        /// First offset of the hole (the broker's next expected offset).
        first_offset: u64,
        /// Exclusive end; greater than `first_offset`.
        end_offset: u64,
        /// Why the edge cannot send these offsets.
        cause: HoleCause,
        /// Human-readable detail (what the edge's WAL reported), at most
        /// about 64 KiB.
        reason: String,
    },
    /// Broker → edge: send `first_offset..end_offset` again (a damaged
    /// range of the central copy, already acknowledged).
    Refetch {
        /// First offset of the damaged range.
        first_offset: u64,
        /// Exclusive end; greater than `first_offset`.
        end_offset: u64,
    },
    /// Edge → broker: one batch of a requested range (wire form, as
    /// [`Frame::Batch`]).
    Repair {
        /// How `payload` is encoded.
        codec: WireCodec,
        /// The batch bytes (compressed when `codec` is zstd).
        payload: Bytes,
    },
    /// Edge → broker: no readable copy of the requested range is left here.
    RefetchUnavailable {
        /// First offset of the requested range.
        first_offset: u64,
        /// Its exclusive end.
        end_offset: u64,
        /// The edge WAL's first offset now.
        log_start: u64,
    },
    /// Broker → edge, instead of `Welcome`: another broker owns the topic.
    Redirect(Redirect),
    /// Broker → edge: everything below `archived_offset` is committed in
    /// the archive (the end of the topic's committed descriptors).
    Archived {
        /// Exclusive end of the archived range.
        archived_offset: u64,
    },
    /// Broker → edge, after `Welcome`, only on a stream whose `Hello` set
    /// `progress`: report the local high-water mark with `Progress` frames,
    /// at most once per `interval_ms` and only when it changed.
    ProgressRequest {
        /// Shortest time between two `Progress` frames, ms (at least 1).
        interval_ms: u32,
    },
    /// Edge → broker, only after a `ProgressRequest`: the next offset the
    /// edge's WAL will assign for the topic (its high-water mark).
    Progress {
        /// The edge's high-water mark.
        high_water_mark: u64,
    },
    /// Broker → edge, just before `Welcome`, only on a stream whose `Hello`
    /// set `tip`: the last batch of the central log, when it holds one.
    Tip {
        /// The batch's base offset.
        base_offset: u64,
        /// Its next offset (base offset plus record count).
        next_offset: u64,
        /// Its CRC-32C as stored in the batch header.
        crc32c: u32,
    },
    /// Broker → edge, the first frame after the `Hello` (before any `Tip`,
    /// `Welcome` or `Redirect`), only on a stream whose `Hello` set
    /// `cluster_id`: the id of the cluster the broker belongs to.
    ClusterId {
        /// The cluster's id (`/cluster/id`).
        id: ClusterId,
    },
}

/// Why bytes are not a valid frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// Declared length over the limit (nothing was allocated).
    #[error("frame of {length} bytes exceeds the limit of {max}")]
    TooLarge {
        /// Declared length.
        length: u32,
        /// The limit.
        max: u32,
    },
    /// Unknown frame type byte.
    #[error("unknown frame type {0}")]
    UnknownType(u8),
    /// The payload does not match its type.
    #[error("malformed {kind} frame: {reason}")]
    Malformed {
        /// Frame type name.
        kind: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// The stream ended inside a frame.
    #[error("stream ended inside a frame ({0} bytes left over)")]
    Truncated(usize),
}

impl Frame {
    /// A batch frame for `batch`, zstd-compressed when `compress` is set and
    /// that makes it smaller.
    /// A stream sending many batches keeps one
    /// [`BatchCompressor`](super::compress::BatchCompressor) instead.
    pub fn batch(batch: &EncodedBatch, compress: bool) -> Frame {
        super::compress::BatchCompressor::new(compress).frame(batch)
    }

    /// A `Repair` frame for `batch` (a batch of a requested range), with
    /// the same wire compression as [`Frame::batch`].
    pub fn repair(batch: &EncodedBatch, compress: bool) -> Frame {
        match Frame::batch(batch, compress) {
            Frame::Batch { codec, payload } => Frame::Repair { codec, payload },
            other => other,
        }
    }

    /// Appends the encoded frame to `out`.
    pub fn encode(&self, out: &mut BytesMut) {
        let start = out.len();
        out.put_u32_le(0); // length, patched below
        match self {
            Frame::Hello(hello) => {
                out.put_u8(HELLO);
                // Serializing plain data structures cannot fail.
                let json = serde_json::to_vec(hello).unwrap_or_default();
                out.put_slice(&json);
            }
            Frame::Welcome { high_water_mark } => {
                out.put_u8(WELCOME);
                out.put_u64_le(*high_water_mark);
            }
            Frame::Batch { codec, payload } => {
                out.put_u8(BATCH);
                out.put_u8(codec_byte(*codec));
                out.put_slice(payload);
            }
            Frame::Ack { next_offset } => {
                out.put_u8(ACK);
                out.put_u64_le(*next_offset);
            }
            Frame::Error { code, message } => {
                out.put_u8(ERROR);
                out.put_u16_le(code.to_u16());
                let text = message.as_bytes();
                let max = CONTROL_FRAME_BYTES as usize - 3;
                out.put_slice(&text[..text.len().min(max)]);
            }
            Frame::Hole {
                first_offset,
                end_offset,
                cause,
                reason,
            } => {
                out.put_u8(HOLE);
                out.put_u64_le(*first_offset);
                out.put_u64_le(*end_offset);
                out.put_u8(cause.to_u8());
                let max = CONTROL_FRAME_BYTES as usize - 1 - HOLE_FIXED_BYTES;
                out.put_slice(truncate_utf8(reason, max).as_bytes());
            }
            Frame::Refetch {
                first_offset,
                end_offset,
            } => {
                out.put_u8(REFETCH);
                out.put_u64_le(*first_offset);
                out.put_u64_le(*end_offset);
            }
            Frame::Repair { codec, payload } => {
                out.put_u8(REPAIR);
                out.put_u8(codec_byte(*codec));
                out.put_slice(payload);
            }
            Frame::RefetchUnavailable {
                first_offset,
                end_offset,
                log_start,
            } => {
                out.put_u8(REFETCH_UNAVAILABLE);
                out.put_u64_le(*first_offset);
                out.put_u64_le(*end_offset);
                out.put_u64_le(*log_start);
            }
            Frame::Redirect(redirect) => {
                out.put_u8(REDIRECT);
                // Serializing plain data structures cannot fail.
                let json = serde_json::to_vec(redirect).unwrap_or_default();
                out.put_slice(&json);
            }
            Frame::Archived { archived_offset } => {
                out.put_u8(ARCHIVED);
                out.put_u64_le(*archived_offset);
            }
            Frame::ProgressRequest { interval_ms } => {
                out.put_u8(PROGRESS_REQUEST);
                out.put_u32_le(*interval_ms);
            }
            Frame::Progress { high_water_mark } => {
                out.put_u8(PROGRESS);
                out.put_u64_le(*high_water_mark);
            }
            Frame::Tip {
                base_offset,
                next_offset,
                crc32c,
            } => {
                out.put_u8(TIP);
                out.put_u64_le(*base_offset);
                out.put_u64_le(*next_offset);
                out.put_u32_le(*crc32c);
            }
            Frame::ClusterId { id } => {
                out.put_u8(CLUSTER_ID);
                out.put_slice(&id.to_bytes());
            }
        }
        let length = (out.len() - start - 4) as u32;
        out[start..start + 4].copy_from_slice(&length.to_le_bytes());
    }

    /// The encoded frame as bytes.
    pub fn to_bytes(&self) -> Bytes {
        let mut out = BytesMut::new();
        self.encode(&mut out);
        out.freeze()
    }
}

/// The longest prefix of `text` of at most `max` bytes that ends on a
/// character boundary.
fn truncate_utf8(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Bytes of a batch frame before its payload: length, type and wire codec.
pub const BATCH_FRAME_HEADER_BYTES: usize = FRAME_HEADER_BYTES + 1;

/// The first [`BATCH_FRAME_HEADER_BYTES`] of a batch frame whose payload is
/// `payload_len` bytes. Sending them and then the payload puts the same
/// bytes on the stream as [`Frame::encode`] of the `Batch` frame, without
/// copying the payload.
///
/// # Panics
/// If `payload_len` does not fit the u32 length field (no batch under any
/// [`Limits`] comes near 4 GiB).
pub fn batch_frame_header(codec: WireCodec, payload_len: usize) -> [u8; BATCH_FRAME_HEADER_BYTES] {
    let length = u32::try_from(payload_len + 2).expect("batch frame length fits in u32");
    let mut header = [0u8; BATCH_FRAME_HEADER_BYTES];
    header[..4].copy_from_slice(&length.to_le_bytes());
    header[4] = BATCH;
    header[5] = codec_byte(codec);
    header
}

fn codec_byte(codec: WireCodec) -> u8 {
    match codec {
        WireCodec::None => 0,
        WireCodec::Zstd => 1,
    }
}

/// Largest frame (type + payload) accepted under `limits`, bytes.
pub fn max_frame_bytes(limits: &Limits) -> u32 {
    (limits.max_batch_bytes + 2).max(CONTROL_FRAME_BYTES)
}

/// Takes one complete frame from the front of `buf`, if there is one.
///
/// # Errors
/// [`FrameError`] for an oversized, unknown or malformed frame. After an
/// error the stream is unusable.
pub fn decode(buf: &mut BytesMut, limits: &Limits) -> Result<Option<Frame>, FrameError> {
    if buf.len() < 4 {
        return Ok(None);
    }
    let length = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]);
    let max = max_frame_bytes(limits);
    if length > max {
        return Err(FrameError::TooLarge { length, max });
    }
    if length == 0 {
        return Err(FrameError::Malformed {
            kind: "empty",
            reason: "frame without a type".into(),
        });
    }
    if buf.len() < 4 + length as usize {
        buf.reserve(4 + length as usize - buf.len());
        return Ok(None);
    }
    buf.advance(4);
    let mut body = buf.split_to(length as usize).freeze();
    let kind = body.get_u8();
    let malformed = |kind: &'static str, reason: &str| FrameError::Malformed {
        kind,
        reason: reason.to_string(),
    };
    let frame = match kind {
        HELLO => {
            let hello: Hello =
                serde_json::from_slice(&body).map_err(|e| malformed("hello", &e.to_string()))?;
            Frame::Hello(hello)
        }
        WELCOME => {
            if body.len() != 8 {
                return Err(malformed("welcome", "payload is not 8 bytes"));
            }
            Frame::Welcome {
                high_water_mark: body.get_u64_le(),
            }
        }
        BATCH | REPAIR => {
            let name = if kind == BATCH { "batch" } else { "repair" };
            if body.is_empty() {
                return Err(malformed(name, "missing codec byte"));
            }
            let codec = match body.get_u8() {
                0 => WireCodec::None,
                1 => WireCodec::Zstd,
                other => return Err(malformed(name, &format!("unknown wire codec {other}"))),
            };
            if kind == BATCH {
                Frame::Batch {
                    codec,
                    payload: body,
                }
            } else {
                Frame::Repair {
                    codec,
                    payload: body,
                }
            }
        }
        REFETCH | REFETCH_UNAVAILABLE => {
            let (name, len) = if kind == REFETCH {
                ("refetch", 16)
            } else {
                ("refetch_unavailable", 24)
            };
            if body.len() != len {
                return Err(malformed(name, &format!("payload is not {len} bytes")));
            }
            let first_offset = body.get_u64_le();
            let end_offset = body.get_u64_le();
            if end_offset <= first_offset {
                return Err(malformed(
                    name,
                    &format!("empty range {first_offset}..{end_offset}"),
                ));
            }
            if kind == REFETCH {
                Frame::Refetch {
                    first_offset,
                    end_offset,
                }
            } else {
                Frame::RefetchUnavailable {
                    first_offset,
                    end_offset,
                    log_start: body.get_u64_le(),
                }
            }
        }
        REDIRECT => {
            let redirect: Redirect =
                serde_json::from_slice(&body).map_err(|e| malformed("redirect", &e.to_string()))?;
            if redirect.ingest_addr.is_empty() || redirect.ingest_addr.len() > 1024 {
                return Err(malformed(
                    "redirect",
                    "ingest_addr empty or over 1024 bytes",
                ));
            }
            Frame::Redirect(redirect)
        }
        ARCHIVED => {
            if body.len() != 8 {
                return Err(malformed("archived", "payload is not 8 bytes"));
            }
            Frame::Archived {
                archived_offset: body.get_u64_le(),
            }
        }
        PROGRESS_REQUEST => {
            if body.len() != 4 {
                return Err(malformed("progress_request", "payload is not 4 bytes"));
            }
            let interval_ms = body.get_u32_le();
            if interval_ms == 0 {
                return Err(malformed("progress_request", "interval_ms is 0"));
            }
            Frame::ProgressRequest { interval_ms }
        }
        PROGRESS => {
            if body.len() != 8 {
                return Err(malformed("progress", "payload is not 8 bytes"));
            }
            Frame::Progress {
                high_water_mark: body.get_u64_le(),
            }
        }
        TIP => {
            if body.len() != 20 {
                return Err(malformed("tip", "payload is not 20 bytes"));
            }
            let (base_offset, next_offset) = (body.get_u64_le(), body.get_u64_le());
            if next_offset <= base_offset {
                return Err(malformed("tip", "next_offset not above base_offset"));
            }
            Frame::Tip {
                base_offset,
                next_offset,
                crc32c: body.get_u32_le(),
            }
        }
        CLUSTER_ID => {
            let bytes: [u8; CLUSTER_ID_BYTES] = body.as_ref().try_into().map_err(|_| {
                malformed(
                    "cluster_id",
                    &format!("payload is not {CLUSTER_ID_BYTES} bytes"),
                )
            })?;
            let id = ClusterId::from_bytes(bytes)
                .map_err(|e| malformed("cluster_id", &e.to_string()))?;
            Frame::ClusterId { id }
        }
        ACK => {
            if body.len() != 8 {
                return Err(malformed("ack", "payload is not 8 bytes"));
            }
            Frame::Ack {
                next_offset: body.get_u64_le(),
            }
        }
        ERROR => {
            if body.len() < 2 {
                return Err(malformed("error", "missing code"));
            }
            let code = ErrorCode::from_u16(body.get_u16_le());
            Frame::Error {
                code,
                message: String::from_utf8_lossy(&body).into_owned(),
            }
        }
        HOLE => {
            if body.len() < HOLE_FIXED_BYTES {
                return Err(malformed("hole", "payload shorter than 17 bytes"));
            }
            let first_offset = body.get_u64_le();
            let end_offset = body.get_u64_le();
            if end_offset <= first_offset {
                return Err(malformed(
                    "hole",
                    &format!("empty range {first_offset}..{end_offset}"),
                ));
            }
            let cause_byte = body.get_u8();
            let cause = HoleCause::from_u8(cause_byte)
                .ok_or_else(|| malformed("hole", &format!("unknown cause {cause_byte}")))?;
            let reason = std::str::from_utf8(&body)
                .map_err(|_| malformed("hole", "reason is not UTF-8"))?
                .to_owned();
            Frame::Hole {
                first_offset,
                end_offset,
                cause,
                reason,
            }
        }
        other => return Err(FrameError::UnknownType(other)),
    };
    Ok(Some(frame))
}

/// Why a batch frame's payload is not an acceptable batch.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BatchFrameError {
    /// zstd failed or would inflate beyond `max_batch_bytes`.
    #[error("wire decompression failed: {0}")]
    Decompress(String),
    /// The batch itself is invalid (CRC, structure, limits).
    #[error(transparent)]
    Batch(#[from] DecodeError),
}

/// Turns a batch frame's payload back into the verified record batch.
///
/// # Errors
/// [`BatchFrameError`] if decompression fails or the batch does not verify.
pub fn open_batch(
    codec: WireCodec,
    payload: Bytes,
    limits: &Limits,
) -> Result<EncodedBatch, BatchFrameError> {
    let raw = match codec {
        WireCodec::None => payload,
        WireCodec::Zstd => Bytes::from(
            zstd::bulk::decompress(&payload, limits.max_batch_bytes as usize)
                .map_err(|e| BatchFrameError::Decompress(e.to_string()))?,
        ),
    };
    Ok(EncodedBatch::from_bytes(raw, limits)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::{Record, RecordBatch};
    use crate::intent::StreamIntent;
    use proptest::prelude::*;

    fn sample_batch() -> EncodedBatch {
        let records = (0..20)
            .map(|i| Record {
                timestamp_ms: 1_700_000_000_000 + i,
                value: Bytes::from(format!("{{\"reading\":{i},\"unit\":\"kW\"}}")),
                ..Record::default()
            })
            .collect();
        RecordBatch::new(40, records)
            .encode(&Limits::default())
            .unwrap()
    }

    fn frames() -> Vec<Frame> {
        vec![
            Frame::Hello(Hello {
                protocol: PROTOCOL_VERSION,
                topic: "/plant1/power".into(),
                settings: Some(StreamIntent::EventStream.expand()),
                ack_datagrams: true,
                progress: true,
                tip: true,
                cluster_id: true,
            }),
            Frame::Welcome {
                high_water_mark: 77,
            },
            Frame::batch(&sample_batch(), false),
            Frame::batch(&sample_batch(), true),
            Frame::Ack { next_offset: 60 },
            Frame::Error {
                code: ErrorCode::NotOwner,
                message: "edge plant2 does not own namespace plant1".into(),
            },
            Frame::Hole {
                first_offset: 1_000,
                end_offset: 1_250,
                cause: HoleCause::Damaged,
                reason: "crc mismatch at byte 4096 of segment 0 (ü)".into(),
            },
            Frame::Hole {
                first_offset: 7,
                end_offset: 8,
                cause: HoleCause::Lost,
                reason: String::new(),
            },
            Frame::Refetch {
                first_offset: 40,
                end_offset: 60,
            },
            Frame::repair(&sample_batch(), false),
            Frame::repair(&sample_batch(), true),
            Frame::RefetchUnavailable {
                first_offset: 40,
                end_offset: 60,
                log_start: 1_000,
            },
            Frame::ProgressRequest { interval_ms: 1_000 },
            Frame::Progress {
                high_water_mark: u64::MAX - 1,
            },
            Frame::Tip {
                base_offset: 40,
                next_offset: 60,
                crc32c: 0xdead_beef,
            },
            Frame::ClusterId {
                id: ClusterId::from_random([0x5a; 16]),
            },
        ]
    }

    #[test]
    fn progress_and_tip_frames_have_exact_bytes_and_refuse_wrong_lengths() {
        let limits = Limits::default();
        assert_eq!(
            Frame::ProgressRequest { interval_ms: 500 }
                .to_bytes()
                .as_ref(),
            [5, 0, 0, 0, PROGRESS_REQUEST, 0xf4, 0x01, 0, 0]
        );
        assert_eq!(
            Frame::Progress {
                high_water_mark: 258
            }
            .to_bytes()
            .as_ref(),
            [9, 0, 0, 0, PROGRESS, 2, 1, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(
            Frame::Tip {
                base_offset: 1,
                next_offset: 3,
                crc32c: 0x0403_0201
            }
            .to_bytes()
            .as_ref(),
            [
                21, 0, 0, 0, TIP, 1, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4
            ]
        );
        for (kind, payload) in [
            (PROGRESS_REQUEST, vec![0; 4]),
            (PROGRESS_REQUEST, vec![1; 8]),
            (PROGRESS, vec![1; 4]),
            (TIP, vec![1; 16]),
            // next_offset not above base_offset
            (
                TIP,
                [[5u8; 8], [5u8; 8]]
                    .concat()
                    .into_iter()
                    .chain([0; 4])
                    .collect(),
            ),
        ] {
            let mut wire = BytesMut::new();
            wire.put_u32_le(payload.len() as u32 + 1);
            wire.put_u8(kind);
            wire.put_slice(&payload);
            assert!(
                matches!(
                    decode(&mut wire, &limits),
                    Err(FrameError::Malformed { .. })
                ),
                "type {kind}, {} bytes",
                payload.len()
            );
        }
    }

    #[test]
    fn refetch_frames_with_an_empty_range_or_a_wrong_length_are_refused() {
        let limits = Limits::default();
        for (kind, payload) in [
            (REFETCH, [5u64.to_le_bytes(), 5u64.to_le_bytes()].concat()),
            (REFETCH, vec![0; 15]),
            (
                REFETCH_UNAVAILABLE,
                [1u64, 2].map(u64::to_le_bytes).concat(),
            ),
        ] {
            let mut wire = BytesMut::new();
            wire.put_u32_le(payload.len() as u32 + 1);
            wire.put_u8(kind);
            wire.put_slice(&payload);
            assert!(matches!(
                decode(&mut wire, &limits),
                Err(FrameError::Malformed { .. })
            ));
        }
    }

    #[test]
    fn frames_round_trip_across_any_split() {
        let limits = Limits::default();
        let mut wire = BytesMut::new();
        for frame in frames() {
            frame.encode(&mut wire);
        }
        let wire = wire.freeze();
        for split in 0..wire.len() {
            let mut buf = BytesMut::new();
            let mut out = Vec::new();
            for chunk in [&wire[..split], &wire[split..]] {
                buf.extend_from_slice(chunk);
                while let Some(frame) = decode(&mut buf, &limits).unwrap() {
                    out.push(frame);
                }
            }
            assert_eq!(out, frames(), "split at {split}");
            assert!(buf.is_empty());
        }
    }

    #[test]
    fn compression_is_used_only_when_smaller_and_round_trips() {
        let limits = Limits::default();
        let batch = sample_batch();
        let Frame::Batch { codec, payload } = Frame::batch(&batch, true) else {
            panic!("not a batch frame");
        };
        assert_eq!(codec, WireCodec::Zstd);
        assert!(payload.len() < batch.len());
        assert_eq!(open_batch(codec, payload, &limits).unwrap(), batch);
        let random = RecordBatch::new(
            0,
            vec![Record {
                value: Bytes::from({
                    use rand::{RngExt, SeedableRng};
                    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
                    (0..200).map(|_| rng.random::<u8>()).collect::<Vec<u8>>()
                }),
                ..Record::default()
            }],
        )
        .encode(&limits)
        .unwrap();
        // Random bytes: whichever codec is chosen, the frame is never larger
        // than the batch, and it opens to the same batch.
        let Frame::Batch { codec, payload } = Frame::batch(&random, true) else {
            panic!("not a batch frame");
        };
        match codec {
            WireCodec::None => assert_eq!(&payload, random.as_bytes()),
            WireCodec::Zstd => assert!(payload.len() < random.len()),
        }
        assert_eq!(open_batch(codec, payload, &limits).unwrap(), random);
    }

    #[test]
    fn oversized_length_is_refused_before_allocating() {
        let limits = Limits::default();
        let mut buf = BytesMut::from(&u32::MAX.to_le_bytes()[..]);
        assert!(matches!(
            decode(&mut buf, &limits),
            Err(FrameError::TooLarge {
                length: u32::MAX,
                ..
            })
        ));
    }

    fn hole_bytes(first: u64, end: u64, cause: u8, reason: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&(18 + reason.len() as u32).to_le_bytes());
        out.push(HOLE);
        out.extend_from_slice(&first.to_le_bytes());
        out.extend_from_slice(&end.to_le_bytes());
        out.push(cause);
        out.extend_from_slice(reason);
        out
    }

    #[test]
    fn a_hole_frame_has_the_documented_layout_and_a_long_reason_is_cut_on_a_char_boundary() {
        let frame = Frame::Hole {
            first_offset: 3,
            end_offset: 9,
            cause: HoleCause::Lost,
            reason: "gone".into(),
        };
        assert_eq!(frame.to_bytes().as_ref(), &hole_bytes(3, 9, 1, b"gone")[..]);
        let long = Frame::Hole {
            first_offset: 0,
            end_offset: 1,
            cause: HoleCause::Damaged,
            reason: "é".repeat(CONTROL_FRAME_BYTES as usize),
        };
        let mut buf = BytesMut::from(long.to_bytes().as_ref());
        assert!(buf.len() <= FRAME_HEADER_BYTES - 1 + CONTROL_FRAME_BYTES as usize);
        let Some(Frame::Hole { reason, .. }) = decode(&mut buf, &Limits::default()).unwrap() else {
            panic!("not a hole frame");
        };
        assert!(reason.chars().all(|c| c == 'é') && !reason.is_empty());
    }

    #[test]
    fn bad_frames_are_typed_errors() {
        let limits = Limits::default();
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (vec![1, 0, 0, 0, 42], "unknown frame type 42"),
            (vec![0, 0, 0, 0], "frame without a type"),
            (vec![3, 0, 0, 0, WELCOME, 1, 2], "welcome"),
            (vec![2, 0, 0, 0, BATCH, 7], "unknown wire codec 7"),
            (vec![3, 0, 0, 0, HELLO, b'{', b'}'], "hello"),
            (
                vec![9, 0, 0, 0, HOLE, 1, 0, 0, 0, 0, 0, 0, 0],
                "shorter than 17",
            ),
            (hole_bytes(5, 5, 0, b""), "empty range 5..5"),
            (hole_bytes(9, 5, 0, b""), "empty range 9..5"),
            (hole_bytes(5, 9, 2, b""), "unknown cause 2"),
            (hole_bytes(5, 9, 1, &[0xff, 0xfe]), "not UTF-8"),
        ];
        for (bytes, expected) in cases {
            let mut buf = BytesMut::from(&bytes[..]);
            let err = decode(&mut buf, &limits).unwrap_err();
            assert!(err.to_string().contains(expected), "{err} / {expected}");
        }
    }

    #[test]
    fn ack_datagrams_round_trip_and_bad_ones_are_typed_errors() {
        let ack = AckDatagram {
            stream_id: 8,
            next_offset: 1 << 40,
        };
        let bytes = ack.to_bytes();
        assert_eq!(bytes.len(), ACK_DATAGRAM_BYTES);
        assert_eq!(AckDatagram::decode(&bytes), Ok(ack));
        for bad in [&bytes[..16], &[bytes.as_ref(), &[0]].concat()[..], &[]] {
            assert!(
                matches!(AckDatagram::decode(bad), Err(FrameError::Malformed { .. })),
                "{} bytes",
                bad.len()
            );
        }
        let mut other_type = bytes.to_vec();
        other_type[0] = WELCOME;
        assert_eq!(
            AckDatagram::decode(&other_type),
            Err(FrameError::UnknownType(WELCOME))
        );
    }

    #[test]
    fn a_hello_from_an_edge_that_predates_ack_datagrams_does_not_ask_for_them() {
        let old = br#"{"protocol":1,"topic":"/plant1/power","settings":null}"#;
        let hello: Hello = serde_json::from_slice(old).unwrap();
        assert!(!hello.ack_datagrams);
        // And an old broker's parser (no such field) reads a new Hello.
        let new = serde_json::to_value(Hello {
            ack_datagrams: true,
            ..hello.clone()
        })
        .unwrap();
        assert_eq!(new["ack_datagrams"], true);
        assert!(!hello.progress, "an old edge never sends Progress frames");
        assert!(
            serde_json::to_value(&hello)
                .unwrap()
                .get("progress")
                .is_none(),
            "a Hello without progress is byte for byte the older one"
        );
        assert!(
            serde_json::to_value(&hello)
                .unwrap()
                .get("ack_datagrams")
                .is_none()
        );
    }

    #[test]
    fn a_zstd_bomb_is_refused() {
        let limits = Limits {
            max_record_bytes: 1024,
            max_batch_bytes: 4096,
        };
        let bomb = zstd::bulk::compress(&vec![0u8; 1 << 20], 3).unwrap();
        assert!(matches!(
            open_batch(WireCodec::Zstd, Bytes::from(bomb), &limits),
            Err(BatchFrameError::Decompress(_))
        ));
    }

    proptest! {
        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let limits = Limits::default();
            let mut buf = BytesMut::from(&bytes[..]);
            while let Ok(Some(_)) = decode(&mut buf, &limits) {}
        }
    }
}
