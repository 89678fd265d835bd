//! Controlled recovery of a topic's WAL after a latched I/O failure: the
//! I/O-free state machine ([`Reopener`]) that decides when to reopen, and
//! the rule ([`should_seal`]) that decides when a reopened WAL's active
//! segment is sealed so that retention can free it.
//!
//! The WAL is fail-stop: after a failed `write` or `fdatasync` every call
//! returns `PreviousIo` until it is reopened (retrying an `fdatasync` could
//! report success for lost data). The topic layer therefore never retries
//! on the failed handle; it drops it and opens the WAL again on the same
//! directory, and recovery decides what is on disk (a partial write at the
//! end is truncated; everything below the high-water mark was durable and
//! stays). Reopening is retried with backon's exponential backoff
//! ([`MIN_REOPEN_DELAY`] doubling to [`MAX_REOPEN_DELAY`], never giving up).
//! While a topic is faulted its publishes are refused at once (HTTP 507
//! `disk_full` for a full disk) and replication keeps reading what is
//! stored.

use std::time::{Duration, Instant};

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};
use serde::Serialize;

/// First delay before reopening a failed WAL.
pub const MIN_REOPEN_DELAY: Duration = Duration::from_millis(200);
/// Longest delay between reopen attempts.
pub const MAX_REOPEN_DELAY: Duration = Duration::from_secs(10);
/// A reopened WAL that worked this long without a new failure starts the
/// backoff small again at its next failure.
pub const HEALTHY_AFTER: Duration = Duration::from_secs(60);

/// What kind of failure latched the WAL.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    /// The file system is full or the disk quota exhausted (`ENOSPC`,
    /// `EDQUOT`).
    DiskFull,
    /// Any other I/O failure.
    Io,
}

impl FaultKind {
    /// `disk_full` or `io_error`.
    pub fn as_str(self) -> &'static str {
        match self {
            FaultKind::DiskFull => "disk_full",
            FaultKind::Io => "io_error",
        }
    }
}

/// A latched WAL failure as `/health` and the topics API show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FaultReport {
    /// `disk_full` or `io_error`.
    pub state: FaultKind,
    /// The WAL directory of the topic.
    pub path: String,
    /// The failure, as the WAL reported it.
    pub error: String,
    /// Reopen attempts that failed since the fault began.
    pub failed_reopens: u64,
}

#[derive(Debug, Clone)]
struct Fault {
    kind: FaultKind,
    path: String,
    error: String,
    failed_reopens: u64,
    next_attempt: Instant,
}

fn new_backoff() -> ExponentialBackoff {
    ExponentialBuilder::default()
        .with_min_delay(MIN_REOPEN_DELAY)
        .with_max_delay(MAX_REOPEN_DELAY)
        .without_max_times()
        .build()
}

/// The reopen state of one topic's WAL. Pure: every method takes `now`.
pub struct Reopener {
    fault: Option<Fault>,
    backoff: ExponentialBackoff,
    /// When the last reopen succeeded.
    reopened_at: Option<Instant>,
}

impl std::fmt::Debug for Reopener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reopener")
            .field("fault", &self.fault)
            .field("reopened_at", &self.reopened_at)
            .finish_non_exhaustive()
    }
}

impl Default for Reopener {
    fn default() -> Reopener {
        Reopener {
            fault: None,
            backoff: new_backoff(),
            reopened_at: None,
        }
    }
}

impl Reopener {
    /// The WAL reported a latched failure at `now`. Returns `true` if this
    /// starts a fault (the caller logs it), `false` if the topic is already
    /// faulted (the first failure is kept).
    pub fn failed(&mut self, now: Instant, kind: FaultKind, path: &str, error: &str) -> bool {
        if self.fault.is_some() {
            return false;
        }
        if self
            .reopened_at
            .is_some_and(|at| now.saturating_duration_since(at) >= HEALTHY_AFTER)
        {
            self.backoff = new_backoff();
        }
        let delay = self.next_delay();
        self.fault = Some(Fault {
            kind,
            path: path.to_owned(),
            error: error.to_owned(),
            failed_reopens: 0,
            next_attempt: now + delay,
        });
        true
    }

    fn next_delay(&mut self) -> Duration {
        self.backoff.next().unwrap_or(MAX_REOPEN_DELAY)
    }

    /// The fault's kind, if the topic is faulted.
    pub fn fault_kind(&self) -> Option<FaultKind> {
        self.fault.as_ref().map(|f| f.kind)
    }

    /// The fault as shown to operators.
    pub fn report(&self) -> Option<FaultReport> {
        self.fault.as_ref().map(|f| FaultReport {
            state: f.kind,
            path: f.path.clone(),
            error: f.error.clone(),
            failed_reopens: f.failed_reopens,
        })
    }

    /// Whether a reopen attempt is due at `now`.
    pub fn due(&self, now: Instant) -> bool {
        self.fault.as_ref().is_some_and(|f| now >= f.next_attempt)
    }

    /// When the next attempt is due (`None`: not faulted).
    pub fn next_attempt(&self) -> Option<Instant> {
        self.fault.as_ref().map(|f| f.next_attempt)
    }

