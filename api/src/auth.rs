//! Wire shapes of the broker's `/v1/auth` endpoints (principals, role
//! bindings, roles, `whoami`), shared by the broker and `tribctl auth`.
//! Documented in `docs/admin-api.md` ("Authentication and permissions").

use serde::{Deserialize, Serialize};

/// How a principal authenticates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PrincipalKind {
    /// A named bearer token `trib.<principal>.<64 hex chars>`, stored as
    /// its SHA-256 only.
    Token,
    /// A client certificate chaining to the cluster CA whose identity (first
    /// DNS SAN, else common name) is the principal's name.
    Certificate,
}

impl PrincipalKind {
    /// `token` or `certificate`.
    pub fn as_str(self) -> &'static str {
        match self {
            PrincipalKind::Token => "token",
            PrincipalKind::Certificate => "certificate",
        }
    }
}

/// `POST /v1/auth/principals` body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreatePrincipalRequest {
    /// The principal's name (the naming rules of role names).
    pub name: String,
    /// How it authenticates; default `token`.
    #[serde(default = "default_kind")]
    pub kind: PrincipalKind,
    /// A role to grant in the same Raft transaction (the principal is
    /// created with its binding or not at all).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// Namespace scope of `role`; absent: every namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Topic-name prefix inside `namespace` (requires `namespace`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic_prefix: Option<String>,
}

fn default_kind() -> PrincipalKind {
    PrincipalKind::Token
}

/// A principal as listed (never its token).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrincipalInfo {
    /// Name.
    pub name: String,
    /// Kind.
    pub kind: PrincipalKind,
    /// When it was created, ms since the Unix epoch.
    pub created_at_ms: u64,
    /// The principal that created it.
    pub created_by: String,
}

/// `201` answer of `POST /v1/auth/principals`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreatePrincipalResponse {
    /// The new principal.
    pub principal: PrincipalInfo,
    /// The bearer token, for kind `token` only. Shown once: the broker
    /// keeps only its SHA-256.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// The binding granted with it, when the request named a `role`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binding: Option<BindingInfo>,
}

/// `GET /v1/auth/principals` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrincipalList {
    /// Every principal, by name.
    pub principals: Vec<PrincipalInfo>,
}

/// A role binding: `principal` holds `role` on a scope. Without
/// `namespace` it is cluster-wide; `topic_prefix` narrows it to the topics
/// of `namespace` whose name (after the namespace) starts with it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Binding {
    /// The principal.
    pub principal: String,
    /// The role (built-in or custom).
    pub role: String,
    /// Namespace scope; absent: every namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Topic-name prefix inside `namespace` (requires `namespace`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic_prefix: Option<String>,
}

/// A stored binding with its id (deterministic from its fields, so a grant
/// is idempotent).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BindingInfo {
    /// `/auth/bindings/{id}`.
    pub id: String,
    /// The binding.
    #[serde(flatten)]
    pub binding: Binding,
}

/// `GET /v1/auth/bindings[?principal=]` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BindingList {
    /// Bindings, by id.
    pub bindings: Vec<BindingInfo>,
}

/// A role and its permissions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoleInfo {
    /// Role name.
    pub name: String,
    /// Fixed in code (cannot be changed or deleted).
    pub built_in: bool,
    /// Permission names (`topics_read`, `consume`, ...).
    pub permissions: Vec<String>,
}

/// `GET /v1/auth/roles` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoleList {
    /// Built-in roles, then custom roles by name.
    pub roles: Vec<RoleInfo>,
}

/// `PUT /v1/auth/roles/{role}` body, and the stored value of
/// `/auth/roles/{role}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoleDefinition {
    /// Permission names.
    pub permissions: Vec<String>,
}

/// `GET /v1/auth/whoami` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WhoAmI {
    /// The authenticated principal.
    pub name: String,
    /// `token`, `certificate` or `bootstrap` (the legacy `admin_token`).
    pub kind: String,
    /// Its bindings.
    pub bindings: Vec<BindingInfo>,
}
