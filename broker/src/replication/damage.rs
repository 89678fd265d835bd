//! Damaged central ranges: found, reported, healed, or skipped.
//!
//! - **Found**: a background pass CRC-checks the sealed segments of every
//!   open topic at a bounded rate (`[wal] scrub_bytes_per_sec`,
//!   [`Wal::scrub_segment`]), and opens, one per check, the topics this
//!   broker serves that nothing opened since it started (so damage in a
//!   topic nobody reads after a restart is found too); reads find damage
//!   too, and opening a WAL
//!   lists a sealed segment whose data file is gone (its index kept) as
//!   one damaged range. Either way the WAL lists the range once
//!   ([`Wal::damaged_ranges`]) and logs it once.
//! - **Reported**: `/health` (`degraded`, with the ranges), the metrics
//!   `tributary_broker_damaged_ranges` / `tributary_broker_damaged_offsets`,
//!   the admin API's topic view and `tribctl topics describe`.
//! - **Healed**: every check interval each damaged range is asked for again:
//!   from the edge that replicates the topic (a `Refetch` frame on its
//!   stream, FORMAT.md "Replication stream"), or, when no edge stream is
//!   open or the edge answered that it no longer holds it, from the archive
//!   (`[archive]`) when that holds it. The batches replace the damaged
//!   bytes in an atomic segment rewrite ([`Wal::repair_range`]). A request
//!   not answered is asked again after [`RETRY_AFTER`].
//! - **Skipped**: when nothing holds the range, an operator may skip it
//!   (`POST /v1/topics/{ns}/{topic}/skip-damaged`, `tribctl topics
//!   skip-damaged`): it is recorded in Raft as a hole with cause `damaged`
//!   and reads as a declared hole from then on, also after a restart
//!   ([`TopicStore`] applies such holes again when it opens the WAL); its
//!   segment is rewritten without the damaged bytes ([`Wal::skip_damaged`]),
//!   so the tier service archives it with the hole like an edge-declared
//!   one.

use std::collections::HashMap;
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use broker_core::wal::{UnreadableKind, UnreadableRange, Wal, WalError};
use serde::Serialize;
use tokio::sync::mpsc;
use tracing::{info, warn};
use tributary_archive::Archive;
use tributary_archive::reader::Start;
use tributary_proto::batch::EncodedBatch;
use tributary_proto::keys::TopicName;
use tributary_proto::replication::frame::HoleCause;
use tributary_proto::replication::hole::HoleRecord;

use super::topics::{TopicError, TopicStore};

/// A request not answered (no repair, no "unavailable") is sent again after
/// this long.
pub const RETRY_AFTER: Duration = Duration::from_secs(10);
/// Default scrub rate, bytes/s.
pub const DEFAULT_SCRUB_BYTES_PER_SEC: u64 = 4 * 1024 * 1024;
/// Default interval between damage checks.
pub const DEFAULT_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// A damaged range of one topic, as `/health`, the topic view and
/// `tribctl topics describe` show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DamagedRange {
    /// `/{ns}/{topic}`.
    pub topic: String,
    /// First unreadable offset.
    pub first_offset: u64,
    /// Exclusive end.
    pub end_offset: u64,
    /// Base offset of the segment holding the damaged bytes.
    pub segment_base: u64,
    /// Byte position of the damage in the segment file.
    pub position: u64,
    /// Length of the damaged bytes.
    pub bytes: u64,
    /// What the first failed check said.
    pub reason: String,
}

impl DamagedRange {
    fn from_range(topic: &TopicName, range: &UnreadableRange) -> Option<DamagedRange> {
        match &range.kind {
            UnreadableKind::Damaged {
                segment_base,
                position,
                bytes,
                reason,
            } => Some(DamagedRange {
                topic: topic.as_str().to_string(),
                first_offset: range.first_offset,
                end_offset: range.end_offset,
                segment_base: *segment_base,
                position: *position,
                bytes: *bytes,
                reason: reason.clone(),
            }),
            UnreadableKind::Hole => None,
        }
    }
}

