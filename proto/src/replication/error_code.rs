//! [`ErrorCode`]: why a replication stream is refused or closed, the u16
//! code of an `Error` frame (FORMAT.md, "Replication stream").

/// Why a stream is refused or closed; carried in an `Error` frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorCode {
    /// A frame could not be decoded or arrived out of order.
    Malformed,
    /// The edge's certificate identity does not own the topic's namespace.
    NotOwner,
    /// The topic name is invalid.
    InvalidTopic,
    /// A batch starts after the next expected offset.
    Gap,
    /// A batch straddles the next expected offset.
    Overlap,
    /// A batch fails its CRC or structure checks.
    Corrupt,
    /// A batch or frame exceeds a limit.
    TooLarge,
    /// The topic exists centrally with other settings.
    Conflict,
    /// The broker cannot serve now (metadata unavailable, storage failed,
    /// the topic has no owner yet, the broker lost its lease); the edge
    /// retries later.
    Unavailable,
    /// The `Hello`'s protocol version is not the broker's
    /// ([`PROTOCOL_VERSION`](super::frame::PROTOCOL_VERSION)): upgrade the older side.
    UnsupportedProtocol,
    /// A code this build does not know.
    Unknown(u16),
}

impl ErrorCode {
    pub(super) fn to_u16(self) -> u16 {
        match self {
            ErrorCode::Malformed => 1,
            ErrorCode::NotOwner => 2,
            ErrorCode::InvalidTopic => 3,
            ErrorCode::Gap => 4,
            ErrorCode::Overlap => 5,
            ErrorCode::Corrupt => 6,
            ErrorCode::TooLarge => 7,
            ErrorCode::Conflict => 8,
            ErrorCode::Unavailable => 9,
            ErrorCode::UnsupportedProtocol => 10,
            ErrorCode::Unknown(code) => code,
        }
    }

    pub(super) fn from_u16(code: u16) -> ErrorCode {
        match code {
            1 => ErrorCode::Malformed,
            2 => ErrorCode::NotOwner,
            3 => ErrorCode::InvalidTopic,
            4 => ErrorCode::Gap,
            5 => ErrorCode::Overlap,
            6 => ErrorCode::Corrupt,
            7 => ErrorCode::TooLarge,
            8 => ErrorCode::Conflict,
            9 => ErrorCode::Unavailable,
            10 => ErrorCode::UnsupportedProtocol,
            other => ErrorCode::Unknown(other),
        }
    }

    /// Whether the edge should retry after this error (reconnect later)
    /// rather than stop replicating the topic and alert.
    pub fn is_retryable(self) -> bool {
        matches!(self, ErrorCode::Unavailable)
    }
}
