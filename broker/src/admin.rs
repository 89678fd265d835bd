//! The broker's admin HTTP API (axum): namespaces, intent-backed topics,
//! subscription failure policies, declarative `apply` and cluster status.
//! Documented for operators, with curl examples, in `docs/admin-api.md`.
//!
//! Every route under `/v1` requires `Authorization: Bearer <token>`; the
//! token is compared in constant time (for a given presented length), and a
//! missing or wrong token is `401` with a JSON body and a
//! `WWW-Authenticate: Bearer` header. An empty configured token refuses
//! every request. `GET /health` needs no token.
//!
//! | method and path | what |
//! |---|---|
//! | `GET /health` | liveness, unauthenticated |
//! | `GET /v1/namespaces` | list namespaces |
//! | `POST /v1/namespaces` | create a namespace, body `{"name": "agents"}` |
//! | `GET /v1/topics[?namespace=ns]` | list topics |
//! | `POST /v1/topics` | create, body `{"name", "intent", "partitions"}` |
//! | `GET /v1/topics/{ns}/{topic}` | describe |
//! | `DELETE /v1/topics/{ns}/{topic}` | delete with partitions and all keys under them |
//! | `GET /v1/topics/{ns}/{topic}/subscriptions/{sub}/failure-policy` | the stored or inherited policy |
//! | `PUT …/failure-policy` | replace the policy (full body) |
//! | `PATCH …/failure-policy` | change some fields, keep the rest |
//! | `POST /v1/apply[?dry_run=true][&file=name]` | apply a YAML manifest (request body) |
//! | `GET /v1/cluster/status` | leader, members, term, last applied index |
//! | `GET /v1/storage/topics[?prefix=/tributary]` | topics with tiered segments: count, `cur`, tiered offset |
//! | `GET /v1/storage/topics/{ns}/{topic}/segments[?prefix=]` | a topic's segment descriptors, `cur`, tiered offset |
//! | `POST /v1/storage/descriptors[?prefix=]` | commit `{"topic", "descriptor"}`: descriptor + `segments/cur` in one Raft txn |
//! | `POST /v1/storage/topics/{ns}/{topic}/trim[?prefix=]` | apply local WAL retention with the committed tiered offset as the safe offset |
//! | `POST /v1/storage/topics/{ns}/{topic}/unload[?prefix=]` | seal the active segment; once everything is tiered, write the topic's `state` marker (`202` until then) |
//! | `DELETE /v1/storage/topics/{ns}/{topic}/segments/{start}[?prefix=]` | cold retention: remove the oldest descriptor (never `cur`) |
//!
//! The storage endpoints serve the tier service (`tier-service/`), which
//! runs beside the broker and commits what it uploaded through them; see
//! [`commit_descriptor`] for the rules a commit must pass. `trim` needs the
//! broker's WALs: [`with_local_segments`] wires them in (without it, `501
//! not_supported`).
//!
//! Errors are JSON: `{"error": "<message>", "kind": "<kind>", "field":
//! "<field>"?, …}` with `400 invalid_input` / `400 invalid_manifest` (bad
//! input naming the field, or every manifest issue in `errors`), `401
//! unauthorized`, `404 not_found`, `409 conflict` / `409 manifest_conflict`
//! (with `differences` or `errors`), `500 internal`, `501 not_supported`.
//!
//! The catalog semantics (what create, apply and the failure policies do)
//! live in [`broker_core::catalog`].

use std::future::Future;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Extension, Path, Query, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use broker_core::catalog::{
    Action, Catalog, CatalogError, FailurePolicyPatch, Manifest, ManifestErrors, TopicSpec,
};
use broker_core::metadata::{BoxFuture, MetadataError, MetadataStore, Txn, TxnOutcome};

use broker_core::clock::now_ms;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tributary_proto::archive::SegmentDescriptor;
use tributary_proto::intent::{StreamIntent, SubscriptionFailurePolicy};
use tributary_proto::keys::{
    NameError, NamespaceName, StorageKey, StorageKeys, SubscriptionName, TopicName,
};

use crate::raft::node::{ClusterStatus, MetaNode};

/// Default listen address of the admin API.
pub const DEFAULT_ADMIN_ADDR: &str = "127.0.0.1:7400";

/// Environment variable conventionally holding the admin bearer token (read
/// by `tribctl`; the broker's configuration decides where its token comes
/// from).
pub const TOKEN_ENV: &str = "TRIB_ADMIN_TOKEN";

/// File name used in manifest errors when the request names none.
pub const DEFAULT_MANIFEST_NAME: &str = "manifest";

/// The cluster as the admin API reports it: the broker's Raft [`MetaNode`],
/// or a fixed status in tests.
pub trait ClusterView: Send + Sync {
    /// Current status: this node, leader, term, members, last applied index.
    fn status(&self) -> ClusterStatus;
}

impl ClusterView for MetaNode {
    fn status(&self) -> ClusterStatus {
        MetaNode::status(self)
    }
}

/// What the handlers share.
#[derive(Clone)]
pub struct AdminState {
    /// The metadata store (the Raft node in the broker, redb in tests).
    pub store: Arc<dyn MetadataStore>,
    /// Cluster status source.
    pub cluster: Arc<dyn ClusterView>,
    /// The bearer token every `/v1` request must present. Empty refuses
    /// every request.
    pub token: Arc<str>,
}

impl std::fmt::Debug for AdminState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the token.
        f.debug_struct("AdminState").finish_non_exhaustive()
    }
}

