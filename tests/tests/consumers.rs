//! Central consumers with real processes: the `broker` binary and
//! `consumer_child` processes driven over HTTP, SIGKILLed mid-run.
//!
//! - at-least-once: a consumer process is SIGKILLed five times while it
//!   works through 2,000 messages; every offset is acknowledged at least
//!   once and none is skipped;
//! - a broker SIGKILL redelivers at most what was acknowledged after the
//!   last persisted cursor; a graceful stop persists the cursor;
//! - a consumer process SIGTERMed and restarted under the same
//!   `consumer_name` re-attaches to its exclusive subscription at once
//!   (issue 16, defect 4); another name gets `409 subscription_busy` naming
//!   the holding session and when it expires.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use rand::{RngExt, SeedableRng};
use tributary_api::client::ClientError;
use tributary_api::consumer::{AttachRequest, PublishRecord, StartPosition, SubscriptionType};
use tributary_api::consumer_client::ConsumerClient;
use tributary_test_support::ports::{free_tcp, free_udp};
use tributary_test_support::process::{Proc, bin_path};

const TOKEN: &str = "consumer-e2e-token";
const TOPIC: &str = "/default/jobs";

struct Broker {
    proc: Proc,
    url: String,
}

impl Broker {
    fn new(dir: &Path, consumers_toml: &str) -> Broker {
        let certs = dir.join("certs");
        broker_core::dev_certs::issue(&certs, &[1], &[]).expect("certs");
        let admin = free_tcp();
        let config = dir.join("broker.toml");
        std::fs::write(
            &config,
            format!(
                r#"node_id = 1
data_dir = "{data}"
raft_listen = "{raft}"
admin_listen = "{admin}"
ingest_listen = "{ingest}"
admin_token = "{TOKEN}"
[tls]
cert = "{certs}/broker-1.pem"
key = "{certs}/broker-1.key"
ca = "{certs}/ca.pem"
[consumers]
{consumers_toml}
"#,
                data = dir.join("broker").display(),
                raft = free_udp(),
                ingest = free_udp(),
                certs = certs.display(),
            ),
        )
        .expect("config");
        let mut command = Command::new(bin_path("broker"));
        command.arg("--config").arg(&config).env("RUST_LOG", "warn");
        Broker {
            proc: Proc::new("broker", command),
            url: format!("http://{admin}"),
        }
    }

