//! Failover time and the edge disk that "two copies until archived" holds.
//!
//! ```text
//! cargo bench -p tributary-tests --bench failover            # 10 kills
//! cargo bench -p tributary-tests --bench failover -- 20      # 20 kills
//! ```
//! Builds the release `broker`, `edge-agent` and `tier-service` (a no-op
//! when fresh), then runs three brokers with a tier service beside each and
//! one edge on 127.0.0.1 with the default lease settings (`[cluster]`
//! lease 5 s, heartbeat 1 s, margin 1.5 s) and the default edge keep-alive
//! and idle timeout. The edge publishes an `event_stream` topic at a steady
//! rate (100 records of about 100 bytes every 20 ms: 5,000 records/s,
//! roughly the demo's replay rate per topic). Each round SIGKILLs the
//! topic's owner and measures the time from the kill to the first
//! acknowledgement the edge gets after it (from the new owner), then starts
//! the killed broker again and waits 10 s. Prints p50, p99 and max over the
//! rounds, and the edge's retained WAL bytes (what `retain_until =
//! "archived"` holds beyond the acknowledged offset) sampled every 500 ms.

use std::time::{Duration, Instant};

use tributary_tests::fleet::{Fleet, edge_get, edge_offsets, ndjson, publish_ndjson};

const TOPIC: &str = "/plant1/readings";

fn build() {
    if std::env::var_os("TRIBUTARY_BENCH_NO_BUILD").is_some() {
        return;
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = std::process::Command::new(cargo)
        .args([
            "build",
            "--release",
            "-p",
            "broker",
            "-p",
            "edge-agent",
            "-p",
            "tier-service",
        ])
        .status()
        .expect("run cargo");
    assert!(status.success(), "cargo build --release failed");
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn main() {
    let rounds: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(10);
    build();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut fleet = Fleet::new(dir.path(), &[(TOPIC, "event_stream")], "", "");
    fleet.start_all();
    let api = fleet.edge_api;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let publisher = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut next = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if let Ok((_, end)) = publish_ndjson(api, TOPIC, ndjson("r", next, 100)) {
                    next = end;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let sampler = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut retained = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if let Some(state) = edge_get(api, &format!("/v1/topics{TOPIC}")) {
                    retained.push(state["wal_bytes"].as_u64().unwrap_or(0));
                }
                std::thread::sleep(Duration::from_millis(500));
            }
            retained
        })
    };
    let acked = || edge_offsets(api, TOPIC).map_or(0, |(_, a)| a);
    let deadline = Instant::now() + Duration::from_secs(60);
    while acked() < 5_000 {
        assert!(
            Instant::now() < deadline,
            "nothing acknowledged within 60 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut times = Vec::new();
    let mut leader_times = Vec::new();
    for round in 0..rounds {
        let Some((owner, epoch)) = fleet.marked_owner(TOPIC) else {
            panic!("no owner marked");
        };
        // Whether the owner also leads Raft: its death then waits for an
        // election, and the new leader's wait before it takes topics over.
        let was_leader = fleet.raft_leader(owner) == Some(owner);
        let before = acked();
        fleet.node(owner).kill();
        let killed = Instant::now();
        loop {
            if acked() > before {
                break;
            }
            assert!(
                killed.elapsed() < Duration::from_secs(120),
                "no acknowledgement 120 s after the kill"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        let took = killed.elapsed();
        let new = fleet.marked_owner(TOPIC);
        eprintln!(
            "round {round}: killed broker {owner} (epoch {epoch}{}); first acknowledgement after {:.2} s; owner now {new:?}",
            if was_leader { ", the Raft leader" } else { "" },
            took.as_secs_f64()
        );
        times.push(took);
        if was_leader {
            leader_times.push(took);
        }
        fleet.node(owner).start();
        std::thread::sleep(Duration::from_secs(10));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    publisher.join().expect("publisher");
    let retained = sampler.join().expect("sampler");
    times.sort();
    println!(
        "failover over {} SIGKILLs of the owner: p50 {:.2} s, p99 {:.2} s, max {:.2} s (target p99 <= 10 s)",
        times.len(),
        percentile(&times, 0.5).as_secs_f64(),
        percentile(&times, 0.99).as_secs_f64(),
        times.last().map_or(0.0, Duration::as_secs_f64)
    );
    leader_times.sort();
    if let Some(max) = leader_times.last() {
        println!(
            "of which {} killed the Raft leader too: p50 {:.2} s, max {:.2} s",
            leader_times.len(),
            percentile(&leader_times, 0.5).as_secs_f64(),
            max.as_secs_f64()
        );
    }
    if !retained.is_empty() {
        let mut sorted = retained.clone();
        sorted.sort_unstable();
        println!(
            "edge WAL held at about 500 KB/s (5,000 records/s): median {:.1} MB, max {:.1} MB over {} samples",
            sorted[sorted.len() / 2] as f64 / 1e6,
            sorted[sorted.len() - 1] as f64 / 1e6,
            sorted.len()
        );
    }
    for node in &mut fleet.nodes {
        node.kill();
    }
    fleet.edge.kill();
}
