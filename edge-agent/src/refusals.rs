//! Log lines for publishes refused because storage is full: HTTP `507`
//! (`disk_budget_full`, `disk_full`) and MQTT `0x97`. Every refusal is
//! counted (`tributary_edge_refused_records_total`,
//! `tributary_edge_disk_full_total`, `tributary_edge_mqtt_refused_full_total`);
//! the log says so at most once per topic and kind every [`WINDOW`], a
//! `warn` line with plain fields (`topic`, `kind`, `limit`, `limit_bytes`,
//! `used_bytes`, `batch_bytes` or `path`, `via`) and `suppressed`: how many
//! refusals of that topic and kind were not logged since its previous line.
//! A producer retrying against a full budget thus costs one line per ten
//! seconds, not one per request.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

use tracing::warn;

use crate::budget::BudgetScope;
use crate::topic::PublishError;

/// At most one line per topic and kind in this long.
pub const WINDOW: Duration = Duration::from_secs(10);

/// A topic and a refusal kind.
type Key = (String, &'static str);

/// Which refusals were logged when, and how many were not since.
#[derive(Debug)]
pub struct RefusalLog {
    window: Duration,
    /// Per key: when its last line was logged, refusals since.
    slots: Mutex<HashMap<Key, (Instant, u64)>>,
}

impl RefusalLog {
    /// A log that lets one line per topic and kind through per `window`.
    pub fn new(window: Duration) -> RefusalLog {
        RefusalLog {
            window,
            slots: Mutex::new(HashMap::new()),
        }
    }

    /// A refusal of `topic` for `kind` at `now`: `Some(suppressed)` when it
    /// is to be logged (with the refusals not logged since the previous
    /// line), `None` when it is only counted.
    pub fn admit(&self, topic: &str, kind: &'static str, now: Instant) -> Option<u64> {
        let mut slots = self
            .slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match slots.get_mut(&(topic.to_owned(), kind)) {
            Some((logged_at, suppressed))
                if now.saturating_duration_since(*logged_at) < self.window =>
            {
                *suppressed += 1;
                None
            }
            Some(slot) => {
                let suppressed = slot.1;
                *slot = (now, 0);
                Some(suppressed)
            }
            None => {
                slots.insert((topic.to_owned(), kind), (now, 0));
                Some(0)
            }
        }
    }
}

/// The agent's log of storage refusals.
pub static STORAGE_REFUSALS: LazyLock<RefusalLog> = LazyLock::new(|| RefusalLog::new(WINDOW));

/// Logs `error` (rate-limited, see the module doc) if it is a storage
/// refusal; `via` is `http` or `mqtt`.
pub fn log_storage_refusal(error: &PublishError, via: &'static str) {
    let now = Instant::now();
    match error {
        PublishError::Full(full) => {
            let kind = "disk_budget_full";
            let Some(suppressed) = STORAGE_REFUSALS.admit(full.topic.as_str(), kind, now) else {
                return;
            };
            let limit = match full.scope {
                BudgetScope::Topic => "topic disk_budget_bytes",
                BudgetScope::Agent => "agent disk_budget_bytes",
            };
            warn!(
                topic = full.topic.as_str(),
                kind,
                limit,
                limit_bytes = full.limit_bytes,
                used_bytes = full.used_bytes,
                batch_bytes = full.batch_bytes,
                via,
                suppressed,
                "publish refused: the disk budget is full (HTTP 507); at most one line per topic every 10 s, suppressed counts the refusals since the previous one"
            );
        }
        PublishError::DiskFull { topic, path, .. } => {
            let kind = "disk_full";
            let Some(suppressed) = STORAGE_REFUSALS.admit(topic.as_str(), kind, now) else {
                return;
            };
            warn!(
                topic = topic.as_str(),
                kind,
                path = %path.display(),
                via,
                suppressed,
                "publish refused: the file system holding the topic's WAL is full (HTTP 507); at most one line per topic every 10 s, suppressed counts the refusals since the previous one"
            );
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_topic_and_kind_per_window_with_the_count_suppressed() {
        let log = RefusalLog::new(Duration::from_secs(10));
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        assert_eq!(log.admit("/e/a", "disk_budget_full", at(0)), Some(0));
        assert_eq!(log.admit("/e/a", "disk_budget_full", at(1)), None);
        assert_eq!(log.admit("/e/a", "disk_budget_full", at(9_999)), None);
        // Another topic, another kind: their own lines.
        assert_eq!(log.admit("/e/b", "disk_budget_full", at(5)), Some(0));
        assert_eq!(log.admit("/e/a", "disk_full", at(6)), Some(0));
        assert_eq!(log.admit("/e/a", "disk_budget_full", at(10_000)), Some(2));
        assert_eq!(log.admit("/e/a", "disk_budget_full", at(10_001)), None);
        assert_eq!(log.admit("/e/a", "disk_budget_full", at(30_000)), Some(1));
    }
}
