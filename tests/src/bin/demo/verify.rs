//! After everything stopped: the central topics counted from the broker's
//! WALs, `tribctl archive verify` on the bucket (no broker involved), and
//! every record read back from the archive and tallied against the CSV.

use std::path::Path;
use std::process::Command;

use anyhow::{Context as _, anyhow};
use broker_core::wal::{Wal, WalConfig};
use serde_json::Value;
use tributary_archive::reader::{Archive, Start};
use tributary_archive::{Bucket, StoreConfig};
use tributary_proto::keys::{StorageKeys, TopicName};
use tributary_tests::demo::{Tally, TallyReport};

use crate::processes::Layout;
use crate::summary::TopicCounts;
use crate::{DAILY, READINGS};

/// Counts each topic's records in its owner's WAL (the broker must be
/// stopped): its high-water mark. A new owner's WAL starts at the archive's
/// end, so its high-water mark counts the whole topic.
pub fn central_counts(layout: &Layout, topics: [&mut TopicCounts; 2]) -> anyhow::Result<()> {
    for counts in topics {
        let topic = TopicName::new(&counts.topic).map_err(|e| anyhow!("{e}"))?;
        let owner = layout
            .owner(&counts.topic)
            .ok_or_else(|| anyhow!("no broker owns {}", counts.topic))?;
        let dir = layout
            .broker_data(owner)
            .join("topics")
            .join(topic.namespace())
            .join(topic.topic());
        let wal = Wal::open(&dir, WalConfig::default())
            .with_context(|| format!("opening the central WAL {}", dir.display()))?;
        counts.central = wal.high_water_mark();
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
