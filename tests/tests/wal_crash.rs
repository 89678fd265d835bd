//! Crash test with real processes: a child appends to four topics (four
//! WALs sharing the process's writer pool) with `fsync_batch` (and, in a
//! second test, `os_cache_flush`) and prints each acknowledged offset; the
//! parent SIGKILLs it at random moments, reopens every WAL and checks that
//! every acknowledged record is present byte for byte at its offset in its
//! topic, offsets are contiguous and no record appears twice.

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use broker_core::wal::{SyncMode, Wal};
use bytes::Bytes;
use rand::{RngExt, SeedableRng, rngs::StdRng};
use tributary_tests::crash::{crash_wal_config, topic_dir, value_for};

/// Topics the child writes, each its own WAL, all on one writer pool.
const TOPICS: u64 = 4;

/// One acknowledged append as the child reported it.
struct Ack {
    topic: u64,
    base: u64,
    count: u64,
    generation: u64,
    producer: u64,
    seq: u64,
}

fn parse_ack(line: &str) -> Option<Ack> {
    let mut parts = line.split(' ').map(|p| p.parse::<u64>());
    let ack = Ack {
        topic: parts.next()?.ok()?,
        base: parts.next()?.ok()?,
        count: parts.next()?.ok()?,
        generation: parts.next()?.ok()?,
        producer: parts.next()?.ok()?,
        seq: parts.next()?.ok()?,
    };
    parts.next().is_none().then_some(ack)
}

/// Runs the child until a random moment, SIGKILLs it and returns the
/// acknowledged appends it printed (complete lines only).
fn run_and_kill(dir: &Path, generation: u64, mode: SyncMode, rng: &mut StdRng) -> Vec<Ack> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_wal_crash_child"))
        .arg(dir)
        .arg(generation.to_string())
        .arg(TOPICS.to_string())
        .arg((TOPICS + rng.random_range(0..8u64)).to_string())
        .arg(mode.as_str())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn child");
    let stdout = child.stdout.take().expect("child stdout");
    let reader = std::thread::spawn(move || {
        let mut acks = Vec::new();
        let mut reader = BufReader::new(stdout);
        let mut line = String::new();
        // A line cut by the kill has no newline: it was not fully reported.
        while reader.read_line(&mut line).unwrap_or(0) > 0 {
            if let Some(stripped) = line.strip_suffix('\n') {
                acks.push(parse_ack(stripped).expect("well-formed ack line"));
            }
            line.clear();
        }
        acks
    });
    std::thread::sleep(Duration::from_millis(rng.random_range(5..80)));
    child.kill().expect("SIGKILL child"); // Child::kill sends SIGKILL on Unix.
    child.wait().expect("reap child");
    reader.join().expect("reader thread")
}

fn check_log(
    dir: &Path,
    mode: SyncMode,
    acked: &HashMap<u64, Bytes>,
    round: u64,
    seed: u64,
) -> u64 {
    let config = crash_wal_config(mode);
    let wal = Wal::open(dir, config.clone())
        .unwrap_or_else(|e| panic!("seed {seed} round {round}: reopen failed: {e}"));
    let mut next = 0;
    let mut seen = HashSet::new();
    let mut found = 0usize;
    loop {
        let batches = wal.read(next, 1 << 20).expect("read");
        if batches.is_empty() {
            break;
        }
        for batch in batches {
            let decoded = batch.decode(&config.limits).expect("decode");
            assert_eq!(
                decoded.base_offset, next,
                "seed {seed}: offsets not contiguous"
            );
            for (i, record) in decoded.records.iter().enumerate() {
                let offset = next + i as u64;
                assert!(
                    seen.insert(record.value.clone()),
                    "seed {seed} round {round}: record at {offset} appears twice"
                );
                if let Some(expected) = acked.get(&offset) {
                    assert_eq!(
                        &record.value, expected,
                        "seed {seed}: offset {offset} has other bytes"
                    );
                    found += 1;
                }
            }
            next = batch.next_offset();
        }
    }
    assert_eq!(wal.high_water_mark(), next);
    assert_eq!(
        found,
        acked.len(),
        "seed {seed} round {round}: acknowledged records missing"
    );
    next
}

fn crash_loop(mode: SyncMode, kills: u64) {
    let seed: u64 = std::env::var("TRIB_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        });
    eprintln!("wal crash test ({mode}): seed {seed} (set TRIB_CRASH_SEED to replay)");
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().expect("tempdir");
    let mut acked: Vec<HashMap<u64, Bytes>> = vec![HashMap::new(); TOPICS as usize];
    let started = Instant::now();
    let mut total_acks = 0;
    for generation in 0..kills {
        assert!(
            started.elapsed() < Duration::from_secs(240),
            "seed {seed}: crash loop exceeded its time bound"
        );
        let acks = run_and_kill(dir.path(), generation, mode, &mut rng);
        total_acks += acks.len();
        for ack in acks {
            assert_eq!(ack.generation, generation);
            assert_eq!(ack.topic, ack.producer % TOPICS);
            for j in 0..ack.count {
                let value = value_for(ack.generation, ack.producer, ack.seq, j as usize);
                let previous = acked[ack.topic as usize].insert(ack.base + j, Bytes::from(value));
                assert!(
                    previous.is_none(),
                    "seed {seed}: topic {} offset {} acknowledged twice",
                    ack.topic,
                    ack.base + j
                );
            }
        }
        for (topic, acked) in acked.iter().enumerate() {
            let dir = topic_dir(dir.path(), topic as u64);
            check_log(&dir, mode, acked, generation, seed);
        }
    }
    assert!(
        total_acks > 0,
        "seed {seed}: the child never acknowledged anything"
    );
    let records: usize = acked.iter().map(HashMap::len).sum();
    eprintln!("{kills} kills, {total_acks} acknowledged appends, {records} records");
    for (topic, acked) in acked.iter().enumerate() {
        assert!(
            !acked.is_empty(),
            "seed {seed}: topic {topic} never acknowledged"
        );
    }
}

#[test]
fn fsync_batch_survives_50_sigkills() {
    crash_loop(SyncMode::FsyncBatch, 50);
}

#[test]
fn os_cache_flush_survives_20_sigkills() {
    crash_loop(SyncMode::OsCacheFlush, 20);
}
