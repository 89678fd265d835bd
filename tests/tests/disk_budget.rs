//! Disk budget with the real binaries: with the broker down, a topic fills
//! to its budget and producers get HTTP 507 naming the topic and the limit;
//! nothing already stored is lost; once the broker is back and has drained
//! the topic, publishing resumes.

use std::time::Duration;

use tributary_tests::cluster::{Pair, read_wal};

const BUDGET: u64 = 2 * 1024 * 1024;

fn batch(first: u64, count: u64) -> (String, Vec<String>) {
    let values: Vec<String> = (first..first + count)
        .map(|i| format!("reading-{i:08}-{}", "x".repeat(200)))
        .collect();
    let body = values
        .iter()
        .map(|v| format!("{{\"value\":{v:?}}}\n"))
        .collect();
    (body, values)
}

#[test]
fn a_full_topic_refuses_with_507_loses_nothing_and_resumes_after_draining() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut pair = Pair::new_with(
        dir.path(),
        "task_queue",
        None,
        "max_record_bytes = 16384\nmax_batch_bytes = 65536",
        &format!("disk_budget_bytes = {BUDGET}"),
    );
    pair.edge.start();
    pair.wait_for_edge();

    // Fill with the broker down.
    let mut acked = Vec::new();
    let mut next = 0u64;
    let refusal = loop {
        let (body, values) = batch(next, 100);
        match pair.publish_ndjson(body) {
            Ok((base, end)) => {
                assert_eq!(base, next);
                acked.extend(values);
                next = end;
            }
            Err(e) => break e,
        }
        assert!(next < 1_000_000, "the budget never filled");
    };
    assert!(refusal.starts_with("status 507"), "{refusal}");
    assert!(refusal.contains("/plant1/readings"), "{refusal}");
    assert!(refusal.contains(&BUDGET.to_string()), "{refusal}");
    let state = pair.topic_state().expect("topic state");
    let used = state["wal_bytes"].as_u64().expect("wal_bytes");
    assert!(
        used <= BUDGET + BUDGET / 100,
        "overshoot: {used} > {BUDGET} + 1 %"
    );

    // Broker up: the topic drains, space frees, publishing resumes.
    pair.broker.start();
    pair.wait_acknowledged(next, Duration::from_secs(120));
    let mut resumed = None;
    for _ in 0..100 {
        let (body, values) = batch(next, 100);
        if let Ok((base, end)) = pair.publish_ndjson(body) {
            assert_eq!(base, next);
            acked.extend(values);
            next = end;
            resumed = Some(end);
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        resumed.is_some(),
        "publishing did not resume after draining"
    );
    pair.wait_acknowledged(next, Duration::from_secs(60));
    assert_eq!(pair.broker.terminate(), Some(0));
    assert_eq!(pair.edge.terminate(), Some(0));

    let central = read_wal(&pair.broker_data.join("topics/plant1/readings"));
    assert_eq!(central.len(), acked.len());
    for (i, ((offset, stored), value)) in central.iter().zip(&acked).enumerate() {
        assert_eq!(*offset, i as u64);
        assert_eq!(stored.as_ref(), value.as_bytes());
    }
}

/// The config trial: a budget lowered below what the active segment holds
/// (a segment is sized from the budget it was created under: 64 MiB
/// without one) refused every publish for good, though the broker held
/// every record. The active segment, all of it acknowledged, gives its
/// room back and publishing goes on.
#[test]
fn a_budget_lowered_below_an_acknowledged_active_segment_gives_the_room_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut pair = Pair::new_with(
        dir.path(),
        "task_queue",
        None,
        "max_record_bytes = 16384\nmax_batch_bytes = 65536",
        "retain_until = \"acknowledged\"",
    );
    pair.broker.start();
    pair.edge.start();
    pair.wait_for_edge();
    let mut next = 0u64;
    for _ in 0..15 {
        let (body, _) = batch(next, 100);
        let (base, end) = pair.publish_ndjson(body).expect("publish");
        assert_eq!(base, next);
        next = end;
    }
    pair.wait_acknowledged(next, Duration::from_secs(60));
    // About 330 kB, all in the one active segment; the new budget is
    // 2 x max_batch_bytes.
    assert_eq!(pair.edge.terminate(), Some(0));
    let config_path = dir.path().join("edge.toml");
    let config = std::fs::read_to_string(&config_path).expect("edge config");
    // In the topic's table (the last one; `[replication]` has a
    // `retain_until` too).
    let at = config
        .rfind("retain_until = \"acknowledged\"")
        .expect("the topic's retain_until");
    let mut lowered = config.clone();
    lowered.insert_str(at, "disk_budget_bytes = 131072\n");
    assert_ne!(config, lowered);
    std::fs::write(&config_path, lowered).expect("write edge config");
    pair.edge.start();
    pair.wait_for_edge();
    let (body, _) = batch(next, 100);
    let (base, end) = pair
        .publish_ndjson(body)
        .expect("publish after the budget was lowered");
    assert_eq!(base, next);
    pair.wait_acknowledged(end, Duration::from_secs(60));
    let (consumed, gaps) = pair.consume_all("check", end);
    assert!(gaps.is_empty(), "{gaps:?}");
    assert_eq!(consumed.len() as u64, end, "every record once");
    assert_eq!(pair.broker.terminate(), Some(0));
    assert_eq!(pair.edge.terminate(), Some(0));
}
