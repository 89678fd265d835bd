//! Fan-in: many edges into one broker, measured by `edge-swarm`
//! (`tributary_tests::swarm`) against the release broker, one fresh broker
//! per case.
//!
//! ```text
//! cargo bench -p tributary-tests --bench fan_in [-- CASE...]
//! ```
//! CASEs (default: all): `scale` (10, 100 and 1,000 edges, one topic each,
//! 200-byte records as a backlog, `task_queue` and `event_stream`),
//! `latency` (1,000 edges producing 220 records/s each, `task_queue`, their
//! batch times spread over the batch interval), `lockstep` (the same at
//! 200 records/s each with every edge's batches at the same instants),
//! `idle` (5,000 idle connections: broker RSS per connection), `raw` (raw
//! quinn, no Tributary code: the scale case's bytes over the same
//! connection counts, a task per connection on the server) and `raw-loop`
//! (the same into a server that drives quinn-proto from one loop). About
//! five minutes in all on two cores. `--edges=10,1000` and
//! `--intents=event_stream` narrow `scale` (and the raw cases) to those
//! rows; `--records=N` changes the backlog (default [`SCALE_RECORDS`]).
//!
//! # What is measured
//! - **scale**: per case a warm-up swarm sends one record per topic (the
//!   topic's first contact: created through Raft, owner assigned, first
//!   batch acknowledged; its time is the "first contact" column), then the
//!   measured swarm connects again and sends a backlog of
//!   [`SCALE_RECORDS`] records split evenly over the edges, in batches of
//!   100, released once every topic has its `Welcome`. Throughput =
//!   records acknowledged / time from that release to the last
//!   acknowledgement (connection set-up is the separate set-up column). The
//!   swarm runs in this process, on the same two cores as the broker; its
//!   own CPU seconds and the edges' QUIC counters are printed per case.
//! - **latency**: 1,000 edges each produce [`LATENCY_RATE`] records/s for
//!   [`LATENCY_SECONDS`] (batches of 100 every 0.45 s; edge `k` starts
//!   `k/1000` of an interval late, as independent devices are not in step):
//!   the offered load is 220,000 records/s; acknowledgement latency is per
//!   batch, from the hand-off to QUIC to the first acknowledgement
//!   (datagram or frame). **lockstep**: 200 records/s each, every edge's
//!   batch at the same instants (a burst of 1,000 batches every 0.5 s).
//! - **idle**: 5,000 edges connect, open their stream (one record each),
//!   then stay idle for [`IDLE_HOLD`] with the edge agent's keep-alive
//!   (1 s); RSS per connection = (broker RSS at the end of the hold − RSS
//!   before the swarm) / 5,000.
//!
//! The broker's CPU seconds (from `/proc`) cover the release of the
//! production to the last acknowledgement.

#[path = "common/mod.rs"]
mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::{build_release_binaries, scratch_dir};
use tributary_proto::intent::StreamIntent;
use tributary_tests::solo::SoloBroker;
use tributary_tests::swarm::{self, Report, SwarmConfig};

/// Records of the measured backlog in each scale case (200 MB of values).
const SCALE_RECORDS: u64 = 1_000_000;
/// Seconds of production in the latency case.
const LATENCY_SECONDS: u64 = 10;
/// How long the idle connections stay idle.
const IDLE_HOLD: Duration = Duration::from_secs(10);

fn release_broker() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/release/broker")
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

fn run(config: &SwarmConfig) -> Report {
    let report = runtime().block_on(swarm::run(config)).expect("swarm");
    assert!(
        report.mismatches().is_empty(),
        "not exact:\n{}",
        report.render()
    );
    report
}

struct ScaleRow {
    intent: StreamIntent,
    edges: usize,
    first_contact: Report,
    backlog: Report,
}

fn scale(intent: StreamIntent, edges: usize, records: u64) -> ScaleRow {
    let dir = scratch_dir("fan-in");
    let mut broker = SoloBroker::new(dir.path(), &release_broker(), "", None);
    broker.start();
    let mut config = SwarmConfig::new(broker.ingest, broker.certs.clone(), edges);
    config.intent = Some(intent);
    config.broker_pid = broker.broker.pid();
    config.duration = Duration::from_secs(120);
    config.production.records = 1;
    let first_contact = run(&config);
    config.production.records = 1 + records / edges as u64;
    let backlog = run(&config);
    assert_eq!(broker.broker.terminate(), Some(0));
    ScaleRow {
        intent,
        edges,
        first_contact,
        backlog,
    }
}

fn ms(d: Option<Duration>) -> String {
    d.map_or_else(|| "-".into(), |d| format!("{:.1}", d.as_secs_f64() * 1e3))
}

fn print_scale(rows: &[ScaleRow]) {
    println!();
    println!(
        "| intent | edges | first contact, all topics (s) | records/s | MB/s | ack p50 / p99 / p99.9 (ms) | set-up p50 / max (ms) | broker CPU s/GB | broker peak RSS (MiB) | vs 10 edges |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for row in rows {
        let base = rows
            .iter()
            .find(|r| r.intent == row.intent && r.edges == 10)
            .map(|r| r.backlog.records_per_second());
        let b = &row.backlog;
        println!(
            "| {} | {} | {:.2} | {:.0} | {:.1} | {} / {} / {} | {} / {} | {:.2} | {:.0} | {} |",
            row.intent.as_str(),
            row.edges,
            row.first_contact
                .first_contact
                .unwrap_or_default()
                .as_secs_f64(),
            b.records_per_second(),
            b.megabytes_per_second(),
            ms(b.ack_latency[0]),
            ms(b.ack_latency[1]),
            ms(b.ack_latency[2]),
            ms(b.setup[0]),
            ms(b.setup[2]),
            b.broker_cpu_per_gb().unwrap_or(f64::NAN),
            b.broker_peak_rss.unwrap_or(0) as f64 / 1048576.0,
            base.map_or_else(
                || "-".into(),
                |base| format!("{:.2}", b.records_per_second() / base)
            ),
        );
    }
}

