//! The broker's admin HTTP API (axum): namespaces, intent-backed topics,
//! subscription failure policies, declarative `apply` and cluster status.
//! Documented for operators, with curl examples, in `docs/admin-api.md`.
//!
//! Every route under `/v1` passes the guard of [`crate::auth`]: a named
//! token, the bootstrap `admin_token` or a certificate principal (else
//! `401` with `WWW-Authenticate: Bearer`), holding the route's permission on
//! the request's namespace (else `403 forbidden` naming the permission).
//! `GET /health` needs no credentials.
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
//! | `POST /v1/topics/{ns}/{topic}/skip-damaged` | body `{"first_offset", "end_offset", "reason"?}`: record a damaged range nothing can heal as a hole (`409 not_damaged` unless it is exactly one) |
//! | `GET /v1/topics/{ns}/{topic}/subscriptions/{sub}/failure-policy` | the stored or inherited policy |
//! | `PUT …/failure-policy` | replace the policy (full body) |
//! | `PATCH …/failure-policy` | change some fields, keep the rest |
//! | `POST /v1/apply[?dry_run=true][&file=name]` | apply a YAML manifest (request body) |
//! | `GET /v1/cluster/status` | `cluster_id`, leader, members, term, last applied index; `brokers` (lease, topics owned) |
//! | `POST /v1/topics/{ns}/{topic}/move` | body `{"to": N}`: give the topic to broker N (new epoch) |
//! | `POST /v1/cluster/rebalance` | body `{"dry_run"?, "max_moves"?}`: even out topic counts; the planned moves |
//! | `GET /v1/edges` | every edge the cluster knows: connected, since, last seen, brokers, per-topic high-water mark and lag (`edges.rs`, [`crate::fleet`]) |
//! | `GET /v1/storage/cluster` | `{"cluster_id"}` (`null` until it exists): the tier service's check of its archive prefix's owner |
//! | `GET /v1/storage/topics[?prefix=/tributary]` | topics with tiered segments: count, `cur`, tiered offset |
//! | `GET /v1/storage/topics/{ns}/{topic}/segments[?prefix=]` | a topic's segment descriptors, `cur`, tiered offset |
//! | `POST /v1/storage/descriptors[?prefix=]` | commit `{"topic", "descriptor"}`: descriptor + `segments/cur` in one Raft txn |
//! | `POST /v1/storage/topics/{ns}/{topic}/trim[?prefix=]` | apply local WAL retention with the committed tiered offset as the safe offset |
//! | `POST /v1/storage/topics/{ns}/{topic}/unload[?prefix=]` | seal the active segment; once everything is tiered, write the topic's `state` marker (`202` until then) |
//! | `DELETE /v1/storage/topics/{ns}/{topic}/segments/{start}[?prefix=]` | cold retention: remove the oldest descriptor (never `cur`) |
//! | `POST /v1/edges/{edge}/token` | body `{"ttl_ms"?}`: mint the edge's one-time enrollment token ([`crate::enroll`]) |
//! | `POST /v1/edges/{edge}/revoke` | revoke the edge's certificates issued up to now |
//!
//! The storage endpoints serve the tier service (`tier-service/`), which
//! runs beside the broker and commits what it uploaded through them; they
//! live in [`crate::storage`] (see [`crate::storage::commit_descriptor`] for
//! the rules a commit must pass). `trim` needs the broker's WALs:
//! [`crate::storage::with_local_segments`] wires them in (without it, `501
//! not_supported`).
//!
//! Files: this one (state, router, the catalog's errors as responses),
//! `topics.rs` (namespaces and topics), `policy.rs` (failure policies and
//! their partial updates), `manifest.rs` (parsing and validating
//! manifests), `apply.rs` (plan and apply), `cluster.rs` (cluster status),
//! `edges.rs` (the fleet of edges),
//! `ownership.rs` (brokers, moves, rebalancing).
//! Request parsing is shared with the consumer API in `crate::http`; the
//! guard and the `/v1/auth` endpoints live in `crate::auth`.
//!
//! Errors are JSON: `{"error": "<message>", "kind": "<kind>", "field":
//! "<field>"?, …}` with `400 invalid_input` / `400 invalid_manifest` (bad
//! input naming the field, or every manifest issue in `errors`), `401
//! unauthorized`, `403 forbidden` (with `permission`), `404 not_found`, `409 conflict` / `409 manifest_conflict`
//! (with `differences` or `errors`), `500 internal`, `501 not_supported`.
//!
//! The catalog semantics (what create and the failure policies do) live in
//! [`broker_core::catalog`]; `apply` and partial policy updates are here.

mod apply;
mod cluster;
mod edges;
mod manifest;
mod ownership;
mod policy;
mod topics;

use std::future::Future;
use std::sync::Arc;

use axum::Router;
use axum::http::StatusCode;
use axum::middleware;
use axum::routing::{get, post};
use broker_core::catalog::CatalogError;
use broker_core::metadata::MetadataStore;
use serde_json::{Value, json};
use tributary_api::admin::PlanAction;
use tributary_proto::intent::StreamIntent;
use tributary_proto::keys::{NamespaceName, TopicName};

use crate::auth::AuthState;
use crate::http::ApiError;

pub use self::apply::{ApplyError, DEFAULT_MANIFEST_NAME, apply, plan};
pub use self::cluster::{ClusterView, StaticClusterView};
pub use self::manifest::{Manifest, ManifestErrors, parse_manifest};
pub use self::policy::{FailurePolicyPatch, patch_failure_policy};

/// Default listen address of the admin API.
pub const DEFAULT_ADMIN_ADDR: &str = "127.0.0.1:7400";

