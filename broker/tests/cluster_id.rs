//! The cluster's identity (`/cluster/id`, FORMAT.md "Cluster identity") on
//! a three-broker cluster of real processes: the brokers, started
//! together, each try to create it and all end up with one committed
//! value, which `GET /v1/cluster/status` shows; restarting every broker
//! keeps it.

mod common;

use std::time::{Duration, Instant};

use common::{Node, wait_for_leader};
use tributary_proto::cluster::ClusterId;

/// Waits (60 s at most) until every running node's status names a cluster
/// id; returns them in node order.
fn cluster_ids(nodes: &[Node]) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ids: Vec<Option<String>> = nodes
            .iter()
            .map(|n| {
                n.status()
                    .and_then(|s| s["cluster_id"].as_str().map(str::to_owned))
            })
            .collect();
        if ids.iter().all(Option::is_some) {
            return ids.into_iter().flatten().collect();
        }
        assert!(
            Instant::now() < deadline,
            "no cluster id on every node within 60 s: {ids:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn three_brokers_agree_on_one_cluster_id_and_keep_it_across_restarts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut nodes = common::start_three(dir.path(), 1000);
    wait_for_leader(&nodes);
    let ids = cluster_ids(&nodes);
    let id = ClusterId::parse(&ids[0]).expect("a UUID");
    assert_eq!(id.to_string(), ids[0], "canonical text");
    assert_eq!(ids[1], ids[0]);
    assert_eq!(ids[2], ids[0]);

    // Without a majority (two of three brokers down) the survivor cannot
    // read Raft, yet still names the id it read: the id never changes (it
    // answered `null` after a 2 s read timeout).
    nodes[1].kill();
    nodes[2].kill();
    let status = nodes[0].status().expect("the survivor answers");
    assert_eq!(
        status["cluster_id"].as_str(),
        Some(ids[0].as_str()),
        "{status}"
    );

    // Every broker restarts: the id is read back, not made again.
    for node in &mut nodes {
        node.kill();
    }
    for node in &mut nodes {
        node.start();
    }
    wait_for_leader(&nodes);
    assert_eq!(cluster_ids(&nodes), ids);
}
