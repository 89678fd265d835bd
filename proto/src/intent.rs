//! Stream intents: what a topic is for, expanded into concrete delivery, WAL
//! durability and failure-handling settings (`seeds/000_d502aacc865e81b1.txt`).
//!
//! # The table
//!
//! | intent | aliases | delivery | wal_sync_mode | max_retries | backoff_ms | poison_policy | dlq_suffix | persistence |
//! |---|---|---|---|---|---|---|---|---|
//! | `realtime` | telemetry_firehose, firehose, telemetry, ephemeral | NonReliable | async | 0 | 0 | none | — | in_memory |
//! | `event_stream` | agent_event_mesh, event_mesh, events, lakehouse_feed, lakehouse, custom | Reliable | os_cache_flush | 3 | 500 | dead_letter | `-dlq` | wal |
//! | `task_queue` | agent_task_queue, tasks, work_queue | Reliable | fsync_batch | 5 | 1000 | dead_letter | `-dlq` | wal |
//! | `audit_log` | tool_invocation_log, tool_log, audit, state_log | Reliable | fsync_batch | 10 | 500 | block | — | wal |
//!
//! Aliases normalize to their canonical intent when parsed, so only canonical
//! names are ever stored. Parsing ignores surrounding whitespace and ASCII
//! case (`Task_Queue` is `task_queue`); nothing else is translated (`task-queue`
//! is unknown).
//!
//! # Flow
//! Explicit creation stores [`ExpandedStreamSettings`] at
//! `/topics/{ns}/{topic}/intent` and its [`Delivery`] at `.../delivery`.
//! The first attach of a subscription derives a [`SubscriptionFailurePolicy`]
//! from the stored settings with [`SubscriptionFailurePolicy::inherit`].
//! Implicit creation (first publish to an unknown topic) uses
//! [`ImplicitTopicSettings::broker_fallback`].

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::SyncMode;
use crate::keys::{NameError, TopicName};

/// Suffix of the dead-letter topic of the DLQ intents: `<topic>-dlq`.
pub const DEFAULT_DLQ_SUFFIX: &str = "-dlq";
/// Ack timeout of derived and fallback failure policies, ms.
pub const DEFAULT_ACK_TIMEOUT_MS: u64 = 30_000;
/// Largest redelivery delay of derived and fallback failure policies, ms.
pub const DEFAULT_MAX_REDELIVERY_DELAY_MS: u64 = 60_000;
/// WAL sync mode of implicitly created topics (the cluster default when a
/// WAL directory is configured).
pub const CLUSTER_DEFAULT_WAL_SYNC: SyncMode = SyncMode::OsCacheFlush;

// ---------------------------------------------------------------------------
// Intents
// ---------------------------------------------------------------------------

/// A canonical stream intent.
///
/// Serialized as its canonical name; deserializing also accepts aliases.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "&'static str")]
pub enum StreamIntent {
    /// Live metrics, heartbeats, ephemeral firehose: in memory, no retries.
    Realtime,
    /// Pub/sub event bus, agent event mesh, CDC / lakehouse feed.
    EventStream,
    /// Durable worker queues, agent task dispatch.
    TaskQueue,
    /// Tool invocation ledgers, compliance and state logs: never skip.
    AuditLog,
}

impl StreamIntent {
    /// Every intent, in table order.
    pub const ALL: [StreamIntent; 4] = [
        StreamIntent::Realtime,
        StreamIntent::EventStream,
        StreamIntent::TaskQueue,
        StreamIntent::AuditLog,
    ];

