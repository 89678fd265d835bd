//! Tiered read (issue 5 "Tiered read", issue 6 "Tests"): a topic's sealed
//! segments are tiered by the tier service's library (`Tiering::run_pass`:
//! upload to a local-directory bucket, descriptor committed through the
//! admin API, trim through `/v1/storage/.../trim`), so the local WAL no
//! longer holds them; a subscription from `earliest` then still receives
//! every record with the same offsets, keys, headers, timestamps and
//! values, read from the archive and then from the local WAL.
//!
//! Everything is real: redb metadata, topic WALs with fsync, the admin and
//! consumer routers on 127.0.0.1:0, the archive objects on disk.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use broker_core::catalog::{Catalog, TopicSpec};
use broker_core::metadata::MetadataStore;
use broker_core::metadata::redb::RedbStore;

use broker_core::clock::SystemClock;
use tributary_api::consumer::{
    AttachRequest, Message, PublishRecord, SeekRequest, StartPosition, SubscriptionType,
};
use tributary_api::consumer_client::{ClientError, ConsumerClient};
use tributary_archive::{Archive, Bucket};
use tributary_broker::admin::{AdminState, StaticClusterView, router};
use tributary_broker::consumer::{ConsumerConfig, ConsumerService};
use tributary_broker::replication::topics::TopicStore;
use tributary_broker::storage::{with_local_segments, with_storage_archive};
use tributary_proto::Limits;
use tributary_proto::keys::{StorageKeys, TopicName};
use tributary_tier::broker_api::BrokerClient;
use tributary_tier::faults::Faults;
use tributary_tier::tiering::Tiering;

const TOKEN: &str = "tiered-read-token";
const TOPIC: &str = "/default/tiered";
/// Records per sealed segment (each round is rolled).
const PER_SEGMENT: u64 = 100;
/// Sealed (then tiered and trimmed) segments.
const SEALED: u64 = 3;
/// Records left in the active segment.
const TAIL: u64 = 50;
const TOTAL: u64 = SEALED * PER_SEGMENT + TAIL;
/// How long delivery waits at a damaged range before the poison policy.
const DAMAGE_WAIT_MS: u64 = 1500;

struct Harness {
    runtime: tokio::runtime::Runtime,
    store: Arc<RedbStore>,
    topics: Arc<TopicStore>,
    dir: tempfile::TempDir,
}

impl Harness {
    fn new() -> Harness {
        let dir = tempfile::tempdir().unwrap();
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
        Harness {
            runtime,
            store,
            topics,
            dir,
        }
    }

    fn archive(&self) -> Archive {
        let bucket = Bucket::local(self.dir.path().join("bucket")).unwrap();
        Archive::new(bucket, StorageKeys::default())
    }

    /// Serves the admin API (with the storage endpoints trimming these
    /// WALs) and the consumer API of a service with or without the archive;
    /// returns the base URL.
    fn serve(&self, archive: Option<Archive>) -> String {
        let state = AdminState {
            store: self.store.clone(),
            cluster: Arc::new(StaticClusterView::single_leader("127.0.0.1:7401", 1)),
            auth: tributary_broker::auth::AuthState::new(
                self.store.clone(),
                Some(TOKEN.to_owned()),
            ),
        };
        let listener = self
            .runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let store: Arc<dyn MetadataStore> = self.store.clone();
        let topics = self.topics.clone();
        let storage_archive = self.archive();
        self.runtime.block_on(async move {
            let config = ConsumerConfig {
                tick_ms: 50,
                damage_wait_ms: DAMAGE_WAIT_MS,
                ..ConsumerConfig::default()
            };
            let service = ConsumerService::new(
                topics.clone(),
                store,
                config,
                "127.0.0.1:7400".into(),
                1,
                Arc::new(SystemClock),
            );
            if let Some(archive) = archive {
                service.set_archive(archive);
            }
            service.spawn_ticker();
            // The storage API checks objects in the bucket the tier service
            // writes (the broker's `[archive]`), whatever the consumers use.
            let app = with_storage_archive(
                with_local_segments(
                    router(state.clone()).merge(tributary_broker::consumer::http::router(
                        service,
                        state.auth.clone(),
                    )),
                    topics,
                ),
                storage_archive,
            );
            tokio::spawn(async move { axum::serve(listener, app).await });
        });
        base
    }

