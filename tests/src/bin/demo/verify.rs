//! The central topics counted by their owners (before the brokers stop),
//! `tribctl archive verify` on the bucket (no broker involved), and every
//! record read back from the archive and tallied against the CSV.

use std::path::Path;
use std::process::Command;

use anyhow::{Context as _, anyhow};
use serde_json::Value;
use tributary_archive::reader::{Archive, Start};
use tributary_archive::{Bucket, StoreConfig};
use tributary_proto::keys::{StorageKeys, TopicName};
use tributary_tests::demo::{Tally, TallyReport};

use crate::processes::{Layout, get_text, metric};
use crate::summary::TopicCounts;
use crate::{DAILY, READINGS};

/// Reads each topic's central record count while the brokers run (after
/// everything was tiered): the highest `tributary_broker_topic_high_water_mark`
/// a broker reports for it, which is its owner's (a broker closes the WAL of
/// a topic it no longer serves, and a stale copy holds no more than the
/// owner). A new owner's WAL starts at the archive's end, so its
/// high-water mark counts the whole topic. It is read before the brokers
/// stop because a graceful stop hands each topic to a broker still
/// running, which opens its WAL only when an edge next connects.
pub fn central_counts(
    agent: &ureq::Agent,
    layout: &Layout,
    topics: [&mut TopicCounts; 2],
) -> anyhow::Result<()> {
    let expositions: Vec<String> = layout
        .admins
        .iter()
        .filter_map(|admin| get_text(agent, &format!("https://{admin}/metrics")))
        .collect();
    for counts in topics {
        let name = format!(
            "tributary_broker_topic_high_water_mark{{topic=\"{}\"}}",
            counts.topic
        );
        counts.central = expositions
            .iter()
            .filter_map(|text| metric(text, &name))
            .max()
            .ok_or_else(|| anyhow!("no broker reports a high-water mark for {}", counts.topic))?;
    }
    Ok(())
}

/// Runs `tribctl archive verify` on the bucket, then reads both topics back
/// and tallies them against what was published (`input_readings`,
/// `input_daily`).
pub fn archive(
    work: &Path,
    layout: &Layout,
    readings: &mut TopicCounts,
    daily: &mut TopicCounts,
    input_readings: Tally,
    input_daily: Tally,
) -> anyhow::Result<()> {
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
    for counts in [&mut *readings, &mut *daily] {
        let verdict = verdicts["topics"]
            .as_array()
            .and_then(|a| a.iter().find(|v| v["topic"] == counts.topic.as_str()))
            .ok_or_else(|| anyhow!("tribctl archive verify: no verdict for {}", counts.topic))?;
        counts.archive_verified = verdict["records"].as_u64().unwrap_or_default();
        counts.archive_segments = verdict["segments"].as_u64().unwrap_or_default();
        counts.archive_ok = verdict["ok"] == true && output.status.success();
    }
    let (tally_readings, tally_daily) = read_archive(&archive_dir, input_readings, input_daily)?;
    readings.read_back = tally_readings;
    daily.read_back = tally_daily;
    Ok(())
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
