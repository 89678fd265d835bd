//! Shared helpers of the integration tests: agents on temporary data
//! directories with a fixed clock, and a blocking HTTP client run off the
//! async runtime.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use broker_core::clock::ManualClock;
use serde_json::Value;
use tributary_edge::{Agent, AgentConfig, FullPolicy, TopicConfig};
use tributary_proto::batch::Record;
use tributary_proto::intent::StreamIntent;
use tributary_proto::keys::{NamespaceName, TopicName};
use tributary_proto::{Limits, RecordBatch};

/// The clock of every test agent, ms since the Unix epoch.
pub const NOW_MS: u64 = 1_767_225_600_000;

/// A configuration for edge `e1` in `dir`, local API on a free port.
pub fn config(dir: &Path) -> AgentConfig {
    let mut config = AgentConfig::new(dir, NamespaceName::new("e1").unwrap());
    config.local_api = "127.0.0.1:0".parse().unwrap();
    config
}

/// A configured topic.
pub fn topic(name: &str, intent: StreamIntent) -> TopicConfig {
    TopicConfig {
        name: TopicName::new(name).unwrap(),
        intent,
        disk_budget_bytes: None,
        full_policy: FullPolicy::Refuse,
        realtime_ring_records: None,
        retain_until: None,
    }
}

/// Small limits so budgets and segments stay small.
pub fn small_limits() -> Limits {
    Limits {
        max_record_bytes: 1024,
        max_batch_bytes: 2048,
    }
}

pub fn name(s: &str) -> TopicName {
    TopicName::new(s).unwrap()
}

pub async fn start(config: AgentConfig) -> Agent {
    Agent::start_with_clock(config, Arc::new(ManualClock::new(NOW_MS)))
        .await
        .expect("agent starts")
}

/// A response: status and body (JSON when it parses, else a string).
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub body: Value,
    pub text: String,
}

impl Reply {
    pub fn error(&self) -> &str {
        self.body["error"].as_str().unwrap_or("")
    }
}

fn agent() -> ureq::Agent {
    ureq::Agent::new_with_config(
        ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build(),
    )
}

fn reply(response: Result<ureq::http::Response<ureq::Body>, ureq::Error>) -> Reply {
    let mut response = response.expect("request completes");
    let status = response.status().as_u16();
    let text = response.body_mut().read_to_string().unwrap();
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text.clone()));
    Reply { status, body, text }
}

/// `POST http://{addr}{path}` with `headers` and `body`, off the runtime.
pub async fn post(addr: SocketAddr, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Reply {
    let url = format!("http://{addr}{path}");
    let headers: Vec<(String, String)> = headers
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    let body = body.to_vec();
    tokio::task::spawn_blocking(move || {
        let mut request = agent().post(&url);
        for (k, v) in &headers {
            request = request.header(k, v);
        }
        reply(request.send(&body[..]))
    })
    .await
    .unwrap()
}

/// `GET http://{addr}{path}`, off the runtime.
pub async fn get(addr: SocketAddr, path: &str) -> Reply {
    let url = format!("http://{addr}{path}");
    tokio::task::spawn_blocking(move || reply(agent().get(&url).call()))
        .await
        .unwrap()
}

/// Every record of the topic's WAL from `from`, decoded, with its offset.
pub fn read_wal(agent: &Agent, topic: &str, from: u64) -> Vec<(u64, Record)> {
    let topic = agent.topics().topic(&name(topic)).expect("topic exists");
    let wal = topic.wal().expect("durable topic");
    let limits = agent.config().limits;
    let mut out = Vec::new();
    let mut next = from;
    loop {
        let batches = wal.read(next, 1 << 20).unwrap();
        if batches.is_empty() {
            return out;
        }
        for batch in batches {
            let decoded = batch.decode(&limits).unwrap();
            for (i, record) in decoded.records.into_iter().enumerate() {
                let offset = decoded.base_offset + i as u64;
                if offset >= next {
                    out.push((offset, record));
                }
            }
            next = batch.next_offset();
        }
    }
}

/// A record with `value`, stamped with the test clock.
pub fn record(value: &[u8]) -> Record {
    Record {
        timestamp_ms: NOW_MS as i64,
        key: None,
        headers: Vec::new(),
        value: bytes::Bytes::copy_from_slice(value),
    }
}

/// Encoded size of one batch holding `records`, bytes.
pub fn batch_bytes(records: Vec<Record>, limits: &Limits) -> u64 {
    RecordBatch::new(0, records).encode(limits).unwrap().len() as u64
}
