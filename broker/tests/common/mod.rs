//! Shared by the broker's integration tests: real `broker` processes on
//! 127.0.0.1 (ports, processes and certificates from
//! `tributary_test_support`), their configs and admin API
//! helpers (`cluster.rs`, `storage_raft.rs`), and the single-leader cluster
//! view of the in-process API tests (`consumer_api.rs`, `tiered_read.rs`).
#![allow(dead_code)] // each test binary uses a subset

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use tributary_test_support::ports::{free_tcp, free_udp};
use tributary_test_support::process::Proc;

/// Admin token of every test broker.
pub const TOKEN: &str = "cluster-test-token";

/// One broker process of a test cluster: its id, config file and admin
/// address; SIGKILLed when dropped.
pub struct Node {
    pub id: u64,
    pub config: PathBuf,
    pub admin: SocketAddr,
    process: Proc,
}

impl Node {
    /// Node `id` that runs `broker --config {config}` once started (logs
    /// at `warn` on stderr).
    pub fn new(id: u64, config: PathBuf, admin: SocketAddr) -> Node {
        let mut command = Command::new(env!("CARGO_BIN_EXE_broker"));
        command.arg("--config").arg(&config).env("RUST_LOG", "warn");
        Node {
            id,
            config,
            admin,
            process: Proc::new("broker", command),
        }
    }

    /// Node `id` run by `process` (a command of its own: environment,
    /// logs).
    pub fn from_proc(id: u64, config: PathBuf, admin: SocketAddr, process: Proc) -> Node {
        Node {
            id,
            config,
            admin,
            process,
        }
    }

    pub fn start(&mut self) {
        self.process.start();
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        self.process.kill();
    }

    pub fn is_running(&self) -> bool {
        self.process.is_running()
    }

    pub fn url(&self, path: &str) -> String {
        format!("https://{}/v1{path}", self.admin)
    }

    pub fn status(&self) -> Option<Value> {
        get_json(&self.url("/cluster/status")).ok()
    }
}

/// Development CA directories of the test brokers written so far (the
/// brokers serve HTTPS; [`agent`] trusts these CAs only).
/// Every test's CA, as read when it was trusted: tests in this process run
/// at once, and a finished test deletes its directory.
static TRUSTED: std::sync::Mutex<Vec<(PathBuf, Vec<u8>)>> = std::sync::Mutex::new(Vec::new());

/// Makes [`agent`] trust the development CA in `certs`.
pub fn trust(certs: &Path) {
    let pem = tributary_test_support::certs::ca_pem(certs);
    let mut trusted = TRUSTED.lock().unwrap_or_else(|e| e.into_inner());
    if !trusted.iter().any(|(d, _)| d == certs) {
        trusted.push((certs.to_path_buf(), pem));
    }
}

/// An HTTPS agent trusting the CAs of every broker config written in this
/// process; 40 s timeout, statuses are answers.
pub fn agent() -> ureq::Agent {
    agent_with_timeout(std::time::Duration::from_secs(40))
}

/// [`agent`] with another whole-request timeout (bulk metadata writes on
/// a loaded three-broker cluster).
pub fn agent_with_timeout(timeout: std::time::Duration) -> ureq::Agent {
    let pems: Vec<Vec<u8>> = TRUSTED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .map(|(_, pem)| pem.clone())
        .collect();
    tributary_test_support::certs::https_agent_with_roots(&pems, timeout)
}

pub fn get_json(url: &str) -> Result<Value, String> {
    let mut response = agent()
        .get(url)
        .header("Authorization", &format!("Bearer {TOKEN}"))
        .call()
        .map_err(|e| e.to_string())?;
    if response.status() != 200 {
        return Err(format!("{url}: status {}", response.status()));
    }
    response
        .body_mut()
        .read_json::<Value>()
        .map_err(|e| e.to_string())
}

