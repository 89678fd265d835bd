//! The edge's local metadata store (`{data_dir}/metadata.redb`) damaged
//! in the middle, truncated to half, or deleted while the agent is down
//! (SIGKILLed first), with the real binaries: the agent starts every time,
//! its log says what it rebuilt (an implicit topic found as a WAL
//! directory is recreated), and after more publishes every record the
//! producer was acknowledged arrives at the broker exactly once, at its
//! offset, with no gap.

use std::collections::{BTreeMap, HashSet};
use std::io::{Seek, SeekFrom, Write};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use tributary_test_support::process::{Proc, bin_path};
use tributary_tests::cluster::{EdgeClient, Pair, child_log_filter, read_wal};

/// Records per publish.
const BATCH: usize = 50;
/// Records published before the kill, and after the restart.
const RECORDS: usize = 1000;
/// Records published to the implicit topic before the kill.
const EXTRA_RECORDS: usize = 100;
/// Longest the broker may take to acknowledge everything.
const DRAIN: Duration = Duration::from_secs(90);

/// Publishes `count` unique records in batches; returns offset → value of
/// what was acknowledged.
fn publish(client: &EdgeClient, tag: &str, count: usize) -> BTreeMap<u64, String> {
    let mut acked = BTreeMap::new();
    for batch in 0..count / BATCH {
        let values: Vec<String> = (0..BATCH).map(|i| format!("{tag}-b{batch}-r{i}")).collect();
        let body: String = values
            .iter()
            .map(|v| format!("{{\"value\":{v:?}}}\n"))
            .collect();
        let (base, next) = client
            .publish_ndjson(body)
            .unwrap_or_else(|e| panic!("publish {tag} batch {batch}: {e}"));
        assert_eq!(next - base, BATCH as u64);
        for (i, v) in values.into_iter().enumerate() {
            assert!(acked.insert(base + i as u64, v).is_none(), "offset reused");
        }
    }
    acked
}

/// Publishes `count` records to the implicit topic `/plant1/extra`.
fn publish_extra(edge_api: std::net::SocketAddr, count: usize) {
    let body: String = (0..count)
        .map(|i| format!("{{\"value\":\"extra-{i}\"}}\n"))
        .collect();
    let url = format!("http://{edge_api}/v1/topics/plant1/extra/batch");
    let response = ureq::post(&url)
        .header("content-type", "application/x-ndjson")
        .send(body)
        .expect("publish to the implicit topic");
    assert!(response.status().is_success(), "{}", response.status());
}

/// The implicit topic's high-water mark, if the topic exists.
fn extra_high_water_mark(edge_api: std::net::SocketAddr) -> Option<u64> {
    let url = format!("http://{edge_api}/v1/topics/plant1/extra");
    let mut response = ureq::get(&url).call().ok()?;
    let value: serde_json::Value = response.body_mut().read_json().ok()?;
    value["high_water_mark"].as_u64()
}

