//! A single metadata node survives a restart after 20,000 writes with all
//! data intact. Nodes that never persist snapshots fail this: openraft purges
//! the log behind each snapshot, so without a persisted snapshot the purged
//! writes are gone after a restart.

use std::path::Path;
use std::sync::Arc;

use broker_core::tls::TlsIdentity;
use tributary_broker::raft::node::{MetaNode, NodeConfig};
use tributary_broker::raft::{MetaCommand, MetaCondition, MetaOp};
use tributary_test_support::ports::free_udp;

const WRITES: usize = 20_000;
const IN_FLIGHT: usize = 64;

/// Waits (at most 5 s) until UDP `addr` can be bound again. `shutdown`
/// closes the node's QUIC endpoint, but quinn releases the socket only when
/// its endpoint driver task next runs after the last handle is dropped: a
/// restart in the same process (only tests do that; a restarted broker is a
/// new process) must wait for that, or its bind races the old driver.
async fn wait_until_released(addr: std::net::SocketAddr) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while std::net::UdpSocket::bind(addr).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "{addr} still bound 5 s after the node's shutdown"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

fn dev_tls(dir: &Path) -> TlsIdentity {
    tributary_test_support::certs::issue(dir, &[1], &[]);
    tributary_test_support::certs::broker_identity(dir, 1)
}

fn put(i: usize) -> MetaCommand {
    MetaCommand::Txn {
        conditions: vec![],
        ops: vec![MetaOp::Put {
            key: format!("/test/key-{i:06}"),
            value: format!("{{\"i\":{i}}}").into_bytes(),
            expires_at_ms: None,
        }],
        now_ms: 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_node_restarts_after_20000_writes_with_all_data() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tls = dev_tls(&dir.path().join("certs"));
    let data = dir.path().join("node1");
    let addr = free_udp();
    let config = NodeConfig::single(1, data.clone(), addr);
    let node = MetaNode::start(config.clone(), &tls).await.expect("start");

    let semaphore = Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..WRITES {
        let permit = semaphore.clone().acquire_owned().await.expect("permit");
        let node = node.clone();
        tasks.spawn(async move {
            let response = node.write(put(i)).await.expect("write");
            drop(permit);
            assert!(response.applied);
        });
    }
    while let Some(result) = tasks.join_next().await {
        result.expect("write task");
    }
    // A compare-and-swap on the last key: the state machine answers with
    // what it saw.
    let cas = node
        .write(MetaCommand::Txn {
            conditions: vec![MetaCondition {
                key: "/test/key-000000".into(),
                value: Some(b"{\"i\":1}".to_vec()),
            }],
            ops: vec![MetaOp::Delete {
                key: "/test/key-000000".into(),
            }],
            now_ms: 0,
        })
        .await
        .expect("cas");
    assert!(!cas.applied);
    assert_eq!(cas.current, vec![Some(b"{\"i\":0}".to_vec())]);

    let before = node.status();
    node.shutdown().await;
    drop(node);
    assert!(
        data.join("snapshots/current.snap").exists(),
        "a snapshot must have been persisted"
    );

    wait_until_released(addr).await;
    let node = MetaNode::start(config, &tls).await.expect("restart");
    node.read_barrier().await.expect("leader after restart");
    let entries = node.state_machine().list("/test/", 0).expect("list");
    assert_eq!(entries.len(), WRITES);
    for (i, (key, value)) in entries.iter().enumerate() {
        assert_eq!(key, &format!("/test/key-{i:06}"));
        assert_eq!(value, &format!("{{\"i\":{i}}}").into_bytes());
    }
    let after = node.status();
    assert!(after.last_applied_index >= before.last_applied_index);
    // And it keeps accepting writes.
    assert!(
        node.write(put(WRITES))
            .await
            .expect("write after restart")
            .applied
    );
    node.shutdown().await;
}

/// `shutdown` returns only once openraft's tasks have let go of the redb
/// file: a restart in the same process straight after it opens the
/// database every time (it once failed under load with
/// `DatabaseAlreadyOpen`, when the state machine worker outlived
/// `Raft::shutdown`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_right_after_shutdown_reopens_the_database_every_round() {
    const ROUNDS: usize = 15;
    let dir = tempfile::tempdir().expect("tempdir");
    let tls = dev_tls(&dir.path().join("certs"));
    let config = NodeConfig::single(1, dir.path().join("node1"), free_udp());
    for round in 0..ROUNDS {
        let node = MetaNode::start(config.clone(), &tls)
            .await
            .unwrap_or_else(|e| panic!("start in round {round}: {e}"));
        let response = node.write(put(round)).await.expect("write");
        assert!(response.applied, "round {round}");
        node.shutdown().await;
        drop(node);
        wait_until_released(config.listen).await;
    }
    let node = MetaNode::start(config, &tls).await.expect("last start");
    node.read_barrier().await.expect("leader");
    let entries = node.state_machine().list("/test/", 0).expect("list");
    assert_eq!(entries.len(), ROUNDS, "one write kept per round");
    node.shutdown().await;
}
