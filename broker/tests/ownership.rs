//! Topic ownership on the HTTP APIs: two brokers served in-process on
//! 127.0.0.1:0, each with its own topic WALs and its own
//! `Extension<Arc<Cluster>>` (lease renewed every 100 ms, `/cluster/*`
//! followed by a watch, topics opened under their ownership epoch and
//! closed when they move away) over one shared redb metadata store, driven by the
//! Rust consumer client (which follows redirects) and raw HTTP (which does
//! not). A third app without the extension shows the old behaviour.
//!
//! - a non-owner answers 307 to the owner for consumer requests and never
//!   creates a local log; 503 `no_owner` with `Retry-After` when the owner
//!   holds no lease; the storage API answers 409 `not_owner`;
//! - moves and rebalancing through the admin API, the owner in describe
//!   and the brokers in the cluster status;
//! - fencing: a stale owner's descriptor commit, unload `state`, cursor
//!   write and dead-letter copy are refused and write nothing.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use broker_core::catalog::{Catalog, TopicSpec};
use broker_core::clock::SystemClock;
use broker_core::metadata::MetadataStore;
use broker_core::metadata::redb::RedbStore;
use serde_json::{Value, json};
use tributary_api::consumer::{
    AttachRequest, NackRequest, PublishRecord, StartPosition, SubscriptionType,
};
use tributary_api::consumer_client::ConsumerClient;
use tributary_broker::admin::{AdminState, StaticClusterView, router};
use tributary_broker::cluster::{Cluster, ClusterConfig, Route};
use tributary_broker::consumer::{ConsumerConfig, ConsumerService};
use tributary_broker::replication::topics::TopicStore;
use tributary_broker::storage::{StorageError, UnloadOutcome, commit_descriptor, unload_step};
use tributary_proto::Limits;
use tributary_proto::archive::SegmentDescriptor;
use tributary_proto::cluster::Assignment;
use tributary_proto::keys::{StorageKeys, SubscriptionName, TopicName, cluster as cluster_keys};

const TOKEN: &str = "ownership-test-token";

struct Broker {
    id: u64,
    base: String,
    topics_dir: PathBuf,
    cluster: Option<Arc<Cluster>>,
    service: Arc<ConsumerService>,
    client: ConsumerClient,
}

struct Harness {
    runtime: tokio::runtime::Runtime,
    store: Arc<RedbStore>,
    brokers: Vec<Broker>,
    raw: ureq::Agent,
    _dir: tempfile::TempDir,
}

struct Reply {
    status: u16,
    location: Option<String>,
    retry_after: Option<String>,
    body: Value,
}

fn config() -> ConsumerConfig {
    ConsumerConfig {
        tick_ms: 50,
        policy_refresh_ms: 100,
        // Cursors are written only when a test says so (persist_all).
        cursor_persist_every_acks: 1_000_000,
        cursor_persist_interval_ms: 3_600_000,
        ..ConsumerConfig::default()
    }
}

