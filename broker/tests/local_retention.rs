//! Local retention without a tier service (issue 6 "Retention"): only what
//! every durable subscription has acknowledged (the minimum persisted
//! cursor) or what a declared `max_age_ms` expires is deleted, with exact
//! segment boundaries. Real topic WALs with fsync and a redb store.

use std::sync::Arc;

use broker_core::catalog::{Catalog, TopicSpec};
use broker_core::metadata::MetadataStore;
use broker_core::metadata::redb::RedbStore;

use broker_core::clock::SystemClock;
use bytes::Bytes;
use serde_json::json;
use tributary_broker::replication::topics::TopicStore;
use tributary_broker::storage::retention::{self, Rule};
use tributary_proto::keys::{self, SubscriptionName, TopicName};
use tributary_proto::{Limits, Record};

const T0: i64 = 1_700_000_000_000;

#[test]
fn deletes_only_segments_below_the_minimum_cursor_or_past_the_declared_age() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let store =
        Arc::new(RedbStore::open(dir.path().join("meta.redb"), Arc::new(SystemClock)).unwrap());
    let topics = TopicStore::new(dir.path().join("topics"), store.clone(), Limits::default());
    let topic = TopicName::new("/default/compacted").unwrap();
    let idle = TopicName::new("/default/no-subscribers").unwrap();
    runtime.block_on(async {
        for t in [&topic, &idle] {
            Catalog::new(store.as_ref())
                .create_topic(&TopicSpec::parse(t.as_str(), "event_stream", 0).unwrap())
                .await
                .unwrap();
        }
        // 4 sealed segments of 100 records (segment k: offsets
        // 100k..100k+100, timestamps T0 + k * 1000 s), then 50 active.
        for t in [&topic, &idle] {
            for k in 0..5u64 {
                let count = if k < 4 { 100 } else { 50 };
                let records = (0..count)
                    .map(|i| Record {
                        timestamp_ms: T0 + (k as i64) * 1_000_000 + i,
                        key: None,
                        headers: Vec::new(),
                        value: Bytes::from(format!("{k}-{i}")),
                    })
                    .collect();
                topics.append_central(t, records, false).await.unwrap();
                if k < 4 {
                    topics.get(t).await.unwrap().roll().await.unwrap();
                }
            }
        }
    });
    let put_cursor = |sub: &str, cursor: u64| {
        let name = SubscriptionName::new(sub).unwrap();
        runtime
            .block_on(store.put(
                &keys::topics::subscription_cursor(&topic, &name),
                json!(cursor),
            ))
            .unwrap();
    };
    let run = |t: &TopicName, max_age_ms: Option<u64>, now_ms: i64| {
        runtime.block_on(async {
            let wal = topics.get(t).await.unwrap();
            retention::apply(store.as_ref(), t, wal, max_age_ms, now_ms)
                .await
                .unwrap()
        })
    };
    let now = T0 + 10_000_000;

    // No durable subscription and no declared limit: nothing deleted.
    let outcome = run(&idle, None, now);
    assert_eq!(
        (outcome.min_cursor, outcome.deleted.len(), outcome.log_start),
        (None, 0, 0)
    );

    // Cursors 250 and 130: only 0..100 ends at or below 130.
    put_cursor("a", 250);
    put_cursor("b", 130);
    let outcome = run(&topic, None, now);
    assert_eq!(outcome.min_cursor, Some(130));
    assert_eq!(outcome.deleted, vec![(0, 100, Rule::MinimumCursor)]);
    assert_eq!(outcome.log_start, 100);

    // b reaches 300: the minimum is 250, so 100..200 goes, 200..300 stays.
    put_cursor("b", 300);
    let outcome = run(&topic, None, now);
    assert_eq!(outcome.min_cursor, Some(250));
    assert_eq!(outcome.deleted, vec![(100, 200, Rule::MinimumCursor)]);
    assert_eq!(outcome.log_start, 200);
    let wal = runtime.block_on(topics.get(&topic)).unwrap();
    assert_eq!(wal.high_water_mark(), 450);
    let kept: Vec<(u64, u64)> = wal
        .sealed_segments()
        .iter()
        .map(|s| (s.base_offset, s.next_offset))
        .collect();
    assert_eq!(kept, vec![(200, 300), (300, 400)]);

    // A declared max age of 1500 s at T0 + 3600 s expires segments whose
    // newest record is before T0 + 2100 s: 200..300 (T0 + 2000 s + 99 ms),
    // not 300..400 (T0 + 3000 s), whatever the cursors say.
    let outcome = run(&topic, Some(1_500_000), T0 + 3_600_000);
    assert_eq!(outcome.deleted, vec![(200, 300, Rule::MaxAge)]);
    assert_eq!(outcome.log_start, 300);
    // The idle topic under the same limit loses its first three segments.
    let outcome = run(&idle, Some(1_500_000), T0 + 3_600_000);
    assert_eq!(
        outcome.deleted,
        vec![
            (0, 100, Rule::MaxAge),
            (100, 200, Rule::MaxAge),
            (200, 300, Rule::MaxAge)
        ]
    );
    assert_eq!(outcome.log_start, 300);
}
