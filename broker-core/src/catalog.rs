//! The topic and namespace catalog: creating, describing, listing and
//! deleting intent-backed topics, subscription failure policies and the
//! declarative `apply`, all over any [`MetadataStore`].
//!
//! Behaviour follows `seeds/000_d502aacc865e81b1.txt` (stream intents,
//! failure-policy inheritance, `describe` and `apply`) and the key layout of
//! `seeds/001_4a7643a8a6858094.txt`; every key comes from [`tributary_proto::keys`].
//!
//! # What a topic is in metadata
//!
//! | key | value |
//! |---|---|
//! | `/topics/{ns}/{topic}` | partition count, a JSON number (0 = non-partitioned) |
//! | `/topics/{ns}/{topic}/intent` | [`ExpandedStreamSettings`] JSON (explicit topics only) |
//! | `/topics/{ns}/{topic}/delivery` | `"Reliable"` or `"NonReliable"` |
//! | `/namespaces/{ns}/topics/{ns}/{topic}` | the partition count again, so listing a namespace needs one prefix scan |
//! | `/namespaces/{ns}/policy` | [`NamespacePolicy`] JSON; its presence is what makes a namespace exist |
//!
//! A topic created with `partitions = N > 0` also gets the first four keys
//! for each `{topic}-part-0 … {topic}-part-(N-1)`, with marker 0 and the same
//! intent and delivery. All keys of a create are one [`Txn`] whose
//! preconditions require every written key to be absent (or, when repairing,
//! to still hold the value that was read), so two concurrent creates cannot
//! interleave: one applies, the other re-reads and reports `unchanged` or a
//! conflict.
//!
//! # Decisions where the seeds are silent
//!
//! - **Namespaces are created implicitly.** Creating a topic (explicitly,
//!   implicitly or through `apply`) whose namespace does not exist creates
//!   the namespace with the default [`NamespacePolicy`] in the same
//!   transaction; outcomes and plans say so. Creating an existing namespace
//!   is `unchanged` and never touches its policy.
//! - **`create` is create-only.** An existing topic with identical stored
//!   settings is `unchanged`; any difference (partitions, intent, a stored
//!   setting that no longer matches the intent table, an implicit topic with
//!   no intent) is [`CatalogError::TopicConflict`] naming every differing
//!   field. Only `apply` updates.
//! - **What `apply` may update.** Changing the intent of an existing topic
//!   (including giving an implicit topic an intent) rewrites `/intent` and
//!   `/delivery` of the topic and its partitions; the topic's WAL uses the
//!   new sync mode the next time it is loaded, and subscriptions keep their
//!   persisted failure policies (the seed never overwrites those). Growing
//!   the partition count of a partitioned topic creates the new partitions.
//!   Shrinking it, or turning a non-partitioned topic into a partitioned one
//!   or back, would strand stored records and is refused
//!   ([`CatalogError::ManifestConflict`], field `partitions`), as is a new
//!   partition whose name an existing topic already has. `apply` never
//!   deletes topics or namespaces that the manifest does not mention.
//! - **Dead-letter topics are not created up front.** `<topic>-dlq` is only
//!   checked to be a valid name; it comes into existence like any topic on
//!   its first publish (implicit creation).
//! - **Implicit topics have no `/intent` key.** Their WAL sync mode is
//!   [`CLUSTER_DEFAULT_WAL_SYNC`] and their subscriptions inherit
//!   [`SubscriptionFailurePolicy::broker_fallback`], as the seed's table
//!   says. An existing topic always wins over an implicit create.
//! - **Deleting** removes the topic marker, every key under
//!   `/topics/{ns}/{topic}/` (intent, delivery, policy, producers,
//!   subscriptions with cursors and failure policies) and the namespace
//!   registry entry, for the topic and each partition, in one transaction. A
//!   single partition of a partitioned topic cannot be deleted alone. Edge
//!   checkpoints, broker assignments and archived segments are not touched.
//! - **Failure policy limits** beyond [`SubscriptionFailurePolicy::validate`]:
//!   at most [`MAX_REDELIVERY_COUNT`] redeliveries and at most
//!   [`MAX_POLICY_DURATION_MS`] for the ack timeout and the delays.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Value, json};
use tributary_api::admin::{ManifestIssue, PolicySource};

use crate::metadata::{MAX_TXN_OPS, MetadataError, MetadataStore, Txn, TxnOutcome};
use crate::wal::SyncMode;
use tributary_proto::intent::{
    BackoffStrategy, CLUSTER_DEFAULT_WAL_SYNC, Delivery, ExpandedStreamSettings, IntentError,
    PoisonPolicy, PolicyError, StreamIntent, SubscriptionFailurePolicy,
};
use tributary_proto::keys::{
    self, MetadataKey, NameError, NamespaceName, SubscriptionKey, SubscriptionName, TopicName,
};

/// Most partitions of one topic. A create of this many partitions plus its
/// namespace fits in one transaction ([`MAX_TXN_OPS`]) with room to spare.
pub const MAX_PARTITIONS: u32 = 256;

/// Keys written per topic or partition: marker, intent, delivery, registry.
const KEYS_PER_TOPIC: usize = 4;
// Worst case of one create: a precondition and a put per key, plus the
// namespace policy's precondition and put.
const _: () = assert!(2 * KEYS_PER_TOPIC * (MAX_PARTITIONS as usize + 1) + 2 <= MAX_TXN_OPS);

/// Most redeliveries a failure policy may ask for.
pub const MAX_REDELIVERY_COUNT: u32 = 10_000;

/// Longest ack timeout, base delay or maximum delay of a failure policy, ms
/// (one day).
pub const MAX_POLICY_DURATION_MS: u64 = 86_400_000;

/// Attempts of a read-then-write operation before it reports
/// [`CatalogError::ConcurrentChange`].
const WRITE_ATTEMPTS: usize = 4;

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

/// One field whose existing value differs from the requested one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Difference {
    /// The field, e.g. `partitions`, `intent`, `max_retries`.
    pub field: String,
    /// The stored value, rendered (`none` when absent).
    pub existing: String,
    /// The requested value, rendered.
    pub requested: String,
}

impl Difference {
    fn new(field: &str, existing: impl fmt::Display, requested: impl fmt::Display) -> Difference {
        Difference {
            field: field.to_owned(),
            existing: existing.to_string(),
            requested: requested.to_string(),
        }
    }
}

impl fmt::Display for Difference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: existing {}, requested {}",
            self.field, self.existing, self.requested
        )
    }
}

fn join_differences(differences: &[Difference]) -> String {
    differences
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Every problem found in a manifest; nothing of it was applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("manifest {file}: {}; nothing applied", self.joined())]
pub struct ManifestErrors {
    /// The manifest's file name.
    pub file: String,
    /// The problems, in document order. Never empty.
    pub issues: Vec<ManifestIssue>,
}

impl ManifestErrors {
    /// A single document-level problem (for parsers: YAML syntax errors).
    pub fn document(file: &str, message: impl Into<String>) -> ManifestErrors {
        ManifestErrors {
            file: file.to_owned(),
            issues: vec![ManifestIssue::document(file, message)],
        }
    }

    fn joined(&self) -> String {
        // Each issue already starts with the file name.
        let prefix = format!("{}: ", self.file);
        self.issues
            .iter()
            .map(|issue| {
                let text = issue.to_string();
                text.strip_prefix(&prefix)
                    .map(str::to_owned)
                    .unwrap_or(text)
            })
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// Errors of catalog operations.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CatalogError {
    /// A topic, namespace or subscription name breaks the naming rules.
    #[error("{field}: {source}")]
    InvalidName {
        /// The request field that held the name (`name`, `topic`,
        /// `namespace`, `subscription`, `dead_letter_topic`).
        field: &'static str,
        /// The rule broken.
        source: NameError,
    },
    /// Not a canonical intent or alias; the message lists the valid names.
    #[error("intent: {0}")]
    InvalidIntent(#[from] IntentError),
    /// A partition count that is not a whole number from 0 to
    /// [`MAX_PARTITIONS`].
    #[error("partitions: must be a whole number from 0 to {max}, got {value}")]
    InvalidPartitions {
        /// The refused value as written.
        value: String,
        /// [`MAX_PARTITIONS`].
        max: u32,
    },
    /// A failure policy whose fields contradict each other.
    #[error("{field}: {source}")]
    InvalidPolicy {
        /// The field to change.
        field: &'static str,
        /// The contradiction.
        source: PolicyError,
    },
    /// A failure policy value above its limit.
    #[error("{field}: {value} is above the limit of {max}")]
    PolicyOutOfRange {
        /// The field.
        field: &'static str,
        /// The refused value.
        value: u64,
        /// The limit.
        max: u64,
    },
    /// No marker at `/topics/{ns}/{topic}`.
    #[error("topic {topic} does not exist")]
    TopicNotFound {
        /// The topic.
        topic: TopicName,
    },
    /// No policy at `/namespaces/{ns}/policy`.
    #[error("namespace {namespace} does not exist")]
    NamespaceNotFound {
        /// The namespace.
        namespace: NamespaceName,
    },
    /// The topic exists with other settings (or a partition name is taken).
    #[error(
        "topic {topic} already exists with different settings: {}",
        join_differences(differences)
    )]
    TopicConflict {
        /// The topic.
        topic: TopicName,
        /// Every differing field.
        differences: Vec<Difference>,
    },
    /// Deleting one partition of a partitioned topic.
    #[error("topic {topic} is partition {index} of {parent}; delete {parent} instead")]
    IsPartition {
        /// The partition.
        topic: TopicName,
        /// Its partitioned topic.
        parent: TopicName,
        /// Its index.
        index: u32,
    },
    /// Metadata changed between reading and writing, again on retry.
    /// Nothing was written.
    #[error("metadata at {key} changed concurrently; nothing was written, retry")]
    ConcurrentChange {
        /// The key whose precondition failed.
        key: String,
    },
    /// A manifest that does not validate; nothing was applied.
    #[error(transparent)]
    InvalidManifest(ManifestErrors),
    /// A valid manifest that asks for a change the catalog refuses
    /// (shrinking partitions, a taken partition name); nothing was applied.
    #[error(transparent)]
    ManifestConflict(ManifestErrors),
    /// Stored metadata that does not decode or contradicts itself.
    #[error("stored metadata at {key} is inconsistent: {reason}")]
    Inconsistent {
        /// The key.
        key: String,
        /// Why.
        reason: String,
    },
    /// The store failed.
    #[error(transparent)]
    Metadata(#[from] MetadataError),
}

impl CatalogError {
    /// The request field an input error is about, if any.
    pub fn field(&self) -> Option<&str> {
        match self {
            CatalogError::InvalidName { field, .. }
            | CatalogError::InvalidPolicy { field, .. }
            | CatalogError::PolicyOutOfRange { field, .. } => Some(field),
            CatalogError::InvalidIntent(_) => Some("intent"),
            CatalogError::InvalidPartitions { .. } => Some("partitions"),
            _ => None,
        }
    }

    fn policy(source: PolicyError) -> CatalogError {
        CatalogError::InvalidPolicy {
            field: source.field(),
            source,
        }
    }

    fn inconsistent(key: &str, reason: impl Into<String>) -> CatalogError {
        CatalogError::Inconsistent {
            key: key.to_owned(),
            reason: reason.into(),
        }
    }
}

// ---------------------------------------------------------------------------
// Values
// ---------------------------------------------------------------------------

/// Namespace-wide defaults stored at `/namespaces/{ns}/policy`
/// (`seeds/001_4a7643a8a6858094.txt`). 0 means unlimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct NamespacePolicy {
    /// Producers per topic, 0 = unlimited.
    pub max_producers_per_topic: u32,
    /// Consumers per topic, 0 = unlimited.
    pub max_consumers_per_topic: u32,
    /// Largest message, bytes, 0 = unlimited.
    pub max_message_size: u64,
}

/// What an operation did, or what one plan item would do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// Does not exist yet: created.
    Create,
    /// Exists with other settings: rewritten (`apply` only).
    Update,
    /// Exists exactly as requested: nothing written.
    Unchanged,
}

impl Action {
    /// `create`, `update` or `unchanged`.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Create => "create",
            Action::Update => "update",
            Action::Unchanged => "unchanged",
        }
    }
}

impl fmt::Display for Action {
    /// The name; honours width and alignment (`{:<9}`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

/// A validated request to create a topic: name, canonical intent and
/// partition count. Construction checks that the partition count is at most
/// [`MAX_PARTITIONS`] and that every partition name and dead-letter topic
/// name is valid, so a create never fails half-way on a name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicSpec {
    name: TopicName,
    intent: StreamIntent,
    partitions: u32,
    /// Invariant: `partitions` names, `name-part-0 …`.
    partition_names: Vec<TopicName>,
}

impl TopicSpec {
    /// A spec for `name` with `intent` and `partitions` (0 =
    /// non-partitioned).
    ///
    /// # Errors
    /// [`CatalogError::InvalidPartitions`] above [`MAX_PARTITIONS`];
    /// [`CatalogError::InvalidName`] (field `name`) when a partition or
    /// dead-letter topic name would be invalid (too long).
    pub fn new(
        name: TopicName,
        intent: StreamIntent,
        partitions: u32,
    ) -> Result<TopicSpec, CatalogError> {
        if partitions > MAX_PARTITIONS {
            return Err(CatalogError::InvalidPartitions {
                value: partitions.to_string(),
                max: MAX_PARTITIONS,
            });
        }
        let invalid = |source| CatalogError::InvalidName {
            field: "name",
            source,
        };
        let partition_names = (0..partitions)
            .map(|index| name.partition(index))
            .collect::<Result<Vec<_>, _>>()
            .map_err(invalid)?;
        let settings = intent.expand();
        for topic in std::iter::once(&name).chain(&partition_names) {
            settings.dlq_topic(topic).map_err(invalid)?;
        }
        Ok(TopicSpec {
            name,
            intent,
            partitions,
            partition_names,
        })
    }

