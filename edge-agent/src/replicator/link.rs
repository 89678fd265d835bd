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
//!   again (backon's exponential backoff, driven here one delay at a time).
//!   connection that lasted [`WORKING_CONNECTION`] worked, and the backoff
//!   starts small again after it. A connection closed right after its
//!   handshake did not work: a broker refusing this edge's certificate
//!   does so only after the handshake (TLS 1.3), and must not be retried in
//!   a tight loop.
//! - A failure is a warning once per distinct reason (until a connection
//!   works), so an operator sees why nothing replicates without a line per
//!   retry.
//! - Topic streams that ended are restarted after [`STREAM_RESTART`]
//!   ([`RETRYABLE_RESTART`] after a retryable refusal); a
//!   stream that keeps failing the same way for a reason that needs an
//!   operator warns once per connection ([`StreamReports`]).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};

/// A connection that lasted this long worked: the reconnect backoff starts
/// small again after it.
pub const WORKING_CONNECTION: Duration = Duration::from_secs(10);

/// How long a topic stream that ended for a reason that needs an operator
/// (a refusal that is not retryable, a WAL failure) waits before it is
/// restarted on a connection.
pub const STREAM_RESTART: Duration = Duration::from_secs(5);

/// How long a topic stream refused for a retryable reason (`Unavailable`:
/// the topic has no owner yet, or its owner lost its lease) waits before
/// it is restarted: short, so a failover takes about a lease, not a lease
/// plus 5 s.
pub const RETRYABLE_RESTART: Duration = Duration::from_secs(1);

/// How long a broker that could not be reached (the attempt never
/// connected) is passed over while another can be tried: a dead broker
/// costs a handshake timeout per visit, and rotating back to it during a
/// failover made the edge wait 5 s more for an owner already elsewhere.
pub const SKIP_UNREACHABLE: Duration = Duration::from_secs(30);

/// First reconnect delay (before jitter).
pub const MIN_BACKOFF: Duration = Duration::from_millis(100);

/// How reconnect delays are jittered (backon's jitter: each delay plus a
/// random part of up to as much again, drawn after the cap).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Jitter {
    /// No jitter: delays are exactly [`MIN_BACKOFF`] doubling to the cap.
    Off,
    /// A random jitter from the process's generator (production).
    Random,
    /// A jitter from a generator seeded with this value (repeatable tests).
    Seeded(u64),
}

/// backon's exponential backoff: [`MIN_BACKOFF`], doubling up to `max`,
/// never giving up, jittered per `jitter`.
fn new_backoff(max: Duration, jitter: Jitter) -> ExponentialBackoff {
    let builder = ExponentialBuilder::default()
        .with_min_delay(MIN_BACKOFF)
        .with_max_delay(max)
        .without_max_times();
    match jitter {
        Jitter::Off => builder,
        Jitter::Random => builder.with_jitter(),
        Jitter::Seeded(seed) => builder.with_jitter().with_jitter_seed(seed),
    }
    .build()
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
    max_backoff: Duration,
    jitter: Jitter,
    backoff: ExponentialBackoff,
    /// The reason of the last failure warned about.
    last_failure: Option<String>,
    /// Per broker: until when it is passed over (its last attempt never
    /// connected), see [`SKIP_UNREACHABLE`].
    unreachable_until: Vec<Option<Instant>>,
    /// The broker of the attempt under way.
    current: usize,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("brokers", &self.brokers)
            .field("attempts", &self.attempts)
            .field("max_backoff", &self.max_backoff)
            .field("jitter", &self.jitter)
            .field("last_failure", &self.last_failure)
            .finish_non_exhaustive()
    }
}

impl Link {
    /// A link over `brokers` (tried in order) whose backoff is capped at
    /// `max_backoff`, jittered per `jitter`.
    pub fn new(brokers: Vec<String>, max_backoff: Duration, jitter: Jitter) -> Link {
        Link {
            unreachable_until: vec![None; brokers.len()],
            brokers,
            attempts: 0,
            max_backoff,
            jitter,
            backoff: new_backoff(max_backoff, jitter),
            last_failure: None,
            current: 0,
        }
    }

