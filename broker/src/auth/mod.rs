//! Authentication and authorization of every `/v1` route of the broker's
//! HTTP APIs (admin, storage, consumer, auth): ONE axum middleware,
//! [`guard`], in front of each router.
//!
//! 1. Authenticate: `Authorization: Bearer <token>` — the legacy
//!    `admin_token` (the bootstrap principal `bootstrap-admin`, role
//!    `admin`) or a named token `trib.<principal>.<64 hex>` whose SHA-256
//!    matches `/auth/principals/{principal}` — else the client certificate
//!    the HTTPS listener verified ([`crate::http::PeerCertificate`]) if a
//!    `certificate` principal of that name exists. Otherwise `401
//!    unauthorized` with `WWW-Authenticate: Bearer`.
//! 2. Authorize from the permission table ([`table::RULES`], keyed by
//!    method and route template): the principal needs a binding whose role
//!    holds the route's permission and whose scope covers the request's
//!    namespace/topic, else `403 forbidden` naming the permission; a route
//!    missing from the table is refused (fail closed). The handler never
//!    runs on a refusal.
//! 3. Audit: routes marked `audited` append one record to the audit topic
//!    ([`audit`]), refusals included.
//!
//! Steps 1 and 2 read the cached snapshot of `/auth/` ([`cache`]); a refusal
//! (an unknown principal, a missing permission) is decided again once on a
//! linearizable re-listing, so a token or grant acknowledged by any broker
//! is honoured by every broker at once, not only after the watch delivers
//! it.
//!
//! `GET /health` and `GET /metrics` stay unauthenticated: load balancers and
//! Prometheus scrape them, and they disclose no record data. `POST
//! /v1/enroll` is not behind the guard either: an enrolling device holds
//! only its one-time enrollment token, which the endpoint checks itself
//! ([`crate::enroll`]); its outcome is audited like the routes here.
//!
//! Files: this one (state, guard), `model.rs` (permissions, roles, tokens,
//! the decision), `table.rs` (route → permission), `cache.rs` (the `/auth/`
//! snapshot), `http.rs` (the `/v1/auth` endpoints), `audit.rs`.

pub mod audit;
pub mod cache;
pub mod http;
pub mod model;
pub mod table;

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use axum::body::Body;
use axum::extract::{MatchedPath, Query, RawPathParams, Request};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use broker_core::metadata::MetadataStore;
use serde_json::json;
use tributary_api::auth::PrincipalKind;
use tributary_proto::keys::TopicName;

use self::audit::{AuditRecord, AuditSink};
use self::cache::AuthCache;
use self::model::{BOOTSTRAP_ADMIN, Permission, Principal, Scope};
use self::table::ScopeFrom;
use crate::http::ApiError;
/// The verified client certificate of a request (inserted by the HTTPS
/// listener), re-exported for tests and embedders.
pub use crate::http::PeerCertificate;

/// Largest request body the guard reads to find a body-named scope (POST
/// `/v1/topics`, `/v1/namespaces`, `/v1/storage/descriptors`).
const MAX_SCOPED_BODY: usize = 2 * 1024 * 1024;

/// What the guard needs: the `/auth/` cache, the bootstrap token and the
/// audit sink. Cheap to clone.
#[derive(Clone)]
pub struct AuthState {
    inner: Arc<Inner>,
}

struct Inner {
    cache: Arc<AuthCache>,
    bootstrap: Option<String>,
    audit: RwLock<Option<AuditSink>>,
}

impl std::fmt::Debug for AuthState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the bootstrap token.
        f.debug_struct("AuthState")
            .field("cache", &self.inner.cache)
            .finish_non_exhaustive()
    }
}

impl AuthState {
    /// Auth over `store`'s `/auth/` with the legacy `admin_token` as
    /// bootstrap admin (`None` or empty: no bootstrap principal). Starts the
    /// cache's watch when called inside a Tokio runtime.
    pub fn new(store: Arc<dyn MetadataStore>, bootstrap: Option<String>) -> AuthState {
        let cache = Arc::new(AuthCache::new(store));
        if tokio::runtime::Handle::try_current().is_ok() {
            cache.spawn_watch();
        }
        let bootstrap = bootstrap.filter(|token| !token.is_empty());
        if bootstrap.is_some() {
            tracing::warn!(
                "admin_token is the bootstrap admin (principal bootstrap-admin): create named \
                 tokens with `tribctl auth create` and remove it"
            );
        }
        AuthState {
            inner: Arc::new(Inner {
                cache,
                bootstrap,
                audit: RwLock::new(None),
            }),
        }
    }

