//! The consumer HTTP API over a real socket: the admin router merged with
//! the consumer router, served on 127.0.0.1:0 over real topic WALs and a
//! redb metadata store, driven by the Rust consumer client
//! (`tributary_api::consumer_client`) and raw HTTP for malformed input.
//!
//! Multi-process tests (a SIGKILLed consumer process, a broker restart) are
//! in `tests/tests/consumers.rs`.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use broker_core::catalog::{Catalog, TopicSpec};
use broker_core::metadata::MetadataStore;
use broker_core::metadata::redb::RedbStore;

use broker_core::clock::{Clock, ManualClock, SystemClock};
use serde_json::{Value, json};
use tributary_api::admin::PolicySource;
use tributary_api::consumer::{
    AttachRequest, NackRequest, PublishRecord, SeekRequest, StartPosition, SubscriptionType,
};
use tributary_api::consumer_client::{ClientError, ConsumerClient};
use tributary_broker::admin::{AdminState, StaticClusterView, router};
use tributary_broker::consumer::{ConsumerConfig, ConsumerService};
use tributary_broker::replication::topics::TopicStore;
use tributary_proto::Limits;
use tributary_proto::intent::PoisonPolicy;
use tributary_proto::keys::{SubscriptionName, TopicName};
use tributary_test_support::loop_fs::LoopFs;

const TOKEN: &str = "consumer-test-token";
const BROKER_ADDR: &str = "127.0.0.1:7400";

struct Harness {
    runtime: tokio::runtime::Runtime,
    store: Arc<RedbStore>,
    base: String,
    client: ConsumerClient,
    raw: ureq::Agent,
    /// The small filesystem under `topics/`, if any (unmounted before the
    /// directory is removed: fields drop in order, the runtime first).
    loop_fs: Option<LoopFs>,
    _dir: tempfile::TempDir,
}

/// One byte of a topic's WAL segment file, flipped by a test and put back.
struct Flip {
    path: std::path::PathBuf,
    position: u64,
    original: u8,
}

impl Flip {
    /// Flips the byte at `position` of the first segment of `topic`.
    fn at(h: &Harness, topic: &str, position: u64) -> Flip {
        let name = TopicName::new(topic).unwrap();
        let dir = h
            ._dir
            .path()
            .join("topics")
            .join(name.namespace())
            .join(name.topic());
        let path = dir.join(format!("{:020}.log", 0));
        let mut bytes = std::fs::read(&path).unwrap();
        let index = usize::try_from(position).unwrap();
        let original = bytes[index];
        bytes[index] ^= 0xff;
        write_in_place(&path, &bytes);
        Flip {
            path,
            position,
            original,
        }
    }

    /// Puts the original byte back (the range heals).
    fn restore(&self) {
        let mut bytes = std::fs::read(&self.path).unwrap();
        bytes[usize::try_from(self.position).unwrap()] = self.original;
        write_in_place(&self.path, &bytes);
    }
}

fn write_in_place(path: &std::path::Path, bytes: &[u8]) {
    use std::io::{Seek, Write};
    let mut file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    file.seek(std::io::SeekFrom::Start(0)).unwrap();
    file.write_all(bytes).unwrap();
    file.sync_data().unwrap();
}

struct Reply {
    status: u16,
    body: Value,
}

impl Harness {
    fn start(config: ConsumerConfig) -> Harness {
        Harness::start_with_clock(config, Arc::new(SystemClock))
    }

    /// As [`Harness::start`], the consumer service timed by `clock`.
    fn start_with_clock(config: ConsumerConfig, clock: Arc<dyn Clock>) -> Harness {
        Harness::start_with(config, clock, None)
    }

    /// As [`Harness::start`], with the topic WALs on a loop-mounted ext4
    /// of `bytes` (root only; fails without mkfs.ext4 and losetup).
    fn start_on_small_disk(config: ConsumerConfig, bytes: u64) -> Harness {
        Harness::start_with(config, Arc::new(SystemClock), Some(bytes))
    }

    fn start_with(
        config: ConsumerConfig,
        clock: Arc<dyn Clock>,
        small_disk_bytes: Option<u64>,
    ) -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let loop_fs = small_disk_bytes
            .map(|bytes| LoopFs::create_at(dir.path(), bytes, &dir.path().join("topics")));
        let store =
            Arc::new(RedbStore::open(dir.path().join("meta.redb"), Arc::new(SystemClock)).unwrap());
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let topics = Arc::new(TopicStore::new(
            dir.path().join("topics"),
            store.clone(),
            Limits::default(),
        ));
        let state = AdminState {
            store: store.clone(),
            cluster: Arc::new(StaticClusterView::single_leader("127.0.0.1:7401", 1)),
            auth: tributary_broker::auth::AuthState::new(store.clone(), Some(TOKEN.to_owned())),
        };
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let store_dyn: Arc<dyn MetadataStore> = store.clone();
        runtime.block_on(async {
            let service =
                ConsumerService::new(topics, store_dyn, config, BROKER_ADDR.to_owned(), 1, clock);
            service.spawn_ticker();
            let app = router(state.clone()).merge(tributary_broker::consumer::http::router(
                service,
                state.auth.clone(),
            ));
            tokio::spawn(async move { axum::serve(listener, app).await });
        });
        let raw = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .max_idle_connections(0)
            .max_idle_connections_per_host(0)
            .build()
            .into();
        Harness {
            runtime,
            store,
            client: ConsumerClient::new(&base, TOKEN),
            base,
            raw,
            loop_fs,
            _dir: dir,
        }
    }

    fn create_topic(&self, name: &str, intent: &str) {
        let spec = TopicSpec::parse(name, intent, 0).unwrap();
        self.runtime
            .block_on(Catalog::new(self.store.as_ref()).create_topic(&spec))
            .unwrap();
    }

    fn publish(&self, topic: &str, values: &[&str]) -> (u64, u64) {
        let records = values
            .iter()
            .map(|v| PublishRecord {
                value: Some((*v).to_owned()),
                ..PublishRecord::default()
            })
            .collect();
        let r = self.client.publish(topic, records).unwrap();
        (r.base_offset, r.next_offset)
    }

    fn request(&self, method: &str, path: &str, token: Option<&str>, body: Option<&str>) -> Reply {
        let mut builder = ureq::http::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base));
        if let Some(token) = token {
            builder = builder.header("Authorization", format!("Bearer {token}"));
        }
        let response = match body {
            Some(body) => self.raw.run(builder.body(body.to_owned()).unwrap()),
            None => self.raw.run(builder.body(()).unwrap()),
        }
        .unwrap();
        let status = response.status().as_u16();
        let text = response.into_body().read_to_string().unwrap();
        let body = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
        Reply { status, body }
    }

    fn patch_policy(&self, topic: &str, sub: &str, patch: Value) {
        let reply = self.request(
            "PATCH",
            &format!("/v1/topics{topic}/subscriptions/{sub}/failure-policy"),
            Some(TOKEN),
            Some(&patch.to_string()),
        );
        assert_eq!(reply.status, 200, "{}", reply.body);
    }

    fn attach(&self, topic: &str, sub: &str, kind: SubscriptionType) -> u64 {
        let request = AttachRequest {
            subscription_type: kind,
            start: StartPosition::Earliest,
            ..AttachRequest::default()
        };
        self.client
            .attach(topic, sub, &request)
            .unwrap()
            .consumer_id
    }
}

fn fast() -> ConsumerConfig {
    ConsumerConfig {
        tick_ms: 50,
        policy_refresh_ms: 100,
        ..ConsumerConfig::default()
    }
}

fn api_status(result: Result<impl std::fmt::Debug, ClientError>) -> (u16, String) {
    match result {
        Err(ClientError::Api { status, kind, .. }) => (status, kind),
        other => panic!("expected an API error, got {other:?}"),
    }
}

const JOBS: &str = "/default/jobs";

#[test]
fn task_queue_subscription_inherits_5_and_1000_ms_and_an_override_survives_a_new_consumer() {
    let h = Harness::start(fast());
    h.create_topic(JOBS, "task_queue");
    let first = h
        .client
        .attach(JOBS, "workers", &AttachRequest::default())
        .unwrap();
    assert!(first.created);
    assert_eq!(first.policy_source, PolicySource::Intent);
    assert_eq!(first.failure_policy.max_redelivery_count, 5);
    assert_eq!(first.failure_policy.base_redelivery_delay_ms, 1000);
    assert_eq!(first.failure_policy.ack_timeout_ms, 30_000);
    assert_eq!(first.failure_policy.poison_policy, PoisonPolicy::DeadLetter);
    assert_eq!(
        first.failure_policy.dead_letter_topic.as_deref(),
        Some("/default/jobs-dlq")
    );
    // Persisted at the seed's key on first attach.
    let topic = TopicName::new(JOBS).unwrap();
    let name = SubscriptionName::new("workers").unwrap();
    let stored = h
        .runtime
        .block_on(
            h.store
                .get(&tributary_proto::keys::topics::subscription_failure_policy(
                    &topic, &name,
                )),
        )
        .unwrap()
        .unwrap();
    assert_eq!(stored["max_redelivery_count"], 5);

    h.patch_policy(
        JOBS,
        "workers",
        json!({"max_redelivery_count": 8, "base_redelivery_delay_ms": 250}),
    );
    let second = h
        .client
        .attach(JOBS, "workers", &AttachRequest::default())
        .unwrap();
    assert!(!second.created);
    assert_eq!(second.policy_source, PolicySource::Stored);
    assert_eq!(second.failure_policy.max_redelivery_count, 8);
    assert_eq!(second.failure_policy.base_redelivery_delay_ms, 250);
    let state = h.client.state(JOBS, "workers").unwrap();
    assert_eq!(state.failure_policy.max_redelivery_count, 8);
    assert_eq!(state.consumers.len(), 2);
}

