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
//!
//! Errors are JSON: `{"error": "<message>", "kind": "<kind>", "field":
//! "<field>"?, …}` with `400 invalid_input` / `400 invalid_manifest` (bad
//! input naming the field, or every manifest issue in `errors`), `401
//! unauthorized`, `404 not_found`, `409 conflict` / `409 manifest_conflict`
//! (with `differences` or `errors`), `500 internal`.
//!
//! The catalog semantics (what create, apply and the failure policies do)
//! live in [`broker_core::catalog`].

use std::future::Future;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use broker_core::catalog::{
    Action, Catalog, CatalogError, FailurePolicyPatch, Manifest, ManifestErrors, TopicSpec,
};
use broker_core::intent::{StreamIntent, SubscriptionFailurePolicy};
use broker_core::keys::{NameError, NamespaceName, SubscriptionName, TopicName};
use broker_core::metadata::MetadataStore;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

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

/// An error response: status and JSON body `{"error", "kind", ...}`.
#[derive(Debug)]
struct ApiError {
    status: StatusCode,
    body: serde_json::Map<String, Value>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &str, message: impl Into<String>) -> ApiError {
        let mut body = serde_json::Map::new();
        body.insert("error".into(), Value::String(message.into()));
        body.insert("kind".into(), Value::String(kind.into()));
        ApiError { status, body }
    }

    fn with(mut self, key: &str, value: Value) -> ApiError {
        self.body.insert(key.to_owned(), value);
        self
    }

    fn invalid(field: &str, message: impl Into<String>) -> ApiError {
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

type ApiResult = Result<Response, ApiError>;

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
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
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

async fn require_token(State(state): State<AdminState>, request: Request, next: Next) -> Response {
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim());
    match presented {
        None => unauthorized("missing bearer token: send Authorization: Bearer <token>"),
        Some(token)
            if !state.token.is_empty()
                && constant_time_eq(token.as_bytes(), state.token.as_bytes()) =>
        {
            next.run(request).await
        }
        Some(_) => unauthorized("invalid bearer token"),
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

#[cfg(test)]
mod tests {
    use super::*;

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
