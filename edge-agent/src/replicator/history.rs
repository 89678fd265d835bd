//! Whether the broker's log of a topic is this edge's: the two checks made
//! when a stream opens, before anything is sent.
//!
//! - [`tip_mismatch`]: the broker's last batch (its `Tip`, FORMAT.md
//!   "Replication stream") must be the local batch at the same offset when
//!   the local WAL holds that offset; otherwise another log (a second
//!   device under this identity, or this device's log replaced) wrote the
//!   broker's records, and the stream stops ([`EdgeError::Diverged`]).
//! - [`adopt_broker_offset`]: a broker ahead of the local log, when nothing
//!   local is unacknowledged (a new or reflashed device), is where the
//!   local log continues.
//! - [`resume_over_missing`]: a broker behind the local log's start, when
//!   the offsets between were never acknowledged (dropped under the disk
//!   budget), resumes with them declared a hole.

use broker_core::wal::{BatchId, Wal};
use tracing::warn;
use tributary_proto::replication::edge::{EdgeError, EdgeEvent, EdgeStream};
use tributary_proto::replication::frame::Frame;

use super::StreamError;
use crate::topic::Topic;

/// Why the local WAL's batch at `base_offset` is not the central log's last
/// batch (`base_offset..next_offset`, CRC `crc32c`; FORMAT.md, "Tip"), or
/// `None` when it is, or when the local WAL cannot say: it no longer or
/// not yet holds the offset, or cannot read it (damage is reported
/// elsewhere). Batches travel verbatim, so a log that wrote the central
/// batch holds it byte for byte.
pub(super) fn tip_mismatch(
    wal: &Wal,
    base_offset: u64,
    next_offset: u64,
    crc32c: u32,
) -> Option<String> {
    wal.mismatch(&BatchId {
        base_offset,
        next_offset,
        crc32c,
    })
}

/// The broker holds offsets up to `broker`, past this edge's log (which
/// ends at `local`). When nothing local is unacknowledged (a new or
/// reflashed device's empty log, or one whose every record the broker
/// acknowledged) there is nothing the broker's records could shadow: the
/// log continues at `broker` (the offsets below it are a hole locally,
/// held centrally) and the stream resumes there. Otherwise the broker's
/// records may hide local ones: [`EdgeError::BrokerAhead`], which needs an
/// operator (the `Tip` check tells the two apart once the local log
/// reaches them).
///
/// # Errors
/// [`EdgeError::BrokerAhead`]; WAL errors declaring the hole.
pub(super) async fn adopt_broker_offset(
    stream: &mut EdgeStream,
    topic: &Topic,
    wal: &Wal,
    broker: u64,
    local: u64,
) -> Result<EdgeEvent, StreamError> {
    let ahead = EdgeError::BrokerAhead { broker, local };
    if topic.acknowledged_offset() < local {
        return Err(StreamError::Edge(ahead));
    }
    let skipped = wal
        .skip_to_from(local, broker)
        .await
        .map_err(|e| StreamError::Wal(e.to_string()))?;
    if !skipped {
        // A record was appended meanwhile: it is unacknowledged now.
        return Err(StreamError::Edge(ahead));
    }
    warn!(
        topic = %topic.name(),
        from = local,
        to = broker,
        "the broker holds offsets this edge's log never had and nothing here is unacknowledged: the log continues at the broker's high-water mark (expected once after a device was replaced or reflashed; if it repeats, two devices share this edge id)"
    );
    Ok(stream.on_frame(
        Frame::Welcome {
            high_water_mark: broker,
        },
        wal.log_start_offset(),
        wal.high_water_mark(),
    )?)
}

/// The broker resumes at `broker`, below the local log's start
/// `local_start`. When this edge's acknowledged checkpoint is not past
/// `broker`, the offsets `broker..local_start` were never acknowledged and
/// the local log no longer holds them: dropped under the disk budget
/// (`full_policy = "drop_oldest"`, docs/edge-agent.md) or lost. The stream
/// resumes at `broker` and the read-ahead declares them a hole first (they
/// stopped the topic for good before). When the checkpoint is past
/// `broker`, the broker lost records it had acknowledged, which needs an
/// operator: [`EdgeError::LocalDataMissing`].
///
/// # Errors
/// [`EdgeError::LocalDataMissing`]; [`EdgeError::BrokerAhead`].
pub(super) fn resume_over_missing(
    stream: &mut EdgeStream,
    topic: &Topic,
    wal: &Wal,
    broker: u64,
    local_start: u64,
) -> Result<EdgeEvent, StreamError> {
    let checkpoint = topic.acknowledged_offset();
    if checkpoint > broker {
        return Err(StreamError::Edge(EdgeError::LocalDataMissing {
            broker,
            local_start,
        }));
    }
    warn!(
        topic = %topic.name(),
        from = broker,
        to = local_start,
        checkpoint,
        "offsets {broker}..{local_start} were never acknowledged and are no longer in the local log (dropped under the disk budget, or lost): they are declared to the broker as a hole"
    );
    Ok(stream.resume_over_missing(broker, wal.high_water_mark())?)
}
