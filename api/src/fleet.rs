//! JSON shape of `GET /v1/edges` (`docs/admin-api.md`, "Edges"): every
//! edge the brokers of the cluster know, whether it is connected, since
//! when, when it was last seen, to which brokers, and each topic's
//! high-water mark and lag. The broker writes it, `tribctl edges list` and
//! the tests parse it.

use serde::{Deserialize, Serialize};

pub use tributary_proto::fleet::{EdgeView, TopicView};

/// Answer of `GET /v1/edges`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EdgeList {
    /// The broker that answered.
    pub broker_id: u64,
    /// Its wall clock when it answered, ms since the Unix epoch (the `now`
    /// of connected edges' `last_seen_ms`).
    pub as_of_ms: u64,
    /// Every known edge, by edge id.
    pub edges: Vec<EdgeView>,
}
