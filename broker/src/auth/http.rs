//! The `/v1/auth` endpoints (all `auth_manage` except `whoami`): principals
//! (create shows a named token once and removes bindings left under its
//! name; revoke deletes the principal and all its bindings in one Raft
//! transaction conditioned on the principal, which every grant rewrites
//! with a new generation, so a racing grant cannot leave a binding
//! behind), role bindings (ids deterministic,
//! so a grant is idempotent), custom roles and `whoami`. Wire shapes in
//! [`tributary_api::auth`]. After each write this broker reloads its cache
//! at once; the others follow through their watch of `/auth/`.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Extension, Path, Query, State};
use axum::http::StatusCode;
use axum::middleware;
use axum::routing::{delete, get, put};
use axum::{Json, Router};
use broker_core::metadata::{MetadataError, MetadataStore, Txn, TxnOutcome};
use serde::Deserialize;
use serde_json::{Value, json};
use tributary_api::auth::{
    Binding, BindingInfo, BindingList, CreatePrincipalRequest, CreatePrincipalResponse,
    PrincipalInfo, PrincipalKind, PrincipalList, RoleDefinition, RoleInfo, RoleList, WhoAmI,
};
use tributary_proto::keys::{BindingId, NamespaceName, PrincipalName, RoleName, auth};

use super::AuthState;
use super::audit::AuditTarget;
use super::model::{
    BOOTSTRAP_ADMIN, BUILT_IN_ROLES, Permission, Principal, StoredPrincipal, binding_id,
    built_in_role, new_token, sha256_hex,
};
use crate::http::{ApiError, ApiResult, ok, parse_json, query};

#[derive(Clone)]
struct Api {
    auth: AuthState,
    store: Arc<dyn MetadataStore>,
}

/// The `/v1/auth` routes, behind the guard.
pub fn router(auth: AuthState, store: Arc<dyn MetadataStore>) -> Router {
    let api = Api {
        auth: auth.clone(),
        store,
    };
    Router::new()
        .route(
            "/v1/auth/principals",
            get(list_principals).post(create_principal),
        )
        .route("/v1/auth/principals/{name}", delete(revoke_principal))
        .route("/v1/auth/bindings", get(list_bindings).post(grant))
        .route("/v1/auth/bindings/{id}", delete(ungrant))
        .route("/v1/auth/roles", get(list_roles))
        .route("/v1/auth/roles/{role}", put(put_role).delete(delete_role))
        .route("/v1/auth/whoami", get(whoami))
        .route_layer(middleware::from_fn_with_state(auth, super::guard))
        .with_state(api)
}

fn internal(error: MetadataError) -> ApiError {
    tracing::error!(%error, "auth API: metadata failure");
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "internal",
        error.to_string(),
    )
}

fn conflict(message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::CONFLICT, "conflict", message)
}

fn not_found(message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", message)
}

impl Api {
    async fn reload(&self) {
        if let Err(error) = self.auth.cache().reload().await {
            tracing::warn!(%error, "auth: reloading after a change failed; the watch retries");
        }
    }

    async fn list<T: serde::de::DeserializeOwned>(
        &self,
        prefix: &str,
    ) -> Result<Vec<(String, T)>, ApiError> {
        let entries = self.store.list(prefix).await.map_err(internal)?;
        Ok(entries
            .into_iter()
            .filter_map(|(key, value)| {
                let name = key.strip_prefix(prefix)?.to_owned();
                serde_json::from_value(value).ok().map(|v| (name, v))
            })
            .collect())
    }
}

fn info(p: StoredPrincipal) -> PrincipalInfo {
    PrincipalInfo {
        name: p.name,
        kind: p.kind,
        created_at_ms: p.created_at_ms,
        created_by: p.created_by,
    }
}

async fn list_principals(State(api): State<Api>) -> ApiResult {
    let principals = api
        .list::<StoredPrincipal>(&auth::principals_prefix())
        .await?
        .into_iter()
        .map(|(_, p)| info(p))
        .collect();
    ok(StatusCode::OK, PrincipalList { principals })
}

