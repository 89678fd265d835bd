//! The local HTTP API (axum). Routes, bodies and status codes are
//! documented in `docs/edge-agent.md`; in short:
//!
//! | route | does |
//! |---|---|
//! | `POST /v1/topics/{ns}/{topic}/records` | publish one record: body = value, `?key=`, `?timestamp_ms=`, headers from `x-trib-h-{name}` request headers |
//! | `POST /v1/topics/{ns}/{topic}/batch` | publish an NDJSON batch ([`crate::ndjson`]), all or nothing |
//! | `GET /v1/topics` | every topic with its counters ([`AgentStats`]) |
//! | `GET /v1/topics/{ns}/{topic}` | one topic ([`crate::topic::TopicStats`]) |
//! | `GET /health` | `{"status":"ok",...}` with `replication` (`state` connected / disconnected / not_configured, `connected_broker`, `last_error` and its age `last_error_age_ms` (kept after a reconnect until the next failure), `stalled_for_ms`, `unhealthy_after_ms`, `stalls`, per WAL topic `lag_records` and `stopped` (`reason`, `age_ms`, or null: the stream last ended for a reason an operator must look at, such as another log's records at the broker, until it resumes)); `"degraded"` also while a topic is `stopped`, with `faults` naming each topic whose WAL is latched (a full disk) and its path, and `damaged` naming each unreadable offset range of a WAL (topic, `first_offset`, `end_offset`, `kind`, `reason`); 503 `"unhealthy"` once nothing could leave the device for longer than `[replication] unhealthy_after_ms` ([`crate::health`]); 503 while shutting down |
//! | `GET /metrics` | OpenMetrics text ([`crate::metrics`]) |
//!
//! Publish responses are sent once the batch is durable per the topic's
//! sync mode. Both publish routes honour `Idempotency-Key`
//! ([`crate::idempotency`]; 409 `idempotency_key_reused`); the batch route
//! also NDJSON `producer_id` + `sequence` ([`crate::sequence`]; 409
//! `sequence_reused`, `sequence_duplicate`, `sequence_gap`), but not both
//! in one request (400). Every error is JSON `{"error": "..."}` with more fields where
//! useful: 400 bad input (naming the field or NDJSON line), 403 a topic
//! outside the edge's namespace or over `max_topics`, 404 unknown topic or
//! route, 413 over `max_record_bytes` / `max_batch_bytes`, 503 shutting
//! down, 507 disk budget full (kind `disk_budget_full`, with `topic` and
//! `limit_bytes`) or file system full (kind `disk_full`, with `topic` and
//! `path`), 500 anything else.

use std::pin::Pin;
use std::sync::{Arc, Weak};

use axum::Router;
use axum::body::{Body, Bytes, HttpBody};
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{FromRequestParts, Path, Query, RawQuery};
use axum::http::request::Parts;
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::BytesMut;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tracing::{debug, error, warn};
use tributary_proto::Record;
use tributary_proto::keys::TopicName;

use crate::agent::SharedStall;
use crate::budget::BudgetScope;
use crate::health::StallReport;
use crate::manager::{AgentStats, TopicError, TopicManager};
use crate::metrics;
use crate::ndjson::{self, NdjsonError};
use crate::pending::PendingRequest;
use crate::replicator::ReplicationStats;
use crate::topic::{PublishAck, PublishError};

mod retry;

/// Prefix of request headers that become record headers
/// (`x-trib-h-unit: celsius` → header `unit` = `celsius`).
pub const RECORD_HEADER_PREFIX: &str = "x-trib-h-";
/// The batch endpoint accepts request bodies up to this many times
/// `max_batch_bytes` (JSON and base64 take more room than the encoded
/// batch).
pub const BATCH_BODY_FACTOR: usize = 4;
/// Largest body drained after refusing it as too large, so the client
/// reads the 413 instead of a reset connection.
const DRAIN_MAX_BYTES: usize = 256 * 1024 * 1024;