/// The admin API's routes (see the module doc).
pub fn router(state: AdminState) -> Router {
    let v1 = Router::new()
        .route("/namespaces", get(list_namespaces).post(create_namespace))
        .route("/topics", get(list_topics).post(create_topic))
        .route(
            "/topics/{namespace}/{topic}",
            get(describe_topic).delete(delete_topic),
        )
        .route(
            "/topics/{namespace}/{topic}/subscriptions/{subscription}/failure-policy",
            get(get_failure_policy)
                .put(put_failure_policy)
                .patch(patch_failure_policy),
        )
        .route("/apply", post(apply))
        .route("/cluster/status", get(cluster_status))
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
            axum::routing::delete(retire_segment),
        )
        .route_layer(middleware::from_fn_with_state(state.clone(), require_token));
    Router::new()
        .route("/health", get(health))
        .nest("/v1", v1)
        .fallback(not_found)
        .with_state(state)
}

/// Serves [`router`] on `listener` until `shutdown` resolves, then finishes
/// the requests in flight.
///
/// # Errors
/// I/O errors of the listener.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AdminState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown)
        .await
}

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

/// An error response: status and JSON body `{"error", "kind", ...}`
/// (shared by the admin and consumer APIs).
#[derive(Debug)]
pub(crate) struct ApiError {
    status: StatusCode,
    body: serde_json::Map<String, Value>,
}

impl ApiError {
    /// An error with `status`, a machine-readable `kind` and a message.
    pub(crate) fn new(status: StatusCode, kind: &str, message: impl Into<String>) -> ApiError {
        let mut body = serde_json::Map::new();
        body.insert("error".into(), Value::String(message.into()));
        body.insert("kind".into(), Value::String(kind.into()));
        ApiError { status, body }
    }

    /// Adds a field to the JSON body.
    pub(crate) fn with(mut self, key: &str, value: Value) -> ApiError {
        self.body.insert(key.to_owned(), value);
        self
    }

    /// A 400 `invalid_input` naming `field`.
    pub(crate) fn invalid(field: &str, message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_input", message).with("field", json!(field))
    }

    fn name(field: &'static str, source: NameError) -> ApiError {
        ApiError::from(CatalogError::InvalidName { field, source })
    }
}

impl From<CatalogError> for ApiError {
    fn from(err: CatalogError) -> ApiError {
        let message = err.to_string();
        let field = err.field().map(str::to_owned);
        let error = match &err {
            CatalogError::InvalidIntent(_) => {
                let names: Vec<&str> = StreamIntent::ALL
                    .iter()
                    .flat_map(|i| std::iter::once(i.as_str()).chain(i.aliases().iter().copied()))
                    .collect();
                ApiError::new(StatusCode::BAD_REQUEST, "invalid_input", message)
                    .with("valid_intents", json!(names))
            }
            CatalogError::TopicNotFound { .. } | CatalogError::NamespaceNotFound { .. } => {
                ApiError::new(StatusCode::NOT_FOUND, "not_found", message)
            }
            CatalogError::TopicConflict { differences, .. } => {
                ApiError::new(StatusCode::CONFLICT, "conflict", message)
                    .with("differences", json!(differences))
            }
            CatalogError::IsPartition { .. } | CatalogError::ConcurrentChange { .. } => {
                ApiError::new(StatusCode::CONFLICT, "conflict", message)
            }
            CatalogError::InvalidManifest(errors) => {
                ApiError::new(StatusCode::BAD_REQUEST, "invalid_manifest", message)
                    .with("errors", json!(errors.issues))
            }
            CatalogError::ManifestConflict(errors) => {
                ApiError::new(StatusCode::CONFLICT, "manifest_conflict", message)
                    .with("errors", json!(errors.issues))
            }
            CatalogError::Inconsistent { .. } | CatalogError::Metadata(_) => {
                tracing::error!(error = %err, "admin API: metadata failure");
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
            }
            _ => ApiError::new(StatusCode::BAD_REQUEST, "invalid_input", message),
        };
        match field {
            Some(field) => error.with("field", json!(field)),
            None => error,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(Value::Object(self.body))).into_response()
    }
}

pub(crate) type ApiResult = Result<Response, ApiError>;

fn ok(status: StatusCode, body: impl serde::Serialize) -> ApiResult {
    Ok((status, axum::Json(body)).into_response())
}

/// Decodes a JSON body, naming the offending field on failure.
fn parse_json<T: DeserializeOwned>(body: &Bytes) -> Result<T, ApiError> {
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(&mut deserializer).map_err(|err| {
        let path = err.path().to_string();
        let inner = err.into_inner();
        if path == "." {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_input",
                format!("request body: {inner}"),
            )
        } else {
            ApiError::invalid(&path, format!("{path}: {inner}"))
        }
    })
}

fn query<T>(query: Result<Query<T>, QueryRejection>) -> Result<T, ApiError> {
    query
        .map(|Query(q)| q)
        .map_err(|rejection| ApiError::invalid("query", rejection.body_text()))
}

fn topic_from_path(namespace: &str, topic: &str) -> Result<TopicName, ApiError> {
    let namespace = NamespaceName::new(namespace).map_err(|e| ApiError::name("namespace", e))?;
    TopicName::from_parts(&namespace, topic).map_err(|e| ApiError::name("topic", e))
}

// ---------------------------------------------------------------------------
// Authentication
// ---------------------------------------------------------------------------

/// Compares two byte strings in time that depends only on their lengths.
pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = u64::from(a.len() != b.len());
    for i in 0..a.len().max(b.len()) {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= u64::from(x ^ y);
    }
    std::hint::black_box(diff) == 0
}

fn unauthorized(message: &str) -> Response {
    let mut response =
        ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", message).into_response();
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"tributary-admin\""),
    );
    response
}

