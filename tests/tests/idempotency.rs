//! HTTP retries without duplicates end to end, on a real `edge-agent`
//! process: a batch retried three times (once across a SIGKILL of the
//! agent) is stored once and answered with the same offsets, with an
//! `Idempotency-Key` header or with NDJSON `producer_id` + `sequence`;
//! another body for a used key or sequence range is refused with 409, a
//! sequence gap too, and malformed producer fields with 400.

use std::time::{Duration, Instant};

use serde_json::Value;
use tributary_tests::mqtt::{MqttEdge, read_records};

const RULES: &str = "[[mqtt.topics]]\nfilter = \"#\"\ntopic = \"/plant1/readings\"\n";

fn post(edge: &MqttEdge, key: &str, body: &str) -> (u16, Value) {
    post_with(edge, Some(key), body)
}

/// POSTs `body` to `/plant1/readings`' batch route, with the
/// `Idempotency-Key` `key` if given.
fn post_with(edge: &MqttEdge, key: Option<&str>, body: &str) -> (u16, Value) {
    try_post(edge, key, body).expect("post")
}

/// As [`post_with`]; `Err` when the request got no answer (the agent died).
fn try_post(edge: &MqttEdge, key: Option<&str>, body: &str) -> Result<(u16, Value), ureq::Error> {
    try_post_to(edge.api, key, body)
}

/// [`try_post`] to the agent API at `api`.
fn try_post_to(
    api: std::net::SocketAddr,
    key: Option<&str>,
    body: &str,
) -> Result<(u16, Value), ureq::Error> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(30)))
        .http_status_as_error(false)
        .build()
        .into();
    let mut request = agent
        .post(&format!("http://{api}/v1/topics/plant1/readings/batch"))
        .header("content-type", "application/x-ndjson");
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    let mut response = request.send(body.to_owned())?;
    let status = response.status().as_u16();
    Ok((status, response.body_mut().read_json()?))
}

fn wait_api(edge: &MqttEdge) {
    tributary_test_support::process::wait_for_tcp("edge API", edge.api, Duration::from_secs(10));
}

#[test]
fn a_retried_batch_with_an_idempotency_key_is_stored_once_even_across_a_sigkill() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut edge = MqttEdge::new(dir.path(), "audit_log", RULES);
    edge.start();
    wait_api(&edge);
    let body = "{\"value\":\"a\"}\n{\"value\":\"b\"}\n{\"value\":\"c\"}\n";
    let (status, first) = post(&edge, "order-17", body);
    assert_eq!(status, 200, "{first}");
    assert_eq!(
        (first["base_offset"].as_u64(), first["next_offset"].as_u64()),
        (Some(0), Some(3))
    );
    // Another key in between: its own offsets.
    let (status, other) = post(&edge, "order-18", "{\"value\":\"d\"}\n");
    assert_eq!(status, 200, "{other}");
    assert_eq!(other["base_offset"].as_u64(), Some(3));

    let (status, retry1) = post(&edge, "order-17", body);
    assert_eq!((status, &retry1), (200, &first), "retry 1");
    edge.edge.kill();
    edge.start();
    wait_api(&edge);
    let (status, retry2) = post(&edge, "order-17", body);
    assert_eq!((status, &retry2), (200, &first), "retry 2, after a SIGKILL");
    let (status, retry3) = post(&edge, "order-17", body);
    assert_eq!((status, &retry3), (200, &first), "retry 3");

    let (status, refused) = post(&edge, "order-17", "{\"value\":\"changed\"}\n");
    assert_eq!(status, 409, "{refused}");
    assert_eq!(refused["kind"], "idempotency_key_reused");

    assert_eq!(edge.edge.terminate(), Some(0));
    let values: Vec<String> = read_records(&edge.wal_dir("readings"))
        .into_iter()
        .map(|(_, r)| String::from_utf8_lossy(&r.value).into_owned())
        .collect();
    assert_eq!(
        values,
        ["a", "b", "c", "d"],
        "stored once each, nothing from the refused body"
    );
}

