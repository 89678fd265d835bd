//! [`CatalogError`]: why a catalog operation failed, naming the request
//! field for input errors and every differing field for conflicts.

use tributary_api::admin::Difference;
use tributary_proto::intent::{IntentError, PolicyError};
use tributary_proto::keys::{NameError, NamespaceName, TopicName};

use crate::metadata::MetadataError;

fn join_differences(differences: &[Difference]) -> String {
    differences
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
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
    /// [`MAX_PARTITIONS`](super::MAX_PARTITIONS).
    #[error("partitions: must be a whole number from 0 to {max}, got {value}")]
    InvalidPartitions {
        /// The refused value as written.
        value: String,
        /// [`MAX_PARTITIONS`](super::MAX_PARTITIONS).
        max: u32,
    },
    /// A failure policy whose fields contradict each other (the message
    /// names the field already).
    #[error("{source}")]
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

    pub(super) fn policy(source: PolicyError) -> CatalogError {
        CatalogError::InvalidPolicy {
            field: source.field(),
            source,
        }
    }

    pub(super) fn inconsistent(key: &str, reason: impl Into<String>) -> CatalogError {
        CatalogError::Inconsistent {
            key: key.to_owned(),
            reason: reason.into(),
        }
    }
}
