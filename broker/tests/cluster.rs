//! A three-broker metadata cluster of real `broker` processes on 127.0.0.1
//! (Raft over QUIC with mutual TLS):
//! - writes sent to a follower are forwarded to the leader;
//! - the cluster keeps serving writes when the leader is SIGKILLed;
//! - a restarted node catches up, by snapshot when the leader has purged the
//!   log it missed;
//! - a broker with a certificate from another CA cannot join.

mod common;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::{Node, TOKEN, agent, get_json, wait_for_leader, write_config};
use tributary_test_support::ports::{free_tcp, free_udp};

fn create_namespace(node: &Node, name: &str) {
    let mut response = agent()
        .post(&node.url("/namespaces"))
        .header("Authorization", &format!("Bearer {TOKEN}"))
        .send_json(serde_json::json!({ "name": name }))
        .expect("create namespace request");
    let status = response.status().as_u16();
    let body = response.body_mut().read_to_string().unwrap_or_default();
    assert!(
        status == 200 || status == 201,
        "create {name} on node {}: {status} {body}",
        node.id
    );
}

/// The namespaces the test created (not `_system`, which holds each
/// broker's audit topic).
fn namespaces(node: &Node) -> BTreeSet<String> {
    let body = get_json(&node.url("/namespaces")).expect("list namespaces");
    body["namespaces"]
        .as_array()
        .expect("namespaces array")
        .iter()
        .filter_map(|v| v.as_str().map(str::to_string))
        .filter(|name| name != "_system")
        .collect()
}

fn applied(node: &Node) -> u64 {
    node.status()
        .and_then(|s| s["last_applied_index"].as_u64())
        .unwrap_or(0)
}

/// Waits (bounded) until every running node names the same leader.
fn wait_for_catch_up(node: &Node, target: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while applied(node) < target {
        assert!(
            Instant::now() < deadline,
            "node {} stuck at {} < {target}",
            node.id,
            applied(node)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn three_brokers_survive_leader_kill_and_catch_up_by_snapshot() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut nodes = common::start_three(dir.path(), 40);
    let leader = wait_for_leader(&nodes);
    let mut expected = BTreeSet::new();

    // Writes through a follower are forwarded to the leader.
    let follower = nodes.iter().position(|n| n.id != leader).expect("follower");
    for i in 0..10 {
        let name = format!("before-{i}");
        create_namespace(&nodes[follower], &name);
        expected.insert(name);
    }
    assert_eq!(namespaces(&nodes[follower]), expected);

    // SIGKILL the leader: the others elect a new one and keep serving writes.
    let old_leader = nodes.iter().position(|n| n.id == leader).expect("leader");
    nodes[old_leader].kill();
    let survivor = (old_leader + 1) % 3;
    for i in 0..10 {
        let name = format!("after-kill-{i}");
        create_namespace(&nodes[survivor], &name);
        expected.insert(name);
    }
    let new_leader = wait_for_leader(&nodes);
    assert_ne!(new_leader, leader);
    for node in nodes.iter().filter(|n| n.is_running()) {
        assert_eq!(namespaces(node), expected, "node {}", node.id);
    }

    // The old leader restarts and catches up.
    nodes[old_leader].start();
    let target = applied(&nodes[survivor]);
    wait_for_catch_up(&nodes[old_leader], target);
    assert_eq!(namespaces(&nodes[old_leader]), expected);

    // A follower that misses more than the leader keeps in its log gets a
    // snapshot.
    let leader = wait_for_leader(&nodes);
    let lagging = nodes
        .iter()
        .position(|n| n.id != leader)
        .expect("a follower");
    let lagging_applied = applied(&nodes[lagging]);
    nodes[lagging].kill();
    let writer = nodes
        .iter()
        .position(|n| n.is_running())
        .expect("a running node");
    for i in 0..100 {
        let name = format!("while-down-{i:03}");
        create_namespace(&nodes[writer], &name);
        expected.insert(name);
    }
    // Enough metadata that the snapshot is about a megabyte (the cluster
    // trial's 1.4 MB snapshot never reached its follower within openraft's
    // default 200 ms per snapshot request): 10 manifests of 2 topics of 64
    // partitions, each one Raft entry. (6 topics per manifest took about
    // 40 s an apply on a three-broker cluster, the request's timeout: the
    // slow partition creation the security trial measured, left alone.
    // Two topics took over 40 s too in a fresh-clone run on a loaded
    // machine: these applies get 240 s.)
    let bulk = common::agent_with_timeout(Duration::from_secs(240));
    for m in 0..10 {
        let name = format!("bulk-{m}");
        let topics: String = (0..2)
            .map(|t| {
                format!("  - name: /{name}/t{t}\n    intent: task_queue\n    partitions: 64\n")
            })
            .collect();
        let manifest = format!("namespaces:\n  - {name}\ntopics:\n{topics}");
        let mut response = bulk
            .post(&nodes[writer].url("/apply"))
            .header("Authorization", &format!("Bearer {TOKEN}"))
            .header("Content-Type", "application/yaml")
            .send(manifest.as_bytes())
            .expect("apply request");
        let status = response.status().as_u16();
        let body = response.body_mut().read_to_string().unwrap_or_default();
        assert_eq!(status, 200, "apply {name}: {body}");
        expected.insert(name);
    }
    for i in 0..50 {
        let name = format!("after-bulk-{i:03}");
        create_namespace(&nodes[writer], &name);
        expected.insert(name);
    }
    let leader_index = nodes
        .iter()
        .position(|n| n.id == leader)
        .expect("leader node");
    let leader_status = nodes[leader_index].status().expect("leader status");
    let purged = leader_status["purged_index"].as_u64().unwrap_or(0);
    assert!(
        purged > lagging_applied,
        "the leader must have purged past the lagging node ({purged} <= {lagging_applied})"
    );
    nodes[lagging].start();
    let target = applied(&nodes[leader_index]);
    wait_for_catch_up(&nodes[lagging], target);
    let status = nodes[lagging].status().expect("status");
    let snapshot = status["snapshot_index"].as_u64().unwrap_or(0);
    assert!(
        snapshot > lagging_applied,
        "caught up without a snapshot past {lagging_applied}: {status}"
    );
    assert_eq!(namespaces(&nodes[lagging]), expected);
}

#[test]
fn a_broker_from_another_ca_cannot_join() {
    let dir = tempfile::tempdir().expect("tempdir");
    let certs = dir.path().join("certs");
    let rogue_certs = dir.path().join("rogue");
    broker_core::dev_certs::issue(&certs, &[1, 2], &[]).expect("certs");
    broker_core::dev_certs::issue(&rogue_certs, &[2], &[]).expect("rogue certs");
    let raft: Vec<SocketAddr> = (0..2).map(|_| free_udp()).collect();
    let admins = [free_tcp(), free_tcp()];
    let mut good = Node::new(
        1,
        write_config(dir.path(), &certs, 1, &raft, admins[0], 40),
        admins[0],
    );
    let mut rogue = Node::new(
        2,
        write_config(dir.path(), &rogue_certs, 2, &raft, admins[1], 40),
        admins[1],
    );
    good.start();
    rogue.start();
    // With two members, a leader needs both votes: the rogue's are refused
    // by TLS, so no leader may appear.
    std::thread::sleep(Duration::from_secs(4));
    for node in [&good, &rogue] {
        let leader = node.status().and_then(|s| s["leader"].as_u64());
        assert_eq!(
            leader, None,
            "node {} found a leader with a rogue peer",
            node.id
        );
    }
}
