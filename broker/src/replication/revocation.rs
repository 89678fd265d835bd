//! Edge revocation at the ingest endpoint ([`EdgeGate`]).
//!
//! Right after the mutual-TLS handshake, a connection whose edge is
//! revoked (its certificate's validity starts at or before the edge's
//! revocation, see [`crate::enroll::model::revokes`]) is closed with the
//! application error code [`REVOKED_CLOSE_CODE`] and a reason naming the
//! edge and what to do; the edge logs that reason and shows it as its
//! `/health` `last_error`. Every admitted connection stays registered
//! until it ends, and each rebuild of the auth cache (the broker's watch
//! of `/auth/`, so every broker within a Raft round trip of the
//! revocation) closes the registered connections it now revokes.
//!
//! No gap between the two: a connection is registered before its check,
//! and the cache swaps its snapshot before announcing the rebuild, so a
//! revocation is seen either by the check or by the rebuild's sweep.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use broker_core::tls::{certificate_not_before_s, peer_certificate};

use crate::auth::cache::AuthCache;

/// The QUIC application error code a revoked edge's connection is closed
/// with (1 is "no edge identity").
pub const REVOKED_CLOSE_CODE: u32 = 2;

/// One admitted edge connection.
struct Live {
    identity: String,
    not_before_s: Option<i64>,
    conn: quinn::Connection,
}

/// The revocation check of edge connections, and the registry of those
/// admitted.
pub struct EdgeGate {
    cache: Arc<AuthCache>,
    live: Mutex<HashMap<usize, Live>>,
}

impl std::fmt::Debug for EdgeGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EdgeGate")
            .field("connections", &self.live().len())
            .finish()
    }
}

/// An admitted connection's registration; dropping it unregisters the
/// connection.
#[must_use = "the connection is unregistered when this is dropped"]
pub struct Admission {
    gate: Arc<EdgeGate>,
    id: usize,
}

impl Drop for Admission {
    fn drop(&mut self) {
        self.gate.live().remove(&self.id);
    }
}

/// The close reason sent to a revoked edge.
pub fn revoked_reason(edge: &str) -> String {
    format!(
        "edge {edge} is revoked: this certificate was issued before `tribctl edges revoke {edge}`; \
         enroll again with a new token (`tribctl edges token {edge}`, then `edge-agent enroll`)"
    )
}

impl EdgeGate {
    /// A gate over `cache` (the broker's `/auth/` snapshot).
    pub fn new(cache: Arc<AuthCache>) -> Arc<EdgeGate> {
        Arc::new(EdgeGate {
            cache,
            live: Mutex::new(HashMap::new()),
        })
    }

    fn live(&self) -> std::sync::MutexGuard<'_, HashMap<usize, Live>> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Admits `conn` of edge `identity` unless the edge is revoked for its
    /// certificate; a revoked connection is closed with the reason, which
    /// is also returned.
    ///
    /// # Errors
    /// The close reason of a revoked edge.
    pub fn admit(
        self: &Arc<Self>,
        conn: &quinn::Connection,
        identity: &str,
    ) -> Result<Admission, String> {
        let not_before_s = peer_certificate(conn)
            .as_ref()
            .and_then(certificate_not_before_s);
        let id = conn.stable_id();
        self.live().insert(
            id,
            Live {
                identity: identity.to_owned(),
                not_before_s,
                conn: conn.clone(),
            },
        );
        let admission = Admission {
            gate: self.clone(),
            id,
        };
        if self
            .cache
            .snapshot()
            .edge_revoked(identity, not_before_s)
            .is_some()
        {
            let reason = revoked_reason(identity);
            conn.close(REVOKED_CLOSE_CODE.into(), reason.as_bytes());
            return Err(reason);
        }
        Ok(admission)
    }

    /// Closes every admitted connection the current snapshot revokes;
    /// returns how many.
    pub fn close_revoked(&self) -> usize {
        let snapshot = self.cache.snapshot();
        let live = self.live();
        let mut closed = 0;
        for entry in live.values() {
            if snapshot
                .edge_revoked(&entry.identity, entry.not_before_s)
                .is_some()
            {
                tracing::warn!(edge = %entry.identity, peer = %entry.conn.remote_address(), "closing the connection of a revoked edge");
                entry.conn.close(
                    REVOKED_CLOSE_CODE.into(),
                    revoked_reason(&entry.identity).as_bytes(),
                );
                closed += 1;
            }
        }
        closed
    }

    /// Sweeps the admitted connections after every rebuild of the auth
    /// cache ([`EdgeGate::close_revoked`]), until the cache is dropped.
    pub fn spawn_watch(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let gate = self.clone();
        let mut changes = self.cache.subscribe();
        tokio::spawn(async move {
            while changes.changed().await.is_ok() {
                gate.close_revoked();
            }
        })
    }
}
