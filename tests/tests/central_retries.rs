//! Central publishes with an `Idempotency-Key` across SIGKILLs of a real
//! `broker` process (`docs/consumer-api.md`, "Retries without
//! duplicates"): a client publishes 150 keyed requests of 5 records,
//! retrying each with the same key and body until it is answered, while
//! the broker is SIGKILLed and restarted 8 times, each time a few
//! milliseconds after a request was answered (so requests are in flight);
//! then every request is
//! sent once more. Every request's records are stored exactly once, at
//! the offsets it was answered with (the same on the extra retry), and the
//! topic holds nothing else: offsets `0..300` in request order.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rand::{RngExt, SeedableRng};
use serde_json::{Value, json};
use tributary_api::consumer_client::ConsumerClient;
use tributary_test_support::process::bin_path;
use tributary_tests::solo::SoloBroker;

const TOKEN: &str = "e2e-test-token";
const TOPIC: &str = "/default/orders";
const REQUESTS: usize = 150;
const PER_REQUEST: usize = 5;
const KILLS: usize = 8;

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(10)))
        .http_status_as_error(false)
        .build()
        .into()
}

fn body(request: usize) -> String {
    let records: Vec<Value> = (0..PER_REQUEST)
        .map(|i| json!({"value": format!("r{request}-{i}"), "timestamp_ms": 1_700_000_000_000u64}))
        .collect();
    json!({ "records": records }).to_string()
}

/// POSTs request `request` with its key; `Some((base, next))` once
/// answered 200, `None` on no answer or a retryable refusal.
fn publish(base_url: &str, request: usize) -> Option<(u64, u64)> {
    let mut response = agent()
        .post(format!("{base_url}/v1/topics{TOPIC}/records"))
        .header("Authorization", format!("Bearer {TOKEN}"))
        .header("Content-Type", "application/json")
        .header("Idempotency-Key", format!("order-{request}"))
        .send(body(request))
        .ok()?;
    let status = response.status().as_u16();
    let reply: Value = response.body_mut().read_json().unwrap_or(Value::Null);
    match status {
        200 => Some((
            reply["base_offset"].as_u64().expect("base_offset"),
            reply["next_offset"].as_u64().expect("next_offset"),
        )),
        // Not up yet, no owner yet, the WAL closed under the request.
        409 | 500 | 503 => {
            assert_ne!(reply["kind"], "idempotency_key_reused", "{reply}");
            None
        }
        other => panic!("request {request}: {other} {reply}"),
    }
}

#[test]
fn keyed_central_publishes_are_stored_once_across_broker_sigkills() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut broker = SoloBroker::new(dir.path(), &bin_path("broker"), "", None);
    broker.start();
    let base_url = format!("http://{}", broker.admin);
    let created = agent()
        .post(format!("{base_url}/v1/topics"))
        .header("Authorization", format!("Bearer {TOKEN}"))
        .send_json(json!({"name": TOPIC, "intent": "task_queue", "partitions": 0}))
        .expect("create topic");
    assert_eq!(created.status().as_u16(), 201);

    let answered = AtomicUsize::new(0);
    let answers: Vec<(u64, u64)> = std::thread::scope(|s| {
        let publisher = s.spawn(|| {
            let mut answers = Vec::with_capacity(REQUESTS);
            for request in 0..REQUESTS {
                let deadline = Instant::now() + Duration::from_secs(120);
                loop {
                    if let Some(answer) = publish(&base_url, request) {
                        answers.push(answer);
                        answered.fetch_add(1, Ordering::SeqCst);
                        break;
                    }
                    assert!(
                        Instant::now() < deadline,
                        "request {request} never answered"
                    );
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
            answers
        });
        let mut rng = rand::rngs::StdRng::seed_from_u64(19);
        for kill in 0..KILLS {
            // A request answered since the restart, then a moment later
            // (others in flight) the SIGKILL.
            let seen = answered.load(Ordering::SeqCst);
            let deadline = Instant::now() + Duration::from_secs(60);
            while answered.load(Ordering::SeqCst) == seen {
                assert!(Instant::now() < deadline, "no progress before kill {kill}");
                std::thread::sleep(Duration::from_millis(1));
            }
            std::thread::sleep(Duration::from_millis(rng.random_range(0..15)));
            assert!(
                answered.load(Ordering::SeqCst) < REQUESTS,
                "the publisher finished before kill {kill}"
            );
            broker.broker.kill();
            broker.start();
        }
        publisher.join().expect("publisher")
    });

    // Each request once more: the same answer, nothing stored.
    for (request, answer) in answers.iter().enumerate() {
        let again = (0..100)
            .find_map(|_| {
                publish(&base_url, request).or_else(|| {
                    std::thread::sleep(Duration::from_millis(100));
                    None
                })
            })
            .expect("answered");
        assert_eq!(again, *answer, "request {request}");
    }
    let client = ConsumerClient::new(&base_url, TOKEN);
    let mut values = Vec::new();
    loop {
        let page = client
            .peek(TOPIC, Some(values.len() as u64), 500)
            .expect("peek");
        if page.messages.is_empty() {
            break;
        }
        values.extend(page.messages.into_iter().map(|m| m.value.expect("text")));
    }
    assert_eq!(values.len(), REQUESTS * PER_REQUEST, "each request once");
    for (request, (base, next)) in answers.iter().enumerate() {
        assert_eq!((*next - *base) as usize, PER_REQUEST);
        let want: Vec<String> = (0..PER_REQUEST)
            .map(|i| format!("r{request}-{i}"))
            .collect();
        assert_eq!(
            values[*base as usize..*next as usize],
            want[..],
            "request {request} at {base}"
        );
    }
}
