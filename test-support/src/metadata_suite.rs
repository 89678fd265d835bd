//! One behavioural suite for every [`MetadataStore`] implementation (the
//! embedded redb store in `broker-core/tests/metadata_suite.rs`, the
//! broker's Raft store in `broker/tests/raft_store_suite.rs`).
//!
//! Each case is a `pub async fn(&Fixture)` that starts from an empty store
//! and asserts exact results. [`crate::metadata_store_suite!`] turns every
//! case into a `#[test]` for an implementation, in an integration test (a
//! unit test inside broker-core would see another copy of its types):
//!
//! ```ignore
//! async fn fixture() -> tributary_test_support::metadata_suite::Fixture { /* fresh store */ }
//! tributary_test_support::metadata_store_suite!(fixture);
//! ```
//!
//! The suite needs the store to read time from the fixture's
//! [`ManualClock`].

use std::any::Any;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use broker_core::clock::{Clock, ManualClock};
use broker_core::metadata::{
    CasOutcome, MAX_KEY_BYTES, MAX_TXN_OPS, MAX_VALUE_BYTES, MetadataError, MetadataStore,
    MetadataStoreExt, Txn, TxnOutcome, WATCH_CHANNEL_CAPACITY, Watch, WatchError, WatchEvent,
};

/// The clock reading every fixture starts at, ms since the Unix epoch.
pub const START_MS: u64 = 1_700_000_000_000;

/// Longest wait for an event that must arrive.
const EVENT_WAIT: Duration = Duration::from_secs(10);

/// A fresh, empty store and the clock it reads.
pub struct Fixture {
    /// The store under test.
    pub store: Arc<dyn MetadataStore>,
    /// The clock the store was built with, reading [`START_MS`].
    pub clock: Arc<ManualClock>,
    /// Whatever must outlive the store (a temporary directory, a cluster).
    pub guard: Box<dyn Any + Send + Sync>,
}

/// Generates one `#[test]` per suite case, each on a fresh fixture from
/// `$fixture`, an `async fn() -> Fixture`, on a 2-worker tokio runtime.
#[macro_export]
macro_rules! metadata_store_suite {
    ($fixture:path) => {
        $crate::metadata_store_suite!(@cases $fixture;
            get_of_missing_key_is_none,
            put_then_get_returns_the_value,
            put_overwrites,
            delete_reports_whether_a_live_value_was_removed,
            cas_on_absent_key_creates_once,
            cas_on_value_swaps_only_on_match,
            txn_applies_all_ops_in_order,
            txn_with_a_failed_precondition_applies_nothing,
            txn_preconditions_see_the_state_before_the_ops,
            list_returns_prefix_matches_sorted,
            watch_delivers_changes_under_the_prefix_in_commit_order,
            watch_starts_after_the_call,
            watch_reports_lag,
            ttl_keys_expire_and_purge_removes_them,
            plain_put_clears_a_ttl_and_ttl_put_refreshes,
            invalid_input_is_refused_before_writing,
            typed_access_round_trips,
            concurrent_cas_increments_are_linearizable,
            random_ops_match_a_model,
        );
    };
    (@cases $fixture:path; $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                $crate::metadata_suite::runtime().block_on(async {
                    let fixture = $fixture().await;
                    $crate::metadata_suite::$case(&fixture).await;
                });
            }
        )*
    };
}

/// The 2-worker tokio runtime each generated test runs its case on.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

fn store(fx: &Fixture) -> &dyn MetadataStore {
    fx.store.as_ref()
}

/// The next event, failing the test after [`EVENT_WAIT`].
async fn next_event(watch: &mut Watch) -> Result<WatchEvent, WatchError> {
    tokio::time::timeout(EVENT_WAIT, watch.recv())
        .await
        .expect("a watch event within the wait")
}

