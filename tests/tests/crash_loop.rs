//! Crash loop with the real binaries: a producer publishes to the edge while
//! the edge-agent and the broker are SIGKILLed at random moments (at least
//! 30 kills, bounded in time). Every record acknowledged to the producer
//! must arrive centrally exactly once, at the offset the edge assigned, with
//! its bytes; no record may appear twice.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::{RngExt, SeedableRng, rngs::StdRng};
use tributary_tests::cluster::{Pair, read_wal};

const KILLS: usize = 30;

fn seed() -> u64 {
    std::env::var("TRIB_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        })
}

#[test]
fn every_acknowledged_record_arrives_once_across_30_kills() {
    let seed = seed();
    eprintln!("crash loop seed {seed} (TRIB_CRASH_SEED replays the kill schedule)");
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().expect("tempdir");
    let pair = Arc::new(Mutex::new(Pair::new(dir.path(), "task_queue", None)));
    {
        let mut p = pair.lock().expect("pair");
        p.broker.start();
        p.edge.start();
        p.wait_for_edge();
    }
    let edge_api = pair.lock().expect("pair").edge_api;
    let publisher = Pair::api_client(edge_api);

    // The producer: small batches of unique values; what the edge
    // acknowledged is recorded by offset.
    let acked: Arc<Mutex<HashMap<u64, String>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let producer = {
        let acked = acked.clone();
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut attempt: u64 = 0;
            while !stop.load(Ordering::Relaxed) {
                let values: Vec<String> = (0..20).map(|i| format!("a{attempt}-r{i}")).collect();
                attempt += 1;
                let body: String = values
                    .iter()
                    .map(|v| format!("{{\"value\":{v:?}}}\n"))
                    .collect();
                match publisher.publish_ndjson(body) {
                    Ok((base, next)) => {
                        assert_eq!(next - base, values.len() as u64);
                        let mut acked = acked.lock().expect("acked");
                        for (i, v) in values.into_iter().enumerate() {
                            assert!(acked.insert(base + i as u64, v).is_none(), "offset reused");
                        }
                    }
                    // The edge is down or was killed mid-request: not
                    // acknowledged, so no promise is made about it.
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        })
    };

    let started = Instant::now();
    for kill in 0..KILLS {
        assert!(
            started.elapsed() < Duration::from_secs(240),
            "crash loop over its time bound"
        );
        std::thread::sleep(Duration::from_millis(rng.random_range(100..600)));
        let mut p = pair.lock().expect("pair");
        if rng.random_range(0..2) == 0 {
            p.edge.kill();
            std::thread::sleep(Duration::from_millis(rng.random_range(0..300)));
            p.edge.start();
        } else {
            p.broker.kill();
            std::thread::sleep(Duration::from_millis(rng.random_range(0..300)));
            p.broker.start();
        }
        eprintln!("kill {kill} done at {:?}", started.elapsed());
    }
    stop.store(true, Ordering::Relaxed);
    producer.join().expect("producer");

    let mut p = pair.lock().expect("pair");
    p.wait_for_edge();
    let (hwm, _) = p.edge_offsets().expect("edge offsets");
    p.wait_acknowledged(hwm, Duration::from_secs(180));
    assert_eq!(p.broker.terminate(), Some(0));
    assert_eq!(p.edge.terminate(), Some(0));

    let central = read_wal(&p.broker_data.join("topics/plant1/readings"));
    let acked = acked.lock().expect("acked");
    assert!(
        acked.len() > 100,
        "the producer got too few acknowledgements: {}",
        acked.len()
    );
    assert_eq!(
        central.len() as u64,
        hwm,
        "central holds a different number of records than the edge assigned"
    );
    let mut seen = HashSet::new();
    for (i, (offset, value)) in central.iter().enumerate() {
        assert_eq!(*offset, i as u64, "central offsets are not contiguous");
        assert!(seen.insert(value.clone()), "record {value:?} appears twice");
    }
    for (offset, value) in acked.iter() {
        let (_, stored) = &central[*offset as usize];
        assert_eq!(
            stored.as_ref(),
            value.as_bytes(),
            "offset {offset} (seed {seed})"
        );
    }
    eprintln!(
        "{KILLS} kills, {} acknowledged records, {} central records, {:?}",
        acked.len(),
        central.len(),
        started.elapsed()
    );
}
