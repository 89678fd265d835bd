//! The topic and namespace catalog: creating, loading, describing, listing
//! and deleting intent-backed topics and namespaces, and subscription
//! failure policies, all over any [`MetadataStore`]. What the edge agent and
//! the broker both need; the declarative `apply` (manifests, plans) and
//! partial policy updates are the broker's (`tributary_broker::admin`), on
//! top of [`Catalog::compare`], [`Catalog::add_namespace`] and
//! [`Catalog::update_failure_policy`]. The JSON results live in
//! [`tributary_api::admin`].
//!
//! Files: `error.rs` ([`CatalogError`]), `spec.rs` ([`TopicSpec`], a
//! validated create request), `compare.rs` (a spec against the store,
//! [`Comparison`]), and the operations in `namespaces.rs`, `topics.rs` and
//! `policy.rs`.
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
//! | `/topics/{ns}/{topic}/intent` | [`ExpandedStreamSettings`](tributary_proto::intent::ExpandedStreamSettings) JSON (explicit topics only) |
//! | `/topics/{ns}/{topic}/delivery` | `"Reliable"` or `"NonReliable"` |
//! | `/namespaces/{ns}/topics/{ns}/{topic}` | the partition count again, so listing a namespace needs one prefix scan |
//! | `/namespaces/{ns}/policy` | [`NamespacePolicy`] JSON; its presence is what makes a namespace exist |
//!
//! A topic created with `partitions = N > 0` also gets the first four keys
//! for each `{topic}-part-0 … {topic}-part-(N-1)`, with marker 0 and the same
//! intent and delivery. All keys of a create are one [`Txn`](crate::metadata::Txn) whose
//! preconditions require every written key to be absent (or, when repairing,
//! to still hold the value that was read), so two concurrent creates cannot
//! interleave: one applies, the other re-reads and reports `unchanged` or a
//! conflict.
//!
//! # Decisions where the seeds are silent
//!
//! - **Namespaces are created implicitly.** Creating a topic (explicitly,
//!   implicitly or through the broker's `apply`) whose namespace does not
//!   exist creates the namespace with the default [`NamespacePolicy`] in the
//!   same transaction; outcomes and plans say so. Creating an existing namespace
//!   is `unchanged` and never touches its policy.
//! - **`create` is create-only.** An existing topic with identical stored
//!   settings is `unchanged`; any difference (partitions, intent, a stored
//!   setting that no longer matches the intent table, an implicit topic with
//!   no intent) is [`CatalogError::TopicConflict`] naming every differing
//!   field. Only the broker's `apply` updates.
//! - **`apply`** (the broker's manifests) updates what `create` refuses; its
//!   rules are documented in the broker's `admin/apply.rs`.
//! - **Dead-letter topics are not created up front.** `<topic>-dlq` is only
//!   checked to be a valid name; it comes into existence like any topic on
//!   its first publish (implicit creation).
//! - **Implicit topics have no `/intent` key.** Their WAL sync mode is
//!   [`CLUSTER_DEFAULT_WAL_SYNC`](tributary_proto::intent::CLUSTER_DEFAULT_WAL_SYNC) and their subscriptions inherit
//!   [`SubscriptionFailurePolicy::broker_fallback`](tributary_proto::intent::SubscriptionFailurePolicy::broker_fallback), as the seed's table
//!   says. An existing topic always wins over an implicit create.
//! - **Deleting** removes the topic marker, every key under
//!   `/topics/{ns}/{topic}/` (intent, delivery, policy, producers,
//!   subscriptions with cursors and failure policies) and the namespace
//!   registry entry, for the topic and each partition, in one transaction. A
//!   single partition of a partitioned topic cannot be deleted alone. Edge
//!   checkpoints, broker assignments and archived segments are not touched.
//! - **Failure policy limits** beyond [`SubscriptionFailurePolicy::validate`](tributary_proto::intent::SubscriptionFailurePolicy::validate):
//!   at most [`MAX_REDELIVERY_COUNT`] redeliveries and at most
//!   [`MAX_POLICY_DURATION_MS`] for the ack timeout and the delays.

mod compare;
mod error;
#[cfg(any(test, feature = "catalog-fixture"))]
pub mod fixture;
mod namespaces;
mod policy;
mod spec;
mod topics;

use std::fmt;

use serde::Serialize;
use serde_json::Value;

use crate::metadata::{MAX_TXN_OPS, MetadataError, MetadataStore};

pub use self::compare::Comparison;
pub use self::error::CatalogError;
pub use self::namespaces::NamespacePolicy;
pub use self::policy::{MAX_POLICY_DURATION_MS, MAX_REDELIVERY_COUNT, validate_policy};
pub use self::spec::TopicSpec;
pub use self::topics::{ImplicitOutcome, TopicLoadSettings};

/// Most partitions of one topic. A create of this many partitions plus its
/// namespace fits in one transaction ([`MAX_TXN_OPS`]) with room to spare.
pub const MAX_PARTITIONS: u32 = 256;

/// Keys written per topic or partition: marker, intent, delivery, registry.
const KEYS_PER_TOPIC: usize = 4;
// Worst case of one create: a precondition and a put per key, plus the
// namespace policy's precondition and put.
const _: () = assert!(2 * KEYS_PER_TOPIC * (MAX_PARTITIONS as usize + 1) + 2 <= MAX_TXN_OPS);

/// Attempts of a read-then-write operation before it reports
/// [`CatalogError::ConcurrentChange`].
const WRITE_ATTEMPTS: usize = 4;

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

    /// The metadata store this catalog works on (for callers that commit a
    /// transaction they built with [`Catalog::add_namespace`] and
    /// [`Comparison`]).
    pub fn store(&self) -> &'a dyn MetadataStore {
        self.store
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

#[cfg(test)]
mod tests;
