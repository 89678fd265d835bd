//! The replay: a reader thread turns the CSV into NDJSON bodies (readings
//! and daily summaries, tallied as sent); the main thread posts them to the
//! edge in order, checks the offsets it assigns, and stops the broker
//! (SIGTERM) for an outage in the middle.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, ensure};
use serde_json::Value;
use tributary_tests::demo::{self, DaySummary, Tally};

use crate::central::Central;
use crate::options::Args;
use crate::processes::{Layout, edge_topic};
use crate::summary::{Summary, fmt_count};
use crate::{DAILY, READINGS};

/// A body for the edge's batch endpoint.
pub struct Job {
    pub topic: &'static str,
    pub body: String,
    pub records: u64,
}

/// What the reader thread returns.
pub struct Input {
    pub rows: u64,
    pub csv_bytes: u64,
    pub value_bytes: u64,
    pub readings: Tally,
    pub daily: Tally,
}

/// Refuses a file that does not start with the data set's header.
pub fn check_header(path: &Path) -> anyhow::Result<()> {
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
pub fn read_input(
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
pub fn publish(
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

/// Replays the CSV through the edge (see the module comment), with the
/// broker outage; records the outage and the replay time in `summary` and
/// returns what was sent.
pub fn replay(
    args: &Args,
    agent: &ureq::Agent,
    layout: &Layout,
    central: &mut Central,
    summary: &mut Summary,
) -> anyhow::Result<Input> {
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
    let mut offsets = (0u64, 0u64);
    let mut outage: Option<(Instant, u64)> = None;
    let mut last_report = Instant::now();
    let replay_started = Instant::now();
    let restart = |summary: &mut Summary,
                   central: &mut Central,
                   since: Instant,
                   at: u64,
                   now_published: u64|
     -> anyhow::Result<()> {
        let (hwm, acked, _) = edge_topic(agent, layout, READINGS).unwrap_or_default();
        summary.backlog_at_restart = hwm.saturating_sub(acked);
        summary.published_during_outage = now_published - at;
        central.restart();
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
            publish(agent, layout, job, offset)?;
            if !readings {
                continue;
            }
            let published = offsets.0;
            match outage {
                None if !central.is_down() && published >= stop_at.max(1) => {
                    eprintln!("demo: {} records published", fmt_count(published));
                    central.outage(layout, summary)?;
                    outage = Some((Instant::now(), published));
                }
                Some((since, at))
                    if central.is_down()
                        && published >= restart_at
                        && since.elapsed() >= Duration::from_millis(args.outage_ms) =>
                {
                    restart(summary, central, since, at, published)?;
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
        && central.is_down()
    {
        let rest = Duration::from_millis(args.outage_ms).saturating_sub(since.elapsed());
        std::thread::sleep(rest);
        restart(summary, central, since, at, offsets.0)?;
    }
    summary.replay_s = replay_started.elapsed().as_secs_f64();
    Ok(input)
}
