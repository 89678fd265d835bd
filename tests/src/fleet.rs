//! Three real brokers on 127.0.0.1 (one Raft group), a tier service beside
//! each (all writing one local-directory archive), and one edge agent given
//! all three ingest addresses: the central cluster of the ownership tests.
//! Configuration files, ports and certificates are written by
//! [`Fleet::new`]; nothing starts until asked.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use tributary_api::consumer::{AttachRequest, StartPosition, SubscriptionType};
use tributary_api::consumer_client::ConsumerClient;
use tributary_test_support::ports::{free_tcp, free_udp};
use tributary_test_support::process::{Proc, bin_path};

use crate::cluster::child_log_filter;

/// The bootstrap admin token of every broker.
pub const TOKEN: &str = "e2e-test-token";

/// One broker and the tier service beside it.
pub struct Node {
    /// Node id (1..=3).
    pub id: u64,
    /// The broker process.
    pub broker: Proc,
    /// Its tier service.
    pub tier: Proc,
    /// Admin API (plain HTTP on loopback).
    pub admin: SocketAddr,
    /// Ingest (QUIC) address.
    pub ingest: SocketAddr,
    /// Raft (QUIC) address.
    pub raft: SocketAddr,
    /// Data directory.
    pub data: PathBuf,
}

impl Node {
    /// Starts the broker, then its tier service.
    pub fn start(&mut self) {
        self.broker.start();
        self.tier.start();
    }

    /// SIGKILLs the broker and its tier service (a lost host).
    pub fn kill(&mut self) {
        self.broker.kill();
        self.tier.kill();
    }

    /// Whether the broker runs.
    pub fn is_running(&self) -> bool {
        self.broker.is_running()
    }

    /// The admin API base URL.
    pub fn url(&self) -> String {
        format!("http://{}", self.admin)
    }
}

/// The whole fleet.
pub struct Fleet {
    /// Brokers 1..=3 (index 0 is broker 1).
    pub nodes: Vec<Node>,
    /// The edge agent (`plant1`).
    pub edge: Proc,
    /// Its local API.
    pub edge_api: SocketAddr,
    /// Its data directory.
    pub edge_data: PathBuf,
    /// The archive directory every tier service writes.
    pub archive: PathBuf,
    /// The certificates directory.
    pub certs: PathBuf,
}

impl Fleet {
    /// Writes certificates and configuration under `dir` for the edge
    /// topics `topics` (`(name, intent)`); `broker_extra` is appended to
    /// every broker's configuration (whole sections), `edge_extra` to the
    /// edge's top level.
    pub fn new(dir: &Path, topics: &[(&str, &str)], broker_extra: &str, edge_extra: &str) -> Fleet {
        let certs = dir.join("certs");
        tributary_test_support::certs::issue(&certs, &[1, 2, 3], &["plant1"]);
        let archive = dir.join("archive");
        std::fs::create_dir_all(&archive).expect("archive dir");
        let raft: Vec<SocketAddr> = (0..3).map(|_| free_udp()).collect();
        let members: String = raft
            .iter()
            .enumerate()
            .map(|(i, addr)| format!("{} = \"{addr}\"\n", i + 1))
            .collect();
        // Raft keeps its default timings (250 ms heartbeats): with faster
        // ones, a loaded two-core CI machine misses AppendEntries deadlines
        // often enough to let a healthy owner's lease lapse.
        let mut nodes = Vec::new();
        for id in 1..=3u64 {
            let admin = free_tcp();
            let ingest = free_udp();
            let data = dir.join(format!("broker-{id}"));
            let config = dir.join(format!("broker-{id}.toml"));
            tributary_test_support::certs::write_private(
                &config,
                &format!(
                    r#"node_id = {id}
data_dir = "{data}"
raft_listen = "{raft}"
admin_listen = "{admin}"
admin_plain_http = true
ingest_listen = "{ingest}"
admin_token = "{TOKEN}"
[tls]
cert = "{certs}/broker-{id}.pem"
key = "{certs}/broker-{id}.key"
ca = "{certs}/ca.pem"
[members]
{members}
[wal]
segment_max_age_ms = 1000
[archive.store]
url = "{archive}"
{broker_extra}
"#,
                    data = data.display(),
                    raft = raft[(id - 1) as usize],
                    certs = certs.display(),
                    archive = archive.display(),
                ),
            );
            let tier_config = dir.join(format!("tier-{id}.toml"));
            tributary_test_support::certs::write_private(
                &tier_config,
                &format!(
                    r#"data_dir = "{data}"
poll_interval_ms = 300
metrics_listen = "{metrics}"
[broker]
url = "http://{admin}"
token = "{TOKEN}"
[store]
url = "{archive}"
"#,
                    data = data.display(),
                    metrics = free_tcp(),
                    archive = archive.display(),
                ),
            );
            let mut broker_cmd = Command::new(bin_path("broker"));
            broker_cmd
                .arg("--config")
                .arg(&config)
                .env("RUST_LOG", child_log_filter());
            let mut tier_cmd = Command::new(bin_path("tier-service"));
            tier_cmd
                .arg("--config")
                .arg(&tier_config)
                .env("RUST_LOG", child_log_filter());
            nodes.push(Node {
                id,
                broker: Proc::new("broker", broker_cmd),
                tier: Proc::new("tier-service", tier_cmd),
                admin,
                ingest,
                raft: raft[(id - 1) as usize],
                data,
            });
        }
        let edge_api = free_tcp();
        let edge_data = dir.join("edge");
        let brokers: Vec<String> = nodes.iter().map(|n| format!("\"{}\"", n.ingest)).collect();
        let topics: String = topics
            .iter()
            .map(|(name, intent)| format!("[[topics]]\nname = \"{name}\"\nintent = \"{intent}\"\n"))
            .collect();
        let edge_config = dir.join("edge.toml");
        std::fs::write(
            &edge_config,
            format!(
                r#"data_dir = "{data}"
edge_id = "plant1"
brokers = [{brokers}]
local_api = "{edge_api}"
checkpoint_interval_ms = 200
{edge_extra}
[tls]
cert = "{certs}/edge-plant1.pem"
key = "{certs}/edge-plant1.key"
ca = "{certs}/ca.pem"
{topics}"#,
                data = edge_data.display(),
                brokers = brokers.join(", "),
                certs = certs.display(),
            ),
        )
        .expect("edge config");
        let mut edge_cmd = Command::new(bin_path("edge-agent"));
        edge_cmd
            .arg("run")
            .arg("--config")
            .arg(&edge_config)
            .env("RUST_LOG", child_log_filter());
        Fleet {
            nodes,
            edge: Proc::new("edge-agent", edge_cmd),
            edge_api,
            edge_data,
            archive,
            certs,
        }
    }