    /// The `/auth/` cache.
    pub fn cache(&self) -> &Arc<AuthCache> {
        &self.inner.cache
    }

    /// Sends audit records of admin actions to `sink` from now on.
    pub fn set_audit(&self, sink: AuditSink) {
        match self.inner.audit.write() {
            Ok(mut guard) => *guard = Some(sink),
            Err(poisoned) => *poisoned.into_inner() = Some(sink),
        }
    }

    /// Where audit records go, once set.
    pub(crate) fn audit(&self) -> Option<AuditSink> {
        match self.inner.audit.read() {
            Ok(guard) => guard.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }
}

/// Who failed to authenticate, for the audit record.
struct Unauthenticated {
    name: String,
    message: &'static str,
    /// A principal the cached snapshot does not know (it may have been
    /// created through another broker a moment ago).
    unknown: bool,
}

fn authenticate(state: &AuthState, request: &Request) -> Result<Principal, Unauthenticated> {
    let bearer = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(broker_core::secrets::bearer_token);
    let snapshot = state.inner.cache.snapshot();
    if let Some(token) = bearer {
        if let Some(bootstrap) = &state.inner.bootstrap
            && model::secret_matches(token, bootstrap)
        {
            return Ok(Principal {
                name: BOOTSTRAP_ADMIN.to_owned(),
                kind: "bootstrap",
            });
        }
        let Some(name) = model::token_principal(token) else {
            return Err(Unauthenticated {
                name: "unknown".into(),
                message: "invalid bearer token",
                unknown: false,
            });
        };
        let known = snapshot.principals.get(name).is_some_and(|p| {
            p.kind == PrincipalKind::Token
                && p.token_sha256
                    .as_deref()
                    .is_some_and(|hash| model::token_matches(token, hash))
        });
        return if known {
            Ok(Principal {
                name: name.to_owned(),
                kind: "token",
            })
        } else {
            Err(Unauthenticated {
                name: name.to_owned(),
                message: "invalid or revoked bearer token",
                unknown: true,
            })
        };
    }
    if let Some(peer) = request.extensions().get::<PeerCertificate>() {
        // A certificate principal named like an edge: revoking the edge
        // (`POST /v1/edges/{edge}/revoke`) refuses the certificates it
        // refuses at ingest here too (a security trial's F5).
        if snapshot
            .edge_revoked(&peer.identity, peer.not_before_s)
            .is_some()
        {
            return Err(Unauthenticated {
                name: peer.identity.clone(),
                message: "client certificate revoked: its edge identity was revoked after it was issued",
                unknown: false,
            });
        }
        let known = snapshot
            .principals
            .get(&peer.identity)
            .is_some_and(|p| p.kind == PrincipalKind::Certificate);
        return if known {
            Ok(Principal {
                name: peer.identity.clone(),
                kind: "certificate",
            })
        } else {
            Err(Unauthenticated {
                name: peer.identity.clone(),
                message: "client certificate identity is not a certificate principal",
                unknown: true,
            })
        };
    }
    let message = if request.headers().contains_key(header::AUTHORIZATION) {
        "unusable Authorization header: send Authorization: Bearer <token>, in visible ASCII"
    } else {
        "missing bearer token: send Authorization: Bearer <token>"
    };
    Err(Unauthenticated {
        name: "anonymous".into(),
        message,
        unknown: false,
    })
}

/// Longest wait for the re-read of `/auth/` before a refusal (a Raft
/// group without a leader would otherwise hold every refusal for the read
/// barrier's retries).
const REFRESH_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Whether the auth cache now holds a snapshot listed after `ticket`
/// (see [`AuthCache::refresh_after`]); a failed or slower listing than
/// [`REFRESH_WAIT`] is logged and the refusal stands.
async fn refreshed(state: &AuthState, ticket: u64) -> bool {
    match tokio::time::timeout(REFRESH_WAIT, state.inner.cache.refresh_after(ticket)).await {
        Ok(Ok(())) => true,
        Ok(Err(error)) => {
            tracing::warn!(%error, "auth: re-reading /auth/ before a refusal failed");
            false
        }
        Err(_) => {
            tracing::warn!(
                wait_s = REFRESH_WAIT.as_secs(),
                "auth: re-reading /auth/ before a refusal timed out"
            );
            false
        }
    }
}

/// A 401 `unauthorized` with `WWW-Authenticate: Bearer`.
fn unauthorized(message: &str) -> Response {
    let mut response =
        ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", message).into_response();
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"tributary-admin\""),
    );
    response
}

