//! `edge-swarm`: many simulated edges in one process against a real broker.
//!
//! Each edge has its own QUIC connection and its own client certificate
//! (issued from the development CA in [`SwarmConfig::certs`] for edge id
//! `{prefix}{index:05}`, which is also its namespace), and replicates its
//! topics `/{edge}/t{j}` with the edge agent's protocol state machine
//! (`tributary_proto::replication::edge::EdgeStream`), not N copies of the
//! `edge-agent` binary. Records are made up from their offsets
//! ([`log::value_for`]), so after a reconnect any range is sent again byte
//! for byte and a test can check what the broker stored.
//!
//! At the end every topic's acknowledged offset must equal what it
//! produced, and the broker's high-water mark (the `Welcome` to a fresh
//! `Hello`) must equal that too; [`Report`] says which topics differ and
//! prints records/s, MB/s, acknowledgement latency quantiles, connection
//! set-up time, and, given the broker's pid, its CPU seconds per GB and
//! RSS from `/proc`. Bounded: nothing is attempted after
//! [`SwarmConfig::duration`]; loopback only (the broker address is the
//! caller's).

pub mod edge;
pub mod log;
pub mod measure;

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use broker_core::dev_certs::{edge_paths, issue};
use broker_core::tls::{ALPN_REPLICATION, TlsIdentity, transport_config_with};
use tokio::sync::watch;
use tributary_proto::intent::StreamIntent;
use tributary_proto::limits::Limits;
use tributary_proto::replication::edge::Window;

use edge::{EdgeContext, SimEdge};
use log::{Production, TopicLog};
use measure::{Latencies, ProcSample, TransportTotals};

/// Keep-alive and idle timeout of every simulated edge: the edge agent's
/// defaults (`[replication] keep_alive_ms`, `idle_timeout_ms`).
const KEEP_ALIVE: Duration = Duration::from_secs(1);
const IDLE_TIMEOUT: Duration = Duration::from_secs(5);

/// What a swarm does.
#[derive(Debug, Clone)]
pub struct SwarmConfig {
    /// The broker's ingest (QUIC) address.
    pub broker: SocketAddr,
    /// Directory of the development certificates (`ca.pem`; the CA key in
    /// `{certs}-ca/ca.key`, as `tribctl certs` writes them); missing edge
    /// certificates are issued into it.
    pub certs: PathBuf,
    /// Number of edges.
    pub edges: usize,
    /// Edge ids are `{prefix}{index:05}`.
    pub prefix: String,
    /// Topics per edge.
    pub topics_per_edge: usize,
    /// Intent of every topic (`None`: the broker's implicit settings).
    pub intent: Option<StreamIntent>,
    /// How each topic produces records.
    pub production: Production,
    /// In-flight window of each stream.
    pub window: Window,
    /// With a production rate: whether the topics produce in lockstep
    /// (every topic's batches at the same instants, a burst of one batch
    /// per topic every batch interval) instead of with their phases spread
    /// evenly over one batch interval (topic `k` of `n` starts `k/n` of an
    /// interval late), as independent devices do.
    pub lockstep: bool,
    /// Upper bound on the whole run.
    pub duration: Duration,
    /// Client UDP sockets the edges are spread over (at least 1).
    pub endpoints: usize,
    /// The broker's pid, for its CPU time and RSS.
    pub broker_pid: Option<u32>,
    /// With `Some`, every edge keeps its connection and streams open, idle,
    /// this long after all topics were acknowledged, and the broker's RSS
    /// is read at its end ([`Report::broker_rss_held`]).
    pub hold: Option<Duration>,
}

impl SwarmConfig {
    /// A swarm of `edges` edges with one topic each against `broker`.
    pub fn new(broker: SocketAddr, certs: PathBuf, edges: usize) -> SwarmConfig {
        SwarmConfig {
            broker,
            certs,
            edges,
            prefix: "swarm".into(),
            topics_per_edge: 1,
            intent: Some(StreamIntent::TaskQueue),
            production: Production {
                records: 1000,
                rate: None,
                batch_records: 100,
                record_bytes: 200,
            },
            window: Window::default(),
            lockstep: false,
            duration: Duration::from_secs(60),
            endpoints: edges.clamp(1, 64),
            broker_pid: None,
            hold: None,
        }
    }

