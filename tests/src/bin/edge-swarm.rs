//! `edge-swarm`: simulates many edges in one process against a running
//! broker (module `tributary_tests::swarm`), then checks every topic's
//! acknowledged offset and the broker's high-water mark and prints what it
//! measured. Exits 1 when a topic is not exact.
//!
//! ```text
//! edge-swarm --broker 127.0.0.1:7400 --certs ./certs --edges 100 \
//!     --intent task_queue --records 10000 --record-bytes 200 [--rate 500 [--lockstep]] \
//!     [--broker-pid PID] [--json]
//! ```

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use tributary_proto::intent::StreamIntent;
use tributary_tests::swarm::{self, SwarmConfig};

/// Simulate many edges replicating to one broker.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// The broker's ingest (QUIC) address.
    #[arg(long)]
    broker: SocketAddr,
    /// Directory of the development certificates (`tribctl certs --out`:
    /// ca.pem here, the CA key in {certs}-ca/ca.key); missing edge
    /// certificates are issued into it.
    #[arg(long)]
    certs: PathBuf,
    /// Number of edges.
    #[arg(long, default_value_t = 10)]
    edges: usize,
    /// Edge ids are PREFIX00000, PREFIX00001, ...
    #[arg(long, default_value = "swarm")]
    prefix: String,
    /// Topics per edge (/EDGE/t0, /EDGE/t1, ...).
    #[arg(long, default_value_t = 1)]
    topics_per_edge: usize,
    /// Intent of every topic; `implicit` sends none.
    #[arg(long, default_value = "task_queue")]
    intent: String,
    /// Records per topic.
    #[arg(long, default_value_t = 1000)]
    records: u64,
    /// Records per second per topic; 0: all at once (a backlog).
    #[arg(long, default_value_t = 0.0)]
    rate: f64,
    /// With --rate: every topic produces its batches at the same instants
    /// (default: phases spread evenly over one batch interval).
    #[arg(long)]
    lockstep: bool,
    /// Most records per batch.
    #[arg(long, default_value_t = 100)]
    batch_records: u64,
    /// Bytes of each record value (at least 16).
    #[arg(long, default_value_t = 200)]
    record_bytes: usize,
    /// Upper bound on the run, seconds.
    #[arg(long, default_value_t = 120)]
    duration_s: u64,
    /// Client UDP sockets the edges are spread over (default: edges, at
    /// most 64).
    #[arg(long)]
    endpoints: Option<usize>,
    /// The broker's pid, for its CPU seconds and RSS.
    #[arg(long)]
    broker_pid: Option<u32>,
    /// Keep every connection open and idle this many seconds once all is
    /// acknowledged, then read the broker's RSS.
    #[arg(long)]
    hold_s: Option<u64>,
    /// Print the report as one JSON object too.
    #[arg(long)]
    json: bool,
}

/// Refuses arguments the swarm cannot run with, naming the flag (a record
/// or batch over the broker's limits would be refused for good, and the
/// swarm would reconnect until `--duration-s`).
fn check(args: &Args) -> anyhow::Result<()> {
    let limits = tributary_proto::limits::Limits::default();
    // A record's framing (offset and timestamp deltas, key marker, header
    // count, value length) is at most this many bytes beyond its value.
    const RECORD_FRAMING: u64 = 32;
    let record = args.record_bytes as u64 + RECORD_FRAMING;
    let checks = [
        (args.edges == 0, "--edges must be at least 1"),
        (
            args.topics_per_edge == 0,
            "--topics-per-edge must be at least 1",
        ),
        (args.records == 0, "--records must be at least 1"),
        (
            args.batch_records == 0,
            "--batch-records must be at least 1",
        ),
        (args.endpoints == Some(0), "--endpoints must be at least 1"),
        (args.record_bytes < 16, "--record-bytes must be at least 16"),
        (
            !args.rate.is_finite() || args.rate < 0.0,
            "--rate must be a number of records per second, 0 for a backlog",
        ),
        (
            record > u64::from(limits.max_record_bytes),
            "--record-bytes is over what a broker accepts in one record (max_record_bytes, 1 MiB)",
        ),
        (
            args.batch_records.saturating_mul(record) + 48 > u64::from(limits.max_batch_bytes),
            "--batch-records x --record-bytes is over what a broker accepts in one batch \
             (max_batch_bytes, 8 MiB)",
        ),
    ];
    if let Some((_, message)) = checks.iter().find(|(bad, _)| *bad) {
        anyhow::bail!("{message}");
    }
    if !args.certs.join("ca.pem").is_file() {
        anyhow::bail!(
            "--certs {}: no ca.pem there; give the directory `tribctl certs --out` wrote",
            args.certs.display()
        );
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    check(&args)?;
    let intent = match args.intent.as_str() {
        "implicit" => None,
        name => Some(StreamIntent::parse(name).context("--intent")?),
    };
    let mut config = SwarmConfig::new(args.broker, args.certs, args.edges);
    config.prefix = args.prefix;
    config.topics_per_edge = args.topics_per_edge;
    config.intent = intent;
    config.production.records = args.records;
    config.production.rate = (args.rate > 0.0).then_some(args.rate);
    config.production.batch_records = args.batch_records.max(1);
    config.lockstep = args.lockstep;
    config.production.record_bytes = args.record_bytes;
    config.duration = Duration::from_secs(args.duration_s);
    if let Some(endpoints) = args.endpoints {
        config.endpoints = endpoints.max(1);
    }
    config.broker_pid = args.broker_pid;
    config.hold = args.hold_s.map(Duration::from_secs);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?;
    let report = runtime.block_on(swarm::run(&config))?;
    print!("{}", report.render());
    if args.json {
        println!("{}", swarm::report_json(&report));
    }
    let bad = report.mismatches().len();
    if bad > 0 {
        anyhow::bail!("{bad} of {} topics are not exact", report.topics.len());
    }
    Ok(())
}
