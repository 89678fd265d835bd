//! The pure RBAC model (no I/O): [`Permission`], the built-in roles, the
//! stored shapes of principals, roles and bindings under `/auth/`, named
//! tokens (`trib.<principal>.<64 hex>`, stored as SHA-256) and the
//! authorization decision over a [`Snapshot`] of `/auth/`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use subtle::ConstantTimeEq;
use tributary_api::auth::{Binding, PrincipalKind};

/// One thing a principal may do; every `/v1` route needs exactly one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Permission {
    /// List and describe namespaces, topics, failure policies.
    TopicsRead,
    /// Create namespaces and topics, delete topics, set failure policies,
    /// `apply`, `skip-damaged`.
    TopicsWrite,
    /// Consumer data plane: peek, subscription state, attach/detach,
    /// receive/read, ack/nack.
    Consume,
    /// Subscription management: seek, pause/resume, replay-dlq,
    /// unsubscribe.
    SubscriptionsManage,
    /// Central publish.
    Produce,
    /// Every `/v1/storage` endpoint (the tier service).
    Storage,
    /// Cluster status.
    ClusterRead,
    /// The `/v1/auth` endpoints (principals, bindings, roles), edge
    /// enrollment tokens and edge revocation (`/v1/edges/{edge}/token`,
    /// `/v1/edges/{edge}/revoke`).
    AuthManage,
}

impl Permission {
    /// Every permission, in a stable order.
    pub const ALL: [Permission; 8] = [
        Permission::TopicsRead,
        Permission::TopicsWrite,
        Permission::Consume,
        Permission::SubscriptionsManage,
        Permission::Produce,
        Permission::Storage,
        Permission::ClusterRead,
        Permission::AuthManage,
    ];

    /// The stable snake-case name used on the wire and in custom roles.
    pub fn as_str(self) -> &'static str {
        match self {
            Permission::TopicsRead => "topics_read",
            Permission::TopicsWrite => "topics_write",
            Permission::Consume => "consume",
            Permission::SubscriptionsManage => "subscriptions_manage",
            Permission::Produce => "produce",
            Permission::Storage => "storage",
            Permission::ClusterRead => "cluster_read",
            Permission::AuthManage => "auth_manage",
        }
    }

    /// The permission named `name`, if any.
    pub fn parse(name: &str) -> Option<Permission> {
        Permission::ALL.into_iter().find(|p| p.as_str() == name)
    }
}

impl std::fmt::Display for Permission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The built-in roles, fixed in code: `(name, permissions)`.
///
/// - `admin`: everything.
/// - `tier`: the storage endpoints plus `topics_read` (the tier service).
/// - `consumer`: `consume`, `subscriptions_manage` and `topics_read` (a
///   consumer owns its subscriptions: seek, pause, replay its dead letters).
/// - `producer`: `produce` and `topics_read`.
pub const BUILT_IN_ROLES: [(&str, &[Permission]); 4] = [
    ("admin", &Permission::ALL),
    ("tier", &[Permission::Storage, Permission::TopicsRead]),
    (
        "consumer",
        &[
            Permission::Consume,
            Permission::SubscriptionsManage,
            Permission::TopicsRead,
        ],
    ),
    ("producer", &[Permission::Produce, Permission::TopicsRead]),
];

/// The permissions of built-in role `name`, if it is one.
pub fn built_in_role(name: &str) -> Option<&'static [Permission]> {
    BUILT_IN_ROLES
        .iter()
        .find(|(role, _)| *role == name)
        .map(|(_, permissions)| *permissions)
}

/// The stored value of `/auth/principals/{name}`: never the token, only
/// its SHA-256 (hex).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredPrincipal {
    /// Name (equals the key's last part).
    pub name: String,
    /// How it authenticates.
    pub kind: PrincipalKind,
    /// SHA-256 of the whole token string, lowercase hex; kind `token` only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_sha256: Option<String>,
    /// Creation time, ms since the Unix epoch.
    pub created_at_ms: u64,
    /// Who created it.
    pub created_by: String,
    /// Bumped by every grant to this principal (the grant rewrites the
    /// principal in its transaction), so a revoke that read the principal
    /// before a grant committed fails its precondition and reads again:
    /// no binding outlives its principal.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub generation: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The prefix of every named token.
pub const TOKEN_PREFIX: &str = "trib.";

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// SHA-256 of `data`, lowercase hex.
pub fn sha256_hex(data: &[u8]) -> String {
    hex(ring::digest::digest(&ring::digest::SHA256, data).as_ref())
}

/// A new named token for `principal`: `trib.<principal>.<64 hex>` from 32
/// bytes of the system CSPRNG.
///
/// # Errors
/// The CSPRNG failed (`ring::error::Unspecified`).
pub fn new_token(principal: &str) -> Result<String, ring::error::Unspecified> {
    use ring::rand::SecureRandom;
    let mut secret = [0u8; 32];
    ring::rand::SystemRandom::new().fill(&mut secret)?;
    Ok(format!("{TOKEN_PREFIX}{principal}.{}", hex(&secret)))
}

