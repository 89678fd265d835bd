//! One topic of the agent: its WAL (durable intents and implicit topics) or
//! its in-memory ring (`realtime`), its disk budget, acknowledged checkpoint
//! and counters.
//!
//! # Publishing
//! Records are encoded into one record batch (no compression: the
//! replicator compresses on the wire), so size limits and the budget are
//! checked on the exact bytes that will be written. A durable topic then
//! reserves the batch against its own and the agent's budget
//! ([`crate::budget`]) and appends it; the call returns once the batch is
//! durable per the topic's sync mode. A realtime topic pushes the records
//! into its ring.
//!
//! # Deletion
//! Segments of a durable topic are deleted in two places only:
//! [`Topic::acknowledge`] and [`Topic::archive`] (WAL retention with
//! `safe_offset` = [`Topic::safe_offset`]: the acknowledged offset, or with
//! `retain_until = "archived"` (the default) the smaller of it and the
//! archived offset, and `retention_max_bytes` 0) and,
//! for `full_policy = drop_oldest`, when a batch does not fit (the oldest
//! sealed segment, acknowledged or not; each drop is logged with
//! `tracing::warn!` and counted).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use broker_core::catalog::TopicLoadSettings;
use broker_core::clock::Clock;
use broker_core::wal::{RetentionReport, UnreadableKind, Wal, WalError};
use serde::Serialize;
use tracing::{debug, info, warn};
use tributary_proto::Limits;
use tributary_proto::intent::{Persistence, StreamIntent};
use tributary_proto::keys::TopicName;

use crate::budget::{self, BudgetScope, ByteBudget, FullPolicy};
use crate::config::RetainUntil;
use crate::recovery::{FaultReport, Reopener};
use crate::ring::RealtimeRing;

mod archive;
mod claims;
mod damage;
mod errors;
mod publish;
mod reopen;
mod tight;

pub use damage::DamagedRange;
pub use errors::{AckError, PublishError, TopicFull};
pub use publish::Mark;

/// Dropped ranges kept per topic for [`TopicStats::recent_dropped_ranges`].
pub const RECENT_DROPPED_RANGES: usize = 16;
/// How long [`Topic::close`] waits for other holders of the WAL handle
/// (the replicator) to let go before leaving the final flush to the last
/// holder.
pub const CLOSE_WAIT: Duration = Duration::from_secs(5);

/// Offsets assigned to a published batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PublishAck {
    /// Offset of the first record.
    pub base_offset: u64,
    /// Offset just past the last record.
    pub next_offset: u64,
    /// Records published.
    pub count: u64,
}

/// What an acknowledgement released ([`Topic::acknowledge`]): the
/// acknowledged offset afterwards and the WAL segments or ring records it
/// freed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AckRelease {
    /// The topic's acknowledged offset afterwards (never decreases).
    pub acknowledged_offset: u64,
    /// Segments deleted, `(base_offset, next_offset, bytes)`.
    pub deleted_segments: Vec<(u64, u64, u64)>,
    /// Ring records released (realtime topics).
    pub released_records: u64,
}

/// A range deleted by `drop_oldest`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct DroppedRange {
    /// First offset of the deleted segment.
    pub start_offset: u64,
    /// Offset just past its last record.
    pub end_offset: u64,
    /// Records of it not acknowledged by the broker: lost.
    pub lost_records: u64,
    /// Size of the deleted segment, bytes.
    pub bytes: u64,
}

