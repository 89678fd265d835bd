//! A full file system under the edge's WALs, with the real binaries and a
//! real 64 MiB ext4 file system on a loop device (root, `mkfs.ext4`,
//! `mount`; the test fails without them): no disk budget is configured, so
//! the file system itself fills. Producers get 507 `disk_full` naming the
//! path (never 500), `/health` says `degraded`, SIGTERM in that state exits
//! 0, the agent killed with SIGKILL restarts on the full disk, and once the
//! broker is reachable it drains, seals and deletes the acknowledged
//! segment and accepts publishes again by itself. Every acknowledged record
//! arrives at the broker once, at its offset.
//!
//! The metadata store (`{data_dir}/metadata.redb`) is not on the small
//! file system: the loop file system is mounted on `{data_dir}/topics`
//! only (the store's own behaviour on a full disk is tested apart).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::Value;
use tributary_test_support::loop_fs::LoopFs;
use tributary_tests::cluster::{Pair, metric_value, read_wal, try_scrape};

/// Room the filler leaves for the WAL to fill itself, bytes.
const HEADROOM: u64 = 3 * 1024 * 1024;

fn batch(first: u64, count: u64) -> (String, Vec<String>) {
    let values: Vec<String> = (first..first + count)
        .map(|i| format!("reading-{i:08}-{}", "x".repeat(200)))
        .collect();
    let body = values
        .iter()
        .map(|v| format!("{{\"value\":{v:?}}}\n"))
        .collect();
    (body, values)
}

fn health(pair: &Pair) -> Value {
    let url = format!("http://{}/health", pair.edge_api);
    let text = try_scrape(&url).expect("health");
    serde_json::from_str(&text).expect("health json")
}

/// Publishes batches of 100 records from `*next` until one is refused;
/// records the acknowledged ones in `acked` (offset → value); returns the
/// refusal. Offsets must continue where the last acknowledgement ended.
fn publish_until_refused(pair: &Pair, next: &mut u64, acked: &mut HashMap<u64, String>) -> String {
    let start = *next;
    loop {
        let (body, values) = batch(*next, 100);
        match pair.publish_ndjson(body) {
            Ok((base, end)) => {
                assert!(base >= *next, "offset {base} re-used (next was {next})");
                for (i, v) in values.into_iter().enumerate() {
                    acked.insert(base + i as u64, v);
                }
                *next = end;
            }
            Err(e) => return e,
        }
        assert!(*next - start < 2_000_000, "the file system never filled");
    }
}

fn assert_disk_full(refusal: &str) {
    assert!(refusal.starts_with("status 507"), "{refusal}");
    assert!(refusal.contains("\"kind\":\"disk_full\""), "{refusal}");
    assert!(refusal.contains("topics/plant1/readings"), "{refusal}");
}

