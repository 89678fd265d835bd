//! The metadata store suite of `tributary_test_support::metadata_suite`, run against the
//! Raft store on a real single-node cluster (QUIC on 127.0.0.1, redb files).

use std::sync::Arc;

use broker_core::clock::ManualClock;
use broker_core::tls::TlsIdentity;
use tributary_broker::raft::node::{MetaNode, NodeConfig};
use tributary_broker::store::RaftMetadataStore;
use tributary_test_support::metadata_suite::{Fixture, START_MS};

async fn fixture() -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    let certs = dir.path().join("certs");
    broker_core::dev_certs::issue(&certs, &[1], &[]).expect("certs");
    let tls = TlsIdentity::load(&broker_core::dev_certs::broker_paths(&certs, 1)).expect("tls");
    let listen = std::net::UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .expect("free port");
    let node = MetaNode::start(NodeConfig::single(1, dir.path().join("node"), listen), &tls)
        .await
        .expect("start node");
    node.read_barrier().await.expect("leader elected");
    let clock = Arc::new(ManualClock::new(START_MS));
    let store = RaftMetadataStore::new(node, clock.clone());
    Fixture {
        store: Arc::new(store),
        clock,
        guard: Box::new(dir),
    }
}

tributary_test_support::metadata_store_suite!(fixture);
