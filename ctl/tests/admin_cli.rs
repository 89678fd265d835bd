//! The real `tribctl` binary against the broker's admin router served
//! in-process on 127.0.0.1:0 with a redb metadata store.

use std::path::Path;
use std::process::{Command, Output};
use std::sync::Arc;

use broker_core::catalog::Catalog;
use broker_core::metadata::MetadataStore;
use broker_core::metadata::redb::RedbStore;

use broker_core::clock::ManualClock;
use serde_json::{Value, json};
use tributary_broker::admin::{AdminState, StaticClusterView, serve};
use tributary_broker::raft::node::ClusterStatus;
use tributary_proto::keys::{SubscriptionName, TopicName};

const TOKEN: &str = "ctl-test-token";

struct Server {
    runtime: tokio::runtime::Runtime,
    store: Arc<RedbStore>,
    base: String,
    dir: tempfile::TempDir,
}

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl From<Output> for Run {
    fn from(output: Output) -> Run {
        Run {
            code: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8(output.stdout).unwrap(),
            stderr: String::from_utf8(output.stderr).unwrap(),
        }
    }
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
            cluster: Arc::new(StaticClusterView(ClusterStatus {
                last_applied_index: Some(17),
                ..StaticClusterView::single_leader("127.0.0.1:7500", 2).0
            })),
            auth: tributary_broker::auth::AuthState::new(store.clone(), Some(TOKEN.to_owned())),
        };
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        runtime.spawn(serve(listener, state, std::future::pending()));
        Server {
            runtime,
            store,
            base,
            dir,
        }
    }

    fn command(&self) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_tribctl"));
        command
            .current_dir(self.dir.path())
            .env("TRIB_ADMIN_URL", &self.base)
            .env("TRIB_ADMIN_TOKEN", TOKEN);
        command
    }

    /// Runs `tribctl args…` against this server.
    fn tribctl(&self, args: &[&str]) -> Run {
        self.command().args(args).output().unwrap().into()
    }

    /// Runs a command that must succeed; returns its stdout.
    fn ok(&self, args: &[&str]) -> String {
        let run = self.tribctl(args);
        assert_eq!(run.code, 0, "{args:?}: {}", run.stderr);
        assert_eq!(run.stderr, "", "{args:?}");
        run.stdout
    }

    /// Runs a command with `--output json`; returns the parsed stdout.
    fn json(&self, args: &[&str]) -> Value {
        let mut args = args.to_vec();
        args.extend(["--output", "json"]);
        let stdout = self.ok(&args);
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
    }

    fn write(&self, name: &str, text: &str) {
        std::fs::write(self.dir.path().join(name), text).unwrap();
    }

    fn topic_keys(&self) -> usize {
        self.runtime
            .block_on(self.store.list("/topics/"))
            .unwrap()
            .len()
    }
}

