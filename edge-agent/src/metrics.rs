//! `GET /metrics`: the Prometheus text exposition format (version 0.0.4),
//! written by hand from [`AgentStats`].
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `tributary_edge_records_in_total` | counter | `topic` |
//! | `tributary_edge_bytes_in_total` | counter | `topic` |
//! | `tributary_edge_refused_records_total` | counter | `topic` (budget full) |
//! | `tributary_edge_dropped_records_total` | counter | `topic`, `reason` (`drop_oldest`, `ring_full`) |
//! | `tributary_edge_dropped_segments_total` | counter | `topic` |
//! | `tributary_edge_high_water_mark` | gauge | `topic` |
//! | `tributary_edge_acknowledged_offset` | gauge | `topic` |
//! | `tributary_edge_backlog_records` | gauge | `topic` |
//! | `tributary_edge_backlog_bytes` | gauge | `topic` |
//! | `tributary_edge_wal_bytes` | gauge | `topic` |
//! | `tributary_edge_disk_used_bytes` | gauge | `topic`, and one without labels for the agent |
//! | `tributary_edge_disk_budget_bytes` | gauge | `topic` where set, and one without labels where the agent budget is set |
//! | `tributary_edge_disk_full_total` | counter | `topic`: records refused with 507 `disk_full` (the file system holding the WAL was full) |
//! | `tributary_edge_wal_reopens_total` | counter | `topic`: times the WAL was reopened after a latched I/O failure |
//! | `tributary_edge_wal_fault` | gauge | `topic`, `state` (`disk_full`, `io_error`): 1 while the topic's WAL is latched in that state and the agent reopens it, else 0 (WAL topics) |
//! | `tributary_edge_disk_full_topics` | gauge | none: topics whose WAL is latched on a full disk now |
//! | `tributary_edge_unreadable_ranges` | gauge | `topic`: offset ranges the WAL cannot read (damaged bytes kept, or holes), WAL topics |
//! | `tributary_edge_unreadable_offsets` | gauge | `topic`: offsets inside them |
//! | `tributary_edge_replication_lag_records` | gauge | `topic` (WAL topics: high-water mark minus acknowledged offset) |
//! | `tributary_edge_replication_connects_total` | counter | none: QUIC connections to a broker made |
//! | `tributary_edge_replication_reconnects_total` | counter | none: connections after the first |
//! | `tributary_edge_replication_acks_total` | counter | `path`: `stream` or `datagram`, whichever copy of an acknowledgement arrived first (acknowledgements that advanced a topic's acknowledged offset) |
//! | `tributary_edge_replication_connections_lost_total` | counter | `reason`: `reset` (the broker restarted: stateless reset), `timed_out` (idle timeout), `closed` (closed by the broker), `other` |
//! | `tributary_edge_replication_raw_bytes_total` | counter | none: record batch bytes sent, before wire compression |
//! | `tributary_edge_replication_wire_bytes_total` | counter | none: batch frame bytes sent (after zstd) |
//! | `tributary_edge_replication_redirects_total` | counter | none: redirects to a topic's owner followed |
//! | `tributary_edge_replication_redirect_loops_total` | counter | none: topics held back after more than 4 redirects without a Welcome |
//! | `tributary_edge_unarchived_records` | gauge | `topic` (WAL topics: acknowledged offset minus archived offset) |
//!
//! Counters count since the agent started.

use std::fmt::Write as _;

use std::sync::atomic::Ordering;

use crate::manager::AgentStats;
use crate::recovery::FaultKind;
use crate::replicator::{LossReason, ReplicationStats};
use crate::topic::TopicStats;

/// The `Content-Type` of the exposition.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Escapes a label value (`\`, `"` and newline).
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

struct Family {
    name: &'static str,
    kind: &'static str,
    help: &'static str,
    value: fn(&TopicStats) -> Option<u64>,
}

