//! Replication goodput edge → broker over loopback QUIC, against a raw quinn
//! bulk stream with the same TLS setup, in the same run.
//!
//! ```text
//! cargo bench -p tributary-tests --bench replication_goodput [-- [--pinned] INTENT...]
//! ```
//! With `--pinned`, the edge agent runs on core 0 and the broker on core 1
//! (`taskset -a -p`, every thread), and the raw transfer's client and
//! server threads likewise: what the product does per byte is then not
//! mixed with how two processes share two cores.
//! The bench first runs `cargo build --release -p broker -p edge-agent` (a
//! no-op when fresh). `INTENT`s default to `event_stream` (central sync mode
//! `os_cache_flush`) and `task_queue` (`fsync_batch`). About 1 GB per
//! case; three to four minutes in all, mostly publishing the backlogs.
//!
//! # What is measured
//! - **Replication** (the product, real processes): the release `broker` and
//!   `edge-agent` binaries on 127.0.0.1 ([`Pair`]), one topic of the given
//!   intent. With the broker stopped, the edge takes a backlog of
//!   [`BATCHES`] published batches of [`RECORDS_PER_BATCH`] records, each
//!   value [`VALUE_BYTES`] random bytes (incompressible, so wire compression
//!   neither helps nor is skipped: the replicator still tries zstd on every
//!   batch, as it does in production). Then the broker starts; the bench
//!   polls the edge's API every [`POLL`] and takes the time from the first
//!   acknowledgement to the one covering the whole backlog. Goodput = record
//!   value bytes acknowledged in that interval / its length. It includes
//!   everything the product does per batch: WAL read at the edge, zstd
//!   attempt, framing, QUIC, CRC and offset checks, the central WAL append
//!   and its sync mode, acknowledgements and edge checkpoints.
//! - **Raw quinn**: one unidirectional stream carrying the same number of
//!   bytes in 64 KiB chunks between two threads, each with its own
//!   current-thread tokio runtime (like two processes), using
//!   `TlsIdentity::quic_server` / `quic_client` with the same development
//!   certificates and ALPN, so the same TLS 1.3 suite and transport settings.
//!   Time from the server's first byte to its last.
//! - The raw stream runs [`RAW_ROUNDS`] times before and as many after the
//!   replication cases; the ratio is against the median of all, and every
//!   raw figure is printed to show drift and noise (the machine may be
//!   shared: the bench also prints the load average before and after).
//! - **Where a batch waits**: after each drain the bench scrapes the edge's
//!   `tributary_edge_replication_stage_seconds` (minus a scrape taken
//!   before the drain, so the warm-up batch is left out) and the broker's
//!   `tributary_broker_ingest_stage_seconds` (a fresh process for the
//!   drain) and prints per stage the observations, their sum, mean and
//!   sum / drain time: the mean number of batches in that stage at once
//!   (stages of different batches overlap, so shares add up to more
//!   than 1).

#[path = "common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::{
    RawBulk, build_release_binaries, megabytes, quic_configs, random_bodies, scratch_dir,
};
use tributary_test_support::openmetrics::{self, HistogramSeries};
use tributary_tests::cluster::{Pair, try_scrape};

/// Bytes of each record value.
const VALUE_BYTES: usize = 1024;
/// Records per published batch (one WAL batch of ~1.07 MB).
const RECORDS_PER_BATCH: usize = 1024;
/// Batches in the backlog: ~1 GB of values, a drain of about two seconds
/// (with 200 MB the drain took half a second and one run's CPU per GB
/// varied by a third between runs).
const BATCHES: usize = 950;
/// Value bytes of the backlog; also the raw stream's size.
const PAYLOAD_BYTES: u64 = (BATCHES * RECORDS_PER_BATCH * VALUE_BYTES) as u64;
/// Interval between polls of the edge's acknowledged offset.
const POLL: Duration = Duration::from_millis(10);
/// Raw transfers before and after the replication cases.
const RAW_ROUNDS: usize = 3;
/// Bound on a backlog's replication.
const DRAIN_MAX: Duration = Duration::from_secs(180);

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg").map_or_else(|_| "?".into(), |s| s.trim().to_string())
}