impl Harness {
    /// Brokers 1 and 2 with ownership; broker 3 (index 2) without.
    fn start() -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let store =
            Arc::new(RedbStore::open(dir.path().join("meta.redb"), Arc::new(SystemClock)).unwrap());
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let mut brokers = Vec::new();
        for id in 1..=3u64 {
            let listener = runtime
                .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
                .unwrap();
            let base = format!("http://{}", listener.local_addr().unwrap());
            let topics_dir = dir.path().join(format!("broker-{id}")).join("topics");
            let store_dyn: Arc<dyn MetadataStore> = store.clone();
            let topics = Arc::new(TopicStore::new(
                topics_dir.clone(),
                store_dyn.clone(),
                Limits::default(),
            ));
            let state = AdminState {
                store: store_dyn.clone(),
                cluster: Arc::new(StaticClusterView::single_leader("127.0.0.1:7401", 1)),
                auth: tributary_broker::auth::AuthState::new(
                    store_dyn.clone(),
                    Some(TOKEN.to_owned()),
                ),
            };
            let cluster = (id < 3).then(|| {
                Cluster::new(
                    id,
                    store_dyn.clone(),
                    Arc::new(SystemClock),
                    ClusterConfig {
                        heartbeat_ms: 100,
                        ..ClusterConfig::new(format!("127.0.0.1:{}", 7600 + id), base.clone())
                    },
                )
            });
            let service = runtime.block_on(async {
                let service = ConsumerService::new(
                    topics.clone(),
                    store_dyn,
                    config(),
                    format!("127.0.0.1:740{id}"),
                    id,
                    Arc::new(SystemClock),
                );
                service.spawn_ticker();
                let mut app = tributary_broker::storage::with_local_segments(
                    router(state.clone()).merge(tributary_broker::consumer::http::router(
                        service.clone(),
                        state.auth.clone(),
                    )),
                    topics.clone(),
                );
                if let Some(cluster) = &cluster {
                    service.set_cluster(cluster.clone());
                    // As the broker's server wires it: topics opened under
                    // their ownership epoch, closed when it moves away.
                    topics.set_cluster(cluster.clone());
                    let (releasing, topics) = (cluster.clone(), topics.clone());
                    tokio::spawn(async move {
                        let mut changes = releasing.subscribe();
                        loop {
                            topics.release_lost().await;
                            if changes.changed().await.is_err() {
                                break;
                            }
                        }
                    });
                    tokio::spawn(tributary_broker::cluster::lease::run(cluster.clone()));
                    tokio::spawn(cluster.clone().follow());
                    app = app.layer(axum::Extension(cluster.clone()));
                }
                tokio::spawn(async move { axum::serve(listener, app).await });
                service
            });
            brokers.push(Broker {
                id,
                client: ConsumerClient::new(&base, TOKEN),
                base,
                topics_dir,
                cluster,
                service,
            });
        }
        let raw = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .max_redirects(0)
            .max_idle_connections(0)
            .max_idle_connections_per_host(0)
            .build()
            .into();
        let h = Harness {
            runtime,
            store,
            brokers,
            raw,
            _dir: dir,
        };
        h.wait_until("both leases are live", || {
            h.cluster(0).brokers().iter().filter(|b| b.live).count() == 2
                && h.cluster(1).brokers().iter().filter(|b| b.live).count() == 2
        });
        h
    }

    fn cluster(&self, index: usize) -> &Arc<Cluster> {
        self.brokers[index].cluster.as_ref().unwrap()
    }

    fn wait_until(&self, what: &str, mut condition: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !condition() {
            assert!(Instant::now() < deadline, "not within 10 s: {what}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn create_topic(&self, name: &str, intent: &str) {
        let spec = TopicSpec::parse(name, intent, 0).unwrap();
        self.runtime
            .block_on(Catalog::new(self.store.as_ref()).create_topic(&spec))
            .unwrap();
    }

    /// Writes broker `owner`'s assignment of `topic` at `epoch` and waits
    /// until both brokers route it accordingly.
    fn assign(&self, topic: &str, owner: u64, epoch: u64) {
        let name = TopicName::new(topic).unwrap();
        let assignment = Assignment {
            epoch,
            assigned_at_ms: broker_core::clock::now_ms() as u64,
            previous_owner: None,
            reason: "new_topic".into(),
        };
        self.runtime
            .block_on(self.store.put(
                &cluster_keys::broker_assignment(owner, &name),
                serde_json::to_value(assignment).unwrap(),
            ))
            .unwrap();
        self.wait_routed(topic, owner, epoch);
    }

    fn wait_routed(&self, topic: &str, owner: u64, epoch: u64) {
        let name = TopicName::new(topic).unwrap();
        self.wait_until(&format!("{topic} routed to broker {owner}"), || {
            (0..2).all(|i| match self.cluster(i).route(&name) {
                Route::Local { epoch: e } => self.brokers[i].id == owner && e == epoch,
                Route::Remote(o) => o.broker_id == owner && o.epoch == epoch,
                Route::Unassigned { .. } => false,
            })
        });
    }

    fn request(&self, broker: usize, method: &str, path: &str, body: Option<Value>) -> Reply {
        let builder = ureq::http::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.brokers[broker].base))
            .header("Authorization", format!("Bearer {TOKEN}"))
            .header("Content-Type", "application/json");
        let response = match body {
            Some(body) => self.raw.run(builder.body(body.to_string()).unwrap()),
            None => self.raw.run(builder.body(()).unwrap()),
        }
        .unwrap();
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .map(|v| v.to_str().unwrap().to_owned())
        };
        let (location, retry_after) = (header("location"), header("retry-after"));
        let status = response.status().as_u16();
        let text = response.into_body().read_to_string().unwrap();
        let body = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
        Reply {
            status,
            location,
            retry_after,
            body,
        }
    }

    /// Whether broker `index` has a local log directory for `topic`.
    fn has_log(&self, index: usize, topic: &str) -> bool {
        let name = TopicName::new(topic).unwrap();
        self.brokers[index]
            .topics_dir
            .join(name.namespace())
            .join(name.topic())
            .exists()
    }

    fn publish(&self, index: usize, topic: &str, values: &[&str]) -> (u64, u64) {
        let records = values
            .iter()
            .map(|v| PublishRecord {
                value: Some((*v).to_owned()),
                ..PublishRecord::default()
            })
            .collect();
        let r = self.brokers[index].client.publish(topic, records).unwrap();
        (r.base_offset, r.next_offset)
    }
}

const EVENTS: &str = "/ns/events";

