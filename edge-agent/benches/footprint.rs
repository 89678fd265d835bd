//! Memory footprint of the `edge-agent` binary (issue 7, "Edge devices"):
//! resident set size idle and while ingesting at full speed, read from
//! `/proc/PID/status` (`VmRSS` sampled every 50 ms, `VmHWM` = the kernel's
//! peak). Targets: idle ≤ 12 MiB, ingesting ≤ 48 MiB.
//!
//! The agent runs as its own process from the release build with a
//! Raspberry-Pi-like configuration (`configs/edge-raspberry-pi.toml`):
//! an `audit_log` topic (fsync per group commit, refuse when full), an
//! `event_stream` topic (drop_oldest), a `realtime` ring of 10,000 records,
//! mutual TLS, and a broker address where nobody listens, so the replicator
//! keeps reconnecting and the backlog accumulates (the worst case on a
//! device). Load: producer threads posting NDJSON batches of
//! `BATCH_RECORDS` records of about 200 bytes (a JSON sensor reading) to the
//! local API as fast as the agent acknowledges them, for `INGEST_SECS`.
//!
//! Run: `scripts/edge-footprint` (= `cargo bench -p edge-agent --bench
//! footprint`). Environment: `TRIB_EDGE_BIN` (another binary to measure,
//! e.g. the plain `--release` build: `cargo bench` builds this crate's binary
//! with the dev-dependency features), `FOOTPRINT_INGEST_SECS`.
//! Exit status 1 if a target is missed.

use std::io::Write as _;
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use tributary_api::client::ClientError;
use tributary_edge::client::LocalClient;
use tributary_proto::keys::TopicName;

const MIB: f64 = 1024.0 * 1024.0;
/// Idle target, bytes.
const IDLE_TARGET_BYTES: u64 = 12 * 1024 * 1024;
/// Ingest target, bytes.
const INGEST_TARGET_BYTES: u64 = 48 * 1024 * 1024;
/// How long the agent sits idle before the idle reading, s.
const IDLE_SECS: u64 = 5;
/// Default ingest duration, s.
const INGEST_SECS: u64 = 20;
/// Records per posted batch.
const BATCH_RECORDS: usize = 500;
/// Producer threads on the event_stream topic (plus one on audit, one on
/// the realtime ring).
const TELEMETRY_PRODUCERS: usize = 3;

fn main() -> anyhow::Result<()> {
    // `cargo bench` passes `--bench`; nothing to parse.
    let bin = std::env::var_os("TRIB_EDGE_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_edge-agent")));
    let ingest_secs = match std::env::var("FOOTPRINT_INGEST_SECS") {
        Ok(s) => s.parse().context("FOOTPRINT_INGEST_SECS")?,
        Err(_) => INGEST_SECS,
    };
    let dir = tempfile::tempdir()?;
    let api = SocketAddr::from(([127, 0, 0, 1], free_tcp_port()?));
    let config = write_config(dir.path(), api)?;

    println!("edge-agent footprint: {}", bin.display());
    let mut agent = Agent::start(&bin, &config)?;
    agent.wait_healthy(api)?;
    std::thread::sleep(Duration::from_secs(IDLE_SECS));
    let idle = agent.status()?;
    println!(
        "idle after {IDLE_SECS} s:   VmRSS {:6.1} MiB  VmHWM {:6.1} MiB  threads {}",
        idle.rss as f64 / MIB,
        idle.hwm as f64 / MIB,
        idle.threads
    );

    let load = Load::start(api, ingest_secs);
    let mut peak_rss = 0;
    let mut max_threads = 0;
    while !load.done() {
        let s = agent.status()?;
        peak_rss = peak_rss.max(s.rss);
        max_threads = max_threads.max(s.threads);
        std::thread::sleep(Duration::from_millis(50));
    }
    let stats = load.join()?;
    let after = agent.status()?;
    let rate = stats.records as f64 / stats.elapsed.as_secs_f64();
    println!(
        "ingesting {:.1} s: {} records ({:.0} records/s, {:.1} MiB/s of NDJSON), {} refused (507, audit budget full)",
        stats.elapsed.as_secs_f64(),
        stats.records,
        rate,
        stats.bytes as f64 / MIB / stats.elapsed.as_secs_f64(),
        stats.refused
    );
    println!(
        "ingesting:        VmRSS peak {:6.1} MiB  VmHWM {:6.1} MiB  threads {}",
        peak_rss as f64 / MIB,
        after.hwm as f64 / MIB,
        max_threads
    );
    println!("after ingest:     VmRSS {:6.1} MiB", after.rss as f64 / MIB);
    agent.stop()?;

    let idle_ok = idle.rss <= IDLE_TARGET_BYTES;
    let ingest_ok = after.hwm <= INGEST_TARGET_BYTES;
    println!(
        "targets: idle VmRSS {:.1} ≤ 12 MiB: {}; ingest VmHWM {:.1} ≤ 48 MiB: {}",
        idle.rss as f64 / MIB,
        verdict(idle_ok),
        after.hwm as f64 / MIB,
        verdict(ingest_ok)
    );
    if stats.records == 0 {
        bail!("no record was acknowledged");
    }
    if !(idle_ok && ingest_ok) {
        std::process::exit(1);
    }
    Ok(())
}

