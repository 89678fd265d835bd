//! Placement rules: unassigned and orphaned topics get live owners, epochs
//! only grow, live owners keep their topics, rebalancing has hysteresis.

use std::collections::{BTreeMap, BTreeSet};

use super::placement::{
    ClusterSnapshot, MoveError, Previous, plan, plan_drain, plan_move, plan_rebalance,
};
use super::{Assignment, BrokerLifecycle, Unassigned, pinned_broker};
use crate::keys::TopicName;

fn t(name: &str) -> TopicName {
    TopicName::new(name).expect("valid topic")
}

fn assigned(epoch: u64) -> Assignment {
    Assignment {
        epoch,
        assigned_at_ms: 1,
        previous_owner: None,
        reason: "new_topic".into(),
    }
}

fn waiting(last_epoch: u64, prefer: Option<u64>) -> Unassigned {
    Unassigned {
        last_epoch,
        last_owner: None,
        prefer,
        since_ms: 1,
        reason: "new_topic".into(),
    }
}

fn live(ids: &[u64]) -> BTreeMap<u64, BrokerLifecycle> {
    ids.iter()
        .map(|&id| (id, BrokerLifecycle::Active))
        .collect()
}

#[test]
fn unassigned_topics_go_to_the_least_loaded_live_broker_at_the_next_epoch() {
    let mut snapshot = ClusterSnapshot {
        live: live(&[1, 2, 3]),
        ..Default::default()
    };
    snapshot.assignments.insert(t("/a/x"), (1, assigned(1)));
    snapshot.assignments.insert(t("/a/y"), (2, assigned(4)));
    snapshot
        .unassigned
        .insert(t("/b/p-part-0"), waiting(0, None));
    snapshot
        .unassigned
        .insert(t("/b/p-part-1"), waiting(6, None));
    snapshot.unassigned.insert(t("/c/z"), waiting(0, None));
    let changes = plan(&snapshot, 100);
    let got: Vec<(String, u64, u64)> = changes
        .iter()
        .map(|c| (c.topic.as_str().to_owned(), c.to, c.assignment.epoch))
        .collect();
    // Broker 3 owns nothing: first; then ties by lowest id.
    assert_eq!(
        got,
        vec![
            ("/b/p-part-0".into(), 3, 1),
            ("/b/p-part-1".into(), 1, 7),
            ("/c/z".into(), 2, 1),
        ]
    );
    assert!(changes.iter().all(|c| c.assignment.assigned_at_ms == 100));
}

#[test]
fn a_dead_owners_topics_move_and_a_live_owner_keeps_its_own() {
    let mut snapshot = ClusterSnapshot {
        live: live(&[2, 3]),
        ..Default::default()
    };
    snapshot.assignments.insert(t("/a/x"), (1, assigned(3)));
    snapshot.assignments.insert(t("/a/y"), (1, assigned(9)));
    snapshot.assignments.insert(t("/a/z"), (2, assigned(2)));
    let changes = plan(&snapshot, 5);
    assert_eq!(changes.len(), 2);
    for c in &changes {
        assert_ne!(c.to, 1);
        assert_eq!(c.assignment.previous_owner, Some(1));
        assert_eq!(c.assignment.reason, "owner_dead");
        assert_eq!(c.assignment.epoch, c.previous.epoch() + 1);
        assert!(matches!(c.previous, Previous::Owner(1, _)));
    }
    // Spread: broker 3 (0 topics) first, then broker 2 and 3 tie at 1 → 2.
    assert_eq!(changes[0].to, 3);
    assert_eq!(changes[1].to, 2);
    // Within a new Raft leader's first lease TTL nothing is taken over
    // (the owner may be alive and not have renewed yet); new topics are
    // still placed.
    snapshot.takeovers_from_ms = 6;
    assert!(plan(&snapshot, 5).is_empty());
    assert_eq!(plan(&snapshot, 6).len(), 2);
    // An owner the Raft leader knows to be gone (no answer in its term)
    // is taken over without the wait.
    snapshot.unreachable = BTreeSet::from([1]);
    assert_eq!(plan(&snapshot, 5).len(), 2);
    snapshot.unreachable = BTreeSet::from([9]);
    assert!(plan(&snapshot, 5).is_empty());
    snapshot.unreachable.clear();
    snapshot.unassigned.insert(t("/a/new"), waiting(0, None));
    let placed = plan(&snapshot, 5);
    assert_eq!(placed.len(), 1, "{placed:?}");
    assert_eq!(placed[0].topic, t("/a/new"));
    snapshot.unassigned.clear();
    snapshot.takeovers_from_ms = 0;
    // With every broker alive nothing moves.
    snapshot.live = live(&[1, 2, 3]);
    assert!(plan(&snapshot, 5).is_empty());
    // With no broker alive nothing can move.
    snapshot.live.clear();
    assert!(plan(&snapshot, 5).is_empty());
}

