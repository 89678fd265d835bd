//! `full_policy = "drop_oldest"` during a broker outage (real binaries on
//! 127.0.0.1): the edge keeps taking records and deletes its oldest ones,
//! some never replicated. When the broker is back, the dropped offsets are
//! declared a hole and replication goes on: every record the edge still
//! holds reaches the broker once at its offset, and a consumer gets a gap
//! notice of kind `hole` for the dropped range. (The topic stopped for good
//! before: "broker resumes at X but the local log starts at Y".)

use std::time::Duration;

use tributary_api::consumer::{AttachRequest, GapKind, StartPosition, SubscriptionType};
use tributary_tests::cluster::{Pair, TOPIC};

const PER_BATCH: u64 = 10;

fn value(offset: u64) -> String {
    format!("reading-{offset:06}-{}", "x".repeat(40))
}

fn publish(pair: &Pair, next: &mut u64) {
    pair.publish_values(next, PER_BATCH, value);
}

fn log_start(pair: &Pair) -> u64 {
    pair.topic_state().expect("topic state")["log_start_offset"]
        .as_u64()
        .expect("log_start_offset")
}

#[test]
fn offsets_dropped_before_replication_are_a_hole_and_the_rest_replicates() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut pair = Pair::new_with(
        dir.path(),
        "event_stream",
        None,
        "max_record_bytes = 1024\nmax_batch_bytes = 4096",
        "disk_budget_bytes = 65536\nfull_policy = \"drop_oldest\"",
    );
    pair.broker.start();
    pair.edge.start();
    pair.wait_for_edge();
    let mut next = 0;
    for _ in 0..20 {
        publish(&pair, &mut next);
    }
    pair.wait_acknowledged(next, Duration::from_secs(60));
    let acknowledged = next;

    // The broker is away; the edge drops its oldest segments, some of them
    // never replicated, until it holds well past them.
    assert_eq!(pair.broker.terminate(), Some(0));
    let mut rounds = 0;
    while log_start(&pair) <= acknowledged + 100 {
        publish(&pair, &mut next);
        rounds += 1;
        assert!(rounds < 5_000, "nothing dropped past {acknowledged}");
    }
    let dropped_to = log_start(&pair);
    for _ in 0..5 {
        publish(&pair, &mut next);
    }
    // The edge still holds `dropped_to..next`, never acknowledged.
    assert_eq!(log_start(&pair), dropped_to, "no drop after the check");

    pair.broker.start();
    pair.wait_acknowledged(next, Duration::from_secs(60));
    let state = pair.topic_state().expect("topic state");
    assert!(state["stopped"].is_null(), "{state}");

    let (records, gaps) = pair.consume_all("after-drop", next);
    let offsets: Vec<u64> = records.keys().copied().collect();
    let expected: Vec<u64> = (0..acknowledged).chain(dropped_to..next).collect();
    assert_eq!(offsets, expected);
    for (offset, got) in &records {
        assert_eq!(got, &value(*offset), "value at {offset}");
    }
    assert_eq!(gaps.len(), 1, "{gaps:?}");
    assert_eq!(
        (gaps[0].first_offset, gaps[0].end_offset, gaps[0].kind),
        (acknowledged, dropped_to, GapKind::Hole),
        "{gaps:?}"
    );

    // Leased delivery (receive) names the hole once per answer, from the
    // first offset it crossed (it named it once per read step of 16
    // offsets, up to 63 times an answer), and delivers the same records.
    let client = pair.consumer();
    let attach = AttachRequest {
        subscription_type: SubscriptionType::Shared,
        start: StartPosition::Earliest,
        ..AttachRequest::default()
    };
    let session = client.attach(TOPIC, "leased", &attach).expect("attach");
    let mut received = Vec::new();
    let mut first_notice = None;
    for _ in 0..200 {
        let got = client
            .receive(TOPIC, "leased", session.consumer_id, 500, 200)
            .expect("receive");
        assert!(got.gaps.len() <= 1, "{:?}", got.gaps);
        if let Some(gap) = got.gaps.first() {
            assert_eq!((gap.end_offset, gap.kind), (dropped_to, GapKind::Hole));
            first_notice.get_or_insert(gap.first_offset);
        }
        let offsets: Vec<u64> = got.messages.iter().map(|m| m.offset).collect();
        if !offsets.is_empty() {
            client
                .ack(TOPIC, "leased", session.consumer_id, &offsets)
                .expect("ack");
        }
        received.extend(offsets);
        if received.len() == expected.len() {
            break;
        }
    }
    received.sort_unstable();
    assert_eq!(received, expected);
    assert_eq!(first_notice, Some(acknowledged));

    assert_eq!(pair.edge.terminate(), Some(0));
    assert_eq!(pair.broker.terminate(), Some(0));
}