    /// The canonical name.
    pub fn as_str(self) -> &'static str {
        match self {
            StreamIntent::Realtime => "realtime",
            StreamIntent::EventStream => "event_stream",
            StreamIntent::TaskQueue => "task_queue",
            StreamIntent::AuditLog => "audit_log",
        }
    }

    /// The aliases that normalize to this intent.
    pub fn aliases(self) -> &'static [&'static str] {
        match self {
            StreamIntent::Realtime => &["telemetry_firehose", "firehose", "telemetry", "ephemeral"],
            StreamIntent::EventStream => &[
                "agent_event_mesh",
                "event_mesh",
                "events",
                "lakehouse_feed",
                "lakehouse",
                "custom",
            ],
            StreamIntent::TaskQueue => &["agent_task_queue", "tasks", "work_queue"],
            StreamIntent::AuditLog => &["tool_invocation_log", "tool_log", "audit", "state_log"],
        }
    }

    /// Parses a canonical name or an alias (ASCII case-insensitive, surrounding
    /// whitespace ignored).
    ///
    /// # Errors
    /// [`IntentError::Unknown`], whose message lists every valid name.
    pub fn parse(name: &str) -> Result<StreamIntent, IntentError> {
        let wanted = name.trim();
        StreamIntent::ALL
            .into_iter()
            .find(|intent| {
                intent.as_str().eq_ignore_ascii_case(wanted)
                    || intent
                        .aliases()
                        .iter()
                        .any(|alias| alias.eq_ignore_ascii_case(wanted))
            })
            .ok_or_else(|| IntentError::Unknown {
                input: name.to_owned(),
            })
    }

    /// The expanded settings of this intent (the table in the module doc).
    pub fn expand(self) -> ExpandedStreamSettings {
        let (delivery, wal_sync_mode, max_retries, backoff_ms, poison_policy, dlq, persistence) =
            match self {
                StreamIntent::Realtime => (
                    Delivery::NonReliable,
                    SyncMode::Async,
                    0,
                    0,
                    PoisonPolicy::None,
                    false,
                    Persistence::InMemory,
                ),
                StreamIntent::EventStream => (
                    Delivery::Reliable,
                    SyncMode::OsCacheFlush,
                    3,
                    500,
                    PoisonPolicy::DeadLetter,
                    true,
                    Persistence::Wal,
                ),
                StreamIntent::TaskQueue => (
                    Delivery::Reliable,
                    SyncMode::FsyncBatch,
                    5,
                    1000,
                    PoisonPolicy::DeadLetter,
                    true,
                    Persistence::Wal,
                ),
                StreamIntent::AuditLog => (
                    Delivery::Reliable,
                    SyncMode::FsyncBatch,
                    10,
                    500,
                    PoisonPolicy::Block,
                    false,
                    Persistence::Wal,
                ),
            };
        ExpandedStreamSettings {
            intent: self,
            delivery,
            wal_sync_mode,
            max_retries,
            backoff_ms,
            poison_policy,
            dlq_suffix: dlq.then(|| DEFAULT_DLQ_SUFFIX.to_owned()),
            persistence,
        }
    }
}

impl fmt::Display for StreamIntent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for StreamIntent {
    type Err = IntentError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        StreamIntent::parse(s)
    }
}

impl TryFrom<String> for StreamIntent {
    type Error = IntentError;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        StreamIntent::parse(&s)
    }
}

impl From<StreamIntent> for &'static str {
    fn from(intent: StreamIntent) -> &'static str {
        intent.as_str()
    }
}

/// Every valid intent name, for error messages:
/// `realtime (aliases: telemetry_firehose, ...), event_stream (...), ...`.
pub fn valid_intent_names() -> String {
    StreamIntent::ALL
        .iter()
        .map(|intent| format!("{} (aliases: {})", intent, intent.aliases().join(", ")))
        .collect::<Vec<_>>()
        .join("; ")
}

/// Errors of this module.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IntentError {
    /// Not a canonical intent or alias.
    #[error(
        "unknown stream intent {input:?}; valid intents: {}",
        valid_intent_names()
    )]
    Unknown {
        /// The refused input, unchanged.
        input: String,
    },
}

// ---------------------------------------------------------------------------
// Settings
// ---------------------------------------------------------------------------

/// How a topic dispatches: the value stored at `/topics/{ns}/{topic}/delivery`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Delivery {
    /// Acknowledged, redelivered, stored in the WAL per its sync mode.
    Reliable,
    /// Fire and forget, in memory.
    NonReliable,
}

impl Delivery {
    /// The stored form, `"Reliable"` or `"NonReliable"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Delivery::Reliable => "Reliable",
            Delivery::NonReliable => "NonReliable",
        }
    }

    /// The lower-case form of the describe summary, `reliable` or
    /// `non_reliable`.
    pub fn summary_name(self) -> &'static str {
        match self {
            Delivery::Reliable => "reliable",
            Delivery::NonReliable => "non_reliable",
        }
    }
}

impl fmt::Display for Delivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What happens to a message whose delivery attempts exceed the limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PoisonPolicy {
    /// Copy it to the dead-letter topic with origin headers and advance the
    /// cursor past it.
    DeadLetter,
    /// Halt delivery on it until it is acknowledged, the policy changes or
    /// the cursor is moved.
    Block,
    /// Drop it: advance the cursor without copying it anywhere (the realtime
    /// intent, which does not redeliver at all).
    None,
}

impl PoisonPolicy {
    /// The stored form: `dead_letter`, `block` or `none`.
    pub fn as_str(self) -> &'static str {
        match self {
            PoisonPolicy::DeadLetter => "dead_letter",
            PoisonPolicy::Block => "block",
            PoisonPolicy::None => "none",
        }
    }
}

impl fmt::Display for PoisonPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a topic's records live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Persistence {
    /// Memory only, no WAL (realtime).
    InMemory,
    /// The topic's WAL, tiered to object storage when sealed.
    Wal,
}

impl Persistence {
    /// The stored form: `in_memory` or `wal`.
    pub fn as_str(self) -> &'static str {
        match self {
            Persistence::InMemory => "in_memory",
            Persistence::Wal => "wal",
        }
    }
}

