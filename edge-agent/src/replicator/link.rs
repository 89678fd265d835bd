//! The replication link as an I/O-free state machine: which broker the
//! next connection attempt dials, how long to back off after an attempt
//! ended, when a connection counts as having worked (and resets the
//! backoff), which failures are worth a warning, and which ended topic
//! streams need an operator. The tokio shell ([`super::run`]) does the
//! connecting and sleeping; this module only decides, from the `now` it is
//! given.
//!
//! - Brokers are tried in the configured order, one attempt each, round
//!   robin.
//! - Backoff: 100 ms after the first failure, doubling up to `max_backoff`
//!   (30 s by default), each delay plus a random jitter of up to as much
//!   again. It measures failures to connect, not connection lifetimes: a
//!   connection that lasted [`WORKING_CONNECTION`] worked, and the backoff
//!   starts small again after it. A connection closed right after its
//!   handshake did not work: a broker refusing this edge's certificate
//!   does so only after the handshake (TLS 1.3), and must not be retried in
//!   a tight loop.
//! - A failure is a warning once per distinct reason (until a connection
//!   works), so an operator sees why nothing replicates without a line per
//!   retry.
//! - Topic streams that ended are restarted every [`STREAM_RESTART`]; a
//!   stream that keeps failing the same way for a reason that needs an
//!   operator warns once per connection ([`StreamReports`]).

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// A connection that lasted this long worked: the reconnect backoff starts
/// small again after it.
pub const WORKING_CONNECTION: Duration = Duration::from_secs(10);

/// How often topic streams that ended (refused for a retryable reason, a
/// WAL failure) are restarted on a connection.
pub const STREAM_RESTART: Duration = Duration::from_secs(5);

/// First reconnect delay (before jitter).
pub const MIN_BACKOFF: Duration = Duration::from_millis(100);

/// Exponential backoff: [`MIN_BACKOFF`], then doubling up to a cap, plus a
/// jitter of `jitter × delay` (`jitter` in `[0, 1)`).
#[derive(Debug, Clone)]
struct Backoff {
    max: Duration,
    /// The last delay before jitter; `None` before the first.
    current: Option<Duration>,
}

impl Backoff {
    fn new(max: Duration) -> Backoff {
        Backoff { max, current: None }
    }

    fn next(&mut self, jitter: f32) -> Duration {
        let base = match self.current {
            None => MIN_BACKOFF,
            Some(current) if current < self.max => current.saturating_mul(2).min(self.max),
            Some(current) => current.min(self.max),
        };
        self.current = Some(base);
        base.saturating_add(base.mul_f32(jitter.clamp(0.0, 1.0)))
    }
}

/// What the shell logs about an attempt that ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptReport {
    /// It ended without an error: nothing to say.
    Quiet,
    /// A failure different from the previous one: a warning.
    NewFailure,
    /// The same failure as the previous attempt: debug only.
    RepeatedFailure,
    /// A working connection ended: debug only (the loss is logged by the
    /// connection itself).
    Ended,
}

/// The decision after an attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retry {
    /// What to log.
    pub report: AttemptReport,
    /// The wait before the next attempt.
    pub delay: Duration,
    /// When the next attempt starts (`now + delay`).
    pub at: Instant,
}

/// The link to the brokers: rotation, backoff and failure reports.
pub struct Link {
    brokers: Vec<String>,
    /// Attempts started so far (the next broker is `attempts % len`).
    attempts: usize,
    backoff: Backoff,
    /// Draws the jitter of each delay, in `[0, 1)`.
    jitter: Box<dyn FnMut() -> f32 + Send>,
    /// The reason of the last failure warned about.
    last_failure: Option<String>,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("brokers", &self.brokers)
            .field("attempts", &self.attempts)
            .field("backoff", &self.backoff)
            .field("last_failure", &self.last_failure)
            .finish_non_exhaustive()
    }
}

impl Link {
    /// A link over `brokers` (tried in order) whose backoff is capped at
    /// `max_backoff`; `jitter` draws each delay's random part in `[0, 1)`.
    pub fn new(
        brokers: Vec<String>,
        max_backoff: Duration,
        jitter: impl FnMut() -> f32 + Send + 'static,
    ) -> Link {
        Link {
            brokers,
            attempts: 0,
            backoff: Backoff::new(max_backoff),
            jitter: Box::new(jitter),
            last_failure: None,
        }
    }

