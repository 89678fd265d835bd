//! This broker's lease: `/cluster/brokers/{id}/state` put with a TTL every
//! heartbeat, carrying its addresses and load. A renewal counts from the
//! moment it was proposed ([`super::Cluster::lease_fresh`]).

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
    loop {
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
        if !cluster.lease_fresh() {
            cluster.bump();
        }
        let next = started + heartbeat;
        tokio::time::sleep_until(next.into()).await;
    }
}