/// The request's scope per `from`; may read (and put back) the body.
async fn scope_of(from: ScopeFrom, request: Request) -> Result<(Scope, Request), Response> {
    let (mut parts, body) = request.into_parts();
    let mut scope = Scope::default();
    let body = match from {
        ScopeFrom::Cluster => body,
        ScopeFrom::Path => {
            use axum::extract::FromRequestParts;
            if let Ok(params) = RawPathParams::from_request_parts(&mut parts, &()).await {
                for (name, value) in &params {
                    match name {
                        "namespace" => scope.namespace = Some(value.to_owned()),
                        "topic" => scope.topic = Some(value.to_owned()),
                        _ => {}
                    }
                }
            }
            body
        }
        ScopeFrom::Query => {
            if let Ok(Query(query)) = Query::<HashMap<String, String>>::try_from_uri(&parts.uri) {
                scope.namespace = query.get("namespace").cloned();
            }
            body
        }
        ScopeFrom::BodyNamespace(field) | ScopeFrom::BodyTopic(field) => {
            let bytes = axum::body::to_bytes(body, MAX_SCOPED_BODY)
                .await
                .map_err(|_| {
                    ApiError::new(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        "too_large",
                        format!("request body over {MAX_SCOPED_BODY} bytes"),
                    )
                    .into_response()
                })?;
            let named = serde_json::from_slice::<serde_json::Value>(&bytes)
                .ok()
                .and_then(|v| v.get(field).and_then(|f| f.as_str()).map(str::to_owned));
            if let Some(named) = named {
                if matches!(from, ScopeFrom::BodyNamespace(_)) {
                    scope.namespace = Some(named);
                } else if let Ok(topic) = TopicName::new(&named) {
                    scope.namespace = Some(topic.namespace().to_owned());
                    scope.topic = Some(topic.topic().to_owned());
                }
            }
            Body::from(bytes)
        }
    };
    Ok((scope, Request::from_parts(parts, body)))
}

