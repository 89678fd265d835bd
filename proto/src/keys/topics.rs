//! Builders for `/topics/...`.

use super::{MetadataKey, NamespaceName, SubscriptionKey, SubscriptionName, TopicKey, TopicName};

fn key(topic: &TopicName, key: TopicKey) -> String {
    MetadataKey::Topic {
        topic: topic.clone(),
        key,
    }
    .to_string()
}

fn subscription_key(topic: &TopicName, name: &SubscriptionName, kind: SubscriptionKey) -> String {
    key(
        topic,
        TopicKey::Subscription {
            name: name.clone(),
            key: kind,
        },
    )
}

/// `/topics/{ns}/{topic}`: existence marker (partition count).
pub fn marker(topic: &TopicName) -> String {
    key(topic, TopicKey::Marker)
}

/// `/topics/{ns}/{topic}/delivery`.
pub fn delivery(topic: &TopicName) -> String {
    key(topic, TopicKey::Delivery)
}

/// `/topics/{ns}/{topic}/policy`.
pub fn policy(topic: &TopicName) -> String {
    key(topic, TopicKey::Policy)
}

/// `/topics/{ns}/{topic}/intent`.
pub fn intent(topic: &TopicName) -> String {
    key(topic, TopicKey::Intent)
}

/// `/topics/{ns}/{topic}/producers/{producer_id}`.
pub fn producer(topic: &TopicName, producer_id: u64) -> String {
    key(topic, TopicKey::Producer { producer_id })
}

/// `/topics/{ns}/{topic}/producers/`.
pub fn producers_prefix(topic: &TopicName) -> String {
    format!("/topics{topic}/producers/")
}

/// `/topics/{ns}/{topic}/idempotency/{hex key}`: the `Idempotency-Key`
/// of a central publish, `key` as given (hex-encoded here).
pub fn idempotency(topic: &TopicName, key: &str) -> String {
    use std::fmt::Write as _;
    let mut key_hex = String::with_capacity(key.len() * 2);
    for b in key.bytes() {
        let _ = write!(key_hex, "{b:02x}");
    }
    self::key(topic, TopicKey::Idempotency { key_hex })
}

/// `/topics/{ns}/{topic}/holes/{first_offset:020}`: a hole declared by the
/// edge (JSON `{first_offset, end_offset, cause, reason, declared_at_ms}`,
/// written by the broker's ingest).
pub fn hole(topic: &TopicName, first_offset: u64) -> String {
    key(topic, TopicKey::Hole { first_offset })
}

/// `/topics/{ns}/{topic}/holes/`: lists the declared holes in offset order.
pub fn holes_prefix(topic: &TopicName) -> String {
    format!("/topics{topic}/holes/")
}

/// `/topics/{ns}/{topic}/subscriptions/{sub}`.
pub fn subscription(topic: &TopicName, name: &SubscriptionName) -> String {
    subscription_key(topic, name, SubscriptionKey::Metadata)
}

/// `/topics/{ns}/{topic}/subscriptions/{sub}/cursor`.
pub fn subscription_cursor(topic: &TopicName, name: &SubscriptionName) -> String {
    subscription_key(topic, name, SubscriptionKey::Cursor)
}

/// `/topics/{ns}/{topic}/subscriptions/{sub}/acked`: offsets finished
/// above the cursor (`{"cursor": C, "ranges": [[first, end], …]}`).
pub fn subscription_acked(topic: &TopicName, name: &SubscriptionName) -> String {
    subscription_key(topic, name, SubscriptionKey::Acked)
}

/// `/topics/{ns}/{topic}/subscriptions/{sub}/failure_policy`.
pub fn subscription_failure_policy(topic: &TopicName, name: &SubscriptionName) -> String {
    subscription_key(topic, name, SubscriptionKey::FailurePolicy)
}

/// `/topics/{ns}/{topic}/subscriptions/{sub}/dispatch_config`.
pub fn subscription_dispatch_config(topic: &TopicName, name: &SubscriptionName) -> String {
    subscription_key(topic, name, SubscriptionKey::DispatchConfig)
}

/// `/topics/{ns}/{topic}/subscriptions/`: every subscription key of a
/// topic, sub-keys included; [`super::parse_subscription_key`] sorts
/// them out.
pub fn subscriptions_prefix(topic: &TopicName) -> String {
    format!("/topics{topic}/subscriptions/")
}

/// `/topics/{ns}/{topic}/`: every sub-key of one topic (not the marker,
/// and not topics whose name merely starts with this one's).
pub fn topic_prefix(topic: &TopicName) -> String {
    format!("/topics{topic}/")
}

/// `/topics/{ns}/`: every key of every topic in a namespace.
pub fn namespace_prefix(namespace: &NamespaceName) -> String {
    format!("/topics/{namespace}/")
}

/// `/topics/`: every topic key.
pub fn all_prefix() -> String {
    "/topics/".to_owned()
}