/// The expanded settings stored at `/topics/{ns}/{topic}/intent`.
///
/// JSON field names are fixed: `intent`, `delivery`, `wal_sync_mode`,
/// `max_retries`, `backoff_ms`, `poison_policy`, `dlq_suffix` (string or
/// null), `persistence`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExpandedStreamSettings {
    /// The canonical intent.
    pub intent: StreamIntent,
    /// Dispatch strategy.
    pub delivery: Delivery,
    /// WAL durability; a topic's WAL is always opened with this value.
    #[serde(with = "sync_mode_serde")]
    pub wal_sync_mode: SyncMode,
    /// Redeliveries before the poison policy applies.
    pub max_retries: u32,
    /// Base redelivery backoff, ms.
    pub backoff_ms: u64,
    /// What happens after `max_retries`.
    pub poison_policy: PoisonPolicy,
    /// Dead-letter topic suffix (`"-dlq"`), `None` without a DLQ.
    pub dlq_suffix: Option<String>,
    /// Where records live.
    pub persistence: Persistence,
}

impl ExpandedStreamSettings {
    /// The dead-letter topic of `topic` (`<topic><dlq_suffix>`), `None`
    /// without a DLQ suffix.
    ///
    /// # Errors
    /// [`NameError`] when the suffixed name is invalid (e.g. too long).
    pub fn dlq_topic(&self, topic: &TopicName) -> Result<Option<TopicName>, NameError> {
        self.dlq_suffix
            .as_deref()
            .map(|suffix| topic.with_suffix(suffix))
            .transpose()
    }

    /// The one-line summary of `describe`, e.g.
    /// `task_queue (delivery=reliable, wal_sync=fsync_batch, max_retries=5,
    /// backoff_ms=1000, poison_policy=dead_letter, dlq=/default/agent-jobs-dlq)`;
    /// `dlq=none` without a DLQ suffix.
    pub fn summary(&self, topic: &TopicName) -> String {
        let dlq = match &self.dlq_suffix {
            // Display only: an over-long name is still shown as it would be.
            Some(suffix) => format!("{topic}{suffix}"),
            None => "none".to_owned(),
        };
        format!(
            "{} (delivery={}, wal_sync={}, max_retries={}, backoff_ms={}, poison_policy={}, dlq={dlq})",
            self.intent,
            self.delivery.summary_name(),
            self.wal_sync_mode,
            self.max_retries,
            self.backoff_ms,
            self.poison_policy,
        )
    }
}

/// Serde for [`SyncMode`] as its configuration name (`async`,
/// `os_cache_flush`, `fsync_batch`).
pub mod sync_mode_serde {
    use std::str::FromStr;

    use serde::{Deserialize, Deserializer, Serializer};

    use crate::SyncMode;

    /// Serializes `mode` as its name.
    ///
    /// # Errors
    /// Those of the serializer.
    pub fn serialize<S: Serializer>(mode: &SyncMode, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(mode.as_str())
    }

    /// Deserializes a mode name.
    ///
    /// # Errors
    /// An unknown name, listing the valid ones.
    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<SyncMode, D::Error> {
        let name = String::deserialize(deserializer)?;
        SyncMode::from_str(&name).map_err(serde::de::Error::custom)
    }
}

// ---------------------------------------------------------------------------
// Subscription failure policies
// ---------------------------------------------------------------------------

/// How the redelivery delay grows with the attempt number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackoffStrategy {
    /// `base * 2^(attempt - 1)`, capped at the maximum.
    Exponential,
    /// `base` for every attempt (capped at the maximum).
    Fixed,
    /// `base * attempt`, capped at the maximum.
    Linear,
}

impl BackoffStrategy {
    /// The stored form: `exponential`, `fixed` or `linear`.
    pub fn as_str(self) -> &'static str {
        match self {
            BackoffStrategy::Exponential => "exponential",
            BackoffStrategy::Fixed => "fixed",
            BackoffStrategy::Linear => "linear",
        }
    }
}

impl fmt::Display for BackoffStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A subscription's failure policy, stored at
/// `/topics/{ns}/{topic}/subscriptions/{sub}/failure_policy`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubscriptionFailurePolicy {
    /// Redeliveries before the poison policy applies.
    pub max_redelivery_count: u32,
    /// Time after which an unacknowledged delivery counts as failed, ms.
    pub ack_timeout_ms: u64,
    /// Delay before the first redelivery, ms.
    pub base_redelivery_delay_ms: u64,
    /// Cap of the redelivery delay, ms.
    pub max_redelivery_delay_ms: u64,
    /// Growth of the delay.
    pub backoff_strategy: BackoffStrategy,
    /// What happens after `max_redelivery_count`.
    pub poison_policy: PoisonPolicy,
    /// Topic that receives poison messages; required for `dead_letter`.
    pub dead_letter_topic: Option<String>,
}

