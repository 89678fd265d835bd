//! Declared holes in the archive (issue 15, "replication past damage"): a
//! central WAL segment whose offsets skip a hole recorded in Raft is
//! archived with the hole in the object, verified as intact, read across,
//! trimmed; a gap no one declared still stops the topic's tiering.

mod common;

use std::ops::ControlFlow;

use common::{Harness, record_for};
use tributary_archive::Bucket;
use tributary_archive::reader::{Archive, Start};
use tributary_proto::archive::HoleRange;
use tributary_proto::batch::Codec;
use tributary_proto::keys::{StorageKeys, TopicName};
use tributary_proto::replication::frame::HoleCause;
use tributary_proto::replication::hole::HoleRecord;
use tributary_tier::faults::Faults;
use tributary_tier::service::{self, RunReport};

fn run_once(h: &Harness) -> RunReport {
    h.runtime
        .block_on(service::run(
            h.tier_config(),
            Faults::none(),
            true,
            std::future::pending(),
        ))
        .unwrap()
}

fn archive(h: &Harness) -> Archive {
    Archive::new(
        Bucket::local(h.bucket_dir.clone()).unwrap(),
        StorageKeys::default(),
    )
}

/// Appends records `first..end` to the topic's WAL in one batch.
fn append(h: &Harness, topic: &TopicName, first: u64, end: u64) {
    let wal = h.wal(topic);
    h.runtime.block_on(async {
        assert_eq!(wal.next_offset(), first);
        let records = (first..end)
            .map(|o| record_for(topic.as_str(), o))
            .collect();
        wal.append(records, Codec::None).await.unwrap();
    });
}

/// Declares `first..end` a hole in the WAL (as the broker does for a
/// `Hole` frame) and, with `record`, in the metadata store at
/// `/topics/{ns}/{topic}/holes/{first:020}`.
fn hole(h: &Harness, topic: &TopicName, first: u64, end: u64, record: bool) {
    let wal = h.wal(topic);
    h.runtime.block_on(async {
        assert_eq!(wal.next_offset(), first);
        if record {
            let value = serde_json::to_value(HoleRecord::new(
                first,
                end,
                HoleCause::Damaged,
                "test: damaged at the edge".into(),
                1,
            ))
            .unwrap();
            let key = tributary_proto::keys::topics::hole(topic, first);
            broker_core::metadata::MetadataStore::put(&*h.store, &key, value)
                .await
                .unwrap();
        }
        wal.skip_to(end).await.unwrap();
    });
}

fn range(first_offset: u64, end_offset: u64) -> HoleRange {
    HoleRange {
        first_offset,
        end_offset,
    }
}

#[test]
fn a_segment_with_declared_holes_is_archived_verified_read_and_trimmed() {
    let h = Harness::with_retention(&["/ns/holes"], true);
    let topic = h.topics[0].clone();
    // One segment: records 0..10, hole 10..15, records 15..20, hole 20..25
    // at its end; then a second segment 25..30.
    append(&h, &topic, 0, 10);
    hole(&h, &topic, 10, 15, true);
    append(&h, &topic, 15, 20);
    hole(&h, &topic, 20, 25, true);
    h.runtime.block_on(h.wal(&topic).roll()).unwrap();
    append(&h, &topic, 25, 30);
    h.runtime.block_on(h.wal(&topic).roll()).unwrap();
    let sealed = h.wal(&topic).sealed_segments();
    assert_eq!(
        sealed
            .iter()
            .map(|s| (s.base_offset, s.next_offset))
            .collect::<Vec<_>>(),
        [(0, 25), (25, 30)]
    );

    let report = run_once(&h);
    assert!(!report.has_errors(), "{report:?}");
    let descriptors = h.descriptors(&topic);
    assert_eq!(descriptors.len(), 2);
    assert_eq!(
        (
            descriptors[0].start_offset,
            descriptors[0].end_offset,
            descriptors[0].record_count,
            descriptors[0].format_version
        ),
        (0, 24, 15, 2)
    );
    assert_eq!(descriptors[1].format_version, 1, "no hole: version 1");
    assert!(
        h.wal(&topic).sealed_segments().is_empty(),
        "tiered segments are trimmed"
    );

    // Verify, bucket only (what `tribctl archive verify` calls).
    let a = archive(&h);
    let (objects, _) = h.runtime.block_on(a.segments(&topic)).unwrap();
    let verdict = h.runtime.block_on(a.verify(&objects[0], &mut |_| {}));
    assert!(verdict.damage.is_empty(), "{:?}", verdict.damage);
    assert_eq!(verdict.holes, [range(10, 15), range(20, 25)]);
    assert_eq!(verdict.records_ok, 15);

    // Reading steps over the holes and names them, in order.
    let events = std::cell::RefCell::new(Vec::new());
    h.runtime
        .block_on(a.read_with_holes(
            &topic,
            Start::Offset(3),
            &mut |r| {
                assert_eq!(r.record, record_for(topic.as_str(), r.offset));
                events.borrow_mut().push(format!("{}", r.offset));
                ControlFlow::Continue(())
            },
            &mut |hole| events.borrow_mut().push(format!("hole {hole}")),
        ))
        .unwrap();
    let expected: Vec<String> = (3..10)
        .map(|o| o.to_string())
        .chain(["hole 10..15".to_string()])
        .chain((15..20).map(|o| o.to_string()))
        .chain(["hole 20..25".to_string()])
        .chain((25..30).map(|o| o.to_string()))
        .collect();
    assert_eq!(events.into_inner(), expected);
}

#[test]
fn an_undeclared_gap_still_stops_tiering_of_the_topic() {
    let h = Harness::with_retention(&["/ns/gap"], false);
    let topic = h.topics[0].clone();
    append(&h, &topic, 0, 10);
    // Skipped in the WAL, but no hole recorded in Raft.
    hole(&h, &topic, 10, 15, false);
    append(&h, &topic, 15, 20);
    h.runtime.block_on(h.wal(&topic).roll()).unwrap();
    let report = run_once(&h);
    assert!(report.has_errors(), "{report:?}");
    let text = format!("{report:?}");
    assert!(
        text.contains("starts at offset 15, expected 10"),
        "the error names the gap: {text}"
    );
    assert!(h.descriptors(&topic).is_empty());
    assert_eq!(h.wal(&topic).sealed_segments().len(), 1, "kept locally");
}
