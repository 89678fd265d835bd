//! Holes declared by edges (`Hole` frame, FORMAT.md "Replication stream"):
//! the ingest driver records each in Raft, then skips the central WAL past
//! it, then acknowledges its end like a batch. Consumers get a gap notice
//! for the range and the archive shows it as a declared hole.

use broker_core::wal::{Wal, WalError};
use tracing::warn;
use tributary_proto::keys::TopicName;
use tributary_proto::replication::frame::{ErrorCode, Frame};
use tributary_proto::replication::hole::HoleRecord;
use tributary_proto::replication::ingest::DeclaredHole;

use super::topics::{TopicError, TopicStore};

/// Milliseconds since the Unix epoch, for `declared_at_ms`.
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Applies a hole the stream accepted at its next expected offset: records
/// it in Raft (first, so a crash before the WAL skips leaves a record the
/// edge's re-declaration after reconnecting matches), then
/// `Wal::skip_to(end_offset)`, durable when it returns. Returns the offset
/// to acknowledge (`end_offset`), or the `Error` frame to close the stream
/// with.
pub(super) async fn declare(
    topics: &TopicStore,
    topic: &TopicName,
    wal: &Wal,
    hole: DeclaredHole,
) -> Result<u64, Frame> {
    let refuse = |code: ErrorCode, message: String| Frame::Error { code, message };
    let next = wal.next_offset();
    if next != hole.first_offset {
        let code = if next < hole.first_offset {
            ErrorCode::Gap
        } else {
            ErrorCode::Overlap
        };
        return Err(refuse(
            code,
            format!(
                "hole {}..{} does not start at the central next offset {next}",
                hole.first_offset, hole.end_offset
            ),
        ));
    }
    let record = HoleRecord::new(
        hole.first_offset,
        hole.end_offset,
        hole.cause,
        hole.reason,
        now_ms(),
    );
    match topics.record_hole(topic, &record).await {
        Ok(()) => {}
        Err(e @ (TopicError::Conflict { .. } | TopicError::WriterConflict { .. })) => {
            return Err(refuse(ErrorCode::Conflict, e.to_string()));
        }
        Err(e) => return Err(refuse(ErrorCode::Unavailable, e.to_string())),
    }
    if let Err(e) = wal.skip_to(hole.end_offset).await {
        let code = match e {
            WalError::Gap { .. } => ErrorCode::Gap,
            WalError::Overlap { .. } => ErrorCode::Overlap,
            _ => ErrorCode::Unavailable,
        };
        return Err(refuse(code, e.to_string()));
    }
    warn!(
        %topic,
        first_offset = record.first_offset,
        end_offset = record.end_offset,
        cause = %record.cause,
        reason = %record.reason,
        "edge declared a hole: no record is stored for these offsets"
    );
    Ok(hole.end_offset)
}
