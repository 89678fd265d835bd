//! `demo`: Tributary's main job on real data, run by `scripts/demo`.
//!
//! Starts a single-node broker (embedded Raft) — or, with `--brokers 3`, a
//! three-broker cluster with a tier service beside each — a tier service on
//! a local directory and an edge agent `plant1` given every broker's
//! address, all on 127.0.0.1 under one work directory, then replays the UCI "Individual household electric power
//! consumption" readings (Hebrail & Berard, UCI Machine Learning
//! Repository) through the edge's NDJSON batch endpoint:
//! - every row as one JSON record on `/plant1/household-power`
//!   (`event_stream`), keyed by its timestamp;
//! - one summary record per day on `/plant1/household-power-daily`
//!   (`audit_log`), keyed by the date.
//!
//! In the middle it stops the broker (SIGTERM) — in a cluster it SIGKILLs
//! the owner of the readings topic instead, and the others take over —
//! keeps publishing, and starts it again. At the end it waits until the edge's checkpoints and the
//! committed tiered offsets reach every record, stops everything (SIGTERM,
//! exit 0 expected), counts the central topics' WALs, runs `tribctl archive
//! verify` on the bucket (no broker involved), reads the whole archive back
//! and compares it record by record with the CSV. It prints a summary and
//! exits 1 if any count disagrees.

mod central;
mod options;
mod processes;
mod replay;
mod summary;
mod verify;

use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use anyhow::{anyhow, ensure};
use clap::Parser;

use options::Args;
use processes::{
    Layout, edge_topic, get_json, get_text, http, metric, prepare_work_dir, stop, tiered_offset,
    wait_until, write_configs,
};
use replay::check_header;
use summary::{Summary, TopicCounts, check, fmt_count, print_summary};
use tributary_test_support::ports::free_tcp;

