//! HTTP publishes with a retry check (`Idempotency-Key`, NDJSON
//! `producer_id` + `sequence`) that a crash left unanswered: the agent
//! settles their markers when it starts, so a retry of a stored request
//! gets its original offsets and one that never reached the WAL is stored
//! once. The crash states are written as a SIGKILL leaves them (records in
//! the WAL, the marker in the metadata store, no answer);
//! `tests/tests/idempotency.rs` produces them with real SIGKILLs. The
//! stored records stay exactly what the client sent (no header added).

mod common;

use broker_core::metadata::MetadataStore;
use common::*;
use serde_json::{Value, json};
use tributary_edge::pending::{PENDING_PREFIX, records_digest};
use tributary_proto::batch::Record;
use tributary_proto::intent::StreamIntent;

const BATCH: &str = "/v1/topics/e1/t/batch";

fn retries_config(dir: &std::path::Path) -> tributary_edge::AgentConfig {
    let mut config = config(dir);
    config.topics.push(topic("/e1/t", StreamIntent::AuditLog));
    config
}

/// Records of `values`, stamped as the test agent stamps them.
fn records(values: &[&str]) -> Vec<Record> {
    values.iter().map(|v| record(v.as_bytes())).collect()
}

/// The marker of a keyed request `body` whose records are `values`.
fn key_marker(key: &str, body: &str, from: u64, values: &[&str]) -> Value {
    json!({"topic": "/e1/t", "from": from, "count": values.len(),
           "records_digest": records_digest(&records(values)),
           "fingerprint": fingerprint(body),
           "request": {"kind": "key", "key": key}})
}

/// Appends `records` to `/e1/t` as one batch (the append a crash
/// interrupted before the answer was written).
async fn append(agent: &tributary_edge::Agent, records: Vec<Record>) {
    agent
        .topics()
        .publish(&name("/e1/t"), records)
        .await
        .expect("append");
}

/// Writes `markers` (pending key suffix under `/e1/t/`, marker) and restarts.
async fn crash_with_markers(
    agent: tributary_edge::Agent,
    config: tributary_edge::AgentConfig,
    markers: &[(&str, Value)],
) -> tributary_edge::Agent {
    for (suffix, marker) in markers {
        agent
            .topics()
            .store()
            .put(&format!("{PENDING_PREFIX}e1/t/{suffix}"), marker.clone())
            .await
            .unwrap();
    }
    agent.shutdown().await.unwrap();
    start(config).await
}

fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

fn fingerprint(body: &str) -> String {
    tributary_edge::idempotency::fingerprint(&[b"batch", body.as_bytes()])
}

fn values(agent: &tributary_edge::Agent) -> Vec<String> {
    read_wal(agent, "/e1/t", 0)
        .into_iter()
        .map(|(_, r)| String::from_utf8_lossy(&r.value).into_owned())
        .collect()
}

fn answer(reply: &Reply) -> (u16, Value, Value, Value) {
    (
        reply.status,
        reply.body["base_offset"].clone(),
        reply.body["next_offset"].clone(),
        reply.body["count"].clone(),
    )
}

/// POSTs `body` to the batch route with the `Idempotency-Key` `key`; the
/// answer's status and offsets.
async fn post_keyed(
    agent: &tributary_edge::Agent,
    key: &str,
    body: &str,
) -> (u16, Value, Value, Value) {
    let reply = post(
        agent.local_addr(),
        BATCH,
        &[("idempotency-key", key)],
        body.as_bytes(),
    )
    .await;
    answer(&reply)
}

async fn markers_left(agent: &tributary_edge::Agent) -> usize {
    agent
        .topics()
        .store()
        .list(PENDING_PREFIX)
        .await
        .unwrap()
        .len()
}

