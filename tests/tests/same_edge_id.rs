//! Two logs under one edge identity: a second device given the same edge
//! id, or a gateway reflashed with its old certificate and an empty data
//! directory. Offsets alone cannot tell its records from the first log's;
//! before the `Tip` check (FORMAT.md, "Replication stream") such an edge
//! waited until its log passed the broker's high-water mark, then resumed
//! there, and the broker acknowledged its first records as "duplicates"
//! of the other log's, which the edge then deleted.
//!
//! - A new device that has published nothing when it first meets the
//!   broker has nothing the broker's records could shadow: its log
//!   continues at the broker's high-water mark, and what it publishes
//!   arrives after the first device's records (with a warning, which
//!   repeats if two live devices share the id). The first device, coming
//!   back with a record the broker does not hold, finds the broker's last
//!   batch is not its own and stops, keeping its record.
//! - A device that published before it could reach the broker (its records
//!   at offsets the broker already holds) stops the same way: nothing of
//!   it is acknowledged, and the broker keeps exactly the first log.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use tributary_test_support::ports::free_tcp;
use tributary_test_support::process::{Proc, bin_path};
use tributary_tests::cluster::{EdgeClient, Pair};
use tributary_tests::fleet::edge_get;

fn ndjson(prefix: &str, range: std::ops::Range<u64>) -> String {
    range
        .map(|i| format!("{{\"value\":\"{prefix}-{i}\"}}\n"))
        .collect()
}

/// An agent with the pair's identity, certificate and broker but its own
/// data directory and local API; its output goes to `{name}.log`.
struct Device {
    proc: Proc,
    api: EdgeClient,
    addr: SocketAddr,
    log: PathBuf,
}

impl Device {
    fn new(dir: &Path, pair: &Pair, name: &str) -> Device {
        let api: SocketAddr = free_tcp();
        let config = std::fs::read_to_string(dir.join("edge.toml")).expect("edge.toml");
        let config = config
            .replace(
                &format!("data_dir = \"{}\"", pair.edge_data.display()),
                &format!("data_dir = \"{}\"", dir.join(name).display()),
            )
            .replace(
                &format!("local_api = \"{}\"", pair.edge_api),
                &format!("local_api = \"{api}\""),
            );
        assert!(config.contains(name) && config.contains(&api.to_string()));
        let path = dir.join(format!("{name}.toml"));
        std::fs::write(&path, config).expect("device config");
        let log = dir.join(format!("{name}.log"));
        let mut cmd = Command::new(bin_path("edge-agent"));
        cmd.arg("run")
            .arg("--config")
            .arg(&path)
            .env("RUST_LOG", "warn");
        Device {
            proc: Proc::logged("edge-agent", cmd, &log).expect("log"),
            api: Pair::api_client(api),
            addr: api,
            log,
        }
    }