/// Every event already queued, asserting no error.
fn drain(watch: &mut Watch) -> Vec<WatchEvent> {
    let mut events = Vec::new();
    // Bounded: a watch never holds more than the channel capacity.
    for _ in 0..=WATCH_CHANNEL_CAPACITY {
        match watch.try_recv().expect("no lag or close") {
            Some(event) => events.push(event),
            None => return events,
        }
    }
    panic!("watch queue longer than its capacity");
}

fn put_event(key: &str, value: Value) -> WatchEvent {
    WatchEvent::Put {
        key: key.to_owned(),
        value,
    }
}

fn delete_event(key: &str) -> WatchEvent {
    WatchEvent::Delete {
        key: key.to_owned(),
    }
}

/// `get` of a key never written is `None`; so is `list` of an empty store.
pub async fn get_of_missing_key_is_none(fx: &Fixture) {
    let s = store(fx);
    assert_eq!(s.get("/missing").await.unwrap(), None);
    assert_eq!(s.list("").await.unwrap(), vec![]);
    assert_eq!(s.purge_expired().await.unwrap(), 0);
}

/// Every kind of JSON value reads back exactly; `null` is a value.
pub async fn put_then_get_returns_the_value(fx: &Fixture) {
    let s = store(fx);
    let values = [
        json!(null),
        json!(true),
        json!(0),
        json!(u64::MAX),
        json!(-1.5),
        json!("Reliable"),
        json!([1, "two", null]),
        json!({"broker_addr": "10.0.0.1:6650", "nested": {"a": [1, 2]}, "empty": {}}),
    ];
    for (i, value) in values.iter().enumerate() {
        s.put(&format!("/v/{i}"), value.clone()).await.unwrap();
    }
    for (i, value) in values.iter().enumerate() {
        assert_eq!(
            s.get(&format!("/v/{i}")).await.unwrap().as_ref(),
            Some(value)
        );
    }
    // A key holding null exists.
    assert_eq!(
        s.compare_and_swap("/v/0", None, json!(1)).await.unwrap(),
        CasOutcome {
            applied: false,
            current: Some(json!(null))
        }
    );
    // The largest value fits.
    let big = Value::String("x".repeat(MAX_VALUE_BYTES - 2));
    s.put("/big", big.clone()).await.unwrap();
    assert_eq!(s.get("/big").await.unwrap(), Some(big));
}

/// A second put replaces the value.
pub async fn put_overwrites(fx: &Fixture) {
    let s = store(fx);
    s.put("/k", json!(1)).await.unwrap();
    s.put("/k", json!({"v": 2})).await.unwrap();
    assert_eq!(s.get("/k").await.unwrap(), Some(json!({"v": 2})));
    assert_eq!(s.list("/").await.unwrap().len(), 1);
}

/// `delete` is true only when it removed a value.
pub async fn delete_reports_whether_a_live_value_was_removed(fx: &Fixture) {
    let s = store(fx);
    s.put("/k", json!("v")).await.unwrap();
    s.put("/k2", json!("other")).await.unwrap();
    assert!(s.delete("/k").await.unwrap());
    assert_eq!(s.get("/k").await.unwrap(), None);
    assert!(!s.delete("/k").await.unwrap());
    assert!(!s.delete("/never").await.unwrap());
    assert_eq!(s.get("/k2").await.unwrap(), Some(json!("other")));
}

/// Compare-and-swap against absence creates the key exactly once.
pub async fn cas_on_absent_key_creates_once(fx: &Fixture) {
    let s = store(fx);
    assert_eq!(
        s.compare_and_swap("/leader", None, json!(1)).await.unwrap(),
        CasOutcome {
            applied: true,
            current: Some(json!(1))
        }
    );
    assert_eq!(
        s.compare_and_swap("/leader", None, json!(2)).await.unwrap(),
        CasOutcome {
            applied: false,
            current: Some(json!(1))
        }
    );
    assert_eq!(s.get("/leader").await.unwrap(), Some(json!(1)));
}

