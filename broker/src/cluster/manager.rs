//! The load manager: on the Raft leader, every heartbeat and whenever
//! `/cluster/*` changes, gives unassigned topics and a dead broker's
//! topics a live owner ([`tributary_proto::cluster::placement::plan`]) and
//! purges expired keys (lapsed leases).
//!
//! A broker that has just become leader takes no dead owner's topics over
//! for [`takeover_grace_ms`] (`takeovers_from_ms`): without a leader no
//! lease could be renewed, so after an election the live brokers' leases
//! may have lapsed too, and they renew with the new leader within that
//! time.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;

use super::{Cluster, ClusterError};

/// Placement changes written to Raft at the same time.
const CONCURRENT_CHANGES: usize = 64;

/// Whether this node leads the Raft group now.
pub type IsLeader = Arc<dyn Fn() -> bool + Send + Sync>;

/// The members of the Raft group that have not answered this leader in
/// its term (empty when this node does not lead, or without Raft).
pub type Unreachable = Arc<dyn Fn() -> std::collections::BTreeSet<u64> + Send + Sync>;

/// How long a new leader waits before any takeover from a dead owner, ms:
/// the lease's fresh window (`lease_ttl_ms − lease_margin_ms`, 3.5 s by
/// default), at least two heartbeats. A live broker renews within a
/// heartbeat or two of the election (one renewal waits for a read through
/// the new leader first); a whole TTL made a leader's own topics wait the
/// election plus 5 s, past the 10 s failover target (9.1–12.6 s measured).
pub fn takeover_grace_ms(config: &super::ClusterConfig) -> u64 {
    config
        .lease_ttl_ms
        .saturating_sub(config.lease_margin_ms)
        .max(config.heartbeat_ms.saturating_mul(2))
}

/// How long a new leader leads before it asks which Raft members have not
/// answered it, ms: half a heartbeat (500 ms by default; at least 50). Its
/// first AppendEntries go out at the election, and a live member answers
/// within a round trip; Raft's own heartbeat is 250 ms, so a member that
/// missed one is still counted as answering by then.
pub fn reachability_wait_ms(config: &super::ClusterConfig) -> u64 {
    (config.heartbeat_ms / 2).max(50)
}

/// Runs until aborted. `unreachable` names the brokers that are gone for
/// sure (Raft members silent to this leader), whose topics need not wait
/// for the grace; it is asked only after [`reachability_wait_ms`] of
/// leading, so a member has had time to answer.
pub async fn run(cluster: Arc<Cluster>, is_leader: IsLeader, unreachable: Unreachable) {
    let heartbeat = Duration::from_millis(cluster.config.heartbeat_ms.max(10));
    let mut changes = cluster.subscribe();
    // When this node became leader (None: it is not leading).
    let mut leading_since_ms: Option<u64> = None;
    // When the next round must run at the latest, if before a heartbeat.
    let mut wake_at: Option<u64> = None;
    loop {
        if !is_leader() {
            leading_since_ms = None;
        } else {
            if let Err(e) = cluster.store.purge_expired().await {
                tracing::debug!(error = %e, "purging expired cluster keys failed");
            }
            let now = cluster.clock.now_ms();
            let grace_ms = takeover_grace_ms(&cluster.config);
            let since = *leading_since_ms.get_or_insert_with(|| {
                tracing::info!(
                    grace_ms,
                    "leading the load manager; no dead owner's topics are taken over until brokers had time to renew with this leader"
                );
                now
            });
            let mut snapshot = cluster.read().snapshot(now);
            snapshot.takeovers_from_ms = since.saturating_add(grace_ms);
            let ask_at = since.saturating_add(reachability_wait_ms(&cluster.config));
            if now >= ask_at {
                snapshot.unreachable = unreachable();
            } else {
                // Run again the moment members have had time to answer,
                // not a whole heartbeat later: an edge retrying its dead
                // owner's topic meanwhile gets "no owner" until then.
                wake_at = Some(ask_at);
            }
            let plan = tributary_proto::cluster::placement::plan(&snapshot, now);
            // Each change is its own conditional Raft write; issued
            // together, Raft appends them in shared batches (one log write
            // for many), so a fleet's first contact does not wait for
            // hundreds of round trips one after the other.
            let failed = futures::stream::iter(plan)
                .map(|change| {
                    let cluster = &cluster;
                    async move { (cluster.apply_change(&change).await, change) }
                })
                .buffer_unordered(CONCURRENT_CHANGES)
                .filter_map(|(result, change)| async move {
                    match result {
                        Ok(()) | Err(ClusterError::Contended(_)) => None,
                        Err(e) => Some((change, e)),
                    }
                })
                .collect::<Vec<_>>()
                .await;
            if let Some((change, e)) = failed.first() {
                tracing::warn!(topic = %change.topic, error = %e, failed = failed.len(), "assigning topics failed; retrying");
            }
        }
        // Run again on the next change (debounced a little) or heartbeat,
        // or when the members' answers may be asked.
        let wait = wake_at
            .take()
            .map_or(heartbeat, |at| {
                Duration::from_millis(at.saturating_sub(cluster.clock.now_ms()))
            })
            .min(heartbeat);
        let _ = tokio::time::timeout(wait, changes.changed()).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
