//! The consumer HTTP API (axum), merged into the admin router and guarded
//! by the same auth layer ([`crate::auth`]). Documented in `docs/consumer-api.md`.
//!
//! | method and path | what |
//! |---|---|
//! | `POST /v1/topics/{ns}/{topic}/records` | publish centrally, body [`PublishRequest`] |
//! | `GET /v1/topics/{ns}/{topic}/records?offset=&max_messages=&encoding=` | peek without a subscription |
//! | `GET …/subscriptions/{sub}` | subscription state |
//! | `DELETE …/subscriptions/{sub}` | unsubscribe |
//! | `POST …/subscriptions/{sub}/attach` | attach a consumer, body [`AttachRequest`] |
//! | `POST …/subscriptions/{sub}/detach` | end a session |
//! | `POST …/subscriptions/{sub}/receive` | long-poll lease |
//! | `POST …/subscriptions/{sub}/read` | long-poll cursor read |
//! | `POST …/subscriptions/{sub}/ack` | per-message ack |
//! | `POST …/subscriptions/{sub}/ack-up-to` | cumulative ack |
//! | `POST …/subscriptions/{sub}/nack` | negative ack |
//! | `POST …/subscriptions/{sub}/seek` | move the cursor |
//! | `POST …/subscriptions/{sub}/pause`, `…/resume` | stop / restart delivery |
//! | `POST …/subscriptions/{sub}/replay-dlq` | move dead-lettered messages back |
//!
//! Errors are JSON `{"error", "kind", "field"?}`: `400 invalid_input`,
//! `400 offset_out_of_range` (with `log_start`, `high_water_mark`), `401
//! unauthorized`, `403 forbidden` (with `permission`), `404 not_found`, `409 subscription_busy | type_mismatch |
//! durability_mismatch | not_leased | writer_conflict | partitioned`, `500 internal`, `503
//! archive_not_configured` (an offset below the local WAL, no `[archive]`).

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::middleware;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use bytes::Bytes as RecordBytes;
use serde::Deserialize;
use serde_json::json;
use tributary_api::consumer::{
    AckRequest, AckUpToRequest, AttachRequest, MAX_MESSAGES_PER_CALL, MAX_OFFSETS_PER_CALL,
    MAX_WAIT_MS, NackRequest, PublishRequest, PublishResponse, ReceiveRequest, SeekRequest,
    SessionRequest, ValueEncoding,
};
use tributary_proto::Record;
use tributary_proto::keys::{NamespaceName, TopicName};

use super::{ConsumerError, ConsumerService, records};
use crate::http::{ApiError, ApiResult, parse_json};

#[derive(Clone)]
struct Api {
    service: Arc<ConsumerService>,
}

/// The consumer routes (under `/v1`), behind the same guard as the admin
/// API ([`crate::auth::guard`]: `consume`, `produce` or
/// `subscriptions_manage` on the topic's namespace).
pub fn router(service: Arc<ConsumerService>, auth: crate::auth::AuthState) -> Router {
    let store = service.store.clone();
    let api = Api { service };
    let sub = "/v1/topics/{namespace}/{topic}/subscriptions/{subscription}";
    Router::new()
        .route(
            "/v1/topics/{namespace}/{topic}/records",
            get(peek).post(publish),
        )
        .route(sub, get(state).delete(unsubscribe))
        .route(&format!("{sub}/attach"), post(attach))
        .route(&format!("{sub}/detach"), post(detach))
        .route(&format!("{sub}/receive"), post(receive))
        .route(&format!("{sub}/read"), post(read))
        .route(&format!("{sub}/ack"), post(ack))
        .route(&format!("{sub}/ack-up-to"), post(ack_up_to))
        .route(&format!("{sub}/nack"), post(nack))
        .route(&format!("{sub}/seek"), post(seek))
        .route(&format!("{sub}/pause"), post(pause))
        .route(&format!("{sub}/resume"), post(resume))
        .route(&format!("{sub}/replay-dlq"), post(replay_dlq))
        .route_layer(middleware::from_fn_with_state(
            store,
            crate::http::owner_route::owner_route,
        ))
        .route_layer(middleware::from_fn_with_state(auth, crate::auth::guard))
        .with_state(api)
}