/// Compare-and-swap against a value swaps only when it matches exactly.
pub async fn cas_on_value_swaps_only_on_match(fx: &Fixture) {
    let s = store(fx);
    s.put("/cursor", json!(10)).await.unwrap();
    assert_eq!(
        s.compare_and_swap("/cursor", Some(json!(9)), json!(11))
            .await
            .unwrap(),
        CasOutcome {
            applied: false,
            current: Some(json!(10))
        }
    );
    // Value equality is JSON equality: 10 and 10.0 differ.
    assert!(
        !s.compare_and_swap("/cursor", Some(json!(10.0)), json!(11))
            .await
            .unwrap()
            .applied
    );
    assert_eq!(
        s.compare_and_swap("/cursor", Some(json!(10)), json!(11))
            .await
            .unwrap(),
        CasOutcome {
            applied: true,
            current: Some(json!(11))
        }
    );
    assert_eq!(
        s.compare_and_swap("/missing", Some(json!(1)), json!(2))
            .await
            .unwrap(),
        CasOutcome {
            applied: false,
            current: None
        }
    );
    assert_eq!(s.get("/missing").await.unwrap(), None);
    assert_eq!(s.get("/cursor").await.unwrap(), Some(json!(11)));
}

/// A transaction applies every op, in order (a later op on the same key
/// wins), and reports `Applied`.
pub async fn txn_applies_all_ops_in_order(fx: &Fixture) {
    let s = store(fx);
    s.put("/old", json!("x")).await.unwrap();
    let txn = Txn::new()
        .when_absent("/topics/a/b")
        .when_equals("/old", json!("x"))
        .put("/topics/a/b", json!(3))
        .put("/topics/a/b/intent", json!({"intent": "task_queue"}))
        .put("/tmp", json!(1))
        .delete("/tmp")
        .delete("/old")
        .delete("/never")
        .put("/twice", json!(1))
        .put("/twice", json!(2));
    assert_eq!(s.txn(txn).await.unwrap(), TxnOutcome::Applied);
    assert_eq!(
        s.list("/").await.unwrap(),
        vec![
            ("/topics/a/b".to_owned(), json!(3)),
            (
                "/topics/a/b/intent".to_owned(),
                json!({"intent": "task_queue"})
            ),
            ("/twice".to_owned(), json!(2)),
        ]
    );
    // An empty transaction applies and changes nothing.
    assert_eq!(s.txn(Txn::new()).await.unwrap(), TxnOutcome::Applied);
    assert_eq!(s.list("/").await.unwrap().len(), 3);
}

/// The first failing precondition is reported and nothing is applied.
pub async fn txn_with_a_failed_precondition_applies_nothing(fx: &Fixture) {
    let s = store(fx);
    s.put("/a", json!(1)).await.unwrap();
    s.put("/b", json!(2)).await.unwrap();
    let mut watch = s.watch("/").await.unwrap();
    let txn = Txn::new()
        .when_equals("/a", json!(1))
        .when_absent("/b")
        .when_absent("/also-fails")
        .put("/a", json!(100))
        .put("/c", json!(3))
        .delete("/b");
    assert_eq!(
        s.txn(txn).await.unwrap(),
        TxnOutcome::ConditionFailed {
            index: 1,
            key: "/b".to_owned(),
            current: Some(json!(2)),
        }
    );
    assert_eq!(
        s.list("/").await.unwrap(),
        vec![("/a".to_owned(), json!(1)), ("/b".to_owned(), json!(2))]
    );
    assert_eq!(
        drain(&mut watch),
        vec![],
        "a failed transaction has no events"
    );
    let txn = Txn::new()
        .when_equals("/missing", json!(1))
        .put("/c", json!(3));
    assert_eq!(
        s.txn(txn).await.unwrap(),
        TxnOutcome::ConditionFailed {
            index: 0,
            key: "/missing".to_owned(),
            current: None,
        }
    );
    assert_eq!(s.get("/c").await.unwrap(), None);
}

