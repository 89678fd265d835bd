//! Edge → broker replication through a bad link (the relay of
//! `tributary_test_support::relay` between the real `edge-agent` and `broker`
//! binaries): every record published at the edge reaches the central topic
//! exactly once, with the same offsets and bytes.
//!
//! - `loss_delay_and_short_cuts_lose_and_duplicate_nothing`: 20 % random
//!   loss *each way* and 300 ms of added delay *each way* (so 600 ms more
//!   round-trip time), first on its own, then with two cuts of a few
//!   seconds while publishing continues. The cuts are shorter than QUIC's
//!   30 s idle timeout, so the connection survives them (checked: no new
//!   handshake crosses the relay).
//! - `a_cut_longer_than_the_idle_timeout_reconnects_and_resumes`: a clean
//!   link cut for 35 s, longer than the idle timeout: the connection dies,
//!   the edge reconnects after the heal and resumes from the broker's mark.
//!   It runs in parallel with the first test and takes about as long.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use tributary_test_support::ports::free_udp;
use tributary_test_support::relay::{LinkConfig, Relay, RelayConfig};
use tributary_tests::cluster::{Pair, read_batches, read_wal};

/// Seed of the relay's loss and jitter.
const SEED: u64 = 0x7419_b1e5;
/// Records per published batch (one NDJSON request, one WAL batch).
const PER_BATCH: u64 = 200;

/// The value of the record at `offset`: derivable (the check needs no copy
/// of what was sent) and only partly compressible, so that the link carries
/// a fair number of packets.
fn value(offset: u64) -> String {
    let mut z = offset.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    format!(
        "{{\"seq\":{offset},\"sensor\":\"s{}\",\"sample\":\"{z:016x}\"}}",
        offset % 16
    )
}

fn ndjson(from: u64, count: u64) -> String {
    let mut body = String::with_capacity(count as usize * 80);
    for offset in from..from + count {
        body.push_str(&format!("{{\"value\":{:?}}}\n", value(offset)));
    }
    body
}

/// The broker's ingest address, from the config [`Pair::new`] wrote.
fn broker_ingest(dir: &Path) -> SocketAddr {
    let config = std::fs::read_to_string(dir.join("broker.toml")).expect("broker.toml");
    config
        .lines()
        .find_map(|line| line.strip_prefix("ingest_listen = "))
        .and_then(|v| v.trim().trim_matches('"').parse().ok())
        .expect("ingest_listen in broker.toml")
}

/// A broker and an edge (`event_stream` topic) with a relay between them.
fn pair_through_relay(dir: &Path, mut config: RelayConfig) -> (Pair, Relay) {
    config.listen = free_udp();
    let pair = Pair::new(dir, "event_stream", Some(config.listen.to_string()));
    let relay = Relay::start(config, broker_ingest(dir)).expect("relay");
    (pair, relay)
}

/// Publishes `count` records from `next` in batches; returns the new next.
fn publish(pair: &Pair, next: u64, count: u64) -> u64 {
    let mut next = next;
    let end = next + count;
    while next < end {
        let n = PER_BATCH.min(end - next);
        let (base, after) = pair.publish_ndjson(ndjson(next, n)).expect("publish");
        assert_eq!((base, after), (next, next + n));
        next = after;
    }
    next
}

