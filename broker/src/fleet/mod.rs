//! Fleet visibility, broker side: which edges hold replication connections
//! to this broker, since when, from where, and each topic's offsets (the
//! broker's acknowledged offset and the edge's own high-water mark from its
//! `Progress` frames).
//!
//! - The ingest endpoint registers every edge connection
//!   ([`Fleet::connected`], logged at `info` with the edge id and remote
//!   address) and ends it ([`EdgeConnection::closed`], logged with the
//!   topics streamed and the reason); each topic stream updates its
//!   [`TopicProgress`] (atomics, no lock on the data path).
//! - [`report`] shares it with the cluster: one Raft transaction per
//!   change of connection state (coalesced over [`EVENT_DELAY`]) and one
//!   per `[fleet] report_interval_ms` (default 15 s) holding the entries of
//!   the edges that are connected or whose offsets moved, each at
//!   `/fleet/edges/{edge_id}/{broker_id}` ([`tributary_proto::fleet`]). An
//!   idle, disconnected edge costs nothing; a fleet of N connected edges
//!   costs N small puts per broker per interval, in one transaction.
//! - `GET /v1/edges` (`crate::admin`) merges every broker's entries, with
//!   this broker's own taken live from here ([`Fleet::entries`]).
//! - `/metrics`: `tributary_broker_edge_connected{edge}` and
//!   `tributary_broker_edge_last_seen_timestamp_seconds{edge}` for the
//!   edges this broker knows ([`Fleet::metrics`]).

pub mod report;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use broker_core::clock::Clock;
use serde::Deserialize;
use tracing::info;
use tributary_proto::fleet::{EdgeEntry, TopicEntry};
use tributary_proto::keys::TopicName;

/// How long connection changes are gathered before they are written (a
/// reconnect storm becomes a few transactions, not one per edge).
pub const EVENT_DELAY: Duration = Duration::from_millis(200);

/// `[fleet]` of the broker configuration.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FleetConfig {
    /// How often the entries of connected edges and moved offsets are
    /// written to Raft, ms. Default 15000; at least 100.
    pub report_interval_ms: u64,
    /// The interval edges are asked to report their high-water mark at
    /// (`ProgressRequest`), ms. Default 1000; at least 100.
    pub progress_interval_ms: u32,
}

impl Default for FleetConfig {
    fn default() -> Self {
        FleetConfig {
            report_interval_ms: 15_000,
            progress_interval_ms: 1_000,
        }
    }
}

impl FleetConfig {
    /// The problems of this section, as `(field, reason)`.
    pub fn problems(&self) -> Vec<(&'static str, String)> {
        let mut problems = Vec::new();
        if self.report_interval_ms < 100 {
            problems.push((
                "fleet.report_interval_ms",
                format!("{} is below 100 ms", self.report_interval_ms),
            ));
        }
        if self.progress_interval_ms < 100 {
            problems.push((
                "fleet.progress_interval_ms",
                format!("{} is below 100 ms", self.progress_interval_ms),
            ));
        }
        problems
    }
}

/// `u64::MAX` in [`TopicProgress::edge_hwm`]: the edge never reported it.
const UNKNOWN: u64 = u64::MAX;

/// One topic's offsets as its edge stream sees them; shared by the stream
/// (writer) and the fleet (reader).
#[derive(Debug)]
pub struct TopicProgress {
    acked: AtomicU64,
    edge_hwm: AtomicU64,
}

impl TopicProgress {
    fn new() -> TopicProgress {
        TopicProgress {
            acked: AtomicU64::new(0),
            edge_hwm: AtomicU64::new(UNKNOWN),
        }
    }

    /// Everything below `next_offset` is durable here and acknowledged (or
    /// was held when the stream opened).
    pub fn acknowledged(&self, next_offset: u64) {
        self.acked.fetch_max(next_offset, Ordering::Relaxed);
    }

    /// The edge reports its high-water mark (a `Progress` frame).
    pub fn edge_reports(&self, high_water_mark: u64) {
        self.edge_hwm
            .store(high_water_mark.min(UNKNOWN - 1), Ordering::Relaxed);
    }

    fn values(&self) -> (u64, Option<u64>) {
        let hwm = self.edge_hwm.load(Ordering::Relaxed);
        (
            self.acked.load(Ordering::Relaxed),
            (hwm != UNKNOWN).then_some(hwm),
        )
    }
}

/// A topic's values as last reported: (acknowledged offset, the edge's
/// high-water mark, when they last changed in ms).
type Reported = (u64, Option<u64>, u64);

/// What this broker knows of one edge.
#[derive(Debug, Default)]
struct EdgeState {
    /// Open connections: id → (remote address, connected at ms).
    connections: BTreeMap<u64, (SocketAddr, u64)>,
    /// Remote address of the newest connection.
    remote_addr: String,
    /// While disconnected: when the last connection ended, ms.
    ended_ms: u64,
    /// Topics with their progress handles and the values last reported
    /// with the time they changed: (acked, edge hwm, updated ms).
    topics: BTreeMap<String, (Arc<TopicProgress>, Option<Reported>)>,
    /// Bumped at every connect and disconnect.
    event: u64,
    /// `event` as of the last write that succeeded.
    written_event: u64,
    /// The entry last written (its `last_seen_ms` aside).
    written: Option<EdgeEntry>,
}

