//! One direction of the relay's path as a state machine without I/O: random
//! loss, the bandwidth bottleneck with its bounded queue, and the delay with
//! jitter ([`Link`], configured by [`LinkConfig`]). It takes time as an
//! argument; the relay's tasks feed it.

use std::cmp::{Ordering as CmpOrdering, Reverse};
use std::collections::{BinaryHeap, VecDeque};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use tokio::time::Instant;

/// Most datagrams past the bottleneck and not yet delivered, per direction.
/// At 300 ms of delay this allows ~330,000 datagrams/s, far beyond what
/// loopback QUIC sends in the tests.
pub const IN_FLIGHT_DATAGRAMS_MAX: usize = 100_000;
/// Default bound on a bottleneck's queue, bytes.
pub const QUEUE_BYTES_DEFAULT: usize = 64 * 1024;

/// One direction of the path.
#[derive(Debug, Clone, PartialEq)]
pub struct LinkConfig {
    /// Probability that a datagram is lost, `0.0..=1.0`.
    pub loss: f64,
    /// Fixed one-way delay added to every datagram.
    pub delay: Duration,
    /// Extra one-way delay, uniform in `0..=jitter`, drawn per datagram.
    pub jitter: Duration,
    /// Bottleneck rate in UDP payload bytes per second; `None`: unlimited.
    pub bandwidth_bytes_per_s: Option<u64>,
    /// Bound on the bottleneck's queue, bytes (ignored without a rate).
    pub queue_bytes_max: usize,
}

impl LinkConfig {
    /// No loss, no delay, no bottleneck.
    pub fn perfect() -> LinkConfig {
        LinkConfig {
            loss: 0.0,
            delay: Duration::ZERO,
            jitter: Duration::ZERO,
            bandwidth_bytes_per_s: None,
            queue_bytes_max: QUEUE_BYTES_DEFAULT,
        }
    }

    /// Random loss with probability `loss` and a fixed one-way `delay`.
    pub fn lossy(loss: f64, delay: Duration) -> LinkConfig {
        LinkConfig {
            loss,
            delay,
            ..LinkConfig::perfect()
        }
    }

    /// The same with a bottleneck of `bytes_per_s` and a queue of
    /// `queue_bytes_max`.
    pub fn with_bandwidth(mut self, bytes_per_s: u64, queue_bytes_max: usize) -> LinkConfig {
        self.bandwidth_bytes_per_s = Some(bytes_per_s);
        self.queue_bytes_max = queue_bytes_max;
        self
    }

    pub(super) fn validate(&self) {
        assert!(
            (0.0..=1.0).contains(&self.loss),
            "loss {} is not a probability",
            self.loss
        );
        assert!(
            self.bandwidth_bytes_per_s != Some(0),
            "a bandwidth of 0 would hold every datagram forever; use a cut"
        );
    }
}

/// What happened to a datagram offered to a [`Link`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum Verdict {
    /// Accepted; it will be due at this instant.
    Accepted(Instant),
    /// Lost at random.
    Lost,
    /// The bottleneck's queue was full (or too many datagrams in flight).
    QueueFull,
}

#[derive(Debug)]
struct Pending {
    due: Instant,
    seq: u64,
    bytes: Vec<u8>,
}

impl PartialEq for Pending {
    fn eq(&self, other: &Self) -> bool {
        (self.due, self.seq) == (other.due, other.seq)
    }
}
impl Eq for Pending {}
impl PartialOrd for Pending {
    fn partial_cmp(&self, other: &Self) -> Option<CmpOrdering> {
        Some(self.cmp(other))
    }
}
impl Ord for Pending {
    fn cmp(&self, other: &Self) -> CmpOrdering {
        (self.due, self.seq).cmp(&(other.due, other.seq))
    }
}

/// One direction of the path as a state machine without I/O: datagrams go
/// in with [`Link::offer`], come out with [`Link::poll_due`], and
/// [`Link::next_due`] says when to poll next.
#[derive(Debug)]
pub struct Link {
    config: LinkConfig,
    rng: StdRng,
    /// When the bottleneck finishes serialising everything accepted.
    busy_until: Option<Instant>,
    /// Departure instants and sizes of accepted datagrams still in the
    /// bottleneck's queue. Invariant: `queued_bytes` is the sum of sizes.
    queue: VecDeque<(Instant, usize)>,
    queued_bytes: usize,
    /// Datagrams past the bottleneck, earliest due first (ties: arrival
    /// order). Invariant: `in_flight.len() <= IN_FLIGHT_DATAGRAMS_MAX`.
    in_flight: BinaryHeap<Reverse<Pending>>,
    next_seq: u64,
}

