//! `tribctl topics move` under load, on three real brokers (a tier service
//! beside each) and one edge agent publishing NDJSON throughout: the topic
//! moves to another broker with a new epoch, the edge follows, and at the
//! end every acknowledged record is there exactly once, offsets
//! contiguous, values as published, read through the new owner, the old
//! owner and the third broker (the non-owners redirect; the consumer
//! client follows).

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tributary_test_support::process::bin_path;
use tributary_tests::fleet::{
    Fleet, TOKEN, consume_all, edge_offsets, ndjson, publish_ndjson, wait_acknowledged,
};

const READINGS: &str = "/plant1/readings";

fn owner_of(fleet: &Fleet, not: Option<u64>, limit: Duration) -> (u64, u64) {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(owner) = fleet.marked_owner(READINGS)
            && not.is_none_or(|n| owner.0 != n)
        {
            return owner;
        }
        assert!(Instant::now() < deadline, "no owner within {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_topic_moved_under_load_loses_and_duplicates_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut fleet = Fleet::new(dir.path(), &[(READINGS, "event_stream")], "", "");
    fleet.start_all();
    let stop = Arc::new(AtomicBool::new(false));
    let api = fleet.edge_api;
    let publishing = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut next = 0u64;
            while !stop.load(Ordering::Relaxed) {
                match publish_ndjson(api, READINGS, ndjson(READINGS, next, 50)) {
                    Ok((base, end)) => {
                        assert_eq!(base, next, "the edge assigned another offset");
                        next = end;
                    }
                    Err(e) => eprintln!("publish at {next} refused (retrying): {e}"),
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            next
        })
    };
    wait_acknowledged(api, READINGS, 1000, Duration::from_secs(60));
    let (owner, epoch) = owner_of(&fleet, None, Duration::from_secs(30));
    let target = if owner == 3 { 1 } else { owner + 1 };
    let acked_at_move = edge_offsets(api, READINGS).map_or(0, |(_, a)| a);
    // Asked of the third broker: any broker carries out a move.
    let via = 6 - owner - target;
    let out = Command::new(bin_path("tribctl"))
        .env("TRIB_ADMIN_URL", fleet.nodes[(via - 1) as usize].url())
        .env("TRIB_ADMIN_TOKEN", TOKEN)
        .args(["topics", "move", READINGS, "--to", &target.to_string()])
        .output()
        .expect("tribctl topics move");
    assert!(
        out.status.success(),
        "move: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!(
            "moved {READINGS} from broker {owner} to broker {target} (epoch {})\n",
            epoch + 1
        )
    );
    let moved = Instant::now();
    assert_eq!(
        owner_of(&fleet, Some(owner), Duration::from_secs(30)),
        (target, epoch + 1)
    );
    // The new owner acknowledges what the edge sends it.
    let deadline = Instant::now() + Duration::from_secs(60);
    while edge_offsets(api, READINGS).map_or(0, |(_, a)| a) <= acked_at_move {
        assert!(
            Instant::now() < deadline,
            "no acknowledgement after the move"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!(
        "move: broker {owner} → broker {target}, first acknowledgement by the new owner after {:?}",
        moved.elapsed()
    );
    std::thread::sleep(Duration::from_secs(3));
    stop.store(true, Ordering::Relaxed);
    let end = publishing.join().expect("publisher");
    wait_acknowledged(api, READINGS, end, Duration::from_secs(120));
    // Through the new owner, the old owner and the third broker: the same
    // records, each once.
    let mut seen = Vec::new();
    for (via, subscription) in [
        (target, "via-owner"),
        (owner, "via-old"),
        (via, "via-third"),
    ] {
        let client = fleet.consumer(via);
        let records = consume_all(
            &client,
            READINGS,
            subscription,
            end,
            Duration::from_secs(120),
        );
        assert_eq!(records.len() as u64, end, "through broker {via}: count");
        for (i, (offset, value)) in records.iter().enumerate() {
            assert_eq!(*offset, i as u64, "through broker {via}: offsets");
            assert_eq!(
                value,
                &format!("{READINGS}-{offset}"),
                "through broker {via}"
            );
        }
        seen.push(records);
    }
    assert!(seen.windows(2).all(|w| w[0] == w[1]));
    for node in &mut fleet.nodes {
        node.tier.kill();
    }
    assert_eq!(fleet.edge.terminate(), Some(0), "edge-agent exit");
}