#[test]
fn a_non_owner_redirects_consumers_and_creates_no_local_log() {
    let h = Harness::start();
    h.create_topic(EVENTS, "event_stream");
    // Before ownership (broker 3 has no cluster): a peek on a broker
    // without the log answers an empty topic and creates the log.
    let legacy = h.request(2, "GET", "/v1/topics/ns/events/records", None);
    assert_eq!(legacy.status, 200, "{}", legacy.body);
    assert_eq!(legacy.body["high_water_mark"], json!(0), "{}", legacy.body);
    assert!(h.has_log(2, EVENTS), "the defect: an empty local log");

    h.assign(EVENTS, 2, 1);
    let peek = h.request(
        0,
        "GET",
        "/v1/topics/ns/events/records?offset=0&max_messages=5",
        None,
    );
    assert_eq!(peek.status, 307, "{}", peek.body);
    assert_eq!(
        peek.location.as_deref(),
        Some(
            format!(
                "{}/v1/topics/ns/events/records?offset=0&max_messages=5",
                h.brokers[1].base
            )
            .as_str()
        )
    );
    assert_eq!(peek.body["kind"], json!("not_owner"));
    assert_eq!(
        (peek.body["owner"].clone(), peek.body["epoch"].clone()),
        (json!(2), json!(1))
    );
    assert_eq!(
        peek.body["error"],
        json!("topic /ns/events is owned by broker 2 (epoch 1)")
    );
    let attach = h.request(
        0,
        "POST",
        "/v1/topics/ns/events/subscriptions/s/attach",
        Some(json!({})),
    );
    assert_eq!(attach.status, 307, "{}", attach.body);
    assert!(!h.has_log(0, EVENTS), "a non-owner created a local log");

    // The Rust client follows: publish, attach, receive and ack through
    // broker 1 all land on broker 2.
    assert_eq!(h.publish(0, EVENTS, &["a", "b", "c"]), (0, 3));
    let client = &h.brokers[0].client;
    let consumer = client
        .attach(
            EVENTS,
            "s",
            &AttachRequest {
                subscription_type: SubscriptionType::Exclusive,
                start: StartPosition::Earliest,
                ..AttachRequest::default()
            },
        )
        .unwrap()
        .consumer_id;
    let got = client.receive(EVENTS, "s", consumer, 10, 2000).unwrap();
    let values: Vec<_> = got
        .messages
        .iter()
        .map(|m| (m.offset, m.value.clone().unwrap()))
        .collect();
    assert_eq!(
        values,
        vec![
            (0, "a".to_owned()),
            (1, "b".to_owned()),
            (2, "c".to_owned())
        ]
    );
    client.ack(EVENTS, "s", consumer, &[0, 1, 2]).unwrap();
    assert_eq!(client.state(EVENTS, "s").unwrap().cursor, 3);
    // What broker 2's own client sees is the same.
    let direct = h.brokers[1].client.peek(EVENTS, Some(0), 10).unwrap();
    assert_eq!(direct.messages.len(), 3);
    assert!(!h.has_log(0, EVENTS), "a non-owner created a local log");
    assert!(h.has_log(1, EVENTS));
}

#[test]
fn no_live_owner_is_503_with_retry_after_and_the_storage_api_is_409() {
    let h = Harness::start();
    h.create_topic(EVENTS, "event_stream");
    // Broker 9 owns it but holds no lease.
    let name = TopicName::new(EVENTS).unwrap();
    h.runtime
        .block_on(h.store.put(
            &cluster_keys::broker_assignment(9, &name),
            json!({"epoch": 4, "assigned_at_ms": 1, "reason": "new_topic"}),
        ))
        .unwrap();
    h.wait_until("broker 1 sees the assignment", || {
        h.cluster(0).owner(&name) == Some((9, 4))
    });
    let reply = h.request(0, "GET", "/v1/topics/ns/events/records", None);
    assert_eq!(reply.status, 503, "{}", reply.body);
    assert_eq!(reply.retry_after.as_deref(), Some("1"));
    assert_eq!(reply.body["kind"], json!("no_owner"));
    assert!(!h.has_log(0, EVENTS));

    h.runtime
        .block_on(h.store.delete(&cluster_keys::broker_assignment(9, &name)))
        .unwrap();
    h.assign(EVENTS, 2, 5);
    // The storage API: 409 not_owner on broker 1, never a redirect.
    for (method, path, body) in [
        ("POST", "/v1/storage/topics/ns/events/trim", None),
        ("POST", "/v1/storage/topics/ns/events/unload", None),
        (
            "POST",
            "/v1/storage/descriptors",
            Some(json!({
                "topic": EVENTS,
                "descriptor": descriptor(&StorageKeys::default(), &name),
            })),
        ),
    ] {
        let reply = h.request(0, method, path, body.clone());
        assert_eq!(reply.status, 409, "{path}: {}", reply.body);
        assert_eq!(reply.body["kind"], json!("not_owner"), "{path}");
        assert_eq!(reply.body["owner"], json!(2), "{path}");
        assert_eq!(reply.location, None);
    }
    // Listing descriptors answers anywhere, saying who owns the topic.
    let listed = h.request(0, "GET", "/v1/storage/topics/ns/events/segments", None);
    assert_eq!(listed.status, 200, "{}", listed.body);
    assert_eq!(
        (
            listed.body["owner"].clone(),
            listed.body["epoch"].clone(),
            listed.body["owned_here"].clone()
        ),
        (json!(2), json!(5), json!(false))
    );
    let listed = h.request(1, "GET", "/v1/storage/topics/ns/events/segments", None);
    assert_eq!(listed.body["owned_here"], json!(true));
}

