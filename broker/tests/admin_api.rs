//! The admin HTTP API over a real socket: the router served on
//! 127.0.0.1:0 with a redb metadata store and a fixed cluster view, driven
//! by a blocking HTTP client (ureq) from the test thread.

use std::collections::BTreeMap;
use std::sync::Arc;

use broker_core::catalog::Catalog;
use broker_core::metadata::MetadataStore;
use broker_core::metadata::redb::RedbStore;

use broker_core::clock::ManualClock;
use serde_json::{Value, json};
use tributary_broker::admin::{AdminState, StaticClusterView, serve};
use tributary_broker::raft::node::ClusterStatus;
use tributary_proto::keys::{SubscriptionName, TopicName};

const TOKEN: &str = "s3cret-admin-token";

fn cluster_status() -> ClusterStatus {
    ClusterStatus {
        node_id: 1,
        leader: Some(1),
        term: 3,
        members: BTreeMap::from([
            (1, "127.0.0.1:7500".to_owned()),
            (2, "127.0.0.1:7501".to_owned()),
        ]),
        last_applied_index: Some(42),
        snapshot_index: Some(40),
        purged_index: None,
        state: "Leader".to_owned(),
    }
}

struct Server {
    runtime: tokio::runtime::Runtime,
    store: Arc<RedbStore>,
    base: String,
    agent: ureq::Agent,
    _dir: tempfile::TempDir,
}

struct Reply {
    status: u16,
    body: Value,
    www_authenticate: Option<String>,
}

impl Server {
    fn start() -> Server {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(
            RedbStore::open(dir.path().join("meta.redb"), Arc::new(ManualClock::new(1))).unwrap(),
        );
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let state = AdminState {
            store: store.clone(),
            cluster: Arc::new(StaticClusterView(cluster_status())),
            auth: tributary_broker::auth::AuthState::new(store.clone(), Some(TOKEN.to_owned())),
        };
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        runtime.spawn(serve(listener, state, std::future::pending()));
        // No connection reuse: a refused request (401 before the body is
        // read) makes the server close its connection, and a pooled stale
        // connection would fail the next request at random.
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .max_idle_connections(0)
            .max_idle_connections_per_host(0)
            .build()
            .into();
        Server {
            runtime,
            store,
            base,
            agent,
            _dir: dir,
        }
    }

    fn request(&self, method: &str, path: &str, token: Option<&str>, body: Option<&str>) -> Reply {
        let mut builder = ureq::http::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base));
        if let Some(token) = token {
            builder = builder.header("Authorization", format!("Bearer {token}"));
        }
        let response = match body {
            Some(body) => self.agent.run(builder.body(body.to_owned()).unwrap()),
            None => self.agent.run(builder.body(()).unwrap()),
        }
        .unwrap();
        let status = response.status().as_u16();
        let www_authenticate = response
            .headers()
            .get("www-authenticate")
            .map(|v| v.to_str().unwrap().to_owned());
        let text = response.into_body().read_to_string().unwrap();
        let body = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
        Reply {
            status,
            body,
            www_authenticate,
        }
    }

    /// An authenticated call: (status, JSON body).
    fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let text = body.map(|b| b.to_string());
        let reply = self.request(method, path, Some(TOKEN), text.as_deref());
        (reply.status, reply.body)
    }

    fn call_text(&self, method: &str, path: &str, body: &str) -> (u16, Value) {
        let reply = self.request(method, path, Some(TOKEN), Some(body));
        (reply.status, reply.body)
    }

    async fn dump(store: &RedbStore) -> Vec<String> {
        store
            .list("/")
            .await
            .unwrap()
            .into_iter()
            .map(|(k, _)| k)
            .collect()
    }

    fn keys(&self) -> Vec<String> {
        self.runtime.block_on(Server::dump(&self.store))
    }
}

fn intent_names() -> Value {
    json!([
        "realtime",
        "telemetry_firehose",
        "firehose",
        "telemetry",
        "ephemeral",
        "event_stream",
        "agent_event_mesh",
        "event_mesh",
        "events",
        "lakehouse_feed",
        "lakehouse",
        "custom",
        "task_queue",
        "agent_task_queue",
        "tasks",
        "work_queue",
        "audit_log",
        "tool_invocation_log",
        "tool_log",
        "audit",
        "state_log"
    ])
}