#[test]
fn preferred_pinned_and_draining_brokers() {
    let mut snapshot = ClusterSnapshot {
        live: live(&[1, 2]),
        ..Default::default()
    };
    snapshot.live.insert(3, BrokerLifecycle::Draining);
    snapshot.unassigned.insert(t("/a/x"), waiting(0, Some(2)));
    snapshot.unassigned.insert(t("/a/y"), waiting(0, Some(3)));
    snapshot
        .unassigned
        .insert(t("/_system/audit-broker-3"), waiting(0, None));
    snapshot
        .unassigned
        .insert(t("/_system/audit-broker-4"), waiting(0, None));
    let changes = plan(&snapshot, 1);
    let got: BTreeMap<String, u64> = changes
        .iter()
        .map(|c| (c.topic.as_str().to_owned(), c.to))
        .collect();
    // Preferred 2 is live; preferred 3 drains (least loaded instead); the
    // audit topic of 3 stays with 3 (live, even draining); 4 is dead: waits.
    assert_eq!(
        got,
        BTreeMap::from([
            ("/_system/audit-broker-3".to_owned(), 3),
            ("/a/x".to_owned(), 2),
            ("/a/y".to_owned(), 1),
        ])
    );
    assert_eq!(pinned_broker(&t("/_system/audit-broker-12")), Some(12));
    assert_eq!(pinned_broker(&t("/_system/other")), None);
    assert_eq!(pinned_broker(&t("/plant/audit-broker-1")), None);
}

