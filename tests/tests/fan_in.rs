//! Fan-in: `edge-swarm` (50 simulated edges, each its own QUIC connection
//! and certificate) against a real broker that is SIGKILLed twice while
//! the edges produce. Every acknowledged record of every edge must be in
//! the broker's WAL exactly once, at its offset, with its bytes. And the
//! ingest endpoint's receive budget: each edge connection gets its share.

use std::net::SocketAddr;
use std::time::Duration;

use broker_core::dev_certs::{edge_paths, issue};
use broker_core::tls::{ALPN_REPLICATION, BROKER_SERVER_NAME, TlsIdentity};
use tributary_test_support::process::bin_path;
use tributary_tests::cluster::read_records;
use tributary_tests::solo::SoloBroker;
use tributary_tests::swarm::log::{Production, TIMESTAMP_BASE_MS, seed_for, value_for};
use tributary_tests::swarm::{self, SwarmConfig};

const EDGES: usize = 50;
const RECORDS: u64 = 3_000;
const RECORD_BYTES: usize = 200;

#[test]
fn fifty_edges_keep_every_acknowledged_record_once_across_two_broker_sigkills() {
    let dir = tempfile::tempdir().unwrap();
    let mut broker = SoloBroker::new(dir.path(), &bin_path("broker"), "", None);
    broker.start();
    let mut config = SwarmConfig::new(broker.ingest, broker.certs.clone(), EDGES);
    config.production = Production {
        records: RECORDS,
        // Ten seconds of production per edge: both kills land mid-run.
        rate: Some(300.0),
        batch_records: 50,
        record_bytes: RECORD_BYTES,
    };
    config.duration = Duration::from_secs(120);
    let topics = config.topic_names();
    let swarm = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(swarm::run(&config)).unwrap()
    });
    for pause in [3, 4] {
        std::thread::sleep(Duration::from_secs(pause));
        broker.broker.kill();
        std::thread::sleep(Duration::from_millis(300));
        broker.start();
    }
    let report = swarm.join().unwrap();
    print!("{}", report.render());
    assert!(
        report.mismatches().is_empty(),
        "not exact: {:?}",
        report.mismatches()
    );
    assert_eq!(report.records_acked(), EDGES as u64 * RECORDS);
    // The kills landed mid-run: streams broke and edges came back.
    assert!(
        report.connects >= 2 * EDGES as u64 && report.stream_failures >= EDGES as u64,
        "{} connects, {} broken streams: the kills did not land mid-run",
        report.connects,
        report.stream_failures
    );
    assert_eq!(broker.broker.terminate(), Some(0));
    for topic in &topics {
        let records = read_records(&broker.wal_dir(topic));
        let offsets: Vec<u64> = records.iter().map(|(o, _)| *o).collect();
        assert_eq!(
            offsets,
            (0..RECORDS).collect::<Vec<_>>(),
            "{topic}: offsets not contiguous from 0 or not once each"
        );
        let seed = seed_for(topic);
        for (offset, record) in &records {
            assert_eq!(
                record.value,
                value_for(seed, *offset, RECORD_BYTES),
                "{topic} offset {offset}: bytes differ"
            );
            assert_eq!(record.timestamp_ms, TIMESTAMP_BASE_MS + *offset as i64);
        }
    }
}

const MIB: usize = 1024 * 1024;

/// Writes `bytes` more on `send` (within 20 s), then checks that not one
/// more byte is taken within half a second: the broker never reads this
/// stream, so what `send` takes is the connection's flow-control credit.
async fn takes_exactly(send: &mut quinn::SendStream, bytes: usize, what: &str) {
    let chunk = vec![0x5a; bytes];
    tokio::time::timeout(Duration::from_secs(20), send.write_all(&chunk))
        .await
        .unwrap_or_else(|_| panic!("{what}: the broker granted less than {bytes} bytes"))
        .unwrap();
    let more = tokio::time::timeout(Duration::from_millis(500), send.write(&[0])).await;
    assert!(
        more.is_err(),
        "{what}: the broker granted more than {bytes} bytes"
    );
}

