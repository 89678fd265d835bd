//! Kill the real `tier-service` binary at every step of the commit order
//! (and with SIGKILL at random moments), run it again, and check after
//! every run that nothing was lost and, at the end, that nothing is left
//! over:
//! - no local segment is deleted before its descriptor is committed (the
//!   stand-in broker checks at every trim);
//! - every committed descriptor has its object, of the recorded size;
//! - finally every sealed offset range is in exactly one committed
//!   descriptor with a matching object, and the bucket holds no object
//!   without a descriptor.

mod common;

use std::collections::BTreeSet;
use std::ops::ControlFlow;
use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

use common::{Harness, assert_contiguous, record_for};
use tributary_archive::Bucket;
use tributary_archive::reader::{Archive, Start};
use tributary_proto::keys::StorageKeys;
use tributary_tier::faults::FAULT_POINTS;

/// Sealed ranges seen so far, per topic.
fn sealed_ranges(h: &Harness) -> Vec<BTreeSet<(u64, u64)>> {
    h.topics
        .iter()
        .map(|t| {
            h.wal(t)
                .sealed_segments()
                .iter()
                .map(|s| (s.base_offset, s.next_offset))
                .collect()
        })
        .collect()
}

/// The safety invariants, checked after every (possibly killed) run.
fn check_safe(h: &Harness, context: &str) {
    assert_eq!(h.violations(), Vec::<String>::new(), "{context}");
    for topic in &h.topics {
        let descriptors = h.descriptors(topic);
        let objects = h.objects(topic);
        for d in &descriptors {
            assert_eq!(
                objects.get(&d.object_id),
                Some(&d.size),
                "{context}: {topic}: committed {} has no object of its size",
                d.object_id
            );
        }
        // Offsets below the local log start are all committed.
        let log_start = h.wal(topic).log_start_offset();
        let tiered = descriptors.last().map_or(0, |d| d.next_offset());
        assert!(
            log_start <= tiered || log_start == 0,
            "{context}: {topic}: local log starts at {log_start}, tiered only to {tiered}"
        );
        if log_start > 0 {
            assert_contiguous(topic, &descriptors, 0, tiered);
        }
    }
}