    /// Starts an attempt: the broker address it dials (`None` without any
    /// broker).
    pub fn next_broker(&mut self) -> Option<&str> {
        if self.brokers.is_empty() {
            return None;
        }
        let index = self.attempts % self.brokers.len();
        self.attempts += 1;
        Some(&self.brokers[index])
    }

    /// The attempt ended at `now`: its handshake completed at
    /// `connected_at` (`None`: it never connected), and it ended with
    /// `failure` (`None`: without an error). Returns what to log and when
    /// to try again.
    pub fn attempt_ended(
        &mut self,
        now: Instant,
        connected_at: Option<Instant>,
        failure: Option<&str>,
    ) -> Retry {
        let worked =
            connected_at.is_some_and(|at| now.saturating_duration_since(at) >= WORKING_CONNECTION);
        if worked {
            self.backoff = Backoff::new(self.backoff.max);
            self.last_failure = None;
        }
        let report = match failure {
            None => AttemptReport::Quiet,
            Some(_) if worked => AttemptReport::Ended,
            Some(reason) if self.last_failure.as_deref() == Some(reason) => {
                AttemptReport::RepeatedFailure
            }
            Some(reason) => {
                self.last_failure = Some(reason.to_owned());
                AttemptReport::NewFailure
            }
        };
        let delay = self.backoff.next((self.jitter)());
        Retry {
            report,
            delay,
            at: now + delay,
        }
    }
}

/// Per connection: the last error each topic's stream ended with, so a
/// stream that keeps failing the same way is a warning once per connection
/// (it is retried every [`STREAM_RESTART`] meanwhile).
#[derive(Debug, Default)]
pub struct StreamReports {
    last: HashMap<String, String>,
}