/// Counters and state of a topic, as `GET /v1/topics` shows them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TopicStats {
    /// The topic.
    pub name: TopicName,
    /// Canonical intent; `None` for an implicitly created topic.
    pub intent: Option<StreamIntent>,
    /// `Reliable` or `NonReliable`.
    pub delivery: &'static str,
    /// The sync mode its WAL is opened with (`async` for realtime).
    pub wal_sync_mode: &'static str,
    /// `wal` or `in_memory`.
    pub persistence: &'static str,
    /// Created by a first publish rather than the configuration.
    pub implicit: bool,
    /// Offset just past the last durable (readable) record.
    pub high_water_mark: u64,
    /// First offset still held.
    pub log_start_offset: u64,
    /// Next offset acknowledged by the broker (the checkpoint).
    pub acknowledged_offset: u64,
    /// Offset below which the broker reported everything committed in the
    /// archive (`/edge/archived/{ns}/{topic}`).
    pub archived_offset: u64,
    /// `archived` or `acknowledged`: below which offset local retention
    /// deletes.
    pub retain_until: &'static str,
    /// Records not yet acknowledged and still held.
    pub backlog_records: u64,
    /// Bytes not yet acknowledged: WAL segments holding an unacknowledged
    /// record (whole segments, so an upper bound), or the ring's records.
    pub backlog_bytes: u64,
    /// Bytes of WAL segment files (0 for realtime).
    pub wal_bytes: u64,
    /// Bytes counted against the budgets (WAL bytes plus appends in
    /// flight).
    pub disk_used_bytes: u64,
    /// The topic's own budget, bytes.
    pub disk_budget_bytes: Option<u64>,
    /// `refuse` or `drop_oldest` (durable topics).
    pub full_policy: Option<FullPolicy>,
    /// Ring capacity, records (realtime).
    pub ring_capacity_records: Option<u32>,
    /// Records published since the agent started.
    pub records_in: u64,
    /// Encoded batch bytes published since the agent started.
    pub bytes_in: u64,
    /// Records refused because a budget was full.
    pub refused_records: u64,
    /// Records lost: dropped by `drop_oldest` before the broker
    /// acknowledged them, or pushed out of a full ring.
    pub dropped_records: u64,
    /// Segments deleted by `drop_oldest`.
    pub dropped_segments: u64,
    /// The last [`RECENT_DROPPED_RANGES`] ranges deleted by `drop_oldest`.
    pub recent_dropped_ranges: Vec<DroppedRange>,
    /// Records refused because the file system holding the WAL was full.
    pub disk_full_records: u64,
    /// Times the WAL was reopened after a latched I/O failure.
    pub wal_reopens: u64,
    /// The latched WAL failure the topic is recovering from, if any.
    pub wal_fault: Option<FaultReport>,
    /// Offset ranges the WAL cannot read (damaged bytes it keeps, holes
    /// not yet acknowledged by the broker), oldest first; empty when all
    /// is well.
    pub damaged_ranges: Vec<DamagedRange>,
}

/// Per-topic settings that come from the agent configuration (not from
/// the stored intent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopicPolicy {
    /// Own disk budget, bytes.
    pub disk_budget_bytes: Option<u64>,
    /// What happens when a budget is full.
    pub full_policy: FullPolicy,
    /// Ring capacity for realtime topics, records.
    pub ring_records: u32,
    /// Below which offset sealed segments may be deleted.
    pub retain_until: RetainUntil,
}

#[derive(Debug, Default)]
struct Counters {
    records_in: AtomicU64,
    bytes_in: AtomicU64,
    refused_records: AtomicU64,
    dropped_records: AtomicU64,
    dropped_segments: AtomicU64,
    disk_full_records: AtomicU64,
    wal_reopens: AtomicU64,
}

/// Where a topic's records live: a durable WAL or a realtime in-memory
/// ring.
#[derive(Debug)]
enum TopicLog {
    /// `None` once closed.
    Wal(Mutex<Option<Arc<Wal>>>),
    Ring(RealtimeRing),
}

/// A topic. Shared as `Arc<Topic>`; all methods take `&self`.
pub struct Topic {
    name: TopicName,
    settings: TopicLoadSettings,
    implicit: bool,
    policy: TopicPolicy,
    log: TopicLog,
    budget: ByteBudget,
    agent_budget: Arc<ByteBudget>,
    limits: Limits,
    clock: Arc<dyn Clock>,
    /// Next offset acknowledged by the broker; only grows.
    acknowledged: AtomicU64,
    /// The acknowledged offset changed since the checkpoint was written.
    checkpoint_dirty: AtomicBool,
    /// Archived offset the broker reported; only grows.
    archived: AtomicU64,
    /// The archived offset changed since it was written.
    archived_dirty: AtomicBool,
    counters: Counters,
    dropped_ranges: Mutex<VecDeque<DroppedRange>>,
    /// Serializes `drop_oldest` so concurrent publishers drop one segment
    /// at a time.
    room: tokio::sync::Mutex<()>,
    /// The WAL's reopen state after a latched I/O failure
    /// ([`crate::recovery`]).
    reopener: Mutex<Reopener>,
    /// Held while retention deletes segments and while the WAL is
    /// reopened, so a reopen never sees a segment half deleted.
    maintenance: tokio::sync::Mutex<()>,
    /// Keeps batches identical to a marked publish's out of the range its
    /// marker's settlement searches ([`claims`]).
    claims: claims::ContentClaims,
    /// Turns true once a stream of this topic got its `Welcome` (the log
    /// continues where the broker is).
    resumed: tokio::sync::watch::Sender<bool>,
}