/// Waits (bounded by `limit`) until the edge's acknowledged offset passes
/// `acked`.
fn wait_for_progress(pair: &Pair, acked: u64, limit: Duration) {
    let deadline = Instant::now() + limit;
    while pair.edge_offsets().map_or(0, |(_, a)| a) <= acked {
        assert!(
            Instant::now() < deadline,
            "no acknowledgement within {limit:?} of the heal"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Stops both processes and checks that the central topic holds exactly
/// the records `0..records`, in order, with their values, and that what
/// the edge still keeps is byte-identical centrally.
fn stop_and_verify(mut pair: Pair, records: u64) {
    assert_eq!(pair.broker.terminate(), Some(0), "broker exit status");
    assert_eq!(pair.edge.terminate(), Some(0), "edge exit status");
    let central_dir = pair.broker_data.join("topics/plant1/readings");
    let central = read_wal(&central_dir);
    assert_eq!(central.len() as u64, records, "records centrally");
    for (i, (offset, bytes)) in central.iter().enumerate() {
        assert_eq!(*offset, i as u64, "offset at position {i}");
        assert_eq!(
            bytes.as_ref(),
            value(i as u64).as_bytes(),
            "offset {offset}"
        );
    }
    let edge_dir = pair.edge_data.join("topics/plant1/readings");
    let edge_start = broker_core::wal::Wal::open(&edge_dir, broker_core::wal::WalConfig::default())
        .expect("open edge wal")
        .log_start_offset();
    let edge_batches = read_batches(&edge_dir, edge_start);
    assert!(!edge_batches.is_empty());
    assert_eq!(
        read_batches(&central_dir, edge_start),
        edge_batches,
        "batches are not verbatim"
    );
}

#[test]
fn loss_delay_and_short_cuts_lose_and_duplicate_nothing() {
    const PHASE_RECORDS: u64 = 6000;
    const CUT: Duration = Duration::from_secs(4);
    let dir = tempfile::tempdir().expect("tempdir");
    let link = LinkConfig::lossy(0.2, Duration::from_millis(300));
    let (mut pair, relay) = pair_through_relay(dir.path(), RelayConfig::symmetric(SEED, link));
    pair.broker.start();
    pair.edge.start();
    pair.wait_for_edge();

    // Phase 1: loss and delay only.
    let started = Instant::now();
    let mut next = publish(&pair, 0, PHASE_RECORDS);
    pair.wait_acknowledged(next, Duration::from_secs(90));
    let phase1 = relay.stats();
    eprintln!(
        "phase 1: {next} records acknowledged in {:?}; relay {phase1:?}",
        started.elapsed()
    );
    assert!(phase1.upstream.dropped_loss > 0 && phase1.downstream.dropped_loss > 0);

    // Phase 2: two cuts shorter than the idle timeout while publishing
    // goes on.
    let started = Instant::now();
    let phase_end = next + PHASE_RECORDS;
    let per_step = PHASE_RECORDS / 5;
    next = publish(&pair, next, per_step);
    for _ in 0..2 {
        relay.cut();
        let cut_at = Instant::now();
        next = publish(&pair, next, per_step);
        std::thread::sleep(CUT.saturating_sub(cut_at.elapsed()));
        let acked_at_heal = pair.edge_offsets().map_or(0, |(_, acked)| acked);
        relay.heal();
        let healed = Instant::now();
        wait_for_progress(&pair, acked_at_heal, Duration::from_secs(60));
        eprintln!(
            "after a {CUT:?} cut: acknowledgements resumed {:?} after the heal",
            healed.elapsed()
        );
        next = publish(&pair, next, per_step);
    }
    assert_eq!(next, phase_end);
    pair.wait_acknowledged(next, Duration::from_secs(90));
    let phase2 = relay.stats();
    eprintln!(
        "phase 2: {next} records acknowledged {:?} after its start; relay {phase2:?}",
        started.elapsed()
    );
    assert!(phase2.upstream.dropped_cut > 0, "the cuts dropped nothing");
    assert_eq!(
        phase2.upstream.long_header, phase1.upstream.long_header,
        "a short cut made the edge reconnect"
    );
    drop(relay);
    stop_and_verify(pair, next);
}

#[test]
fn a_cut_longer_than_the_idle_timeout_reconnects_and_resumes() {
    const RECORDS: u64 = 2000;
    /// Longer than the 30 s QUIC idle timeout (broker-core `tls`).
    const CUT: Duration = Duration::from_secs(35);
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut pair, relay) = pair_through_relay(
        dir.path(),
        RelayConfig::symmetric(SEED, LinkConfig::perfect()),
    );
    pair.broker.start();
    pair.edge.start();
    pair.wait_for_edge();
    let mut next = publish(&pair, 0, RECORDS / 2);
    pair.wait_acknowledged(next, Duration::from_secs(30));
    let before = relay.stats();

    relay.cut();
    let cut_at = Instant::now();
    next = publish(&pair, next, RECORDS / 2);
    std::thread::sleep(CUT.saturating_sub(cut_at.elapsed()));
    relay.heal();
    let healed = Instant::now();
    pair.wait_acknowledged(next, Duration::from_secs(60));
    let after = relay.stats();
    eprintln!(
        "{next} records acknowledged {:?} after a {CUT:?} cut healed; relay {after:?}",
        healed.elapsed()
    );
    assert!(
        after.upstream.long_header > before.upstream.long_header,
        "no new handshake after a cut longer than the idle timeout"
    );
    drop(relay);
    stop_and_verify(pair, next);
}
