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
    /// A batch whose offsets the WAL already holds is not the batch stored
    /// there: another log wrote those offsets (two devices under one edge
    /// id, a device whose log was replaced). Nothing was written.
    #[error("offsets {base}..{next} already hold another batch ({reason})")]
    NotStoredBatch {
        /// The batch's base offset.
        base: u64,
        /// The batch's next offset.
        next: u64,
        /// What differs.
        reason: String,
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
    /// A segment file overlaps the one before it: it starts below that
    /// one's end (a stray or misnamed file). Nothing was changed.
    #[error(
        "segment file {} does not fit the log: it starts at offset {found_base}, but the \
         segment before it ends at {expected_base} (a stray or misnamed file: move it away \
         or give it its right name)",
        path.display()
    )]
    MissingRange {
        /// Where the next segment should start.
        expected_base: u64,
        /// Where it does start.
        found_base: u64,
        /// The file that does not fit.
        path: PathBuf,
    },
    /// A segment file's bytes contradict its name or its place in the log
    /// (its first batch has another base offset, or it is not a segment of
    /// this log at all). Recovery keeps every byte and refuses to open the
    /// WAL rather than truncate it or invent a hole. Nothing was changed.
    #[error("segment file {} does not fit the log: {reason}", path.display())]
    StraySegment {
        /// The file.
        path: PathBuf,
        /// What does not fit.
        reason: String,
    },
    /// A read reached offsets it cannot return: damaged bytes or a declared
    /// hole (see [`UnreadableRange`]). The reader continues at
    /// `range.end_offset`; the WAL also lists the range in
    /// [`super::Wal::damaged_ranges`].
    #[error("{0}")]
    Unreadable(UnreadableRange),
    /// [`super::Wal::repair_range`]: no damaged range starts at this offset
    /// (never damaged, already repaired, or skipped).
    #[error("no damaged range starts at offset {first_offset}")]
    NotDamaged {
        /// The first offset asked for.
        first_offset: u64,
    },
    /// [`super::Wal::repair_range`]: the batches offered do not replace the
    /// damaged range exactly, or the rewritten segment does not verify.
    /// Nothing was changed.
    #[error("cannot repair offsets {first_offset}..{end_offset}: {reason}")]
    RepairMismatch {
        /// First offset of the damaged range.
        first_offset: u64,
        /// Its exclusive end.
        end_offset: u64,
        /// What did not match.
        reason: String,
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

/// Offsets `first_offset..end_offset` that a WAL holds no readable record
/// for. Nothing is skipped silently: readers get this range as
/// [`WalError::Unreadable`] and decide (the edge declares it to the broker as
/// a hole, a consumer gets a gap notice).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnreadableRange {
    /// First offset of the range.
    pub first_offset: u64,
    /// First offset after it (exclusive end).
    pub end_offset: u64,
    /// Why the offsets cannot be read.
    pub kind: UnreadableKind,
}

/// Why an [`UnreadableRange`] cannot be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UnreadableKind {
    /// Bytes are stored for these offsets but fail verification (CRC, header
    /// or offset checks). The WAL keeps them as they are.
    Damaged {
        /// Base offset of the segment holding the bytes.
        segment_base: u64,
        /// Byte position of the first damaged byte in the segment file.
        position: u64,
        /// Length of the damaged byte range, bytes (up to the next valid
        /// batch or the end of the segment).
        bytes: u64,
        /// What the first failed check said.
        reason: String,
    },
    /// No bytes are stored for these offsets and none will be: they were
    /// declared a hole ([`super::Wal::skip_to`]), or recovery found them
    /// acknowledged (by the persisted sync mark) but missing from the file,
    /// and never hands them out again.
    Hole,
}

impl UnreadableRange {
    /// Number of offsets in the range.
    pub fn len(&self) -> u64 {
        self.end_offset - self.first_offset
    }

    /// Whether the range holds no offset.
    pub fn is_empty(&self) -> bool {
        self.end_offset <= self.first_offset
    }

    /// `"damaged"` or `"hole"`, for logs, metrics and APIs.
    pub fn kind_name(&self) -> &'static str {
        match self.kind {
            UnreadableKind::Damaged { .. } => "damaged",
            UnreadableKind::Hole => "hole",
        }
    }
}

