//! Pacing under the bandwidth cap: a token bucket shared by every topic
//! stream of the replicator, I/O-free (each reservation is given its
//! `now`).

use std::time::Duration;

use tokio::time::Instant;

/// A token bucket shared by all streams: `rate` bytes per second, bursts up
/// to one second's worth. A stream reserves the bytes of a frame and then
/// waits the time the bucket names, while it goes on reading
/// acknowledgements.
pub struct Pacer {
    rate: u64,
    /// Tokens (negative: owed by reservations still waiting) and when they
    /// were counted.
    state: std::sync::Mutex<(f64, Instant)>,
}

impl Pacer {
    /// A full bucket at `now`.
    pub fn new(rate: u64, now: Instant) -> Pacer {
        Pacer {
            rate,
            state: std::sync::Mutex::new((rate as f64, now)),
        }
    }

    /// Takes `bytes` tokens at `now` and returns how long to wait before
    /// sending them (zero when the bucket held them). Reservations queue:
    /// each one waits for the tokens of those before it.
    pub fn reserve(&self, bytes: usize, now: Instant) -> Duration {
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (tokens, last) = *state;
        let rate = self.rate as f64;
        let refill = now.saturating_duration_since(last).as_secs_f64() * rate;
        let tokens = (tokens + refill).min(rate) - bytes as f64;
        *state = (tokens, now.max(last));
        if tokens < 0.0 {
            Duration::from_secs_f64(-tokens / rate)
        } else {
            Duration::ZERO
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pacer_names_the_wait_and_queues_reservations_behind_each_other() {
        let t0 = Instant::now();
        let pacer = Pacer::new(1000, t0);
        // A full bucket: one second's worth goes at once.
        assert_eq!(pacer.reserve(400, t0), Duration::ZERO);
        assert_eq!(pacer.reserve(600, t0), Duration::ZERO);
        // Empty: 500 bytes wait half a second, the next 1000 wait for them.
        assert_eq!(pacer.reserve(500, t0), Duration::from_millis(500));
        assert_eq!(pacer.reserve(1000, t0), Duration::from_millis(1500));
        // 2.5 s later the debt is paid and the bucket refilled by 1000.
        let later = t0 + Duration::from_millis(2500);
        assert_eq!(pacer.reserve(1000, later), Duration::ZERO);
        assert_eq!(pacer.reserve(1, later), Duration::from_millis(1));
    }

    #[test]
    fn an_idle_pacer_never_holds_more_than_one_second_of_tokens() {
        let t0 = Instant::now();
        let pacer = Pacer::new(1000, t0);
        let later = t0 + Duration::from_secs(3600);
        assert_eq!(pacer.reserve(1000, later), Duration::ZERO);
        assert_eq!(pacer.reserve(100, later), Duration::from_millis(100));
    }
}
