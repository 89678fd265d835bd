//! JSON shapes of the admin API's topic-ownership endpoints
//! (`docs/admin-api.md`): the brokers of `GET /v1/cluster/status`, `POST
//! /v1/topics/{ns}/{topic}/move` and `POST /v1/cluster/rebalance`. The
//! broker writes them, `tribctl` and the tests parse them.

use serde::{Deserialize, Serialize};
use tributary_proto::keys::TopicName;

/// One broker in `brokers` of `GET /v1/cluster/status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokerView {
    /// Node id.
    pub broker_id: u64,
    /// Where edges reach its replication listener, `host:port`.
    pub ingest_addr: String,
    /// Its admin, consumer and storage API base URL.
    pub admin_url: String,
    /// Whether its lease is held now.
    pub live: bool,
    /// `active` or `draining`.
    pub lifecycle: String,
    /// Ms since its last lease renewal (wall clock of the answering
    /// broker).
    pub lease_age_ms: u64,
    /// Topics assigned to it.
    pub topics_owned: usize,
    /// Bytes per second appended to its central WALs, as it last reported.
    #[serde(default)]
    pub bytes_in_per_s: u64,
}

/// Body of `POST /v1/topics/{ns}/{topic}/move`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MoveRequest {
    /// The broker that is to own the topic.
    pub to: u64,
}

/// Answer of `POST /v1/topics/{ns}/{topic}/move`: the new assignment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoveResponse {
    /// The topic.
    pub topic: TopicName,
    /// Its owner before the move.
    pub from: Option<u64>,
    /// Its owner now.
    pub to: u64,
    /// The new ownership epoch.
    pub epoch: u64,
}

/// Body of `POST /v1/cluster/rebalance`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RebalanceRequest {
    /// Only plan: move nothing.
    #[serde(default)]
    pub dry_run: bool,
    /// Most moves planned; default [`DEFAULT_MAX_MOVES`].
    #[serde(default)]
    pub max_moves: Option<usize>,
}

/// Moves a rebalance plans when the request names no `max_moves`.
pub const DEFAULT_MAX_MOVES: usize = 16;

/// One move of a rebalance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedMove {
    /// The topic.
    pub topic: TopicName,
    /// Its owner before.
    pub from: Option<u64>,
    /// Its owner after.
    pub to: u64,
    /// The epoch of the new assignment.
    pub epoch: u64,
    /// Why (`rebalance`).
    pub reason: String,
}

/// Answer of `POST /v1/cluster/rebalance`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RebalanceResponse {
    /// Whether the moves were only planned.
    pub dry_run: bool,
    /// The moves, carried out unless `dry_run`.
    pub moves: Vec<PlannedMove>,
}
