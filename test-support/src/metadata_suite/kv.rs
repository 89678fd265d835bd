//! Cases on single keys, compare-and-swap, transactions and listing.

use broker_core::metadata::{CasOutcome, MAX_VALUE_BYTES, Txn, TxnOutcome};
use serde_json::{Value, json};

use super::{Fixture, drain, store};

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
        // A write this node applied is in its local copy too.
        assert_eq!(
            s.get_local(&format!("/v/{i}")).await.unwrap().as_ref(),
            Some(value)
        );
    }
    assert_eq!(s.get_local("/v/absent").await.unwrap(), None);
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