impl StreamReports {
    /// The stream of `topic` ended with `error`; `needs_operator` when the
    /// reason is one an operator must look at (a refusal that is not
    /// retryable, a broker ahead of the local log, local data missing, a
    /// protocol or WAL failure; not a lost connection, which the
    /// connection reports). Whether to warn (else debug only).
    pub fn stream_ended(&mut self, topic: &str, needs_operator: bool, error: &str) -> bool {
        if needs_operator && self.last.get(topic).map(String::as_str) != Some(error) {
            self.last.insert(topic.to_owned(), error.to_owned());
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn link(brokers: &[&str], jitter: f32) -> Link {
        Link::new(
            brokers.iter().map(|b| (*b).to_owned()).collect(),
            Duration::from_secs(30),
            move || jitter,
        )
    }

    #[test]
    fn failures_back_off_from_100_ms_doubling_to_the_cap() {
        let mut link = link(&["b1:7100"], 0.0);
        let mut now = Instant::now();
        let mut delays = Vec::new();
        for _ in 0..12 {
            link.next_broker();
            let retry = link.attempt_ended(now, None, Some("refused"));
            assert_eq!(retry.at, now + retry.delay);
            delays.push(retry.delay);
            now = retry.at;
        }
        assert_eq!(
            delays,
            [
                ms(100),
                ms(200),
                ms(400),
                ms(800),
                ms(1600),
                ms(3200),
                ms(6400),
                ms(12_800),
                ms(25_600),
                ms(30_000),
                ms(30_000),
                ms(30_000),
            ]
        );
    }

    #[test]
    fn jitter_adds_up_to_as_much_again() {
        let now = Instant::now();
        let jittered = |base: Duration, jitter: f32| base + base.mul_f32(jitter);
        let mut link = link(&["b1:7100"], 0.5);
        assert_eq!(
            link.attempt_ended(now, None, Some("x")).delay,
            jittered(ms(100), 0.5)
        );
        assert_eq!(
            link.attempt_ended(now, None, Some("x")).delay,
            jittered(ms(200), 0.5)
        );
        assert_eq!(jittered(ms(200), 0.5).as_millis(), 300);
        // Capped at 250 ms: the cap applies before the jitter.
        let mut capped = Link::new(vec!["b".into()], ms(250), || 0.999);
        let delays: Vec<Duration> = (0..4)
            .map(|_| capped.attempt_ended(now, None, Some("x")).delay)
            .collect();
        assert_eq!(
            delays,
            [
                jittered(ms(100), 0.999),
                jittered(ms(200), 0.999),
                jittered(ms(250), 0.999),
                jittered(ms(250), 0.999),
            ]
        );
        assert!(delays[3] < ms(500));
    }

    #[test]
    fn brokers_rotate_in_order_one_attempt_each() {
        let mut link = link(&["b1:7100", "b2:7100", "b3:7100"], 0.0);
        let now = Instant::now();
        let mut dialled = Vec::new();
        for _ in 0..7 {
            dialled.push(link.next_broker().unwrap().to_owned());
            link.attempt_ended(now, None, Some("timed out"));
        }
        assert_eq!(
            dialled,
            [
                "b1:7100", "b2:7100", "b3:7100", "b1:7100", "b2:7100", "b3:7100", "b1:7100"
            ]
        );
        assert_eq!(
            Link::new(Vec::new(), ms(30_000), || 0.0).next_broker(),
            None
        );
    }

    #[test]
    fn a_working_connection_resets_the_backoff_and_a_short_one_does_not() {
        let mut link = link(&["b1:7100"], 0.0);
        let t0 = Instant::now();
        for expected in [100, 200, 400] {
            assert_eq!(
                link.attempt_ended(t0, None, Some("refused")).delay,
                ms(expected)
            );
        }
        // Closed 9.999 s after its handshake: did not work, backoff grows.
        let at = t0 + Duration::from_secs(1);
        let retry = link.attempt_ended(at + ms(9_999), Some(at), Some("closed"));
        assert_eq!(retry.delay, ms(800));
        assert_eq!(retry.report, AttemptReport::NewFailure);
        // 10 s: it worked; the next wait is the first one again.
        let retry = link.attempt_ended(at + WORKING_CONNECTION, Some(at), Some("closed"));
        assert_eq!(retry.delay, ms(100));
        assert_eq!(retry.report, AttemptReport::Ended);
        let retry = link.attempt_ended(at + WORKING_CONNECTION, None, Some("refused"));
        assert_eq!(retry.delay, ms(200));
    }

    #[test]
    fn a_failure_warns_once_per_distinct_reason_until_a_connection_works() {
        let mut link = link(&["b1:7100"], 0.0);
        let now = Instant::now();
        let reports: Vec<AttemptReport> =
            ["refused", "refused", "timed out", "timed out", "refused"]
                .iter()
                .map(|reason| link.attempt_ended(now, None, Some(reason)).report)
                .collect();
        assert_eq!(
            reports,
            [
                AttemptReport::NewFailure,
                AttemptReport::RepeatedFailure,
                AttemptReport::NewFailure,
                AttemptReport::RepeatedFailure,
                AttemptReport::NewFailure,
            ]
        );
        assert_eq!(
            link.attempt_ended(now, None, None).report,
            AttemptReport::Quiet
        );
        // After a working connection the same reason is news again.
        let later = now + WORKING_CONNECTION;
        assert_eq!(
            link.attempt_ended(later, Some(now), Some("refused")).report,
            AttemptReport::Ended
        );
        assert_eq!(
            link.attempt_ended(later, None, Some("refused")).report,
            AttemptReport::NewFailure
        );
    }

    #[test]
    fn a_stream_failure_that_needs_an_operator_warns_once_per_error() {
        let mut reports = StreamReports::default();
        assert!(reports.stream_ended("/e1/t", true, "refused: unauthorized"));
        assert!(!reports.stream_ended("/e1/t", true, "refused: unauthorized"));
        assert!(reports.stream_ended("/e1/u", true, "refused: unauthorized"));
        assert!(reports.stream_ended("/e1/t", true, "wal: closed"));
        assert!(reports.stream_ended("/e1/t", true, "refused: unauthorized"));
        assert!(!reports.stream_ended("/e1/v", false, "connection: lost"));
        assert!(!reports.stream_ended("/e1/v", false, "connection: lost"));
    }
}
