//! Tests of the catalog: creates, implicit topics and load settings,
//! failure policies, describe, listing and delete, against a redb store.

use std::collections::BTreeMap;

use serde_json::json;
use tributary_api::admin::{
    CreateOutcome, DeleteOutcome, Difference, PlanAction, PolicySource, TopicDescription,
    TopicListEntry,
};
use tributary_proto::intent::{
    BackoffStrategy, Delivery, PoisonPolicy, StreamIntent, SubscriptionFailurePolicy,
};

use super::*;
use crate::wal::SyncMode;

use super::fixture::{default_ns_policy, fixture, intent_json, ns, spec, sub, topic, topic_keys};

// ---- create -------------------------------------------------------------

#[tokio::test]
async fn create_writes_every_key_of_the_seed_in_one_transaction() {
    let f = fixture();
    let outcome = f
        .catalog()
        .create_topic(&spec("/default/agent-jobs", "task_queue", 3))
        .await
        .unwrap();
    assert_eq!(
        outcome,
        CreateOutcome {
            topic: topic("/default/agent-jobs"),
            action: PlanAction::Create,
            intent: StreamIntent::TaskQueue,
            partitions: 3,
            namespace_created: true,
        }
    );
    let mut expected = topic_keys("default", "agent-jobs", "task_queue", 3);
    expected.insert("/namespaces/default/policy".into(), default_ns_policy());
    assert_eq!(f.dump().await, expected);
    assert_eq!(expected.len(), 1 + 4 * 4);
}

#[tokio::test]
async fn every_intent_and_alias_stores_the_canonical_expansion() {
    let f = fixture();
    let cases = [
        ("telemetry_firehose", "realtime"),
        ("agent_event_mesh", "event_stream"),
        ("work_queue", "task_queue"),
        ("tool_invocation_log", "audit_log"),
    ];
    let mut expected = BTreeMap::new();
    expected.insert("/namespaces/n/policy".to_owned(), default_ns_policy());
    for (alias, canonical) in cases {
        let name = format!("/n/{canonical}");
        let outcome = f
            .catalog()
            .create_topic(&spec(&name, alias, 0))
            .await
            .unwrap();
        assert_eq!(outcome.intent.as_str(), canonical);
        expected.extend(topic_keys("n", canonical, canonical, 0));
        // The canonical name is the same topic: unchanged.
        let again = f
            .catalog()
            .create_topic(&spec(&name, canonical, 0))
            .await
            .unwrap();
        assert_eq!(again.action, PlanAction::Unchanged);
        assert!(!again.namespace_created);
    }
    assert_eq!(f.dump().await, expected);
    assert_eq!(
        f.dump().await["/topics/n/realtime/delivery"],
        json!("NonReliable")
    );
}

#[tokio::test]
async fn create_is_idempotent_and_conflicts_name_every_differing_field() {
    let f = fixture();
    let c = f.catalog();
    c.create_topic(&spec("/default/agent-jobs", "task_queue", 3))
        .await
        .unwrap();
    let before = f.dump().await;
    let again = c
        .create_topic(&spec("/default/agent-jobs", "tasks", 3))
        .await
        .unwrap();
    assert_eq!(again.action, PlanAction::Unchanged);
    let err = c
        .create_topic(&spec("/default/agent-jobs", "audit_log", 6))
        .await
        .unwrap_err();
    let CatalogError::TopicConflict { differences, .. } = &err else {
        panic!("{err:?}");
    };
    assert_eq!(
        differences,
        &vec![
            Difference::new("partitions", 3, 6),
            Difference::new("intent", "task_queue", "audit_log"),
        ]
    );
    assert_eq!(
        err.to_string(),
        "topic /default/agent-jobs already exists with different settings: \
         partitions: existing 3, requested 6; intent: existing task_queue, requested audit_log"
    );
    // A stored setting that drifted from the table is named field by field.
    let intent_key = "/topics/default/agent-jobs/intent";
    let mut drifted = intent_json("task_queue");
    drifted["max_retries"] = json!(7);
    f.store.put(intent_key, drifted).await.unwrap();
    let err = c
        .create_topic(&spec("/default/agent-jobs", "task_queue", 3))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, CatalogError::TopicConflict { differences, .. }
            if differences == &vec![Difference::new("max_retries", 7, 5)]),
        "{err:?}"
    );
    f.store
        .put(intent_key, intent_json("task_queue"))
        .await
        .unwrap();
    assert_eq!(f.dump().await, before);
}