/// The damaged (not skipped) ranges of `wal`.
pub fn damaged_of(topic: &TopicName, wal: &Wal) -> Vec<DamagedRange> {
    wal.damaged_ranges()
        .iter()
        .filter_map(|r| DamagedRange::from_range(topic, r))
        .collect()
}

/// Why a skip was refused.
#[derive(Debug, thiserror::Error)]
pub enum SkipError {
    /// The range is not exactly one damaged range of the topic.
    #[error(
        "offsets {first_offset}..{end_offset} of {topic} are not a damaged range (damaged now: {damaged:?})"
    )]
    NotDamaged {
        /// The topic.
        topic: TopicName,
        /// First offset asked for.
        first_offset: u64,
        /// End asked for.
        end_offset: u64,
        /// The topic's damaged ranges now, as `first..end`.
        damaged: Vec<String>,
    },
    /// Opening the topic or recording the hole failed.
    #[error(transparent)]
    Topic(#[from] TopicError),
}

#[derive(Debug, Clone, Copy)]
struct Attempt {
    at: Instant,
    /// The edge said it no longer holds the range: ask the archive.
    edge_unavailable: bool,
    /// This attempt asked an edge stream (else only the archive).
    asked_edge: bool,
}

/// The refetch requests one edge stream carries out.
struct StreamRoute {
    id: u64,
    requests: mpsc::Sender<(u64, u64)>,
}

/// Finds, reports and heals damaged central ranges (module doc).
pub struct DamageService {
    topics: Arc<TopicStore>,
    archive: Mutex<Option<Archive>>,
    scrub_bytes_per_sec: u64,
    interval: Duration,
    streams: Mutex<HashMap<TopicName, StreamRoute>>,
    attempts: Mutex<HashMap<(TopicName, u64), Attempt>>,
    /// Per topic: the next sealed segment to scrub.
    cursors: Mutex<HashMap<TopicName, u64>>,
    /// Unopened topics tried in this round of [`DamageService::open_next_unopened`]
    /// (one that fails to open is tried again in the next round, after the
    /// others).
    opened_tried: Mutex<std::collections::HashSet<TopicName>>,
    next_stream: AtomicU64,
    repaired: AtomicU64,
}

/// Removes a stream's route when the stream ends.
pub struct RouteGuard {
    service: Arc<DamageService>,
    topic: TopicName,
    id: u64,
}

impl Drop for RouteGuard {
    fn drop(&mut self) {
        let mut streams = lock(&self.service.streams);
        if streams.get(&self.topic).is_some_and(|r| r.id == self.id) {
            streams.remove(&self.topic);
        }
    }
}

