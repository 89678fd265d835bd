//! What an open edge stream checks at each tick of its archive check (every
//! [`ARCHIVE_CHECK`]), besides the archive: whether this broker still owns
//! the topic at the stream's epoch, and whether the topic still exists.

use std::sync::Arc;

use broker_core::metadata::MetadataStore;
use tributary_proto::keys::TopicName;
use tributary_proto::replication::frame::{ErrorCode, Frame};

use super::ingest::{ARCHIVE_CHECK, refusal};

/// The refusal that ends a stream whose topic this broker no longer serves
/// at the epoch it opened it under (another owner, or a stale lease), and
/// whether the lease is stale (then the whole connection is closed).
pub(super) fn ownership_lost(
    ownership: Option<&(
        Arc<crate::cluster::Cluster>,
        u64,
        tokio::sync::watch::Receiver<u64>,
    )>,
    topic: Option<&TopicName>,
) -> Option<(Frame, bool)> {
    let ((cluster, epoch, _), topic) = (ownership?, topic?);
    if cluster.route(topic) == (crate::cluster::Route::Local { epoch: *epoch }) {
        return None;
    }
    let frame = refusal(
        ErrorCode::Unavailable,
        format!(
            "broker {} no longer serves {topic} at epoch {epoch}; reconnect to its owner",
            cluster.me()
        ),
    );
    Some((frame, !cluster.lease_fresh()))
}

/// The `Error` frame that closes an edge's stream whose topic was deleted
/// centrally (`DELETE /v1/topics/…`), `None` while it exists. Retryable: the
/// edge's next `Hello` creates the topic again with its intent and the
/// stream resumes at the same high-water mark (the edge is the topic's
/// source of truth; docs/admin-api.md, "Delete"). This broker's applied
/// copy is read first, once per [`ARCHIVE_CHECK`]; an absent marker is
/// confirmed through the leader, so a follower's copy that has not yet
/// applied the topic's creation cannot close the stream. Bounded like the
/// other checks of the tick; a metadata error leaves the stream open.
pub(super) async fn deleted_centrally(
    store: &dyn MetadataStore,
    topic: &TopicName,
) -> Option<Frame> {
    let marker = tributary_proto::keys::topics::marker(topic);
    if !matches!(store.get_local(&marker).await, Ok(None)) {
        return None;
    }
    match tokio::time::timeout(ARCHIVE_CHECK, store.get(&marker)).await {
        Ok(Ok(None)) => Some(refusal(
            ErrorCode::Unavailable,
            format!("{topic} was deleted centrally; reconnect to create it again"),
        )),
        _ => None,
    }
}
