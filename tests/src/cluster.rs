//! A real `broker` and `edge-agent` pair on 127.0.0.1 for end-to-end tests
//! (processes, ports and certificates from `tributary_test_support`): their
//! configuration files, the edge's local API, `/metrics` scrapes, and reading
//! both ends' WALs after they stopped.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use broker_core::wal::{Wal, WalConfig};
use bytes::Bytes;
use serde_json::Value;
use tributary_api::consumer::{AttachRequest, Gap, StartPosition, SubscriptionType};
use tributary_api::consumer_client::ConsumerClient;
use tributary_proto::Record;
use tributary_test_support::ports::{free_tcp, free_udp};
use tributary_test_support::process::{Proc, bin_path};

/// A single-node broker and one edge (`plant1`) wired to it, in `dir`.
pub struct Pair {
    /// The broker process.
    pub broker: Proc,
    /// The edge-agent process.
    pub edge: Proc,
    /// The edge's local API address.
    pub edge_api: SocketAddr,
    /// The broker's admin API (and `/metrics`).
    pub broker_admin: SocketAddr,
    /// The broker's data directory.
    pub broker_data: PathBuf,
    /// The edge's data directory.
    pub edge_data: PathBuf,
}

/// Intent of the topic used by [`Pair`]'s tests.
pub const TOPIC: &str = "/plant1/readings";

impl Pair {
    /// Writes certificates and configs under `dir`; starts nothing.
    /// `edge_brokers` overrides the broker address the edge dials (a relay).
    pub fn new(dir: &Path, intent: &str, edge_brokers: Option<String>) -> Pair {
        Pair::new_with(dir, intent, edge_brokers, "", "")
    }

    /// [`Pair::new`] with extra TOML lines for the edge: `agent_extra` at the
    /// top level, `topic_extra` in the test topic's `[[topics]]` table.
    pub fn new_with(
        dir: &Path,
        intent: &str,
        edge_brokers: Option<String>,
        agent_extra: &str,
        topic_extra: &str,
    ) -> Pair {
        let certs = dir.join("certs");
        tributary_test_support::certs::issue(&certs, &[1], &["plant1"]);
        let ingest = free_udp();
        let broker_admin = free_tcp();
        let broker_data = dir.join("broker");
        let broker_config = dir.join("broker.toml");
        // Plain HTTP on loopback (the broker logs it): the e2e tests here
        // are about replication and consumers; tests/tests/https.rs covers
        // the HTTPS listener. The file holds the token: mode 0600.
        crate::solo::write_single_node_config(
            &broker_config,
            &broker_data,
            broker_admin,
            ingest,
            &certs,
            // A consumer waits this long at a damaged central range (it may
            // heal) before the poison policy applies; short for tests.
            "[consumers]\ndamage_wait_ms = 3000",
        );
        let edge_api = free_tcp();
        let edge_data = dir.join("edge");
        let edge_config = dir.join("edge.toml");
        // Through a relay (a lossy, thin link) the edge keeps the thin-link
        // settings of docs/edge-agent.md: a short cut must not end the
        // connection (the default 5 s idle timeout is for failover).
        let thin_link = if edge_brokers.is_some() {
            "keep_alive_ms = 5000\nidle_timeout_ms = 30000\n"
        } else {
            ""
        };
        let brokers = edge_brokers.unwrap_or_else(|| ingest.to_string());
        std::fs::write(
            &edge_config,
            format!(
                r#"data_dir = "{data}"
edge_id = "plant1"
brokers = ["{brokers}"]
local_api = "{api}"
checkpoint_interval_ms = 200
{agent_extra}
[tls]
cert = "{certs}/edge-plant1.pem"
key = "{certs}/edge-plant1.key"
ca = "{certs}/ca.pem"
# A pair runs no tier service: nothing is ever archived, so the edge
# deletes what the broker acknowledged (before archived offsets).
[replication]
retain_until = "acknowledged"
{thin_link}[[topics]]
name = "{TOPIC}"
intent = "{intent}"
{topic_extra}
"#,
                data = edge_data.display(),
                api = edge_api,
                certs = certs.display(),
            ),
        )
        .expect("edge config");
        let mut broker_cmd = Command::new(bin_path("broker"));
        broker_cmd
            .arg("--config")
            .arg(&broker_config)
            .env("RUST_LOG", child_log_filter());
        let mut edge_cmd = Command::new(bin_path("edge-agent"));
        edge_cmd
            .arg("run")
            .arg("--config")
            .arg(&edge_config)
            .env("RUST_LOG", child_log_filter());
        Pair {
            broker: Proc::new("broker", broker_cmd),
            edge: Proc::new("edge-agent", edge_cmd),
            edge_api,
            broker_admin,
            broker_data,
            edge_data,
        }
    }