#[test]
fn create_describe_list_delete() {
    let server = Server::start();
    assert_eq!(
        server.ok(&[
            "topics",
            "create",
            "/default/agent-jobs",
            "--intent",
            "task_queue",
            "--partitions",
            "3"
        ]),
        "created namespace default\ncreated topic /default/agent-jobs (task_queue, 3 partitions)\n"
    );
    assert_eq!(
        server.ok(&[
            "topics",
            "create",
            "/default/agent-jobs",
            "--intent",
            "agent_task_queue",
            "--partitions",
            "3"
        ]),
        "unchanged topic /default/agent-jobs (task_queue, 3 partitions)\n"
    );

    // Unassigned, no subscriptions yet.
    assert_eq!(
        server.ok(&["topics", "describe", "/default/agent-jobs"]),
        "Topic: /default/agent-jobs\n\
         Owner: unassigned\n\
         Delivery: Reliable\n\
         Intent: task_queue (delivery=reliable, wal_sync=fsync_batch, max_retries=5, \
         backoff_ms=1000, poison_policy=dead_letter, dlq=/default/agent-jobs-dlq)\n\
         Partitions: 3\n\
         Subscriptions: none\n"
    );
    // The seed's sample output, once broker 1 owns the topic and a
    // consumer attached.
    server.runtime.block_on(async {
        server
            .store
            .put(
                "/cluster/brokers/1/default/agent-jobs",
                json!({"epoch": 3, "assigned_at_ms": 1, "reason": "new_topic"}),
            )
            .await
            .unwrap();
        Catalog::new(&*server.store)
            .attach_subscription(
                &TopicName::new("/default/agent-jobs").unwrap(),
                &SubscriptionName::new("worker-pool").unwrap(),
            )
            .await
            .unwrap();
    });
    assert_eq!(
        server.ok(&["topics", "describe", "/default/agent-jobs"]),
        "Topic: /default/agent-jobs\n\
         Owner: broker 1 (epoch 3)\n\
         Delivery: Reliable\n\
         Intent: task_queue (delivery=reliable, wal_sync=fsync_batch, max_retries=5, \
         backoff_ms=1000, poison_policy=dead_letter, dlq=/default/agent-jobs-dlq)\n\
         Partitions: 3\n\
         Subscriptions: worker-pool\n"
    );
    let described = server.json(&["topics", "describe", "/default/agent-jobs"]);
    assert_eq!(described["broker_id"], json!(1));
    assert_eq!(described["epoch"], json!(3));
    assert_eq!(described["intent"]["wal_sync_mode"], json!("fsync_batch"));
    assert_eq!(
        described["subscriptions"][0]["failure_policy"]["max_redelivery_count"],
        json!(5)
    );

    server.ok(&["topics", "create", "/agents/audit", "--intent", "audit"]);
    assert_eq!(
        server.ok(&["topics", "list"]),
        "/agents/audit\n/default/agent-jobs (3 partitions)\n"
    );
    assert_eq!(
        server.ok(&["topics", "list", "--namespace", "default"]),
        "/default/agent-jobs (3 partitions)\n"
    );
    assert_eq!(
        server.json(&["topics", "list", "--namespace", "agents"]),
        json!({"topics": [{"name": "/agents/audit", "partitions": 0}]})
    );

    let conflict = server.tribctl(&[
        "topics",
        "create",
        "/default/agent-jobs",
        "--intent",
        "audit_log",
        "--partitions",
        "3",
    ]);
    assert_eq!(conflict.code, 1);
    assert_eq!(conflict.stdout, "");
    assert_eq!(
        conflict.stderr,
        "error: topic /default/agent-jobs already exists with different settings: \
         intent: existing task_queue, requested audit_log\n"
    );

    assert_eq!(
        server.ok(&["topics", "delete", "/default/agent-jobs"]),
        "deleted topic /default/agent-jobs (3 partitions, 17 metadata keys)\n"
    );
    let gone = server.tribctl(&["topics", "describe", "/default/agent-jobs"]);
    assert_eq!(gone.code, 1);
    assert_eq!(
        gone.stderr,
        "error: topic /default/agent-jobs does not exist\n"
    );
}