    /// The id of edge `index`.
    pub fn edge_id(&self, index: usize) -> String {
        format!("{}{index:05}", self.prefix)
    }

    /// How long after the start of production topic `index` of `topics`
    /// begins producing: `index/topics` of a batch interval
    /// (`batch_records / rate`), zero in [`SwarmConfig::lockstep`] or
    /// without a rate.
    pub fn phase(&self, index: usize, topics: usize) -> Duration {
        match self.production.rate {
            Some(rate) if rate > 0.0 && !self.lockstep && topics > 0 => {
                let interval = self.production.batch_records.max(1) as f64 / rate;
                Duration::from_secs_f64(interval * index as f64 / topics as f64)
            }
            _ => Duration::ZERO,
        }
    }

    /// Every topic name of the swarm, edge by edge.
    pub fn topic_names(&self) -> Vec<String> {
        (0..self.edges)
            .flat_map(|i| {
                let edge = self.edge_id(i);
                (0..self.topics_per_edge).map(move |j| format!("/{edge}/t{j}"))
            })
            .collect()
    }
}

/// Why a swarm could not run.
#[derive(Debug, thiserror::Error)]
pub enum SwarmError {
    /// Issuing or loading an edge certificate.
    #[error("edge certificate of {edge}: {message}")]
    Certificate {
        /// The edge id.
        edge: String,
        /// What failed.
        message: String,
    },
    /// Binding a client UDP socket.
    #[error("client endpoint: {0}")]
    Endpoint(std::io::Error),
}

/// What one topic ended with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicOutcome {
    /// `/{edge}/{topic}`.
    pub name: String,
    /// Records it produced.
    pub produced: u64,
    /// Everything below it was acknowledged.
    pub acked: u64,
    /// The broker's high-water mark at the end (`None`: not read).
    pub broker_hwm: Option<u64>,
    /// The last error of a stream that ended early.
    pub last_error: Option<String>,
}

impl TopicOutcome {
    /// Whether every record was acknowledged and the broker holds exactly
    /// that many.
    pub fn is_exact(&self) -> bool {
        self.acked == self.produced && self.broker_hwm == Some(self.produced)
    }
}

/// What a swarm measured.
#[derive(Debug, Clone)]
pub struct Report {
    /// Edges simulated.
    pub edges: usize,
    /// Every topic's outcome.
    pub topics: Vec<TopicOutcome>,
    /// Bytes of each record value.
    pub record_bytes: usize,
    /// From the start of production (once every topic was welcomed) until
    /// the last acknowledgement of any topic.
    pub elapsed: Duration,
    /// From the swarm's start until every topic had its `Welcome`
    /// (connections set up, topics created or opened).
    pub all_welcomed: Duration,
    /// Acknowledgement latency quantiles (p50, p99, p99.9), one sample per
    /// batch acknowledged on the stream that sent it.
    pub ack_latency: [Option<Duration>; 3],
    /// Latency samples.
    pub ack_samples: usize,
    /// Handshake time of each edge's first connection: p50, p99, max.
    pub setup: [Option<Duration>; 3],
    /// Until every topic had its first acknowledgement (connection, topic
    /// creation through Raft, first batch), from the swarm's start.
    pub first_contact: Option<Duration>,
    /// Connections established (more than `edges`: reconnects).
    pub connects: u64,
    /// Connection attempts that failed.
    pub connect_failures: u64,
    /// Streams that ended before their topic was done.
    pub stream_failures: u64,
    /// The broker's CPU seconds from the start of production until the last
    /// acknowledgement.
    pub broker_cpu_seconds: Option<f64>,
    /// The broker's RSS before the swarm connected, bytes.
    pub broker_rss_start: Option<u64>,
    /// The broker's RSS when the last topic was done, bytes.
    pub broker_rss_end: Option<u64>,
    /// The broker's peak RSS (`VmHWM`) when the last topic was done, bytes.
    pub broker_peak_rss: Option<u64>,
    /// The broker's RSS at the end of the hold (every connection idle),
    /// bytes.
    pub broker_rss_held: Option<u64>,
    /// The swarm's own CPU seconds (this process) over the same interval
    /// as [`Report::broker_cpu_seconds`]: the load generator shares the
    /// machine's cores with the broker.
    pub swarm_cpu_seconds: Option<f64>,
    /// QUIC counters of the edges' connections that carried production.
    pub transport: TransportTotals,
    /// `Ack` frames the edges received (fewer than batches when one
    /// acknowledges several).
    pub ack_frames: u64,
}