#[tokio::test]
async fn a_taken_partition_name_refuses_the_whole_create() {
    let f = fixture();
    let c = f.catalog();
    c.create_implicit(&topic("/default/jobs-part-1"), false)
        .await
        .unwrap();
    let before = f.dump().await;
    let err = c
        .create_topic(&spec("/default/jobs", "task_queue", 2))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, CatalogError::TopicConflict { differences, .. }
        if differences == &vec![Difference::new(
            "partitions",
            "topic /default/jobs-part-1 exists",
            "2 partitions"
        )]),
        "{err:?}"
    );
    assert_eq!(f.dump().await, before, "nothing half-applied");
}

#[tokio::test]
async fn concurrent_creates_apply_once() {
    let f = fixture();
    let s = spec("/default/agent-jobs", "task_queue", 8);
    let c = f.catalog();
    let (a, b) = tokio::join!(c.create_topic(&s), c.create_topic(&s));
    let mut actions = [a.unwrap().action, b.unwrap().action];
    actions.sort_by_key(|a| a.as_str());
    assert_eq!(actions, [PlanAction::Create, PlanAction::Unchanged]);
    let mut expected = topic_keys("default", "agent-jobs", "task_queue", 8);
    expected.insert("/namespaces/default/policy".into(), default_ns_policy());
    assert_eq!(f.dump().await, expected);
}

#[test]
fn invalid_create_requests_name_the_field() {
    let err = TopicSpec::parse("/default/x", "nope", 0).unwrap_err();
    assert_eq!(err.field(), Some("intent"));
    assert_eq!(
        err.to_string(),
        format!(
            "intent: unknown stream intent \"nope\"; valid intents: {}",
            tributary_proto::intent::valid_intent_names()
        )
    );
    for (partitions, shown) in [(-1, "-1"), (257, "257"), (i64::MAX, "9223372036854775807")] {
        let err = TopicSpec::parse("/default/x", "task_queue", partitions).unwrap_err();
        assert_eq!(err.field(), Some("partitions"));
        assert_eq!(
            err.to_string(),
            format!("partitions: must be a whole number from 0 to 256, got {shown}")
        );
    }
    let err = TopicSpec::parse("default/x", "task_queue", 0).unwrap_err();
    assert_eq!(err.field(), Some("name"));
    assert_eq!(
        err.to_string(),
        "name: invalid topic name \"default/x\": topic name must start with '/'"
    );
    // Partition and dead-letter names must fit too.
    let long = format!("/n/{}", "t".repeat(250));
    assert!(TopicSpec::parse(&long, "audit_log", 0).is_ok());
    let err = TopicSpec::parse(&long, "audit_log", 2).unwrap_err();
    assert_eq!(err.field(), Some("name"));
    let err = TopicSpec::parse(&long, "task_queue", 0).unwrap_err();
    assert!(err.to_string().contains("-dlq"), "{err}");
    assert_eq!(
        spec("/default/x", "tasks", 256).partition_names().len(),
        256
    );
}

// ---- implicit topics and load settings ----------------------------------