    fn topic(&self) -> TopicName {
        TopicName::new(TOPIC).unwrap()
    }

    fn roll(&self) {
        let wal = self
            .runtime
            .block_on(self.topics.get(&self.topic()))
            .unwrap();
        self.runtime.block_on(wal.roll()).unwrap();
    }

    fn log_start(&self) -> u64 {
        let wal = self
            .runtime
            .block_on(self.topics.get(&self.topic()))
            .unwrap();
        wal.log_start_offset()
    }

    /// One tier-service pass over the broker's topics into the bucket.
    fn tier(&self, base: &str) -> tributary_tier::tiering::PassReport {
        let keys = StorageKeys::default();
        let tiering = Tiering {
            bucket: self.archive().bucket().clone(),
            broker: BrokerClient::new(base, TOKEN, &keys).unwrap(),
            keys,
            topics_dir: self.dir.path().join("topics"),
            upload: Default::default(),
            retry: Default::default(),
            topic_concurrency: 1,
            faults: Arc::new(Faults::none()),
            cold: Default::default(),
            lakehouse: Default::default(),
        };
        let (_tx, rx) = tokio::sync::watch::channel(false);
        self.runtime.block_on(tiering.run_pass(&rx))
    }
}

/// Record `i`: a key, two headers and a fixed timestamp, all checked.
fn record(i: u64) -> PublishRecord {
    PublishRecord {
        value: Some(format!("value-{i}-{}", "x".repeat((i % 50) as usize))),
        key: Some(format!("k{}", i % 7)),
        headers: BTreeMap::from([
            ("n".to_owned(), i.to_string()),
            ("source".to_owned(), "tiered-read-test".to_owned()),
        ]),
        timestamp_ms: Some(1_700_000_000_000 + i as i64 * 10),
        ..PublishRecord::default()
    }
}

fn api_error(result: Result<impl std::fmt::Debug, ClientError>) -> (u16, String, String) {
    match result {
        Err(ClientError::Api {
            status,
            kind,
            message,
            ..
        }) => (status, kind, message),
        other => panic!("expected an API error, got {other:?}"),
    }
}

fn without_lease(mut m: Message) -> Message {
    m.attempt = 0;
    m.lease_deadline_ms = None;
    m
}