/// NDJSON lines of `producer` with `values` at sequences from `first`.
fn sequenced(producer: &str, first: u64, values: &[&str]) -> String {
    values
        .iter()
        .zip(first..)
        .map(|(v, seq)| {
            format!("{{\"value\":\"{v}\",\"producer_id\":\"{producer}\",\"sequence\":{seq}}}\n")
        })
        .collect()
}

fn offsets(answer: &Value) -> (Option<u64>, Option<u64>, Option<u64>) {
    (
        answer["base_offset"].as_u64(),
        answer["next_offset"].as_u64(),
        answer["count"].as_u64(),
    )
}

#[test]
fn a_retried_batch_with_producer_sequences_is_stored_once_even_across_a_sigkill() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut edge = MqttEdge::new(dir.path(), "audit_log", RULES);
    edge.start();
    wait_api(&edge);
    let first_batch = sequenced("sensor-7", 0, &["a", "b", "c"]);
    let (status, first) = post_with(&edge, None, &first_batch);
    assert_eq!(status, 200, "{first}");
    assert_eq!(offsets(&first), (Some(0), Some(3), Some(3)));

    let (status, retry1) = post_with(&edge, None, &first_batch);
    assert_eq!((status, &retry1), (200, &first), "retry 1");
    edge.edge.kill();
    edge.start();
    wait_api(&edge);
    let (status, retry2) = post_with(&edge, None, &first_batch);
    assert_eq!((status, &retry2), (200, &first), "retry 2, after a SIGKILL");
    let (status, retry3) = post_with(&edge, None, &first_batch);
    assert_eq!((status, &retry3), (200, &first), "retry 3");

    // The next range is stored; another producer has its own sequences.
    let second_batch = sequenced("sensor-7", 3, &["d", "e", "f"]);
    let (status, second) = post_with(&edge, None, &second_batch);
    assert_eq!(status, 200, "{second}");
    assert_eq!(offsets(&second), (Some(3), Some(6), Some(3)));
    let (status, other) = post_with(&edge, None, &sequenced("sensor-8", 0, &["x"]));
    assert_eq!(status, 200, "{other}");
    assert_eq!(offsets(&other), (Some(6), Some(7), Some(1)));

    // Another body at 0..=2: refused.
    let (status, reused) = post_with(&edge, None, &sequenced("sensor-7", 0, &["A", "B", "C"]));
    assert_eq!(status, 409, "{reused}");
    assert_eq!(reused["kind"], "sequence_reused", "{reused}");
    assert_eq!(reused["base_offset"], 0, "{reused}");
    // A gap: 7 after 5.
    let (status, gap) = post_with(&edge, None, &sequenced("sensor-7", 7, &["g"]));
    assert_eq!(status, 409, "{gap}");
    assert_eq!(gap["kind"], "sequence_gap", "{gap}");
    assert_eq!(gap["expected_sequence"], 6, "{gap}");
    // Part of a stored batch: a duplicate.
    let (status, duplicate) = post_with(&edge, None, &sequenced("sensor-7", 4, &["e", "f"]));
    assert_eq!(status, 409, "{duplicate}");
    assert_eq!(duplicate["kind"], "sequence_duplicate", "{duplicate}");
    assert_eq!(duplicate["last_sequence"], 5, "{duplicate}");
    // The older batch is still a retry after the newer one.
    let (status, retry4) = post_with(&edge, None, &first_batch);
    assert_eq!(
        (status, &retry4),
        (200, &first),
        "retry 4, after batch 3..=5"
    );

    // Malformed producer fields: 400, nothing stored.
    let long = "p".repeat(201);
    let bad: [(&str, String, usize, &str); 7] = [
        (
            "mixed",
            "{\"value\":\"m\",\"producer_id\":\"sensor-7\",\"sequence\":6}\n{\"value\":\"n\"}\n".into(),
            2,
            "producer_id",
        ),
        (
            "sequence without producer_id",
            "{\"value\":\"m\",\"sequence\":6}\n".into(),
            1,
            "producer_id",
        ),
        (
            "not consecutive",
            "{\"value\":\"m\",\"producer_id\":\"sensor-7\",\"sequence\":6}\n{\"value\":\"n\",\"producer_id\":\"sensor-7\",\"sequence\":8}\n".into(),
            2,
            "sequence",
        ),
        (
            "two producers",
            "{\"value\":\"m\",\"producer_id\":\"sensor-7\",\"sequence\":6}\n{\"value\":\"n\",\"producer_id\":\"sensor-9\",\"sequence\":7}\n".into(),
            2,
            "producer_id",
        ),
        (
            "sequence as a string",
            "{\"value\":\"m\",\"producer_id\":\"sensor-7\",\"sequence\":\"6\"}\n".into(),
            1,
            "sequence",
        ),
        (
            "producer_id as a number",
            "{\"value\":\"m\",\"producer_id\":7,\"sequence\":6}\n".into(),
            1,
            "producer_id",
        ),
        (
            "producer_id over 200 bytes",
            format!("{{\"value\":\"m\",\"producer_id\":\"{long}\",\"sequence\":0}}\n"),
            1,
            "producer_id",
        ),
    ];
    for (case, body, line, field) in &bad {
        let (status, refused) = post_with(&edge, None, body);
        assert_eq!(status, 400, "{case}: {refused}");
        assert_eq!(refused["kind"], "invalid_input", "{case}: {refused}");
        assert_eq!(refused["line"], *line, "{case}: {refused}");
        assert_eq!(refused["field"], *field, "{case}: {refused}");
    }
    // One mechanism per request.
    let (status, both) = post_with(&edge, Some("order-1"), &sequenced("sensor-7", 6, &["h"]));
    assert_eq!(status, 400, "{both}");
    assert_eq!(both["kind"], "invalid_input", "{both}");

    // Nothing above moved the producer on: 6 is still the next sequence.
    let (status, third) = post_with(&edge, None, &sequenced("sensor-7", 6, &["g"]));
    assert_eq!(status, 200, "{third}");
    assert_eq!(offsets(&third), (Some(7), Some(8), Some(1)));

    assert_eq!(edge.edge.terminate(), Some(0));
    let records = read_records(&edge.wal_dir("readings"));
    let stored: Vec<(u64, String)> = records
        .iter()
        .map(|(offset, r)| (*offset, String::from_utf8_lossy(&r.value).into_owned()))
        .collect();
    let expected: Vec<(u64, String)> = ["a", "b", "c", "d", "e", "f", "x", "g"]
        .iter()
        .zip(0u64..)
        .map(|(v, o)| (o, (*v).to_owned()))
        .collect();
    assert_eq!(stored, expected, "each stored once, nothing refused stored");
    assert!(
        records
            .iter()
            .all(|(_, r)| r.key.is_none() && r.headers.is_empty()),
        "producer_id and sequence are not part of the record"
    );
}

