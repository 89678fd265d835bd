//! An edge whose `brokers` are changed to another Tributary cluster under
//! the same CA (staging → production) must not take that cluster's
//! `Welcome`, `Ack` or `Archived` for the first one's: its checkpoints
//! count the first cluster's offsets. Before the cluster id (FORMAT.md,
//! "Cluster identity") an edge with nothing unacknowledged continued its
//! log at the other cluster's high-water mark and moved its checkpoint
//! there, and could trim below that cluster's archived offset.
//!
//! Here: an edge replicates A-0..A-9 to broker A (a single-node cluster);
//! broker B, another single-node cluster with certificates from the same
//! CA, already holds 30 records of the same topic from another device.
//! Pointed at B, the edge stops the topic with an error naming both
//! cluster ids: its WAL, checkpoint and `/edge/cluster` stay exactly as
//! they were, records published meanwhile stay unacknowledged, and B
//! receives nothing. Pointed back at A, it resumes and A holds A-0..A-14,
//! each once.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use broker_core::metadata::MetadataStore;
use serde_json::Value;
use tributary_test_support::ports::{free_tcp, free_udp};
use tributary_test_support::process::{Proc, bin_path, wait_for_tcp};
use tributary_tests::cluster::{EdgeClient, Pair, child_log_filter, metric_value, read_wal};
use tributary_tests::fleet::edge_get;

fn ndjson(prefix: &str, range: std::ops::Range<u64>) -> String {
    range
        .map(|i| format!("{{\"value\":\"{prefix}-{i}\"}}\n"))
        .collect()
}

fn values(prefix: &str, range: std::ops::Range<u64>) -> Vec<String> {
    range.map(|i| format!("{prefix}-{i}")).collect()
}

/// The cluster id `GET /v1/cluster/status` of the broker at `admin` shows,
/// waiting (30 s at most) until it has one.
fn cluster_id(admin: SocketAddr) -> String {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let status = agent
            .get(&format!("http://{admin}/v1/cluster/status"))
            .header("Authorization", "Bearer e2e-test-token")
            .call()
            .ok()
            .and_then(|mut r| r.body_mut().read_json::<Value>().ok());
        if let Some(id) = status
            .as_ref()
            .and_then(|s| s["cluster_id"].as_str().map(str::to_owned))
        {
            return id;
        }
        assert!(Instant::now() < deadline, "no cluster id: {status:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The edge's configuration with `brokers` naming `ingest` only.
fn point_edge_at(config: &Path, ingest: SocketAddr) {
    let text = std::fs::read_to_string(config).expect("edge.toml");
    let start = text.find("brokers = [").expect("brokers line");
    let end = start + text[start..].find('\n').expect("line end");
    let text = format!("{}brokers = [\"{ingest}\"]{}", &text[..start], &text[end..]);
    std::fs::write(config, text).expect("edge.toml");
}

/// File name → bytes of every file under `dir` (recursively) but the
/// WAL's sync mark (`wal.mark`, FORMAT.md "Sync mark"), which every start
/// rewrites with a new sequence number.
fn files(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).expect("read dir").flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.file_name().is_some_and(|n| n != "wal.mark") {
                let bytes = std::fs::read(&path).expect("read file");
                out.push((path.strip_prefix(dir).expect("under dir").into(), bytes));
            }
        }
    }
    out.sort();
    out
}

/// The values of `keys` in the edge's local metadata store (the agent must
/// be stopped).
fn edge_metadata(data: &Path, keys: &[&str]) -> Vec<Option<Value>> {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let store = broker_core::metadata::redb::RedbStore::open(
            data.join("metadata.redb"),
            std::sync::Arc::new(broker_core::clock::SystemClock),
        )
        .expect("open the edge's metadata");
        let mut out = Vec::new();
        for key in keys {
            out.push(store.get(key).await.expect("read"));
        }
        out
    })
}