#[test]
fn shared_subscription_with_three_consumers_acks_each_message_once_and_a_timed_out_lease_goes_to_another()
 {
    let h = Harness::start(fast());
    h.create_topic(JOBS, "task_queue");
    let values: Vec<String> = (0..300).map(|i| format!("job-{i}")).collect();
    let refs: Vec<&str> = values.iter().map(String::as_str).collect();
    assert_eq!(h.publish(JOBS, &refs), (0, 300));
    let consumers: Vec<u64> = (0..3)
        .map(|_| h.attach(JOBS, "pool", SubscriptionType::Shared))
        .collect();
    let handles: Vec<_> = consumers
        .iter()
        .map(|&id| {
            let client = h.client.clone();
            std::thread::spawn(move || {
                let mut acked = Vec::new();
                let deadline = Instant::now() + Duration::from_secs(30);
                let mut empty = 0;
                while empty < 3 && Instant::now() < deadline {
                    let batch = client.receive(JOBS, "pool", id, 7, 200).unwrap();
                    if batch.messages.is_empty() {
                        empty += 1;
                        continue;
                    }
                    empty = 0;
                    for m in &batch.messages {
                        assert_eq!(
                            m.value.as_deref(),
                            Some(format!("job-{}", m.offset).as_str())
                        );
                        assert_eq!(m.attempt, 1);
                    }
                    let offsets: Vec<u64> = batch.messages.iter().map(|m| m.offset).collect();
                    let r = client.ack(JOBS, "pool", id, &offsets).unwrap();
                    assert!(r.no_op.is_empty());
                    acked.extend(r.acked);
                }
                acked
            })
        })
        .collect();
    let per_consumer: Vec<Vec<u64>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let mut all: Vec<u64> = per_consumer.iter().flatten().copied().collect();
    all.sort_unstable();
    assert_eq!(
        all,
        (0..300).collect::<Vec<u64>>(),
        "each message acknowledged exactly once"
    );
    assert!(
        per_consumer.iter().filter(|v| !v.is_empty()).count() >= 2,
        "work was shared"
    );
    assert_eq!(h.client.state(JOBS, "pool").unwrap().cursor, 300);

    // Ack timeout: consumer 0 leases and never acks; consumer 1 gets it.
    h.patch_policy(
        JOBS,
        "pool",
        json!({"ack_timeout_ms": 500, "base_redelivery_delay_ms": 100}),
    );
    std::thread::sleep(Duration::from_millis(400)); // policy refresh
    assert_eq!(h.publish(JOBS, &["slow"]), (300, 301));
    let leased = h
        .client
        .receive(JOBS, "pool", consumers[0], 1, 2000)
        .unwrap();
    assert_eq!(leased.messages[0].offset, 300);
    let started = Instant::now();
    let again = h
        .client
        .receive(JOBS, "pool", consumers[1], 1, 5000)
        .unwrap();
    assert_eq!(again.messages.len(), 1);
    assert_eq!(
        (again.messages[0].offset, again.messages[0].attempt),
        (300, 2)
    );
    assert!(started.elapsed() >= Duration::from_millis(500));
    // The first consumer lost the lease: its ack is refused.
    let (status, kind) = api_status(h.client.ack(JOBS, "pool", consumers[0], &[300]));
    assert_eq!((status, kind.as_str()), (409, "not_leased"));
    let r = h.client.ack(JOBS, "pool", consumers[1], &[300]).unwrap();
    assert_eq!((r.acked, r.cursor), (vec![300], 301));
}

#[test]
fn dead_letter_copies_with_exact_headers_and_replay_brings_it_back() {
    let h = Harness::start(fast());
    h.create_topic(JOBS, "task_queue");
    let consumer = h.attach(JOBS, "workers", SubscriptionType::Shared);
    h.patch_policy(
        JOBS,
        "workers",
        json!({"max_redelivery_count": 1, "base_redelivery_delay_ms": 10}),
    );
    // Attaching again applies the stored override at once.
    let consumer2 = h.attach(JOBS, "workers", SubscriptionType::Shared);
    let mut headers = BTreeMap::new();
    headers.insert("trace".to_owned(), "abc".to_owned());
    let r = h
        .client
        .publish(
            JOBS,
            vec![PublishRecord {
                value: Some("poison".into()),
                key: Some("k1".into()),
                headers,
                ..PublishRecord::default()
            }],
        )
        .unwrap();
    assert_eq!((r.base_offset, r.next_offset), (0, 1));
    let nack = |attempt: u32| {
        let got = h
            .client
            .receive(JOBS, "workers", consumer, 1, 3000)
            .unwrap();
        assert_eq!(
            (got.messages[0].offset, got.messages[0].attempt),
            (0, attempt)
        );
        h.client
            .nack(
                JOBS,
                "workers",
                &NackRequest {
                    consumer_id: consumer,
                    offsets: vec![0],
                    delay_ms: None,
                    reason: Some("bad payload".into()),
                },
            )
            .unwrap()
    };
    let first = nack(1);
    assert_eq!((first.redelivery, first.dead_lettered), (vec![0], vec![]));
    let second = nack(2);
    assert_eq!((second.redelivery, second.dead_lettered), (vec![], vec![0]));
    assert_eq!(second.dead_letter_pending, Vec::<u64>::new());
    let dlq = h.client.peek("/default/jobs-dlq", Some(0), 10).unwrap();
    assert_eq!(dlq.messages.len(), 1);
    let m = &dlq.messages[0];
    assert_eq!(
        (m.value.as_deref(), m.key.as_deref()),
        (Some("poison"), Some("k1"))
    );
    let headers: Vec<(String, String)> = m
        .headers
        .iter()
        .map(|h| (h.name.clone(), h.value.clone().unwrap()))
        .collect();
    let expected: Vec<(String, String)> = [
        ("trace", "abc"),
        ("x-original-topic", "/default/jobs"),
        ("x-original-subscription", "workers"),
        ("x-original-topic-offset", "0"),
        ("x-original-producer-id", "broker:1"),
        ("x-original-broker-addr", BROKER_ADDR),
        ("x-poison-policy", "dead_letter"),
        ("x-delivery-attempt", "2"),
        ("x-failure-reason", "bad payload"),
    ]
    .iter()
    .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
    .collect();
    assert_eq!(headers, expected);
    assert_eq!(h.publish(JOBS, &["fine"]), (1, 2));
    // The subscription moved past the poison message; offset 1 flows.
    let next = h
        .client
        .receive(JOBS, "workers", consumer2, 10, 2000)
        .unwrap();
    assert_eq!(
        next.messages.iter().map(|m| m.offset).collect::<Vec<_>>(),
        vec![1]
    );
    h.client.ack(JOBS, "workers", consumer2, &[1]).unwrap();
    assert_eq!(h.client.state(JOBS, "workers").unwrap().cursor, 2);

    let replay = h.client.replay_dlq(JOBS, "workers").unwrap();
    assert_eq!((replay.replayed, replay.offsets.clone()), (1, vec![2]));
    assert_eq!(replay.dead_letter_topic, "/default/jobs-dlq");
    let back = h
        .client
        .receive(JOBS, "workers", consumer, 10, 2000)
        .unwrap();
    assert_eq!(back.messages.len(), 1);
    let m = &back.messages[0];
    assert_eq!(
        (m.offset, m.value.as_deref(), m.key.as_deref()),
        (2, Some("poison"), Some("k1"))
    );
    assert_eq!(m.header_text("trace"), Some("abc"));
    assert_eq!(
        m.header_text("x-replayed-from"),
        Some("/default/jobs-dlq@0")
    );
    assert_eq!(m.header_text("x-original-topic"), None);
    // Replaying again moves nothing (the replay cursor is durable).
    assert_eq!(h.client.replay_dlq(JOBS, "workers").unwrap().replayed, 0);
    // A name that never was a subscription here is 404, and no replay
    // cursor is stored for it.
    assert_eq!(
        api_status(h.client.replay_dlq(JOBS, "nobody")),
        (404, "not_found".to_owned())
    );
    let dlq_topic = TopicName::new("/default/jobs-dlq").unwrap();
    let cursor_of = |sub: &str| {
        let key = tributary_proto::keys::topics::subscription_cursor(
            &dlq_topic,
            &SubscriptionName::new(sub).unwrap(),
        );
        h.runtime.block_on(h.store.get(&key)).unwrap()
    };
    assert_eq!(cursor_of("replay.nobody"), None);
    assert_eq!(cursor_of("replay.workers"), Some(json!(1)));
}