/// A failure policy whose fields contradict each other.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// `dead_letter` without a `dead_letter_topic`.
    #[error("poison_policy dead_letter requires dead_letter_topic")]
    MissingDeadLetterTopic,
    /// `dead_letter_topic` is not a valid topic name.
    #[error("dead_letter_topic: {0}")]
    DeadLetterTopic(#[from] NameError),
    /// `base_redelivery_delay_ms > max_redelivery_delay_ms`.
    #[error("base_redelivery_delay_ms {base} exceeds max_redelivery_delay_ms {max}")]
    DelayRange {
        /// Base delay, ms.
        base: u64,
        /// Maximum delay, ms.
        max: u64,
    },
    /// `ack_timeout_ms` of 0 would time out every delivery at once.
    #[error("ack_timeout_ms must be above 0")]
    ZeroAckTimeout,
    /// `dead_letter_topic` names the subscription's own topic.
    #[error(
        "dead_letter_topic {0} is the subscription's own topic: each dead-lettered message \
         would be delivered to it again, forever"
    )]
    DeadLetterIsSource(String),
    /// `dead_letter_topic` is in another namespace than the subscription's
    /// topic: a principal allowed to write one namespace would write
    /// another's (an edge's, `default`) through its dead letters.
    #[error(
        "dead_letter_topic {dlq} is not in namespace {namespace:?} of the subscription's topic: \
         a dead-letter topic must be in the same namespace (e.g. /{namespace}/<topic>-dlq)"
    )]
    DeadLetterOtherNamespace {
        /// The dead-letter topic.
        dlq: String,
        /// The subscription's topic's namespace.
        namespace: String,
    },
    /// `dead_letter_topic` is in a system namespace (`/_system/...`).
    #[error(
        "dead_letter_topic {0} is a system topic (namespaces starting with '_' are the \
         brokers'): dead letters may not be written there"
    )]
    DeadLetterSystem(String),
}

impl PolicyError {
    /// The policy field to change.
    pub fn field(&self) -> &'static str {
        match self {
            PolicyError::MissingDeadLetterTopic
            | PolicyError::DeadLetterTopic(_)
            | PolicyError::DeadLetterIsSource(_)
            | PolicyError::DeadLetterOtherNamespace { .. }
            | PolicyError::DeadLetterSystem(_) => "dead_letter_topic",
            PolicyError::DelayRange { .. } => "base_redelivery_delay_ms",
            PolicyError::ZeroAckTimeout => "ack_timeout_ms",
        }
    }
}

impl SubscriptionFailurePolicy {
    /// The policy of subscriptions on implicitly created topics: 5
    /// redeliveries, 30 s ack timeout, 1 s to 60 s exponential backoff,
    /// block.
    pub fn broker_fallback() -> SubscriptionFailurePolicy {
        SubscriptionFailurePolicy {
            max_redelivery_count: 5,
            ack_timeout_ms: DEFAULT_ACK_TIMEOUT_MS,
            base_redelivery_delay_ms: 1000,
            max_redelivery_delay_ms: DEFAULT_MAX_REDELIVERY_DELAY_MS,
            backoff_strategy: BackoffStrategy::Exponential,
            poison_policy: PoisonPolicy::Block,
            dead_letter_topic: None,
        }
    }

    /// Derives the policy a new subscription of `topic` inherits from the
    /// topic's stored intent settings:
    /// `max_redelivery_count ← max_retries`, `base_redelivery_delay_ms ←
    /// backoff_ms`, ack timeout 30 000 ms, maximum delay 60 000 ms,
    /// exponential, and the intent's poison policy. For `dead_letter` the
    /// dead-letter topic is `<topic><dlq_suffix>`, `<topic>-dlq` when the
    /// stored settings lack a suffix. `block` and `none` carry no topic.
    ///
    /// The base delay is capped at the maximum so the result validates.
    ///
    /// # Errors
    /// [`NameError`] when the dead-letter topic name is invalid (too long).
    pub fn inherit(
        settings: &ExpandedStreamSettings,
        topic: &TopicName,
    ) -> Result<SubscriptionFailurePolicy, NameError> {
        let dead_letter_topic = match settings.poison_policy {
            PoisonPolicy::DeadLetter => {
                let suffix = settings.dlq_suffix.as_deref().unwrap_or(DEFAULT_DLQ_SUFFIX);
                Some(topic.with_suffix(suffix)?.to_string())
            }
            PoisonPolicy::Block | PoisonPolicy::None => None,
        };
        Ok(SubscriptionFailurePolicy {
            max_redelivery_count: settings.max_retries,
            ack_timeout_ms: DEFAULT_ACK_TIMEOUT_MS,
            base_redelivery_delay_ms: settings.backoff_ms.min(DEFAULT_MAX_REDELIVERY_DELAY_MS),
            max_redelivery_delay_ms: DEFAULT_MAX_REDELIVERY_DELAY_MS,
            backoff_strategy: BackoffStrategy::Exponential,
            poison_policy: settings.poison_policy,
            dead_letter_topic,
        })
    }

