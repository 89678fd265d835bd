//! Builders for `/auth/...`.

use super::{BindingId, MetadataKey, NamespaceName, PrincipalName, RoleName};

/// `/auth/roles/{role}`.
pub fn role(role: &RoleName) -> String {
    MetadataKey::AuthRole { role: role.clone() }.to_string()
}

/// `/auth/bindings/{binding_id}`.
pub fn binding(binding: &BindingId) -> String {
    MetadataKey::AuthBinding {
        binding: binding.clone(),
    }
    .to_string()
}

/// `/auth/principals/{name}`.
pub fn principal(principal: &PrincipalName) -> String {
    MetadataKey::AuthPrincipal {
        principal: principal.clone(),
    }
    .to_string()
}

/// `/auth/enrollments/{edge_id}`: the edge's one-time enrollment token
/// (stored as its SHA-256), minted by `tribctl edges token`.
pub fn enrollment(edge: &NamespaceName) -> String {
    MetadataKey::AuthEnrollment { edge: edge.clone() }.to_string()
}

/// `/auth/enrollments/`: every enrollment token.
pub fn enrollments_prefix() -> String {
    "/auth/enrollments/".to_owned()
}

/// `/auth/revoked_edges/{edge_id}`: the edge's revocation (`tribctl edges
/// revoke`).
pub fn revoked_edge(edge: &NamespaceName) -> String {
    MetadataKey::AuthRevokedEdge { edge: edge.clone() }.to_string()
}

/// `/auth/revoked_edges/`: every revoked edge.
pub fn revoked_edges_prefix() -> String {
    "/auth/revoked_edges/".to_owned()
}

/// `/auth/roles/`: every custom role.
pub fn roles_prefix() -> String {
    "/auth/roles/".to_owned()
}

/// `/auth/bindings/`: every binding.
pub fn bindings_prefix() -> String {
    "/auth/bindings/".to_owned()
}

/// `/auth/principals/`: every principal.
pub fn principals_prefix() -> String {
    "/auth/principals/".to_owned()
}

/// `/auth/`: brokers watch it and reload RBAC on any change.
pub fn prefix() -> String {
    "/auth/".to_owned()
}