    /// Parses untyped input (an API request): a topic name, an intent name
    /// or alias, and a partition count.
    ///
    /// # Errors
    /// [`CatalogError::InvalidName`] (field `name`),
    /// [`CatalogError::InvalidIntent`] listing the valid names,
    /// [`CatalogError::InvalidPartitions`] for negative or too large counts,
    /// and those of [`TopicSpec::new`].
    pub fn parse(name: &str, intent: &str, partitions: i64) -> Result<TopicSpec, CatalogError> {
        let name = TopicName::new(name).map_err(|source| CatalogError::InvalidName {
            field: "name",
            source,
        })?;
        let intent = StreamIntent::parse(intent)?;
        let partitions = u32::try_from(partitions)
            .ok()
            .filter(|&p| p <= MAX_PARTITIONS)
            .ok_or(CatalogError::InvalidPartitions {
                value: partitions.to_string(),
                max: MAX_PARTITIONS,
            })?;
        TopicSpec::new(name, intent, partitions)
    }

    /// The topic.
    pub fn name(&self) -> &TopicName {
        &self.name
    }

    /// The canonical intent.
    pub fn intent(&self) -> StreamIntent {
        self.intent
    }

    /// Partition count, 0 = non-partitioned.
    pub fn partitions(&self) -> u32 {
        self.partitions
    }

    /// The partition topics, `{topic}-part-0 …`.
    pub fn partition_names(&self) -> &[TopicName] {
        &self.partition_names
    }

    /// The topic and its partitions with the marker value of each.
    fn topics(&self) -> impl Iterator<Item = (&TopicName, u32)> {
        std::iter::once((&self.name, self.partitions))
            .chain(self.partition_names.iter().map(|p| (p, 0)))
    }

    /// Every key of the topic and its partitions with the value it must
    /// hold, [`KEYS_PER_TOPIC`] per topic in the order marker, intent,
    /// delivery, registry; the topic itself first.
    fn desired_entries(&self) -> Result<Vec<(String, Value)>, CatalogError> {
        let settings = self.intent.expand();
        let settings_json = to_json("intent", &settings)?;
        let delivery = json!(settings.delivery.as_str());
        let mut entries = Vec::with_capacity(KEYS_PER_TOPIC * (self.partitions as usize + 1));
        for (topic, count) in self.topics() {
            entries.push((keys::topics::marker(topic), json!(count)));
            entries.push((keys::topics::intent(topic), settings_json.clone()));
            entries.push((keys::topics::delivery(topic), delivery.clone()));
            entries.push((keys::namespaces::topic(topic), json!(count)));
        }
        Ok(entries)
    }
}

fn to_json<T: Serialize>(key: &str, value: &T) -> Result<Value, CatalogError> {
    serde_json::to_value(value).map_err(|source| {
        CatalogError::Metadata(MetadataError::Encode {
            key: key.to_owned(),
            source,
        })
    })
}

fn decode<T: serde::de::DeserializeOwned>(key: &str, value: Value) -> Result<T, CatalogError> {
    serde_json::from_value(value).map_err(|e| CatalogError::inconsistent(key, e.to_string()))
}

fn decode_count(key: &str, value: &Value) -> Result<u32, CatalogError> {
    value
        .as_u64()
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| {
            CatalogError::inconsistent(key, format!("partition count {value} is not a u32"))
        })
}

/// A JSON value for messages: strings without quotes, `null` as `none`.
fn render(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Null => "none".to_owned(),
        other => other.to_string(),
    }
}

/// The result of [`Catalog::create_topic`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateOutcome {
    /// The topic.
    pub topic: TopicName,
    /// [`Action::Create`] or [`Action::Unchanged`].
    pub action: Action,
    /// Canonical intent.
    pub intent: StreamIntent,
    /// Partition count.
    pub partitions: u32,
    /// Whether the namespace was created by this call.
    pub namespace_created: bool,
}

/// The result of [`Catalog::create_implicit`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImplicitOutcome {
    /// Whether this call created the topic (false: it existed; its stored
    /// settings win).
    pub created: bool,
    /// Whether the namespace was created by this call.
    pub namespace_created: bool,
    /// The settings the topic is loaded with.
    pub settings: TopicLoadSettings,
}

/// What a broker needs when it loads a topic; read from metadata, never
/// from a client flag.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicLoadSettings {
    /// Dispatch strategy (`/delivery`).
    pub delivery: Delivery,
    /// The WAL sync mode: the intent's persisted `wal_sync_mode`, or
    /// [`CLUSTER_DEFAULT_WAL_SYNC`] for implicit topics.
    #[serde(with = "tributary_proto::intent::sync_mode_serde")]
    pub wal_sync_mode: SyncMode,
    /// The stored intent settings; `None` for implicit topics.
    pub intent: Option<ExpandedStreamSettings>,
}

/// One subscription in a [`TopicDescription`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubscriptionSummary {
    /// Subscription name.
    pub name: SubscriptionName,
    /// Its persisted failure policy, if one is stored.
    pub failure_policy: Option<SubscriptionFailurePolicy>,
}

/// The result of [`Catalog::describe`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicDescription {
    /// The topic.
    pub topic: TopicName,
    /// The broker a topic is assigned to
    /// (`/cluster/brokers/{id}/{ns}/{topic}`), `None` when unassigned.
    pub broker_id: Option<u64>,
    /// Partition count, 0 = non-partitioned.
    pub partitions: u32,
    /// The partition topics.
    pub partition_topics: Vec<TopicName>,
    /// Dispatch strategy.
    pub delivery: Delivery,
    /// WAL sync mode the topic is loaded with.
    #[serde(with = "tributary_proto::intent::sync_mode_serde")]
    pub wal_sync_mode: SyncMode,
    /// Stored intent settings; `None` for implicit topics.
    pub intent: Option<ExpandedStreamSettings>,
    /// The seed's one-line summary, e.g. `task_queue (delivery=reliable,
    /// wal_sync=fsync_batch, max_retries=5, backoff_ms=1000,
    /// poison_policy=dead_letter, dlq=/default/agent-jobs-dlq)`; for
    /// implicit topics `none (implicit topic: wal_sync=os_cache_flush,
    /// broker fallback failure policy)`.
    pub intent_summary: String,
    /// Subscriptions with a key under the topic, by name.
    pub subscriptions: Vec<SubscriptionSummary>,
}

/// One topic of [`Catalog::list_topics`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicListEntry {
    /// The topic.
    pub name: TopicName,
    /// Partition count, 0 = non-partitioned.
    pub partitions: u32,
}

/// The result of [`Catalog::delete_topic`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeleteOutcome {
    /// The topic.
    pub topic: TopicName,
    /// Its partition count.
    pub partitions: u32,
    /// Keys removed (topic and partitions, all keys under them, registry
    /// entries).
    pub deleted_keys: usize,
}

/// A subscription's failure policy and where it comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailurePolicyView {
    /// The topic.
    pub topic: TopicName,
    /// The subscription.
    pub subscription: SubscriptionName,
    /// Whether the policy is stored. A policy that is not stored yet is the
    /// one the first attach will persist.
    pub persisted: bool,
    /// Where the policy came from (for a stored one: [`PolicySource::Stored`],
    /// unless this very call derived and stored it).
    pub source: PolicySource,
    /// The policy.
    pub policy: SubscriptionFailurePolicy,
}

/// A partial failure policy: `None` fields keep their current value. For
/// `dead_letter_topic`, an absent field keeps it and JSON `null` clears it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FailurePolicyPatch {
    /// New `max_redelivery_count`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_redelivery_count: Option<u32>,
    /// New `ack_timeout_ms`, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ack_timeout_ms: Option<u64>,
    /// New `base_redelivery_delay_ms`, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_redelivery_delay_ms: Option<u64>,
    /// New `max_redelivery_delay_ms`, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_redelivery_delay_ms: Option<u64>,
    /// New `backoff_strategy`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff_strategy: Option<BackoffStrategy>,
    /// New `poison_policy`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub poison_policy: Option<PoisonPolicy>,
    /// `Some(Some(t))` sets, `Some(None)` clears, `None` keeps.
    #[serde(
        default,
        deserialize_with = "present_or_null",
        skip_serializing_if = "Option::is_none"
    )]
    pub dead_letter_topic: Option<Option<String>>,
}

fn present_or_null<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Option<String>>, D::Error> {
    Option::<String>::deserialize(d).map(Some)
}

impl FailurePolicyPatch {
    /// `policy` with the fields of this patch applied.
    pub fn apply_to(&self, policy: &SubscriptionFailurePolicy) -> SubscriptionFailurePolicy {
        SubscriptionFailurePolicy {
            max_redelivery_count: self
                .max_redelivery_count
                .unwrap_or(policy.max_redelivery_count),
            ack_timeout_ms: self.ack_timeout_ms.unwrap_or(policy.ack_timeout_ms),
            base_redelivery_delay_ms: self
                .base_redelivery_delay_ms
                .unwrap_or(policy.base_redelivery_delay_ms),
            max_redelivery_delay_ms: self
                .max_redelivery_delay_ms
                .unwrap_or(policy.max_redelivery_delay_ms),
            backoff_strategy: self.backoff_strategy.unwrap_or(policy.backoff_strategy),
            poison_policy: self.poison_policy.unwrap_or(policy.poison_policy),
            dead_letter_topic: match &self.dead_letter_topic {
                Some(topic) => topic.clone(),
                None => policy.dead_letter_topic.clone(),
            },
        }
    }
}

/// Checks an operator-supplied policy: [`SubscriptionFailurePolicy::validate`]
/// plus the catalog's limits.
///
/// # Errors
/// [`CatalogError::InvalidPolicy`] or [`CatalogError::PolicyOutOfRange`],
/// naming the field.
pub fn validate_policy(policy: &SubscriptionFailurePolicy) -> Result<(), CatalogError> {
    let limits = [
        (
            "max_redelivery_count",
            u64::from(policy.max_redelivery_count),
            u64::from(MAX_REDELIVERY_COUNT),
        ),
        (
            "ack_timeout_ms",
            policy.ack_timeout_ms,
            MAX_POLICY_DURATION_MS,
        ),
        (
            "base_redelivery_delay_ms",
            policy.base_redelivery_delay_ms,
            MAX_POLICY_DURATION_MS,
        ),
        (
            "max_redelivery_delay_ms",
            policy.max_redelivery_delay_ms,
            MAX_POLICY_DURATION_MS,
        ),
    ];
    for (field, value, max) in limits {
        if value > max {
            return Err(CatalogError::PolicyOutOfRange { field, value, max });
        }
    }
    policy.validate().map_err(CatalogError::policy)
}

// ---------------------------------------------------------------------------
// Manifests
// ---------------------------------------------------------------------------

/// A validated `apply` manifest (`seeds/000_d502aacc865e81b1.txt`,
/// "Declarative State"): namespaces to exist and intent-backed topics.
///
/// Document shape (any serde format; the admin API parses YAML):
/// ```yaml
/// namespaces:
///   - agents
/// topics:
///   - name: /agents/events
///     intent: agent_event_mesh
///     partitions: 3
/// ```
/// Both keys are optional; `partitions` defaults to 0; `intent` is
/// required. An empty document is an empty manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    file: String,
    namespaces: Vec<NamespaceName>,
    /// Invariant: entry `i` of the document's `topics`.
    topics: Vec<TopicSpec>,
}

const MANIFEST_SECTIONS: [&str; 2] = ["namespaces", "topics"];
const TOPIC_FIELDS: [&str; 3] = ["name", "intent", "partitions"];

impl Manifest {
    /// Validates a parsed manifest document. `file` names the manifest in
    /// every issue.
    ///
    /// Everything is checked before anything is returned: the document
    /// shape, unknown keys, every name, intent and partition count,
    /// duplicate namespaces and topics, and topics named like a partition of
    /// another entry.
    ///
    /// # Errors
    /// [`ManifestErrors`] with one [`ManifestIssue`] per problem (file,
    /// section, index, name, field).
    pub fn from_value(file: &str, document: &Value) -> Result<Manifest, ManifestErrors> {
        let mut issues = Vec::new();
        let mut manifest = Manifest {
            file: file.to_owned(),
            namespaces: Vec::new(),
            topics: Vec::new(),
        };
        let empty = serde_json::Map::new();
        let root = match document {
            Value::Null => &empty,
            Value::Object(map) => map,
            _ => {
                return Err(ManifestErrors::document(
                    file,
                    "the manifest must be a mapping with the keys namespaces and topics",
                ));
            }
        };
        for key in root.keys() {
            if !MANIFEST_SECTIONS.contains(&key.as_str()) {
                issues.push(ManifestIssue {
                    field: Some(key.clone()),
                    ..ManifestIssue::document(
                        file,
                        "unknown top-level key; expected namespaces or topics",
                    )
                });
            }
        }
        let section = |name: &str, issues: &mut Vec<ManifestIssue>| -> Vec<Value> {
            match root.get(name) {
                None | Some(Value::Null) => Vec::new(),
                Some(Value::Array(items)) => items.clone(),
                Some(_) => {
                    issues.push(ManifestIssue {
                        field: Some(name.to_owned()),
                        ..ManifestIssue::document(file, "must be a list")
                    });
                    Vec::new()
                }
            }
        };

        let mut seen_namespaces: BTreeMap<String, usize> = BTreeMap::new();
        for (index, item) in section("namespaces", &mut issues).iter().enumerate() {
            let issue = |name: Option<&str>, message: String| {
                ManifestIssue::entry(file, "namespaces", index, name, Some("name"), message)
            };
            let Some(raw) = item.as_str() else {
                issues.push(issue(None, format!("must be a string, got {item}")));
                continue;
            };
            match NamespaceName::new(raw) {
                Err(e) => issues.push(issue(Some(raw), e.to_string())),
                Ok(ns) => match seen_namespaces.get(raw) {
                    Some(first) => {
                        issues.push(issue(
                            Some(raw),
                            format!("duplicate of namespaces[{first}]"),
                        ));
                    }
                    None => {
                        seen_namespaces.insert(raw.to_owned(), index);
                        manifest.namespaces.push(ns);
                    }
                },
            }
        }

        let topic_items = section("topics", &mut issues);
        let mut seen_topics: BTreeMap<TopicName, usize> = BTreeMap::new();
        let mut valid_topics = true;
        for (index, item) in topic_items.iter().enumerate() {
            match Self::topic_entry(file, index, item, &seen_topics) {
                Ok(spec) => {
                    seen_topics.insert(spec.name.clone(), index);
                    manifest.topics.push(spec);
                }
                Err(mut entry_issues) => {
                    valid_topics = false;
                    issues.append(&mut entry_issues);
                }
            }
        }
        if valid_topics {
            // A topic named like a partition of another entry would share
            // its keys. Indices match entries when every entry is valid.
            for (index, spec) in manifest.topics.iter().enumerate() {
                for (partition, name) in spec.partition_names.iter().enumerate() {
                    if let Some(&other) = seen_topics.get(name) {
                        issues.push(ManifestIssue::entry(
                            file,
                            "topics",
                            other,
                            Some(name.as_str()),
                            Some("name"),
                            format!(
                                "is partition {partition} of topics[{index}] ({})",
                                spec.name
                            ),
                        ));
                    }
                }
            }
        }
        if issues.is_empty() {
            Ok(manifest)
        } else {
            issues.sort_by_key(|issue| {
                (
                    issue.section.is_some(),
                    issue
                        .section
                        .as_deref()
                        .and_then(|s| MANIFEST_SECTIONS.iter().position(|&x| x == s)),
                    issue.index,
                )
            });
            Err(ManifestErrors {
                file: file.to_owned(),
                issues,
            })
        }
    }