const FAMILIES: &[Family] = &[
    Family {
        name: "tributary_edge_records_in_total",
        kind: "counter",
        help: "Records published to the topic.",
        value: |t| Some(t.records_in),
    },
    Family {
        name: "tributary_edge_bytes_in_total",
        kind: "counter",
        help: "Encoded record batch bytes published to the topic.",
        value: |t| Some(t.bytes_in),
    },
    Family {
        name: "tributary_edge_refused_records_total",
        kind: "counter",
        help: "Records refused because a disk budget was full.",
        value: |t| Some(t.refused_records),
    },
    Family {
        name: "tributary_edge_dropped_segments_total",
        kind: "counter",
        help: "WAL segments deleted by full_policy drop_oldest.",
        value: |t| Some(t.dropped_segments),
    },
    Family {
        name: "tributary_edge_high_water_mark",
        kind: "gauge",
        help: "Offset just past the last durable record.",
        value: |t| Some(t.high_water_mark),
    },
    Family {
        name: "tributary_edge_acknowledged_offset",
        kind: "gauge",
        help: "Next offset acknowledged by the broker (checkpoint).",
        value: |t| Some(t.acknowledged_offset),
    },
    Family {
        name: "tributary_edge_backlog_records",
        kind: "gauge",
        help: "Records held and not yet acknowledged by the broker.",
        value: |t| Some(t.backlog_records),
    },
    Family {
        name: "tributary_edge_backlog_bytes",
        kind: "gauge",
        help: "Bytes held and not yet acknowledged (whole WAL segments).",
        value: |t| Some(t.backlog_bytes),
    },
    Family {
        name: "tributary_edge_wal_bytes",
        kind: "gauge",
        help: "Bytes of the topic's WAL segment files.",
        value: |t| Some(t.wal_bytes),
    },
    Family {
        name: "tributary_edge_disk_full_total",
        kind: "counter",
        help: "Records refused with 507 disk_full: the file system holding the topic's WAL was full.",
        value: |t| (t.ring_capacity_records.is_none()).then_some(t.disk_full_records),
    },
    Family {
        name: "tributary_edge_wal_reopens_total",
        kind: "counter",
        help: "Times the topic's WAL was reopened after a latched I/O failure.",
        value: |t| (t.ring_capacity_records.is_none()).then_some(t.wal_reopens),
    },
    Family {
        name: "tributary_edge_unreadable_ranges",
        kind: "gauge",
        help: "Offset ranges the topic's WAL cannot read (damaged bytes it keeps, or holes); listed in /health and the topics API.",
        value: |t| (t.ring_capacity_records.is_none()).then_some(t.damaged_ranges.len() as u64),
    },
    Family {
        name: "tributary_edge_unreadable_offsets",
        kind: "gauge",
        help: "Offsets inside those ranges.",
        value: |t| {
            (t.ring_capacity_records.is_none())
                .then(|| t.damaged_ranges.iter().map(|r| r.len()).sum())
        },
    },
    Family {
        name: "tributary_edge_unarchived_records",
        kind: "gauge",
        help: "Records acknowledged by the broker but not yet reported archived (WAL topics): acknowledged offset minus archived offset; with retain_until = archived the edge keeps them.",
        value: |t| {
            (t.ring_capacity_records.is_none())
                .then(|| t.acknowledged_offset.saturating_sub(t.archived_offset))
        },
    },
    Family {
        name: "tributary_edge_replication_lag_records",
        kind: "gauge",
        help: "Records not yet acknowledged by the broker: high-water mark minus acknowledged offset (WAL topics).",
        value: |t| {
            (t.ring_capacity_records.is_none())
                .then(|| t.high_water_mark.saturating_sub(t.acknowledged_offset))
        },
    },
];