    /// A consumer client of the pair's broker (consumer API on the admin
    /// listener, the test token).
    pub fn consumer(&self) -> ConsumerClient {
        ConsumerClient::new(&format!("http://{}", self.broker_admin), "e2e-test-token")
    }

    /// Reads [`TOPIC`] from the earliest offset with the exclusive cursor-read
    /// subscription `subscription` until its cursor reaches `end`,
    /// acknowledging as it goes: the records by offset and the distinct gap
    /// notices. Panics when an offset is delivered twice or the cursor stops
    /// moving for 60 s.
    pub fn consume_all(
        &self,
        subscription: &str,
        end: u64,
    ) -> (std::collections::BTreeMap<u64, String>, Vec<Gap>) {
        let client = self.consumer();
        let attach = AttachRequest {
            subscription_type: SubscriptionType::Exclusive,
            start: StartPosition::Earliest,
            ..AttachRequest::default()
        };
        let session = client.attach(TOPIC, subscription, &attach).expect("attach");
        let mut records = std::collections::BTreeMap::new();
        let mut gaps: Vec<Gap> = Vec::new();
        let mut cursor = session.cursor;
        let deadline = Instant::now() + Duration::from_secs(60);
        while cursor < end {
            assert!(
                Instant::now() < deadline,
                "consumer stuck at {cursor} (end {end})"
            );
            let got = client
                .read(TOPIC, subscription, session.consumer_id, 500, 500)
                .expect("read");
            for gap in got.gaps {
                if !gaps.contains(&gap) {
                    gaps.push(gap);
                }
            }
            let mut last = None;
            for m in got.messages {
                last = Some(m.offset);
                assert!(
                    records
                        .insert(m.offset, m.value.expect("text value"))
                        .is_none(),
                    "offset {} delivered twice",
                    m.offset
                );
            }
            cursor = got.cursor;
            if let Some(last) = last {
                cursor = client
                    .ack_up_to(TOPIC, subscription, session.consumer_id, last)
                    .expect("ack up to")
                    .cursor;
            }
        }
        (records, gaps)
    }

