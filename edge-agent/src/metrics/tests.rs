//! The edge's exposition: every family with its `edge` (and `topic`)
//! labels, agent-wide and per-topic disk families apart, OpenMetrics text
//! the shared checker accepts.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tributary_proto::keys::TopicName;
use tributary_test_support::openmetrics;

use super::*;
use crate::recovery::FaultReport;
use crate::replicator::stages::Stage;

fn topic(name: &str, ring: bool) -> TopicStats {
    TopicStats {
        name: TopicName::new(name).unwrap(),
        intent: None,
        delivery: "NonReliable",
        wal_sync_mode: "os_cache_flush",
        persistence: if ring { "in_memory" } else { "wal" },
        implicit: true,
        high_water_mark: 10,
        log_start_offset: 2,
        acknowledged_offset: 4,
        archived_offset: 0,
        retain_until: "archived",
        backlog_records: 6,
        backlog_bytes: 600,
        wal_bytes: 1000,
        disk_used_bytes: 1000,
        disk_budget_bytes: (!ring).then_some(5000),
        full_policy: None,
        ring_capacity_records: ring.then_some(8),
        records_in: 10,
        bytes_in: 1234,
        refused_records: 1,
        dropped_records: 3,
        dropped_segments: 0,
        recent_dropped_ranges: vec![],
        disk_full_records: 0,
        wal_reopens: 0,
        wal_fault: None,
        damaged_ranges: Vec::new(),
    }
}

fn stats() -> AgentStats {
    AgentStats {
        edge_id: "e1".into(),
        disk_budget_bytes: Some(9000),
        disk_used_bytes: 1000,
        topics: vec![topic("/e1/a", false), topic("/e1/r", true), {
            let mut full = topic("/e1/f", false);
            full.disk_full_records = 7;
            full.wal_reopens = 2;
            full.wal_fault = Some(FaultReport {
                state: FaultKind::DiskFull,
                path: "/data/topics/e1/f".into(),
                error: "No space left on device (os error 28)".into(),
                failed_reopens: 1,
            });
            full
        }],
    }
}

fn render(
    stats: &AgentStats,
    replication: Option<(&ReplicationStats, Option<&StallReport>)>,
) -> String {
    let mut out = Exposition::new(&stats.edge_id);
    add_agent(&mut out, stats);
    if let Some((r, stall)) = replication {
        add_replication(&mut out, r, stall);
    }
    out.finish()
}

#[test]
fn renders_every_family_with_edge_and_topic_labels() {
    let text = render(&stats(), None);
    for line in [
        "# TYPE tributary_edge_records_in counter",
        "tributary_edge_records_in_total{edge=\"e1\",topic=\"/e1/a\"} 10",
        "tributary_edge_bytes_in_total{edge=\"e1\",topic=\"/e1/r\"} 1234",
        "tributary_edge_backlog_bytes{edge=\"e1\",topic=\"/e1/a\"} 600",
        "tributary_edge_dropped_records_total{edge=\"e1\",topic=\"/e1/a\",reason=\"drop_oldest\"} 3",
        "tributary_edge_dropped_records_total{edge=\"e1\",topic=\"/e1/r\",reason=\"ring_full\"} 3",
        "tributary_edge_disk_used_bytes{edge=\"e1\"} 1000",
        "tributary_edge_topic_disk_used_bytes{edge=\"e1\",topic=\"/e1/a\"} 1000",
        "tributary_edge_disk_budget_bytes{edge=\"e1\"} 9000",
        "tributary_edge_topic_disk_budget_bytes{edge=\"e1\",topic=\"/e1/a\"} 5000",
        "tributary_edge_disk_full_total{edge=\"e1\",topic=\"/e1/a\"} 0",
        "tributary_edge_disk_full_total{edge=\"e1\",topic=\"/e1/f\"} 7",
        "tributary_edge_wal_reopens_total{edge=\"e1\",topic=\"/e1/f\"} 2",
        "tributary_edge_wal_fault{edge=\"e1\",topic=\"/e1/a\",state=\"disk_full\"} 0",
        "tributary_edge_wal_fault{edge=\"e1\",topic=\"/e1/f\",state=\"disk_full\"} 1",
        "tributary_edge_wal_fault{edge=\"e1\",topic=\"/e1/f\",state=\"io_error\"} 0",
        "tributary_edge_disk_full_topics{edge=\"e1\"} 1",
        "tributary_edge_replication_lag_records{edge=\"e1\",topic=\"/e1/a\"} 6",
        "# EOF",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in\n{text}"
        );
    }
    for absent in [
        "tributary_edge_topic_disk_used_bytes{edge=\"e1\",topic=\"/e1/r\"}",
        "tributary_edge_topic_disk_budget_bytes{edge=\"e1\",topic=\"/e1/r\"}",
        "tributary_edge_wal_fault{edge=\"e1\",topic=\"/e1/r\"",
        "tributary_edge_disk_full_total{edge=\"e1\",topic=\"/e1/r\"",
        "tributary_edge_replication_lag_records{edge=\"e1\",topic=\"/e1/r\"}",
    ] {
        assert!(!text.contains(absent), "{absent} in\n{text}");
    }
    // The shared checker: OpenMetrics, HELP sentences, one label set per
    // family (the disk families no longer mix totals and topics).
    let families = openmetrics::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let used = &families["tributary_edge_disk_used_bytes"];
    assert_eq!(used.samples.len(), 1, "agent-wide only");
    assert_eq!(
        families["tributary_edge_topic_disk_used_bytes"]
            .samples
            .iter()
            .map(|s| s.2)
            .sum::<f64>(),
        2000.0,
        "sum() over topics counts each topic once"
    );
}

