//! The fresh-user trial's reproductions, on the agent over real files: a
//! renamed segment, an undecodable `wal.mark` with one flipped byte, and a
//! garbage file named like a segment past the end. Recovery keeps every
//! acknowledged record's bytes, never hands an offset out twice, and
//! refuses a file that does not fit rather than truncate it.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use serde_json::json;
use tributary_edge::Agent;
use tributary_edge::agent::AgentError;
use tributary_edge::manager::OpenError;
use tributary_proto::intent::StreamIntent;

fn segment(dir: &Path, base: u64) -> PathBuf {
    dir.join(format!("{base:020}.log"))
}

/// Starts an agent with `/e1/t` as an audit log, publishes `n` records
/// (`v0`, `v1`, ...) and stops it; returns the topic's WAL directory.
async fn publish_and_stop(data: &Path, n: u64) -> PathBuf {
    let mut cfg = config(data);
    cfg.topics = vec![topic("/e1/t", StreamIntent::AuditLog)];
    let agent = start(cfg).await;
    for i in 0..n {
        let r = post(
            agent.local_addr(),
            "/v1/topics/e1/t/records",
            &[],
            format!("v{i}").as_bytes(),
        )
        .await;
        assert_eq!(r.body["base_offset"], json!(i), "{}", r.text);
    }
    let dir = agent.topics().topic_dir(&name("/e1/t"));
    agent.shutdown().await.unwrap();
    dir
}

fn values(agent: &Agent) -> Vec<(u64, String)> {
    let topic = agent.topics().topic(&name("/e1/t")).unwrap();
    let wal = topic.wal().unwrap();
    let limits = agent.config().limits;
    let mut out = Vec::new();
    let mut from = wal.log_start_offset();
    while from < wal.high_water_mark() {
        match wal.read(from, 1 << 20) {
            Ok(batches) => {
                for batch in batches {
                    let decoded = batch.decode(&limits).unwrap();
                    for (i, r) in decoded.records.into_iter().enumerate() {
                        let value = String::from_utf8(r.value.to_vec()).unwrap();
                        out.push((decoded.base_offset + i as u64, value));
                    }
                    from = batch.next_offset();
                }
            }
            Err(broker_core::wal::WalError::Unreadable(range)) => from = range.end_offset,
            Err(e) => panic!("read at {from}: {e}"),
        }
    }
    out
}

fn expected(offsets: &[u64]) -> Vec<(u64, String)> {
    offsets.iter().map(|&o| (o, format!("v{o}"))).collect()
}

async fn refused(data: &Path) -> String {
    match Agent::start(config(data)).await {
        Err(AgentError::Open(e @ OpenError::Wal { .. })) => e.to_string(),
        Err(other) => panic!("expected the topic's WAL refused, got {other}"),
        Ok(agent) => {
            let hwm = agent
                .topics()
                .topic(&name("/e1/t"))
                .map(|t| t.high_water_mark());
            agent.shutdown().await.unwrap();
            panic!("expected the topic's WAL refused, the agent started (high-water mark {hwm:?})")
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renamed_segment_is_refused_and_renaming_it_back_restores_every_record() {
    let data = tempfile::tempdir().unwrap();
    let dir = publish_and_stop(data.path(), 3).await;
    let bytes = std::fs::read(segment(&dir, 0)).unwrap();
    std::fs::rename(segment(&dir, 0), segment(&dir, 1)).unwrap();

    let error = refused(data.path()).await;
    assert!(error.contains("00000000000000000001.log"), "{error}");
    assert_eq!(std::fs::read(segment(&dir, 1)).unwrap(), bytes);

    std::fs::rename(segment(&dir, 1), segment(&dir, 0)).unwrap();
    let agent = start(config(data.path())).await;
    assert_eq!(values(&agent), expected(&[0, 1, 2]));
    let r = post(agent.local_addr(), "/v1/topics/e1/t/records", &[], b"v3").await;
    assert_eq!(r.body["base_offset"], json!(3), "{}", r.text);
    agent.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_garbage_mark_and_a_flipped_byte_keep_the_intact_records_and_their_offsets() {
    let data = tempfile::tempdir().unwrap();
    let dir = publish_and_stop(data.path(), 5).await;
    let path = segment(&dir, 0);
    let mut bytes = std::fs::read(&path).unwrap();
    let one = bytes.len() / 5;
    bytes[one + one / 2] ^= 0x10;
    std::fs::write(&path, &bytes).unwrap();
    let garbage: Vec<u8> = (0..128u32).map(|i| (i * 151 + 7) as u8).collect();
    std::fs::write(dir.join("wal.mark"), garbage).unwrap();

    let agent = start(config(data.path())).await;
    let topic = agent.topics().topic(&name("/e1/t")).unwrap();
    assert_eq!(topic.high_water_mark(), 5);
    let damaged: Vec<_> = topic
        .wal()
        .unwrap()
        .damaged_ranges()
        .iter()
        .map(|r| (r.first_offset, r.end_offset))
        .collect();
    assert_eq!(damaged, [(1, 2)]);
    assert_eq!(values(&agent), expected(&[0, 2, 3, 4]));
    assert_eq!(std::fs::read(&path).unwrap(), bytes, "every byte kept");
    let r = post(agent.local_addr(), "/v1/topics/e1/t/records", &[], b"v5").await;
    assert_eq!(r.body["base_offset"], json!(5), "{}", r.text);
    drop(topic);
    agent.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_garbage_segment_past_the_end_is_refused_not_made_a_hole() {
    let data = tempfile::tempdir().unwrap();
    let dir = publish_and_stop(data.path(), 16).await;
    let stray = segment(&dir, 100);
    let garbage: Vec<u8> = (0..3000u32).map(|i| (i * 89 + 13) as u8).collect();
    std::fs::write(&stray, &garbage).unwrap();

    let error = refused(data.path()).await;
    assert!(error.contains("00000000000000000100.log"), "{error}");
    assert_eq!(std::fs::read(&stray).unwrap(), garbage, "not truncated");

    std::fs::remove_file(&stray).unwrap();
    let agent = start(config(data.path())).await;
    let all: Vec<u64> = (0..16).collect();
    assert_eq!(values(&agent), expected(&all));
    let r = post(agent.local_addr(), "/v1/topics/e1/t/records", &[], b"v16").await;
    assert_eq!(r.body["base_offset"], json!(16), "{}", r.text);
    agent.shutdown().await.unwrap();
}