#[test]
fn a_subscription_from_earliest_reads_tiered_and_trimmed_segments_from_the_archive() {
    let h = Harness::new();
    let spec = TopicSpec::parse(TOPIC, "event_stream", 0).unwrap();
    h.runtime
        .block_on(Catalog::new(h.store.as_ref()).create_topic(&spec))
        .unwrap();
    let base = h.serve(Some(h.archive()));
    let plain_base = h.serve(None);
    let client = ConsumerClient::new(&base, TOKEN);
    let plain = ConsumerClient::new(&plain_base, TOKEN);

    // 3 sealed segments of 100 records (published 25 per batch), then 50
    // records in the active segment.
    let mut next = 0;
    for segment in 0..=SEALED {
        let count = if segment < SEALED { PER_SEGMENT } else { TAIL };
        for chunk in (next..next + count).collect::<Vec<_>>().chunks(25) {
            let r = client
                .publish(TOPIC, chunk.iter().map(|&i| record(i)).collect())
                .unwrap();
            assert_eq!((r.base_offset, r.next_offset), (chunk[0], chunk[0] + 25));
        }
        next += count;
        if segment < SEALED {
            h.roll();
        }
    }
    assert_eq!(next, TOTAL);
    let before: Vec<Message> = client.peek(TOPIC, Some(0), 1000).unwrap().messages;
    assert_eq!(before.len() as u64, TOTAL);

    // A durable subscription on the broker without an archive, created
    // while everything is local: its cursor stays at 0.
    let early = AttachRequest {
        subscription_type: SubscriptionType::Exclusive,
        start: StartPosition::Earliest,
        ..AttachRequest::default()
    };
    let plain_consumer = plain.attach(TOPIC, "early", &early).unwrap().consumer_id;

    let report = h.tier(&base);
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(report.committed, SEALED, "{report:?}");
    assert_eq!(report.trimmed_segments, SEALED, "{report:?}");
    assert_eq!(h.log_start(), SEALED * PER_SEGMENT, "local WAL trimmed");
    let (objects, _) = h
        .runtime
        .block_on(h.archive().segments(&h.topic()))
        .unwrap();
    let ranges: Vec<(u64, u64)> = objects
        .iter()
        .map(|o| (o.start_offset, o.end_offset))
        .collect();
    assert_eq!(ranges, vec![(0, 99), (100, 199), (200, 299)]);

    // Without an archive: a clear 503 naming the tiered offset.
    let (status, kind, message) = api_error(plain.read(TOPIC, "early", plain_consumer, 10, 0));
    assert_eq!((status, kind.as_str()), (503, "archive_not_configured"));
    assert!(
        message.contains("offset 0 was tiered") && message.contains("no archive is configured"),
        "{message}"
    );
    let (status, kind, _) = api_error(plain.peek(TOPIC, Some(0), 10));
    assert_eq!((status, kind.as_str()), (400, "offset_out_of_range"));

    // With the archive: every record, same JSON, exactly once, in order.
    let consumer = client
        .attach(
            TOPIC,
            "from-earliest",
            &AttachRequest {
                subscription_type: SubscriptionType::Shared,
                start: StartPosition::Earliest,
                ..AttachRequest::default()
            },
        )
        .unwrap()
        .consumer_id;
    let mut received: Vec<Message> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while (received.len() as u64) < TOTAL && Instant::now() < deadline {
        let got = client
            .receive(TOPIC, "from-earliest", consumer, 64, 500)
            .unwrap();
        let offsets: Vec<u64> = got.messages.iter().map(|m| m.offset).collect();
        if !offsets.is_empty() {
            client
                .ack(TOPIC, "from-earliest", consumer, &offsets)
                .unwrap();
        }
        received.extend(got.messages.into_iter().map(without_lease));
    }
    let offsets: Vec<u64> = received.iter().map(|m| m.offset).collect();
    assert_eq!(offsets, (0..TOTAL).collect::<Vec<_>>());
    assert_eq!(received, before);
    let state = client.state(TOPIC, "from-earliest").unwrap();
    assert_eq!(state.cursor, TOTAL);

    // Cursor reads across the archive/WAL boundary, peeks and seeks into
    // the archive.
    let reader = client
        .attach(
            TOPIC,
            "cursor-read",
            &AttachRequest {
                subscription_type: SubscriptionType::Exclusive,
                start: StartPosition::Offset(290),
                ..AttachRequest::default()
            },
        )
        .unwrap()
        .consumer_id;
    let got = client.read(TOPIC, "cursor-read", reader, 20, 0).unwrap();
    let offsets: Vec<u64> = got.messages.iter().map(|m| m.offset).collect();
    assert_eq!(offsets, (290..310).collect::<Vec<_>>());
    assert_eq!(got.messages, before[290..310].to_vec());
    let peeked = client.peek(TOPIC, None, 1000).unwrap().messages;
    assert_eq!(peeked, before, "peek from the log start (0, archived)");
    client
        .seek(
            TOPIC,
            "cursor-read",
            &SeekRequest {
                offset: None,
                timestamp_ms: Some(1_700_000_000_000 + 1234),
            },
        )
        .unwrap();
    let got = client.read(TOPIC, "cursor-read", reader, 1, 0).unwrap();
    assert_eq!(
        got.messages[0].offset, 124,
        "timestamp lookup in the archive"
    );
    // An offset past the end is refused naming the whole readable range,
    // archive included (it named the local WAL's, [300, 350], although 0
    // was accepted); a negative timestamp is refused as at attach.
    let past = SeekRequest {
        offset: Some(TOTAL + 1),
        timestamp_ms: None,
    };
    let (status, kind, message) = api_error(client.seek(TOPIC, "cursor-read", &past));
    assert_eq!((status, kind.as_str()), (400, "offset_out_of_range"));
    assert!(
        message.contains(&format!("outside [0, {TOTAL}]")),
        "{message}"
    );
    let attach_past = AttachRequest {
        start: StartPosition::Offset(TOTAL + 1),
        ..AttachRequest::default()
    };
    let (status, _, message) = api_error(client.attach(TOPIC, "past", &attach_past));
    assert_eq!(status, 400);
    assert!(
        message.contains(&format!("outside [0, {TOTAL}]")),
        "{message}"
    );
    let negative = SeekRequest {
        offset: None,
        timestamp_ms: Some(-3),
    };
    let (status, kind, message) = api_error(client.seek(TOPIC, "cursor-read", &negative));
    assert_eq!((status, kind.as_str()), (400, "invalid_input"), "{message}");
    assert!(message.starts_with("timestamp_ms: "), "{message}");
}