#[test]
fn bad_inputs_print_one_error_line() {
    let server = Server::start();
    let run = server.tribctl(&[
        "topics",
        "create",
        "/default/x",
        "--intent",
        "task_queue",
        "--partitions",
        "-1",
    ]);
    assert_eq!(run.code, 1);
    assert_eq!(
        run.stderr,
        "error: partitions: must be a whole number from 0 to 256, got -1\n"
    );
    let run = server.tribctl(&["topics", "create", "/default/x", "--intent", "queue"]);
    assert_eq!(run.code, 1);
    assert_eq!(
        run.stderr,
        "error: intent: unknown stream intent \"queue\"; valid intents: \
         realtime (aliases: telemetry_firehose, firehose, telemetry, ephemeral); \
         event_stream (aliases: agent_event_mesh, event_mesh, events, lakehouse_feed, \
         lakehouse, custom); task_queue (aliases: agent_task_queue, tasks, work_queue); \
         audit_log (aliases: tool_invocation_log, tool_log, audit, state_log)\n"
    );
    let run = server.tribctl(&["topics", "describe", "default/x"]);
    assert_eq!(run.code, 1);
    assert_eq!(
        run.stderr,
        "error: invalid topic name \"default/x\": topic name must start with '/'\n"
    );
    assert_eq!(server.topic_keys(), 0);

    let no_token = server
        .command()
        .env_remove("TRIB_ADMIN_TOKEN")
        .args(["namespaces", "list"])
        .output()
        .unwrap();
    let no_token = Run::from(no_token);
    assert_eq!(no_token.code, 1);
    assert_eq!(
        no_token.stderr,
        "error: no admin token: pass --token or set TRIB_ADMIN_TOKEN\n"
    );
    let wrong = server.tribctl(&["namespaces", "list", "--token", "wrong"]);
    assert_eq!(wrong.code, 1);
    assert_eq!(wrong.stderr, "error: invalid bearer token\n");

    // `topics unload` needs a broker that holds the topic's WALs; this
    // admin router has none and says so.
    let run = server.tribctl(&["topics", "unload", "/default/x", "--wait-ms", "0"]);
    assert_eq!(run.code, 1);
    assert_eq!(
        run.stderr,
        "error: this broker does not expose its local WALs to the admin API\n"
    );
    let run = server.tribctl(&["topics", "unload", "default/x"]);
    assert_eq!(run.code, 1);
    assert_eq!(
        run.stderr,
        "error: invalid topic name \"default/x\": topic name must start with '/'\n"
    );

    let unreachable = server.tribctl(&["namespaces", "list", "--admin-url", "http://127.0.0.1:1"]);
    assert_eq!(unreachable.code, 1);
    assert!(
        unreachable
            .stderr
            .starts_with("error: cannot reach the admin API at http://127.0.0.1:1/v1/namespaces: "),
        "{}",
        unreachable.stderr
    );
    assert_eq!(
        unreachable.stderr.lines().count(),
        1,
        "{}",
        unreachable.stderr
    );
    // A CA file that is not there is named as such (it read "admin API
    // at /nonexistent/ca.pem: ...").
    let missing_ca = server.tribctl(&[
        "namespaces",
        "list",
        "--admin-url",
        "https://127.0.0.1:1",
        "--ca",
        "/nonexistent/ca.pem",
    ]);
    assert_eq!(missing_ca.code, 1);
    assert!(
        missing_ca
            .stderr
            .starts_with("error: /nonexistent/ca.pem: ")
            && !missing_ca.stderr.contains("admin API at /nonexistent"),
        "{}",
        missing_ca.stderr
    );
}

