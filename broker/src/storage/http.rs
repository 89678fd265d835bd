//! The `/v1/storage` endpoints the tier service calls (listed in
//! [`crate::admin`]): topics and segment descriptors, descriptor commits,
//! `trim`, `unload` and cold retention. Merged into the admin router by
//! [`routes`], under the same bearer token.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Extension, Path, Query, State};
use axum::http::StatusCode;
use axum::routing::{delete, get, post, put};
use broker_core::clock::now_ms;
use serde::Deserialize;
use serde_json::json;
use tributary_proto::archive::SegmentDescriptor;
use tributary_proto::keys::{StorageKey, StorageKeys, TopicName};

use super::{
    CommitOutcome, LocalSegments, StorageArchive, StorageError, TrimReport, UnloadOutcome, WalView,
    commit_verified, list_descriptors, retire_descriptor, retired_below, tiered_state, unload_step,
    verified_trim_offset,
};
use crate::admin::{AdminState, topic_from_path};
use crate::cluster::Cluster;
use crate::http::owner_route::fence_for;
use crate::http::{ApiError, ApiResult, ok, parse_json, query};

/// The storage routes, relative to `/v1`.
pub(crate) fn routes() -> Router<AdminState> {
    Router::new()
        .route("/storage/cluster", get(storage_cluster))
        .route("/storage/topics", get(list_storage_topics))
        .route(
            "/storage/topics/{namespace}/{topic}/segments",
            get(list_segments),
        )
        .route("/storage/descriptors", post(post_descriptor))
        .route("/storage/topics/{namespace}/{topic}/trim", post(trim_topic))
        .route(
            "/storage/topics/{namespace}/{topic}/unload",
            post(unload_topic),
        )
        .route(
            "/storage/topics/{namespace}/{topic}/segments/{start}",
            delete(retire_segment),
        )
        .route(
            "/storage/topics/{namespace}/{topic}/missing/{start}",
            put(mark_missing).delete(clear_missing),
        )
        .route(
            "/storage/topics/{namespace}/{topic}/lakehouse",
            put(super::lakehouse::put_progress),
        )
}

/// Storage errors as responses: `400 invalid_input` (field `descriptor`),
/// `404 not_found`, `409 conflict` (with `committed`) / `not_contiguous` /
/// `contended` / the refusal's kind (the rule, see `verify.rs`),
/// `503 archive_unavailable`, `500 internal`.
impl From<StorageError> for ApiError {
    fn from(err: StorageError) -> ApiError {
        let message = err.to_string();
        match err {
            StorageError::Invalid(_) => {
                ApiError::new(StatusCode::BAD_REQUEST, "invalid_input", message)
                    .with("field", json!("descriptor"))
            }
            StorageError::Conflict { committed, .. } => {
                ApiError::new(StatusCode::CONFLICT, "conflict", message)
                    .with("committed", json!(committed))
            }
            StorageError::NotContiguous { .. } => {
                ApiError::new(StatusCode::CONFLICT, "not_contiguous", message)
            }
            StorageError::Contended => ApiError::new(StatusCode::CONFLICT, "contended", message),
            StorageError::NotFound { .. } => {
                ApiError::new(StatusCode::NOT_FOUND, "not_found", message)
            }
            StorageError::Refused { kind, .. } => {
                ApiError::new(StatusCode::CONFLICT, kind, message)
            }
            StorageError::Archive(_) => {
                tracing::warn!(error = %err, "admin API: archive bucket unavailable");
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "archive_unavailable",
                    message,
                )
            }
            StorageError::Inconsistent(_) | StorageError::Metadata(_) => {
                tracing::error!(error = %err, "admin API: storage metadata failure");
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
            }
        }
    }
}