    /// Validates one entry of `topics`, collecting every problem of it.
    fn topic_entry(
        file: &str,
        index: usize,
        item: &Value,
        seen: &BTreeMap<TopicName, usize>,
    ) -> Result<TopicSpec, Vec<ManifestIssue>> {
        let Some(map) = item.as_object() else {
            return Err(vec![ManifestIssue::entry(
                file,
                "topics",
                index,
                None,
                None,
                format!("must be a mapping with name, intent and partitions, got {item}"),
            )]);
        };
        let raw_name = map.get("name").and_then(Value::as_str);
        let mut issues = Vec::new();
        let mut issue = |field: &str, message: String| {
            issues.push(ManifestIssue::entry(
                file,
                "topics",
                index,
                raw_name,
                Some(field),
                message,
            ));
        };
        for key in map.keys() {
            if !TOPIC_FIELDS.contains(&key.as_str()) {
                issue(
                    key,
                    "unknown field; expected name, intent, partitions".into(),
                );
            }
        }
        let name = match map.get("name") {
            None | Some(Value::Null) => {
                issue("name", "is required".into());
                None
            }
            Some(Value::String(s)) => match TopicName::new(s) {
                Ok(name) => match seen.get(&name) {
                    Some(first) => {
                        issue("name", format!("duplicate of topics[{first}]"));
                        None
                    }
                    None => Some(name),
                },
                Err(e) => {
                    issue("name", e.to_string());
                    None
                }
            },
            Some(other) => {
                issue("name", format!("must be a string, got {other}"));
                None
            }
        };
        let intent = match map.get("intent") {
            None | Some(Value::Null) => {
                issue("intent", "is required".into());
                None
            }
            Some(Value::String(s)) => match StreamIntent::parse(s) {
                Ok(intent) => Some(intent),
                Err(e) => {
                    issue("intent", e.to_string());
                    None
                }
            },
            Some(other) => {
                issue("intent", format!("must be a string, got {other}"));
                None
            }
        };
        let partitions = match map.get("partitions") {
            None | Some(Value::Null) => Some(0),
            Some(value) => match value.as_u64().and_then(|n| u32::try_from(n).ok()) {
                Some(n) if n <= MAX_PARTITIONS => Some(n),
                _ => {
                    issue(
                        "partitions",
                        format!("must be a whole number from 0 to {MAX_PARTITIONS}, got {value}"),
                    );
                    None
                }
            },
        };
        if let (Some(name), Some(intent), Some(partitions)) = (name, intent, partitions)
            && issues.is_empty()
        {
            return TopicSpec::new(name, intent, partitions).map_err(|e| {
                let field = e.field().unwrap_or("name").to_owned();
                let message = match &e {
                    CatalogError::InvalidName { source, .. } => source.to_string(),
                    other => other.to_string(),
                };
                vec![ManifestIssue::entry(
                    file,
                    "topics",
                    index,
                    raw_name,
                    Some(&field),
                    message,
                )]
            });
        }
        Err(issues)
    }

    /// The file name given to [`Manifest::from_value`].
    pub fn file(&self) -> &str {
        &self.file
    }

    /// Declared namespaces, in document order.
    pub fn namespaces(&self) -> &[NamespaceName] {
        &self.namespaces
    }

    /// Declared topics, in document order.
    pub fn topics(&self) -> &[TopicSpec] {
        &self.topics
    }
}

/// What a plan item is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ItemKind {
    /// A namespace.
    Namespace,
    /// A topic (with its partitions).
    Topic,
}

impl ItemKind {
    /// `namespace` or `topic`.
    pub fn as_str(self) -> &'static str {
        match self {
            ItemKind::Namespace => "namespace",
            ItemKind::Topic => "topic",
        }
    }
}

/// One line of an `apply` plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanItem {
    /// Namespace or topic.
    pub kind: ItemKind,
    /// The namespace (`agents`) or topic (`/agents/events`).
    pub name: String,
    /// What applying does to it.
    pub action: Action,
    /// The topic's canonical intent (topics only).
    pub intent: Option<StreamIntent>,
    /// The topic's partition count (topics only).
    pub partitions: Option<u32>,
    /// For [`Action::Update`]: each changed field, existing → requested.
    pub changes: Vec<Difference>,
}

/// An `apply` plan: namespaces first (declared, then implied by topics, in
/// document order), then topics in document order.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Plan {
    /// The items.
    pub items: Vec<PlanItem>,
}

impl Plan {
    /// How many items have `action`.
    pub fn count(&self, action: Action) -> usize {
        self.items.iter().filter(|i| i.action == action).count()
    }
}

/// The result of [`Catalog::apply`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApplyReport {
    /// Whether this was a dry run (nothing written).
    pub dry_run: bool,
    /// Whether a transaction was committed (false for dry runs and for
    /// plans with nothing to create or update).
    pub committed: bool,
    /// The plan.
    pub plan: Plan,
}

// ---------------------------------------------------------------------------
// Comparing a topic spec with the store
// ---------------------------------------------------------------------------

/// One key of a topic spec, its stored and its desired value.
#[derive(Debug)]
struct Entry {
    key: String,
    current: Option<Value>,
    desired: Value,
}

impl Entry {
    fn matches(&self) -> bool {
        self.current.as_ref() == Some(&self.desired)
    }

    fn precondition(&self, txn: Txn) -> Txn {
        match &self.current {
            Some(value) => txn.when_equals(self.key.clone(), value.clone()),
            None => txn.when_absent(self.key.clone()),
        }
    }
}

/// A topic spec against the store.
#[derive(Debug)]
struct Comparison {
    /// Keys of the spec ([`TopicSpec::desired_entries`] order).
    entries: Vec<Entry>,
    /// Stored partition count; `None` when the topic does not exist.
    existing_partitions: Option<u32>,
    /// Differences from the stored topic; for a missing topic, the
    /// partition names that are taken by existing topics.
    differences: Vec<Difference>,
    /// Partitions this spec would add whose name an existing topic already
    /// has (all partitions of a missing topic, the new ones of a growing
    /// topic).
    taken: Vec<TopicName>,
}

impl Comparison {
    fn action(&self) -> Action {
        match self.existing_partitions {
            None => Action::Create,
            Some(_) if self.entries.iter().all(Entry::matches) => Action::Unchanged,
            Some(_) => Action::Update,
        }
    }

    /// Adds the writes that make the store match the spec: a precondition
    /// on the topic marker (absent, or its read value) and on every key it
    /// rewrites, and a put for every key that differs.
    fn add_writes(&self, mut txn: Txn) -> Txn {
        for (index, entry) in self.entries.iter().enumerate() {
            if index == 0 || !entry.matches() {
                txn = entry.precondition(txn);
            }
            if !entry.matches() {
                txn = txn.put(entry.key.clone(), entry.desired.clone());
            }
        }
        txn
    }

    /// Preconditions that keep an `unchanged` verdict true at commit time:
    /// the topic marker and intent still hold what was read.
    fn add_guards(&self, mut txn: Txn) -> Txn {
        for entry in self.entries.iter().take(2) {
            txn = entry.precondition(txn);
        }
        txn
    }
}

// ---------------------------------------------------------------------------
// The catalog
// ---------------------------------------------------------------------------

/// Catalog operations over a metadata store. Cheap to build per request.
#[derive(Clone, Copy)]
pub struct Catalog<'a> {
    store: &'a dyn MetadataStore,
}

impl fmt::Debug for Catalog<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Catalog").finish_non_exhaustive()
    }
}

