//! The real `tribctl` binary against the admin router of a broker with
//! topic ownership (broker 1's `Extension<Arc<Cluster>>`, broker 2 holding
//! a lease in the same process), served in-process on 127.0.0.1:0 over a
//! redb store: `cluster status` lists the brokers, `topics describe` the
//! owner and epoch, `topics move` and `cluster rebalance` change owners.

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use broker_core::catalog::{Catalog, TopicSpec};
use broker_core::clock::SystemClock;
use broker_core::metadata::MetadataStore;
use broker_core::metadata::redb::RedbStore;
use serde_json::{Value, json};
use tributary_broker::admin::{AdminState, StaticClusterView, router};
use tributary_broker::cluster::{Cluster, ClusterConfig};
use tributary_proto::keys::{TopicName, cluster as cluster_keys};

const TOKEN: &str = "ctl-cluster-token";

struct Server {
    runtime: tokio::runtime::Runtime,
    store: Arc<RedbStore>,
    base: String,
    clusters: Vec<Arc<Cluster>>,
    _dir: tempfile::TempDir,
}

impl Server {
    fn start() -> Server {
        let dir = tempfile::tempdir().unwrap();
        let store =
            Arc::new(RedbStore::open(dir.path().join("meta.redb"), Arc::new(SystemClock)).unwrap());
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let store_dyn: Arc<dyn MetadataStore> = store.clone();
        let clusters: Vec<Arc<Cluster>> = (1..=2u64)
            .map(|id| {
                let admin_url = if id == 1 {
                    base.clone()
                } else {
                    "http://127.0.0.1:7999".to_owned()
                };
                let cluster = Cluster::new(
                    id,
                    store_dyn.clone(),
                    Arc::new(SystemClock),
                    ClusterConfig {
                        heartbeat_ms: 100,
                        ..ClusterConfig::new(format!("127.0.0.1:760{id}"), admin_url)
                    },
                );
                runtime.spawn(tributary_broker::cluster::lease::run(cluster.clone()));
                runtime.spawn(cluster.clone().follow());
                cluster
            })
            .collect();
        let state = AdminState {
            store: store_dyn.clone(),
            cluster: Arc::new(StaticClusterView::single_leader("127.0.0.1:7500", 2)),
            auth: tributary_broker::auth::AuthState::new(store_dyn, Some(TOKEN.to_owned())),
        };
        let app = router(state).layer(axum::Extension(clusters[0].clone()));
        runtime.spawn(async move { axum::serve(listener, app).await });
        let server = Server {
            runtime,
            store,
            base,
            clusters,
            _dir: dir,
        };
        server.wait_until("both leases live", |s| {
            s.clusters[0].brokers().iter().filter(|b| b.live).count() == 2
        });
        server
    }

