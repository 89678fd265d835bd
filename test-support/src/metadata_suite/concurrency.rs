//! Linearizable concurrent compare-and-swap, and random operations checked
//! against an in-memory model.

use std::collections::BTreeMap;
use std::sync::Arc;

use broker_core::clock::Clock;
use broker_core::metadata::{CasOutcome, Txn, TxnOutcome, WatchEvent};
use serde_json::{Value, json};

use super::{Fixture, delete_event, drain, put_event, store};

/// Concurrent read-modify-write loops over compare-and-swap lose no update.
pub async fn concurrent_cas_increments_are_linearizable(fx: &Fixture) {
    const TASKS: u64 = 6;
    const INCREMENTS: u64 = 8;
    const ATTEMPTS_MAX: u32 = 1000;
    fx.store.put("/counter", json!(0)).await.unwrap();
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let store = Arc::clone(&fx.store);
            tokio::spawn(async move {
                let mut attempts = 0;
                for _ in 0..INCREMENTS {
                    let mut current = store.get("/counter").await.unwrap();
                    loop {
                        attempts += 1;
                        assert!(attempts <= ATTEMPTS_MAX, "CAS retries unbounded");
                        let n = current.as_ref().and_then(Value::as_u64).unwrap();
                        let outcome = store
                            .compare_and_swap("/counter", current.clone(), json!(n + 1))
                            .await
                            .unwrap();
                        if outcome.applied {
                            break;
                        }
                        current = outcome.current;
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(
        fx.store.get("/counter").await.unwrap(),
        Some(json!(TASKS * INCREMENTS))
    );
}

// ---------------------------------------------------------------------------
// Model test
// ---------------------------------------------------------------------------

/// splitmix64: a tiny seeded generator, so the suite needs no RNG crate.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

/// The reference: key → (value, expires_at_ms).
#[derive(Default)]
struct Model {
    entries: BTreeMap<String, (Value, Option<u64>)>,
    events: Vec<WatchEvent>,
}

impl Model {
    fn live(&self, key: &str, now: u64) -> Option<Value> {
        self.entries
            .get(key)
            .filter(|(_, at)| at.is_none_or(|at| now < at))
            .map(|(value, _)| value.clone())
    }

    fn put(&mut self, key: &str, value: Value, expires_at: Option<u64>) {
        self.entries
            .insert(key.to_owned(), (value.clone(), expires_at));
        self.events.push(put_event(key, value));
    }

    fn delete(&mut self, key: &str, now: u64) -> bool {
        let live = self.live(key, now).is_some();
        if self.entries.remove(key).is_some() {
            self.events.push(delete_event(key));
        }
        live
    }

    fn list(&self, prefix: &str, now: u64) -> Vec<(String, Value)> {
        self.entries
            .keys()
            .filter(|key| key.starts_with(prefix))
            .filter_map(|key| self.live(key, now).map(|value| (key.clone(), value)))
            .collect()
    }

    fn purge(&mut self, now: u64) -> usize {
        let expired: Vec<String> = self
            .entries
            .iter()
            .filter(|(_, (_, at))| at.is_some_and(|at| now >= at))
            .map(|(key, _)| key.clone())
            .collect();
        for key in &expired {
            self.entries.remove(key);
            self.events.push(delete_event(key));
        }
        expired.len()
    }
}

const MODEL_KEYS: [&str; 6] = ["/m/a", "/m/b", "/m/a/x", "/m/ab", "/n/a", "/n/b/c"];
const MODEL_PREFIXES: [&str; 7] = ["", "/", "/m/", "/m/a", "/n", "/n/b/", "/zz"];
const MODEL_STEPS: usize = 250;
const MODEL_SEED: u64 = 0x7472_6962_7574_6172;

/// Random operations against the store and a `BTreeMap` model agree on
/// every result and on the watch event sequence. The seed is printed on
/// failure.
pub async fn random_ops_match_a_model(fx: &Fixture) {
    let s = store(fx);
    let seed = MODEL_SEED;
    let mut rng = SplitMix(seed);
    let mut model = Model::default();
    let mut watch = s.watch("").await.unwrap();
    let value = |rng: &mut SplitMix| match rng.below(3) {
        0 => json!(rng.below(4)),
        1 => json!({"v": rng.below(4)}),
        _ => json!(null),
    };
    for step in 0..MODEL_STEPS {
        let now = fx.clock.now_ms();
        let key = *rng.pick(&MODEL_KEYS);
        let ctx = format!("seed {seed:#x} step {step}");
        match rng.below(10) {
            0 => {
                let v = value(&mut rng);
                s.put(key, v.clone()).await.unwrap();
                model.put(key, v, None);
            }
            1 => {
                let v = value(&mut rng);
                let ttl = 1 + rng.below(4);
                s.put_with_ttl(key, v.clone(), ttl).await.unwrap();
                model.put(key, v, Some(now + ttl));
            }
            2 => {
                let removed = s.delete(key).await.unwrap();
                assert_eq!(removed, model.delete(key, now), "{ctx}: delete {key}");
            }
            3 => {
                assert_eq!(
                    s.get(key).await.unwrap(),
                    model.live(key, now),
                    "{ctx}: get {key}"
                );
            }
            4 => {
                let expected = match rng.below(3) {
                    0 => model.live(key, now),
                    1 => None,
                    _ => Some(value(&mut rng)),
                };
                let new = value(&mut rng);
                let outcome = s
                    .compare_and_swap(key, expected.clone(), new.clone())
                    .await
                    .unwrap();
                let current = model.live(key, now);
                let want = if current == expected {
                    model.put(key, new.clone(), None);
                    CasOutcome {
                        applied: true,
                        current: Some(new),
                    }
                } else {
                    CasOutcome {
                        applied: false,
                        current,
                    }
                };
                assert_eq!(outcome, want, "{ctx}: cas {key}");
            }
            5 => {
                let mut txn = Txn::new();
                let mut conditions = Vec::new();
                for _ in 0..rng.below(3) {
                    let k = *rng.pick(&MODEL_KEYS);
                    let expected = if rng.below(2) == 0 {
                        model.live(k, now)
                    } else {
                        Some(value(&mut rng))
                    };
                    conditions.push((k, expected.clone()));
                    txn = match expected {
                        Some(v) => txn.when_equals(k, v),
                        None => txn.when_absent(k),
                    };
                }
                let mut ops = Vec::new();
                for _ in 0..1 + rng.below(3) {
                    let k = *rng.pick(&MODEL_KEYS);
                    if rng.below(3) == 0 {
                        ops.push((k, None));
                        txn = txn.delete(k);
                    } else {
                        let v = value(&mut rng);
                        ops.push((k, Some(v.clone())));
                        txn = txn.put(k, v);
                    }
                }
                let outcome = s.txn(txn).await.unwrap();
                let failed = conditions
                    .iter()
                    .enumerate()
                    .find(|(_, (k, expected))| model.live(k, now) != *expected);
                let want = match failed {
                    Some((index, (k, _))) => TxnOutcome::ConditionFailed {
                        index,
                        key: (*k).to_owned(),
                        current: model.live(k, now),
                    },
                    None => {
                        for (k, op) in ops {
                            match op {
                                Some(v) => model.put(k, v, None),
                                None => {
                                    model.delete(k, now);
                                }
                            }
                        }
                        TxnOutcome::Applied
                    }
                };
                assert_eq!(outcome, want, "{ctx}: txn");
            }
            6 => {
                let prefix = *rng.pick(&MODEL_PREFIXES);
                assert_eq!(
                    s.list(prefix).await.unwrap(),
                    model.list(prefix, now),
                    "{ctx}: list {prefix:?}"
                );
            }
            7 => {
                assert_eq!(
                    s.purge_expired().await.unwrap(),
                    model.purge(now),
                    "{ctx}: purge"
                );
            }
            _ => fx.clock.advance(rng.below(3)),
        }
    }
    let now = fx.clock.now_ms();
    assert_eq!(
        s.list("").await.unwrap(),
        model.list("", now),
        "final state"
    );
    assert_eq!(
        drain(&mut watch),
        model.events,
        "seed {seed:#x}: event sequence"
    );
}