#[test]
fn a_subscription_name_leaves_room_for_its_replay_cursor() {
    let h = Harness::start(fast());
    h.create_topic(JOBS, "task_queue");
    let attach = |name: &str| {
        h.client.attach(
            JOBS,
            name,
            &AttachRequest {
                subscription_type: SubscriptionType::Shared,
                ..AttachRequest::default()
            },
        )
    };
    // `replay.` + 248 bytes = 255, the longest name.
    assert!(attach(&"s".repeat(248)).is_ok());
    assert_eq!(
        api_status(attach(&"s".repeat(249))),
        (400, "invalid_input".to_owned())
    );
    assert_eq!(
        api_status(h.client.replay_dlq(JOBS, &"s".repeat(249))),
        (400, "invalid_input".to_owned())
    );
    // A 248-byte subscription's dead letters replay.
    assert_eq!(
        h.client
            .replay_dlq(JOBS, &"s".repeat(248))
            .unwrap()
            .replayed,
        0
    );
}

#[test]
fn block_halts_on_the_poison_message_and_resumes_after_seek() {
    let h = Harness::start(fast());
    let audit = "/default/audit";
    h.create_topic(audit, "audit_log");
    let consumer = h.attach(audit, "ledger", SubscriptionType::Exclusive);
    assert_eq!(
        h.client
            .state(audit, "ledger")
            .unwrap()
            .failure_policy
            .poison_policy,
        PoisonPolicy::Block
    );
    h.patch_policy(
        audit,
        "ledger",
        json!({"max_redelivery_count": 0, "base_redelivery_delay_ms": 10}),
    );
    let consumer_state = h.client.attach(
        audit,
        "ledger",
        &AttachRequest {
            subscription_type: SubscriptionType::Exclusive,
            ..AttachRequest::default()
        },
    );
    // Exclusive: a second consumer is refused while the first is attached.
    assert_eq!(
        api_status(consumer_state),
        (409, "subscription_busy".to_owned())
    );
    std::thread::sleep(Duration::from_millis(300)); // policy refresh
    assert_eq!(h.publish(audit, &["a", "b", "c"]), (0, 3));
    let got = h
        .client
        .receive(audit, "ledger", consumer, 1, 2000)
        .unwrap();
    assert_eq!(got.messages[0].offset, 0);
    let nacked = h
        .client
        .nack(
            audit,
            "ledger",
            &NackRequest {
                consumer_id: consumer,
                offsets: vec![0],
                delay_ms: None,
                reason: Some("unparseable".into()),
            },
        )
        .unwrap();
    assert_eq!(nacked.blocked_at, Some(0));
    // Halted: nothing after offset 0 is delivered.
    let halted = h
        .client
        .receive(audit, "ledger", consumer, 10, 600)
        .unwrap();
    assert!(halted.messages.is_empty());
    assert_eq!(halted.blocked_at, Some(0));
    // Nothing went to a dead-letter topic.
    assert_eq!(
        api_status(h.client.peek("/default/audit-dlq", None, 1)).0,
        404
    );
    let cursor = h
        .client
        .seek(
            audit,
            "ledger",
            &SeekRequest {
                offset: Some(1),
                timestamp_ms: None,
            },
        )
        .unwrap();
    assert_eq!(cursor["cursor"], 1);
    let resumed = h
        .client
        .receive(audit, "ledger", consumer, 10, 2000)
        .unwrap();
    assert_eq!(resumed.blocked_at, None);
    assert_eq!(
        resumed
            .messages
            .iter()
            .map(|m| m.offset)
            .collect::<Vec<_>>(),
        vec![1, 2]
    );
}

#[test]
fn cursor_reads_ack_up_to_an_offset_and_an_older_ack_is_a_no_op() {
    let h = Harness::start(fast());
    h.create_topic(JOBS, "event_stream");
    assert_eq!(h.publish(JOBS, &["0", "1", "2", "3", "4", "5"]), (0, 6));
    let c = h.attach(JOBS, "reader", SubscriptionType::Exclusive);
    let first = h.client.read(JOBS, "reader", c, 4, 0).unwrap();
    assert_eq!(
        first.messages.iter().map(|m| m.offset).collect::<Vec<_>>(),
        vec![0, 1, 2, 3]
    );
    // Not acknowledged: the same records again.
    let again = h.client.read(JOBS, "reader", c, 4, 0).unwrap();
    assert_eq!(again.messages, first.messages);
    let r = h.client.ack_up_to(JOBS, "reader", c, 2).unwrap();
    assert_eq!((r.acked, r.cursor), (true, 3));
    let r = h.client.ack_up_to(JOBS, "reader", c, 1).unwrap();
    assert_eq!((r.acked, r.cursor), (false, 3));
    let next = h.client.read(JOBS, "reader", c, 10, 0).unwrap();
    assert_eq!(
        next.messages.iter().map(|m| m.offset).collect::<Vec<_>>(),
        vec![3, 4, 5]
    );
    let (status, _) = api_status(h.client.ack_up_to(JOBS, "reader", c, 6));
    assert_eq!(status, 400);
    // Long poll: a read with nothing new waits for the next record.
    h.client.ack_up_to(JOBS, "reader", c, 5).unwrap();
    let client = h.client.clone();
    let waiter = std::thread::spawn(move || client.read(JOBS, "reader", c, 10, 10_000).unwrap());
    std::thread::sleep(Duration::from_millis(300));
    h.publish(JOBS, &["late"]);
    let late = waiter.join().unwrap();
    assert_eq!(
        late.messages
            .iter()
            .map(|m| (m.offset, m.value.clone().unwrap()))
            .collect::<Vec<_>>(),
        vec![(6, "late".to_owned())]
    );
}

#[test]
fn per_message_leases_do_not_block_siblings() {
    let h = Harness::start(fast());
    h.create_topic(JOBS, "task_queue");
    h.publish(JOBS, &["a", "b", "c", "d"]);
    let c = h.attach(JOBS, "w", SubscriptionType::Shared);
    let got = h.client.receive(JOBS, "w", c, 3, 0).unwrap();
    assert_eq!(
        got.messages.iter().map(|m| m.offset).collect::<Vec<_>>(),
        vec![0, 1, 2]
    );
    let r = h.client.ack(JOBS, "w", c, &[1, 2]).unwrap();
    assert_eq!((r.acked, r.cursor), (vec![1, 2], 0));
    let more = h.client.receive(JOBS, "w", c, 3, 0).unwrap();
    assert_eq!(
        more.messages.iter().map(|m| m.offset).collect::<Vec<_>>(),
        vec![3]
    );
    let r = h.client.ack(JOBS, "w", c, &[0, 3, 1]).unwrap();
    assert_eq!((r.acked, r.no_op, r.cursor), (vec![0, 3], vec![1], 4));
    // nack with an explicit delay of 0: redelivered at once.
    h.publish(JOBS, &["e"]);
    let e = h.client.receive(JOBS, "w", c, 1, 0).unwrap();
    h.client
        .nack(
            JOBS,
            "w",
            &NackRequest {
                consumer_id: c,
                offsets: vec![4],
                delay_ms: Some(0),
                reason: None,
            },
        )
        .unwrap();
    let e2 = h.client.receive(JOBS, "w", c, 1, 0).unwrap();
    assert_eq!(
        (e2.messages[0].offset, e2.messages[0].attempt),
        (e.messages[0].offset, 2)
    );
}