impl<'a> Catalog<'a> {
    /// A catalog over `store`.
    pub fn new(store: &'a dyn MetadataStore) -> Catalog<'a> {
        Catalog { store }
    }

    // ---- namespaces -------------------------------------------------------

    /// Whether `/namespaces/{ns}/policy` exists.
    ///
    /// # Errors
    /// [`CatalogError::Metadata`].
    pub async fn namespace_exists(&self, namespace: &NamespaceName) -> Result<bool, CatalogError> {
        Ok(self
            .store
            .get(&keys::namespaces::policy(namespace))
            .await?
            .is_some())
    }

    /// Creates `namespace` with the default [`NamespacePolicy`];
    /// idempotent: an existing namespace is [`Action::Unchanged`] and keeps
    /// its policy.
    ///
    /// # Errors
    /// [`CatalogError::Metadata`].
    pub async fn create_namespace(
        &self,
        namespace: &NamespaceName,
    ) -> Result<Action, CatalogError> {
        let key = keys::namespaces::policy(namespace);
        let policy = to_json(&key, &NamespacePolicy::default())?;
        match self.store.compare_and_swap(&key, None, policy).await? {
            outcome if outcome.applied => Ok(Action::Create),
            _ => Ok(Action::Unchanged),
        }
    }

    /// Every namespace, sorted by name. Scans `/namespaces/`, which also
    /// holds every topic's registry entry: cost grows with the topic count.
    ///
    /// # Errors
    /// [`CatalogError::Metadata`].
    pub async fn list_namespaces(&self) -> Result<Vec<NamespaceName>, CatalogError> {
        let entries = self.store.list(&keys::namespaces::all_prefix()).await?;
        Ok(entries
            .into_iter()
            .filter_map(|(key, _)| match MetadataKey::parse(&key) {
                Ok(MetadataKey::NamespacePolicy { namespace }) => Some(namespace),
                _ => None,
            })
            .collect())
    }

    /// Adds the namespace's creation to `txn` when it does not exist;
    /// returns whether it did.
    async fn add_namespace(
        &self,
        namespace: &NamespaceName,
        txn: Txn,
    ) -> Result<(Txn, bool), CatalogError> {
        if self.namespace_exists(namespace).await? {
            return Ok((txn, false));
        }
        let key = keys::namespaces::policy(namespace);
        let policy = to_json(&key, &NamespacePolicy::default())?;
        Ok((txn.when_absent(key.clone()).put(key, policy), true))
    }

    // ---- topics -----------------------------------------------------------

    async fn compare(&self, spec: &TopicSpec) -> Result<Comparison, CatalogError> {
        let mut entries = Vec::new();
        for (key, desired) in spec.desired_entries()? {
            let current = self.store.get(&key).await?;
            entries.push(Entry {
                key,
                current,
                desired,
            });
        }
        let marker = &entries[0];
        let existing_partitions = marker
            .current
            .as_ref()
            .map(|value| decode_count(&marker.key, value))
            .transpose()?;
        // Partitions the spec adds whose marker already exists.
        let first_new = existing_partitions.unwrap_or(0) as usize;
        let taken: Vec<TopicName> = spec
            .partition_names
            .iter()
            .enumerate()
            .skip(first_new)
            .filter(|(index, _)| entries[KEYS_PER_TOPIC * (index + 1)].current.is_some())
            .map(|(_, name)| name.clone())
            .collect();
        let mut differences = Vec::new();
        match existing_partitions {
            None => {
                for name in &taken {
                    differences.push(Difference::new(
                        "partitions",
                        format!("topic {name} exists"),
                        format!("{} partitions", spec.partitions),
                    ));
                }
            }
            Some(existing) => {
                if existing != spec.partitions {
                    differences.push(Difference::new("partitions", existing, spec.partitions));
                }
                let intent = &entries[1];
                let desired_intent = spec.intent.expand();
                match &intent.current {
                    None => differences.push(Difference::new(
                        "intent",
                        "none (implicit topic)",
                        desired_intent.intent,
                    )),
                    Some(value) => {
                        let stored: ExpandedStreamSettings = decode(&intent.key, value.clone())?;
                        if stored.intent != desired_intent.intent {
                            differences.push(Difference::new(
                                "intent",
                                stored.intent,
                                desired_intent.intent,
                            ));
                        } else if let (Value::Object(have), Value::Object(want)) =
                            (value, &intent.desired)
                        {
                            for (field, wanted) in want {
                                let had = have.get(field).unwrap_or(&Value::Null);
                                if had != wanted {
                                    differences.push(Difference::new(
                                        field,
                                        render(had),
                                        render(wanted),
                                    ));
                                }
                            }
                        }
                    }
                }
                let delivery = &entries[2];
                if !delivery.matches() {
                    differences.push(Difference::new(
                        "delivery",
                        delivery.current.as_ref().map_or("none".into(), render),
                        render(&delivery.desired),
                    ));
                }
                if differences.is_empty() {
                    let stale = entries.iter().filter(|e| !e.matches()).count();
                    if stale > 0 {
                        differences.push(Difference::new(
                            "metadata_keys",
                            format!("{stale} keys missing or different"),
                            "rewritten to match the intent",
                        ));
                    }
                }
            }
        }
        Ok(Comparison {
            entries,
            existing_partitions,
            differences,
            taken,
        })
    }

    /// Creates an intent-backed topic and its partitions in one transaction
    /// (`seeds/000_d502aacc865e81b1.txt`, "Zero-Drift Raft Expansion"),
    /// creating its namespace too when missing.
    ///
    /// An existing topic with exactly these settings is
    /// [`Action::Unchanged`]; a concurrent create of the same topic is
    /// detected by the preconditions and re-checked.
    ///
    /// # Errors
    /// [`CatalogError::TopicConflict`] naming every differing field (also
    /// when a partition name is taken by an existing topic);
    /// [`CatalogError::ConcurrentChange`]; [`CatalogError::Inconsistent`];
    /// [`CatalogError::Metadata`].
    pub async fn create_topic(&self, spec: &TopicSpec) -> Result<CreateOutcome, CatalogError> {
        let outcome = |action, namespace_created| CreateOutcome {
            topic: spec.name.clone(),
            action,
            intent: spec.intent,
            partitions: spec.partitions,
            namespace_created,
        };
        let mut failed_key = String::new();
        // The comparison reads key by key, not from one snapshot: a create
        // racing with ours can be seen half-way (partitions without their
        // parent). A conflict is reported only when two reads in a row agree.
        let mut seen_conflict: Option<Vec<Difference>> = None;
        for _ in 0..WRITE_ATTEMPTS {
            let comparison = self.compare(spec).await?;
            match comparison.action() {
                Action::Unchanged => return Ok(outcome(Action::Unchanged, false)),
                Action::Create | Action::Update
                    if seen_conflict.as_ref() != Some(&comparison.differences)
                        && !comparison.differences.is_empty() =>
                {
                    seen_conflict = Some(comparison.differences.clone());
                    continue;
                }
                Action::Create if comparison.differences.is_empty() => {
                    let (txn, namespace_created) = self
                        .add_namespace(&spec.name.namespace_name(), Txn::new())
                        .await?;
                    match self.store.txn(comparison.add_writes(txn)).await? {
                        TxnOutcome::Applied => {
                            return Ok(outcome(Action::Create, namespace_created));
                        }
                        TxnOutcome::ConditionFailed { key, .. } => failed_key = key,
                    }
                }
                Action::Create | Action::Update => {
                    return Err(CatalogError::TopicConflict {
                        topic: spec.name.clone(),
                        differences: comparison.differences,
                    });
                }
            }
        }
        Err(CatalogError::ConcurrentChange { key: failed_key })
    }

    /// Implicit creation on the first publish to an unknown topic, with the
    /// broker fallback of the seed table: delivery `NonReliable` unless
    /// `reliable_dispatch`, no `/intent` key (so the WAL uses
    /// [`CLUSTER_DEFAULT_WAL_SYNC`] and subscriptions get
    /// [`SubscriptionFailurePolicy::broker_fallback`]), non-partitioned. The
    /// namespace is created when missing. An existing topic is left as it is
    /// and its stored settings are returned.
    ///
    /// # Errors
    /// [`CatalogError::ConcurrentChange`], [`CatalogError::Inconsistent`],
    /// [`CatalogError::Metadata`].
    pub async fn create_implicit(
        &self,
        topic: &TopicName,
        reliable_dispatch: bool,
    ) -> Result<ImplicitOutcome, CatalogError> {
        let delivery = if reliable_dispatch {
            Delivery::Reliable
        } else {
            Delivery::NonReliable
        };
        let marker = keys::topics::marker(topic);
        let mut failed_key = String::new();
        for _ in 0..WRITE_ATTEMPTS {
            if self.store.get(&marker).await?.is_some() {
                return Ok(ImplicitOutcome {
                    created: false,
                    namespace_created: false,
                    settings: self.load_settings(topic).await?,
                });
            }
            let (mut txn, namespace_created) = self
                .add_namespace(&topic.namespace_name(), Txn::new())
                .await?;
            for (key, value) in [
                (marker.clone(), json!(0)),
                (keys::topics::delivery(topic), json!(delivery.as_str())),
                (keys::namespaces::topic(topic), json!(0)),
            ] {
                txn = txn.when_absent(key.clone()).put(key, value);
            }
            match self.store.txn(txn).await? {
                TxnOutcome::Applied => {
                    return Ok(ImplicitOutcome {
                        created: true,
                        namespace_created,
                        settings: TopicLoadSettings {
                            delivery,
                            wal_sync_mode: CLUSTER_DEFAULT_WAL_SYNC,
                            intent: None,
                        },
                    });
                }
                TxnOutcome::ConditionFailed { key, .. } => failed_key = key,
            }
        }
        Err(CatalogError::ConcurrentChange { key: failed_key })
    }

    /// The stored partition count of `topic`.
    async fn marker(&self, topic: &TopicName) -> Result<u32, CatalogError> {
        let key = keys::topics::marker(topic);
        match self.store.get(&key).await? {
            Some(value) => decode_count(&key, &value),
            None => Err(CatalogError::TopicNotFound {
                topic: topic.clone(),
            }),
        }
    }

    async fn stored_intent(
        &self,
        topic: &TopicName,
    ) -> Result<Option<ExpandedStreamSettings>, CatalogError> {
        let key = keys::topics::intent(topic);
        self.store
            .get(&key)
            .await?
            .map(|value| decode(&key, value))
            .transpose()
    }

    /// The settings a broker loads `topic` with, read from metadata: the
    /// persisted `wal_sync_mode` of its intent, or
    /// [`CLUSTER_DEFAULT_WAL_SYNC`] for an implicit topic
    /// (`seeds/000_d502aacc865e81b1.txt`: "Whenever a broker loads or
    /// reloads a topic … it reads /intent").
    ///
    /// # Errors
    /// [`CatalogError::TopicNotFound`]; [`CatalogError::Inconsistent`] when
    /// neither `/delivery` nor `/intent` is stored or a value does not
    /// decode; [`CatalogError::Metadata`].
    pub async fn load_settings(
        &self,
        topic: &TopicName,
    ) -> Result<TopicLoadSettings, CatalogError> {
        self.marker(topic).await?;
        let intent = self.stored_intent(topic).await?;
        let delivery_key = keys::topics::delivery(topic);
        let delivery = match self.store.get(&delivery_key).await? {
            Some(value) => decode(&delivery_key, value)?,
            None => match &intent {
                Some(settings) => settings.delivery,
                None => {
                    return Err(CatalogError::inconsistent(
                        &delivery_key,
                        "topic has neither /delivery nor /intent",
                    ));
                }
            },
        };
        Ok(TopicLoadSettings {
            delivery,
            wal_sync_mode: intent
                .as_ref()
                .map_or(CLUSTER_DEFAULT_WAL_SYNC, |s| s.wal_sync_mode),
            intent,
        })
    }

    /// The WAL sync mode `topic` must be opened with; see
    /// [`Catalog::load_settings`].
    ///
    /// # Errors
    /// As [`Catalog::load_settings`].
    pub async fn sync_mode_for(&self, topic: &TopicName) -> Result<SyncMode, CatalogError> {
        Ok(self.load_settings(topic).await?.wal_sync_mode)
    }

    /// Describes `topic` (`seeds/000_d502aacc865e81b1.txt`, sample output of
    /// `describe`). `broker_candidates` are the broker ids whose assignment
    /// key `/cluster/brokers/{id}/{ns}/{topic}` is checked, in order (the
    /// cluster members).
    ///
    /// # Errors
    /// As [`Catalog::load_settings`].
    pub async fn describe(
        &self,
        topic: &TopicName,
        broker_candidates: &[u64],
    ) -> Result<TopicDescription, CatalogError> {
        let partitions = self.marker(topic).await?;
        let settings = self.load_settings(topic).await?;
        let mut broker_id = None;
        for &id in broker_candidates {
            if self
                .store
                .get(&keys::cluster::broker_assignment(id, topic))
                .await?
                .is_some()
            {
                broker_id = Some(id);
                break;
            }
        }
        let mut subscriptions: BTreeMap<SubscriptionName, Option<SubscriptionFailurePolicy>> =
            BTreeMap::new();
        for (key, value) in self
            .store
            .list(&keys::topics::subscriptions_prefix(topic))
            .await?
        {
            let Ok((_, name, kind)) = keys::parse_subscription_key(&key) else {
                continue;
            };
            let slot = subscriptions.entry(name).or_default();
            if kind == SubscriptionKey::FailurePolicy {
                *slot = Some(decode(&key, value)?);
            }
        }
        let partition_topics = (0..partitions)
            .map(|index| topic.partition(index))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| CatalogError::inconsistent(&keys::topics::marker(topic), e.to_string()))?;
        let intent_summary = match &settings.intent {
            Some(intent) => intent.summary(topic),
            None => format!(
                "none (implicit topic: wal_sync={}, broker fallback failure policy)",
                settings.wal_sync_mode
            ),
        };
        Ok(TopicDescription {
            topic: topic.clone(),
            broker_id,
            partitions,
            partition_topics,
            delivery: settings.delivery,
            wal_sync_mode: settings.wal_sync_mode,
            intent: settings.intent,
            intent_summary,
            subscriptions: subscriptions
                .into_iter()
                .map(|(name, failure_policy)| SubscriptionSummary {
                    name,
                    failure_policy,
                })
                .collect(),
        })
    }

    /// Topics of `namespace` (all namespaces when `None`), sorted by name.
    /// Partitions of a listed partitioned topic are not listed separately.
    ///
    /// # Errors
    /// [`CatalogError::NamespaceNotFound`]; [`CatalogError::Inconsistent`]
    /// for a registry value that is not a partition count;
    /// [`CatalogError::Metadata`].
    pub async fn list_topics(
        &self,
        namespace: Option<&NamespaceName>,
    ) -> Result<Vec<TopicListEntry>, CatalogError> {
        let prefix = match namespace {
            Some(ns) => {
                if !self.namespace_exists(ns).await? {
                    return Err(CatalogError::NamespaceNotFound {
                        namespace: ns.clone(),
                    });
                }
                keys::namespaces::topics_prefix(ns)
            }
            None => keys::namespaces::all_prefix(),
        };
        let mut topics = BTreeMap::new();
        for (key, value) in self.store.list(&prefix).await? {
            if let Ok(MetadataKey::NamespaceTopic { topic }) = MetadataKey::parse(&key) {
                topics.insert(topic, decode_count(&key, &value)?);
            }
        }
        let hidden: BTreeSet<TopicName> = topics
            .keys()
            .filter(|topic| {
                topic
                    .partition_of()
                    .is_some_and(|(parent, index)| topics.get(&parent).is_some_and(|&n| index < n))
            })
            .cloned()
            .collect();
        Ok(topics
            .into_iter()
            .filter(|(name, _)| !hidden.contains(name))
            .map(|(name, partitions)| TopicListEntry { name, partitions })
            .collect())
    }

    /// Deletes `topic`, its partitions and every key under them, in one
    /// transaction conditional on the topic marker.
    ///
    /// # Errors
    /// [`CatalogError::TopicNotFound`]; [`CatalogError::IsPartition`] for a
    /// partition of an existing partitioned topic;
    /// [`CatalogError::ConcurrentChange`]; [`CatalogError::Metadata`] (also
    /// when the keys exceed one transaction).
    pub async fn delete_topic(&self, topic: &TopicName) -> Result<DeleteOutcome, CatalogError> {
        if let Some((parent, index)) = topic.partition_of()
            && let Ok(count) = self.marker(&parent).await
            && index < count
        {
            return Err(CatalogError::IsPartition {
                topic: topic.clone(),
                parent,
                index,
            });
        }
        let marker_key = keys::topics::marker(topic);
        let Some(marker) = self.store.get(&marker_key).await? else {
            return Err(CatalogError::TopicNotFound {
                topic: topic.clone(),
            });
        };
        let partitions = decode_count(&marker_key, &marker)?;
        let mut txn = Txn::new().when_equals(marker_key, marker);
        let mut deleted_keys = 0;
        let mut topics = vec![topic.clone()];
        for index in 0..partitions {
            topics.push(topic.partition(index).map_err(|e| {
                CatalogError::inconsistent(&keys::topics::marker(topic), e.to_string())
            })?);
        }
        for name in &topics {
            for key in [keys::topics::marker(name), keys::namespaces::topic(name)] {
                // A partition may lack a key when metadata was damaged.
                if self.store.get(&key).await?.is_some() {
                    deleted_keys += 1;
                    txn = txn.delete(key);
                }
            }
            for (key, _) in self.store.list(&keys::topics::topic_prefix(name)).await? {
                deleted_keys += 1;
                txn = txn.delete(key);
            }
        }
        match self.store.txn(txn).await? {
            TxnOutcome::Applied => Ok(DeleteOutcome {
                topic: topic.clone(),
                partitions,
                deleted_keys,
            }),
            TxnOutcome::ConditionFailed { key, .. } => Err(CatalogError::ConcurrentChange { key }),
        }
    }

    // ---- failure policies -------------------------------------------------

    /// The policy a new subscription of `topic` inherits: derived from the
    /// stored intent, or the broker fallback for implicit topics.
    async fn derived_policy(
        &self,
        topic: &TopicName,
    ) -> Result<(SubscriptionFailurePolicy, PolicySource), CatalogError> {
        match self.stored_intent(topic).await? {
            Some(settings) => SubscriptionFailurePolicy::inherit(&settings, topic)
                .map(|policy| (policy, PolicySource::Intent))
                .map_err(|e| {
                    CatalogError::inconsistent(&keys::topics::intent(topic), e.to_string())
                }),
            None => Ok((
                SubscriptionFailurePolicy::broker_fallback(),
                PolicySource::BrokerFallback,
            )),
        }
    }

