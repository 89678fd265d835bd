//! A second log under one edge identity (a second device given the same
//! edge id, or a reflashed gateway with an empty data directory and its
//! old certificate) must not take the broker's records for its own.
//!
//! Edge A replicates 10 records and stops. Edge B, same certificate, empty
//! data directory, publishes 20 records at its own offsets 0..20. Before
//! the `Tip` check (FORMAT.md, "Replication stream") B waited until its log
//! passed the broker's high-water mark and then resumed at 10: the broker
//! acknowledged B's offsets 0..10 as duplicates of A's records, B counted
//! them acknowledged and would have deleted them. Now B finds that the
//! broker's last batch is not its own and stops: nothing of B's is
//! acknowledged, B keeps all 20 records and says why, the broker still
//! holds exactly A's 10 records, and A, coming back, carries on.

use std::process::Command;
use std::time::{Duration, Instant};

use tributary_test_support::ports::free_tcp;
use tributary_test_support::process::{Proc, bin_path};
use tributary_tests::cluster::Pair;

fn ndjson(prefix: &str, range: std::ops::Range<u64>) -> String {
    range
        .map(|i| format!("{{\"value\":\"{prefix}-{i}\"}}\n"))
        .collect()
}

#[test]
fn a_second_log_under_one_edge_id_stops_instead_of_losing_its_records() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut pair = Pair::new(dir.path(), "task_queue", None);
    pair.broker.start();
    pair.edge.start();
    pair.wait_for_edge();
    assert_eq!(pair.publish_ndjson(ndjson("A", 0..10)), Ok((0, 10)));
    pair.wait_acknowledged(10, Duration::from_secs(60));
    assert_eq!(pair.edge.terminate(), Some(0));

    // Device B: the same edge.toml (identity, certificate, broker), its own
    // empty data directory and local API.
    let b_api = free_tcp();
    let config = std::fs::read_to_string(dir.path().join("edge.toml")).expect("edge.toml");
    let b_config = dir.path().join("edge-b.toml");
    let config = config
        .replace(
            &format!("data_dir = \"{}\"", pair.edge_data.display()),
            &format!("data_dir = \"{}\"", dir.path().join("edge-b").display()),
        )
        .replace(
            &format!("local_api = \"{}\"", pair.edge_api),
            &format!("local_api = \"{b_api}\""),
        );
    assert!(config.contains("edge-b") && config.contains(&b_api.to_string()));
    std::fs::write(&b_config, config).expect("edge-b.toml");
    let log = dir.path().join("edge-b.log");
    let mut cmd = Command::new(bin_path("edge-agent"));
    cmd.arg("run")
        .arg("--config")
        .arg(&b_config)
        .env("RUST_LOG", "warn");
    let mut b = Proc::logged("edge-agent", cmd, &log).expect("log");
    b.start();
    let b_client = Pair::api_client(b_api);
    let deadline = Instant::now() + Duration::from_secs(30);
    while b_client.edge_offsets().is_none() {
        assert!(Instant::now() < deadline, "edge B's API not up");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(b_client.publish_ndjson(ndjson("B", 0..20)), Ok((0, 20)));

    // B's stream is retried every 5 s: within 20 s it has met the broker
    // with its 20 records and said why it stops.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("are not this edge's") {
            assert!(
                text.contains("offsets 0..10") && text.contains("same edge id"),
                "{text}"
            );
            break;
        }
        assert!(Instant::now() < deadline, "edge B never said why:\n{text}");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(
        b_client.edge_offsets(),
        Some((20, 0)),
        "nothing of B's is acknowledged; B keeps its 20 records"
    );
    assert_eq!(b.terminate(), Some(0));

    // The broker holds exactly A's records.
    let (records, gaps) = pair.consume_all("audit", 10);
    assert!(gaps.is_empty(), "{gaps:?}");
    let values: Vec<String> = records.values().cloned().collect();
    let expected: Vec<String> = (0..10).map(|i| format!("A-{i}")).collect();
    assert_eq!(values, expected);

    // A comes back and carries on: its own history passes the check.
    pair.edge.start();
    pair.wait_for_edge();
    assert_eq!(pair.publish_ndjson(ndjson("A", 10..15)), Ok((10, 15)));
    pair.wait_acknowledged(15, Duration::from_secs(60));
    let (records, gaps) = pair.consume_all("audit-again", 15);
    assert!(gaps.is_empty(), "{gaps:?}");
    let values: Vec<String> = records.values().cloned().collect();
    let expected: Vec<String> = (0..15).map(|i| format!("A-{i}")).collect();
    assert_eq!(values, expected);
    assert_eq!(pair.edge.terminate(), Some(0));
    assert_eq!(pair.broker.terminate(), Some(0));
}
