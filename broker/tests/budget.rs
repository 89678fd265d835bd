//! The un-archived WAL budget (`tributary_broker::budget`) over real topic
//! WALs (files, fdatasync, segments sealed by age) and a redb metadata
//! store, driven through the consumer API's central publish on a real
//! socket: publishes get `507 budget_exceeded` once the budget is reached,
//! nothing acknowledged is lost, the un-archived bytes stay within the
//! budget plus one segment, and acceptance resumes by itself once a committed
//! tiered offset covers the sealed segments.

use std::sync::Arc;
use std::time::{Duration, Instant};

use broker_core::catalog::{Catalog, TopicSpec};
use broker_core::clock::SystemClock;
use broker_core::metadata::MetadataStore;
use broker_core::metadata::redb::RedbStore;
use serde_json::json;
use tributary_api::consumer::PublishRecord;
use tributary_api::consumer_client::{ClientError, ConsumerClient};
use tributary_broker::budget::{Budget, BudgetConfig};
use tributary_broker::consumer::{ConsumerConfig, ConsumerService};
use tributary_broker::replication::topics::TopicStore;
use tributary_proto::Limits;
use tributary_proto::archive::SegmentDescriptor;
use tributary_proto::keys::{DEFAULT_STORAGE_PREFIX, StorageKeys, TopicName};

const TOKEN: &str = "budget-test-token";
const TOPIC: &str = "/default/jobs";
const LIMIT: u64 = 64 * 1024;

fn records(first: u64, count: u64) -> Vec<PublishRecord> {
    (first..first + count)
        .map(|i| PublishRecord {
            value: Some(format!("{i:08}-{}", "x".repeat(500))),
            ..PublishRecord::default()
        })
        .collect()
}