#[test]
fn move_rebalance_describe_and_status() {
    let h = Harness::start();
    h.create_topic(EVENTS, "event_stream");
    h.assign(EVENTS, 2, 1);
    let described = h.request(0, "GET", "/v1/topics/ns/events", None);
    assert_eq!(
        (
            described.body["broker_id"].clone(),
            described.body["epoch"].clone()
        ),
        (json!(2), json!(1))
    );
    let status = h.request(0, "GET", "/v1/cluster/status", None);
    let brokers = status.body["brokers"].as_array().unwrap();
    let summary: Vec<(u64, bool, u64, String)> = brokers
        .iter()
        .map(|b| {
            (
                b["broker_id"].as_u64().unwrap(),
                b["live"].as_bool().unwrap(),
                b["topics_owned"].as_u64().unwrap(),
                b["admin_url"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        vec![
            (1, true, 0, h.brokers[0].base.clone()),
            (2, true, 1, h.brokers[1].base.clone())
        ]
    );
    assert!(brokers[0]["lease_age_ms"].as_u64().unwrap() < 5000);

    // A move asked of any broker; to a broker without a lease refused.
    let refused = h.request(
        0,
        "POST",
        "/v1/topics/ns/events/move",
        Some(json!({"to": 7})),
    );
    assert_eq!(
        (refused.status, refused.body["kind"].clone()),
        (409, json!("target_not_live")),
        "{}",
        refused.body
    );
    let moved = h.request(
        0,
        "POST",
        "/v1/topics/ns/events/move",
        Some(json!({"to": 1})),
    );
    assert_eq!(moved.status, 200, "{}", moved.body);
    assert_eq!(
        moved.body,
        json!({"topic": EVENTS, "from": 2, "to": 1, "epoch": 2})
    );
    h.wait_routed(EVENTS, 1, 2);
    let described = h.request(1, "GET", "/v1/topics/ns/events", None);
    assert_eq!(
        (
            described.body["broker_id"].clone(),
            described.body["epoch"].clone()
        ),
        (json!(1), json!(2))
    );
    let again = h.request(
        1,
        "POST",
        "/v1/topics/ns/events/move",
        Some(json!({"to": 1})),
    );
    assert_eq!(again.body["kind"], json!("already_there"), "{}", again.body);

    // Four topics on broker 1, none on 2: a dry run plans moves and
    // changes nothing; the real run carries them out.
    for (i, t) in ["/ns/a", "/ns/b", "/ns/c"].iter().enumerate() {
        h.create_topic(t, "event_stream");
        h.assign(t, 1, 1 + i as u64);
    }
    // Centrally written topics stay (a new owner would start at the
    // archive's end without what broker 1 has not archived): the
    // rebalance moved them and their acknowledged records were gone.
    for path in ["/v1/topics/ns/events/records", "/v1/topics/ns/a/records"] {
        let published = h.request(
            0,
            "POST",
            path,
            Some(json!({"records": [{"value": "kept"}]})),
        );
        assert_eq!(published.status, 200, "{path}: {}", published.body);
    }
    let dry = h.request(
        0,
        "POST",
        "/v1/cluster/rebalance",
        Some(json!({"dry_run": true})),
    );
    assert_eq!(dry.status, 200, "{}", dry.body);
    assert_eq!(dry.body["dry_run"], json!(true));
    let planned = dry.body["moves"].as_array().unwrap().clone();
    assert_eq!(planned.len(), 2, "{}", dry.body);
    assert!(
        planned
            .iter()
            .all(|m| m["topic"] != json!(EVENTS) && m["topic"] != json!("/ns/a")),
        "{}",
        dry.body
    );
    assert!(
        planned
            .iter()
            .all(|m| m["from"] == json!(1) && m["to"] == json!(2))
    );
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(h.cluster(0).owned().len(), 4, "a dry run moved something");
    let real = h.request(
        0,
        "POST",
        "/v1/cluster/rebalance",
        Some(json!({"max_moves": 1})),
    );
    assert_eq!(real.status, 200, "{}", real.body);
    assert_eq!(
        real.body["moves"].as_array().unwrap().len(),
        1,
        "{}",
        real.body
    );
    h.wait_until("one topic moved to broker 2", || {
        h.cluster(1).owned().len() == 1
    });
    // Without ownership the endpoints are not there.
    let legacy = h.request(2, "POST", "/v1/cluster/rebalance", Some(json!({})));
    assert_eq!(legacy.status, 501, "{}", legacy.body);
}

fn descriptor(keys: &StorageKeys, topic: &TopicName) -> SegmentDescriptor {
    SegmentDescriptor {
        start_offset: 0,
        end_offset: 9,
        record_count: 10,
        size: 1000 + 16 + 112,
        object_id: keys.segment_object(topic, 0, 9),
        format_version: tributary_proto::archive::FORMAT_VERSION,
        checksum_crc32c: 7,
        batches_crc32c: 8,
        batches_bytes: 1000,
        index_position: 1000,
        index_bytes: 16,
        first_timestamp_ms: 1,
        max_timestamp_ms: 2,
        created_at_ms: 3,
    }
}

#[test]
fn a_stale_owner_commits_no_descriptor_and_writes_no_state() {
    let h = Harness::start();
    h.create_topic(EVENTS, "event_stream");
    h.assign(EVENTS, 2, 1);
    let name = TopicName::new(EVENTS).unwrap();
    let keys = StorageKeys::default();
    let stale = h.cluster(1).fence(&name, 1).expect("broker 2 owns it at 1");
    assert!(h.cluster(1).fence(&name, 0).is_none(), "wrong epoch");
    assert!(h.cluster(0).fence(&name, 1).is_none(), "not the owner");
    h.runtime
        .block_on(h.cluster(0).move_topic_forced(&name, 1))
        .unwrap();
    h.wait_routed(EVENTS, 1, 2);
    let d = descriptor(&keys, &name);
    let refused = h
        .runtime
        .block_on(commit_descriptor(&*h.store, &keys, &name, &d, Some(&stale)));
    assert!(
        matches!(
            refused,
            Err(StorageError::Refused {
                kind: "not_owner",
                ..
            })
        ),
        "{refused:?}"
    );
    let unload = h.runtime.block_on(unload_step(
        &*h.store,
        &keys,
        &name,
        None,
        2,
        1,
        Some(&stale),
    ));
    assert!(
        matches!(
            unload,
            Err(StorageError::Refused {
                kind: "not_owner",
                ..
            })
        ),
        "{unload:?}"
    );
    let written = h.runtime.block_on(async {
        (
            h.store
                .get(&keys.segment_descriptor(&name, 0))
                .await
                .unwrap(),
            h.store.get(&keys.segments_cur(&name)).await.unwrap(),
            h.store.get(&keys.topic_state(&name)).await.unwrap(),
        )
    });
    assert_eq!(written, (None, None, None), "a stale owner wrote");
    // The new owner's fence commits.
    let fresh = h.cluster(0).fence(&name, 2).unwrap();
    let committed = h
        .runtime
        .block_on(commit_descriptor(&*h.store, &keys, &name, &d, Some(&fresh)))
        .unwrap();
    assert_eq!(committed.1.tiered_offset, Some(10));
    let unloaded = h
        .runtime
        .block_on(unload_step(
            &*h.store,
            &keys,
            &name,
            Some(10),
            1,
            1,
            Some(&fresh),
        ))
        .unwrap();
    assert!(matches!(unloaded, UnloadOutcome::Unloaded(ref s) if s.next_offset == 10));
}

/// Attaches a consumer to subscription `s` of [`EVENTS`] from earliest.
fn attach_earliest(client: &ConsumerClient) -> tributary_api::consumer::AttachResponse {
    client
        .attach(
            EVENTS,
            "s",
            &AttachRequest {
                start: StartPosition::Earliest,
                ..AttachRequest::default()
            },
        )
        .unwrap()
}

#[test]
fn a_stale_owner_writes_no_cursor() {
    let h = Harness::start();
    h.create_topic(EVENTS, "event_stream");
    h.assign(EVENTS, 2, 1);
    assert_eq!(h.publish(1, EVENTS, &["a", "b", "c"]), (0, 3));
    let client = &h.brokers[1].client;
    let consumer = attach_earliest(client).consumer_id;
    let got = client.receive(EVENTS, "s", consumer, 10, 2000).unwrap();
    assert_eq!(got.messages.len(), 3);
    client.ack(EVENTS, "s", consumer, &[0, 1]).unwrap();
    let name = TopicName::new(EVENTS).unwrap();
    let cursor_key = tributary_proto::keys::topics::subscription_cursor(
        &name,
        &SubscriptionName::new("s").unwrap(),
    );
    let cursor = || h.runtime.block_on(h.store.get(&cursor_key)).unwrap();
    assert_eq!(cursor(), Some(json!(0)), "written at creation only");
    // While it owns the topic, broker 2 persists the cursor.
    h.runtime.block_on(h.brokers[1].service.persist_all());
    assert_eq!(cursor(), Some(json!(2)));
    client.ack(EVENTS, "s", consumer, &[2]).unwrap();
    // Someone else wrote the cursor meanwhile (as the new owner's seek or
    // progress would): the old owner's hand-off compares with the 2 it
    // wrote and leaves it alone.
    h.runtime
        .block_on(h.store.put(&cursor_key, json!(1)))
        .unwrap();
    h.runtime
        .block_on(h.cluster(0).move_topic_forced(&name, 1))
        .unwrap();
    h.wait_routed(EVENTS, 1, 2);
    // Several ticks of the old owner (50 ms each), then a persist: its
    // cursor (3) is written nowhere.
    std::thread::sleep(Duration::from_millis(500));
    h.runtime.block_on(h.brokers[1].service.persist_all());
    assert_eq!(cursor(), Some(json!(1)), "a stale owner wrote the cursor");
}

#[test]
fn a_topic_that_moves_away_hands_its_acknowledged_progress_over() {
    let h = Harness::start();
    h.create_topic(EVENTS, "event_stream");
    h.assign(EVENTS, 2, 1);
    assert_eq!(h.publish(1, EVENTS, &["a", "b", "c", "d", "e"]), (0, 5));
    let client = &h.brokers[1].client;
    let consumer = attach_earliest(client).consumer_id;
    let got = client.receive(EVENTS, "s", consumer, 10, 2000).unwrap();
    assert_eq!(got.messages.len(), 5);
    // 3 stays leased: 4 is finished above the cursor.
    client.ack(EVENTS, "s", consumer, &[0, 1, 2, 4]).unwrap();
    let name = TopicName::new(EVENTS).unwrap();
    let cursor_key = tributary_proto::keys::topics::subscription_cursor(
        &name,
        &SubscriptionName::new("s").unwrap(),
    );
    let cursor = || h.runtime.block_on(h.store.get(&cursor_key)).unwrap();
    assert_eq!(cursor(), Some(json!(0)), "batched: not written yet");
    // Moved away by another broker (a rebalance, a takeover): within a
    // tick the old owner stores the 3 it acknowledged, its session ends.
    h.runtime
        .block_on(h.cluster(0).move_topic_forced(&name, 1))
        .unwrap();
    h.wait_routed(EVENTS, 1, 2);
    let deadline = Instant::now() + Duration::from_secs(10);
    while cursor() != Some(json!(3)) {
        assert!(Instant::now() < deadline, "not handed over: {:?}", cursor());
        std::thread::sleep(Duration::from_millis(20));
    }
    // And what it finished above the cursor, so the new owner does not
    // deliver 4 again (the trial: 59 acknowledged messages redelivered
    // after a move).
    let acked_key = tributary_proto::keys::topics::subscription_acked(
        &name,
        &SubscriptionName::new("s").unwrap(),
    );
    assert_eq!(
        h.runtime.block_on(h.store.get(&acked_key)).unwrap(),
        Some(json!({"cursor": 3, "ranges": [[4, 5]]}))
    );
    assert!(client.receive(EVENTS, "s", consumer, 10, 0).is_err());
}

#[test]
fn a_dead_letter_copy_to_a_topic_owned_elsewhere_is_not_written() {
    const JOBS: &str = "/ns/jobs";
    const DLQ: &str = "/ns/jobs-dlq";
    let h = Harness::start();
    h.create_topic(JOBS, "task_queue");
    h.assign(JOBS, 2, 1);
    // The dead-letter topic belongs to broker 1.
    h.assign(DLQ, 1, 1);
    let client = &h.brokers[1].client;
    let consumer = client
        .attach(
            JOBS,
            "workers",
            &AttachRequest {
                subscription_type: SubscriptionType::Shared,
                start: StartPosition::Earliest,
                ..AttachRequest::default()
            },
        )
        .unwrap()
        .consumer_id;
    let patch = h.request(
        1,
        "PATCH",
        "/v1/topics/ns/jobs/subscriptions/workers/failure-policy",
        Some(json!({"max_redelivery_count": 0, "base_redelivery_delay_ms": 10})),
    );
    assert_eq!(patch.status, 200, "{}", patch.body);
    std::thread::sleep(Duration::from_millis(300)); // policy refresh
    assert_eq!(h.publish(1, JOBS, &["poison"]), (0, 1));
    let got = client.receive(JOBS, "workers", consumer, 1, 3000).unwrap();
    assert_eq!(got.messages[0].offset, 0);
    client
        .nack(
            JOBS,
            "workers",
            &NackRequest {
                consumer_id: consumer,
                offsets: vec![0],
                delay_ms: None,
                reason: Some("bad".into()),
            },
        )
        .unwrap();
    // Several ticks later: nothing written to a local dead-letter log, and
    // the message is not finished (the cursor stays at 0).
    std::thread::sleep(Duration::from_millis(500));
    assert!(!h.has_log(1, DLQ), "a dead-letter copy went to a local log");
    assert!(!h.has_log(0, DLQ));
    assert_eq!(client.state(JOBS, "workers").unwrap().cursor, 0);
    // Once broker 2 owns the dead-letter topic the copy is made.
    let dlq = TopicName::new(DLQ).unwrap();
    h.runtime
        .block_on(h.cluster(0).move_topic_forced(&dlq, 2))
        .unwrap();
    h.wait_routed(DLQ, 2, 2);
    h.wait_until("the copy is made and the message finished", || {
        client.state(JOBS, "workers").unwrap().cursor == 1
    });
    // Read through broker 1: redirected to broker 2.
    let copied = h.brokers[0].client.peek(DLQ, Some(0), 10).unwrap();
    assert_eq!(copied.messages.len(), 1);
    assert_eq!(copied.messages[0].value.as_deref(), Some("poison"));
    assert!(h.has_log(1, DLQ) && !h.has_log(0, DLQ));
}

#[test]
fn a_stored_cursor_past_the_high_water_mark_is_clamped_on_attach() {
    let h = Harness::start();
    h.create_topic(EVENTS, "event_stream");
    h.assign(EVENTS, 1, 1);
    assert_eq!(h.publish(0, EVENTS, &["a", "b"]), (0, 2));
    // A durable subscription whose stored cursor is past the log (the old
    // owner acknowledged records this owner never had).
    let name = TopicName::new(EVENTS).unwrap();
    let sub = SubscriptionName::new("s").unwrap();
    h.runtime.block_on(async {
        h.store
            .put(
                &tributary_proto::keys::topics::subscription(&name, &sub),
                json!({"type": "exclusive", "durable": true, "paused": false, "created_ms": 1}),
            )
            .await
            .unwrap();
        h.store
            .put(
                &tributary_proto::keys::topics::subscription_cursor(&name, &sub),
                json!(40),
            )
            .await
            .unwrap();
    });
    let client = &h.brokers[0].client;
    let attached = client
        .attach(
            EVENTS,
            "s",
            &AttachRequest {
                subscription_type: SubscriptionType::Exclusive,
                ..AttachRequest::default()
            },
        )
        .unwrap();
    assert_eq!(attached.cursor, 2, "clamped to the high-water mark");
    assert_eq!(h.publish(0, EVENTS, &["c"]), (2, 3));
    let got = client
        .receive(EVENTS, "s", attached.consumer_id, 10, 2000)
        .unwrap();
    let offsets: Vec<u64> = got.messages.iter().map(|m| m.offset).collect();
    assert_eq!(offsets, vec![2], "the record appended next is delivered");
}

/// A topic that moves away and back comes back as a new log (the takeover
/// starts it at the archive's end): the subscription loaded before must
/// not keep reading the old, closed WAL handle (it would never see another
/// record). Its consumers are told to attach again, and the next attach
/// resumes at the stored cursor on the new log.
#[test]
fn a_subscription_follows_its_topic_back_after_a_move() {
    let h = Harness::start();
    h.create_topic(EVENTS, "event_stream");
    h.assign(EVENTS, 2, 1);
    let values: Vec<String> = (0..10).map(|i| format!("a{i}")).collect();
    let values: Vec<&str> = values.iter().map(String::as_str).collect();
    assert_eq!(h.publish(1, EVENTS, &values), (0, 10));
    let client = &h.brokers[1].client;
    let consumer = attach_earliest(client).consumer_id;
    let got = client.receive(EVENTS, "s", consumer, 20, 2000).unwrap();
    let offsets: Vec<u64> = got.messages.iter().map(|m| m.offset).collect();
    assert_eq!(offsets, (0..10).collect::<Vec<u64>>());
    client.ack(EVENTS, "s", consumer, &offsets[..6]).unwrap();
    h.runtime.block_on(h.brokers[1].service.persist_all());
    // Acknowledged, not yet persisted when the topic moves away.
    client.ack(EVENTS, "s", consumer, &[6, 7]).unwrap();
    // The tier service archived 0..=9 (so a takeover starts at 10).
    let name = TopicName::new(EVENTS).unwrap();
    let keys = StorageKeys::default();
    let cursor_key = tributary_proto::keys::topics::subscription_cursor(
        &name,
        &SubscriptionName::new("s").unwrap(),
    );
    let stored = || h.runtime.block_on(h.store.get(&cursor_key)).unwrap();
    assert_eq!(stored(), Some(json!(6)));
    let fence = h.cluster(1).fence(&name, 1).unwrap();
    h.runtime
        .block_on(commit_descriptor(
            &*h.store,
            &keys,
            &name,
            &descriptor(&keys, &name),
            Some(&fence),
        ))
        .unwrap();
    // Away to broker 1 (epoch 2) and back to broker 2 (epoch 3).
    h.runtime
        .block_on(h.cluster(0).move_topic_forced(&name, 1))
        .unwrap();
    h.wait_routed(EVENTS, 1, 2);
    // Broker 1's consumers finished the subscription meanwhile.
    h.runtime
        .block_on(h.store.put(&cursor_key, json!(10)))
        .unwrap();
    h.runtime
        .block_on(h.cluster(0).move_topic_forced(&name, 2))
        .unwrap();
    h.wait_routed(EVENTS, 2, 3);
    // Broker 2 owns the topic again, but what it still holds of the
    // subscription is from epoch 1: its cursor (8) is not written over the
    // newer one.
    h.runtime.block_on(h.brokers[1].service.persist_all());
    assert_eq!(stored(), Some(json!(10)), "a stale subscription wrote");
    // Broker 2 reserved offsets up to 10 + RESERVE_AHEAD at epoch 1 (the
    // archive holds 0..10): a takeover cannot tell the unused ones from
    // lost ones, so they are a declared hole and offsets continue after it.
    let next = 10 + tributary_broker::replication::topics::RESERVE_AHEAD;
    assert_eq!(h.publish(1, EVENTS, &["b"]), (next, next + 1));
    let stale = client.receive(EVENTS, "s", consumer, 20, 2000);
    match stale {
        Err(tributary_api::client::ClientError::Api {
            status, message, ..
        }) => {
            // "attach again", or "attach first" once the ticker unloaded it.
            assert_eq!(status, 404, "{message}");
            assert!(message.contains("attach"), "{message}");
        }
        other => panic!("the old session read the closed log: {other:?}"),
    }
    let again = attach_earliest(client);
    assert_eq!(again.cursor, 10, "the stored cursor");
    assert_eq!(again.high_water_mark, next + 1);
    // The hole first (one gap notice), then the record after it.
    let mut got = Vec::new();
    let mut gaps = Vec::new();
    for _ in 0..3 {
        let read = client
            .receive(EVENTS, "s", again.consumer_id, 20, 2000)
            .unwrap();
        gaps.extend(read.gaps.iter().map(|g| (g.first_offset, g.end_offset)));
        got.extend(read.messages.iter().map(|m| (m.offset, m.value.clone())));
        if !got.is_empty() {
            break;
        }
    }
    assert_eq!(gaps, vec![(10, next)]);
    assert_eq!(got, vec![(next, Some("b".to_owned()))]);
}

/// A keyed central publish (`Idempotency-Key`) through broker `index`:
/// its answer's offsets.
fn publish_keyed(h: &Harness, index: usize, key: &str, values: &[&str]) -> (u64, u64) {
    let records: Vec<Value> = values.iter().map(|v| json!({"value": v})).collect();
    let request = ureq::http::Request::builder()
        .method("POST")
        .uri(format!(
            "{}/v1/topics/ns/events/records",
            h.brokers[index].base
        ))
        .header("Authorization", format!("Bearer {TOKEN}"))
        .header("Content-Type", "application/json")
        .header("Idempotency-Key", key)
        .body(json!({ "records": records }).to_string())
        .unwrap();
    let response = h.raw.run(request).unwrap();
    let status = response.status().as_u16();
    let text = response.into_body().read_to_string().unwrap();
    assert_eq!(status, 200, "{text}");
    let body: Value = serde_json::from_str(&text).unwrap();
    (
        body["base_offset"].as_u64().unwrap(),
        body["next_offset"].as_u64().unwrap(),
    )
}

/// The owner of a centrally written topic is lost before the archive has
/// its tail (here: a forced move; in the trial a SIGKILL outlasting the
/// lease): the new owner starts at the archive's end but must not hand the
/// lost offsets out again, to other records (a consumer that read offset 1
/// would find another record there), and a retry of a keyed publish whose
/// records were lost is stored again at new offsets, not answered with the
/// lost ones (the trial: "200 base 1812" for offsets then holding another
/// request's records).
#[test]
fn a_new_owner_of_a_central_topic_hands_no_offset_out_twice() {
    use tributary_broker::replication::topics::RESERVE_AHEAD;
    let h = Harness::start();
    h.create_topic(EVENTS, "event_stream");
    h.assign(EVENTS, 1, 1);
    assert_eq!(publish_keyed(&h, 0, "k1", &["a", "b"]), (0, 2));
    assert_eq!(h.publish(0, EVENTS, &["c"]), (2, 3));
    let name = TopicName::new(EVENTS).unwrap();
    h.runtime
        .block_on(h.cluster(0).move_topic_forced(&name, 2))
        .unwrap();
    h.wait_routed(EVENTS, 2, 2);
    // Nothing was archived: 0..3 are lost with broker 1's copy, and what
    // broker 1 had reserved is not handed out again. The retry of k1
    // first, before anything opened the topic at its new owner: stored
    // again, past the hole.
    let reserved = 2 + RESERVE_AHEAD;
    let again = publish_keyed(&h, 1, "k1", &["a", "b"]);
    assert_eq!(again, (reserved, reserved + 2));
    assert_eq!(h.publish(1, EVENTS, &["d"]), (reserved + 2, reserved + 3));
    let read = h.brokers[1].client.peek(EVENTS, Some(0), 10).unwrap();
    let got: Vec<(u64, Option<String>)> = read
        .messages
        .iter()
        .map(|m| (m.offset, m.value.clone()))
        .collect();
    assert_eq!(
        got,
        vec![
            (reserved, Some("a".to_owned())),
            (reserved + 1, Some("b".to_owned())),
            (reserved + 2, Some("d".to_owned()))
        ]
    );
    let gaps: Vec<(u64, u64)> = read
        .gaps
        .iter()
        .map(|g| (g.first_offset, g.end_offset))
        .collect();
    assert_eq!(gaps, vec![(0, reserved)], "{:?}", read.gaps);
    // From then on k1 is answered with its new offsets.
    assert_eq!(publish_keyed(&h, 1, "k1", &["a", "b"]), again);
}

/// A drain (SIGTERM) keeps a topic whose dead-letter topic stays on the
/// broker (centrally written): moved alone, the restart left the pair
/// apart for good and poison messages waited (the trial of the fixes).
#[test]
fn a_drain_keeps_a_topic_with_its_centrally_written_dead_letter_topic() {
    let h = Harness::start();
    for (topic, intent) in [
        ("/ns/jobs", "task_queue"),
        ("/ns/jobs-dlq", "event_stream"),
        ("/ns/other", "event_stream"),
    ] {
        h.create_topic(topic, intent);
        h.assign(topic, 1, 1);
    }
    assert_eq!(h.publish(0, "/ns/jobs-dlq", &["copy"]), (0, 1));
    let moved = h.runtime.block_on(h.cluster(0).drain()).unwrap();
    assert_eq!(moved, 1, "only /ns/other");
    h.wait_routed("/ns/other", 2, 2);
    for kept in ["/ns/jobs", "/ns/jobs-dlq"] {
        let name = TopicName::new(kept).unwrap();
        assert_eq!(h.cluster(1).owner(&name), Some((1, 1)), "{kept}");
    }
}