/// Checks the request's `Authorization: Bearer` token against `token` (an
/// empty configured token admits nobody): `None` when it matches, else the
/// 401 response to send, with `WWW-Authenticate`.
pub(crate) fn reject_unauthorized(request: &Request, token: &str) -> Option<Response> {
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim());
    match presented {
        None => Some(unauthorized(
            "missing bearer token: send Authorization: Bearer <token>",
        )),
        Some(presented)
            if !token.is_empty() && constant_time_eq(presented.as_bytes(), token.as_bytes()) =>
        {
            None
        }
        Some(_) => Some(unauthorized("invalid bearer token")),
    }
}

async fn require_token(State(state): State<AdminState>, request: Request, next: Next) -> Response {
    match reject_unauthorized(&request, &state.token) {
        None => next.run(request).await,
        Some(response) => response,
    }
}

// ---------------------------------------------------------------------------
// Handlers
// ---------------------------------------------------------------------------

async fn health() -> axum::Json<Value> {
    axum::Json(json!({"status": "ok"}))
}

async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such endpoint")
}

fn status_of(action: Action) -> StatusCode {
    match action {
        Action::Create => StatusCode::CREATED,
        Action::Update | Action::Unchanged => StatusCode::OK,
    }
}

async fn list_namespaces(State(state): State<AdminState>) -> ApiResult {
    let namespaces = Catalog::new(&*state.store).list_namespaces().await?;
    ok(StatusCode::OK, json!({ "namespaces": namespaces }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateNamespaceRequest {
    name: String,
}

async fn create_namespace(State(state): State<AdminState>, body: Bytes) -> ApiResult {
    let request: CreateNamespaceRequest = parse_json(&body)?;
    let namespace = NamespaceName::new(&request.name).map_err(|e| ApiError::name("name", e))?;
    let action = Catalog::new(&*state.store)
        .create_namespace(&namespace)
        .await?;
    ok(
        status_of(action),
        json!({ "namespace": namespace, "action": action }),
    )
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListTopicsQuery {
    namespace: Option<String>,
}

async fn list_topics(
    State(state): State<AdminState>,
    params: Result<Query<ListTopicsQuery>, QueryRejection>,
) -> ApiResult {
    let params = query(params)?;
    let namespace = params
        .namespace
        .as_deref()
        .map(NamespaceName::new)
        .transpose()
        .map_err(|e| ApiError::name("namespace", e))?;
    let topics = Catalog::new(&*state.store)
        .list_topics(namespace.as_ref())
        .await?;
    ok(StatusCode::OK, json!({ "topics": topics }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateTopicRequest {
    name: String,
    intent: String,
    #[serde(default)]
    partitions: i64,
}

async fn create_topic(State(state): State<AdminState>, body: Bytes) -> ApiResult {
    let request: CreateTopicRequest = parse_json(&body)?;
    let spec = TopicSpec::parse(&request.name, &request.intent, request.partitions)?;
    let outcome = Catalog::new(&*state.store).create_topic(&spec).await?;
    ok(status_of(outcome.action), outcome)
}

async fn describe_topic(
    State(state): State<AdminState>,
    Path((namespace, topic)): Path<(String, String)>,
) -> ApiResult {
    let topic = topic_from_path(&namespace, &topic)?;
    let candidates: Vec<u64> = state.cluster.status().members.keys().copied().collect();
    let description = Catalog::new(&*state.store)
        .describe(&topic, &candidates)
        .await?;
    ok(StatusCode::OK, description)
}

async fn delete_topic(
    State(state): State<AdminState>,
    Path((namespace, topic)): Path<(String, String)>,
) -> ApiResult {
    let topic = topic_from_path(&namespace, &topic)?;
    let outcome = Catalog::new(&*state.store).delete_topic(&topic).await?;
    ok(StatusCode::OK, outcome)
}

fn policy_path(
    namespace: &str,
    topic: &str,
    subscription: &str,
) -> Result<(TopicName, SubscriptionName), ApiError> {
    let topic = topic_from_path(namespace, topic)?;
    let subscription =
        SubscriptionName::new(subscription).map_err(|e| ApiError::name("subscription", e))?;
    Ok((topic, subscription))
}

async fn get_failure_policy(
    State(state): State<AdminState>,
    Path((namespace, topic, subscription)): Path<(String, String, String)>,
) -> ApiResult {
    let (topic, subscription) = policy_path(&namespace, &topic, &subscription)?;
    let view = Catalog::new(&*state.store)
        .failure_policy(&topic, &subscription)
        .await?;
    ok(StatusCode::OK, view)
}

async fn put_failure_policy(
    State(state): State<AdminState>,
    Path((namespace, topic, subscription)): Path<(String, String, String)>,
    body: Bytes,
) -> ApiResult {
    let (topic, subscription) = policy_path(&namespace, &topic, &subscription)?;
    let policy: SubscriptionFailurePolicy = parse_json(&body)?;
    let view = Catalog::new(&*state.store)
        .set_failure_policy(&topic, &subscription, &policy)
        .await?;
    ok(StatusCode::OK, view)
}

async fn patch_failure_policy(
    State(state): State<AdminState>,
    Path((namespace, topic, subscription)): Path<(String, String, String)>,
    body: Bytes,
) -> ApiResult {
    let (topic, subscription) = policy_path(&namespace, &topic, &subscription)?;
    let patch: FailurePolicyPatch = parse_json(&body)?;
    let view = Catalog::new(&*state.store)
        .patch_failure_policy(&topic, &subscription, &patch)
        .await?;
    ok(StatusCode::OK, view)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ApplyQuery {
    #[serde(default)]
    dry_run: bool,
    file: Option<String>,
}

/// Parses manifest text (YAML, and so also JSON) into a validated
/// [`Manifest`]; `file` names it in every issue.
///
/// # Errors
/// [`CatalogError::InvalidManifest`]: text that is not UTF-8 or not YAML
/// (with line and column), or every validation issue.
pub fn parse_manifest(file: &str, text: &[u8]) -> Result<Manifest, CatalogError> {
    let text = std::str::from_utf8(text).map_err(|e| {
        CatalogError::InvalidManifest(ManifestErrors::document(
            file,
            format!("not UTF-8 text: {e}"),
        ))
    })?;
    let document: Value = if text.trim().is_empty() {
        Value::Null
    } else {
        // Through YAML's own value first: it refuses duplicate keys, which
        // a JSON map would silently collapse to the last one.
        let invalid = |message: String| {
            CatalogError::InvalidManifest(ManifestErrors::document(file, message))
        };
        let yaml: serde_yaml_ng::Value =
            serde_yaml_ng::from_str(text).map_err(|e| invalid(format!("not valid YAML: {e}")))?;
        serde_json::to_value(&yaml).map_err(|e| invalid(format!("not a manifest document: {e}")))?
    };
    Manifest::from_value(file, &document).map_err(CatalogError::InvalidManifest)
}

async fn apply(
    State(state): State<AdminState>,
    params: Result<Query<ApplyQuery>, QueryRejection>,
    body: Bytes,
) -> ApiResult {
    let params = query(params)?;
    let file = params.file.as_deref().unwrap_or(DEFAULT_MANIFEST_NAME);
    let manifest = parse_manifest(file, &body)?;
    let report = Catalog::new(&*state.store)
        .apply(&manifest, params.dry_run)
        .await?;
    ok(StatusCode::OK, report)
}

async fn cluster_status(State(state): State<AdminState>) -> ApiResult {
    ok(StatusCode::OK, state.cluster.status())
}

// ---------------------------------------------------------------------------
// Storage: segment descriptors (tier service)
// ---------------------------------------------------------------------------

/// Access to the broker's local topic WALs for the `trim` endpoint.
pub trait LocalSegments: Send + Sync {
    /// Applies `topic`'s local retention with `safe_offset` as the safe
    /// offset: only sealed segments entirely below it may be deleted, and
    /// only while a retention limit asks for it
    /// ([`broker_core::wal::Wal::apply_retention`]).
    fn trim<'a>(
        &'a self,
        topic: &'a TopicName,
        safe_offset: u64,
        now_ms: i64,
    ) -> BoxFuture<'a, Result<TrimReport, String>>;

    /// Seals `topic`'s active segment (if it holds records) so everything
    /// written so far can be tiered, for an unload. `None` when the topic
    /// has no local WAL. The default refuses (not supported).
    fn seal<'a>(&'a self, topic: &'a TopicName) -> BoxFuture<'a, Result<SealReport, String>> {
        let _ = topic;
        Box::pin(async { Err("sealing is not supported by this broker".to_owned()) })
    }
}

/// What a `seal` did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SealReport {
    /// Offset just past the last record stored locally (every offset below
    /// it is now in a sealed segment); `None` without a local WAL.
    pub next_offset: Option<u64>,
}

/// What a `trim` did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrimReport {
    /// Whether the topic's WAL is open on this broker (nothing is trimmed
    /// otherwise).
    pub wal_open: bool,
    /// `(base_offset, next_offset, bytes)` of each deleted segment.
    pub deleted: Vec<(u64, u64, u64)>,
    /// First offset still stored locally, when the WAL is open.
    pub log_start: Option<u64>,
}

/// The topic's WAL, opened if no edge or publisher opened it since the
/// broker started (a trim or an unload must not wait for one); `None` for a
/// topic the catalog does not know.
async fn open_local(
    topics: &crate::topics::TopicStore,
    topic: &TopicName,
) -> Result<Option<Arc<broker_core::wal::Wal>>, String> {
    match topics.open_existing(topic, false).await {
        Ok(wal) => Ok(Some(wal)),
        Err(crate::topics::TopicError::Catalog(CatalogError::TopicNotFound { .. })) => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

impl LocalSegments for crate::topics::TopicStore {
    fn trim<'a>(
        &'a self,
        topic: &'a TopicName,
        safe_offset: u64,
        now_ms: i64,
    ) -> BoxFuture<'a, Result<TrimReport, String>> {
        Box::pin(async move {
            // A WAL not opened since the broker started (no edge wrote to
            // the topic yet) is opened now: trims must not wait for an edge.
            let Some(wal) = open_local(self, topic).await? else {
                return Ok(TrimReport::default());
            };
            let report =
                tokio::task::spawn_blocking(move || wal.apply_retention(safe_offset, now_ms))
                    .await
                    .map_err(|e| e.to_string())?
                    .map_err(|e| e.to_string())?;
            Ok(TrimReport {
                wal_open: true,
                deleted: report.deleted,
                log_start: Some(report.log_start),
            })
        })
    }

    fn seal<'a>(&'a self, topic: &'a TopicName) -> BoxFuture<'a, Result<SealReport, String>> {
        Box::pin(async move {
            let Some(wal) = open_local(self, topic).await? else {
                return Ok(SealReport::default());
            };
            wal.roll().await.map_err(|e| e.to_string())?;
            Ok(SealReport {
                next_offset: Some(wal.next_offset()),
            })
        })
    }
}

/// Adds the broker's local WALs to `router` so `POST
/// /v1/storage/topics/{ns}/{topic}/trim` can apply retention.
pub fn with_local_segments(router: Router, segments: Arc<dyn LocalSegments>) -> Router {
    router.layer(Extension(segments))
}

/// A topic's committed storage state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TieredState {
    /// Start offset of the descriptor `segments/cur` points to.
    pub cur: Option<u64>,
    /// Offset just past the `cur` descriptor's last record: every offset
    /// below it (from the first descriptor's start) is in committed
    /// segments. The safe offset for the broker's local retention.
    pub tiered_offset: Option<u64>,
}

/// The outcome of [`commit_descriptor`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CommitOutcome {
    /// Descriptor (and `cur`, when it moved) written in one transaction.
    Committed,
    /// The same object's descriptor was already committed: nothing written.
    Unchanged,
}

/// Why a descriptor was not committed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StorageError {
    /// The descriptor contradicts itself or its key.
    #[error("invalid descriptor: {0}")]
    Invalid(String),
    /// Another descriptor is committed at the same start offset.
    #[error("a different descriptor is committed at {key}")]
    Conflict {
        /// Its key.
        key: String,
        /// The committed one.
        committed: Box<SegmentDescriptor>,
    },
    /// The descriptor does not continue the committed segments.
    #[error("segment {start}..={end} does not continue the committed segments: {reason}")]
    NotContiguous {
        /// Its start offset.
        start: u64,
        /// Its end offset.
        end: u64,
        /// Gap or overlap, with the neighbour.
        reason: String,
    },
    /// Committed metadata that does not parse (a damaged store).
    #[error("stored storage metadata is inconsistent: {0}")]
    Inconsistent(String),
    /// Concurrent commits kept changing `segments/cur`.
    #[error("segments/cur kept changing; retry")]
    Contended,
    /// No descriptor at that start offset.
    #[error("no committed descriptor at {key}")]
    NotFound {
        /// The descriptor key.
        key: String,
    },
    /// A cold-retention delete that would break the committed range: not
    /// the oldest descriptor, or the `cur` one.
    #[error("{message}")]
    Refused {
        /// `not_oldest` or `is_cur`.
        kind: &'static str,
        /// Why.
        message: String,
    },
    /// The metadata store failed.
    #[error(transparent)]
    Metadata(#[from] MetadataError),
}

fn decode_descriptor(key: &str, value: Value) -> Result<SegmentDescriptor, StorageError> {
    serde_json::from_value(value)
        .map_err(|e| StorageError::Inconsistent(format!("{key}: not a segment descriptor: {e}")))
}

/// The committed `cur` and tiered offset of `topic`.
///
/// # Errors
/// [`StorageError::Inconsistent`] if `cur` points at a missing or
/// malformed descriptor; metadata errors.
pub async fn tiered_state(
    store: &dyn MetadataStore,
    keys: &StorageKeys,
    topic: &TopicName,
) -> Result<TieredState, StorageError> {
    let cur_key = keys.segments_cur(topic);
    let Some(cur) = store.get(&cur_key).await? else {
        return Ok(TieredState {
            cur: None,
            tiered_offset: None,
        });
    };
    let start = cur
        .as_str()
        .and_then(|v| StorageKeys::parse_segments_cur_value(v).ok())
        .ok_or_else(|| {
            StorageError::Inconsistent(format!("{cur_key}: {cur} is not a padded offset"))
        })?;
    let key = keys.segment_descriptor(topic, start);
    let value = store
        .get(&key)
        .await?
        .ok_or_else(|| StorageError::Inconsistent(format!("{cur_key} points at missing {key}")))?;
    let descriptor = decode_descriptor(&key, value)?;
    Ok(TieredState {
        cur: Some(start),
        tiered_offset: Some(descriptor.next_offset()),
    })
}

/// The committed tiered offset of `topic` (see [`TieredState`]): what the
/// broker's local retention may use as its safe offset.
///
/// # Errors
/// As [`tiered_state`].
pub async fn tiered_offset(
    store: &dyn MetadataStore,
    keys: &StorageKeys,
    topic: &TopicName,
) -> Result<Option<u64>, StorageError> {
    Ok(tiered_state(store, keys, topic).await?.tiered_offset)
}

/// Every committed descriptor of `topic`, by start offset.
///
/// # Errors
/// [`StorageError::Inconsistent`] for a value that is not a descriptor;
/// metadata errors.
pub async fn list_descriptors(
    store: &dyn MetadataStore,
    keys: &StorageKeys,
    topic: &TopicName,
) -> Result<Vec<SegmentDescriptor>, StorageError> {
    let mut out = Vec::new();
    for (key, value) in store.list(&keys.segments_prefix(topic)).await? {
        if let Ok(StorageKey::SegmentDescriptor { .. }) = keys.parse(&key) {
            out.push(decode_descriptor(&key, value)?);
        }
    }
    Ok(out)
}

/// The cold-retention low mark of `topic`: offsets below it were removed
/// from the archive on purpose ([`retire_descriptor`]); `None` if nothing
/// was.
///
/// # Errors
/// [`StorageError::Inconsistent`] for a malformed value; metadata errors.
pub async fn retired_below(
    store: &dyn MetadataStore,
    keys: &StorageKeys,
    topic: &TopicName,
) -> Result<Option<u64>, StorageError> {
    let key = keys.retired(topic);
    match store.get(&key).await? {
        None => Ok(None),
        Some(v) => v["below_offset"]
            .as_u64()
            .map(Some)
            .ok_or_else(|| StorageError::Inconsistent(format!("{key}: {v} has no below_offset"))),
    }
}

/// Most attempts of [`commit_descriptor`] when concurrent commits move
/// `segments/cur` under it.
const COMMIT_ATTEMPTS_MAX: usize = 8;

/// Commits `descriptor` of `topic`: the descriptor at
/// `segments/{start:020}` and, when it extends the committed range,
/// `segments/cur`, in one transaction.
///
/// Rules:
/// - the descriptor is self-consistent and its `object_id` is the
///   deterministic object key of its range;
/// - a descriptor of the same object already committed is
///   [`CommitOutcome::Unchanged`] (idempotent redo); a different one is a
///   [`StorageError::Conflict`];
/// - a descriptor past `cur` must start exactly at the `cur`
///   descriptor's next offset (no gap, no overlap), so every offset below
///   the tiered offset is in a committed segment; one below `cur` (a
///   repair) must not overlap its neighbours and leaves `cur` alone.
///
/// # Errors
/// [`StorageError`] as above; metadata errors.
pub async fn commit_descriptor(
    store: &dyn MetadataStore,
    keys: &StorageKeys,
    topic: &TopicName,
    descriptor: &SegmentDescriptor,
) -> Result<(CommitOutcome, TieredState), StorageError> {
    descriptor
        .validate()
        .map_err(|e| StorageError::Invalid(e.to_owned()))?;
    let expected_object =
        keys.segment_object(topic, descriptor.start_offset, descriptor.end_offset);
    if descriptor.object_id != expected_object {
        return Err(StorageError::Invalid(format!(
            "object_id {:?} is not the segment's object key {expected_object:?}",
            descriptor.object_id
        )));
    }
    let key = keys.segment_descriptor(topic, descriptor.start_offset);
    let cur_key = keys.segments_cur(topic);
    let value =
        serde_json::to_value(descriptor).map_err(|e| StorageError::Invalid(e.to_string()))?;
    if let Some(below) = retired_below(store, keys, topic).await?
        && descriptor.start_offset < below
    {
        return Err(StorageError::Refused {
            kind: "retired",
            message: format!(
                "offsets below {below} were removed by cold retention; segment {}..={} is not committed again",
                descriptor.start_offset, descriptor.end_offset
            ),
        });
    }
    for _ in 0..COMMIT_ATTEMPTS_MAX {
        if let Some(existing) = store.get(&key).await? {
            let existing = decode_descriptor(&key, existing)?;
            if existing.same_object(descriptor) {
                return Ok((
                    CommitOutcome::Unchanged,
                    tiered_state(store, keys, topic).await?,
                ));
            }
            return Err(StorageError::Conflict {
                key,
                committed: Box::new(existing),
            });
        }
        let state = tiered_state(store, keys, topic).await?;
        let cur_value = store.get(&cur_key).await?;
        let not_contiguous = |reason: String| StorageError::NotContiguous {
            start: descriptor.start_offset,
            end: descriptor.end_offset,
            reason,
        };
        let moves_cur = match (state.cur, state.tiered_offset) {
            (Some(cur), Some(tiered)) if descriptor.start_offset > cur => {
                if descriptor.start_offset != tiered {
                    return Err(not_contiguous(format!(
                        "the committed segments end at offset {tiered}"
                    )));
                }
                true
            }
            (Some(_), _) => {
                // A repair below `cur`: must fit between its neighbours.
                for other in list_descriptors(store, keys, topic).await? {
                    if other.start_offset <= descriptor.end_offset
                        && descriptor.start_offset <= other.end_offset
                    {
                        return Err(not_contiguous(format!(
                            "overlaps committed segment {}..={}",
                            other.start_offset, other.end_offset
                        )));
                    }
                }
                false
            }
            (None, _) => true,
        };
        let mut txn = Txn::new().when_absent(key.clone());
        txn = match &cur_value {
            Some(v) => txn.when_equals(cur_key.clone(), v.clone()),
            None => txn.when_absent(cur_key.clone()),
        };
        txn = txn.put(key.clone(), value.clone());
        if moves_cur {
            txn = txn.put(
                cur_key.clone(),
                Value::String(StorageKeys::segments_cur_value(descriptor.start_offset)),
            );
        }
        match store.txn(txn).await? {
            TxnOutcome::Applied => {
                let state = if moves_cur {
                    TieredState {
                        cur: Some(descriptor.start_offset),
                        tiered_offset: Some(descriptor.next_offset()),
                    }
                } else {
                    state
                };
                return Ok((CommitOutcome::Committed, state));
            }
            TxnOutcome::ConditionFailed { .. } => continue,
        }
    }
    Err(StorageError::Contended)
}

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
            StorageError::Inconsistent(_) | StorageError::Metadata(_) => {
                tracing::error!(error = %err, "admin API: storage metadata failure");
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
            }
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PrefixQuery {
    prefix: Option<String>,
}

fn storage_keys(
    params: Result<Query<PrefixQuery>, QueryRejection>,
) -> Result<StorageKeys, ApiError> {
    match query(params)?.prefix {
        None => Ok(StorageKeys::default()),
        Some(prefix) => StorageKeys::new(&prefix).map_err(|e| ApiError::name("prefix", e)),
    }
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
    ok(StatusCode::OK, body)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CommitRequest {
    topic: String,
    descriptor: SegmentDescriptor,
}

async fn post_descriptor(
    State(state): State<AdminState>,
    params: Result<Query<PrefixQuery>, QueryRejection>,
    body: Bytes,
) -> ApiResult {
    let keys = storage_keys(params)?;
    let request: CommitRequest = parse_json(&body)?;
    let topic = TopicName::new(&request.topic).map_err(|e| ApiError::name("topic", e))?;
    let (outcome, tiered) =
        commit_descriptor(&*state.store, &keys, &topic, &request.descriptor).await?;
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
    Path((namespace, topic)): Path<(String, String)>,
    params: Result<Query<PrefixQuery>, QueryRejection>,
) -> ApiResult {
    let topic = topic_from_path(&namespace, &topic)?;
    let keys = storage_keys(params)?;
    let segments = local_segments(segments)?;
    // The safe offset comes from Raft, never from the caller: a segment is
    // deleted only once its descriptor is committed.
    let tiered = tiered_state(&*state.store, &keys, &topic).await?;
    let report = match tiered.tiered_offset {
        Some(safe) => segments
            .trim(&topic, safe, now_ms())
            .await
            .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e))?,
        None => TrimReport::default(),
    };
    ok(
        StatusCode::OK,
        json!({
            "topic": topic,
            "tiered_offset": tiered.tiered_offset,
            "wal_open": report.wal_open,
            "deleted": report.deleted,
            "log_start": report.log_start,
        }),
    )
}

/// The sealed mobility marker of a topic, at
/// `{prefix}/storage/topics/{ns}/{topic}/state` (JSON, field names from the
/// metadata seed), written when a topic is unloaded: every record the
/// broker stored is in committed segments, so another broker can continue
/// at `next_offset`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicState {
    /// Always true when written by an unload.
    pub sealed: bool,
    /// The last offset stored and committed (inclusive); `None` when the
    /// topic never held a record.
    pub last_committed_offset: Option<u64>,
    /// Where another broker continues: `last_committed_offset + 1`, or 0.
    pub next_offset: u64,
    /// Raft node id of the broker that unloaded the topic.
    pub broker_id: u64,
    /// When, ms since the Unix epoch.
    pub timestamp: i64,
}

/// The outcome of [`unload_step`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UnloadOutcome {
    /// Every local record is committed: the state marker was written.
    Unloaded(TopicState),
    /// Sealed, but the tier service has not committed everything yet.
    Waiting {
        /// Offset just past the last local record.
        sealed_offset: u64,
        /// The committed tiered offset.
        tiered_offset: Option<u64>,
    },
}

