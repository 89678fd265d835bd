//! Start-up reconciliation and the archive reader, in process: the tier
//! service library against the stand-in broker of `common`.

mod common;

use std::ops::ControlFlow;

use common::{Harness, record_for};
use tributary_archive::Bucket;
use tributary_archive::reader::{Archive, Start};
use tributary_proto::keys::StorageKeys;
use tributary_tier::TierError;
use tributary_tier::faults::Faults;
use tributary_tier::service::{self, DataDirLock, RunReport};
use tributary_tier::upload::{UploadTuning, upload_segment};

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

#[test]
fn a_committed_object_that_vanished_is_uploaded_again_from_the_local_segment() {
    let h = Harness::with_retention(&["/ns/keep"], false);
    h.write(2000, 20);
    let first = run_once(&h);
    assert!(!first.has_errors(), "{first:?}");
    let topic = &h.topics[0];
    let descriptors = h.descriptors(topic);
    assert!(descriptors.len() >= 3);
    let victim = &descriptors[1];
    let path = h.bucket_dir.join(&victim.object_id);
    let original = std::fs::read(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    let report = run_once(&h);
    assert_eq!(report.reconcile.reuploaded, vec![victim.object_id.clone()]);
    assert!(!report.has_errors(), "{report:?}");
    assert_eq!(
        std::fs::read(&path).unwrap(),
        original,
        "rebuilt byte for byte"
    );
    // Truncated object: of the wrong size, also uploaded again.
    std::fs::write(&path, &original[..100]).unwrap();
    let report = run_once(&h);
    assert_eq!(report.reconcile.reuploaded, vec![victim.object_id.clone()]);
    assert_eq!(std::fs::read(&path).unwrap(), original);
}

#[test]
fn a_committed_object_that_vanished_without_local_copy_is_reported() {
    let h = Harness::new(&["/ns/gone"]);
    h.write(600, 20);
    assert!(!run_once(&h).has_errors());
    let topic = &h.topics[0];
    assert!(h.wal(topic).sealed_segments().is_empty(), "trimmed");
    let victim = h.descriptors(topic)[0].clone();
    std::fs::remove_file(h.bucket_dir.join(&victim.object_id)).unwrap();
    let report = run_once(&h);
    assert!(report.has_errors());
    assert_eq!(
        report.reconcile.missing,
        vec![(
            topic.to_string(),
            victim.start_offset,
            victim.end_offset,
            victim.object_id.clone()
        )]
    );
}

#[test]
fn orphan_objects_are_adopted_or_deleted() {
    let h = Harness::with_retention(&["/ns/orphans"], false);
    h.write(3000, 20);
    let topic = h.topics[0].clone();
    let keys = StorageKeys::default();
    let sealed = h.wal(&topic).sealed_segments();
    assert!(sealed.len() >= 4, "{}", sealed.len());
    let bucket = Bucket::local(h.bucket_dir.clone()).unwrap();
    let key_of =
        |i: usize| keys.segment_object(&topic, sealed[i].base_offset, sealed[i].next_offset - 1);
    // Segments 0 and 1 stored but never committed (a crash after upload);
    // segment 1's object then damaged.
    for (i, segment) in sealed.iter().enumerate().take(2) {
        h.runtime
            .block_on(upload_segment(
                &bucket,
                &key_of(i),
                segment,
                &UploadTuning::default(),
                &Faults::none(),
            ))
            .unwrap();
    }
    let damaged = h.bucket_dir.join(key_of(1));
    let mut bytes = std::fs::read(&damaged).unwrap();
    bytes[200] ^= 0x40;
    std::fs::write(&damaged, &bytes).unwrap();
    // An object overlapping segment 0 with another range, and a foreign
    // file under the segments prefix.
    let overlapping = keys.segment_object(&topic, sealed[0].base_offset, sealed[0].base_offset + 2);
    std::fs::write(h.bucket_dir.join(&overlapping), b"left over").unwrap();
    let foreign = format!("{}notes.txt", keys.segment_objects_prefix(&topic));
    std::fs::write(h.bucket_dir.join(&foreign), b"hello").unwrap();

    let report = run_once(&h);
    let r = &report.reconcile;
    assert_eq!(r.adopted, vec![key_of(0)], "{r:?}");
    assert!(r.deleted.contains(&key_of(1)), "{r:?}");
    assert!(r.deleted.contains(&overlapping), "{r:?}");
    assert_eq!(r.foreign, vec![foreign.clone()]);
    assert!(!report.has_errors(), "{report:?}");
    // The pass uploaded segment 1 again and committed the rest.
    let descriptors = h.descriptors(&topic);
    assert_eq!(descriptors.len(), sealed.len());
    let objects = h.objects(&topic);
    for d in &descriptors {
        assert_eq!(objects.get(&d.object_id), Some(&d.size));
    }
    assert_eq!(
        objects.len(),
        descriptors.len() + 1,
        "only the foreign file is extra"
    );
    let a = archive(&h);
    let (listed, _) = h.runtime.block_on(a.segments(&topic)).unwrap();
    for object in &listed {
        let verdict = h.runtime.block_on(a.verify(object, &mut |_| {}));
        assert!(verdict.damage.is_empty(), "{verdict:?}");
    }
}

#[test]
fn one_tier_service_per_data_directory() {
    let dir = tempfile::tempdir().unwrap();
    let first = DataDirLock::acquire(dir.path()).unwrap();
    assert!(matches!(
        DataDirLock::acquire(dir.path()),
        Err(TierError::Locked { .. })
    ));
    drop(first);
    DataDirLock::acquire(dir.path()).unwrap();
}

#[test]
fn the_first_record_at_an_offset_takes_two_reads() {
    let h = Harness::new(&["/ns/read"]);
    h.write(2000, 10);
    assert!(!run_once(&h).has_errors());
    let topic = h.topics[0].clone();
    let descriptors = h.descriptors(&topic);
    assert!(descriptors.len() >= 5);
    let a = archive(&h);
    let (objects, _) = h.runtime.block_on(a.segments(&topic)).unwrap();
    for target in [0u64, 1, 777, 1234, 1999] {
        let object = objects
            .iter()
            .find(|o| o.start_offset <= target && target <= o.end_offset)
            .unwrap();
        let before = a.bucket().requests();
        let index = h.runtime.block_on(a.open(object)).unwrap();
        let block = index.block_for_offset(target).unwrap();
        let mut found = None;
        let flow = h
            .runtime
            .block_on(a.read_block(object, &index, block, &mut |r| {
                if r.offset >= target {
                    found = Some(r);
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            }))
            .unwrap();
        assert!(flow.is_break());
        let after = a.bucket().requests();
        assert_eq!(after.gets - before.gets, 2, "offset {target}");
        assert_eq!((after.heads, after.lists), (before.heads, before.lists));
        let found = found.unwrap();
        assert_eq!(found.offset, target);
        assert_eq!(found.record, record_for(topic.as_str(), target));
    }
    // Across objects, from a timestamp: record o has timestamp base + 10 o.
    let t = 1_700_000_000_000 + 10 * 1500 - 5;
    let mut got = Vec::new();
    h.runtime
        .block_on(a.read(&topic, Start::Timestamp(t), &mut |r| {
            got.push(r.offset);
            ControlFlow::Continue(())
        }))
        .unwrap();
    assert_eq!(got, (1500..2000).collect::<Vec<_>>());
}
