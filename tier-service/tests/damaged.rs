//! A damaged local segment (issue 16, defect 3, the tier service's part): a
//! sealed segment whose bytes fail their CRC is not uploaded, is reported
//! once (log) and counted (`tributary_tier_damaged_segments`), segments
//! before it are tiered and trimmed as usual, nothing after it is
//! committed; once the segment is healed (its bytes rewritten intact, as
//! the broker's refetch does) the next pass uploads it and the rest. A
//! segment whose data file is gone (its index kept: the broker lists its
//! range as damaged and re-fetches it) is treated the same way.

mod common;

use common::{Harness, assert_contiguous};
use tributary_tier::faults::Faults;
use tributary_tier::service;

#[test]
fn a_damaged_local_segment_is_not_uploaded_and_is_after_it_heals() {
    // One after the other: the damage gauge is process-wide.
    for deleted in [false, true] {
        damaged_then_healed(deleted);
    }
}

fn damaged_then_healed(deleted: bool) {
    let h = Harness::with_retention(&["/ns/damaged"], false);
    let topic = h.topics[0].clone();
    h.write(1500, 20);
    let sealed = h.wal(&topic).sealed_segments();
    assert!(sealed.len() >= 3, "{}", sealed.len());
    let victim = sealed[1].clone();
    let intact = std::fs::read(&victim.log_path).unwrap();
    let mut flipped = intact.clone();
    let at = flipped.len() / 2;
    flipped[at] ^= 0x40;
    if deleted {
        std::fs::remove_file(&victim.log_path).unwrap();
    } else {
        std::fs::write(&victim.log_path, &flipped).unwrap();
    }

    let run = || {
        h.runtime
            .block_on(service::run(
                h.tier_config(),
                Faults::none(),
                true,
                std::future::pending(),
            ))
            .unwrap()
    };
    for _ in 0..2 {
        let report = run();
        let pass = &report.passes[0];
        assert_eq!(
            pass.damaged,
            vec![(topic.to_string(), victim.base_offset, victim.next_offset)],
            "deleted {deleted}: {report:?}"
        );
        assert!(pass.errors.is_empty(), "deleted {deleted}: {report:?}");
        assert!(report.has_errors());
        // Only the segment before the damage is archived.
        let descriptors = h.descriptors(&topic);
        assert_contiguous(&topic, &descriptors, 0, victim.base_offset);
        assert!(h.objects(&topic).len() == 1, "{:?}", h.objects(&topic));
        let text = tributary_tier::metrics::STATS.render().unwrap();
        assert!(
            text.lines()
                .any(|l| l == "tributary_tier_damaged_segments 1"),
            "{text}"
        );
    }

    // Healed: the next pass uploads it and every later segment.
    std::fs::write(&victim.log_path, &intact).unwrap();
    let report = run();
    assert!(!report.has_errors(), "{report:?}");
    let end = h.wal(&topic).next_offset();
    assert_contiguous(&topic, &h.descriptors(&topic), 0, end);
    assert_eq!(h.objects(&topic).len(), sealed.len());
    let text = tributary_tier::metrics::STATS.render().unwrap();
    assert!(
        text.lines()
            .any(|l| l == "tributary_tier_damaged_segments 0"),
        "{text}"
    );
    assert!(h.violations().is_empty(), "{:?}", h.violations());
}
