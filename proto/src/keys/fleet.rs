//! Builders for `/fleet/...`: what the brokers know of the edges that
//! connect to them (`tribctl edges list`, `docs/admin-api.md`).

use super::{MetadataKey, NamespaceName};

/// `/fleet/edges/{edge_id}/{broker_id}`: broker `broker_id`'s entry for
/// edge `edge_id`.
pub fn edge_entry(edge: &NamespaceName, broker_id: u64) -> String {
    MetadataKey::FleetEdge {
        edge: edge.clone(),
        broker_id,
    }
    .to_string()
}

/// `/fleet/edges/`: every edge entry of every broker.
pub fn edges_prefix() -> String {
    "/fleet/edges/".to_owned()
}