fn wait_offsets(api: &EdgeClient, want: (u64, u64)) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while api.edge_offsets() != Some(want) {
        assert!(
            Instant::now() < deadline,
            "offsets {:?}, want {want:?}",
            api.edge_offsets()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn an_edge_pointed_at_another_cluster_stops_and_keeps_its_log_and_checkpoint() {
    let dir = tempfile::tempdir().expect("tempdir");
    let dir = dir.path();
    let mut pair = Pair::new(dir, "task_queue", None);
    let edge_config = dir.join("edge.toml");
    let ingest_a: SocketAddr = {
        let text = std::fs::read_to_string(&edge_config).expect("edge.toml");
        let start = text.find("brokers = [\"").expect("brokers") + 12;
        let end = start + text[start..].find('"').expect("quote");
        text[start..end].parse().expect("ingest address")
    };
    pair.broker.start();
    pair.edge.start();
    pair.wait_for_edge();
    assert_eq!(pair.publish_ndjson(ndjson("A", 0..10)), Ok((0, 10)));
    pair.wait_acknowledged(10, Duration::from_secs(30));
    let id_a = cluster_id(pair.broker_admin);
    assert_eq!(pair.edge.terminate(), Some(0));

    // Broker B: another single-node cluster, same CA, holding 30 records
    // of /plant1/readings from another device.
    let (ingest_b, admin_b, data_b) = (free_udp(), free_tcp(), dir.join("broker-b"));
    let config_b = dir.join("broker-b.toml");
    tributary_tests::solo::write_single_node_config(
        &config_b,
        &data_b,
        admin_b,
        ingest_b,
        &dir.join("certs"),
        "",
    );
    let mut command = Command::new(bin_path("broker"));
    command
        .arg("--config")
        .arg(&config_b)
        .env("RUST_LOG", child_log_filter());
    let mut broker_b = Proc::new("broker", command);
    broker_b.start();
    wait_for_tcp("broker B", admin_b, Duration::from_secs(30));
    let other_api = free_tcp();
    let other_config = dir.join("other.toml");
    let text = std::fs::read_to_string(&edge_config)
        .expect("edge.toml")
        .replace(
            &pair.edge_data.display().to_string(),
            &dir.join("other").display().to_string(),
        )
        .replace(&pair.edge_api.to_string(), &other_api.to_string());
    std::fs::write(&other_config, text).expect("other.toml");
    point_edge_at(&other_config, ingest_b);
    let mut command = Command::new(bin_path("edge-agent"));
    command
        .arg("run")
        .arg("--config")
        .arg(&other_config)
        .env("RUST_LOG", child_log_filter());
    let mut other = Proc::new("edge-agent", command);
    other.start();
    let other_client = Pair::api_client(other_api);
    wait_offsets(&other_client, (0, 0));
    for first in [0, 10, 20] {
        assert_eq!(
            other_client.publish_ndjson(ndjson("O", first..first + 10)),
            Ok((first, first + 10))
        );
    }
    wait_offsets(&other_client, (30, 30));
    assert_eq!(other.terminate(), Some(0));
    let id_b = cluster_id(admin_b);
    assert_ne!(id_a, id_b, "two clusters, two ids");

    // The edge as it stands: 10 records, all acknowledged by A.
    let wal_dir = pair.edge_data.join("topics/plant1/readings");
    let wal_before = files(&wal_dir);
    assert!(
        wal_before
            .iter()
            .any(|(name, _)| name.as_os_str() == "00000000000000000000.log"),
        "{:?}",
        wal_before.iter().map(|(n, _)| n).collect::<Vec<_>>()
    );
    let metadata_keys = [
        "/edge/checkpoints/plant1/readings",
        "/edge/archived/plant1/readings",
        "/edge/cluster",
    ];
    let metadata_before = edge_metadata(&pair.edge_data, &metadata_keys);
    assert_eq!(
        metadata_before,
        vec![Some(Value::from(10)), None, Some(Value::from(id_a.clone()))]
    );

    // Pointed at B: the stream stops before B's Welcome.
    point_edge_at(&edge_config, ingest_b);
    pair.edge.start();
    pair.wait_for_edge();
    let deadline = Instant::now() + Duration::from_secs(30);
    let reason = loop {
        let health = edge_get(pair.edge_api, "/health").expect("health");
        if let Some(reason) = health["replication"]["topics"][0]["stopped"]["reason"].as_str() {
            assert_eq!(health["status"], "degraded", "{health}");
            assert_eq!(
                health["replication"]["cluster_id"],
                id_a.as_str(),
                "{health}"
            );
            break reason.to_owned();
        }
        assert!(Instant::now() < deadline, "never stopped: {health}");
        std::thread::sleep(Duration::from_millis(100));
    };
    println!("the edge's error: {reason}");
    assert!(
        reason.contains(&format!("belongs to cluster {id_b}"))
            && reason.contains(&format!("came from cluster {id_a}"))
            && reason.contains("Point `brokers` back")
            && reason.contains("fresh data directory"),
        "{reason}"
    );
    let metrics =
        tributary_tests::cluster::try_scrape(&format!("http://{}/metrics", pair.edge_api))
            .expect("metrics");
    assert!(
        metric_value(
            &metrics,
            "tributary_edge_replication_cluster_mismatches_total"
        )
        .is_some_and(|n| n >= 1),
        "{metrics}"
    );
    assert_eq!(pair.edge_offsets(), Some((10, 10)));
    assert_eq!(pair.edge.terminate(), Some(0));
    assert_eq!(files(&wal_dir), wal_before, "the WAL is untouched");
    assert_eq!(
        read_wal(&wal_dir)
            .into_iter()
            .map(|(offset, value)| (offset, String::from_utf8_lossy(&value).into_owned()))
            .collect::<Vec<_>>(),
        (0..10).zip(values("A", 0..10)).collect::<Vec<_>>()
    );
    assert_eq!(
        edge_metadata(&pair.edge_data, &metadata_keys),
        metadata_before
    );

    // Records published while pointed at B stay unacknowledged (the
    // stream is retried every 5 s: wait past a retry).
    pair.edge.start();
    pair.wait_for_edge();
    assert_eq!(pair.publish_ndjson(ndjson("A", 10..15)), Ok((10, 15)));
    std::thread::sleep(Duration::from_secs(7));
    assert_eq!(pair.edge_offsets(), Some((15, 10)));
    assert_eq!(pair.edge.terminate(), Some(0));
    assert_eq!(
        edge_metadata(&pair.edge_data, &metadata_keys),
        metadata_before
    );

    // B got nothing from this edge: exactly the other device's 30 records.
    assert_eq!(broker_b.terminate(), Some(0));
    let central_b: Vec<(u64, String)> = read_wal(&data_b.join("topics/plant1/readings"))
        .into_iter()
        .map(|(offset, value)| (offset, String::from_utf8_lossy(&value).into_owned()))
        .collect();
    assert_eq!(
        central_b,
        (0..30)
            .zip(values("O", 0..30))
            .collect::<Vec<(u64, String)>>()
    );

    // Back at A: it resumes, and A holds A-0..A-14, each once.
    point_edge_at(&edge_config, ingest_a);
    pair.edge.start();
    pair.wait_for_edge();
    pair.wait_acknowledged(15, Duration::from_secs(30));
    let health = edge_get(pair.edge_api, "/health").expect("health");
    assert!(
        health["replication"]["topics"][0]["stopped"].is_null(),
        "{health}"
    );
    assert_eq!(pair.edge.terminate(), Some(0));
    let (records, gaps) = pair.consume_all("check", 15);
    assert!(gaps.is_empty(), "{gaps:?}");
    assert_eq!(
        records.into_iter().collect::<Vec<_>>(),
        (0..15)
            .zip(values("A", 0..15))
            .collect::<Vec<(u64, String)>>()
    );
    assert_eq!(pair.broker.terminate(), Some(0));
}
