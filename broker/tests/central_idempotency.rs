//! Central publishes with an `Idempotency-Key` (`docs/consumer-api.md`,
//! "Retries without duplicates"), over real HTTP on 127.0.0.1 against the
//! consumer router on a redb store and real topic WALs: a retry is
//! answered with the original offsets and stores nothing, another body
//! with a used key is refused, concurrent requests with one key store
//! once, keyed and unkeyed publishes racing for the next offset each
//! store once, and a marker left by a crash (committed before the append;
//! a crash cannot be had on demand in-process, so the marker is written as
//! the broker writes it) is settled: the records found at its offset are
//! answered, none found are stored.

mod served;

use broker_core::catalog::{Catalog, TopicSpec};
use broker_core::idempotency::{fingerprint, records_digest};
use broker_core::metadata::MetadataStore;
use bytes::Bytes;
use serde_json::{Value, json};
use served::Served;
use tributary_api::consumer_client::ConsumerClient;
use tributary_broker::consumer::ConsumerConfig;
use tributary_proto::Record;
use tributary_proto::keys::TopicName;

const TOKEN: &str = "idempotency-test-token";
const JOBS: &str = "/shop/jobs";

/// The admin and consumer routers on a redb store and topic WALs, with
/// [`JOBS`] created (`task_queue`).
struct Harness {
    served: Served,
    client: ConsumerClient,
}

impl Harness {
    fn start() -> Harness {
        let served = Served::consumers(TOKEN, ConsumerConfig::default());
        let spec = TopicSpec::parse(JOBS, "task_queue", 0).unwrap();
        served
            .runtime
            .block_on(Catalog::new(served.store.as_ref()).create_topic(&spec))
            .unwrap();
        Harness {
            client: ConsumerClient::new(&served.base, TOKEN),
            served,
        }
    }

