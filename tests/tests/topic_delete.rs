//! Deleting, centrally, a topic an edge still replicates into (real
//! binaries on 127.0.0.1). The edge is the topic's source of truth: the
//! delete removes the central settings and subscriptions, the owner closes
//! the edge's stream, and the edge's next `Hello` creates the topic again
//! with the edge's intent. Its records keep their offsets: nothing the edge
//! had acknowledged is lost or stored twice, and what it publishes after the
//! delete continues the same log.

use std::time::{Duration, Instant};

use serde_json::Value;
use tributary_tests::cluster::{Pair, TOPIC};

const TOKEN: &str = "e2e-test-token";

fn value(offset: u64) -> String {
    format!("reading-{offset:06}")
}

fn publish(pair: &Pair, next: &mut u64, count: u64) {
    pair.publish_values(next, count, value);
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into()
}

/// (status, JSON body) of `method` on the pair's admin API.
fn admin(pair: &Pair, method: &str, path: &str) -> (u16, Value) {
    admin_with(pair, method, path, &Value::Null)
}

/// (status, JSON body) of `method` with a JSON `body` on the pair's admin
/// API.
fn admin_with(pair: &Pair, method: &str, path: &str, body: &Value) -> (u16, Value) {
    let url = format!("http://{}{path}", pair.broker_admin);
    let auth = format!("Bearer {TOKEN}");
    let response = match method {
        "DELETE" => agent().delete(&url).header("Authorization", &auth).call(),
        "POST" => agent()
            .post(&url)
            .header("Authorization", &auth)
            .header("Content-Type", "application/json")
            .send(body.to_string()),
        _ => agent().get(&url).header("Authorization", &auth).call(),
    };
    let mut response = response.unwrap_or_else(|e| panic!("{method} {url}: {e}"));
    let status = response.status().as_u16();
    let body = response.body_mut().read_json().unwrap_or(Value::Null);
    (status, body)
}

/// A broker and an edge replicating an `event_stream` topic, both up.
fn started(dir: &std::path::Path) -> Pair {
    let mut pair = Pair::new(dir, "event_stream", None);
    pair.broker.start();
    pair.edge.start();
    pair.wait_for_edge();
    pair
}

#[test]
fn a_deleted_edge_fed_topic_comes_back_with_the_edge_and_keeps_its_offsets() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut pair = started(dir.path());
    let mut next = 0;
    for _ in 0..5 {
        publish(&pair, &mut next, 20);
    }
    pair.wait_acknowledged(next, Duration::from_secs(60));
    // A subscription's cursor, which the delete removes with the topic.
    let (records, _) = pair.consume_all("before-delete", next);
    assert_eq!(records.len() as u64, next);

    let (status, deleted) = admin(&pair, "DELETE", &format!("/v1/topics{TOPIC}"));
    assert_eq!(status, 200, "{deleted}");
    assert_eq!(deleted["edge_fed"], Value::Bool(true), "{deleted}");
    assert!(
        deleted["note"]
            .as_str()
            .is_some_and(|n| n.contains("next contact")),
        "{deleted}"
    );

    // The owner closes the stream within its 1 s check; the edge's next
    // Hello creates the topic again, with its intent, at the same offsets.
    let deadline = Instant::now() + Duration::from_secs(30);
    let described = loop {
        let (status, body) = admin(&pair, "GET", &format!("/v1/topics{TOPIC}"));
        if status == 200 {
            break body;
        }
        assert_eq!(status, 404, "{body}");
        assert!(
            Instant::now() < deadline,
            "the topic was not created again: {body}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(described["intent"]["intent"], "event_stream", "{described}");
    for _ in 0..5 {
        publish(&pair, &mut next, 20);
    }
    pair.wait_acknowledged(next, Duration::from_secs(60));

    // Every record once, at its offset, before and after the delete; the
    // old subscription is gone (a new one starts from the earliest offset).
    let (records, gaps) = pair.consume_all("after-delete", next);
    assert!(gaps.is_empty(), "{gaps:?}");
    let offsets: Vec<u64> = records.keys().copied().collect();
    assert_eq!(offsets, (0..next).collect::<Vec<_>>());
    for (offset, got) in &records {
        assert_eq!(got, &value(*offset), "value at {offset}");
    }
    let (status, subscriptions) = admin(
        &pair,
        "GET",
        &format!("/v1/topics{TOPIC}/subscriptions/before-delete"),
    );
    assert_eq!(status, 404, "{subscriptions}");

    assert_eq!(pair.edge.terminate(), Some(0));
    assert_eq!(pair.broker.terminate(), Some(0));
}

/// Deleted and at once created again centrally with another intent than
/// the edge's (before the owner's next check): the owner still closes the
/// edge's stream, and the edge's next contact is refused with `Conflict`
/// naming both intents, so nothing the edge publishes afterwards goes into
/// a topic with other settings (its records went in before).
#[test]
fn an_edge_fed_topic_created_again_with_another_intent_refuses_the_edge() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut pair = started(dir.path());
    let mut next = 0;
    publish(&pair, &mut next, 20);
    pair.wait_acknowledged(next, Duration::from_secs(60));

    let (status, deleted) = admin(&pair, "DELETE", &format!("/v1/topics{TOPIC}"));
    assert_eq!(status, 200, "{deleted}");
    let spec = serde_json::json!({"name": TOPIC, "intent": "task_queue"});
    let (status, created) = admin_with(&pair, "POST", "/v1/topics", &spec);
    assert_eq!(status, 201, "{created}");

    let deadline = Instant::now() + Duration::from_secs(30);
    let reason = loop {
        let health: Value = ureq::get(&format!("http://{}/health", pair.edge_api))
            .call()
            .ok()
            .and_then(|mut r| r.body_mut().read_json().ok())
            .unwrap_or(Value::Null);
        if let Some(reason) = health["replication"]["topics"][0]["stopped"]["reason"].as_str() {
            break reason.to_owned();
        }
        assert!(
            Instant::now() < deadline,
            "the edge was not refused: {health}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        reason.contains("exists centrally with intent task_queue"),
        "{reason}"
    );
    let acknowledged = pair.edge_offsets().expect("edge offsets").1;
    assert_eq!(acknowledged, next);
    publish(&pair, &mut next, 20);
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(pair.edge_offsets().expect("edge offsets").1, acknowledged);

    assert_eq!(pair.edge.terminate(), Some(0));
    assert_eq!(pair.broker.terminate(), Some(0));
}
