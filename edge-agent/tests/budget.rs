//! Disk budgets over real WALs: refusal with 507, space returning after
//! acknowledgement, `drop_oldest` with exact ranges, the agent-wide budget,
//! and the overshoot bound.

mod common;

use std::path::Path;

use broker_core::wal::WalError;
use bytes::Bytes;
use common::*;
use serde_json::json;
use tributary_edge::budget::BudgetScope;
use tributary_edge::topic::{DroppedRange, TopicFull};
use tributary_edge::{FullPolicy, PublishError, TopicError};
use tributary_proto::Limits;
use tributary_proto::intent::StreamIntent;

/// A value of `len` bytes whose first bytes spell `i`.
fn value(i: u64, len: usize) -> Vec<u8> {
    let mut v = format!("{i:08}").into_bytes();
    v.resize(len, b'.');
    v
}

/// The value length whose one-record batch is exactly `target` bytes.
fn value_len_for(target: u64, limits: &Limits) -> usize {
    (1..limits.max_record_bytes as usize)
        .find(|&len| batch_bytes(vec![record(&value(0, len))], limits) == target)
        .expect("a value length gives the target size")
}

fn full(err: TopicError) -> TopicFull {
    match err {
        TopicError::Publish(PublishError::Full(full)) => full,
        other => panic!("expected a full budget, got {other:?}"),
    }
}

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_topic_refuses_with_507_loses_nothing_and_an_unarchived_tail_holds_it_full_until_archived()
 {
    const LIMIT: u64 = 262_144;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.limits = small_limits();
    let mut t = topic("/e1/t", StreamIntent::EventStream);
    t.disk_budget_bytes = Some(LIMIT);
    cfg.topics = vec![t];
    let agent = start(cfg).await;
    let addr = agent.local_addr();
    let manager = agent.topics().clone();
    let topic = manager.topic(&name("/e1/t")).unwrap();
    let wal = topic.wal().unwrap();
    // 1 % of the budget; above max_batch_bytes.
    assert_eq!(wal.config().segment_max_bytes, 2621);

    let records = |first: u64| {
        (first..first + 5)
            .map(|i| record(&value(i, 150)))
            .collect::<Vec<_>>()
    };
    let batch = batch_bytes(records(0), &agent.config().limits);
    let mut next = 0u64;
    let err = loop {
        match manager.publish(&name("/e1/t"), records(next)).await {
            Ok(ack) => {
                assert_eq!((ack.base_offset, ack.next_offset), (next, next + 5));
                next += 5;
                assert!(wal.size_bytes() <= LIMIT);
            }
            Err(e) => break full(e),
        }
    };
    let used = wal.size_bytes();
    assert_eq!(
        err,
        TopicFull {
            topic: name("/e1/t"),
            scope: BudgetScope::Topic,
            limit_bytes: LIMIT,
            used_bytes: used,
            batch_bytes: batch,
            policy: FullPolicy::Refuse,
        }
    );
    // Filled to within one batch of the limit, never past it.
    assert_eq!(used, (LIMIT / batch) * batch);
    assert!(LIMIT - used < batch);
    assert_eq!(next, (LIMIT / batch) * 5);

    // A bigger batch than the room left (6 records of 150 bytes).
    let body: String = (0..6)
        .map(|_| format!("{{\"value\":\"{}\"}}\n", "v".repeat(150)))
        .collect();
    let r = post(addr, "/v1/topics/e1/t/batch", &[], body.as_bytes()).await;
    assert_eq!(r.status, 507, "{}", r.text);
    assert_eq!(r.body["kind"], json!("disk_budget_full"));
    assert_eq!(r.body["topic"], json!("/e1/t"));
    assert_eq!(r.body["limit"], json!("topic disk_budget_bytes"));
    assert_eq!(r.body["limit_bytes"], json!(LIMIT));
    assert_eq!(r.body["used_bytes"], json!(used));
    let batch_in_body = r.body["batch_bytes"].as_u64().unwrap();
    assert_eq!(
        r.error(),
        format!(
            "topic /e1/t is full: the topic's disk_budget_bytes = {LIMIT} bytes, {used} used, a batch of {batch_in_body} bytes does not fit; nothing was stored (full_policy = refuse)"
        )
    );

    // Nothing already stored is lost.
    let stored = read_wal(&agent, "/e1/t", 0);
    assert_eq!(stored.len() as u64, next);
    for (i, (offset, rec)) in stored.iter().enumerate() {
        assert_eq!(*offset, i as u64);
        assert_eq!(rec.value, Bytes::from(value(i as u64, 150)));
    }
    let stats = topic.stats();
    assert_eq!(stats.refused_records, 5 + 6);
    assert_eq!(stats.dropped_records, 0);
    assert_eq!(stats.backlog_bytes, used);

    // The broker acknowledges everything but has archived nothing yet: with
    // retain_until = "archived" (the default) every segment stays, counted
    // against the budget, and the topic still refuses exactly as before.
    let outcome = manager.on_acknowledged(&name("/e1/t"), next).await.unwrap();
    assert_eq!(outcome.deleted_segments, []);
    assert_eq!(wal.size_bytes(), used);
    assert_eq!(topic.stats().disk_used_bytes, used);
    assert_eq!(topic.stats().backlog_bytes, 0, "acknowledged: no backlog");
    let held = full(
        manager
            .publish(&name("/e1/t"), records(next))
            .await
            .unwrap_err(),
    );
    assert_eq!((held.used_bytes, held.batch_bytes), (used, batch));
    let r = post(addr, "/v1/topics/e1/t/batch", &[], body.as_bytes()).await;
    assert_eq!(r.status, 507, "{}", r.text);
    assert_eq!(r.body["used_bytes"], json!(used));
    assert_eq!(read_wal(&agent, "/e1/t", 0).len() as u64, next);
    assert_eq!(topic.stats().refused_records, 5 + 6 + 5 + 6);
    assert_eq!(topic.stats().dropped_records, 0);

    // The broker reports everything archived: sealed segments go, space
    // returns.
    let freed = manager.on_archived(&name("/e1/t"), next).await.unwrap();
    let sealed_before = wal.sealed_segments().iter().map(|s| s.bytes).sum::<u64>();
    assert_eq!(sealed_before, 0);
    assert!(freed > 0);
    assert_eq!(wal.size_bytes(), used - freed);
    assert_eq!(topic.stats().archived_offset, next);
    assert_eq!(wal.sealed_segments().len(), 0);
    assert_eq!(topic.stats().disk_used_bytes, wal.size_bytes());
    assert_eq!(manager.agent_budget().used_bytes(), wal.size_bytes());
    assert_eq!(topic.stats().backlog_bytes, 0);
    let r = post(addr, "/v1/topics/e1/t/records", &[], b"resumed").await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.body["base_offset"], json!(next));
    assert_eq!(
        read_wal(&agent, "/e1/t", next)[0].1.value,
        Bytes::from_static(b"resumed")
    );
    drop((topic, wal));
    agent.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_oldest_drops_and_counts_exact_ranges() {
    const LIMIT: u64 = 8192;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.limits = small_limits();
    let mut t = topic("/e1/t", StreamIntent::TaskQueue);
    t.disk_budget_bytes = Some(LIMIT);
    t.full_policy = FullPolicy::DropOldest;
    cfg.topics = vec![t];
    let agent = start(cfg).await;
    let addr = agent.local_addr();
    let limits = agent.config().limits;
    let manager = agent.topics().clone();
    let topic = manager.topic(&name("/e1/t")).unwrap();
    let wal = topic.wal().unwrap();
    // 1 % of 8 KiB is below max_batch_bytes, so segments are one batch limit.
    assert_eq!(wal.config().segment_max_bytes, 2048);
    // 500-byte batches: four per segment.
    let len = value_len_for(500, &limits);

    let publish = |i: u64| {
        let manager = manager.clone();
        async move {
            let ack = manager
                .publish(&name("/e1/t"), vec![record(&value(i, len))])
                .await
                .unwrap();
            assert_eq!(ack.base_offset, i);
        }
    };
    for i in 0..16 {
        publish(i).await;
    }
    assert_eq!(wal.size_bytes(), 8000);
    assert_eq!(topic.stats().dropped_segments, 0);
    // The broker has 0..2; no segment lies entirely below 2.
    assert_eq!(
        manager
            .on_acknowledged(&name("/e1/t"), 2)
            .await
            .unwrap()
            .deleted_segments,
        []
    );
    for i in 16..29 {
        publish(i).await;
        assert!(
            wal.size_bytes() <= LIMIT,
            "offset {i}: {}",
            wal.size_bytes()
        );
        assert_eq!(manager.agent_budget().used_bytes(), wal.size_bytes());
    }
    let range = |start, lost| DroppedRange {
        start_offset: start,
        end_offset: start + 4,
        lost_records: lost,
        bytes: 2000,
    };
    let stats = topic.stats();
    assert_eq!(
        stats.recent_dropped_ranges,
        [range(0, 2), range(4, 4), range(8, 4), range(12, 4)]
    );
    assert_eq!(stats.dropped_records, 14);
    assert_eq!(stats.dropped_segments, 4);
    assert_eq!(stats.refused_records, 0);
    assert_eq!(stats.log_start_offset, 16);
    assert_eq!(stats.high_water_mark, 29);
    assert_eq!(stats.backlog_records, 13);
    assert_eq!(wal.size_bytes(), 6500);

    // What is left is exactly 16..29.
    let stored = read_wal(&agent, "/e1/t", 16);
    let offsets: Vec<u64> = stored.iter().map(|(o, _)| *o).collect();
    assert_eq!(offsets, (16..29).collect::<Vec<_>>());
    for (offset, rec) in &stored {
        assert_eq!(rec.value, Bytes::from(value(*offset, len)));
    }
    assert!(matches!(
        wal.read(0, 1024),
        Err(WalError::OffsetBelowLogStart {
            requested: 0,
            log_start: 16
        })
    ));

    // HTTP never sees a 507 under drop_oldest while there is something to drop.
    for i in 29..33 {
        let r = post(addr, "/v1/topics/e1/t/records", &[], &value(i, len)).await;
        assert_eq!(r.status, 200, "{}", r.text);
        assert_eq!(r.body["base_offset"], json!(i));
    }
    assert_eq!(
        topic.stats().recent_dropped_ranges.last(),
        Some(&range(16, 4))
    );
    assert_eq!(topic.stats().dropped_records, 18);
    let metrics = get(addr, "/metrics").await.text;
    for line in [
        "tributary_edge_dropped_records_total{edge=\"e1\",topic=\"/e1/t\",reason=\"drop_oldest\"} 18",
        "tributary_edge_dropped_segments_total{edge=\"e1\",topic=\"/e1/t\"} 5",
        "tributary_edge_topic_disk_budget_bytes{edge=\"e1\",topic=\"/e1/t\"} 8192",
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "missing {line}:\n{metrics}"
        );
    }
    drop((topic, wal));
    agent.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_budget_is_shared_and_drop_oldest_seals_the_active_segment() {
    const AGENT_LIMIT: u64 = 16_384;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.limits = small_limits();
    cfg.disk_budget_bytes = Some(AGENT_LIMIT);
    // Today's retention (delete once acknowledged) for /e1/a, per topic.
    let mut a = topic("/e1/a", StreamIntent::EventStream);
    a.retain_until = Some(tributary_edge::config::RetainUntil::Acknowledged);
    let mut b = topic("/e1/b", StreamIntent::EventStream);
    b.full_policy = FullPolicy::DropOldest;
    cfg.topics = vec![a, b];
    let agent = start(cfg).await;
    let addr = agent.local_addr();
    let limits = agent.config().limits;
    let manager = agent.topics().clone();
    let len = value_len_for(500, &limits);
    let one = |i| vec![record(&value(i, len))];

    // /e1/a fills the agent budget: 32 batches of 500 bytes.
    let mut next_a = 0;
    let err = loop {
        match manager.publish(&name("/e1/a"), one(next_a)).await {
            Ok(_) => next_a += 1,
            Err(e) => break full(e),
        }
    };
    assert_eq!(next_a, 32);
    assert_eq!(
        (err.scope, err.limit_bytes, err.used_bytes, err.batch_bytes),
        (BudgetScope::Agent, AGENT_LIMIT, 16_000, 500)
    );
    let r = post(addr, "/v1/topics/e1/a/records", &[], &value(99, len)).await;
    assert_eq!(r.status, 507, "{}", r.text);
    assert_eq!(r.body["limit"], json!("agent disk_budget_bytes"));
    assert_eq!(r.body["limit_bytes"], json!(AGENT_LIMIT));
    assert!(
        r.error()
            .contains("the agent's disk_budget_bytes = 16384 bytes"),
        "{}",
        r.error()
    );

    // /e1/b has nothing of its own to drop.
    let err = full(manager.publish(&name("/e1/b"), one(0)).await.unwrap_err());
    assert_eq!(
        (err.scope, err.policy),
        (BudgetScope::Agent, FullPolicy::DropOldest)
    );
    assert!(
        err.to_string()
            .ends_with("(full_policy = drop_oldest, nothing left to drop)"),
        "{err}"
    );

    // The broker acknowledges 0..8 of /e1/a: two segments (4000 bytes) go.
    let outcome = manager.on_acknowledged(&name("/e1/a"), 8).await.unwrap();
    assert_eq!(outcome.deleted_segments, [(0, 4, 2000), (4, 8, 2000)]);
    assert_eq!(manager.agent_budget().used_bytes(), 12_000);
    manager.publish(&name("/e1/b"), one(0)).await.unwrap();

    // /e1/a fills it again; /e1/b then seals and drops its only segment.
    while manager.publish(&name("/e1/a"), one(next_a)).await.is_ok() {
        next_a += 1;
    }
    assert_eq!(next_a, 39);
    let ack = manager.publish(&name("/e1/b"), one(1)).await.unwrap();
    assert_eq!(ack.base_offset, 1);
    let b = manager.topic(&name("/e1/b")).unwrap();
    let stats = b.stats();
    assert_eq!(
        stats.recent_dropped_ranges,
        [DroppedRange {
            start_offset: 0,
            end_offset: 1,
            lost_records: 1,
            bytes: 500
        }]
    );
    assert_eq!(stats.log_start_offset, 1);
    assert_eq!(stats.high_water_mark, 2);
    // /e1/a lost nothing.
    assert_eq!(read_wal(&agent, "/e1/a", 8).len(), 31);
    assert_eq!(
        manager.agent_budget().used_bytes(),
        AGENT_LIMIT - AGENT_LIMIT % 500
    );

    // A batch that would not fit even with /e1/b empty (/e1/a's 15,500
    // bytes + 1,000 > 16,384) is refused before anything is dropped: it
    // deleted /e1/b's records and then refused anyway.
    let big = vec![record(&value(2, value_len_for(1000, &limits)))];
    let err = full(manager.publish(&name("/e1/b"), big).await.unwrap_err());
    assert_eq!(
        (err.scope, err.batch_bytes, err.policy),
        (BudgetScope::Agent, 1000, FullPolicy::DropOldest)
    );
    let stats = b.stats();
    assert_eq!(
        (
            stats.log_start_offset,
            stats.high_water_mark,
            stats.dropped_records
        ),
        (1, 2, 1)
    );
    drop(b);
    agent.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overshoot_stays_within_one_percent() {
    const LIMIT: u64 = 1 << 20;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.limits = Limits {
        max_record_bytes: 4096,
        max_batch_bytes: 8192,
    };
    let mut dropping = topic("/e1/drop", StreamIntent::EventStream);
    dropping.disk_budget_bytes = Some(LIMIT);
    dropping.full_policy = FullPolicy::DropOldest;
    let mut refusing = topic("/e1/refuse", StreamIntent::EventStream);
    refusing.disk_budget_bytes = Some(LIMIT);
    cfg.topics = vec![dropping, refusing];
    let agent = start(cfg).await;
    let manager = agent.topics().clone();
    let max_batch = u64::from(agent.config().limits.max_batch_bytes);
    let drop_wal = manager.topic(&name("/e1/drop")).unwrap().wal().unwrap();
    let refuse_wal = manager.topic(&name("/e1/refuse")).unwrap().wal().unwrap();
    // Segments are 1 % of the budget.
    assert_eq!(drop_wal.config().segment_max_bytes, LIMIT / 100);

    // A fixed pseudo-random sequence of batch shapes: 1-2 records of
    // 100-3999 bytes.
    let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
    let mut shape = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (1 + (seed % 2) as usize, 100 + ((seed >> 8) % 3900) as usize)
    };
    let mut written = 0u64;
    let mut i = 0u64;
    while written < 3 * LIMIT {
        let (count, len) = shape();
        let records: Vec<_> = (0..count)
            .map(|k| record(&value(i + k as u64, len)))
            .collect();
        written += batch_bytes(records.clone(), &agent.config().limits);
        manager.publish(&name("/e1/drop"), records).await.unwrap();
        i += count as u64;
        assert!(
            drop_wal.size_bytes() <= LIMIT,
            "{} > {LIMIT}",
            drop_wal.size_bytes()
        );
    }
    let stats = manager.topic(&name("/e1/drop")).unwrap().stats();
    assert!(stats.dropped_segments > 100, "{}", stats.dropped_segments);
    assert_eq!(stats.dropped_records, stats.log_start_offset);
    // Everything on disk, seal indexes included, is within 1 % too.
    let on_disk = dir_bytes(&dir.path().join("topics/e1/drop"));
    assert!(on_disk <= LIMIT + LIMIT / 100, "{on_disk}");

    let mut refused = None;
    while refused.is_none() {
        let (count, len) = shape();
        let records: Vec<_> = (0..count).map(|k| record(&value(k as u64, len))).collect();
        if let Err(e) = manager.publish(&name("/e1/refuse"), records).await {
            refused = Some(full(e));
        }
    }
    let size = refuse_wal.size_bytes();
    assert!(size <= LIMIT, "{size}");
    assert!(size > LIMIT - max_batch, "{size}");
    assert_eq!(refused.map(|r| r.used_bytes), Some(size));
    let on_disk = dir_bytes(&dir.path().join("topics/e1/refuse"));
    assert!(on_disk <= LIMIT + LIMIT / 100, "{on_disk}");
    drop((drop_wal, refuse_wal));
    agent.shutdown().await.unwrap();
}