/// An error response: status and JSON body with at least `error` (a
/// message) and `kind` (`invalid_input`, `forbidden`, `not_found`,
/// `method_not_allowed`, `too_large`, `shutting_down`, `disk_budget_full`,
/// `disk_full`, `internal`), as in the broker's admin API.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    body: Value,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        let kind = match status {
            StatusCode::BAD_REQUEST => "invalid_input",
            StatusCode::FORBIDDEN => "forbidden",
            StatusCode::NOT_FOUND => "not_found",
            StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
            StatusCode::PAYLOAD_TOO_LARGE => "too_large",
            StatusCode::SERVICE_UNAVAILABLE => "shutting_down",
            StatusCode::INSUFFICIENT_STORAGE => "disk_budget_full",
            _ => "internal",
        };
        ApiError {
            status,
            body: json!({ "error": message.into(), "kind": kind }),
        }
    }

    fn with_kind(mut self, kind: &str) -> ApiError {
        self.body["kind"] = json!(kind);
        self
    }

    fn with(mut self, key: &str, value: Value) -> ApiError {
        if let Some(map) = self.body.as_object_mut() {
            map.insert(key.to_owned(), value);
        }
        self
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        self.status
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.body)).into_response()
    }
}

/// `lines[i]` is the NDJSON line of record `i`, when the records came from
/// a batch body.
fn publish_error(e: TopicError, lines: Option<&[usize]>) -> ApiError {
    let message = e.to_string();
    match e {
        TopicError::InvalidName(_) => ApiError::new(StatusCode::BAD_REQUEST, message),
        TopicError::ForeignNamespace { .. } | TopicError::TooManyTopics { .. } => {
            ApiError::new(StatusCode::FORBIDDEN, message)
        }
        TopicError::NotFound { .. } => ApiError::new(StatusCode::NOT_FOUND, message),
        TopicError::ShuttingDown | TopicError::Publish(PublishError::Closed { .. }) => {
            ApiError::new(StatusCode::SERVICE_UNAVAILABLE, message)
        }
        TopicError::Publish(PublishError::Empty) => ApiError::new(StatusCode::BAD_REQUEST, message),
        TopicError::Publish(PublishError::TooLarge {
            record_index,
            limit,
        }) => {
            let line = record_index.and_then(|i| lines.and_then(|l| l.get(i)).copied());
            let message = match line {
                Some(line) => format!("line {line}: {limit}"),
                None => limit.to_string(),
            };
            let mut err = ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, message)
                .with("limit", json!(limit.limit.to_string()))
                .with("limit_bytes", json!(limit.max));
            if let Some(line) = line {
                err = err.with("line", json!(line));
            }
            err
        }
        TopicError::Publish(ref refusal @ PublishError::Full(ref full)) => {
            crate::refusals::log_storage_refusal(refusal, "http");
            let limit = match full.scope {
                BudgetScope::Topic => "topic disk_budget_bytes",
                BudgetScope::Agent => "agent disk_budget_bytes",
            };
            ApiError::new(StatusCode::INSUFFICIENT_STORAGE, message)
                .with("topic", json!(full.topic.as_str()))
                .with("limit", json!(limit))
                .with("limit_bytes", json!(full.limit_bytes))
                .with("used_bytes", json!(full.used_bytes))
                .with("batch_bytes", json!(full.batch_bytes))
        }
        TopicError::Publish(
            ref refusal @ PublishError::DiskFull {
                ref topic,
                ref path,
                ..
            },
        ) => {
            crate::refusals::log_storage_refusal(refusal, "http");
            ApiError::new(StatusCode::INSUFFICIENT_STORAGE, message)
                .with_kind("disk_full")
                .with("topic", json!(topic.as_str()))
                .with("path", json!(path.display().to_string()))
        }
        ref other if on_full_disk(other) => {
            // Creating an implicit topic (its settings, its WAL directory)
            // on a full disk: like a full WAL, nothing was stored.
            warn!(error = %other, "publish refused: the disk under the agent's data is full");
            ApiError::new(StatusCode::INSUFFICIENT_STORAGE, message).with_kind("disk_full")
        }
        other => {
            error!(error = %other, "publish failed");
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, message)
        }
    }
}

/// Whether `e` failed because the file system under the agent's data (its
/// metadata store or a new WAL directory) is full.
fn on_full_disk(e: &TopicError) -> bool {
    use crate::manager::OpenError;
    use broker_core::catalog::CatalogError;
    match e {
        TopicError::Metadata(m)
        | TopicError::Open(OpenError::Catalog(CatalogError::Metadata(m))) => m.is_disk_full(),
        TopicError::Open(OpenError::Wal { source, .. }) => source.is_disk_full(),
        _ => false,
    }
}