async fn create_principal(
    State(api): State<Api>,
    Extension(caller): Extension<Principal>,
    body: Bytes,
) -> ApiResult {
    let request: CreatePrincipalRequest = parse_json(&body)?;
    let name = PrincipalName::new(&request.name).map_err(|e| ApiError::name("name", e))?;
    if name.as_str() == BOOTSTRAP_ADMIN {
        return Err(conflict(format!(
            "{BOOTSTRAP_ADMIN} is reserved for the configured admin_token"
        ))
        .with("field", json!("name")));
    }
    let token = match request.kind {
        PrincipalKind::Token => Some(new_token(name.as_str()).map_err(|_| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "the system random number generator failed",
            )
        })?),
        PrincipalKind::Certificate => None,
    };
    let binding = match &request.role {
        Some(role) => {
            let binding = Binding {
                principal: name.to_string(),
                role: role.clone(),
                namespace: request.namespace.clone(),
                topic_prefix: request.topic_prefix.clone(),
            };
            check_binding(&api, &binding).await?;
            Some(binding)
        }
        None if request.namespace.is_some() || request.topic_prefix.is_some() => {
            return Err(ApiError::invalid(
                "role",
                "role: namespace and topic_prefix scope a role; name one",
            ));
        }
        None => None,
    };
    let stored = StoredPrincipal {
        name: name.to_string(),
        kind: request.kind,
        token_sha256: token.as_deref().map(|t| sha256_hex(t.as_bytes())),
        created_at_ms: u64::try_from(broker_core::clock::now_ms()).unwrap_or(0),
        created_by: caller.name,
        generation: 0,
    };
    let key = auth::principal(&name);
    let value = serde_json::to_value(&stored).unwrap_or(Value::Null);
    let mut txn = Txn::new().when_absent(&key).put(&key, value);
    let mut granted = None;
    let mut granted_key = None;
    if let Some(binding) = binding {
        let (binding_key, binding_value, id) = binding_entry(&binding)?;
        txn = txn.put(binding_key.clone(), binding_value);
        granted_key = Some(binding_key);
        granted = Some(BindingInfo { id, binding });
    }
    // A new principal inherits nothing: bindings left under its name (by
    // a principal of that name revoked while a grant raced it, or written
    // around the API) go in the same transaction. No grant can add one
    // meanwhile: a grant needs the principal to exist.
    let stale = bindings_of(&api, &name).await?;
    for (id, _) in &stale {
        let stale_key = format!("{}{id}", auth::bindings_prefix());
        if granted_key.as_deref() != Some(stale_key.as_str()) {
            txn = txn.delete(stale_key);
        }
    }
    let outcome = api.store.txn(txn).await.map_err(internal)?;
    if !outcome.applied() {
        return Err(conflict(format!(
            "principal {name} exists: revoke it first"
        )));
    }
    if !stale.is_empty() {
        let ids: Vec<&str> = stale.iter().map(|(id, _)| id.as_str()).collect();
        tracing::warn!(principal = %name, bindings = %ids.join(","), "created a principal: removed bindings left under its name");
    }
    api.reload().await;
    let target = format!("principal {name} ({})", kind_name(request.kind));
    with_target(
        ok(
            StatusCode::CREATED,
            CreatePrincipalResponse {
                principal: info(stored),
                token,
                binding: granted,
            },
        ),
        target,
    )
}

fn kind_name(kind: PrincipalKind) -> &'static str {
    match kind {
        PrincipalKind::Token => "token",
        PrincipalKind::Certificate => "certificate",
    }
}

/// `response` with the [`AuditTarget`] the guard copies into the audit
/// record.
fn with_target(response: ApiResult, target: String) -> ApiResult {
    response.map(|mut response| {
        response.extensions_mut().insert(AuditTarget(target));
        response
    })
}