/// Longest wait of a new topic's first publish for its stream's `Welcome`
/// while a broker is connected ([`crate::manager::TopicManager::get_or_create`]).
pub const FIRST_WELCOME_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// Everything [`Topic::open_wal`] and [`Topic::open_ring`] need.
pub(crate) struct TopicParts {
    pub name: TopicName,
    pub settings: TopicLoadSettings,
    pub implicit: bool,
    pub policy: TopicPolicy,
    pub agent_budget: Arc<ByteBudget>,
    pub limits: Limits,
    pub clock: Arc<dyn Clock>,
    pub acknowledged: u64,
    pub archived: u64,
}

impl std::fmt::Debug for Topic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Topic")
            .field("name", &self.name)
            .field("settings", &self.settings)
            .field("policy", &self.policy)
            .field("acknowledged", &self.acknowledged_offset())
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Poisoning means a panic while holding the lock; the guarded values
    // are replaced whole, never left half-updated.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn now_ms(clock: &dyn Clock) -> i64 {
    i64::try_from(clock.now_ms()).unwrap_or(i64::MAX)
}

impl Topic {
    /// A durable topic over an opened WAL; its current size is counted
    /// against the budgets.
    pub(crate) fn open_wal(parts: TopicParts, wal: Wal) -> Topic {
        let used = wal.size_bytes();
        parts.agent_budget.add(used);
        Topic::new(parts, TopicLog::Wal(Mutex::new(Some(Arc::new(wal)))), used)
    }

    /// A realtime topic whose ring starts at `next_offset`.
    pub(crate) fn open_ring(parts: TopicParts, next_offset: u64) -> Topic {
        let ring = RealtimeRing::new(parts.policy.ring_records, next_offset);
        Topic::new(parts, TopicLog::Ring(ring), 0)
    }

    fn new(parts: TopicParts, log: TopicLog, used: u64) -> Topic {
        Topic {
            name: parts.name,
            settings: parts.settings,
            implicit: parts.implicit,
            policy: parts.policy,
            log,
            budget: ByteBudget::new(BudgetScope::Topic, parts.policy.disk_budget_bytes, used),
            agent_budget: parts.agent_budget,
            limits: parts.limits,
            clock: parts.clock,
            acknowledged: AtomicU64::new(parts.acknowledged),
            checkpoint_dirty: AtomicBool::new(false),
            archived: AtomicU64::new(parts.archived),
            archived_dirty: AtomicBool::new(false),
            counters: Counters::default(),
            dropped_ranges: Mutex::new(VecDeque::new()),
            room: tokio::sync::Mutex::new(()),
            reopener: Mutex::new(Reopener::default()),
            maintenance: tokio::sync::Mutex::new(()),
            claims: claims::ContentClaims::default(),
            resumed: tokio::sync::watch::channel(false).0,
        }
    }

    /// The replicator's report: a stream of this topic got its `Welcome`
    /// and resumed (an empty log now continues at the broker's high-water
    /// mark, `replicator::history`).
    pub fn mark_resumed(&self) {
        self.resumed.send_replace(true);
    }