/// Response of both publish routes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublishResponse {
    /// The topic.
    pub topic: String,
    /// Offset of the first record.
    pub base_offset: u64,
    /// Offset just past the last record.
    pub next_offset: u64,
    /// Records published.
    pub count: u64,
}

impl PublishResponse {
    fn new(topic: &TopicName, ack: PublishAck) -> PublishResponse {
        PublishResponse {
            topic: topic.as_str().to_owned(),
            base_offset: ack.base_offset,
            next_offset: ack.next_offset,
            count: ack.count,
        }
    }
}

/// Query of `POST .../records`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RecordQuery {
    key: Option<String>,
    timestamp_ms: Option<i64>,
}

/// Refuses a `key` query parameter whose percent-decoded bytes are not
/// UTF-8. The query parser replaces such bytes with U+FFFD, which would
/// silently store another key than the one sent.
///
/// # Errors
/// 400 naming `key`.
fn strict_utf8_key(raw_query: &str) -> Result<(), ApiError> {
    for pair in raw_query.split('&') {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        if percent_encoding::percent_decode_str(name).decode_utf8_lossy() != "key" {
            continue;
        }
        let value = value.replace('+', " ");
        if percent_encoding::percent_decode_str(&value)
            .decode_utf8()
            .is_err()
        {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "key: not valid UTF-8 once percent-decoded",
            ));
        }
    }
    Ok(())
}

/// Query of `POST .../batch`: none allowed.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchQuery {}

/// The topic manager as a handler sees it. The router holds the manager
/// only weakly and each request takes a strong handle for its own
/// duration: once the server has stopped (graceful shutdown waits for the
/// requests in flight), no connection task still holds the manager, so the
/// agent's handle is the last one and the metadata store closes when the
/// agent drops it, not whenever a connection task finishes its final drop.
struct ApiManager(Arc<TopicManager>);

impl FromRequestParts<Weak<TopicManager>> for ApiManager {
    type Rejection = ApiError;

    async fn from_request_parts(
        _parts: &mut Parts,
        manager: &Weak<TopicManager>,
    ) -> Result<ApiManager, ApiError> {
        manager
            .upgrade()
            .map(ApiManager)
            .ok_or_else(|| publish_error(TopicError::ShuttingDown, None))
    }
}

/// The router of the local API over `manager`, which it holds weakly: the
/// caller keeps `manager` alive while serving (requests answer 503 once it
/// is gone).
pub fn router(manager: &Arc<TopicManager>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics_text))
        .route("/v1/topics", get(list_topics))
        .route("/v1/topics/{ns}/{topic}", get(get_topic))
        .route("/v1/topics/{ns}/{topic}/records", post(publish_record))
        .route("/v1/topics/{ns}/{topic}/batch", post(publish_batch))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(Arc::downgrade(manager))
}

async fn not_found(method: Method, uri: Uri) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!("no route for {method} {}", uri.path()),
    )
}

async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("method {method} is not allowed on {}", uri.path()),
    )
}

