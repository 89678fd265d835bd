//! Where each topic's stream runs, as an I/O-free table: `brokers = [...]`
//! is a bootstrap list, and a broker that does not own a topic answers its
//! `Hello` with a `Redirect` naming the owner's ingest address. The table
//! records, per topic, the owner it was sent to (`None`: the bootstrap
//! connection), how many redirects it followed since its last `Welcome`,
//! and whether a redirect loop holds it back. The tokio shell
//! ([`super::run`] and its target connections) dials one connection per
//! distinct owner address and runs there exactly the topics routed to it.
//!
//! - A redirect is followed at once, up to [`MAX_REDIRECT_HOPS`] hops per
//!   attempt (an attempt ends with a `Welcome`). One more hop is a loop
//!   (two brokers naming each other, or an owner that keeps failing): the
//!   topic goes back to the bootstrap connection, held for
//!   [`LOOP_BACKOFF_MIN`] doubling to [`LOOP_BACKOFF_MAX`] per loop in a
//!   row.
//! - When the owner's connection fails, or the owner refuses the topic for
//!   a retryable reason, the topic falls back to the bootstrap connection,
//!   which may redirect it again (counted as a hop of the same attempt).
//! - The shell logs "topic owned by broker N at ADDR; replicating there"
//!   once per topic and owner ([`RedirectDecision::Follow::announce`]).

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

/// Redirects a topic may follow between two `Welcome`s; one more is a
/// loop.
pub const MAX_REDIRECT_HOPS: u32 = 4;
/// How long a topic caught in its first redirect loop waits before the
/// bootstrap connection tries it again.
pub const LOOP_BACKOFF_MIN: Duration = Duration::from_secs(1);
/// Longest wait after a redirect loop.
pub const LOOP_BACKOFF_MAX: Duration = Duration::from_secs(30);

/// What to do with a `Redirect`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedirectDecision {
    /// Open the topic's stream on the connection to `addr`.
    Follow {
        /// The owner's ingest address.
        addr: String,
        /// First redirect of this topic to this owner: log it.
        announce: bool,
    },
    /// Too many hops without a `Welcome`: the topic is back on the
    /// bootstrap connection, held until `until`.
    Loop {
        /// Loops in a row so far (1 for the first).
        loops: u32,
        /// The wait before the bootstrap connection tries it again.
        delay: Duration,
        /// `now + delay`.
        until: Instant,
    },
}

#[derive(Debug, Default)]
struct TopicRoute {
    /// The owner's ingest address; `None`: the bootstrap connection.
    target: Option<String>,
    /// Redirects followed since the last `Welcome`.
    hops: u32,
    /// Redirect loops in a row (the backoff exponent).
    loops: u32,
    /// Held back after a loop until then.
    held_until: Option<Instant>,
    /// The owner last announced in the log: broker id and address.
    announced: Option<(u64, String)>,
}

/// The route of every topic that was redirected at least once.
#[derive(Debug, Default)]
pub struct RouteTable {
    topics: HashMap<String, TopicRoute>,
}

impl RouteTable {
    /// The owner address `topic`'s stream runs on; `None`: the bootstrap
    /// connection.
    pub fn target(&self, topic: &str) -> Option<&str> {
        self.topics.get(topic).and_then(|r| r.target.as_deref())
    }

    /// Whether `topic`'s stream may start at `now` (not held after a
    /// redirect loop).
    pub fn may_start(&self, topic: &str, now: Instant) -> bool {
        self.topics
            .get(topic)
            .and_then(|r| r.held_until)
            .is_none_or(|until| now >= until)
    }

    /// The broker `broker_id` at `addr` owns `topic` (a `Redirect` at
    /// `now`).
    pub fn on_redirect(
        &mut self,
        topic: &str,
        broker_id: u64,
        addr: &str,
        now: Instant,
    ) -> RedirectDecision {
        let route = self.topics.entry(topic.to_owned()).or_default();
        route.hops += 1;
        if route.hops > MAX_REDIRECT_HOPS {
            route.target = None;
            route.hops = 0;
            let delay = LOOP_BACKOFF_MIN
                .saturating_mul(1 << route.loops.min(16))
                .min(LOOP_BACKOFF_MAX);
            route.loops = route.loops.saturating_add(1);
            let until = now + delay;
            route.held_until = Some(until);
            return RedirectDecision::Loop {
                loops: route.loops,
                delay,
                until,
            };
        }
        let owner = (broker_id, addr.to_owned());
        let announce = route.announced.as_ref() != Some(&owner);
        route.announced = Some(owner);
        route.target = Some(addr.to_owned());
        RedirectDecision::Follow {
            addr: addr.to_owned(),
            announce,
        }
    }

    /// `topic`'s stream got a `Welcome`: the attempt worked, its hop and
    /// loop counts start over.
    pub fn on_resumed(&mut self, topic: &str) {
        if let Some(route) = self.topics.get_mut(topic) {
            route.hops = 0;
            route.loops = 0;
            route.held_until = None;
        }
    }

