//! The central un-archived byte budget (`[budget]` in the broker
//! configuration): a bound on the local WAL bytes the broker holds that the
//! archive does not, so an object store that is down stops acceptance
//! instead of filling the broker's disk.
//!
//! **What counts.** A topic's un-archived bytes are the bytes of its local
//! segment files not covered by its committed tiered offset (`segments/cur`
//! in Raft, under the default storage prefix): every segment except the
//! sealed ones wholly below that offset. A topic with no committed
//! descriptor counts all its local bytes: with no tier service running, the
//! budget bounds the whole local WAL. The limit is checked against the
//! *sealed* un-archived segments; the active segment (which the tier
//! service cannot archive before it seals) comes on top, so the un-archived
//! WAL stays within the budget plus one segment, and a refusal never waits
//! for a segment that cannot seal. The budget is off unless configured.
//!
//! **When reached** (the broker total at or above `unarchived_bytes`, or a
//! topic at or above its `topics` limit), new batches for the affected
//! topics are refused before they are written: an edge stream gets the
//! `Error` frame with code `Unavailable` and a message starting
//! `budget_exceeded:` (the edge keeps its records and retries with its
//! backoff, as during a link outage), a central producer gets
//! `507 budget_exceeded`. Nothing acknowledged is dropped to make room.
//! Refusals count in `tributary_broker_budget_refusals_total`; the bytes
//! (all un-archived, the active segments included) are
//! `tributary_broker_unarchived_bytes`; one warning is logged per topic when
//! an episode starts and one line when it ends. Acceptance resumes by
//! itself once tiering moves the tiered offset (and trims delete the
//! segments).
//!
//! Committed tiered offsets are re-read every `refresh_ms`; segment sizes
//! are read live at each check.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use broker_core::metadata::MetadataStore;
use broker_core::wal::Wal;
use serde::{Deserialize, Serialize};
use tracing::{info, warn};
use tributary_proto::keys::{DEFAULT_STORAGE_PREFIX, StorageKeys, TopicName};

use crate::replication::topics::TopicStore;

/// `[budget]`: the un-archived byte budget. Off unless a limit is set.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct BudgetConfig {
    /// Un-archived WAL bytes this broker holds at most, over all topics.
    /// Default none (no broker-wide limit).
    pub unarchived_bytes: Option<u64>,
    /// Per-topic limits of un-archived bytes, by topic name
    /// (`"/ns/topic" = bytes`). Default none.
    pub topics: BTreeMap<String, u64>,
    /// How often committed tiered offsets are re-read, ms. Default 1000.
    pub refresh_ms: u64,
}

impl Default for BudgetConfig {
    fn default() -> Self {
        BudgetConfig {
            unarchived_bytes: None,
            topics: BTreeMap::new(),
            refresh_ms: 1000,
        }
    }
}

impl BudgetConfig {
    /// Whether any limit is set.
    pub fn enabled(&self) -> bool {
        self.unarchived_bytes.is_some() || !self.topics.is_empty()
    }
}

/// A batch refused by the budget.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "budget_exceeded: {scope} holds {used} un-archived WAL bytes, its budget is {limit}; new records are accepted again once the tier service archives and trims (check the object store)"
)]
pub struct BudgetExceeded {
    /// `broker` or `topic /ns/name`.
    pub scope: String,
    /// Un-archived bytes now.
    pub used: u64,
    /// The limit, bytes.
    pub limit: u64,
}

/// The budget's state: cached tiered offsets, counters, the episode flag.
pub struct Budget {
    config: BudgetConfig,
    /// Weak: the topic store holds the budget ([`TopicStore::set_budget`]).
    topics: Weak<TopicStore>,
    store: Arc<dyn MetadataStore>,
    tiered: Mutex<HashMap<TopicName, u64>>,
    refusals: AtomicU64,
    /// Topics refused since their last accepted batch (an episode each).
    over: Mutex<HashSet<TopicName>>,
}

/// Un-archived bytes of `wal` given its committed tiered offset: all its
/// segment bytes except the sealed segments wholly below the offset (the
/// active segment included).
pub fn unarchived_bytes(wal: &Wal, tiered_offset: u64) -> u64 {
    let archived: u64 = wal
        .sealed_segments()
        .iter()
        .filter(|s| s.next_offset <= tiered_offset)
        .map(|s| s.bytes)
        .sum();
    wal.size_bytes().saturating_sub(archived)
}

/// The bytes of `wal`'s sealed segments not wholly below `tiered_offset`:
/// what the budget limits.
pub fn sealed_unarchived_bytes(wal: &Wal, tiered_offset: u64) -> u64 {
    wal.sealed_segments()
        .iter()
        .filter(|s| s.next_offset > tiered_offset)
        .map(|s| s.bytes)
        .sum()
}

