//! The acknowledgement datagram: an `Ack` repeated in a QUIC datagram
//! (RFC 9221) on the connection of the stream it acknowledges. Layout in
//! `FORMAT.md` ("Acknowledgement datagram").

use bytes::{Buf, BufMut, Bytes, BytesMut};

use super::frame::FrameError;

/// The datagram's type byte: 4, as the `Ack` frame's.
const ACK: u8 = 4;

/// Bytes of an encoded [`AckDatagram`].
pub const ACK_DATAGRAM_BYTES: usize = 17;

/// An acknowledgement repeated in a QUIC datagram: everything below
/// `next_offset` on the topic whose replication stream has QUIC stream id
/// `stream_id` (on this connection) is durable centrally.
///
/// ```text
/// u8 type (4, as the Ack frame) | u64 stream_id (LE) | u64 next_offset (LE)
/// ```
///
/// Datagrams may be lost, duplicated or reordered, and one may arrive before
/// the `Ack` frame it repeats or after a later one: the receiver takes the
/// highest offset it has seen
/// ([`EdgeStream::on_datagram_ack`](super::edge::EdgeStream::on_datagram_ack)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AckDatagram {
    /// QUIC stream id of the topic's replication stream.
    pub stream_id: u64,
    /// Exclusive end of the acknowledged range.
    pub next_offset: u64,
}

impl AckDatagram {
    /// The datagram's [`ACK_DATAGRAM_BYTES`] bytes.
    pub fn to_bytes(self) -> Bytes {
        let mut out = BytesMut::with_capacity(ACK_DATAGRAM_BYTES);
        out.put_u8(ACK);
        out.put_u64_le(self.stream_id);
        out.put_u64_le(self.next_offset);
        out.freeze()
    }

    /// Parses a received datagram.
    ///
    /// # Errors
    /// [`FrameError::Malformed`] if it is not [`ACK_DATAGRAM_BYTES`] long,
    /// [`FrameError::UnknownType`] if its type byte is not 4.
    pub fn decode(mut datagram: &[u8]) -> Result<AckDatagram, FrameError> {
        if datagram.len() != ACK_DATAGRAM_BYTES {
            return Err(FrameError::Malformed {
                kind: "ack datagram",
                reason: format!("{} bytes instead of {ACK_DATAGRAM_BYTES}", datagram.len()),
            });
        }
        match datagram.get_u8() {
            ACK => Ok(AckDatagram {
                stream_id: datagram.get_u64_le(),
                next_offset: datagram.get_u64_le(),
            }),
            other => Err(FrameError::UnknownType(other)),
        }
    }
}