#[test]
fn failure_policies() {
    let server = Server::start();
    server.ok(&[
        "topics",
        "create",
        "/default/agent-jobs",
        "--intent",
        "task_queue",
        "--partitions",
        "3",
    ]);
    assert_eq!(
        server.ok(&[
            "topics",
            "get-failure-policy",
            "/default/agent-jobs",
            "-s",
            "worker-pool"
        ]),
        "Topic: /default/agent-jobs\n\
         Subscription: worker-pool\n\
         Source: inherited from the intent (persisted when the first consumer attaches)\n\
         max_redelivery_count: 5\n\
         ack_timeout_ms: 30000\n\
         base_redelivery_delay_ms: 1000\n\
         max_redelivery_delay_ms: 60000\n\
         backoff_strategy: exponential\n\
         poison_policy: dead_letter\n\
         dead_letter_topic: /default/agent-jobs-dlq\n"
    );
    // The seed's example override.
    assert_eq!(
        server.ok(&[
            "topics",
            "set-failure-policy",
            "/default/agent-jobs",
            "-s",
            "worker-pool",
            "--max-redelivery-count",
            "8",
            "--ack-timeout-ms",
            "45000",
            "--base-redelivery-delay-ms",
            "1000",
            "--max-redelivery-delay-ms",
            "60000",
            "--backoff-strategy",
            "exponential",
            "--dead-letter-topic",
            "/default/agent-jobs-dlq",
            "--poison-policy",
            "dead_letter",
        ]),
        "Topic: /default/agent-jobs\n\
         Subscription: worker-pool\n\
         Source: stored\n\
         max_redelivery_count: 8\n\
         ack_timeout_ms: 45000\n\
         base_redelivery_delay_ms: 1000\n\
         max_redelivery_delay_ms: 60000\n\
         backoff_strategy: exponential\n\
         poison_policy: dead_letter\n\
         dead_letter_topic: /default/agent-jobs-dlq\n"
    );
    // Unspecified flags keep their values.
    let view = server.json(&[
        "topics",
        "set-failure-policy",
        "/default/agent-jobs",
        "-s",
        "worker-pool",
        "--poison-policy",
        "block",
        "--dead-letter-topic",
        "none",
    ]);
    assert_eq!(
        view,
        json!({
            "topic": "/default/agent-jobs", "subscription": "worker-pool",
            "persisted": true, "source": "stored",
            "policy": {
                "max_redelivery_count": 8, "ack_timeout_ms": 45000,
                "base_redelivery_delay_ms": 1000, "max_redelivery_delay_ms": 60000,
                "backoff_strategy": "exponential", "poison_policy": "block",
                "dead_letter_topic": null
            }
        })
    );
    assert_eq!(
        server.json(&[
            "topics",
            "get-failure-policy",
            "/default/agent-jobs",
            "-s",
            "worker-pool"
        ]),
        view
    );

    let nothing = server.tribctl(&[
        "topics",
        "set-failure-policy",
        "/default/agent-jobs",
        "-s",
        "worker-pool",
    ]);
    assert_eq!(nothing.code, 1);
    assert!(
        nothing
            .stderr
            .starts_with("error: nothing to change: pass at least one of"),
        "{}",
        nothing.stderr
    );
    let invalid = server.tribctl(&[
        "topics",
        "set-failure-policy",
        "/default/agent-jobs",
        "-s",
        "worker-pool",
        "--base-redelivery-delay-ms",
        "90000",
    ]);
    assert_eq!(invalid.code, 1);
    assert_eq!(
        invalid.stderr,
        "error: base_redelivery_delay_ms 90000 exceeds \
         max_redelivery_delay_ms 60000\n"
    );
    let usage = server.tribctl(&[
        "topics",
        "set-failure-policy",
        "/default/agent-jobs",
        "-s",
        "worker-pool",
        "--backoff-strategy",
        "random",
    ]);
    assert_eq!(usage.code, 2, "clap refuses it before any request");
    assert!(
        usage
            .stderr
            .contains("[possible values: exponential, fixed, linear]")
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
fn apply_prints_the_plan_and_is_idempotent() {
    let server = Server::start();
    server.write("cluster-topology.yaml", SEED_MANIFEST);
    let plan = |action: &str| {
        format!(
            "{action:<9} namespace agents\n\
             {action:<9} topic /agents/events (event_stream, 3 partitions)\n\
             {action:<9} topic /agents/tasks (task_queue, 6 partitions)\n\
             {action:<9} topic /agents/tool-audit (audit_log, non-partitioned)\n"
        )
    };
    assert_eq!(
        server.ok(&["apply", "-f", "cluster-topology.yaml", "--dry-run"]),
        format!(
            "{}dry run: 4 to create, 0 to update, 0 unchanged; nothing applied\n",
            plan("create")
        )
    );
    assert_eq!(server.topic_keys(), 0, "a dry run writes nothing");
    assert_eq!(
        server.ok(&["apply", "-f", "cluster-topology.yaml"]),
        format!(
            "{}applied: 4 created, 0 updated, 0 unchanged\n",
            plan("create")
        )
    );
    assert_eq!(server.topic_keys(), 3 * (4 + 7 + 1));
    assert_eq!(
        server.ok(&["apply", "-f", "cluster-topology.yaml"]),
        format!(
            "{}applied: 0 created, 0 updated, 4 unchanged\n",
            plan("unchanged")
        )
    );
    let report = server.json(&["apply", "-f", "cluster-topology.yaml"]);
    assert_eq!(report["committed"], json!(false));
    assert_eq!(report["dry_run"], json!(false));
    assert_eq!(report["plan"]["items"].as_array().unwrap().len(), 4);

    // Growing partitions and changing an intent are updates.
    server.write(
        "grow.yaml",
        "topics:\n  - name: /agents/tasks\n    intent: task_queue\n    partitions: 8\n  \
         - name: /agents/events\n    intent: task_queue\n    partitions: 3\n",
    );
    assert_eq!(
        server.ok(&["apply", "-f", "grow.yaml", "--dry-run"]),
        "unchanged namespace agents\n\
         update    topic /agents/tasks (task_queue, 8 partitions): partitions 6 -> 8\n\
         update    topic /agents/events (task_queue, 3 partitions): intent event_stream -> task_queue\n\
         dry run: 0 to create, 2 to update, 1 unchanged; nothing applied\n"
    );
    assert_eq!(
        server.ok(&["namespaces", "list"]),
        "agents\n",
        "a dry run changed nothing"
    );
}

#[test]
fn apply_with_one_bad_entry_applies_nothing() {
    let server = Server::start();
    server.write(
        "topology.yaml",
        "namespaces: [agents]\n\
         topics:\n  \
           - name: /agents/ok\n    intent: task_queue\n    partitions: 2\n  \
           - name: /agents/bad\n    intent: task_queue\n    partitions: -3\n",
    );
    let run = server.tribctl(&["apply", "-f", "topology.yaml"]);
    assert_eq!(run.code, 1);
    assert_eq!(run.stdout, "");
    assert_eq!(
        run.stderr,
        "error: topology.yaml: topics[1] (/agents/bad): partitions: must be a whole number \
         from 0 to 256, got -3\n\
         error: nothing applied\n"
    );
    assert_eq!(server.ok(&["topics", "list"]), "");
    assert_eq!(server.ok(&["namespaces", "list"]), "");
    assert_eq!(server.topic_keys(), 0);

    server.write(
        "typo.yaml",
        "topics:\n  - name: /agents/x\n    intnet: task_queue\n",
    );
    let run = server.tribctl(&["apply", "-f", "typo.yaml", "--dry-run"]);
    assert_eq!(run.code, 1);
    assert_eq!(
        run.stderr,
        "error: typo.yaml: topics[0] (/agents/x): intnet: unknown field; expected name, \
         intent, partitions\n\
         error: typo.yaml: topics[0] (/agents/x): intent: is required\n\
         error: nothing applied\n"
    );
    let missing = server.tribctl(&["apply", "-f", "missing.yaml"]);
    assert_eq!(missing.code, 1);
    assert!(
        missing
            .stderr
            .starts_with("error: cannot read missing.yaml: "),
        "{}",
        missing.stderr
    );
}

#[test]
fn namespaces_and_cluster_status() {
    let server = Server::start();
    assert_eq!(
        server.ok(&["namespaces", "create", "agents"]),
        "created namespace agents\n"
    );
    assert_eq!(
        server.ok(&["namespaces", "create", "agents"]),
        "unchanged namespace agents\n"
    );
    server.ok(&["namespaces", "create", "default"]);
    assert_eq!(server.ok(&["namespaces", "list"]), "agents\ndefault\n");
    assert_eq!(
        server.json(&["namespaces", "list"]),
        json!({"namespaces": ["agents", "default"]})
    );
    assert_eq!(
        server.ok(&["cluster", "status"]),
        "Cluster ID: unknown\n\
         Node ID: 1\n\
         State: Leader\n\
         Leader: 1\n\
         Term: 2\n\
         Last applied index: 17\n\
         Snapshot index: none\n\
         Purged index: none\n\
         Members:\n  \
           1 127.0.0.1:7500\n"
    );
    assert_eq!(
        server.json(&["cluster", "status"]),
        json!({
            "node_id": 1, "leader": 1, "term": 2,
            "members": {"1": "127.0.0.1:7500"},
            "last_applied_index": 17, "snapshot_index": null, "purged_index": null,
            "state": "Leader", "cluster_id": null
        })
    );
}

#[test]
fn certs_still_works() {
    let server = Server::start();
    let out = server.dir.path().join("certs");
    let stdout = server.ok(&[
        "certs",
        "--out",
        out.to_str().unwrap(),
        "--broker",
        "1",
        "--edge",
        "edge1",
    ]);
    assert!(stdout.contains("broker 1: "), "{stdout}");
    for file in ["ca.pem", "broker-1.pem", "broker-1.key", "edge-edge1.pem"] {
        assert!(Path::new(&out).join(file).exists(), "{file}");
    }
    // The CA key is not among the files devices get: it sits beside them.
    assert!(!out.join("ca.key").exists());
    let ca_key = server.dir.path().join("certs-ca").join("ca.key");
    assert!(ca_key.exists());
    assert!(
        stdout.ends_with(&format!(
            "CA key: {} (keep it off devices; a broker's [enroll] ca_key)\n",
            ca_key.display()
        )),
        "{stdout}"
    );
    // --ca-dir names another directory; the existing CA is found there only
    // if its key is: here a new CA is made in another output directory.
    let vault = server.dir.path().join("vault");
    let other = server.dir.path().join("other");
    server.ok(&[
        "certs",
        "--out",
        other.to_str().unwrap(),
        "--ca-dir",
        vault.to_str().unwrap(),
        "--edge",
        "edge2",
    ]);
    assert!(vault.join("ca.key").exists());
    assert!(!other.join("ca.key").exists());
    // Node ids start at 1: a broker-0 certificate no broker could use.
    let zero = server.tribctl(&["certs", "--out", other.to_str().unwrap(), "--broker", "0"]);
    assert_eq!(zero.code, 2, "{}", zero.stderr);
    assert!(
        zero.stderr
            .starts_with("error: invalid value '0' for '--broker <ID>': 0 is not in 1.."),
        "{}",
        zero.stderr
    );
    assert!(!other.join("broker-0.pem").exists());
    // Host names for broker certificates: a bad one, or names without a
    // broker to put them in, are refused before anything is written.
    let hosts = server.dir.path().join("hosts");
    let bad = server.tribctl(&[
        "certs",
        "--out",
        hosts.to_str().unwrap(),
        "--broker",
        "1",
        "--broker-host",
        "not a host",
    ]);
    assert_eq!(bad.code, 1, "{}", bad.stderr);
    assert!(
        bad.stderr.contains("invalid broker host \"not a host\""),
        "{}",
        bad.stderr
    );
    let alone = server.tribctl(&[
        "certs",
        "--out",
        hosts.to_str().unwrap(),
        "--broker-host",
        "b.example.net",
    ]);
    assert_eq!(alone.code, 1, "{}", alone.stderr);
    assert!(
        alone.stderr.contains("give --broker ID"),
        "{}",
        alone.stderr
    );
    assert!(!hosts.exists());
    server.ok(&[
        "certs",
        "--out",
        hosts.to_str().unwrap(),
        "--broker",
        "1",
        "--broker-host",
        "b.example.net",
    ]);
    let pem = std::fs::read(hosts.join("broker-1.pem")).unwrap();
    assert!(!pem.is_empty());
}

#[test]
fn auth_create_list_grant_whoami_revoke() {
    let server = Server::start();
    // Create with a role: the token is printed once, on stdout.
    let created = server.json(&[
        "auth",
        "create",
        "reader",
        "--role",
        "consumer",
        "--namespace",
        "shop",
    ]);
    let token = created["token"].as_str().unwrap().to_owned();
    assert!(token.starts_with("trib.reader."), "{created}");
    assert_eq!(created["principal"]["name"], "reader");
    assert_eq!(created["principal"]["kind"], "token");
    assert_eq!(created["binding"]["role"], "consumer");
    assert_eq!(created["binding"]["namespace"], "shop");
    let stored = server
        .runtime
        .block_on(server.store.get("/auth/principals/reader"))
        .unwrap()
        .unwrap();
    assert!(
        !stored.to_string().contains(&token),
        "the token is stored hashed"
    );

    // A create whose role is refused creates nothing: the principal and
    // its binding are one transaction.
    for (role, namespace, message) in [
        ("superuser", "shop", "error: no role superuser\n"),
        (
            "consumer",
            "bad ns",
            "error: namespace: invalid namespace \"bad ns\": namespace contains ' ' at byte 3",
        ),
    ] {
        let refused = server.tribctl(&[
            "auth",
            "create",
            "x1",
            "--role",
            role,
            "--namespace",
            namespace,
        ]);
        assert_eq!(refused.code, 1, "{}", refused.stderr);
        assert!(refused.stderr.starts_with(message), "{}", refused.stderr);
        assert_eq!(refused.stdout, "");
        assert!(
            server
                .runtime
                .block_on(server.store.get("/auth/principals/x1"))
                .unwrap()
                .is_none(),
            "nothing created"
        );
    }

    let text = server.ok(&["auth", "create", "tier-1", "--kind", "certificate"]);
    assert_eq!(text, "created certificate principal tier-1\n");
    let listed = server.ok(&["auth", "list"]);
    let names: Vec<&str> = listed
        .lines()
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    assert_eq!(names, ["reader", "tier-1"], "{listed}");
    assert!(
        listed.contains("reader  token  created by bootstrap-admin"),
        "{listed}"
    );

    let granted = server.ok(&["auth", "grant", "tier-1", "--role", "tier"]);
    assert!(
        granted.starts_with("granted ") && granted.ends_with(" tier-1 tier (cluster-wide)\n"),
        "{granted}"
    );
    let roles = server.ok(&["auth", "roles"]);
    assert!(
        roles.contains("tier (built-in): storage, topics_read\n"),
        "{roles}"
    );

    // whoami with the new token.
    let who = server
        .command()
        .env("TRIB_ADMIN_TOKEN", &token)
        .args(["auth", "whoami", "--output", "json"])
        .output()
        .unwrap();
    assert!(
        who.status.success(),
        "{}",
        String::from_utf8_lossy(&who.stderr)
    );
    let who: Value = serde_json::from_slice(&who.stdout).unwrap();
    assert_eq!(who["name"], "reader");
    assert_eq!(who["bindings"][0]["namespace"], "shop");
    // The consumer may not manage auth: a 403 naming the permission.
    let refused: Run = server
        .command()
        .env("TRIB_ADMIN_TOKEN", &token)
        .args(["auth", "list"])
        .output()
        .unwrap()
        .into();
    assert_ne!(refused.code, 0);
    assert!(refused.stderr.contains("auth_manage"), "{}", refused.stderr);

    assert_eq!(
        server.ok(&["auth", "ungrant", "tier-1", "--role", "tier"]),
        granted.replacen("granted", "removed", 1)
    );
    assert_eq!(
        server.ok(&["auth", "revoke", "reader"]),
        "revoked reader (1 binding(s) removed)\n"
    );
    let after: Run = server
        .command()
        .env("TRIB_ADMIN_TOKEN", &token)
        .args(["auth", "whoami"])
        .output()
        .unwrap()
        .into();
    assert_ne!(after.code, 0);
    assert_eq!(after.stderr, "error: invalid or revoked bearer token\n");
    assert_eq!(server.json(&["auth", "bindings"])["bindings"], json!([]));
}

#[test]
fn edges_token_prints_a_token_once_and_revoke_voids_it() {
    let server = Server::start();
    let stdout = server.ok(&["edges", "token", "plant1", "--ttl", "90s"]);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    assert!(
        lines[0].starts_with("enrollment token for edge plant1 (one use, expires 20")
            && lines[0].ends_with("Z; shown once, store it now):"),
        "{stdout}"
    );
    let token = lines[1];
    assert!(token.starts_with("trib-enroll.plant1."), "{token}");
    assert_eq!(token.len(), "trib-enroll.plant1.".len() + 64);
    let stored = |key: &str| server.runtime.block_on(server.store.get(key)).unwrap();
    let record = stored("/auth/enrollments/plant1").expect("stored");
    assert_eq!(
        record["expires_at_ms"].as_u64().unwrap() - record["created_at_ms"].as_u64().unwrap(),
        90_000
    );
    assert_eq!(record["token_sha256"].as_str().unwrap().len(), 64);
    assert!(!record.to_string().contains(&token[19..]), "{record}");

    // Minting again replaces it; JSON output.
    let minted = server.json(&["edges", "token", "plant1"]);
    assert_eq!(minted["edge_id"], "plant1");
    assert_ne!(minted["token"], token);
    let record = stored("/auth/enrollments/plant1").expect("stored");
    assert_eq!(
        record["expires_at_ms"].as_u64().unwrap() - record["created_at_ms"].as_u64().unwrap(),
        24 * 3600 * 1000,
        "default ttl 24h"
    );

    let revoked = server.ok(&["edges", "revoke", "plant1"]);
    assert!(
        revoked.starts_with(
            "revoked edge plant1: every broker refuses its certificates issued up to 20"
        ) && revoked.ends_with("Z (enroll it again with `tribctl edges token plant1`)\n"),
        "{revoked}"
    );
    let revocation = stored("/auth/revoked_edges/plant1").expect("revocation");
    assert_eq!(revocation["revoked_by"], "bootstrap-admin");
    assert_eq!(
        stored("/auth/enrollments/plant1"),
        None,
        "the unused token is void"
    );

    // Bad input: a name that cannot be a namespace, a TTL over 30 days.
    let bad = server.tribctl(&["edges", "token", "a/b"]);
    assert_eq!(bad.code, 1, "{}", bad.stderr);
    assert!(bad.stderr.starts_with("error: "), "{}", bad.stderr);
    assert!(bad.stderr.contains("\"a/b\""), "{}", bad.stderr);
    let long = server.tribctl(&["edges", "token", "plant1", "--ttl", "31d"]);
    assert_eq!(long.code, 2, "{}", long.stderr);
    assert!(
        long.stderr.contains("must be from 1ms to 30 days"),
        "{}",
        long.stderr
    );
}
