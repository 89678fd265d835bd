//! The cluster's identity: one random [`ClusterId`] at `/cluster/id` in
//! Raft, written once and never changed, so an edge can tell this cluster's
//! acknowledgements from another's (FORMAT.md, "Cluster identity").
//!
//! There is no separate "create at initialisation" step: every broker, at
//! each start, runs [`ensure`] — read the key; when absent, put a fresh id
//! *only if the key is still absent* (one Raft transaction with an
//! absence precondition); then use whatever value is committed. On a new
//! cluster the first broker to get a transaction through creates it; an
//! upgraded cluster that predates the key gets one the same way; brokers
//! starting together agree on the one that won, and a restart reads it
//! back. A value that is there but does not parse is an error, never
//! overwritten: the id edges recorded must not change behind them.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use broker_core::metadata::{MetadataError, MetadataStore};
use serde::Deserialize as _;
use tracing::{info, warn};
use tributary_proto::cluster::{CLUSTER_ID_BYTES, ClusterId};
use tributary_proto::keys::cluster as keys;
use tributary_proto::replication::frame::{ErrorCode, Frame};
use tributary_proto::replication::ingest::IngestStream;

/// Why the cluster id could not be read or created.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IdentityError {
    /// The metadata store failed (no leader yet, Raft unavailable).
    #[error("reading or creating the cluster id: {0}")]
    Metadata(#[from] MetadataError),
    /// `/cluster/id` holds something that is not a cluster id.
    #[error("the cluster id at /cluster/id is unreadable ({value}): {reason}")]
    Invalid {
        /// The stored value (JSON).
        value: String,
        /// Why it does not parse.
        reason: String,
    },
    /// The system random number generator failed.
    #[error("no randomness for a new cluster id")]
    Random,
}

/// A fresh random (version 4) cluster id from the system RNG.
///
/// # Errors
/// [`IdentityError::Random`].
pub fn random_cluster_id() -> Result<ClusterId, IdentityError> {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; CLUSTER_ID_BYTES];
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| IdentityError::Random)?;
    Ok(ClusterId::from_random(bytes))
}

fn parse(value: &serde_json::Value) -> Result<ClusterId, IdentityError> {
    ClusterId::deserialize(value).map_err(|e| IdentityError::Invalid {
        value: value.to_string(),
        reason: e.to_string(),
    })
}

/// The committed cluster id, created with `fresh` (put only if the key is
/// still absent) when there is none; concurrent callers all return the one
/// value that was committed.
///
/// # Errors
/// [`IdentityError`]; nothing is written when the stored value is invalid.
pub async fn ensure(
    store: &dyn MetadataStore,
    fresh: impl FnOnce() -> Result<ClusterId, IdentityError>,
) -> Result<ClusterId, IdentityError> {
    let key = keys::id();
    if let Some(value) = store.get(&key).await? {
        return parse(&value);
    }
    let new = fresh()?;
    let outcome = store
        .compare_and_swap(&key, None, serde_json::json!(new.to_string()))
        .await?;
    match (outcome.applied, outcome.current) {
        (true, _) => {
            info!(cluster_id = %new, "created the cluster id");
            Ok(new)
        }
        (false, Some(current)) => parse(&current),
        (false, None) => Err(IdentityError::Invalid {
            value: "null".into(),
            reason: "the put-if-absent failed but the key is absent".into(),
        }),
    }
}

/// This broker's cached view of the cluster id: read (and created when
/// absent) once, then kept, since it never changes.
#[derive(Clone)]
pub struct ClusterIdentity {
    store: Arc<dyn MetadataStore>,
    id: Arc<OnceLock<ClusterId>>,
}

impl std::fmt::Debug for ClusterIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterIdentity")
            .field("id", &self.id.get())
            .finish_non_exhaustive()
    }
}

/// First wait between attempts of [`ClusterIdentity::spawn_load`].
const RETRY_MIN: Duration = Duration::from_millis(200);
/// Longest wait between them.
const RETRY_MAX: Duration = Duration::from_secs(5);

impl ClusterIdentity {
    /// The identity of the cluster whose metadata is `store`; nothing is
    /// read until asked.
    pub fn new(store: Arc<dyn MetadataStore>) -> ClusterIdentity {
        ClusterIdentity {
            store,
            id: Arc::new(OnceLock::new()),
        }
    }

    /// The id, if this broker has read it already.
    pub fn get(&self) -> Option<ClusterId> {
        self.id.get().copied()
    }