    /// `topic` goes back to the bootstrap connection (its owner refused it
    /// for a retryable reason). Whether it had an owner address.
    pub fn fall_back(&mut self, topic: &str) -> bool {
        self.topics
            .get_mut(topic)
            .is_some_and(|r| r.target.take().is_some())
    }

    /// Every topic routed to `addr` goes back to the bootstrap connection
    /// (the connection there failed); returns them, sorted.
    pub fn fall_back_all(&mut self, addr: &str) -> Vec<String> {
        let mut moved: Vec<String> = self
            .topics
            .iter_mut()
            .filter(|(_, r)| r.target.as_deref() == Some(addr))
            .map(|(topic, r)| {
                r.target = None;
                topic.clone()
            })
            .collect();
        moved.sort();
        moved
    }

    /// Every owner address some topic is routed to.
    pub fn targets(&self) -> BTreeSet<String> {
        self.topics
            .values()
            .filter_map(|r| r.target.clone())
            .collect()
    }

    /// Whether some topic is routed to `addr`.
    pub fn is_wanted(&self, addr: &str) -> bool {
        self.topics
            .values()
            .any(|r| r.target.as_deref() == Some(addr))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_redirect_routes_the_topic_to_the_owner_and_announces_each_owner_once() {
        let mut table = RouteTable::default();
        let now = Instant::now();
        assert_eq!(table.target("/e1/t"), None);
        let first = table.on_redirect("/e1/t", 2, "b2:7100", now);
        assert_eq!(
            first,
            RedirectDecision::Follow {
                addr: "b2:7100".into(),
                announce: true
            }
        );
        assert_eq!(table.target("/e1/t"), Some("b2:7100"));
        assert_eq!(
            table.target("/e1/u"),
            None,
            "other topics stay on bootstrap"
        );
        table.on_resumed("/e1/t");
        // The same owner again (after a fallback): followed, not announced.
        assert!(table.fall_back("/e1/t"));
        assert_eq!(table.target("/e1/t"), None);
        assert_eq!(
            table.on_redirect("/e1/t", 2, "b2:7100", now),
            RedirectDecision::Follow {
                addr: "b2:7100".into(),
                announce: false
            }
        );
        // A new owner is announced.
        assert_eq!(
            table.on_redirect("/e1/t", 3, "b3:7100", now),
            RedirectDecision::Follow {
                addr: "b3:7100".into(),
                announce: true
            }
        );
        assert_eq!(table.targets(), BTreeSet::from(["b3:7100".to_owned()]));
    }

    #[test]
    fn a_failed_owner_connection_sends_its_topics_back_to_bootstrap() {
        let mut table = RouteTable::default();
        let now = Instant::now();
        for topic in ["/e1/a", "/e1/b"] {
            let _ = table.on_redirect(topic, 2, "b2:7100", now);
        }
        let _ = table.on_redirect("/e1/c", 3, "b3:7100", now);
        assert!(table.is_wanted("b2:7100"));
        assert_eq!(table.fall_back_all("b2:7100"), ["/e1/a", "/e1/b"]);
        assert!(!table.is_wanted("b2:7100"));
        assert_eq!(table.target("/e1/a"), None);
        assert_eq!(table.target("/e1/c"), Some("b3:7100"));
        assert!(!table.fall_back("/e1/a"), "already on bootstrap");
        assert!(!table.fall_back("/e1/never"));
    }

    #[test]
    fn a_redirect_loop_holds_the_topic_back_doubling_until_a_welcome() {
        let mut table = RouteTable::default();
        let t0 = Instant::now();
        let mut now = t0;
        let mut delays = Vec::new();
        for _ in 0..7 {
            // Two brokers naming each other: hops until the bound.
            for hop in 1..=MAX_REDIRECT_HOPS {
                let addr = if hop % 2 == 0 { "b1:7100" } else { "b2:7100" };
                assert!(table.may_start("/e1/t", now));
                assert!(matches!(
                    table.on_redirect("/e1/t", u64::from(hop % 2 + 1), addr, now),
                    RedirectDecision::Follow { .. }
                ));
            }
            match table.on_redirect("/e1/t", 2, "b2:7100", now) {
                RedirectDecision::Loop { delay, until, .. } => {
                    assert_eq!(until, now + delay);
                    assert_eq!(table.target("/e1/t"), None, "back on bootstrap");
                    assert!(!table.may_start("/e1/t", now));
                    assert!(!table.may_start("/e1/t", until - Duration::from_millis(1)));
                    assert!(table.may_start("/e1/t", until));
                    delays.push(delay.as_secs());
                    now = until;
                }
                other => panic!("expected a loop, got {other:?}"),
            }
        }
        assert_eq!(delays, [1, 2, 4, 8, 16, 30, 30]);
        // A Welcome ends the attempt: the next loop waits 1 s again.
        table.on_resumed("/e1/t");
        for _ in 0..MAX_REDIRECT_HOPS {
            let _ = table.on_redirect("/e1/t", 2, "b2:7100", now);
        }
        assert!(matches!(
            table.on_redirect("/e1/t", 2, "b2:7100", now),
            RedirectDecision::Loop { loops: 1, delay, .. } if delay == LOOP_BACKOFF_MIN
        ));
    }
}