#[test]
fn central_publish_gets_507_at_the_budget_and_resumes_once_tiered() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let store =
        Arc::new(RedbStore::open(dir.path().join("meta.redb"), Arc::new(SystemClock)).unwrap());
    let store_dyn: Arc<dyn MetadataStore> = store.clone();
    let topics = Arc::new(
        TopicStore::new(
            dir.path().join("topics"),
            store_dyn.clone(),
            Limits::default(),
        )
        .with_segment_max_age(Some(Duration::from_millis(200))),
    );
    let topic = TopicName::new(TOPIC).unwrap();
    let spec = TopicSpec::parse(TOPIC, "task_queue", 0).unwrap();
    runtime
        .block_on(Catalog::new(store.as_ref()).create_topic(&spec))
        .unwrap();
    let budget = Budget::new(
        BudgetConfig {
            unarchived_bytes: Some(LIMIT),
            refresh_ms: 50,
            ..BudgetConfig::default()
        },
        &topics,
        store_dyn.clone(),
    );
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    runtime.block_on(async {
        let _refresh = Budget::install(budget.clone()).expect("first install");
        let service = ConsumerService::new(
            topics.clone(),
            store_dyn.clone(),
            ConsumerConfig::default(),
            "127.0.0.1:7400".into(),
            1,
            Arc::new(SystemClock),
        );
        let app = tributary_broker::consumer::http::router(
            service,
            tributary_broker::auth::AuthState::new(store_dyn.clone(), Some(TOKEN.to_owned())),
        );
        tokio::spawn(async move { axum::serve(listener, app).await });
    });
    let client = ConsumerClient::new(&base, TOKEN);

    // Publish 20 records (~10 KiB) at a time until the budget refuses.
    let mut next = 0u64;
    let refusal = loop {
        assert!(next < 2_000, "never refused; {next} records accepted");
        match client.publish(TOPIC, records(next, 20)) {
            Ok(r) => {
                assert_eq!((r.base_offset, r.next_offset), (next, next + 20));
                next += 20;
            }
            Err(e) => break e,
        }
        std::thread::sleep(Duration::from_millis(40));
    };
    match &refusal {
        ClientError::Api {
            status,
            kind,
            message,
            ..
        } => {
            assert_eq!(
                (*status, kind.as_str()),
                (507, "budget_exceeded"),
                "{message}"
            );
            assert!(
                message.starts_with("budget_exceeded: broker holds"),
                "{message}"
            );
        }
        other => panic!("expected 507, got {other:?}"),
    }
    let wal = runtime.block_on(topics.get(&topic)).expect("open");
    let (_, used) = runtime.block_on(budget.usage());
    assert!(used >= LIMIT, "refused at {used} < {LIMIT}");
    // The sealed un-archived bytes stop within one batch of the limit; all
    // un-archived bytes (the active segment too) within one more segment.
    let largest = wal
        .sealed_segments()
        .iter()
        .map(|s| s.bytes)
        .max()
        .unwrap_or(0);
    let all = tributary_broker::budget::unarchived_bytes(&wal, 0);
    assert!(
        all <= LIMIT + 2 * largest,
        "{all} un-archived bytes, budget {LIMIT}, segments up to {largest}"
    );
    assert_eq!(wal.high_water_mark(), next, "nothing refused was stored");
    // Still refused; the refusals count.
    assert!(client.publish(TOPIC, records(next, 1)).is_err());
    assert!(budget.refusals() >= 2);
    // Every acknowledged record is there, at its offset.
    let mut seen = 0;
    while seen < next {
        let page = client.peek(TOPIC, Some(seen), 500).unwrap();
        for m in &page.messages {
            assert_eq!(m.offset, seen);
            assert!(
                m.value
                    .as_deref()
                    .unwrap()
                    .starts_with(&format!("{seen:08}-"))
            );
            seen += 1;
        }
    }

    // "Tiering": a committed descriptor covers the sealed segments.
    let deadline = Instant::now() + Duration::from_secs(10);
    let sealed = loop {
        let sealed = wal.sealed_segments();
        if sealed.len() >= 2 {
            break sealed;
        }
        assert!(Instant::now() < deadline, "segments never sealed");
        std::thread::sleep(Duration::from_millis(50));
    };
    let end = sealed.last().unwrap().next_offset;
    let keys = StorageKeys::new(DEFAULT_STORAGE_PREFIX).unwrap();
    let descriptor = SegmentDescriptor {
        start_offset: 0,
        end_offset: end - 1,
        record_count: end,
        size: 1000 + 16 + 112,
        object_id: keys.segment_object(&topic, 0, end - 1),
        format_version: tributary_proto::archive::FORMAT_VERSION,
        checksum_crc32c: 7,
        batches_crc32c: 8,
        batches_bytes: 1000,
        index_position: 1000,
        index_bytes: 16,
        first_timestamp_ms: 1,
        max_timestamp_ms: 2,
        created_at_ms: 3,
    };
    runtime.block_on(async {
        store
            .put(
                &keys.segment_descriptor(&topic, 0),
                serde_json::to_value(&descriptor).unwrap(),
            )
            .await
            .unwrap();
        store
            .put(
                &keys.segments_cur(&topic),
                json!(StorageKeys::segments_cur_value(0)),
            )
            .await
            .unwrap();
    });
    // Acceptance resumes by itself (the next refresh reads the offset).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match client.publish(TOPIC, records(next, 20)) {
            Ok(r) => {
                assert_eq!(r.base_offset, next);
                break;
            }
            Err(ClientError::Api { status: 507, .. }) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("not accepted again: {e}"),
        }
    }
    let archived: u64 = sealed.iter().map(|s| s.bytes).sum();
    let (_, now_used) = runtime.block_on(budget.usage());
    assert!(now_used < used, "{now_used} vs {used}");
    assert!(archived > 0);
    println!(
        "refused at {used} un-archived bytes (budget {LIMIT}); {} refusals; after tiering {now_used}",
        budget.refusals()
    );
}