impl Report {
    /// Records acknowledged across the swarm.
    pub fn records_acked(&self) -> u64 {
        self.topics.iter().map(|t| t.acked).sum()
    }

    /// Topics whose counts are not exact ([`TopicOutcome::is_exact`]).
    pub fn mismatches(&self) -> Vec<&TopicOutcome> {
        self.topics.iter().filter(|t| !t.is_exact()).collect()
    }

    /// Records acknowledged per second of production (0 when nothing was
    /// left to send: every topic was complete at its `Welcome`).
    pub fn records_per_second(&self) -> f64 {
        if self.elapsed.is_zero() {
            return 0.0;
        }
        self.records_acked() as f64 / self.elapsed.as_secs_f64()
    }

    /// Record value megabytes (10^6 bytes) acknowledged per second.
    pub fn megabytes_per_second(&self) -> f64 {
        self.records_per_second() * self.record_bytes as f64 / 1e6
    }

    /// The broker's CPU seconds per GB (10^9 bytes) of record values
    /// (`None` without a pid or without records).
    pub fn broker_cpu_per_gb(&self) -> Option<f64> {
        let gb = self.records_acked() as f64 * self.record_bytes as f64 / 1e9;
        self.broker_cpu_seconds
            .filter(|_| gb > 0.0)
            .map(|cpu| cpu / gb)
    }

    /// Broker RSS per idle edge connection (held minus start), bytes.
    pub fn rss_per_connection(&self) -> Option<f64> {
        let held = self.broker_rss_held?;
        let start = self.broker_rss_start?;
        Some(held.saturating_sub(start) as f64 / self.edges.max(1) as f64)
    }

    /// A human-readable summary, one figure per line.
    pub fn render(&self) -> String {
        let ms = |d: Option<Duration>| {
            d.map_or_else(
                || "-".into(),
                |d| format!("{:.1} ms", d.as_secs_f64() * 1e3),
            )
        };
        let mib = |b: Option<u64>| {
            b.map_or_else(
                || "-".into(),
                |b| format!("{:.1} MiB", b as f64 / 1048576.0),
            )
        };
        let mut out = String::new();
        let topics = self.topics.len();
        let exact = topics - self.mismatches().len();
        out += &format!(
            "edges {}  topics {topics} (exact {exact})  records acked {}  in {:.2} s\n",
            self.edges,
            self.records_acked(),
            self.elapsed.as_secs_f64()
        );
        out += &format!(
            "throughput {:.0} records/s  {:.1} MB/s\n",
            self.records_per_second(),
            self.megabytes_per_second()
        );
        out += &format!(
            "ack latency p50 {}  p99 {}  p99.9 {}  ({} batches)\n",
            ms(self.ack_latency[0]),
            ms(self.ack_latency[1]),
            ms(self.ack_latency[2]),
            self.ack_samples
        );
        out += &format!(
            "connection set-up p50 {}  p99 {}  max {}  all topics welcomed {}  first contact (all topics acked once) {}\n",
            ms(self.setup[0]),
            ms(self.setup[1]),
            ms(self.setup[2]),
            ms(Some(self.all_welcomed)),
            ms(self.first_contact)
        );
        out += &format!(
            "connects {}  failed connects {}  failed streams {}\n",
            self.connects, self.connect_failures, self.stream_failures
        );
        out += &format!(
            "broker CPU {}  ({} per GB)  RSS start {}  end {}  peak {}  held {}{}\n",
            self.broker_cpu_seconds
                .map_or_else(|| "-".into(), |c| format!("{c:.2} s")),
            self.broker_cpu_per_gb()
                .map_or_else(|| "-".into(), |c| format!("{c:.2} s")),
            mib(self.broker_rss_start),
            mib(self.broker_rss_end),
            mib(self.broker_peak_rss),
            mib(self.broker_rss_held),
            self.rss_per_connection()
                .map_or_else(String::new, |b| format!(
                    "  ({:.1} KiB per connection)",
                    b / 1024.0
                )),
        );
        if let Some(cpu) = self.swarm_cpu_seconds {
            out += &format!("swarm (this process) CPU {cpu:.2} s\n");
        }
        let t = &self.transport;
        if t.datagrams_sent > 0 {
            let batches = self.ack_samples.max(1) as f64;
            out += &format!(
                "edges sent {} datagrams in {} sendmsg ({:.1} per batch), received {} datagrams, {} QUIC ACK frames ({:.2} per batch), {} credit updates, {} Ack frames; {} congestion events, {} lost packets\n",
                t.datagrams_sent,
                t.send_calls,
                t.datagrams_sent as f64 / batches,
                t.datagrams_received,
                t.acks_received,
                t.acks_received as f64 / batches,
                t.credit_updates_received,
                self.ack_frames,
                t.congestion_events,
                t.lost_packets,
            );
        }
        for t in self.mismatches().iter().take(10) {
            out += &format!(
                "NOT EXACT {}: produced {} acked {} broker hwm {:?} last error {:?}\n",
                t.name, t.produced, t.acked, t.broker_hwm, t.last_error
            );
        }
        out
    }
}