    /// Starts every broker and tier service, then the edge; waits for the
    /// edge's API.
    pub fn start_all(&mut self) {
        for node in &mut self.nodes {
            node.start();
        }
        self.edge.start();
        let deadline = Instant::now() + Duration::from_secs(30);
        while edge_get(self.edge_api, "/health").is_none() {
            assert!(Instant::now() < deadline, "edge API not up within 30 s");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The owner of `topic` and its epoch, from the ownership markers in the
    /// brokers' data directories (`{data}/ownership/{ns}/{topic}`): the
    /// highest epoch marked. A broker writes its marker when it opens the
    /// topic as owner.
    pub fn marked_owner(&self, topic: &str) -> Option<(u64, u64)> {
        self.nodes
            .iter()
            .filter_map(|n| {
                let path = n.data.join("ownership").join(topic.trim_start_matches('/'));
                let bytes = std::fs::read(path).ok()?;
                let v: Value = serde_json::from_slice(&bytes).ok()?;
                Some((v["epoch"].as_u64()?, n.id))
            })
            .max()
            .map(|(epoch, id)| (id, epoch))
    }

    /// The Raft leader as broker `via` sees it (`GET /v1/cluster/status`),
    /// `None` while there is none or the broker does not answer.
    pub fn raft_leader(&self, via: u64) -> Option<u64> {
        let mut reply = ureq::get(format!(
            "{}/v1/cluster/status",
            self.nodes[(via - 1) as usize].url()
        ))
        .header("Authorization", format!("Bearer {TOKEN}"))
        .call()
        .ok()?;
        let status: Value = reply.body_mut().read_json().ok()?;
        status["leader"].as_u64()
    }

    /// The node with id `id`.
    pub fn node(&mut self, id: u64) -> &mut Node {
        &mut self.nodes[(id - 1) as usize]
    }

    /// A consumer client of broker `id` (it follows redirects to owners).
    pub fn consumer(&self, id: u64) -> ConsumerClient {
        ConsumerClient::new(&self.nodes[(id - 1) as usize].url(), TOKEN)
    }
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(30)))
        .http_status_as_error(false)
        .build()
        .into()
}

/// `GET {path}` on an edge's local API, as JSON; `None` on any failure.
pub fn edge_get(api: SocketAddr, path: &str) -> Option<Value> {
    let mut response = agent().get(&format!("http://{api}{path}")).call().ok()?;
    if response.status() != 200 {
        return None;
    }
    response.body_mut().read_json::<Value>().ok()
}

