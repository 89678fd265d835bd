//! The broker's un-archived WAL budget with the real binaries: a broker
//! (small `[budget]`, segments sealed by age, `[archive]` on the same
//! bucket for tiered reads), a tier service archiving to a moto S3 server,
//! and an edge agent publishing under load. The S3 server is stopped
//! (SIGSTOP) for `TRIB_TEST_BUDGET_OUTAGE_S` seconds (default 180, as in
//! issue 16): producers see backpressure (the edge's backlog grows, the
//! broker's refusals metric rises, a central publish gets 507), the
//! broker's un-archived WAL stays within the budget plus one segment
//! (sampled); then S3 comes back (SIGCONT) and everything arrives, exactly
//! once, every offset at a consumer reading from the earliest offset.

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tributary_api::consumer::{AttachRequest, PublishRecord, StartPosition, SubscriptionType};
use tributary_api::consumer_client::{ClientError, ConsumerClient};
use tributary_test_support::moto::Moto;
use tributary_test_support::ports::free_tcp;
use tributary_test_support::process::{Proc, bin_path};
use tributary_tests::cluster::{EdgeClient, Pair, metric_value, try_scrape};

const TOKEN: &str = "e2e-test-token";
const TOPIC: &str = "/plant1/readings";
const CENTRAL: &str = "/default/central";
const BUCKET: &str = "tributary-budget";
/// The broker's un-archived WAL budget, bytes.
const BUDGET: u64 = 512 * 1024;
const PER_BATCH: u64 = 20;

fn value(offset: u64) -> String {
    format!("reading-{offset:08}-{}", "x".repeat(200))
}

fn outage() -> Duration {
    let secs = std::env::var("TRIB_TEST_BUDGET_OUTAGE_S")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(180);
    Duration::from_secs(secs)
}

fn signal(pid: u32, sig: &str) {
    let status = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success(), "kill {sig} {pid}");
}

fn metric(url: &str, series: &str) -> Option<u64> {
    try_scrape(url).ok().and_then(|t| metric_value(&t, series))
}

/// Bytes of the largest `.log` file in `dir`.
/// The sum over every topic WAL under `topics` of its largest segment:
/// what the active segments may add to the budget.
fn active_allowance(topics: &std::path::Path) -> u64 {
    let mut total = 0;
    for ns in std::fs::read_dir(topics).into_iter().flatten().flatten() {
        for topic in std::fs::read_dir(ns.path()).into_iter().flatten().flatten() {
            total += largest_segment(&topic.path());
        }
    }
    total
}

fn largest_segment(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter(|e| e.path().extension().is_some_and(|x| x == "log"))
                .filter_map(|e| e.metadata().ok().map(|m| m.len()))
                .max()
                .unwrap_or(0)
        })
        .unwrap_or(0)
}