impl EdgeState {
    /// The entry for this edge at `now_ms`, with every topic's `updated_ms`
    /// moved to now when its values changed since the last look.
    fn entry(&mut self, now_ms: u64) -> EdgeEntry {
        let connected = !self.connections.is_empty();
        let topics = self
            .topics
            .iter_mut()
            .map(|(name, (progress, seen))| {
                let (acked, hwm) = progress.values();
                let updated_ms = match seen {
                    Some((a, h, at)) if (*a, *h) == (acked, hwm) => *at,
                    _ => now_ms,
                };
                *seen = Some((acked, hwm, updated_ms));
                (
                    name.clone(),
                    TopicEntry {
                        acknowledged_offset: acked,
                        edge_high_water_mark: hwm,
                        updated_ms,
                    },
                )
            })
            .collect();
        EdgeEntry {
            connections: u32::try_from(self.connections.len()).unwrap_or(u32::MAX),
            remote_addr: self.remote_addr.clone(),
            since_ms: if connected {
                self.connections
                    .values()
                    .map(|c| c.1)
                    .min()
                    .unwrap_or(now_ms)
            } else {
                self.ended_ms
            },
            last_seen_ms: if connected { now_ms } else { self.ended_ms },
            topics,
        }
    }
}

/// The edges of this broker.
pub struct Fleet {
    me: u64,
    clock: Arc<dyn Clock>,
    config: FleetConfig,
    edges: Mutex<BTreeMap<String, EdgeState>>,
    next_connection: AtomicU64,
    /// Woken at every connect and disconnect (the reporter writes them).
    changed: tokio::sync::Notify,
}

impl std::fmt::Debug for Fleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fleet")
            .field("me", &self.me)
            .finish_non_exhaustive()
    }
}