#[test]
fn a_read_from_the_archive_answers_about_64_mib_and_the_next_goes_on() {
    const BIG: u64 = 100;
    const VALUE_BYTES: usize = 1_000_000;
    let h = Harness::new();
    let spec = TopicSpec::parse(TOPIC, "event_stream", 0).unwrap();
    h.runtime
        .block_on(Catalog::new(h.store.as_ref()).create_topic(&spec))
        .unwrap();
    let base = h.serve(Some(h.archive()));
    let client = ConsumerClient::new(&base, TOKEN);
    let big = |i: u64| PublishRecord {
        value: Some(format!("{i:07}{}", "b".repeat(VALUE_BYTES - 7))),
        ..PublishRecord::default()
    };
    // One record per request: the API takes bodies up to 2 MiB.
    let publish = |i: u64| {
        let r = client.publish(TOPIC, vec![big(i)]).unwrap();
        assert_eq!(r.base_offset, i);
    };
    (0..BIG).for_each(publish);
    h.roll();
    let report = h.tier(&base);
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(h.log_start(), BIG, "the 100 MB segment tiered and trimmed");
    (BIG..BIG + 10).for_each(publish);
    // 64 MiB holds 67 records of 1,000,000 bytes: a peek of 1,000 from
    // the archive stops there, the next goes on across the WAL boundary.
    let mut offsets = Vec::new();
    let mut sizes = Vec::new();
    let mut from = 0;
    for _ in 0..5 {
        let got = client.peek(TOPIC, Some(from), 1000).unwrap().messages;
        let Some(last) = got.last() else { break };
        from = last.offset + 1;
        sizes.push(got.len());
        for m in &got {
            assert_eq!(
                m.value.as_deref().map(|v| &v[..7]),
                Some(format!("{:07}", m.offset).as_str())
            );
        }
        offsets.extend(got.iter().map(|m| m.offset));
    }
    assert_eq!(sizes, vec![67, 43]);
    assert_eq!(offsets, (0..BIG + 10).collect::<Vec<_>>());
}

/// Flips the byte at `at` (a fraction of the batches region) of the one
/// archive object of `topic`; returns the object's path and its bytes
/// before.
fn flip_in_object(h: &Harness, topic: &TopicName, at: f64) -> (std::path::PathBuf, Vec<u8>) {
    let archive = h.archive();
    let (objects, _) = h.runtime.block_on(archive.segments(topic)).unwrap();
    assert_eq!(objects.len(), 1);
    let index = h.runtime.block_on(archive.open(&objects[0])).unwrap();
    let position = (index.footer().batches_bytes as f64 * at) as usize;
    let path = h.dir.path().join("bucket").join(&objects[0].key);
    let good = std::fs::read(&path).unwrap();
    let mut bytes = good.clone();
    bytes[position] ^= 0xff;
    std::fs::write(&path, &bytes).unwrap();
    (path, good)
}

