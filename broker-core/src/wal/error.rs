//! [`WalError`]: every way a WAL call fails, and the I/O error adapter that
//! names the operation and the file.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tributary_proto::limits::LimitError;

/// Errors of the WAL. Appends that fail hand nothing to disk.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WalError {
    /// A file-system operation failed.
    #[error("{op} {}: {source}", path.display())]
    Io {
        /// What was attempted.
        op: &'static str,
        /// On which file or directory.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// An earlier write or fdatasync failed; the WAL refuses all work until
    /// reopened (recovery then decides what is on disk).
    #[error("WAL stopped after an earlier I/O failure: {0}")]
    PreviousIo(Arc<str>),
    /// The WAL was closed.
    #[error("WAL is closed")]
    Closed,
    /// Invalid configuration.
    #[error("invalid WAL configuration: {0}")]
    Config(String),
    /// A size limit is exceeded.
    #[error(transparent)]
    Limit(#[from] LimitError),
    /// Records could not be encoded.
    #[error(transparent)]
    Encode(#[from] tributary_proto::batch::EncodeError),
    /// `append_at` found a batch starting after the next expected offset.
    #[error("gap: expected offset {expected}, batch starts at {got}")]
    Gap {
        /// The WAL's next offset.
        expected: u64,
        /// The batch's base offset.
        got: u64,
    },
    /// `append_at` found a batch that straddles the next expected offset.
    #[error("batch {base}..{next} overlaps the stored end {expected}")]
    Overlap {
        /// The WAL's next offset.
        expected: u64,
        /// The batch's base offset.
        base: u64,
        /// The batch's next offset.
        next: u64,
    },
    /// Stored data is damaged. The range `first_offset..end_offset` cannot be
    /// read; nothing is skipped silently.
    #[error(
        "corrupt data in segment {segment_base} at byte {position}: offsets {first_offset}..{end_offset} unreadable: {reason}"
    )]
    Corrupt {
        /// Base offset of the damaged segment.
        segment_base: u64,
        /// First unreadable offset.
        first_offset: u64,
        /// First offset readable again (exclusive end of the damage).
        end_offset: u64,
        /// Byte position of the damage in the segment file.
        position: u64,
        /// What is wrong.
        reason: String,
    },
    /// Segments are missing between two that exist.
    #[error("missing segment: expected one starting at {expected_base}, found {found_base}")]
    MissingRange {
        /// Where the next segment should start.
        expected_base: u64,
        /// Where it does start.
        found_base: u64,
    },
    /// The requested offset was deleted by retention.
    #[error("offset {requested} is below the log start {log_start}")]
    OffsetBelowLogStart {
        /// Offset asked for.
        requested: u64,
        /// First offset still stored.
        log_start: u64,
    },
}

pub(crate) fn io_err<'a>(
    op: &'static str,
    path: &'a Path,
) -> impl FnOnce(io::Error) -> WalError + 'a {
    move |source| WalError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}