fn valid_intents_text() -> &'static str {
    "realtime (aliases: telemetry_firehose, firehose, telemetry, ephemeral); \
     event_stream (aliases: agent_event_mesh, event_mesh, events, lakehouse_feed, lakehouse, \
     custom); task_queue (aliases: agent_task_queue, tasks, work_queue); \
     audit_log (aliases: tool_invocation_log, tool_log, audit, state_log)"
}

#[test]
fn health_needs_no_token() {
    let server = Server::start();
    let reply = server.request("GET", "/health", None, None);
    assert_eq!(reply.status, 200);
    assert_eq!(reply.body, json!({"status": "ok"}));
}

#[test]
fn every_v1_endpoint_requires_the_bearer_token() {
    let server = Server::start();
    let endpoints = [
        ("GET", "/v1/namespaces", None),
        ("POST", "/v1/namespaces", Some(r#"{"name":"agents"}"#)),
        ("GET", "/v1/topics", None),
        (
            "POST",
            "/v1/topics",
            Some(r#"{"name":"/default/x","intent":"task_queue"}"#),
        ),
        ("GET", "/v1/topics/default/x", None),
        ("DELETE", "/v1/topics/default/x", None),
        (
            "GET",
            "/v1/topics/default/x/subscriptions/s/failure-policy",
            None,
        ),
        (
            "PUT",
            "/v1/topics/default/x/subscriptions/s/failure-policy",
            Some("{}"),
        ),
        (
            "PATCH",
            "/v1/topics/default/x/subscriptions/s/failure-policy",
            Some("{}"),
        ),
        ("POST", "/v1/apply", Some("namespaces: [agents]")),
        ("GET", "/v1/cluster/status", None),
    ];
    for (method, path, body) in endpoints {
        let missing = server.request(method, path, None, body);
        assert_eq!(missing.status, 401, "{method} {path}");
        assert_eq!(
            missing.body,
            json!({
                "error": "missing bearer token: send Authorization: Bearer <token>",
                "kind": "unauthorized"
            }),
            "{method} {path}"
        );
        assert_eq!(
            missing.www_authenticate.as_deref(),
            Some("Bearer realm=\"tributary-admin\"")
        );
        // An Authorization header that is no Bearer token in visible
        // ASCII is named as such (it said the token was missing). (ureq
        // itself refuses to send one that is not ASCII.)
        for unusable in [&b"Basic dXNlcjpwdw=="[..], b"Token abc"] {
            let request = ureq::http::Request::builder()
                .method(method)
                .uri(format!("{}{path}", server.base))
                .header(
                    "Authorization",
                    ureq::http::HeaderValue::from_bytes(unusable).unwrap(),
                )
                .body(body.unwrap_or_default().to_owned())
                .unwrap();
            let response = server.agent.run(request).unwrap();
            assert_eq!(response.status().as_u16(), 401, "{method} {path}");
            let text = response.into_body().read_to_string().unwrap();
            assert!(
                text.contains("unusable Authorization header: send Authorization: Bearer <token>, in visible ASCII"),
                "{method} {path}: {text}"
            );
        }
        for wrong in [
            "s3cret-admin-toke",
            "s3cret-admin-tokenX",
            "S3CRET-ADMIN-TOKEN",
        ] {
            let reply = server.request(method, path, Some(wrong), body);
            assert_eq!(reply.status, 401, "{method} {path} {wrong}");
            assert_eq!(
                reply.body,
                json!({"error": "invalid bearer token", "kind": "unauthorized"})
            );
        }
    }
    assert!(server.keys().is_empty(), "nothing was written");
    // Another scheme is no bearer token.
    let mut builder = ureq::http::Request::builder()
        .method("GET")
        .uri(format!("{}/v1/namespaces", server.base));
    builder = builder.header("Authorization", format!("Basic {TOKEN}"));
    let response = server.agent.run(builder.body(()).unwrap()).unwrap();
    assert_eq!(response.status().as_u16(), 401);
    // The scheme is case-insensitive (RFC 6750).
    let builder = ureq::http::Request::builder()
        .method("GET")
        .uri(format!("{}/v1/namespaces", server.base))
        .header("Authorization", format!("bearer {TOKEN}"));
    let response = server.agent.run(builder.body(()).unwrap()).unwrap();
    assert_eq!(response.status().as_u16(), 200);
}

#[test]
fn namespaces_create_and_list() {
    let server = Server::start();
    assert_eq!(
        server.call("POST", "/v1/namespaces", Some(json!({"name": "agents"}))),
        (201, json!({"namespace": "agents", "action": "create"}))
    );
    assert_eq!(
        server.call("POST", "/v1/namespaces", Some(json!({"name": "agents"}))),
        (200, json!({"namespace": "agents", "action": "unchanged"}))
    );
    server.call("POST", "/v1/namespaces", Some(json!({"name": "default"})));
    assert_eq!(
        server.call("GET", "/v1/namespaces", None),
        (200, json!({"namespaces": ["agents", "default"]}))
    );
    assert_eq!(
        server.call("POST", "/v1/namespaces", Some(json!({"name": "bad ns"}))),
        (
            400,
            json!({
                "error": "name: invalid namespace \"bad ns\": namespace contains ' ' at byte 3; \
                          allowed: ASCII letters, digits, '-', '_', '.'",
                "kind": "invalid_input",
                "field": "name"
            })
        )
    );
    let (status, body) = server.call("POST", "/v1/namespaces", Some(json!({"nam": "x"})));
    assert_eq!(status, 400);
    assert_eq!(body["kind"], json!("invalid_input"));
    assert_eq!(
        body["error"],
        json!("nam: unknown field `nam`, expected `name` at line 1 column 6")
    );
    assert_eq!(
        server.call_text("POST", "/v1/namespaces", "not json"),
        (
            400,
            json!({
                "error": "request body: expected ident at line 1 column 2",
                "kind": "invalid_input"
            })
        )
    );
}

#[test]
fn topics_create_describe_list_delete() {
    let server = Server::start();
    let create = json!({"name": "/default/agent-jobs", "intent": "task_queue", "partitions": 3});
    assert_eq!(
        server.call("POST", "/v1/topics", Some(create.clone())),
        (
            201,
            json!({
                "topic": "/default/agent-jobs", "action": "create", "intent": "task_queue",
                "partitions": 3, "namespace_created": true
            })
        )
    );
    let alias = json!({"name": "/default/agent-jobs", "intent": "work_queue", "partitions": 3});
    assert_eq!(
        server.call("POST", "/v1/topics", Some(alias)),
        (
            200,
            json!({
                "topic": "/default/agent-jobs", "action": "unchanged", "intent": "task_queue",
                "partitions": 3, "namespace_created": false
            })
        )
    );
    assert_eq!(
        server.call(
            "POST",
            "/v1/topics",
            Some(json!({"name": "/default/agent-jobs", "intent": "audit_log", "partitions": 3}))
        ),
        (
            409,
            json!({
                "error": "topic /default/agent-jobs already exists with different settings: \
                          intent: existing task_queue, requested audit_log",
                "kind": "conflict",
                "differences": [
                    {"field": "intent", "existing": "task_queue", "requested": "audit_log"}
                ]
            })
        )
    );
    server.call(
        "POST",
        "/v1/topics",
        Some(json!({"name": "/agents/audit", "intent": "audit"})),
    );

    // Describe, with a subscription attached by a consumer and the topic
    // assigned to broker 1.
    server.runtime.block_on(async {
        let topic = TopicName::new("/default/agent-jobs").unwrap();
        Catalog::new(&*server.store)
            .attach_subscription(&topic, &SubscriptionName::new("worker-pool").unwrap())
            .await
            .unwrap();
        server
            .store
            .put("/cluster/brokers/1/default/agent-jobs", json!({}))
            .await
            .unwrap();
    });
    assert_eq!(
        server.call("GET", "/v1/topics/default/agent-jobs", None),
        (
            200,
            json!({
                "topic": "/default/agent-jobs",
                "broker_id": 1,
                "partitions": 3,
                "partition_topics": [
                    "/default/agent-jobs-part-0",
                    "/default/agent-jobs-part-1",
                    "/default/agent-jobs-part-2"
                ],
                "delivery": "Reliable",
                "wal_sync_mode": "fsync_batch",
                "intent": {
                    "intent": "task_queue", "delivery": "Reliable",
                    "wal_sync_mode": "fsync_batch", "max_retries": 5, "backoff_ms": 1000,
                    "poison_policy": "dead_letter", "dlq_suffix": "-dlq", "persistence": "wal"
                },
                "intent_summary": "task_queue (delivery=reliable, wal_sync=fsync_batch, \
                                   max_retries=5, backoff_ms=1000, poison_policy=dead_letter, \
                                   dlq=/default/agent-jobs-dlq)",
                "subscriptions": [{
                    "name": "worker-pool",
                    "failure_policy": {
                        "max_redelivery_count": 5, "ack_timeout_ms": 30000,
                        "base_redelivery_delay_ms": 1000, "max_redelivery_delay_ms": 60000,
                        "backoff_strategy": "exponential", "poison_policy": "dead_letter",
                        "dead_letter_topic": "/default/agent-jobs-dlq"
                    }
                }]
            })
        )
    );
    assert_eq!(
        server.call("GET", "/v1/topics", None),
        (
            200,
            json!({"topics": [
                {"name": "/agents/audit", "partitions": 0},
                {"name": "/default/agent-jobs", "partitions": 3}
            ]})
        )
    );
    assert_eq!(
        server.call("GET", "/v1/topics?namespace=agents", None),
        (
            200,
            json!({"topics": [{"name": "/agents/audit", "partitions": 0}]})
        )
    );
    assert_eq!(
        server.call("GET", "/v1/topics?namespace=nope", None),
        (
            404,
            json!({"error": "namespace nope does not exist", "kind": "not_found"})
        )
    );
    assert_eq!(
        server.call("DELETE", "/v1/topics/default/agent-jobs-part-1", None),
        (
            409,
            json!({
                "error": "topic /default/agent-jobs-part-1 is partition 1 of /default/agent-jobs; \
                          delete /default/agent-jobs instead",
                "kind": "conflict"
            })
        )
    );
    assert_eq!(
        server.call("DELETE", "/v1/topics/default/agent-jobs", None),
        (
            200,
            json!({"topic": "/default/agent-jobs", "partitions": 3, "deleted_keys": 17, "edge_fed": false})
        )
    );
    let gone = json!({"error": "topic /default/agent-jobs does not exist", "kind": "not_found"});
    assert_eq!(
        server.call("GET", "/v1/topics/default/agent-jobs", None),
        (404, gone.clone())
    );
    assert_eq!(
        server.call("DELETE", "/v1/topics/default/agent-jobs", None),
        (404, gone)
    );
}

#[test]
fn bad_topic_inputs_name_the_field() {
    let server = Server::start();
    let create = |body: Value| server.call("POST", "/v1/topics", Some(body));
    assert_eq!(
        create(json!({"name": "/default/x", "intent": "queue"})),
        (
            400,
            json!({
                "error": format!(
                    "intent: unknown stream intent \"queue\"; valid intents: {}",
                    valid_intents_text()
                ),
                "kind": "invalid_input",
                "field": "intent",
                "valid_intents": intent_names()
            })
        )
    );
    assert_eq!(
        create(json!({"name": "default/x", "intent": "task_queue"})),
        (
            400,
            json!({
                "error": "name: invalid topic name \"default/x\": topic name must start with '/'",
                "kind": "invalid_input",
                "field": "name"
            })
        )
    );
    assert_eq!(
        create(json!({"name": "/default/x/y", "intent": "task_queue"})),
        (
            400,
            json!({
                "error": "name: invalid topic name \"/default/x/y\": topic name must have \
                          exactly 2 parts separated by '/', found 3",
                "kind": "invalid_input",
                "field": "name"
            })
        )
    );
    for (partitions, shown) in [(json!(-1), "-1"), (json!(100_000), "100000")] {
        assert_eq!(
            create(json!({"name": "/default/x", "intent": "task_queue", "partitions": partitions})),
            (
                400,
                json!({
                    "error": format!(
                        "partitions: must be a whole number from 0 to 256, got {shown}"
                    ),
                    "kind": "invalid_input",
                    "field": "partitions"
                })
            )
        );
    }
    assert_eq!(
        server.call_text(
            "POST",
            "/v1/topics",
            r#"{"name":"/default/x","intent":"tasks","partitions":"3"}"#
        ),
        (
            400,
            json!({
                "error": "partitions: invalid type: string \"3\", expected i64 at line 1 column 54",
                "kind": "invalid_input",
                "field": "partitions"
            })
        )
    );
    assert_eq!(
        server.call("GET", "/v1/topics/bad%20ns/x", None),
        (
            400,
            json!({
                "error": "namespace: invalid namespace \"bad ns\": namespace contains ' ' at \
                          byte 3; allowed: ASCII letters, digits, '-', '_', '.'",
                "kind": "invalid_input",
                "field": "namespace"
            })
        )
    );
    assert_eq!(
        server.call("GET", "/v1/topics/default/..", None),
        (
            400,
            json!({
                "error": "topic: invalid topic name \"/default/..\": topic must not be '.' or '..'",
                "kind": "invalid_input",
                "field": "topic"
            })
        )
    );
    assert_eq!(
        server.call("GET", "/v1/nothing", None),
        (
            404,
            json!({"error": "no such endpoint", "kind": "not_found"})
        )
    );
    assert!(server.keys().is_empty(), "nothing was written");
}

#[test]
fn failure_policies_get_set_and_patch() {
    let server = Server::start();
    server.call(
        "POST",
        "/v1/topics",
        Some(json!({"name": "/default/agent-jobs", "intent": "task_queue"})),
    );
    let path = "/v1/topics/default/agent-jobs/subscriptions/worker-pool/failure-policy";
    let inherited = json!({
        "max_redelivery_count": 5, "ack_timeout_ms": 30000,
        "base_redelivery_delay_ms": 1000, "max_redelivery_delay_ms": 60000,
        "backoff_strategy": "exponential", "poison_policy": "dead_letter",
        "dead_letter_topic": "/default/agent-jobs-dlq"
    });
    let view = |persisted: bool, source: &str, policy: &Value| {
        json!({
            "topic": "/default/agent-jobs", "subscription": "worker-pool",
            "persisted": persisted, "source": source, "policy": policy
        })
    };
    assert_eq!(
        server.call("GET", path, None),
        (200, view(false, "intent", &inherited))
    );
    let mut patched = inherited.clone();
    patched["max_redelivery_count"] = json!(8);
    patched["ack_timeout_ms"] = json!(45000);
    assert_eq!(
        server.call(
            "PATCH",
            path,
            Some(json!({"max_redelivery_count": 8, "ack_timeout_ms": 45000}))
        ),
        (200, view(true, "stored", &patched))
    );
    assert_eq!(
        server.call("GET", path, None),
        (200, view(true, "stored", &patched))
    );
    let full = json!({
        "max_redelivery_count": 2, "ack_timeout_ms": 10000,
        "base_redelivery_delay_ms": 100, "max_redelivery_delay_ms": 1000,
        "backoff_strategy": "linear", "poison_policy": "block", "dead_letter_topic": null
    });
    assert_eq!(
        server.call("PUT", path, Some(full.clone())),
        (200, view(true, "stored", &full))
    );
    // A consumer attaching later keeps the override.
    let attached = server.runtime.block_on(async {
        Catalog::new(&*server.store)
            .attach_subscription(
                &TopicName::new("/default/agent-jobs").unwrap(),
                &SubscriptionName::new("worker-pool").unwrap(),
            )
            .await
            .unwrap()
    });
    assert_eq!(serde_json::to_value(&attached.policy).unwrap(), full);

    let mut zero = full.clone();
    zero["ack_timeout_ms"] = json!(0);
    assert_eq!(
        server.call("PUT", path, Some(zero)),
        (
            400,
            json!({
                "error": "ack_timeout_ms must be above 0",
                "kind": "invalid_input",
                "field": "ack_timeout_ms"
            })
        )
    );
    assert_eq!(
        server.call("PATCH", path, Some(json!({"poison_policy": "dead_letter"}))),
        (
            400,
            json!({
                "error": "poison_policy dead_letter requires dead_letter_topic",
                "kind": "invalid_input",
                "field": "dead_letter_topic"
            })
        )
    );
    assert_eq!(
        server.call("PATCH", path, Some(json!({"max_redelivery_count": 20000}))),
        (
            400,
            json!({
                "error": "max_redelivery_count: 20000 is above the limit of 10000",
                "kind": "invalid_input",
                "field": "max_redelivery_count"
            })
        )
    );
    let (status, body) = server.call("PATCH", path, Some(json!({"backoff_strategy": "random"})));
    assert_eq!(status, 400);
    assert_eq!(body["field"], json!("backoff_strategy"));
    assert_eq!(
        body["error"],
        json!(
            "backoff_strategy: unknown variant `random`, expected one of `exponential`, \
             `fixed`, `linear` at line 1 column 28"
        )
    );
    assert_eq!(
        server.call("GET", path, None),
        (200, view(true, "stored", &full)),
        "refused changes stored nothing"
    );
    assert_eq!(
        server.call(
            "GET",
            "/v1/topics/default/missing/subscriptions/s/failure-policy",
            None
        ),
        (
            404,
            json!({"error": "topic /default/missing does not exist", "kind": "not_found"})
        )
    );
    assert_eq!(
        server
            .call(
                "GET",
                "/v1/topics/default/agent-jobs/subscriptions/a%3Ab/failure-policy",
                None
            )
            .1["field"],
        json!("subscription")
    );
}

const SEED_MANIFEST: &str = "\
namespaces:
  - agents
topics:
  - name: /agents/events
    intent: agent_event_mesh
    partitions: 3
  - name: /agents/tasks
    intent: task_queue
    partitions: 6
  - name: /agents/tool-audit
    intent: tool_invocation_log
";

#[test]
fn apply_plans_applies_and_is_idempotent() {
    let server = Server::start();
    let item = |kind: &str, name: &str, action: &str, intent: Value, partitions: Value| {
        json!({
            "kind": kind, "name": name, "action": action, "intent": intent,
            "partitions": partitions, "changes": []
        })
    };
    let plan = |action: &str| {
        json!({"items": [
            item("namespace", "agents", action, Value::Null, Value::Null),
            item("topic", "/agents/events", action, json!("event_stream"), json!(3)),
            item("topic", "/agents/tasks", action, json!("task_queue"), json!(6)),
            item("topic", "/agents/tool-audit", action, json!("audit_log"), json!(0)),
        ]})
    };
    assert_eq!(
        server.call_text(
            "POST",
            "/v1/apply?dry_run=true&file=cluster-topology.yaml",
            SEED_MANIFEST
        ),
        (
            200,
            json!({"dry_run": true, "committed": false, "plan": plan("create")})
        )
    );
    assert!(server.keys().is_empty(), "a dry run writes nothing");
    assert_eq!(
        server.call_text("POST", "/v1/apply", SEED_MANIFEST),
        (
            200,
            json!({"dry_run": false, "committed": true, "plan": plan("create")})
        )
    );
    assert_eq!(server.keys().len(), 1 + 4 * 4 + 4 * 7 + 4);
    assert_eq!(
        server.call_text("POST", "/v1/apply", SEED_MANIFEST),
        (
            200,
            json!({"dry_run": false, "committed": false, "plan": plan("unchanged")})
        )
    );
}

#[test]
fn apply_is_all_or_nothing() {
    let server = Server::start();
    let bad = "\
namespaces: [agents]
topics:
  - name: /agents/ok
    intent: task_queue
  - name: /agents/bad
    intent: nope
  - name: /agents/neg
    intent: tasks
    partitions: -2
";
    assert_eq!(
        server.call_text("POST", "/v1/apply?file=topology.yaml", bad),
        (
            400,
            json!({
                "error": format!(
                    "manifest topology.yaml: topics[1] (/agents/bad): intent: unknown stream \
                     intent \"nope\"; valid intents: {}; topics[2] (/agents/neg): partitions: \
                     must be a whole number from 0 to 256, got -2; nothing applied",
                    valid_intents_text()
                ),
                "kind": "invalid_manifest",
                "errors": [
                    {
                        "file": "topology.yaml", "section": "topics", "index": 1,
                        "name": "/agents/bad", "field": "intent",
                        "message": format!(
                            "unknown stream intent \"nope\"; valid intents: {}",
                            valid_intents_text()
                        )
                    },
                    {
                        "file": "topology.yaml", "section": "topics", "index": 2,
                        "name": "/agents/neg", "field": "partitions",
                        "message": "must be a whole number from 0 to 256, got -2"
                    }
                ]
            })
        )
    );
    assert!(server.keys().is_empty(), "nothing applied");

    let (status, body) = server.call_text("POST", "/v1/apply?file=t.yaml", "topics: [\n");
    assert_eq!(status, 400);
    assert_eq!(body["kind"], json!("invalid_manifest"));
    let message = body["errors"][0]["message"].as_str().unwrap();
    assert!(message.starts_with("not valid YAML: "), "{message}");
    // Deep flow nesting is refused before the YAML parser sees it (which
    // took 13 s of a runtime worker for this body).
    let deep = format!("topics: {}{}", "[".repeat(10_000), "]".repeat(10_000));
    let (status, body) = server.call_text("POST", "/v1/apply?file=deep.yaml", &deep);
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["kind"], json!("invalid_manifest"));
    let message = body["errors"][0]["message"].as_str().unwrap();
    assert!(
        message.starts_with("nesting deeper than 64 levels"),
        "{message}"
    );

    server.call_text("POST", "/v1/apply", SEED_MANIFEST);
    let before = server.keys();
    let shrink = "\
topics:
  - name: /agents/new
    intent: tasks
  - name: /agents/tasks
    intent: task_queue
    partitions: 2
";
    assert_eq!(
        server.call_text("POST", "/v1/apply?file=shrink.yaml", shrink),
        (
            409,
            json!({
                "error": "manifest shrink.yaml: topics[1] (/agents/tasks): partitions: existing \
                          topic has 6 partitions, requested 2; only a partitioned topic's \
                          partition count can grow; nothing applied",
                "kind": "manifest_conflict",
                "errors": [{
                    "file": "shrink.yaml", "section": "topics", "index": 1,
                    "name": "/agents/tasks", "field": "partitions",
                    "message": "existing topic has 6 partitions, requested 2; only a \
                                partitioned topic's partition count can grow"
                }]
            })
        )
    );
    assert_eq!(server.keys(), before, "/agents/new was not created");
    assert_eq!(
        server
            .call_text("POST", "/v1/apply?dry_run=maybe", SEED_MANIFEST)
            .0,
        400
    );
}

#[test]
fn cluster_status_reports_the_view() {
    let server = Server::start();
    assert_eq!(
        server.call("GET", "/v1/cluster/status", None),
        (
            200,
            json!({
                "node_id": 1,
                "leader": 1,
                "term": 3,
                "members": {"1": "127.0.0.1:7500", "2": "127.0.0.1:7501"},
                "last_applied_index": 42,
                "snapshot_index": 40,
                "purged_index": null,
                "state": "Leader",
                // No broker started this store's identity task.
                "cluster_id": null
            })
        )
    );
}

/// Trim and unload act on the broker's local WALs; an admin API served
/// without them (this harness, like a metadata-only broker) refuses both
/// with 501 `not_supported` instead of pretending to have done something.
#[test]
fn trim_and_unload_without_local_wals_are_not_supported() {
    let server = Server::start();
    for action in ["trim", "unload"] {
        let reply = server.request(
            "POST",
            &format!("/v1/storage/topics/plant1/readings/{action}"),
            Some(TOKEN),
            None,
        );
        assert_eq!(reply.status, 501, "{action}: {}", reply.body);
        assert_eq!(
            reply.body["kind"], "not_supported",
            "{action}: {}",
            reply.body
        );
    }
}