/// A `task_queue` topic served with the archive, `count` records (a
/// multiple of 25, published 25 per batch) in one sealed segment that is
/// tiered and trimmed; returns the consumer API's base URL and a client.
fn tiered_task_queue(h: &Harness, count: u64) -> (String, ConsumerClient) {
    tiered_task_queue_of(h, count, h.archive(), 0)
}

/// As [`tiered_task_queue`], consumers reading through `archive`, offset
/// `i` holding `record(i + values_from)`.
fn tiered_task_queue_of(
    h: &Harness,
    count: u64,
    archive: Archive,
    values_from: u64,
) -> (String, ConsumerClient) {
    let spec = TopicSpec::parse(TOPIC, "task_queue", 0).unwrap();
    h.runtime
        .block_on(Catalog::new(h.store.as_ref()).create_topic(&spec))
        .unwrap();
    let base = h.serve(Some(archive));
    let client = ConsumerClient::new(&base, TOKEN);
    for first in (0..count).step_by(25) {
        let values = first + values_from..first + values_from + 25;
        let r = client.publish(TOPIC, values.map(record).collect()).unwrap();
        assert_eq!(r.base_offset, first);
    }
    h.roll();
    let report = h.tier(&base);
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(h.log_start(), count);
    (base, client)
}

/// A shared consumer of `workers` from the earliest offset.
fn attach_earliest(client: &ConsumerClient) -> u64 {
    client
        .attach(
            TOPIC,
            "workers",
            &AttachRequest {
                subscription_type: SubscriptionType::Shared,
                start: StartPosition::Earliest,
                ..AttachRequest::default()
            },
        )
        .unwrap()
        .consumer_id
}

#[test]
fn a_damaged_archive_object_stops_delivery_before_it_and_the_poison_policy_moves_past_it() {
    let h = Harness::new();
    // One sealed segment of 8 batches of 25 records, tiered and trimmed,
    // then 25 records in the WAL.
    let (_, client) = tiered_task_queue(&h, 200);
    client
        .publish(TOPIC, (200..225).map(record).collect())
        .unwrap();
    flip_in_object(&h, &h.topic(), 0.45);

    // A peek from 0 answers the records before the damage; one from the
    // damage names it (503 damaged_range).
    let peek = client.peek(TOPIC, Some(0), 1000).unwrap();
    let first = peek.messages.last().map_or(0, |m| m.offset + 1);
    assert!(first > 0 && first < 100, "{first}");
    assert_eq!(first % 25, 0, "the damage starts at a batch: {first}");
    assert_eq!(
        peek.messages.iter().map(|m| m.offset).collect::<Vec<_>>(),
        (0..first).collect::<Vec<_>>()
    );
    let (status, kind, message) = api_error(client.peek(TOPIC, Some(first), 10));
    assert_eq!((status, kind.as_str()), (503, "damaged_range"), "{message}");
    assert!(message.contains("archive object"), "{message}");
    let Err(ClientError::Api { body, .. }) = client.peek(TOPIC, Some(first), 10) else {
        unreachable!()
    };
    let end = body["end_offset"].as_u64().unwrap();
    assert!(end > first && end <= 200, "{first}..{end}");

    // A consumer receives everything before it, then waits at it (no
    // lease at or past it), then the poison policy (dead_letter) moves
    // past with a dead-letter entry naming the range; everything after it
    // arrives once.
    let consumer = attach_earliest(&client);
    let mut received = Vec::new();
    let mut saw_waiting = false;
    let deadline = Instant::now() + Duration::from_secs(30);
    while (received.len() as u64) < 225 - (end - first) && Instant::now() < deadline {
        let got = client.receive(TOPIC, "workers", consumer, 64, 200).unwrap();
        if got.damaged.is_some() {
            saw_waiting = true;
        }
        let offsets: Vec<u64> = got.messages.iter().map(|m| m.offset).collect();
        if !offsets.is_empty() {
            client.ack(TOPIC, "workers", consumer, &offsets).unwrap();
        }
        received.extend(offsets);
    }
    assert!(saw_waiting, "delivery never reported the damaged range");
    let expected: Vec<u64> = (0..first).chain(end..225).collect();
    assert_eq!(received, expected);
    let state = client.state(TOPIC, "workers").unwrap();
    assert_eq!(state.cursor, 225);
    let dlq = client.peek("/default/tiered-dlq", Some(0), 10).unwrap();
    assert_eq!(dlq.messages.len(), 1, "one entry naming the range");
    assert_eq!(
        dlq.messages[0].header_text("x-damaged-range"),
        Some(format!("{first}..{end}").as_str())
    );
    assert_eq!(
        dlq.messages[0].header_text("x-original-topic-offset"),
        Some(first.to_string().as_str())
    );
}