/// Longest wait of `GET /v1/storage/cluster` for the cluster id.
const CLUSTER_ID_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// `GET /v1/storage/cluster`: `{"cluster_id": "<uuid>"}`, the committed
/// `/cluster/id` (`null` until it exists), for the tier service, which
/// claims its archive prefix for this cluster (`docs/archive-format.md`,
/// "Prefix owner"). Unlike `GET /v1/cluster/status` it needs only the
/// `storage` permission (the `tier` role). A metadata read failure or
/// timeout is `503 unavailable`, never `null`: `null` would let the tier
/// service start without checking the prefix's owner.
async fn storage_cluster(State(state): State<AdminState>) -> ApiResult {
    let key = tributary_proto::keys::cluster::id();
    let unavailable =
        |message: String| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message);
    let value = tokio::time::timeout(CLUSTER_ID_READ_TIMEOUT, state.store.get(&key))
        .await
        .map_err(|_| unavailable(format!("reading {key} timed out")))?
        .map_err(|e| unavailable(format!("reading {key}: {e}")))?;
    ok(
        StatusCode::OK,
        json!({ "cluster_id": value.unwrap_or(serde_json::Value::Null) }),
    )
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PrefixQuery {
    prefix: Option<String>,
}

pub(super) fn storage_keys(
    params: Result<Query<PrefixQuery>, QueryRejection>,
) -> Result<StorageKeys, ApiError> {
    match query(params)?.prefix {
        None => Ok(StorageKeys::default()),
        Some(prefix) => StorageKeys::new(&prefix).map_err(|e| ApiError::name("prefix", e)),
    }
}

/// The keys of a write (commit, trim, unload, retire, missing marks): only
/// under this broker's `[archive]` prefix, where its own reads look. A
/// tier service with another `prefix` had its descriptors committed under
/// that prefix and the local copies trimmed, after which the broker found
/// the records nowhere (the config trial).
fn write_keys(
    params: Result<Query<PrefixQuery>, QueryRejection>,
    archive: Option<&Extension<StorageArchive>>,
) -> Result<StorageKeys, ApiError> {
    let keys = storage_keys(params)?;
    if let Some(Extension(StorageArchive(archive))) = archive
        && archive.keys().prefix() != keys.prefix()
    {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "prefix_mismatch",
            format!(
                "storage prefix {:?} is not this broker's [archive] prefix {:?}: set the tier service's `prefix` to the broker's (the broker reads archived records only under its own); nothing was changed",
                keys.prefix(),
                archive.keys().prefix()
            ),
        ));
    }
    Ok(keys)
}

async fn list_storage_topics(
    State(state): State<AdminState>,
    params: Result<Query<PrefixQuery>, QueryRejection>,
) -> ApiResult {
    let keys = storage_keys(params)?;
    let root = format!("{}/storage/topics/", keys.prefix());
    let mut counts: std::collections::BTreeMap<TopicName, u64> = std::collections::BTreeMap::new();
    for (key, _) in state.store.list(&root).await.map_err(StorageError::from)? {
        if let Ok(StorageKey::SegmentDescriptor { topic, .. }) = keys.parse(&key) {
            *counts.entry(topic).or_default() += 1;
        }
    }
    let mut topics = Vec::new();
    for (topic, segments) in counts {
        let tiered = tiered_state(&*state.store, &keys, &topic).await?;
        topics.push(json!({
            "topic": topic,
            "segments": segments,
            "cur": tiered.cur,
            "tiered_offset": tiered.tiered_offset,
        }));
    }
    ok(StatusCode::OK, json!({ "topics": topics }))
}

