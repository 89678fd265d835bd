//! Disk budgets: byte counters with an optional limit, reserved before an
//! append so the limit is never passed.
//!
//! # Accounting
//! A durable topic's counter holds the bytes of its WAL segment files
//! ([`broker_core::wal::Wal::size_bytes`] at open) plus every batch
//! reserved since (appended or being appended) minus every segment deleted
//! since (acknowledged retention or `drop_oldest`). Segment files hold
//! record batches back to back, so once the appends in flight are written
//! the counter equals `size_bytes` exactly. The agent counter is the sum of
//! the topic counters.
//!
//! # Overshoot
//! A batch is reserved against both counters *before* it is appended
//! ([`reserve`]): `used + batch ≤ limit` or nothing is written. Concurrent
//! publishers reserve atomically, so the WAL bytes never pass a limit: the
//! overshoot on WAL bytes is 0. Seal index files (`.index`, 56 bytes plus
//! 8 bytes per 4 KiB of segment, about 0.2 %) are not counted.
//!
//! # Segment size of budgeted topics
//! `drop_oldest` frees space one sealed segment at a time, so a budgeted
//! topic's segments are at most 1 % of its budget
//! ([`segment_max_bytes_for`]), but never smaller than `max_batch_bytes`
//! (the WAL requires a batch to fit a segment): with a budget below
//! 100 × `max_batch_bytes` a step frees one batch-sized segment, more than
//! 1 %.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

/// Most a budgeted topic's segment may be, as a divisor of the budget:
/// `budget / 100` = 1 %.
pub const SEGMENT_BUDGET_DIVISOR: u64 = 100;

/// What a durable topic does when its disk budget (or the agent's) has no
/// room for a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FullPolicy {
    /// Refuse the batch with [`crate::topic::PublishError::Full`] (HTTP
    /// 507); nothing stored is lost. The default.
    #[default]
    Refuse,
    /// Delete the oldest sealed segments of the topic, acknowledged by the
    /// broker or not, until the batch fits; every dropped range is counted
    /// and logged.
    DropOldest,
}

impl FullPolicy {
    /// The configuration name: `refuse` or `drop_oldest`.
    pub fn as_str(self) -> &'static str {
        match self {
            FullPolicy::Refuse => "refuse",
            FullPolicy::DropOldest => "drop_oldest",
        }
    }
}

impl fmt::Display for FullPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which budget refused a reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BudgetScope {
    /// The topic's own `disk_budget_bytes`.
    Topic,
    /// The agent-wide `disk_budget_bytes`.
    Agent,
}

impl BudgetScope {
    /// The configuration field that sets the limit.
    pub fn field(self) -> &'static str {
        match self {
            BudgetScope::Topic => "topics[].disk_budget_bytes",
            BudgetScope::Agent => "disk_budget_bytes",
        }
    }
}

/// A reservation that did not fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "{} of {limit_bytes} bytes exhausted: {used_bytes} bytes used, a batch of {requested_bytes} bytes does not fit",
    scope.field()
)]
pub struct BudgetExceeded {
    /// Which budget.
    pub scope: BudgetScope,
    /// Its limit, bytes.
    pub limit_bytes: u64,
    /// Bytes counted against it when the reservation was tried.
    pub used_bytes: u64,
    /// Bytes asked for.
    pub requested_bytes: u64,
}

/// A byte counter with an optional limit. Lock-free; all methods take
/// `&self`.
#[derive(Debug)]
pub struct ByteBudget {
    scope: BudgetScope,
    limit_bytes: Option<u64>,
    used_bytes: AtomicU64,
}

impl ByteBudget {
    /// A counter at `used_bytes` with `limit_bytes` (`None`: unlimited).
    pub fn new(scope: BudgetScope, limit_bytes: Option<u64>, used_bytes: u64) -> ByteBudget {
        ByteBudget {
            scope,
            limit_bytes,
            used_bytes: AtomicU64::new(used_bytes),
        }
    }

    /// The limit, bytes; `None` when unlimited.
    pub fn limit_bytes(&self) -> Option<u64> {
        self.limit_bytes
    }

    /// Bytes counted now.
    pub fn used_bytes(&self) -> u64 {
        self.used_bytes.load(Ordering::SeqCst)
    }

    /// Adds `bytes` if the total stays within the limit.
    ///
    /// # Errors
    /// [`BudgetExceeded`] with the count seen; nothing is added.
    pub fn try_reserve(&self, bytes: u64) -> Result<(), BudgetExceeded> {
        let limit = self.limit_bytes;
        self.used_bytes
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |used| {
                let total = used.checked_add(bytes)?;
                match limit {
                    Some(limit) if total > limit => None,
                    _ => Some(total),
                }
            })
            .map(drop)
            .map_err(|used_bytes| BudgetExceeded {
                scope: self.scope,
                limit_bytes: limit.unwrap_or(u64::MAX),
                used_bytes,
                requested_bytes: bytes,
            })
    }

    /// Adds `bytes` regardless of the limit (bytes found on disk at open).
    pub fn add(&self, bytes: u64) {
        let _ = self
            .used_bytes
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |used| {
                Some(used.saturating_add(bytes))
            });
    }

    /// Subtracts `bytes` (a failed append, a deleted segment); saturates at 0.
    pub fn release(&self, bytes: u64) {
        let _ = self
            .used_bytes
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |used| {
                Some(used.saturating_sub(bytes))
            });
    }
}

/// Reserves `bytes` against the topic's budget, then the agent's; if the
/// agent refuses, the topic reservation is undone. Either both counters grow
/// by `bytes` or neither does.
///
/// # Errors
/// [`BudgetExceeded`] of the budget that refused.
pub fn reserve(topic: &ByteBudget, agent: &ByteBudget, bytes: u64) -> Result<(), BudgetExceeded> {
    topic.try_reserve(bytes)?;
    if let Err(e) = agent.try_reserve(bytes) {
        topic.release(bytes);
        return Err(e);
    }
    Ok(())
}

