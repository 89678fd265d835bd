//! Cases on prefix watches: order, start point, lag.

use std::sync::Arc;
use std::time::Duration;

use broker_core::metadata::{MAX_TXN_OPS, Txn, WATCH_CHANNEL_CAPACITY, WatchError};
use serde_json::json;

use super::{Fixture, delete_event, drain, next_event, put_event, store};

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
