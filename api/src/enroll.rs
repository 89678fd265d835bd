//! Wire shapes of certificate enrollment and edge revocation, shared by the
//! broker, `tribctl edges` and `edge-agent enroll`. Documented in
//! `docs/admin-api.md` ("Edge enrollment and revocation").
//!
//! 1. An operator mints a one-time enrollment token bound to an edge id
//!    (`POST /v1/edges/{edge_id}/token`, permission `auth_manage`):
//!    [`EnrollmentTokenRequest`] → [`EnrollmentTokenResponse`], the token
//!    shown once (the broker keeps its SHA-256).
//! 2. The device sends a PEM certificate signing request with that token as
//!    its bearer token (`POST` [`ENROLL_PATH`], no admin token):
//!    [`EnrollRequest`] → [`EnrollResponse`], a client certificate whose
//!    identity is the token's edge id, whatever the request asked for.
//! 3. `POST /v1/edges/{edge_id}/revoke` (`auth_manage`) →
//!    [`EdgeRevocation`]: every broker refuses that edge's certificates
//!    issued up to then.

use serde::{Deserialize, Serialize};

/// The enrollment endpoint on the broker's HTTPS admin listener.
pub const ENROLL_PATH: &str = "/v1/enroll";

/// Prefix of every enrollment token: `trib-enroll.<edge_id>.<64 hex>`
/// (never a named admin token, which starts `trib.`).
pub const ENROLL_TOKEN_PREFIX: &str = "trib-enroll.";

/// Time to live of an enrollment token when the request names none, ms (24
/// hours).
pub const DEFAULT_TOKEN_TTL_MS: u64 = 24 * 60 * 60 * 1000;

/// Longest time to live of an enrollment token, ms (30 days): a forgotten
/// token must not stay usable for ever.
pub const MAX_TOKEN_TTL_MS: u64 = 30 * 24 * 60 * 60 * 1000;

/// Largest enrollment request body the broker reads, bytes (a CSR is about
/// 500 bytes of PEM).
pub const MAX_ENROLL_BODY_BYTES: usize = 64 * 1024;

/// The `kind` of each refusal of [`ENROLL_PATH`] (the `error` message says
/// more).
pub mod refusal {
    /// 503: the broker has no `[enroll]` CA to sign with.
    pub const DISABLED: &str = "enrollment_disabled";
    /// 401: no bearer token, not an enrollment token, or not the one
    /// minted last for its edge.
    pub const TOKEN_UNKNOWN: &str = "token_unknown";
    /// 401: the token was used already (one use only).
    pub const TOKEN_USED: &str = "token_used";
    /// 401: the token's time to live is over.
    pub const TOKEN_EXPIRED: &str = "token_expired";
    /// 400: the body is not a PEM certificate signing request with a valid
    /// self-signature.
    pub const INVALID_CSR: &str = "invalid_csr";
    /// 403: the token's edge id is one no edge may have (a broker's
    /// certificate identity `broker-…`, the brokers' server name, a system
    /// namespace): no certificate is signed for it, whatever token was
    /// stored for it.
    pub const EDGE_ID_RESERVED: &str = "edge_id_reserved";
}

/// `POST /v1/edges/{edge_id}/token` body.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnrollmentTokenRequest {
    /// How long the token may be used, ms, from 1 to [`MAX_TOKEN_TTL_MS`];
    /// default [`DEFAULT_TOKEN_TTL_MS`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
}

/// `POST /v1/edges/{edge_id}/token` answer (201). The token is in no other
/// answer and is not stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnrollmentTokenResponse {
    /// The edge the token enrolls.
    pub edge_id: String,
    /// `trib-enroll.<edge_id>.<64 hex>`; it replaces any earlier token of
    /// this edge.
    pub token: String,
    /// When it stops being usable, ms since the Unix epoch.
    pub expires_at_ms: u64,
}

/// `POST /v1/enroll` body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnrollRequest {
    /// A PEM `CERTIFICATE REQUEST` (PKCS#10) signed by the device's new
    /// key. Only its public key is used.
    pub csr: String,
}

/// `POST /v1/enroll` answer (200).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnrollResponse {
    /// The identity of the certificate (DNS name and common name): the
    /// token's edge id.
    pub edge_id: String,
    /// The client certificate, PEM.
    pub certificate: String,
    /// The certificate of the CA that signed it, PEM.
    pub ca: String,
    /// The certificate's serial number, lowercase hex.
    pub serial: String,
    /// Start of validity, ms since the Unix epoch (whole seconds).
    pub not_before_ms: u64,
    /// End of validity, ms since the Unix epoch (whole seconds).
    pub not_after_ms: u64,
}

/// `POST /v1/edges/{edge_id}/revoke` answer (200), also the stored value
/// of `/auth/revoked_edges/{edge_id}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EdgeRevocation {
    /// The edge.
    pub edge_id: String,
    /// When it was revoked, ms since the Unix epoch: certificates of the
    /// edge whose validity starts at or before this second are refused.
    pub revoked_at_ms: u64,
    /// The principal that revoked it.
    pub revoked_by: String,
}