/// Preconditions are evaluated against the state before any op, even when
/// an op of the same transaction would make them hold.
pub async fn txn_preconditions_see_the_state_before_the_ops(fx: &Fixture) {
    let s = store(fx);
    let txn = Txn::new()
        .when_absent("/k")
        .put("/k", json!(1))
        .put("/other", json!(true));
    assert!(s.txn(txn).await.unwrap().applied());
    let txn = Txn::new()
        .put("/k", json!(2))
        .when_equals("/k", json!(2))
        .put("/other", json!(false));
    assert_eq!(
        s.txn(txn).await.unwrap(),
        TxnOutcome::ConditionFailed {
            index: 0,
            key: "/k".to_owned(),
            current: Some(json!(1))
        }
    );
    assert_eq!(s.get("/k").await.unwrap(), Some(json!(1)));
    assert_eq!(s.get("/other").await.unwrap(), Some(json!(true)));
}

/// `list` is a plain string-prefix match, sorted by key bytes.
pub async fn list_returns_prefix_matches_sorted(fx: &Fixture) {
    let s = store(fx);
    for key in [
        "/a/b", "/a/bc", "/b", "/a/b/c", "/a/a", "/a/b/a", "/a/B", "/a/b-", "/ab",
    ] {
        s.put(key, json!(key)).await.unwrap();
    }
    let keys = |entries: Vec<(String, Value)>| -> Vec<String> {
        entries
            .into_iter()
            .map(|(key, value)| {
                assert_eq!(value, json!(key), "value belongs to its key");
                key
            })
            .collect()
    };
    assert_eq!(
        keys(s.list("/a/b").await.unwrap()),
        ["/a/b", "/a/b-", "/a/b/a", "/a/b/c", "/a/bc"]
    );
    assert_eq!(keys(s.list("/a/b/").await.unwrap()), ["/a/b/a", "/a/b/c"]);
    assert_eq!(
        keys(s.list("/a/").await.unwrap()),
        ["/a/B", "/a/a", "/a/b", "/a/b-", "/a/b/a", "/a/b/c", "/a/bc"]
    );
    assert_eq!(keys(s.list("").await.unwrap()).len(), 9);
    assert_eq!(keys(s.list("/a/b/c").await.unwrap()), ["/a/b/c"]);
    assert_eq!(keys(s.list("/c").await.unwrap()), Vec::<String>::new());
    assert_eq!(keys(s.list("/b").await.unwrap()), ["/b"]);
}

/// A watch sees puts and deletes under its prefix, in commit order, and
/// nothing outside it; transactions give one event per op.
pub async fn watch_delivers_changes_under_the_prefix_in_commit_order(fx: &Fixture) {
    let s = store(fx);
    let mut watch = s.watch("/topics/").await.unwrap();
    let mut all = s.watch("").await.unwrap();
    assert_eq!(watch.prefix(), "/topics/");
    s.put("/topics/a/b", json!(0)).await.unwrap();
    s.put("/cluster/leader", json!(1)).await.unwrap();
    s.put("/topics/a/b", json!(1)).await.unwrap();
    assert!(s.delete("/topics/a/b").await.unwrap());
    assert!(!s.delete("/topics/none").await.unwrap());
    let txn = Txn::new()
        .put("/topics/x/y", json!("p"))
        .put("/elsewhere", json!(2))
        .delete("/topics/x/y")
        .delete("/topics/missing");
    assert!(s.txn(txn).await.unwrap().applied());
    assert!(
        s.compare_and_swap("/topics/c/d", None, json!("cas"))
            .await
            .unwrap()
            .applied
    );
    let expected = [
        put_event("/topics/a/b", json!(0)),
        put_event("/topics/a/b", json!(1)),
        delete_event("/topics/a/b"),
        put_event("/topics/x/y", json!("p")),
        delete_event("/topics/x/y"),
        put_event("/topics/c/d", json!("cas")),
    ];
    // Awaiting recv and draining see the same sequence.
    assert_eq!(next_event(&mut watch).await, Ok(expected[0].clone()));
    assert_eq!(drain(&mut watch), expected[1..]);
    assert_eq!(
        drain(&mut all),
        vec![
            put_event("/topics/a/b", json!(0)),
            put_event("/cluster/leader", json!(1)),
            put_event("/topics/a/b", json!(1)),
            delete_event("/topics/a/b"),
            put_event("/topics/x/y", json!("p")),
            put_event("/elsewhere", json!(2)),
            delete_event("/topics/x/y"),
            put_event("/topics/c/d", json!("cas")),
        ]
    );
    // A waiting receiver wakes up for a later write.
    let store = Arc::clone(&fx.store);
    let writer = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(20)).await;
        store.put("/topics/late", json!("late")).await.unwrap();
    });
    assert_eq!(
        next_event(&mut watch).await,
        Ok(put_event("/topics/late", json!("late")))
    );
    writer.await.unwrap();
}

