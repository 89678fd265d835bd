//! The tier service and topic ownership, against the stand-in broker of
//! `common` (the real admin router over a redb store and real WALs):
//! - a topic another broker owns is skipped: nothing uploaded, nothing
//!   committed, counted; once its broker owns it, it is tiered;
//! - uploads are create-if-absent: a committed object with other bytes is
//!   never replaced (the segment is refused), an uncommitted leftover is.

mod common;

use std::time::{Duration, Instant};

use broker_core::metadata::MetadataStore;
use broker_core::wal::list_sealed_segments;
use common::{Harness, assert_contiguous};
use tributary_broker::cluster::Route;
use tributary_proto::cluster::Assignment;
use tributary_proto::keys::{StorageKeys, TopicName, cluster as cluster_keys};
use tributary_tier::error::TierError;
use tributary_tier::faults::Faults;
use tributary_tier::service;

fn run_once(h: &Harness) -> service::RunReport {
    h.runtime
        .block_on(service::run(
            h.tier_config(),
            Faults::none(),
            true,
            std::future::pending(),
        ))
        .unwrap()
}

fn assign(h: &Harness, topic: &TopicName, owner: u64, epoch: u64) {
    let assignment = Assignment {
        epoch,
        assigned_at_ms: 1,
        previous_owner: None,
        reason: "new_topic".into(),
    };
    h.runtime
        .block_on(h.store.put(
            &cluster_keys::broker_assignment(owner, topic),
            serde_json::to_value(assignment).unwrap(),
        ))
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while h.clusters[0].owner(topic) != Some((owner, epoch)) {
        assert!(Instant::now() < deadline, "assignment not seen");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_topic_another_broker_owns_is_skipped_with_no_upload() {
    let h = Harness::with_cluster(&["/ns/owned-elsewhere"]);
    let topic = h.topics[0].clone();
    h.write(300, 10);
    assign(&h, &topic, 2, 1);
    assert!(matches!(h.clusters[0].route(&topic), Route::Remote(_)));
    let report = run_once(&h);
    let pass = &report.passes[0];
    assert_eq!(pass.skipped_not_owner, 1, "{pass:?}");
    assert_eq!((pass.committed, pass.uploaded_bytes), (0, 0), "{pass:?}");
    assert!(pass.errors.is_empty(), "skipping is not an error: {pass:?}");
    assert!(
        h.objects(&topic).is_empty(),
        "uploaded for a topic it does not own"
    );
    assert!(h.descriptors(&topic).is_empty());

    // Moved to this broker: the next run tiers every sealed segment.
    h.runtime
        .block_on(h.clusters[1].move_topic(&topic, 1))
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !matches!(h.clusters[0].route(&topic), Route::Local { epoch: 2 }) {
        assert!(Instant::now() < deadline, "move not seen");
        std::thread::sleep(Duration::from_millis(20));
    }
    let report = run_once(&h);
    let pass = &report.passes[0];
    assert_eq!(pass.skipped_not_owner, 0, "{pass:?}");
    assert!(pass.errors.is_empty(), "{pass:?}");
    assert!(pass.committed > 0, "{pass:?}");
    let descriptors = h.descriptors(&topic);
    assert_contiguous(&topic, &descriptors, 0, 300);
    assert_eq!(h.objects(&topic).len(), descriptors.len());
}

/// The object file of `key` in the local bucket.
fn object_path(h: &Harness, key: &str) -> std::path::PathBuf {
    h.bucket_dir.join(key)
}

#[test]
fn a_committed_object_with_other_bytes_is_never_replaced() {
    let h = Harness::with_retention(&["/ns/conflict"], false);
    let topic = h.topics[0].clone();
    h.write(200, 10);
    let report = run_once(&h);
    assert!(report.passes[0].errors.is_empty(), "{:?}", report.passes[0]);
    let descriptors = h.descriptors(&topic);
    assert!(!descriptors.is_empty());
    let first = descriptors[0].clone();
    // Another writer's bytes at the committed key (its footer differs).
    let path = object_path(&h, &first.object_id);
    let mut bytes = std::fs::read(&path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&path, &bytes).unwrap();
    let tiering = service::build(&h.tier_config(), Faults::none()).unwrap();
    let dir = h
        .data_dir
        .join("topics")
        .join(topic.namespace())
        .join(topic.topic());
    let sealed = list_sealed_segments(&dir).unwrap();
    let segment = sealed
        .iter()
        .find(|s| s.base_offset == first.start_offset)
        .unwrap();
    let mut pass = tributary_tier::tiering::PassReport::default();
    let result = h
        .runtime
        .block_on(tiering.tier_segment(&topic, segment, &mut pass));
    assert!(
        matches!(&result, Err(TierError::ObjectConflict { key, .. }) if *key == first.object_id),
        "{result:?}"
    );
    assert!(
        result.unwrap_err().to_string().contains("not replaced"),
        "a clear error"
    );
    assert_eq!(
        std::fs::read(&path).unwrap(),
        bytes,
        "the committed object was replaced"
    );
    assert_eq!(h.descriptors(&topic), descriptors);
}

#[test]
fn an_uncommitted_leftover_is_replaced_and_an_identical_object_reused() {
    let h = Harness::with_retention(&["/ns/leftover"], false);
    let topic = h.topics[0].clone();
    h.write(200, 10);
    let dir = h
        .data_dir
        .join("topics")
        .join(topic.namespace())
        .join(topic.topic());
    let sealed = list_sealed_segments(&dir).unwrap();
    let keys = StorageKeys::default();
    let first = &sealed[0];
    let key = keys.segment_object(&topic, first.base_offset, first.next_offset - 1);
    // A never-committed upload with other bytes at the first key.
    let path = object_path(&h, &key);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, b"not this segment").unwrap();
    let report = run_once(&h);
    let pass = &report.passes[0];
    assert!(pass.errors.is_empty(), "{pass:?}");
    assert_eq!(pass.object_conflicts, 0);
    let descriptors = h.descriptors(&topic);
    assert_contiguous(&topic, &descriptors, 0, 200);
    assert_eq!(
        std::fs::metadata(&path).unwrap().len(),
        descriptors[0].size,
        "the leftover was not replaced"
    );
    // A redo over stored, identical objects uploads nothing.
    let tiering = service::build(&h.tier_config(), Faults::none()).unwrap();
    let mut pass = tributary_tier::tiering::PassReport::default();
    let again = h
        .runtime
        .block_on(tiering.tier_segment(&topic, first, &mut pass))
        .unwrap();
    assert!(again.same_object(&descriptors[0]), "{again:?}");
    assert_eq!(pass.uploaded_bytes, 0);
}

/// The archive audit in a cluster: each broker's tier service audits the
/// topics its broker owns. A topic another broker owns is left to that
/// broker's tier service, whose marks its broker accepts: auditing it here
/// too raised every missing object once per tier service, and the marks
/// this broker refuses (`409 not_owner`) as audit failures.
#[test]
fn the_audit_leaves_a_topic_another_broker_owns_to_that_brokers_tier_service() {
    let h = Harness::with_cluster(&["/ns/audited-elsewhere"]);
    let topic = h.topics[0].clone();
    assign(&h, &topic, 1, 1);
    h.write(300, 10);
    let report = run_once(&h);
    assert!(!report.has_errors(), "{report:?}");
    let descriptors = h.descriptors(&topic);
    assert_contiguous(&topic, &descriptors, 0, 300);
    let (key, _) = h.objects(&topic).into_iter().next().unwrap();
    std::fs::remove_file(object_path(&h, &key)).unwrap();

    // Owned here: the audit finds the missing object.
    let report = run_once(&h);
    let audit = &report.audits[0];
    assert_eq!(audit.topics, 1, "{audit:?}");
    assert_eq!(audit.lost.len(), 1, "{audit:?}");
    assert!(audit.errors.is_empty(), "{audit:?}");

    // Owned by broker 2: not audited here, and no failure.
    h.runtime
        .block_on(h.clusters[1].move_topic(&topic, 2))
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !matches!(h.clusters[0].route(&topic), Route::Remote(_)) {
        assert!(Instant::now() < deadline, "move not seen");
        std::thread::sleep(Duration::from_millis(20));
    }
    let report = run_once(&h);
    let audit = &report.audits[0];
    assert_eq!(
        (audit.topics, audit.checked, audit.lost.len()),
        (0, 0, 0),
        "{audit:?}"
    );
    assert!(audit.errors.is_empty(), "{audit:?}");
}