    /// Attaches the exclusive subscription `probe` to [`TOPIC`], which opens
    /// the topic's WAL at the broker (its seal timer, retention and
    /// background scrub run from then on), retrying for 60 s while the
    /// broker starts.
    pub fn open_topic(&self) {
        let attach = AttachRequest {
            subscription_type: SubscriptionType::Exclusive,
            start: StartPosition::Earliest,
            ..AttachRequest::default()
        };
        let client = self.consumer();
        let deadline = Instant::now() + Duration::from_secs(60);
        while client.attach(TOPIC, "probe", &attach).is_err() {
            assert!(
                Instant::now() < deadline,
                "broker up and the topic open: not within 60 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A client of the edge's local API (can move to another thread).
    pub fn api_client(edge_api: SocketAddr) -> EdgeClient {
        EdgeClient { api: edge_api }
    }

    fn client(&self) -> EdgeClient {
        EdgeClient { api: self.edge_api }
    }

    /// The test topic's state at the edge (`GET /v1/topics/{ns}/{topic}`).
    pub fn topic_state(&self) -> Option<Value> {
        self.client().topic_state()
    }

    /// (high-water mark, acknowledged offset) of the test topic at the edge.
    pub fn edge_offsets(&self) -> Option<(u64, u64)> {
        self.client().edge_offsets()
    }

    /// Publishes NDJSON lines as one batch; returns (base, next) offsets.
    ///
    /// # Errors
    /// The transport error or the status and body of a refusal.
    pub fn publish_ndjson(&self, body: String) -> Result<(u64, u64), String> {
        self.client().publish_ndjson(body)
    }

    /// Publishes records `*next..*next + count` as one NDJSON batch, the
    /// record at offset `o` holding `value(o)` (JSON text), checks that the
    /// edge assigned exactly those offsets, and moves `next` past them.
    /// Panics on a refusal.
    pub fn publish_values(&self, next: &mut u64, count: u64, value: impl Fn(u64) -> String) {
        let body: String = (*next..*next + count)
            .map(|o| format!("{{\"value\":{:?}}}\n", value(o)))
            .collect();
        let (base, end) = self.publish_ndjson(body).expect("publish");
        // Offsets are never reused: each publish starts where the last ended.
        assert_eq!((base, end), (*next, *next + count), "offsets assigned");
        *next = end;
    }

    /// Waits (bounded) for the edge's local API to answer.
    pub fn wait_for_edge(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.edge_offsets().is_none() {
            assert!(Instant::now() < deadline, "edge API not up within 30 s");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits (bounded by `limit`) until the edge reports everything up to
    /// `target` acknowledged by the broker.
    pub fn wait_acknowledged(&self, target: u64, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            if let Some((_, acked)) = self.edge_offsets()
                && acked >= target
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "not acknowledged up to {target} within {limit:?}: {:?}",
                self.edge_offsets()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// The `RUST_LOG` filter of the broker and edge processes a [`Pair`]
/// starts: `TRIB_TEST_CHILD_LOG` if set (to debug a failing test), else
/// `warn`.
pub fn child_log_filter() -> String {
    std::env::var("TRIB_TEST_CHILD_LOG").unwrap_or_else(|_| "warn".into())
}

/// A client of an edge's local API for the test topic.
#[derive(Debug, Clone, Copy)]
pub struct EdgeClient {
    api: SocketAddr,
}

impl EdgeClient {
    /// The test topic's state (`GET /v1/topics/{ns}/{topic}`).
    pub fn topic_state(&self) -> Option<Value> {
        let url = format!("http://{}/v1/topics/plant1/readings", self.api);
        let mut response = agent().get(&url).call().ok()?;
        if response.status() != 200 {
            return None;
        }
        response.body_mut().read_json::<Value>().ok()
    }

    /// (high-water mark, acknowledged offset) of the test topic.
    pub fn edge_offsets(&self) -> Option<(u64, u64)> {
        let state = self.topic_state()?;
        Some((
            state["high_water_mark"].as_u64()?,
            state["acknowledged_offset"].as_u64()?,
        ))
    }

    /// Publishes NDJSON lines as one batch; returns (base, next) offsets.
    ///
    /// # Errors
    /// The transport error or the status and body of a refusal.
    pub fn publish_ndjson(&self, body: String) -> Result<(u64, u64), String> {
        let url = format!("http://{}/v1/topics/plant1/readings/batch", self.api);
        let mut response = agent()
            .post(&url)
            .header("content-type", "application/x-ndjson")
            .send(body)
            .map_err(|e| e.to_string())?;
        let status = response.status().as_u16();
        let value: Value = response.body_mut().read_json().map_err(|e| e.to_string())?;
        if status != 200 && status != 201 {
            return Err(format!("status {status}: {value}"));
        }
        Ok((
            value["base_offset"].as_u64().ok_or("no base_offset")?,
            value["next_offset"].as_u64().ok_or("no next_offset")?,
        ))
    }
}

/// The Prometheus exposition at `url`; `Err` while the listener is not up
/// (connection refused: the process is still starting).
///
/// # Panics
/// On a status other than 200.
pub fn try_scrape(url: &str) -> Result<String, String> {
    let mut response = agent().get(url).call().map_err(|e| e.to_string())?;
    assert_eq!(response.status(), 200, "{url}");
    response
        .body_mut()
        .read_to_string()
        .map_err(|e| e.to_string())
}

/// The value of `series` in `text`: the sample named exactly so (name with
/// its labels, as exposed), else the one sample of that name whose labels
/// include every label `series` names (so `name{topic="/e1/a"}` finds
/// `name{edge="e1",topic="/e1/a"}` and `name` finds `name{edge="e1"}`);
/// `None` when no sample or several match.
pub fn metric_value(text: &str, series: &str) -> Option<u64> {
    let parse = |v: &str| v.trim().parse::<f64>().ok().map(|v| v as u64);
    if let Some(v) = text
        .lines()
        .find_map(|line| parse(line.strip_prefix(series)?.strip_prefix(' ')?))
    {
        return Some(v);
    }
    let (name, wanted) = split_series(series);
    let mut matching = text.lines().filter_map(|line| {
        let (line_series, value) = line.rsplit_once(' ')?;
        let (line_name, have) = split_series(line_series);
        (line_name == name && wanted.iter().all(|w| have.contains(w)))
            .then(|| parse(value))
            .flatten()
    });
    let first = matching.next()?;
    matching.next().is_none().then_some(first)
}

/// `name{a="x",b="y"}` as its name and its `a="x"` parts.
fn split_series(series: &str) -> (&str, Vec<&str>) {
    match series.split_once('{') {
        Some((name, labels)) => (
            name,
            labels
                .trim_end_matches('}')
                .split(',')
                .filter(|l| !l.is_empty())
                .collect(),
        ),
        None => (series, Vec::new()),
    }
}

fn agent() -> ureq::Agent {
    tributary_api::phase_timeouts!(
        ureq::Agent::config_builder().http_status_as_error(false),
        Duration::from_secs(120)
    )
    .build()
    .into()
}

/// Every record of the WAL in `dir` as (offset, value), from its log
/// start. Opens (and closes) the WAL: the process that owns it must be
/// stopped.
pub fn read_wal(dir: &Path) -> Vec<(u64, Bytes)> {
    read_records(dir)
        .into_iter()
        .map(|(offset, record)| (offset, record.value))
        .collect()
}

/// Every record of the WAL in `dir` with its offset, headers included. The
/// process that owns the WAL must be stopped.
pub fn read_records(dir: &Path) -> Vec<(u64, Record)> {
    if !dir.exists() {
        return Vec::new();
    }
    let wal = Wal::open(dir, WalConfig::default()).expect("open wal");
    let mut out = Vec::new();
    let mut from = wal.log_start_offset();
    loop {
        let batches = wal.read(from, 8 << 20).expect("read wal");
        if batches.is_empty() {
            return out;
        }
        for batch in batches {
            let decoded = batch.decode(&wal.config().limits).expect("decode");
            for (i, record) in decoded.records.into_iter().enumerate() {
                out.push((decoded.base_offset + i as u64, record));
            }
            from = batch.next_offset();
        }
    }
}

/// The batches (raw bytes) of the WAL in `dir` from `from` on.
pub fn read_batches(dir: &Path, from: u64) -> Vec<Bytes> {
    let wal = Wal::open(dir, WalConfig::default()).expect("open wal");
    let mut out = Vec::new();
    let mut next = from;
    loop {
        let batches = wal.read(next, 8 << 20).expect("read wal");
        if batches.is_empty() {
            return out;
        }
        for batch in batches {
            next = batch.next_offset();
            out.push(batch.into_bytes());
        }
    }
}