async fn health(
    ApiManager(manager): ApiManager,
    replication: Option<axum::Extension<Arc<ReplicationStats>>>,
    stall: Option<axum::Extension<SharedStall>>,
) -> Response {
    let stall = stall.map(|axum::Extension(s)| {
        let watch = s.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        (
            watch.report(std::time::Instant::now()),
            watch.unhealthy_after(),
        )
    });
    let faults = manager.faults();
    let stopped = replication
        .as_ref()
        .map(|r| r.stopped_topics())
        .unwrap_or_default();
    let damaged: Vec<Value> = manager
        .stats()
        .topics
        .iter()
        .flat_map(|t| {
            t.damaged_ranges.iter().map(|r| {
                json!({
                    "topic": t.name.as_str(),
                    "first_offset": r.first_offset,
                    "end_offset": r.end_offset,
                    "kind": r.kind,
                    "reason": r.reason,
                })
            })
        })
        .collect();
    let (status, word) = if manager.is_closing() {
        (StatusCode::SERVICE_UNAVAILABLE, "shutting_down")
    } else if stall.as_ref().is_some_and(|(r, _)| r.unhealthy) {
        // Nothing left the device for longer than the setting: records
        // pile up locally. Restarting the agent does not help; an operator
        // (or the network) has to.
        (StatusCode::SERVICE_UNAVAILABLE, "unhealthy")
    } else if !faults.is_empty() || !damaged.is_empty() || !stopped.is_empty() {
        // Degraded, not down: replication and reads go on, and the agent
        // recovers by itself; a load balancer should not restart it.
        (StatusCode::OK, "degraded")
    } else {
        (StatusCode::OK, "ok")
    };
    let faults: Vec<Value> = faults
        .into_iter()
        .map(|(topic, f)| {
            json!({
                "topic": topic.as_str(),
                "state": f.state,
                "path": f.path,
                "error": f.error,
                "failed_reopens": f.failed_reopens,
            })
        })
        .collect();
    let body = json!({
        "status": word,
        "edge_id": manager.config().edge_id.as_str(),
        "topics": manager.topics().len(),
        "faults": faults,
        "damaged": damaged,
        "replication": replication_health(&manager, replication.as_deref(), stall.as_ref(), &stopped),
    });
    (status, axum::Json(body)).into_response()
}

/// `/health`'s `replication`: `state` (`not_configured`, `connected`,
/// `disconnected`), the connected broker, the last error, how long nothing
/// could leave the device (`stalled_for_ms`, with `unhealthy_after_ms` and
/// the `stalls`, one sentence each), each topic's lag (records published
/// but not yet acknowledged by the broker) and `cluster_id`, the central
/// cluster the checkpoints belong to (`/edge/cluster`, once a stream read
/// or recorded it).
fn replication_health(
    manager: &TopicManager,
    stats: Option<&Arc<ReplicationStats>>,
    stall: Option<&(StallReport, std::time::Duration)>,
    stopped: &[(String, String, std::time::Instant)],
) -> Value {
    let configured = !manager.config().brokers.is_empty() && manager.config().tls.is_some();
    let link = stats.map(|s| s.link_status()).unwrap_or_default();
    let state = match (configured, &link.connected_broker) {
        (false, _) => "not_configured",
        (true, Some(_)) => "connected",
        (true, None) => "disconnected",
    };
    let ms = |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    // Realtime topics (rings) are never replicated: no lag to show.
    let lag: Vec<Value> = manager
        .stats()
        .topics
        .iter()
        .filter(|t| t.ring_capacity_records.is_none())
        .map(|t| {
            let stopped = stopped
                .iter()
                .find(|(topic, _, _)| topic == t.name.as_str())
                .map(|(_, reason, at)| json!({"reason": reason, "age_ms": ms(at.elapsed())}));
            json!({
                "topic": t.name.as_str(),
                "high_water_mark": t.high_water_mark,
                "acknowledged_offset": t.acknowledged_offset,
                "lag_records": t.high_water_mark.saturating_sub(t.acknowledged_offset),
                "stopped": stopped,
            })
        })
        .collect();
    json!({
        "state": state,
        "connected_broker": link.connected_broker,
        "last_error": link.last_error,
        "last_error_age_ms": link.last_error_at.map(|at| ms(at.elapsed())),
        "stalled_for_ms": stall.map(|(r, _)| ms(r.stalled_for)),
        "unhealthy_after_ms": stall.map(|(_, after)| ms(*after)),
        "stalls": stall.map(|(r, _)| r.reasons.clone()).unwrap_or_default(),
        "topics": lag,
        "cluster_id": stats.and_then(|s| s.cluster.known()).map(|id| id.to_string()),
    })
}

async fn metrics_text(
    ApiManager(manager): ApiManager,
    replication: Option<axum::Extension<Arc<ReplicationStats>>>,
    mqtt: Option<axum::Extension<Arc<crate::mqtt::MqttStats>>>,
    stall: Option<axum::Extension<SharedStall>>,
) -> Response {
    let stats = manager.stats();
    let mut out = metrics::Exposition::new(&stats.edge_id);
    metrics::add_agent(&mut out, &stats);
    if let Some(axum::Extension(replication)) = replication {
        let stall = stall.map(|axum::Extension(s)| stall_report(&s));
        metrics::add_replication(&mut out, &replication, stall.as_ref());
    }
    if let Some(axum::Extension(mqtt)) = mqtt {
        mqtt.add_to(&mut out);
    }
    (
        [(header::CONTENT_TYPE, metrics::CONTENT_TYPE)],
        out.finish(),
    )
        .into_response()
}

