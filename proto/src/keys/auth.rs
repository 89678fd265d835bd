//! Builders for `/auth/...`.

use super::{BindingId, MetadataKey, RoleName};

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

/// `/auth/`: brokers watch it and reload RBAC on any change.
pub fn prefix() -> String {
    "/auth/".to_owned()
}
