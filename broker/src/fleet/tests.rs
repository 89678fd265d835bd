//! The fleet registry: entries at connect and disconnect, what is due for
//! writing, adopting an earlier process's entries, the metrics' values.

use std::sync::Arc;

use broker_core::clock::ManualClock;
use tributary_proto::fleet::EdgeEntry;
use tributary_proto::keys::TopicName;

use super::{Fleet, FleetConfig};

fn fleet(clock: &Arc<ManualClock>) -> Arc<Fleet> {
    Fleet::new(7, clock.clone(), FleetConfig::default())
}

fn addr(port: u16) -> std::net::SocketAddr {
    std::net::SocketAddr::from(([10, 0, 0, 9], port))
}

fn entry_of(fleet: &Fleet, edge: &str) -> EdgeEntry {
    fleet
        .entries()
        .into_iter()
        .find(|(e, _)| e == edge)
        .map(|(_, entry)| entry)
        .expect("entry")
}

#[test]
fn a_connection_is_seen_now_and_its_end_is_remembered_with_the_offsets() {
    let clock = Arc::new(ManualClock::new(1_000));
    let fleet = fleet(&clock);
    let conn = fleet.connected("plant1", addr(5000));
    let topic = TopicName::new("/plant1/readings").unwrap();
    let progress = conn.topic(&topic);
    progress.acknowledged(40);
    progress.acknowledged(30); // never backwards
    progress.edge_reports(55);
    clock.set(4_000);
    let e = entry_of(&fleet, "plant1");
    assert_eq!(
        (e.connections, e.since_ms, e.last_seen_ms),
        (1, 1_000, 4_000)
    );
    assert_eq!(e.remote_addr, "10.0.0.9:5000");
    let t = e.topics["/plant1/readings"];
    assert_eq!(
        (t.acknowledged_offset, t.edge_high_water_mark, t.updated_ms),
        (40, Some(55), 4_000)
    );
    assert_eq!(fleet.metrics(), vec![("plant1".to_owned(), true, 4.0)]);
    clock.set(6_500);
    conn.closed("timed out");
    clock.set(9_000);
    let e = entry_of(&fleet, "plant1");
    assert_eq!(
        (e.connections, e.since_ms, e.last_seen_ms),
        (0, 6_500, 6_500)
    );
    assert_eq!(
        e.topics["/plant1/readings"].updated_ms, 4_000,
        "unchanged offsets keep their time"
    );
    assert_eq!(fleet.metrics(), vec![("plant1".to_owned(), false, 6.5)]);
}

#[test]
fn connection_changes_are_due_at_once_and_the_rest_only_periodically() {
    let clock = Arc::new(ManualClock::new(1_000));
    let fleet = fleet(&clock);
    let conn = fleet.connected("plant1", addr(5000));
    let due = fleet.due(false);
    assert_eq!(due.len(), 1, "the connect is due");
    fleet.written(due);
    assert!(fleet.due(false).is_empty(), "written");
    // Connected: refreshed at every periodic report.
    assert_eq!(fleet.due(true).len(), 1);
    let progress = conn.topic(&TopicName::new("/plant1/a").unwrap());
    progress.acknowledged(5);
    assert!(fleet.due(false).is_empty(), "offsets wait for the period");
    let due = fleet.due(true);
    assert_eq!(due[0].1.topics["/plant1/a"].acknowledged_offset, 5);
    fleet.written(due);
    drop(conn); // ends it, like `closed`
    let due = fleet.due(false);
    assert_eq!(due.len(), 1, "the disconnect is due");
    assert_eq!(due[0].1.connections, 0);
    fleet.written(due);
    // Disconnected and unchanged: nothing more to write, ever.
    assert!(fleet.due(true).is_empty());
}

#[test]
fn two_connections_of_one_edge_end_one_at_a_time() {
    let clock = Arc::new(ManualClock::new(1_000));
    let fleet = fleet(&clock);
    let first = fleet.connected("plant1", addr(5000));
    clock.set(2_000);
    let second = fleet.connected("plant1", addr(5001));
    first.closed("closed");
    let e = entry_of(&fleet, "plant1");
    assert_eq!((e.connections, e.since_ms), (1, 2_000));
    assert_eq!(e.remote_addr, "10.0.0.9:5001");
    second.closed("closed");
    first.closed("closed again: ignored");
    assert_eq!(entry_of(&fleet, "plant1").connections, 0);
}

#[test]
fn entries_of_an_earlier_process_are_adopted_as_disconnected() {
    let clock = Arc::new(ManualClock::new(50_000));
    let fleet = fleet(&clock);
    let mut topics = std::collections::BTreeMap::new();
    topics.insert(
        "/plant1/a".to_owned(),
        tributary_proto::fleet::TopicEntry {
            acknowledged_offset: 12,
            edge_high_water_mark: Some(20),
            updated_ms: 30_000,
        },
    );
    let stale = EdgeEntry {
        connections: 2,
        remote_addr: "10.0.0.9:5000".into(),
        since_ms: 10_000,
        last_seen_ms: 40_000,
        topics,
    };
    fleet.adopt("plant1", &stale);
    let due = fleet.due(false);
    assert_eq!(due.len(), 1, "rewritten as ended");
    let e = &due[0].1;
    assert_eq!(
        (e.connections, e.since_ms, e.last_seen_ms),
        (0, 40_000, 40_000)
    );
    assert_eq!(e.topics["/plant1/a"].updated_ms, 30_000);
    fleet.written(due);
    let clean = EdgeEntry {
        connections: 0,
        ..stale.clone()
    };
    fleet.adopt("plant2", &clean);
    assert!(
        fleet.due(true).is_empty(),
        "an entry already disconnected is not rewritten"
    );
    // An edge that connected before the adoption keeps its live state.
    let conn = fleet.connected("plant3", addr(6000));
    fleet.adopt("plant3", &stale);
    assert_eq!(entry_of(&fleet, "plant3").connections, 1);
    drop(conn);
}
