//! MQTT sessions: the QoS 2 packet ids a client has in flight, per client
//! id, and (for persistent sessions) their copy in the agent's metadata
//! store at `/edge/mqtt/sessions/{hex client id}` so that a resend after
//! an agent crash is recognised.
//!
//! Exactly-once across a crash, per QoS 2 PUBLISH of a persistent
//! session: (1) the entry `pending {topic, from}` is committed (the one
//! store commit per message), `from` being the topic's high-water mark
//! before the append; (2) the record is appended with the headers
//! `mqtt.client_id` and `mqtt.packet_id` and awaited durable; (3) the entry
//! becomes `received` in memory and PUBREC is sent. A resend (DUP) of a
//! `received` id is answered PUBREC without storing. The `pending`
//! entries a crash left are settled when the listener starts
//! ([`settle_pending`], before anything can append to or delete from a
//! WAL): the topic's WAL is scanned from `from` for a record with the
//! client's id and packet id; found, the entry becomes `received`,
//! absent, it is removed and the resend is stored as a new message.
//! PUBREL removes the entry and saves the session before the PUBCOMP goes
//! out, so an id the session knows is a message not yet released; the
//! `received` state is saved with the session's next save (the next
//! message, a PUBREL, the connection's end).
//!
//! Expiry (MQTT 5.0 §3.1.2.11.2): when a persistent session's connection
//! ends, `expires_at_ms` is set to that instant plus its session expiry
//! interval (never for 3.1.1 and 0xFFFFFFFF); [`SessionStore::open`]
//! discards a session at or past it, and [`SessionStore::sweep`] removes
//! such sessions from the store and from memory.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use broker_core::metadata::{MetadataError, MetadataStore};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tributary_proto::keys::{TopicName, edge};

use crate::manager::TopicManager;

/// Header naming the client id of a QoS 2 record of a persistent session.
pub const HEADER_CLIENT_ID: &str = "mqtt.client_id";
/// Header holding the packet id of such a record (decimal).
pub const HEADER_PACKET_ID: &str = "mqtt.packet_id";

/// State of one QoS 2 packet id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Qos2State {
    /// Being stored (or stored, and the agent died before PUBREC).
    Pending {
        /// The Tributary topic.
        topic: String,
        /// High-water mark of the topic before the append.
        from: u64,
    },
    /// Stored and PUBREC sent; waiting for PUBREL.
    Received,
}

/// The persisted part of a session.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionData {
    /// The client id.
    pub client_id: String,
    /// QoS 2 packet ids in flight.
    pub qos2: BTreeMap<u16, Qos2State>,
    /// When the session expires, ms since the Unix epoch: set when its
    /// connection ends (the end plus the session expiry interval, MQTT 5.0
    /// §3.1.2.11.2); absent while a connection holds it and for sessions
    /// that never expire (3.1.1 `clean_session = false`, 5.0 interval
    /// 0xFFFFFFFF).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at_ms: Option<u64>,
    /// The session expiry interval, s, when finite (from the CONNECT that
    /// holds or last held the session, or a later 5.0 DISCONNECT); absent:
    /// never expires. Lets the agent's start give a session whose
    /// connection a crash ended its deadline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_expiry_s: Option<u32>,
}

/// The finite session expiry interval of `expiry_s` (`u32::MAX`: never,
/// `None`).
pub fn finite_expiry(expiry_s: u32) -> Option<u32> {
    (expiry_s != u32::MAX).then_some(expiry_s)
}

impl SessionData {
    /// Sets the deadline of a session whose connection ended at `now_ms`:
    /// `now_ms` + its interval (none when it never expires).
    pub fn start_expiry(&mut self, now_ms: u64) {
        self.expires_at_ms = self
            .session_expiry_s
            .map(|s| now_ms.saturating_add(u64::from(s) * 1000));
    }
}

/// One client's session.
#[derive(Debug, Default)]
pub struct Session {
    /// Persisted in the metadata store (`clean_session = false` /
    /// session expiry > 0).
    pub persistent: bool,
    /// QoS 2 state.
    pub data: SessionData,
    /// QoS 1 packet ids acknowledged on this session since the agent
    /// started: a DUP resend of one is a counted redelivery.
    pub qos1_acked: std::collections::HashSet<u16>,
    /// A copy of it may be in the metadata store (it was read from there,
    /// or persistent at some point), to delete when it ends.
    pub stored: bool,
}

