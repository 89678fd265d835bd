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

impl ClusterView for MetaNode {
    fn status(&self) -> ClusterStatus {
        MetaNode::status(self)
    }
}

pub(super) async fn cluster_status(State(state): State<AdminState>) -> ApiResult {
    ok(StatusCode::OK, state.cluster.status())
}