/// The first of `candidates` not `tried` in this round (and marks it
/// tried); `None` ends the round and starts a new one, so a topic that
/// failed is tried again only after every other one.
fn next_to_try(
    candidates: Vec<TopicName>,
    tried: &mut std::collections::HashSet<TopicName>,
) -> Option<TopicName> {
    let next = candidates.into_iter().find(|t| !tried.contains(t));
    match &next {
        Some(topic) => {
            tried.insert(topic.clone());
        }
        None => tried.clear(),
    }
    next
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl DamageService {
    /// A service over `topics`, scrubbing at `scrub_bytes_per_sec` (0: no
    /// background scrub) and checking every `interval`.
    pub fn new(
        topics: Arc<TopicStore>,
        scrub_bytes_per_sec: u64,
        interval: Duration,
    ) -> Arc<DamageService> {
        Arc::new(DamageService {
            topics,
            archive: Mutex::new(None),
            scrub_bytes_per_sec,
            interval,
            streams: Mutex::new(HashMap::new()),
            attempts: Mutex::new(HashMap::new()),
            cursors: Mutex::new(HashMap::new()),
            opened_tried: Mutex::new(std::collections::HashSet::new()),
            next_stream: AtomicU64::new(0),
            repaired: AtomicU64::new(0),
        })
    }

    /// Re-fetches from `archive` what no edge can send.
    pub fn set_archive(&self, archive: Archive) {
        *lock(&self.archive) = Some(archive);
    }

    /// The topic store.
    pub fn topics(&self) -> &Arc<TopicStore> {
        &self.topics
    }

    /// Ranges repaired since start.
    pub fn repaired_count(&self) -> u64 {
        self.repaired.load(Ordering::Relaxed)
    }

    /// Routes refetch requests for `topic` to the edge stream that holds
    /// the returned receiver (the newest stream of a topic wins) until the
    /// guard is dropped.
    pub fn register_stream(
        self: &Arc<Self>,
        topic: &TopicName,
    ) -> (mpsc::Receiver<(u64, u64)>, RouteGuard) {
        let (tx, rx) = mpsc::channel(64);
        let id = self.next_stream.fetch_add(1, Ordering::Relaxed);
        lock(&self.streams).insert(topic.clone(), StreamRoute { id, requests: tx });
        // A new stream is asked at once for what no edge was asked for
        // yet; a range an edge was already asked for waits for its retry
        // (an edge that drops the stream on a Refetch, one that predates
        // the frame, is not asked again on every reconnect).
        lock(&self.attempts).retain(|(t, _), a| t != topic || a.asked_edge);
        let guard = RouteGuard {
            service: self.clone(),
            topic: topic.clone(),
            id,
        };
        (rx, guard)
    }

    /// Every damaged range of the open topics, by topic and offset.
    pub async fn damaged(&self) -> Vec<DamagedRange> {
        let mut out = Vec::new();
        for (topic, wal) in self.topics.open_topics().await {
            out.extend(damaged_of(&topic, &wal));
        }
        out
    }

    /// The edge re-sent `first_offset..end_offset`: rewrite its segment.
    pub async fn repair_from_edge(
        &self,
        topic: &TopicName,
        wal: &Wal,
        first_offset: u64,
        batches: &[EncodedBatch],
    ) {
        self.repair(topic, wal, first_offset, batches, "edge").await;
    }

    async fn repair(
        &self,
        topic: &TopicName,
        wal: &Wal,
        first_offset: u64,
        batches: &[EncodedBatch],
        source: &str,
    ) {
        match wal.repair_range(first_offset, batches).await {
            Ok(report) => {
                self.repaired.fetch_add(1, Ordering::Relaxed);
                lock(&self.attempts).remove(&(topic.clone(), first_offset));
                info!(
                    %topic,
                    first_offset,
                    end_offset = report.end_offset,
                    segment_base = report.segment_base,
                    source,
                    "damaged range healed: re-fetched and its segment rewritten"
                );
            }
            Err(WalError::NotDamaged { .. }) => {
                lock(&self.attempts).remove(&(topic.clone(), first_offset));
            }
            Err(e) => {
                warn!(%topic, first_offset, source, error = %e, "re-fetched batches did not repair the damaged range");
            }
        }
    }

    /// The edge no longer holds `first_offset..`: the archive is asked at
    /// the next check.
    pub fn edge_unavailable(&self, topic: &TopicName, first_offset: u64, log_start: u64) {
        warn!(%topic, first_offset, edge_log_start = log_start, "the edge no longer holds a damaged range; trying the archive");
        lock(&self.attempts).insert(
            (topic.clone(), first_offset),
            Attempt {
                at: Instant::now()
                    .checked_sub(RETRY_AFTER)
                    .unwrap_or_else(Instant::now),
                edge_unavailable: true,
                asked_edge: true,
            },
        );
    }

    /// Runs the check loop until the task is aborted.
    pub fn spawn(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let service = self.clone();
        tokio::spawn(async move {
            // Bytes scrubbed beyond what the rate allowed so far.
            let mut debt: u64 = 0;
            let mut ticker = tokio::time::interval(service.interval);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticker.tick().await;
                let credit =
                    (service.scrub_bytes_per_sec as f64 * service.interval.as_secs_f64()) as u64;
                debt = debt.saturating_sub(credit);
                for (topic, wal) in service.topics.open_topics().await {
                    if service.scrub_bytes_per_sec > 0 && debt == 0 {
                        debt += service.scrub_step(&topic, &wal).await;
                    }
                    service.request_repairs(&topic, &wal).await;
                }
                if service.scrub_bytes_per_sec > 0 && debt == 0 {
                    service.open_next_unopened().await;
                }
            }
        })
    }

    /// Opens one topic this broker serves but nobody opened since it
    /// started, so that the scrub covers it from the next check on: damage
    /// in a topic no edge, consumer or publish touches after a restart
    /// would otherwise stay out of `/health` until something reads it.
    /// Opening is what a consumer's first read does (recovery of the tail,
    /// the ownership checks); a failure is logged and the topic is tried
    /// again once every other one was.
    async fn open_next_unopened(&self) {
        let unopened = self.topics.served_unopened().await;
        let topic = next_to_try(unopened, &mut lock(&self.opened_tried));
        let Some(topic) = topic else {
            return;
        };
        match self.topics.open_existing(&topic, false).await {
            Ok(wal) => {
                info!(%topic, high_water_mark = wal.high_water_mark(), "opened a topic nothing had opened since the start, to scrub it");
            }
            Err(e) => warn!(%topic, error = %e, "opening a topic to scrub it failed"),
        }
    }

    /// CRC-checks the next sealed segment of `topic`; returns its bytes.
    async fn scrub_step(&self, topic: &TopicName, wal: &Arc<Wal>) -> u64 {
        let sealed = wal.sealed_segments();
        if sealed.is_empty() {
            return 0;
        }
        let cursor = lock(&self.cursors).get(topic).copied().unwrap_or(0);
        let segment = sealed
            .iter()
            .find(|s| s.base_offset >= cursor)
            .unwrap_or(&sealed[0])
            .clone();
        lock(&self.cursors).insert(topic.clone(), segment.next_offset);
        let reader = wal.clone();
        let base = segment.base_offset;
        match tokio::task::spawn_blocking(move || reader.scrub_segment(base)).await {
            Ok(Ok(report)) => report.bytes,
            Ok(Err(e)) => {
                warn!(%topic, segment_base = base, error = %e, "scrubbing a sealed segment failed");
                segment.bytes
            }
            Err(e) => {
                warn!(%topic, error = %e, "scrub task failed");
                0
            }
        }
    }

    /// Asks for every damaged range of `topic` not asked for recently.
    async fn request_repairs(&self, topic: &TopicName, wal: &Wal) {
        for range in damaged_of(topic, wal) {
            let key = (topic.clone(), range.first_offset);
            let previous = lock(&self.attempts).get(&key).copied();
            if previous.is_some_and(|a| a.at.elapsed() < RETRY_AFTER) {
                continue;
            }
            let edge_unavailable = previous.is_some_and(|a| a.edge_unavailable);
            let route = lock(&self.streams)
                .get(topic)
                .map(|r| r.requests.clone())
                .filter(|_| !edge_unavailable);
            lock(&self.attempts).insert(
                key,
                Attempt {
                    at: Instant::now(),
                    edge_unavailable,
                    asked_edge: route.is_some(),
                },
            );
            if let Some(route) = route {
                info!(%topic, first_offset = range.first_offset, end_offset = range.end_offset, "asking the edge to re-send a damaged range");
                let _ = route.try_send((range.first_offset, range.end_offset));
                continue;
            }
            self.repair_from_archive(topic, wal, &range).await;
        }
    }

    async fn repair_from_archive(&self, topic: &TopicName, wal: &Wal, range: &DamagedRange) {
        let Some(archive) = lock(&self.archive).clone() else {
            return;
        };
        let (first, end) = (range.first_offset, range.end_offset);
        let owned_topic = topic.clone();
        // The archive's read futures are not `Send` (they take `&mut dyn
        // FnMut` callbacks): driven on a blocking thread.
        let handle = tokio::runtime::Handle::current();
        let read = tokio::task::spawn_blocking(move || {
            handle.block_on(async move {
                let mut batches: Vec<EncodedBatch> = Vec::new();
                let mut collect = |batch: &EncodedBatch| {
                    if batch.next_offset() > first && batch.base_offset() < end {
                        batches.push(batch.clone());
                    }
                    Ok(if batch.next_offset() >= end {
                        ControlFlow::Break(())
                    } else {
                        ControlFlow::Continue(())
                    })
                };
                archive
                    .read_batches(&owned_topic, Start::Offset(first), &mut collect)
                    .await
                    .map(|()| batches)
                    .map_err(|e| e.to_string())
            })
        })
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r);
        match read {
            Ok(batches) if !batches.is_empty() => {
                self.repair(topic, wal, first, &batches, "archive").await;
            }
            Ok(_) => {
                info!(%topic, first_offset = first, end_offset = end, "the archive does not hold the damaged range either; it stays damaged until re-sent or skipped");
            }
            Err(e) => {
                info!(%topic, first_offset = first, end_offset = end, error = %e, "the archive cannot supply the damaged range");
            }
        }
    }

    /// Skips the damaged range `first_offset..end_offset` of `topic` (an
    /// operator's decision that nothing will heal it): records it in Raft
    /// as a hole with cause `damaged`, then makes the WAL read it as a
    /// declared hole. Returns the recorded hole.
    ///
    /// # Errors
    /// [`SkipError::NotDamaged`] unless the range is exactly one damaged
    /// range of the topic; [`SkipError::Topic`] for an unknown topic or a
    /// metadata failure.
    pub async fn skip(
        &self,
        topic: &TopicName,
        first_offset: u64,
        end_offset: u64,
        reason: &str,
    ) -> Result<HoleRecord, SkipError> {
        let wal = self.topics.open_existing(topic, false).await?;
        let damaged = damaged_of(topic, &wal);
        if !damaged
            .iter()
            .any(|d| (d.first_offset, d.end_offset) == (first_offset, end_offset))
        {
            return Err(SkipError::NotDamaged {
                topic: topic.clone(),
                first_offset,
                end_offset,
                damaged: damaged
                    .iter()
                    .map(|d| format!("{}..{}", d.first_offset, d.end_offset))
                    .collect(),
            });
        }
        let record = HoleRecord::new(
            first_offset,
            end_offset,
            HoleCause::Damaged,
            format!("damaged range skipped by an operator: {reason}"),
            now_ms(),
        );
        self.topics.record_hole(topic, &record).await?;
        // Recorded first: after a crash here the open applies it again.
        match wal.skip_damaged(first_offset, end_offset).await {
            Ok(rewritten) => {
                info!(%topic, first_offset, end_offset, rewritten, "damaged bytes removed from their segment");
            }
            Err(e) => {
                warn!(%topic, first_offset, end_offset, error = %e, "the skipped range reads as a hole, but its segment could not be rewritten");
            }
        }
        lock(&self.attempts).remove(&(topic.clone(), first_offset));
        warn!(%topic, first_offset, end_offset, "damaged range skipped by an operator: it reads as a declared hole from now on");
        Ok(record)
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A topic that keeps failing to open does not hold up the others: each
    /// round tries every unopened topic once, in order.
    #[test]
    fn unopened_topics_are_tried_in_rounds() {
        let topic = |n: &str| TopicName::new(n).expect("topic name");
        let (a, b) = (topic("/ns/a"), topic("/ns/b"));
        let mut tried = std::collections::HashSet::new();
        let both = || vec![a.clone(), b.clone()];
        assert_eq!(next_to_try(both(), &mut tried), Some(a.clone()));
        // `a` failed to open and is still unopened: `b` comes first.
        assert_eq!(next_to_try(both(), &mut tried), Some(b.clone()));
        assert_eq!(next_to_try(both(), &mut tried), None, "round over");
        assert_eq!(next_to_try(both(), &mut tried), Some(a.clone()), "again");
        // `a` opened meanwhile; `b` is still due in this round.
        assert_eq!(next_to_try(vec![b.clone()], &mut tried), Some(b.clone()));
    }
}
