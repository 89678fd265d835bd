//! The auth layer over real HTTP on 127.0.0.1 (admin, storage, consumer and
//! auth routers in one process over a redb store and real topic WALs):
//! every route of the permission table answers 401 without credentials,
//! 403 naming the permission (and changes nothing) for a principal lacking
//! it, and runs for one holding it; namespace scopes; roles; revocation;
//! the audit topic; and every route the routers declare has a table entry.

mod served;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use broker_core::catalog::{Catalog, TopicSpec};
use broker_core::clock::SystemClock;
use broker_core::metadata::MetadataStore;
use serde_json::{Value, json};
use served::{Reply, Served};
use tributary_broker::admin::{AdminState, StaticClusterView, router};
use tributary_broker::auth::audit::{AuditRecord, AuditSink, audit_topic};
use tributary_broker::auth::table::{RULES, lookup};
use tributary_broker::consumer::{ConsumerConfig, ConsumerService};
use tributary_broker::replication::topics::TopicStore;
use tributary_broker::storage::with_local_segments;
use tributary_proto::Limits;

const BOOTSTRAP: &str = "auth-test-bootstrap-token";

/// The admin, consumer and auth routers over one store, with the audit
/// topic, behind [`pretend_client_certificate`].
struct Harness(Served);

impl std::ops::Deref for Harness {
    type Target = Served;
    fn deref(&self) -> &Served {
        &self.0
    }
}

impl Harness {
    fn start() -> Harness {
        Harness(Served::start(|store, dir| {
            let topics = Arc::new(TopicStore::new(
                dir.join("topics"),
                store.clone(),
                Limits::default(),
            ));
            let store_dyn: Arc<dyn MetadataStore> = store;
            let state = AdminState::with_bootstrap_token(
                store_dyn.clone(),
                Arc::new(StaticClusterView::single_leader("127.0.0.1:7401", 1)),
                BOOTSTRAP,
            );
            let (sink, _task) =
                AuditSink::spawn(store_dyn.clone(), topics.clone(), audit_topic(1).unwrap());
            state.auth.set_audit(sink);
            let service = ConsumerService::new(
                topics.clone(),
                store_dyn.clone(),
                ConsumerConfig::default(),
                "127.0.0.1:7400".to_owned(),
                1,
                Arc::new(SystemClock),
            );
            with_local_segments(
                router(state.clone()).merge(tributary_broker::consumer::http::router(
                    service,
                    state.auth.clone(),
                )),
                topics,
            )
            .layer(axum::middleware::from_fn(pretend_client_certificate))
        }))
    }

    fn admin(&self, method: &str, path: &str, body: Value) -> Reply {
        let body = (!body.is_null()).then(|| body.to_string());
        self.request(method, path, Some(BOOTSTRAP), body.as_deref())
    }

    /// Creates token principal `name` and returns its token.
    fn principal(&self, name: &str) -> String {
        let reply = self.admin(
            "POST",
            "/v1/auth/principals",
            json!({"name": name, "kind": "token"}),
        );
        assert_eq!(reply.status, 201, "{}", reply.body);
        reply.body["token"].as_str().unwrap().to_owned()
    }

    fn grant(&self, principal: &str, role: &str, namespace: Option<&str>) -> String {
        let mut body = json!({"principal": principal, "role": role});
        if let Some(ns) = namespace {
            body["namespace"] = json!(ns);
        }
        let reply = self.admin("POST", "/v1/auth/bindings", body);
        assert_eq!(reply.status, 201, "{}", reply.body);
        reply.body["id"].as_str().unwrap().to_owned()
    }

    fn create_topic(&self, name: &str, intent: &str) {
        let spec = TopicSpec::parse(name, intent, 0).unwrap();
        self.runtime
            .block_on(Catalog::new(self.store.as_ref()).create_topic(&spec))
            .unwrap();
    }

    /// Every metadata key and value except the audit topic's own keys.
    fn metadata(&self) -> BTreeMap<String, Value> {
        self.runtime
            .block_on(self.store.list("/"))
            .unwrap()
            .into_iter()
            .filter(|(key, _)| !key.contains("/_system/"))
            .collect()
    }