pub fn wait_for_leader(nodes: &[Node]) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let leaders: BTreeSet<Option<u64>> = nodes
            .iter()
            .filter(|n| n.is_running())
            .map(|n| n.status().and_then(|s| s["leader"].as_u64()))
            .collect();
        if leaders.len() == 1
            && let Some(Some(leader)) = leaders.into_iter().next()
            && nodes.iter().any(|n| n.id == leader && n.is_running())
        {
            return leader;
        }
        assert!(Instant::now() < deadline, "no agreed leader within 60 s");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Waits (bounded) until every running node's cluster status shows every
/// running node's lease live and active: only then does the load manager
/// place a new topic on the broker a request reached (it prefers that
/// broker only while it sees its lease), which a test publishing through a
/// chosen broker relies on.
pub fn wait_for_live_brokers(nodes: &[Node]) {
    let running: BTreeSet<u64> = nodes
        .iter()
        .filter(|n| n.is_running())
        .map(|n| n.id)
        .collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let all_see_all = nodes.iter().filter(|n| n.is_running()).all(|n| {
            n.status().is_some_and(|s| {
                let live: BTreeSet<u64> = s["brokers"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|b| b["live"] == true && b["lifecycle"] == "active")
                    .filter_map(|b| b["broker_id"].as_u64())
                    .collect();
                live == running
            })
        });
        if all_see_all {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "not every broker's lease live within 60 s"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

pub fn write_config(
    dir: &Path,
    certs: &Path,
    id: u64,
    raft: &[SocketAddr],
    admin: SocketAddr,
    snapshot_every: u64,
) -> PathBuf {
    write_config_with(dir, certs, id, raft, admin, snapshot_every, "")
}

/// [`write_config`] with `extra` TOML appended (whole sections).
pub fn write_config_with(
    dir: &Path,
    certs: &Path,
    id: u64,
    raft: &[SocketAddr],
    admin: SocketAddr,
    snapshot_every: u64,
    extra: &str,
) -> PathBuf {
    let members: String = raft
        .iter()
        .enumerate()
        .map(|(i, addr)| format!("{} = \"{addr}\"\n", i + 1))
        .collect();
    let text = format!(
        r#"node_id = {id}
data_dir = "{data}"
raft_listen = "{raft}"
admin_listen = "{admin}"
ingest_listen = "{ingest}"
admin_token = "{TOKEN}"

[tls]
cert = "{certs}/broker-{id}.pem"
key = "{certs}/broker-{id}.key"
ca = "{certs}/ca.pem"

[members]
{members}
[raft]
heartbeat_ms = 100
election_timeout_min_ms = 500
election_timeout_max_ms = 1000
snapshot_every = {snapshot_every}
logs_kept_after_snapshot = 5
{extra}"#,
        data = dir.join(format!("node-{id}")).display(),
        raft = raft[(id - 1) as usize],
        ingest = free_udp(),
        certs = certs.display(),
    );
    let path = dir.join(format!("broker-{id}.toml"));
    // It holds the admin token: the broker refuses it world-readable.
    tributary_test_support::certs::write_private(&path, &text);
    trust(certs);
    path
}

/// Three brokers (ids 1–3) under `dir` with certificates from one dev CA,
/// free ports, a snapshot every `snapshot_every` Raft entries; all started.
pub fn start_three(dir: &Path, snapshot_every: u64) -> Vec<Node> {
    start_three_with(dir, snapshot_every, "")
}

/// [`start_three`] with `extra` TOML sections in every broker's config.
pub fn start_three_with(dir: &Path, snapshot_every: u64, extra: &str) -> Vec<Node> {
    let certs = dir.join("certs");
    tributary_test_support::certs::issue(&certs, &[1, 2, 3], &[]);
    let raft: Vec<SocketAddr> = (0..3).map(|_| free_udp()).collect();
    let mut nodes: Vec<Node> = (1..=3u64)
        .map(|id| {
            let admin = free_tcp();
            let config = write_config_with(dir, &certs, id, &raft, admin, snapshot_every, extra);
            Node::new(id, config, admin)
        })
        .collect();
    for node in &mut nodes {
        node.start();
    }
    nodes
}