#[test]
fn each_edge_connection_gets_its_share_of_the_ingest_receive_budget() {
    let dir = tempfile::tempdir().unwrap();
    let budget = MIB;
    let mut broker = SoloBroker::new(
        dir.path(),
        &bin_path("broker"),
        &format!("[ingest]\nreceive_budget_bytes = {budget}\n"),
        None,
    );
    broker.start();
    let ids: Vec<String> = (0..5).map(|i| format!("budget{i}")).collect();
    issue(&broker.certs, &[], &ids).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let endpoint =
            broker_core::tls::client_endpoint(SocketAddr::from(([127, 0, 0, 1], 0))).unwrap();
        let mut open = Vec::new();
        // The k-th connection's share: the budget over k rounded up to a
        // power of two (the earlier ones keep the credit they were given).
        for (id, share) in ids.iter().zip([MIB, MIB / 2, MIB / 4, MIB / 4, MIB / 8]) {
            let config = TlsIdentity::load(&edge_paths(&broker.certs, id))
                .unwrap()
                .quic_client(ALPN_REPLICATION)
                .unwrap();
            let conn = endpoint
                .connect_with(config, broker.ingest, BROKER_SERVER_NAME)
                .unwrap()
                .await
                .unwrap();
            // A unidirectional stream: the broker never accepts one, so
            // nothing reads what arrives on it.
            let mut send = conn.open_uni().await.unwrap();
            takes_exactly(&mut send, share, id).await;
            open.push((conn, send));
        }
        // Four leave: at two connections (a quarter of eight) the share
        // goes back up to half the budget, for the one left too.
        let (last, mut last_send) = open.pop().unwrap();
        for (conn, _) in open.drain(..) {
            conn.close(0u32.into(), b"done");
        }
        takes_exactly(&mut last_send, MIB / 2 - MIB / 8, "the last connection").await;
        last.close(0u32.into(), b"done");
        endpoint.wait_idle().await;
    });
    assert_eq!(broker.broker.terminate(), Some(0));
}

/// `edge-swarm` refuses arguments it cannot run with, naming the flag,
/// before it connects anywhere (the broker address is never dialled).
#[test]
fn edge_swarm_refuses_nonsense_arguments_naming_the_flag() {
    let dir = tempfile::tempdir().expect("tempdir");
    let certs = dir.path().join("certs");
    std::fs::create_dir_all(&certs).expect("certs dir");
    std::fs::write(certs.join("ca.pem"), b"").expect("ca.pem");
    let cases: [(&[&str], &str); 8] = [
        (&["--edges", "0"], "--edges must be at least 1"),
        (
            &["--batch-records", "0"],
            "--batch-records must be at least 1",
        ),
        (
            &["--record-bytes", "1"],
            "--record-bytes must be at least 16",
        ),
        (&["--endpoints", "0"], "--endpoints must be at least 1"),
        (&["--records", "0"], "--records must be at least 1"),
        (
            &["--record-bytes", "2000000"],
            "--record-bytes is over what a broker accepts in one record (max_record_bytes, 1 MiB)",
        ),
        (
            &["--record-bytes", "100000", "--batch-records", "100"],
            "--batch-records x --record-bytes is over what a broker accepts in one batch \
             (max_batch_bytes, 8 MiB)",
        ),
        (
            &["--rate=-1"],
            "--rate must be a number of records per second, 0 for a backlog",
        ),
    ];
    for (extra, message) in cases {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_edge-swarm"))
            .env("RUST_BACKTRACE", "0")
            .env("RUST_LIB_BACKTRACE", "0")
            .args(["--broker", "127.0.0.1:9", "--certs"])
            .arg(&certs)
            .args(extra)
            .output()
            .expect("run edge-swarm");
        assert_eq!(out.status.code(), Some(1), "{extra:?}: {out:?}");
        assert_eq!(
            String::from_utf8_lossy(&out.stderr),
            format!("Error: {message}\n"),
            "{extra:?}"
        );
    }
    let missing = dir.path().join("nowhere");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_edge-swarm"))
        .env("RUST_BACKTRACE", "0")
        .env("RUST_LIB_BACKTRACE", "0")
        .args(["--broker", "127.0.0.1:9", "--certs"])
        .arg(&missing)
        .output()
        .expect("run edge-swarm");
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        format!(
            "Error: --certs {}: no ca.pem there; give the directory `tribctl certs --out` wrote\n",
            missing.display()
        )
    );
    assert!(!missing.exists(), "no CA was made");
}