/// An intact archive object written over a committed one under the same
/// key (the same offsets, other records, every CRC valid: a wrong backup
/// restored, a stray upload) is a damaged range to consumers, not records
/// they would take for the topic's: the broker checks each object it opens
/// against the descriptor committed in its metadata.
#[test]
fn an_object_replaced_under_a_committed_key_is_a_damaged_range_not_served() {
    let h = Harness::new();
    let checked =
        h.archive()
            .with_committed(tributary_broker::consumer::tiered::committed_descriptors(
                h.store.clone(),
            ));
    let (_, client) = tiered_task_queue_of(&h, 100, checked, 0);
    let peek = client.peek(TOPIC, Some(0), 1000).unwrap();
    assert_eq!(peek.messages.len(), 100);
    assert_eq!(peek.messages[7].value, record(7).value);

    // The same topic and offsets elsewhere, other values, tiered there.
    let other = Harness::new();
    tiered_task_queue_of(&other, 100, other.archive(), 1_000);
    let (objects, _) = h
        .runtime
        .block_on(h.archive().segments(&h.topic()))
        .unwrap();
    let (theirs, _) = other
        .runtime
        .block_on(other.archive().segments(&other.topic()))
        .unwrap();
    assert_eq!(objects.len(), 1);
    assert_eq!(objects[0].key, theirs[0].key, "the same key");
    std::fs::copy(
        other.dir.path().join("bucket").join(&theirs[0].key),
        h.dir.path().join("bucket").join(&objects[0].key),
    )
    .unwrap();

    let (status, kind, message) = api_error(client.peek(TOPIC, Some(0), 1000));
    assert_eq!((status, kind.as_str()), (503, "damaged_range"), "{message}");
    assert!(
        message.contains("not the object committed for this key"),
        "{message}"
    );
    let Err(ClientError::Api { body, .. }) = client.peek(TOPIC, Some(0), 10) else {
        unreachable!()
    };
    assert_eq!(body["end_offset"].as_u64(), Some(100), "{body}");
    // A consumer receives none of the other object's records.
    let consumer = attach_earliest(&client);
    let got = client.receive(TOPIC, "workers", consumer, 100, 0).unwrap();
    assert!(got.messages.is_empty(), "{:?}", got.messages);
    assert_eq!(
        got.damaged.map(|d| (d.first_offset, d.end_offset)),
        Some((0, 100))
    );
}

#[test]
fn a_damaged_archive_object_healed_within_the_wait_is_delivered_whole() {
    let h = Harness::new();
    let (_, client) = tiered_task_queue(&h, 100);
    let (object, good) = flip_in_object(&h, &h.topic(), 0.6);
    let consumer = attach_earliest(&client);
    let got = client.receive(TOPIC, "workers", consumer, 100, 0).unwrap();
    let damaged = got.damaged.expect("stopped at the damage");
    let before: Vec<u64> = got.messages.iter().map(|m| m.offset).collect();
    assert_eq!(before, (0..damaged.first_offset).collect::<Vec<_>>());
    client.ack(TOPIC, "workers", consumer, &before).unwrap();
    // The object is written again whole (as the audit's re-upload would).
    std::fs::write(&object, &good).unwrap();
    let got = client
        .receive(TOPIC, "workers", consumer, 100, 1000)
        .unwrap();
    assert_eq!(
        got.messages.iter().map(|m| m.offset).collect::<Vec<_>>(),
        (damaged.first_offset..100).collect::<Vec<_>>()
    );
    assert!(got.damaged.is_none());
}