    fn start(&mut self) {
        self.proc.start();
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.api.edge_offsets().is_none() {
            assert!(Instant::now() < deadline, "device API not up");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits (20 s at most; streams are retried every 5 s) until the log
    /// says the broker's records are not this device's, and checks that
    /// `/health` reports the topic stopped with that reason.
    fn wait_diverged(&self, range: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let text = std::fs::read_to_string(&self.log).unwrap_or_default();
            if text.contains("are not this edge's") {
                assert!(
                    text.contains(&format!("offsets {range}")) && text.contains("same edge id"),
                    "{text}"
                );
                // /health says so too, for the topic.
                let health = edge_get(self.addr, "/health").expect("health");
                assert_eq!(health["status"], "degraded", "{health}");
                let reason = health["replication"]["topics"][0]["stopped"]["reason"]
                    .as_str()
                    .unwrap_or_default();
                assert!(reason.contains(&format!("offsets {range}")), "{health}");
                return;
            }
            assert!(Instant::now() < deadline, "never said why:\n{text}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn wait_offsets(&self, want: (u64, u64)) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.api.edge_offsets() != Some(want) {
            assert!(
                Instant::now() < deadline,
                "offsets {:?}, want {want:?}",
                self.api.edge_offsets()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// The broker's records, in offset order.
fn central(pair: &Pair, subscription: &str, end: u64) -> Vec<String> {
    let (records, gaps) = pair.consume_all(subscription, end);
    assert!(gaps.is_empty(), "{gaps:?}");
    assert_eq!(
        records.keys().copied().collect::<Vec<_>>(),
        (0..end).collect::<Vec<_>>()
    );
    records.into_values().collect()
}

fn values(parts: &[(&str, std::ops::Range<u64>)]) -> Vec<String> {
    parts
        .iter()
        .flat_map(|(p, r)| r.clone().map(move |i| format!("{p}-{i}")))
        .collect()
}

/// A pair's broker, started, and device A, stopped after its records
/// A-0..A-9 were acknowledged at offsets 0..10.
fn first_device(dir: &Path) -> (Pair, Device) {
    let mut pair = Pair::new(dir, "task_queue", None);
    pair.broker.start();
    let mut a = Device::new(dir, &pair, "device-a");
    a.start();
    assert_eq!(a.api.publish_ndjson(ndjson("A", 0..10)), Ok((0, 10)));
    a.wait_offsets((10, 10));
    assert_eq!(a.proc.terminate(), Some(0));
    (pair, a)
}

/// Device B, started while the pair's broker is down, publishes `batches`
/// (records B-0..B-19, one publish each); once the broker is back, B finds
/// the broker's last batch (A's, 0..10) is not its own, stops and keeps all
/// 20 records unacknowledged.
/// Each batch is `(first, end)`.
fn offline_device_stops(dir: &Path, pair: &mut Pair, batches: &[(u64, u64)]) {
    let mut b = Device::new(dir, pair, "device-b");
    b.start();
    for &(first, end) in batches {
        assert_eq!(
            b.api.publish_ndjson(ndjson("B", first..end)),
            Ok((first, end))
        );
    }
    pair.broker.start();
    b.wait_diverged("0..10");
    assert_eq!(
        b.api.edge_offsets(),
        Some((20, 0)),
        "nothing of B's is acknowledged; B keeps its 20 records"
    );
    assert_eq!(b.proc.terminate(), Some(0));
}

#[test]
fn a_new_device_under_an_existing_edge_id_continues_at_the_brokers_offset() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut pair, mut a) = first_device(dir.path());

    // B, empty: its log continues at the broker's 10 before it publishes,
    // and it is healthy (the offsets below are the broker's, not a loss).
    let mut b = Device::new(dir.path(), &pair, "device-b");
    b.start();
    b.wait_offsets((10, 10));
    assert_eq!(b.api.publish_ndjson(ndjson("B", 0..20)), Ok((10, 30)));
    b.wait_offsets((30, 30));
    let health = edge_get(b.addr, "/health").expect("health");
    assert_eq!(health["status"], "ok", "{health}");
    assert_eq!(b.proc.terminate(), Some(0));
    assert_eq!(
        central(&pair, "audit", 30),
        values(&[("A", 0..10), ("B", 0..20)])
    );

    let text = std::fs::read_to_string(&b.log).expect("log");
    assert!(
        text.contains("the log continues at the broker's high-water mark")
            && text.contains("from=0")
            && text.contains("to=10"),
        "{text}"
    );

    // A comes back with a record it published while the broker was down,
    // at its own offset 10: the broker's last batch (B's, 10..30) is not
    // A's. A stops and keeps it.
    pair.broker.kill();
    a.start();
    assert_eq!(a.api.publish_ndjson(ndjson("A", 10..11)), Ok((10, 11)));
    pair.broker.start();
    a.wait_diverged("10..30");
    assert_eq!(a.api.edge_offsets(), Some((11, 10)));
    assert_eq!(a.proc.terminate(), Some(0));
    assert_eq!(
        central(&pair, "audit-again", 30),
        values(&[("A", 0..10), ("B", 0..20)])
    );
    assert_eq!(pair.broker.terminate(), Some(0));
}

#[test]
fn a_device_that_published_before_meeting_the_broker_stops_and_keeps_its_records() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut pair, mut a) = first_device(dir.path());

    // B publishes 20 records while the broker is down, at offsets 0..20.
    pair.broker.kill();
    offline_device_stops(dir.path(), &mut pair, &[(0, 20)]);
    assert_eq!(central(&pair, "audit", 10), values(&[("A", 0..10)]));

    // A comes back and carries on: its own history passes the check.
    a.start();
    assert_eq!(a.api.publish_ndjson(ndjson("A", 10..15)), Ok((10, 15)));
    a.wait_offsets((15, 15));
    assert_eq!(a.proc.terminate(), Some(0));
    assert_eq!(central(&pair, "audit-again", 15), values(&[("A", 0..15)]));
    assert_eq!(pair.broker.terminate(), Some(0));
}

/// As above, but the broker already archived and trimmed the first log:
/// its WAL holds no record (an empty active segment at offset 10). The
/// last trimmed batch is kept (`wal.tip`), so the broker still shows it,
/// and B, whose offsets 0..20 cover it, still stops with nothing
/// acknowledged. Before, no `Tip` was sent and the broker acknowledged B's
/// records 0..10 as duplicates of A's.
#[test]
fn a_device_that_published_offline_stops_even_after_the_broker_trimmed_its_log() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut pair, _a) = first_device(dir.path());
    // Seal quiet segments after 300 ms and delete sealed segments (local
    // retention, no tier service) as soon as they exist.
    pair.broker.kill();
    let broker_toml = dir.path().join("broker.toml");
    let mut text = std::fs::read_to_string(&broker_toml).expect("broker.toml");
    text.push_str(
        "[wal]\nsegment_max_age_ms = 300\n[retention]\ninterval_ms = 200\nmax_age_ms = 1\n",
    );
    std::fs::write(&broker_toml, text).expect("broker.toml");
    pair.broker.start();
    pair.open_topic();
    let wal = pair.broker_data.join("topics/plant1/readings");
    let logs = || -> Vec<String> {
        std::fs::read_dir(&wal)
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.ends_with(".log"))
                    .collect()
            })
            .unwrap_or_default()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while logs() != vec![format!("{:020}.log", 10)] {
        assert!(Instant::now() < deadline, "never trimmed: {:?}", logs());
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(wal.join("wal.tip").exists());

    pair.broker.kill();
    // Two batches, the first ending where the broker's log ends: without
    // the check B would resume at 10 and lose 0..10.
    offline_device_stops(dir.path(), &mut pair, &[(0, 10), (10, 20)]);
    assert_eq!(logs(), vec![format!("{:020}.log", 10)]);
    assert_eq!(pair.broker.terminate(), Some(0));
}