#[test]
fn a_stopped_object_store_backpressures_the_edge_within_the_budget_and_everything_arrives_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let moto = Moto::start();
    let endpoint = moto.endpoint();
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let created = agent
        .put(format!("{endpoint}/{BUCKET}"))
        .send_empty()
        .expect("create bucket");
    assert!(created.status().is_success(), "create bucket");

    let mut pair = Pair::new(dir.path(), "event_stream", None);
    let broker_toml = dir.path().join("broker.toml");
    let mut text = std::fs::read_to_string(&broker_toml).expect("broker.toml");
    text.push_str(&format!(
        r#"[wal]
segment_max_age_ms = 300
[budget]
unarchived_bytes = {BUDGET}
refresh_ms = 200
[archive]
prefix = "/tributary"
[archive.store]
url = "s3://{BUCKET}"
endpoint = "{endpoint}"
region = "us-east-1"
path_style = true
allow_http = true
access_key_id = "testing"
secret_access_key = "testing"
"#
    ));
    std::fs::write(&broker_toml, text).expect("broker.toml");
    let admin = pair.broker_admin;
    let metrics = format!("http://{admin}/metrics");
    pair.broker.start();
    pair.edge.start();
    pair.wait_for_edge();
    let mut tier = Command::new(bin_path("tier-service"));
    tier.arg("--data-dir")
        .arg(&pair.broker_data)
        .args(["--bucket", &format!("s3://{BUCKET}")])
        .args(["--s3-endpoint", &endpoint])
        .args(["--s3-region", "us-east-1", "--s3-path-style", "true"])
        .args(["--s3-allow-http", "true"])
        .args([
            "--s3-access-key-id",
            "testing",
            "--s3-secret-access-key",
            "testing",
        ])
        .args(["--s3-request-timeout-ms", "2000", "--s3-max-retries", "1"])
        .args(["--s3-retry-timeout-ms", "4000"])
        .args(["--broker-url", &format!("http://{admin}")])
        .args(["--token", TOKEN, "--poll-interval-ms", "200"])
        .args(["--metrics-listen", &free_tcp().to_string()])
        .env("RUST_LOG", "warn");
    let mut tier = Proc::new("tier-service", tier);
    tier.start();
    let central = ConsumerClient::new(&format!("http://{admin}"), TOKEN);
    // The admin API answers once Raft has a leader.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let created = agent
            .post(format!("http://{admin}/v1/topics"))
            .header("Authorization", format!("Bearer {TOKEN}"))
            .send_json(
                serde_json::json!({"name": CENTRAL, "intent": "event_stream", "partitions": 0}),
            )
            .map(|r| r.status().as_u16());
        if matches!(created, Ok(201)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "central topic not created: {created:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    // A producer at the edge: 20 records (~4.5 KiB) every 50 ms.
    let stop = Arc::new(AtomicBool::new(false));
    let published = Arc::new(AtomicU64::new(0));
    let producer = {
        let stop = stop.clone();
        let published = published.clone();
        let edge = Pair::api_client(pair.edge_api);
        std::thread::spawn(move || produce(&edge, &stop, &published))
    };

    // Tiering works before the outage.
    let deadline = Instant::now() + Duration::from_secs(60);
    while metric(
        &metrics,
        "tributary_broker_topic_tiered_offset{topic=\"/plant1/readings\"}",
    )
    .unwrap_or(0)
        == 0
    {
        assert!(Instant::now() < deadline, "nothing tiered within 60 s");
        std::thread::sleep(Duration::from_millis(200));
    }

    // The object store stops answering.
    let outage = outage();
    signal(moto.pid(), "-STOP");
    let started = Instant::now();
    let (mut max_unarchived, mut max_segment, mut max_backlog) = (0u64, 0u64, 0u64);
    let mut central_refused = None;
    while started.elapsed() < outage {
        if let Some(bytes) = metric(&metrics, "tributary_broker_unarchived_bytes") {
            max_unarchived = max_unarchived.max(bytes);
        }
        // The budget bounds the sealed un-archived segments; each topic's
        // active segment (the readings, the central topic, the broker's
        // audit topic, which records the tier service's refused calls)
        // comes on top.
        max_segment = max_segment.max(active_allowance(&pair.broker_data.join("topics")));
        if let Some((hwm, acked)) = pair.edge_offsets() {
            max_backlog = max_backlog.max(hwm.saturating_sub(acked));
        }
        if central_refused.is_none() {
            let record = PublishRecord {
                value: Some("central".into()),
                ..PublishRecord::default()
            };
            match central.publish(CENTRAL, vec![record]) {
                Err(ClientError::Api {
                    status: 507,
                    kind,
                    message,
                    ..
                }) => {
                    assert_eq!(kind, "budget_exceeded", "{message}");
                    central_refused = Some(started.elapsed());
                }
                Ok(_) => {}
                Err(e) => panic!("central publish: {e}"),
            }
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let refusals = metric(&metrics, "tributary_broker_budget_refusals_total").unwrap_or(0);
    println!(
        "outage {outage:?}: max un-archived {max_unarchived} B (budget {BUDGET}, largest segment {max_segment}), edge backlog up to {max_backlog} records, {refusals} refusals, central 507 after {central_refused:?}"
    );
    assert!(refusals > 0, "the broker never refused");
    assert!(central_refused.is_some(), "no 507 for the central producer");
    assert!(
        max_backlog > 10 * PER_BATCH,
        "the edge backlog never grew: {max_backlog}"
    );
    assert!(
        max_unarchived <= BUDGET + max_segment,
        "un-archived {max_unarchived} over budget {BUDGET} + one segment per topic {max_segment}"
    );

    // Back: everything arrives.
    signal(moto.pid(), "-CONT");
    stop.store(true, Ordering::Relaxed);
    producer.join().expect("producer");
    let total = published.load(Ordering::Relaxed);
    pair.wait_acknowledged(total, Duration::from_secs(180));
    let consumer = ConsumerClient::new(&format!("http://{admin}"), TOKEN);
    let attach = AttachRequest {
        subscription_type: SubscriptionType::Exclusive,
        start: StartPosition::Earliest,
        ..AttachRequest::default()
    };
    let session = consumer.attach(TOPIC, "check", &attach).expect("attach");
    assert_eq!(session.cursor, 0, "earliest is offset 0 (archived)");
    let mut got: BTreeMap<u64, String> = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    while (got.len() as u64) < total {
        assert!(
            Instant::now() < deadline,
            "consumer got {} of {total}",
            got.len()
        );
        let batch = consumer
            .read(TOPIC, "check", session.consumer_id, 1000, 500)
            .expect("read");
        assert!(batch.gaps.is_empty(), "{:?}", batch.gaps);
        for m in &batch.messages {
            let previous = got.insert(m.offset, m.value.clone().unwrap_or_default());
            assert!(previous.is_none(), "offset {} twice", m.offset);
        }
        if let Some(last) = batch.messages.last() {
            consumer
                .ack_up_to(TOPIC, "check", session.consumer_id, last.offset)
                .expect("ack up to");
        }
    }
    assert_eq!(got.len() as u64, total);
    for (offset, v) in &got {
        assert_eq!(v, &value(*offset), "offset {offset}");
    }
    assert_eq!(got.keys().next_back().copied(), Some(total - 1));
    // Acceptance resumed for central producers too.
    let record = PublishRecord {
        value: Some("after".into()),
        ..PublishRecord::default()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while central.publish(CENTRAL, vec![record.clone()]).is_err() {
        assert!(Instant::now() < deadline, "central publish still refused");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(tier.terminate(), Some(0));
    assert_eq!(pair.edge.terminate(), Some(0));
    assert_eq!(pair.broker.terminate(), Some(0));
}

/// Publishes `PER_BATCH` records every 50 ms until `stop`; counts them in
/// `published` (offsets are consecutive from 0).
fn produce(edge: &EdgeClient, stop: &AtomicBool, published: &AtomicU64) {
    let mut next = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let body: String = (next..next + PER_BATCH)
            .map(|o| format!("{{\"value\":{:?}}}\n", value(o)))
            .collect();
        let (base, end) = edge.publish_ndjson(body).expect("edge publish");
        assert_eq!((base, end), (next, next + PER_BATCH));
        next = end;
        published.store(next, Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(50));
    }
}