/// Appends the replicator's counters to `out` (Prometheus text).
pub fn render_replication(out: &mut String, stats: &ReplicationStats) {
    let connects = stats.connects.load(Ordering::Relaxed);
    for (name, help, value) in [
        (
            "tributary_edge_replication_connects_total",
            "QUIC connections made to a broker.",
            connects,
        ),
        (
            "tributary_edge_replication_reconnects_total",
            "Connections to a broker after the first (after an outage or error).",
            connects.saturating_sub(1),
        ),
        (
            "tributary_edge_replication_raw_bytes_total",
            "Record batch bytes sent to the broker, before wire compression.",
            stats.raw_bytes_sent.load(Ordering::Relaxed),
        ),
        (
            "tributary_edge_replication_wire_bytes_total",
            "Batch frame bytes sent to the broker (after zstd when smaller).",
            stats.wire_bytes_sent.load(Ordering::Relaxed),
        ),
        (
            "tributary_edge_replication_redirects_total",
            "Redirects to a topic's owner followed (a broker that does not own the topic named the one that does).",
            stats.redirects_followed.load(Ordering::Relaxed),
        ),
        (
            "tributary_edge_replication_redirect_loops_total",
            "Times a topic followed too many redirects without a Welcome and was held back.",
            stats.redirect_loops.load(Ordering::Relaxed),
        ),
    ] {
        header(out, name, "counter", help);
        sample(out, name, &[], value);
    }
    let name = "tributary_edge_replication_acks_total";
    header(
        out,
        name,
        "counter",
        "Acknowledgements that advanced a topic's acknowledged offset, by the copy that arrived first (Ack frame on the stream or QUIC datagram).",
    );
    for (path, value) in [
        ("stream", &stats.stream_acks),
        ("datagram", &stats.datagram_acks),
    ] {
        sample(out, name, &[("path", path)], value.load(Ordering::Relaxed));
    }
    let name = "tributary_edge_replication_connections_lost_total";
    header(
        out,
        name,
        "counter",
        "Established connections to a broker that ended, by reason.",
    );
    for reason in LossReason::ALL {
        let value = stats.connections_lost[reason as usize].load(Ordering::Relaxed);
        sample(out, name, &[("reason", reason.label())], value);
    }
}

/// Renders the exposition of `stats`.
pub fn render(stats: &AgentStats) -> String {
    let mut out = String::new();
    for family in FAMILIES {
        header(&mut out, family.name, family.kind, family.help);
        for topic in &stats.topics {
            if let Some(value) = (family.value)(topic) {
                sample(
                    &mut out,
                    family.name,
                    &[("topic", topic.name.as_str())],
                    value,
                );
            }
        }
    }
    let dropped = "tributary_edge_dropped_records_total";
    header(
        &mut out,
        dropped,
        "counter",
        "Records lost: dropped by drop_oldest before acknowledgement, or pushed out of a full realtime ring.",
    );
    for topic in &stats.topics {
        let reason = if topic.ring_capacity_records.is_some() {
            "ring_full"
        } else {
            "drop_oldest"
        };
        sample(
            &mut out,
            dropped,
            &[("topic", topic.name.as_str()), ("reason", reason)],
            topic.dropped_records,
        );
    }
    let fault = "tributary_edge_wal_fault";
    header(
        &mut out,
        fault,
        "gauge",
        "1 while the topic's WAL is latched after an I/O failure (state disk_full or io_error) and the agent reopens it.",
    );
    for topic in stats
        .topics
        .iter()
        .filter(|t| t.ring_capacity_records.is_none())
    {
        for state in [FaultKind::DiskFull, FaultKind::Io] {
            let value = u64::from(topic.wal_fault.as_ref().is_some_and(|f| f.state == state));
            sample(
                &mut out,
                fault,
                &[("topic", topic.name.as_str()), ("state", state.as_str())],
                value,
            );
        }
    }
    let full_topics = "tributary_edge_disk_full_topics";
    header(
        &mut out,
        full_topics,
        "gauge",
        "Topics whose WAL is latched on a full file system now.",
    );
    let full = stats
        .topics
        .iter()
        .filter(|t| {
            t.wal_fault
                .as_ref()
                .is_some_and(|f| f.state == FaultKind::DiskFull)
        })
        .count();
    sample(&mut out, full_topics, &[], full as u64);
    let used = "tributary_edge_disk_used_bytes";
    header(
        &mut out,
        used,
        "gauge",
        "Bytes counted against the disk budget (WAL bytes plus appends in flight).",
    );
    sample(&mut out, used, &[], stats.disk_used_bytes);
    for topic in &stats.topics {
        if topic.ring_capacity_records.is_none() {
            sample(
                &mut out,
                used,
                &[("topic", topic.name.as_str())],
                topic.disk_used_bytes,
            );
        }
    }
    let budget = "tributary_edge_disk_budget_bytes";
    header(&mut out, budget, "gauge", "Configured disk budget.");
    if let Some(limit) = stats.disk_budget_bytes {
        sample(&mut out, budget, &[], limit);
    }
    for topic in &stats.topics {
        if let Some(limit) = topic.disk_budget_bytes {
            sample(&mut out, budget, &[("topic", topic.name.as_str())], limit);
        }
    }
    out
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

fn sample(out: &mut String, name: &str, labels: &[(&str, &str)], value: u64) {
    out.push_str(name);
    if !labels.is_empty() {
        out.push('{');
        for (i, (key, value)) in labels.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            let _ = write!(out, "{key}=\"{}\"", escape(value));
        }
        out.push('}');
    }
    let _ = writeln!(out, " {value}");
}