impl Fleet {
    /// The fleet of broker `me`, timed by `clock` (wall clock ms).
    pub fn new(me: u64, clock: Arc<dyn Clock>, config: FleetConfig) -> Arc<Fleet> {
        Arc::new(Fleet {
            me,
            clock,
            config,
            edges: Mutex::new(BTreeMap::new()),
            next_connection: AtomicU64::new(1),
            changed: tokio::sync::Notify::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, EdgeState>> {
        self.edges
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// This broker's id.
    pub fn me(&self) -> u64 {
        self.me
    }

    /// The settings.
    pub fn config(&self) -> &FleetConfig {
        &self.config
    }

    /// Edge `edge` connected from `remote`: logged (`info`, "edge
    /// connected", fields `edge`, `remote_addr`, `broker`, `connections`).
    /// The connection ends with [`EdgeConnection::closed`] (or its drop).
    pub fn connected(self: &Arc<Self>, edge: &str, remote: SocketAddr) -> EdgeConnection {
        let id = self.next_connection.fetch_add(1, Ordering::Relaxed);
        let now_ms = self.clock.now_ms();
        let open = {
            let mut edges = self.lock();
            let state = edges.entry(edge.to_owned()).or_default();
            state.connections.insert(id, (remote, now_ms));
            state.remote_addr = remote.to_string();
            state.event += 1;
            state.connections.len()
        };
        self.changed.notify_one();
        info!(
            edge,
            remote_addr = %remote,
            broker = self.me,
            connections = open,
            "edge connected"
        );
        EdgeConnection {
            fleet: self.clone(),
            edge: edge.to_owned(),
            remote,
            id,
            connected_ms: now_ms,
            topics: Mutex::new(BTreeSet::new()),
            closed: AtomicBool::new(false),
        }
    }

    /// Takes in an entry an earlier process of this broker wrote (found at
    /// start-up): the edge is known, with no connection here now. An edge
    /// already connected meanwhile keeps its live state.
    pub fn adopt(&self, edge: &str, entry: &EdgeEntry) {
        let mut edges = self.lock();
        if edges.contains_key(edge) {
            return;
        }
        let mut state = EdgeState {
            remote_addr: entry.remote_addr.clone(),
            ended_ms: entry.last_seen_ms.max(if entry.connections == 0 {
                entry.since_ms
            } else {
                0
            }),
            ..EdgeState::default()
        };
        for (name, t) in &entry.topics {
            let progress = Arc::new(TopicProgress::new());
            progress.acknowledged(t.acknowledged_offset);
            if let Some(hwm) = t.edge_high_water_mark {
                progress.edge_reports(hwm);
            }
            let seen = Some((t.acknowledged_offset, t.edge_high_water_mark, t.updated_ms));
            state.topics.insert(name.clone(), (progress, seen));
        }
        if entry.connections > 0 {
            // Written as connected by a process that is gone: say it ended.
            state.event = 1;
        } else {
            state.written = Some(entry.clone());
        }
        edges.insert(edge.to_owned(), state);
        drop(edges);
        self.changed.notify_one();
    }

    /// Every edge's entry as of now (connected ones seen now).
    pub fn entries(&self) -> Vec<(String, EdgeEntry)> {
        let now_ms = self.clock.now_ms();
        self.lock()
            .iter_mut()
            .map(|(edge, state)| (edge.clone(), state.entry(now_ms)))
            .collect()
    }

    /// `(edge, connected, last seen in seconds since the Unix epoch)` of
    /// every edge this broker knows: now while connected.
    pub fn metrics(&self) -> Vec<(String, bool, f64)> {
        let now_ms = self.clock.now_ms();
        self.lock()
            .iter()
            .map(|(edge, state)| {
                let connected = !state.connections.is_empty();
                let seen = if connected { now_ms } else { state.ended_ms };
                (edge.clone(), connected, seen as f64 / 1000.0)
            })
            .collect()
    }

    /// The entries to write now: edges whose connections changed since the
    /// last successful write, and, with `periodic`, connected edges and
    /// edges whose offsets moved. Each comes with the event count to pass
    /// to [`Fleet::written`].
    pub fn due(&self, periodic: bool) -> Vec<(String, EdgeEntry, u64)> {
        let now_ms = self.clock.now_ms();
        let mut edges = self.lock();
        let mut due = Vec::new();
        for (edge, state) in edges.iter_mut() {
            let event = state.event != state.written_event;
            let entry = state.entry(now_ms);
            let moved = state.written.as_ref().is_none_or(|w| {
                w.topics != entry.topics
                    || w.connections != entry.connections
                    || w.remote_addr != entry.remote_addr
            });
            if event || (periodic && (entry.connections > 0 || moved)) {
                due.push((edge.clone(), entry, state.event));
            }
        }
        due
    }

    /// `entries` (from [`Fleet::due`]) are durable.
    pub fn written(&self, entries: Vec<(String, EdgeEntry, u64)>) {
        let mut edges = self.lock();
        for (edge, entry, event) in entries {
            if let Some(state) = edges.get_mut(&edge) {
                state.written_event = state.written_event.max(event);
                state.written = Some(entry);
            }
        }
    }

    /// Resolves at the next connect or disconnect.
    pub async fn changes(&self) {
        self.changed.notified().await;
    }

    /// Ends every connection now (the broker shuts down); their
    /// [`EdgeConnection::closed`] calls that follow only log.
    pub fn close_all(&self, reason: &str) {
        let now_ms = self.clock.now_ms();
        let mut ended = 0usize;
        for state in self.lock().values_mut() {
            if !state.connections.is_empty() {
                ended += state.connections.len();
                state.connections.clear();
                state.ended_ms = now_ms;
                state.event += 1;
            }
        }
        if ended > 0 {
            info!(connections = ended, reason, "edge connections ended");
        }
    }

    fn close(&self, connection: &EdgeConnection, reason: &str) {
        if connection.closed.swap(true, Ordering::Relaxed) {
            return;
        }
        let now_ms = self.clock.now_ms();
        let open = {
            let mut edges = self.lock();
            let Some(state) = edges.get_mut(&connection.edge) else {
                return;
            };
            if state.connections.remove(&connection.id).is_some() {
                if state.connections.is_empty() {
                    state.ended_ms = now_ms;
                }
                state.event += 1;
            }
            state.connections.len()
        };
        self.changed.notify_one();
        let topics: Vec<String> = connection
            .topics
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .cloned()
            .collect();
        info!(
            edge = connection.edge.as_str(),
            remote_addr = %connection.remote,
            broker = self.me,
            topics = topics.join(","),
            connected_s = now_ms.saturating_sub(connection.connected_ms) / 1000,
            connections = open,
            reason,
            "edge disconnected"
        );
    }
}

/// One replication connection of an edge; ends with
/// [`EdgeConnection::closed`] (dropping it ends it too, reason `ended`).
#[derive(Debug)]
pub struct EdgeConnection {
    fleet: Arc<Fleet>,
    edge: String,
    remote: SocketAddr,
    id: u64,
    connected_ms: u64,
    topics: Mutex<BTreeSet<String>>,
    closed: AtomicBool,
}

impl EdgeConnection {
    /// The progress handle of `topic`, streamed on this connection (one per
    /// edge and topic, kept across connections).
    pub fn topic(&self, topic: &TopicName) -> Arc<TopicProgress> {
        let name = topic.as_str().to_owned();
        self.topics
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(name.clone());
        let mut edges = self.fleet.lock();
        let state = edges.entry(self.edge.clone()).or_default();
        state
            .topics
            .entry(name)
            .or_insert_with(|| (Arc::new(TopicProgress::new()), None))
            .0
            .clone()
    }

    /// The connection ended (`reason`: how, for the log line).
    pub fn closed(&self, reason: &str) {
        self.fleet.close(self, reason);
    }
}

impl Drop for EdgeConnection {
    fn drop(&mut self) {
        self.fleet.close(self, "ended");
    }
}

#[cfg(test)]
mod tests;