async fn revoke_principal(State(api): State<Api>, Path(name): Path<String>) -> ApiResult {
    let name = PrincipalName::new(&name).map_err(|e| ApiError::name("name", e))?;
    if name.as_str() == BOOTSTRAP_ADMIN {
        return Err(conflict(
            "bootstrap-admin is the configured admin_token: remove it from the broker's configuration",
        ));
    }
    let key = auth::principal(&name);
    // The principal's value is the precondition and every grant rewrites
    // it: a grant committed after the read below fails this transaction,
    // which then reads again (its binding included).
    let mut attempts = 0;
    let removed = loop {
        attempts += 1;
        let Some(current) = api.store.get(&key).await.map_err(internal)? else {
            return Err(not_found(format!("no principal {name}")));
        };
        let mut txn = Txn::new().when_equals(&key, current).delete(&key);
        let mut removed = Vec::new();
        for (id, _) in bindings_of(&api, &name).await? {
            txn = txn.delete(format!("{}{id}", auth::bindings_prefix()));
            removed.push(id);
        }
        match api.store.txn(txn).await.map_err(internal)? {
            TxnOutcome::Applied => break removed,
            TxnOutcome::ConditionFailed { .. } if attempts < CONCURRENT_ATTEMPTS => continue,
            TxnOutcome::ConditionFailed { .. } => {
                return Err(conflict(format!(
                    "principal {name} changed concurrently: retry"
                )));
            }
        }
    };
    api.reload().await;
    ok(
        StatusCode::OK,
        json!({"revoked": name, "bindings_removed": removed}),
    )
}

/// How often a grant or a revoke reads and tries again when the
/// principal changed in between before answering `409 conflict`.
const CONCURRENT_ATTEMPTS: u32 = 5;

/// The bindings whose principal is `name`, by id.
async fn bindings_of(api: &Api, name: &PrincipalName) -> Result<Vec<(String, Binding)>, ApiError> {
    Ok(api
        .list::<Binding>(&auth::bindings_prefix())
        .await?
        .into_iter()
        .filter(|(_, binding)| binding.principal == name.as_str())
        .collect())
}

/// The key and stored value of custom role `role`, `None` for a built-in
/// one.
///
/// # Errors
/// `404 not_found` (field `role`) when the custom role does not exist.
async fn custom_role(api: &Api, role: &str) -> Result<Option<(String, Value)>, ApiError> {
    if built_in_role(role).is_some() {
        return Ok(None);
    }
    let name = RoleName::new(role).map_err(|e| ApiError::name("role", e))?;
    let key = auth::role(&name);
    match api.store.get(&key).await.map_err(internal)? {
        Some(value) => Ok(Some((key, value))),
        None => Err(not_found(format!("no role {role}")).with("field", json!("role"))),
    }
}

/// The stored principal `current` with its generation bumped.
fn next_generation(current: &Value, name: &PrincipalName) -> Result<Value, ApiError> {
    let mut stored: StoredPrincipal = serde_json::from_value(current.clone()).map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("the stored principal {name} is undecodable ({e}): revoke and create it again"),
        )
    })?;
    stored.generation = stored.generation.saturating_add(1);
    serde_json::to_value(&stored).map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("principal {name}: {e}"),
        )
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BindingQuery {
    principal: Option<String>,
}

async fn list_bindings(
    State(api): State<Api>,
    q: Result<Query<BindingQuery>, QueryRejection>,
) -> ApiResult {
    let q = query(q)?;
    let bindings = api
        .list::<Binding>(&auth::bindings_prefix())
        .await?
        .into_iter()
        .filter(|(_, b)| q.principal.as_ref().is_none_or(|p| *p == b.principal))
        .map(|(id, binding)| BindingInfo { id, binding })
        .collect();
    ok(StatusCode::OK, BindingList { bindings })
}

async fn role_exists(api: &Api, role: &str) -> Result<bool, ApiError> {
    if built_in_role(role).is_some() {
        return Ok(true);
    }
    let role = RoleName::new(role).map_err(|e| ApiError::name("role", e))?;
    Ok(api
        .store
        .get(&auth::role(&role))
        .await
        .map_err(internal)?
        .is_some())
}