#[tokio::test]
async fn implicit_creation_uses_the_broker_fallback() {
    let f = fixture();
    let c = f.catalog();
    let t = topic("/edge1/sensors");
    let outcome = c.create_implicit(&t, false).await.unwrap();
    let fallback = TopicLoadSettings {
        delivery: Delivery::NonReliable,
        wal_sync_mode: SyncMode::OsCacheFlush,
        intent: None,
    };
    assert_eq!(
        outcome,
        ImplicitOutcome {
            created: true,
            namespace_created: true,
            settings: fallback.clone(),
        }
    );
    let expected: BTreeMap<String, Value> = [
        ("/namespaces/edge1/policy", default_ns_policy()),
        ("/namespaces/edge1/topics/edge1/sensors", json!(0)),
        ("/topics/edge1/sensors", json!(0)),
        ("/topics/edge1/sensors/delivery", json!("NonReliable")),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    assert_eq!(f.dump().await, expected);
    // The existing topic wins over a later reliable request.
    let again = c.create_implicit(&t, true).await.unwrap();
    assert_eq!(
        again,
        ImplicitOutcome {
            created: false,
            namespace_created: false,
            settings: fallback,
        }
    );
    assert_eq!(c.sync_mode_for(&t).await.unwrap(), SyncMode::OsCacheFlush);
    let reliable = c
        .create_implicit(&topic("/edge1/reliable"), true)
        .await
        .unwrap();
    assert_eq!(reliable.settings.delivery, Delivery::Reliable);
    assert!(!reliable.namespace_created);

    let view = c.attach_subscription(&t, &sub("s1")).await.unwrap();
    assert_eq!(view.source, PolicySource::BrokerFallback);
    assert_eq!(
        f.dump().await["/topics/edge1/sensors/subscriptions/s1/failure_policy"],
        json!({
            "max_redelivery_count": 5, "ack_timeout_ms": 30000,
            "base_redelivery_delay_ms": 1000, "max_redelivery_delay_ms": 60000,
            "backoff_strategy": "exponential", "poison_policy": "block",
            "dead_letter_topic": null
        })
    );
    // An explicit create of an implicit topic is a conflict.
    let err = c
        .create_topic(&spec("/edge1/sensors", "task_queue", 0))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, CatalogError::TopicConflict { differences, .. }
        if differences == &vec![
            Difference::new("intent", "none (implicit topic)", "task_queue"),
            Difference::new("delivery", "NonReliable", "Reliable"),
        ]),
        "{err:?}"
    );
}

#[tokio::test]
async fn the_wal_sync_mode_is_the_persisted_one() {
    let f = fixture();
    let c = f.catalog();
    for (intent, mode) in [
        ("realtime", SyncMode::Async),
        ("event_stream", SyncMode::OsCacheFlush),
        ("task_queue", SyncMode::FsyncBatch),
        ("audit_log", SyncMode::FsyncBatch),
    ] {
        let t = topic(&format!("/n/{intent}"));
        c.create_topic(&spec(t.as_str(), intent, 1)).await.unwrap();
        assert_eq!(c.sync_mode_for(&t).await.unwrap(), mode, "{intent}");
        let partition = t.partition(0).unwrap();
        assert_eq!(c.sync_mode_for(&partition).await.unwrap(), mode);
    }
    // What is stored is what is used, even if the table says otherwise.
    let mut stored = intent_json("task_queue");
    stored["wal_sync_mode"] = json!("os_cache_flush");
    f.store
        .put("/topics/n/task_queue/intent", stored)
        .await
        .unwrap();
    assert_eq!(
        c.sync_mode_for(&topic("/n/task_queue")).await.unwrap(),
        SyncMode::OsCacheFlush
    );
    assert!(matches!(
        c.sync_mode_for(&topic("/n/missing")).await,
        Err(CatalogError::TopicNotFound { .. })
    ));
    f.store
        .put(
            "/topics/n/task_queue/intent",
            json!({"intent": "task_queue"}),
        )
        .await
        .unwrap();
    assert!(matches!(
        c.sync_mode_for(&topic("/n/task_queue")).await,
        Err(CatalogError::Inconsistent { key, .. }) if key == "/topics/n/task_queue/intent"
    ));
}

// ---- failure policies ---------------------------------------------------

fn policy_json(max: u32, base: u64, poison: &str, dlq: Option<&str>) -> Value {
    json!({
        "max_redelivery_count": max, "ack_timeout_ms": 30000,
        "base_redelivery_delay_ms": base, "max_redelivery_delay_ms": 60000,
        "backoff_strategy": "exponential", "poison_policy": poison,
        "dead_letter_topic": dlq
    })
}

