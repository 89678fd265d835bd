//! `GET /metrics` on the admin listener: Prometheus/OpenMetrics text
//! (`prometheus-client`), built at scrape time from the open topic WALs,
//! the committed tiered offsets in Raft and the Raft status, plus the
//! ingest counters below.
//!
//! No bearer token: like `/health` it is read-only and the admin listener is
//! loopback by default; put it behind the same network policy as the admin
//! API. It shows topic names, offsets and sizes, never record contents.
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `tributary_broker_ingest_batches_total` | counter | none: record batches received from edges |
//! | `tributary_broker_ingest_records_total` | counter | none: records in those batches |
//! | `tributary_broker_ingest_bytes_total` | counter | none: record batch bytes received |
//! | `tributary_broker_ingest_stage_seconds` | histogram | `stage` (`receive`, `decode`, `append`, `durable`, `ack`): where edge batches spent their time, all topics ([`crate::replication::stages`]) |
//! | `tributary_broker_topic_high_water_mark` | gauge | `topic`: offset just past the last durable record (= records ever stored) |
//! | `tributary_broker_topic_log_start_offset` | gauge | `topic`: first offset still in the local WAL |
//! | `tributary_broker_topic_wal_bytes` | gauge | `topic`: bytes of the local WAL segment files |
//! | `tributary_broker_topic_tiered_offset` | gauge | `topic`: committed tiered offset (every offset below it is archived) |
//! | `tributary_broker_topic_tier_backlog_records` | gauge | `topic`: high-water mark minus tiered offset |
//! | `tributary_broker_unarchived_bytes` | gauge | none: local WAL bytes not covered by a committed tiered offset, all open topics (`crate::budget`) |
//! | `tributary_broker_audit_records_total` | counter | none: audit records of admin actions appended |
//! | `tributary_broker_audit_failures_total` | counter | none: audit records lost (append failed, queue full) |
//! | `tributary_broker_budget_refusals_total` | counter | none: batches refused by the un-archived byte budget (edge streams and central publishes) |
//! | `tributary_broker_damaged_ranges` | gauge | `topic`: damaged ranges of the local WAL not yet healed or skipped |
//! | `tributary_broker_damaged_offsets` | gauge | `topic`: offsets in those ranges |
//! | `tributary_broker_raft_term` | gauge | none |
//! | `tributary_broker_raft_leader_id` | gauge | none: the leader's node id, 0 when none is known |
//! | `tributary_broker_raft_is_leader` | gauge | none: 1 on the leader |
//! | `tributary_broker_raft_last_applied_index` | gauge | none |
//! | `tributary_broker_edge_connected` | gauge | `edge`: 1 while the edge holds a replication connection to this broker, else 0 |
//! | `tributary_broker_edge_last_seen_timestamp_seconds` | gauge | `edge`: when this broker last knew the edge connected (now while it is), seconds since the Unix epoch |
//!
//! Topic metrics cover the topics this process has open (an edge has
//! replicated to them since the broker started); edge metrics the edges
//! that connected to this broker since it started, and those an earlier
//! process of it recorded ([`crate::fleet`]). Across brokers, an edge is
//! connected when `max by (edge) (tributary_broker_edge_connected)` is 1.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use broker_core::metadata::MetadataStore;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tributary_proto::keys::{DEFAULT_STORAGE_PREFIX, StorageKeys};

use crate::admin::ClusterView;
use crate::replication::topics::TopicStore;
use crate::storage::tiered_state;

/// The `Content-Type` of the exposition (OpenMetrics 1.0 text).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Counters of the replication endpoint, process-wide.
#[derive(Debug, Default)]
pub struct IngestStats {
    batches: AtomicU64,
    records: AtomicU64,
    bytes: AtomicU64,
}