impl UnreadableRange {
    /// What is wrong with the range, without its offsets: `N damaged bytes
    /// at byte P of segment S: reason`, or that it is a declared hole.
    pub fn detail(&self) -> String {
        match &self.kind {
            UnreadableKind::Damaged {
                segment_base,
                position,
                bytes,
                reason,
            } => format!(
                "{bytes} damaged bytes at byte {position} of segment {segment_base}: {reason}"
            ),
            UnreadableKind::Hole => "a declared hole (no record is stored for them)".into(),
        }
    }
}

impl std::fmt::Display for UnreadableRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (first, end) = (self.first_offset, self.end_offset);
        match &self.kind {
            UnreadableKind::Damaged { .. } => {
                write!(f, "offsets {first}..{end} unreadable: {}", self.detail())
            }
            UnreadableKind::Hole => write!(f, "offsets {first}..{end} are {}", self.detail()),
        }
    }
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

impl WalError {
    /// Whether this failure is a full file system or an exhausted disk
    /// quota (`ENOSPC`, `EDQUOT`): for [`WalError::Io`] from the OS error
    /// itself, for [`WalError::PreviousIo`] from the latched message, which
    /// ends with the OS error as `io::Error` prints it (`… (os error 28)`).
    /// The caller then reports a full disk (a state that ends when space is
    /// freed) rather than a broken one.
    pub fn is_disk_full(&self) -> bool {
        match self {
            WalError::Io { source, .. } => io_is_disk_full(source),
            WalError::PreviousIo(message) => message_is_disk_full(message),
            _ => false,
        }
    }

    /// The file or directory a [`WalError::Io`] names (for
    /// [`WalError::PreviousIo`], the path in its message is not parsed:
    /// `None`).
    pub fn io_path(&self) -> Option<&Path> {
        match self {
            WalError::Io { path, .. } => Some(path),
            _ => None,
        }
    }
}

/// `ENOSPC` or `EDQUOT`.
pub(crate) fn io_is_disk_full(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded
    )
}

/// Whether a latched failure message ends with an OS error that is
/// `ENOSPC` or `EDQUOT` (`"... (os error N)"`, the form `io::Error`
/// displays an OS error in).
fn message_is_disk_full(message: &str) -> bool {
    let Some(rest) = message.trim_end().strip_suffix(')') else {
        return false;
    };
    let Some((_, code)) = rest.rsplit_once("(os error ") else {
        return false;
    };
    code.parse::<i32>()
        .is_ok_and(|code| io_is_disk_full(&io::Error::from_raw_os_error(code)))
}

#[cfg(test)]
mod disk_full_tests {
    use super::*;

    fn io(code: i32) -> WalError {
        WalError::Io {
            op: "write",
            path: PathBuf::from("/data/topics/e1/t/00000000000000000000.log"),
            source: io::Error::from_raw_os_error(code),
        }
    }

    #[test]
    fn enospc_and_edquot_are_disk_full_other_errors_are_not() {
        // Linux: ENOSPC 28, EDQUOT 122, EIO 5, EROFS 30.
        assert!(io(28).is_disk_full());
        assert!(io(122).is_disk_full());
        assert!(!io(5).is_disk_full());
        assert!(!io(30).is_disk_full());
        assert_eq!(
            io(28).io_path(),
            Some(Path::new("/data/topics/e1/t/00000000000000000000.log"))
        );
        assert!(!WalError::Closed.is_disk_full());
        assert!(!WalError::Config("(os error 28)".into()).is_disk_full());
    }

    #[test]
    fn a_latched_failure_keeps_its_classification() {
        let latched = |e: WalError| WalError::PreviousIo(Arc::from(e.to_string()));
        assert!(latched(io(28)).is_disk_full());
        assert!(latched(io(122)).is_disk_full());
        assert!(!latched(io(5)).is_disk_full());
        assert!(!WalError::PreviousIo(Arc::from("no space (os error x)")).is_disk_full());
        assert!(!WalError::PreviousIo(Arc::from("os error 28")).is_disk_full());
    }
}