/// Environment variable conventionally holding the admin bearer token (read
/// by `tribctl`; the broker's configuration decides where its token comes
/// from).
pub const TOKEN_ENV: &str = "TRIB_ADMIN_TOKEN";

/// What the handlers share.
#[derive(Clone)]
pub struct AdminState {
    /// The metadata store (the Raft node in the broker, redb in tests).
    pub store: Arc<dyn MetadataStore>,
    /// Cluster status source.
    pub cluster: Arc<dyn ClusterView>,
    /// Who may call what: the `/auth/` cache and the bootstrap token
    /// ([`crate::auth`]).
    pub auth: AuthState,
}

impl AdminState {
    /// State over `store` whose only admin is the bootstrap token `token`
    /// (the legacy `admin_token`; empty: none) plus the principals under
    /// `/auth/` of `store`.
    pub fn with_bootstrap_token(
        store: Arc<dyn MetadataStore>,
        cluster: Arc<dyn ClusterView>,
        token: &str,
    ) -> AdminState {
        let auth = AuthState::new(store.clone(), Some(token.to_owned()));
        AdminState {
            store,
            cluster,
            auth,
        }
    }
}

impl std::fmt::Debug for AdminState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the token.
        f.debug_struct("AdminState").finish_non_exhaustive()
    }
}

/// The admin API's routes (see the module doc), with the storage endpoints
/// of [`crate::storage`].
pub fn router(state: AdminState) -> Router {
    let v1 = Router::new()
        .route(
            "/namespaces",
            get(topics::list_namespaces).post(topics::create_namespace),
        )
        .route(
            "/topics",
            get(topics::list_topics).post(topics::create_topic),
        )
        .route(
            "/topics/{namespace}/{topic}",
            get(topics::describe_topic).delete(topics::delete_topic),
        )
        .route(
            "/topics/{namespace}/{topic}/skip-damaged",
            post(topics::skip_damaged),
        )
        .route(
            "/topics/{namespace}/{topic}/move",
            post(ownership::move_topic),
        )
        .route(
            "/topics/{namespace}/{topic}/subscriptions/{subscription}/failure-policy",
            get(policy::get_failure_policy)
                .put(policy::put_failure_policy)
                .patch(policy::patch_failure_policy_handler),
        )
        .route("/apply", post(apply::apply_manifest))
        .route("/cluster/status", get(cluster::cluster_status))
        .route("/cluster/rebalance", post(ownership::rebalance))
        .route("/edges", get(edges::list_edges))
        .merge(crate::storage::routes())
        .route_layer(middleware::from_fn_with_state(
            state.store.clone(),
            crate::http::owner_route::owner_route,
        ))
        .route_layer(middleware::from_fn_with_state(
            state.auth.clone(),
            crate::auth::guard,
        ));
    Router::new()
        .route("/health", get(health))
        .nest("/v1", v1)
        .fallback(not_found)
        .with_state(state.clone())
        .merge(crate::enroll::admin_router(
            state.auth.clone(),
            state.store.clone(),
        ))
        .merge(crate::auth::http::router(state.auth, state.store))
}

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

/// The catalog's errors as responses: `400 invalid_input` naming the field
/// (with `valid_intents` for an unknown intent), `404 not_found`, `409
/// conflict` (with `differences`), `500 internal`.
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

/// The topic of a `/{namespace}/{topic}` path.
pub(crate) fn topic_from_path(namespace: &str, topic: &str) -> Result<TopicName, ApiError> {
    let namespace = NamespaceName::new(namespace).map_err(|e| ApiError::name("namespace", e))?;
    TopicName::from_parts(&namespace, topic).map_err(|e| ApiError::name("topic", e))
}

/// Refuses a client's write (a central publish, creating or deleting a
/// topic) in a system namespace (one starting with `_`, where the brokers
/// keep their audit topics `/_system/audit-broker-{id}`): `403
/// reserved_namespace`. Reading those topics stays open to whoever may.
/// Without it an operator could append forged audit records or delete a
/// broker's audit trail through the public API.
///
/// # Errors
/// The 403 for a system namespace.
pub(crate) fn refuse_system_write(topic: &TopicName) -> Result<(), ApiError> {
    refuse_system_namespace(topic.namespace(), topic.as_ref())
}

/// [`refuse_system_write`] for a namespace `name` (`what` names the
/// request's subject in the message): creating `/_anything` was `201` while
/// every topic in it was refused.
///
/// # Errors
/// The 403 for a system namespace.
pub(crate) fn refuse_system_namespace(name: &str, what: &str) -> Result<(), ApiError> {
    if name.starts_with('_') {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "reserved_namespace",
            format!(
                "{what}: namespaces starting with '_' are the system's (the brokers' audit \
                 topics live in /_system); only brokers write there: read it, but publish to, \
                 create and delete topics in another namespace"
            ),
        ));
    }
    Ok(())
}

/// `{"status": "ok"}`, or `{"status": "degraded", "damaged_ranges": [...]}`
/// while a topic WAL holds damaged ranges (not yet healed or skipped; see
/// `crate::replication::damage`). Always `200`: the broker is alive.
async fn health(
    damage: Option<axum::Extension<Arc<crate::replication::damage::DamageService>>>,
) -> axum::Json<Value> {
    let damaged = match damage {
        Some(axum::Extension(damage)) => damage.damaged().await,
        None => Vec::new(),
    };
    if damaged.is_empty() {
        return axum::Json(json!({"status": "ok"}));
    }
    axum::Json(json!({"status": "degraded", "damaged_ranges": damaged}))
}

async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such endpoint")
}

/// `201` for a create, `200` otherwise.
fn status_of(action: PlanAction) -> StatusCode {
    match action {
        PlanAction::Create => StatusCode::CREATED,
        PlanAction::Update | PlanAction::Unchanged => StatusCode::OK,
    }
}
