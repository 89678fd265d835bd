//! Segment descriptors (what the tier service commits through
//! `POST /v1/storage/descriptors`) in a three-broker Raft cluster of real
//! `broker` processes: they survive a leader SIGKILL and a restart of every
//! broker, byte for byte, and `segments/cur` keeps the tiered offset
//! continuous across both. The descriptors are real: each describes a
//! sealed segment of the WAL of the broker they are committed through
//! (centrally published), uploaded into the brokers' shared `[archive]`
//! bucket, since a broker verifies both before committing.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use broker_core::wal::list_sealed_segments;
use common::{Node, TOKEN, agent, get_json, wait_for_leader};
use tributary_archive::Bucket;
use tributary_tier::faults::Faults;
use tributary_tier::upload::upload_segment;

use serde_json::{Value, json};
use tributary_proto::archive::SegmentDescriptor;
use tributary_proto::keys::{StorageKeys, TopicName};

/// POSTs `body`; a `503 no_owner` (the broker cannot prove it owns the
/// topic now: its lease is not fresh after an election or a restart) is
/// retried after its `Retry-After` as the API asks a client to, for at most
/// 30 s. Any other answer is returned.
fn post(url: &str, body: &Value) -> (u16, Value) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut response = agent()
            .post(url)
            .header("Authorization", &format!("Bearer {TOKEN}"))
            .send_json(body)
            .expect("POST");
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        let answer = response
            .body_mut()
            .read_json::<Value>()
            .unwrap_or(Value::Null);
        if status != 503 || answer["kind"] != "no_owner" || Instant::now() >= deadline {
            return (status, answer);
        }
        std::thread::sleep(Duration::from_secs(retry_after.unwrap_or(1).min(5)));
    }
}