/// Key `k1`: its two records reached the WAL (offsets 0, 1; another
/// request's record followed at 2), the answer did not. Key `k2`: marked
/// at 3, its append never happened. After the restart a retry of `k1` is
/// answered 0..2 and stores nothing; `k2`'s retry is stored at 3, once.
/// Before the markers, the retry of `k1` was stored again at 3.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_publish_a_crash_left_unanswered_is_answered_or_stored_once() {
    let dir = tempfile::tempdir().unwrap();
    let config = retries_config(dir.path());
    let agent = start(config.clone()).await;
    let k1_body = "{\"value\":\"a\"}\n{\"value\":\"b\"}\n";
    let k2_body = "{\"value\":\"c\"}\n";
    append(&agent, records(&["a", "b"])).await;
    append(&agent, records(&["other"])).await;
    let agent = crash_with_markers(
        agent,
        config,
        &[
            (&hex("k1"), key_marker("k1", k1_body, 0, &["a", "b"])),
            (&hex("k2"), key_marker("k2", k2_body, 3, &["c"])),
        ],
    )
    .await;
    assert_eq!(markers_left(&agent).await, 0, "settled at start");

    assert_eq!(
        post_keyed(&agent, "k1", k1_body).await,
        (200, json!(0), json!(2), json!(2))
    );
    let k2 = (200, json!(3), json!(4), json!(1));
    assert_eq!(post_keyed(&agent, "k2", k2_body).await, k2);
    assert_eq!(post_keyed(&agent, "k2", k2_body).await, k2, "again");
    assert_eq!(values(&agent), ["a", "b", "other", "c"]);
    agent.shutdown().await.unwrap();
}

/// The same for a sequenced batch: producer `p7` stored 0..=1 at offset 0
/// without an answer; after the restart its retry gets 0..2 and the next
/// range 2..=2 is stored at 2 (not refused as a gap, not stored twice).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sequenced_batch_a_crash_left_unanswered_is_answered_at_restart() {
    let dir = tempfile::tempdir().unwrap();
    let config = retries_config(dir.path());
    let agent = start(config.clone()).await;
    let line = |v: &str, seq: u64| {
        format!("{{\"value\":\"{v}\",\"producer_id\":\"p7\",\"sequence\":{seq}}}\n")
    };
    let body = format!("{}{}", line("a", 0), line("b", 1));
    append(&agent, records(&["a", "b"])).await;
    let marker = json!({"topic": "/e1/t", "from": 0, "count": 2,
        "records_digest": records_digest(&records(&["a", "b"])),
        "fingerprint": fingerprint(&body),
        "request": {"kind": "producer", "producer_id": "p7",
                    "first_sequence": 0, "last_sequence": 1}});
    let agent = crash_with_markers(
        agent,
        config,
        &[(&format!("producers/{}", hex("p7")), marker)],
    )
    .await;
    assert_eq!(markers_left(&agent).await, 0, "settled at start");
    let retry = post(agent.local_addr(), BATCH, &[], body.as_bytes()).await;
    assert_eq!(
        answer(&retry),
        (200, json!(0), json!(2), json!(2)),
        "{retry:?}"
    );
    let next = post(agent.local_addr(), BATCH, &[], line("c", 2).as_bytes()).await;
    assert_eq!(
        answer(&next),
        (200, json!(2), json!(3), json!(1)),
        "{next:?}"
    );
    assert_eq!(values(&agent), ["a", "b", "c"]);
    agent.shutdown().await.unwrap();
}

/// Two keyed requests with identical records, both unanswered, only one
/// batch in the WAL, and a third whose answer was written holding an
/// identical batch: the WAL batch goes to one marker, the answered batch
/// to neither, so one retry is answered and the other stored: the count
/// of copies is right. What a keyed publish stores is the client's record
/// alone, and no marker is left once it is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identical_unanswered_requests_get_one_batch_each_at_most() {
    let dir = tempfile::tempdir().unwrap();
    let config = retries_config(dir.path());
    let agent = start(config.clone()).await;
    let body = "{\"value\":\"same\"}\n";
    // k0 answered at 0 (the normal path), then k1 or k2 stored at 1.
    assert_eq!(
        post_keyed(&agent, "k0", body).await,
        (200, json!(0), json!(1), json!(1))
    );
    let stored = read_wal(&agent, "/e1/t", 0);
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].1, record(b"same"), "the client's record alone");
    assert_eq!(markers_left(&agent).await, 0);
    append(&agent, records(&["same"])).await;
    let agent = crash_with_markers(
        agent,
        config,
        &[
            (&hex("k1"), key_marker("k1", body, 0, &["same"])),
            (&hex("k2"), key_marker("k2", body, 0, &["same"])),
        ],
    )
    .await;
    assert_eq!(markers_left(&agent).await, 0, "settled at start");
    let mut answers = Vec::new();
    for key in ["k1", "k2", "k1", "k2"] {
        answers.push(post_keyed(&agent, key, body).await);
    }
    assert_eq!(
        answers,
        [
            (200, json!(1), json!(2), json!(1)),
            (200, json!(2), json!(3), json!(1)),
            (200, json!(1), json!(2), json!(1)),
            (200, json!(2), json!(3), json!(1)),
        ]
    );
    assert_eq!(
        values(&agent),
        ["same", "same", "same"],
        "three requests, three copies"
    );
    agent.shutdown().await.unwrap();
}