/// The replication stall now.
fn stall_report(watch: &SharedStall) -> StallReport {
    watch
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .report(std::time::Instant::now())
}

async fn list_topics(ApiManager(manager): ApiManager) -> axum::Json<AgentStats> {
    axum::Json(manager.stats())
}

fn path_topic(
    manager: &TopicManager,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<TopicName, ApiError> {
    let Path((ns, topic)) = path
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("topic: {}", e.body_text())))?;
    manager
        .topic_name(&ns, &topic)
        .map_err(|e| publish_error(e, None))
}

async fn get_topic(
    ApiManager(manager): ApiManager,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<axum::Json<crate::topic::TopicStats>, ApiError> {
    let name = path_topic(&manager, path)?;
    let topic = manager.topic(&name).ok_or_else(|| {
        publish_error(
            TopicError::NotFound {
                topic: name.clone(),
            },
            None,
        )
    })?;
    Ok(axum::Json(topic.stats()))
}

fn query_error(e: QueryRejection) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, format!("query: {}", e.body_text()))
}

async fn publish_record(
    ApiManager(manager): ApiManager,
    path: Result<Path<(String, String)>, PathRejection>,
    query: Result<Query<RecordQuery>, QueryRejection>,
    RawQuery(raw_query): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> Result<axum::Json<PublishResponse>, ApiError> {
    let name = path_topic(&manager, path)?;
    let Query(query) = query.map_err(query_error)?;
    if query.key.as_deref().is_some_and(|k| k.contains('\u{FFFD}')) {
        strict_utf8_key(raw_query.as_deref().unwrap_or(""))?;
    }
    let timestamp_ms = match query.timestamp_ms {
        Some(ts) => tributary_proto::limits::check_timestamp_ms(ts).map_err(|why| {
            ApiError::new(StatusCode::BAD_REQUEST, format!("timestamp_ms: {why}"))
        })?,
        None => manager.now_ms(),
    };
    let mut record_headers = Vec::new();
    for (header_name, value) in &headers {
        let Some(name) = header_name.as_str().strip_prefix(RECORD_HEADER_PREFIX) else {
            continue;
        };
        if name.is_empty() {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                format!(
                    "header {header_name}: the record header name after {RECORD_HEADER_PREFIX} is empty"
                ),
            ));
        }
        if crate::mqtt::conn::is_reserved_header(name) {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                format!(
                    "header {header_name}: record header names beginning with {:?} are the agent's own",
                    crate::mqtt::conn::RESERVED_HEADER_PREFIX
                ),
            ));
        }
        record_headers.push((name.to_owned(), Bytes::copy_from_slice(value.as_bytes())));
    }
    let max = manager.config().limits.max_record_bytes as usize;
    let value = read_body(&headers, body, max).await.map_err(|e| match e {
        BodyError::TooLarge => ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("max_record_bytes exceeded: the record value is over {max} bytes"),
        )
        .with("limit", json!("max_record_bytes"))
        .with("limit_bytes", json!(max)),
        BodyError::Read(reason) => {
            ApiError::new(StatusCode::BAD_REQUEST, format!("body: {reason}"))
        }
    })?;
    let record = Record {
        timestamp_ms,
        key: query.key.map(|k| Bytes::from(k.into_bytes())),
        headers: record_headers,
        value,
    };
    let request = retry::request_key(&headers)?.map(|key| PendingRequest::Key { key });
    // Hashed only when an `Idempotency-Key` asks for it.
    // Of the request's meaning, not its spelling: the query's key and
    // timestamp as parsed (a retry may encode or order them otherwise).
    let given_ts = query.timestamp_ms.map(i64::to_be_bytes);
    let fp = if request.is_some() {
        let mut parts: Vec<&[u8]> = vec![b"record"];
        match &record.key {
            Some(key) => parts.extend([&b"k"[..], key]),
            None => parts.push(b"-"),
        }
        match &given_ts {
            Some(ts) => parts.extend([&b"t"[..], ts]),
            None => parts.push(b"-"),
        }
        for (n, v) in &record.headers {
            parts.push(n.as_bytes());
            parts.push(v);
        }
        parts.push(&record.value);
        crate::idempotency::fingerprint(&parts)
    } else {
        String::new()
    };
    let records = vec![record];
    let check = request.map(|r| retry::Check::new(r, fp, &records));
    let ack = retry::checked(&manager, &name, check, records, |e| publish_error(e, None)).await?;
    debug!(topic = %name, base_offset = ack.base_offset, "published one record");
    Ok(axum::Json(PublishResponse::new(&name, ack)))
}