#[test]
fn start_positions_pause_resume_unsubscribe_and_ephemeral_expiry() {
    // Long enough that no session expires between two steps on a busy
    // machine (400 ms did, under a full parallel test run).
    let h = Harness::start(ConsumerConfig {
        session_timeout_ms: 2000,
        ..fast()
    });
    h.create_topic(JOBS, "event_stream");
    let now = broker_core::clock::now_ms();
    let records = (0..4)
        .map(|i| PublishRecord {
            value: Some(format!("v{i}")),
            timestamp_ms: Some(now + i * 1000),
            ..PublishRecord::default()
        })
        .collect();
    h.client.publish(JOBS, records).unwrap();
    let attach = |sub: &str, start: StartPosition, durable: bool| {
        h.client
            .attach(
                JOBS,
                sub,
                &AttachRequest {
                    start,
                    durable: Some(durable),
                    ..AttachRequest::default()
                },
            )
            .unwrap()
    };
    assert_eq!(attach("latest", StartPosition::Latest, true).cursor, 4);
    assert_eq!(attach("earliest", StartPosition::Earliest, true).cursor, 0);
    assert_eq!(attach("at2", StartPosition::Offset(2), true).cursor, 2);
    assert_eq!(
        attach("ts", StartPosition::Timestamp(now + 2500), true).cursor,
        3
    );
    // Seek by timestamp.
    let moved = h
        .client
        .seek(
            JOBS,
            "earliest",
            &SeekRequest {
                offset: None,
                timestamp_ms: Some(now + 1000),
            },
        )
        .unwrap();
    assert_eq!(moved["cursor"], 1);

    // Pause: nothing is delivered; resume: it flows again.
    let c = attach("p", StartPosition::Earliest, true).consumer_id;
    h.request(
        "POST",
        &format!("/v1/topics{JOBS}/subscriptions/p/pause"),
        Some(TOKEN),
        None,
    );
    let paused = h.client.receive(JOBS, "p", c, 10, 200).unwrap();
    assert!(paused.paused && paused.messages.is_empty());
    h.request(
        "POST",
        &format!("/v1/topics{JOBS}/subscriptions/p/resume"),
        Some(TOKEN),
        None,
    );
    assert_eq!(
        h.client
            .receive(JOBS, "p", c, 10, 0)
            .unwrap()
            .messages
            .len(),
        4
    );

    // Unsubscribe removes the keys; the session is gone.
    let r = h.request(
        "DELETE",
        &format!("/v1/topics{JOBS}/subscriptions/p"),
        Some(TOKEN),
        None,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(api_status(h.client.receive(JOBS, "p", c, 1, 0)).0, 404);
    assert_eq!(api_status(h.client.state(JOBS, "p")).0, 404);

    // Ephemeral: nothing stored; removed when the session expires.
    let e = attach("tail", StartPosition::Earliest, false);
    assert!(!e.durable);
    let topic = TopicName::new(JOBS).unwrap();
    let name = SubscriptionName::new("tail").unwrap();
    let stored = h
        .runtime
        .block_on(
            h.store
                .list(&tributary_proto::keys::topics::subscriptions_prefix(&topic)),
        )
        .unwrap();
    assert!(
        stored.iter().all(|(k, _)| !k.contains("/tail")),
        "{stored:?}"
    );
    assert!(h.client.state(JOBS, "tail").is_ok());
    // Gone once the session expires (2 s without a request), within a bound.
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while h.client.state(JOBS, "tail").is_ok() {
        assert!(
            std::time::Instant::now() < deadline,
            "ephemeral subscription still there 15 s after its last request"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(api_status(h.client.state(JOBS, "tail")).0, 404);
    let _ = name;
}

#[test]
fn failover_delivers_to_the_oldest_session_and_the_standby_takes_over() {
    let h = Harness::start(ConsumerConfig {
        session_timeout_ms: 500,
        ..fast()
    });
    h.create_topic(JOBS, "event_stream");
    h.publish(JOBS, &["a", "b"]);
    let first = h
        .client
        .attach(
            JOBS,
            "fo",
            &AttachRequest {
                subscription_type: SubscriptionType::Failover,
                start: StartPosition::Earliest,
                ..AttachRequest::default()
            },
        )
        .unwrap();
    let second = h
        .client
        .attach(
            JOBS,
            "fo",
            &AttachRequest {
                subscription_type: SubscriptionType::Failover,
                ..AttachRequest::default()
            },
        )
        .unwrap();
    assert!(first.active && !second.active);
    let standby = h
        .client
        .receive(JOBS, "fo", second.consumer_id, 10, 0)
        .unwrap();
    assert!(!standby.active && standby.messages.is_empty());
    let got = h
        .client
        .receive(JOBS, "fo", first.consumer_id, 1, 0)
        .unwrap();
    assert_eq!(got.messages[0].offset, 0);
    // The standby received nothing: its ack-up-to would skip offset 1,
    // which no one has seen (a trial's standby moved the cursor to 9).
    let (status, body) = api_status(h.client.ack_up_to(JOBS, "fo", second.consumer_id, 1));
    assert_eq!(status, 409, "{body}");
    assert!(body.contains("not_active"), "{body}");
    assert_eq!(h.client.state(JOBS, "fo").unwrap().cursor, 0);
    // The active consumer goes silent: its session expires, its lease comes
    // back, and the standby receives everything.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut seen = BTreeSet::new();
    while seen.len() < 2 && Instant::now() < deadline {
        let r = h
            .client
            .receive(JOBS, "fo", second.consumer_id, 10, 200)
            .unwrap();
        seen.extend(r.messages.iter().map(|m| m.offset));
    }
    assert_eq!(seen, BTreeSet::from([0, 1]));
    assert_eq!(
        api_status(h.client.receive(JOBS, "fo", first.consumer_id, 1, 0)).0,
        404
    );
}

/// method, path, body, expected status, kind, a phrase of the message.
type Case<'a> = (&'a str, String, Option<String>, u16, &'a str, &'a str);

#[test]
fn bad_inputs_get_clear_4xx_errors() {
    let h = Harness::start(fast());
    h.create_topic(JOBS, "task_queue");
    h.publish(JOBS, &["a", "b"]);
    let c = h.attach(JOBS, "w", SubscriptionType::Shared);
    let sub = format!("/v1/topics{JOBS}/subscriptions/w");
    let cases: Vec<Case> = vec![
        // Nothing dead-lettered (no dead-letter topic) and no such
        // subscription (it answered 200, replayed 0); a body with fields
        // it does not take (it was not read).
        (
            "POST",
            format!("/v1/topics{JOBS}/subscriptions/nope2/replay-dlq"),
            Some("{}".to_owned()),
            404,
            "not_found",
            "does not exist and has no dead-lettered messages",
        ),
        (
            "POST",
            format!("{sub}/replay-dlq"),
            Some(r#"{"bogus": true}"#.to_owned()),
            400,
            "invalid_input",
            "bogus",
        ),
        (
            "POST",
            "/v1/topics/default/nope/subscriptions/w/attach".into(),
            Some("{}".to_owned()),
            404,
            "not_found",
            "does not exist",
        ),
        (
            "POST",
            format!("/v1/topics{JOBS}/subscriptions/unknown/receive"),
            Some(r#"{"consumer_id": 1}"#.to_owned()),
            404,
            "not_found",
            "attach first",
        ),
        (
            "POST",
            format!("{sub}/receive"),
            Some(r#"{"consumer_id": 12345}"#.to_owned()),
            404,
            "not_found",
            "no session",
        ),
        (
            "POST",
            format!("{sub}/receive"),
            Some("{not json".to_owned()),
            400,
            "invalid_input",
            "request body",
        ),
        // An array of a struct's fields in order is no object (serde read
        // `[]` as an attach with every default).
        (
            "POST",
            format!("/v1/topics{JOBS}/subscriptions/x9/attach"),
            Some("[]".to_owned()),
            400,
            "invalid_input",
            "a JSON object expected",
        ),
        (
            "POST",
            format!("{sub}/pause"),
            Some(r#"{"x": 1}"#.to_owned()),
            400,
            "invalid_input",
            "x",
        ),
        (
            "POST",
            format!("/v1/topics{JOBS}/subscriptions/x9/attach"),
            Some(r#"{"start": {"timestamp": -5}}"#.to_owned()),
            400,
            "invalid_input",
            "start.timestamp",
        ),
        (
            "POST",
            format!("/v1/topics{JOBS}/subscriptions/x9/attach"),
            Some(r#"{"consumer_name": ""}"#.to_owned()),
            400,
            "invalid_input",
            "consumer_name",
        ),
        (
            "POST",
            format!("{sub}/receive"),
            Some(format!(r#"{{"consumer_id": {c}, "max_messages": 0}}"#)),
            400,
            "invalid_input",
            "max_messages",
        ),
        (
            "POST",
            format!("{sub}/receive"),
            Some(format!(r#"{{"consumer_id": {c}, "max_wait_ms": 999999}}"#)),
            400,
            "invalid_input",
            "max_wait_ms",
        ),
        (
            "POST",
            format!("{sub}/receive"),
            Some(format!(r#"{{"consumer_id": {c}, "max_mesages": 3}}"#)),
            400,
            "invalid_input",
            "max_mesages",
        ),
        (
            "POST",
            format!("{sub}/ack"),
            Some(format!(r#"{{"consumer_id": {c}, "offsets": [2]}}"#)),
            400,
            "invalid_input",
            "high-water mark",
        ),
        (
            "POST",
            format!("{sub}/ack"),
            Some(format!(r#"{{"consumer_id": {c}, "offsets": []}}"#)),
            400,
            "invalid_input",
            "offsets",
        ),
        (
            "POST",
            format!("{sub}/ack"),
            Some(format!(r#"{{"consumer_id": {c}, "offsets": [-1]}}"#)),
            400,
            "invalid_input",
            "offsets",
        ),
        (
            "POST",
            format!("{sub}/ack-up-to"),
            Some(format!(
                r#"{{"consumer_id": {c}, "offset": 18446744073709551615}}"#
            )),
            400,
            "invalid_input",
            "high-water mark",
        ),
        (
            "POST",
            format!("{sub}/seek"),
            Some(r#"{"offset": 5}"#.to_owned()),
            400,
            "offset_out_of_range",
            "outside [0, 2]",
        ),
        (
            "POST",
            format!("{sub}/seek"),
            Some(r#"{"offset": 1, "timestamp_ms": 5}"#.to_owned()),
            400,
            "invalid_input",
            "exactly one",
        ),
        (
            "POST",
            format!("{sub}/attach"),
            Some(r#"{"type": "exclusive"}"#.to_owned()),
            409,
            "type_mismatch",
            "is shared",
        ),
        (
            "POST",
            format!("{sub}/attach"),
            Some(r#"{"durable": false}"#.to_owned()),
            409,
            "durability_mismatch",
            "is durable, not ephemeral",
        ),
        (
            "POST",
            format!("/v1/topics{JOBS}/subscriptions/x2/attach"),
            Some(r#"{"start": {"offset": 9}}"#.to_owned()),
            400,
            "offset_out_of_range",
            "outside",
        ),
        (
            "POST",
            format!("/v1/topics{JOBS}/subscriptions/bad%20name/attach"),
            Some("{}".to_owned()),
            400,
            "invalid_input",
            "subscription",
        ),
        (
            "POST",
            format!("/v1/topics{JOBS}/subscriptions/x3/attach"),
            Some(r#"{"start": "yesterday"}"#.to_owned()),
            400,
            "invalid_input",
            "start",
        ),
        (
            "POST",
            format!("/v1/topics{JOBS}/records"),
            Some(r#"{"records": [{"value": "a", "value_b64": "YQ=="}]}"#.to_owned()),
            400,
            "invalid_input",
            "exactly one",
        ),
        // A header name given twice: the last value silently won.
        (
            "POST",
            format!("/v1/topics{JOBS}/records"),
            Some(r#"{"records": [{"value": "a", "headers": {"x": "1", "x": "2"}}]}"#.to_owned()),
            400,
            "invalid_input",
            "records[0].headers: header name \"x\" is given twice",
        ),
        (
            "POST",
            format!("/v1/topics{JOBS}/records"),
            Some(r#"{"records": [{"value_b64": "***"}]}"#.to_owned()),
            400,
            "invalid_input",
            "base64",
        ),
        (
            "POST",
            format!("/v1/topics{JOBS}/records"),
            Some(r#"{"records": []}"#.to_owned()),
            400,
            "invalid_input",
            "records",
        ),
        (
            "POST",
            format!("/v1/topics{JOBS}/records"),
            Some(
                r#"{"records": [{"value": "a"}, {"value": "b", "timestamp_ms": 9223372036854775807}]}"#
                    .to_owned(),
            ),
            400,
            "invalid_input",
            "records[1].timestamp_ms: must be ms since the Unix epoch, from 0",
        ),
        (
            "GET",
            format!("/v1/topics{JOBS}/records?offset=7"),
            None,
            400,
            "offset_out_of_range",
            "outside",
        ),
        (
            "GET",
            format!("/v1/topics{JOBS}/records?offset=abc"),
            None,
            400,
            "invalid_input",
            "offset",
        ),
        (
            "DELETE",
            format!("/v1/topics{JOBS}/subscriptions/never"),
            None,
            404,
            "not_found",
            "does not exist",
        ),
        (
            "POST",
            format!("/v1/topics{JOBS}/subscriptions/never/pause"),
            None,
            404,
            "not_found",
            "subscription never of /default/jobs does not exist",
        ),
        // A topic that does not exist is named as such (it read
        // "subscription s of /default/nosuch does not exist").
        (
            "POST",
            "/v1/topics/default/nosuch/subscriptions/s/seek".to_owned(),
            Some(r#"{"offset": 0}"#.to_owned()),
            404,
            "not_found",
            "topic /default/nosuch does not exist",
        ),
        (
            "DELETE",
            "/v1/topics/default/nosuch/subscriptions/s".to_owned(),
            None,
            404,
            "not_found",
            "topic /default/nosuch does not exist",
        ),
    ];
    for (method, path, body, status, kind, needle) in cases {
        let r = h.request(method, &path, Some(TOKEN), body.as_deref());
        assert_eq!(r.status, status, "{method} {path} {body:?}: {}", r.body);
        assert_eq!(r.body["kind"], kind, "{method} {path}: {}", r.body);
        let message = r.body["error"].as_str().unwrap();
        assert!(
            message.contains(needle),
            "{method} {path}: {message:?} lacks {needle:?}"
        );
        // The field is named once ("subscription: ...", never
        // "subscription: subscription: ...").
        if let Some((field, rest)) = message.split_once(": ") {
            assert!(
                !rest.starts_with(&format!("{field}:")),
                "{method} {path}: {message:?} names its field twice"
            );
        }
    }
    // Foreign lease.
    let other = h.attach(JOBS, "w", SubscriptionType::Shared);
    let got = h.client.receive(JOBS, "w", c, 1, 0).unwrap();
    let (status, kind) = api_status(h.client.ack(JOBS, "w", other, &[got.messages[0].offset]));
    assert_eq!((status, kind.as_str()), (409, "not_leased"));
    let (status, kind) = api_status(h.client.nack(
        JOBS,
        "w",
        &NackRequest {
            consumer_id: other,
            offsets: vec![got.messages[0].offset],
            delay_ms: None,
            reason: None,
        },
    ));
    assert_eq!((status, kind.as_str()), (409, "not_leased"));
    // The refused calls changed nothing: the holder acks it.
    let r = h
        .client
        .ack(JOBS, "w", c, &[got.messages[0].offset])
        .unwrap();
    assert_eq!(r.acked, vec![got.messages[0].offset]);
    // No token / wrong token.
    let r = h.request("POST", &format!("{sub}/receive"), None, Some("{}"));
    assert_eq!(
        (r.status, r.body["kind"].as_str()),
        (401, Some("unauthorized"))
    );
    let r = h.request(
        "GET",
        &format!("/v1/topics{JOBS}/records"),
        Some("wrong"),
        None,
    );
    assert_eq!(r.status, 401);
}

#[test]
fn leases_redelivery_and_ephemeral_expiry_follow_the_injected_clock() {
    // The consumer service reads this clock only: nothing times out while
    // it stands still, however slow the machine, and everything does when
    // it moves.
    let clock = Arc::new(ManualClock::new(1_000_000));
    let h = Harness::start_with_clock(fast(), clock.clone());
    h.create_topic(JOBS, "task_queue");
    h.publish(JOBS, &["a"]);
    let attached = h
        .client
        .attach(
            JOBS,
            "tail",
            &AttachRequest {
                start: StartPosition::Earliest,
                durable: Some(false),
                ..AttachRequest::default()
            },
        )
        .unwrap();
    let policy = attached.failure_policy.clone();
    let c = attached.consumer_id;
    // Joining it as durable is refused; without `durable` it is joined as
    // it is (and that second session ends at once).
    let refused = h.client.attach(
        JOBS,
        "tail",
        &AttachRequest {
            durable: Some(true),
            ..AttachRequest::default()
        },
    );
    match refused {
        Err(ClientError::Api {
            status,
            kind,
            message,
            ..
        }) => {
            assert_eq!((status, kind.as_str()), (409, "durability_mismatch"));
            assert!(message.contains("is ephemeral, not durable"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    let joined = h
        .client
        .attach(JOBS, "tail", &AttachRequest::default())
        .unwrap();
    assert_eq!((joined.durable, joined.created), (false, false));
    h.client.detach(JOBS, "tail", joined.consumer_id).unwrap();
    let first = h.client.receive(JOBS, "tail", c, 10, 0).unwrap();
    assert_eq!(first.messages.len(), 1);
    let ack_timeout = i64::try_from(policy.ack_timeout_ms).unwrap();
    assert_eq!(
        (
            first.messages[0].attempt,
            first.messages[0].lease_deadline_ms
        ),
        (1, Some(1_000_000 + ack_timeout))
    );
    // Several ticks of real time: the lease and the session stand.
    std::thread::sleep(Duration::from_millis(300));
    let state = h.client.state(JOBS, "tail").unwrap();
    assert_eq!((state.in_flight, state.consumers.len()), (1, 1));
    assert_eq!(state.consumers[0].last_seen_ms, 1_000_000);
    // The lease times out: redelivered after the first backoff, not before.
    clock.advance(policy.ack_timeout_ms);
    let early = h.client.receive(JOBS, "tail", c, 10, 0).unwrap();
    assert!(early.messages.is_empty(), "{early:?}");
    clock.advance(policy.redelivery_delay_ms(1));
    let again = h.client.receive(JOBS, "tail", c, 10, 0).unwrap();
    assert_eq!(
        (again.messages[0].offset, again.messages[0].attempt),
        (0, 2)
    );
    // The session's silence passes the timeout: the ephemeral subscription
    // ends on the next tick.
    clock.advance(fast().session_timeout_ms + 1);
    let deadline = Instant::now() + Duration::from_secs(10);
    while h.client.state(JOBS, "tail").is_ok() {
        assert!(
            Instant::now() < deadline,
            "ephemeral subscription not removed"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(api_status(h.client.receive(JOBS, "tail", c, 1, 0)).0, 404);
}

// ---- Damaged ranges (issue 16, defect 3, consumer part) -------------------

const DAMAGED: &str = "/default/damaged";

/// A topic with three batches of ten records (offsets 0..10, 10..20,
/// 20..30) whose second batch has a flipped byte (stored, fails its CRC).
/// Returns the flip (to heal it).
fn damaged_topic(h: &Harness) -> Flip {
    h.create_topic(DAMAGED, "task_queue");
    let values: Vec<String> = (0..30).map(|i| format!("record-{i}")).collect();
    let mut sizes = Vec::new();
    for chunk in values.chunks(10) {
        let chunk: Vec<&str> = chunk.iter().map(String::as_str).collect();
        let (base, _) = h.publish(DAMAGED, &chunk);
        let name = TopicName::new(DAMAGED).unwrap();
        let log = h
            ._dir
            .path()
            .join("topics")
            .join(name.namespace())
            .join(name.topic())
            .join(format!("{:020}.log", 0));
        // The append is durable when publish answers; wait until the file
        // shows it (the size is what positions the flip).
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let len = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
            if len > sizes.last().copied().unwrap_or(0) {
                sizes.push(len);
                break;
            }
            assert!(Instant::now() < deadline, "batch at {base} not on disk");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    // The middle of the second batch.
    Flip::at(h, DAMAGED, (sizes[0] + sizes[1]) / 2)
}

fn offsets_of(messages: &[tributary_api::consumer::Message]) -> Vec<u64> {
    messages.iter().map(|m| m.offset).collect()
}

fn damage_config(wait_ms: u64) -> ConsumerConfig {
    ConsumerConfig {
        damage_wait_ms: wait_ms,
        ..fast()
    }
}

#[test]
fn leases_stop_before_a_damaged_range_wait_then_dead_letter_it_with_a_gap_notice() {
    let h = Harness::start(damage_config(1500));
    let _flip = damaged_topic(&h);
    let consumer = h.attach(DAMAGED, "work", SubscriptionType::Shared);
    h.patch_policy(DAMAGED, "work", json!({"poison_policy": "dead_letter"}));
    std::thread::sleep(Duration::from_millis(300)); // policy refresh
    let first = h
        .client
        .receive(DAMAGED, "work", consumer, 100, 500)
        .unwrap();
    // Every good record before the damage, and the damage named.
    assert_eq!(offsets_of(&first.messages), (0..10).collect::<Vec<_>>());
    let damaged = first.damaged.clone().expect("damaged range reported");
    assert_eq!((damaged.first_offset, damaged.end_offset), (10, 20));
    assert_eq!(damaged.state, tributary_api::consumer::DamageState::Waiting);
    assert!(
        damaged.reason.contains("damaged bytes at byte") && !damaged.reason.contains("offsets"),
        "{}",
        damaged.reason
    );
    assert!(first.gaps.is_empty());
    // No lease for an offset that could not be read.
    let state = h.client.state(DAMAGED, "work").unwrap();
    assert_eq!(state.in_flight, 10);
    assert_eq!(state.damaged.as_ref().map(|d| d.first_offset), Some(10));
    h.client
        .ack(DAMAGED, "work", consumer, &(0..10).collect::<Vec<_>>())
        .unwrap();
    let waiting = h
        .client
        .receive(DAMAGED, "work", consumer, 100, 300)
        .unwrap();
    assert!(waiting.messages.is_empty());
    assert_eq!(waiting.damaged.map(|d| d.first_offset), Some(10));
    assert_eq!(h.client.state(DAMAGED, "work").unwrap().in_flight, 0);
    // After the wait: a dead-letter entry names the range, a gap notice of
    // kind damaged moves past it, and the records after it come.
    let mut gaps = Vec::new();
    let mut after = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while after.len() < 10 {
        assert!(Instant::now() < deadline, "stuck: {gaps:?} {after:?}");
        let got = h
            .client
            .receive(DAMAGED, "work", consumer, 100, 1000)
            .unwrap();
        gaps.extend(got.gaps);
        let offsets = offsets_of(&got.messages);
        if !offsets.is_empty() {
            h.client.ack(DAMAGED, "work", consumer, &offsets).unwrap();
        }
        after.extend(offsets);
    }
    assert_eq!(after, (20..30).collect::<Vec<_>>());
    assert_eq!(gaps.len(), 1, "{gaps:?}");
    assert_eq!(
        (gaps[0].first_offset, gaps[0].end_offset, gaps[0].kind),
        (10, 20, tributary_api::consumer::GapKind::Damaged)
    );
    assert!(
        gaps[0].reason.contains("dead-letter entry"),
        "{}",
        gaps[0].reason
    );
    let state = h.client.state(DAMAGED, "work").unwrap();
    assert_eq!(
        (state.cursor, state.in_flight, state.damaged),
        (30, 0, None)
    );
    let dlq = h.client.peek("/default/damaged-dlq", None, 10).unwrap();
    assert_eq!(dlq.messages.len(), 1);
    let header = |name: &str| {
        dlq.messages[0]
            .headers
            .iter()
            .find(|x| x.name == name)
            .and_then(|x| x.value.clone())
    };
    assert_eq!(header("x-damaged-range").as_deref(), Some("10..20"));
    assert_eq!(header("x-original-topic-offset").as_deref(), Some("10"));
}

#[test]
fn a_damaged_range_that_heals_within_the_wait_is_delivered_exactly() {
    let h = Harness::start(damage_config(60_000));
    let flip = damaged_topic(&h);
    let consumer = h.attach(DAMAGED, "work", SubscriptionType::Shared);
    let first = h
        .client
        .receive(DAMAGED, "work", consumer, 100, 500)
        .unwrap();
    assert_eq!(offsets_of(&first.messages), (0..10).collect::<Vec<_>>());
    assert_eq!(first.damaged.map(|d| d.end_offset), Some(20));
    h.client
        .ack(DAMAGED, "work", consumer, &(0..10).collect::<Vec<_>>())
        .unwrap();
    // Cursor reads and peek on the same damage.
    let cursor_sub = h.client.attach(
        DAMAGED,
        "reader",
        &AttachRequest {
            subscription_type: SubscriptionType::Exclusive,
            start: StartPosition::Earliest,
            ..AttachRequest::default()
        },
    );
    let reader = cursor_sub.unwrap().consumer_id;
    let read = h.client.read(DAMAGED, "reader", reader, 100, 500).unwrap();
    assert_eq!(offsets_of(&read.messages), (0..10).collect::<Vec<_>>());
    assert_eq!(read.damaged.map(|d| d.first_offset), Some(10));
    h.client.ack_up_to(DAMAGED, "reader", reader, 9).unwrap();
    let at_damage = h.client.read(DAMAGED, "reader", reader, 100, 300).unwrap();
    assert!(at_damage.messages.is_empty());
    assert_eq!(at_damage.cursor, 10);
    let peek = h.client.peek(DAMAGED, None, 100).unwrap();
    assert_eq!(offsets_of(&peek.messages), (0..10).collect::<Vec<_>>());
    let (status, kind) = api_status(h.client.peek(DAMAGED, Some(10), 100));
    assert_eq!((status, kind.as_str()), (503, "damaged_range"));
    let peek_after = h.client.peek(DAMAGED, Some(20), 100).unwrap();
    assert_eq!(
        offsets_of(&peek_after.messages),
        (20..30).collect::<Vec<_>>()
    );

    // The range heals (the segment is rewritten): the same reads succeed,
    // every record once, no gap.
    flip.restore();
    let mut leased = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while leased.len() < 20 {
        assert!(Instant::now() < deadline, "after heal got {leased:?}");
        let got = h
            .client
            .receive(DAMAGED, "work", consumer, 100, 1000)
            .unwrap();
        assert!(got.gaps.is_empty(), "{:?}", got.gaps);
        leased.extend(offsets_of(&got.messages));
    }
    assert_eq!(leased, (10..30).collect::<Vec<_>>());
    let read = h.client.read(DAMAGED, "reader", reader, 100, 1000).unwrap();
    assert_eq!(offsets_of(&read.messages), (10..30).collect::<Vec<_>>());
    assert!(read.gaps.is_empty() && read.damaged.is_none());
    let peek = h.client.peek(DAMAGED, Some(10), 100).unwrap();
    assert_eq!(offsets_of(&peek.messages), (10..30).collect::<Vec<_>>());
}

#[test]
fn block_halts_at_a_damaged_range_with_the_reason_until_it_heals() {
    let h = Harness::start(damage_config(1000));
    let flip = damaged_topic(&h);
    let attach = AttachRequest {
        subscription_type: SubscriptionType::Exclusive,
        start: StartPosition::Earliest,
        ..AttachRequest::default()
    };
    let leaser = h
        .client
        .attach(DAMAGED, "ledger", &attach)
        .unwrap()
        .consumer_id;
    let reader = h
        .client
        .attach(DAMAGED, "cursor", &attach)
        .unwrap()
        .consumer_id;
    for sub in ["ledger", "cursor"] {
        h.patch_policy(DAMAGED, sub, json!({"poison_policy": "block"}));
    }
    std::thread::sleep(Duration::from_millis(300)); // policy refresh
    let got = h
        .client
        .receive(DAMAGED, "ledger", leaser, 100, 500)
        .unwrap();
    assert_eq!(offsets_of(&got.messages), (0..10).collect::<Vec<_>>());
    h.client
        .ack(DAMAGED, "ledger", leaser, &(0..10).collect::<Vec<_>>())
        .unwrap();
    let read = h.client.read(DAMAGED, "cursor", reader, 100, 500).unwrap();
    assert_eq!(offsets_of(&read.messages), (0..10).collect::<Vec<_>>());
    h.client.ack_up_to(DAMAGED, "cursor", reader, 9).unwrap();
    // The wait ends: blocked at 10, with the reason, for both read kinds.
    let deadline = Instant::now() + Duration::from_secs(10);
    for sub in ["ledger", "cursor"] {
        loop {
            let got = if sub == "ledger" {
                h.client.receive(DAMAGED, sub, leaser, 100, 300).unwrap()
            } else {
                h.client.read(DAMAGED, sub, reader, 100, 300).unwrap()
            };
            assert!(got.messages.is_empty() && got.gaps.is_empty(), "{got:?}");
            if got.blocked_at == Some(10) {
                let damaged = got.damaged.expect("reason");
                assert_eq!(damaged.state, tributary_api::consumer::DamageState::Blocked);
                assert_eq!((damaged.first_offset, damaged.end_offset), (10, 20));
                break;
            }
            assert!(Instant::now() < deadline, "{sub} not blocked");
        }
        let state = h.client.state(DAMAGED, sub).unwrap();
        assert_eq!(
            (state.blocked_at, state.in_flight, state.cursor),
            (Some(10), 0, 10)
        );
        assert!(state.damaged.is_some());
    }
    // Nothing was dead-lettered.
    assert_eq!(
        api_status(h.client.peek("/default/damaged-dlq", None, 1)).0,
        404
    );
    // It heals: both continue with exactly the rest.
    flip.restore();
    let got = h
        .client
        .receive(DAMAGED, "ledger", leaser, 100, 2000)
        .unwrap();
    assert_eq!(offsets_of(&got.messages), (10..30).collect::<Vec<_>>());
    assert_eq!((got.blocked_at, got.damaged), (None, None));
    let read = h.client.read(DAMAGED, "cursor", reader, 100, 2000).unwrap();
    assert_eq!(offsets_of(&read.messages), (10..30).collect::<Vec<_>>());
}

#[test]
fn a_cursor_read_moves_past_a_damaged_range_after_the_wait_with_a_dead_letter_entry() {
    let h = Harness::start(damage_config(1000));
    let _flip = damaged_topic(&h);
    let attach = AttachRequest {
        subscription_type: SubscriptionType::Exclusive,
        start: StartPosition::Earliest,
        ..AttachRequest::default()
    };
    let reader = h
        .client
        .attach(DAMAGED, "cursor", &attach)
        .unwrap()
        .consumer_id;
    h.patch_policy(DAMAGED, "cursor", json!({"poison_policy": "dead_letter"}));
    std::thread::sleep(Duration::from_millis(300)); // policy refresh
    let read = h.client.read(DAMAGED, "cursor", reader, 100, 500).unwrap();
    assert_eq!(offsets_of(&read.messages), (0..10).collect::<Vec<_>>());
    h.client.ack_up_to(DAMAGED, "cursor", reader, 9).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let moved = loop {
        let got = h.client.read(DAMAGED, "cursor", reader, 100, 1000).unwrap();
        if !got.gaps.is_empty() || !got.messages.is_empty() {
            break got;
        }
        assert!(Instant::now() < deadline, "cursor read stuck at the damage");
    };
    assert_eq!(moved.gaps.len(), 1, "{:?}", moved.gaps);
    assert_eq!(
        (moved.gaps[0].first_offset, moved.gaps[0].end_offset),
        (10, 20)
    );
    assert_eq!(
        moved.gaps[0].kind,
        tributary_api::consumer::GapKind::Damaged
    );
    assert_eq!(offsets_of(&moved.messages), (20..30).collect::<Vec<_>>());
    let dlq = h.client.peek("/default/damaged-dlq", None, 10).unwrap();
    assert_eq!(dlq.messages.len(), 1);
}

/// A central publish that meets a full broker disk is refused with 507
/// `disk_full` (nothing stored, retry); once space is free the next publish
/// reopens the topic's WAL and is stored, and every acknowledged record is
/// delivered once at its offset, to a consumer session attached before
/// the disk filled (it follows the reopened WAL).
#[test]
fn a_full_broker_disk_answers_507_disk_full_and_publishing_resumes_once_space_is_free() {
    let h = Harness::start_on_small_disk(fast(), 32 << 20);
    let fs = h.loop_fs.as_ref().expect("a small disk");
    h.create_topic("/jobs/work", "task_queue");
    let value = |offset: u64| format!("job-{offset:08}-{}", "x".repeat(4000));
    let mut acked: BTreeMap<u64, String> = BTreeMap::new();
    let publish = |next: u64| {
        let records = (0..16)
            .map(|i| PublishRecord {
                value: Some(value(next + i)),
                ..PublishRecord::default()
            })
            .collect();
        h.client.publish("/jobs/work", records)
    };
    let (base, next) = h.publish("/jobs/work", &["first"]);
    assert_eq!((base, next), (0, 1));
    acked.insert(0, "first".to_owned());
    // A consumer session from before the disk filled: it keeps reading
    // after the topic's WAL is reopened (same handle swapped, session kept).
    let consumer = h.attach("/jobs/work", "audit", SubscriptionType::Exclusive);
    let mut next = next;
    fs.fill();
    // Bounded: 32 MiB hold at most ~500 such batches.
    let refusal = (0..2000)
        .find_map(|_| match publish(next) {
            Ok(r) => {
                assert_eq!(r.base_offset, next, "offsets continue");
                for offset in r.base_offset..r.next_offset {
                    acked.insert(offset, value(offset));
                }
                next = r.next_offset;
                fs.fill();
                None
            }
            Err(e) => Some(e),
        })
        .expect("a full disk refused a publish");
    match refusal {
        ClientError::Api {
            status,
            kind,
            message,
            ..
        } => {
            assert_eq!((status, kind.as_str()), (507, "disk_full"), "{message}");
            assert!(message.contains("retry"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    fs.free();
    let deadline = Instant::now() + Duration::from_secs(10);
    let stored = loop {
        match publish(next) {
            Ok(r) => break r,
            Err(e) => {
                assert!(
                    Instant::now() < deadline,
                    "not stored after space was freed: {e}"
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    };
    assert!(stored.base_offset >= next, "an offset was handed out twice");
    for offset in stored.base_offset..stored.next_offset {
        acked.insert(offset, value(offset));
    }
    let mut got: BTreeMap<u64, String> = BTreeMap::new();
    for _ in 0..1000 {
        let batch = h
            .client
            .receive("/jobs/work", "audit", consumer, 1000, 200)
            .unwrap();
        if batch.messages.is_empty() {
            break;
        }
        let offsets = offsets_of(&batch.messages);
        for m in batch.messages {
            assert!(
                got.insert(m.offset, m.value.unwrap_or_default()).is_none(),
                "offset {} twice",
                m.offset
            );
        }
        h.client
            .ack("/jobs/work", "audit", consumer, &offsets)
            .unwrap();
    }
    for (offset, value) in &acked {
        assert!(
            got.get(offset) == Some(value),
            "acknowledged offset {offset}; got {:?}, acked {:?}",
            got.keys().collect::<Vec<_>>(),
            acked.keys().collect::<Vec<_>>()
        );
    }
}

/// A receive of many large messages answers at most about 64 MiB of them
/// (the rest are given back unleased, not lost or leased twice), and the
/// next receive goes on. Before, it read and answered every leased
/// message at once (1,000 messages of 1 MiB: a gigabyte in one answer).
#[test]
fn a_receive_of_large_messages_answers_about_64_mib_and_the_next_goes_on() {
    let h = Harness::start(fast());
    h.create_topic(JOBS, "event_stream");
    let big = "x".repeat(1_000_000);
    for _ in 0..100 {
        h.publish(JOBS, &[big.as_str()]);
    }
    let c = h.attach(JOBS, "w", SubscriptionType::Shared);
    let first = h.client.receive(JOBS, "w", c, 100, 0).unwrap();
    let n = first.messages.len();
    // Read 16 at a time until 64 MiB are passed: 80 of 1 MB.
    assert_eq!(n, 80, "messages in the first answer");
    let offsets: Vec<u64> = first.messages.iter().map(|m| m.offset).collect();
    assert_eq!(offsets, (0..n as u64).collect::<Vec<_>>());
    let second = h.client.receive(JOBS, "w", c, 100, 0).unwrap();
    let rest: Vec<u64> = second.messages.iter().map(|m| m.offset).collect();
    assert_eq!(
        rest,
        (n as u64..100).collect::<Vec<_>>(),
        "the rest, once each"
    );
    assert!(
        second.messages.iter().all(|m| m.attempt == 1),
        "given back unleased, not failed"
    );
}

#[test]
fn a_central_publish_to_a_topic_an_edge_replicates_into_is_409_writer_conflict_saying_so() {
    let h = Harness::start(fast());
    h.create_topic(JOBS, "task_queue");
    // The edge's writer marker, as its first stream writes it.
    let topic = TopicName::new(JOBS).unwrap();
    let key = tributary_proto::keys::topics::producer(
        &topic,
        tributary_broker::replication::topics::EDGE_PRODUCER_ID,
    );
    h.runtime
        .block_on(h.store.put(&key, json!({"kind": "edge"})))
        .unwrap();
    let err = h
        .client
        .publish(
            JOBS,
            vec![PublishRecord {
                value: Some("x".into()),
                ..PublishRecord::default()
            }],
        )
        .unwrap_err();
    let ClientError::Api {
        status,
        kind,
        message,
        ..
    } = err
    else {
        panic!("{err}");
    };
    assert_eq!(
        (status, kind.as_str()),
        (409, "writer_conflict"),
        "{message}"
    );
    assert_eq!(
        message,
        "topic /default/jobs: an edge replicates into it, so it takes no central publish (the edge assigns its offsets): publish at the edge, or to another topic"
    );
    let peek = h.client.peek(JOBS, Some(0), 10).unwrap();
    assert!(peek.messages.is_empty(), "nothing stored");
}

/// A partitioned topic takes records through its partitions only: a
/// publish to the topic itself is refused naming them (it was stored in a
/// log of its own beside the partitions), and nothing is stored.
#[test]
fn a_publish_to_a_partitioned_topic_itself_is_refused_naming_its_partitions() {
    let h = Harness::start(fast());
    let spec = TopicSpec::parse("/default/parts", "task_queue", 3).unwrap();
    h.runtime
        .block_on(Catalog::new(h.store.as_ref()).create_topic(&spec))
        .unwrap();
    let body = r#"{"records": [{"value": "a"}]}"#;
    for _ in 0..2 {
        let r = h.request(
            "POST",
            "/v1/topics/default/parts/records",
            Some(TOKEN),
            Some(body),
        );
        assert_eq!(
            (r.status, r.body["kind"].as_str()),
            (409, Some("writer_conflict")),
            "{}",
            r.body
        );
        let message = r.body["error"].as_str().unwrap_or_default();
        assert!(
            message.contains("partitioned into 3")
                && message.contains("/default/parts-part-0 … /default/parts-part-2"),
            "{message}"
        );
    }
    assert_eq!(h.publish("/default/parts-part-1", &["a"]), (0, 1));
    // Attaching to the topic itself is refused the same way: it created a
    // durable subscription that could never receive anything.
    let refused = h.client.attach(
        "/default/parts",
        "workers",
        &AttachRequest {
            subscription_type: SubscriptionType::Shared,
            start: StartPosition::Earliest,
            ..AttachRequest::default()
        },
    );
    let Err(ClientError::Api {
        status,
        kind,
        message,
        ..
    }) = refused
    else {
        panic!("attach to a partitioned topic: {refused:?}");
    };
    assert_eq!((status, kind.as_str()), (409, "partitioned"), "{message}");
    assert!(
        message.contains("/default/parts-part-0 … /default/parts-part-2"),
        "{message}"
    );
    assert!(
        h.runtime
            .block_on(h.store.list("/topics/default/parts/subscriptions/"))
            .unwrap()
            .is_empty(),
        "a subscription was stored"
    );
    let topics = h._dir.path().join("topics/default");
    assert!(
        topics.join("parts-part-1").exists() && !topics.join("parts").exists(),
        "no log was opened for the topic itself"
    );
}

/// A dead-letter topic an edge replicates into is refused when a failure
/// policy names it (PUT and PATCH, `409 writer_conflict`, nothing changed):
/// dead-letter copies are central writes, which such a topic refuses, and
/// the subscription stalled at its first poison message, logging the
/// failed copy four times a second (the cluster trial).
#[test]
fn a_failure_policy_cannot_name_an_edge_fed_dead_letter_topic() {
    let h = Harness::start(fast());
    h.create_topic(JOBS, "task_queue");
    h.create_topic("/default/edgefed", "event_stream");
    let topics = tributary_broker::replication::topics::TopicStore::new(
        h._dir.path().join("claims"),
        h.store.clone(),
        tributary_proto::Limits::default(),
    );
    let edgefed = tributary_proto::keys::TopicName::new("/default/edgefed").unwrap();
    h.runtime
        .block_on(topics.claim_writer(
            &edgefed,
            tributary_broker::replication::topics::Writer::Edge,
        ))
        .unwrap();
    let path = format!("/v1/topics{JOBS}/subscriptions/workers/failure-policy");
    let patch = json!({"dead_letter_topic": "/default/edgefed"});
    let mut put = h.request("GET", &path, Some(TOKEN), None).body["policy"].clone();
    put["dead_letter_topic"] = json!("/default/edgefed");
    for (method, body) in [("PATCH", patch), ("PUT", put)] {
        let reply = h.request(method, &path, Some(TOKEN), Some(&body.to_string()));
        assert_eq!(reply.status, 409, "{method}: {}", reply.body);
        assert_eq!(reply.body["kind"], "writer_conflict", "{method}");
        assert_eq!(reply.body["field"], "dead_letter_topic", "{method}");
    }
    let stored = h.request("GET", &path, Some(TOKEN), None);
    assert_eq!(
        stored.body["policy"]["dead_letter_topic"],
        json!("/default/jobs-dlq")
    );
    // A topic only the broker writes is fine.
    h.patch_policy(
        JOBS,
        "workers",
        json!({"dead_letter_topic": "/default/other-dlq"}),
    );
}

/// A stored cursor past the high-water mark on attach. On an edge-fed topic
/// it is kept: a new owner starts its log at the archive's end and the edge
/// re-sends the rest at the same offsets, so the records below the cursor
/// come back and were acknowledged already (clamping redelivered 694 of
/// them in the cluster trial). On a central-written topic it is clamped:
/// what the old owner lost is gone, and the records appended next would be
/// skipped.
#[test]
fn a_stored_cursor_past_the_end_is_kept_for_an_edge_fed_topic_and_clamped_otherwise() {
    let h = Harness::start(fast());
    h.create_topic("/default/edgefed", "event_stream");
    h.create_topic("/default/central", "event_stream");
    let topics = tributary_broker::replication::topics::TopicStore::new(
        h._dir.path().join("claims"),
        h.store.clone(),
        tributary_proto::Limits::default(),
    );
    let edgefed = TopicName::new("/default/edgefed").unwrap();
    h.runtime
        .block_on(topics.claim_writer(
            &edgefed,
            tributary_broker::replication::topics::Writer::Edge,
        ))
        .unwrap();
    let meta = json!({"type": "shared", "durable": true, "paused": false, "created_ms": 1});
    for topic in ["/default/edgefed", "/default/central"] {
        let base = format!("/topics{topic}/subscriptions/workers");
        h.runtime.block_on(async {
            h.store.put(&base, meta.clone()).await.unwrap();
            h.store
                .put(&format!("{base}/cursor"), json!(50))
                .await
                .unwrap();
        });
    }
    let attach = AttachRequest::default();
    let kept = h
        .client
        .attach("/default/edgefed", "workers", &attach)
        .unwrap();
    assert_eq!((kept.cursor, kept.high_water_mark), (50, 0));
    // Nothing to deliver until the edge's records pass the cursor; no error.
    let got = h
        .client
        .read("/default/edgefed", "workers", kept.consumer_id, 10, 100)
        .unwrap();
    assert!(got.messages.is_empty());
    assert_eq!(got.cursor, 50);
    let clamped = h
        .client
        .attach("/default/central", "workers", &attach)
        .unwrap();
    assert_eq!((clamped.cursor, clamped.high_water_mark), (0, 0));
}