/// Publishes `count` records to `topic` through `node`'s central publish
/// API (one batch), then waits until the broker sealed them in a segment
/// of their own (`[wal] segment_max_age_ms`), uploads that segment into the
/// shared archive bucket as the tier service does, and returns its
/// descriptor (not committed).
fn publish_sealed_and_upload(
    runtime: &tokio::runtime::Runtime,
    dir: &Path,
    node: &Node,
    topic: &TopicName,
    count: u64,
) -> SegmentDescriptor {
    let wal_dir = dir
        .join(format!("node-{}", node.id))
        .join("topics")
        .join(topic.namespace())
        .join(topic.topic());
    let sealed_before = list_sealed_segments(&wal_dir).map_or(0, |s| s.len());
    let records: Vec<Value> = (0..count)
        .map(|i| json!({"value": format!("{topic} record {i}")}))
        .collect();
    let (status, body) = post(
        &node.url(&format!("/topics{topic}/records")),
        &json!({ "records": records }),
    );
    assert!(status == 200 || status == 201, "publish: {status} {body}");
    let deadline = Instant::now() + Duration::from_secs(30);
    let segment = loop {
        let sealed = list_sealed_segments(&wal_dir).unwrap_or_default();
        if sealed.len() > sealed_before {
            break sealed.last().cloned().unwrap();
        }
        assert!(Instant::now() < deadline, "segment not sealed within 30 s");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(segment.next_offset - segment.base_offset, count);
    let key =
        StorageKeys::default().segment_object(topic, segment.base_offset, segment.next_offset - 1);
    let bucket = Bucket::local(dir.join("archive")).unwrap();
    let tail = runtime
        .block_on(upload_segment(
            &bucket,
            &key,
            &segment,
            &Default::default(),
            &Faults::none(),
        ))
        .unwrap();
    SegmentDescriptor::from_footer(&tail.footer, key, 1_800_000_000_000)
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
        // Every node lists the same descriptors; which broker owns the topic
        // (`owner`, `epoch`, `owned_here`) differs by node and is not part
        // of what this test checks.
        let got = get_json(&node.url(&format!("/storage/topics{topic}/segments"))).map(|mut v| {
            if let Some(object) = v.as_object_mut() {
                for field in ["owner", "epoch", "owned_here"] {
                    object.remove(field);
                }
            }
            v
        });
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
    // Every broker checks objects in one shared bucket (`[archive]`) and
    // seals a quiet segment after 300 ms.
    let extra = format!(
        "[wal]\nsegment_max_age_ms = 300\n[archive.store]\nurl = \"{}\"\n",
        dir.path().join("archive").display()
    );
    let mut nodes = common::start_three_with(dir.path(), 20, &extra);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let topic = TopicName::new("/plant/line-1").unwrap();
    let other = TopicName::new("/plant/line-2").unwrap();
    let leader = wait_for_leader(&nodes);
    // The topics below are placed on the follower that is asked first.
    common::wait_for_live_brokers(&nodes);
    let mut committed = Vec::new();
    let mut other_committed = Vec::new();

    // Ten segments of 100 offsets, published to and committed through a
    // follower (its writes are forwarded to the leader); that follower
    // holds the topics' WALs.
    let holder = nodes.iter().position(|n| n.id != leader).unwrap();
    let manifest = "namespaces:\n  - plant\ntopics:\n  - name: /plant/line-1\n    intent: event_stream\n  - name: /plant/line-2\n    intent: event_stream\n";
    let response = agent()
        .post(&nodes[holder].url("/apply"))
        .header("Authorization", &format!("Bearer {TOKEN}"))
        .send(manifest)
        .expect("apply");
    assert_eq!(response.status().as_u16(), 200);
    let segment = |node: &Node, topic: &TopicName, count: u64| {
        publish_sealed_and_upload(&runtime, dir.path(), node, topic, count)
    };
    for i in 0..10u64 {
        let d = segment(&nodes[holder], &topic, 100);
        assert_eq!((d.start_offset, d.end_offset), (i * 100, i * 100 + 99));
        if i == 0 {
            // A tier service with another `prefix` than the broker's
            // [archive]: refused, nothing committed (the config trial's
            // broker committed it and trimmed, then found the records
            // nowhere under its own prefix).
            let (status, body) = post(
                &format!(
                    "{}?prefix=/other",
                    nodes[holder].url("/storage/descriptors")
                ),
                &json!({ "topic": topic, "descriptor": d }),
            );
            assert_eq!(
                (status, body["kind"].as_str()),
                (409, Some("prefix_mismatch")),
                "{body}"
            );
        }
        let (status, body) = commit(&nodes[holder], &topic, &d);
        assert_eq!(status, 201, "{body}");
        assert_eq!(body["tiered_offset"], json!(i * 100 + 100));
        committed.push(d);
    }
    let d = segment(&nodes[holder], &other, 50);
    assert_eq!(commit(&nodes[holder], &other, &d).0, 201);
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
    assert_listed(&nodes[holder], &topic, &committed);
    // A gap is refused, the same descriptor again is unchanged, a
    // different one at a committed start is a conflict.
    let next = segment(&nodes[holder], &topic, 100);
    let gap = segment(&nodes[holder], &topic, 100);
    assert_eq!((gap.start_offset, gap.end_offset), (1100, 1199));
    let (status, body) = commit(&nodes[holder], &topic, &gap);
    assert_eq!(
        (status, body["kind"].as_str()),
        (409, Some("not_contiguous")),
        "{body}"
    );
    let (status, body) = commit(&nodes[holder], &topic, &committed[3]);
    assert_eq!((status, body["outcome"].as_str()), (200, Some("unchanged")));
    let mut changed = committed[3].clone();
    changed.checksum_crc32c ^= 1;
    assert_eq!(commit(&nodes[holder], &topic, &changed).0, 409);
    for d in [next, gap] {
        let (status, body) = commit(&nodes[holder], &topic, &d);
        assert_eq!(status, 201, "{body}");
        committed.push(d);
    }
    for i in 12..20u64 {
        let d = segment(&nodes[holder], &topic, 100);
        assert_eq!(d.start_offset, i * 100);
        let (status, body) = commit(&nodes[holder], &topic, &d);
        assert_eq!(status, 201, "{body}");
        committed.push(d);
    }
    let d = segment(&nodes[holder], &other, 50);
    assert_eq!(commit(&nodes[holder], &other, &d).0, 201);
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
    let want = json!([
        {"topic": topic, "segments": 20, "cur": 1900, "tiered_offset": 2000},
        {"topic": other, "segments": 2, "cur": 50, "tiered_offset": 100},
    ]);
    for node in &nodes {
        assert_listed(node, &topic, &committed);
        assert_listed(node, &other, &other_committed);
        // Retried like `assert_listed`: a read right after the restart may
        // meet an election (an error, not other contents).
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let topics = get_json(&node.url("/storage/topics"));
            if topics.as_ref().is_ok_and(|t| t["topics"] == want) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "node {}: /storage/topics {topics:?}, expected {want}",
                node.id
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    // And the tiered offset continues after the restart, on whichever
    // broker owns the topic now (its lease may have lapsed during the
    // restart, and a new owner's log starts at the archive's end).
    common::wait_for_live_brokers(&nodes);
    let deadline = Instant::now() + Duration::from_secs(30);
    let owner = loop {
        let owner = nodes.iter().position(|n| {
            get_json(&n.url(&format!("/storage/topics{topic}/segments")))
                .is_ok_and(|v| v["owned_here"] == true)
        });
        if let Some(owner) = owner {
            break owner;
        }
        assert!(Instant::now() < deadline, "{topic} has no owner after 30 s");
        std::thread::sleep(Duration::from_millis(200));
    };
    let d = segment(&nodes[owner], &topic, 100);
    assert_eq!(d.start_offset, 2000);
    let (status, body) = commit(&nodes[owner], &topic, &d);
    assert_eq!(status, 201, "{body}");
    committed.push(d);
    for node in &nodes {
        assert_listed(node, &topic, &committed);
    }
}