/// Records per second of each edge in the latency case: 220, so 1,000
/// edges offer 220,000 records/s, a tenth above the 200,000 the broker
/// must sustain.
const LATENCY_RATE: u64 = 220;

/// The latency case: 1,000 edges producing [`LATENCY_RATE`] records/s
/// each, `task_queue`; `lockstep` makes every edge produce its batches at
/// the same instants (a burst of 1,000 batches every 0.5 s) instead of at
/// phases spread over the interval.
fn latency(rate: u64, lockstep: bool) -> Report {
    let dir = scratch_dir("fan-in-latency");
    let mut broker = SoloBroker::new(dir.path(), &release_broker(), "", None);
    broker.start();
    let mut config = SwarmConfig::new(broker.ingest, broker.certs.clone(), 1000);
    config.intent = Some(StreamIntent::TaskQueue);
    config.broker_pid = broker.broker.pid();
    config.duration = Duration::from_secs(120);
    config.production.records = 1;
    run(&config);
    config.production.records = 1 + rate * LATENCY_SECONDS;
    config.production.rate = Some(rate as f64);
    config.lockstep = lockstep;
    let report = run(&config);
    assert_eq!(broker.broker.terminate(), Some(0));
    report
}

fn idle() -> Report {
    let dir = scratch_dir("fan-in-idle");
    let mut broker = SoloBroker::new(dir.path(), &release_broker(), "", None);
    broker.start();
    std::thread::sleep(Duration::from_secs(1));
    let mut config = SwarmConfig::new(broker.ingest, broker.certs.clone(), 5000);
    config.intent = Some(StreamIntent::EventStream);
    config.broker_pid = broker.broker.pid();
    config.duration = Duration::from_secs(180);
    config.production.records = 1;
    config.hold = Some(IDLE_HOLD);
    let report = run(&config);
    assert_eq!(broker.broker.terminate(), Some(0));
    report
}

/// Raw quinn with the scale case's shape (`common::raw_fan_in`): the same
/// bytes (`records` × 200) over 10 … 1,000 connections, no Tributary code.
fn print_raw(edge_counts: &[usize], records: u64, kind: common::raw_fan_in::ServerKind) {
    let dir = scratch_dir("raw-fan-in");
    let (server, client) = common::quic_configs(&dir.path().join("certs"), None);
    println!();
    println!(
        "raw fan-in, {kind:?} server, {} MB in 20 kB writes",
        records * 200 / 1_000_000
    );
    println!("| connections | MB/s | CPU s/GB (clients + server) | server CPU s/GB | vs 10 |");
    println!("|---|---|---|---|---|");
    let mut base = None;
    for &edges in edge_counts {
        let r = runtime().block_on(common::raw_fan_in::run(
            kind,
            server.clone(),
            client.clone(),
            edges,
            records * 200,
        ));
        let base = *base.get_or_insert(r.rate());
        let gb = r.bytes as f64 / 1e9;
        println!(
            "| {edges} | {:.1} | {:.2} | {:.2} | {:.2} |",
            r.rate() / 1e6,
            r.cpu_seconds / gb,
            r.server_cpu_seconds / gb,
            r.rate() / base
        );
    }
}

fn main() {
    let cases: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let wants = |case: &str| cases.is_empty() || cases.iter().any(|c| c == case);
    // `--edges=10,1000` and `--intents=event_stream` narrow `scale` (for
    // experiments; the table needs all of them).
    let option = |name: &str| {
        std::env::args().find_map(|a| a.strip_prefix(&format!("--{name}=")).map(str::to_owned))
    };
    let edge_counts: Vec<usize> = option("edges").map_or_else(
        || vec![10, 100, 1000],
        |list| list.split(',').filter_map(|n| n.parse().ok()).collect(),
    );
    let intents: Vec<StreamIntent> = option("intents").map_or_else(
        || vec![StreamIntent::TaskQueue, StreamIntent::EventStream],
        |list| {
            list.split(',')
                .filter_map(|i| StreamIntent::parse(i).ok())
                .collect()
        },
    );
    let records: u64 = option("records")
        .and_then(|n| n.parse().ok())
        .unwrap_or(SCALE_RECORDS);
    build_release_binaries();
    if wants("scale") {
        let mut rows = Vec::new();
        for &intent in &intents {
            for &edges in &edge_counts {
                let row = scale(intent, edges, records);
                eprint!("{} x {edges}: {}", intent.as_str(), row.backlog.render());
                rows.push(row);
            }
        }
        print_scale(&rows);
    }
    if wants("raw") {
        print_raw(&edge_counts, records, common::raw_fan_in::ServerKind::Quinn);
    }
    if wants("raw-loop") {
        print_raw(&edge_counts, records, common::raw_fan_in::ServerKind::Loop);
    }
    if wants("latency") {
        let report = latency(LATENCY_RATE, false);
        println!();
        println!(
            "latency: 1000 edges x {LATENCY_RATE} records/s (task_queue, fsync_batch), {LATENCY_SECONDS} s, phases spread"
        );
        print!("{}", report.render());
    }
    if wants("lockstep") {
        let report = latency(200, true);
        println!();
        println!(
            "latency: 1000 edges x 200 records/s (task_queue, fsync_batch), {LATENCY_SECONDS} s, in lockstep"
        );
        print!("{}", report.render());
    }
    if wants("idle") {
        let report = idle();
        println!();
        println!("idle: 5000 connections held {} s", IDLE_HOLD.as_secs());
        print!("{}", report.render());
    }
}
