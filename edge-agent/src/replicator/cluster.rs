//! Which central cluster this edge's checkpoints and archived offsets
//! belong to (FORMAT.md, "Cluster identity").
//!
//! Every stream asks the broker for its cluster's id (`Hello` field
//! `cluster_id`); a broker that knows the field sends it before anything
//! else. The first id the edge gets is stored at `/edge/cluster` in the
//! local metadata store — a put-if-absent, committed durably before the
//! stream goes on, so concurrent streams of several topics record one id
//! and no acknowledgement is applied before it is on disk. From then on a
//! stream whose broker names another id stops before its first `Welcome`
//! ([`EdgeError::OtherCluster`]): nothing is sent, trimmed or
//! checkpointed, and the topic is reported stopped in `/health` until
//! `brokers` point back at the recorded cluster. A broker that sends no id
//! (it predates the field) is taken as before.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use broker_core::metadata::MetadataStore;
use broker_core::metadata::redb::RedbStore;
use tracing::{error, info};
use tributary_proto::cluster::ClusterId;
use tributary_proto::keys;
use tributary_proto::replication::edge::EdgeError;

use super::StreamError;

/// The cluster id this edge is bound to, and what disagreed with it.
#[derive(Debug, Default)]
pub struct ClusterBinding {
    /// Held while the id is read or first stored, so concurrent streams
    /// agree on one.
    first: tokio::sync::Mutex<()>,
    /// The recorded id, once read or stored.
    known: Mutex<Option<ClusterId>>,
    /// Foreign ids already logged as an error (each once per run).
    reported: Mutex<BTreeSet<ClusterId>>,
    /// Streams stopped because their broker belongs to another cluster.
    pub mismatches: AtomicU64,
}

impl ClusterBinding {
    /// The id recorded at `/edge/cluster`, once a stream has read or
    /// stored it in this run.
    pub fn known(&self) -> Option<ClusterId> {
        *self.known.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Checks the id `found` that the broker at `broker` sent against the
    /// recorded one, recording it (durably) when there is none yet.
    ///
    /// # Errors
    /// [`EdgeError::OtherCluster`] for another id (counted in
    /// [`ClusterBinding::mismatches`], logged once per id and run);
    /// [`StreamError::Metadata`] when the local store fails or holds an
    /// unreadable id.
    pub(super) async fn check(
        &self,
        store: &RedbStore,
        found: ClusterId,
        broker: &str,
    ) -> Result<(), StreamError> {
        let expected = match self.known() {
            Some(id) => id,
            None => self.read_or_record(store, found, broker).await?,
        };
        if expected == found {
            return Ok(());
        }
        self.mismatches.fetch_add(1, Ordering::Relaxed);
        let mismatch = EdgeError::OtherCluster {
            expected,
            found,
            broker: broker.to_owned(),
        };
        let first_time = self
            .reported
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(found);
        if first_time {
            error!(cluster_id = %expected, other_cluster_id = %found, %broker, "{mismatch}");
        }
        Err(StreamError::Edge(mismatch))
    }

    async fn read_or_record(
        &self,
        store: &RedbStore,
        found: ClusterId,
        broker: &str,
    ) -> Result<ClusterId, StreamError> {
        let _first = self.first.lock().await;
        if let Some(id) = self.known() {
            return Ok(id);
        }
        let key = keys::edge::cluster();
        let failed = |e: &dyn std::fmt::Display| StreamError::Metadata(format!("{key}: {e}"));
        // Durable (redb `Immediate`) before this returns.
        let outcome = store
            .compare_and_swap(&key, None, serde_json::json!(found.to_string()))
            .await
            .map_err(|e| failed(&e))?;
        let id = if outcome.applied {
            info!(cluster_id = %found, %broker, "recorded the central cluster this edge replicates to");
            found
        } else {
            let current = outcome.current.unwrap_or(serde_json::Value::Null);
            serde::Deserialize::deserialize(&current)
                .map_err(|e: serde_json::Error| failed(&format!("{current}: {e}")))?
        };
        *self.known.lock().unwrap_or_else(|p| p.into_inner()) = Some(id);
        Ok(id)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use broker_core::clock::SystemClock;

    fn id(byte: u8) -> ClusterId {
        ClusterId::from_random([byte; 16])
    }

    #[tokio::test]
    async fn the_first_id_is_recorded_once_and_another_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metadata.redb");
        let store = RedbStore::open(&path, Arc::new(SystemClock)).unwrap();
        let binding = Arc::new(ClusterBinding::default());
        // Streams of several topics at once: one id is stored.
        let checks: Vec<_> = (0..8u8)
            .map(|i| {
                let (binding, store) = (binding.clone(), store.clone());
                tokio::spawn(
                    async move { binding.check(&store, id(1 + i % 2), "b:1").await.is_ok() },
                )
            })
            .collect();
        let mut passed = 0;
        for check in checks {
            passed += usize::from(check.await.unwrap());
        }
        assert_eq!(passed, 4, "the streams of the id that won");
        let recorded = binding.known().unwrap();
        assert_eq!(
            store.get("/edge/cluster").await.unwrap(),
            Some(serde_json::json!(recorded.to_string()))
        );
        assert_eq!(binding.mismatches.load(Ordering::Relaxed), 4);

        // After a restart: read back, the other id still refused.
        drop(store);
        let store = RedbStore::open(&path, Arc::new(SystemClock)).unwrap();
        let binding = ClusterBinding::default();
        let other = if recorded == id(1) { id(2) } else { id(1) };
        let Err(StreamError::Edge(EdgeError::OtherCluster {
            expected, found, ..
        })) = binding.check(&store, other, "b:1").await
        else {
            panic!("another cluster accepted");
        };
        assert_eq!((expected, found), (recorded, other));
        assert!(binding.check(&store, recorded, "b:1").await.is_ok());
        assert_eq!(
            store.get("/edge/cluster").await.unwrap(),
            Some(serde_json::json!(recorded.to_string()))
        );
    }
}
