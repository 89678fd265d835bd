//! What this broker knows of `/cluster/*`: brokers (with their lease),
//! assignments and the unassigned queue, kept from a watch on `/cluster/`.
//! Pure: entries go in with [`View::apply`], time comes in as `now_ms`.

use std::collections::BTreeMap;

use tributary_proto::cluster::placement::ClusterSnapshot;
use tributary_proto::cluster::{Assignment, BrokerState, Unassigned};
use tributary_proto::keys::{MetadataKey, TopicName};

/// `/cluster/*` as last seen.
#[derive(Debug, Clone, Default)]
pub struct View {
    /// `/cluster/brokers/{id}/state`, by id (lapsed leases included until
    /// purged; [`View::is_live`] tells them apart).
    pub brokers: BTreeMap<u64, BrokerState>,
    /// Topic → owner and assignment.
    pub owners: BTreeMap<TopicName, (u64, Assignment)>,
    /// Topics waiting for an owner.
    pub unassigned: BTreeMap<TopicName, Unassigned>,
}

impl View {
    /// Applies a put (`Some`) or delete (`None`) of `key`; keys outside
    /// the three kinds above, and values that do not decode, are ignored
    /// (a value that does not decode is logged).
    pub fn apply(&mut self, key: &str, value: Option<&serde_json::Value>) {
        let Ok(parsed) = MetadataKey::parse(key) else {
            return;
        };
        fn decode<T: serde::de::DeserializeOwned>(key: &str, v: &serde_json::Value) -> Option<T> {
            match serde_json::from_value(v.clone()) {
                Ok(value) => Some(value),
                Err(e) => {
                    tracing::warn!(key, error = %e, "ignoring a cluster entry that does not decode");
                    None
                }
            }
        }
        match parsed {
            MetadataKey::BrokerState { broker_id } => match value.and_then(|v| decode(key, v)) {
                Some(state) => {
                    self.brokers.insert(broker_id, state);
                }
                None => {
                    self.brokers.remove(&broker_id);
                }
            },
            MetadataKey::BrokerAssignment { broker_id, topic } => {
                match value.and_then(|v| decode::<Assignment>(key, v)) {
                    Some(assignment) => {
                        // A newer epoch wins over a stale entry not yet deleted.
                        let keep_old = self
                            .owners
                            .get(&topic)
                            .is_some_and(|(_, old)| old.epoch > assignment.epoch);
                        if !keep_old {
                            self.owners.insert(topic, (broker_id, assignment));
                        }
                    }
                    None => {
                        if self
                            .owners
                            .get(&topic)
                            .is_some_and(|(b, _)| *b == broker_id)
                        {
                            self.owners.remove(&topic);
                        }
                    }
                }
            }
            MetadataKey::Unassigned { topic } => match value.and_then(|v| decode(key, v)) {
                Some(waiting) => {
                    self.unassigned.insert(topic, waiting);
                }
                None => {
                    self.unassigned.remove(&topic);
                }
            },
            _ => {}
        }
    }

    /// Whether broker `id`'s lease is held at `now_ms` (wall clock, ms).
    pub fn is_live(&self, id: u64, now_ms: u64) -> bool {
        self.brokers
            .get(&id)
            .is_some_and(|s| s.renewed_at_ms.saturating_add(s.lease_ttl_ms) > now_ms)
    }

    /// The load manager's input at `now_ms`.
    pub fn snapshot(&self, now_ms: u64) -> ClusterSnapshot {
        ClusterSnapshot {
            live: self
                .brokers
                .iter()
                .filter(|(id, _)| self.is_live(**id, now_ms))
                .map(|(id, s)| (*id, s.lifecycle))
                .collect(),
            assignments: self.owners.clone(),
            unassigned: self.unassigned.clone(),
            takeovers_from_ms: 0,
            unreachable: Default::default(),
        }
    }

    /// Topics owned by broker `id`.
    pub fn owned_by(&self, id: u64) -> usize {
        self.owners.values().filter(|(b, _)| *b == id).count()
    }
}
