//! A topic catalog on a fresh redb metadata store, with the helpers catalog
//! tests share: parsed names and specs, the seed's intent rows as stored
//! JSON, and every key an explicit topic create writes. Used by the
//! catalog's own tests and, through feature `catalog-fixture`, by the
//! broker's manifest, apply and failure-policy tests. Never in a shipped
//! binary.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::catalog::{Catalog, TopicSpec};
use crate::clock::ManualClock;
use crate::metadata::MetadataStore;
use crate::metadata::redb::RedbStore;
use serde_json::{Value, json};
use tributary_proto::keys::{NamespaceName, SubscriptionName, TopicName};

/// A redb metadata store in a temporary directory (removed on drop), its
/// clock standing at 1,000 ms.
#[derive(Debug)]
pub struct CatalogFixture {
    _dir: tempfile::TempDir,
    /// The store.
    pub store: RedbStore,
}

/// A fresh [`CatalogFixture`].
///
/// # Panics
/// If the temporary directory or the store cannot be created.
pub fn fixture() -> CatalogFixture {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = RedbStore::open(
        dir.path().join("meta.redb"),
        Arc::new(ManualClock::new(1_000)),
    )
    .expect("open the metadata store");
    CatalogFixture { _dir: dir, store }
}

impl CatalogFixture {
    /// The catalog over the store.
    pub fn catalog(&self) -> Catalog<'_> {
        Catalog::new(&self.store)
    }

    /// Every key and value in the store.
    ///
    /// # Panics
    /// If listing fails.
    pub async fn dump(&self) -> BTreeMap<String, Value> {
        self.store
            .list("/")
            .await
            .expect("list the store")
            .into_iter()
            .collect()
    }
}

/// A topic name that must be valid.
///
/// # Panics
/// If it is not.
pub fn topic(name: &str) -> TopicName {
    TopicName::new(name).expect("valid topic name")
}

/// A subscription name that must be valid.
///
/// # Panics
/// If it is not.
pub fn sub(name: &str) -> SubscriptionName {
    SubscriptionName::new(name).expect("valid subscription name")
}

/// A namespace name that must be valid.
///
/// # Panics
/// If it is not.
pub fn ns(name: &str) -> NamespaceName {
    NamespaceName::new(name).expect("valid namespace name")
}

/// A topic spec that must be valid.
///
/// # Panics
/// If it is not.
pub fn spec(name: &str, intent: &str, partitions: i64) -> TopicSpec {
    TopicSpec::parse(name, intent, partitions).expect("valid topic spec")
}

/// The seed table's rows (`seeds/000_d502aacc865e81b1.txt`) as stored
/// JSON, written out by hand so a test fails if the code's table drifts.
///
/// # Panics
/// For an intent that is not canonical.
pub fn intent_json(intent: &str) -> Value {
    match intent {
        "realtime" => json!({
            "intent": "realtime", "delivery": "NonReliable", "wal_sync_mode": "async",
            "max_retries": 0, "backoff_ms": 0, "poison_policy": "none",
            "dlq_suffix": null, "persistence": "in_memory"
        }),
        "event_stream" => json!({
            "intent": "event_stream", "delivery": "Reliable",
            "wal_sync_mode": "os_cache_flush", "max_retries": 3, "backoff_ms": 500,
            "poison_policy": "dead_letter", "dlq_suffix": "-dlq", "persistence": "wal"
        }),
        "task_queue" => json!({
            "intent": "task_queue", "delivery": "Reliable", "wal_sync_mode": "fsync_batch",
            "max_retries": 5, "backoff_ms": 1000, "poison_policy": "dead_letter",
            "dlq_suffix": "-dlq", "persistence": "wal"
        }),
        "audit_log" => json!({
            "intent": "audit_log", "delivery": "Reliable", "wal_sync_mode": "fsync_batch",
            "max_retries": 10, "backoff_ms": 500, "poison_policy": "block",
            "dlq_suffix": null, "persistence": "wal"
        }),
        other => panic!("not a canonical intent: {other}"),
    }
}

/// The default namespace policy as stored.
pub fn default_ns_policy() -> Value {
    json!({"max_producers_per_topic": 0, "max_consumers_per_topic": 0, "max_message_size": 0})
}

/// Every key an explicit create of `/{ns}/{name}` with `partitions` writes.
pub fn topic_keys(ns: &str, name: &str, intent: &str, partitions: u32) -> BTreeMap<String, Value> {
    let mut keys = BTreeMap::new();
    let names = std::iter::once((name.to_owned(), partitions))
        .chain((0..partitions).map(|i| (format!("{name}-part-{i}"), 0)));
    for (t, count) in names {
        let delivery = intent_json(intent)["delivery"].clone();
        keys.insert(format!("/topics/{ns}/{t}"), json!(count));
        keys.insert(format!("/topics/{ns}/{t}/intent"), intent_json(intent));
        keys.insert(format!("/topics/{ns}/{t}/delivery"), delivery);
        keys.insert(format!("/namespaces/{ns}/topics/{ns}/{t}"), json!(count));
    }
    keys
}