async fn list_segments(
    State(state): State<AdminState>,
    cluster: Option<Extension<Arc<Cluster>>>,
    Path((namespace, topic)): Path<(String, String)>,
    params: Result<Query<PrefixQuery>, QueryRejection>,
) -> ApiResult {
    let topic = topic_from_path(&namespace, &topic)?;
    let keys = storage_keys(params)?;
    let segments = list_descriptors(&*state.store, &keys, &topic).await?;
    let tiered = tiered_state(&*state.store, &keys, &topic).await?;
    let mut body = json!({
        "topic": topic,
        "segments": segments,
        "cur": tiered.cur,
        "tiered_offset": tiered.tiered_offset,
    });
    if let Some(below) = retired_below(&*state.store, &keys, &topic).await? {
        body["retired_below"] = json!(below);
    }
    // The lakehouse writer's progress, if it ever wrote this topic.
    if let Some(progress) = state
        .store
        .get(&keys.lakehouse(&topic))
        .await
        .map_err(StorageError::from)?
    {
        body["lakehouse"] = progress;
    }
    // Ownership (a cluster): the tier service uploads and commits only a
    // topic its broker serves now (`owned_here`).
    if let Some(Extension(cluster)) = &cluster {
        let (owner, epoch) = cluster.owner(&topic).unzip();
        body["owner"] = json!(owner);
        body["epoch"] = json!(epoch);
        // (A path call: the auth table test parses this file for router
        // calls, and a method call would read as one.)
        let route = Cluster::route(cluster, &topic);
        body["owned_here"] = json!(matches!(route, crate::cluster::Route::Local { .. }));
    }
    // Declared holes (Raft `/topics/{ns}/{topic}/holes/`): the tier service
    // puts those inside a segment's offsets into its archive object.
    let holes = crate::replication::topics::list_holes(&*state.store, &topic)
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()))?;
    if !holes.is_empty() {
        body["holes"] = json!(holes);
    }
    // The archive audit's marks: committed descriptors whose object is
    // missing or damaged.
    let missing: Vec<serde_json::Value> = state
        .store
        .list(&keys.missing_prefix(&topic))
        .await
        .map_err(StorageError::from)?
        .into_iter()
        .map(|(_, v)| v)
        .collect();
    if !missing.is_empty() {
        body["missing"] = json!(missing);
    }
    ok(StatusCode::OK, body)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CommitRequest {
    topic: String,
    descriptor: SegmentDescriptor,
}

/// The broker's local view of `topic`'s WAL, `None` without local WALs or
/// for a topic this broker does not hold.
async fn wal_view(
    segments: Option<&Arc<dyn LocalSegments>>,
    topic: &TopicName,
) -> Result<Option<WalView>, ApiError> {
    match segments {
        None => Ok(None),
        Some(segments) => segments
            .view(topic)
            .await
            .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e)),
    }
}

async fn post_descriptor(
    State(state): State<AdminState>,
    cluster: Option<Extension<Arc<Cluster>>>,
    segments: Option<Extension<Arc<dyn LocalSegments>>>,
    archive: Option<Extension<StorageArchive>>,
    params: Result<Query<PrefixQuery>, QueryRejection>,
    body: Bytes,
) -> ApiResult {
    let keys = write_keys(params, archive.as_ref())?;
    let request: CommitRequest = parse_json(&body)?;
    let topic = TopicName::new(&request.topic).map_err(|e| ApiError::name("topic", e))?;
    let cluster = cluster.map(|Extension(c)| c);
    let fence = fence_for(cluster.as_ref(), &topic)?;
    let segments = segments.map(|Extension(s)| s);
    let wal = wal_view(segments.as_ref(), &topic).await?;
    let archive = archive.map(|Extension(StorageArchive(a))| a);
    let (outcome, tiered) = commit_verified(
        &*state.store,
        &keys,
        &topic,
        &request.descriptor,
        wal.as_ref(),
        archive.as_deref(),
        fence.as_ref(),
    )
    .await?;
    if outcome == CommitOutcome::Committed {
        tracing::info!(%topic, start = request.descriptor.start_offset, end = request.descriptor.end_offset, object = %request.descriptor.object_id, "descriptor verified against the local WAL and the archive, committed");
    }
    let status = match outcome {
        CommitOutcome::Committed => StatusCode::CREATED,
        CommitOutcome::Unchanged => StatusCode::OK,
    };
    ok(
        status,
        json!({
            "outcome": outcome,
            "key": keys.segment_descriptor(&topic, request.descriptor.start_offset),
            "cur": tiered.cur,
            "tiered_offset": tiered.tiered_offset,
        }),
    )
}

/// The broker's local WALs, or 501 `not_supported` when this admin API runs
/// without them (a metadata-only broker).
fn local_segments(
    segments: Option<Extension<Arc<dyn LocalSegments>>>,
) -> Result<Arc<dyn LocalSegments>, ApiError> {
    segments.map(|Extension(segments)| segments).ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_IMPLEMENTED,
            "not_supported",
            "this broker does not expose its local WALs to the admin API",
        )
    })
}

