//! The tier service's errors, one enum for the layer, with a retry verdict.

use std::path::PathBuf;

use broker_core::wal::WalError;
use tributary_proto::archive::ArchiveError;
use tributary_proto::keys::NameError;

/// Why a tiering, reconciliation or archive-reading step failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TierError {
    /// A local file-system operation failed.
    #[error("{op} {}: {source}", path.display())]
    Io {
        /// What was attempted.
        op: &'static str,
        /// On which path.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// Listing or reading a WAL directory failed.
    #[error(transparent)]
    Wal(#[from] WalError),
    /// An object-store request failed (after the store's own retries).
    #[error("object store {op} {key}: {source}")]
    Store {
        /// What was attempted.
        op: &'static str,
        /// The object key or prefix.
        key: String,
        /// The store's error.
        source: object_store::Error,
    },
    /// A segment or object is not a valid archive (local segment damaged,
    /// or stored object damaged).
    #[error("{what} {key}: {source}")]
    Archive {
        /// `segment` (local file) or `object`.
        what: &'static str,
        /// Path or object key.
        key: String,
        /// The check that failed.
        source: ArchiveError,
    },
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
    Bucket(#[from] tributary_archive::BucketError),
    /// Invalid configuration.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// A name that is not a valid namespace, topic or prefix.
    #[error(transparent)]
    Name(#[from] NameError),
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
            TierError::Store { source, .. } => !matches!(
                source,
                object_store::Error::NotFound { .. }
                    | object_store::Error::AlreadyExists { .. }
                    | object_store::Error::Precondition { .. }
                    | object_store::Error::NotSupported { .. }
                    | object_store::Error::NotImplemented { .. }
                    | object_store::Error::InvalidPath { .. }
                    | object_store::Error::UnknownConfigurationKey { .. }
            ),
            TierError::Broker { status, .. } => status.is_none_or(|s| s >= 500 && s != 501),
            TierError::Bucket(error) => error.is_retryable(),
            TierError::Verify { .. } => true,
            TierError::Io { .. } => true,
            _ => false,
        }
    }

    pub(crate) fn store(
        op: &'static str,
        key: impl Into<String>,
    ) -> impl FnOnce(object_store::Error) -> TierError {
        let key = key.into();
        move |source| TierError::Store { op, key, source }
    }

    pub(crate) fn io(
        op: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> TierError {
        let path = path.into();
        move |source| TierError::Io { op, path, source }
    }
}