/// Waits until the edge's log holds `needle`; returns the log.
fn wait_for_log(log: &Path, needle: &str, limit: Duration) -> String {
    let deadline = Instant::now() + limit;
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if text.contains(needle) {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "edge log has no {needle:?} within {limit:?}:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs one round: publish, SIGKILL the edge, `damage` the store, restart,
/// check the log for `expect_in_log`, publish again, drain, compare.
fn damaged_store_round(name: &str, damage: impl FnOnce(&Path), expect_in_log: &str) {
    let started = Instant::now();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut pair = Pair::new(dir.path(), "task_queue", None);
    // The edge with its log in a file, to read what it says at start.
    let log = dir.path().join("edge.log");
    let mut edge_cmd = Command::new(bin_path("edge-agent"));
    edge_cmd
        .arg("run")
        .arg("--config")
        .arg(dir.path().join("edge.toml"))
        .env("RUST_LOG", child_log_filter());
    pair.edge = Proc::logged("edge-agent", edge_cmd, &log).expect("edge log");
    pair.broker.start();
    pair.edge.start();
    pair.wait_for_edge();
    let client = Pair::api_client(pair.edge_api);

    let mut acked = publish(&client, "before", RECORDS);
    publish_extra(pair.edge_api, EXTRA_RECORDS);
    let (hwm, _) = pair.edge_offsets().expect("edge offsets");
    pair.wait_acknowledged(hwm, DRAIN);
    // Checkpoints are written every 200 ms: let one be written, then more
    // records that the broker may not have when the edge dies.
    std::thread::sleep(Duration::from_millis(500));
    acked.extend(publish(&client, "unreplicated", 4 * BATCH));
    pair.edge.kill();

    let store = pair.edge_data.join("metadata.redb");
    assert!(
        store.exists(),
        "{name}: no metadata store at {}",
        store.display()
    );
    damage(&store);

    pair.edge.start();
    pair.wait_for_edge();
    let text = wait_for_log(&log, expect_in_log, Duration::from_secs(30));
    assert!(
        text.contains("/plant1/extra"),
        "{name}: the log does not name the rebuilt implicit topic:\n{text}"
    );
    // The implicit topic is back with its records.
    assert_eq!(
        extra_high_water_mark(pair.edge_api),
        Some(EXTRA_RECORDS as u64),
        "{name}: implicit topic not rebuilt"
    );

    acked.extend(publish(&client, "after", RECORDS));
    let (hwm, _) = pair.edge_offsets().expect("edge offsets");
    pair.wait_acknowledged(hwm, DRAIN);
    assert_eq!(pair.broker.terminate(), Some(0), "{name}: broker exit");
    assert_eq!(pair.edge.terminate(), Some(0), "{name}: edge exit");

    let central = read_wal(&pair.broker_data.join("topics/plant1/readings"));
    assert_eq!(
        central.len() as u64,
        hwm,
        "{name}: the broker holds a different number of records than the edge assigned"
    );
    assert_eq!(
        acked.len() as u64,
        hwm,
        "{name}: every publish was acknowledged"
    );
    let mut seen = HashSet::new();
    for (i, (offset, value)) in central.iter().enumerate() {
        assert_eq!(*offset, i as u64, "{name}: central offsets have a gap");
        assert!(
            seen.insert(value.clone()),
            "{name}: {value:?} appears twice"
        );
    }
    for (offset, value) in &acked {
        let (_, stored) = &central[*offset as usize];
        assert_eq!(stored.as_ref(), value.as_bytes(), "{name}: offset {offset}");
    }
    eprintln!(
        "{name}: {} acknowledged records arrived once in {:?}",
        acked.len(),
        started.elapsed()
    );
}

#[test]
fn a_metadata_store_damaged_in_the_middle_is_replaced_and_nothing_is_lost() {
    damaged_store_round(
        "middle",
        |path| {
            let len = std::fs::metadata(path).expect("store").len();
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .open(path)
                .expect("store");
            // 512 bytes in every 8 KiB from the middle on.
            let mut at = len / 2;
            while at + 512 < len {
                file.seek(SeekFrom::Start(at)).expect("seek");
                file.write_all(&[0xAB; 512]).expect("damage");
                at += 8192;
            }
            file.sync_all().expect("sync");
        },
        "local metadata store was DAMAGED",
    );
}

#[test]
fn a_truncated_metadata_store_is_replaced_and_nothing_is_lost() {
    damaged_store_round(
        "truncated",
        |path| {
            let len = std::fs::metadata(path).expect("store").len();
            std::fs::OpenOptions::new()
                .write(true)
                .open(path)
                .expect("store")
                .set_len(len / 2)
                .expect("truncate");
        },
        "local metadata store was DAMAGED",
    );
}

#[test]
fn a_deleted_metadata_store_is_rebuilt_and_nothing_is_lost() {
    damaged_store_round(
        "deleted",
        |path| std::fs::remove_file(path).expect("delete the store"),
        "local metadata store is missing what the WAL directories hold",
    );
}
