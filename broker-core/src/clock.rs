//! Time, injected: the [`Clock`] trait every timing rule outside the pure
//! crate reads (metadata TTLs, the WAL's group-commit window and segment
//! age, consumer leases and session lifetimes), the real [`SystemClock`],
//! and a [`ManualClock`] that tests move by hand.
//!
//! Two readings, as in the standard library: [`Clock::now`] is monotonic
//! (durations, deadlines), [`Clock::now_ms`] is wall-clock milliseconds
//! since the Unix epoch (timestamps, TTLs that survive a restart).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A source of time.
pub trait Clock: Send + Sync + fmt::Debug {
    /// Wall-clock milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;

    /// Monotonic now, for durations and deadlines.
    fn now(&self) -> Instant;
}

/// Wall-clock now, milliseconds since the Unix epoch, as the `i64` that
/// record timestamps and descriptors use: 0 before 1970, `i64::MAX` past
/// its range. Code with a [`Clock`] reads time through it instead.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// The system clock; the one place outside tests that reads real time.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        // A clock before 1970 reads as 0: keys with a TTL then live longer,
        // never shorter.
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }

    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// A clock that moves only when told to. Both readings move together:
/// [`ManualClock::advance`] by `ms` adds `ms` to [`Clock::now_ms`] and
/// `ms` milliseconds to [`Clock::now`].
#[derive(Debug)]
pub struct ManualClock {
    now_ms: AtomicU64,
    origin: Instant,
    elapsed_ms: AtomicU64,
}

impl Default for ManualClock {
    fn default() -> ManualClock {
        ManualClock::new(0)
    }
}

impl ManualClock {
    /// A clock reading `now_ms` (ms since the Unix epoch); its monotonic
    /// reading starts at the real instant of the call.
    pub fn new(now_ms: u64) -> ManualClock {
        ManualClock {
            now_ms: AtomicU64::new(now_ms),
            origin: Instant::now(),
            elapsed_ms: AtomicU64::new(0),
        }
    }

    /// Sets the wall-clock time, ms since the Unix epoch (the monotonic
    /// reading does not move: it never goes back).
    pub fn set(&self, now_ms: u64) {
        self.now_ms.store(now_ms, Ordering::SeqCst);
    }

    /// Moves both readings forward by `ms` (saturating).
    pub fn advance(&self, ms: u64) {
        for counter in [&self.now_ms, &self.elapsed_ms] {
            let _ = counter.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |now| {
                Some(now.saturating_add(ms))
            });
        }
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.now_ms.load(Ordering::SeqCst)
    }

    fn now(&self) -> Instant {
        self.origin + Duration::from_millis(self.elapsed_ms.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_both_readings_only_when_told() {
        let clock = ManualClock::new(1_000);
        let start = clock.now();
        assert_eq!(clock.now_ms(), 1_000);
        assert_eq!(clock.now(), start);
        clock.advance(250);
        assert_eq!(clock.now_ms(), 1_250);
        assert_eq!(clock.now() - start, Duration::from_millis(250));
        clock.set(5);
        assert_eq!(clock.now_ms(), 5);
        assert_eq!(clock.now() - start, Duration::from_millis(250));
    }
}