/// SIGKILLs the process `pid` after `delay`, on a thread of its own.
fn kill_after(pid: u32, delay: Duration) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        std::thread::sleep(delay);
        let _ = std::process::Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
    })
}

/// Posts `requests` batches of two records back to back, each retried
/// until answered, while the agent is SIGKILLed [`KILLS`] times at
/// moments spread over 5–60 ms after its API is up (so most land inside
/// a request: before, during or after its append, or while its answer
/// is written). `request(i)` gives the key and body of batch `i`, whose
/// values are `r{i}a` and `r{i}b`. Returns the answers.
fn posts_through_sigkills(
    edge: &mut MqttEdge,
    request: impl Fn(usize) -> (Option<String>, String),
) -> (Vec<Value>, usize) {
    const KILLS: usize = 15;
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut answers = Vec::new();
    let mut kills = 0;
    // Deterministic spread of delays (a linear congruential sequence).
    let mut seed: u64 = 0x2545_f491;
    let mut delay = || {
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        Duration::from_millis(5 + (seed >> 33) % 56)
    };
    let mut killer = Some(kill_after(edge.edge.pid().expect("running"), delay()));
    // After the last kill, 20 more requests on a quiet agent.
    let mut after_last_kill = 0;
    while kills < KILLS || after_last_kill < 20 {
        let i = answers.len();
        assert!(
            Instant::now() < deadline,
            "bounded: {kills} kills, {i} requests"
        );
        let (key, body) = request(i);
        match try_post(edge, key.as_deref(), &body) {
            Ok((200, answer)) => {
                answers.push(answer);
                if kills == KILLS {
                    after_last_kill += 1;
                }
            }
            Ok((status, answer)) => panic!("request {i}: {status} {answer}"),
            Err(_) => {
                // The agent died (mid-request or between two): restart it
                // and retry request i.
                if let Some(k) = killer.take() {
                    k.join().expect("killer");
                }
                edge.edge.kill();
                edge.start();
                wait_api(edge);
                kills += 1;
                if kills < KILLS {
                    killer = Some(kill_after(edge.edge.pid().expect("running"), delay()));
                }
            }
        }
    }
    (answers, kills)
}