impl From<ConsumerError> for ApiError {
    fn from(e: ConsumerError) -> ApiError {
        let message = e.to_string();
        match e {
            ConsumerError::Invalid { field, .. } => ApiError::invalid(&field, message),
            ConsumerError::OffsetOutOfRange {
                log_start,
                high_water_mark,
                ..
            } => ApiError::new(StatusCode::BAD_REQUEST, "offset_out_of_range", message)
                .with("log_start", json!(log_start))
                .with("high_water_mark", json!(high_water_mark)),
            ConsumerError::NotFound(_) => {
                ApiError::new(StatusCode::NOT_FOUND, "not_found", message)
            }
            ConsumerError::Conflict { kind, .. } => {
                ApiError::new(StatusCode::CONFLICT, kind, message)
            }
            ConsumerError::MovedTo(owner) => {
                ApiError::new(StatusCode::CONFLICT, "not_owner", message)
                    .with("owner", json!(owner.broker_id))
                    .with("epoch", json!(owner.epoch))
                    .with("owner_url", json!(owner.admin_url))
            }
            ConsumerError::TooLarge(_) => {
                ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "too_large", message)
            }
            ConsumerError::OwnerChanged(_) => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "owner_changed", message)
            }
            ConsumerError::ArchiveNotConfigured(_) => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "archive_not_configured",
                message,
            ),
            ConsumerError::Damaged {
                first_offset,
                end_offset,
                ..
            } => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "damaged_range", message)
                .with("first_offset", json!(first_offset))
                .with("end_offset", json!(end_offset)),
            ConsumerError::BudgetExceeded(_) => {
                ApiError::new(StatusCode::INSUFFICIENT_STORAGE, "budget_exceeded", message)
            }
            ConsumerError::DiskFull(_) => {
                tracing::warn!(error = %message, "consumer API: the broker's disk is full");
                ApiError::new(StatusCode::INSUFFICIENT_STORAGE, "disk_full", message)
            }
            ConsumerError::Internal(_) => {
                tracing::error!(error = %message, "consumer API: internal error");
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
            }
        }
    }
}

fn ok(body: impl serde::Serialize) -> ApiResult {
    Ok((StatusCode::OK, axum::Json(body)).into_response())
}

fn topic_from_path(namespace: &str, topic: &str) -> Result<TopicName, ApiError> {
    let ns = NamespaceName::new(namespace)
        .map_err(|e| ApiError::invalid("namespace", format!("namespace: {e}")))?;
    TopicName::from_parts(&ns, topic).map_err(|e| ApiError::invalid("topic", format!("topic: {e}")))
}

fn check_receive(r: &ReceiveRequest) -> Result<(), ApiError> {
    if r.max_messages == 0 || r.max_messages > MAX_MESSAGES_PER_CALL {
        return Err(ApiError::invalid(
            "max_messages",
            format!(
                "max_messages: must be 1 to {MAX_MESSAGES_PER_CALL}, got {}",
                r.max_messages
            ),
        ));
    }
    if r.max_wait_ms > MAX_WAIT_MS {
        return Err(ApiError::invalid(
            "max_wait_ms",
            format!("max_wait_ms: at most {MAX_WAIT_MS}, got {}", r.max_wait_ms),
        ));
    }
    Ok(())
}

fn check_offsets(offsets: &[u64]) -> Result<(), ApiError> {
    if offsets.is_empty() || offsets.len() > MAX_OFFSETS_PER_CALL {
        return Err(ApiError::invalid(
            "offsets",
            format!(
                "offsets: give 1 to {MAX_OFFSETS_PER_CALL} offsets, got {}",
                offsets.len()
            ),
        ));
    }
    Ok(())
}

type SubPath = Path<(String, String, String)>;

async fn attach(State(api): State<Api>, Path((ns, topic, sub)): SubPath, body: Bytes) -> ApiResult {
    let topic = topic_from_path(&ns, &topic)?;
    let request: AttachRequest = parse_json(&body)?;
    let response = api.service.attach(&topic, &sub, &request).await?;
    let status = if response.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, axum::Json(response)).into_response())
}

async fn detach(State(api): State<Api>, Path((ns, topic, sub)): SubPath, body: Bytes) -> ApiResult {
    let topic = topic_from_path(&ns, &topic)?;
    let request: SessionRequest = parse_json(&body)?;
    api.service
        .detach(&topic, &sub, request.consumer_id)
        .await?;
    ok(json!({"detached": request.consumer_id}))
}

async fn receive(
    State(api): State<Api>,
    Path((ns, topic, sub)): SubPath,
    body: Bytes,
) -> ApiResult {
    let topic = topic_from_path(&ns, &topic)?;
    let r: ReceiveRequest = parse_json(&body)?;
    check_receive(&r)?;
    ok(api
        .service
        .receive(
            &topic,
            &sub,
            r.consumer_id,
            r.max_messages,
            r.max_wait_ms,
            r.encoding,
        )
        .await?)
}

async fn read(State(api): State<Api>, Path((ns, topic, sub)): SubPath, body: Bytes) -> ApiResult {
    let topic = topic_from_path(&ns, &topic)?;
    let r: ReceiveRequest = parse_json(&body)?;
    check_receive(&r)?;
    ok(api
        .service
        .read(
            &topic,
            &sub,
            r.consumer_id,
            r.max_messages,
            r.max_wait_ms,
            r.encoding,
        )
        .await?)
}

