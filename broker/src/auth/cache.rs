//! [`AuthCache`]: every broker's copy of `/auth/` (principals, custom
//! roles, bindings, revoked edges) as one immutable [`Snapshot`], loaded at
//! start and rebuilt on every change the metadata store's watch reports
//! (re-listed after a lagged watch). Raft applies a revocation on every
//! member, so it reaches every broker's cache as fast as Raft replicates
//! (well under a second on a healthy cluster). A grant needs no wait: a
//! request refused by the cached snapshot (an unknown token or certificate
//! principal, a missing permission) is decided again on a linearizable
//! re-listing ([`AuthCache::refresh_after`]), so a token or binding
//! acknowledged by any broker works at every broker at once. Each rebuild is announced
//! on [`AuthCache::subscribe`] (the ingest endpoint closes the connections
//! of edges revoked meanwhile).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use broker_core::metadata::{MetadataError, MetadataStore, WatchError};
use tributary_api::auth::Binding;
use tributary_api::enroll::EdgeRevocation;
use tributary_proto::keys::auth;

use super::model::{Permission, Snapshot, StoredPrincipal};

/// The RBAC cache of one broker. Cheap to read ([`AuthCache::snapshot`]
/// clones an `Arc`).
pub struct AuthCache {
    store: Arc<dyn MetadataStore>,
    snapshot: RwLock<Arc<Snapshot>>,
    generation: AtomicU64,
    reload: tokio::sync::Mutex<()>,
    changed: tokio::sync::watch::Sender<u64>,
    /// Reloads begun (numbered from 1, under `reload`).
    begun: AtomicU64,
    /// The number of the reload the current snapshot came from.
    current: AtomicU64,
}

impl std::fmt::Debug for AuthCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthCache")
            .field("generation", &self.generation())
            .finish_non_exhaustive()
    }
}

impl AuthCache {
    /// An empty cache over `store` (generation 0: not loaded yet).
    pub fn new(store: Arc<dyn MetadataStore>) -> AuthCache {
        AuthCache {
            store,
            snapshot: RwLock::new(Arc::new(Snapshot::default())),
            generation: AtomicU64::new(0),
            reload: tokio::sync::Mutex::new(()),
            changed: tokio::sync::watch::channel(0).0,
            begun: AtomicU64::new(0),
            current: AtomicU64::new(0),
        }
    }

    /// A receiver of the generation after every rebuild of the snapshot.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// The current snapshot.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        match self.snapshot.read() {
            Ok(guard) => guard.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// How many times the snapshot was rebuilt (0 before the first load).
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Loads the first snapshot if none was loaded yet.
    ///
    /// # Errors
    /// The metadata store's list failed.
    pub async fn ensure_loaded(&self) -> Result<(), MetadataError> {
        if self.generation() == 0 {
            self.reload().await?;
        }
        Ok(())
    }

    /// Re-lists `/auth/` and swaps in the new snapshot. Entries that do not
    /// decode are skipped with a warning (fail closed: they grant nothing).
    ///
    /// # Errors
    /// The metadata store's list failed; the old snapshot stays.
    pub async fn reload(&self) -> Result<(), MetadataError> {
        let _one_at_a_time = self.reload.lock().await;
        self.load_locked().await
    }

    /// A ticket for [`AuthCache::refresh_after`]: the reloads begun so far.
    pub fn ticket(&self) -> u64 {
        self.begun.load(Ordering::Acquire)
    }

    /// Makes the snapshot one whose listing began after `ticket` was taken,
    /// reloading unless such a reload already finished (concurrent callers
    /// share one). The listing is a linearizable read, so whatever was
    /// committed before the ticket is in the result: a token or binding
    /// created through another broker and acknowledged to the client before
    /// its request reached this one.
    ///
    /// # Errors
    /// The metadata store's list failed; the old snapshot stays.
    pub async fn refresh_after(&self, ticket: u64) -> Result<(), MetadataError> {
        let _one_at_a_time = self.reload.lock().await;
        if self.current.load(Ordering::Acquire) > ticket {
            return Ok(());
        }
        self.load_locked().await
    }

    async fn load_locked(&self) -> Result<(), MetadataError> {
        let number = self.begun.fetch_add(1, Ordering::AcqRel) + 1;
        let entries = self.store.list(&auth::prefix()).await?;
        let mut snapshot = Snapshot::default();
        for (key, value) in entries {
            if let Some(name) = key.strip_prefix(&auth::principals_prefix()) {
                match serde_json::from_value::<StoredPrincipal>(value) {
                    Ok(p) if p.name == name => {
                        snapshot.principals.insert(name.to_owned(), p);
                    }
                    _ => tracing::warn!(%key, "auth: skipping an undecodable principal"),
                }
            } else if let Some(name) = key.strip_prefix(&auth::roles_prefix()) {
                match serde_json::from_value::<tributary_api::auth::RoleDefinition>(value) {
                    Ok(role) => {
                        let permissions = role
                            .permissions
                            .iter()
                            .filter_map(|p| Permission::parse(p))
                            .collect();
                        snapshot.roles.insert(name.to_owned(), permissions);
                    }
                    Err(_) => tracing::warn!(%key, "auth: skipping an undecodable role"),
                }
            } else if let Some(edge) = key.strip_prefix(&auth::revoked_edges_prefix()) {
                match serde_json::from_value::<EdgeRevocation>(value) {
                    Ok(revocation) => {
                        snapshot
                            .revoked_edges
                            .insert(edge.to_owned(), revocation.revoked_at_ms);
                    }
                    Err(_) => {
                        // Fail closed: every certificate of the edge.
                        tracing::warn!(%key, "auth: an undecodable revocation revokes the edge for good");
                        snapshot.revoked_edges.insert(edge.to_owned(), u64::MAX);
                    }
                }
            } else if let Some(id) = key.strip_prefix(&auth::bindings_prefix()) {
                match serde_json::from_value::<Binding>(value) {
                    Ok(binding) => {
                        snapshot.bindings.insert(id.to_owned(), binding);
                    }
                    Err(_) => tracing::warn!(%key, "auth: skipping an undecodable binding"),
                }
            }
        }
        match self.snapshot.write() {
            Ok(mut guard) => *guard = Arc::new(snapshot),
            Err(poisoned) => *poisoned.into_inner() = Arc::new(snapshot),
        }
        self.current.store(number, Ordering::Release);
        let generation = self.generation.fetch_add(1, Ordering::AcqRel) + 1;
        self.changed.send_replace(generation);
        Ok(())
    }

    /// Watches `/auth/` and reloads on every change (and after a lagged
    /// watch), until the store closes. Watches first, then loads, so no
    /// change between the two is missed.
    pub fn spawn_watch(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let cache = Arc::clone(self);
        tokio::spawn(async move {
            let mut watch = loop {
                match cache.store.watch(&auth::prefix()).await {
                    Ok(watch) => break watch,
                    Err(error) => {
                        tracing::warn!(%error, "auth: cannot watch /auth/; retrying");
                        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                    }
                }
            };
            if let Err(error) = cache.reload().await {
                tracing::warn!(%error, "auth: first load of /auth/ failed");
            }
            loop {
                match watch.recv().await {
                    Ok(_) | Err(WatchError::Lagged { .. }) => {
                        // Drain what is queued, then rebuild once.
                        while let Ok(Some(_)) = watch.try_recv() {}
                        if let Err(error) = cache.reload().await {
                            tracing::warn!(%error, "auth: reloading /auth/ failed");
                        }
                    }
                    Err(WatchError::Closed) => return,
                }
            }
        })
    }
}
