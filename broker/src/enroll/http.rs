//! The admin routes of enrollment (permission `auth_manage`, audited):
//! `POST /v1/edges/{edge}/token` mints an edge's one-time enrollment token
//! (shown once; it replaces the edge's earlier one) and `POST
//! /v1/edges/{edge}/revoke` records the edge's revocation and deletes its
//! unused token, in one Raft transaction. Wire shapes in
//! [`tributary_api::enroll`].

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Extension, Path, State};
use axum::http::StatusCode;
use axum::middleware;
use axum::routing::post;
use broker_core::metadata::{MetadataError, MetadataStore, Txn};
use serde_json::Value;
use tributary_api::enroll::{
    DEFAULT_TOKEN_TTL_MS, EdgeRevocation, EnrollmentTokenRequest, EnrollmentTokenResponse,
    MAX_TOKEN_TTL_MS,
};
use tributary_proto::keys::{NamespaceName, auth};

use super::model::{StoredEnrollment, new_token};
use crate::auth::AuthState;
use crate::auth::audit::AuditTarget;
use crate::auth::model::{Principal, sha256_hex};
use crate::http::{ApiError, ApiResult, ok, parse_json};

#[derive(Clone)]
struct Api {
    auth: AuthState,
    store: Arc<dyn MetadataStore>,
}

/// The edges' token and revoke routes, behind the guard of
/// [`crate::auth`].
pub fn admin_router(auth: AuthState, store: Arc<dyn MetadataStore>) -> Router {
    Router::new()
        .route("/v1/edges/{edge}/token", post(mint_token))
        .route("/v1/edges/{edge}/revoke", post(revoke_edge))
        .route_layer(middleware::from_fn_with_state(
            auth.clone(),
            crate::auth::guard,
        ))
        .with_state(Api { auth, store })
}

pub(super) fn internal(error: MetadataError) -> ApiError {
    tracing::error!(%error, "enrollment: metadata failure");
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "internal",
        error.to_string(),
    )
}

pub(super) fn now_ms() -> u64 {
    u64::try_from(broker_core::clock::now_ms()).unwrap_or(0)
}

fn with_target(response: ApiResult, target: String) -> ApiResult {
    response.map(|mut response| {
        response.extensions_mut().insert(AuditTarget(target));
        response
    })
}

fn edge_of(edge: &str) -> Result<NamespaceName, ApiError> {
    let name = NamespaceName::new(edge).map_err(|e| ApiError::name("edge_id", e))?;
    if let Some(why) = name.reserved_for_edges() {
        return Err(ApiError::invalid(
            "edge_id",
            format!("edge_id: {edge:?} cannot be an edge id: {why}"),
        ));
    }
    Ok(name)
}

async fn mint_token(
    State(api): State<Api>,
    Extension(caller): Extension<Principal>,
    Path(edge): Path<String>,
    body: Bytes,
) -> ApiResult {
    let edge = edge_of(&edge)?;
    if let Some(why) = tributary_proto::keys::new_edge_id_problem(edge.as_str()) {
        return Err(ApiError::invalid(
            "edge_id",
            format!("edge_id: {:?} cannot be an edge id: {why}", edge.as_str()),
        ));
    }
    let request: EnrollmentTokenRequest = if body.is_empty() {
        EnrollmentTokenRequest::default()
    } else {
        parse_json(&body)?
    };
    let ttl_ms = request.ttl_ms.unwrap_or(DEFAULT_TOKEN_TTL_MS);
    if !(1..=MAX_TOKEN_TTL_MS).contains(&ttl_ms) {
        return Err(ApiError::invalid(
            "ttl_ms",
            format!("ttl_ms: must be from 1 to {MAX_TOKEN_TTL_MS} (30 days), got {ttl_ms}"),
        ));
    }
    let token = new_token(edge.as_str()).map_err(|_| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "the system random number generator failed",
        )
    })?;
    let now = now_ms();
    let stored = StoredEnrollment {
        edge_id: edge.to_string(),
        token_sha256: sha256_hex(token.as_bytes()),
        created_at_ms: now,
        created_by: caller.name,
        expires_at_ms: now.saturating_add(ttl_ms),
        used_at_ms: None,
        serial: None,
    };
    let value = serde_json::to_value(&stored).unwrap_or(Value::Null);
    api.store
        .put(&auth::enrollment(&edge), value)
        .await
        .map_err(internal)?;
    tracing::info!(edge = %edge, expires_at_ms = stored.expires_at_ms, "minted an enrollment token");
    with_target(
        ok(
            StatusCode::CREATED,
            EnrollmentTokenResponse {
                edge_id: edge.to_string(),
                token,
                expires_at_ms: stored.expires_at_ms,
            },
        ),
        format!(
            "enrollment token of edge {edge}, expires at {} ms",
            stored.expires_at_ms
        ),
    )
}

async fn revoke_edge(
    State(api): State<Api>,
    Extension(caller): Extension<Principal>,
    Path(edge): Path<String>,
) -> ApiResult {
    // Any edge that may exist can be revoked (also one enrolled before
    // new ids were limited to the certificate-safe shape).
    let edge = edge_of(&edge)?;
    let revocation = EdgeRevocation {
        edge_id: edge.to_string(),
        revoked_at_ms: now_ms(),
        revoked_by: caller.name,
    };
    let value = serde_json::to_value(&revocation).unwrap_or(Value::Null);
    // The edge's unused token goes with it: a stolen device's token must
    // not enroll a new certificate. No condition: it always applies.
    let _unconditional = api
        .store
        .txn(
            Txn::new()
                .put(auth::revoked_edge(&edge), value)
                .delete(auth::enrollment(&edge)),
        )
        .await
        .map_err(internal)?;
    // This broker closes the edge's connections at once; the others follow
    // through their watch of /auth/.
    if let Err(error) = api.auth.cache().reload().await {
        tracing::warn!(%error, "auth: reloading after a revocation failed; the watch retries");
    }
    tracing::warn!(edge = %edge, by = %revocation.revoked_by, "edge revoked");
    let target = format!("edge {edge} revoked");
    with_target(ok(StatusCode::OK, &revocation), target)
}