/// Every batch `i` is stored once, at the offsets its answer gave.
fn assert_stored_once(edge: &mut MqttEdge, answers: &[Value]) {
    assert_eq!(edge.edge.terminate(), Some(0));
    let stored: Vec<(u64, String)> = read_records(&edge.wal_dir("readings"))
        .into_iter()
        .map(|(offset, r)| (offset, String::from_utf8_lossy(&r.value).into_owned()))
        .collect();
    let expected: Vec<(u64, String)> = (0..answers.len())
        .flat_map(|i| [format!("r{i}a"), format!("r{i}b")])
        .zip(0u64..)
        .map(|(v, o)| (o, v))
        .collect();
    assert_eq!(stored.len(), expected.len(), "records stored");
    assert_eq!(stored, expected, "each batch once, in order");
    for (i, answer) in answers.iter().enumerate() {
        let base = 2 * i as u64;
        assert_eq!(
            offsets(answer),
            (Some(base), Some(base + 2), Some(2)),
            "answer of batch {i}"
        );
    }
}

fn pair(i: usize) -> String {
    format!("{{\"value\":\"r{i}a\"}}\n{{\"value\":\"r{i}b\"}}\n")
}

/// Keyed batches posted while the agent is SIGKILLed 15 times at random
/// moments, each retried until answered: every batch is stored exactly
/// once and every answer names its own offsets. Before the agent
/// committed a marker ahead of each append (`crate::pending`), a kill
/// between a durable append and the recorded answer stored the retry a
/// second time.
#[test]
fn keyed_batches_posted_through_sigkills_are_stored_once_each() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut edge = MqttEdge::new(dir.path(), "audit_log", RULES);
    edge.start();
    wait_api(&edge);
    let (answers, kills) =
        posts_through_sigkills(&mut edge, |i| (Some(format!("batch-{i}")), pair(i)));
    assert_eq!(kills, 15);
    assert_stored_once(&mut edge, &answers);
}

/// The same with NDJSON `producer_id` + `sequence` instead of a key.
#[test]
fn sequenced_batches_posted_through_sigkills_are_stored_once_each() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut edge = MqttEdge::new(dir.path(), "audit_log", RULES);
    edge.start();
    wait_api(&edge);
    let (answers, kills) = posts_through_sigkills(&mut edge, |i| {
        let seq = 2 * i;
        let body = format!(
            "{{\"value\":\"r{i}a\",\"producer_id\":\"press\",\"sequence\":{seq}}}\n{{\"value\":\"r{i}b\",\"producer_id\":\"press\",\"sequence\":{}}}\n",
            seq + 1
        );
        (None, body)
    });
    assert_eq!(kills, 15);
    assert_stored_once(&mut edge, &answers);
}

