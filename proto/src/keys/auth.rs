//! Builders for `/auth/...`.

use super::{BindingId, MetadataKey, PrincipalName, RoleName};

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