#[test]
fn moves_are_checked_and_rebalancing_stops_within_one_topic_of_even() {
    let mut snapshot = ClusterSnapshot {
        live: live(&[1, 2, 3]),
        ..Default::default()
    };
    for i in 0..7 {
        snapshot
            .assignments
            .insert(t(&format!("/a/t{i}")), (1, assigned(1)));
    }
    snapshot
        .assignments
        .insert(t("/_system/audit-broker-1"), (1, assigned(1)));
    assert_eq!(
        plan_move(&snapshot, &t("/a/t0"), 1, "move", 1),
        Err(MoveError::AlreadyThere {
            topic: t("/a/t0"),
            broker: 1
        })
    );
    assert_eq!(
        plan_move(&snapshot, &t("/a/t0"), 9, "move", 1),
        Err(MoveError::TargetNotLive(9))
    );
    assert!(matches!(
        plan_move(&snapshot, &t("/_system/audit-broker-1"), 2, "move", 1),
        Err(MoveError::Pinned { broker: 1, .. })
    ));
    assert_eq!(
        plan_move(&snapshot, &t("/a/none"), 2, "move", 1),
        Err(MoveError::NotAssigned(t("/a/none")))
    );
    let moved = plan_move(&snapshot, &t("/a/t0"), 2, "move", 1).expect("move");
    assert_eq!((moved.to, moved.assignment.epoch), (2, 2));

    // Topics that must stay (centrally written) are not moved, and count:
    // with all of broker 1's topics staying, nothing moves.
    let all: BTreeSet<TopicName> = snapshot.assignments.keys().cloned().collect();
    assert_eq!(plan_rebalance(&snapshot, 1, 100, &all), vec![]);
    let one = BTreeSet::from([t("/a/t0")]);
    assert!(
        plan_rebalance(&snapshot, 1, 100, &one)
            .iter()
            .all(|m| m.topic != t("/a/t0"))
    );

    // 8 on broker 1 (one pinned), 0 and 0: rebalance to 3/3/2 (the pinned
    // audit topic stays and counts), then nothing more.
    let moves = plan_rebalance(&snapshot, 1, 100, &BTreeSet::new());
    assert_eq!(moves.len(), 5);
    let mut load = BTreeMap::from([(1u64, 8u64), (2, 0), (3, 0)]);
    for m in &moves {
        *load.get_mut(&1).unwrap() -= 1;
        *load.get_mut(&m.to).unwrap() += 1;
    }
    assert_eq!(load, BTreeMap::from([(1, 3), (2, 3), (3, 2)]));
    for m in &moves {
        snapshot
            .assignments
            .insert(m.topic.clone(), (m.to, m.assignment.clone()));
    }
    assert!(
        plan_rebalance(&snapshot, 1, 100, &BTreeSet::new()).is_empty(),
        "hysteresis"
    );
    assert_eq!(
        plan_rebalance(&ClusterSnapshot::default(), 1, 10, &BTreeSet::new()),
        vec![]
    );

    // Draining broker 1 hands over everything but its audit topic.
    let drain = plan_drain(&snapshot, 1, 1);
    assert_eq!(drain.len(), 2);
    assert!(
        drain
            .iter()
            .all(|c| c.to != 1 && c.assignment.reason == "drain")
    );
}

/// A dead owner's topic and its dead-letter topic `{t}-dlq` go to one
/// broker, and a topic goes where its dead-letter topic lives; a
/// rebalance does not move a topic away from the dead-letter topic that
/// stays with its owner. Apart, every poison message waited: a dead-letter
/// copy is appended only by the dead-letter topic's owner (the consumer
/// trial: a crash and a rebalance split two task queues from theirs).
#[test]
fn a_topic_and_its_dead_letter_topic_stay_together() {
    let mut snapshot = ClusterSnapshot {
        live: live(&[2, 3]),
        ..Default::default()
    };
    snapshot.assignments.insert(t("/p/jobs"), (1, assigned(1)));
    snapshot
        .assignments
        .insert(t("/p/jobs-dlq"), (1, assigned(1)));
    snapshot.assignments.insert(t("/q/jobs"), (1, assigned(4)));
    snapshot
        .assignments
        .insert(t("/q/jobs-dlq"), (3, assigned(2)));
    snapshot.assignments.insert(t("/z/z"), (2, assigned(1)));
    let got: BTreeMap<String, u64> = plan(&snapshot, 100)
        .iter()
        .map(|c| (c.topic.as_str().to_owned(), c.to))
        .collect();
    // Least loaded alone put /p/jobs on 2 and its dead-letter topic on 3,
    // then /q/jobs on 2, away from its dead-letter topic on 3.
    assert_eq!(got["/p/jobs"], got["/p/jobs-dlq"], "{got:?}");
    assert_eq!(got["/q/jobs"], 3, "{got:?}");

    let mut snapshot = ClusterSnapshot {
        live: live(&[1, 2]),
        ..Default::default()
    };
    for name in ["/a/x", "/a/y", "/p/jobs", "/p/jobs-dlq"] {
        snapshot.assignments.insert(t(name), (1, assigned(1)));
    }
    let stay: BTreeSet<TopicName> = [t("/p/jobs-dlq")].into();
    let moved: Vec<String> = plan_rebalance(&snapshot, 100, 10, &stay)
        .iter()
        .map(|c| c.topic.as_str().to_owned())
        .collect();
    assert_eq!(moved, vec!["/a/y".to_owned(), "/a/x".to_owned()]);
}