    async fn stored_policy(
        &self,
        topic: &TopicName,
        subscription: &SubscriptionName,
    ) -> Result<Option<(Value, SubscriptionFailurePolicy)>, CatalogError> {
        let key = keys::topics::subscription_failure_policy(topic, subscription);
        match self.store.get(&key).await? {
            Some(value) => {
                let policy = decode(&key, value.clone())?;
                Ok(Some((value, policy)))
            }
            None => Ok(None),
        }
    }

    /// A consumer attaches under `subscription`
    /// (`seeds/000_d502aacc865e81b1.txt`, "How Topic Defaults Flow to
    /// Subscriptions"): a stored policy is returned untouched (never
    /// overwritten); otherwise the policy is derived from `/intent` (broker
    /// fallback for implicit topics) and persisted with a `when_absent`
    /// precondition, so of two racing first attaches one persists and both
    /// return the same policy.
    ///
    /// # Errors
    /// [`CatalogError::TopicNotFound`]; [`CatalogError::ConcurrentChange`];
    /// [`CatalogError::Inconsistent`]; [`CatalogError::Metadata`].
    pub async fn attach_subscription(
        &self,
        topic: &TopicName,
        subscription: &SubscriptionName,
    ) -> Result<FailurePolicyView, CatalogError> {
        let key = keys::topics::subscription_failure_policy(topic, subscription);
        let view = |policy, source| FailurePolicyView {
            topic: topic.clone(),
            subscription: subscription.clone(),
            persisted: true,
            source,
            policy,
        };
        let mut failed_key = String::new();
        for _ in 0..WRITE_ATTEMPTS {
            let marker_key = keys::topics::marker(topic);
            let Some(marker) = self.store.get(&marker_key).await? else {
                return Err(CatalogError::TopicNotFound {
                    topic: topic.clone(),
                });
            };
            if let Some((_, policy)) = self.stored_policy(topic, subscription).await? {
                return Ok(view(policy, PolicySource::Stored));
            }
            let (policy, source) = self.derived_policy(topic).await?;
            let txn = Txn::new()
                .when_equals(marker_key, marker)
                .when_absent(key.clone())
                .put(key.clone(), to_json(&key, &policy)?);
            match self.store.txn(txn).await? {
                TxnOutcome::Applied => return Ok(view(policy, source)),
                TxnOutcome::ConditionFailed { key, .. } => failed_key = key,
            }
        }
        Err(CatalogError::ConcurrentChange { key: failed_key })
    }

    /// The failure policy of `subscription`: the stored one, or (not
    /// persisted) the one its first attach would persist.
    ///
    /// # Errors
    /// [`CatalogError::TopicNotFound`]; [`CatalogError::Inconsistent`];
    /// [`CatalogError::Metadata`].
    pub async fn failure_policy(
        &self,
        topic: &TopicName,
        subscription: &SubscriptionName,
    ) -> Result<FailurePolicyView, CatalogError> {
        self.marker(topic).await?;
        let (persisted, source, policy) = match self.stored_policy(topic, subscription).await? {
            Some((_, policy)) => (true, PolicySource::Stored, policy),
            None => {
                let (policy, source) = self.derived_policy(topic).await?;
                (false, source, policy)
            }
        };
        Ok(FailurePolicyView {
            topic: topic.clone(),
            subscription: subscription.clone(),
            persisted,
            source,
            policy,
        })
    }

    /// Stores `policy` for `subscription`, replacing any stored one (an
    /// explicit override always wins; later attaches keep it). The
    /// subscription need not have been attached yet.
    ///
    /// # Errors
    /// [`CatalogError::InvalidPolicy`] / [`CatalogError::PolicyOutOfRange`]
    /// naming the field; [`CatalogError::TopicNotFound`];
    /// [`CatalogError::ConcurrentChange`]; [`CatalogError::Metadata`].
    pub async fn set_failure_policy(
        &self,
        topic: &TopicName,
        subscription: &SubscriptionName,
        policy: &SubscriptionFailurePolicy,
    ) -> Result<FailurePolicyView, CatalogError> {
        validate_policy(policy)?;
        self.update_policy(topic, subscription, |_| Ok(policy.clone()))
            .await
    }

    /// Applies `patch` to the current policy of `subscription` (stored, or
    /// the one it would inherit) and stores the result; fields the patch
    /// leaves out keep their current values.
    ///
    /// # Errors
    /// As [`Catalog::set_failure_policy`].
    pub async fn patch_failure_policy(
        &self,
        topic: &TopicName,
        subscription: &SubscriptionName,
        patch: &FailurePolicyPatch,
    ) -> Result<FailurePolicyView, CatalogError> {
        self.update_policy(topic, subscription, |current| {
            let policy = patch.apply_to(current);
            validate_policy(&policy)?;
            Ok(policy)
        })
        .await
    }

    /// Read-modify-write of a subscription's policy, conditional on the
    /// topic marker and the policy read.
    async fn update_policy(
        &self,
        topic: &TopicName,
        subscription: &SubscriptionName,
        change: impl Fn(&SubscriptionFailurePolicy) -> Result<SubscriptionFailurePolicy, CatalogError>,
    ) -> Result<FailurePolicyView, CatalogError> {
        let key = keys::topics::subscription_failure_policy(topic, subscription);
        let mut failed_key = String::new();
        for _ in 0..WRITE_ATTEMPTS {
            let marker_key = keys::topics::marker(topic);
            let Some(marker) = self.store.get(&marker_key).await? else {
                return Err(CatalogError::TopicNotFound {
                    topic: topic.clone(),
                });
            };
            let stored = self.stored_policy(topic, subscription).await?;
            let current = match &stored {
                Some((_, policy)) => policy.clone(),
                None => self.derived_policy(topic).await?.0,
            };
            let policy = change(&current)?;
            let txn = Txn::new().when_equals(marker_key, marker);
            let txn = match stored {
                Some((value, _)) => txn.when_equals(key.clone(), value),
                None => txn.when_absent(key.clone()),
            };
            let txn = txn.put(key.clone(), to_json(&key, &policy)?);
            match self.store.txn(txn).await? {
                TxnOutcome::Applied => {
                    return Ok(FailurePolicyView {
                        topic: topic.clone(),
                        subscription: subscription.clone(),
                        persisted: true,
                        source: PolicySource::Stored,
                        policy,
                    });
                }
                TxnOutcome::ConditionFailed { key, .. } => failed_key = key,
            }
        }
        Err(CatalogError::ConcurrentChange { key: failed_key })
    }

    // ---- apply --------------------------------------------------------------

    /// The plan of `manifest` against the store, without writing.
    ///
    /// # Errors
    /// As [`Catalog::apply`].
    pub async fn plan(&self, manifest: &Manifest) -> Result<Plan, CatalogError> {
        Ok(self.prepare(manifest).await?.0)
    }

    /// Computes the plan and the one transaction that carries it out.
    async fn prepare(&self, manifest: &Manifest) -> Result<(Plan, Txn), CatalogError> {
        let file = manifest.file();
        let mut plan = Plan::default();
        let mut txn = Txn::new();

        let mut namespaces: Vec<NamespaceName> = manifest.namespaces.clone();
        for spec in &manifest.topics {
            let ns = spec.name.namespace_name();
            if !namespaces.contains(&ns) {
                namespaces.push(ns);
            }
        }
        for namespace in &namespaces {
            let (next, created) = self.add_namespace(namespace, txn).await?;
            txn = next;
            plan.items.push(PlanItem {
                kind: ItemKind::Namespace,
                name: namespace.to_string(),
                action: if created {
                    Action::Create
                } else {
                    Action::Unchanged
                },
                intent: None,
                partitions: None,
                changes: Vec::new(),
            });
        }

        let mut issues = Vec::new();
        for (index, spec) in manifest.topics.iter().enumerate() {
            let comparison = self.compare(spec).await?;
            let action = comparison.action();
            let refusal = match (action, comparison.existing_partitions) {
                _ if !comparison.taken.is_empty() => {
                    let names: Vec<&str> = comparison.taken.iter().map(TopicName::as_str).collect();
                    Some((
                        "partitions",
                        format!(
                            "partition names already used by existing topics: {}",
                            names.join(", ")
                        ),
                    ))
                }
                (Action::Update, Some(existing))
                    if existing != spec.partitions
                        && !(existing > 0 && spec.partitions > existing) =>
                {
                    Some((
                        "partitions",
                        format!(
                            "existing topic has {existing} partitions, requested {}; \
                             only a partitioned topic's partition count can grow",
                            spec.partitions
                        ),
                    ))
                }
                _ => None,
            };
            if let Some((field, message)) = refusal {
                issues.push(ManifestIssue::entry(
                    file,
                    "topics",
                    index,
                    Some(spec.name.as_str()),
                    Some(field),
                    message,
                ));
                continue;
            }
            txn = match action {
                Action::Unchanged => comparison.add_guards(txn),
                Action::Create | Action::Update => comparison.add_writes(txn),
            };
            plan.items.push(PlanItem {
                kind: ItemKind::Topic,
                name: spec.name.to_string(),
                action,
                intent: Some(spec.intent),
                partitions: Some(spec.partitions),
                changes: if action == Action::Update {
                    comparison.differences
                } else {
                    Vec::new()
                },
            });
        }
        if !issues.is_empty() {
            return Err(CatalogError::ManifestConflict(ManifestErrors {
                file: file.to_owned(),
                issues,
            }));
        }
        let size = txn.preconditions.len() + txn.ops.len();
        if size > MAX_TXN_OPS {
            return Err(CatalogError::InvalidManifest(ManifestErrors::document(
                file,
                format!(
                    "applying needs {size} preconditions and writes in one atomic \
                     transaction, at most {MAX_TXN_OPS}; split the manifest"
                ),
            )));
        }
        Ok((plan, txn))
    }

    /// Applies `manifest` all or nothing (`seeds/000_d502aacc865e81b1.txt`,
    /// "Declarative State"): computes the plan (create / update / unchanged
    /// per namespace and topic) and, unless `dry_run`, writes all of it in
    /// one transaction whose preconditions pin everything the plan read.
    /// Applying the same manifest again plans everything `unchanged` and
    /// writes nothing.
    ///
    /// # Errors
    /// [`CatalogError::ManifestConflict`] for refused updates (shrinking or
    /// reshaping partitions, partition names taken), listing every entry;
    /// [`CatalogError::InvalidManifest`] when the plan does not fit one
    /// transaction; [`CatalogError::ConcurrentChange`] when the metadata
    /// changed between planning and committing (nothing applied);
    /// [`CatalogError::Inconsistent`]; [`CatalogError::Metadata`].
    pub async fn apply(
        &self,
        manifest: &Manifest,
        dry_run: bool,
    ) -> Result<ApplyReport, CatalogError> {
        let (plan, txn) = self.prepare(manifest).await?;
        let has_writes = plan.items.iter().any(|i| i.action != Action::Unchanged);
        if dry_run || !has_writes {
            return Ok(ApplyReport {
                dry_run,
                committed: false,
                plan,
            });
        }
        match self.store.txn(txn).await? {
            TxnOutcome::Applied => Ok(ApplyReport {
                dry_run,
                committed: true,
                plan,
            }),
            TxnOutcome::ConditionFailed { key, .. } => Err(CatalogError::ConcurrentChange { key }),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use serde_json::json;

    use super::*;
    use crate::metadata::redb::RedbStore;
    use crate::metadata::{BoxFuture, Watch};

    use crate::clock::ManualClock;

    struct Fixture {
        _dir: tempfile::TempDir,
        store: RedbStore,
    }

    fn fixture() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let store = RedbStore::open(
            dir.path().join("meta.redb"),
            Arc::new(ManualClock::new(1_000)),
        )
        .unwrap();
        Fixture { _dir: dir, store }
    }

    impl Fixture {
        fn catalog(&self) -> Catalog<'_> {
            Catalog::new(&self.store)
        }

        async fn dump(&self) -> BTreeMap<String, Value> {
            self.store.list("/").await.unwrap().into_iter().collect()
        }
    }

    fn topic(name: &str) -> TopicName {
        TopicName::new(name).unwrap()
    }

    fn sub(name: &str) -> SubscriptionName {
        SubscriptionName::new(name).unwrap()
    }

    fn ns(name: &str) -> NamespaceName {
        NamespaceName::new(name).unwrap()
    }

    fn spec(name: &str, intent: &str, partitions: i64) -> TopicSpec {
        TopicSpec::parse(name, intent, partitions).unwrap()
    }

    /// The seed table's rows as stored JSON.
    fn intent_json(intent: &str) -> Value {
        match intent {
            "realtime" => json!({
                "intent": "realtime", "delivery": "NonReliable", "wal_sync_mode": "async",
                "max_retries": 0, "backoff_ms": 0, "poison_policy": "none",
                "dlq_suffix": null, "persistence": "in_memory"
            }),
            "event_stream" => json!({
                "intent": "event_stream", "delivery": "Reliable",
                "wal_sync_mode": "os_cache_flush", "max_retries": 3, "backoff_ms": 500,
                "poison_policy": "dead_letter", "dlq_suffix": "-dlq", "persistence": "wal"
            }),
            "task_queue" => json!({
                "intent": "task_queue", "delivery": "Reliable", "wal_sync_mode": "fsync_batch",
                "max_retries": 5, "backoff_ms": 1000, "poison_policy": "dead_letter",
                "dlq_suffix": "-dlq", "persistence": "wal"
            }),
            "audit_log" => json!({
                "intent": "audit_log", "delivery": "Reliable", "wal_sync_mode": "fsync_batch",
                "max_retries": 10, "backoff_ms": 500, "poison_policy": "block",
                "dlq_suffix": null, "persistence": "wal"
            }),
            other => panic!("{other}"),
        }
    }