#[tokio::test]
async fn first_attach_inherits_from_the_intent_and_persists() {
    let f = fixture();
    let c = f.catalog();
    let cases = [
        ("realtime", policy_json(0, 0, "none", None)),
        (
            "event_stream",
            policy_json(3, 500, "dead_letter", Some("/default/event_stream-dlq")),
        ),
        (
            "task_queue",
            policy_json(5, 1000, "dead_letter", Some("/default/task_queue-dlq")),
        ),
        ("audit_log", policy_json(10, 500, "block", None)),
    ];
    for (intent, expected) in cases {
        let t = topic(&format!("/default/{intent}"));
        c.create_topic(&spec(t.as_str(), intent, 0)).await.unwrap();
        let s = sub("worker-pool");
        let before = c.failure_policy(&t, &s).await.unwrap();
        assert!(!before.persisted);
        assert_eq!(before.source, PolicySource::Intent);
        let view = c.attach_subscription(&t, &s).await.unwrap();
        assert_eq!(
            serde_json::to_value(&view).unwrap(),
            json!({
                "topic": t.as_str(), "subscription": "worker-pool",
                "persisted": true, "source": "intent", "policy": expected
            }),
            "{intent}"
        );
        let key = format!("/topics/default/{intent}/subscriptions/worker-pool/failure_policy");
        assert_eq!(f.dump().await[&key], expected, "{intent}");
        let second = c.attach_subscription(&t, &s).await.unwrap();
        assert_eq!(second.source, PolicySource::Stored);
        assert_eq!(second.policy, view.policy);
    }
    assert!(matches!(
        c.attach_subscription(&topic("/default/missing"), &sub("s"))
            .await,
        Err(CatalogError::TopicNotFound { .. })
    ));
}

#[tokio::test]
async fn overrides_win_and_are_never_overwritten() {
    let f = fixture();
    let c = f.catalog();
    let t = topic("/default/agent-jobs");
    c.create_topic(&spec(t.as_str(), "task_queue", 0))
        .await
        .unwrap();
    let override_policy = SubscriptionFailurePolicy {
        max_redelivery_count: 8,
        ack_timeout_ms: 45_000,
        base_redelivery_delay_ms: 1000,
        max_redelivery_delay_ms: 60_000,
        backoff_strategy: BackoffStrategy::Exponential,
        poison_policy: PoisonPolicy::DeadLetter,
        dead_letter_topic: Some("/default/agent-jobs-dlq".into()),
    };
    // Attached first, then overridden.
    c.attach_subscription(&t, &sub("worker-pool"))
        .await
        .unwrap();
    let set = c
        .set_failure_policy(&t, &sub("worker-pool"), &override_policy)
        .await
        .unwrap();
    assert_eq!(set.source, PolicySource::Stored);
    // Overridden before any consumer attached.
    c.set_failure_policy(&t, &sub("auditors"), &override_policy)
        .await
        .unwrap();
    for name in ["worker-pool", "auditors"] {
        let view = c.attach_subscription(&t, &sub(name)).await.unwrap();
        assert_eq!(view.policy, override_policy, "{name}");
        assert_eq!(view.source, PolicySource::Stored);
    }
    // Other subscriptions still inherit.
    let other = c.attach_subscription(&t, &sub("other")).await.unwrap();
    assert_eq!(other.policy.max_redelivery_count, 5);
    assert_eq!(
        f.dump().await["/topics/default/agent-jobs/subscriptions/worker-pool/failure_policy"],
        json!({
            "max_redelivery_count": 8, "ack_timeout_ms": 45000,
            "base_redelivery_delay_ms": 1000, "max_redelivery_delay_ms": 60000,
            "backoff_strategy": "exponential", "poison_policy": "dead_letter",
            "dead_letter_topic": "/default/agent-jobs-dlq"
        })
    );
}

#[tokio::test]
async fn concurrent_first_attaches_persist_one_policy() {
    let f = fixture();
    let c = f.catalog();
    let t = topic("/default/jobs");
    c.create_topic(&spec(t.as_str(), "task_queue", 0))
        .await
        .unwrap();
    let s = sub("pool");
    let (a, b) = tokio::join!(c.attach_subscription(&t, &s), c.attach_subscription(&t, &s));
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a.policy, b.policy);
    let mut sources = [a.source, b.source];
    sources.sort_by_key(|s| *s == PolicySource::Stored);
    assert_eq!(sources, [PolicySource::Intent, PolicySource::Stored]);
}