/// `drop_oldest` on a topic held full by an acknowledged but un-archived
/// tail (`retain_until = "archived"`) drops exactly as before: the oldest
/// sealed segment, counted and listed; its records are not counted as lost
/// (the broker holds them). An `Archived` report then deletes what it
/// covers without counting it as dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_oldest_with_an_unarchived_tail_drops_and_counts_as_before_and_archived_deletes_the_rest()
 {
    const LIMIT: u64 = 8192;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.limits = small_limits();
    let mut t = topic("/e1/t", StreamIntent::EventStream);
    t.disk_budget_bytes = Some(LIMIT);
    t.full_policy = FullPolicy::DropOldest;
    cfg.topics = vec![t];
    let agent = start(cfg).await;
    let limits = agent.config().limits;
    let manager = agent.topics().clone();
    let topic = manager.topic(&name("/e1/t")).unwrap();
    let wal = topic.wal().unwrap();
    let len = value_len_for(500, &limits);
    for i in 0..16 {
        manager
            .publish(&name("/e1/t"), vec![record(&value(i, len))])
            .await
            .unwrap();
    }
    // Everything acknowledged, nothing archived: nothing deleted.
    let outcome = manager.on_acknowledged(&name("/e1/t"), 16).await.unwrap();
    assert_eq!(outcome.deleted_segments, []);
    assert_eq!(wal.size_bytes(), 8000);
    // The next batch does not fit: the oldest sealed segment goes.
    manager
        .publish(&name("/e1/t"), vec![record(&value(16, len))])
        .await
        .unwrap();
    let stats = topic.stats();
    assert_eq!(
        stats.recent_dropped_ranges,
        [DroppedRange {
            start_offset: 0,
            end_offset: 4,
            lost_records: 0,
            bytes: 2000,
        }]
    );
    assert_eq!((stats.dropped_segments, stats.dropped_records), (1, 0));
    assert_eq!(stats.log_start_offset, 4);
    // Archived up to 12: segments 4..8 and 8..12 go, not counted as drops.
    let freed = manager.on_archived(&name("/e1/t"), 12).await.unwrap();
    assert_eq!(freed, 4000);
    let stats = topic.stats();
    assert_eq!((stats.dropped_segments, stats.log_start_offset), (1, 12));
    assert_eq!(stats.disk_used_bytes, wal.size_bytes());
    assert_eq!(manager.agent_budget().used_bytes(), wal.size_bytes());
    drop((topic, wal));
    agent.shutdown().await.unwrap();
}
