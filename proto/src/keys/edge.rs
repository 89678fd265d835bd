//! Builders for `/edge/...`.

use super::{MetadataKey, TopicName};

/// `/edge/checkpoints/{ns}/{topic}`.
pub fn checkpoint(topic: &TopicName) -> String {
    MetadataKey::EdgeCheckpoint {
        topic: topic.clone(),
    }
    .to_string()
}

/// `/edge/checkpoints/`: every checkpoint.
pub fn checkpoints_prefix() -> String {
    "/edge/checkpoints/".to_owned()
}

/// `/edge/archived/{ns}/{topic}`: the topic's archived offset (JSON
/// number), beside its checkpoint.
pub fn archived(topic: &TopicName) -> String {
    MetadataKey::EdgeArchived {
        topic: topic.clone(),
    }
    .to_string()
}

/// `/edge/cluster`: the id of the central cluster the edge's checkpoints
/// and archived offsets belong to (JSON string,
/// [`crate::cluster::ClusterId`]).
pub fn cluster() -> String {
    MetadataKey::EdgeCluster.to_string()
}

/// `/edge/mqtt/sessions/{hex}`: an MQTT persistent session of the edge
/// agent's listener (JSON: client id and the QoS 2 packet ids in flight),
/// `{hex}` being the client id's bytes in lower-case hex (client ids may
/// hold any character).
pub fn mqtt_session(client_id: &str) -> String {
    use std::fmt::Write;
    let mut key = String::with_capacity(21 + 2 * client_id.len());
    key.push_str(MQTT_SESSIONS_PREFIX);
    for b in client_id.bytes() {
        let _ = write!(key, "{b:02x}");
    }
    key
}

/// `/edge/mqtt/sessions/`: every MQTT persistent session.
pub const MQTT_SESSIONS_PREFIX: &str = "/edge/mqtt/sessions/";