    /// Waits at most `limit` for [`Topic::mark_resumed`] (a new topic's
    /// first publish waits [`FIRST_WELCOME_WAIT`] while a broker is
    /// connected); whether it came.
    pub async fn wait_resumed(&self, limit: std::time::Duration) -> bool {
        let mut resumed = self.resumed.subscribe();
        tokio::time::timeout(limit, resumed.wait_for(|&r| r))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// The topic name.
    pub fn name(&self) -> &TopicName {
        &self.name
    }

    /// The stored settings the topic was opened with (the same the broker
    /// must create the central topic with).
    pub fn settings(&self) -> &TopicLoadSettings {
        &self.settings
    }

    /// Whether the topic was created by a first publish.
    pub fn is_implicit(&self) -> bool {
        self.implicit
    }

    /// Whether the topic lives in memory (realtime intent).
    pub fn is_realtime(&self) -> bool {
        matches!(self.log, TopicLog::Ring(_))
    }

    /// Its configured policy.
    pub fn policy(&self) -> &TopicPolicy {
        &self.policy
    }

    /// Drain order when replicating a backlog, lower first: `audit_log` 0,
    /// `task_queue` 1, `event_stream` and implicit topics 2, `realtime` 3.
    pub fn drain_rank(&self) -> u8 {
        match self.settings.intent.as_ref().map(|s| s.intent) {
            Some(StreamIntent::AuditLog) => 0,
            Some(StreamIntent::TaskQueue) => 1,
            Some(StreamIntent::EventStream) | None => 2,
            Some(StreamIntent::Realtime) => 3,
        }
    }

    /// The WAL handle of a durable topic; `None` for a realtime topic or
    /// after [`Topic::close`]. Read with [`Wal::read`] and wait for new
    /// records with [`Wal::wait_for_offset`]; never append or delete
    /// through it (use [`Topic::publish`] and [`Topic::acknowledge`], which
    /// keep the budget accounts).
    pub fn wal(&self) -> Option<Arc<Wal>> {
        match &self.log {
            TopicLog::Wal(wal) => lock(wal).clone(),
            TopicLog::Ring(_) => None,
        }
    }

    /// The ring of a realtime topic.
    pub fn ring(&self) -> Option<&RealtimeRing> {
        match &self.log {
            TopicLog::Ring(ring) => Some(ring),
            TopicLog::Wal(_) => None,
        }
    }

    /// Offset just past the last durable record (the ring's next offset for
    /// realtime; 0 for a closed WAL).
    pub fn high_water_mark(&self) -> u64 {
        match &self.log {
            TopicLog::Ring(ring) => ring.next_offset(),
            TopicLog::Wal(_) => self.wal().map_or(0, |w| w.high_water_mark()),
        }
    }

    /// Next offset acknowledged by the broker.
    pub fn acknowledged_offset(&self) -> u64 {
        self.acknowledged.load(Ordering::SeqCst)
    }

    /// Runs WAL retention (on the blocking pool) with `safe_offset` and
    /// releases the deleted bytes from the budgets.
    async fn delete_sealed_below(
        &self,
        wal: &Arc<Wal>,
        safe_offset: u64,
    ) -> Result<RetentionReport, WalError> {
        let _maintenance = self.maintenance.lock().await;
        let wal = Arc::clone(wal);
        let now = now_ms(self.clock.as_ref());
        let report = tokio::task::spawn_blocking(move || wal.apply_retention(safe_offset, now))
            .await
            .map_err(|e| WalError::Config(format!("retention task failed: {e}")))??;
        let freed: u64 = report.deleted.iter().map(|&(_, _, bytes)| bytes).sum();
        budget::release(&self.budget, &self.agent_budget, freed);
        Ok(report)
    }

    fn record_drops(&self, report: &RetentionReport) {
        let acknowledged = self.acknowledged_offset();
        for &(start, end, bytes) in &report.deleted {
            let lost = end.saturating_sub(start.max(acknowledged));
            self.counters
                .dropped_records
                .fetch_add(lost, Ordering::Relaxed);
            self.counters
                .dropped_segments
                .fetch_add(1, Ordering::Relaxed);
            warn!(
                topic = %self.name,
                start_offset = start,
                end_offset = end,
                lost_records = lost,
                bytes,
                acknowledged_offset = acknowledged,
                "disk budget full (full_policy = drop_oldest): dropped offsets {start}..{end}, {lost} of them not yet acknowledged by the broker"
            );
            let mut ranges = lock(&self.dropped_ranges);
            if ranges.len() == RECENT_DROPPED_RANGES {
                ranges.pop_front();
            }
            ranges.push_back(DroppedRange {
                start_offset: start,
                end_offset: end,
                lost_records: lost,
                bytes,
            });
        }
    }

    /// Records that the broker durably holds every record below
    /// `next_offset`: raises the checkpoint (written to the local store by
    /// the agent's checkpoint task, batched) and deletes the WAL segments
    /// entirely below [`Topic::safe_offset`] (realtime: releases the ring's records). An offset
    /// below the current checkpoint changes nothing.
    ///
    /// # Errors
    /// [`AckError::BeyondEnd`] past the high-water mark (nothing changes);
    /// [`AckError::Wal`] if retention failed (the checkpoint is raised).
    pub async fn acknowledge(&self, next_offset: u64) -> Result<AckRelease, AckError> {
        let high_water_mark = self.high_water_mark();
        if next_offset > high_water_mark {
            return Err(AckError::BeyondEnd {
                topic: self.name.clone(),
                next_offset,
                high_water_mark,
            });
        }
        let previous = self.acknowledged.fetch_max(next_offset, Ordering::SeqCst);
        if next_offset > previous {
            self.checkpoint_dirty.store(true, Ordering::SeqCst);
        }
        let acknowledged_offset = previous.max(next_offset);
        let mut released = AckRelease {
            acknowledged_offset,
            ..AckRelease::default()
        };
        match &self.log {
            TopicLog::Ring(ring) => {
                released.released_records = ring.release_below(acknowledged_offset)
            }
            TopicLog::Wal(_) => {
                if let Some(wal) = self.wal() {
                    let report = self
                        .delete_sealed_below(&wal, self.safe_offset())
                        .await
                        .map_err(|source| AckError::Wal {
                            topic: self.name.clone(),
                            source,
                        })?;
                    for &(start, end, bytes) in &report.deleted {
                        debug!(topic = %self.name, start, end, bytes, "deleted an acknowledged segment");
                    }
                    released.deleted_segments = report.deleted;
                    self.release_safe_active_segment(&wal)
                        .await
                        .map_err(|source| AckError::Wal {
                            topic: self.name.clone(),
                            source,
                        })?;
                }
            }
        }
        Ok(released)
    }

    /// The acknowledged offset if it changed since the last call (for the
    /// checkpoint writer); clears the flag.
    pub(crate) fn take_dirty_checkpoint(&self) -> Option<u64> {
        self.checkpoint_dirty
            .swap(false, Ordering::SeqCst)
            .then(|| self.acknowledged_offset())
    }

    /// Marks the checkpoint as not yet written (a failed write).
    pub(crate) fn mark_checkpoint_dirty(&self) {
        self.checkpoint_dirty.store(true, Ordering::SeqCst);
    }

    /// Counters and state now.
    pub fn stats(&self) -> TopicStats {
        let acknowledged = self.acknowledged_offset();
        let intent = self.settings.intent.as_ref();
        let persistence = intent.map_or(Persistence::Wal, |s| s.persistence);
        let mut stats = TopicStats {
            name: self.name.clone(),
            intent: intent.map(|s| s.intent),
            delivery: self.settings.delivery.as_str(),
            wal_sync_mode: self.settings.wal_sync_mode.as_str(),
            persistence: persistence.as_str(),
            implicit: self.implicit,
            high_water_mark: 0,
            log_start_offset: 0,
            acknowledged_offset: acknowledged,
            archived_offset: self.archived_offset(),
            retain_until: self.policy.retain_until.as_str(),
            backlog_records: 0,
            backlog_bytes: 0,
            wal_bytes: 0,
            disk_used_bytes: self.budget.used_bytes(),
            disk_budget_bytes: None,
            full_policy: None,
            ring_capacity_records: None,
            records_in: self.counters.records_in.load(Ordering::Relaxed),
            bytes_in: self.counters.bytes_in.load(Ordering::Relaxed),
            refused_records: self.counters.refused_records.load(Ordering::Relaxed),
            dropped_records: self.counters.dropped_records.load(Ordering::Relaxed),
            dropped_segments: self.counters.dropped_segments.load(Ordering::Relaxed),
            recent_dropped_ranges: lock(&self.dropped_ranges).iter().copied().collect(),
            disk_full_records: self.counters.disk_full_records.load(Ordering::Relaxed),
            wal_reopens: self.counters.wal_reopens.load(Ordering::Relaxed),
            wal_fault: self.fault(),
            damaged_ranges: Vec::new(),
        };
        match &self.log {
            TopicLog::Ring(ring) => {
                let r = ring.stats();
                stats.high_water_mark = r.next_offset;
                stats.log_start_offset = r.first_offset;
                stats.backlog_records = r.len_records;
                stats.backlog_bytes = r.len_bytes;
                stats.ring_capacity_records = Some(r.capacity_records);
                stats.dropped_records += r.dropped_records;
                stats.disk_used_bytes = 0;
            }
            TopicLog::Wal(_) => {
                stats.disk_budget_bytes = self.policy.disk_budget_bytes;
                stats.full_policy = Some(self.policy.full_policy);
                if let Some(wal) = self.wal() {
                    let hwm = wal.high_water_mark();
                    let log_start = wal.log_start_offset();
                    let size = wal.size_bytes();
                    let sealed = wal.sealed_segments();
                    let sealed_bytes: u64 = sealed.iter().map(|s| s.bytes).sum();
                    let unacked_sealed: u64 = sealed
                        .iter()
                        .filter(|s| s.next_offset > acknowledged)
                        .map(|s| s.bytes)
                        .sum();
                    let active_bytes = size.saturating_sub(sealed_bytes);
                    stats.high_water_mark = hwm;
                    stats.log_start_offset = log_start;
                    stats.backlog_records = hwm.saturating_sub(acknowledged.max(log_start));
                    stats.backlog_bytes =
                        unacked_sealed + if hwm > acknowledged { active_bytes } else { 0 };
                    stats.wal_bytes = size;
                    // A hole the broker already acknowledged past holds
                    // nothing to act on here: the broker has what those
                    // offsets hold (a new device's log continuing at the
                    // broker's high-water mark, records lost locally after
                    // replication) or recorded the hole itself. Damaged
                    // bytes stay listed.
                    stats.damaged_ranges = wal
                        .damaged_ranges()
                        .iter()
                        .filter(|r| {
                            !(matches!(r.kind, UnreadableKind::Hole)
                                && r.end_offset <= acknowledged)
                        })
                        .map(DamagedRange::from)
                        .collect();
                }
            }
        }
        stats
    }

    /// Closes the WAL (flushes and syncs it) or, for a realtime topic, does
    /// nothing; later publishes fail with [`PublishError::Closed`]. If
    /// another holder of the WAL handle does not let go within
    /// [`CLOSE_WAIT`], the last holder's drop flushes it instead.
    ///
    /// # Errors
    /// [`WalError`] from the final flush.
    pub async fn close(&self) -> Result<(), WalError> {
        let TopicLog::Wal(slot) = &self.log else {
            return Ok(());
        };
        let Some(mut wal) = lock(slot).take() else {
            return Ok(());
        };
        let deadline = tokio::time::Instant::now() + CLOSE_WAIT;
        loop {
            match Arc::try_unwrap(wal) {
                Ok(wal) => {
                    return match wal.close().await {
                        Ok(()) => {
                            info!(topic = %self.name, "WAL closed");
                            Ok(())
                        }
                        Err(e) if self.fault().is_some() || e.is_disk_full() => {
                            // Everything acknowledged was durable before
                            // the failure; the next start's recovery
                            // truncates what the failed write left.
                            warn!(topic = %self.name, error = %e, "WAL closed after a latched I/O failure; recovery at the next start decides what is on disk");
                            Ok(())
                        }
                        Err(e) => Err(e),
                    };
                }
                Err(shared) if tokio::time::Instant::now() < deadline => {
                    wal = shared;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(_) => {
                    warn!(topic = %self.name, "WAL handle still held elsewhere; its last holder flushes it on drop");
                    return Ok(());
                }
            }
        }
    }
}
