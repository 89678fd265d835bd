//! Segment descriptors (what the tier service commits through
//! `POST /v1/storage/descriptors`) in a three-broker Raft cluster of real
//! `broker` processes: they survive a leader SIGKILL and a restart of every
//! broker, byte for byte, and `segments/cur` keeps the tiered offset
//! continuous across both.

mod common;

use std::time::{Duration, Instant};

use common::{Node, TOKEN, agent, get_json, wait_for_leader};

use serde_json::{Value, json};
use tributary_proto::archive::SegmentDescriptor;
use tributary_proto::keys::{StorageKeys, TopicName};

fn post(url: &str, body: &Value) -> (u16, Value) {
    let mut response = agent()
        .post(url)
        .header("Authorization", &format!("Bearer {TOKEN}"))
        .send_json(body)
        .expect("POST");
    let status = response.status().as_u16();
    let body = response
        .body_mut()
        .read_json::<Value>()
        .unwrap_or(Value::Null);
    (status, body)
}

/// A self-consistent descriptor of offsets `start..=end` (the broker checks
/// consistency and continuity, not the object).
fn descriptor(topic: &TopicName, start: u64, end: u64) -> SegmentDescriptor {
    let batches_bytes = 4000 + start;
    SegmentDescriptor {
        start_offset: start,
        end_offset: end,
        record_count: end - start + 1,
        size: batches_bytes + 16 + 112,
        object_id: StorageKeys::default().segment_object(topic, start, end),
        format_version: tributary_proto::archive::FORMAT_VERSION,
        checksum_crc32c: 0x1000 + start as u32,
        batches_crc32c: 0x2000 + start as u32,
        batches_bytes,
        index_position: batches_bytes,
        index_bytes: 16,
        first_timestamp_ms: 1_700_000_000_000 + start as i64,
        max_timestamp_ms: 1_700_000_000_000 + end as i64,
        created_at_ms: 1_800_000_000_000 + start as i64,
    }
}

fn commit(node: &Node, topic: &TopicName, d: &SegmentDescriptor) -> (u16, Value) {
    post(
        &node.url("/storage/descriptors"),
        &json!({ "topic": topic, "descriptor": d }),
    )
}

/// The committed descriptors, `cur` and tiered offset as `node` lists them,
/// retried (bounded) until they equal `expected`.
fn assert_listed(node: &Node, topic: &TopicName, expected: &[SegmentDescriptor]) {
    let want = json!({
        "topic": topic,
        "segments": expected,
        "cur": expected.last().map(|d| d.start_offset),
        "tiered_offset": expected.last().map(|d| d.end_offset + 1),
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let got = get_json(&node.url(&format!("/storage/topics{topic}/segments")));
        if got.as_ref() == Ok(&want) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "node {}: listed {got:?}, expected {want}",
            node.id
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn descriptors_survive_a_leader_kill_and_a_full_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut nodes = common::start_three(dir.path(), 20);
    let topic = TopicName::new("/plant/line-1").unwrap();
    let other = TopicName::new("/plant/line-2").unwrap();
    let leader = wait_for_leader(&nodes);
    let mut committed = Vec::new();
    let mut other_committed = Vec::new();

    // Ten segments of 100 offsets through a follower (forwarded).
    let follower = nodes.iter().position(|n| n.id != leader).unwrap();
    for i in 0..10u64 {
        let d = descriptor(&topic, i * 100, i * 100 + 99);
        let (status, body) = commit(&nodes[follower], &topic, &d);
        assert_eq!(status, 201, "{body}");
        assert_eq!(body["tiered_offset"], json!(i * 100 + 100));
        committed.push(d);
    }
    let d = descriptor(&other, 0, 49);
    assert_eq!(commit(&nodes[follower], &other, &d).0, 201);
    other_committed.push(d);
    for node in &nodes {
        assert_listed(node, &topic, &committed);
    }

    // SIGKILL the leader: the survivors elect another and keep the
    // descriptors; commits continue from the same tiered offset.
    let old = nodes.iter().position(|n| n.id == leader).unwrap();
    nodes[old].kill();
    let new_leader = wait_for_leader(&nodes);
    assert_ne!(new_leader, leader);
    let survivor = nodes.iter().position(|n| n.is_running()).unwrap();
    assert_listed(&nodes[survivor], &topic, &committed);
    // A gap is refused, the same descriptor again is unchanged, a
    // different one at a committed start is a conflict.
    let gap = descriptor(&topic, 1100, 1199);
    let (status, body) = commit(&nodes[survivor], &topic, &gap);
    assert_eq!(
        (status, body["kind"].as_str()),
        (409, Some("not_contiguous"))
    );
    let (status, body) = commit(&nodes[survivor], &topic, &committed[3]);
    assert_eq!((status, body["outcome"].as_str()), (200, Some("unchanged")));
    let mut changed = descriptor(&topic, 300, 399);
    changed.checksum_crc32c ^= 1;
    assert_eq!(commit(&nodes[survivor], &topic, &changed).0, 409);
    for i in 10..20u64 {
        let d = descriptor(&topic, i * 100, i * 100 + 99);
        let (status, body) = commit(&nodes[survivor], &topic, &d);
        assert_eq!(status, 201, "{body}");
        committed.push(d);
    }
    let d = descriptor(&other, 50, 99);
    assert_eq!(commit(&nodes[survivor], &other, &d).0, 201);
    other_committed.push(d);

    // The old leader comes back and catches up (by snapshot: 20 entries
    // per snapshot, 5 kept).
    nodes[old].start();
    wait_for_leader(&nodes);
    for node in &nodes {
        assert_listed(node, &topic, &committed);
        assert_listed(node, &other, &other_committed);
    }

    // Every broker SIGKILLed at once, then restarted: the descriptors are
    // read back from disk byte for byte, on every node.
    for node in &mut nodes {
        node.kill();
    }
    for node in &mut nodes {
        node.start();
    }
    wait_for_leader(&nodes);
    for node in &nodes {
        assert_listed(node, &topic, &committed);
        assert_listed(node, &other, &other_committed);
        let topics = get_json(&node.url("/storage/topics")).unwrap();
        assert_eq!(
            topics["topics"],
            json!([
                {"topic": topic, "segments": 20, "cur": 1900, "tiered_offset": 2000},
                {"topic": other, "segments": 2, "cur": 50, "tiered_offset": 100},
            ]),
            "node {}",
            node.id
        );
    }
    // And the tiered offset continues after the restart.
    let d = descriptor(&topic, 2000, 2099);
    let (status, body) = commit(&nodes[0], &topic, &d);
    assert_eq!(status, 201, "{body}");
    committed.push(d);
    for node in &nodes {
        assert_listed(node, &topic, &committed);
    }
}