async fn publish_batch(
    ApiManager(manager): ApiManager,
    path: Result<Path<(String, String)>, PathRejection>,
    query: Result<Query<BatchQuery>, QueryRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<axum::Json<PublishResponse>, ApiError> {
    let name = path_topic(&manager, path)?;
    let Query(BatchQuery {}) = query.map_err(query_error)?;
    let max_batch = manager.config().limits.max_batch_bytes as usize;
    let max = max_batch.saturating_mul(BATCH_BODY_FACTOR);
    let body = read_body(&headers, body, max).await.map_err(|e| match e {
        BodyError::TooLarge => ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "max_batch_bytes exceeded: the request body is over {max} bytes ({BATCH_BODY_FACTOR} × max_batch_bytes of {max_batch}); send smaller batches"
            ),
        )
        .with("limit", json!("max_batch_bytes"))
        .with("limit_bytes", json!(max_batch)),
        BodyError::Read(reason) => ApiError::new(StatusCode::BAD_REQUEST, format!("body: {reason}")),
    })?;
    let parsed = ndjson::parse(&body, manager.now_ms()).map_err(|e| {
        let err = ApiError::new(StatusCode::BAD_REQUEST, e.to_string());
        match e {
            NdjsonError::Line(line) => err
                .with("line", json!(line.line))
                .with("field", json!(line.field)),
            NdjsonError::Empty => err,
        }
    })?;
    let ndjson::ParsedBatch {
        records,
        lines,
        producer,
    } = parsed;
    let request = match (producer, retry::request_key(&headers)?) {
        (Some(_), Some(_)) => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                format!(
                    "header {}: not with producer_id and sequence in the body; use one of the two per request",
                    crate::idempotency::HEADER
                ),
            ));
        }
        (Some(p), None) => Some(PendingRequest::Producer {
            producer_id: p.id,
            first_sequence: p.first_sequence,
            last_sequence: p.last_sequence,
        }),
        (None, Some(key)) => Some(PendingRequest::Key { key }),
        (None, None) => None,
    };
    // Hashed only for a request that asks for retries without duplicates.
    let fp = match request {
        Some(_) => crate::idempotency::fingerprint(&[b"batch", &body]),
        None => String::new(),
    };
    let check = request.map(|r| retry::Check::new(r, fp, &records));
    let ack = retry::checked(&manager, &name, check, records, |e| {
        publish_error(e, Some(&lines))
    })
    .await?;
    debug!(topic = %name, base_offset = ack.base_offset, count = ack.count, "published a batch");
    Ok(axum::Json(PublishResponse::new(&name, ack)))
}

enum BodyError {
    TooLarge,
    Read(String),
}

/// Reads `body` up to `limit` bytes. Over the limit, the rest is drained
/// (up to [`DRAIN_MAX_BYTES`]) so the client gets to read the refusal.
async fn read_body(headers: &HeaderMap, mut body: Body, limit: usize) -> Result<Bytes, BodyError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let mut too_large = declared.is_some_and(|len| len > limit as u64);
    let mut buf = BytesMut::new();
    let mut seen = 0usize;
    while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
        let frame = frame.map_err(|e| BodyError::Read(e.to_string()))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        seen = seen.saturating_add(data.len());
        if seen > limit {
            too_large = true;
        }
        if too_large {
            if seen > DRAIN_MAX_BYTES {
                break;
            }
            continue;
        }
        buf.extend_from_slice(&data);
    }
    if too_large {
        return Err(BodyError::TooLarge);
    }
    Ok(buf.freeze())
}
