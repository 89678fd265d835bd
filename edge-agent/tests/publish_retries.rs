//! HTTP publishes with a retry check (`Idempotency-Key`, NDJSON
//! `producer_id` + `sequence`) that a crash left unanswered: the agent
//! settles their markers when it starts, so a retry of a stored request
//! gets its original offsets and one that never reached the WAL is stored
//! once. The crash states are written as a SIGKILL leaves them (records in
//! the WAL, the marker in the metadata store, no answer);
//! `tests/tests/idempotency.rs` produces them with real SIGKILLs.

mod common;

use broker_core::metadata::MetadataStore;
use bytes::Bytes;
use common::*;
use serde_json::{Value, json};
use tributary_edge::pending::{
    HEADER_IDEMPOTENCY_KEY, HEADER_PRODUCER_ID, HEADER_SEQUENCE, PENDING_PREFIX,
};
use tributary_proto::batch::Record;
use tributary_proto::intent::StreamIntent;

const BATCH: &str = "/v1/topics/e1/t/batch";

fn retries_config(dir: &std::path::Path) -> tributary_edge::AgentConfig {
    let mut config = config(dir);
    config.topics.push(topic("/e1/t", StreamIntent::AuditLog));
    config
}

/// `value` with the headers `headers` (the agent's, as a publish adds them).
fn tagged(value: &str, headers: &[(&str, &str)]) -> Record {
    let mut r = record(value.as_bytes());
    r.headers = headers
        .iter()
        .map(|(n, v)| ((*n).to_owned(), Bytes::copy_from_slice(v.as_bytes())))
        .collect();
    r
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
    append(
        &agent,
        vec![tagged("a", &[(HEADER_IDEMPOTENCY_KEY, "k1")]), record(b"b")],
    )
    .await;
    append(&agent, vec![record(b"other")]).await;
    let marker = |key: &str, body: &str, from: u64, count: u64| {
        json!({"topic": "/e1/t", "from": from, "count": count,
               "fingerprint": fingerprint(body),
               "request": {"kind": "key", "key": key}})
    };
    let agent = crash_with_markers(
        agent,
        config,
        &[
            (&hex("k1"), marker("k1", k1_body, 0, 2)),
            (&hex("k2"), marker("k2", k2_body, 3, 1)),
        ],
    )
    .await;
    assert_eq!(markers_left(&agent).await, 0, "settled at start");

    let retry = post(
        agent.local_addr(),
        BATCH,
        &[("idempotency-key", "k1")],
        k1_body.as_bytes(),
    )
    .await;
    assert_eq!(answer(&retry), (200, json!(0), json!(2), json!(2)), "{retry:?}");
    let retry = post(
        agent.local_addr(),
        BATCH,
        &[("idempotency-key", "k2")],
        k2_body.as_bytes(),
    )
    .await;
    assert_eq!(answer(&retry), (200, json!(3), json!(4), json!(1)), "{retry:?}");
    let again = post(
        agent.local_addr(),
        BATCH,
        &[("idempotency-key", "k2")],
        k2_body.as_bytes(),
    )
    .await;
    assert_eq!(answer(&again), answer(&retry));
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
    append(
        &agent,
        vec![
            tagged("a", &[(HEADER_PRODUCER_ID, "p7"), (HEADER_SEQUENCE, "0")]),
            record(b"b"),
        ],
    )
    .await;
    let marker = json!({"topic": "/e1/t", "from": 0, "count": 2,
        "fingerprint": fingerprint(&body),
        "request": {"kind": "producer", "producer_id": "p7",
                    "first_sequence": 0, "last_sequence": 1}});
    let agent = crash_with_markers(agent, config, &[(&format!("producers/{}", hex("p7")), marker)])
        .await;
    assert_eq!(markers_left(&agent).await, 0, "settled at start");
    let retry = post(agent.local_addr(), BATCH, &[], body.as_bytes()).await;
    assert_eq!(answer(&retry), (200, json!(0), json!(2), json!(2)), "{retry:?}");
    let next = post(agent.local_addr(), BATCH, &[], line("c", 2).as_bytes()).await;
    assert_eq!(answer(&next), (200, json!(2), json!(3), json!(1)), "{next:?}");
    assert_eq!(values(&agent), ["a", "b", "c"]);
    agent.shutdown().await.unwrap();
}

/// What a keyed publish stores: its records, the first with the header
/// `http.idempotency_key`; no marker is left once it is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_publish_tags_its_first_record_and_leaves_no_marker() {
    let dir = tempfile::tempdir().unwrap();
    let agent = start(retries_config(dir.path())).await;
    let reply = post(
        agent.local_addr(),
        "/v1/topics/e1/t/records",
        &[("idempotency-key", "o-1"), ("x-trib-h-unit", "C")],
        b"21.5",
    )
    .await;
    assert_eq!(answer(&reply), (200, json!(0), json!(1), json!(1)), "{reply:?}");
    let stored = read_wal(&agent, "/e1/t", 0);
    let headers: Vec<(&str, &[u8])> = stored[0]
        .1
        .headers
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_ref()))
        .collect();
    assert_eq!(
        headers,
        [("unit", &b"C"[..]), (HEADER_IDEMPOTENCY_KEY, &b"o-1"[..])]
    );
    assert_eq!(markers_left(&agent).await, 0);
    agent.shutdown().await.unwrap();
}

/// Record headers named like the agent's own (`mqtt.*`, `http.*`) are
/// refused on both routes, nothing stored: a record carrying another
/// request's `http.idempotency_key` would pass for it after a crash.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn record_headers_named_like_the_agents_own_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let agent = start(retries_config(dir.path())).await;
    for header in ["x-trib-h-http.idempotency_key", "x-trib-h-mqtt.packet_id"] {
        let reply = post(
            agent.local_addr(),
            "/v1/topics/e1/t/records",
            &[(header, "k1")],
            b"v",
        )
        .await;
        assert_eq!(reply.status, 400, "{reply:?}");
        assert_eq!(reply.body["kind"], "invalid_input");
        assert!(reply.error().contains(header), "{reply:?}");
    }
    let body = "{\"value\":\"a\"}\n{\"value\":\"b\",\"headers\":{\"site\":\"n\",\"http.sequence\":\"0\"}}\n";
    let reply = post(agent.local_addr(), BATCH, &[], body.as_bytes()).await;
    assert_eq!(reply.status, 400, "{reply:?}");
    assert_eq!(
        (&reply.body["line"], &reply.body["field"]),
        (&json!(2), &json!("headers.http.sequence"))
    );
    let fine = post(
        agent.local_addr(),
        "/v1/topics/e1/t/records",
        &[("x-trib-h-httpx", "1")],
        b"v",
    )
    .await;
    assert_eq!(answer(&fine), (200, json!(0), json!(1), json!(1)), "{fine:?}");
    agent.shutdown().await.unwrap();
}