/// Checks a binding's scope and that its role exists; its principal's name.
async fn check_binding(api: &Api, binding: &Binding) -> Result<PrincipalName, ApiError> {
    let principal =
        PrincipalName::new(&binding.principal).map_err(|e| ApiError::name("principal", e))?;
    if let Some(ns) = &binding.namespace {
        NamespaceName::new(ns).map_err(|e| ApiError::name("namespace", e))?;
    }
    if binding.topic_prefix.is_some() && binding.namespace.is_none() {
        return Err(ApiError::invalid(
            "topic_prefix",
            "topic_prefix: needs a namespace",
        ));
    }
    if !role_exists(api, &binding.role).await? {
        return Err(not_found(format!("no role {}", binding.role)).with("field", json!("role")));
    }
    Ok(principal)
}

/// The store key and value of `binding`, and its id.
fn binding_entry(binding: &Binding) -> Result<(String, Value, String), ApiError> {
    let id = binding_id(binding);
    let key = auth::binding(&BindingId::new(&id).map_err(|e| ApiError::name("id", e))?);
    let value = serde_json::to_value(binding).unwrap_or(Value::Null);
    Ok((key, value, id))
}

async fn grant(State(api): State<Api>, body: Bytes) -> ApiResult {
    let binding: Binding = parse_json(&body)?;
    let principal = check_binding(&api, &binding).await?;
    let principal_key = auth::principal(&principal);
    let (key, value, id) = binding_entry(&binding)?;
    // Conditioned on the principal's value, which it rewrites with the
    // next generation: a revoke that read the principal before this
    // commits fails its own precondition (see revoke_principal).
    let mut attempts = 0;
    loop {
        attempts += 1;
        let Some(current) = api.store.get(&principal_key).await.map_err(internal)? else {
            return Err(
                not_found(format!("no principal {principal}: create it first"))
                    .with("field", json!("principal")),
            );
        };
        let bumped = next_generation(&current, &principal)?;
        let mut txn = Txn::new()
            .when_equals(&principal_key, current)
            .put(&principal_key, bumped)
            .put(&key, value.clone());
        // A custom role must still be there as read: a grant cannot commit
        // after the role's deletion (put_role clears what raced it).
        if let Some((role_key, role_value)) = custom_role(&api, &binding.role).await? {
            txn = txn.when_equals(role_key, role_value);
        }
        let outcome = api.store.txn(txn).await.map_err(internal)?;
        if outcome.applied() {
            break;
        }
        if attempts >= CONCURRENT_ATTEMPTS {
            return Err(conflict(format!(
                "principal {principal} changed concurrently: retry"
            )));
        }
    }
    api.reload().await;
    let on = match (&binding.namespace, &binding.topic_prefix) {
        (Some(ns), Some(prefix)) => format!("namespace {ns}, topics {prefix}*"),
        (Some(ns), None) => format!("namespace {ns}"),
        _ => "the cluster".to_owned(),
    };
    let target = format!(
        "binding {id}: {} role {} on {on}",
        binding.principal, binding.role
    );
    with_target(ok(StatusCode::CREATED, BindingInfo { id, binding }), target)
}

async fn ungrant(State(api): State<Api>, Path(id): Path<String>) -> ApiResult {
    let id = BindingId::new(&id).map_err(|e| ApiError::name("id", e))?;
    if !api
        .store
        .delete(&auth::binding(&id))
        .await
        .map_err(internal)?
    {
        return Err(not_found(format!("no binding {id}")));
    }
    api.reload().await;
    ok(StatusCode::OK, json!({"removed": id}))
}

fn names(permissions: &[Permission]) -> Vec<String> {
    permissions.iter().map(|p| p.as_str().to_owned()).collect()
}

