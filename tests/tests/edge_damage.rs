//! Damaged WAL bytes and replication, with the real binaries on 127.0.0.1
//! (issue 15, defect 2). 16 bytes are overwritten in the middle of a batch
//! while the process that owns the WAL is stopped (SIGKILL), on an
//! `fsync_batch` topic (`task_queue`):
//!
//! - at the edge, in a sealed segment and in the active segment, before the
//!   broker has the records: on restart every intact record reaches the
//!   broker exactly once at its own offset, the two damaged batches are
//!   declared as holes (Raft, consumer gap notices, the central WAL), no
//!   offset is reused and new publishes continue after them;
//! - at the edge, after the broker has the records: simply skipped, no hole;
//! - centrally, in the broker's own WAL: consumers get a gap notice naming
//!   exactly the damaged batch's offsets and later records still flow.

use std::collections::BTreeMap;
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use broker_core::wal::{UnreadableKind, UnreadableRange, Wal, WalConfig, WalError};
use tributary_api::consumer::{AttachRequest, Gap, GapKind, StartPosition};
use tributary_api::consumer_client::ConsumerClient;
use tributary_tests::cluster::{Pair, TOPIC, metric_value, try_scrape};

/// Records per published batch (one publish is one batch).
const PER_BATCH: u64 = 40;
/// Edge limits: 64 KiB batches, and a budget that makes segments 64 KiB
/// (1 % of it), so a few hundred records fill several segments.
const AGENT_EXTRA: &str = "max_record_bytes = 16384\nmax_batch_bytes = 65536";
const TOPIC_EXTRA: &str = "disk_budget_bytes = 6553600";

/// The value of the record at `offset` (derivable, so checks need no copy).
fn value(offset: u64) -> String {
    format!("reading-{offset:08}-{}", "x".repeat(200))
}

fn publish(pair: &Pair, next: &mut u64) {
    pair.publish_values(next, PER_BATCH, value);
}

/// One batch of a segment file: byte position, length, base offset, count.
#[derive(Debug, Clone, Copy)]
struct BatchAt {
    position: u64,
    length: u64,
    base: u64,
    count: u64,
}

/// A WAL segment file and whether it is sealed.
struct SegmentFile {
    log: PathBuf,
    sealed: bool,
}