/// Writes committed before `watch` resolved are not delivered.
pub async fn watch_starts_after_the_call(fx: &Fixture) {
    let s = store(fx);
    s.put("/w/before", json!(1)).await.unwrap();
    let mut watch = s.watch("/w/").await.unwrap();
    assert_eq!(drain(&mut watch), vec![]);
    s.put("/w/after", json!(2)).await.unwrap();
    assert_eq!(drain(&mut watch), vec![put_event("/w/after", json!(2))]);
    // Two watches of the same prefix each get every event.
    let mut second = s.watch("/w/").await.unwrap();
    assert!(s.delete("/w/before").await.unwrap());
    assert_eq!(drain(&mut watch), vec![delete_event("/w/before")]);
    assert_eq!(drain(&mut second), vec![delete_event("/w/before")]);
}

/// A watcher more than the channel capacity behind gets `Lagged`, then
/// continues with the retained events.
pub async fn watch_reports_lag(fx: &Fixture) {
    let s = store(fx);
    let mut watch = s.watch("/lag/").await.unwrap();
    let mut written = 0usize;
    for round in 0..3 {
        let mut txn = Txn::new();
        for i in 0..MAX_TXN_OPS {
            txn = txn.put(format!("/lag/{round}/{i:05}"), json!(i));
        }
        written += MAX_TXN_OPS;
        assert!(s.txn(txn).await.unwrap().applied());
    }
    assert!(written > WATCH_CHANNEL_CAPACITY);
    match watch.try_recv() {
        Err(WatchError::Lagged { missed }) => {
            assert_eq!(missed as usize, written - WATCH_CHANNEL_CAPACITY);
        }
        other => panic!("expected lag, got {other:?}"),
    }
    let retained = drain(&mut watch);
    assert_eq!(retained.len(), WATCH_CHANNEL_CAPACITY);
    assert_eq!(
        retained.last(),
        Some(&put_event(
            &format!("/lag/2/{:05}", MAX_TXN_OPS - 1),
            json!(MAX_TXN_OPS - 1)
        ))
    );
    assert_eq!(s.list("/lag/").await.unwrap().len(), written);
}