    /// A reopen attempt failed at `now` (`kind` and `error` of that
    /// failure, which replace the shown ones); schedules the next one.
    pub fn attempt_failed(&mut self, now: Instant, kind: FaultKind, error: &str) {
        let delay = self.next_delay();
        if let Some(fault) = &mut self.fault {
            fault.kind = kind;
            fault.error = error.to_owned();
            fault.failed_reopens += 1;
            fault.next_attempt = now + delay;
        }
    }

    /// The WAL was reopened at `now` and accepts appends again: the fault
    /// ends. The backoff keeps growing until the WAL stayed healthy for
    /// [`HEALTHY_AFTER`], so a disk that fills again at once is not
    /// retried at the shortest delay forever.
    pub fn reopened(&mut self, now: Instant) {
        self.fault = None;
        self.reopened_at = Some(now);
    }
}

/// Whether a reopened WAL's active segment should be sealed now: the
/// failure was a full disk and the broker acknowledged records of the
/// active segment (`acknowledged` > `active_base`, the active segment's
/// first offset), so once sealed, retention deletes it (entirely, when the
/// broker acknowledged all of it) and gives the space back. Retention
/// never deletes the active segment, so a topic holding only its active
/// segment could otherwise never free space.
pub fn should_seal(
    kind: FaultKind,
    active_base: u64,
    active_bytes: u64,
    acknowledged: u64,
) -> bool {
    kind == FaultKind::DiskFull && active_bytes > 0 && acknowledged > active_base
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIR: &str = "/data/topics/e1/t";

    #[test]
    fn a_fault_is_retried_with_a_growing_capped_delay_and_keeps_the_first_error() {
        let t0 = Instant::now();
        let mut r = Reopener::default();
        assert!(!r.due(t0));
        assert!(r.failed(t0, FaultKind::DiskFull, DIR, "write: No space left"));
        assert!(!r.failed(t0, FaultKind::Io, DIR, "later"));
        let report = r.report().unwrap();
        assert_eq!(report.state, FaultKind::DiskFull);
        assert_eq!(report.error, "write: No space left");
        assert_eq!(report.path, DIR);
        let first = r.next_attempt().unwrap() - t0;
        assert_eq!(first.as_millis(), MIN_REOPEN_DELAY.as_millis());
        assert!(!r.due(t0 + first - Duration::from_millis(1)));
        assert!(r.due(t0 + first));
        let mut now = t0 + first;
        let mut delays = Vec::new();
        for _ in 0..10 {
            r.attempt_failed(now, FaultKind::DiskFull, "open: No space left");
            let delay = r.next_attempt().unwrap() - now;
            delays.push(delay);
            now += delay;
        }
        // backon multiplies in f32: compare whole milliseconds.
        let ms: Vec<u128> = delays.iter().map(Duration::as_millis).collect();
        assert_eq!(ms[..3], [400, 800, 1600]);
        assert!(ms.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(*ms.last().unwrap(), MAX_REOPEN_DELAY.as_millis());
        assert_eq!(r.report().unwrap().failed_reopens, 10);
        assert_eq!(r.report().unwrap().error, "open: No space left");
    }

    #[test]
    fn a_reopen_ends_the_fault_and_the_backoff_restarts_only_after_a_healthy_period() {
        let t0 = Instant::now();
        let mut r = Reopener::default();
        r.failed(t0, FaultKind::DiskFull, DIR, "full");
        r.attempt_failed(t0, FaultKind::DiskFull, "full");
        r.reopened(t0 + Duration::from_secs(1));
        assert_eq!(r.fault_kind(), None);
        assert!(r.report().is_none());
        assert!(!r.due(t0 + Duration::from_secs(100)));
        // Full again at once: the backoff goes on where it was.
        let t1 = t0 + Duration::from_secs(2);
        assert!(r.failed(t1, FaultKind::DiskFull, DIR, "full"));
        assert_eq!((r.next_attempt().unwrap() - t1).as_millis(), 800);
        r.reopened(t1);
        // Full again after a healthy period: small again.
        let t2 = t1 + HEALTHY_AFTER;
        assert!(r.failed(t2, FaultKind::Io, DIR, "EIO"));
        assert_eq!((r.next_attempt().unwrap() - t2).as_millis(), 200);
        assert_eq!(r.fault_kind(), Some(FaultKind::Io));
    }

    #[test]
    fn only_a_full_disk_with_acknowledged_records_in_the_active_segment_seals_it() {
        assert!(should_seal(FaultKind::DiskFull, 100, 4096, 101));
        assert!(should_seal(FaultKind::DiskFull, 0, 4096, 5000));
        // Nothing of the active segment acknowledged: sealing frees nothing.
        assert!(!should_seal(FaultKind::DiskFull, 100, 4096, 100));
        assert!(!should_seal(FaultKind::DiskFull, 100, 4096, 0));
        // Empty active segment: nothing to seal.
        assert!(!should_seal(FaultKind::DiskFull, 100, 0, 200));
        // Another I/O failure: space is not the problem.
        assert!(!should_seal(FaultKind::Io, 100, 4096, 200));
    }
}