async fn ack(State(api): State<Api>, Path((ns, topic, sub)): SubPath, body: Bytes) -> ApiResult {
    let topic = topic_from_path(&ns, &topic)?;
    let r: AckRequest = parse_json(&body)?;
    check_offsets(&r.offsets)?;
    ok(api
        .service
        .ack(&topic, &sub, r.consumer_id, &r.offsets)
        .await?)
}

async fn ack_up_to(
    State(api): State<Api>,
    Path((ns, topic, sub)): SubPath,
    body: Bytes,
) -> ApiResult {
    let topic = topic_from_path(&ns, &topic)?;
    let r: AckUpToRequest = parse_json(&body)?;
    ok(api
        .service
        .ack_up_to(&topic, &sub, r.consumer_id, r.offset)
        .await?)
}

async fn nack(State(api): State<Api>, Path((ns, topic, sub)): SubPath, body: Bytes) -> ApiResult {
    let topic = topic_from_path(&ns, &topic)?;
    let r: NackRequest = parse_json(&body)?;
    check_offsets(&r.offsets)?;
    if r.delay_ms.is_some_and(|d| d > 86_400_000) {
        return Err(ApiError::invalid(
            "delay_ms",
            "delay_ms: at most 86400000 (one day)",
        ));
    }
    ok(api.service.nack(&topic, &sub, &r).await?)
}

async fn seek(State(api): State<Api>, Path((ns, topic, sub)): SubPath, body: Bytes) -> ApiResult {
    let topic = topic_from_path(&ns, &topic)?;
    let r: SeekRequest = parse_json(&body)?;
    let cursor = api
        .service
        .seek(&topic, &sub, r.offset, r.timestamp_ms)
        .await?;
    ok(json!({"topic": topic, "subscription": sub, "cursor": cursor}))
}

/// The body of a call that takes none: empty or `{}`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NoFields {}

fn no_fields(body: &Bytes) -> Result<(), ApiError> {
    if !body.iter().all(u8::is_ascii_whitespace) {
        parse_json::<NoFields>(body)?;
    }
    Ok(())
}

async fn pause(State(api): State<Api>, Path((ns, topic, sub)): SubPath, body: Bytes) -> ApiResult {
    let topic = topic_from_path(&ns, &topic)?;
    no_fields(&body)?;
    api.service.set_paused(&topic, &sub, true).await?;
    ok(json!({"topic": topic, "subscription": sub, "paused": true}))
}

async fn resume(State(api): State<Api>, Path((ns, topic, sub)): SubPath, body: Bytes) -> ApiResult {
    let topic = topic_from_path(&ns, &topic)?;
    no_fields(&body)?;
    api.service.set_paused(&topic, &sub, false).await?;
    ok(json!({"topic": topic, "subscription": sub, "paused": false}))
}

async fn state(State(api): State<Api>, Path((ns, topic, sub)): SubPath) -> ApiResult {
    let topic = topic_from_path(&ns, &topic)?;
    ok(api.service.state(&topic, &sub).await?)
}

async fn unsubscribe(State(api): State<Api>, Path((ns, topic, sub)): SubPath) -> ApiResult {
    let topic = topic_from_path(&ns, &topic)?;
    api.service.unsubscribe(&topic, &sub).await?;
    ok(json!({"topic": topic, "subscription": sub, "deleted": true}))
}

async fn replay_dlq(
    State(api): State<Api>,
    Path((ns, topic, sub)): SubPath,
    body: Bytes,
) -> ApiResult {
    let topic = topic_from_path(&ns, &topic)?;
    no_fields(&body)?;
    ok(api.service.replay_dlq(&topic, &sub).await?)
}

/// Most records in one central publish.
const MAX_PUBLISH_RECORDS: usize = 10_000;

/// `?ack=` of a publish: `durable` (default: the records are durable on
/// the topic's owner per its sync mode) or `archived` (also committed in
/// the archive, waited for up to `max_wait_ms`, default 120000, at most
/// [`MAX_ARCHIVE_WAIT_MS`]).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PublishQuery {
    #[serde(default)]
    ack: PublishAck,
    #[serde(default = "default_archive_wait")]
    max_wait_ms: u64,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum PublishAck {
    #[default]
    Durable,
    Archived,
}

fn default_archive_wait() -> u64 {
    120_000
}

/// Longest `?ack=archived` wait accepted, ms (10 min): a request is not a
/// place to wait for an archive that hours will not bring.
const MAX_ARCHIVE_WAIT_MS: u64 = 600_000;