async fn trim_topic(
    State(state): State<AdminState>,
    segments: Option<Extension<Arc<dyn LocalSegments>>>,
    archive: Option<Extension<StorageArchive>>,
    Path((namespace, topic)): Path<(String, String)>,
    params: Result<Query<PrefixQuery>, QueryRejection>,
) -> ApiResult {
    let topic = topic_from_path(&namespace, &topic)?;
    let keys = write_keys(params, archive.as_ref())?;
    let segments = local_segments(segments)?;
    let Some(Extension(StorageArchive(archive))) = archive else {
        return Err(StorageError::Refused {
            kind: "archive_not_configured",
            message: format!(
                "this broker has no [archive] section, so it cannot check that {topic}'s segments are archived; it trims nothing"
            ),
        }
        .into());
    };
    // The safe offset comes from Raft and the archive, never from the
    // caller nor from `segments/cur` alone: the end of the committed
    // descriptors that cover the log start without a gap, each object
    // re-verified now.
    let tiered = tiered_state(&*state.store, &keys, &topic).await?;
    let (report, safe) = match wal_view(Some(&segments), &topic).await? {
        Some(view) => {
            let safe = verified_trim_offset(&*state.store, &keys, &topic, &view, &archive).await?;
            let report = segments
                .trim(&topic, safe, now_ms())
                .await
                .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e))?;
            (report, Some(safe))
        }
        None => (TrimReport::default(), None),
    };
    ok(
        StatusCode::OK,
        json!({
            "topic": topic,
            "tiered_offset": tiered.tiered_offset,
            "verified_offset": safe,
            "wal_open": report.wal_open,
            "deleted": report.deleted,
            "log_start": report.log_start,
        }),
    )
}

async fn unload_topic(
    State(state): State<AdminState>,
    cluster: Option<Extension<Arc<Cluster>>>,
    segments: Option<Extension<Arc<dyn LocalSegments>>>,
    Path((namespace, topic)): Path<(String, String)>,
    archive: Option<Extension<StorageArchive>>,
    params: Result<Query<PrefixQuery>, QueryRejection>,
) -> ApiResult {
    let topic = topic_from_path(&namespace, &topic)?;
    let keys = write_keys(params, archive.as_ref())?;
    let segments = local_segments(segments)?;
    let cluster = cluster.map(|Extension(c)| c);
    let fence = fence_for(cluster.as_ref(), &topic)?;
    let sealed = segments
        .seal(&topic)
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e))?;
    let broker_id = state.cluster.status().node_id;
    match unload_step(
        &*state.store,
        &keys,
        &topic,
        sealed.next_offset,
        broker_id,
        now_ms(),
        fence.as_ref(),
    )
    .await?
    {
        UnloadOutcome::Unloaded(marker) => ok(
            StatusCode::OK,
            json!({
                "topic": topic,
                "outcome": "unloaded",
                "key": keys.topic_state(&topic),
                "state": marker,
            }),
        ),
        UnloadOutcome::Waiting {
            sealed_offset,
            tiered_offset,
        } => ok(
            StatusCode::ACCEPTED,
            json!({
                "topic": topic,
                "outcome": "sealed",
                "sealed_offset": sealed_offset,
                "tiered_offset": tiered_offset,
            }),
        ),
    }
}

async fn retire_segment(
    State(state): State<AdminState>,
    Path((namespace, topic, start)): Path<(String, String, String)>,
    archive: Option<Extension<StorageArchive>>,
    params: Result<Query<PrefixQuery>, QueryRejection>,
) -> ApiResult {
    let topic = topic_from_path(&namespace, &topic)?;
    let keys = write_keys(params, archive.as_ref())?;
    let start: u64 = start.parse().map_err(|_| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_input",
            format!("start offset {start:?} is not a number"),
        )
        .with("field", json!("start"))
    })?;
    let first = retire_descriptor(&*state.store, &keys, &topic, start).await?;
    ok(
        StatusCode::OK,
        json!({
            "topic": topic,
            "outcome": "deleted",
            "key": keys.segment_descriptor(&topic, start),
            "first_offset": first,
        }),
    )
}

