//! Group commit and segment-age decisions, as pure functions of the pending
//! state and `now` (no clocks, no I/O), so they are unit-tested without sleeps.

use std::time::{Duration, Instant};

/// What the writer should do next with the appends waiting in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum FlushDecision {
    /// Nothing is pending.
    Idle,
    /// Write (and sync, per mode) everything pending now, as one group.
    FlushNow,
    /// Wait for more appends to join the group, at most until this instant.
    WaitUntil(Instant),
}

/// Group-commit policy: appends that arrive while a flush is in progress, or
/// within `flush_interval` of the first pending append, share one write and
/// one `fdatasync`; a group is flushed at once when it reaches
/// `flush_max_batch_bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupCommit {
    /// Longest an append waits for others to join its group.
    pub flush_interval: Duration,
    /// Group size that triggers a flush without waiting, bytes.
    pub flush_max_batch_bytes: usize,
}

impl GroupCommit {
    /// Decides for `pending_bytes` waiting since `oldest_pending_at`.
    pub fn decide(
        &self,
        pending_bytes: usize,
        oldest_pending_at: Option<Instant>,
        now: Instant,
    ) -> FlushDecision {
        let Some(oldest) = oldest_pending_at else {
            return FlushDecision::Idle;
        };
        if pending_bytes == 0 {
            return FlushDecision::Idle;
        }
        if pending_bytes >= self.flush_max_batch_bytes {
            return FlushDecision::FlushNow;
        }
        let deadline = oldest + self.flush_interval;
        if now >= deadline {
            FlushDecision::FlushNow
        } else {
            FlushDecision::WaitUntil(deadline)
        }
    }
}

/// When the active segment must roll because of its age: `None` if it is
/// empty or no age limit is set, otherwise the instant it becomes due.
pub fn age_roll_due(
    segment_max_age: Option<Duration>,
    first_write_at: Option<Instant>,
) -> Option<Instant> {
    Some(first_write_at? + segment_max_age?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(ms: u64, bytes: usize) -> GroupCommit {
        GroupCommit {
            flush_interval: Duration::from_millis(ms),
            flush_max_batch_bytes: bytes,
        }
    }

    #[test]
    fn nothing_pending_is_idle() {
        let now = Instant::now();
        assert_eq!(policy(5, 100).decide(0, None, now), FlushDecision::Idle);
        assert_eq!(
            policy(5, 100).decide(0, Some(now), now),
            FlushDecision::Idle
        );
    }

    #[test]
    fn zero_interval_flushes_as_soon_as_the_writer_is_free() {
        let now = Instant::now();
        assert_eq!(
            policy(0, 100).decide(1, Some(now), now),
            FlushDecision::FlushNow
        );
    }

    #[test]
    fn appends_within_the_interval_wait_for_the_group() {
        let t0 = Instant::now();
        let p = policy(5, 1000);
        let deadline = t0 + Duration::from_millis(5);
        // A second append 2 ms later joins the same group: same deadline.
        assert_eq!(
            p.decide(10, Some(t0), t0),
            FlushDecision::WaitUntil(deadline)
        );
        assert_eq!(
            p.decide(20, Some(t0), t0 + Duration::from_millis(2)),
            FlushDecision::WaitUntil(deadline)
        );
        assert_eq!(p.decide(20, Some(t0), deadline), FlushDecision::FlushNow);
    }

    #[test]
    fn a_full_group_flushes_without_waiting() {
        let t0 = Instant::now();
        let p = policy(1000, 64);
        assert_eq!(
            p.decide(63, Some(t0), t0),
            FlushDecision::WaitUntil(t0 + Duration::from_secs(1))
        );
        assert_eq!(p.decide(64, Some(t0), t0), FlushDecision::FlushNow);
    }

    #[test]
    fn age_roll_needs_a_write_and_a_limit() {
        let t0 = Instant::now();
        let hour = Duration::from_secs(3600);
        assert_eq!(age_roll_due(None, Some(t0)), None);
        assert_eq!(age_roll_due(Some(hour), None), None);
        assert_eq!(age_roll_due(Some(hour), Some(t0)), Some(t0 + hour));
    }
}
