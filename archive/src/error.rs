//! [`BucketError`]: why an object-store request or an archive read failed.

use std::path::PathBuf;

use tributary_proto::archive::ArchiveError;

/// Why opening a bucket, or listing, reading or verifying archived
/// segments, failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BucketError {
    /// A local file-system operation failed (the local-directory store).
    #[error("{op} {}: {source}", path.display())]
    Io {
        /// What was attempted.
        op: &'static str,
        /// On which path.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
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
    /// A stored object is not a valid archive segment.
    #[error("{what} {key}: {source}")]
    Archive {
        /// `segment` (local file) or `object`.
        what: &'static str,
        /// Path or object key.
        key: String,
        /// The check that failed.
        source: ArchiveError,
    },
    /// Objects of one topic contradict each other (overlapping ranges, a
    /// key that disagrees with its footer).
    #[error("inconsistent storage for {topic}: {reason}")]
    Inconsistent {
        /// The topic.
        topic: String,
        /// What disagrees.
        reason: String,
    },
    /// No object holds the offsets `first_offset..end_offset` of `topic`,
    /// between two objects that exist (an object deleted or never
    /// written): a read that needs them stops here; reads that start past
    /// them go on.
    #[error(
        "inconsistent storage for {topic}: the archive has no object for offsets {first_offset}..{end_offset}"
    )]
    MissingObject {
        /// The topic.
        topic: String,
        /// First missing offset.
        first_offset: u64,
        /// One past the last missing offset (the next object's first).
        end_offset: u64,
    },
    /// The segment descriptor an object is checked against could not be
    /// read from the metadata ([`crate::reader::CommittedDescriptors`]).
    #[error("reading the committed descriptor {key}: {reason}")]
    Descriptor {
        /// The descriptor key.
        key: String,
        /// Why not.
        reason: String,
    },
    /// An invalid store configuration.
    #[error("invalid configuration: {0}")]
    Config(String),
}

impl BucketError {
    /// True for failures a later attempt may not repeat: network errors,
    /// 5xx answers, object-store I/O. A missing object, a refused
    /// precondition or damaged data is not retried.
    pub fn is_retryable(&self) -> bool {
        match self {
            BucketError::Store { source, .. } => !matches!(
                source,
                object_store::Error::NotFound { .. }
                    | object_store::Error::AlreadyExists { .. }
                    | object_store::Error::Precondition { .. }
                    | object_store::Error::NotSupported { .. }
                    | object_store::Error::NotImplemented { .. }
                    | object_store::Error::InvalidPath { .. }
                    | object_store::Error::UnknownConfigurationKey { .. }
            ),
            BucketError::Io { .. } => true,
            _ => false,
        }
    }

    /// True when the object (or prefix) does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(
            self,
            BucketError::Store {
                source: object_store::Error::NotFound { .. },
                ..
            }
        )
    }

    /// A mapper from an object-store error of `op` on `key`.
    pub fn store(
        op: &'static str,
        key: impl Into<String>,
    ) -> impl FnOnce(object_store::Error) -> BucketError {
        let key = key.into();
        move |source| BucketError::Store { op, key, source }
    }

    /// A mapper from an I/O error of `op` on `path`.
    pub fn io(
        op: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> BucketError {
        let path = path.into();
        move |source| BucketError::Io { op, path, source }
    }
}
