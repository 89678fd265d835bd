//! The tier service's errors, one enum for the layer, with a retry verdict.

use std::path::PathBuf;

use broker_core::wal::WalError;
use tributary_archive::BucketError;
use tributary_proto::archive::ArchiveError;
use tributary_proto::keys::NameError;

/// Why a tiering, reconciliation or archive-reading step failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TierError {
    /// Listing or reading a WAL directory failed.
    #[error(transparent)]
    Wal(#[from] WalError),
    /// The stored object is not what was uploaded.
    #[error("verification of {key} failed: {reason}")]
    Verify {
        /// Object key.
        key: String,
        /// What differs.
        reason: String,
    },
    /// The broker's admin API refused or failed a request.
    #[error("broker {what}: {message}{}", status.map(|s| format!(" (HTTP {s}{})", kind.as_deref().map(|k| format!(", {k}")).unwrap_or_default())).unwrap_or_default())]
    Broker {
        /// Which call.
        what: &'static str,
        /// HTTP status, if a response arrived.
        status: Option<u16>,
        /// The API's error kind (`conflict`, `not_contiguous`, ...).
        kind: Option<String>,
        /// The message.
        message: String,
    },
    /// A committed descriptor contradicts the local segment or the bucket.
    #[error("inconsistent storage for {topic}: {reason}")]
    Inconsistent {
        /// The topic.
        topic: String,
        /// What disagrees.
        reason: String,
    },
    /// Opening the bucket, or an archive read through it, failed.
    #[error(transparent)]
    Bucket(#[from] BucketError),
    /// Invalid configuration.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// A name that is not a valid namespace, topic or prefix.
    #[error(transparent)]
    Name(#[from] NameError),
    /// A local sealed segment whose bytes fail their checks (CRC): it is
    /// not uploaded; the topic waits at it until the broker heals the
    /// segment (or an operator declares the damaged range a hole).
    #[error(
        "local segment {base_offset}..{next_offset} of {topic} is damaged and is not uploaded: {reason}"
    )]
    DamagedSegment {
        /// The topic.
        topic: String,
        /// First offset of the segment.
        base_offset: u64,
        /// Offset just past it.
        next_offset: u64,
        /// What failed.
        reason: String,
    },
    /// The archive already holds an object at `key` whose bytes differ
    /// from the local segment, and a committed descriptor names it: the
    /// committed bytes are never replaced, the segment is refused.
    #[error(
        "archive object {key} is committed with other bytes than the local segment ({reason}); not replaced, segment refused"
    )]
    ObjectConflict {
        /// Object key.
        key: String,
        /// What differs.
        reason: String,
    },
    /// The broker beside this tier service does not own the topic now
    /// (another broker does, or its lease lapsed): nothing is uploaded or
    /// committed for it.
    #[error("topic {topic} is not owned by this broker{}", owner.map(|o| format!(" (owner: broker {o})")).unwrap_or_default())]
    NotOwner {
        /// The topic.
        topic: String,
        /// Its owner, when it has one.
        owner: Option<u64>,
    },
    /// A listener (`metrics_listen`) could not be bound: the service does
    /// not start without it (as the broker and the edge agent do not).
    #[error("{what} listener on {addr} ({setting}): {error}")]
    Listen {
        /// `metrics`.
        what: &'static str,
        /// The setting that gave the address.
        setting: &'static str,
        /// The address.
        addr: std::net::SocketAddr,
        /// The OS error (part of the message, not repeated as a source).
        error: std::io::Error,
    },
    /// The archive prefix belongs to another cluster (its owner object
    /// names another id): the service does not start, and nothing in the
    /// bucket is touched.
    #[error(
        "the archive at {bucket} prefix {prefix} belongs to cluster {owner} (owner object {key}), \
         but this tier service's broker is in cluster {ours}: refusing to start, nothing in the bucket \
         was changed. Give this cluster its own archive: another prefix (`prefix`, --prefix) or \
         another bucket (`[store] url`, --bucket)"
    )]
    PrefixOwnedByOther {
        /// The bucket's description.
        bucket: String,
        /// The storage prefix.
        prefix: String,
        /// The owner object's key.
        key: String,
        /// The cluster the owner object names.
        owner: tributary_proto::cluster::ClusterId,
        /// This service's broker's cluster.
        ours: tributary_proto::cluster::ClusterId,
    },
    /// The archive prefix's owner object cannot be read as one: the
    /// service does not start and leaves it as it is.
    #[error(
        "the archive owner object {key} at {bucket} prefix {prefix} is damaged ({reason}): \
         refusing to start, it was left as it is. Find which cluster archives under this prefix; \
         if it is this one ({ours}), replace the object with {{\"format\":1,\"cluster_id\":\"{ours}\"}}, \
         otherwise give this cluster its own prefix (`prefix`, --prefix) or bucket (`[store] url`, --bucket)"
    )]
    OwnerObjectDamaged {
        /// The bucket's description.
        bucket: String,
        /// The storage prefix.
        prefix: String,
        /// The owner object's key.
        key: String,
        /// This service's broker's cluster.
        ours: tributary_proto::cluster::ClusterId,
        /// Why it does not parse.
        reason: crate::owner::OwnerParseError,
    },
    /// Another tier service holds the data directory's lock.
    #[error("another tier service is running on {} (lock held)", path.display())]
    Locked {
        /// The lock file.
        path: PathBuf,
    },
}

impl TierError {
    /// True for failures a later attempt may not repeat: network errors,
    /// 5xx answers, object-store I/O. Refusals (conflicts, invalid input,
    /// damaged data) are not retried.
    pub fn is_retryable(&self) -> bool {
        match self {
            TierError::Broker { status, .. } => status.is_none_or(|s| s >= 500 && s != 501),
            TierError::Bucket(error) => error.is_retryable(),
            TierError::Verify { .. } => true,
            _ => false,
        }
    }

    /// True when the broker does not own the topic now ([`TierError::NotOwner`],
    /// or a `409 not_owner` from the storage API): the topic is skipped.
    pub fn is_not_owner(&self) -> bool {
        match self {
            TierError::NotOwner { .. } => true,
            TierError::Broker { status, kind, .. } => {
                *status == Some(409) && kind.as_deref() == Some("not_owner")
            }
            _ => false,
        }
    }

    /// True for a create-if-absent write refused because the key exists.
    pub(crate) fn is_already_exists(&self) -> bool {
        matches!(
            self,
            TierError::Bucket(BucketError::Store {
                source: object_store::Error::AlreadyExists { .. },
                ..
            })
        )
    }

    pub(crate) fn store(
        op: &'static str,
        key: impl Into<String>,
    ) -> impl FnOnce(object_store::Error) -> TierError {
        let key = key.into();
        move |source| TierError::Bucket(BucketError::Store { op, key, source })
    }

    /// A damaged local segment (`what` = `segment`) or stored object
    /// (`object`) at `key`.
    pub(crate) fn archive(what: &'static str, key: String, source: ArchiveError) -> TierError {
        TierError::Bucket(BucketError::Archive { what, key, source })
    }

    pub(crate) fn io(
        op: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> TierError {
        let path = path.into();
        move |source| TierError::Bucket(BucketError::Io { op, path, source })
    }
}