    fn default_ns_policy() -> Value {
        json!({"max_producers_per_topic": 0, "max_consumers_per_topic": 0, "max_message_size": 0})
    }

    /// Every key an explicit create of `/{ns}/{name}` writes.
    fn topic_keys(ns: &str, name: &str, intent: &str, partitions: u32) -> BTreeMap<String, Value> {
        let mut keys = BTreeMap::new();
        let names = std::iter::once((name.to_owned(), partitions))
            .chain((0..partitions).map(|i| (format!("{name}-part-{i}"), 0)));
        for (t, count) in names {
            let delivery = intent_json(intent)["delivery"].clone();
            keys.insert(format!("/topics/{ns}/{t}"), json!(count));
            keys.insert(format!("/topics/{ns}/{t}/intent"), intent_json(intent));
            keys.insert(format!("/topics/{ns}/{t}/delivery"), delivery);
            keys.insert(format!("/namespaces/{ns}/topics/{ns}/{t}"), json!(count));
        }
        keys
    }

    // ---- create -------------------------------------------------------------

    #[tokio::test]
    async fn create_writes_every_key_of_the_seed_in_one_transaction() {
        let f = fixture();
        let outcome = f
            .catalog()
            .create_topic(&spec("/default/agent-jobs", "task_queue", 3))
            .await
            .unwrap();
        assert_eq!(
            outcome,
            CreateOutcome {
                topic: topic("/default/agent-jobs"),
                action: Action::Create,
                intent: StreamIntent::TaskQueue,
                partitions: 3,
                namespace_created: true,
            }
        );
        let mut expected = topic_keys("default", "agent-jobs", "task_queue", 3);
        expected.insert("/namespaces/default/policy".into(), default_ns_policy());
        assert_eq!(f.dump().await, expected);
        assert_eq!(expected.len(), 1 + 4 * 4);
    }

    #[tokio::test]
    async fn every_intent_and_alias_stores_the_canonical_expansion() {
        let f = fixture();
        let cases = [
            ("telemetry_firehose", "realtime"),
            ("agent_event_mesh", "event_stream"),
            ("work_queue", "task_queue"),
            ("tool_invocation_log", "audit_log"),
        ];
        let mut expected = BTreeMap::new();
        expected.insert("/namespaces/n/policy".to_owned(), default_ns_policy());
        for (alias, canonical) in cases {
            let name = format!("/n/{canonical}");
            let outcome = f
                .catalog()
                .create_topic(&spec(&name, alias, 0))
                .await
                .unwrap();
            assert_eq!(outcome.intent.as_str(), canonical);
            expected.extend(topic_keys("n", canonical, canonical, 0));
            // The canonical name is the same topic: unchanged.
            let again = f
                .catalog()
                .create_topic(&spec(&name, canonical, 0))
                .await
                .unwrap();
            assert_eq!(again.action, Action::Unchanged);
            assert!(!again.namespace_created);
        }
        assert_eq!(f.dump().await, expected);
        assert_eq!(
            f.dump().await["/topics/n/realtime/delivery"],
            json!("NonReliable")
        );
    }