    /// The audit records once exactly `expected` are stored (polled with a
    /// deadline), in offset order.
    fn audit_records(&self, expected: usize) -> Vec<AuditRecord> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let reply = self.admin(
                "GET",
                "/v1/topics/_system/audit-broker-1/records?max_messages=1000",
                Value::Null,
            );
            // 404 until the background task has created the topic.
            let messages = match reply.status {
                200 => reply.body["messages"].as_array().unwrap().clone(),
                404 => Vec::new(),
                _ => panic!("{} {}", reply.status, reply.body),
            };
            if messages.len() >= expected || Instant::now() > deadline {
                return messages
                    .iter()
                    .map(|m| {
                        let record: AuditRecord =
                            serde_json::from_str(m["value"].as_str().unwrap()).unwrap();
                        assert_eq!(m["key"].as_str(), Some(record.principal.as_str()));
                        record
                    })
                    .collect();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Stands in for the HTTPS listener: a request with `x-test-peer: NAME`
/// arrives as if over a connection whose client certificate has identity
/// NAME (and `notBefore` from `x-test-not-before: SECONDS`, if given).
async fn pretend_client_certificate(
    mut request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let identity = request
        .headers()
        .get("x-test-peer")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let not_before_s = request
        .headers()
        .get("x-test-not-before")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    if let Some(identity) = identity {
        request
            .extensions_mut()
            .insert(tributary_broker::auth::PeerCertificate {
                identity,
                not_before_s,
            });
    }
    next.run(request).await
}

/// `GET path` as if over a connection whose client certificate has
/// identity `peer` (and `notBefore` `not_before_s`): status and JSON body.
fn get_as_peer(h: &Harness, peer: &str, not_before_s: Option<i64>, path: &str) -> (u16, Value) {
    let mut request = ureq::http::Request::builder()
        .method("GET")
        .uri(format!("{}{path}", h.base))
        .header("x-test-peer", peer);
    if let Some(s) = not_before_s {
        request = request.header("x-test-not-before", s.to_string());
    }
    let response = h.raw.run(request.body(()).unwrap()).unwrap();
    let status = response.status().as_u16();
    let body: Value =
        serde_json::from_str(&response.into_body().read_to_string().unwrap()).unwrap();
    (status, body)
}

/// A concrete path for a route template, in namespace `a`, topic `t`.
fn concrete(template: &str) -> String {
    template
        .replace("{namespace}", "a")
        .replace("{topic}", "t")
        .replace("{subscription}", "s")
        .replace("{start}", "0")
        .replace("{name}", "someone")
        .replace("{id}", "0123456789abcdef0123456789abcdef")
        .replace("{role}", "custom-role")
        .replace("{edge}", "plant1")
}

/// A plausible body for a route (scope fields name namespace `a`).
fn body_for(method: &str, template: &str) -> Option<String> {
    if method == "GET" || method == "DELETE" {
        return None;
    }
    let body = match template {
        "/v1/namespaces" => json!({"name": "a"}),
        "/v1/topics" => json!({"name": "/a/new-topic", "intent": "task_queue"}),
        "/v1/storage/descriptors" => json!({"topic": "/a/t"}),
        "/v1/apply" => return Some("namespaces: [a]".to_owned()),
        _ => json!({}),
    };
    Some(body.to_string())
}

#[test]
fn every_route_is_401_without_credentials_403_without_the_permission_and_runs_with_it() {
    let h = Harness::start();
    h.create_topic("/a/t", "task_queue");
    let nobody = h.principal("nobody");
    let mut holders: BTreeMap<&str, String> = BTreeMap::new();
    for rule in RULES {
        let path = concrete(rule.path);
        let body = body_for(rule.method, rule.path);
        let what = format!("{} {}", rule.method, rule.path);

        let before = h.metadata();
        let missing = h.request(rule.method, &path, None, body.as_deref());
        assert_eq!(missing.status, 401, "{what}: {}", missing.body);
        assert_eq!(missing.body["kind"], "unauthorized", "{what}");
        let forged = format!("trib.nobody.{}", "0".repeat(64));
        let wrong = h.request(rule.method, &path, Some(&forged), body.as_deref());
        assert_eq!(wrong.status, 401, "{what}: {}", wrong.body);

        let Some(permission) = rule.permission else {
            let reply = h.request(rule.method, &path, Some(&nobody), body.as_deref());
            assert_eq!(reply.status, 200, "{what}: {}", reply.body);
            continue;
        };
        let refused = h.request(rule.method, &path, Some(&nobody), body.as_deref());
        assert_eq!(refused.status, 403, "{what}: {}", refused.body);
        assert_eq!(refused.body["kind"], "forbidden", "{what}");
        assert_eq!(refused.body["permission"], permission.as_str(), "{what}");
        assert!(
            refused.body["error"].as_str().unwrap().contains(&format!(
                "principal nobody lacks permission {}",
                permission.as_str()
            )),
            "{what}: {}",
            refused.body
        );
        assert_eq!(
            h.metadata(),
            before,
            "{what}: a refused request changed metadata"
        );

        // A principal holding exactly this permission, cluster-wide.
        let token = holders
            .entry(permission.as_str())
            .or_insert_with(|| {
                let name = permission.as_str().replace('_', "-");
                let reply = h.admin(
                    "PUT",
                    &format!("/v1/auth/roles/only-{name}"),
                    json!({"permissions": [permission.as_str()]}),
                );
                assert_eq!(reply.status, 200, "{}", reply.body);
                let token = h.principal(&format!("holder-{name}"));
                h.grant(&format!("holder-{name}"), &format!("only-{name}"), None);
                token
            })
            .clone();
        let allowed = h.request(rule.method, &path, Some(&token), body.as_deref());
        assert!(
            allowed.status != 401 && allowed.status != 403,
            "{what}: holder of {permission} refused: {} {}",
            allowed.status,
            allowed.body
        );
    }
}

#[test]
fn a_consumer_of_namespace_a_reads_a_but_not_b_and_tier_cannot_create_topics() {
    let h = Harness::start();
    h.create_topic("/a/jobs", "task_queue");
    h.create_topic("/b/jobs", "task_queue");
    let publish = json!({"records": [{"value": "one"}, {"value": "two"}]});
    for ns in ["a", "b"] {
        let reply = h.admin(
            "POST",
            &format!("/v1/topics/{ns}/jobs/records"),
            publish.clone(),
        );
        assert_eq!(reply.status, 200, "{}", reply.body);
    }
    let consumer = h.principal("reader-a");
    h.grant("reader-a", "consumer", Some("a"));
    let peek = |ns: &str| {
        h.request(
            "GET",
            &format!("/v1/topics/{ns}/jobs/records?max_messages=10"),
            Some(&consumer),
            None,
        )
    };
    let a = peek("a");
    assert_eq!(a.status, 200, "{}", a.body);
    let values: Vec<&str> = a.body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["value"].as_str().unwrap())
        .collect();
    assert_eq!(values, ["one", "two"]);
    let b = peek("b");
    assert_eq!(b.status, 403, "{}", b.body);
    assert_eq!(
        b.body,
        json!({
            "kind": "forbidden",
            "error": "principal reader-a lacks permission consume on topic /b/jobs",
            "permission": "consume",
            "namespace": "b",
        })
    );
    // Listing topics of a is allowed; a cluster-wide list is not.
    let list_a = h.request("GET", "/v1/topics?namespace=a", Some(&consumer), None);
    assert_eq!(list_a.status, 200, "{}", list_a.body);
    let list_all = h.request("GET", "/v1/topics", Some(&consumer), None);
    assert_eq!(list_all.status, 403, "{}", list_all.body);
    // A consumer may not publish.
    let produce = h.request(
        "POST",
        "/v1/topics/a/jobs/records",
        Some(&consumer),
        Some(&publish.to_string()),
    );
    assert_eq!(produce.status, 403);
    assert_eq!(produce.body["permission"], "produce");

    // tier: storage yes, topic creation no (and the topic does not appear).
    let tier = h.principal("tier-1");
    h.grant("tier-1", "tier", None);
    let storage = h.request("GET", "/v1/storage/topics", Some(&tier), None);
    assert_eq!(storage.status, 200, "{}", storage.body);
    let create = h.request(
        "POST",
        "/v1/topics",
        Some(&tier),
        Some(&json!({"name": "/a/sneaky", "intent": "task_queue"}).to_string()),
    );
    assert_eq!(create.status, 403, "{}", create.body);
    assert_eq!(create.body["permission"], "topics_write");
    assert_eq!(create.body["namespace"], "a");
    let described = h.admin("GET", "/v1/topics/a/sneaky", Value::Null);
    assert_eq!(described.status, 404, "{}", described.body);

    // A namespace-scoped writer creates topics in its namespace only.
    let writer = h.principal("writer-a");
    let reply = h.admin(
        "PUT",
        "/v1/auth/roles/topic-writer",
        json!({"permissions": ["topics_write"]}),
    );
    assert_eq!(reply.status, 200, "{}", reply.body);
    h.grant("writer-a", "topic-writer", Some("a"));
    let ok = h.request(
        "POST",
        "/v1/topics",
        Some(&writer),
        Some(&json!({"name": "/a/orders", "intent": "task_queue"}).to_string()),
    );
    assert_eq!(ok.status, 201, "{}", ok.body);
    let other = h.request(
        "POST",
        "/v1/topics",
        Some(&writer),
        Some(&json!({"name": "/b/orders", "intent": "task_queue"}).to_string()),
    );
    assert_eq!(other.status, 403, "{}", other.body);
    assert_eq!(
        h.admin("GET", "/v1/topics/b/orders", Value::Null).status,
        404
    );
}

#[test]
fn revocation_grants_and_roles_are_managed_through_the_auth_api() {
    let h = Harness::start();
    let token = h.principal("ops");
    assert!(token.starts_with("trib.ops.") && token.len() == "trib.ops.".len() + 64);
    // Stored hashed, never in plain text.
    let stored = h.metadata()["/auth/principals/ops"].clone();
    assert!(!stored.to_string().contains(&token[9..]), "{stored}");
    assert_eq!(stored["kind"], "token");
    assert_eq!(stored["created_by"], "bootstrap-admin");
    assert_eq!(stored["token_sha256"].as_str().unwrap().len(), 64);

    let id = h.grant("ops", "admin", None);
    assert_eq!(h.grant("ops", "admin", None), id, "a grant is idempotent");
    let who = h.request("GET", "/v1/auth/whoami", Some(&token), None);
    assert_eq!(who.status, 200);
    assert_eq!(who.body["name"], "ops");
    assert_eq!(who.body["kind"], "token");
    assert_eq!(who.body["bindings"].as_array().unwrap().len(), 1);
    // The named admin manages auth itself.
    let created = h.request(
        "POST",
        "/v1/auth/principals",
        Some(&token),
        Some(&json!({"name": "edge-gw", "kind": "certificate"}).to_string()),
    );
    assert_eq!(created.status, 201, "{}", created.body);
    assert!(created.body.get("token").is_none());
    assert_eq!(created.body["principal"]["created_by"], "ops");
    // Duplicates, built-in roles, unknown permissions and roles are refused.
    assert_eq!(
        h.admin("POST", "/v1/auth/principals", json!({"name": "ops"}))
            .status,
        409
    );
    assert_eq!(
        h.admin(
            "POST",
            "/v1/auth/principals",
            json!({"name": "bootstrap-admin"})
        )
        .status,
        409
    );
    assert_eq!(
        h.admin("PUT", "/v1/auth/roles/admin", json!({"permissions": []}))
            .status,
        409
    );
    let bad = h.admin(
        "PUT",
        "/v1/auth/roles/x",
        json!({"permissions": ["everything"]}),
    );
    assert_eq!(bad.status, 400);
    assert_eq!(bad.body["field"], "permissions");
    let no_role = h.admin(
        "POST",
        "/v1/auth/bindings",
        json!({"principal": "ops", "role": "nope"}),
    );
    assert_eq!(no_role.status, 404);
    // A method a route does not have is 405 naming the allowed ones.
    let patch = h.admin("PATCH", "/v1/topics", json!({}));
    assert_eq!(patch.status, 405, "{}", patch.body);
    assert_eq!(patch.body["kind"], "method_not_allowed");
    assert_eq!(
        patch.body["error"],
        "PATCH is not allowed on /v1/topics; allowed: GET, POST"
    );
    // A query string on a route that takes none is refused and nothing is
    // done: `?dry_run=true` on a delete deleted the topic.
    let created = h.admin(
        "POST",
        "/v1/topics",
        json!({"name": "/shop/q", "intent": "event_stream"}),
    );
    assert_eq!(created.status, 201, "{}", created.body);
    let dry = h.admin("DELETE", "/v1/topics/shop/q?dry_run=true&x", Value::Null);
    assert_eq!(dry.status, 400, "{}", dry.body);
    assert_eq!(dry.body["kind"], "invalid_input");
    assert_eq!(dry.body["field"], "query");
    assert_eq!(
        dry.body["error"],
        "DELETE /v1/topics/{namespace}/{topic} takes no query parameters (got dry_run, x); nothing was done"
    );
    assert_eq!(h.admin("GET", "/v1/topics/shop/q", Value::Null).status, 200);
    // Routes that take parameters still refuse unknown ones themselves,
    // and an empty query string is no parameter.
    let unknown = h.admin("GET", "/v1/auth/bindings?principle=ops", Value::Null);
    assert_eq!(unknown.status, 400, "{}", unknown.body);
    assert_eq!(
        h.admin("GET", "/v1/auth/bindings?principal=ops", Value::Null)
            .status,
        200
    );
    assert_eq!(
        h.admin("DELETE", "/v1/topics/shop/q?", Value::Null).status,
        200
    );
    // A principal created with its role: both in one transaction, or
    // neither.
    let refused = h.admin(
        "POST",
        "/v1/auth/principals",
        json!({"name": "x1", "role": "nope"}),
    );
    assert_eq!(refused.status, 404, "{}", refused.body);
    let unscoped = h.admin(
        "POST",
        "/v1/auth/principals",
        json!({"name": "x1", "namespace": "shop"}),
    );
    assert_eq!(unscoped.status, 400, "{}", unscoped.body);
    assert_eq!(unscoped.body["field"], "role");
    assert!(!h.metadata().contains_key("/auth/principals/x1"));
    let with_role = h.admin(
        "POST",
        "/v1/auth/principals",
        json!({"name": "x1", "role": "consumer", "namespace": "shop"}),
    );
    assert_eq!(with_role.status, 201, "{}", with_role.body);
    let binding_id = with_role.body["binding"]["id"].as_str().unwrap().to_owned();
    assert_eq!(
        h.metadata()[&format!("/auth/bindings/{binding_id}")]["role"],
        "consumer"
    );
    assert_eq!(
        h.admin("DELETE", "/v1/auth/principals/x1", Value::Null)
            .body["bindings_removed"],
        json!([binding_id])
    );
    let roles = h.admin("GET", "/v1/auth/roles", Value::Null);
    let names: Vec<&str> = roles.body["roles"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["admin", "tier", "consumer", "producer"]);

    // Revoke: the principal and all its bindings go in one transaction.
    let revoked = h.admin("DELETE", "/v1/auth/principals/ops", Value::Null);
    assert_eq!(revoked.status, 200, "{}", revoked.body);
    assert_eq!(revoked.body["bindings_removed"], json!([id]));
    assert!(
        !h.metadata()
            .keys()
            .any(|k| k.starts_with("/auth/bindings/"))
    );
    let after = h.request("GET", "/v1/auth/whoami", Some(&token), None);
    assert_eq!(after.status, 401, "{}", after.body);
    // Re-creating the name gives a new token; the old one stays dead.
    let fresh = h.principal("ops");
    assert_ne!(fresh, token);
    assert_eq!(
        h.request("GET", "/v1/auth/whoami", Some(&token), None)
            .status,
        401
    );
    assert_eq!(
        h.request("GET", "/v1/auth/whoami", Some(&fresh), None)
            .status,
        200
    );
}

#[test]
fn the_audit_topic_holds_one_record_per_admin_action_with_the_principal() {
    let h = Harness::start();
    // 1: create a principal (bootstrap-admin), 2: grant it.
    let token = h.principal("auditor");
    h.grant("auditor", "consumer", Some("a"));
    // Not audited: reads.
    assert_eq!(
        h.request("GET", "/v1/auth/whoami", Some(&token), None)
            .status,
        200
    );
    assert_eq!(h.admin("GET", "/v1/namespaces", Value::Null).status, 200);
    // 3: refused (403) topic creation by auditor.
    let refused = h.request(
        "POST",
        "/v1/topics",
        Some(&token),
        Some(&json!({"name": "/a/x", "intent": "task_queue"}).to_string()),
    );
    assert_eq!(refused.status, 403);
    // 4: refused (401) with a forged token naming "mallory".
    let forged = format!("trib.mallory.{}", "a".repeat(64));
    assert_eq!(
        h.request(
            "POST",
            "/v1/namespaces",
            Some(&forged),
            Some(r#"{"name":"z"}"#)
        )
        .status,
        401
    );
    // 5: a namespace created by the bootstrap admin.
    assert_eq!(
        h.admin("POST", "/v1/namespaces", json!({"name": "a"}))
            .status,
        201
    );
    let records = h.audit_records(5);
    // Nothing else arrives.
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(h.audit_records(5).len(), 5);
    let summary: Vec<(&str, &str, &str, u16, &str)> = records
        .iter()
        .map(|r| {
            (
                r.principal.as_str(),
                r.action.as_str(),
                r.route.as_str(),
                r.status,
                r.outcome.as_str(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            (
                "bootstrap-admin",
                "POST /v1/auth/principals",
                "/v1/auth/principals",
                201,
                "ok"
            ),
            (
                "bootstrap-admin",
                "POST /v1/auth/bindings",
                "/v1/auth/bindings",
                201,
                "ok"
            ),
            ("auditor", "POST /v1/topics", "/v1/topics", 403, "refused"),
            (
                "mallory",
                "POST /v1/namespaces",
                "/v1/namespaces",
                401,
                "refused"
            ),
            (
                "bootstrap-admin",
                "POST /v1/namespaces",
                "/v1/namespaces",
                201,
                "ok"
            ),
        ]
    );
    assert_eq!(records[2].namespace.as_deref(), Some("a"));
    assert_eq!(records[2].topic.as_deref(), Some("x"));
    assert_eq!(records[2].kind.as_deref(), Some("forbidden"));
    assert_eq!(records[3].kind.as_deref(), Some("unauthorized"));
    assert_eq!(records[4].namespace.as_deref(), Some("a"));
    // What an auth action acted on is named.
    assert_eq!(
        records[0].target.as_deref(),
        Some("principal auditor (token)")
    );
    let binding = records[1].target.as_deref().unwrap_or_default();
    assert!(
        binding.starts_with("binding ")
            && binding.ends_with(": auditor role consumer on namespace a"),
        "{binding}"
    );
    assert_eq!(records[2].target, None);
    // Never a token.
    let all = serde_json::to_string(&records).unwrap();
    assert!(!all.contains(&token[13..]) && !all.contains(BOOTSTRAP));
}

/// Every `.route(...)` of the four routers, with its methods, read from
/// their source: a new route without a table entry fails here.
#[test]
fn every_route_the_routers_declare_has_a_table_entry() {
    let sources = [
        ("/v1", include_str!("../src/admin/mod.rs")),
        ("/v1", include_str!("../src/storage/http.rs")),
        ("", include_str!("../src/consumer/http.rs")),
        ("", include_str!("../src/auth/http.rs")),
        ("", include_str!("../src/enroll/http.rs")),
    ];
    let sub = "/v1/topics/{namespace}/{topic}/subscriptions/{subscription}";
    let mut seen = 0;
    for (prefix, source) in sources {
        let mut rest = source;
        while let Some(at) = rest.find(".route(") {
            let call = &rest[at + ".route(".len()..];
            // The call's extent: up to the matching parenthesis.
            let mut depth = 1;
            let mut end = 0;
            for (i, ch) in call.char_indices() {
                match ch {
                    '(' => depth += 1,
                    ')' => depth -= 1,
                    _ => {}
                }
                if depth == 0 {
                    end = i;
                    break;
                }
            }
            let call = &call[..end];
            rest = &rest[at + 7 + end..];
            let literal = call.split('"').nth(1).unwrap_or_default();
            let path = if call.trim_start().starts_with("sub,") {
                sub.to_owned()
            } else if call.trim_start().starts_with("&format!(") {
                literal.replace("{sub}", sub)
            } else if literal.starts_with("/v1/") || literal == "/health" {
                literal.to_owned()
            } else {
                format!("{prefix}{literal}")
            };
            if path == "/health" {
                continue;
            }
            let methods: Vec<&str> = ["get", "post", "put", "patch", "delete"]
                .into_iter()
                .filter(|m| {
                    call.match_indices(&format!("{m}("))
                        .any(|(i, _)| i == 0 || !call.as_bytes()[i - 1].is_ascii_alphanumeric())
                })
                .collect();
            assert!(!methods.is_empty(), "no method in .route({call})");
            for method in methods {
                let method = method.to_ascii_uppercase();
                assert!(
                    lookup(&method, &path).is_some(),
                    "{method} {path} has no entry in the permission table"
                );
                seen += 1;
            }
        }
    }
    assert_eq!(
        seen,
        RULES.len(),
        "the table lists a route no router declares"
    );
}

#[test]
fn a_client_certificate_authenticates_only_as_a_certificate_principal() {
    let h = Harness::start();
    let as_peer = |peer: &str, path: &str| get_as_peer(&h, peer, None, path);
    // Unknown identity: 401.
    assert_eq!(as_peer("tier-7", "/v1/auth/whoami").0, 401);
    // A token principal of that name does not make the certificate valid.
    h.principal("tier-7");
    assert_eq!(as_peer("tier-7", "/v1/auth/whoami").0, 401);
    let reply = h.admin(
        "POST",
        "/v1/auth/principals",
        json!({"name": "tier-8", "kind": "certificate"}),
    );
    assert_eq!(reply.status, 201, "{}", reply.body);
    assert!(reply.body.get("token").is_none());
    let (status, who) = as_peer("tier-8", "/v1/auth/whoami");
    assert_eq!(status, 200, "{who}");
    assert_eq!(who["name"], "tier-8");
    assert_eq!(who["kind"], "certificate");
    // Authenticated but without a binding: 403; with tier: storage works.
    assert_eq!(as_peer("tier-8", "/v1/storage/topics").0, 403);
    h.grant("tier-8", "tier", None);
    assert_eq!(as_peer("tier-8", "/v1/storage/topics").0, 200);
    assert_eq!(as_peer("tier-8", "/v1/auth/principals").0, 403);
}

/// A security trial (F5): an admin made a certificate principal named
/// like an edge; after `POST /v1/edges/{edge}/revoke` that edge's
/// certificates kept working on the admin API while ingest refused them.
/// Now the API refuses the certificates the revocation covers (issued
/// before it) and takes one issued after it.
#[test]
fn a_revoked_edge_certificate_no_longer_authenticates_as_a_certificate_principal() {
    let h = Harness::start();
    let as_peer =
        |not_before_s: i64| get_as_peer(&h, "plant9", Some(not_before_s), "/v1/auth/whoami");
    let now_s = i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs(),
    )
    .unwrap();
    let issued_before = now_s - 3600;
    let reply = h.admin(
        "POST",
        "/v1/auth/principals",
        json!({"name": "plant9", "kind": "certificate"}),
    );
    assert_eq!(reply.status, 201, "{}", reply.body);
    let (status, who) = as_peer(issued_before);
    assert_eq!(status, 200, "{who}");
    assert_eq!(who["name"], "plant9");

    let reply = h.admin("POST", "/v1/edges/plant9/revoke", json!({}));
    assert_eq!(reply.status, 200, "{}", reply.body);
    let (status, body) = as_peer(issued_before);
    assert_eq!(status, 401, "{body}");
    assert_eq!(body["kind"], "unauthorized");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("client certificate revoked"),
        "{body}"
    );
    // A certificate issued after the revocation (a re-enrolled device).
    let (status, who) = as_peer(now_s + 5);
    assert_eq!(status, 200, "{who}");
}

/// Archiving the audit topic is not itself audited: otherwise every
/// archived audit segment would append a record, which seals into the next
/// segment, forever. The same call on another topic is audited.
#[test]
fn storage_calls_on_the_audit_topic_are_not_audited_but_on_other_topics_are() {
    let h = Harness::start();
    assert_eq!(
        h.admin(
            "POST",
            "/v1/topics",
            json!({"name": "/a/x", "intent": "event_stream"})
        )
        .status,
        201
    );
    // Wait for the audit topic (created in the background) and record 1.
    assert_eq!(h.audit_records(1).len(), 1);
    let own = h.admin(
        "POST",
        "/v1/storage/topics/_system/audit-broker-1/unload",
        Value::Null,
    );
    assert!(own.status < 300, "{} {}", own.status, own.body);
    let other = h.admin("POST", "/v1/storage/topics/a/x/unload", Value::Null);
    assert!(other.status < 300, "{} {}", other.status, other.body);
    let records = h.audit_records(2);
    std::thread::sleep(Duration::from_millis(200));
    let records_after = h.audit_records(3);
    assert_eq!(records_after.len(), 2, "{records_after:?}");
    assert_eq!(records[1].action, "POST /v1/storage/topics/a/x/unload");
    assert_eq!(records[1].topic.as_deref(), Some("x"));
}

#[test]
fn a_json_body_with_data_after_its_object_is_refused_and_changes_nothing() {
    let h = Harness::start();
    for (path, body) in [
        ("/v1/auth/principals", r#"{"name":"tg1"}garbage"#),
        ("/v1/auth/principals", r#"{"name":"tg1"} {"x":1}"#),
        (
            "/v1/topics",
            r#"{"name":"/default/t2","intent":"task_queue"} {"x":1}"#,
        ),
    ] {
        let reply = h.request("POST", path, Some(BOOTSTRAP), Some(body));
        assert_eq!(reply.status, 400, "{body}: {}", reply.body);
        assert_eq!(reply.body["kind"], "invalid_input", "{}", reply.body);
        let error = reply.body["error"].as_str().unwrap();
        assert!(error.starts_with("request body: data after"), "{error}");
    }
    let keys = h.metadata();
    assert!(!keys.contains_key("/auth/principals/tg1"), "{keys:?}");
    assert!(!keys.keys().any(|k| k.contains("/default/t2")), "{keys:?}");
    // Trailing whitespace is fine.
    let reply = h.request(
        "POST",
        "/v1/auth/principals",
        Some(BOOTSTRAP),
        Some("{\"name\":\"tg1\"} \n"),
    );
    assert_eq!(reply.status, 201, "{}", reply.body);
}

/// The audit trail cannot be forged or removed through the public API:
/// publishing to a broker's audit topic, creating a topic in a system
/// namespace and deleting the audit topic are `403 reserved_namespace`
/// (each refusal audited, nothing appended); reading it stays open.
#[test]
fn the_system_namespace_takes_no_client_writes() {
    let h = Harness::start();
    assert_eq!(
        h.admin("POST", "/v1/namespaces", json!({"name": "a"}))
            .status,
        201
    );
    assert_eq!(h.audit_records(1).len(), 1);
    let forged = json!({"records": [{"value": "{\"principal\":\"someone-else\"}"}]});
    for (method, path, body) in [
        ("POST", "/v1/topics/_system/audit-broker-1/records", forged),
        (
            "POST",
            "/v1/topics",
            json!({"name": "/_system/x", "intent": "task_queue"}),
        ),
        ("DELETE", "/v1/topics/_system/audit-broker-1", Value::Null),
        (
            "POST",
            "/v1/topics",
            json!({"name": "/_other/x", "intent": "task_queue"}),
        ),
        // Was 201 (the bad-input trial): the namespace then listed, every
        // topic in it refused.
        ("POST", "/v1/namespaces", json!({"name": "_newns"})),
    ] {
        let reply = h.admin(method, path, body);
        assert_eq!(reply.status, 403, "{method} {path}: {}", reply.body);
        assert_eq!(reply.body["kind"], "reserved_namespace", "{}", reply.body);
    }
    // Every stored record is the brokers' own (a forged one would not
    // parse as an audit record): the namespace and the four refused
    // admin calls (a publish is data plane, not audited).
    let records = h.audit_records(5);
    assert_eq!(records.len(), 5);
    assert_eq!(
        records[1..].iter().map(|r| r.status).collect::<Vec<_>>(),
        [403, 403, 403, 403]
    );
    assert!(records.iter().all(|r| r.principal == "bootstrap-admin"));
    assert_eq!(
        h.admin("GET", "/v1/topics/_system/audit-broker-1", Value::Null)
            .status,
        200
    );
}