impl IngestStats {
    /// Counts one received record batch of `records` records and `bytes`
    /// encoded bytes.
    pub fn on_batch(&self, records: u32, bytes: usize) {
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.records
            .fetch_add(u64::from(records), Ordering::Relaxed);
        self.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// (batches, records, bytes) so far.
    pub fn snapshot(&self) -> (u64, u64, u64) {
        (
            self.batches.load(Ordering::Relaxed),
            self.records.load(Ordering::Relaxed),
            self.bytes.load(Ordering::Relaxed),
        )
    }
}

/// The ingest counters of this process (the replication endpoint adds to
/// them).
pub static INGEST: IngestStats = IngestStats {
    batches: AtomicU64::new(0),
    records: AtomicU64::new(0),
    bytes: AtomicU64::new(0),
};

/// What the `/metrics` handler reads.
#[derive(Clone)]
pub struct MetricsState {
    /// Raft status.
    pub cluster: Arc<dyn ClusterView>,
    /// Raft metadata (tiered offsets).
    pub store: Arc<dyn MetadataStore>,
    /// The open topic WALs.
    pub topics: Arc<TopicStore>,
    /// The edges of this broker (`None`: no edge metrics).
    pub fleet: Option<Arc<crate::fleet::Fleet>>,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TopicLabel {
    topic: String,
}

type TopicGauge = Family<TopicLabel, Gauge<u64, AtomicU64>>;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EdgeLabel {
    edge: String,
}

fn counter(registry: &mut Registry, name: &str, help: &str, value: u64) {
    let metric: Counter<u64> = Counter::default();
    metric.inner().store(value, Ordering::Relaxed);
    registry.register(name, help.trim_end_matches('.'), metric);
}

fn gauge(registry: &mut Registry, name: &str, help: &str, value: u64) {
    let metric: Gauge<u64, AtomicU64> = Gauge::default();
    metric.set(value);
    registry.register(name, help.trim_end_matches('.'), metric);
}

/// Renders the exposition.
///
/// # Errors
/// Only a formatting failure (never expected).
pub async fn render(state: &MetricsState) -> Result<String, std::fmt::Error> {
    let mut registry = Registry::default();
    let (batches, records, bytes) = INGEST.snapshot();
    counter(
        &mut registry,
        "tributary_broker_ingest_batches",
        "Record batches received from edges.",
        batches,
    );
    counter(
        &mut registry,
        "tributary_broker_ingest_records",
        "Records in the batches received from edges.",
        records,
    );
    counter(
        &mut registry,
        "tributary_broker_ingest_bytes",
        "Record batch bytes received from edges.",
        bytes,
    );
    registry.register(
        "tributary_broker_ingest_stage_seconds",
        "Seconds edge batches spent in each ingest stage, all topics: receive (first to last read of the frame), decode (checks), append (budget and WAL enqueue), durable (until the writer saw it durable), ack (until the Ack was written)",
        crate::replication::stages::INGEST_STAGES.family(),
    );
    let hwm = TopicGauge::default();
    let start = TopicGauge::default();
    let wal_bytes = TopicGauge::default();
    let tiered = TopicGauge::default();
    let backlog = TopicGauge::default();
    let damaged_ranges = TopicGauge::default();
    let damaged_offsets = TopicGauge::default();
    let keys = StorageKeys::new(DEFAULT_STORAGE_PREFIX).ok();
    let mut unarchived = 0u64;
    for (topic, wal) in state.topics.open_topics().await {
        let label = TopicLabel {
            topic: topic.as_str().to_string(),
        };
        let high = wal.high_water_mark();
        hwm.get_or_create(&label).set(high);
        start.get_or_create(&label).set(wal.log_start_offset());
        let damaged = crate::replication::damage::damaged_of(&topic, &wal);
        damaged_ranges
            .get_or_create(&label)
            .set(damaged.len() as u64);
        damaged_offsets
            .get_or_create(&label)
            .set(damaged.iter().map(|d| d.end_offset - d.first_offset).sum());
        wal_bytes.get_or_create(&label).set(wal.size_bytes());
        let tiered_offset = match &keys {
            Some(keys) => tiered_state(&*state.store, keys, &topic)
                .await
                .ok()
                .and_then(|t| t.tiered_offset),
            None => None,
        };
        let t = tiered_offset.unwrap_or(0);
        unarchived = unarchived.saturating_add(crate::budget::unarchived_bytes(&wal, t));
        tiered.get_or_create(&label).set(t);
        backlog.get_or_create(&label).set(high.saturating_sub(t));
    }
    registry.register(
        "tributary_broker_topic_high_water_mark",
        "Offset just past the topic's last durable record (records ever stored)",
        hwm,
    );
    registry.register(
        "tributary_broker_topic_log_start_offset",
        "First offset still in the topic's local WAL",
        start,
    );
    registry.register(
        "tributary_broker_topic_wal_bytes",
        "Bytes of the topic's local WAL segment files",
        wal_bytes,
    );
    registry.register(
        "tributary_broker_topic_tiered_offset",
        "Committed tiered offset: every offset below it is in the archive (0: none yet)",
        tiered,
    );
    registry.register(
        "tributary_broker_topic_tier_backlog_records",
        "Records stored but not yet archived: high-water mark minus tiered offset",
        backlog,
    );
    gauge(
        &mut registry,
        "tributary_broker_unarchived_bytes",
        "Local WAL bytes not covered by a committed tiered offset (all open topics).",
        unarchived,
    );
    let (audited, audit_failures) = crate::auth::audit::AUDIT.snapshot();
    counter(
        &mut registry,
        "tributary_broker_audit_records",
        "Audit records of admin actions appended to this broker's audit topic.",
        audited,
    );
    counter(
        &mut registry,
        "tributary_broker_audit_failures",
        "Audit records lost: the append failed or the queue was full.",
        audit_failures,
    );
    counter(
        &mut registry,
        "tributary_broker_budget_refusals",
        "Batches refused because the un-archived WAL budget was reached.",
        state.topics.budget().map_or(0, |b| b.refusals()),
    );
    registry.register(
        "tributary_broker_damaged_ranges",
        "Damaged ranges in the topic's local WAL (stored bytes fail verification), not yet healed or skipped",
        damaged_ranges,
    );
    registry.register(
        "tributary_broker_damaged_offsets",
        "Offsets in the topic's damaged ranges",
        damaged_offsets,
    );
    let status = state.cluster.status();
    gauge(
        &mut registry,
        "tributary_broker_raft_term",
        "Current Raft term.",
        status.term,
    );
    gauge(
        &mut registry,
        "tributary_broker_raft_leader_id",
        "Node id of the Raft leader (0: none known).",
        status.leader.unwrap_or(0),
    );
    gauge(
        &mut registry,
        "tributary_broker_raft_is_leader",
        "Whether this node is the Raft leader: 1 if it is, else 0.",
        u64::from(status.leader == Some(status.node_id)),
    );
    gauge(
        &mut registry,
        "tributary_broker_raft_last_applied_index",
        "Index of the last applied Raft log entry.",
        status.last_applied_index.unwrap_or(0),
    );
    if let Some(fleet) = &state.fleet {
        let connected = Family::<EdgeLabel, Gauge<u64, AtomicU64>>::default();
        let last_seen = Family::<EdgeLabel, Gauge<f64, AtomicU64>>::default();
        for (edge, is_connected, seen_s) in fleet.metrics() {
            let label = EdgeLabel { edge };
            connected.get_or_create(&label).set(u64::from(is_connected));
            last_seen.get_or_create(&label).set(seen_s);
        }
        registry.register(
            "tributary_broker_edge_connected",
            "Whether the edge holds a replication connection to this broker now: 1 if it does, 0 if not",
            connected,
        );
        registry.register(
            "tributary_broker_edge_last_seen_timestamp_seconds",
            "When this broker last knew the edge connected (now while it is), in seconds since the Unix epoch",
            last_seen,
        );
    }
    let mut out = String::new();
    encode(&mut out, &registry)?;
    Ok(out)
}

async fn metrics(State(state): State<MetricsState>) -> Response {
    match render(&state).await {
        Ok(text) => ([(header::CONTENT_TYPE, CONTENT_TYPE)], text).into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

/// `GET /metrics` (no token; see the module documentation).
pub fn router(state: MetricsState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .with_state(state)
}