/// Record headers named like the agent's MQTT headers (`mqtt.*`) are
/// refused on both HTTP routes, nothing stored: a record carrying a
/// client's `mqtt.client_id` and `mqtt.packet_id` would make that client's
/// QoS 2 resend look stored after a crash.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn record_headers_named_like_the_agents_own_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let agent = start(retries_config(dir.path())).await;
    let reply = post(
        agent.local_addr(),
        "/v1/topics/e1/t/records",
        &[("x-trib-h-mqtt.packet_id", "7")],
        b"v",
    )
    .await;
    assert_eq!(reply.status, 400, "{reply:?}");
    assert_eq!(reply.body["kind"], "invalid_input");
    assert!(
        reply.error().contains("x-trib-h-mqtt.packet_id"),
        "{reply:?}"
    );
    let body = "{\"value\":\"a\"}\n{\"value\":\"b\",\"headers\":{\"site\":\"n\",\"mqtt.client_id\":\"dev\"}}\n";
    let reply = post(agent.local_addr(), BATCH, &[], body.as_bytes()).await;
    assert_eq!(reply.status, 400, "{reply:?}");
    assert_eq!(
        (&reply.body["line"], &reply.body["field"]),
        (&json!(2), &json!("headers.mqtt.client_id"))
    );
    let fine = post(
        agent.local_addr(),
        "/v1/topics/e1/t/records",
        &[("x-trib-h-mqttx", "1")],
        b"v",
    )
    .await;
    assert_eq!(
        answer(&fine),
        (200, json!(0), json!(1), json!(1)),
        "{fine:?}"
    );
    agent.shutdown().await.unwrap();
}

/// A retry is judged by what the request means, not how it is spelled:
/// the query's key and timestamp in another order or encoding are the
/// same request (the answer, not 409). Two `Idempotency-Key` headers are
/// refused (400): before, the first won and a retry carrying the second
/// was stored again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_is_matched_by_meaning_and_one_key_per_request() {
    let dir = tempfile::tempdir().unwrap();
    let agent = start(retries_config(dir.path())).await;
    let records = |query: &str| format!("/v1/topics/e1/t/records?{query}");
    let first = post(
        agent.local_addr(),
        &records("key=a&timestamp_ms=5"),
        &[("idempotency-key", "q1")],
        b"v",
    )
    .await;
    assert_eq!(
        answer(&first),
        (200, json!(0), json!(1), json!(1)),
        "{first:?}"
    );
    for query in ["timestamp_ms=5&key=a", "key=%61&timestamp_ms=5"] {
        let retry = post(
            agent.local_addr(),
            &records(query),
            &[("idempotency-key", "q1")],
            b"v",
        )
        .await;
        assert_eq!(answer(&retry), answer(&first), "{query}: {retry:?}");
    }
    let other = post(
        agent.local_addr(),
        &records("key=b&timestamp_ms=5"),
        &[("idempotency-key", "q1")],
        b"v",
    )
    .await;
    assert_eq!(
        other.status, 409,
        "another key is another request: {other:?}"
    );
    let two = post(
        agent.local_addr(),
        BATCH,
        &[("idempotency-key", "q2"), ("idempotency-key", "q3")],
        b"{\"value\":\"x\"}\n",
    )
    .await;
    assert_eq!(two.status, 400, "{two:?}");
    assert!(two.error().contains("more than once"), "{two:?}");
    let upper = post(
        agent.local_addr(),
        BATCH,
        &[],
        b"{\"value\":\"x\",\"headers\":{\"MQTT.client_id\":\"dev\"}}\n",
    )
    .await;
    assert_eq!(upper.status, 400, "{upper:?}");
    assert_eq!(values(&agent), ["v"]);
    agent.shutdown().await.unwrap();
}