struct Raw {
    seconds: f64,
    /// CPU seconds (user + system) of this process during the transfer: the
    /// sending and receiving threads (plus an idle polling loop).
    cpu_seconds: f64,
}

/// CPU seconds (user + system, all threads, living and exited) of `pid`
/// ("self" for this process), from `/proc/{pid}/stat`; `None` once it is
/// gone.
fn cpu_seconds(pid: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised command name; utime and stime are the
    // 14th and 15th fields of the line, in clock ticks (100 per second on
    // Linux).
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 / 100.0)
}

/// Pids of the processes whose command line mentions `needle` (the
/// scratch directory of a run: its broker and edge agent).
fn pids_mentioning(needle: &str) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let pid = e.file_name().to_string_lossy().into_owned();
            pid.chars().all(|c| c.is_ascii_digit()).then_some(pid)
        })
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(needle))
        })
        .collect()
}

fn total_cpu(pids: &[String]) -> f64 {
    pids.iter().filter_map(|p| cpu_seconds(p)).sum()
}

/// Cores of the edge (or raw client) and the broker (or raw server) with
/// `--pinned`.
const EDGE_CORE: usize = 0;
const BROKER_CORE: usize = 1;

fn raw_run(pinned: bool) -> Raw {
    let dir = scratch_dir("raw");
    let (server, client) = quic_configs(&dir.path().join("certs"), None);
    let cpu_before = cpu_seconds("self").unwrap_or(0.0);
    let pin = pinned.then_some((EDGE_CORE, BROKER_CORE));
    let bulk = RawBulk::start_pinned(server, client, |addr| addr, PAYLOAD_BYTES, pin);
    let deadline = Instant::now() + Duration::from_secs(120);
    while bulk.last_byte().is_none() {
        assert!(Instant::now() < deadline, "raw transfer did not finish");
        std::thread::sleep(Duration::from_millis(5));
    }
    let (first, last) = (bulk.first_byte().unwrap(), bulk.last_byte().unwrap());
    assert_eq!(bulk.received(), PAYLOAD_BYTES);
    let cpu_seconds = cpu_seconds("self").unwrap_or(0.0) - cpu_before;
    bulk.stop();
    Raw {
        seconds: (last - first).as_secs_f64(),
        cpu_seconds,
    }
}

