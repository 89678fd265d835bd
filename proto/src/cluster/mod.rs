//! The central cluster's identity ([`ClusterId`], at `/cluster/id`) and
//! topic ownership in it: the values stored under
//! `/cluster/*` (key paths from `seeds/001_4a7643a8a6858094.txt`, built by
//! [`crate::keys::cluster`]) and the I/O-free placement rules of the load
//! manager ([`placement`]).
//!
//! - `/cluster/brokers/{id}/state` holds a [`BrokerState`], written with a
//!   TTL (the broker's **lease**) and renewed on every heartbeat. A broker
//!   whose key expired is dead for placement.
//! - `/cluster/brokers/{id}/{ns}/{topic}` holds an [`Assignment`]: broker
//!   `id` owns the topic at [`Assignment::epoch`]. Each partition
//!   (`{topic}-part-N`) is a topic of its own here.
//! - `/cluster/unassigned/{ns}/{topic}` holds an [`Unassigned`]: the topic
//!   waits for the load manager.
//!
//! At most one of those keys exists per topic: every change is one Raft
//! transaction that removes the old key (with its exact value as a
//! precondition) and writes the new one, and the epoch of a new assignment
//! is one above the last. So the epoch of a topic only grows, and "broker
//! `id` owns the topic at epoch `e`" is one exact-value precondition that
//! any durable central write (descriptor commit, cursor, unload `state`)
//! carries: a stale owner's write is refused in Raft.

mod id;
pub mod placement;

pub use id::{CLUSTER_ID_BYTES, ClusterId, ClusterIdError};

use serde::{Deserialize, Serialize};

/// Whether a live broker takes new topics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BrokerLifecycle {
    /// Takes new topics.
    #[default]
    Active,
    /// Shutting down or being emptied: gets no new topics; its topics are
    /// handed over.
    Draining,
}

/// The value of `/cluster/brokers/{id}/state`: a broker's lease and its
/// addresses and load, renewed every heartbeat.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokerState {
    /// The broker's node id.
    pub broker_id: u64,
    /// Where edges reach its replication listener, `host:port`.
    pub ingest_addr: String,
    /// Base URL of its admin, consumer and storage API, e.g.
    /// `https://127.0.0.1:7400` (no trailing `/`).
    pub admin_url: String,
    /// Active or draining.
    #[serde(default)]
    pub lifecycle: BrokerLifecycle,
    /// Topics it owns (its load for placement).
    #[serde(default)]
    pub topics_owned: u64,
    /// Bytes per second appended to its central WALs, over the last
    /// heartbeat interval.
    #[serde(default)]
    pub bytes_in_per_s: u64,
    /// The lease's time to live, ms.
    pub lease_ttl_ms: u64,
    /// Wall-clock time of this renewal, ms since the Unix epoch.
    pub renewed_at_ms: u64,
    /// Wall-clock time the broker process started, ms since the Unix epoch.
    pub started_at_ms: u64,
}

/// The value of `/cluster/brokers/{id}/{ns}/{topic}`: the broker owns the
/// topic at `epoch`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assignment {
    /// Ownership epoch: one above the topic's previous epoch, starting at 1.
    pub epoch: u64,
    /// When it was assigned, ms since the Unix epoch.
    pub assigned_at_ms: u64,
    /// The broker that owned the topic before (epoch − 1), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_owner: Option<u64>,
    /// Why: `new_topic`, `owner_dead`, `move`, `rebalance`, `drain`,
    /// `pinned`, `local_data`.
    pub reason: String,
}

/// The value of `/cluster/unassigned/{ns}/{topic}`: the topic waits for an
/// owner.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unassigned {
    /// The epoch of the topic's last assignment (0: never assigned).
    #[serde(default)]
    pub last_epoch: u64,
    /// The broker that owned it last, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_owner: Option<u64>,
    /// A broker that should get it if live (one holding its local data
    /// from before ownership existed, or a move's target).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefer: Option<u64>,
    /// Since when, ms since the Unix epoch.
    pub since_ms: u64,
    /// Why: `new_topic`, `local_data`, `released`.
    pub reason: String,
}

/// Namespace of the per-broker system topics that must stay on their
/// broker (the audit topic `/_system/audit-broker-{id}`).
pub const SYSTEM_NAMESPACE: &str = "_system";

/// The broker a topic is pinned to, if any: `/_system/audit-broker-{id}`
/// is written only by broker `id`, so only it may own it.
pub fn pinned_broker(topic: &crate::keys::TopicName) -> Option<u64> {
    if topic.namespace() != SYSTEM_NAMESPACE {
        return None;
    }
    topic.topic().strip_prefix("audit-broker-")?.parse().ok()
}

#[cfg(test)]
mod tests;