/// POSTs NDJSON `body` to the device's implicit topic `/plant1/{topic}`
/// (no configuration: created by this publish); (base, next) offsets.
fn publish_implicit(addr: SocketAddr, topic: &str, body: String) -> (u64, u64) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(30)))
        .build()
        .into();
    let mut response = agent
        .post(format!("http://{addr}/v1/topics/plant1/{topic}/batch"))
        .header("content-type", "application/x-ndjson")
        .send(body)
        .expect("publish");
    let value: serde_json::Value = response.body_mut().read_json().expect("json");
    (
        value["base_offset"].as_u64().expect("base_offset"),
        value["next_offset"].as_u64().expect("next_offset"),
    )
}

/// (high-water mark, acknowledged offset) of `/plant1/{topic}` at the
/// device.
fn implicit_offsets(addr: SocketAddr, topic: &str) -> Option<(u64, u64)> {
    let state = edge_get(addr, &format!("/v1/topics/plant1/{topic}"))?;
    Some((
        state["high_water_mark"].as_u64()?,
        state["acknowledged_offset"].as_u64()?,
    ))
}

fn wait_implicit(addr: SocketAddr, topic: &str, want: (u64, u64)) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while implicit_offsets(addr, topic) != Some(want) {
        assert!(
            Instant::now() < deadline,
            "{topic}: offsets {:?}, want {want:?}",
            implicit_offsets(addr, topic)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A topic a device creates by publishing to it may exist centrally from
/// the device's earlier life (a gateway reflashed with its certificate, an
/// empty data directory): while a broker is connected, the first publish
/// waits for the stream's `Welcome`, so the log starts at the broker's
/// high-water mark and the record replicates. It was stored at offset 0,
/// which the broker held, and never left the device ("broker holds offsets
/// up to 2 but the local log ends at 1").
#[test]
fn a_reflashed_devices_first_publish_to_an_implicit_topic_continues_at_the_brokers_offset() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (pair, mut a) = first_device(dir.path());
    a.start();
    assert_eq!(publish_implicit(a.addr, "notes", ndjson("A", 0..2)), (0, 2));
    wait_implicit(a.addr, "notes", (2, 2));
    assert_eq!(a.proc.terminate(), Some(0));

    // Reflashed: device B, same identity, empty data directory, connected.
    let mut b = Device::new(dir.path(), &pair, "device-b");
    b.start();
    b.wait_offsets((10, 10));
    assert_eq!(publish_implicit(b.addr, "notes", ndjson("B", 0..1)), (2, 3));
    wait_implicit(b.addr, "notes", (3, 3));
    let health = edge_get(b.addr, "/health").expect("health");
    assert_eq!(health["status"], "ok", "{health}");
    assert_eq!(b.proc.terminate(), Some(0));
}