/// Topic of the readings.
const READINGS: &str = "/plant1/household-power";
/// Topic of the daily summaries.
const DAILY: &str = "/plant1/household-power-daily";
/// Admin token of the demo broker.
const TOKEN: &str = "demo-admin-token";

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(summary) => {
            print_summary(&summary);
            if let Some(path) = &args.summary_json
                && let Err(e) = std::fs::write(
                    path,
                    serde_json::to_vec_pretty(&summary).unwrap_or_default(),
                )
            {
                eprintln!("error: writing {}: {e}", path.display());
                return ExitCode::FAILURE;
            }
            if summary.ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("demo: error: {e:#}");
            eprintln!(
                "demo: the processes' logs are in {}",
                args.work_dir.join("logs").display()
            );
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> anyhow::Result<Summary> {
    let started = Instant::now();
    let bins = match &args.bin_dir {
        Some(dir) => dir.clone(),
        None => std::env::current_exe()?
            .parent()
            .ok_or_else(|| anyhow!("no directory of the demo binary"))?
            .to_path_buf(),
    };
    for name in ["broker", "edge-agent", "tier-service", "tribctl"] {
        ensure!(
            bins.join(name).exists(),
            "{} is missing (cargo build --release --bins)",
            bins.join(name).display()
        );
    }
    ensure!(args.batch_rows > 0, "--batch-rows must be at least 1");
    ensure!(
        matches!(args.brokers, 1 | 3),
        "--brokers must be 1 or 3 (a majority must survive the owner's SIGKILL)"
    );
    check_header(&args.csv)?;
    prepare_work_dir(&args.work_dir)?;
    let work = std::path::absolute(&args.work_dir)?;
    let admins: Vec<_> = (0..args.brokers).map(|_| free_tcp()).collect();
    let layout = Layout {
        work: work.clone(),
        bins,
        admin: admins[0],
        admins,
        edge_api: free_tcp(),
    };
    write_configs(&layout, args)?;
    let config_arg = |name: &str| work.join(name);
    let mut central = central::Central::new(&layout)?;
    let mut edge_cmd = Command::new(layout.bin("edge-agent"));
    edge_cmd
        .arg("run")
        .arg("--config")
        .arg(config_arg("edge.toml"));
    let mut edge = layout.logged("edge-agent", edge_cmd)?;
    let agent = http(&layout);

    eprintln!("demo: work directory {}", work.display());
    for broker in &mut central.brokers {
        broker.start();
    }
    for admin in &layout.admins {
        let health = format!("https://{admin}/health");
        wait_until("broker admin API up", Duration::from_secs(60), || {
            get_json(&agent, &health, None).is_some()
        })?;
    }
    processes::create_tier_principal(&layout)?;
    for tier in &mut central.tiers {
        tier.start();
    }
    edge.start();
    let edge_health = format!("http://{}/health", layout.edge_api);
    wait_until("edge API up", Duration::from_secs(60), || {
        get_json(&agent, &edge_health, None).is_some()
    })?;
    eprintln!(
        "demo: {} (admin {}), tier service{}, edge agent plant1 (API {}) running",
        if args.brokers == 1 {
            "broker".to_owned()
        } else {
            format!("{} brokers", args.brokers)
        },
        layout.admin,
        if args.brokers == 1 { "" } else { "s" },
        layout.edge_api
    );

    let mut summary = Summary::default();
    let input = replay::replay(args, &agent, &layout, &mut central, &mut summary)?;
    summary.rows_read = input.rows;
    summary.csv_bytes = input.csv_bytes;
    summary.value_bytes = input.value_bytes;
    let days = input.daily.published();
    eprintln!(
        "demo: replay done: {} rows and {} daily summaries published in {:.1} s; waiting for replication and tiering",
        fmt_count(input.rows),
        fmt_count(days),
        summary.replay_s
    );

    // Settle: everything acknowledged at the edge, then tiered; a broker or
    // tier service that exits meanwhile ends the wait at once.
    let limit = Duration::from_secs(args.settle_timeout_s);
    for (topic, count) in [(READINGS, input.rows), (DAILY, days)] {
        settle(
            &format!("{topic}: {count} records acknowledged at the edge"),
            limit,
            &mut central,
            || edge_topic(&agent, &layout, topic).is_some_and(|(_, acked, _)| acked >= count),
        )?;
    }
    eprintln!("demo: everything replicated; waiting for the tier service");
    for (topic, count) in [(READINGS, input.rows), (DAILY, days)] {
        settle(
            &format!("{topic}: {count} records tiered"),
            limit,
            &mut central,
            || tiered_offset(&agent, &layout, topic).is_some_and(|t| t >= count),
        )?;
    }
    let mut readings = TopicCounts {
        topic: READINGS.into(),
        published: input.rows,
        ..TopicCounts::default()
    };
    let mut daily = TopicCounts {
        topic: DAILY.into(),
        published: days,
        ..TopicCounts::default()
    };
    for counts in [&mut readings, &mut daily] {
        let (_, acked, bytes_in) =
            edge_topic(&agent, &layout, &counts.topic).ok_or_else(|| anyhow!("edge API gone"))?;
        counts.acknowledged_at_edge = acked;
        summary.edge_batch_bytes += bytes_in;
    }
    let metrics = get_text(&agent, &format!("http://{}/metrics", layout.edge_api))
        .ok_or_else(|| anyhow!("edge /metrics unavailable"))?;
    summary.replication_raw_bytes =
        metric(&metrics, "tributary_edge_replication_raw_bytes_total").unwrap_or_default();
    summary.wire_bytes =
        metric(&metrics, "tributary_edge_replication_wire_bytes_total").unwrap_or_default();
    summary.reconnects =
        metric(&metrics, "tributary_edge_replication_reconnects_total").unwrap_or_default();

    // The central topics, as their owners count them.
    verify::central_counts(&agent, &layout, [&mut readings, &mut daily])?;

    // Stop everything gracefully; each must exit 0. Then the archive:
    // `tribctl archive verify` (no broker), then every record.
    stop(&mut summary, "edge-agent", &mut edge);
    central.stop_all(&mut summary);
    verify::archive(
        &work,
        &layout,
        &mut readings,
        &mut daily,
        input.readings,
        input.daily,
    )?;
    summary.readings = readings;
    summary.daily = daily;
    summary.wall_s = started.elapsed().as_secs_f64();
    summary.records_per_s = summary.rows_read as f64 / summary.wall_s;
    check(&mut summary);
    Ok(summary)
}

/// [`wait_until`] that also fails as soon as a broker or tier service that
/// should run has exited (its log is under `logs/`), instead of waiting out
/// `limit`.
fn settle(
    what: &str,
    limit: Duration,
    central: &mut central::Central,
    mut ready: impl FnMut() -> bool,
) -> anyhow::Result<()> {
    let mut exited = None;
    wait_until(what, limit, || {
        exited = central.exited();
        exited.is_some() || ready()
    })?;
    match exited {
        Some(which) => Err(anyhow!("{what}: {which} exited; see logs/")),
        None => Ok(()),
    }
}
