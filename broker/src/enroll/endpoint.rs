//! `POST /v1/enroll` ([`tributary_api::enroll::ENROLL_PATH`]): a device
//! trades its one-time enrollment token (the bearer token; no admin token
//! or certificate is needed) and a PEM CSR for a client certificate whose
//! identity is the token's edge id.
//!
//! Order, so that a refusal changes nothing: check the token (exists, is
//! the one minted last, unused, not expired), sign the certificate in
//! memory (a bad CSR stops here), then consume the token in one Raft
//! transaction conditioned on the token record and the edge's revocation
//! record being exactly what was read. Of two concurrent uses only one
//! transaction applies; the other is answered `401 token_used` and its
//! certificate, never sent, is dropped. Every outcome is audited
//! (principal `enroll:{edge_id}`, kind `enrollment_token`). A token whose
//! edge id no edge may have ([`NamespaceName::reserved_for_edges`], e.g.
//! `broker-2`) is refused `403 edge_id_reserved` before anything is read.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use broker_core::metadata::{MetadataStore, Txn};
use serde_json::Value;
use tributary_api::enroll::{
    ENROLL_PATH, EdgeRevocation, EnrollRequest, EnrollResponse, MAX_ENROLL_BODY_BYTES, refusal,
};
use tributary_proto::keys::{NamespaceName, auth};

use super::http::{internal, now_ms};
use super::model::{StoredEnrollment, TokenRefusal, check_token, not_before_s, token_edge};
use super::signer::Signer;
use crate::auth::AuthState;
use crate::auth::audit::AuditRecord;
use crate::http::{ApiError, parse_json};

/// What the endpoint needs: the metadata store, the auth state (for the
/// audit log) and the `[enroll]` CA, if this broker has one.
#[derive(Clone)]
pub struct EnrollService {
    store: Arc<dyn MetadataStore>,
    auth: AuthState,
    signer: Option<Arc<Signer>>,
}

impl std::fmt::Debug for EnrollService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EnrollService")
            .field("signer", &self.signer)
            .finish_non_exhaustive()
    }
}

impl EnrollService {
    /// The endpoint over `store`, auditing through `auth`, signing with
    /// `signer` (`None`: every request is `503 enrollment_disabled`).
    pub fn new(
        store: Arc<dyn MetadataStore>,
        auth: AuthState,
        signer: Option<Arc<Signer>>,
    ) -> EnrollService {
        EnrollService {
            store,
            auth,
            signer,
        }
    }
}

/// The `POST /v1/enroll` route (request bodies above
/// [`MAX_ENROLL_BODY_BYTES`] are refused with `413`).
pub fn enroll_router(service: EnrollService) -> Router {
    Router::new()
        .route(ENROLL_PATH, post(enroll))
        .layer(DefaultBodyLimit::max(MAX_ENROLL_BODY_BYTES))
        .with_state(service)
}

/// A refused token as a `401` of its kind.
fn refused(refusal: &TokenRefusal) -> ApiError {
    ApiError::new(
        StatusCode::UNAUTHORIZED,
        refusal.kind(),
        refusal.to_string(),
    )
}

/// The bearer token of `headers`, if any.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(broker_core::secrets::bearer_token)
}

async fn enroll(State(service): State<EnrollService>, headers: HeaderMap, body: Bytes) -> Response {
    let edge = bearer(&headers).and_then(token_edge).map(str::to_owned);
    let outcome = service.run(&headers, &body).await;
    let (response, target) = match outcome {
        Ok((answer, target)) => (
            (StatusCode::OK, axum::Json(answer)).into_response(),
            Some(target),
        ),
        Err(error) => (error.into_response(), None),
    };
    if let Some(sink) = service.auth.audit() {
        let status = response.status().as_u16();
        let (outcome, kind) = match status {
            200..=299 => ("ok", None),
            401 => ("refused", Some("unauthorized")),
            _ => ("failed", None),
        };
        sink.record(AuditRecord {
            at_ms: now_ms(),
            principal: format!("enroll:{}", edge.as_deref().unwrap_or("unknown")),
            principal_kind: "enrollment_token".to_owned(),
            action: format!("POST {ENROLL_PATH}"),
            route: ENROLL_PATH.to_owned(),
            namespace: edge,
            topic: None,
            target,
            status,
            outcome: outcome.to_owned(),
            kind: kind.map(str::to_owned),
        });
    }
    response
}

