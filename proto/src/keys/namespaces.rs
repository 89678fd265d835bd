//! Builders for `/namespaces/...`.

use super::{MetadataKey, NamespaceName, TopicName};

/// `/namespaces/{ns}/policy`.
pub fn policy(namespace: &NamespaceName) -> String {
    MetadataKey::NamespacePolicy {
        namespace: namespace.clone(),
    }
    .to_string()
}

/// `/namespaces/{ns}/topics/{ns}/{topic}`.
pub fn topic(topic: &TopicName) -> String {
    MetadataKey::NamespaceTopic {
        topic: topic.clone(),
    }
    .to_string()
}

/// `/namespaces/{ns}/topics/`: the topic registry of a namespace.
pub fn topics_prefix(namespace: &NamespaceName) -> String {
    format!("/namespaces/{namespace}/topics/")
}

/// `/namespaces/{ns}/`: everything of one namespace.
pub fn prefix(namespace: &NamespaceName) -> String {
    format!("/namespaces/{namespace}/")
}

/// `/namespaces/`: every namespace.
pub fn all_prefix() -> String {
    "/namespaces/".to_owned()
}