/// One step of an unload: with the local WAL sealed up to `local_next`
/// (`None`: no local WAL), writes the `state` marker once the committed
/// tiered offset reaches it, guarded by `segments/cur` so a concurrent
/// commit cannot slip in between the check and the write.
///
/// # Errors
/// [`StorageError::Contended`] if `segments/cur` moved meanwhile (call
/// again); metadata errors.
pub async fn unload_step(
    store: &dyn MetadataStore,
    keys: &StorageKeys,
    topic: &TopicName,
    local_next: Option<u64>,
    broker_id: u64,
    now_ms: i64,
) -> Result<UnloadOutcome, StorageError> {
    let cur_key = keys.segments_cur(topic);
    let cur_value = store.get(&cur_key).await?;
    let tiered = tiered_state(store, keys, topic).await?;
    let tiered_offset = tiered.tiered_offset.unwrap_or(0);
    let local = local_next.unwrap_or(0);
    if tiered_offset < local {
        return Ok(UnloadOutcome::Waiting {
            sealed_offset: local,
            tiered_offset: tiered.tiered_offset,
        });
    }
    let next_offset = tiered_offset.max(local);
    let state = TopicState {
        sealed: true,
        last_committed_offset: next_offset.checked_sub(1),
        next_offset,
        broker_id,
        timestamp: now_ms,
    };
    let value = serde_json::to_value(&state).map_err(|e| StorageError::Invalid(e.to_string()))?;
    let txn = match cur_value {
        Some(v) => Txn::new().when_equals(cur_key, v),
        None => Txn::new().when_absent(cur_key),
    }
    .put(keys.topic_state(topic), value);
    match store.txn(txn).await? {
        TxnOutcome::Applied => Ok(UnloadOutcome::Unloaded(state)),
        TxnOutcome::ConditionFailed { .. } => Err(StorageError::Contended),
    }
}