    /// POSTs `body` to the topic's records with the given `Idempotency-Key`
    /// headers: status and JSON body.
    fn post(&self, keys: &[&[u8]], body: &str) -> (u16, Value) {
        let mut request = ureq::http::Request::builder()
            .method("POST")
            .uri(format!("{}/v1/topics{JOBS}/records", self.served.base))
            .header("Authorization", format!("Bearer {TOKEN}"))
            .header("Content-Type", "application/json");
        for key in keys {
            request = request.header(
                "Idempotency-Key",
                ureq::http::HeaderValue::from_bytes(key).unwrap(),
            );
        }
        let response = self
            .served
            .raw
            .run(request.body(body.to_owned()).unwrap())
            .unwrap();
        let status = response.status().as_u16();
        let text = response.into_body().read_to_string().unwrap();
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    fn high_water_mark(&self) -> u64 {
        self.client.peek(JOBS, Some(0), 1).unwrap().high_water_mark
    }

    /// Every stored value, in offset order.
    fn values(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut next = 0;
        loop {
            let page = self.client.peek(JOBS, Some(next), 500).unwrap();
            let Some(last) = page.messages.last() else {
                return out;
            };
            next = last.offset + 1;
            out.extend(page.messages.into_iter().map(|m| m.value.unwrap()));
        }
    }
}

/// A body of `n` records `{tag}-0`.. with fixed timestamps and a header.
fn body(tag: &str, n: u64) -> String {
    let records: Vec<Value> = (0..n)
        .map(|i| {
            json!({"value": format!("{tag}-{i}"), "key": "k", "headers": {"h": "x"},
                   "timestamp_ms": 1_700_000_000_000u64 + i})
        })
        .collect();
    json!({ "records": records }).to_string()
}

/// The records of [`body`] as the broker stores them.
fn stored_records(tag: &str, n: u64) -> Vec<Record> {
    (0..n)
        .map(|i| Record {
            timestamp_ms: 1_700_000_000_000 + i as i64,
            key: Some(Bytes::from_static(b"k")),
            headers: vec![("h".to_owned(), Bytes::from_static(b"x"))],
            value: Bytes::from(format!("{tag}-{i}")),
        })
        .collect()
}

fn offsets(reply: &Value) -> (u64, u64) {
    (
        reply["base_offset"].as_u64().unwrap(),
        reply["next_offset"].as_u64().unwrap(),
    )
}

#[test]
fn a_retry_is_answered_with_the_original_offsets_and_another_body_is_refused() {
    let h = Harness::start();
    let (status, first) = h.post(&[b"order-17"], &body("a", 3));
    assert_eq!(status, 200, "{first}");
    assert_eq!(offsets(&first), (0, 3));
    // The same request again: the same answer, nothing stored.
    let (status, again) = h.post(&[b"order-17"], &body("a", 3));
    assert_eq!((status, &again), (200, &first));
    assert_eq!(h.high_water_mark(), 3);
    // Another body with the used key: refused, nothing stored.
    let (status, refused) = h.post(&[b"order-17"], &body("b", 2));
    assert_eq!(status, 409, "{refused}");
    assert_eq!(refused["kind"], "idempotency_key_reused");
    assert!(
        refused["error"]
            .as_str()
            .unwrap()
            .contains("its records start at offset 0"),
        "{refused}"
    );
    // Another key, and no key: stored as usual.
    assert_eq!(offsets(&h.post(&[b"order-18"], &body("b", 2)).1), (3, 5));
    assert_eq!(offsets(&h.post(&[], &body("a", 3)).1), (5, 8));
    assert_eq!(h.high_water_mark(), 8);
    // Bad keys: 400 naming the header, nothing stored.
    let long = vec![b'x'; 201];
    for (keys, says) in [
        (vec![&b""[..]], "1 to 200 bytes"),
        (vec![&long[..]], "1 to 200 bytes"),
        (vec![&b"a b"[..]], "visible ASCII only"),
        (vec![&b"caf\xc3\xa9"[..]], "visible ASCII only"),
        (vec![&b"a"[..], &b"a"[..]], "given more than once"),
    ] {
        let (status, reply) = h.post(&keys, &body("c", 1));
        assert_eq!(status, 400, "{keys:?}: {reply}");
        assert_eq!(reply["kind"], "invalid_input");
        assert_eq!(reply["field"], "Idempotency-Key");
        assert!(reply["error"].as_str().unwrap().contains(says), "{reply}");
    }
    assert_eq!(h.high_water_mark(), 8);
}

#[test]
fn concurrent_requests_with_one_key_store_once_and_keyed_and_unkeyed_each_store_once() {
    let h = Harness::start();
    // Eight clients send the same keyed request at once.
    let answers: Vec<(u16, Value)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|_| s.spawn(|| h.post(&[b"same"], &body("same", 4))))
            .collect();
        handles.into_iter().map(|t| t.join().unwrap()).collect()
    });
    for (status, reply) in &answers {
        assert_eq!(*status, 200, "{reply}");
        assert_eq!(offsets(reply), (0, 4));
    }
    assert_eq!(h.high_water_mark(), 4);

    // Keyed requests (each its own key) race unkeyed ones for the next
    // offset: every request's records are stored once, at the offsets it
    // was answered with.
    let results: Vec<(String, (u16, Value))> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..6)
            .map(|t| {
                let h = &h;
                s.spawn(move || {
                    let mut out = Vec::new();
                    for i in 0..10 {
                        let tag = format!("t{t}-{i}");
                        let key = tag.clone();
                        let keys: Vec<&[u8]> = if t % 2 == 0 {
                            vec![key.as_bytes()]
                        } else {
                            vec![]
                        };
                        out.push((tag.clone(), h.post(&keys, &body(&tag, 3))));
                    }
                    out
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect()
    });
    for (tag, (status, reply)) in &results {
        assert_eq!(*status, 200, "{tag}: {reply}");
    }
    let values = h.values();
    assert_eq!(values.len(), 4 + 6 * 10 * 3, "each request stored once");
    for (tag, (_, reply)) in &results {
        let (base, next) = offsets(reply);
        assert_eq!(next - base, 3);
        let got: Vec<&String> = values[base as usize..next as usize].iter().collect();
        let want: Vec<String> = (0..3).map(|i| format!("{tag}-{i}")).collect();
        assert_eq!(got, want.iter().collect::<Vec<_>>(), "{tag} at {base}");
    }
}

#[test]
fn a_marker_left_by_a_crash_is_settled_from_what_the_topic_holds() {
    let h = Harness::start();
    let topic = TopicName::new(JOBS).unwrap();
    let marker = |key: &str, tag: &str, from: u64| {
        let store_key = tributary_proto::keys::topics::idempotency(&topic, key);
        let value = json!({
            "state": "pending",
            "fingerprint": fingerprint(&[body(tag, 2).as_bytes()]),
            "from": from,
            "count": 2,
            "records_digest": records_digest(&stored_records(tag, 2)),
        });
        h.served
            .runtime
            .block_on(h.served.store.put(&store_key, value))
            .unwrap();
    };
    // A crash after the append, before the answer was recorded: the
    // records are at the marker's offset; the retry gets them.
    assert_eq!(offsets(&h.post(&[], &body("x", 2)).1), (0, 2));
    marker("after-append", "x", 0);
    let (status, reply) = h.post(&[b"after-append"], &body("x", 2));
    assert_eq!((status, offsets(&reply)), (200, (0, 2)), "{reply}");
    assert_eq!(h.high_water_mark(), 2, "nothing stored again");
    // A crash after the marker, before the append: other records took the
    // offset since; the retry is stored (once) after them.
    marker("before-append", "y", 2);
    assert_eq!(offsets(&h.post(&[], &body("other", 2)).1), (2, 4));
    let (status, reply) = h.post(&[b"before-append"], &body("y", 2));
    assert_eq!((status, offsets(&reply)), (200, (4, 6)), "{reply}");
    let (status, again) = h.post(&[b"before-append"], &body("y", 2));
    assert_eq!((status, offsets(&again)), (200, (4, 6)));
    // A marker past the high-water mark (the append never happened).
    marker("nothing", "z", 100);
    let (status, reply) = h.post(&[b"nothing"], &body("z", 2));
    assert_eq!((status, offsets(&reply)), (200, (6, 8)), "{reply}");
    // A pending marker of another body: refused.
    marker("theirs", "w", 8);
    let (status, reply) = h.post(&[b"theirs"], &body("v", 2));
    assert_eq!(status, 409, "{reply}");
    assert_eq!(reply["kind"], "idempotency_key_reused");
    assert_eq!(
        h.values(),
        [
            "x-0", "x-1", "other-0", "other-1", "y-0", "y-1", "z-0", "z-1"
        ]
    );
}