/// The principal name of a well-formed named token (`trib.<name>.<64
/// lowercase hex>`), `None` for any other string (a legacy token).
pub fn token_principal(token: &str) -> Option<&str> {
    let rest = token.strip_prefix(TOKEN_PREFIX)?;
    let (name, secret) = rest.rsplit_once('.')?;
    let well_formed = secret.len() == 64
        && secret
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    (well_formed && !name.is_empty()).then_some(name)
}

/// Whether `presented` hashes to `expected_sha256_hex`, compared in
/// constant time (both sides are 64 hex characters).
pub fn token_matches(presented: &str, expected_sha256_hex: &str) -> bool {
    let presented = sha256_hex(presented.as_bytes());
    bool::from(presented.as_bytes().ct_eq(expected_sha256_hex.as_bytes()))
}

/// Whether `presented` equals `secret`, in time independent of where they
/// differ and of `secret`'s length (both are hashed first).
pub fn secret_matches(presented: &str, secret: &str) -> bool {
    let a = ring::digest::digest(&ring::digest::SHA256, presented.as_bytes());
    let b = ring::digest::digest(&ring::digest::SHA256, secret.as_bytes());
    bool::from(a.as_ref().ct_eq(b.as_ref()))
}

/// The deterministic id of a binding: the first 16 bytes of the SHA-256
/// of its fields, hex (so granting the same thing twice is one binding).
pub fn binding_id(binding: &Binding) -> String {
    let text = format!(
        "{}\n{}\n{}\n{}",
        binding.principal,
        binding.role,
        binding.namespace.as_deref().unwrap_or(""),
        binding.topic_prefix.as_deref().unwrap_or("")
    );
    sha256_hex(text.as_bytes())[..32].to_owned()
}

/// Who a request comes from, once authenticated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The principal's name (`bootstrap-admin` for the legacy token).
    pub name: String,
    /// `token`, `certificate` or `bootstrap`.
    pub kind: &'static str,
}

/// The name of the legacy `admin_token`'s principal.
pub const BOOTSTRAP_ADMIN: &str = "bootstrap-admin";

/// A copy of everything under `/auth/`, decoded.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// Principals by name.
    pub principals: BTreeMap<String, StoredPrincipal>,
    /// Custom roles by name: their permissions (unknown names dropped).
    pub roles: BTreeMap<String, Vec<Permission>>,
    /// Bindings by id.
    pub bindings: BTreeMap<String, Binding>,
    /// Revoked edges: the revocation time by edge id, ms since the epoch
    /// (`u64::MAX` for an undecodable revocation: every certificate).
    pub revoked_edges: BTreeMap<String, u64>,
}

/// Where a request acts: its namespace and topic (after the namespace),
/// when it names them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scope {
    /// Namespace, `None` for a cluster-wide request.
    pub namespace: Option<String>,
    /// Topic name after the namespace (`orders` in `/shop/orders`).
    pub topic: Option<String>,
}

impl Snapshot {
    /// The permissions of role `name` (built-in first), empty when unknown.
    pub fn role_permissions(&self, name: &str) -> &[Permission] {
        match built_in_role(name) {
            Some(permissions) => permissions,
            None => self.roles.get(name).map_or(&[], Vec::as_slice),
        }
    }

    /// Why a certificate of `edge` valid from `not_before_s` (seconds
    /// since the epoch; `None`: unknown) is refused, if it is: the edge
    /// was revoked at or after the certificate's start
    /// ([`crate::enroll::model::revokes`]).
    pub fn edge_revoked(&self, edge: &str, not_before_s: Option<i64>) -> Option<u64> {
        let revoked_at_ms = *self.revoked_edges.get(edge)?;
        crate::enroll::model::revokes(revoked_at_ms, not_before_s).then_some(revoked_at_ms)
    }

    /// The bindings of `principal`, by id.
    pub fn bindings_of<'a>(
        &'a self,
        principal: &'a str,
    ) -> impl Iterator<Item = (&'a String, &'a Binding)> + 'a {
        self.bindings
            .iter()
            .filter(move |(_, b)| b.principal == principal)
    }

    /// Whether `principal` holds `permission` on `scope`: some binding of
    /// it grants a role with the permission, and the binding covers the
    /// scope (no namespace: everything; a namespace: requests naming that
    /// namespace; a topic prefix: requests naming a topic of that namespace
    /// starting with it). The bootstrap admin holds everything.
    pub fn allows(&self, principal: &Principal, permission: Permission, scope: &Scope) -> bool {
        if principal.kind == "bootstrap" {
            return true;
        }
        self.bindings_of(&principal.name).any(|(_, binding)| {
            self.role_permissions(&binding.role).contains(&permission) && covers(binding, scope)
        })
    }
}