    /// This edge's certificate changed (a rotation): whatever the brokers
    /// refused may be accepted now, so the backoff starts small again and
    /// the next failure is reported anew.
    pub fn certificate_changed(&mut self) {
        self.backoff = new_backoff(self.max_backoff, self.jitter);
        self.last_failure = None;
    }

    /// Starts an attempt at `now`: the broker address it dials (`None`
    /// without any broker). Brokers are tried in turn, passing over one
    /// whose last attempt never connected (for [`SKIP_UNREACHABLE`]) while
    /// another can be tried.
    pub fn next_broker(&mut self, now: Instant) -> Option<&str> {
        let count = self.brokers.len();
        if count == 0 {
            return None;
        }
        let reachable = |i: usize| {
            self.unreachable_until
                .get(i)
                .copied()
                .flatten()
                .is_none_or(|until| now >= until)
        };
        let index = (0..count)
            .map(|step| (self.attempts + step) % count)
            .find(|&i| reachable(i))
            .unwrap_or(self.attempts % count);
        self.attempts = index + 1;
        self.current = index;
        Some(&self.brokers[index])
    }

    /// The connection of the attempt that just ended heard nothing from
    /// its broker for the idle timeout (at `now`): the broker is passed
    /// over like one that could not be reached ([`SKIP_UNREACHABLE`]).
    /// Called after [`Link::attempt_ended`].
    pub fn broker_went_silent(&mut self, now: Instant) {
        if let Some(until) = self.unreachable_until.get_mut(self.current) {
            *until = Some(now + SKIP_UNREACHABLE);
        }
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
        if let Some(until) = self.unreachable_until.get_mut(self.current) {
            *until = connected_at.is_none().then(|| now + SKIP_UNREACHABLE);
        }
        let worked =
            connected_at.is_some_and(|at| now.saturating_duration_since(at) >= WORKING_CONNECTION);
        if worked {
            self.backoff = new_backoff(self.max_backoff, self.jitter);
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
        // Built without a limit on attempts, the backoff never ends.
        let delay = self.backoff.next().unwrap_or(self.max_backoff);
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

    fn link(brokers: &[&str]) -> Link {
        Link::new(
            brokers.iter().map(|b| (*b).to_owned()).collect(),
            Duration::from_secs(30),
            Jitter::Off,
        )
    }

    #[test]
    fn failures_back_off_from_100_ms_doubling_to_the_cap() {
        let mut link = link(&["b1:7100"]);
        let mut now = Instant::now();
        let mut delays = Vec::new();
        for _ in 0..12 {
            link.next_broker(Instant::now());
            let retry = link.attempt_ended(now, None, Some("refused"));
            assert_eq!(retry.at, now + retry.delay);
            // backon multiplies in f32: compare whole milliseconds.
            delays.push(retry.delay.as_millis());
            now = retry.at;
        }
        assert_eq!(
            delays,
            [
                100, 200, 400, 800, 1600, 3200, 6400, 12_800, 25_600, 30_000, 30_000, 30_000,
            ]
        );
    }

    #[test]
    fn jitter_adds_up_to_as_much_again_after_the_cap_and_repeats_with_its_seed() {
        let now = Instant::now();
        let delays = |seed: u64| -> Vec<Duration> {
            let mut capped = Link::new(vec!["b".into()], ms(250), Jitter::Seeded(seed));
            (0..6)
                .map(|_| capped.attempt_ended(now, None, Some("x")).delay)
                .collect()
        };
        let first = delays(7);
        for (delay, base) in first.iter().zip([100, 200, 250, 250, 250, 250]) {
            assert!(
                *delay >= ms(base) && *delay < ms(2 * base),
                "{delay:?} for a base of {base} ms"
            );
        }
        assert_eq!(first, delays(7), "the same seed gives the same delays");
        assert_ne!(first, delays(8), "another seed gives other delays");
    }

    #[test]
    fn brokers_rotate_in_order_one_attempt_each() {
        let mut link = link(&["b1:7100", "b2:7100", "b3:7100"]);
        let now = Instant::now();
        let mut dialled = Vec::new();
        for _ in 0..7 {
            dialled.push(link.next_broker(now).unwrap().to_owned());
            link.attempt_ended(now, None, Some("timed out"));
        }
        assert_eq!(
            dialled,
            [
                "b1:7100", "b2:7100", "b3:7100", "b1:7100", "b2:7100", "b3:7100", "b1:7100"
            ]
        );
        assert_eq!(
            Link::new(Vec::new(), ms(30_000), Jitter::Off).next_broker(Instant::now()),
            None
        );
    }

    /// A broker that could not be reached is passed over for
    /// [`SKIP_UNREACHABLE`] while another can be tried: during a failover
    /// the rotation went back to the dead owner and waited out a handshake
    /// timeout (5 s) for an owner already elsewhere.
    #[test]
    fn an_unreachable_broker_is_passed_over_while_another_can_be_tried() {
        let mut link = link(&["b1:7100", "b2:7100", "b3:7100"]);
        let t0 = Instant::now();
        let dial = |link: &mut Link, at: Instant, connected: bool| {
            let broker = link.next_broker(at).unwrap().to_owned();
            link.attempt_ended(at, connected.then_some(at), Some("ended"));
            broker
        };
        // b1 is dead, b2 and b3 answer (and refuse: no owner yet).
        assert_eq!(dial(&mut link, t0, false), "b1:7100");
        assert_eq!(dial(&mut link, t0, true), "b2:7100");
        assert_eq!(dial(&mut link, t0, true), "b3:7100");
        assert_eq!(dial(&mut link, t0, true), "b2:7100", "b1 passed over");
        assert_eq!(dial(&mut link, t0, true), "b3:7100");
        // After the skip it is tried again.
        let later = t0 + SKIP_UNREACHABLE;
        assert_eq!(dial(&mut link, later, true), "b1:7100");
        assert_eq!(dial(&mut link, later, true), "b2:7100");
        // A connection whose broker went silent (the owner SIGKILLed under
        // a working connection) passes it over the same way.
        assert_eq!(link.next_broker(later).unwrap(), "b3:7100");
        link.attempt_ended(later, Some(t0), Some("timed out"));
        link.broker_went_silent(later);
        assert_eq!(dial(&mut link, later, true), "b1:7100");
        assert_eq!(dial(&mut link, later, true), "b2:7100");
        assert_eq!(dial(&mut link, later, true), "b1:7100", "b3 passed over");
    }

    #[test]
    fn a_working_connection_resets_the_backoff_and_a_short_one_does_not() {
        let mut link = link(&["b1:7100"]);
        let t0 = Instant::now();
        for expected in [100, 200, 400] {
            assert_eq!(
                link.attempt_ended(t0, None, Some("refused"))
                    .delay
                    .as_millis(),
                expected
            );
        }
        // Closed 9.999 s after its handshake: did not work, backoff grows.
        let at = t0 + Duration::from_secs(1);
        let retry = link.attempt_ended(at + ms(9_999), Some(at), Some("closed"));
        assert_eq!(retry.delay.as_millis(), 800);
        assert_eq!(retry.report, AttemptReport::NewFailure);
        // 10 s: it worked; the next wait is the first one again.
        let retry = link.attempt_ended(at + WORKING_CONNECTION, Some(at), Some("closed"));
        assert_eq!(retry.delay.as_millis(), 100);
        assert_eq!(retry.report, AttemptReport::Ended);
        let retry = link.attempt_ended(at + WORKING_CONNECTION, None, Some("refused"));
        assert_eq!(retry.delay.as_millis(), 200);
    }

    #[test]
    fn a_failure_warns_once_per_distinct_reason_until_a_connection_works() {
        let mut link = link(&["b1:7100"]);
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
