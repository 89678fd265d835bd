//! Fan-in: `edge-swarm` (50 simulated edges, each its own QUIC connection
//! and certificate) against a real broker that is SIGKILLed twice while
//! the edges produce. Every acknowledged record of every edge must be in
//! the broker's WAL exactly once, at its offset, with its bytes.

use std::time::Duration;

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