/// (high-water mark, acknowledged offset) of `topic` at the edge.
pub fn edge_offsets(api: SocketAddr, topic: &str) -> Option<(u64, u64)> {
    let state = edge_get(api, &format!("/v1/topics{topic}"))?;
    Some((
        state["high_water_mark"].as_u64()?,
        state["acknowledged_offset"].as_u64()?,
    ))
}

/// Publishes NDJSON lines to `topic` at the edge as one batch; returns
/// (base, next) offsets.
///
/// # Errors
/// The transport error or the status and body of a refusal.
pub fn publish_ndjson(api: SocketAddr, topic: &str, body: String) -> Result<(u64, u64), String> {
    let mut response = agent()
        .post(&format!("http://{api}/v1/topics{topic}/batch"))
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

/// `n` NDJSON lines whose values are `{tag}-{i}` for `i` in `from..from+n`.
pub fn ndjson(tag: &str, from: u64, n: u64) -> String {
    (from..from + n)
        .map(|i| format!("{{\"key\":\"k{}\",\"value\":\"{tag}-{i}\"}}\n", i % 16))
        .collect()
}

/// Waits (bounded by `limit`) until the edge reports `topic` acknowledged
/// up to its high-water mark, at least `target`.
pub fn wait_acknowledged(api: SocketAddr, topic: &str, target: u64, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        if let Some((hwm, acked)) = edge_offsets(api, topic)
            && acked >= target
            && acked == hwm
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{topic} not acknowledged up to {target} within {limit:?}: {:?}",
            edge_offsets(api, topic)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Reads `topic` from the earliest offset with a fresh exclusive
/// subscription through `client` until `end`, acknowledging as it goes:
/// every record's value by offset.
///
/// It behaves as a consumer of a cluster must: a `503 no_owner` answer
/// (Retry-After; the owner's lease lapsed or the topic is moving) is retried
/// after a pause, and a `404` for the session (the topic moved and the new
/// owner never saw this consumer) re-attaches under the same subscription,
/// which resumes from the cursor stored in Raft. Records past that cursor
/// may then come again (at-least-once for what was never acknowledged):
/// such a redelivery must carry the value first delivered.
///
/// Panics on an offset delivered twice within one session, a redelivery
/// with another value, or when the cursor stops moving for `limit`.
pub fn consume_all(
    client: &ConsumerClient,
    topic: &str,
    subscription: &str,
    end: u64,
    limit: Duration,
) -> BTreeMap<u64, String> {
    let attach = AttachRequest {
        subscription_type: SubscriptionType::Exclusive,
        start: StartPosition::Earliest,
        ..AttachRequest::default()
    };
    let deadline = Instant::now() + limit;
    let pause = |what: &str, e: &dyn std::fmt::Display| {
        assert!(Instant::now() < deadline, "{what} {topic}: {e}");
        std::thread::sleep(Duration::from_millis(300));
    };
    let mut records = BTreeMap::new();
    let mut redelivered = 0u64;
    'session: loop {
        let session = match client.attach(topic, subscription, &attach) {
            Ok(session) => session,
            Err(e) => {
                pause("attach to", &e);
                continue 'session;
            }
        };
        let mut this_session = std::collections::BTreeSet::new();
        let mut cursor = session.cursor;
        while cursor < end {
            assert!(
                Instant::now() < deadline,
                "consumer of {topic} stuck at {cursor} (end {end})"
            );
            let got = match client.read(topic, subscription, session.consumer_id, 1000, 500) {
                Ok(got) => got,
                Err(e) if e.status() == Some(503) => {
                    pause("read", &e);
                    continue;
                }
                Err(e) => {
                    pause("read (re-attaching)", &e);
                    continue 'session;
                }
            };
            let mut last = None;
            for m in got.messages {
                last = Some(m.offset);
                assert!(
                    this_session.insert(m.offset),
                    "offset {} of {topic} delivered twice in one session",
                    m.offset
                );
                let value = m.value.unwrap_or_default();
                if let Some(first) = records.insert(m.offset, value.clone()) {
                    assert_eq!(
                        first, value,
                        "offset {} of {topic} redelivered with another value",
                        m.offset
                    );
                    redelivered += 1;
                }
            }
            cursor = got.cursor;
            let Some(last) = last else { continue };
            // The records are held: acknowledge them, retrying while the
            // owner is briefly unavailable.
            loop {
                match client.ack_up_to(topic, subscription, session.consumer_id, last) {
                    Ok(acked) => {
                        cursor = acked.cursor;
                        break;
                    }
                    Err(e) if e.status() == Some(503) => pause("ack", &e),
                    Err(e) => {
                        pause("ack (re-attaching)", &e);
                        continue 'session;
                    }
                }
            }
        }
        if redelivered > 0 {
            eprintln!(
                "{topic}: {redelivered} unacknowledged records redelivered after a re-attach"
            );
        }
        return records;
    }
}