async fn publish(
    State(api): State<Api>,
    Path((ns, topic)): Path<(String, String)>,
    query: Result<Query<PublishQuery>, QueryRejection>,
    headers: axum::http::HeaderMap,
    body: Bytes,
) -> ApiResult {
    let topic = topic_from_path(&ns, &topic)?;
    crate::admin::refuse_system_write(&topic)?;
    let Query(q) = query.map_err(|r| ApiError::invalid("query", r.body_text()))?;
    let key_values: Vec<&[u8]> = headers
        .get_all(broker_core::idempotency::HEADER)
        .iter()
        .map(|v| v.as_bytes())
        .collect();
    let key = broker_core::idempotency::request_key(&key_values)
        .map_err(|m| ApiError::invalid("Idempotency-Key", m))?;
    if q.max_wait_ms > MAX_ARCHIVE_WAIT_MS {
        return Err(ApiError::invalid(
            "max_wait_ms",
            format!(
                "max_wait_ms: at most {MAX_ARCHIVE_WAIT_MS}, got {}; nothing stored",
                q.max_wait_ms
            ),
        ));
    }
    let r: PublishRequest = parse_json(&body)?;
    if r.records.is_empty() || r.records.len() > MAX_PUBLISH_RECORDS {
        return Err(ApiError::invalid(
            "records",
            format!(
                "records: give 1 to {MAX_PUBLISH_RECORDS} records, got {}",
                r.records.len()
            ),
        ));
    }
    let now = api.service.now_ms();
    let mut out = Vec::with_capacity(r.records.len());
    for (i, rec) in r.records.into_iter().enumerate() {
        let field = |name: &str| format!("records[{i}].{name}");
        let value = match (rec.value, rec.value_b64) {
            (Some(text), None) => RecordBytes::from(text),
            (None, Some(b64)) => records::decode_b64(&field("value_b64"), &b64)
                .map_err(|e| ApiError::invalid(&field("value_b64"), e))?,
            _ => {
                return Err(ApiError::invalid(
                    &field("value"),
                    format!(
                        "{}: give exactly one of value and value_b64",
                        field("value")
                    ),
                ));
            }
        };
        let timestamp_ms = match rec.timestamp_ms {
            Some(ts) => tributary_proto::limits::check_timestamp_ms(ts).map_err(|why| {
                let name = field("timestamp_ms");
                ApiError::invalid(&name, format!("{name}: {why}"))
            })?,
            None => now,
        };
        out.push(Record {
            timestamp_ms,
            key: rec.key.map(RecordBytes::from),
            headers: rec
                .headers
                .into_iter()
                .map(|(k, v)| (k, RecordBytes::from(v)))
                .collect(),
            value,
        });
    }
    let count = u32::try_from(out.len()).unwrap_or(u32::MAX);
    let (base_offset, next_offset) = match key {
        // The body is the request: a retry sends the same bytes.
        Some(key) => {
            let fingerprint = broker_core::idempotency::fingerprint(&[&body]);
            let keyed = api
                .service
                .publish_idempotent(&topic, key, fingerprint, out)
                .await?;
            (keyed.base_offset, keyed.next_offset)
        }
        None => api.service.publish(&topic, out).await?,
    };
    let epoch = api.service.write_epoch(&topic);
    if q.ack == PublishAck::Archived
        && !api
            .service
            .wait_archived(
                &topic,
                base_offset,
                next_offset,
                epoch,
                std::time::Duration::from_millis(q.max_wait_ms),
            )
            .await?
    {
        return Err(ApiError::new(
            StatusCode::GATEWAY_TIMEOUT,
            "archive_pending",
            format!(
                "records {base_offset}..{next_offset} of {topic} are durable on its owner but not committed in the archive after {} ms (is the tier service running?); do not re-publish them",
                q.max_wait_ms
            ),
        )
        .with("base_offset", json!(base_offset))
        .with("next_offset", json!(next_offset)));
    }
    ok(PublishResponse {
        base_offset,
        next_offset,
        count,
    })
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PeekQuery {
    offset: Option<u64>,
    #[serde(default = "default_peek")]
    max_messages: u32,
    #[serde(default)]
    encoding: ValueEncoding,
}

fn default_peek() -> u32 {
    10
}

async fn peek(
    State(api): State<Api>,
    Path((ns, topic)): Path<(String, String)>,
    query: Result<Query<PeekQuery>, QueryRejection>,
) -> ApiResult {
    let topic = topic_from_path(&ns, &topic)?;
    let Query(q) = query.map_err(|r| ApiError::invalid("query", r.body_text()))?;
    if q.max_messages == 0 || q.max_messages > MAX_MESSAGES_PER_CALL {
        return Err(ApiError::invalid(
            "max_messages",
            format!("max_messages: must be 1 to {MAX_MESSAGES_PER_CALL}"),
        ));
    }
    ok(api
        .service
        .peek(&topic, q.offset, q.max_messages, q.encoding)
        .await?)
}
