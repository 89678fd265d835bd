//! The broker as the authority on its log (issue 16, defect 1): the storage
//! API refuses a descriptor that could make a trim delete unarchived data,
//! each with a `409` naming the rule, and a trim deletes only segments
//! wholly covered by descriptors whose objects verify at that moment.
//! Against the real admin router with a real redb store, real topic WALs
//! and a real directory bucket (the stand-in broker of `common`).

mod common;

use broker_core::wal::{SealedSegment, WalConfig};
use common::{Harness, TOKEN, record_for};
use serde_json::{Value, json};
use tributary_archive::Bucket;
use tributary_proto::archive::SegmentDescriptor;
use tributary_proto::batch::Codec;
use tributary_proto::keys::{StorageKeys, TopicName};
use tributary_tier::faults::Faults;
use tributary_tier::upload::upload_segment;

fn post(h: &Harness, path: &str, body: Option<Value>) -> (u16, Value) {
    h.runtime.block_on(async {
        tributary_archive::install_crypto_provider();
        let mut request = reqwest::Client::new()
            .post(format!("{}/v1{path}", h.base_url))
            .bearer_auth(TOKEN);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    })
}

fn commit(h: &Harness, topic: &TopicName, d: &SegmentDescriptor) -> (u16, Value) {
    post(
        h,
        "/storage/descriptors",
        Some(json!({"topic": topic, "descriptor": d})),
    )
}

fn trim(h: &Harness, topic: &TopicName) -> (u16, Value) {
    post(h, &format!("/storage/topics{topic}/trim"), None)
}

/// A topic with three sealed segments of exactly 1,000 records each
/// (`0..1000`, `1000..2000`, `2000..3000`) and local retention that deletes
/// whatever the safe offset allows.
fn three_segments(h: &mut Harness, name: &str) -> TopicName {
    let topic = h.add_topic(
        name,
        WalConfig {
            segment_max_bytes: 64 * 1024 * 1024,
            retention_max_bytes: Some(0),
            ..WalConfig::default()
        },
    );
    let wal = h.wal(&topic);
    h.runtime.block_on(async {
        for _ in 0..3 {
            for _ in 0..40 {
                let base = wal.next_offset();
                let records = (base..base + 25)
                    .map(|o| record_for(topic.as_str(), o))
                    .collect();
                wal.append(records, Codec::None).await.unwrap();
            }
            wal.roll().await.unwrap();
        }
    });
    let sealed: Vec<(u64, u64)> = wal
        .sealed_segments()
        .iter()
        .map(|s| (s.base_offset, s.next_offset))
        .collect();
    assert_eq!(sealed, vec![(0, 1000), (1000, 2000), (2000, 3000)]);
    topic
}

fn segment(h: &Harness, topic: &TopicName, base: u64) -> SealedSegment {
    h.wal(topic)
        .sealed_segments()
        .into_iter()
        .find(|s| s.base_offset == base)
        .unwrap()
}

/// Uploads the sealed segment at `base` into the harness bucket as the
/// tier service does and returns its descriptor (not committed).
fn upload(h: &Harness, topic: &TopicName, base: u64) -> SegmentDescriptor {
    let segment = segment(h, topic, base);
    let keys = StorageKeys::default();
    let key = keys.segment_object(topic, segment.base_offset, segment.next_offset - 1);
    let bucket = Bucket::local(h.bucket_dir.clone()).unwrap();
    let tail = h
        .runtime
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

/// A self-consistent descriptor of `start..=end` whose object was never
/// written.
fn phantom(topic: &TopicName, start: u64, end: u64) -> SegmentDescriptor {
    let batches_bytes = 4000;
    SegmentDescriptor {
        start_offset: start,
        end_offset: end,
        record_count: end - start + 1,
        size: batches_bytes + 16 + 112,
        object_id: StorageKeys::default().segment_object(topic, start, end),
        format_version: tributary_proto::archive::FORMAT_VERSION,
        checksum_crc32c: 1,
        batches_crc32c: 2,
        batches_bytes,
        index_position: batches_bytes,
        index_bytes: 16,
        first_timestamp_ms: 1,
        max_timestamp_ms: 2,
        created_at_ms: 3,
    }
}

fn local_records(h: &Harness, topic: &TopicName) -> (u64, u64) {
    let wal = h.wal(topic);
    (wal.log_start_offset(), wal.next_offset())
}

/// Issue 16 defect 1 as observed: a first descriptor at offset 1,000 (its
/// object really uploaded) then a trim, and a descriptor ending a million
/// offsets past the high-water mark then a trim. Before the fix both were
/// committed and the trims deleted 2,000 acknowledged records (the first
/// 1,000 archived nowhere), then every later sealed segment.
#[test]
fn defect_1_descriptors_that_would_delete_unarchived_data_are_refused() {
    let mut h = Harness::with_retention(&[], true);
    let topic = three_segments(&mut h, "/ns/defect1");

    // A first descriptor that does not start at the log start (0).
    let second = upload(&h, &topic, 1000);
    let (status, body) = commit(&h, &topic, &second);
    assert_eq!(
        (status, body["kind"].as_str()),
        (409, Some("first_not_at_log_start")),
        "{body}"
    );
    let (status, body) = trim(&h, &topic);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["deleted"], json!([]), "{body}");
    assert_eq!(local_records(&h, &topic), (0, 3000), "nothing trimmed");

    // The legitimate first descriptor, then one that ends a million
    // offsets past the high-water mark (3000).
    let first = upload(&h, &topic, 0);
    assert_eq!(commit(&h, &topic, &first).0, 201);
    let far = phantom(&topic, 1000, 1_002_999);
    let (status, body) = commit(&h, &topic, &far);
    assert_eq!(
        (status, body["kind"].as_str()),
        (409, Some("past_high_water_mark")),
        "{body}"
    );
    // The trim deletes exactly the archived segment 0..1000.
    let bytes = segment(&h, &topic, 0).bytes;
    let (status, body) = trim(&h, &topic);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["deleted"], json!([[0, 1000, bytes]]), "{body}");
    assert_eq!(local_records(&h, &topic), (1000, 3000));
    assert!(h.violations().is_empty(), "{:?}", h.violations());
}

