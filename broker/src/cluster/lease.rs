//! This broker's lease: `/cluster/brokers/{id}/state` put with a TTL every
//! heartbeat, carrying its addresses and load. A renewal counts from the
//! moment it was proposed ([`super::Cluster::lease_fresh`]), once this
//! broker's own state machine has applied it (`RaftMetadataStore` waits for
//! the local apply).
//!
//! After a renewal that did not complete in time (no Raft majority, or
//! committed but not applied here), the next is proposed only once a
//! linearizable read completes here within the same time: a read-index
//! through the leader, then applied locally. A broker whose state machine
//! lags (a snapshot it cannot install, a stalled disk) cannot serve its
//! topics; so it lets its key lapse and the load manager gives them to a
//! broker that can, rather than keeping them on a lease it renews but never
//! gets fresh.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use broker_core::metadata::Txn;
use tributary_proto::cluster::BrokerState;
use tributary_proto::keys::cluster as keys;

use super::Cluster;

/// Renews the lease every heartbeat until the task is aborted. A failed
/// renewal is logged once until one succeeds again.
pub async fn run(cluster: Arc<Cluster>) {
    let started_at_ms = cluster.clock.now_ms();
    let heartbeat = Duration::from_millis(cluster.config.heartbeat_ms.max(10));
    let mut failing = false;
    let mut ever_renewed = false;
    let mut last_bytes = 0u64;
    let mut last_at = cluster.clock.now();
    let mut in_doubt = false;
    loop {
        if in_doubt && !caught_up(&cluster, heartbeat * 2).await {
            if !failing {
                failing = true;
                tracing::warn!(
                    broker = cluster.me,
                    "not renewing the broker lease: this broker's state machine does not catch up with the Raft log (or there is no majority); its topics stop being served and move once the lease lapses"
                );
            }
            if !cluster.lease_fresh() {
                cluster.bump();
            }
            tokio::time::sleep(heartbeat).await;
            continue;
        }
        let started = cluster.clock.now();
        let bytes = cluster.bytes_in.load(Ordering::Relaxed);
        let elapsed = started.saturating_duration_since(last_at).as_secs_f64();
        let bytes_in_per_s = if elapsed > 0.0 {
            ((bytes - last_bytes) as f64 / elapsed) as u64
        } else {
            0
        };
        (last_bytes, last_at) = (bytes, started);
        let state = BrokerState {
            broker_id: cluster.me,
            ingest_addr: cluster.config.ingest_addr.clone(),
            admin_url: cluster.config.admin_url.clone(),
            lifecycle: cluster.lifecycle(),
            topics_owned: cluster.owned().len() as u64,
            bytes_in_per_s,
            lease_ttl_ms: cluster.config.lease_ttl_ms,
            renewed_at_ms: cluster.clock.now_ms(),
            started_at_ms,
        };
        let value = serde_json::to_value(&state).unwrap_or_default();
        let txn = Txn::new().put_with_ttl(
            keys::broker_state(cluster.me),
            value,
            cluster.config.lease_ttl_ms.max(1),
        );
        let renewal = tokio::time::timeout(heartbeat * 2, cluster.store.txn(txn)).await;
        let renewed = matches!(renewal, Ok(Ok(_)));
        match renewal {
            Ok(Ok(_)) => {
                if failing {
                    tracing::info!(broker = cluster.me, "lease renewed again");
                    failing = false;
                } else if !ever_renewed {
                    tracing::info!(
                        broker = cluster.me,
                        ttl_ms = cluster.config.lease_ttl_ms,
                        "broker lease registered"
                    );
                }
                ever_renewed = true;
                in_doubt = false;
                cluster.lease_renewed(started);
            }
            // Before the first renewal the Raft group may still be electing.
            Ok(Err(_)) | Err(_) if !ever_renewed => {}
            Ok(Err(e)) if !failing => {
                failing = true;
                tracing::warn!(broker = cluster.me, error = %e, "cannot renew the broker lease; its topics stop being served when it lapses");
            }
            Err(_) if !failing => {
                failing = true;
                tracing::warn!(
                    broker = cluster.me,
                    "lease renewal timed out (no Raft majority?); its topics stop being served when it lapses"
                );
            }
            _ => {}
        }
        if !renewed && ever_renewed {
            in_doubt = true;
        }
        if !cluster.lease_fresh() {
            cluster.bump();
        }
        let next = started + heartbeat;
        tokio::time::sleep_until(next.into()).await;
    }
}