#[test]
fn replication_counters_stall_and_connection() {
    let stats = ReplicationStats::default();
    stats.connects.store(3, Ordering::Relaxed);
    stats.raw_bytes_sent.store(1000, Ordering::Relaxed);
    stats.wire_bytes_sent.store(400, Ordering::Relaxed);
    stats
        .stages
        .observe(Stage::Ack, Duration::from_micros(1500));
    stats.stages.observe(Stage::Ack, Duration::from_micros(500));
    stats.stages.observe(Stage::Read, Duration::from_secs(20));
    let stall = StallReport {
        stalled_for: Duration::from_millis(2500),
        unhealthy: true,
        reasons: vec!["no connection to any broker for 2 s".into()],
    };
    let agent = AgentStats {
        edge_id: "e1".into(),
        disk_budget_bytes: None,
        disk_used_bytes: 0,
        topics: vec![topic("/e1/a", false)],
    };
    let text = render(&agent, Some((&stats, Some(&stall))));
    for line in [
        "# TYPE tributary_edge_replication_connects counter",
        "tributary_edge_replication_connects_total{edge=\"e1\"} 3",
        "tributary_edge_replication_reconnects_total{edge=\"e1\"} 2",
        "tributary_edge_replication_raw_bytes_total{edge=\"e1\"} 1000",
        "tributary_edge_replication_wire_bytes_total{edge=\"e1\"} 400",
        "tributary_edge_replication_acks_total{edge=\"e1\",path=\"stream\"} 0",
        "tributary_edge_replication_connections_lost_total{edge=\"e1\",reason=\"timed_out\"} 0",
        "tributary_edge_replication_connected{edge=\"e1\"} 0",
        "tributary_edge_replication_stalled_seconds{edge=\"e1\"} 2.5",
        "# TYPE tributary_edge_replication_stage_seconds histogram",
        "tributary_edge_replication_stage_seconds_count{edge=\"e1\",stage=\"ack\"} 2",
        "tributary_edge_replication_stage_seconds_sum{edge=\"e1\",stage=\"ack\"} 0.002",
        "tributary_edge_replication_stage_seconds_bucket{le=\"0.001\",edge=\"e1\",stage=\"ack\"} 1",
        "tributary_edge_replication_stage_seconds_bucket{le=\"0.002\",edge=\"e1\",stage=\"ack\"} 2",
        "tributary_edge_replication_stage_seconds_bucket{le=\"10.0\",edge=\"e1\",stage=\"read\"} 0",
        "tributary_edge_replication_stage_seconds_bucket{le=\"+Inf\",edge=\"e1\",stage=\"read\"} 1",
        "tributary_edge_replication_stage_seconds_count{edge=\"e1\",stage=\"send\"} 0",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in\n{text}"
        );
    }
    assert!(
        !text.contains("tributary_edge_disk_budget_bytes{"),
        "no agent budget, no sample"
    );
    openmetrics::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    // Without replication configured: no stall families.
    let text = render(&agent, Some((&stats, None)));
    assert!(!text.contains("tributary_edge_replication_stalled_seconds"));
}

#[test]
fn label_values_are_escaped() {
    let mut out = Exposition::new("e\"1");
    out.gauge(
        "tributary_edge_x",
        "A test gauge for escaping.",
        [(out.labels(&[]), 1)],
    );
    let text = out.finish();
    assert!(
        text.contains("tributary_edge_x{edge=\"e\\\"1\"} 1"),
        "{text}"
    );
}
