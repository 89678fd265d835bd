//! JSON shapes of the broker's admin HTTP API (`docs/admin-api.md`) that
//! more than one crate reads: the broker writes them (the catalog in
//! `broker_core::catalog`, the manifest `apply` in the broker), `tribctl`
//! and the tests parse them.
//!
//! - topics: [`CreateOutcome`], [`TopicDescription`] with its
//!   [`SubscriptionSummary`] list, [`TopicListEntry`], [`DeleteOutcome`],
//!   and [`Difference`] (the fields of a conflict);
//! - failure policies: [`FailurePolicyView`] and its [`PolicySource`];
//! - `apply`: [`ApplyReport`] with its [`Plan`] of [`PlanItem`]s, each a
//!   [`PlanAction`] on an [`ItemKind`], and [`ManifestIssue`].

use std::fmt;

use serde::{Deserialize, Serialize};
use tributary_proto::SyncMode;
use tributary_proto::intent::{
    Delivery, ExpandedStreamSettings, StreamIntent, SubscriptionFailurePolicy,
};
use tributary_proto::keys::{SubscriptionName, TopicName};

/// Where a subscription's failure policy comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PolicySource {
    /// Stored at `/topics/{ns}/{topic}/subscriptions/{sub}/failure_policy`
    /// (inherited on an earlier attach, or set by an operator).
    Stored,
    /// Derived from the topic's `/intent`.
    Intent,
    /// The broker fallback of implicit topics.
    BrokerFallback,
}

/// One problem of a manifest: where (file, entry, field) and what.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestIssue {
    /// The manifest's file name as given by the caller.
    pub file: String,
    /// `namespaces` or `topics`; `None` for the document as a whole.
    pub section: Option<String>,
    /// Position of the entry in its section, from 0.
    pub index: Option<usize>,
    /// The entry's name as written, when it has one.
    pub name: Option<String>,
    /// The offending field of the entry (or top-level key).
    pub field: Option<String>,
    /// What is wrong.
    pub message: String,
}

impl ManifestIssue {
    /// An issue with the document as a whole (syntax, size).
    pub fn document(file: &str, message: impl Into<String>) -> ManifestIssue {
        ManifestIssue {
            file: file.to_owned(),
            section: None,
            index: None,
            name: None,
            field: None,
            message: message.into(),
        }
    }

    /// An issue with entry `index` of `section`.
    pub fn entry(
        file: &str,
        section: &str,
        index: usize,
        name: Option<&str>,
        field: Option<&str>,
        message: impl Into<String>,
    ) -> ManifestIssue {
        ManifestIssue {
            file: file.to_owned(),
            section: Some(section.to_owned()),
            index: Some(index),
            name: name.map(str::to_owned),
            field: field.map(str::to_owned),
            message: message.into(),
        }
    }
}

impl fmt::Display for ManifestIssue {
    /// `{file}: {section}[{index}] ({name}): {field}: {message}`, leaving out
    /// the parts that are unknown.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let entry = match (&self.section, self.index, &self.name) {
            (Some(section), Some(index), Some(name)) => {
                Some(format!("{section}[{index}] ({name})"))
            }
            (Some(section), Some(index), None) => Some(format!("{section}[{index}]")),
            (Some(section), None, _) => Some(section.clone()),
            (None, ..) => None,
        };
        let parts: Vec<&str> = std::iter::once(self.file.as_str())
            .chain(entry.as_deref())
            .chain(self.field.as_deref())
            .chain(std::iter::once(self.message.as_str()))
            .collect();
        f.write_str(&parts.join(": "))
    }
}

/// What an operation did, or what one plan item would do (JSON `create`,
/// `update`, `unchanged`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PlanAction {
    /// Does not exist yet: created.
    Create,
    /// Exists with other settings: rewritten (`apply` only).
    Update,
    /// Exists exactly as requested: nothing written.
    Unchanged,
}

impl PlanAction {
    /// `create`, `update` or `unchanged`.
    pub fn as_str(self) -> &'static str {
        match self {
            PlanAction::Create => "create",
            PlanAction::Update => "update",
            PlanAction::Unchanged => "unchanged",
        }
    }
}

impl fmt::Display for PlanAction {
    /// The name; honours width and alignment (`{:<9}`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

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
    /// A difference of `field`, both values rendered with `Display`.
    pub fn new(
        field: &str,
        existing: impl fmt::Display,
        requested: impl fmt::Display,
    ) -> Difference {
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

/// The result of the catalog's `create_topic`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateOutcome {
    /// The topic.
    pub topic: TopicName,
    /// [`PlanAction::Create`] or [`PlanAction::Unchanged`].
    pub action: PlanAction,
    /// Canonical intent.
    pub intent: StreamIntent,
    /// Partition count.
    pub partitions: u32,
    /// Whether the namespace was created by this call.
    pub namespace_created: bool,
}

/// One subscription in a [`TopicDescription`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubscriptionSummary {
    /// Subscription name.
    pub name: SubscriptionName,
    /// Its persisted failure policy, if one is stored.
    pub failure_policy: Option<SubscriptionFailurePolicy>,
}

/// The result of the catalog's `describe`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicDescription {
    /// The topic.
    pub topic: TopicName,
    /// The broker a topic is assigned to
    /// (`/cluster/brokers/{id}/{ns}/{topic}`), `None` when unassigned.
    pub broker_id: Option<u64>,
    /// The ownership epoch of that assignment (absent from brokers that
    /// predate ownership).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<u64>,
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

/// One topic of the catalog's `list_topics`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicListEntry {
    /// The topic.
    pub name: TopicName,
    /// Partition count, 0 = non-partitioned.
    pub partitions: u32,
}

/// The result of the catalog's `delete_topic`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeleteOutcome {
    /// The topic.
    pub topic: TopicName,
    /// Its partition count.
    pub partitions: u32,
    /// Keys removed (topic and partitions, all keys under them, registry
    /// entries).
    pub deleted_keys: usize,
    /// Whether an edge replicated into the topic: its owner closes the
    /// edge's stream and the edge's next contact creates the topic again,
    /// with the edge's intent and the same offsets. Absent (false) from
    /// brokers before this field.
    #[serde(default)]
    pub edge_fed: bool,
    /// What follows from the delete, for a person (set with `edge_fed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
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
    pub action: PlanAction,
    /// The topic's canonical intent (topics only).
    pub intent: Option<StreamIntent>,
    /// The topic's partition count (topics only).
    pub partitions: Option<u32>,
    /// For [`PlanAction::Update`]: each changed field, existing → requested.
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
    pub fn count(&self, action: PlanAction) -> usize {
        self.items.iter().filter(|i| i.action == action).count()
    }
}

/// The result of the broker's manifest `apply`.
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