/// Error of the session store.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The metadata store failed.
    #[error("mqtt session {client_id:?}: metadata store: {source}")]
    Metadata {
        /// The client.
        client_id: String,
        /// The failure.
        #[source]
        source: MetadataError,
    },
    /// The stored sessions could not be listed (at start, to settle them).
    #[error("mqtt sessions: listing the stored sessions: {0}")]
    List(#[source] MetadataError),
    /// A stored session could not be decoded.
    #[error("mqtt session {client_id:?}: stored session unreadable: {reason}")]
    Decode {
        /// The client.
        client_id: String,
        /// Why.
        reason: String,
    },
}

/// Live sessions of the agent, by client id.
#[derive(Debug, Default)]
pub struct SessionStore {
    live: Mutex<HashMap<String, Arc<SessionSlot>>>,
    /// The number of entries in `live`, for `/metrics`.
    gauge: Arc<AtomicU64>,
}

/// The slot of one client id: its session, locked by the connection that
/// owns it for as long as that connection runs, and the generation of its
/// latest claim.
///
/// Take-over (MQTT 3.1.1 §3.1.4 and 5.0 §3.1.4: a CONNECT with the client
/// id of a connected client ends the older connection): the new
/// connection [`SessionSlot::claim`]s the slot, which the owner sees at
/// its next [`Claim::taken_over`] even if it was busy with a packet at
/// that instant, and then [`SessionSlot::acquire`]s the session, which
/// the owner hands back only after it finished that packet and saved. So
/// two connections never hold one session, and the older one cannot write
/// its state over the newer one's.
#[derive(Debug)]
pub struct SessionSlot {
    session: Arc<tokio::sync::Mutex<Option<Session>>>,
    generation: watch::Sender<u64>,
}

impl Default for SessionSlot {
    fn default() -> SessionSlot {
        SessionSlot {
            session: Arc::default(),
            generation: watch::channel(0).0,
        }
    }
}

/// The session of a slot, held by one connection; dropping it hands the
/// session (as left in it) to the next connection.
pub type HeldSession = tokio::sync::OwnedMutexGuard<Option<Session>>;

/// One connection's claim on a [`SessionSlot`].
#[derive(Debug)]
pub struct Claim {
    generation: u64,
    latest: watch::Receiver<u64>,
}

impl SessionSlot {
    /// Claims the slot for a new connection: any earlier claim is taken
    /// over from now on.
    pub fn claim(&self) -> Claim {
        let mut generation = 0;
        self.generation.send_modify(|g| {
            *g += 1;
            generation = *g;
        });
        Claim {
            generation,
            latest: self.generation.subscribe(),
        }
    }

    /// The session, once the connection holding it let it go; `None` if
    /// that takes longer than `wait`.
    pub async fn acquire(&self, wait: Duration) -> Option<HeldSession> {
        tokio::time::timeout(wait, self.session.clone().lock_owned())
            .await
            .ok()
    }
}

impl Claim {
    /// Whether no later connection claimed the slot.
    pub fn is_latest(&self) -> bool {
        *self.latest.borrow() == self.generation
    }

    /// Resolves once a later connection claimed the slot (at once if one
    /// already has).
    pub async fn taken_over(&mut self) {
        let mine = self.generation;
        if self.latest.wait_for(|&g| g != mine).await.is_err() {
            // The slot's sender lives as long as the slot, which this
            // claim's connection keeps: not reached.
            std::future::pending::<()>().await;
        }
    }
}

/// The key of `client_id`'s session.
pub fn session_key(client_id: &str) -> String {
    edge::mqtt_session(client_id)
}