    fn start(&mut self) {
        self.proc.start();
        let deadline = Instant::now() + Duration::from_secs(30);
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build()
            .into();
        loop {
            // The admin API answers once Raft has a leader and the catalog
            // is readable.
            let ok = agent
                .get(format!("{}/v1/topics", self.url))
                .header("Authorization", format!("Bearer {TOKEN}"))
                .call()
                .is_ok_and(|r| r.status() == 200);
            if ok {
                return;
            }
            assert!(Instant::now() < deadline, "broker not ready within 30 s");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn create_topic(&self, intent: &str) {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build()
            .into();
        let mut r = agent
            .post(format!("{}/v1/topics", self.url))
            .header("Authorization", format!("Bearer {TOKEN}"))
            .send_json(serde_json::json!({"name": TOPIC, "intent": intent, "partitions": 0}))
            .expect("create topic");
        let status = r.status().as_u16();
        let body = r.body_mut().read_to_string().unwrap_or_default();
        assert_eq!(status, 201, "{body}");
    }

    fn client(&self) -> ConsumerClient {
        ConsumerClient::new(&self.url, TOKEN)
    }
}

fn publish(client: &ConsumerClient, count: u64) {
    let mut next = 0;
    while next < count {
        let n = (count - next).min(500);
        let records = (next..next + n)
            .map(|i| PublishRecord {
                value: Some(format!("job-{i}")),
                ..PublishRecord::default()
            })
            .collect();
        let r = client.publish(TOPIC, records).expect("publish");
        assert_eq!((r.base_offset, r.next_offset), (next, next + n));
        next += n;
    }
}

fn child(url: &str, out: &Path, until_empty: bool) -> Proc {
    child_with(url, out, until_empty, &[])
}

fn child_with(url: &str, out: &Path, until_empty: bool, extra: &[&str]) -> Proc {
    let mut command = Command::new(bin_path("consumer_child"));
    command.args([url, TOKEN, TOPIC, "workers"]).arg(out);
    if until_empty {
        command.arg("--until-empty");
    }
    command.args(extra);
    Proc::new("consumer_child", command)
}

fn acked_offsets(path: &PathBuf) -> (BTreeSet<u64>, usize) {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<u64> = text
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| l.parse().expect("offset line"))
        .collect();
    (lines.iter().copied().collect(), lines.len())
}

#[test]
fn at_least_once_with_a_sigkilled_consumer_process() {
    let dir = tempfile::tempdir().unwrap();
    let mut broker = Broker::new(
        dir.path(),
        "session_timeout_ms = 1000\ncursor_persist_every_acks = 50\ntick_ms = 100",
    );
    broker.start();
    broker.create_topic("task_queue");
    let client = broker.client();
    const COUNT: u64 = 2000;
    publish(&client, COUNT);
    let out = dir.path().join("acked.txt");
    let seed: u64 = std::env::var("TRIB_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(7);
    println!("seed {seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut kills = 0;
    for _ in 0..5 {
        let mut c = child(&broker.url, &out, false);
        c.start();
        std::thread::sleep(Duration::from_millis(rng.random_range(300..1200)));
        c.kill();
        kills += 1;
    }
    let (before_final, _) = acked_offsets(&out);
    assert!(
        (before_final.len() as u64) < COUNT,
        "the kills should land before the end (processed {})",
        before_final.len()
    );
    let mut last = child(&broker.url, &out, true);
    last.start();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let state = client.state(TOPIC, "workers").expect("state");
        if state.cursor == COUNT {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "cursor stuck at {} of {COUNT}",
            state.cursor
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(last.wait_exit(Duration::from_secs(30)), Some(0));
    // Every offset was processed before the cursor passed it: none skipped.
    let (processed, lines) = acked_offsets(&out);
    let missing: Vec<u64> = (0..COUNT).filter(|o| !processed.contains(o)).collect();
    assert!(
        missing.is_empty(),
        "{} offsets never delivered, first {:?}",
        missing.len(),
        &missing[..missing.len().min(10)]
    );
    assert_eq!(processed.len() as u64, COUNT);
    println!(
        "{kills} consumer SIGKILLs: all {COUNT} offsets processed and acknowledged; {lines} deliveries in all ({} redelivered after a kill)",
        lines as u64 - COUNT
    );
    assert!(
        lines as u64 > COUNT,
        "a kill mid-batch must cause a redelivery"
    );
}

#[test]
fn a_broker_restart_redelivers_at_most_what_was_acked_after_the_persisted_cursor() {
    let dir = tempfile::tempdir().unwrap();
    let mut broker = Broker::new(
        dir.path(),
        "cursor_persist_every_acks = 100\ncursor_persist_interval_ms = 600000",
    );
    broker.start();
    broker.create_topic("task_queue");
    let client = broker.client();
    publish(&client, 500);
    let attach = AttachRequest {
        start: StartPosition::Earliest,
        ..AttachRequest::default()
    };
    let ack_batches = |consumer: u64, batches: usize| {
        let mut first = None;
        for _ in 0..batches {
            let got = client
                .receive(TOPIC, "workers", consumer, 10, 1000)
                .expect("receive");
            assert_eq!(got.messages.len(), 10);
            first.get_or_insert(got.messages[0].offset);
            let offsets: Vec<u64> = got.messages.iter().map(|m| m.offset).collect();
            client
                .ack(TOPIC, "workers", consumer, &offsets)
                .expect("ack");
        }
        first
    };
    let consumer = client
        .attach(TOPIC, "workers", &attach)
        .unwrap()
        .consumer_id;
    assert_eq!(ack_batches(consumer, 25), Some(0));
    let state = client.state(TOPIC, "workers").unwrap();
    assert_eq!((state.cursor, state.persisted_cursor), (250, 200));

    broker.proc.kill();
    broker.start();
    let again = client.attach(TOPIC, "workers", &attach).unwrap();
    assert!(!again.created);
    assert_eq!(again.cursor, 200, "resumes at the persisted cursor");
    // Redelivered: 200..250, the 50 acknowledged after the last write.
    assert_eq!(ack_batches(again.consumer_id, 10), Some(200));
    assert_eq!(client.state(TOPIC, "workers").unwrap().cursor, 300);

    // A graceful stop writes the cursor: nothing is redelivered.
    assert_eq!(broker.proc.terminate(), Some(0));
    broker.start();
    let third = client.attach(TOPIC, "workers", &attach).unwrap();
    assert_eq!(third.cursor, 300);
    assert_eq!(ack_batches(third.consumer_id, 1), Some(300));
}

#[test]
fn a_sigtermed_consumer_restarted_under_its_name_reattaches_at_once() {
    let dir = tempfile::tempdir().unwrap();
    // The default 30 s session timeout: the restart must not wait for it.
    let mut broker = Broker::new(dir.path(), "tick_ms = 100");
    broker.start();
    broker.create_topic("task_queue");
    let client = broker.client();
    const COUNT: u64 = 300;
    publish(&client, COUNT);
    let out = dir.path().join("acked.txt");
    let me = ["--exclusive", "--name", "worker-a"];
    let mut first = child_with(&broker.url, &out, false, &me);
    first.start();
    let deadline = Instant::now() + Duration::from_secs(30);
    while acked_offsets(&out).0.is_empty() {
        assert!(
            Instant::now() < deadline,
            "the first consumer processed nothing"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // SIGTERM: the process ends (no handler) without detaching; its
    // session and leases stay on the broker.
    let _ = first.terminate();
    let before = client.state(TOPIC, "workers").expect("state");
    assert_eq!(before.consumers.len(), 1, "the dead session is still held");
    // The same name, restarted: re-attaches at once and finishes the topic
    // long before the old session's 30 s timeout.
    let restarted = Instant::now();
    let mut second = child_with(&broker.url, &out, true, &me);
    second.start();
    assert_eq!(second.wait_exit(Duration::from_secs(25)), Some(0));
    let took = restarted.elapsed();
    assert_eq!(client.state(TOPIC, "workers").unwrap().cursor, COUNT);
    let (processed, _) = acked_offsets(&out);
    assert_eq!(processed, (0..COUNT).collect::<BTreeSet<u64>>());
    println!("restarted consumer re-attached and drained {COUNT} offsets in {took:?}");
    assert!(took < Duration::from_secs(20), "took {took:?}");

    // The second process has exited too (without detaching): its session
    // holds the subscription.
    let holder = client.state(TOPIC, "workers").expect("state");
    assert_eq!(holder.consumers.len(), 1, "the dead session is still held");
    let held_by = holder.consumers[0].consumer_id;

    // Another consumer name is refused, naming the session and its expiry.
    let other = AttachRequest {
        subscription_type: SubscriptionType::Exclusive,
        consumer_name: Some("worker-b".into()),
        ..AttachRequest::default()
    };
    match client.attach(TOPIC, "workers", &other) {
        Err(ClientError::Api {
            status,
            kind,
            message,
            ..
        }) => {
            assert_eq!(
                (status, kind.as_str()),
                (409, "subscription_busy"),
                "{message}"
            );
            assert!(
                message.contains(&format!(
                    "consumer session {held_by} (consumer_name \"worker-a\")"
                )),
                "{message}"
            );
            let expires: u64 = message
                .split("expires in ")
                .nth(1)
                .and_then(|rest| rest.split(' ').next())
                .and_then(|ms| ms.parse().ok())
                .unwrap_or_else(|| panic!("no expiry in {message:?}"));
            assert!((1..=30_001).contains(&expires), "{message}");
            println!("409 body: {message}");
        }
        other => panic!("expected 409 subscription_busy, got {other:?}"),
    }
}