impl Link {
    /// A link with `config` whose randomness comes from `seed`.
    ///
    /// # Panics
    /// If `config.loss` is not a probability or the rate is 0.
    pub fn new(config: LinkConfig, seed: u64) -> Link {
        config.validate();
        Link {
            config,
            rng: StdRng::seed_from_u64(seed),
            busy_until: None,
            queue: VecDeque::new(),
            queued_bytes: 0,
            in_flight: BinaryHeap::new(),
            next_seq: 0,
        }
    }

    /// A datagram arrived at `now`.
    pub fn offer(&mut self, now: Instant, bytes: Vec<u8>) -> Verdict {
        // Always two draws per datagram, so that one datagram's fate never
        // shifts the random stream of the ones after it.
        let loss_draw: f64 = self.rng.random();
        let jitter_draw: f64 = self.rng.random();
        if loss_draw < self.config.loss {
            return Verdict::Lost;
        }
        if self.in_flight.len() >= IN_FLIGHT_DATAGRAMS_MAX {
            return Verdict::QueueFull;
        }
        let departure = match self.config.bandwidth_bytes_per_s {
            None => now,
            Some(rate) => {
                while let Some(&(left, size)) = self.queue.front() {
                    if left > now {
                        break;
                    }
                    self.queue.pop_front();
                    self.queued_bytes -= size;
                }
                if self.queued_bytes + bytes.len() > self.config.queue_bytes_max {
                    return Verdict::QueueFull;
                }
                let start = self.busy_until.map_or(now, |busy| busy.max(now));
                let departure = start + Duration::from_secs_f64(bytes.len() as f64 / rate as f64);
                self.busy_until = Some(departure);
                self.queue.push_back((departure, bytes.len()));
                self.queued_bytes += bytes.len();
                departure
            }
        };
        let due = departure + self.config.delay + self.config.jitter.mul_f64(jitter_draw);
        self.in_flight.push(Reverse(Pending {
            due,
            seq: self.next_seq,
            bytes,
        }));
        self.next_seq += 1;
        Verdict::Accepted(due)
    }

    /// When the next datagram is due, if any is in flight.
    pub fn next_due(&self) -> Option<Instant> {
        self.in_flight.peek().map(|Reverse(p)| p.due)
    }

    /// The next datagram due at or before `now`.
    pub fn poll_due(&mut self, now: Instant) -> Option<Vec<u8>> {
        if self.next_due()? > now {
            return None;
        }
        self.in_flight.pop().map(|Reverse(p)| p.bytes)
    }

    /// Bytes in the bottleneck's queue at `now`.
    pub fn queued_bytes(&mut self, now: Instant) -> usize {
        while let Some(&(left, size)) = self.queue.front() {
            if left > now {
                break;
            }
            self.queue.pop_front();
            self.queued_bytes -= size;
        }
        self.queued_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_link_state_machine_serialises_at_the_rate() {
        let start = Instant::now();
        let mut link = Link::new(
            LinkConfig::lossy(0.0, Duration::from_millis(10)).with_bandwidth(1000, 250),
            7,
        );
        let a = link.offer(start, vec![0; 100]);
        let b = link.offer(start, vec![0; 100]);
        let c = link.offer(start, vec![0; 100]);
        assert_eq!(a, Verdict::Accepted(start + Duration::from_millis(110)));
        assert_eq!(b, Verdict::Accepted(start + Duration::from_millis(210)));
        assert_eq!(c, Verdict::QueueFull);
        assert_eq!(link.queued_bytes(start), 200);
        assert_eq!(link.queued_bytes(start + Duration::from_millis(100)), 100);
        assert!(link.poll_due(start + Duration::from_millis(109)).is_none());
        assert!(link.poll_due(start + Duration::from_millis(110)).is_some());
        assert_eq!(link.next_due(), Some(start + Duration::from_millis(210)));
        // Queue drained by then: a new datagram starts serialising at once.
        let d = link.offer(start + Duration::from_millis(300), vec![0; 50]);
        assert_eq!(d, Verdict::Accepted(start + Duration::from_millis(360)));
    }
}