#[cfg(test)]
mod tests {
    use tributary_proto::keys::TopicName;

    use crate::recovery::FaultReport;

    use super::*;

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

    #[test]
    fn renders_every_family_with_labels() {
        let stats = AgentStats {
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
        };
        let text = render(&stats);
        for line in [
            "# TYPE tributary_edge_records_in_total counter",
            "tributary_edge_records_in_total{topic=\"/e1/a\"} 10",
            "tributary_edge_bytes_in_total{topic=\"/e1/r\"} 1234",
            "tributary_edge_backlog_bytes{topic=\"/e1/a\"} 600",
            "tributary_edge_dropped_records_total{topic=\"/e1/a\",reason=\"drop_oldest\"} 3",
            "tributary_edge_dropped_records_total{topic=\"/e1/r\",reason=\"ring_full\"} 3",
            "tributary_edge_disk_used_bytes 1000",
            "tributary_edge_disk_used_bytes{topic=\"/e1/a\"} 1000",
            "tributary_edge_disk_budget_bytes 9000",
            "tributary_edge_disk_budget_bytes{topic=\"/e1/a\"} 5000",
            "tributary_edge_disk_full_total{topic=\"/e1/a\"} 0",
            "tributary_edge_disk_full_total{topic=\"/e1/f\"} 7",
            "tributary_edge_wal_reopens_total{topic=\"/e1/f\"} 2",
            "tributary_edge_wal_fault{topic=\"/e1/a\",state=\"disk_full\"} 0",
            "tributary_edge_wal_fault{topic=\"/e1/f\",state=\"disk_full\"} 1",
            "tributary_edge_wal_fault{topic=\"/e1/f\",state=\"io_error\"} 0",
            "tributary_edge_disk_full_topics 1",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
        assert!(!text.contains("tributary_edge_disk_used_bytes{topic=\"/e1/r\"}"));
        assert!(!text.contains("tributary_edge_disk_budget_bytes{topic=\"/e1/r\"}"));
        assert!(!text.contains("tributary_edge_wal_fault{topic=\"/e1/r\""));
        assert!(!text.contains("tributary_edge_disk_full_total{topic=\"/e1/r\""));
        // Every sample line is `name{labels} value` or `name value`.
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let value = line.rsplit_once(' ').map(|(_, v)| v).unwrap();
            assert!(value.parse::<u64>().is_ok(), "{line}");
        }
    }

    #[test]
    fn replication_counters_and_lag() {
        let stats = ReplicationStats::default();
        stats.connects.store(3, Ordering::Relaxed);
        stats.raw_bytes_sent.store(1000, Ordering::Relaxed);
        stats.wire_bytes_sent.store(400, Ordering::Relaxed);
        let mut text = String::new();
        render_replication(&mut text, &stats);
        for line in [
            "# TYPE tributary_edge_replication_connects_total counter",
            "tributary_edge_replication_connects_total 3",
            "tributary_edge_replication_reconnects_total 2",
            "tributary_edge_replication_raw_bytes_total 1000",
            "tributary_edge_replication_wire_bytes_total 400",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
        let agent = AgentStats {
            edge_id: "e1".into(),
            disk_budget_bytes: None,
            disk_used_bytes: 0,
            topics: vec![topic("/e1/a", false), topic("/e1/r", true)],
        };
        let text = render(&agent);
        assert!(
            text.lines()
                .any(|l| l == "tributary_edge_replication_lag_records{topic=\"/e1/a\"} 6"),
            "{text}"
        );
        assert!(!text.contains("tributary_edge_replication_lag_records{topic=\"/e1/r\"}"));
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