    /// The id: the cached one, else read (created when absent, [`ensure`])
    /// and cached.
    ///
    /// # Errors
    /// [`IdentityError`] while metadata is unavailable.
    pub async fn load(&self) -> Result<ClusterId, IdentityError> {
        if let Some(id) = self.get() {
            return Ok(id);
        }
        let id = ensure(self.store.as_ref(), random_cluster_id).await?;
        Ok(*self.id.get_or_init(|| id))
    }

    /// What to send first on an edge stream whose Hello was just accepted:
    /// the `ClusterId` frame when the Hello asked for it (`Ok(None)`
    /// otherwise), or, while the id cannot be read within `wait`, the
    /// `Unavailable` refusal to close the stream with (the edge retries;
    /// sending nothing would pass for an older broker).
    ///
    /// # Errors
    /// The refusal frame.
    pub async fn frame_for(
        &self,
        ingest: &mut IngestStream,
        wait: Duration,
    ) -> Result<Option<Frame>, Frame> {
        if !ingest.wants_cluster_id() {
            return Ok(None);
        }
        let unavailable = |message: String| Frame::Error {
            code: ErrorCode::Unavailable,
            message,
        };
        match tokio::time::timeout(wait, self.load()).await {
            Ok(Ok(id)) => Ok(ingest.cluster_id(id)),
            Ok(Err(e)) => Err(unavailable(e.to_string())),
            Err(_) => Err(unavailable(format!(
                "the cluster id is not known yet (no answer within {wait:?})"
            ))),
        }
    }

    /// Loads the id in the background, retrying (200 ms doubling to 5 s)
    /// until it succeeds; logs it once known. Started with the broker, so
    /// a cluster has its id as soon as Raft has a leader.
    pub fn spawn_load(&self) -> tokio::task::JoinHandle<()> {
        use backon::{ExponentialBuilder, Retryable as _};
        let identity = self.clone();
        tokio::spawn(async move {
            let backoff = ExponentialBuilder::default()
                .with_min_delay(RETRY_MIN)
                .with_max_delay(RETRY_MAX)
                .without_max_times();
            let mut warned = false;
            let loaded = (|| identity.load())
                .retry(backoff)
                .notify(|e: &IdentityError, wait| {
                    if warned {
                        return;
                    }
                    if matches!(e, IdentityError::Invalid { .. }) {
                        tracing::error!(error = %e, "edges asking for the cluster id are refused until it is repaired");
                        warned = true;
                    } else if wait >= RETRY_MAX {
                        warn!(error = %e, "the cluster id is not known yet; retrying");
                        warned = true;
                    }
                })
                .await;
            if let Ok(id) = loaded {
                info!(cluster_id = %id, "cluster id");
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use broker_core::clock::SystemClock;
    use broker_core::metadata::redb::RedbStore;

    fn store(dir: &std::path::Path) -> Arc<dyn MetadataStore> {
        Arc::new(RedbStore::open(dir.join("m.redb"), Arc::new(SystemClock)).unwrap())
    }

    #[tokio::test]
    async fn concurrent_brokers_agree_on_one_id_and_it_never_changes() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(dir.path());
        // An upgraded cluster: metadata, no id yet.
        store
            .put("/cluster/leader", serde_json::json!(1))
            .await
            .unwrap();
        let tasks: Vec<_> = (0..16)
            .map(|_| {
                let identity = ClusterIdentity::new(store.clone());
                tokio::spawn(async move { identity.load().await.unwrap() })
            })
            .collect();
        let mut ids = std::collections::BTreeSet::new();
        for task in tasks {
            ids.insert(task.await.unwrap());
        }
        assert_eq!(ids.len(), 1, "{ids:?}");
        let id = *ids.first().unwrap();
        assert_eq!(
            store.get("/cluster/id").await.unwrap(),
            Some(serde_json::json!(id.to_string()))
        );
        // Later starts read it back, whatever id they would have made.
        let again = ensure(store.as_ref(), || Ok(ClusterId::from_random([9; 16])))
            .await
            .unwrap();
        assert_eq!(again, id);
    }

    #[tokio::test]
    async fn an_unreadable_stored_id_is_an_error_and_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(dir.path());
        store
            .put("/cluster/id", serde_json::json!("not-a-uuid"))
            .await
            .unwrap();
        let err = ClusterIdentity::new(store.clone())
            .load()
            .await
            .unwrap_err();
        assert!(matches!(err, IdentityError::Invalid { .. }), "{err}");
        assert_eq!(
            store.get("/cluster/id").await.unwrap(),
            Some(serde_json::json!("not-a-uuid"))
        );
    }
}