/// Keyed and unkeyed requests with byte-identical records (an explicit
/// timestamp) posted at once, 6 keyed and 3 unkeyed per round, with a
/// SIGKILL in each of 12 rounds; keyed requests retried until answered.
/// Every answered request has its own copy and its own offsets. Before
/// the topic held back identical batches while a keyed request's marker
/// was committed, an unkeyed twin landing after the marker was taken for
/// the keyed request's batch at the restart: the keyed retry was answered
/// with the twin's offsets and its own records were never stored (a
/// fresh-user trial lost records in 6 of 12 such rounds).
#[test]
fn identical_keyed_and_unkeyed_requests_through_sigkills_each_get_their_own_copy() {
    const ROUNDS: usize = 12;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut edge = MqttEdge::new(dir.path(), "event_stream", RULES);
    edge.start();
    wait_api(&edge);
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut seed: u64 = 0x7717_a1b2;
    // Per round: the answers of the keyed and of the unkeyed requests.
    let mut answered: Vec<(Vec<Value>, Vec<Value>)> = Vec::new();
    for round in 0..ROUNDS {
        assert!(Instant::now() < deadline, "bounded: round {round}");
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        let killer = kill_after(
            edge.edge.pid().expect("running"),
            Duration::from_millis(2 + (seed >> 33) % 12),
        );
        let body = format!("{{\"value\":\"TW-{round}\",\"timestamp_ms\":1700000000000}}\n");
        let api = edge.api;
        let (keyed, unkeyed) = std::thread::scope(|s| {
            let posts: Vec<_> = (0..9)
                .map(|t| {
                    let body = body.clone();
                    s.spawn(move || {
                        let key = (t < 6).then(|| format!("r{round}-{t}"));
                        // Keyed: retried (after the restart) until answered;
                        // unkeyed: answered or not, once.
                        let until = Instant::now() + Duration::from_secs(60);
                        loop {
                            match try_post_to(api, key.as_deref(), &body) {
                                Ok((200, answer)) => return (key.is_some(), Some(answer)),
                                Ok((status, answer)) => panic!("{status} {answer}"),
                                Err(_) if key.is_none() => return (false, None),
                                Err(_) => {
                                    assert!(Instant::now() < until, "no answer in 60 s");
                                    std::thread::sleep(Duration::from_millis(20));
                                }
                            }
                        }
                    })
                })
                .collect();
            killer.join().expect("killer");
            // The kill came: restart while the keyed requests retry.
            edge.edge.kill();
            edge.start();
            wait_api(&edge);
            let mut keyed = Vec::new();
            let mut unkeyed = Vec::new();
            for post in posts {
                match post.join().expect("poster") {
                    (true, Some(answer)) => keyed.push(answer),
                    (false, Some(answer)) => unkeyed.push(answer),
                    _ => {}
                }
            }
            (keyed, unkeyed)
        });
        assert_eq!(
            keyed.len(),
            6,
            "round {round}: every keyed request answered"
        );
        answered.push((keyed, unkeyed));
    }
    assert_eq!(edge.edge.terminate(), Some(0));
    let stored: Vec<(u64, String)> = read_records(&edge.wal_dir("readings"))
        .into_iter()
        .map(|(offset, r)| (offset, String::from_utf8_lossy(&r.value).into_owned()))
        .collect();
    let mut bases = std::collections::BTreeSet::new();
    for (round, (keyed, unkeyed)) in answered.iter().enumerate() {
        let value = format!("TW-{round}");
        let copies: Vec<u64> = stored
            .iter()
            .filter(|(_, v)| *v == value)
            .map(|(o, _)| *o)
            .collect();
        let answers = keyed.len() + unkeyed.len();
        // An unkeyed request cut off by the kill may have been stored.
        assert!(
            copies.len() >= answers && copies.len() <= keyed.len() + 3,
            "round {round}: {} copies for {answers} answered requests",
            copies.len()
        );
        for answer in keyed.iter().chain(unkeyed) {
            let base = answer["base_offset"].as_u64().expect("base_offset");
            assert!(
                copies.contains(&base),
                "round {round}: {answer} names no copy"
            );
            assert!(
                bases.insert(base),
                "round {round}: offset {base} answered twice"
            );
        }
    }
}
