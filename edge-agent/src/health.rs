//! When nothing can leave the device: the replication stall behind
//! `/health`'s `unhealthy` status and `tributary_edge_replication_stalled_seconds`.
//!
//! Replication is *stalled* while
//! - the agent holds no connection to any broker (bootstrap or owner), or
//! - a WAL topic holds records the broker has not acknowledged and its
//!   acknowledged offset has not moved (a refused stream, a broker whose
//!   budget is full, a redirect loop: connected, yet nothing leaves).
//!
//! It is *unhealthy* once stalled for longer than
//! `[replication] unhealthy_after_ms` (default
//! [`crate::config::DEFAULT_UNHEALTHY_AFTER_MS`]). Pure: the agent feeds
//! [`StallWatch::observe`] about once a second with the time and what it
//! sees; [`StallWatch::report`] says how long and why.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// What [`StallWatch::observe`] is told about one WAL topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopicProgress<'a> {
    /// `/{ns}/{topic}`.
    pub name: &'a str,
    /// Next offset the topic's WAL assigns.
    pub high_water_mark: u64,
    /// Everything below it is acknowledged by the broker.
    pub acknowledged_offset: u64,
}

/// The stall state of the agent's replication.
#[derive(Debug, Clone)]
pub struct StallWatch {
    unhealthy_after: Duration,
    /// Since when no broker connection is open; `None` while one is.
    link_down_since: Option<Instant>,
    /// Per topic: the acknowledged offset last seen and since when the
    /// topic has waited with a backlog and no acknowledgement.
    topics: HashMap<String, (u64, Option<Instant>)>,
}

/// How long and why nothing could leave the device, at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StallReport {
    /// How long the longest current stall has lasted; zero when none.
    pub stalled_for: Duration,
    /// Stalled for longer than the setting.
    pub unhealthy: bool,
    /// One sentence per current stall, longest first.
    pub reasons: Vec<String>,
}

impl StallWatch {
    /// A watch that calls a stall longer than `unhealthy_after` unhealthy;
    /// the agent starts at `now` with no broker connection.
    pub fn new(unhealthy_after: Duration, now: Instant) -> StallWatch {
        StallWatch {
            unhealthy_after,
            link_down_since: Some(now),
            topics: HashMap::new(),
        }
    }

    /// What the agent sees at `now`: whether any broker connection is open
    /// (`connected`) and each WAL topic's offsets.
    pub fn observe<'a>(
        &mut self,
        now: Instant,
        connected: bool,
        topics: impl IntoIterator<Item = TopicProgress<'a>>,
    ) {
        match (connected, self.link_down_since) {
            (true, _) => self.link_down_since = None,
            (false, None) => self.link_down_since = Some(now),
            (false, Some(_)) => {}
        }
        let mut seen: HashMap<String, (u64, Option<Instant>)> = HashMap::new();
        for t in topics {
            let previous = self.topics.remove(t.name);
            let waiting = t.high_water_mark > t.acknowledged_offset;
            let since = match previous {
                _ if !waiting => None,
                Some((acked, since)) if acked == t.acknowledged_offset => since.or(Some(now)),
                // Acknowledgements moved (or first seen): progress now.
                _ => Some(now),
            };
            seen.insert(t.name.to_owned(), (t.acknowledged_offset, since));
        }
        self.topics = seen;
    }

    /// The stall at `now`.
    pub fn report(&self, now: Instant) -> StallReport {
        let mut stalls: Vec<(Duration, String)> = Vec::new();
        if let Some(since) = self.link_down_since {
            let for_ = now.saturating_duration_since(since);
            stalls.push((
                for_,
                format!("no connection to any broker for {} s", for_.as_secs()),
            ));
        }
        for (name, (acked, since)) in &self.topics {
            if let Some(since) = since {
                let for_ = now.saturating_duration_since(*since);
                // A backlog younger than an observation is normal traffic.
                if for_.is_zero() {
                    continue;
                }
                stalls.push((
                    for_,
                    format!(
                        "{name}: records waiting and nothing acknowledged past offset {acked} for {} s",
                        for_.as_secs()
                    ),
                ));
            }
        }
        stalls.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
        let stalled_for = stalls.first().map_or(Duration::ZERO, |s| s.0);
        StallReport {
            stalled_for,
            unhealthy: stalled_for > self.unhealthy_after,
            reasons: stalls.into_iter().map(|s| s.1).collect(),
        }
    }

    /// The setting: a stall longer than this is unhealthy.
    pub fn unhealthy_after(&self) -> Duration {
        self.unhealthy_after
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topic(name: &str, hwm: u64, acked: u64) -> TopicProgress<'_> {
        TopicProgress {
            name,
            high_water_mark: hwm,
            acknowledged_offset: acked,
        }
    }

    #[test]
    fn no_broker_for_longer_than_the_setting_is_unhealthy_until_one_answers() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut watch = StallWatch::new(Duration::from_secs(60), t0);
        watch.observe(at(30_000), false, []);
        let r = watch.report(at(30_000));
        assert_eq!(r.stalled_for, Duration::from_secs(30));
        assert!(!r.unhealthy);
        assert_eq!(r.reasons, ["no connection to any broker for 30 s"]);
        let r = watch.report(at(60_001));
        assert!(r.unhealthy, "past the setting");
        watch.observe(at(61_000), true, []);
        let r = watch.report(at(61_000));
        assert_eq!(r.stalled_for, Duration::ZERO);
        assert!(!r.unhealthy && r.reasons.is_empty());
        // The next loss starts a new count.
        watch.observe(at(70_000), false, []);
        assert_eq!(watch.report(at(75_000)).stalled_for, Duration::from_secs(5));
    }

    #[test]
    fn a_topic_whose_backlog_is_not_acknowledged_stalls_while_connected() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut watch = StallWatch::new(Duration::from_secs(10), t0);
        watch.observe(at(0), true, [topic("/e/a", 100, 100), topic("/e/b", 5, 0)]);
        assert_eq!(
            watch.report(at(0)).stalled_for,
            Duration::ZERO,
            "a fresh backlog is traffic"
        );
        // /e/a keeps moving; /e/b does not.
        watch.observe(
            at(6_000),
            true,
            [topic("/e/a", 200, 150), topic("/e/b", 9, 0)],
        );
        watch.observe(
            at(11_000),
            true,
            [topic("/e/a", 300, 250), topic("/e/b", 9, 0)],
        );
        let r = watch.report(at(11_000));
        assert_eq!(r.stalled_for, Duration::from_secs(11));
        assert!(r.unhealthy);
        assert_eq!(
            r.reasons,
            ["/e/b: records waiting and nothing acknowledged past offset 0 for 11 s"]
        );
        // One acknowledgement: progress again.
        watch.observe(
            at(12_000),
            true,
            [topic("/e/a", 300, 300), topic("/e/b", 9, 4)],
        );
        assert!(!watch.report(at(12_000)).unhealthy);
        // Caught up: no stall however long it stays so.
        watch.observe(at(13_000), true, [topic("/e/b", 9, 9)]);
        assert_eq!(watch.report(at(99_000)).stalled_for, Duration::ZERO);
    }

    #[test]
    fn the_longest_stall_comes_first() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut watch = StallWatch::new(Duration::from_secs(1), t0);
        watch.observe(at(1_000), false, [topic("/e/a", 3, 0)]);
        let r = watch.report(at(4_000));
        assert_eq!(r.stalled_for, Duration::from_secs(4));
        assert_eq!(r.reasons.len(), 2);
        assert!(r.reasons[0].starts_with("no connection"), "{:?}", r.reasons);
    }
}
