//! Edge → broker replication with the real binaries on 127.0.0.1: every
//! record published at the edge reaches the central topic exactly once, in
//! order, with the same offsets and bytes, across broker outages.

use std::time::{Duration, Instant};

use tributary_tests::cluster::{Pair, read_batches, read_wal};

/// The value of the record at `offset`: derivable, so the check needs no
/// copy of what was sent.
fn value(offset: u64) -> String {
    format!(
        "{{\"seq\":{offset},\"kw\":{}.{:03}}}",
        offset % 7,
        offset % 1000
    )
}

fn ndjson(from: u64, count: u64) -> String {
    let mut body = String::with_capacity(count as usize * 48);
    for offset in from..from + count {
        body.push_str(&format!("{{\"value\":{:?}}}\n", value(offset)));
    }
    body
}

const RECORDS: u64 = 1_000_000;
const PER_BATCH: u64 = 5_000;

#[test]
fn a_million_records_arrive_exactly_once_across_broker_outages() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut pair = Pair::new(dir.path(), "event_stream", None);
    // The broker is down: the edge keeps everything locally.
    pair.edge.start();
    pair.wait_for_edge();
    let started = Instant::now();
    let mut next = 0;
    while next < RECORDS / 2 {
        let (base, end) = pair
            .publish_ndjson(ndjson(next, PER_BATCH))
            .expect("publish");
        assert_eq!((base, end), (next, next + PER_BATCH));
        next = end;
    }
    // Broker up: replication starts; it is killed mid-transfer while the
    // edge keeps publishing, then started again.
    pair.broker.start();
    let deadline = Instant::now() + Duration::from_secs(120);
    while pair.edge_offsets().map_or(0, |(_, acked)| acked) == 0 {
        assert!(Instant::now() < deadline, "nothing replicated within 120 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    pair.broker.kill();
    while next < RECORDS {
        let (base, end) = pair
            .publish_ndjson(ndjson(next, PER_BATCH))
            .expect("publish");
        assert_eq!(base, next);
        next = end;
    }
    pair.broker.start();
    std::thread::sleep(Duration::from_millis(300));
    pair.broker.kill();
    pair.broker.start();
    pair.wait_acknowledged(RECORDS, Duration::from_secs(600));
    eprintln!("replicated {RECORDS} records in {:?}", started.elapsed());
    assert_eq!(pair.broker.terminate(), Some(0), "broker exit status");
    assert_eq!(pair.edge.terminate(), Some(0), "edge exit status");

    // Central: every record once, in order, same offsets and bytes.
    let central = read_wal(&pair.broker_data.join("topics/plant1/readings"));
    assert_eq!(central.len() as u64, RECORDS);
    for (i, (offset, bytes)) in central.iter().enumerate() {
        assert_eq!(*offset, i as u64);
        assert_eq!(
            bytes.as_ref(),
            value(i as u64).as_bytes(),
            "offset {offset}"
        );
    }
    // What the edge still keeps locally (the unacknowledged segments are
    // gone; the active one remains) is byte-identical centrally.
    let edge_dir = pair.edge_data.join("topics/plant1/readings");
    let edge_batches = read_batches(&edge_dir, edge_start(&edge_dir));
    assert!(!edge_batches.is_empty());
    let central_batches = read_batches(
        &pair.broker_data.join("topics/plant1/readings"),
        edge_start(&edge_dir),
    );
    assert_eq!(central_batches, edge_batches, "batches are not verbatim");
}

fn edge_start(dir: &std::path::Path) -> u64 {
    broker_core::wal::Wal::open(dir, broker_core::wal::WalConfig::default())
        .expect("open edge wal")
        .log_start_offset()
}

/// An edge killed after the broker acknowledged its records but before its
/// checkpoint reached disk: after the restart the broker's Welcome (its
/// durable high-water mark) acknowledges them, with no new record to send.
/// Before this was handled the edge reported them unacknowledged until the
/// next publish, and forever on a quiet topic (the crash loop's stall).
#[test]
fn the_welcome_acknowledges_what_the_broker_holds_after_an_edge_crash() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut pair = Pair::new(dir.path(), "task_queue", None);
    // Checkpoints are written once a minute (the longest interval allowed):
    // within the 30 s waited for below, only the Welcome can move the
    // acknowledged offset of the restarted edge.
    let edge_toml = dir.path().join("edge.toml");
    let text = std::fs::read_to_string(&edge_toml).expect("edge.toml");
    assert!(text.contains("checkpoint_interval_ms = 200\n"));
    let text = text.replace(
        "checkpoint_interval_ms = 200\n",
        "checkpoint_interval_ms = 60000\n",
    );
    std::fs::write(&edge_toml, text).expect("edge.toml");
    pair.broker.start();
    pair.edge.start();
    pair.wait_for_edge();
    assert_eq!(pair.publish_ndjson(ndjson(0, 100)), Ok((0, 100)));
    pair.wait_acknowledged(100, Duration::from_secs(60));

    pair.edge.kill();
    pair.edge.start();
    pair.wait_for_edge();
    pair.wait_acknowledged(100, Duration::from_secs(30));
    assert_eq!(pair.edge_offsets(), Some((100, 100)));
    assert_eq!(pair.broker.terminate(), Some(0));
    assert_eq!(pair.edge.terminate(), Some(0));
    let central = read_wal(&pair.broker_data.join("topics/plant1/readings"));
    assert_eq!(central.len(), 100, "nothing resent, nothing lost");
    for (offset, bytes) in &central {
        assert_eq!(bytes.as_ref(), value(*offset).as_bytes());
    }
}