#[test]
fn leases_of_a_receive_that_failed_to_read_the_archive_are_given_back_unread() {
    let h = Harness::new();
    let (_, client) = tiered_task_queue(&h, 50);
    let consumer = attach_earliest(&client);
    let (object, good) = flip_in_object(&h, &h.topic(), 0.0);
    std::fs::remove_file(&object).unwrap();
    let (status, _, message) = api_error(client.receive(TOPIC, "workers", consumer, 100, 0));
    assert_eq!(status, 500, "{message}");
    assert!(message.contains("not in the archive"), "{message}");
    std::fs::write(&object, &good).unwrap();
    // At once (not after the 30 s ack timeout), first attempt.
    let got = client.receive(TOPIC, "workers", consumer, 100, 0).unwrap();
    assert_eq!(
        got.messages
            .iter()
            .map(|m| (m.offset, m.attempt))
            .collect::<Vec<_>>(),
        (0..50).map(|o| (o, 1)).collect::<Vec<_>>()
    );
}

/// `replay-dlq` reads dead-letter entries the tier service archived and
/// trimmed from the dead-letter topic's local WAL, as a peek does. It read
/// the local WAL only: it replayed none of them and moved its cursor past
/// them for good (the cluster trial: "replayed 0", twice, then nothing
/// left to replay).
#[test]
fn replay_dlq_replays_dead_letter_entries_that_were_archived_and_trimmed() {
    let h = Harness::new();
    let (base, client) = tiered_task_queue(&h, 25);
    // Dead-lettered at the first failure.
    let patched = ureq::patch(format!(
        "{base}/v1/topics{TOPIC}/subscriptions/workers/failure-policy"
    ))
    .header("Authorization", format!("Bearer {TOKEN}"))
    .send_json(serde_json::json!({"max_redelivery_count": 0}))
    .expect("failure policy");
    assert_eq!(patched.status().as_u16(), 200);
    let consumer = attach_earliest(&client);
    let got = client.receive(TOPIC, "workers", consumer, 2, 2000).unwrap();
    let offsets: Vec<u64> = got.messages.iter().map(|m| m.offset).collect();
    assert_eq!(offsets, vec![0, 1]);
    client
        .nack(
            TOPIC,
            "workers",
            &tributary_api::consumer::NackRequest {
                consumer_id: consumer,
                offsets,
                delay_ms: None,
                reason: Some("poison".into()),
            },
        )
        .unwrap();
    const DLQ: &str = "/default/tiered-dlq";
    let deadline = Instant::now() + Duration::from_secs(20);
    while client
        .peek(DLQ, Some(0), 10)
        .map_or(0, |p| p.messages.len())
        < 2
    {
        assert!(Instant::now() < deadline, "no dead-letter entries");
        std::thread::sleep(Duration::from_millis(50));
    }
    // The dead-letter topic's segment is sealed, archived and trimmed.
    let dlq = TopicName::new(DLQ).unwrap();
    let dlq_wal = h.runtime.block_on(h.topics.get(&dlq)).unwrap();
    h.runtime.block_on(dlq_wal.roll()).unwrap();
    let report = h.tier(&base);
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(dlq_wal.log_start_offset(), 2, "the entries left the WAL");

    let replay = client.replay_dlq(TOPIC, "workers").unwrap();
    assert_eq!(
        (
            replay.replayed,
            replay.offsets.clone(),
            replay.dead_letter_cursor
        ),
        (2, vec![25, 26], 2)
    );
    let back = client.peek(TOPIC, Some(25), 10).unwrap();
    let values: Vec<(Option<&str>, Option<&str>)> = back
        .messages
        .iter()
        .map(|m| (m.value.as_deref(), m.header_text("x-replayed-from")))
        .collect();
    let (v0, v1) = (record(0).value.unwrap(), record(1).value.unwrap());
    assert_eq!(
        values,
        vec![
            (Some(v0.as_str()), Some("/default/tiered-dlq@0")),
            (Some(v1.as_str()), Some("/default/tiered-dlq@1"))
        ]
    );
    // Once: the cursor is past them now.
    assert_eq!(client.replay_dlq(TOPIC, "workers").unwrap().replayed, 0);
}