    /// Checks the fields against each other (for policies set by operators).
    ///
    /// # Errors
    /// [`PolicyError`] naming the contradiction.
    pub fn validate(&self) -> Result<(), PolicyError> {
        if self.ack_timeout_ms == 0 {
            return Err(PolicyError::ZeroAckTimeout);
        }
        if self.base_redelivery_delay_ms > self.max_redelivery_delay_ms {
            return Err(PolicyError::DelayRange {
                base: self.base_redelivery_delay_ms,
                max: self.max_redelivery_delay_ms,
            });
        }
        match (&self.dead_letter_topic, self.poison_policy) {
            (None, PoisonPolicy::DeadLetter) => Err(PolicyError::MissingDeadLetterTopic),
            (Some(name), _) => TopicName::new(name).map(drop).map_err(PolicyError::from),
            (None, _) => Ok(()),
        }
    }

    /// [`validate`](Self::validate), and that the dead-letter topic may
    /// receive `topic`'s dead letters ([`check_dead_letter_target`]).
    ///
    /// # Errors
    /// [`PolicyError`] naming the contradiction.
    pub fn validate_for(&self, topic: &TopicName) -> Result<(), PolicyError> {
        self.validate()?;
        match &self.dead_letter_topic {
            Some(name) => check_dead_letter_target(topic, &TopicName::new(name)?),
            None => Ok(()),
        }
    }

    /// Delay before redelivery `attempt` (1 for the first redelivery), ms,
    /// per the backoff strategy and capped at `max_redelivery_delay_ms`.
    /// Attempt 0 is treated as 1. Never overflows.
    pub fn redelivery_delay_ms(&self, attempt: u32) -> u64 {
        let attempt = attempt.max(1);
        let base = self.base_redelivery_delay_ms;
        let delay = match self.backoff_strategy {
            BackoffStrategy::Fixed => base,
            BackoffStrategy::Linear => base.saturating_mul(u64::from(attempt)),
            BackoffStrategy::Exponential => {
                let factor = 1u64.checked_shl(attempt - 1).unwrap_or(u64::MAX);
                base.saturating_mul(factor)
            }
        };
        delay.min(self.max_redelivery_delay_ms)
    }
}

/// Whether `dlq` may receive the dead letters of a subscription of
/// `topic`: not `topic` itself (compared after normalization), in the same
/// namespace (a principal allowed to write one namespace may not write
/// another's through dead letters), and not a system topic (a namespace
/// starting with `_`). Checked when a policy is set and again before each
/// copy (a policy stored before the rule).
///
/// # Errors
/// [`PolicyError::DeadLetterIsSource`],
/// [`PolicyError::DeadLetterOtherNamespace`],
/// [`PolicyError::DeadLetterSystem`].
pub fn check_dead_letter_target(topic: &TopicName, dlq: &TopicName) -> Result<(), PolicyError> {
    if dlq == topic {
        Err(PolicyError::DeadLetterIsSource(topic.to_string()))
    } else if dlq.namespace() != topic.namespace() {
        Err(PolicyError::DeadLetterOtherNamespace {
            dlq: dlq.to_string(),
            namespace: topic.namespace().to_owned(),
        })
    } else if dlq.namespace().starts_with('_') {
        Err(PolicyError::DeadLetterSystem(dlq.to_string()))
    } else {
        Ok(())
    }
}

/// Settings of a topic created implicitly by its first producer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImplicitTopicSettings {
    /// `NonReliable` unless the producer asked for reliable dispatch.
    pub delivery: Delivery,
    /// [`CLUSTER_DEFAULT_WAL_SYNC`].
    pub wal_sync_mode: SyncMode,
    /// [`SubscriptionFailurePolicy::broker_fallback`].
    pub failure_policy: SubscriptionFailurePolicy,
}