impl SessionStore {
    /// An empty store that keeps `gauge` at its number of slots.
    pub fn with_gauge(gauge: Arc<AtomicU64>) -> SessionStore {
        SessionStore {
            live: Mutex::default(),
            gauge,
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Arc<SessionSlot>>> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The slot of `client_id` (created empty).
    pub fn slot(&self, client_id: &str) -> Arc<SessionSlot> {
        let mut live = self.lock();
        let slot = live.entry(client_id.to_owned()).or_default().clone();
        self.gauge.store(live.len() as u64, Ordering::Relaxed);
        slot
    }

    /// Forgets `client_id`'s slot after its connection (the holder of
    /// `claim`) ended without a session to keep (not persistent, or its
    /// CONNECT failed), unless a later connection claimed it or holds it.
    /// Without this every client id ever seen, and every anonymous
    /// connection, kept a slot.
    pub fn release(&self, client_id: &str, slot: &Arc<SessionSlot>, claim: &Claim) {
        let mut live = self.lock();
        let ours = live.get(client_id).is_some_and(|s| Arc::ptr_eq(s, slot));
        // The map's reference and the caller's: nobody else has it, and
        // taking one (`slot`) needs the lock held here.
        if ours && claim.is_latest() && Arc::strong_count(slot) == 2 {
            live.remove(client_id);
            self.gauge.store(live.len() as u64, Ordering::Relaxed);
        }
    }

    /// Client ids with a slot in memory.
    pub fn live(&self) -> usize {
        self.lock().len()
    }

    /// Loads (or starts) the session of `client_id` for a new connection
    /// at `now_ms`: with `clean_start` any stored session is deleted; one
    /// whose expiry passed is discarded (MQTT 5.0 §3.1.2.11.2); the new
    /// connection's session expiry interval `expiry_s` (0: the session
    /// ends with the connection) says whether it is kept. Returns the
    /// session and whether an earlier one was resumed.
    ///
    /// # Errors
    /// [`SessionError`].
    pub async fn open(
        manager: &TopicManager,
        current: Option<Session>,
        client_id: &str,
        clean_start: bool,
        expiry_s: u32,
        now_ms: u64,
    ) -> Result<(Session, bool), SessionError> {
        let persistent = expiry_s > 0;
        let key = session_key(client_id);
        let meta = |source| SessionError::Metadata {
            client_id: client_id.to_owned(),
            source,
        };
        let fresh = || {
            let mut session = Session {
                persistent,
                stored: persistent,
                ..Session::default()
            };
            session.data.client_id = client_id.to_owned();
            session.data.session_expiry_s = finite_expiry(expiry_s);
            session
        };
        if clean_start {
            manager.store().delete(&key).await.map_err(meta)?;
            return Ok((fresh(), false));
        }
        let earlier = match current {
            Some(live) => Some(live),
            None => match manager.store().get(&key).await.map_err(meta)? {
                Some(value) => Some(Session {
                    data: serde_json::from_value::<SessionData>(value).map_err(|e| {
                        SessionError::Decode {
                            client_id: client_id.to_owned(),
                            reason: e.to_string(),
                        }
                    })?,
                    stored: true,
                    ..Session::default()
                }),
                None => None,
            },
        };
        let Some(mut session) = earlier else {
            return Ok((fresh(), false));
        };
        if session.data.expires_at_ms.is_some_and(|t| t <= now_ms) {
            // Its QoS 2 entries go with it: a client told "no session"
            // starts its packet ids afresh, and a stale `received` entry
            // would take its next message for a resend and drop it.
            if session.stored {
                manager.store().delete(&key).await.map_err(meta)?;
            }
            return Ok((fresh(), false));
        }
        session.persistent = persistent;
        session.stored |= persistent;
        session.data.session_expiry_s = finite_expiry(expiry_s);
        if session.data.expires_at_ms.take().is_some() && persistent {
            // Held by a connection: no deadline until it ends; saved, so
            // that an agent crash meanwhile does not leave the old one.
            session.save(manager).await?;
        }
        Ok((session, true))
    }

    /// Removes every stored session whose expiry passed by `now_ms` and
    /// that no connection holds, from the metadata store and from memory
    /// (MQTT 5.0 §3.1.2.11.2). Returns how many.
    ///
    /// # Errors
    /// [`SessionError::List`], [`SessionError::Metadata`].
    pub async fn sweep(&self, manager: &TopicManager, now_ms: u64) -> Result<usize, SessionError> {
        let expired = |value: Option<serde_json::Value>| {
            value
                .and_then(|v| serde_json::from_value::<SessionData>(v).ok())
                .filter(|d| d.expires_at_ms.is_some_and(|t| t <= now_ms))
        };
        let stored = manager
            .store()
            .list(edge::MQTT_SESSIONS_PREFIX)
            .await
            .map_err(SessionError::List)?;
        let mut removed = 0;
        for (key, value) in stored {
            let Some(data) = expired(Some(value)) else {
                continue;
            };
            let meta = |source| SessionError::Metadata {
                client_id: data.client_id.clone(),
                source,
            };
            let slot = self.slot(&data.client_id);
            // A connection holding it (connected, or taking it over) is
            // not expired; otherwise nobody can open it while this runs.
            if let Ok(mut held) = slot.session.clone().try_lock_owned() {
                // Read again: a connection may have come and gone since the
                // listing and set a later expiry.
                if expired(manager.store().get(&key).await.map_err(meta)?).is_some() {
                    manager.store().delete(&key).await.map_err(meta)?;
                    *held = None;
                    removed += 1;
                }
            }
            self.forget_unused(&data.client_id, &slot);
        }
        Ok(removed)
    }

    /// Forgets `client_id`'s slot if it holds no session and nobody else
    /// has it (the map's reference and the caller's).
    fn forget_unused(&self, client_id: &str, slot: &Arc<SessionSlot>) {
        let mut live = self.lock();
        let ours = live.get(client_id).is_some_and(|s| Arc::ptr_eq(s, slot));
        let empty = slot.session.try_lock().is_ok_and(|s| s.is_none());
        if ours && empty && Arc::strong_count(slot) == 2 {
            live.remove(client_id);
            self.gauge.store(live.len() as u64, Ordering::Relaxed);
        }
    }
}

/// What [`settle_pending`] did with the `pending` QoS 2 entries it found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Settled {
    /// Found stored (in the WAL, or in a range since deleted): now
    /// `received`, so a resend is not stored again.
    pub stored: usize,
    /// Not in the WAL: removed, so the client's resend is stored as new.
    pub not_stored: usize,
    /// Sessions whose stored state could not be decoded (left as they are;
    /// their client's CONNECT is refused with the reason).
    pub unreadable: usize,
}

/// Settles every `pending` QoS 2 entry that a crash left in the stored
/// sessions, by looking for its record in the topic's WAL
/// ([`stored_since`]). Run when the listener starts, before any connection,
/// the local API or the replicator can append to or delete from a WAL: an
/// entry whose record never reached the WAL is then told apart from one
/// whose record did, even if its client comes back only after that part of
/// the WAL was replicated, archived and deleted (a deleted range would
/// otherwise be taken for a stored record, and the message lost).
///
/// # Errors
/// [`SessionError::List`] if the store cannot be listed,
/// [`SessionError::Metadata`] if a settled session cannot be written.
pub async fn settle_pending(manager: &TopicManager, now_ms: u64) -> Result<Settled, SessionError> {
    let stored = manager
        .store()
        .list(edge::MQTT_SESSIONS_PREFIX)
        .await
        .map_err(SessionError::List)?;
    let mut settled = Settled::default();
    for (key, value) in stored {
        let Ok(mut data) = serde_json::from_value::<SessionData>(value) else {
            settled.unreadable += 1;
            tracing::warn!(
                key,
                "mqtt session unreadable: left for its client's CONNECT to report"
            );
            continue;
        };
        // A session a connection held when the agent stopped (a crash,
        // or a shutdown that could not save) has no deadline yet: its
        // connection ended now.
        let mut changed = data.expires_at_ms.is_none() && data.session_expiry_s.is_some();
        if changed {
            data.start_expiry(now_ms);
        }
        for (pkid, state) in data.qos2.iter_mut() {
            let Qos2State::Pending { topic, from } = state else {
                continue;
            };
            let found = TopicName::new(topic.as_str())
                .is_ok_and(|topic| stored_since(manager, &topic, *from, &data.client_id, *pkid));
            if found {
                settled.stored += 1;
                *state = Qos2State::Received;
            } else {
                settled.not_stored += 1;
            }
            changed = true;
        }
        if changed {
            data.qos2.retain(|_, state| *state == Qos2State::Received);
            let session = Session {
                persistent: true,
                data,
                stored: true,
                ..Session::default()
            };
            session.save(manager).await?;
        }
    }
    Ok(settled)
}

impl Session {
    /// Deletes the session's copy in the metadata store (the session ended).
    ///
    /// # Errors
    /// [`SessionError::Metadata`].
    pub async fn delete_stored(&self, manager: &TopicManager) -> Result<(), SessionError> {
        manager
            .store()
            .delete(&session_key(&self.data.client_id))
            .await
            .map(|_| ())
            .map_err(|source| SessionError::Metadata {
                client_id: self.data.client_id.clone(),
                source,
            })
    }

