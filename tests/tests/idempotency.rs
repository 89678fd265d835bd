//! HTTP `Idempotency-Key` end to end: a real `edge-agent` process, a batch
//! retried three times (once across a SIGKILL of the agent) is stored once
//! and answered with the same offsets; another body with a used key is
//! refused with 409.

use std::time::Duration;

use serde_json::Value;
use tributary_tests::mqtt::{MqttEdge, read_records};

const RULES: &str = "[[mqtt.topics]]\nfilter = \"#\"\ntopic = \"/plant1/readings\"\n";

fn post(edge: &MqttEdge, key: &str, body: &str) -> (u16, Value) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(30)))
        .http_status_as_error(false)
        .build()
        .into();
    let mut response = agent
        .post(&format!(
            "http://{}/v1/topics/plant1/readings/batch",
            edge.api
        ))
        .header("content-type", "application/x-ndjson")
        .header("idempotency-key", key)
        .send(body.to_owned())
        .expect("post");
    let status = response.status().as_u16();
    (status, response.body_mut().read_json().expect("json"))
}

fn wait_api(edge: &MqttEdge) {
    tributary_test_support::process::wait_for_tcp("edge API", edge.api, Duration::from_secs(10));
}

#[test]
fn a_retried_batch_with_an_idempotency_key_is_stored_once_even_across_a_sigkill() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut edge = MqttEdge::new(dir.path(), "audit_log", RULES);
    edge.start();
    wait_api(&edge);
    let body = "{\"value\":\"a\"}\n{\"value\":\"b\"}\n{\"value\":\"c\"}\n";
    let (status, first) = post(&edge, "order-17", body);
    assert_eq!(status, 200, "{first}");
    assert_eq!(
        (first["base_offset"].as_u64(), first["next_offset"].as_u64()),
        (Some(0), Some(3))
    );
    // Another key in between: its own offsets.
    let (status, other) = post(&edge, "order-18", "{\"value\":\"d\"}\n");
    assert_eq!(status, 200, "{other}");
    assert_eq!(other["base_offset"].as_u64(), Some(3));

    let (status, retry1) = post(&edge, "order-17", body);
    assert_eq!((status, &retry1), (200, &first), "retry 1");
    edge.edge.kill();
    edge.start();
    wait_api(&edge);
    let (status, retry2) = post(&edge, "order-17", body);
    assert_eq!((status, &retry2), (200, &first), "retry 2, after a SIGKILL");
    let (status, retry3) = post(&edge, "order-17", body);
    assert_eq!((status, &retry3), (200, &first), "retry 3");

    let (status, refused) = post(&edge, "order-17", "{\"value\":\"changed\"}\n");
    assert_eq!(status, 409, "{refused}");
    assert_eq!(refused["kind"], "idempotency_key_reused");

    assert_eq!(edge.edge.terminate(), Some(0));
    let values: Vec<String> = read_records(&edge.wal_dir("readings"))
        .into_iter()
        .map(|(_, r)| String::from_utf8_lossy(&r.value).into_owned())
        .collect();
    assert_eq!(
        values,
        ["a", "b", "c", "d"],
        "stored once each, nothing from the refused body"
    );
}