/// A realtime topic's records do not outlive the agent, and after a crash
/// its ring starts again at the checkpoint, reusing offsets (a trial got
/// a keyed retry answered with offsets that then held another record):
/// answers are forgotten at every start, so a keyed retry after a restart
/// is stored again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn realtime_answers_do_not_outlive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = retries_config(dir.path());
    config.topics.push(topic("/e1/rt", StreamIntent::Realtime));
    let agent = start(config.clone()).await;
    let path = "/v1/topics/e1/rt/records";
    let keyed = post(agent.local_addr(), path, &[("idempotency-key", "r1")], b"k").await;
    assert_eq!(
        answer(&keyed),
        (200, json!(0), json!(1), json!(1)),
        "{keyed:?}"
    );
    agent.shutdown().await.unwrap();
    let agent = start(config).await;
    let other = post(agent.local_addr(), path, &[], b"other").await;
    assert_eq!(
        answer(&other),
        (200, json!(1), json!(2), json!(1)),
        "{other:?}"
    );
    let retry = post(agent.local_addr(), path, &[("idempotency-key", "r1")], b"k").await;
    assert_eq!(
        answer(&retry),
        (200, json!(2), json!(3), json!(1)),
        "stored again: {retry:?}"
    );
    agent.shutdown().await.unwrap();
}

/// Keyed requests whose client goes away right after sending them (the
/// connection closed before the answer) and are then retried: each batch
/// is stored once. A request's future is dropped when its connection
/// closes; before the checked publish ran on a task of its own, one
/// dropped between its append and its answer left a marker that only the
/// next start would settle, and the retry stored the batch again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_requests_whose_client_went_away_are_stored_once_on_retry() {
    use tokio::io::AsyncWriteExt;
    const REQUESTS: usize = 100;
    let dir = tempfile::tempdir().unwrap();
    let mut config = retries_config(dir.path());
    config.limits.max_batch_bytes = 4 << 20;
    let agent = start(config).await;
    let body = |i: usize| -> String {
        (0..1500)
            .map(|j| format!("{{\"value\":\"r{i}-{j:04}-{}\"}}\n", "x".repeat(100)))
            .collect()
    };
    for i in 0..REQUESTS {
        let body = body(i);
        let mut socket = tokio::net::TcpStream::connect(agent.local_addr())
            .await
            .unwrap();
        let head = format!(
            "POST {BATCH} HTTP/1.1\r\nhost: agent\r\nidempotency-key: k{i}\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        socket.write_all(head.as_bytes()).await.unwrap();
        socket.write_all(body.as_bytes()).await.unwrap();
        // Gone at once, at a moment that moves through the request's steps.
        tokio::time::sleep(std::time::Duration::from_micros((i as u64 % 40) * 250)).await;
        drop(socket);
    }
    for i in 0..REQUESTS {
        let reply = post_keyed(&agent, &format!("k{i}"), &body(i)).await;
        assert_eq!(reply.0, 200, "k{i}: {reply:?}");
    }
    let stored = read_wal(&agent, "/e1/t", 0);
    let mut seen = std::collections::HashMap::new();
    for (_, r) in &stored {
        *seen.entry(r.value.clone()).or_insert(0u32) += 1;
    }
    let twice = seen.values().filter(|&&n| n > 1).count();
    assert_eq!(twice, 0, "{twice} records stored more than once");
    assert_eq!(stored.len(), REQUESTS * 1500, "every batch once");
    agent.shutdown().await.unwrap();
}
