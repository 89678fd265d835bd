//! Principals and their bindings under concurrent changes, over real HTTP
//! on 127.0.0.1 (the admin router with the auth API, one process, a redb
//! store): a grant rewrites its principal (a new generation), so a revoke
//! that read the principal before the grant committed fails its
//! precondition and reads again; and a principal created under a name
//! inherits no binding left under it.

mod served;

use std::sync::Arc;

use broker_core::metadata::{MetadataStore, Txn};
use serde_json::{Value, json};
use served::{Reply, Served};
use tributary_api::auth::Binding;
use tributary_broker::admin::{AdminState, StaticClusterView, router};
use tributary_broker::auth::model::binding_id;
use tributary_proto::keys::{BindingId, PrincipalName, auth};

const BOOTSTRAP: &str = "auth-races-bootstrap-token";

/// The admin router (with the auth API) over one store.
struct Harness(Served);

impl std::ops::Deref for Harness {
    type Target = Served;
    fn deref(&self) -> &Served {
        &self.0
    }
}

impl Harness {
    fn start() -> Harness {
        Harness(Served::start(|store, _| {
            router(AdminState::with_bootstrap_token(
                store,
                Arc::new(StaticClusterView::single_leader("127.0.0.1:7401", 1)),
                BOOTSTRAP,
            ))
        }))
    }

    fn admin(&self, method: &str, path: &str, body: Option<Value>) -> Reply {
        let body = body.map(|b| b.to_string());
        self.request(method, path, Some(BOOTSTRAP), body.as_deref())
    }

    fn bindings_of(&self, principal: &str) -> Vec<Value> {
        let reply = self.admin(
            "GET",
            &format!("/v1/auth/bindings?principal={principal}"),
            None,
        );
        assert_eq!(reply.status, 200, "{}", reply.body);
        reply.body["bindings"].as_array().unwrap().clone()
    }
}

fn principal_key(name: &str) -> String {
    auth::principal(&PrincipalName::new(name).unwrap())
}

#[test]
fn a_grant_rewrites_its_principal_so_a_revoke_that_read_it_before_cannot_commit() {
    let h = Harness::start();
    let created = h.admin("POST", "/v1/auth/principals", Some(json!({"name": "ops"})));
    assert_eq!(created.status, 201, "{}", created.body);
    // What a revoke reads first.
    let read_by_revoke = h.get(&principal_key("ops")).unwrap();
    let granted = h.admin(
        "POST",
        "/v1/auth/bindings",
        Some(json!({"principal": "ops", "role": "admin"})),
    );
    assert_eq!(granted.status, 201, "{}", granted.body);
    let after_grant = h.get(&principal_key("ops")).unwrap();
    assert_ne!(
        after_grant, read_by_revoke,
        "the grant left the principal as it was"
    );
    assert_eq!(after_grant["generation"], 1);
    assert_eq!(after_grant["token_sha256"], read_by_revoke["token_sha256"]);
    // The revoke's transaction as read before the grant: refused, so the
    // grant's binding cannot be left behind.
    let stale_revoke = Txn::new()
        .when_equals(principal_key("ops"), read_by_revoke)
        .delete(principal_key("ops"));
    let outcome = h.runtime.block_on(h.store.txn(stale_revoke)).unwrap();
    assert!(!outcome.applied());
    // A grant is still idempotent, and the token still authenticates.
    let again = h.admin(
        "POST",
        "/v1/auth/bindings",
        Some(json!({"principal": "ops", "role": "admin"})),
    );
    assert_eq!(again.status, 201, "{}", again.body);
    assert_eq!(again.body["id"], granted.body["id"]);
    let token = created.body["token"].as_str().unwrap();
    let who = h.request("GET", "/v1/auth/whoami", Some(token), None);
    assert_eq!(who.status, 200, "{}", who.body);
    assert_eq!(who.body["bindings"].as_array().unwrap().len(), 1);
    // The revoke reads again and removes the principal with its binding.
    let revoked = h.admin("DELETE", "/v1/auth/principals/ops", None);
    assert_eq!(revoked.status, 200, "{}", revoked.body);
    assert_eq!(
        revoked.body["bindings_removed"],
        json!([granted.body["id"]])
    );
    assert!(h.bindings_of("ops").is_empty());
    assert_eq!(h.get(&principal_key("ops")), None);
}

#[test]
fn a_principal_created_under_a_name_inherits_no_binding_left_under_it() {
    let h = Harness::start();
    // A binding left behind (by a revoke that raced a grant before the
    // fix, or written around the API).
    let left = Binding {
        principal: "ghost".to_owned(),
        role: "admin".to_owned(),
        namespace: None,
        topic_prefix: None,
    };
    let key = auth::binding(&BindingId::new(&binding_id(&left)).unwrap());
    h.runtime
        .block_on(h.store.put(&key, serde_json::to_value(&left).unwrap()))
        .unwrap();
    let created = h.admin(
        "POST",
        "/v1/auth/principals",
        Some(json!({"name": "ghost"})),
    );
    assert_eq!(created.status, 201, "{}", created.body);
    assert_eq!(h.get(&key), None, "the left binding is still stored");
    assert!(h.bindings_of("ghost").is_empty());
    let token = created.body["token"].as_str().unwrap();
    let who = h.request("GET", "/v1/auth/whoami", Some(token), None);
    assert_eq!(who.status, 200, "{}", who.body);
    assert_eq!(who.body["bindings"], json!([]));
    // It holds no admin permission.
    let refused = h.request(
        "POST",
        "/v1/namespaces",
        Some(token),
        Some(&json!({"name": "agents"}).to_string()),
    );
    assert_eq!(refused.status, 403, "{}", refused.body);
    // Created with a role, it gets exactly that binding.
    let created = h.admin(
        "POST",
        "/v1/auth/principals",
        Some(json!({"name": "ghost2", "role": "admin"})),
    );
    assert_eq!(created.status, 201, "{}", created.body);
    assert_eq!(h.bindings_of("ghost2").len(), 1);
}

#[test]
fn a_role_created_under_a_name_inherits_no_binding_left_under_it() {
    let h = Harness::start();
    let created = h.admin("POST", "/v1/auth/principals", Some(json!({"name": "ops"})));
    assert_eq!(created.status, 201, "{}", created.body);
    // A binding to role `auditor` left behind after the role was deleted
    // (a grant that raced the deletion).
    let left = Binding {
        principal: "ops".to_owned(),
        role: "auditor".to_owned(),
        namespace: None,
        topic_prefix: None,
    };
    let key = auth::binding(&BindingId::new(&binding_id(&left)).unwrap());
    h.runtime
        .block_on(h.store.put(&key, serde_json::to_value(&left).unwrap()))
        .unwrap();
    let role = json!({"permissions": ["auth_manage"]});
    let put = h.admin("PUT", "/v1/auth/roles/auditor", Some(role.clone()));
    assert_eq!(put.status, 200, "{}", put.body);
    assert_eq!(h.get(&key), None, "the new role inherited the left binding");
    assert!(h.bindings_of("ops").is_empty());
    // Granted afterwards, it holds; updating the role keeps it.
    let granted = h.admin(
        "POST",
        "/v1/auth/bindings",
        Some(json!({"principal": "ops", "role": "auditor"})),
    );
    assert_eq!(granted.status, 201, "{}", granted.body);
    let put = h.admin("PUT", "/v1/auth/roles/auditor", Some(role));
    assert_eq!(put.status, 200, "{}", put.body);
    assert_eq!(h.bindings_of("ops").len(), 1);
}