fn segments(dir: &Path) -> Vec<SegmentFile> {
    let mut logs: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("wal dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    logs.sort();
    logs.into_iter()
        .map(|log| SegmentFile {
            sealed: log.with_extension("index").exists(),
            log,
        })
        .collect()
}

/// The batches of a segment file, by their headers (FORMAT.md "Record
/// batch": length at byte 4, base offset at 16, record count at 24).
fn batches_in(log: &Path) -> Vec<BatchAt> {
    let bytes = std::fs::read(log).expect("read segment");
    let mut out = Vec::new();
    let mut pos = 0usize;
    while pos + 48 <= bytes.len() {
        let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4"));
        let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8"));
        let length = u32_at(pos + 4) as usize;
        assert!(
            length >= 48 && pos + length <= bytes.len(),
            "batch at {pos}"
        );
        out.push(BatchAt {
            position: pos as u64,
            length: length as u64,
            base: u64_at(pos + 16),
            count: u64::from(u32_at(pos + 24)),
        });
        pos += length;
    }
    out
}

/// Overwrites 16 bytes in the middle of the middle batch of `log` (and
/// fsyncs); returns that batch's offset range.
fn damage_middle_batch(log: &Path) -> (u64, u64) {
    let batches = batches_in(log);
    assert!(
        batches.len() >= 3,
        "{} has {} batches",
        log.display(),
        batches.len()
    );
    let victim = batches[batches.len() / 2];
    let at = victim.position + victim.length / 2;
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(log)
        .expect("open segment");
    let mut original = [0u8; 16];
    file.seek(SeekFrom::Start(at)).expect("seek");
    std::io::Read::read_exact(&mut file, &mut original).expect("read");
    let damaged: Vec<u8> = original.iter().map(|b| b ^ 0xA5).collect();
    file.seek(SeekFrom::Start(at)).expect("seek");
    file.write_all(&damaged).expect("write");
    file.sync_all().expect("fsync");
    (victim.base, victim.base + victim.count)
}

/// Every readable record of the WAL in `dir` and every unreadable range,
/// from its log start (the owning process must be stopped).
fn read_wal_with_holes(dir: &Path) -> (BTreeMap<u64, String>, Vec<UnreadableRange>) {
    let wal = Wal::open(dir, WalConfig::default()).expect("open wal");
    let mut records = BTreeMap::new();
    let mut ranges = Vec::new();
    let mut from = wal.log_start_offset();
    loop {
        let batches = match wal.read(from, 8 << 20) {
            Ok(batches) => batches,
            Err(WalError::Unreadable(range)) => {
                from = range.end_offset;
                ranges.push(range);
                continue;
            }
            Err(e) => panic!("read wal at {from}: {e}"),
        };
        if batches.is_empty() {
            return (records, ranges);
        }
        for batch in batches {
            let decoded = batch.decode(&wal.config().limits).expect("decode");
            for (i, record) in decoded.records.into_iter().enumerate() {
                let text = String::from_utf8(record.value.to_vec()).expect("utf-8 value");
                let offset = decoded.base_offset + i as u64;
                assert!(
                    records.insert(offset, text).is_none(),
                    "offset {offset} twice"
                );
            }
            from = batch.next_offset();
        }
    }
}

/// Waits (bounded) until the edge has published `target` and the broker
/// acknowledged all of it.
/// The edge's `/health` document.
fn edge_health(pair: &Pair) -> serde_json::Value {
    let url = format!("http://{}/health", pair.edge_api);
    let mut response = ureq::get(&url).call().expect("GET /health");
    response.body_mut().read_json().expect("health JSON")
}

fn wait_replicated(pair: &Pair, target: u64) {
    pair.wait_acknowledged(target, Duration::from_secs(60));
}

/// Like [`Pair::consume_all`] with leases (`receive` and per-message `ack`) on a
/// shared subscription: returns the records and gap notices once every
/// offset below `end` was delivered or named in a gap.
fn receive_all(
    client: &ConsumerClient,
    subscription: &str,
    end: u64,
) -> (BTreeMap<u64, String>, Vec<Gap>) {
    let attach = AttachRequest {
        start: StartPosition::Earliest,
        ..AttachRequest::default()
    };
    let session = client.attach(TOPIC, subscription, &attach).expect("attach");
    let mut records = BTreeMap::new();
    let mut gaps: Vec<Gap> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    let covered = |records: &BTreeMap<u64, String>, gaps: &[Gap]| {
        (0..end).all(|o| {
            records.contains_key(&o)
                || gaps
                    .iter()
                    .any(|g| (g.first_offset..g.end_offset).contains(&o))
        })
    };
    while !covered(&records, &gaps) {
        assert!(Instant::now() < deadline, "leased consumer stuck");
        let got = client
            .receive(TOPIC, subscription, session.consumer_id, 500, 500)
            .expect("receive");
        for gap in got.gaps {
            if !gaps.contains(&gap) {
                gaps.push(gap);
            }
        }
        let offsets: Vec<u64> = got.messages.iter().map(|m| m.offset).collect();
        for m in got.messages {
            assert!(
                records
                    .insert(m.offset, m.value.expect("text value"))
                    .is_none(),
                "offset {} delivered twice",
                m.offset
            );
        }
        if !offsets.is_empty() {
            client
                .ack(TOPIC, subscription, session.consumer_id, &offsets)
                .expect("ack");
        }
    }
    (records, gaps)
}

#[test]
fn damage_at_the_edge_is_declared_as_holes_and_everything_intact_is_replicated_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut pair = Pair::new_with(dir.path(), "task_queue", None, AGENT_EXTRA, TOPIC_EXTRA);
    let edge_wal = pair.edge_data.join("topics/plant1/readings");
    // The broker is down: everything stays at the edge.
    pair.edge.start();
    pair.wait_for_edge();
    let mut next = 0;
    loop {
        publish(&pair, &mut next);
        let segs = segments(&edge_wal);
        let sealed = segs.iter().filter(|s| s.sealed).count();
        let active_batches = segs.last().map_or(0, |s| batches_in(&s.log).len());
        if sealed >= 3 && active_batches >= 3 {
            break;
        }
        assert!(next < 40 * PER_BATCH, "segments never filled");
    }
    pair.edge.kill();
    let segs = segments(&edge_wal);
    let sealed_hole = damage_middle_batch(&segs[1].log);
    let active_hole = damage_middle_batch(&segs.last().expect("active").log);
    eprintln!("damaged {sealed_hole:?} (sealed) and {active_hole:?} (active), hwm {next}");

    pair.broker.start();
    pair.edge.start();
    pair.wait_for_edge();
    wait_replicated(&pair, next);
    // The edge names the damaged range it still holds: topics API, /health,
    // metrics. The sealed segment with the other one is deleted once the
    // broker acknowledged past it (a range goes with its segment): wait
    // for that, so what is listed is exactly the active segment's range.
    let deadline = Instant::now() + Duration::from_secs(30);
    let state = loop {
        let state = pair.topic_state().expect("topic state");
        if state["log_start_offset"].as_u64().unwrap_or(0) >= sealed_hole.1 {
            break state;
        }
        assert!(
            Instant::now() < deadline,
            "acknowledged segments never deleted: {state}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let named: Vec<(u64, u64, String)> = state["damaged_ranges"]
        .as_array()
        .expect("damaged_ranges")
        .iter()
        .map(|r| {
            (
                r["first_offset"].as_u64().unwrap_or(0),
                r["end_offset"].as_u64().unwrap_or(0),
                r["kind"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    assert_eq!(
        named,
        vec![(active_hole.0, active_hole.1, "damaged".to_string())]
    );
    let health = edge_health(&pair);
    assert_eq!(health["status"], "degraded", "{health}");
    assert_eq!(
        health["damaged"][0]["first_offset"], active_hole.0,
        "{health}"
    );
    assert_eq!(
        health["damaged"].as_array().map(Vec::len),
        Some(1),
        "{health}"
    );
    let metrics = try_scrape(&format!("http://{}/metrics", pair.edge_api)).expect("metrics");
    let series = |name: &str| metric_value(&metrics, &format!("{name}{{topic=\"{TOPIC}\"}}"));
    assert_eq!(series("tributary_edge_unreadable_ranges"), Some(1));
    assert_eq!(
        series("tributary_edge_unreadable_offsets"),
        Some(active_hole.1 - active_hole.0)
    );
    // New publishes continue after the damage, never in it.
    let before_new = next;
    for _ in 0..3 {
        publish(&pair, &mut next);
    }
    wait_replicated(&pair, next);

    // Consumers: every intact record once, at its own offset, and a gap
    // notice naming exactly each declared hole.
    let (consumed, gaps) = pair.consume_all("audit", next);
    let in_hole = |o: u64| {
        (sealed_hole.0..sealed_hole.1).contains(&o) || (active_hole.0..active_hole.1).contains(&o)
    };
    let expected: BTreeMap<u64, String> = (0..next)
        .filter(|&o| !in_hole(o))
        .map(|o| (o, value(o)))
        .collect();
    assert_eq!(consumed.len(), expected.len());
    assert!(
        consumed == expected,
        "consumed records differ from the intact ones"
    );
    let ranges: Vec<(u64, u64)> = gaps
        .iter()
        .map(|g| (g.first_offset, g.end_offset))
        .collect();
    assert_eq!(ranges, vec![sealed_hole, active_hole]);
    for gap in &gaps {
        assert_eq!(gap.kind, GapKind::Hole);
        // The reason comes from the Raft record of the edge's declaration.
        assert!(
            gap.reason.contains("declared by the edge (damaged)"),
            "{}",
            gap.reason
        );
    }
    assert!(before_new > active_hole.1);

    assert_eq!(pair.broker.terminate(), Some(0), "broker exit status");
    assert_eq!(pair.edge.terminate(), Some(0), "edge exit status");
    // The central WAL: the same records, and exactly the two holes.
    let (central, holes) = read_wal_with_holes(&pair.broker_data.join("topics/plant1/readings"));
    assert!(
        central == expected,
        "central WAL differs from the intact records"
    );
    let holes: Vec<(u64, u64, &str)> = holes
        .iter()
        .map(|r| (r.first_offset, r.end_offset, r.kind_name()))
        .collect();
    assert_eq!(
        holes,
        vec![
            (sealed_hole.0, sealed_hole.1, "hole"),
            (active_hole.0, active_hole.1, "hole")
        ]
    );
}

#[test]
fn damage_at_the_edge_that_the_broker_already_holds_is_skipped_without_a_hole() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut pair = Pair::new_with(dir.path(), "task_queue", None, AGENT_EXTRA, TOPIC_EXTRA);
    let edge_wal = pair.edge_data.join("topics/plant1/readings");
    pair.broker.start();
    pair.edge.start();
    pair.wait_for_edge();
    let mut next = 0;
    loop {
        publish(&pair, &mut next);
        wait_replicated(&pair, next);
        let active_batches = segments(&edge_wal)
            .last()
            .map_or(0, |s| batches_in(&s.log).len());
        if next >= 8 * PER_BATCH && active_batches >= 3 {
            break;
        }
        assert!(
            next < 60 * PER_BATCH,
            "the active segment never held 3 batches"
        );
    }
    pair.edge.kill();
    let mut damaged = Vec::new();
    for segment in segments(&edge_wal) {
        if batches_in(&segment.log).len() >= 3 {
            damaged.push(damage_middle_batch(&segment.log));
        }
    }
    eprintln!("damaged {damaged:?} after replication, hwm {next}");
    pair.edge.start();
    pair.wait_for_edge();
    for _ in 0..3 {
        publish(&pair, &mut next);
    }
    wait_replicated(&pair, next);
    let (consumed, gaps) = pair.consume_all("audit", next);
    assert_eq!(gaps, Vec::new(), "no hole for offsets the broker holds");
    let expected: BTreeMap<u64, String> = (0..next).map(|o| (o, value(o))).collect();
    assert_eq!(consumed.len(), expected.len());
    assert!(consumed == expected);
    assert_eq!(pair.broker.terminate(), Some(0));
    assert_eq!(pair.edge.terminate(), Some(0));
    let (central, holes) = read_wal_with_holes(&pair.broker_data.join("topics/plant1/readings"));
    assert!(central == expected);
    assert_eq!(holes, Vec::new());
}

#[test]
fn damage_in_the_brokers_wal_gives_consumers_a_gap_notice_and_later_records_flow() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut pair = Pair::new_with(dir.path(), "task_queue", None, AGENT_EXTRA, TOPIC_EXTRA);
    let central_wal = pair.broker_data.join("topics/plant1/readings");
    pair.broker.start();
    pair.edge.start();
    pair.wait_for_edge();
    let mut next = 0;
    // Enough batches that the edge has deleted (acknowledged, sealed) the
    // segment holding the one damaged below: nothing can re-send it, so it
    // stays damaged (the broker asks the edge, which says it no longer
    // holds it; tests/tests/central_damage.rs has the range healed).
    for _ in 0..20 {
        publish(&pair, &mut next);
    }
    wait_replicated(&pair, next);
    pair.broker.kill();
    let segs = segments(&central_wal);
    let damaged = damage_middle_batch(&segs.last().expect("central segment").log);
    eprintln!("damaged central {damaged:?}, hwm {next}");
    pair.broker.start();
    // The edge reconnects and replicates what follows.
    for _ in 0..3 {
        publish(&pair, &mut next);
    }
    wait_replicated(&pair, next);
    let (consumed, gaps) = pair.consume_all("audit", next);
    let expected: BTreeMap<u64, String> = (0..next)
        .filter(|o| !(damaged.0..damaged.1).contains(o))
        .map(|o| (o, value(o)))
        .collect();
    assert_eq!(consumed.len(), expected.len());
    assert!(consumed == expected);
    assert_eq!(gaps.len(), 1, "{gaps:?}");
    assert_eq!((gaps[0].first_offset, gaps[0].end_offset), damaged);
    assert_eq!(gaps[0].kind, GapKind::Damaged);
    // Leased delivery: the same records and the same gap notice.
    let (received, leased_gaps) = receive_all(&pair.consumer(), "workers", next);
    assert!(received == expected, "leased records differ");
    assert!(!leased_gaps.is_empty());
    for gap in &leased_gaps {
        assert_eq!((gap.first_offset, gap.end_offset), damaged);
        assert_eq!(gap.kind, GapKind::Damaged);
    }
    assert_eq!(pair.broker.terminate(), Some(0));
    assert_eq!(pair.edge.terminate(), Some(0));
    let (_, ranges) = read_wal_with_holes(&central_wal);
    assert!(matches!(
        ranges.as_slice(),
        [UnreadableRange { first_offset, end_offset, kind: UnreadableKind::Damaged { .. } }]
            if (*first_offset, *end_offset) == damaged
    ));
}

/// The edge trial's removed topic directory (agent stopped, broker holding
/// 0..80): the new WAL started at 0 again and answered publishes with
/// offsets the broker held for other records, which then never arrived.
/// It continues after the checkpoint instead.
#[test]
fn a_removed_topic_directory_continues_after_the_acknowledged_offsets() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut pair = Pair::new_with(dir.path(), "task_queue", None, AGENT_EXTRA, TOPIC_EXTRA);
    let edge_wal = pair.edge_data.join("topics/plant1/readings");
    pair.broker.start();
    pair.edge.start();
    pair.wait_for_edge();
    let mut next = 0;
    for _ in 0..2 {
        publish(&pair, &mut next);
    }
    wait_replicated(&pair, next);
    // Stopped (its checkpoint flushed), not killed: the broker's
    // acknowledgement of the last batch may otherwise not be in the
    // checkpoint yet (flushed every `checkpoint_interval_ms`), and the
    // agent can only continue after what it recorded (docs/edge-agent.md:
    // a lost topic directory continues at the stored checkpoint).
    assert_eq!(pair.edge.terminate(), Some(0));
    std::fs::remove_dir_all(&edge_wal).expect("remove the topic directory");
    pair.edge.start();
    pair.wait_for_edge();
    // `publish` asserts the offsets: 80.., not 0.. again.
    publish(&pair, &mut next);
    wait_replicated(&pair, next);
    let (consumed, gaps) = pair.consume_all("audit", next);
    assert_eq!(gaps, Vec::new());
    let expected: BTreeMap<u64, String> = (0..next).map(|o| (o, value(o))).collect();
    assert!(consumed == expected, "every record once at its offset");
    assert_eq!(pair.broker.terminate(), Some(0));
    assert_eq!(pair.edge.terminate(), Some(0));
}

/// The config trial's lowered `max_batch_bytes`: batches stored under the
/// old limit (9 KB each, not replicated yet) were read as damage when the
/// agent restarted with 8 KiB, declared a hole, and lost at the broker and
/// in the archive. They replicate whole.
#[test]
fn batches_stored_under_a_larger_max_batch_bytes_replicate_after_it_is_lowered() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut pair = Pair::new_with(dir.path(), "task_queue", None, AGENT_EXTRA, TOPIC_EXTRA);
    pair.edge.start();
    pair.wait_for_edge();
    let mut next = 0;
    for _ in 0..3 {
        publish(&pair, &mut next);
    }
    pair.edge.kill();
    let config_path = dir.path().join("edge.toml");
    let config = std::fs::read_to_string(&config_path).expect("edge config");
    let lowered = config
        .replace("max_batch_bytes = 65536", "max_batch_bytes = 8192")
        .replace("max_record_bytes = 16384", "max_record_bytes = 4096");
    assert_ne!(config, lowered, "the limits were in the config");
    std::fs::write(&config_path, lowered).expect("write edge config");
    pair.broker.start();
    pair.edge.start();
    pair.wait_for_edge();
    wait_replicated(&pair, next);
    let (consumed, gaps) = pair.consume_all("audit", next);
    assert_eq!(gaps, Vec::new(), "no hole");
    let expected: BTreeMap<u64, String> = (0..next).map(|o| (o, value(o))).collect();
    assert!(consumed == expected, "every record once at its offset");
    assert_eq!(pair.broker.terminate(), Some(0));
    assert_eq!(pair.edge.terminate(), Some(0));
}
