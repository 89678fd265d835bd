//! The load manager: on the Raft leader, every heartbeat and whenever
//! `/cluster/*` changes, gives unassigned topics and a dead broker's
//! topics a live owner ([`tributary_proto::cluster::placement::plan`]) and
//! purges expired keys (lapsed leases).

use std::sync::Arc;
use std::time::Duration;

use super::{Cluster, ClusterError};

/// Whether this node leads the Raft group now.
pub type IsLeader = Arc<dyn Fn() -> bool + Send + Sync>;

/// Runs until aborted.
pub async fn run(cluster: Arc<Cluster>, is_leader: IsLeader) {
    let heartbeat = Duration::from_millis(cluster.config.heartbeat_ms.max(10));
    let mut changes = cluster.subscribe();
    loop {
        if is_leader() {
            if let Err(e) = cluster.store.purge_expired().await {
                tracing::debug!(error = %e, "purging expired cluster keys failed");
            }
            let now = cluster.clock.now_ms();
            let snapshot = cluster.read().snapshot(now);
            for change in tributary_proto::cluster::placement::plan(&snapshot, now) {
                match cluster.apply_change(&change).await {
                    Ok(()) | Err(ClusterError::Contended(_)) => {}
                    Err(e) => {
                        tracing::warn!(topic = %change.topic, error = %e, "assigning a topic failed; retrying");
                        break;
                    }
                }
            }
        }
        // Run again on the next change (debounced a little) or heartbeat.
        let _ = tokio::time::timeout(heartbeat, changes.changed()).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
