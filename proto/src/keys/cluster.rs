//! Builders for `/cluster/...`.

use super::{MetadataKey, TopicName};

/// `/cluster/leader`.
pub fn leader() -> String {
    MetadataKey::ClusterLeader.to_string()
}

/// `/cluster/id`: the cluster's identity ([`crate::cluster::ClusterId`]).
pub fn id() -> String {
    MetadataKey::ClusterId.to_string()
}

/// `/cluster/register/{broker_id}`.
pub fn register(broker_id: u64) -> String {
    MetadataKey::BrokerRegistration { broker_id }.to_string()
}

/// `/cluster/register/`: every registration.
pub fn register_prefix() -> String {
    "/cluster/register/".to_owned()
}

/// `/cluster/brokers/{broker_id}/state`.
pub fn broker_state(broker_id: u64) -> String {
    MetadataKey::BrokerState { broker_id }.to_string()
}

/// `/cluster/brokers/{broker_id}/{ns}/{topic}`.
pub fn broker_assignment(broker_id: u64, topic: &TopicName) -> String {
    MetadataKey::BrokerAssignment {
        broker_id,
        topic: topic.clone(),
    }
    .to_string()
}

/// `/cluster/brokers/{broker_id}/`: the prefix a broker watches for its
/// assignments. It also matches `.../state`, which
/// [`MetadataKey::parse`] tells apart.
pub fn broker_prefix(broker_id: u64) -> String {
    format!("/cluster/brokers/{broker_id}/")
}

/// `/cluster/unassigned/{ns}/{topic}`.
pub fn unassigned(topic: &TopicName) -> String {
    MetadataKey::Unassigned {
        topic: topic.clone(),
    }
    .to_string()
}

/// `/cluster/unassigned/`: the queue the load manager watches.
pub fn unassigned_prefix() -> String {
    "/cluster/unassigned/".to_owned()
}

/// `/cluster/load/{broker_id}`.
pub fn load(broker_id: u64) -> String {
    MetadataKey::BrokerLoad { broker_id }.to_string()
}

/// `/cluster/load/`: every load report.
pub fn load_prefix() -> String {
    "/cluster/load/".to_owned()
}

/// `/cluster/load_balance`.
pub fn load_balance() -> String {
    MetadataKey::LoadBalance.to_string()
}

/// `/cluster/rebalancing_history/{timestamp_ms:020}`.
pub fn rebalancing_history(timestamp_ms: u64) -> String {
    MetadataKey::RebalancingHistory { timestamp_ms }.to_string()
}

/// `/cluster/rebalancing_history/`: entries list in time order.
pub fn rebalancing_history_prefix() -> String {
    "/cluster/rebalancing_history/".to_owned()
}