/// A TTL key is live until `now + ttl`, then absent for every read, and
/// `purge_expired` removes it with a delete event.
pub async fn ttl_keys_expire_and_purge_removes_them(fx: &Fixture) {
    let s = store(fx);
    let mut watch = s.watch("/cluster/").await.unwrap();
    s.put_with_ttl("/cluster/register/1", json!({"addr": "a"}), 1000)
        .await
        .unwrap();
    s.put_with_ttl("/cluster/register/2", json!({"addr": "b"}), 5000)
        .await
        .unwrap();
    s.put("/cluster/leader", json!(1)).await.unwrap();

    fx.clock.advance(999);
    assert_eq!(
        s.get("/cluster/register/1").await.unwrap(),
        Some(json!({"addr": "a"}))
    );
    assert_eq!(s.purge_expired().await.unwrap(), 0);

    fx.clock.advance(1);
    assert_eq!(s.get("/cluster/register/1").await.unwrap(), None);
    assert_eq!(
        s.list("/cluster/").await.unwrap(),
        vec![
            ("/cluster/leader".to_owned(), json!(1)),
            ("/cluster/register/2".to_owned(), json!({"addr": "b"})),
        ]
    );
    // Absent for compare-and-swap and preconditions too.
    let txn = Txn::new()
        .when_absent("/cluster/register/1")
        .put("/cluster/probe", json!(0));
    assert!(s.txn(txn).await.unwrap().applied());
    assert!(s.delete("/cluster/probe").await.unwrap());

    fx.clock.advance(4000);
    assert_eq!(s.list("/cluster/register/").await.unwrap(), vec![]);
    assert_eq!(s.purge_expired().await.unwrap(), 2);
    assert_eq!(s.purge_expired().await.unwrap(), 0);
    assert_eq!(
        drain(&mut watch),
        vec![
            put_event("/cluster/register/1", json!({"addr": "a"})),
            put_event("/cluster/register/2", json!({"addr": "b"})),
            put_event("/cluster/leader", json!(1)),
            put_event("/cluster/probe", json!(0)),
            delete_event("/cluster/probe"),
            delete_event("/cluster/register/1"),
            delete_event("/cluster/register/2"),
        ]
    );
    assert_eq!(s.get("/cluster/leader").await.unwrap(), Some(json!(1)));

    // CAS over an expired, unpurged key sees it as absent.
    s.put_with_ttl("/cluster/register/3", json!("old"), 10)
        .await
        .unwrap();
    fx.clock.advance(10);
    assert_eq!(
        s.compare_and_swap("/cluster/register/3", None, json!("new"))
            .await
            .unwrap(),
        CasOutcome {
            applied: true,
            current: Some(json!("new"))
        }
    );
    fx.clock.advance(1_000_000);
    assert_eq!(
        s.get("/cluster/register/3").await.unwrap(),
        Some(json!("new")),
        "the swapped-in value has no TTL"
    );

    // Deleting an expired, unpurged key reports false but removes it.
    s.put_with_ttl("/cluster/register/4", json!(4), 10)
        .await
        .unwrap();
    fx.clock.advance(10);
    let _ = drain(&mut watch);
    assert!(!s.delete("/cluster/register/4").await.unwrap());
    assert_eq!(drain(&mut watch), vec![delete_event("/cluster/register/4")]);
    assert_eq!(s.purge_expired().await.unwrap(), 0);
}

/// A plain put removes a key's TTL; a TTL put restarts it.
pub async fn plain_put_clears_a_ttl_and_ttl_put_refreshes(fx: &Fixture) {
    let s = store(fx);
    s.put_with_ttl("/k", json!(1), 100).await.unwrap();
    s.put("/k", json!(2)).await.unwrap();
    fx.clock.advance(1_000);
    assert_eq!(s.get("/k").await.unwrap(), Some(json!(2)));
    assert_eq!(s.purge_expired().await.unwrap(), 0);

    s.put_with_ttl("/r", json!("a"), 100).await.unwrap();
    fx.clock.advance(60);
    s.put_with_ttl("/r", json!("b"), 100).await.unwrap();
    fx.clock.advance(60);
    assert_eq!(s.get("/r").await.unwrap(), Some(json!("b")));
    fx.clock.advance(40);
    assert_eq!(s.get("/r").await.unwrap(), None);

    // A TTL put in a transaction behaves the same.
    let txn = Txn::new().put_with_ttl("/t", json!(true), 5);
    assert!(s.txn(txn).await.unwrap().applied());
    assert_eq!(s.get("/t").await.unwrap(), Some(json!(true)));
    fx.clock.advance(5);
    assert_eq!(s.get("/t").await.unwrap(), None);
    assert_eq!(s.purge_expired().await.unwrap(), 2);
    assert_eq!(s.list("").await.unwrap(), vec![("/k".to_owned(), json!(2))]);
}