/// Every other refusal, then trims that delete nothing unarchived: an
/// object deleted from the bucket after its descriptor was committed keeps
/// its local segment (the trim re-verifies; `segments/cur` alone is never
/// trusted).
#[test]
fn every_descriptor_refusal_names_its_rule_and_trim_keeps_unarchived_segments() {
    let mut h = Harness::with_retention(&[], true);
    let topic = three_segments(&mut h, "/ns/rules");
    let first = upload(&h, &topic, 0);
    let second = upload(&h, &topic, 1000);
    let third = upload(&h, &topic, 2000);

    // Without `[archive]` the broker cannot check objects: it commits and
    // trims nothing.
    h.clear_archive();
    let (status, body) = commit(&h, &topic, &first);
    assert_eq!(
        (status, body["kind"].as_str()),
        (409, Some("archive_not_configured")),
        "{body}"
    );
    let (status, body) = trim(&h, &topic);
    assert_eq!(
        (status, body["kind"].as_str()),
        (409, Some("archive_not_configured")),
        "{body}"
    );
    h.set_archive(Bucket::local(h.bucket_dir.clone()).unwrap());

    // A topic whose WAL this broker does not hold.
    let elsewhere = TopicName::new("/ns/elsewhere").unwrap();
    let (status, body) = commit(&h, &elsewhere, &phantom(&elsewhere, 0, 9));
    assert_eq!(
        (status, body["kind"].as_str()),
        (409, Some("wal_not_local")),
        "{body}"
    );

    // Object missing, object of another size, object damaged.
    let object_path = h.bucket_dir.join(&first.object_id);
    let stored = std::fs::read(&object_path).unwrap();
    std::fs::remove_file(&object_path).unwrap();
    let (status, body) = commit(&h, &topic, &first);
    assert_eq!(
        (status, body["kind"].as_str()),
        (409, Some("object_missing")),
        "{body}"
    );
    std::fs::write(&object_path, &stored).unwrap();
    let mut bigger = first.clone();
    // 16 more batch bytes: self-consistent, but not the stored object.
    bigger.size += 16;
    bigger.batches_bytes += 16;
    bigger.index_position += 16;
    let (status, body) = commit(&h, &topic, &bigger);
    assert_eq!(
        (status, body["kind"].as_str()),
        (409, Some("object_mismatch")),
        "{body}"
    );
    let mut truncated = stored.clone();
    truncated.truncate(stored.len() - 7);
    std::fs::write(&object_path, &truncated).unwrap();
    let (status, body) = commit(&h, &topic, &first);
    assert_eq!(
        (status, body["kind"].as_str()),
        (409, Some("object_mismatch")),
        "{body}"
    );
    std::fs::write(&object_path, &stored).unwrap();
    assert_eq!(commit(&h, &topic, &first).0, 201);
    assert_eq!(commit(&h, &topic, &first).0, 200, "idempotent redo");

    // Offsets in the active segment: below the high-water mark, not sealed.
    let wal = h.wal(&topic);
    h.runtime.block_on(async {
        let records = (3000..3100)
            .map(|o| record_for(topic.as_str(), o))
            .collect();
        wal.append(records, Codec::None).await.unwrap();
    });
    let (status, body) = commit(&h, &topic, &phantom(&topic, 3000, 3099));
    assert_eq!(
        (status, body["kind"].as_str()),
        (409, Some("not_sealed")),
        "{body}"
    );

    // Segments 1000..2000 and 2000..3000 committed, then the object of
    // 1000..2000 vanishes from the bucket: `segments/cur` says 3000 is
    // tiered, but the trim deletes only 0..1000 and keeps the rest.
    assert_eq!(commit(&h, &topic, &second).0, 201);
    assert_eq!(commit(&h, &topic, &third).0, 201);
    std::fs::remove_file(h.bucket_dir.join(&second.object_id)).unwrap();
    let kept: u64 = [1000, 2000]
        .iter()
        .map(|&b| segment(&h, &topic, b).bytes)
        .sum();
    let bytes_0 = segment(&h, &topic, 0).bytes;
    let (status, body) = trim(&h, &topic);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["tiered_offset"], json!(3000), "{body}");
    assert_eq!(body["verified_offset"], json!(1000), "{body}");
    assert_eq!(body["deleted"], json!([[0, 1000, bytes_0]]), "{body}");
    assert_eq!(local_records(&h, &topic), (1000, 3100));
    let sealed = h.wal(&topic).sealed_segments();
    assert_eq!(sealed.len(), 2);
    assert_eq!(sealed.iter().map(|s| s.bytes).sum::<u64>(), kept);
    // A second trim deletes nothing more.
    let (_, body) = trim(&h, &topic);
    assert_eq!(body["deleted"], json!([]), "{body}");
    assert!(h.violations().is_empty(), "{:?}", h.violations());
}