fn run_tier(h: &Harness, fault: Option<&str>) -> std::process::ExitStatus {
    let mut cmd = h.tier_command();
    if let Some(fault) = fault {
        cmd.env("TRIB_TIER_FAULT", fault);
    }
    let output = cmd.output().unwrap();
    let status = output.status;
    if fault.is_none() && !status.success() {
        panic!(
            "tier-service failed: {status}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    if let Some(fault) = fault
        && status.signal().is_none()
        && !status.success()
    {
        panic!(
            "tier-service with {fault} exited with {status} (not a crash)\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    status
}

fn check_final(h: &Harness, all_sealed: &[BTreeSet<(u64, u64)>]) {
    let bucket = Bucket::local(h.bucket_dir.clone()).unwrap();
    let archive = Archive::new(bucket, StorageKeys::default());
    for (topic, sealed) in h.topics.iter().zip(all_sealed) {
        let descriptors = h.descriptors(topic);
        let end = h.wal(topic).next_offset();
        assert_contiguous(topic, &descriptors, 0, end);
        // Every sealed range ever seen is exactly one descriptor.
        let ranges: BTreeSet<(u64, u64)> = descriptors
            .iter()
            .map(|d| (d.start_offset, d.next_offset()))
            .collect();
        assert_eq!(&ranges, sealed, "{topic}: descriptors vs sealed segments");
        // No orphans: objects are exactly the descriptors' objects.
        let objects: BTreeSet<String> = h.objects(topic).into_keys().collect();
        let referenced: BTreeSet<String> =
            descriptors.iter().map(|d| d.object_id.clone()).collect();
        assert_eq!(objects, referenced, "{topic}: objects vs descriptors");
        // Local segments: everything tiered is gone (retention 0).
        assert!(
            h.wal(topic).sealed_segments().is_empty(),
            "{topic}: sealed segments left locally"
        );
        // No staging files of interrupted uploads either.
        let dir = h
            .bucket_dir
            .join(StorageKeys::default().segment_objects_prefix(topic));
        let staging: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains('#'))
            .collect();
        assert!(
            staging.is_empty(),
            "{topic}: staging files left: {staging:?}"
        );
        // Every object verifies and the records are the ones written.
        let (listed, foreign) = h.runtime.block_on(archive.segments(topic)).unwrap();
        assert!(foreign.is_empty());
        for object in &listed {
            let verdict = h.runtime.block_on(archive.verify(object, &mut |_| {}));
            assert!(verdict.damage.is_empty(), "{topic}: {:?}", verdict.damage);
        }
        let mut next = 0u64;
        h.runtime
            .block_on(archive.read(topic, Start::Offset(0), &mut |r| {
                assert_eq!(r.offset, next);
                assert_eq!(r.record, record_for(topic.as_str(), r.offset));
                next += 1;
                ControlFlow::Continue(())
            }))
            .unwrap();
        assert_eq!(next, end, "{topic}: records read back");
    }
}

#[test]
fn killed_at_every_step_then_rerun() {
    let h = Harness::new(&["/plant/line-1", "/plant/line-2"]);
    let mut all_sealed = vec![BTreeSet::new(); h.topics.len()];
    let mut remember = |h: &Harness| {
        for (seen, now) in all_sealed.iter_mut().zip(sealed_ranges(h)) {
            seen.extend(now);
        }
    };
    h.write(900, 40);
    remember(&h);
    let mut crashes = 0;
    // Each point right after one that leaves it work: `after_upload` leaves
    // an orphan object that the next start-up reconciliation adopts.
    let points = [
        "before_upload",
        "mid_upload",
        "after_upload",
        "reconcile_after_adopt",
        "after_verify",
        "after_commit",
        "after_trim",
    ];
    // Cold retention's point is covered by tests/storage_ops.rs, the
    // lakehouse writer's two by tests/lakehouse.rs.
    assert_eq!(points.len(), FAULT_POINTS.len() - 3);
    for round in 0..2u64 {
        for point in points {
            let nth = 1 + round;
            let status = run_tier(&h, Some(&format!("{point}:{nth}")));
            if status.signal().is_some() {
                crashes += 1;
            }
            eprintln!(
                "{point}:{nth}: {status}; descriptors {:?}, local sealed {:?}",
                h.topics
                    .iter()
                    .map(|t| h.descriptors(t).len())
                    .collect::<Vec<_>>(),
                h.topics
                    .iter()
                    .map(|t| h.wal(t).sealed_segments().len())
                    .collect::<Vec<_>>()
            );
            check_safe(&h, &format!("after a crash at {point}:{nth}"));
            // New sealed segments (about 3 per topic) for the next run.
            h.write(700, 25);
            remember(&h);
        }
    }
    assert!(
        crashes >= 2 * points.len() - 1,
        "only {crashes} runs crashed"
    );
    run_tier(&h, None);
    check_safe(&h, "after the clean run");
    check_final(&h, &all_sealed);
}

#[test]
fn sigkill_at_random_moments_then_rerun() {
    let h = Harness::new(&["/site/a"]);
    let mut all_sealed = vec![BTreeSet::new()];
    // A deterministic sequence of delays (LCG, seed printed on failure).
    let seed: u64 = 0x5eed_7121;
    let mut state = seed;
    for i in 0..8 {
        h.write(400, 30);
        for (seen, now) in all_sealed.iter_mut().zip(sealed_ranges(&h)) {
            seen.extend(now);
        }
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let delay = Duration::from_millis(5 + (state >> 33) % 120);
        let mut child = h.tier_command().spawn().unwrap();
        std::thread::sleep(delay);
        let _ = child.kill();
        let _ = child.wait();
        eprintln!(
            "kill {i} after {delay:?}: descriptors {}, local sealed {}, objects {}",
            h.descriptors(&h.topics[0]).len(),
            h.wal(&h.topics[0]).sealed_segments().len(),
            h.objects(&h.topics[0]).len()
        );
        check_safe(&h, &format!("seed {seed:#x}, kill {i} after {delay:?}"));
    }
    run_tier(&h, None);
    check_safe(&h, "after the clean run");
    check_final(&h, &all_sealed);
}