    /// Writes the session to the metadata store (persistent sessions only;
    /// one committed redb transaction).
    ///
    /// # Errors
    /// [`SessionError::Metadata`].
    pub async fn save(&self, manager: &TopicManager) -> Result<(), SessionError> {
        if !self.persistent {
            return Ok(());
        }
        let key = session_key(&self.data.client_id);
        let value = serde_json::to_value(&self.data).map_err(|e| SessionError::Decode {
            client_id: self.data.client_id.clone(),
            reason: e.to_string(),
        })?;
        manager
            .store()
            .put(&key, value)
            .await
            .map_err(|source| SessionError::Metadata {
                client_id: self.data.client_id.clone(),
                source,
            })
    }
}

/// Whether the WAL of `topic` holds, at or above `from`, a record that
/// `client_id` published with packet id `pkid` (a QoS 2 record stored
/// before the agent died without recording it).
///
/// If the WAL no longer starts at or below `from` (replicated, archived
/// and deleted, or dropped by `drop_oldest`), the message counts as
/// stored without a look. That holds because [`settle_pending`] runs at
/// start, before anything can delete from a WAL: an entry a crash left
/// right after it was written is settled while its range is still there,
/// so one whose range is gone was left by an append that completed on a
/// connection that saved nothing since (the `received` state is kept in
/// memory), and storing the resend would duplicate it.
pub fn stored_since(
    manager: &TopicManager,
    topic: &TopicName,
    from: u64,
    client_id: &str,
    pkid: u16,
) -> bool {
    let Some(wal) = manager.topic(topic).and_then(|t| t.wal()) else {
        return false;
    };
    if from < wal.log_start_offset() {
        return true;
    }
    let limits = manager.config().limits;
    let pkid_text = pkid.to_string();
    let mut next = from;
    loop {
        let batches = match wal.read(next, 1 << 20) {
            Ok(b) if !b.is_empty() => b,
            _ => return false,
        };
        for batch in batches {
            next = batch.next_offset();
            let Ok(decoded) = batch.decode(&limits) else {
                continue;
            };
            let hit = decoded.records.iter().any(|r| {
                let header = |name: &str| {
                    r.headers
                        .iter()
                        .find(|(n, _)| n == name)
                        .map(|(_, v)| v.as_ref())
                };
                header(HEADER_CLIENT_ID) == Some(client_id.as_bytes())
                    && header(HEADER_PACKET_ID) == Some(pkid_text.as_bytes())
            });
            if hit {
                return true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A slot is forgotten when its connection ends, unless a later
    /// connection claimed it or holds it (and is about to claim it).
    #[test]
    fn a_slot_is_forgotten_when_its_last_connection_ends() {
        let store = SessionStore::default();
        let a = store.slot("a");
        let claim = a.claim();
        store.release("a", &a, &claim);
        assert_eq!(store.live(), 0);

        // Taken over: the old connection's end keeps it.
        let old = store.slot("a");
        let old_claim = old.claim();
        let new = store.slot("a");
        let new_claim = new.claim();
        store.release("a", &old, &old_claim);
        assert_eq!(store.live(), 1);
        drop(old);
        store.release("a", &new, &new_claim);
        assert_eq!(store.live(), 0);

        // A connection that has the slot but has not claimed it yet.
        let b = store.slot("b");
        let b_claim = b.claim();
        let _arriving = store.slot("b");
        store.release("b", &b, &b_claim);
        assert_eq!(store.live(), 1);
        // A slot replaced in the map is not removed by the old one's end.
        let c = Arc::new(SessionSlot::default());
        let c_claim = c.claim();
        store.release("b", &c, &c_claim);
        assert_eq!(store.live(), 1);
    }

    /// A take-over is seen by a connection that was busy when it happened
    /// (a missed wake-up left two connections on one session), and the new
    /// connection gets the session only when the old one lets it go, with
    /// what the old one left in it.
    #[tokio::test]
    async fn a_take_over_is_seen_late_and_waits_for_the_session() {
        let slot = Arc::new(SessionSlot::default());
        let mut old = slot.claim();
        let mut held = slot.acquire(Duration::from_secs(1)).await.expect("free");
        let session = held.insert(Session::default());
        session.data.client_id = "dev".into();

        let mut new = slot.claim();
        // The old connection looks only now, after the claim.
        tokio::time::timeout(Duration::from_secs(1), old.taken_over())
            .await
            .expect("the take-over is seen after the fact");
        assert!(
            slot.acquire(Duration::from_millis(50)).await.is_none(),
            "the session is still held"
        );
        let waiting = tokio::spawn({
            let slot = slot.clone();
            async move { slot.acquire(Duration::from_secs(5)).await }
        });
        held.as_mut()
            .expect("held")
            .data
            .qos2
            .insert(7, Qos2State::Received);
        drop(held);
        let handed = waiting.await.expect("task").expect("handed over");
        let handed = handed.as_ref().expect("the session left in the slot");
        assert_eq!(handed.data.client_id, "dev");
        assert_eq!(handed.data.qos2.get(&7), Some(&Qos2State::Received));
        // The newest claim is not taken over.
        assert!(
            tokio::time::timeout(Duration::from_millis(50), new.taken_over())
                .await
                .is_err()
        );
    }
}
