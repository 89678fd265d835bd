//! `GET /metrics`: OpenMetrics 1.0 text (`prometheus-client`, the same
//! encoder as the broker's and the tier service's), built at scrape time
//! from [`AgentStats`], the replicator's counters, the replication stall
//! ([`crate::health`]) and the MQTT counters. Every series carries the
//! label `edge` (the edge id); per-topic series also `topic`. A family is
//! either agent-wide or per topic, never both, so `sum()` over one never
//! double-counts. Counters count since the agent started; their samples
//! end in `_total`.
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `tributary_edge_records_in_total` | counter | `edge`, `topic` |
//! | `tributary_edge_bytes_in_total` | counter | `edge`, `topic` |
//! | `tributary_edge_refused_records_total` | counter | `edge`, `topic` (budget full) |
//! | `tributary_edge_dropped_records_total` | counter | `edge`, `topic`, `reason` (`drop_oldest`, `ring_full`) |
//! | `tributary_edge_dropped_segments_total` | counter | `edge`, `topic` |
//! | `tributary_edge_high_water_mark` | gauge | `edge`, `topic` |
//! | `tributary_edge_acknowledged_offset` | gauge | `edge`, `topic` |
//! | `tributary_edge_backlog_records` | gauge | `edge`, `topic` |
//! | `tributary_edge_backlog_bytes` | gauge | `edge`, `topic` |
//! | `tributary_edge_wal_bytes` | gauge | `edge`, `topic` |
//! | `tributary_edge_topic_disk_used_bytes` | gauge | `edge`, `topic` (WAL topics) |
//! | `tributary_edge_topic_disk_budget_bytes` | gauge | `edge`, `topic` where the topic has its own budget |
//! | `tributary_edge_disk_used_bytes` | gauge | `edge`: bytes counted against the agent's budget, all topics |
//! | `tributary_edge_disk_budget_bytes` | gauge | `edge`, where the agent budget is set |
//! | `tributary_edge_disk_full_total` | counter | `edge`, `topic`: records refused with 507 `disk_full` |
//! | `tributary_edge_wal_reopens_total` | counter | `edge`, `topic` |
//! | `tributary_edge_wal_fault` | gauge | `edge`, `topic`, `state` (`disk_full`, `io_error`) |
//! | `tributary_edge_disk_full_topics` | gauge | `edge` |
//! | `tributary_edge_unreadable_ranges` | gauge | `edge`, `topic` |
//! | `tributary_edge_unreadable_offsets` | gauge | `edge`, `topic` |
//! | `tributary_edge_unarchived_records` | gauge | `edge`, `topic` |
//! | `tributary_edge_replication_lag_records` | gauge | `edge`, `topic` (WAL topics: high-water mark minus acknowledged offset) |
//! | `tributary_edge_replication_connected` | gauge | `edge`: 1 while a broker connection is open |
//! | `tributary_edge_replication_stalled_seconds` | gauge | `edge`: how long nothing could leave the device (0 when replicating) |
//! | `tributary_edge_replication_connects_total` | counter | `edge` |
//! | `tributary_edge_replication_reconnects_total` | counter | `edge` |
//! | `tributary_edge_replication_acks_total` | counter | `edge`, `path` (`stream`, `datagram`) |
//! | `tributary_edge_replication_connections_lost_total` | counter | `edge`, `reason` (`reset`, `timed_out`, `closed`, `other`) |
//! | `tributary_edge_replication_raw_bytes_total` | counter | `edge` |
//! | `tributary_edge_replication_wire_bytes_total` | counter | `edge` |
//! | `tributary_edge_replication_redirects_total` | counter | `edge` |
//! | `tributary_edge_replication_redirect_loops_total` | counter | `edge` |
//! | `tributary_edge_replication_cluster_mismatches_total` | counter | `edge`: streams stopped because the broker belongs to another cluster than the one the checkpoints came from |
//! | `tributary_edge_replication_stage_seconds` | histogram | `edge`, `stage` (`read`, `compress`, `queue`, `send`, `ack`: where a batch spent its time, [`crate::replicator::stages`]) |
//! | `tributary_edge_mqtt_*` | counter, gauge | `edge` (`qos` on `publishes`; [`crate::mqtt::MqttStats`]) |

use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::health::StallReport;
use crate::manager::AgentStats;
use crate::recovery::FaultKind;
use crate::replicator::{LossReason, ReplicationStats};
use crate::topic::TopicStats;