/// Loads (issuing what is missing) the client config of every edge.
fn client_configs(config: &SwarmConfig) -> Result<Vec<quinn::ClientConfig>, SwarmError> {
    let ids: Vec<String> = (0..config.edges).map(|i| config.edge_id(i)).collect();
    let missing: Vec<String> = ids
        .iter()
        .filter(|id| !edge_paths(&config.certs, id).key.exists())
        .cloned()
        .collect();
    if !missing.is_empty() {
        issue(&config.certs, &[], &missing)
            .map(drop)
            .map_err(|e| SwarmError::Certificate {
                edge: missing[0].clone(),
                message: e.to_string(),
            })?;
    }
    ids.iter()
        .map(|id| {
            let cert_err = |message: String| SwarmError::Certificate {
                edge: id.clone(),
                message,
            };
            let identity = TlsIdentity::load(&edge_paths(&config.certs, id))
                .map_err(|e| cert_err(e.to_string()))?;
            identity
                .quic_client_with_transport(
                    ALPN_REPLICATION,
                    transport_config_with(KEEP_ALIVE, IDLE_TIMEOUT),
                )
                .map_err(|e| cert_err(e.to_string()))
        })
        .collect()
}

/// Runs the swarm on the current tokio runtime until every topic is done
/// (and the hold is over) or [`SwarmConfig::duration`] passes.
///
/// # Errors
/// [`SwarmError`] if certificates or sockets cannot be set up; what
/// happened to the records is in the [`Report`].
pub async fn run(config: &SwarmConfig) -> Result<Report, SwarmError> {
    let clients = client_configs(config)?;
    let endpoints = (0..config.endpoints.max(1))
        .map(|_| {
            broker_core::tls::client_endpoint(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
                .map_err(SwarmError::Endpoint)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let settings = config.intent.map(StreamIntent::expand);
    let (release, hold) = watch::channel(false);
    let (go_tx, go) = watch::channel(None);
    let started = Instant::now();
    let topics_done = Arc::new(AtomicUsize::new(0));
    let topics_welcomed = Arc::new(AtomicUsize::new(0));
    let ctx = Arc::new(EdgeContext {
        broker: config.broker,
        settings,
        window: config.window,
        limits: Limits::default(),
        deadline: started + config.duration,
        hold: config.hold.map(|_| hold),
        topics_done: topics_done.clone(),
        topics_welcomed: topics_welcomed.clone(),
        go,
    });
    let sample = || config.broker_pid.and_then(ProcSample::read);
    let own = || ProcSample::read(std::process::id());
    let at_start = sample();
    let mut tasks = Vec::with_capacity(config.edges);
    let total_topics = config.edges * config.topics_per_edge;
    for (i, client) in clients.into_iter().enumerate() {
        let id = config.edge_id(i);
        let topics = (0..config.topics_per_edge)
            .map(|j| {
                let phase = config.phase(i * config.topics_per_edge + j, total_topics);
                TopicLog::new(format!("/{id}/t{j}"), config.production).with_phase(phase)
            })
            .collect();
        let mut edge = SimEdge::new(id, client, topics);
        let endpoint = endpoints[i % endpoints.len()].clone();
        let ctx = ctx.clone();
        tasks.push(tokio::spawn(async move {
            edge.run(endpoint, &ctx).await;
            edge
        }));
    }
    while topics_welcomed.load(Ordering::Relaxed) < total_topics && Instant::now() < ctx.deadline {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let all_welcomed = started.elapsed();
    let at_go = sample();
    let own_at_go = own();
    let go_at = Instant::now();
    let _ = go_tx.send(Some(go_at));
    while topics_done.load(Ordering::Relaxed) < total_topics && Instant::now() < ctx.deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let at_end = sample();
    let own_at_end = own();
    let mut held = None;
    if let Some(hold) = config.hold {
        let until = (Instant::now() + hold).min(ctx.deadline);
        tokio::time::sleep_until(until.into()).await;
        held = sample();
        let _ = release.send(true);
    }
    let mut edges = Vec::with_capacity(tasks.len());
    for task in tasks {
        if let Ok(edge) = task.await {
            edges.push(edge);
        }
    }
    for endpoint in &endpoints {
        endpoint.wait_idle().await;
    }
    let samples = Samples {
        start: at_start,
        go: at_go,
        end: at_end,
        held,
        swarm_cpu_seconds: own_at_go
            .zip(own_at_end)
            .map(|(a, b)| b.cpu_seconds - a.cpu_seconds),
    };
    Ok(report(
        config,
        started,
        go_at,
        all_welcomed,
        &edges,
        samples,
    ))
}

/// The broker's `/proc` readings: before the swarm, at the start of
/// production, when the last topic was done, at the end of the hold.
struct Samples {
    start: Option<ProcSample>,
    go: Option<ProcSample>,
    end: Option<ProcSample>,
    held: Option<ProcSample>,
    /// This process's CPU seconds between `go` and `end`.
    swarm_cpu_seconds: Option<f64>,
}

fn report(
    config: &SwarmConfig,
    started: Instant,
    go_at: Instant,
    all_welcomed: Duration,
    edges: &[SimEdge],
    samples: Samples,
) -> Report {
    let mut latencies = Latencies::default();
    let mut setups = Latencies::default();
    let mut topics = Vec::new();
    let mut last_ack = go_at;
    let mut first_contact = Some(Duration::ZERO);
    let (mut connects, mut connect_failures, mut stream_failures) = (0, 0, 0);
    let mut transport = TransportTotals::default();
    let mut ack_frames = 0;
    for edge in edges {
        transport.merge(&edge.transport);
        if let Some(setup) = edge.setup {
            setups.push(setup);
        }
        connects += edge.connects;
        connect_failures += edge.connect_failures;
        for (topic, hwm) in edge.topics.iter().zip(&edge.broker_hwm) {
            latencies.extend(&topic.latencies);
            stream_failures += topic.stream_failures;
            ack_frames += topic.ack_frames;
            last_ack = last_ack.max(topic.last_ack.unwrap_or(go_at));
            first_contact = match (first_contact, topic.first_ack) {
                (Some(max), Some(first)) => Some(max.max(first.saturating_duration_since(started))),
                _ => None,
            };
            topics.push(TopicOutcome {
                name: topic.name.clone(),
                produced: topic.total(),
                acked: topic.acked,
                broker_hwm: *hwm,
                last_error: topic.last_error.clone().or_else(|| edge.last_error.clone()),
            });
        }
    }
    let ack_samples = latencies.len();
    Report {
        edges: config.edges,
        record_bytes: config.production.record_bytes,
        elapsed: last_ack.saturating_duration_since(go_at),
        all_welcomed,
        ack_latency: [
            latencies.quantile(0.5),
            latencies.quantile(0.99),
            latencies.quantile(0.999),
        ],
        ack_samples,
        setup: [
            setups.quantile(0.5),
            setups.quantile(0.99),
            setups.quantile(1.0),
        ],
        first_contact: first_contact.filter(|_| !topics.is_empty()),
        topics,
        connects,
        connect_failures,
        stream_failures,
        broker_cpu_seconds: samples
            .go
            .zip(samples.end)
            .map(|(a, b)| b.cpu_seconds - a.cpu_seconds),
        broker_rss_start: samples.start.map(|s| s.rss_bytes),
        broker_rss_end: samples.end.map(|s| s.rss_bytes),
        broker_peak_rss: samples.end.map(|s| s.peak_rss_bytes),
        broker_rss_held: samples.held.map(|s| s.rss_bytes),
        swarm_cpu_seconds: samples.swarm_cpu_seconds,
        transport,
        ack_frames,
    }
}

/// The report's figures as one JSON object (durations in milliseconds,
/// sizes in bytes), for scripts and benchmarks.
pub fn report_json(report: &Report) -> serde_json::Value {
    let ms = |d: Option<Duration>| d.map(|d| d.as_secs_f64() * 1e3);
    serde_json::json!({
        "edges": report.edges,
        "topics": report.topics.len(),
        "topics_not_exact": report.mismatches().len(),
        "records_acked": report.records_acked(),
        "elapsed_ms": report.elapsed.as_secs_f64() * 1e3,
        "all_welcomed_ms": report.all_welcomed.as_secs_f64() * 1e3,
        "records_per_s": report.records_per_second(),
        "mb_per_s": report.megabytes_per_second(),
        "ack_p50_ms": ms(report.ack_latency[0]),
        "ack_p99_ms": ms(report.ack_latency[1]),
        "ack_p999_ms": ms(report.ack_latency[2]),
        "setup_p50_ms": ms(report.setup[0]),
        "setup_p99_ms": ms(report.setup[1]),
        "setup_max_ms": ms(report.setup[2]),
        "first_contact_ms": ms(report.first_contact),
        "connects": report.connects,
        "connect_failures": report.connect_failures,
        "stream_failures": report.stream_failures,
        "broker_cpu_s": report.broker_cpu_seconds,
        "broker_cpu_s_per_gb": report.broker_cpu_per_gb(),
        "broker_rss_start": report.broker_rss_start,
        "broker_rss_end": report.broker_rss_end,
        "broker_peak_rss": report.broker_peak_rss,
        "broker_rss_held": report.broker_rss_held,
        "broker_rss_per_connection": report.rss_per_connection(),
        "swarm_cpu_s": report.swarm_cpu_seconds,
        "datagrams_sent": report.transport.datagrams_sent,
        "send_calls": report.transport.send_calls,
        "datagrams_received": report.transport.datagrams_received,
        "acks_received": report.transport.acks_received,
        "credit_updates_received": report.transport.credit_updates_received,
        "congestion_events": report.transport.congestion_events,
        "lost_packets": report.transport.lost_packets,
        "ack_frames": report.ack_frames,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_spread_the_topics_over_one_batch_interval_unless_in_lockstep() {
        let mut config = SwarmConfig::new(
            SocketAddr::from((Ipv4Addr::LOCALHOST, 1)),
            PathBuf::from("certs"),
            4,
        );
        // A backlog has no interval.
        assert_eq!(config.phase(3, 4), Duration::ZERO);
        config.production.rate = Some(200.0);
        config.production.batch_records = 100;
        let phases: Vec<u128> = (0..4).map(|k| config.phase(k, 4).as_millis()).collect();
        assert_eq!(phases, [0, 125, 250, 375], "a batch every 500 ms");
        config.lockstep = true;
        assert_eq!(config.phase(3, 4), Duration::ZERO);
    }
}