#[tokio::test]
async fn set_validates_and_names_the_field() {
    let f = fixture();
    let c = f.catalog();
    let t = topic("/default/jobs");
    c.create_topic(&spec(t.as_str(), "task_queue", 0))
        .await
        .unwrap();
    let s = sub("pool");
    let good = c.failure_policy(&t, &s).await.unwrap().policy;
    let before = f.dump().await;
    type Change = fn(&mut SubscriptionFailurePolicy);
    let cases: [(Change, &str, &str); 7] = [
        (
            |p| p.dead_letter_topic = Some("/default/jobs".into()),
            "dead_letter_topic",
            "dead_letter_topic /default/jobs is the subscription's own topic: each \
             dead-lettered message would be delivered to it again, forever",
        ),
        (
            |p| p.ack_timeout_ms = 0,
            "ack_timeout_ms",
            "ack_timeout_ms must be above 0",
        ),
        (
            |p| p.base_redelivery_delay_ms = 70_000,
            "base_redelivery_delay_ms",
            "base_redelivery_delay_ms 70000 exceeds \
             max_redelivery_delay_ms 60000",
        ),
        (
            |p| p.dead_letter_topic = None,
            "dead_letter_topic",
            "poison_policy dead_letter requires dead_letter_topic",
        ),
        (
            |p| p.dead_letter_topic = Some("jobs-dlq".into()),
            "dead_letter_topic",
            "dead_letter_topic: invalid topic name \"jobs-dlq\": \
             topic name must start with '/'",
        ),
        (
            |p| p.max_redelivery_count = 10_001,
            "max_redelivery_count",
            "max_redelivery_count: 10001 is above the limit of 10000",
        ),
        (
            |p| p.ack_timeout_ms = 86_400_001,
            "ack_timeout_ms",
            "ack_timeout_ms: 86400001 is above the limit of 86400000",
        ),
    ];
    for (change, field, message) in cases {
        let mut bad = good.clone();
        change(&mut bad);
        let err = c.set_failure_policy(&t, &s, &bad).await.unwrap_err();
        assert_eq!(err.field(), Some(field));
        assert_eq!(err.to_string(), message);
    }
    assert_eq!(f.dump().await, before, "nothing stored");
    assert!(matches!(
        c.set_failure_policy(&topic("/default/none"), &s, &good)
            .await,
        Err(CatalogError::TopicNotFound { .. })
    ));
}

// ---- describe, list, delete ---------------------------------------------

#[tokio::test]
async fn describe_matches_the_seed_sample() {
    let f = fixture();
    let c = f.catalog();
    let t = topic("/default/agent-jobs");
    c.create_topic(&spec(t.as_str(), "task_queue", 3))
        .await
        .unwrap();
    c.attach_subscription(&t, &sub("worker-pool"))
        .await
        .unwrap();
    f.store
        .put(
            "/topics/default/agent-jobs/subscriptions/metrics/cursor",
            json!(17),
        )
        .await
        .unwrap();
    f.store
        .put("/cluster/brokers/1/default/agent-jobs", json!({}))
        .await
        .unwrap();
    let description = c.describe(&t, &[3, 1, 2]).await.unwrap();
    assert_eq!(
        description.intent_summary,
        "task_queue (delivery=reliable, wal_sync=fsync_batch, max_retries=5, \
         backoff_ms=1000, poison_policy=dead_letter, dlq=/default/agent-jobs-dlq)"
    );
    assert_eq!(
        serde_json::to_value(&description).unwrap(),
        json!({
            "topic": "/default/agent-jobs",
            "broker_id": 1,
            "partitions": 3,
            "partition_topics": [
                "/default/agent-jobs-part-0",
                "/default/agent-jobs-part-1",
                "/default/agent-jobs-part-2"
            ],
            "delivery": "Reliable",
            "wal_sync_mode": "fsync_batch",
            "intent": intent_json("task_queue"),
            "intent_summary": description.intent_summary,
            "subscriptions": [
                {"name": "metrics", "failure_policy": null},
                {
                    "name": "worker-pool",
                    "failure_policy": policy_json(
                        5, 1000, "dead_letter", Some("/default/agent-jobs-dlq")
                    )
                }
            ]
        })
    );
    let round_trip: TopicDescription =
        serde_json::from_value(serde_json::to_value(&description).unwrap()).unwrap();
    assert_eq!(round_trip, description);
    assert_eq!(c.describe(&t, &[2]).await.unwrap().broker_id, None);

    let implicit = topic("/default/auto");
    c.create_implicit(&implicit, false).await.unwrap();
    let d = c.describe(&implicit, &[]).await.unwrap();
    assert_eq!(
        d.intent_summary,
        "none (implicit topic: wal_sync=os_cache_flush, broker fallback failure policy)"
    );
    assert_eq!(d.delivery, Delivery::NonReliable);
    assert_eq!(d.intent, None);
    assert!(matches!(
        c.describe(&topic("/default/none"), &[]).await,
        Err(CatalogError::TopicNotFound { topic }) if topic.as_str() == "/default/none"
    ));
}