    fn wait_until(&self, what: &str, condition: impl Fn(&Server) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !condition(self) {
            assert!(Instant::now() < deadline, "not within 10 s: {what}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn ok(&self, args: &[&str]) -> String {
        let output = Command::new(env!("CARGO_BIN_EXE_tribctl"))
            .env("TRIB_ADMIN_URL", &self.base)
            .env("TRIB_ADMIN_TOKEN", TOKEN)
            .args(args)
            .output()
            .unwrap();
        let stderr = String::from_utf8(output.stderr).unwrap();
        assert!(output.status.success(), "{args:?}: {stderr}");
        String::from_utf8(output.stdout).unwrap()
    }

    fn fails(&self, args: &[&str]) -> String {
        let output = Command::new(env!("CARGO_BIN_EXE_tribctl"))
            .env("TRIB_ADMIN_URL", &self.base)
            .env("TRIB_ADMIN_TOKEN", TOKEN)
            .args(args)
            .output()
            .unwrap();
        assert!(!output.status.success(), "{args:?} succeeded");
        String::from_utf8(output.stderr).unwrap()
    }

    fn json(&self, args: &[&str]) -> Value {
        let mut args = args.to_vec();
        args.extend(["--output", "json"]);
        serde_json::from_str(&self.ok(&args)).unwrap()
    }

    fn create(&self, topic: &str) {
        let spec = TopicSpec::parse(topic, "event_stream", 0).unwrap();
        self.runtime
            .block_on(Catalog::new(self.store.as_ref()).create_topic(&spec))
            .unwrap();
    }

    fn assign(&self, topic: &str, owner: u64, epoch: u64) {
        let name = TopicName::new(topic).unwrap();
        self.runtime
            .block_on(self.store.put(
                &cluster_keys::broker_assignment(owner, &name),
                json!({"epoch": epoch, "assigned_at_ms": 1, "reason": "new_topic"}),
            ))
            .unwrap();
        self.wait_until("assignment seen", |s| {
            s.clusters[0].owner(&name) == Some((owner, epoch))
        });
    }
}

#[test]
fn status_describe_move_and_rebalance() {
    let server = Server::start();
    server.create("/ns/a");
    assert!(
        server
            .ok(&["topics", "describe", "/ns/a"])
            .contains("\nOwner: unassigned\n")
    );
    server.assign("/ns/a", 2, 4);
    assert!(
        server
            .ok(&["topics", "describe", "/ns/a"])
            .contains("\nOwner: broker 2 (epoch 4)\n")
    );

    let status = server.ok(&["cluster", "status"]);
    let table: Vec<Vec<&str>> = status
        .lines()
        .skip_while(|l| *l != "Brokers:")
        .skip(2)
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(table.len(), 2, "{status}");
    assert_eq!(
        (table[0][0], table[0][1], table[0][2], table[0][3]),
        ("1", "127.0.0.1:7601", server.base.as_str(), "yes"),
        "{status}"
    );
    assert_eq!(
        (table[1][0], table[1][3], table[1][5], table[1][6]),
        ("2", "yes", "1", "active"),
        "{status}"
    );
    let lease_age: u64 = table[0][4].parse().unwrap();
    assert!(lease_age < 5000, "{status}");
    assert!(status.contains("LEASE AGE MS"), "{status}");
    let json = server.json(&["cluster", "status"]);
    assert_eq!(json["brokers"][1]["topics_owned"], json!(1));

    assert_eq!(
        server.ok(&["topics", "move", "/ns/a", "--to", "1"]),
        "moved /ns/a from broker 2 to broker 1 (epoch 5)\n"
    );
    let name = TopicName::new("/ns/a").unwrap();
    server.wait_until("move seen", |s| s.clusters[0].owner(&name) == Some((1, 5)));
    assert!(
        server
            .ok(&["topics", "describe", "/ns/a"])
            .contains("\nOwner: broker 1 (epoch 5)\n")
    );
    let refused = server.fails(&["topics", "move", "/ns/a", "--to", "9"]);
    assert!(
        refused.contains("broker 9 is not a live, active member of the cluster"),
        "{refused}"
    );
    // An admin URL without its scheme is refused naming the fix (it said
    // "http: invalid format").
    let refused = server.fails(&["--admin-url", "127.0.0.1:7400", "topics", "list"]);
    assert!(
        refused.contains("give the scheme: https://127.0.0.1:7400"),
        "{refused}"
    );
    // A negative TTL is named with its flag (clap took it for a flag).
    let refused = server.fails(&["edges", "token", "plant9", "--ttl", "-1h"]);
    assert!(
        refused.starts_with("error: invalid value '-1h' for '--ttl <TTL>'"),
        "{refused}"
    );
    // Node ids start at 1: 0 is refused before any request.
    let refused = server.fails(&["topics", "move", "/ns/a", "--to", "0"]);
    assert!(
        refused.contains("invalid value '0' for '--to <TO>'"),
        "{refused}"
    );

    for (i, t) in ["/ns/b", "/ns/c", "/ns/d"].iter().enumerate() {
        server.create(t);
        server.assign(t, 1, 1 + i as u64);
    }
    let dry = server.ok(&["cluster", "rebalance", "--dry-run"]);
    let planned: Vec<&str> = dry
        .lines()
        .filter(|l| l.starts_with("would move /ns/"))
        .collect();
    assert!(!planned.is_empty(), "{dry}");
    assert!(
        planned
            .iter()
            .all(|l| l.contains("from broker 1 to broker 2")),
        "{dry}"
    );
    assert!(dry.ends_with("would move (dry run)\n"), "{dry}");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(server.clusters[0].owned().len(), 4, "a dry run moved");
    // --max-moves 0 would say "balanced" while topics could move.
    let zero = server.fails(&["cluster", "rebalance", "--max-moves", "0"]);
    assert!(
        zero.contains("invalid value '0' for '--max-moves <MAX_MOVES>'"),
        "{zero}"
    );
    let real = server.ok(&["cluster", "rebalance", "--max-moves", "1"]);
    assert!(real.ends_with("1 topic(s) moved\n"), "{real}");
    server.wait_until("one topic on broker 2", |s| {
        s.clusters[1].owned().len() == 1
    });
}