impl Budget {
    /// A budget over the open topics of `topics`, tiered offsets from
    /// `store`.
    pub fn new(
        config: BudgetConfig,
        topics: &Arc<TopicStore>,
        store: Arc<dyn MetadataStore>,
    ) -> Arc<Budget> {
        Arc::new(Budget {
            config,
            topics: Arc::downgrade(topics),
            store,
            tiered: Mutex::new(HashMap::new()),
            refusals: AtomicU64::new(0),
            over: Mutex::new(HashSet::new()),
        })
    }

    /// Makes `budget` the one its topic store checks
    /// ([`TopicStore::check_budget`]) and the metrics show (the first call
    /// wins: `None` afterwards) and starts its refresh task, which ends when
    /// the topic store is dropped.
    pub fn install(budget: Arc<Budget>) -> Option<tokio::task::JoinHandle<()>> {
        let topics = budget.topics.upgrade()?;
        if !topics.set_budget(budget.clone()) {
            return None;
        }
        drop(topics);
        let every = Duration::from_millis(budget.config.refresh_ms.max(10));
        Some(tokio::spawn(async move {
            let mut interval = tokio::time::interval(every);
            interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                interval.tick().await;
                if budget.topics.strong_count() == 0 {
                    return;
                }
                budget.refresh().await;
            }
        }))
    }

    /// Re-reads the committed tiered offset of every open topic.
    pub async fn refresh(&self) {
        let Ok(keys) = StorageKeys::new(DEFAULT_STORAGE_PREFIX) else {
            return;
        };
        let Some(topics) = self.topics.upgrade() else {
            return;
        };
        for (topic, _) in topics.open_topics().await {
            match crate::storage::tiered_offset(&*self.store, &keys, &topic).await {
                Ok(offset) => {
                    if let Ok(mut tiered) = self.tiered.lock() {
                        tiered.insert(topic, offset.unwrap_or(0));
                    }
                }
                Err(e) => {
                    warn!(%topic, error = %e, "budget: reading the tiered offset failed; keeping the last one");
                }
            }
        }
    }

    fn tiered_offset(&self, topic: &TopicName) -> u64 {
        self.tiered
            .lock()
            .ok()
            .and_then(|t| t.get(topic).copied())
            .unwrap_or(0)
    }

    /// Sealed un-archived bytes (what the limits apply to) per open topic
    /// and in all, now.
    pub async fn usage(&self) -> (Vec<(TopicName, u64)>, u64) {
        let mut per_topic = Vec::new();
        let mut total = 0u64;
        let Some(topics) = self.topics.upgrade() else {
            return (per_topic, total);
        };
        for (topic, wal) in topics.open_topics().await {
            let bytes = sealed_unarchived_bytes(&wal, self.tiered_offset(&topic));
            total = total.saturating_add(bytes);
            per_topic.push((topic, bytes));
        }
        (per_topic, total)
    }

    /// Whether a new batch for `topic` may be accepted. Counts a refusal
    /// and logs the start (or end) of an episode.
    ///
    /// # Errors
    /// [`BudgetExceeded`] naming the scope that is full.
    pub async fn admit(&self, topic: &TopicName) -> Result<(), BudgetExceeded> {
        let (per_topic, total) = self.usage().await;
        let mut refused = None;
        if let Some(limit) = self.config.unarchived_bytes
            && total >= limit
        {
            refused = Some(BudgetExceeded {
                scope: "broker".into(),
                used: total,
                limit,
            });
        }
        if refused.is_none()
            && let Some(&limit) = self.config.topics.get(topic.as_str())
        {
            let used = per_topic
                .iter()
                .find(|(t, _)| t == topic)
                .map_or(0, |(_, b)| *b);
            if used >= limit {
                refused = Some(BudgetExceeded {
                    scope: format!("topic {topic}"),
                    used,
                    limit,
                });
            }
        }
        match refused {
            Some(e) => {
                self.refusals.fetch_add(1, Ordering::Relaxed);
                let started = self.over.lock().is_ok_and(|mut o| o.insert(topic.clone()));
                if started {
                    warn!(%topic, scope = %e.scope, used = e.used, limit = e.limit, "un-archived WAL budget reached: refusing new batches until the tier service archives and trims");
                }
                Err(e)
            }
            None => {
                let ended = self.over.lock().is_ok_and(|mut o| o.remove(topic));
                if ended {
                    info!(%topic, total, "un-archived WAL back under its budget: accepting batches again");
                }
                Ok(())
            }
        }
    }

    /// Batches refused so far.
    pub fn refusals(&self) -> u64 {
        self.refusals.load(Ordering::Relaxed)
    }
}