fn covers(binding: &Binding, scope: &Scope) -> bool {
    let Some(namespace) = &binding.namespace else {
        return true;
    };
    if scope.namespace.as_deref() != Some(namespace.as_str()) {
        return false;
    }
    match &binding.topic_prefix {
        None => true,
        Some(prefix) => scope
            .topic
            .as_deref()
            .is_some_and(|topic| topic.starts_with(prefix.as_str())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bind(principal: &str, role: &str, ns: Option<&str>, prefix: Option<&str>) -> Binding {
        Binding {
            principal: principal.into(),
            role: role.into(),
            namespace: ns.map(Into::into),
            topic_prefix: prefix.map(Into::into),
        }
    }

    fn scope(ns: Option<&str>, topic: Option<&str>) -> Scope {
        Scope {
            namespace: ns.map(Into::into),
            topic: topic.map(Into::into),
        }
    }

    #[test]
    fn permission_names_are_stable_and_parse_back() {
        let names: Vec<&str> = Permission::ALL.iter().map(|p| p.as_str()).collect();
        assert_eq!(
            names,
            [
                "topics_read",
                "topics_write",
                "consume",
                "subscriptions_manage",
                "produce",
                "storage",
                "cluster_read",
                "auth_manage"
            ]
        );
        for p in Permission::ALL {
            assert_eq!(Permission::parse(p.as_str()), Some(p));
        }
        assert_eq!(Permission::parse("everything"), None);
    }

    #[test]
    fn tokens_name_their_principal_and_match_only_their_hash() {
        let token = new_token("tier-1").unwrap();
        assert_eq!(token.len(), "trib.tier-1.".len() + 64);
        assert_eq!(token_principal(&token), Some("tier-1"));
        assert_eq!(token_principal("trib.a.b.0000"), None);
        assert_eq!(token_principal("legacy-secret"), None);
        let dotted = format!("trib.a.b.{}", "0".repeat(64));
        assert_eq!(token_principal(&dotted), Some("a.b"));
        let hash = sha256_hex(token.as_bytes());
        assert!(token_matches(&token, &hash));
        assert!(!token_matches(&new_token("tier-1").unwrap(), &hash));
        assert!(secret_matches("s3cret", "s3cret"));
        assert!(!secret_matches("s3cret", "s3cret2"));
        assert_ne!(new_token("x").unwrap(), new_token("x").unwrap());
    }

    #[test]
    fn binding_ids_are_deterministic_per_scope() {
        let a = bind("c", "consumer", Some("shop"), None);
        assert_eq!(binding_id(&a), binding_id(&a.clone()));
        assert_eq!(binding_id(&a).len(), 32);
        assert_ne!(
            binding_id(&a),
            binding_id(&bind("c", "consumer", Some("shop"), Some("o")))
        );
        assert_ne!(
            binding_id(&a),
            binding_id(&bind("c", "consumer", None, None))
        );
    }

    #[test]
    fn scopes_cover_namespace_and_topic_prefix() {
        let mut snap = Snapshot::default();
        snap.bindings
            .insert("1".into(), bind("c", "consumer", Some("a"), None));
        snap.bindings
            .insert("2".into(), bind("p", "producer", Some("a"), Some("orders")));
        snap.bindings
            .insert("3".into(), bind("t", "tier", None, None));
        snap.roles
            .insert("reader".into(), vec![Permission::TopicsRead]);
        snap.bindings
            .insert("4".into(), bind("r", "reader", None, None));
        let who = |name: &str| Principal {
            name: name.into(),
            kind: "token",
        };
        assert!(snap.allows(&who("c"), Permission::Consume, &scope(Some("a"), Some("x"))));
        assert!(!snap.allows(&who("c"), Permission::Consume, &scope(Some("b"), Some("x"))));
        assert!(!snap.allows(&who("c"), Permission::TopicsRead, &scope(None, None)));
        assert!(!snap.allows(&who("c"), Permission::TopicsWrite, &scope(Some("a"), None)));
        assert!(snap.allows(
            &who("p"),
            Permission::Produce,
            &scope(Some("a"), Some("orders-eu"))
        ));
        assert!(!snap.allows(
            &who("p"),
            Permission::Produce,
            &scope(Some("a"), Some("users"))
        ));
        assert!(!snap.allows(&who("p"), Permission::Produce, &scope(Some("a"), None)));
        assert!(snap.allows(&who("t"), Permission::Storage, &scope(None, None)));
        assert!(!snap.allows(&who("t"), Permission::TopicsWrite, &scope(Some("a"), None)));
        assert!(snap.allows(&who("r"), Permission::TopicsRead, &scope(None, None)));
        assert!(!snap.allows(&who("r"), Permission::Consume, &scope(None, None)));
        assert!(!snap.allows(&who("nobody"), Permission::TopicsRead, &scope(None, None)));
    }
}