/// An archive object missing between two others (deleted from the bucket)
/// is a damaged range to consumers, as damaged bytes are: what lies before
/// and after it is served (a read past it used to fail with `500` for
/// every offset after the missing one), a peek into it names its offsets,
/// and the poison policy moves a subscription past it.
#[test]
fn a_missing_archive_object_is_a_damaged_range_and_what_follows_it_is_served() {
    let h = Harness::new();
    let spec = TopicSpec::parse(TOPIC, "task_queue", 0).unwrap();
    h.runtime
        .block_on(Catalog::new(h.store.as_ref()).create_topic(&spec))
        .unwrap();
    let base = h.serve(Some(h.archive()));
    let client = ConsumerClient::new(&base, TOKEN);
    // Three objects of 100 records, then 25 records in the WAL.
    for object in 0..3u64 {
        for first in (object * 100..object * 100 + 100).step_by(25) {
            let r = client
                .publish(TOPIC, (first..first + 25).map(record).collect())
                .unwrap();
            assert_eq!(r.base_offset, first);
        }
        h.roll();
        let report = h.tier(&base);
        assert!(report.errors.is_empty(), "{:?}", report.errors);
    }
    assert_eq!(h.log_start(), 300);
    client
        .publish(TOPIC, (300..325).map(record).collect())
        .unwrap();
    let archive = h.archive();
    let (objects, _) = h.runtime.block_on(archive.segments(&h.topic())).unwrap();
    let ranges: Vec<(u64, u64)> = objects
        .iter()
        .map(|o| (o.start_offset, o.end_offset))
        .collect();
    assert_eq!(ranges, [(0, 99), (100, 199), (200, 299)]);
    std::fs::remove_file(h.dir.path().join("bucket").join(&objects[1].key)).unwrap();

    let peek = client.peek(TOPIC, Some(0), 1000).unwrap();
    assert_eq!(
        peek.messages.iter().map(|m| m.offset).collect::<Vec<_>>(),
        (0..100).collect::<Vec<_>>()
    );
    let (status, kind, message) = api_error(client.peek(TOPIC, Some(150), 10));
    assert_eq!((status, kind.as_str()), (503, "damaged_range"), "{message}");
    assert!(
        message.contains("no object for offsets 100..200"),
        "{message}"
    );
    let peek = client.peek(TOPIC, Some(200), 1000).unwrap();
    assert_eq!(
        peek.messages.iter().map(|m| m.offset).collect::<Vec<_>>(),
        (200..325).collect::<Vec<_>>()
    );

    let consumer = attach_earliest(&client);
    let mut received = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while received.len() < 225 && Instant::now() < deadline {
        let got = client.receive(TOPIC, "workers", consumer, 64, 200).unwrap();
        let offsets: Vec<u64> = got.messages.iter().map(|m| m.offset).collect();
        if !offsets.is_empty() {
            client.ack(TOPIC, "workers", consumer, &offsets).unwrap();
        }
        received.extend(offsets);
    }
    let expected: Vec<u64> = (0..100).chain(200..325).collect();
    assert_eq!(received, expected);
    let dlq = client.peek("/default/tiered-dlq", Some(0), 10).unwrap();
    assert_eq!(dlq.messages.len(), 1, "one entry naming the range");
    assert_eq!(
        dlq.messages[0].header_text("x-damaged-range"),
        Some("100..200")
    );
}