/// Bad keys, values, TTLs and oversized transactions are errors and write
/// nothing.
pub async fn invalid_input_is_refused_before_writing(fx: &Fixture) {
    let s = store(fx);
    let long_key = format!("/{}", "k".repeat(MAX_KEY_BYTES));
    for key in ["", "no-slash", "/ctl\n", long_key.as_str()] {
        assert!(
            matches!(
                s.put(key, json!(1)).await,
                Err(MetadataError::InvalidKey { .. })
            ),
            "put {key:?}"
        );
        assert!(
            matches!(s.get(key).await, Err(MetadataError::InvalidKey { .. })),
            "get {key:?}"
        );
        assert!(
            matches!(s.delete(key).await, Err(MetadataError::InvalidKey { .. })),
            "delete {key:?}"
        );
    }
    let max_key = format!("/{}", "k".repeat(MAX_KEY_BYTES - 1));
    s.put(&max_key, json!("longest key")).await.unwrap();
    assert!(matches!(
        s.list(&long_key).await,
        Err(MetadataError::InvalidKey { .. })
    ));
    assert!(matches!(
        s.watch(&long_key).await,
        Err(MetadataError::InvalidKey { .. })
    ));
    let too_big = Value::String("x".repeat(MAX_VALUE_BYTES - 1));
    match s.put("/big", too_big).await {
        Err(MetadataError::ValueTooLarge { bytes, max, .. }) => {
            assert_eq!((bytes, max), (MAX_VALUE_BYTES + 1, MAX_VALUE_BYTES));
        }
        other => panic!("expected ValueTooLarge, got {other:?}"),
    }
    assert!(matches!(
        s.put_with_ttl("/ttl", json!(1), 0).await,
        Err(MetadataError::ZeroTtl { .. })
    ));
    let mut txn = Txn::new().when_absent("/p");
    for i in 0..MAX_TXN_OPS {
        txn = txn.put(format!("/many/{i}"), json!(i));
    }
    match s.txn(txn).await {
        Err(MetadataError::TooManyOps { count, max }) => {
            assert_eq!((count, max), (MAX_TXN_OPS + 1, MAX_TXN_OPS));
        }
        other => panic!("expected TooManyOps, got {other:?}"),
    }
    // One bad op spoils the whole transaction.
    let txn = Txn::new().put("/fine", json!(1)).put("bad", json!(2));
    assert!(matches!(
        s.txn(txn).await,
        Err(MetadataError::InvalidKey { .. })
    ));
    assert_eq!(
        s.list("").await.unwrap(),
        vec![(max_key, json!("longest key"))]
    );
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Registration {
    broker_addr: String,
    admin_addr: String,
}

/// `get_as` / `put_as` encode and decode through JSON.
pub async fn typed_access_round_trips(fx: &Fixture) {
    let s = store(fx);
    let reg = Registration {
        broker_addr: "10.0.0.1:6650".into(),
        admin_addr: "10.0.0.1:50051".into(),
    };
    s.put_as("/cluster/register/1", &reg).await.unwrap();
    assert_eq!(
        s.get("/cluster/register/1").await.unwrap(),
        Some(json!({"broker_addr": "10.0.0.1:6650", "admin_addr": "10.0.0.1:50051"}))
    );
    assert_eq!(
        s.get_as::<Registration>("/cluster/register/1")
            .await
            .unwrap(),
        Some(reg)
    );
    assert_eq!(s.get_as::<u64>("/missing").await.unwrap(), None);
    s.put_as("/cursor", &42u64).await.unwrap();
    assert_eq!(s.get_as::<u64>("/cursor").await.unwrap(), Some(42));
    assert!(matches!(
        s.get_as::<Registration>("/cursor").await,
        Err(MetadataError::Decode { .. })
    ));
}

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