    #[tokio::test]
    async fn create_is_idempotent_and_conflicts_name_every_differing_field() {
        let f = fixture();
        let c = f.catalog();
        c.create_topic(&spec("/default/agent-jobs", "task_queue", 3))
            .await
            .unwrap();
        let before = f.dump().await;
        let again = c
            .create_topic(&spec("/default/agent-jobs", "tasks", 3))
            .await
            .unwrap();
        assert_eq!(again.action, Action::Unchanged);
        let err = c
            .create_topic(&spec("/default/agent-jobs", "audit_log", 6))
            .await
            .unwrap_err();
        let CatalogError::TopicConflict { differences, .. } = &err else {
            panic!("{err:?}");
        };
        assert_eq!(
            differences,
            &vec![
                Difference::new("partitions", 3, 6),
                Difference::new("intent", "task_queue", "audit_log"),
            ]
        );
        assert_eq!(
            err.to_string(),
            "topic /default/agent-jobs already exists with different settings: \
             partitions: existing 3, requested 6; intent: existing task_queue, requested audit_log"
        );
        // A stored setting that drifted from the table is named field by field.
        let intent_key = "/topics/default/agent-jobs/intent";
        let mut drifted = intent_json("task_queue");
        drifted["max_retries"] = json!(7);
        f.store.put(intent_key, drifted).await.unwrap();
        let err = c
            .create_topic(&spec("/default/agent-jobs", "task_queue", 3))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, CatalogError::TopicConflict { differences, .. }
                if differences == &vec![Difference::new("max_retries", 7, 5)]),
            "{err:?}"
        );
        f.store
            .put(intent_key, intent_json("task_queue"))
            .await
            .unwrap();
        assert_eq!(f.dump().await, before);
    }

    #[tokio::test]
    async fn a_taken_partition_name_refuses_the_whole_create() {
        let f = fixture();
        let c = f.catalog();
        c.create_implicit(&topic("/default/jobs-part-1"), false)
            .await
            .unwrap();
        let before = f.dump().await;
        let err = c
            .create_topic(&spec("/default/jobs", "task_queue", 2))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, CatalogError::TopicConflict { differences, .. }
            if differences == &vec![Difference::new(
                "partitions",
                "topic /default/jobs-part-1 exists",
                "2 partitions"
            )]),
            "{err:?}"
        );
        assert_eq!(f.dump().await, before, "nothing half-applied");
    }

    #[tokio::test]
    async fn concurrent_creates_apply_once() {
        let f = fixture();
        let s = spec("/default/agent-jobs", "task_queue", 8);
        let c = f.catalog();
        let (a, b) = tokio::join!(c.create_topic(&s), c.create_topic(&s));
        let mut actions = [a.unwrap().action, b.unwrap().action];
        actions.sort_by_key(|a| a.as_str());
        assert_eq!(actions, [Action::Create, Action::Unchanged]);
        let mut expected = topic_keys("default", "agent-jobs", "task_queue", 8);
        expected.insert("/namespaces/default/policy".into(), default_ns_policy());
        assert_eq!(f.dump().await, expected);
    }

    #[test]
    fn invalid_create_requests_name_the_field() {
        let err = TopicSpec::parse("/default/x", "nope", 0).unwrap_err();
        assert_eq!(err.field(), Some("intent"));
        assert_eq!(
            err.to_string(),
            format!(
                "intent: unknown stream intent \"nope\"; valid intents: {}",
                tributary_proto::intent::valid_intent_names()
            )
        );
        for (partitions, shown) in [(-1, "-1"), (257, "257"), (i64::MAX, "9223372036854775807")] {
            let err = TopicSpec::parse("/default/x", "task_queue", partitions).unwrap_err();
            assert_eq!(err.field(), Some("partitions"));
            assert_eq!(
                err.to_string(),
                format!("partitions: must be a whole number from 0 to 256, got {shown}")
            );
        }
        let err = TopicSpec::parse("default/x", "task_queue", 0).unwrap_err();
        assert_eq!(err.field(), Some("name"));
        assert_eq!(
            err.to_string(),
            "name: invalid topic name \"default/x\": topic name must start with '/'"
        );
        // Partition and dead-letter names must fit too.
        let long = format!("/n/{}", "t".repeat(250));
        assert!(TopicSpec::parse(&long, "audit_log", 0).is_ok());
        let err = TopicSpec::parse(&long, "audit_log", 2).unwrap_err();
        assert_eq!(err.field(), Some("name"));
        let err = TopicSpec::parse(&long, "task_queue", 0).unwrap_err();
        assert!(err.to_string().contains("-dlq"), "{err}");
        assert_eq!(
            spec("/default/x", "tasks", 256).partition_names().len(),
            256
        );
    }

    // ---- implicit topics and load settings ----------------------------------

    #[tokio::test]
    async fn implicit_creation_uses_the_broker_fallback() {
        let f = fixture();
        let c = f.catalog();
        let t = topic("/edge1/sensors");
        let outcome = c.create_implicit(&t, false).await.unwrap();
        let fallback = TopicLoadSettings {
            delivery: Delivery::NonReliable,
            wal_sync_mode: SyncMode::OsCacheFlush,
            intent: None,
        };
        assert_eq!(
            outcome,
            ImplicitOutcome {
                created: true,
                namespace_created: true,
                settings: fallback.clone(),
            }
        );
        let expected: BTreeMap<String, Value> = [
            ("/namespaces/edge1/policy", default_ns_policy()),
            ("/namespaces/edge1/topics/edge1/sensors", json!(0)),
            ("/topics/edge1/sensors", json!(0)),
            ("/topics/edge1/sensors/delivery", json!("NonReliable")),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        assert_eq!(f.dump().await, expected);
        // The existing topic wins over a later reliable request.
        let again = c.create_implicit(&t, true).await.unwrap();
        assert_eq!(
            again,
            ImplicitOutcome {
                created: false,
                namespace_created: false,
                settings: fallback,
            }
        );
        assert_eq!(c.sync_mode_for(&t).await.unwrap(), SyncMode::OsCacheFlush);
        let reliable = c
            .create_implicit(&topic("/edge1/reliable"), true)
            .await
            .unwrap();
        assert_eq!(reliable.settings.delivery, Delivery::Reliable);
        assert!(!reliable.namespace_created);

        let view = c.attach_subscription(&t, &sub("s1")).await.unwrap();
        assert_eq!(view.source, PolicySource::BrokerFallback);
        assert_eq!(
            f.dump().await["/topics/edge1/sensors/subscriptions/s1/failure_policy"],
            json!({
                "max_redelivery_count": 5, "ack_timeout_ms": 30000,
                "base_redelivery_delay_ms": 1000, "max_redelivery_delay_ms": 60000,
                "backoff_strategy": "exponential", "poison_policy": "block",
                "dead_letter_topic": null
            })
        );
        // An explicit create of an implicit topic is a conflict.
        let err = c
            .create_topic(&spec("/edge1/sensors", "task_queue", 0))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, CatalogError::TopicConflict { differences, .. }
            if differences == &vec![
                Difference::new("intent", "none (implicit topic)", "task_queue"),
                Difference::new("delivery", "NonReliable", "Reliable"),
            ]),
            "{err:?}"
        );
    }

    #[tokio::test]
    async fn the_wal_sync_mode_is_the_persisted_one() {
        let f = fixture();
        let c = f.catalog();
        for (intent, mode) in [
            ("realtime", SyncMode::Async),
            ("event_stream", SyncMode::OsCacheFlush),
            ("task_queue", SyncMode::FsyncBatch),
            ("audit_log", SyncMode::FsyncBatch),
        ] {
            let t = topic(&format!("/n/{intent}"));
            c.create_topic(&spec(t.as_str(), intent, 1)).await.unwrap();
            assert_eq!(c.sync_mode_for(&t).await.unwrap(), mode, "{intent}");
            let partition = t.partition(0).unwrap();
            assert_eq!(c.sync_mode_for(&partition).await.unwrap(), mode);
        }
        // What is stored is what is used, even if the table says otherwise.
        let mut stored = intent_json("task_queue");
        stored["wal_sync_mode"] = json!("os_cache_flush");
        f.store
            .put("/topics/n/task_queue/intent", stored)
            .await
            .unwrap();
        assert_eq!(
            c.sync_mode_for(&topic("/n/task_queue")).await.unwrap(),
            SyncMode::OsCacheFlush
        );
        assert!(matches!(
            c.sync_mode_for(&topic("/n/missing")).await,
            Err(CatalogError::TopicNotFound { .. })
        ));
        f.store
            .put(
                "/topics/n/task_queue/intent",
                json!({"intent": "task_queue"}),
            )
            .await
            .unwrap();
        assert!(matches!(
            c.sync_mode_for(&topic("/n/task_queue")).await,
            Err(CatalogError::Inconsistent { key, .. }) if key == "/topics/n/task_queue/intent"
        ));
    }

    // ---- failure policies ---------------------------------------------------

    fn policy_json(max: u32, base: u64, poison: &str, dlq: Option<&str>) -> Value {
        json!({
            "max_redelivery_count": max, "ack_timeout_ms": 30000,
            "base_redelivery_delay_ms": base, "max_redelivery_delay_ms": 60000,
            "backoff_strategy": "exponential", "poison_policy": poison,
            "dead_letter_topic": dlq
        })
    }

    #[tokio::test]
    async fn first_attach_inherits_from_the_intent_and_persists() {
        let f = fixture();
        let c = f.catalog();
        let cases = [
            ("realtime", policy_json(0, 0, "none", None)),
            (
                "event_stream",
                policy_json(3, 500, "dead_letter", Some("/default/event_stream-dlq")),
            ),
            (
                "task_queue",
                policy_json(5, 1000, "dead_letter", Some("/default/task_queue-dlq")),
            ),
            ("audit_log", policy_json(10, 500, "block", None)),
        ];
        for (intent, expected) in cases {
            let t = topic(&format!("/default/{intent}"));
            c.create_topic(&spec(t.as_str(), intent, 0)).await.unwrap();
            let s = sub("worker-pool");
            let before = c.failure_policy(&t, &s).await.unwrap();
            assert!(!before.persisted);
            assert_eq!(before.source, PolicySource::Intent);
            let view = c.attach_subscription(&t, &s).await.unwrap();
            assert_eq!(
                serde_json::to_value(&view).unwrap(),
                json!({
                    "topic": t.as_str(), "subscription": "worker-pool",
                    "persisted": true, "source": "intent", "policy": expected
                }),
                "{intent}"
            );
            let key = format!("/topics/default/{intent}/subscriptions/worker-pool/failure_policy");
            assert_eq!(f.dump().await[&key], expected, "{intent}");
            let second = c.attach_subscription(&t, &s).await.unwrap();
            assert_eq!(second.source, PolicySource::Stored);
            assert_eq!(second.policy, view.policy);
        }
        assert!(matches!(
            c.attach_subscription(&topic("/default/missing"), &sub("s"))
                .await,
            Err(CatalogError::TopicNotFound { .. })
        ));
    }

    #[tokio::test]
    async fn overrides_win_and_are_never_overwritten() {
        let f = fixture();
        let c = f.catalog();
        let t = topic("/default/agent-jobs");
        c.create_topic(&spec(t.as_str(), "task_queue", 0))
            .await
            .unwrap();
        let override_policy = SubscriptionFailurePolicy {
            max_redelivery_count: 8,
            ack_timeout_ms: 45_000,
            base_redelivery_delay_ms: 1000,
            max_redelivery_delay_ms: 60_000,
            backoff_strategy: BackoffStrategy::Exponential,
            poison_policy: PoisonPolicy::DeadLetter,
            dead_letter_topic: Some("/default/agent-jobs-dlq".into()),
        };
        // Attached first, then overridden.
        c.attach_subscription(&t, &sub("worker-pool"))
            .await
            .unwrap();
        let set = c
            .set_failure_policy(&t, &sub("worker-pool"), &override_policy)
            .await
            .unwrap();
        assert_eq!(set.source, PolicySource::Stored);
        // Overridden before any consumer attached.
        c.set_failure_policy(&t, &sub("auditors"), &override_policy)
            .await
            .unwrap();
        for name in ["worker-pool", "auditors"] {
            let view = c.attach_subscription(&t, &sub(name)).await.unwrap();
            assert_eq!(view.policy, override_policy, "{name}");
            assert_eq!(view.source, PolicySource::Stored);
        }
        // Other subscriptions still inherit.
        let other = c.attach_subscription(&t, &sub("other")).await.unwrap();
        assert_eq!(other.policy.max_redelivery_count, 5);
        assert_eq!(
            f.dump().await["/topics/default/agent-jobs/subscriptions/worker-pool/failure_policy"],
            json!({
                "max_redelivery_count": 8, "ack_timeout_ms": 45000,
                "base_redelivery_delay_ms": 1000, "max_redelivery_delay_ms": 60000,
                "backoff_strategy": "exponential", "poison_policy": "dead_letter",
                "dead_letter_topic": "/default/agent-jobs-dlq"
            })
        );
    }

    #[tokio::test]
    async fn concurrent_first_attaches_persist_one_policy() {
        let f = fixture();
        let c = f.catalog();
        let t = topic("/default/jobs");
        c.create_topic(&spec(t.as_str(), "task_queue", 0))
            .await
            .unwrap();
        let s = sub("pool");
        let (a, b) = tokio::join!(c.attach_subscription(&t, &s), c.attach_subscription(&t, &s));
        let (a, b) = (a.unwrap(), b.unwrap());
        assert_eq!(a.policy, b.policy);
        let mut sources = [a.source, b.source];
        sources.sort_by_key(|s| *s == PolicySource::Stored);
        assert_eq!(sources, [PolicySource::Intent, PolicySource::Stored]);
    }

    #[tokio::test]
    async fn set_validates_and_names_the_field() {
        let f = fixture();
        let c = f.catalog();
        let t = topic("/default/jobs");
        c.create_topic(&spec(t.as_str(), "task_queue", 0))
            .await
            .unwrap();
        let s = sub("pool");
        let good = c.failure_policy(&t, &s).await.unwrap().policy;
        let before = f.dump().await;
        type Change = fn(&mut SubscriptionFailurePolicy);
        let cases: [(Change, &str, &str); 6] = [
            (
                |p| p.ack_timeout_ms = 0,
                "ack_timeout_ms",
                "ack_timeout_ms: ack_timeout_ms must be above 0",
            ),
            (
                |p| p.base_redelivery_delay_ms = 70_000,
                "base_redelivery_delay_ms",
                "base_redelivery_delay_ms: base_redelivery_delay_ms 70000 exceeds \
                 max_redelivery_delay_ms 60000",
            ),
            (
                |p| p.dead_letter_topic = None,
                "dead_letter_topic",
                "dead_letter_topic: poison_policy dead_letter requires dead_letter_topic",
            ),
            (
                |p| p.dead_letter_topic = Some("jobs-dlq".into()),
                "dead_letter_topic",
                "dead_letter_topic: dead_letter_topic: invalid topic name \"jobs-dlq\": \
                 topic name must start with '/'",
            ),
            (
                |p| p.max_redelivery_count = 10_001,
                "max_redelivery_count",
                "max_redelivery_count: 10001 is above the limit of 10000",
            ),
            (
                |p| p.ack_timeout_ms = 86_400_001,
                "ack_timeout_ms",
                "ack_timeout_ms: 86400001 is above the limit of 86400000",
            ),
        ];
        for (change, field, message) in cases {
            let mut bad = good.clone();
            change(&mut bad);
            let err = c.set_failure_policy(&t, &s, &bad).await.unwrap_err();
            assert_eq!(err.field(), Some(field));
            assert_eq!(err.to_string(), message);
        }
        assert_eq!(f.dump().await, before, "nothing stored");
        assert!(matches!(
            c.set_failure_policy(&topic("/default/none"), &s, &good)
                .await,
            Err(CatalogError::TopicNotFound { .. })
        ));
    }

    #[tokio::test]
    async fn patch_keeps_unspecified_fields() {
        let f = fixture();
        let c = f.catalog();
        let t = topic("/default/jobs");
        c.create_topic(&spec(t.as_str(), "task_queue", 0))
            .await
            .unwrap();
        let s = sub("pool");
        let patch: FailurePolicyPatch =
            serde_json::from_value(json!({"max_redelivery_count": 8})).unwrap();
        let view = c.patch_failure_policy(&t, &s, &patch).await.unwrap();
        assert_eq!(
            serde_json::to_value(&view.policy).unwrap(),
            policy_json(8, 1000, "dead_letter", Some("/default/jobs-dlq"))
        );
        let patch: FailurePolicyPatch = serde_json::from_value(
            json!({"poison_policy": "block", "dead_letter_topic": null, "ack_timeout_ms": 45000}),
        )
        .unwrap();
        assert_eq!(patch.dead_letter_topic, Some(None));
        let view = c.patch_failure_policy(&t, &s, &patch).await.unwrap();
        let mut expected = policy_json(8, 1000, "block", None);
        expected["ack_timeout_ms"] = json!(45000);
        assert_eq!(serde_json::to_value(&view.policy).unwrap(), expected);
        assert_eq!(
            f.dump().await["/topics/default/jobs/subscriptions/pool/failure_policy"],
            expected
        );
        // Switching back to dead_letter without a topic is refused.
        let patch: FailurePolicyPatch =
            serde_json::from_value(json!({"poison_policy": "dead_letter"})).unwrap();
        let err = c.patch_failure_policy(&t, &s, &patch).await.unwrap_err();
        assert_eq!(err.field(), Some("dead_letter_topic"));
        let empty: FailurePolicyPatch = serde_json::from_value(json!({})).unwrap();
        assert_eq!(empty, FailurePolicyPatch::default());
        assert!(serde_json::from_value::<FailurePolicyPatch>(json!({"max_retries": 1})).is_err());
    }

    // ---- describe, list, delete ---------------------------------------------

    #[tokio::test]
    async fn describe_matches_the_seed_sample() {
        let f = fixture();
        let c = f.catalog();
        let t = topic("/default/agent-jobs");
        c.create_topic(&spec(t.as_str(), "task_queue", 3))
            .await
            .unwrap();
        c.attach_subscription(&t, &sub("worker-pool"))
            .await
            .unwrap();
        f.store
            .put(
                "/topics/default/agent-jobs/subscriptions/metrics/cursor",
                json!(17),
            )
            .await
            .unwrap();
        f.store
            .put("/cluster/brokers/1/default/agent-jobs", json!({}))
            .await
            .unwrap();
        let description = c.describe(&t, &[3, 1, 2]).await.unwrap();
        assert_eq!(
            description.intent_summary,
            "task_queue (delivery=reliable, wal_sync=fsync_batch, max_retries=5, \
             backoff_ms=1000, poison_policy=dead_letter, dlq=/default/agent-jobs-dlq)"
        );
        assert_eq!(
            serde_json::to_value(&description).unwrap(),
            json!({
                "topic": "/default/agent-jobs",
                "broker_id": 1,
                "partitions": 3,
                "partition_topics": [
                    "/default/agent-jobs-part-0",
                    "/default/agent-jobs-part-1",
                    "/default/agent-jobs-part-2"
                ],
                "delivery": "Reliable",
                "wal_sync_mode": "fsync_batch",
                "intent": intent_json("task_queue"),
                "intent_summary": description.intent_summary,
                "subscriptions": [
                    {"name": "metrics", "failure_policy": null},
                    {
                        "name": "worker-pool",
                        "failure_policy": policy_json(
                            5, 1000, "dead_letter", Some("/default/agent-jobs-dlq")
                        )
                    }
                ]
            })
        );
        let round_trip: TopicDescription =
            serde_json::from_value(serde_json::to_value(&description).unwrap()).unwrap();
        assert_eq!(round_trip, description);
        assert_eq!(c.describe(&t, &[2]).await.unwrap().broker_id, None);

        let implicit = topic("/default/auto");
        c.create_implicit(&implicit, false).await.unwrap();
        let d = c.describe(&implicit, &[]).await.unwrap();
        assert_eq!(
            d.intent_summary,
            "none (implicit topic: wal_sync=os_cache_flush, broker fallback failure policy)"
        );
        assert_eq!(d.delivery, Delivery::NonReliable);
        assert_eq!(d.intent, None);
        assert!(matches!(
            c.describe(&topic("/default/none"), &[]).await,
            Err(CatalogError::TopicNotFound { topic }) if topic.as_str() == "/default/none"
        ));
    }

    #[tokio::test]
    async fn namespaces_and_listing() {
        let f = fixture();
        let c = f.catalog();
        assert_eq!(
            c.create_namespace(&ns("default")).await.unwrap(),
            Action::Create
        );
        f.store
            .put(
                "/namespaces/default/policy",
                json!({"max_producers_per_topic": 4, "max_consumers_per_topic": 0, "max_message_size": 0}),
            )
            .await
            .unwrap();
        assert_eq!(
            c.create_namespace(&ns("default")).await.unwrap(),
            Action::Unchanged
        );
        assert_eq!(
            f.dump().await["/namespaces/default/policy"]["max_producers_per_topic"],
            json!(4),
            "an existing policy is kept"
        );
        c.create_topic(&spec("/default/b", "tasks", 2))
            .await
            .unwrap();
        c.create_topic(&spec("/default/a", "events", 0))
            .await
            .unwrap();
        c.create_topic(&spec("/agents/c", "audit", 0))
            .await
            .unwrap();
        // Named like a partition, but its "parent" has none: listed.
        c.create_implicit(&topic("/agents/c-part-0"), false)
            .await
            .unwrap();
        assert_eq!(
            c.list_namespaces().await.unwrap(),
            vec![ns("agents"), ns("default")]
        );
        let entry = |name: &str, partitions| TopicListEntry {
            name: topic(name),
            partitions,
        };
        assert_eq!(
            c.list_topics(None).await.unwrap(),
            vec![
                entry("/agents/c", 0),
                entry("/agents/c-part-0", 0),
                entry("/default/a", 0),
                entry("/default/b", 2),
            ]
        );
        assert_eq!(
            c.list_topics(Some(&ns("default"))).await.unwrap(),
            vec![entry("/default/a", 0), entry("/default/b", 2)]
        );
        let err = c.list_topics(Some(&ns("nope"))).await.unwrap_err();
        assert_eq!(err.to_string(), "namespace nope does not exist");
    }

    #[tokio::test]
    async fn delete_removes_the_topic_its_partitions_and_everything_under_them() {
        let f = fixture();
        let c = f.catalog();
        c.create_topic(&spec("/default/keep", "tasks", 0))
            .await
            .unwrap();
        let before = f.dump().await;
        let t = topic("/default/jobs");
        c.create_topic(&spec(t.as_str(), "task_queue", 2))
            .await
            .unwrap();
        c.attach_subscription(&t, &sub("a")).await.unwrap();
        c.attach_subscription(&t.partition(0).unwrap(), &sub("a"))
            .await
            .unwrap();
        f.store
            .put(
                "/topics/default/jobs-part-1/subscriptions/a/cursor",
                json!(5),
            )
            .await
            .unwrap();
        let err = c.delete_topic(&t.partition(1).unwrap()).await.unwrap_err();
        assert_eq!(
            err.to_string(),
            "topic /default/jobs-part-1 is partition 1 of /default/jobs; delete /default/jobs instead"
        );
        let outcome = c.delete_topic(&t).await.unwrap();
        assert_eq!(
            outcome,
            DeleteOutcome {
                topic: t.clone(),
                partitions: 2,
                deleted_keys: 15,
            }
        );
        assert_eq!(f.dump().await, before);
        assert!(matches!(
            c.delete_topic(&t).await,
            Err(CatalogError::TopicNotFound { .. })
        ));
    }

    // ---- manifests and apply ------------------------------------------------

    fn seed_manifest() -> Value {
        json!({
            "namespaces": ["agents"],
            "topics": [
                {"name": "/agents/events", "intent": "agent_event_mesh", "partitions": 3},
                {"name": "/agents/tasks", "intent": "task_queue", "partitions": 6},
                {"name": "/agents/tool-audit", "intent": "tool_invocation_log"}
            ]
        })
    }

    fn manifest(value: &Value) -> Manifest {
        Manifest::from_value("cluster-topology.yaml", value).unwrap()
    }

    #[tokio::test]
    async fn apply_the_seed_manifest_then_again_unchanged() {
        let f = fixture();
        let c = f.catalog();
        let m = manifest(&seed_manifest());
        let dry = c.apply(&m, true).await.unwrap();
        assert_eq!(
            serde_json::to_value(&dry).unwrap(),
            json!({
                "dry_run": true,
                "committed": false,
                "plan": {"items": [
                    {"kind": "namespace", "name": "agents", "action": "create",
                     "intent": null, "partitions": null, "changes": []},
                    {"kind": "topic", "name": "/agents/events", "action": "create",
                     "intent": "event_stream", "partitions": 3, "changes": []},
                    {"kind": "topic", "name": "/agents/tasks", "action": "create",
                     "intent": "task_queue", "partitions": 6, "changes": []},
                    {"kind": "topic", "name": "/agents/tool-audit", "action": "create",
                     "intent": "audit_log", "partitions": 0, "changes": []}
                ]}
            })
        );
        assert!(f.dump().await.is_empty(), "a dry run writes nothing");

        let applied = c.apply(&m, false).await.unwrap();
        assert!(applied.committed);
        assert_eq!(applied.plan, dry.plan);
        let mut expected = BTreeMap::new();
        expected.insert("/namespaces/agents/policy".to_owned(), default_ns_policy());
        expected.extend(topic_keys("agents", "events", "event_stream", 3));
        expected.extend(topic_keys("agents", "tasks", "task_queue", 6));
        expected.extend(topic_keys("agents", "tool-audit", "audit_log", 0));
        assert_eq!(f.dump().await, expected);

        let again = c.apply(&m, false).await.unwrap();
        assert!(!again.committed);
        assert!(
            again
                .plan
                .items
                .iter()
                .all(|item| item.action == Action::Unchanged),
            "{again:?}"
        );
        assert_eq!(again.plan.count(Action::Unchanged), 4);
        assert_eq!(f.dump().await, expected);
    }

    #[tokio::test]
    async fn apply_updates_intents_and_grows_partitions() {
        let f = fixture();
        let c = f.catalog();
        c.apply(&manifest(&seed_manifest()), false).await.unwrap();
        c.create_implicit(&topic("/agents/auto"), false)
            .await
            .unwrap();
        let changed = json!({
            "topics": [
                {"name": "/agents/events", "intent": "task_queue", "partitions": 3},
                {"name": "/agents/tasks", "intent": "tasks", "partitions": 8},
                {"name": "/agents/tool-audit", "intent": "audit_log", "partitions": 0},
                {"name": "/agents/auto", "intent": "realtime"}
            ]
        });
        let report = c.apply(&manifest(&changed), false).await.unwrap();
        assert!(report.committed);
        assert_eq!(
            serde_json::to_value(&report.plan).unwrap(),
            json!({"items": [
                {"kind": "namespace", "name": "agents", "action": "unchanged",
                 "intent": null, "partitions": null, "changes": []},
                {"kind": "topic", "name": "/agents/events", "action": "update",
                 "intent": "task_queue", "partitions": 3, "changes": [
                    {"field": "intent", "existing": "event_stream", "requested": "task_queue"}
                 ]},
                {"kind": "topic", "name": "/agents/tasks", "action": "update",
                 "intent": "task_queue", "partitions": 8, "changes": [
                    {"field": "partitions", "existing": "6", "requested": "8"}
                 ]},
                {"kind": "topic", "name": "/agents/tool-audit", "action": "unchanged",
                 "intent": "audit_log", "partitions": 0, "changes": []},
                {"kind": "topic", "name": "/agents/auto", "action": "update",
                 "intent": "realtime", "partitions": 0, "changes": [
                    {"field": "intent", "existing": "none (implicit topic)", "requested": "realtime"}
                 ]}
            ]})
        );
        let mut expected = BTreeMap::new();
        expected.insert("/namespaces/agents/policy".to_owned(), default_ns_policy());
        expected.extend(topic_keys("agents", "events", "task_queue", 3));
        expected.extend(topic_keys("agents", "tasks", "task_queue", 8));
        expected.extend(topic_keys("agents", "tool-audit", "audit_log", 0));
        expected.extend(topic_keys("agents", "auto", "realtime", 0));
        assert_eq!(f.dump().await, expected);
        let again = c.apply(&manifest(&changed), false).await.unwrap();
        assert_eq!(again.plan.count(Action::Unchanged), 5);
    }

    #[tokio::test]
    async fn refused_updates_apply_nothing() {
        let f = fixture();
        let c = f.catalog();
        c.apply(&manifest(&seed_manifest()), false).await.unwrap();
        let before = f.dump().await;
        let doc = json!({
            "namespaces": ["fresh"],
            "topics": [
                {"name": "/fresh/new", "intent": "task_queue"},
                {"name": "/agents/tasks", "intent": "task_queue", "partitions": 4},
                {"name": "/agents/tool-audit", "intent": "audit_log", "partitions": 2},
                {"name": "/agents/events", "intent": "event_stream", "partitions": 0}
            ]
        });
        let err = c.apply(&manifest(&doc), false).await.unwrap_err();
        let CatalogError::ManifestConflict(errors) = &err else {
            panic!("{err:?}");
        };
        let lines: Vec<String> = errors.issues.iter().map(ToString::to_string).collect();
        assert_eq!(
            lines,
            [
                "cluster-topology.yaml: topics[1] (/agents/tasks): partitions: existing topic \
                 has 6 partitions, requested 4; only a partitioned topic's partition count can grow",
                "cluster-topology.yaml: topics[2] (/agents/tool-audit): partitions: existing \
                 topic has 0 partitions, requested 2; only a partitioned topic's partition count \
                 can grow",
                "cluster-topology.yaml: topics[3] (/agents/events): partitions: existing topic \
                 has 3 partitions, requested 0; only a partitioned topic's partition count can grow",
            ]
        );
        assert_eq!(f.dump().await, before, "not even /fresh/new was created");
        assert!(matches!(
            c.apply(&manifest(&doc), true).await,
            Err(CatalogError::ManifestConflict(_))
        ));
    }

    #[tokio::test]
    async fn apply_refuses_partition_names_taken_by_other_topics() {
        let f = fixture();
        let c = f.catalog();
        c.apply(&manifest(&seed_manifest()), false).await.unwrap();
        c.create_implicit(&topic("/agents/tasks-part-7"), false)
            .await
            .unwrap();
        c.create_implicit(&topic("/agents/new-part-0"), false)
            .await
            .unwrap();
        let before = f.dump().await;
        let doc = json!({"topics": [
            {"name": "/agents/tasks", "intent": "task_queue", "partitions": 8},
            {"name": "/agents/new", "intent": "task_queue", "partitions": 2}
        ]});
        let err = c.apply(&manifest(&doc), false).await.unwrap_err();
        let CatalogError::ManifestConflict(errors) = &err else {
            panic!("{err:?}");
        };
        let lines: Vec<String> = errors.issues.iter().map(ToString::to_string).collect();
        assert_eq!(
            lines,
            [
                "cluster-topology.yaml: topics[0] (/agents/tasks): partitions: partition names \
                 already used by existing topics: /agents/tasks-part-7",
                "cluster-topology.yaml: topics[1] (/agents/new): partitions: partition names \
                 already used by existing topics: /agents/new-part-0",
            ]
        );
        assert_eq!(f.dump().await, before);
    }

    #[test]
    fn manifest_validation_reports_every_entry_and_field() {
        let doc = json!({
            "namespaces": ["agents", "agents", "bad ns", 7],
            "topics": [
                {"name": "/agents/ok", "intent": "task_queue"},
                {"name": "/agents/x", "intent": "nope"},
                {"name": "agents/y", "intent": "tasks"},
                {"name": "/agents/z", "intent": "tasks", "partitions": -1},
                {"name": "/agents/ok", "intent": "tasks"},
                {"name": "/agents/w", "intent": "tasks", "partitons": 2},
                {"name": "/agents/big", "intent": "tasks", "partitions": 100000},
                {"name": "/agents/f", "intent": "tasks", "partitions": 1.5},
                {"intent": 3},
                "nope"
            ],
            "extra": 1
        });
        let errors = Manifest::from_value("topology.yaml", &doc).unwrap_err();
        let lines: Vec<String> = errors.issues.iter().map(ToString::to_string).collect();
        let unknown = tributary_proto::intent::valid_intent_names();
        assert_eq!(
            lines,
            [
                "topology.yaml: extra: unknown top-level key; expected namespaces or topics"
                    .to_owned(),
                "topology.yaml: namespaces[1] (agents): name: duplicate of namespaces[0]".into(),
                "topology.yaml: namespaces[2] (bad ns): name: invalid namespace \"bad ns\": \
                 namespace contains ' ' at byte 3; allowed: ASCII letters, digits, '-', '_', '.'"
                    .into(),
                "topology.yaml: namespaces[3]: name: must be a string, got 7".into(),
                format!(
                    "topology.yaml: topics[1] (/agents/x): intent: unknown stream intent \
                     \"nope\"; valid intents: {unknown}"
                ),
                "topology.yaml: topics[2] (agents/y): name: invalid topic name \"agents/y\": \
                 topic name must start with '/'"
                    .into(),
                "topology.yaml: topics[3] (/agents/z): partitions: must be a whole number \
                 from 0 to 256, got -1"
                    .into(),
                "topology.yaml: topics[4] (/agents/ok): name: duplicate of topics[0]".into(),
                "topology.yaml: topics[5] (/agents/w): partitons: unknown field; expected \
                 name, intent, partitions"
                    .into(),
                "topology.yaml: topics[6] (/agents/big): partitions: must be a whole number \
                 from 0 to 256, got 100000"
                    .into(),
                "topology.yaml: topics[7] (/agents/f): partitions: must be a whole number \
                 from 0 to 256, got 1.5"
                    .into(),
                "topology.yaml: topics[8]: name: is required".into(),
                "topology.yaml: topics[8]: intent: must be a string, got 3".into(),
                "topology.yaml: topics[9]: must be a mapping with name, intent and \
                 partitions, got \"nope\""
                    .into(),
            ]
        );
        assert_eq!(
            serde_json::to_value(&errors.issues[4]).unwrap(),
            json!({
                "file": "topology.yaml", "section": "topics", "index": 1,
                "name": "/agents/x", "field": "intent",
                "message": format!("unknown stream intent \"nope\"; valid intents: {unknown}")
            })
        );
        assert!(
            errors
                .to_string()
                .starts_with("manifest topology.yaml: extra: unknown top-level key"),
            "{errors}"
        );
        assert!(
            errors.to_string().ends_with("; nothing applied"),
            "{errors}"
        );

        let collision = json!({"topics": [
            {"name": "/a/x", "intent": "tasks", "partitions": 2},
            {"name": "/a/x-part-1", "intent": "tasks"}
        ]});
        let errors = Manifest::from_value("m.yaml", &collision).unwrap_err();
        assert_eq!(
            errors
                .issues
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>(),
            ["m.yaml: topics[1] (/a/x-part-1): name: is partition 1 of topics[0] (/a/x)"]
        );
        for bad in [
            json!([]),
            json!("text"),
            json!({"topics": {"name": "/a/b"}}),
        ] {
            assert!(Manifest::from_value("m.yaml", &bad).is_err(), "{bad}");
        }
        let empty = Manifest::from_value("m.yaml", &Value::Null).unwrap();
        assert!(empty.topics().is_empty() && empty.namespaces().is_empty());
    }

    #[tokio::test]
    async fn a_manifest_larger_than_one_transaction_is_refused() {
        let f = fixture();
        let topics: Vec<Value> = (0..3)
            .map(|i| json!({"name": format!("/big/t{i}"), "intent": "tasks", "partitions": 256}))
            .collect();
        let m = manifest(&json!({ "topics": topics }));
        let err = f.catalog().apply(&m, false).await.unwrap_err();
        assert_eq!(
            err.to_string(),
            "manifest cluster-topology.yaml: applying needs 6170 preconditions and writes in \
             one atomic transaction, at most 4096; split the manifest; nothing applied"
        );
        assert!(f.dump().await.is_empty());
    }

    /// A store that makes one write of its own just before the first
    /// transaction it is asked to apply: a concurrent admin.
    struct Interfering {
        inner: RedbStore,
        key: String,
        armed: AtomicBool,
    }

    impl MetadataStore for Interfering {
        fn get<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Value>, MetadataError>> {
            self.inner.get(key)
        }

        fn txn(&self, txn: Txn) -> BoxFuture<'_, Result<TxnOutcome, MetadataError>> {
            Box::pin(async move {
                if self.armed.swap(false, Ordering::SeqCst) {
                    self.inner.put(&self.key, json!(9)).await?;
                }
                self.inner.txn(txn).await
            })
        }

        fn delete<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<bool, MetadataError>> {
            self.inner.delete(key)
        }

        fn list<'a>(
            &'a self,
            prefix: &'a str,
        ) -> BoxFuture<'a, Result<Vec<(String, Value)>, MetadataError>> {
            self.inner.list(prefix)
        }

        fn watch<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Watch, MetadataError>> {
            self.inner.watch(prefix)
        }

        fn purge_expired(&self) -> BoxFuture<'_, Result<usize, MetadataError>> {
            self.inner.purge_expired()
        }
    }

    #[tokio::test]
    async fn a_concurrent_change_during_apply_applies_nothing() {
        let f = fixture();
        c_apply_seed(&f).await;
        let store = Interfering {
            inner: f.store,
            key: "/topics/agents/tasks".into(),
            armed: AtomicBool::new(true),
        };
        let doc = json!({"topics": [
            {"name": "/agents/new", "intent": "tasks"},
            {"name": "/agents/tasks", "intent": "task_queue", "partitions": 6}
        ]});
        let err = Catalog::new(&store)
            .apply(&manifest(&doc), false)
            .await
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "metadata at /topics/agents/tasks changed concurrently; nothing was written, retry"
        );
        assert_eq!(
            store.inner.get("/topics/agents/new").await.unwrap(),
            None,
            "nothing applied"
        );
    }

    async fn c_apply_seed(f: &Fixture) {
        f.catalog()
            .apply(&manifest(&seed_manifest()), false)
            .await
            .unwrap();
    }
}