async fn unload_topic(
    State(state): State<AdminState>,
    segments: Option<Extension<Arc<dyn LocalSegments>>>,
    Path((namespace, topic)): Path<(String, String)>,
    params: Result<Query<PrefixQuery>, QueryRejection>,
) -> ApiResult {
    let topic = topic_from_path(&namespace, &topic)?;
    let keys = storage_keys(params)?;
    let segments = local_segments(segments)?;
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

/// Cold retention: removes the descriptor at `start`, which must be the
/// oldest committed one and not the one `segments/cur` points to (the
/// newest segment is always kept, so the tiered offset stays defined and
/// the committed range stays contiguous). Guarded by a transaction on the
/// descriptor's value and `cur`. Returns the start offset of the oldest
/// descriptor left. The caller deletes the object afterwards (descriptor
/// first: a descriptor never points at a deleted object; a crash in
/// between leaves an orphan object below the oldest descriptor, which the
/// tier service's reconciliation deletes).
///
/// # Errors
/// [`StorageError::NotFound`], [`StorageError::Refused`] (`not_oldest`,
/// `is_cur`), [`StorageError::Contended`]; metadata errors.
pub async fn retire_descriptor(
    store: &dyn MetadataStore,
    keys: &StorageKeys,
    topic: &TopicName,
    start: u64,
) -> Result<u64, StorageError> {
    let key = keys.segment_descriptor(topic, start);
    let descriptors = list_descriptors(store, keys, topic).await?;
    let Some(position) = descriptors.iter().position(|d| d.start_offset == start) else {
        return Err(StorageError::NotFound { key });
    };
    if position != 0 {
        return Err(StorageError::Refused {
            kind: "not_oldest",
            message: format!(
                "the oldest committed segment starts at {}; cold retention removes segments oldest first",
                descriptors[0].start_offset
            ),
        });
    }
    let cur_key = keys.segments_cur(topic);
    let cur_value = store.get(&cur_key).await?;
    let tiered = tiered_state(store, keys, topic).await?;
    if tiered.cur == Some(start) || descriptors.len() == 1 {
        return Err(StorageError::Refused {
            kind: "is_cur",
            message: format!("{key} is the newest committed segment (segments/cur); it is kept"),
        });
    }
    let value = store
        .get(&key)
        .await?
        .ok_or_else(|| StorageError::NotFound { key: key.clone() })?;
    let txn = match cur_value {
        Some(v) => Txn::new().when_equals(cur_key, v),
        None => Txn::new().when_absent(cur_key),
    }
    .when_equals(key.clone(), value)
    .delete(key)
    .put(
        keys.retired(topic),
        json!({ "below_offset": descriptors[0].next_offset() }),
    );
    match store.txn(txn).await? {
        TxnOutcome::Applied => Ok(descriptors[1].start_offset),
        TxnOutcome::ConditionFailed { .. } => Err(StorageError::Contended),
    }
}

async fn retire_segment(
    State(state): State<AdminState>,
    Path((namespace, topic, start)): Path<(String, String, String)>,
    params: Result<Query<PrefixQuery>, QueryRejection>,
) -> ApiResult {
    let topic = topic_from_path(&namespace, &topic)?;
    let keys = storage_keys(params)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn descriptor(
        keys: &StorageKeys,
        topic: &TopicName,
        start: u64,
        end: u64,
    ) -> SegmentDescriptor {
        let batches_bytes = 1000 + start;
        SegmentDescriptor {
            start_offset: start,
            end_offset: end,
            record_count: end - start + 1,
            size: batches_bytes + 16 + 112,
            object_id: keys.segment_object(topic, start, end),
            format_version: tributary_proto::archive::FORMAT_VERSION,
            checksum_crc32c: 7,
            batches_crc32c: 8,
            batches_bytes,
            index_position: batches_bytes,
            index_bytes: 16,
            first_timestamp_ms: 1,
            max_timestamp_ms: 2,
            created_at_ms: 3,
        }
    }

    #[test]
    fn descriptor_commits_are_idempotent_contiguous_and_move_cur() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let store = broker_core::metadata::redb::RedbStore::open(
            dir.path().join("m.redb"),
            Arc::new(broker_core::clock::ManualClock::new(1)),
        )
        .unwrap();
        let keys = StorageKeys::default();
        let topic = TopicName::new("/ns/t").unwrap();
        runtime.block_on(async {
            assert_eq!(tiered_offset(&store, &keys, &topic).await.unwrap(), None);
            let first = descriptor(&keys, &topic, 0, 99);
            let (outcome, state) = commit_descriptor(&store, &keys, &topic, &first)
                .await
                .unwrap();
            assert_eq!(outcome, CommitOutcome::Committed);
            assert_eq!((state.cur, state.tiered_offset), (Some(0), Some(100)));
            // A redo with another created_at is the same object.
            let mut again = first.clone();
            again.created_at_ms = 99;
            let (outcome, _) = commit_descriptor(&store, &keys, &topic, &again)
                .await
                .unwrap();
            assert_eq!(outcome, CommitOutcome::Unchanged);
            // Another object at the same start is a conflict.
            let mut other = first.clone();
            other.batches_crc32c ^= 1;
            assert!(matches!(
                commit_descriptor(&store, &keys, &topic, &other).await,
                Err(StorageError::Conflict { .. })
            ));
            // Gaps and overlaps past cur are refused.
            for (start, end) in [(101, 150), (50, 150)] {
                let d = descriptor(&keys, &topic, start, end);
                assert!(
                    matches!(
                        commit_descriptor(&store, &keys, &topic, &d).await,
                        Err(StorageError::NotContiguous { .. })
                    ),
                    "{start}..={end}"
                );
            }
            let second = descriptor(&keys, &topic, 100, 149);
            let (_, state) = commit_descriptor(&store, &keys, &topic, &second)
                .await
                .unwrap();
            assert_eq!(state.tiered_offset, Some(150));
            assert_eq!(
                store.get(&keys.segments_cur(&topic)).await.unwrap(),
                Some(json!("00000000000000000100"))
            );
            assert_eq!(
                list_descriptors(&store, &keys, &topic).await.unwrap(),
                vec![first.clone(), second]
            );
            // The object key must be the deterministic one.
            let mut wrong = descriptor(&keys, &topic, 150, 199);
            wrong.object_id = "elsewhere.seg".into();
            assert!(matches!(
                commit_descriptor(&store, &keys, &topic, &wrong).await,
                Err(StorageError::Invalid(_))
            ));
        });
    }

    #[test]
    fn constant_time_eq_compares_whole_strings() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(!constant_time_eq(b"", b"x"));
        assert!(constant_time_eq(b"", b""));
    }

    #[test]
    fn manifests_parse_from_yaml() {
        let text = "namespaces:\n  - agents\ntopics:\n  - name: /agents/events\n    \
                    intent: agent_event_mesh\n    partitions: 3\n";
        let manifest = parse_manifest("t.yaml", text.as_bytes()).unwrap();
        assert_eq!(manifest.namespaces().len(), 1);
        assert_eq!(manifest.topics()[0].partitions(), 3);
        assert_eq!(manifest.topics()[0].intent(), StreamIntent::EventStream);
        assert!(parse_manifest("t.yaml", b"").unwrap().topics().is_empty());
        let err = parse_manifest("t.yaml", b"topics: [\n").unwrap_err();
        assert!(
            err.to_string()
                .starts_with("manifest t.yaml: not valid YAML: "),
            "{err}"
        );
        let err = parse_manifest("t.yaml", b"topics: []\ntopics: []\n").unwrap_err();
        assert_eq!(
            err.to_string(),
            "manifest t.yaml: not valid YAML: duplicate entry with key \"topics\"; nothing applied"
        );
        let err = parse_manifest("t.yaml", b"{1: x}").unwrap_err();
        assert_eq!(
            err.to_string(),
            "manifest t.yaml: 1: unknown top-level key; expected namespaces or topics; \
             nothing applied"
        );
        let err = parse_manifest("t.yaml", b"\xff").unwrap_err();
        assert!(err.to_string().contains("not UTF-8"), "{err}");
    }
}
