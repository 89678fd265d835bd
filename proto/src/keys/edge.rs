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