/// The middleware guarding every `/v1` route (see the module doc). Add it
/// with `route_layer(middleware::from_fn_with_state(auth, guard))` so the
/// route template is known.
pub async fn guard(
    axum::extract::State(state): axum::extract::State<AuthState>,
    request: Request,
    next: Next,
) -> Response {
    if let Err(error) = state.inner.cache.ensure_loaded().await {
        tracing::error!(%error, "auth: cannot load /auth/");
        return ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "auth_unavailable",
            "the permission store cannot be read",
        )
        .into_response();
    }
    // Any reload begun from here on lists what was committed before this
    // request arrived (a refusal re-decides on such a listing).
    let ticket = state.inner.cache.ticket();
    let method = request.method().as_str().to_owned();
    // Inside the nested `/v1` router the URI lacks the prefix: the original
    // one has it.
    let path = request
        .extensions()
        .get::<axum::extract::OriginalUri>()
        .map_or_else(|| request.uri().path().to_owned(), |u| u.path().to_owned());
    let action = format!("{method} {path}");
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_default();
    let rule = table::lookup(&method, &route);
    let audited = rule.is_none_or(|r| r.audited);
    let audit = state.audit().filter(|_| audited);
    let record = |principal: &str, kind: &str, scope: &Scope, response: &Response| {
        let status = response.status();
        let target = response
            .extensions()
            .get::<audit::AuditTarget>()
            .map(|t| t.0.clone());
        if let Some(sink) = &audit {
            let code = status.as_u16();
            let (outcome, refusal) = match code {
                200..=299 => ("ok", None),
                401 => ("refused", Some("unauthorized")),
                403 => ("refused", Some("forbidden")),
                _ => ("failed", None),
            };
            sink.record(AuditRecord {
                at_ms: u64::try_from(broker_core::clock::now_ms()).unwrap_or(0),
                principal: principal.to_owned(),
                principal_kind: kind.to_owned(),
                action: action.clone(),
                route: route.clone(),
                namespace: scope.namespace.clone(),
                topic: scope.topic.clone(),
                target,
                status: code,
                outcome: outcome.to_owned(),
                kind: refusal.map(str::to_owned),
            });
        }
    };
    let principal = match authenticate(&state, &request) {
        Err(who) if who.unknown && refreshed(&state, ticket).await => {
            authenticate(&state, &request)
        }
        decided => decided,
    };
    let principal = match principal {
        Ok(principal) => principal,
        Err(who) => {
            let response = unauthorized(who.message);
            record(&who.name, "unknown", &Scope::default(), &response);
            crate::http::drain_body(request).await;
            return response;
        }
    };
    let Some(rule) = rule else {
        let allowed = table::methods(&route);
        let response = if allowed.is_empty() {
            ApiError::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                format!("{method} {route} has no permission defined: refused"),
            )
            .into_response()
        } else {
            // The route exists, not with this method.
            let mut response = ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                format!(
                    "{method} is not allowed on {route}; allowed: {}",
                    allowed.join(", ")
                ),
            )
            .into_response();
            if let Ok(value) = axum::http::HeaderValue::from_str(&allowed.join(", ")) {
                response
                    .headers_mut()
                    .insert(axum::http::header::ALLOW, value);
            }
            response
        };
        record(
            &principal.name,
            principal.kind,
            &Scope::default(),
            &response,
        );
        crate::http::drain_body(request).await;
        return response;
    };
    let (scope, mut request) = match scope_of(rule.scope, request).await {
        Ok(pair) => pair,
        Err(response) => return response,
    };
    if let Some(permission) = rule.permission {
        let allowed = |state: &AuthState| {
            state
                .inner
                .cache
                .snapshot()
                .allows(&principal, permission, &scope)
        };
        let permitted = allowed(&state) || (refreshed(&state, ticket).await && allowed(&state));
        if !permitted {
            let on = match (&scope.namespace, &scope.topic) {
                (Some(ns), Some(topic)) => format!("topic /{ns}/{topic}"),
                (Some(ns), None) => format!("namespace {ns}"),
                _ => "the cluster".to_owned(),
            };
            let response = ApiError::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                format!(
                    "principal {} lacks permission {permission} on {on}",
                    principal.name
                ),
            )
            .with("permission", json!(permission.as_str()))
            .with("namespace", json!(scope.namespace))
            .into_response();
            record(&principal.name, principal.kind, &scope, &response);
            crate::http::drain_body(request).await;
            return response;
        }
    }
    if !rule.query
        && let Some(query) = request.uri().query().filter(|q| !q.is_empty())
    {
        let names: Vec<&str> = query
            .split('&')
            .filter_map(|pair| pair.split('=').next())
            .filter(|name| !name.is_empty())
            .collect();
        let response = ApiError::invalid(
            "query",
            format!(
                "{method} {route} takes no query parameters (got {}); nothing was done",
                names.join(", ")
            ),
        )
        .into_response();
        record(&principal.name, principal.kind, &scope, &response);
        crate::http::drain_body(request).await;
        return response;
    }
    let (name, kind) = (principal.name.clone(), principal.kind);
    request.extensions_mut().insert(principal);
    let response = next.run(request).await;
    // Archiving the audit topic itself is not recorded in it (see
    // `audit::is_audit_topic`); a refusal above still is.
    let archiving_audit = rule.permission == Some(Permission::Storage)
        && audit::is_audit_topic(scope.namespace.as_deref(), scope.topic.as_deref())
        && response.status().is_success();
    if !archiving_audit {
        record(&name, kind, &scope, &response);
    }
    response
}
