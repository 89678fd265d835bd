//! Cluster status for the admin API: [`ClusterView`] (the broker's Raft
//! node, or a fixed status in tests) and `GET /v1/cluster/status`.

use axum::extract::State;
use axum::http::StatusCode;

use super::AdminState;
use crate::http::{ApiResult, ok};
use crate::raft::node::{ClusterStatus, MetaNode};

/// The cluster as the admin API reports it: the broker's Raft [`MetaNode`],
/// or a fixed status in tests.
pub trait ClusterView: Send + Sync {
    /// Current status: this node, leader, term, members, last applied index.
    fn status(&self) -> ClusterStatus;
}

/// A cluster view that always reports the same status: for serving the
/// admin API without a Raft node (tests, tools replaying a fixed state).
#[derive(Debug, Clone)]
pub struct StaticClusterView(pub ClusterStatus);

impl StaticClusterView {
    /// A one-node cluster whose node 1, at Raft address `addr`, has led
    /// since `term`; nothing applied yet.
    pub fn single_leader(addr: &str, term: u64) -> StaticClusterView {
        StaticClusterView(ClusterStatus {
            node_id: 1,
            leader: Some(1),
            term,
            members: std::collections::BTreeMap::from([(1, addr.to_owned())]),
            last_applied_index: None,
            snapshot_index: None,
            purged_index: None,
            state: "Leader".to_owned(),
        })
    }
}

impl ClusterView for StaticClusterView {
    fn status(&self) -> ClusterStatus {
        self.0.clone()
    }
}

impl ClusterView for MetaNode {
    fn status(&self) -> ClusterStatus {
        MetaNode::status(self)
    }
}

/// Longest wait of `GET /v1/cluster/status` for the cluster id.
const CLUSTER_ID_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// `GET /v1/cluster/status`: the Raft status, plus `cluster_id` (the
/// committed `/cluster/id`, `null` until it exists) and `brokers` (each
/// broker's lease and load, [`super::ownership`]) with topic ownership.
/// The id never changes once committed, so the one this broker already
/// read ([`ClusterIdentity`](crate::cluster::identity::ClusterIdentity),
/// given as an extension, which reads it once and keeps it) is answered
/// even while there is no Raft leader.
pub(super) async fn cluster_status(
    State(state): State<AdminState>,
    cluster: Option<axum::extract::Extension<std::sync::Arc<crate::cluster::Cluster>>>,
    identity: Option<axum::extract::Extension<crate::cluster::identity::ClusterIdentity>>,
) -> ApiResult {
    let mut value = serde_json::to_value(state.cluster.status()).map_err(|e| {
        crate::http::ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string())
    })?;
    // Bounded: without a leader the rest of the status is still worth
    // showing (then `null`, unless this broker read the id before).
    let cluster_id = match identity {
        Some(axum::extract::Extension(identity)) => {
            tokio::time::timeout(CLUSTER_ID_READ_TIMEOUT, identity.load())
                .await
                .ok()
                .and_then(Result::ok)
                .map(|id| serde_json::Value::String(id.to_string()))
        }
        None => {
            let key = tributary_proto::keys::cluster::id();
            tokio::time::timeout(CLUSTER_ID_READ_TIMEOUT, state.store.get(&key))
                .await
                .ok()
                .and_then(Result::ok)
                .flatten()
        }
    }
    .unwrap_or(serde_json::Value::Null);
    if let Some(object) = value.as_object_mut() {
        object.insert("cluster_id".into(), cluster_id);
    }
    if let (Some(axum::extract::Extension(cluster)), Some(object)) =
        (cluster, value.as_object_mut())
    {
        object.insert(
            "brokers".into(),
            serde_json::json!(super::ownership::brokers(&cluster)),
        );
    }
    ok(StatusCode::OK, value)
}
