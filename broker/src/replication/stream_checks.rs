//! What an open edge stream checks at each tick of its archive check (every
//! [`ARCHIVE_CHECK`]), besides the archive: whether this broker still owns
//! the topic at the stream's epoch, and whether the topic still exists.

use std::sync::Arc;

use broker_core::metadata::{MetadataError, MetadataStore};
use serde_json::Value;
use tributary_proto::intent::ExpandedStreamSettings;
use tributary_proto::keys;
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
/// centrally (`DELETE /v1/topics/…`), or created again with other settings
/// than the edge's `settings` (the stream's `Hello`), `None` while it is
/// the topic the stream opened. Retryable: the edge's next `Hello` creates
/// a deleted topic again with its intent and the stream resumes at the
/// same high-water mark (the edge is the topic's source of truth;
/// docs/admin-api.md, "Delete"), and one created with other settings
/// refuses it with `Conflict`. This broker's applied copy is read first,
/// once per [`ARCHIVE_CHECK`]; a change is confirmed through the leader, so
/// a follower's copy that has not yet applied the topic's creation cannot
/// close the stream. Bounded like the other checks of the tick; a metadata
/// error leaves the stream open.
pub(super) async fn deleted_centrally(
    store: &dyn MetadataStore,
    topic: &TopicName,
    settings: Option<&ExpandedStreamSettings>,
) -> Option<Frame> {
    let marker = keys::topics::marker(topic);
    let intent = keys::topics::intent(topic);
    let changed = |marker: &Option<Value>, intent: &Option<Value>| {
        let stored: Option<ExpandedStreamSettings> = intent
            .as_ref()
            .and_then(|v| serde_json::from_value(v.clone()).ok());
        marker.is_none() || stored.as_ref() != settings
    };
    let (Ok(m), Ok(i)) = (
        store.get_local(&marker).await,
        store.get_local(&intent).await,
    ) else {
        return None;
    };
    if !changed(&m, &i) {
        return None;
    }
    let confirmed = tokio::time::timeout(ARCHIVE_CHECK, async {
        Ok::<_, MetadataError>((store.get(&marker).await?, store.get(&intent).await?))
    })
    .await;
    match confirmed {
        Ok(Ok((m, i))) if changed(&m, &i) => Some(refusal(
            ErrorCode::Unavailable,
            format!(
                "{topic} was deleted centrally (or created again with other settings); reconnect"
            ),
        )),
        _ => None,
    }
}