struct Replication {
    intent: String,
    records: u64,
    seconds: f64,
    publish_seconds: f64,
    timeline: Vec<(f64, u64)>,
    /// The drain's first and last acknowledgement as Unix time (s), to
    /// match a profile recorded with `perf record -k realtime`.
    unix_span: (f64, f64),
    /// CPU seconds of the broker and the edge agent between the first and
    /// the last acknowledgement.
    cpu_seconds: f64,
    /// Per stage of a batch (edge, then broker): the process, the stage and
    /// what the drain added to its histogram.
    stages: Vec<(&'static str, String, HistogramSeries)>,
}

/// The edge's and the broker's stage histograms.
const EDGE_STAGES: &str = "tributary_edge_replication_stage_seconds";
const BROKER_STAGES: &str = "tributary_broker_ingest_stage_seconds";

/// Each stage's series of histogram `family` at `url` (`stage` label, in
/// the order exposed).
fn scrape_stages(url: &str, family: &str) -> Vec<(String, HistogramSeries)> {
    let text = try_scrape(url).unwrap_or_else(|e| panic!("scraping {url}: {e}"));
    let families = openmetrics::parse(&text).unwrap_or_else(|e| panic!("{url}: {e}"));
    let Some(family) = families.get(family) else {
        panic!("{url} has no {family}");
    };
    let mut stages: Vec<String> = Vec::new();
    for (_, labels, _) in &family.samples {
        for (k, v) in labels {
            if k == "stage" && !stages.contains(v) {
                stages.push(v.clone());
            }
        }
    }
    stages
        .into_iter()
        .filter_map(|stage| {
            let series = family.histogram(&[("stage", &stage)])?;
            Some((stage, series))
        })
        .collect()
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

fn pin(proc: &tributary_test_support::process::Proc, cpu: usize, pinned: bool) {
    if pinned {
        common::pin_pid(&proc.pid().expect("running").to_string(), cpu, true);
    }
}

fn replication_run(intent: &str, pinned: bool) -> Replication {
    let dir = scratch_dir("goodput");
    let mut pair = Pair::new(dir.path(), intent, None);
    pair.broker.start();
    pair.edge.start();
    pin(&pair.broker, BROKER_CORE, pinned);
    pin(&pair.edge, EDGE_CORE, pinned);
    pair.wait_for_edge();
    let bodies = random_bodies(8, RECORDS_PER_BATCH, VALUE_BYTES, 7);
    // Warm-up: the central topic exists and the connection was up once.
    let (_, warm) = pair.publish_ndjson(bodies[0].clone()).expect("publish");
    pair.wait_acknowledged(warm, Duration::from_secs(60));
    assert_eq!(pair.broker.terminate(), Some(0));
    let edge_metrics = format!("http://{}/metrics", pair.edge_api);
    let broker_metrics = format!("http://{}/metrics", pair.broker_admin);
    let edge_before = scrape_stages(&edge_metrics, EDGE_STAGES);

    let published = Instant::now();
    let mut hwm = warm;
    for i in 0..BATCHES {
        let (_, next) = pair
            .publish_ndjson(bodies[i % bodies.len()].clone())
            .expect("publish");
        hwm = next;
    }
    let publish_seconds = published.elapsed().as_secs_f64();
    assert_eq!(hwm - warm, (BATCHES * RECORDS_PER_BATCH) as u64);

    pair.broker.start();
    pin(&pair.broker, BROKER_CORE, pinned);
    let pids = pids_mentioning(&dir.path().to_string_lossy());
    let mut cpu_at_first = 0.0;
    let started = Instant::now();
    let mut first: Option<(Instant, u64)> = None;
    let mut unix_start = 0.0;
    let mut timeline = Vec::new();
    let mut last_sample = Instant::now();
    let end = loop {
        assert!(
            started.elapsed() < DRAIN_MAX,
            "backlog not replicated within {DRAIN_MAX:?}"
        );
        let now = Instant::now();
        let acked = pair.edge_offsets().map_or(warm, |(_, acked)| acked);
        if acked > warm && first.is_none() {
            cpu_at_first = total_cpu(&pids);
            first = Some((now, acked));
            unix_start = unix_now();
            last_sample = now;
        }
        if let Some((t0, _)) = first
            && (now - last_sample >= Duration::from_millis(250) || acked == hwm)
        {
            timeline.push(((now - t0).as_secs_f64(), acked));
            last_sample = now;
        }
        if acked == hwm {
            break now;
        }
        std::thread::sleep(POLL);
    };
    let cpu_seconds = total_cpu(&pids) - cpu_at_first;
    let (t0, acked0) = first.expect("acknowledged");
    let mut stages: Vec<(&'static str, String, HistogramSeries)> =
        scrape_stages(&edge_metrics, EDGE_STAGES)
            .into_iter()
            .map(|(stage, after)| {
                let before = edge_before.iter().find(|(s, _)| *s == stage).map_or(
                    HistogramSeries {
                        count: 0.0,
                        sum: 0.0,
                    },
                    |(_, b)| *b,
                );
                ("edge", stage, after.since(&before))
            })
            .collect();
    stages.extend(
        scrape_stages(&broker_metrics, BROKER_STAGES)
            .into_iter()
            .map(|(stage, series)| ("broker", stage, series)),
    );
    assert_eq!(pair.broker.terminate(), Some(0));
    assert_eq!(pair.edge.terminate(), Some(0));
    Replication {
        intent: intent.to_string(),
        records: hwm - acked0,
        seconds: (end - t0).as_secs_f64(),
        publish_seconds,
        timeline,
        unix_span: (unix_start, unix_now()),
        cpu_seconds,
        stages,
    }
}

fn main() {
    let intents: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let pinned = std::env::args().any(|a| a == "--pinned");
    let intents = if intents.is_empty() {
        vec!["event_stream".to_string(), "task_queue".to_string()]
    } else {
        intents
    };
    build_release_binaries();
    println!("load average before: {}", load_average());
    if pinned {
        println!(
            "pinned: edge and raw client on core {EDGE_CORE}, broker and raw server on core {BROKER_CORE}"
        );
    }
    println!(
        "replication goodput vs raw quinn, loopback, {} of values ({} records of {VALUE_BYTES} B in batches of {RECORDS_PER_BATCH})",
        megabytes(PAYLOAD_BYTES as f64),
        BATCHES * RECORDS_PER_BATCH
    );
    let mut raws: Vec<Raw> = (0..RAW_ROUNDS).map(|_| raw_run(pinned)).collect();
    let runs: Vec<Replication> = intents.iter().map(|i| replication_run(i, pinned)).collect();
    raws.extend((0..RAW_ROUNDS).map(|_| raw_run(pinned)));
    let mut raw_seconds: Vec<f64> = raws.iter().map(|r| r.seconds).collect();
    let mut raw_cpu: Vec<f64> = raws.iter().map(|r| r.cpu_seconds).collect();
    let rates: Vec<String> = raw_seconds
        .iter()
        .map(|s| format!("{:.0}", PAYLOAD_BYTES as f64 / s / 1e6))
        .collect();
    println!(
        "raw quinn MB/s, {RAW_ROUNDS} runs before and {RAW_ROUNDS} after the replication cases: {}",
        rates.join(" ")
    );
    raw_seconds.sort_by(f64::total_cmp);
    let median = (raw_seconds[RAW_ROUNDS - 1] + raw_seconds[RAW_ROUNDS]) / 2.0;
    let raw_rate = PAYLOAD_BYTES as f64 / median;
    println!();
    println!(
        "| intent | backlog publish MB/s | replicated | seconds | goodput MB/s | raw MB/s | ratio |"
    );
    println!("|---|---|---|---|---|---|---|");
    for run in &runs {
        let bytes = run.records as f64 * VALUE_BYTES as f64;
        let goodput = bytes / run.seconds;
        println!(
            "| {} | {:.1} | {} | {:.2} | {:.1} | {:.1} | {:.2} |",
            run.intent,
            PAYLOAD_BYTES as f64 / run.publish_seconds / 1e6,
            megabytes(bytes),
            run.seconds,
            goodput / 1e6,
            raw_rate / 1e6,
            goodput / raw_rate
        );
    }
    println!("load average after: {}", load_average());
    // CPU per byte does not depend on what else the machine runs, unlike
    // the rates above: it shows what the product costs beyond the
    // transport even on a busy machine.
    raw_cpu.sort_by(f64::total_cmp);
    let raw_cpu_median = (raw_cpu[RAW_ROUNDS - 1] + raw_cpu[RAW_ROUNDS]) / 2.0;
    let raw_cpu_per_gb = raw_cpu_median / (PAYLOAD_BYTES as f64 / 1e9);
    println!();
    println!(
        "| intent | CPU s per GB, product (edge + broker) | CPU s per GB, raw quinn (median) | product / raw |"
    );
    println!("|---|---|---|---|");
    for run in &runs {
        let per_gb = run.cpu_seconds / (run.records as f64 * VALUE_BYTES as f64 / 1e9);
        println!(
            "| {} | {:.2} | {:.2} | {:.2} |",
            run.intent,
            per_gb,
            raw_cpu_per_gb,
            per_gb / raw_cpu_per_gb
        );
    }
    for run in &runs {
        println!();
        println!(
            "where the batches of the drain spent their time, {} (drain {:.2} s; share = sum / drain = batches in the stage at once on average)",
            run.intent, run.seconds
        );
        println!("| process | stage | count | sum s | mean ms | share of drain |");
        println!("|---|---|---|---|---|---|");
        for (process, stage, series) in &run.stages {
            println!(
                "| {process} | {stage} | {:.0} | {:.4} | {:.4} | {:.2} |",
                series.count,
                series.sum,
                series.mean() * 1e3,
                series.sum / run.seconds
            );
        }
    }
    for run in &runs {
        println!();
        println!(
            "timeline of acknowledged offsets, {} (s since first ack: offset); Unix time {:.3} to {:.3}",
            run.intent, run.unix_span.0, run.unix_span.1
        );
        let line: Vec<String> = run
            .timeline
            .iter()
            .map(|(t, offset)| format!("{t:.2}:{offset}"))
            .collect();
        println!("{}", line.join(" "));
    }
}
