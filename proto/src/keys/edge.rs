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