fn verdict(ok: bool) -> &'static str {
    if ok { "ok" } else { "OVER" }
}

fn free_tcp_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// A UDP port nobody listens on: bound, read, released.
fn dead_udp_port() -> anyhow::Result<u16> {
    Ok(UdpSocket::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Certificates and a configuration like `configs/edge-raspberry-pi.toml`.
fn write_config(dir: &Path, api: SocketAddr) -> anyhow::Result<PathBuf> {
    let certs = dir.join("certs");
    broker_core::dev_certs::issue(&certs, &[1], &["plant1".to_owned()])?;
    let tls = broker_core::dev_certs::edge_paths(&certs, "plant1");
    let path = dir.join("edge.toml");
    let mut f = std::fs::File::create(&path)?;
    write!(
        f,
        r#"data_dir = {data:?}
edge_id = "plant1"
brokers = ["127.0.0.1:{broker}"]
local_api = "{api}"
disk_budget_bytes = 1_073_741_824
max_record_bytes = 262_144
max_batch_bytes = 1_048_576

[tls]
cert = {cert:?}
key = {key:?}
ca = {ca:?}

[[topics]]
name = "/plant1/audit"
intent = "audit_log"
disk_budget_bytes = 268_435_456
full_policy = "refuse"

[[topics]]
name = "/plant1/telemetry"
intent = "event_stream"
disk_budget_bytes = 536_870_912
full_policy = "drop_oldest"

[[topics]]
name = "/plant1/live"
intent = "realtime"
realtime_ring_records = 10_000
"#,
        data = dir.join("data").display().to_string(),
        broker = dead_udp_port()?,
        cert = tls.cert.display().to_string(),
        key = tls.key.display().to_string(),
        ca = tls.ca.display().to_string(),
    )?;
    Ok(path)
}

/// One reading of `/proc/PID/status`, bytes.
struct Status {
    rss: u64,
    hwm: u64,
    threads: u64,
}

struct Agent {
    child: Child,
}

impl Agent {
    fn start(bin: &Path, config: &Path) -> anyhow::Result<Agent> {
        let child = Command::new(bin)
            .args(["run", "--config"])
            .arg(config)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        Ok(Agent { child })
    }

    fn wait_healthy(&mut self, api: SocketAddr) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!("the agent exited early: {status}");
            }
            if ureq::get(&format!("http://{api}/health")).call().is_ok() {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("the agent did not become healthy in 30 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn status(&self) -> anyhow::Result<Status> {
        let text = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))?;
        let field = |name: &str| -> anyhow::Result<u64> {
            let line = text
                .lines()
                .find(|l| l.starts_with(name))
                .with_context(|| format!("no {name} in /proc/PID/status"))?;
            let value: u64 = line[name.len()..]
                .split_whitespace()
                .next()
                .context("empty field")?
                .parse()?;
            Ok(value)
        };
        Ok(Status {
            rss: field("VmRSS:")? * 1024,
            hwm: field("VmHWM:")? * 1024,
            threads: field("Threads:")?,
        })
    }

    fn stop(mut self) -> anyhow::Result<()> {
        let pid = self.child.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status()?;
        let status = self.child.wait()?;
        if !status.success() {
            bail!("the agent exited with {status} after SIGTERM");
        }
        Ok(())
    }
}

