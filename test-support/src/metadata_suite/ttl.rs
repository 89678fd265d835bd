//! Cases on keys with a TTL: expiry on the fixture's clock, purge, refresh.

use broker_core::metadata::{CasOutcome, Txn};
use serde_json::json;

use super::{Fixture, delete_event, drain, put_event, store};

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
    assert_eq!(s.get_local("/cluster/register/1").await.unwrap(), None);
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