/// Whether a linearizable read of this broker's own state key completes
/// within `limit` (on Raft: the leader's commit point applied here).
async fn caught_up(cluster: &Cluster, limit: Duration) -> bool {
    let key = keys::broker_state(cluster.me);
    matches!(
        tokio::time::timeout(limit, cluster.store.get(&key)).await,
        Ok(Ok(_))
    )
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::time::Duration;

    use broker_core::clock::SystemClock;
    use broker_core::metadata::redb::RedbStore;
    use broker_core::metadata::{MetadataError, MetadataStore, Txn, TxnOutcome, Watch};
    use futures::future::BoxFuture;
    use serde_json::Value;
    use tributary_proto::keys::cluster as keys;

    use super::super::{Cluster, ClusterConfig};

    /// A store whose writes commit at once but, while `lagging`, answer
    /// only after `lag`, as do its reads: a Raft write committed by the
    /// majority that this node's state machine applies late, and reads that
    /// wait for it. (A lagging state machine cannot be produced on demand
    /// with a real Raft group here.)
    struct LaggingStore {
        inner: RedbStore,
        lagging: AtomicBool,
        lag: Duration,
        txns: AtomicUsize,
    }

    impl MetadataStore for LaggingStore {
        fn get<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Value>, MetadataError>> {
            Box::pin(async move {
                if self.lagging.load(Ordering::SeqCst) {
                    tokio::time::sleep(self.lag).await;
                }
                self.inner.get(key).await
            })
        }
        fn txn(&self, txn: Txn) -> BoxFuture<'_, Result<TxnOutcome, MetadataError>> {
            Box::pin(async move {
                self.txns.fetch_add(1, Ordering::SeqCst);
                let outcome = self.inner.txn(txn).await;
                if self.lagging.load(Ordering::SeqCst) {
                    tokio::time::sleep(self.lag).await;
                }
                outcome
            })
        }
        fn delete<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<bool, MetadataError>> {
            self.inner.delete(key)
        }
        fn list<'a>(
            &'a self,
            prefix: &'a str,
        ) -> BoxFuture<'a, Result<Vec<(String, Value)>, MetadataError>> {
            self.inner.list(prefix)
        }
        fn watch<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Watch, MetadataError>> {
            self.inner.watch(prefix)
        }
        fn purge_expired(&self) -> BoxFuture<'_, Result<usize, MetadataError>> {
            self.inner.purge_expired()
        }
    }

    /// A broker whose own renewals are committed but not applied here lets
    /// its key lapse (so the load manager moves its topics) instead of
    /// proposing a renewal every heartbeat that keeps the key alive while
    /// it cannot serve.
    #[tokio::test]
    async fn a_lagging_state_machine_lets_the_lease_lapse() {
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(SystemClock);
        let store = Arc::new(LaggingStore {
            inner: RedbStore::open(dir.path().join("meta.redb"), clock.clone()).unwrap(),
            lagging: AtomicBool::new(false),
            lag: Duration::from_secs(3),
            txns: AtomicUsize::new(0),
        });
        let mut config = ClusterConfig::new("127.0.0.1:1".into(), "http://127.0.0.1:1".into());
        config.heartbeat_ms = 50;
        config.lease_ttl_ms = 400;
        config.lease_margin_ms = 100;
        let cluster = Cluster::new(1, store.clone(), clock, config);
        let task = tokio::spawn(super::run(cluster.clone()));
        let key = keys::broker_state(1);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(cluster.lease_fresh());
        assert!(store.get(&key).await.unwrap().is_some());

        store.lagging.store(true, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        // One renewal was proposed (and committed) at the lag's start and
        // did not complete here; none after it, as no read completes here
        // either, so the key expired.
        assert!(!cluster.lease_fresh());
        assert_eq!(store.inner.get(&key).await.unwrap(), None, "the key lapsed");
        let proposed = store.txns.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(
            store.txns.load(Ordering::SeqCst),
            proposed,
            "no renewal proposed while one waits"
        );

        // Caught up: reads complete again and renewals resume.
        store.lagging.store(false, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(2_000)).await;
        assert!(cluster.lease_fresh());
        assert!(store.get(&key).await.unwrap().is_some());
        task.abort();
    }
}
