//! `GET /v1/edges`: every edge the cluster knows ([`tributary_api::fleet`]),
//! merged from the brokers' entries under `/fleet/edges/` in Raft, with
//! this broker's own entries taken live from its [`Fleet`] (fresh to the
//! moment; another broker's are as fresh as its last report, at most
//! `[fleet] report_interval_ms` old for offsets, immediate for connects
//! and disconnects). A connection recorded by a broker whose lease lapsed
//! counts as ended.

use std::collections::BTreeSet;
use std::sync::Arc;

use axum::extract::{Extension, State};
use axum::http::StatusCode;
use broker_core::clock::{Clock, SystemClock};
use tributary_api::fleet::EdgeList;
use tributary_proto::fleet::{BrokerLease, EdgeEntry, merge};
use tributary_proto::keys::{MetadataKey, fleet as keys};

use super::AdminState;
use crate::cluster::Cluster;
use crate::fleet::Fleet;
use crate::http::{ApiError, ApiResult, ok};

pub(super) async fn list_edges(
    State(state): State<AdminState>,
    fleet: Option<Extension<Arc<Fleet>>>,
    cluster: Option<Extension<Arc<Cluster>>>,
) -> ApiResult {
    let stored = state.store.list(&keys::edges_prefix()).await.map_err(|e| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            format!("listing edge entries: {e}"),
        )
    })?;
    let now_ms = SystemClock.now_ms();
    let me = fleet.as_ref().map(|f| f.me());
    let local = fleet.as_ref().map(|f| f.entries()).unwrap_or_default();
    let local_edges: BTreeSet<&str> = local.iter().map(|(e, _)| e.as_str()).collect();
    let mut entries: Vec<(String, u64, EdgeEntry)> = Vec::new();
    for (key, value) in stored {
        let Ok(MetadataKey::FleetEdge { edge, broker_id }) = MetadataKey::parse(&key) else {
            continue;
        };
        let Ok(mut entry) = serde_json::from_value::<EdgeEntry>(value) else {
            tracing::debug!(key, "skipping an edge entry that does not decode");
            continue;
        };
        if Some(broker_id) == me {
            if local_edges.contains(edge.as_str()) {
                continue; // the live state replaces it
            }
            // Written by an earlier process of this broker: nothing it
            // claims is open here now.
            entry.connections = 0;
        }
        entries.push((edge.as_str().to_owned(), broker_id, entry));
    }
    if let Some(me) = me {
        entries.extend(local.into_iter().map(|(edge, entry)| (edge, me, entry)));
    }
    let brokers = cluster.map(|c| c.brokers()).unwrap_or_default();
    let lease = |id: u64| {
        if Some(id) == me {
            return Some(BrokerLease {
                live: true,
                renewed_at_ms: now_ms,
            });
        }
        brokers
            .iter()
            .find(|b| b.broker_id == id)
            .map(|b| BrokerLease {
                live: b.live,
                renewed_at_ms: now_ms.saturating_sub(b.lease_age_ms),
            })
    };
    let edges = merge(
        entries.iter().map(|(e, b, entry)| (e.as_str(), *b, entry)),
        lease,
        now_ms,
    );
    ok(
        StatusCode::OK,
        EdgeList {
            broker_id: me.unwrap_or(0),
            as_of_ms: now_ms,
            edges,
        },
    )
}
