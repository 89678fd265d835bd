//! Where dead letters may go, over real HTTP on 127.0.0.1 (the admin and
//! consumer routers in one process over a redb store and real topic
//! WALs): a failure policy's `dead_letter_topic` must be in the
//! subscription's own namespace and not a system topic, both when the
//! policy is set and when a copy is made under a policy stored earlier
//! (nothing is written or created elsewhere; the message waits until the
//! policy is changed, then goes to the new target).

mod served;

use std::time::{Duration, Instant};

use broker_core::catalog::{Catalog, TopicSpec};
use broker_core::metadata::MetadataStore;
use serde_json::{Value, json};
use served::Served;
use tributary_api::consumer::{AttachRequest, NackRequest, StartPosition, SubscriptionType};
use tributary_api::consumer_client::ConsumerClient;
use tributary_broker::consumer::ConsumerConfig;
use tributary_proto::keys::{SubscriptionName, TopicName};

const TOKEN: &str = "dead-letter-test-token";
const ORDERS: &str = "/shop/orders";

struct Harness {
    served: Served,
    client: ConsumerClient,
}

impl Harness {
    fn start() -> Harness {
        let served = Served::consumers(
            TOKEN,
            ConsumerConfig {
                tick_ms: 50,
                policy_refresh_ms: 100,
                ..ConsumerConfig::default()
            },
        );
        Harness {
            client: ConsumerClient::new(&served.base, TOKEN),
            served,
        }
    }

    fn create_topic(&self, name: &str, intent: &str) {
        let spec = TopicSpec::parse(name, intent, 0).unwrap();
        self.served
            .runtime
            .block_on(Catalog::new(self.served.store.as_ref()).create_topic(&spec))
            .unwrap();
    }

    /// `method` on the failure policy of `sub` of [`ORDERS`]: status, body.
    fn policy(&self, method: &str, sub: &str, body: Value) -> (u16, Value) {
        let request = ureq::http::Request::builder()
            .method(method)
            .uri(format!(
                "{}/v1/topics{ORDERS}/subscriptions/{sub}/failure-policy",
                self.served.base
            ))
            .header("Authorization", format!("Bearer {TOKEN}"))
            .header("Content-Type", "application/json")
            .body(body.to_string())
            .unwrap();
        let response = self.served.raw.run(request).unwrap();
        let status = response.status().as_u16();
        let text = response.into_body().read_to_string().unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    /// Stores [`policy`] for `sub` of [`ORDERS`] directly (as a policy
    /// stored before today's checks would be).
    fn store_policy(&self, sub: &str, dead_letter_topic: &str) {
        let key = tributary_proto::keys::topics::subscription_failure_policy(
            &TopicName::new(ORDERS).unwrap(),
            &SubscriptionName::new(sub).unwrap(),
        );
        self.served
            .runtime
            .block_on(self.served.store.put(&key, policy(dead_letter_topic)))
            .unwrap();
    }

    fn keys_under(&self, prefix: &str) -> Vec<String> {
        self.served
            .runtime
            .block_on(self.served.store.list(prefix))
            .unwrap()
            .into_iter()
            .map(|(key, _)| key)
            .collect()
    }
}

fn policy(dead_letter_topic: &str) -> Value {
    json!({
        "max_redelivery_count": 0, "ack_timeout_ms": 30000,
        "base_redelivery_delay_ms": 10, "max_redelivery_delay_ms": 60000,
        "backoff_strategy": "fixed", "poison_policy": "dead_letter",
        "dead_letter_topic": dead_letter_topic
    })
}

#[test]
fn a_dead_letter_topic_outside_the_subscriptions_namespace_or_a_system_one_is_refused() {
    let h = Harness::start();
    h.create_topic(ORDERS, "task_queue");
    for (target, says) in [
        ("/_system/audit-broker-1", "same namespace"),
        ("/default/jobs", "same namespace"),
        ("/plant2/events", "same namespace"),
        ("/shop2/orders-dlq", "same namespace"),
    ] {
        for method in ["PUT", "PATCH"] {
            let body = if method == "PUT" {
                policy(target)
            } else {
                json!({"dead_letter_topic": target})
            };
            let (status, reply) = h.policy(method, "workers", body);
            assert_eq!(status, 400, "{method} {target}: {reply}");
            assert_eq!(reply["kind"], "invalid_input", "{reply}");
            assert_eq!(reply["field"], "dead_letter_topic", "{reply}");
            let error = reply["error"].as_str().unwrap();
            assert!(error.contains(target) && error.contains(says), "{error}");
        }
    }
    // Nothing was stored, nothing created.
    assert!(
        h.keys_under("/topics/shop/orders/subscriptions/")
            .is_empty()
    );
    for ns in ["/topics/plant2/", "/topics/default/", "/topics/shop2/"] {
        assert!(h.keys_under(ns).is_empty(), "{ns}");
    }
    // In the namespace: accepted.
    let (status, reply) = h.policy("PUT", "workers", policy("/shop/orders-poison"));
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["policy"]["dead_letter_topic"], "/shop/orders-poison");
}