/// A missing-object mark (`{prefix}/storage/topics/{ns}/{topic}/missing/{start:020}`),
/// as the archive audit writes it.
#[derive(Debug, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
struct MissingMark {
    /// Start offset of the descriptor (must equal the path's).
    start_offset: u64,
    /// Its last offset, inclusive.
    end_offset: u64,
    /// The object key.
    object_id: String,
    /// What the audit found (`missing`, `damaged: ...`).
    reason: String,
    /// Whether the broker's local WAL still holds the range (the audit then
    /// uploads it again and clears the mark).
    local_copy: bool,
    /// When the audit found it, ms since the Unix epoch.
    detected_at_ms: i64,
}

fn start_param(start: &str) -> Result<u64, ApiError> {
    start.parse().map_err(|_| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_input",
            format!("start offset {start:?} is not a number"),
        )
        .with("field", json!("start"))
    })
}

/// Writes a missing-object mark. With `[archive]` the broker first reads
/// the object's footer in its own bucket, as the audit does: an object
/// intact there refutes the mark (`409 object_intact`), so a tier service
/// pointed at another bucket cannot mark every archived segment missing.
async fn mark_missing(
    State(state): State<AdminState>,
    Path((namespace, topic, start)): Path<(String, String, String)>,
    params: Result<Query<PrefixQuery>, QueryRejection>,
    archive: Option<Extension<StorageArchive>>,
    body: Bytes,
) -> ApiResult {
    let topic = topic_from_path(&namespace, &topic)?;
    let keys = write_keys(params, archive.as_ref())?;
    let start = start_param(&start)?;
    let mark: MissingMark = parse_json(&body)?;
    if mark.start_offset != start || mark.end_offset < start {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_input",
            format!(
                "mark {}..={} does not start at the path's offset {start}",
                mark.start_offset, mark.end_offset
            ),
        )
        .with("field", json!("start_offset")));
    }
    let Some(descriptor) = state
        .store
        .get(&keys.segment_descriptor(&topic, start))
        .await
        .map_err(StorageError::from)?
    else {
        return Err(StorageError::NotFound {
            key: keys.segment_descriptor(&topic, start),
        }
        .into());
    };
    if let Some(Extension(StorageArchive(archive))) = archive {
        let descriptor: SegmentDescriptor = serde_json::from_value(descriptor).map_err(|e| {
            StorageError::Inconsistent(format!(
                "descriptor of {topic} at {start} does not parse: {e}"
            ))
        })?;
        match super::verify_object(&archive, &descriptor).await {
            Ok(()) => {
                return Err(StorageError::Refused {
                    kind: "object_intact",
                    message: format!(
                        "object {} of {topic} {start}..={} is intact in this broker's archive \
                         bucket (size and footer checksum as described): the reporting tier \
                         service reads another bucket or prefix; check its [store] against the \
                         broker's [archive.store]",
                        descriptor.object_id, descriptor.end_offset
                    ),
                }
                .into());
            }
            Err(StorageError::Refused { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let key = keys.missing(&topic, start);
    let value = json!(mark);
    state
        .store
        .put(&key, value.clone())
        .await
        .map_err(StorageError::from)?;
    tracing::error!(%topic, start, end = mark.end_offset, object = %mark.object_id, reason = %mark.reason, local_copy = mark.local_copy, "ARCHIVE DATA MISSING: the archive audit marked a committed segment's object");
    ok(StatusCode::OK, json!({ "key": key, "mark": value }))
}

async fn clear_missing(
    State(state): State<AdminState>,
    Path((namespace, topic, start)): Path<(String, String, String)>,
    archive: Option<Extension<StorageArchive>>,
    params: Result<Query<PrefixQuery>, QueryRejection>,
) -> ApiResult {
    let topic = topic_from_path(&namespace, &topic)?;
    let keys = write_keys(params, archive.as_ref())?;
    let start = start_param(&start)?;
    let key = keys.missing(&topic, start);
    state.store.delete(&key).await.map_err(StorageError::from)?;
    ok(StatusCode::OK, json!({ "key": key, "outcome": "cleared" }))
}