/// Whether `bytes` could be reserved once the topic held nothing: the most
/// that dropping every segment of the topic (`drop_oldest`) could free.
/// False when the batch is over the topic's limit, or when the agent's
/// other topics leave less than `bytes` of the agent's limit.
pub fn fits_without_topic(topic: &ByteBudget, agent: &ByteBudget, bytes: u64) -> bool {
    let within =
        |limit: Option<u64>, used: u64| limit.is_none_or(|l| used.saturating_add(bytes) <= l);
    let others = agent.used_bytes().saturating_sub(topic.used_bytes());
    within(topic.limit_bytes, 0) && within(agent.limit_bytes, others)
}

/// Releases `bytes` from both counters.
pub fn release(topic: &ByteBudget, agent: &ByteBudget, bytes: u64) {
    topic.release(bytes);
    agent.release(bytes);
}

/// `segment_max_bytes` of a topic whose tightest budget is `budget_bytes`:
/// 1 % of it, at least `max_batch_bytes` (a batch must fit a segment) and at
/// most `default_bytes` (the unbudgeted segment size). Without a budget,
/// `default_bytes`.
pub fn segment_max_bytes_for(
    budget_bytes: Option<u64>,
    max_batch_bytes: u32,
    default_bytes: u64,
) -> u64 {
    let floor = u64::from(max_batch_bytes);
    match budget_bytes {
        None => default_bytes.max(floor),
        Some(budget) => (budget / SEGMENT_BUDGET_DIVISOR)
            .min(default_bytes)
            .max(floor),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn reserve_fits_exactly_up_to_the_limit() {
        let b = ByteBudget::new(BudgetScope::Topic, Some(100), 0);
        assert_eq!(b.try_reserve(60), Ok(()));
        assert_eq!(b.try_reserve(40), Ok(()));
        assert_eq!(b.used_bytes(), 100);
        assert_eq!(
            b.try_reserve(1),
            Err(BudgetExceeded {
                scope: BudgetScope::Topic,
                limit_bytes: 100,
                used_bytes: 100,
                requested_bytes: 1,
            })
        );
        b.release(30);
        assert_eq!(b.used_bytes(), 70);
        b.release(1000);
        assert_eq!(b.used_bytes(), 0);
    }

    #[test]
    fn unlimited_budget_counts_but_never_refuses() {
        let b = ByteBudget::new(BudgetScope::Agent, None, 5);
        assert_eq!(b.try_reserve(u64::MAX - 5), Ok(()));
        assert_eq!(b.used_bytes(), u64::MAX);
        // Overflow is refused rather than wrapped.
        assert_eq!(b.try_reserve(1).map_err(|e| e.used_bytes), Err(u64::MAX));
    }

    #[test]
    fn agent_refusal_undoes_the_topic_reservation() {
        let topic = ByteBudget::new(BudgetScope::Topic, Some(1000), 0);
        let agent = ByteBudget::new(BudgetScope::Agent, Some(500), 450);
        let err = reserve(&topic, &agent, 100).unwrap_err();
        assert_eq!(err.scope, BudgetScope::Agent);
        assert_eq!(err.limit_bytes, 500);
        assert_eq!(err.used_bytes, 450);
        assert_eq!(topic.used_bytes(), 0);
        assert_eq!(agent.used_bytes(), 450);
        assert_eq!(reserve(&topic, &agent, 50), Ok(()));
        assert_eq!((topic.used_bytes(), agent.used_bytes()), (50, 500));
        release(&topic, &agent, 50);
        assert_eq!((topic.used_bytes(), agent.used_bytes()), (0, 450));
    }

    #[test]
    fn concurrent_reservations_never_pass_the_limit() {
        let b = Arc::new(ByteBudget::new(BudgetScope::Topic, Some(10_000), 0));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let b = b.clone();
                std::thread::spawn(move || (0..1000).filter(|_| b.try_reserve(7).is_ok()).count())
            })
            .collect();
        let granted: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert_eq!(granted, 10_000 / 7);
        assert_eq!(b.used_bytes(), (10_000 / 7) * 7);
    }

    #[test]
    fn segment_size_is_one_percent_within_bounds() {
        let mib = 1024 * 1024;
        assert_eq!(segment_max_bytes_for(None, 8 * 1024, 64 * mib), 64 * mib);
        assert_eq!(
            segment_max_bytes_for(Some(1000 * mib), 8 * 1024, 64 * mib),
            10 * mib
        );
        // Capped at the default.
        assert_eq!(
            segment_max_bytes_for(Some(100_000 * mib), 8 * 1024, 64 * mib),
            64 * mib
        );
        // Never below max_batch_bytes.
        assert_eq!(segment_max_bytes_for(Some(mib), 65_536, 64 * mib), 65_536);
        assert_eq!(
            segment_max_bytes_for(Some(1_000_000), 4096, 64 * mib),
            10_000
        );
    }

    #[test]
    fn full_policy_names() {
        assert_eq!(FullPolicy::default(), FullPolicy::Refuse);
        assert_eq!(FullPolicy::DropOldest.to_string(), "drop_oldest");
        assert_eq!(
            serde_json::from_str::<FullPolicy>("\"drop_oldest\"").unwrap(),
            FullPolicy::DropOldest
        );
        let err = serde_json::from_str::<FullPolicy>("\"drop\"").unwrap_err();
        assert!(
            err.to_string()
                .contains("unknown variant `drop`, expected `refuse` or `drop_oldest`"),
            "{err}"
        );
    }
}