async fn list_roles(State(api): State<Api>) -> ApiResult {
    let mut roles: Vec<RoleInfo> = BUILT_IN_ROLES
        .iter()
        .map(|(name, permissions)| RoleInfo {
            name: (*name).to_owned(),
            built_in: true,
            permissions: names(permissions),
        })
        .collect();
    for (name, role) in api.list::<RoleDefinition>(&auth::roles_prefix()).await? {
        roles.push(RoleInfo {
            name,
            built_in: false,
            permissions: role.permissions,
        });
    }
    ok(StatusCode::OK, RoleList { roles })
}

async fn put_role(State(api): State<Api>, Path(role): Path<String>, body: Bytes) -> ApiResult {
    let role = RoleName::new(&role).map_err(|e| ApiError::name("role", e))?;
    if built_in_role(role.as_str()).is_some() {
        return Err(conflict(format!(
            "{role} is a built-in role and cannot be changed"
        )));
    }
    let definition: RoleDefinition = parse_json(&body)?;
    if let Some(bad) = definition
        .permissions
        .iter()
        .find(|p| Permission::parse(p).is_none())
    {
        let valid: Vec<&str> = Permission::ALL.iter().map(|p| p.as_str()).collect();
        return Err(ApiError::invalid(
            "permissions",
            format!("permissions: unknown permission {bad:?}"),
        )
        .with("valid_permissions", json!(valid)));
    }
    let value = serde_json::to_value(&definition).unwrap_or(Value::Null);
    let key = auth::role(&role);
    // A role created under a name inherits no binding left under it (a
    // grant that raced the deletion of an earlier role of that name); an
    // update keeps the role's bindings.
    let mut attempts = 0;
    loop {
        attempts += 1;
        let txn = match api.store.get(&key).await.map_err(internal)? {
            Some(current) => Txn::new().when_equals(&key, current),
            None => {
                let mut txn = Txn::new().when_absent(&key);
                for (id, binding) in api.list::<Binding>(&auth::bindings_prefix()).await? {
                    if binding.role == role.as_str() {
                        tracing::warn!(%role, binding = %id, "created a role: removed a binding left under its name");
                        txn = txn.delete(format!("{}{id}", auth::bindings_prefix()));
                    }
                }
                txn
            }
        };
        let outcome = api
            .store
            .txn(txn.put(&key, value.clone()))
            .await
            .map_err(internal)?;
        if outcome.applied() {
            break;
        }
        if attempts >= CONCURRENT_ATTEMPTS {
            return Err(conflict(format!("role {role} changed concurrently: retry")));
        }
    }
    api.reload().await;
    ok(
        StatusCode::OK,
        RoleInfo {
            name: role.to_string(),
            built_in: false,
            permissions: definition.permissions,
        },
    )
}

async fn delete_role(State(api): State<Api>, Path(role): Path<String>) -> ApiResult {
    let role = RoleName::new(&role).map_err(|e| ApiError::name("role", e))?;
    if built_in_role(role.as_str()).is_some() {
        return Err(conflict(format!(
            "{role} is a built-in role and cannot be deleted"
        )));
    }
    let bound = api
        .list::<Binding>(&auth::bindings_prefix())
        .await?
        .into_iter()
        .filter(|(_, b)| b.role == role.as_str())
        .count();
    if bound > 0 {
        return Err(conflict(format!(
            "role {role} is used by {bound} binding(s): ungrant them first"
        )));
    }
    if !api
        .store
        .delete(&auth::role(&role))
        .await
        .map_err(internal)?
    {
        return Err(not_found(format!("no role {role}")));
    }
    api.reload().await;
    ok(StatusCode::OK, json!({"removed": role}))
}

async fn whoami(State(api): State<Api>, Extension(caller): Extension<Principal>) -> Json<WhoAmI> {
    let snapshot = api.auth.cache().snapshot();
    let bindings = snapshot
        .bindings_of(&caller.name)
        .map(|(id, binding)| BindingInfo {
            id: id.clone(),
            binding: binding.clone(),
        })
        .collect();
    Json(WhoAmI {
        name: caller.name,
        kind: caller.kind.to_owned(),
        bindings,
    })
}