#[tokio::test]
async fn namespaces_and_listing() {
    let f = fixture();
    let c = f.catalog();
    assert_eq!(
        c.create_namespace(&ns("default")).await.unwrap(),
        PlanAction::Create
    );
    f.store
        .put(
            "/namespaces/default/policy",
            json!({"max_producers_per_topic": 4, "max_consumers_per_topic": 0, "max_message_size": 0}),
        )
        .await
        .unwrap();
    assert_eq!(
        c.create_namespace(&ns("default")).await.unwrap(),
        PlanAction::Unchanged
    );
    assert_eq!(
        f.dump().await["/namespaces/default/policy"]["max_producers_per_topic"],
        json!(4),
        "an existing policy is kept"
    );
    c.create_topic(&spec("/default/b", "tasks", 2))
        .await
        .unwrap();
    c.create_topic(&spec("/default/a", "events", 0))
        .await
        .unwrap();
    c.create_topic(&spec("/agents/c", "audit", 0))
        .await
        .unwrap();
    // Named like a partition, but its "parent" has none: listed.
    c.create_implicit(&topic("/agents/c-part-0"), false)
        .await
        .unwrap();
    assert_eq!(
        c.list_namespaces().await.unwrap(),
        vec![ns("agents"), ns("default")]
    );
    let entry = |name: &str, partitions| TopicListEntry {
        name: topic(name),
        partitions,
    };
    assert_eq!(
        c.list_topics(None).await.unwrap(),
        vec![
            entry("/agents/c", 0),
            entry("/agents/c-part-0", 0),
            entry("/default/a", 0),
            entry("/default/b", 2),
        ]
    );
    assert_eq!(
        c.list_topics(Some(&ns("default"))).await.unwrap(),
        vec![entry("/default/a", 0), entry("/default/b", 2)]
    );
    let err = c.list_topics(Some(&ns("nope"))).await.unwrap_err();
    assert_eq!(err.to_string(), "namespace nope does not exist");
}

#[tokio::test]
async fn delete_removes_the_topic_its_partitions_and_everything_under_them() {
    let f = fixture();
    let c = f.catalog();
    c.create_topic(&spec("/default/keep", "tasks", 0))
        .await
        .unwrap();
    let before = f.dump().await;
    let t = topic("/default/jobs");
    c.create_topic(&spec(t.as_str(), "task_queue", 2))
        .await
        .unwrap();
    c.attach_subscription(&t, &sub("a")).await.unwrap();
    c.attach_subscription(&t.partition(0).unwrap(), &sub("a"))
        .await
        .unwrap();
    f.store
        .put(
            "/topics/default/jobs-part-1/subscriptions/a/cursor",
            json!(5),
        )
        .await
        .unwrap();
    let err = c.delete_topic(&t.partition(1).unwrap()).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "topic /default/jobs-part-1 is partition 1 of /default/jobs; delete /default/jobs instead"
    );
    let outcome = c.delete_topic(&t).await.unwrap();
    assert_eq!(
        outcome,
        DeleteOutcome {
            topic: t.clone(),
            partitions: 2,
            deleted_keys: 15,
            edge_fed: false,
            note: None,
        }
    );
    assert_eq!(f.dump().await, before);
    assert!(matches!(
        c.delete_topic(&t).await,
        Err(CatalogError::TopicNotFound { .. })
    ));
}