#[derive(Default)]
struct LoadStats {
    records: u64,
    bytes: u64,
    refused: u64,
    elapsed: Duration,
}

struct Load {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<anyhow::Result<LoadStats>>>,
    start: Instant,
    until: Instant,
}

impl Load {
    fn start(api: SocketAddr, secs: u64) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let seq = Arc::new(AtomicU64::new(0));
        let start = Instant::now();
        let until = start + Duration::from_secs(secs);
        let mut topics = vec!["/plant1/telemetry"; TELEMETRY_PRODUCERS];
        topics.extend(["/plant1/audit", "/plant1/live"]);
        let threads = topics
            .into_iter()
            .map(|topic| {
                let stop = stop.clone();
                let seq = seq.clone();
                std::thread::spawn(move || produce(api, topic, until, &stop, &seq))
            })
            .collect();
        Load {
            stop,
            threads,
            start,
            until,
        }
    }

    fn done(&self) -> bool {
        Instant::now() >= self.until || self.threads.iter().any(|t| t.is_finished())
    }

    fn join(self) -> anyhow::Result<LoadStats> {
        self.stop.store(true, Ordering::Relaxed);
        let mut total = LoadStats::default();
        for t in self.threads {
            let s = t
                .join()
                .map_err(|_| anyhow::anyhow!("a producer panicked"))??;
            total.records += s.records;
            total.bytes += s.bytes;
            total.refused += s.refused;
        }
        total.elapsed = self.start.elapsed();
        Ok(total)
    }
}

/// Posts batches to `topic` until `until` (bounded in time; each request
/// has the client's timeout).
fn produce(
    api: SocketAddr,
    topic: &str,
    until: Instant,
    stop: &AtomicBool,
    seq: &AtomicU64,
) -> anyhow::Result<LoadStats> {
    let client = LocalClient::new(api);
    let topic = TopicName::new(topic)?;
    let mut stats = LoadStats::default();
    let mut body = Vec::with_capacity(BATCH_RECORDS * 300);
    while Instant::now() < until && !stop.load(Ordering::Relaxed) {
        body.clear();
        let first = seq.fetch_add(BATCH_RECORDS as u64, Ordering::Relaxed);
        for i in first..first + BATCH_RECORDS as u64 {
            // About 200 bytes of value, like one row of a power meter.
            let value = format!(
                "{{\"ts\":\"2026-11-29T22:{:02}:{:02}.{:06}Z\",\"active_kw\":{:.3},\"reactive_kw\":{:.3},\"voltage\":{:.2},\"current_a\":{:.1},\"sub1\":{},\"sub2\":{},\"sub3\":{},\"site\":\"north-hall\"}}",
                (i / 60) % 60,
                i % 60,
                i % 1_000_000,
                (i % 5000) as f64 / 1000.0,
                (i % 300) as f64 / 1000.0,
                230.0 + (i % 1000) as f64 / 100.0,
                (i % 200) as f64 / 10.0,
                i % 40,
                i % 3,
                i % 18
            );
            let line = serde_json::json!({ "key": format!("meter-{}", i % 16), "value": value });
            serde_json::to_writer(&mut body, &line)?;
            body.push(b'\n');
        }
        match client.publish_ndjson(&topic, &body) {
            Ok(ack) => {
                stats.records += ack.count;
                stats.bytes += body.len() as u64;
            }
            Err(ClientError::Api { status: 507, .. }) => {
                stats.refused += BATCH_RECORDS as u64;
                // The audit budget is full (refuse): keep the pressure on
                // the other topics only.
                return Ok(stats);
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(stats)
}