impl ImplicitTopicSettings {
    /// The broker fallback of the seed table; `reliable_dispatch` is the
    /// producer's explicit request for reliable dispatch.
    pub fn broker_fallback(reliable_dispatch: bool) -> ImplicitTopicSettings {
        ImplicitTopicSettings {
            delivery: if reliable_dispatch {
                Delivery::Reliable
            } else {
                Delivery::NonReliable
            },
            wal_sync_mode: CLUSTER_DEFAULT_WAL_SYNC,
            failure_policy: SubscriptionFailurePolicy::broker_fallback(),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn topic(name: &str) -> TopicName {
        TopicName::new(name).unwrap()
    }

    #[test]
    fn every_table_cell() {
        // (intent, delivery, wal sync, retries, backoff, poison, dlq, persistence)
        let table = [
            (
                StreamIntent::Realtime,
                Delivery::NonReliable,
                SyncMode::Async,
                0,
                0,
                PoisonPolicy::None,
                None,
                Persistence::InMemory,
            ),
            (
                StreamIntent::EventStream,
                Delivery::Reliable,
                SyncMode::OsCacheFlush,
                3,
                500,
                PoisonPolicy::DeadLetter,
                Some("-dlq"),
                Persistence::Wal,
            ),
            (
                StreamIntent::TaskQueue,
                Delivery::Reliable,
                SyncMode::FsyncBatch,
                5,
                1000,
                PoisonPolicy::DeadLetter,
                Some("-dlq"),
                Persistence::Wal,
            ),
            (
                StreamIntent::AuditLog,
                Delivery::Reliable,
                SyncMode::FsyncBatch,
                10,
                500,
                PoisonPolicy::Block,
                None,
                Persistence::Wal,
            ),
        ];
        for (intent, delivery, sync, retries, backoff, poison, dlq, persistence) in table {
            let s = intent.expand();
            assert_eq!(s.intent, intent);
            assert_eq!(s.delivery, delivery, "{intent}");
            assert_eq!(s.wal_sync_mode, sync, "{intent}");
            assert_eq!(s.max_retries, retries, "{intent}");
            assert_eq!(s.backoff_ms, backoff, "{intent}");
            assert_eq!(s.poison_policy, poison, "{intent}");
            assert_eq!(s.dlq_suffix.as_deref(), dlq, "{intent}");
            assert_eq!(s.persistence, persistence, "{intent}");
        }
    }

    #[test]
    fn every_alias_normalizes_to_its_canonical_intent() {
        let table: [(&str, StreamIntent); 21] = [
            ("realtime", StreamIntent::Realtime),
            ("telemetry_firehose", StreamIntent::Realtime),
            ("firehose", StreamIntent::Realtime),
            ("telemetry", StreamIntent::Realtime),
            ("ephemeral", StreamIntent::Realtime),
            ("event_stream", StreamIntent::EventStream),
            ("agent_event_mesh", StreamIntent::EventStream),
            ("event_mesh", StreamIntent::EventStream),
            ("events", StreamIntent::EventStream),
            ("lakehouse_feed", StreamIntent::EventStream),
            ("lakehouse", StreamIntent::EventStream),
            ("custom", StreamIntent::EventStream),
            ("task_queue", StreamIntent::TaskQueue),
            ("agent_task_queue", StreamIntent::TaskQueue),
            ("tasks", StreamIntent::TaskQueue),
            ("work_queue", StreamIntent::TaskQueue),
            ("audit_log", StreamIntent::AuditLog),
            ("tool_invocation_log", StreamIntent::AuditLog),
            ("tool_log", StreamIntent::AuditLog),
            ("audit", StreamIntent::AuditLog),
            ("state_log", StreamIntent::AuditLog),
        ];
        for (name, intent) in table {
            assert_eq!(StreamIntent::parse(name), Ok(intent), "{name}");
            assert_eq!(name.parse::<StreamIntent>(), Ok(intent), "{name}");
            // Stored (and serialized) as the canonical name.
            assert_eq!(
                serde_json::from_value::<StreamIntent>(json!(name)).unwrap(),
                intent
            );
            assert_eq!(
                serde_json::to_value(StreamIntent::parse(name).unwrap()).unwrap(),
                json!(intent.as_str())
            );
        }
        let listed: usize = StreamIntent::ALL
            .iter()
            .map(|i| 1 + i.aliases().len())
            .sum();
        assert_eq!(listed, table.len(), "the table covers every name");
        assert_eq!(
            StreamIntent::parse("  Task_Queue "),
            Ok(StreamIntent::TaskQueue)
        );
    }

    #[test]
    fn unknown_intent_lists_every_valid_name() {
        for bad in ["task-queue", "", "queue", "realtime2"] {
            let err = StreamIntent::parse(bad).unwrap_err();
            assert_eq!(
                err,
                IntentError::Unknown {
                    input: bad.to_owned()
                }
            );
            let message = err.to_string();
            for intent in StreamIntent::ALL {
                assert!(message.contains(intent.as_str()), "{message}");
                for alias in intent.aliases() {
                    assert!(message.contains(alias), "{alias} missing in {message}");
                }
            }
        }
        assert_eq!(
            StreamIntent::parse("nope").unwrap_err().to_string(),
            "unknown stream intent \"nope\"; valid intents: \
             realtime (aliases: telemetry_firehose, firehose, telemetry, ephemeral); \
             event_stream (aliases: agent_event_mesh, event_mesh, events, lakehouse_feed, \
             lakehouse, custom); \
             task_queue (aliases: agent_task_queue, tasks, work_queue); \
             audit_log (aliases: tool_invocation_log, tool_log, audit, state_log)"
        );
        assert!(serde_json::from_value::<StreamIntent>(json!("nope")).is_err());
    }

    #[test]
    fn expanded_settings_json_has_the_fixed_field_names() {
        assert_eq!(
            serde_json::to_value(StreamIntent::TaskQueue.expand()).unwrap(),
            json!({
                "intent": "task_queue",
                "delivery": "Reliable",
                "wal_sync_mode": "fsync_batch",
                "max_retries": 5,
                "backoff_ms": 1000,
                "poison_policy": "dead_letter",
                "dlq_suffix": "-dlq",
                "persistence": "wal"
            })
        );
        assert_eq!(
            serde_json::to_value(StreamIntent::Realtime.expand()).unwrap(),
            json!({
                "intent": "realtime",
                "delivery": "NonReliable",
                "wal_sync_mode": "async",
                "max_retries": 0,
                "backoff_ms": 0,
                "poison_policy": "none",
                "dlq_suffix": null,
                "persistence": "in_memory"
            })
        );
        for intent in StreamIntent::ALL {
            let settings = intent.expand();
            let text = serde_json::to_string(&settings).unwrap();
            assert_eq!(
                serde_json::from_str::<ExpandedStreamSettings>(&text).unwrap(),
                settings
            );
        }
        let mut bad = serde_json::to_value(StreamIntent::TaskQueue.expand()).unwrap();
        bad["wal_sync_mode"] = json!("fsync");
        let err = serde_json::from_value::<ExpandedStreamSettings>(bad).unwrap_err();
        assert!(err.to_string().contains("fsync_batch"), "{err}");
    }

    #[test]
    fn delivery_is_stored_as_reliable_or_non_reliable() {
        assert_eq!(
            serde_json::to_value(Delivery::Reliable).unwrap(),
            json!("Reliable")
        );
        assert_eq!(
            serde_json::to_value(Delivery::NonReliable).unwrap(),
            json!("NonReliable")
        );
        assert_eq!(
            serde_json::from_value::<Delivery>(json!("NonReliable")).unwrap(),
            Delivery::NonReliable
        );
        assert_eq!(Delivery::Reliable.to_string(), "Reliable");
    }

    #[test]
    fn describe_summary_matches_the_seed_sample() {
        let t = topic("/default/agent-jobs");
        assert_eq!(
            StreamIntent::TaskQueue.expand().summary(&t),
            "task_queue (delivery=reliable, wal_sync=fsync_batch, max_retries=5, \
             backoff_ms=1000, poison_policy=dead_letter, dlq=/default/agent-jobs-dlq)"
        );
        assert_eq!(
            StreamIntent::Realtime.expand().summary(&t),
            "realtime (delivery=non_reliable, wal_sync=async, max_retries=0, \
             backoff_ms=0, poison_policy=none, dlq=none)"
        );
        assert_eq!(
            StreamIntent::AuditLog.expand().summary(&t),
            "audit_log (delivery=reliable, wal_sync=fsync_batch, max_retries=10, \
             backoff_ms=500, poison_policy=block, dlq=none)"
        );
        assert_eq!(
            StreamIntent::EventStream.expand().summary(&t),
            "event_stream (delivery=reliable, wal_sync=os_cache_flush, max_retries=3, \
             backoff_ms=500, poison_policy=dead_letter, dlq=/default/agent-jobs-dlq)"
        );
    }

    #[test]
    fn subscriptions_inherit_from_the_intent() {
        let t = topic("/default/agent-jobs");
        let expect = |max, base, poison, dlq: Option<&str>| SubscriptionFailurePolicy {
            max_redelivery_count: max,
            ack_timeout_ms: 30_000,
            base_redelivery_delay_ms: base,
            max_redelivery_delay_ms: 60_000,
            backoff_strategy: BackoffStrategy::Exponential,
            poison_policy: poison,
            dead_letter_topic: dlq.map(str::to_owned),
        };
        let cases = [
            (
                StreamIntent::Realtime,
                expect(0, 0, PoisonPolicy::None, None),
            ),
            (
                StreamIntent::EventStream,
                expect(
                    3,
                    500,
                    PoisonPolicy::DeadLetter,
                    Some("/default/agent-jobs-dlq"),
                ),
            ),
            (
                StreamIntent::TaskQueue,
                expect(
                    5,
                    1000,
                    PoisonPolicy::DeadLetter,
                    Some("/default/agent-jobs-dlq"),
                ),
            ),
            (
                StreamIntent::AuditLog,
                expect(10, 500, PoisonPolicy::Block, None),
            ),
        ];
        for (intent, policy) in cases {
            let derived = SubscriptionFailurePolicy::inherit(&intent.expand(), &t).unwrap();
            assert_eq!(derived, policy, "{intent}");
            assert_eq!(derived.validate(), Ok(()), "{intent}");
        }
        // Stored settings without a suffix still route to <topic>-dlq.
        let mut settings = StreamIntent::TaskQueue.expand();
        settings.dlq_suffix = None;
        assert_eq!(
            SubscriptionFailurePolicy::inherit(&settings, &t)
                .unwrap()
                .dead_letter_topic
                .as_deref(),
            Some("/default/agent-jobs-dlq")
        );
        // A DLQ name over the limit is refused, not truncated.
        let long = topic(&format!("/n/{}", "t".repeat(250)));
        assert!(
            SubscriptionFailurePolicy::inherit(&StreamIntent::TaskQueue.expand(), &long).is_err()
        );
        assert_eq!(
            StreamIntent::TaskQueue.expand().dlq_topic(&t).unwrap(),
            Some(topic("/default/agent-jobs-dlq"))
        );
        assert_eq!(StreamIntent::AuditLog.expand().dlq_topic(&t).unwrap(), None);
    }

    #[test]
    fn failure_policy_json_matches_the_seed_sample() {
        let policy: SubscriptionFailurePolicy = serde_json::from_value(json!({
            "max_redelivery_count": 5,
            "ack_timeout_ms": 60000,
            "base_redelivery_delay_ms": 1000,
            "max_redelivery_delay_ms": 60000,
            "backoff_strategy": "exponential",
            "dead_letter_topic": "/agents/tasks-dlq",
            "poison_policy": "dead_letter"
        }))
        .unwrap();
        assert_eq!(policy.max_redelivery_count, 5);
        assert_eq!(policy.ack_timeout_ms, 60_000);
        assert_eq!(policy.backoff_strategy, BackoffStrategy::Exponential);
        assert_eq!(policy.poison_policy, PoisonPolicy::DeadLetter);
        assert_eq!(
            policy.dead_letter_topic.as_deref(),
            Some("/agents/tasks-dlq")
        );
        assert_eq!(policy.validate(), Ok(()));
        for (name, strategy) in [
            ("exponential", BackoffStrategy::Exponential),
            ("fixed", BackoffStrategy::Fixed),
            ("linear", BackoffStrategy::Linear),
        ] {
            assert_eq!(serde_json::to_value(strategy).unwrap(), json!(name));
            assert_eq!(strategy.as_str(), name);
        }
        for (name, poison) in [
            ("dead_letter", PoisonPolicy::DeadLetter),
            ("block", PoisonPolicy::Block),
            ("none", PoisonPolicy::None),
        ] {
            assert_eq!(serde_json::to_value(poison).unwrap(), json!(name));
            assert_eq!(poison.as_str(), name);
        }
        assert!(serde_json::from_value::<BackoffStrategy>(json!("random")).is_err());
    }

    #[test]
    fn broker_fallback_for_implicit_topics() {
        let fallback = ImplicitTopicSettings::broker_fallback(false);
        assert_eq!(fallback.delivery, Delivery::NonReliable);
        assert_eq!(fallback.wal_sync_mode, SyncMode::OsCacheFlush);
        assert_eq!(
            fallback.failure_policy,
            SubscriptionFailurePolicy {
                max_redelivery_count: 5,
                ack_timeout_ms: 30_000,
                base_redelivery_delay_ms: 1000,
                max_redelivery_delay_ms: 60_000,
                backoff_strategy: BackoffStrategy::Exponential,
                poison_policy: PoisonPolicy::Block,
                dead_letter_topic: None,
            }
        );
        assert_eq!(
            ImplicitTopicSettings::broker_fallback(true).delivery,
            Delivery::Reliable
        );
    }

    #[test]
    fn validate_names_contradictions() {
        let ok = SubscriptionFailurePolicy::broker_fallback();
        assert_eq!(ok.validate(), Ok(()));
        let with = |f: fn(&mut SubscriptionFailurePolicy)| {
            let mut p = ok.clone();
            f(&mut p);
            p.validate()
        };
        assert_eq!(
            with(|p| p.poison_policy = PoisonPolicy::DeadLetter),
            Err(PolicyError::MissingDeadLetterTopic)
        );
        assert!(matches!(
            with(|p| p.dead_letter_topic = Some("no-slash".into())),
            Err(PolicyError::DeadLetterTopic(_))
        ));
        assert_eq!(
            with(|p| p.base_redelivery_delay_ms = 60_001),
            Err(PolicyError::DelayRange {
                base: 60_001,
                max: 60_000
            })
        );
        assert_eq!(
            with(|p| p.ack_timeout_ms = 0),
            Err(PolicyError::ZeroAckTimeout)
        );
    }

    #[test]
    fn redelivery_delays_follow_the_strategy_and_cap() {
        let mut p = SubscriptionFailurePolicy::broker_fallback();
        let delays = |p: &SubscriptionFailurePolicy| -> Vec<u64> {
            [0, 1, 2, 3, 4, 7, 8, 64, u32::MAX]
                .iter()
                .map(|&a| p.redelivery_delay_ms(a))
                .collect()
        };
        assert_eq!(
            delays(&p),
            [1000, 1000, 2000, 4000, 8000, 60_000, 60_000, 60_000, 60_000]
        );
        p.backoff_strategy = BackoffStrategy::Linear;
        assert_eq!(
            delays(&p),
            [1000, 1000, 2000, 3000, 4000, 7000, 8000, 60_000, 60_000]
        );
        p.backoff_strategy = BackoffStrategy::Fixed;
        assert_eq!(delays(&p), [1000; 9]);
    }

    #[test]
    fn wal_sync_mode_maps_to_the_wal() {
        for mode in [
            SyncMode::Async,
            SyncMode::OsCacheFlush,
            SyncMode::FsyncBatch,
        ] {
            let mut settings = StreamIntent::TaskQueue.expand();
            settings.wal_sync_mode = mode;
            let value = serde_json::to_value(&settings).unwrap();
            assert_eq!(value["wal_sync_mode"], json!(mode.as_str()));
            assert_eq!(
                serde_json::from_value::<ExpandedStreamSettings>(value)
                    .unwrap()
                    .wal_sync_mode,
                mode
            );
        }
    }
}