/// Attaches a consumer to `workers` of [`ORDERS`] from the earliest
/// offset, publishes one record and nacks it (the policies here allow no
/// redelivery, so the poison policy applies at once).
fn poison_nacked(h: &Harness) -> tributary_api::consumer::NackResponse {
    let consumer = h
        .client
        .attach(
            ORDERS,
            "workers",
            &AttachRequest {
                subscription_type: SubscriptionType::Shared,
                start: StartPosition::Earliest,
                ..AttachRequest::default()
            },
        )
        .unwrap()
        .consumer_id;
    h.client
        .publish(
            ORDERS,
            vec![tributary_api::consumer::PublishRecord {
                value: Some("poison".into()),
                ..Default::default()
            }],
        )
        .unwrap();
    let got = h
        .client
        .receive(ORDERS, "workers", consumer, 1, 3000)
        .unwrap();
    assert_eq!(got.messages[0].offset, 0);
    // No redelivery allowed: the poison policy applies at once.
    h.client
        .nack(
            ORDERS,
            "workers",
            &NackRequest {
                consumer_id: consumer,
                offsets: vec![0],
                delay_ms: None,
                reason: Some("bad".into()),
            },
        )
        .unwrap()
}

#[test]
fn a_stored_policy_naming_another_namespace_copies_nothing_there_until_it_is_changed() {
    let h = Harness::start();
    h.create_topic(ORDERS, "task_queue");
    // A policy stored before the rule: dead letters into an edge's
    // namespace.
    h.store_policy("workers", "/plant2/events");
    let nacked = poison_nacked(&h);
    assert_eq!(nacked.redelivery, Vec::<u64>::new());
    assert_eq!(nacked.dead_lettered, Vec::<u64>::new());
    assert_eq!(nacked.dead_letter_pending, vec![0], "the copy is pending");
    let refused = h
        .client
        .state(ORDERS, "workers")
        .unwrap()
        .dead_letter_refused;
    assert!(
        refused
            .as_deref()
            .is_some_and(|r| r.contains("/plant2/events")),
        "{refused:?}"
    );
    // Several copy attempts' worth of ticks: nothing in /plant2 (no topic
    // created there), and the message is not passed.
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(h.keys_under("/topics/plant2/"), Vec::<String>::new());
    assert_eq!(h.client.state(ORDERS, "workers").unwrap().cursor, 0);
    // Once the policy names a topic of the namespace, the waiting copy
    // goes there and the subscription moves on.
    let (status, reply) = h.policy(
        "PATCH",
        "workers",
        json!({"dead_letter_topic": "/shop/orders-dlq"}),
    );
    assert_eq!(status, 200, "{reply}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let dlq = h.client.peek("/shop/orders-dlq", Some(0), 10);
        if let Ok(dlq) = &dlq
            && dlq.messages.len() == 1
        {
            assert_eq!(dlq.messages[0].value.as_deref(), Some("poison"));
            break;
        }
        assert!(Instant::now() < deadline, "no dead-letter copy: {dlq:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(h.keys_under("/topics/plant2/"), Vec::<String>::new());
}

/// A dead-letter topic an edge started to replicate into after the policy
/// named it (the policy check passed then): the copy is refused as a
/// policy error, the message waits and the subscription's state says why,
/// until the policy names another topic.
#[test]
fn a_dead_letter_topic_that_became_edge_fed_holds_the_message_and_says_why() {
    let h = Harness::start();
    h.create_topic(ORDERS, "task_queue");
    h.store_policy("workers", "/shop/orders-dlq");
    // An edge replicates into it (the marker its first stream writes).
    h.create_topic("/shop/orders-dlq", "event_stream");
    let dlq = TopicName::new("/shop/orders-dlq").unwrap();
    let marker = tributary_broker::replication::topics::Writer::Edge.marker_key(&dlq);
    h.served
        .runtime
        .block_on(h.served.store.put(&marker, json!({"kind": "edge"})))
        .unwrap();

    let nacked = poison_nacked(&h);
    assert_eq!(
        (nacked.dead_lettered, nacked.dead_letter_pending),
        (vec![], vec![0])
    );
    std::thread::sleep(Duration::from_millis(300));
    let state = h.client.state(ORDERS, "workers").unwrap();
    assert_eq!(state.cursor, 0, "the message waits");
    assert!(
        state
            .dead_letter_refused
            .as_deref()
            .is_some_and(|r| r.contains("an edge replicates into it")),
        "{:?}",
        state.dead_letter_refused
    );
    // Another dead-letter topic: the waiting copy goes there.
    let (status, reply) = h.policy(
        "PATCH",
        "workers",
        json!({"dead_letter_topic": "/shop/orders-dead"}),
    );
    assert_eq!(status, 200, "{reply}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let state = h.client.state(ORDERS, "workers").unwrap();
        if state.cursor == 1 {
            assert_eq!(state.dead_letter_refused, None);
            break;
        }
        assert!(Instant::now() < deadline, "not copied: {state:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let copied = h.client.peek("/shop/orders-dead", Some(0), 10).unwrap();
    assert_eq!(copied.messages.len(), 1);
}