/// The `Content-Type` of the exposition (OpenMetrics 1.0 text), as the
/// broker and the tier service serve it.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A series' labels, in order (`edge` first).
pub type Labels = Vec<(&'static str, String)>;

/// The families of one scrape, labelled with one edge id.
pub struct Exposition {
    registry: Registry,
    edge: String,
}

impl Exposition {
    /// An empty exposition for edge `edge`.
    pub fn new(edge: &str) -> Exposition {
        Exposition {
            registry: Registry::default(),
            edge: edge.to_owned(),
        }
    }

    /// `edge` plus `extra`.
    pub fn labels(&self, extra: &[(&'static str, &str)]) -> Labels {
        let mut labels = Vec::with_capacity(1 + extra.len());
        labels.push(("edge", self.edge.clone()));
        labels.extend(extra.iter().map(|(k, v)| (*k, (*v).to_owned())));
        labels
    }

    /// A gauge family `name` with `samples`.
    pub fn gauge(
        &mut self,
        name: &str,
        help: &str,
        samples: impl IntoIterator<Item = (Labels, u64)>,
    ) {
        let family = Family::<Labels, Gauge<u64, AtomicU64>>::default();
        for (labels, value) in samples {
            family.get_or_create(&labels).set(value);
        }
        self.registry
            .register(name, help.trim_end_matches('.'), family);
    }

    /// A gauge family `name` of fractional values.
    pub fn gauge_f64(
        &mut self,
        name: &str,
        help: &str,
        samples: impl IntoIterator<Item = (Labels, f64)>,
    ) {
        let family = Family::<Labels, Gauge<f64, AtomicU64>>::default();
        for (labels, value) in samples {
            family.get_or_create(&labels).set(value);
        }
        self.registry
            .register(name, help.trim_end_matches('.'), family);
    }

    /// A counter family; `name` without `_total` (the samples get it).
    pub fn counter(
        &mut self,
        name: &str,
        help: &str,
        samples: impl IntoIterator<Item = (Labels, u64)>,
    ) {
        let family = Family::<Labels, Counter<u64>>::default();
        for (labels, value) in samples {
            family
                .get_or_create(&labels)
                .inner()
                .store(value, Ordering::Relaxed);
        }
        self.registry
            .register(name, help.trim_end_matches('.'), family);
    }

    /// A histogram family `name` of live histograms (handles sharing the
    /// counts of the ones observed into; nothing is copied).
    pub fn histogram(
        &mut self,
        name: &str,
        help: &str,
        series: impl IntoIterator<Item = (Labels, Histogram)>,
    ) {
        self.registry.register_collector(Box::new(HistogramFamily {
            name: name.to_owned(),
            help: help.to_owned(),
            series: series.into_iter().collect(),
        }));
    }

    /// The text (ends with `# EOF`).
    pub fn finish(self) -> String {
        let mut out = String::new();
        // Writing into a String does not fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

/// Histograms that live outside the scrape's registry (a `Family` only
/// holds histograms it created), encoded as one family.
#[derive(Debug)]
struct HistogramFamily {
    name: String,
    help: String,
    series: Vec<(Labels, Histogram)>,
}

impl Collector for HistogramFamily {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut family =
            encoder.encode_descriptor(&self.name, &self.help, None, MetricType::Histogram)?;
        for (labels, histogram) in &self.series {
            histogram.encode(family.encode_family(labels)?)?;
        }
        Ok(())
    }
}

/// A per-topic family: its kind, name, help and value (`None`: no sample
/// for that topic).
struct TopicFamily {
    counter: bool,
    name: &'static str,
    help: &'static str,
    value: fn(&TopicStats) -> Option<u64>,
}

const fn wal_only(t: &TopicStats) -> bool {
    t.ring_capacity_records.is_none()
}

const TOPIC_FAMILIES: &[TopicFamily] = &[
    TopicFamily {
        counter: true,
        name: "tributary_edge_records_in",
        help: "Records published to the topic.",
        value: |t| Some(t.records_in),
    },
    TopicFamily {
        counter: true,
        name: "tributary_edge_bytes_in",
        help: "Encoded record batch bytes published to the topic.",
        value: |t| Some(t.bytes_in),
    },
    TopicFamily {
        counter: true,
        name: "tributary_edge_refused_records",
        help: "Records refused because a disk budget was full.",
        value: |t| Some(t.refused_records),
    },
    TopicFamily {
        counter: true,
        name: "tributary_edge_dropped_segments",
        help: "WAL segments deleted by full_policy drop_oldest.",
        value: |t| Some(t.dropped_segments),
    },
    TopicFamily {
        counter: false,
        name: "tributary_edge_high_water_mark",
        help: "Offset just past the topic's last durable record.",
        value: |t| Some(t.high_water_mark),
    },
    TopicFamily {
        counter: false,
        name: "tributary_edge_acknowledged_offset",
        help: "Next offset the broker has acknowledged for the topic (its checkpoint).",
        value: |t| Some(t.acknowledged_offset),
    },
    TopicFamily {
        counter: false,
        name: "tributary_edge_backlog_records",
        help: "Records the topic holds that the broker has not acknowledged yet.",
        value: |t| Some(t.backlog_records),
    },
    TopicFamily {
        counter: false,
        name: "tributary_edge_backlog_bytes",
        help: "Bytes the topic holds that the broker has not acknowledged yet, in whole WAL segments.",
        value: |t| Some(t.backlog_bytes),
    },
    TopicFamily {
        counter: false,
        name: "tributary_edge_wal_bytes",
        help: "Bytes of the topic's WAL segment files.",
        value: |t| Some(t.wal_bytes),
    },
    TopicFamily {
        counter: false,
        name: "tributary_edge_topic_disk_used_bytes",
        help: "Bytes the topic counts against the disk budgets: its WAL bytes plus appends in flight.",
        value: |t| wal_only(t).then_some(t.disk_used_bytes),
    },
    TopicFamily {
        counter: false,
        name: "tributary_edge_topic_disk_budget_bytes",
        help: "The topic's own disk budget in bytes, where one is configured.",
        value: |t| t.disk_budget_bytes,
    },
    TopicFamily {
        counter: true,
        name: "tributary_edge_disk_full",
        help: "Records refused with 507 disk_full because the file system holding the topic's WAL was full.",
        value: |t| wal_only(t).then_some(t.disk_full_records),
    },
    TopicFamily {
        counter: true,
        name: "tributary_edge_wal_reopens",
        help: "Times the topic's WAL was reopened after a latched I/O failure.",
        value: |t| wal_only(t).then_some(t.wal_reopens),
    },
    TopicFamily {
        counter: false,
        name: "tributary_edge_unreadable_ranges",
        help: "Offset ranges the topic's WAL cannot read (damaged bytes it keeps, or holes), as listed in /health.",
        value: |t| wal_only(t).then_some(t.damaged_ranges.len() as u64),
    },
    TopicFamily {
        counter: false,
        name: "tributary_edge_unreadable_offsets",
        help: "Offsets inside the topic's unreadable ranges.",
        value: |t| wal_only(t).then(|| t.damaged_ranges.iter().map(|r| r.len()).sum()),
    },
    TopicFamily {
        counter: false,
        name: "tributary_edge_unarchived_records",
        help: "Records the broker acknowledged but has not reported archived yet; with retain_until = archived the edge keeps them.",
        value: |t| wal_only(t).then(|| t.acknowledged_offset.saturating_sub(t.archived_offset)),
    },
    TopicFamily {
        counter: false,
        name: "tributary_edge_replication_lag_records",
        help: "Records not yet acknowledged by the broker: the topic's high-water mark minus its acknowledged offset.",
        value: |t| wal_only(t).then(|| t.high_water_mark.saturating_sub(t.acknowledged_offset)),
    },
];

/// Adds the families of `stats` (topics and the agent's disk budget).
pub fn add_agent(out: &mut Exposition, stats: &AgentStats) {
    for family in TOPIC_FAMILIES {
        let samples: Vec<(Labels, u64)> = stats
            .topics
            .iter()
            .filter_map(|t| {
                let value = (family.value)(t)?;
                Some((out.labels(&[("topic", t.name.as_str())]), value))
            })
            .collect();
        if family.counter {
            out.counter(family.name, family.help, samples);
        } else {
            out.gauge(family.name, family.help, samples);
        }
    }
    let dropped: Vec<(Labels, u64)> = stats
        .topics
        .iter()
        .map(|t| {
            let reason = if t.ring_capacity_records.is_some() {
                "ring_full"
            } else {
                "drop_oldest"
            };
            (
                out.labels(&[("topic", t.name.as_str()), ("reason", reason)]),
                t.dropped_records,
            )
        })
        .collect();
    out.counter(
        "tributary_edge_dropped_records",
        "Records lost: dropped by drop_oldest before acknowledgement, or pushed out of a full realtime ring.",
        dropped,
    );
    let mut faults = Vec::new();
    for t in stats.topics.iter().filter(|t| wal_only(t)) {
        for state in [FaultKind::DiskFull, FaultKind::Io] {
            let on = t.wal_fault.as_ref().is_some_and(|f| f.state == state);
            faults.push((
                out.labels(&[("topic", t.name.as_str()), ("state", state.as_str())]),
                u64::from(on),
            ));
        }
    }
    out.gauge(
        "tributary_edge_wal_fault",
        "Whether the topic's WAL is latched after an I/O failure in this state (disk_full or io_error) while the agent reopens it: 1 if so, else 0.",
        faults,
    );
    let full = stats
        .topics
        .iter()
        .filter(|t| {
            t.wal_fault
                .as_ref()
                .is_some_and(|f| f.state == FaultKind::DiskFull)
        })
        .count() as u64;
    out.gauge(
        "tributary_edge_disk_full_topics",
        "Topics whose WAL is latched on a full file system now.",
        [(out.labels(&[]), full)],
    );
    out.gauge(
        "tributary_edge_disk_used_bytes",
        "Bytes the agent counts against its disk budget over all topics: WAL bytes plus appends in flight.",
        [(out.labels(&[]), stats.disk_used_bytes)],
    );
    out.gauge(
        "tributary_edge_disk_budget_bytes",
        "The agent-wide disk budget in bytes, where one is configured.",
        stats.disk_budget_bytes.map(|b| (out.labels(&[]), b)),
    );
}

/// Adds the replicator's counters and, when replication is configured,
/// whether it is connected and how long it has been stalled.
pub fn add_replication(
    out: &mut Exposition,
    stats: &ReplicationStats,
    stall: Option<&StallReport>,
) {
    let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
    let connects = get(&stats.connects);
    for (name, help, value) in [
        (
            "tributary_edge_replication_connects",
            "QUIC connections the agent made to a broker.",
            connects,
        ),
        (
            "tributary_edge_replication_reconnects",
            "Connections the agent made to a broker after the first one (after an outage or error).",
            connects.saturating_sub(1),
        ),
        (
            "tributary_edge_replication_raw_bytes",
            "Record batch bytes sent to brokers, before wire compression.",
            get(&stats.raw_bytes_sent),
        ),
        (
            "tributary_edge_replication_wire_bytes",
            "Batch frame bytes sent to brokers, after zstd where that is smaller.",
            get(&stats.wire_bytes_sent),
        ),
        (
            "tributary_edge_replication_redirects",
            "Redirects to a topic's owner the agent followed.",
            get(&stats.redirects_followed),
        ),
        (
            "tributary_edge_replication_redirect_loops",
            "Times a topic followed too many redirects without a Welcome and was held back.",
            get(&stats.redirect_loops),
        ),
        (
            "tributary_edge_replication_cluster_mismatches",
            "Topic streams stopped because the broker belongs to another cluster than the one this edge's checkpoints came from (/edge/cluster).",
            get(&stats.cluster.mismatches),
        ),
    ] {
        out.counter(name, help, [(out.labels(&[]), value)]);
    }
    let acks = [
        ("stream", get(&stats.stream_acks)),
        ("datagram", get(&stats.datagram_acks)),
    ]
    .map(|(path, value)| (out.labels(&[("path", path)]), value));
    out.counter(
        "tributary_edge_replication_acks",
        "Acknowledgements that advanced a topic's acknowledged offset, by the copy that arrived first (the Ack frame on the stream, or the QUIC datagram).",
        acks,
    );
    let lost: Vec<(Labels, u64)> = LossReason::ALL
        .iter()
        .map(|r| {
            (
                out.labels(&[("reason", r.label())]),
                get(&stats.connections_lost[*r as usize]),
            )
        })
        .collect();
    out.counter(
        "tributary_edge_replication_connections_lost",
        "Established broker connections that ended, by reason.",
        lost,
    );
    let stages: Vec<(Labels, Histogram)> = stats
        .stages
        .histograms()
        .map(|(stage, h)| (out.labels(&[("stage", stage.label())]), h.clone()))
        .collect();
    out.histogram(
        "tributary_edge_replication_stage_seconds",
        "Seconds replicated batches spent in each stage: read (per WAL read step), compress, queue (ready until the send starts), send (until quinn took the frame), ack (until acknowledged).",
        stages,
    );
    if let Some(stall) = stall {
        out.gauge(
            "tributary_edge_replication_connected",
            "Whether the agent holds a connection to a broker now: 1 if it does, 0 if not.",
            [(out.labels(&[]), u64::from(get(&stats.open_connections) > 0))],
        );
        out.gauge_f64(
            "tributary_edge_replication_stalled_seconds",
            "How long nothing could leave the device, in seconds: no broker connection, or a backlog nothing acknowledges (0 while replicating).",
            [(out.labels(&[]), stall.stalled_for.as_secs_f64())],
        );
    }
}

#[cfg(test)]
mod tests;