impl EnrollService {
    /// The answer and the audit target, or the refusal.
    async fn run(
        &self,
        headers: &HeaderMap,
        body: &Bytes,
    ) -> Result<(EnrollResponse, String), ApiError> {
        let Some(signer) = &self.signer else {
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                refusal::DISABLED,
                "this broker signs no certificates: its configuration has no [enroll] section \
                 (ca_cert, ca_key); enroll through a broker that has one",
            ));
        };
        let token = bearer(headers).ok_or_else(|| {
            ApiError::new(
                StatusCode::UNAUTHORIZED,
                refusal::TOKEN_UNKNOWN,
                "no enrollment token: send it as Authorization: Bearer trib-enroll.<edge_id>.<hex> \
                 (`tribctl edges token EDGE_ID` mints one)",
            )
        })?;
        let edge = token_edge(token)
            .and_then(|edge| NamespaceName::new(edge).ok())
            .ok_or_else(|| refused(&TokenRefusal::Unknown))?;
        // A token stored for such an id (minted before the rule, or
        // written around the admin API) signs nothing: a certificate named
        // `broker-2` would be served by the Raft listener as broker 2's.
        if let Some(why) = edge.reserved_for_edges() {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                refusal::EDGE_ID_RESERVED,
                format!("edge_id: {:?} cannot be enrolled: {why}", edge.as_str()),
            )
            .with("field", Value::String("edge_id".into())));
        }
        let request: EnrollRequest = parse_json(body)?;
        let key = auth::enrollment(&edge);
        let current = self.store.get(&key).await.map_err(internal)?;
        let stored = decode::<StoredEnrollment>(current.as_ref(), &key);
        let now = now_ms();
        check_token(stored.as_ref(), token, now).map_err(|r| refused(&r))?;
        let stored = stored.ok_or_else(|| refused(&TokenRefusal::Unknown))?;
        let revoked_key = auth::revoked_edge(&edge);
        let revocation = self.store.get(&revoked_key).await.map_err(internal)?;
        let revoked_at_ms = match decode::<EdgeRevocation>(revocation.as_ref(), &revoked_key) {
            Some(r) => Some(r.revoked_at_ms),
            None if revocation.is_some() => {
                return Err(ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    format!("the revocation record of edge {edge} is undecodable: revoke it again"),
                ));
            }
            None => None,
        };
        let serial = random_serial()?;
        let signed = signer
            .sign(
                &request.csr,
                &edge,
                not_before_s(now, revoked_at_ms),
                serial,
            )
            .map_err(|e| {
                ApiError::new(StatusCode::BAD_REQUEST, refusal::INVALID_CSR, e.to_string())
                    .with("field", Value::String("csr".into()))
            })?;
        let consumed =
            serde_json::to_value(stored.consumed(now, &signed.serial)).unwrap_or(Value::Null);
        let mut txn = Txn::new();
        txn = match current {
            Some(value) => txn.when_equals(&key, value),
            None => txn.when_absent(&key),
        };
        txn = match revocation {
            Some(value) => txn.when_equals(&revoked_key, value),
            None => txn.when_absent(&revoked_key),
        };
        let outcome = self
            .store
            .txn(txn.put(&key, consumed))
            .await
            .map_err(internal)?;
        if !outcome.applied() {
            // Someone used, replaced or revoked it meanwhile: say which.
            let now_current = self.store.get(&key).await.map_err(internal)?;
            let now_stored = decode::<StoredEnrollment>(now_current.as_ref(), &key);
            check_token(now_stored.as_ref(), token, now_ms()).map_err(|r| refused(&r))?;
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "conflict",
                format!("edge {edge} was revoked while enrolling: enroll again"),
            ));
        }
        tracing::info!(edge = %edge, serial = %signed.serial, "enrolled an edge: certificate signed");
        let target = format!("certificate {} for edge {edge}", signed.serial);
        Ok((
            EnrollResponse {
                edge_id: edge.to_string(),
                certificate: signed.pem,
                ca: signer.ca_pem().to_owned(),
                serial: signed.serial,
                not_before_ms: signed.not_before_s.saturating_mul(1000),
                not_after_ms: signed.not_after_s.saturating_mul(1000),
            },
            target,
        ))
    }
}

/// `value` decoded as `T`; an undecodable value is logged and treated as
/// absent (an unknown token, fail closed).
fn decode<T: serde::de::DeserializeOwned>(value: Option<&Value>, key: &str) -> Option<T> {
    let value = value?;
    match serde_json::from_value(value.clone()) {
        Ok(decoded) => Some(decoded),
        Err(error) => {
            tracing::warn!(%key, %error, "enrollment: undecodable record");
            None
        }
    }
}

/// 16 random bytes from the system CSPRNG.
fn random_serial() -> Result<[u8; 16], ApiError> {
    use ring::rand::SecureRandom;
    let mut serial = [0u8; 16];
    ring::rand::SystemRandom::new()
        .fill(&mut serial)
        .map_err(|_| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "the system random number generator failed",
            )
        })?;
    Ok(serial)
}