/// Polls `/health` until it is `degraded` naming the topic and its path
/// (right after a refusal: the first reopen attempt is 200 ms away).
fn wait_degraded(pair: &Pair) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let h = health(pair);
        if h["status"] == "degraded" {
            let fault = &h["faults"][0];
            assert_eq!(fault["topic"], "/plant1/readings", "{h}");
            assert_eq!(fault["state"], "disk_full", "{h}");
            assert!(
                fault["path"]
                    .as_str()
                    .is_some_and(|p| p.ends_with("topics/plant1/readings")),
                "{h}"
            );
            return;
        }
        assert!(Instant::now() < deadline, "/health never degraded: {h}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_full_disk_answers_507_disk_full_and_recovers_by_itself_with_every_record_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut pair = Pair::new_with(
        dir.path(),
        "task_queue",
        None,
        "max_record_bytes = 16384\nmax_batch_bytes = 65536",
        "",
    );
    let fs = LoopFs::create_at(dir.path(), 64 << 20, &pair.edge_data.join("topics"));
    pair.broker.start();
    pair.edge.start();
    pair.wait_for_edge();

    // Some records, acknowledged by the broker, then the broker goes away.
    let mut acked: HashMap<u64, String> = HashMap::new();
    let mut next = 0u64;
    for _ in 0..20 {
        let (body, values) = batch(next, 100);
        let (base, end) = pair.publish_ndjson(body).expect("publish");
        assert_eq!(base, next);
        for (i, v) in values.into_iter().enumerate() {
            acked.insert(base + i as u64, v);
        }
        next = end;
    }
    pair.wait_acknowledged(next, Duration::from_secs(60));
    assert_eq!(pair.broker.terminate(), Some(0));

    // Something else takes the disk; the WAL fills the rest.
    fs.fill();
    fs.free_bytes(HEADROOM);
    let refusal = publish_until_refused(&pair, &mut next, &mut acked);
    assert_disk_full(&refusal);
    wait_degraded(&pair);
    // A new implicit topic (its WAL directory) on a disk without a free
    // block: 507 too, nothing stored (the edge trial got 500 `internal`).
    let filler = fs.fill();
    let refusal = tributary_tests::fleet::publish_ndjson(
        pair.edge_api,
        "/plant1/new-on-full-disk",
        "{\"value\":\"x\"}\n".into(),
    )
    .expect_err("no room for a new topic");
    assert!(refusal.starts_with("status 507"), "{refusal}");
    assert!(refusal.contains("\"kind\":\"disk_full\""), "{refusal}");
    assert!(filler > 0);
    fs.free_bytes(HEADROOM);
    let metrics = try_scrape(&format!("http://{}/metrics", pair.edge_api)).expect("metrics");
    assert!(
        metric_value(
            &metrics,
            "tributary_edge_disk_full_total{topic=\"/plant1/readings\"}"
        )
        .is_some_and(|n| n >= 100),
        "{metrics}"
    );

    // SIGTERM in the full state: a clean exit.
    assert_eq!(pair.edge.terminate(), Some(0), "SIGTERM on a full disk");

    // It starts on the full disk, is still full, and survives SIGKILL.
    pair.edge.start();
    pair.wait_for_edge();
    let refusal = publish_until_refused(&pair, &mut next, &mut acked);
    assert_disk_full(&refusal);
    pair.edge.kill();
    pair.edge.start();
    pair.wait_for_edge();

    // Not a free block left (the edge trial: sealing needs room for the
    // segment's index, and without it the agent stayed full for good).
    pair.edge.kill();
    fs.fill();
    pair.edge.start();
    pair.wait_for_edge();

    // The broker is back: the agent drains, seals and deletes the
    // acknowledged segment, and publishing resumes with no operator.
    pair.broker.start();
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut resumed = 0;
    while resumed < 10 {
        let (body, values) = batch(next, 100);
        match pair.publish_ndjson(body) {
            Ok((base, end)) => {
                assert!(base >= next, "offset {base} re-used (next was {next})");
                for (i, v) in values.into_iter().enumerate() {
                    acked.insert(base + i as u64, v);
                }
                next = end;
                resumed += 1;
            }
            Err(e) => {
                assert_disk_full(&e);
                assert!(
                    Instant::now() < deadline,
                    "publishing did not resume: {e}; health {}",
                    health(&pair)
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
    let h = health(&pair);
    assert_eq!(h["status"], "ok", "{h}");
    let hwm = pair.edge_offsets().expect("offsets").0;
    pair.wait_acknowledged(hwm, Duration::from_secs(120));
    assert_eq!(pair.edge.terminate(), Some(0));
    assert_eq!(pair.broker.terminate(), Some(0));
    drop(fs);

    // Every acknowledged record once, at its offset; offsets contiguous.
    let central = read_wal(&pair.broker_data.join("topics/plant1/readings"));
    for (i, (offset, _)) in central.iter().enumerate() {
        assert_eq!(
            *offset, i as u64,
            "offsets at the broker are not contiguous"
        );
    }
    let held: HashMap<u64, &[u8]> = central.iter().map(|(o, v)| (*o, v.as_ref())).collect();
    for (offset, value) in &acked {
        assert_eq!(
            held.get(offset).copied(),
            Some(value.as_bytes()),
            "acknowledged offset {offset} does not hold its record at the broker"
        );
    }
    let mut seen: HashMap<&[u8], u64> = HashMap::new();
    for (offset, value) in &central {
        if let Some(first) = seen.insert(value.as_ref(), *offset) {
            assert!(
                !acked.values().any(|v| v.as_bytes() == value.as_ref()),
                "an acknowledged record is stored twice, at {first} and {offset}"
            );
        }
    }
}
