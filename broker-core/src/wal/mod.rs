//! The per-topic segmented write-ahead log.
//!
//! # Guarantees
//! - Offsets are assigned contiguously from the topic's next offset and never
//!   restart, across any crash (see [`recovery`]).
//! - An append returns once the batch is durable per the topic's
//!   [`SyncMode`]: `async` on enqueue, `os_cache_flush` once its group's
//!   `write` reached the kernel page cache (survives a process crash or
//!   SIGKILL), `fsync_batch` once its group's `fdatasync` returned (survives
//!   power loss).
//! - Readers see records up to the high-water mark: the end of the last group
//!   that is durable per the sync mode. An offset once readable never
//!   changes meaning.
//! - Segments roll by size and age; a rolled segment is sealed: fsynced, its
//!   `.index` written atomically and the directory fsynced, then never
//!   modified again. Sealed segments are deleted only by
//!   [`Wal::apply_retention`].
//! - After a failed write or `fdatasync` the WAL stops (fail-stop): every
//!   later call returns [`WalError::PreviousIo`] until it is reopened, because
//!   retrying an `fdatasync` after a failure can report success for lost data.
//!
//! # Structure
//! Appenders copy their encoded batch into a shared in-memory group under a
//! mutex (assigning the offset and fixing the CRC there); one writer thread
//! per WAL takes whole groups, writes them with one `write` and, for
//! `fsync_batch`, one `fdatasync`, then publishes the new high-water mark on a
//! `tokio::sync::watch` that appenders and tailing readers await. Decisions
//! (when to flush, when to roll) are pure functions in [`commit`].

pub mod commit;
pub mod recovery;
mod scan;
pub mod segment;
#[cfg(any(test, feature = "sim"))]
pub mod sim;
pub mod storage;
mod writer;

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::{Notify, watch};
use tracing::info;

pub use recovery::RecoveryReport;
pub use scan::ReadBuffers;
use scan::{Step, Window, find_next_valid, read_batch};
pub use segment::SealedSegment;
use segment::{SegmentMeta, WalFile, log_file_name, parse_file_name};
use storage::{FsStorage, Storage};
use tributary_proto::batch::{BatchHeader, Codec, EncodedBatch, Record, RecordBatch};
use tributary_proto::limits::{LimitError, LimitName, Limits};

/// Smallest refill of a [`Wal::read`], bytes: small batches near the end of
/// a budget still share one `pread`.
const MIN_READ_REFILL_BYTES: usize = 64 * 1024;
/// Largest refill of a [`Wal::read`], bytes. Batches are zero-copy slices of
/// the refill buffer, which stays allocated while any of them is alive.
const MAX_READ_REFILL_BYTES: usize = 8 * 1024 * 1024;

pub use tributary_proto::SyncMode;

/// Configuration of one topic's WAL.
#[derive(Debug, Clone)]
pub struct WalConfig {
    /// Durability of an acknowledged append. Default `fsync_batch`.
    pub sync_mode: SyncMode,
    /// Group-commit window: how long the writer waits after the first
    /// pending append for others to join its group. Default 0 (flush as soon
    /// as the writer is free; appends arriving during a flush form the next
    /// group).
    pub flush_interval: Duration,
    /// Group size that is flushed without waiting, bytes. Default 1 MiB.
    pub flush_max_batch_bytes: usize,
    /// Appends wait (backpressure) while this many bytes are pending in
    /// memory. Default 16 MiB; at least `limits.max_batch_bytes`.
    pub max_pending_bytes: usize,
    /// Roll the active segment before it would pass this size, bytes.
    /// Default 64 MiB; at least `limits.max_batch_bytes`, at most `u32::MAX`.
    pub segment_max_bytes: u64,
    /// Roll the active segment this long after its first write in this
    /// process. Default none.
    pub segment_max_age: Option<Duration>,
    /// Sparse index density: one entry per this many bytes. Default 4 KiB.
    pub index_interval_bytes: u64,
    /// Retention by size: delete the oldest safe sealed segments while the
    /// WAL is larger than this, bytes. Default none.
    pub retention_max_bytes: Option<u64>,
    /// Retention by age: delete safe sealed segments whose newest record is
    /// older than this. Default none.
    pub retention_max_age: Option<Duration>,
    /// Record and batch size limits.
    pub limits: Limits,
    /// Offset of the first record of a brand-new (empty) WAL directory.
    pub initial_offset: u64,
}

impl Default for WalConfig {
    fn default() -> Self {
        WalConfig {
            sync_mode: SyncMode::FsyncBatch,
            flush_interval: Duration::ZERO,
            flush_max_batch_bytes: 1024 * 1024,
            max_pending_bytes: 16 * 1024 * 1024,
            segment_max_bytes: 64 * 1024 * 1024,
            segment_max_age: None,
            index_interval_bytes: 4096,
            retention_max_bytes: None,
            retention_max_age: None,
            limits: Limits::default(),
            initial_offset: 0,
        }
    }
}

impl WalConfig {
    /// Checks the limits against each other.
    ///
    /// # Errors
    /// [`WalError::Limit`] naming the offending setting.
    pub fn validate(&self) -> Result<(), WalError> {
        self.limits.validate()?;
        let max_batch = u64::from(self.limits.max_batch_bytes);
        if self.segment_max_bytes < max_batch || self.segment_max_bytes > u64::from(u32::MAX) {
            return Err(WalError::Limit(LimitError {
                limit: LimitName::SegmentMaxBytes,
                actual: self.segment_max_bytes,
                max: u64::from(u32::MAX).max(max_batch),
            }));
        }
        if (self.max_pending_bytes as u64) < max_batch || self.flush_max_batch_bytes == 0 {
            return Err(WalError::Config(
                "max_pending_bytes must be at least max_batch_bytes and flush_max_batch_bytes above 0"
                    .into(),
            ));
        }
        Ok(())
    }

    /// Bytes at the end of the active segment that one unacknowledged group
    /// write can span: damage confined to this tail is a torn write.
    pub(crate) fn torn_write_window_bytes(&self) -> u64 {
        2 * (self.flush_max_batch_bytes as u64).max(u64::from(self.limits.max_batch_bytes))
    }
}

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

/// Offsets assigned to an appended batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppendAck {
    /// Offset of the first record.
    pub base_offset: u64,
    /// Offset just past the last record.
    pub next_offset: u64,
}

/// Outcome of [`Wal::append_at`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AppendAtOutcome {
    /// Stored; durable per the sync mode.
    Appended(AppendAck),
    /// The whole range was already stored (and is durable); nothing written.
    Duplicate(AppendAck),
}

/// What [`Wal::apply_retention`] deleted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RetentionReport {
    /// `(base_offset, next_offset, bytes)` of each deleted segment.
    pub deleted: Vec<(u64, u64, u64)>,
    /// First offset still stored afterwards.
    pub log_start: u64,
}

/// Batches of at least this many bytes wait for the writer as the caller's
/// own bytes (shared, not copied; `append` re-addresses them in place when
/// it holds the only reference) and reach the file through `writev`; a
/// shared batch keeps its whole allocation alive until written (at the
/// broker, the receive buffer it was cut from). Smaller ones are copied
/// into the group's buffer by the appending task: that costs less than one
/// more iovec and one more cross-thread free in the writer thread.
const SHARE_BATCHES_FROM_BYTES: usize = 16 * 1024;

/// One batch waiting in memory for the writer.
#[derive(Debug, Clone)]
pub(crate) struct PendingBatch {
    header: BatchHeader,
    /// The encoded bytes (offsets assigned) if shared with the caller;
    /// `None`: they are the next `header.batch_length` bytes of
    /// [`AppendState::pending`].
    shared: Option<bytes::Bytes>,
}

/// Appends waiting for the writer, and the offset counter.
pub(crate) struct AppendState {
    /// Next offset to assign (includes pending batches).
    next_offset: u64,
    /// The copied waiting batches back to back, offsets assigned.
    pending: Vec<u8>,
    /// Bytes of all waiting batches, copied or shared.
    pending_bytes: usize,
    /// Waiting batches, in offset order.
    batches: Vec<PendingBatch>,
    oldest_pending_at: Option<Instant>,
    /// Roll requests made so far (monotonic); the writer publishes how many
    /// it has served in [`Progress::rolls`].
    roll_requests: u64,
    closing: bool,
    failure: Option<Arc<str>>,
    writer_idle: bool,
}

/// What appenders and readers watch.
#[derive(Debug, Clone)]
pub(crate) struct Progress {
    /// Offset just past the last durable (and readable) record.
    high_water_mark: u64,
    /// Roll requests served (see [`AppendState::roll_requests`]).
    rolls: u64,
    failure: Option<Arc<str>>,
    closed: bool,
}

pub(crate) struct Shared {
    dir: PathBuf,
    storage: Arc<dyn Storage>,
    config: WalConfig,
    state: Mutex<AppendState>,
    writer_wake: Condvar,
    space: Notify,
    progress: watch::Sender<Progress>,
    segments: RwLock<BTreeMap<u64, SegmentMeta>>,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, AppendState> {
        // Poisoning means a panic while holding the lock, i.e. a broken
        // invariant assert: the process is already failing.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn segments(&self) -> RwLockReadGuard<'_, BTreeMap<u64, SegmentMeta>> {
        self.segments.read().unwrap_or_else(|p| p.into_inner())
    }

    fn segments_mut(&self) -> RwLockWriteGuard<'_, BTreeMap<u64, SegmentMeta>> {
        self.segments.write().unwrap_or_else(|p| p.into_inner())
    }
}

/// A topic's write-ahead log. Cheap to share behind an `Arc`; all methods
/// take `&self`.
pub struct Wal {
    shared: Arc<Shared>,
    writer: Option<JoinHandle<()>>,
    report: RecoveryReport,
}

impl fmt::Debug for Wal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Wal")
            .field("dir", &self.shared.dir)
            .field("high_water_mark", &self.high_water_mark())
            .finish()
    }
}

impl Wal {
    /// Opens (or creates) the WAL in `dir` on the real file system,
    /// recovering from any crash (see [`recovery`]).
    ///
    /// # Errors
    /// [`WalError::Config`]/[`WalError::Limit`] for bad settings, I/O errors,
    /// [`WalError::Corrupt`] or [`WalError::MissingRange`] when recovery
    /// finds damage it must not repair silently.
    pub fn open(dir: impl Into<PathBuf>, config: WalConfig) -> Result<Wal, WalError> {
        Wal::open_with(Arc::new(FsStorage), dir, config)
    }

    /// [`Wal::open`] on any [`Storage`].
    ///
    /// # Errors
    /// As [`Wal::open`].
    pub fn open_with(
        storage: Arc<dyn Storage>,
        dir: impl Into<PathBuf>,
        config: WalConfig,
    ) -> Result<Wal, WalError> {
        config.validate()?;
        let dir = dir.into();
        let recovered = recovery::recover(storage.as_ref(), &dir, &config)?;
        let segments = recovered.segments;
        let (&active_base, active) = segments
            .iter()
            .next_back()
            .ok_or_else(|| WalError::Config("recovery produced no segment".into()))?;
        let next_offset = active.next_offset;
        let active_path = dir.join(log_file_name(active_base));
        let file = storage
            .open_append(&active_path)
            .map_err(io_err("open", &active_path))?;
        let (progress, _) = watch::channel(Progress {
            high_water_mark: next_offset,
            rolls: 0,
            failure: None,
            closed: false,
        });
        let shared = Arc::new(Shared {
            dir,
            storage,
            config,
            state: Mutex::new(AppendState {
                next_offset,
                pending: Vec::new(),
                pending_bytes: 0,
                batches: Vec::new(),
                oldest_pending_at: None,
                roll_requests: 0,
                closing: false,
                failure: None,
                writer_idle: false,
            }),
            writer_wake: Condvar::new(),
            space: Notify::new(),
            progress,
            segments: RwLock::new(segments),
        });
        let writer = writer::spawn(shared.clone(), active_base, file)?;
        Ok(Wal {
            shared,
            writer: Some(writer),
            report: recovered.report,
        })
    }

    /// What recovery found when this WAL was opened.
    pub fn recovery_report(&self) -> &RecoveryReport {
        &self.report
    }

    /// The WAL directory.
    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    /// The configuration in force.
    pub fn config(&self) -> &WalConfig {
        &self.shared.config
    }

    /// Offset just past the last readable record: every offset below it is
    /// durable per the sync mode (and is readable unless deleted by
    /// retention).
    pub fn high_water_mark(&self) -> u64 {
        self.shared.progress.borrow().high_water_mark
    }

    /// Next offset that will be assigned (includes appends not yet durable).
    pub fn next_offset(&self) -> u64 {
        self.shared.state().next_offset
    }

    /// First offset still stored (retention deletes below it).
    pub fn log_start_offset(&self) -> u64 {
        self.shared
            .segments()
            .values()
            .next()
            .map_or(0, |s| s.base_offset)
    }

    /// Total bytes of all segment files.
    pub fn size_bytes(&self) -> u64 {
        self.shared.segments().values().map(|s| s.bytes).sum()
    }

    /// Encodes `records` (offsets assigned by the WAL) and appends them.
    ///
    /// # Errors
    /// Encoding/limit errors (nothing is written), [`WalError::Closed`],
    /// [`WalError::PreviousIo`].
    pub async fn append(&self, records: Vec<Record>, codec: Codec) -> Result<AppendAck, WalError> {
        let batch = RecordBatch {
            base_offset: 0,
            codec,
            records,
        };
        let encoded = batch.encode(&self.shared.config.limits)?;
        self.append_encoded(encoded).await
    }

    /// Appends an encoded batch at the next offsets (its base offset field and
    /// CRC are rewritten) and returns once it is durable per the sync mode.
    ///
    /// # Errors
    /// [`WalError::Limit`] if the batch exceeds this WAL's limits,
    /// [`WalError::Closed`], [`WalError::PreviousIo`].
    pub async fn append_encoded(&self, batch: EncodedBatch) -> Result<AppendAck, WalError> {
        let ack = self.enqueue(batch, None).await?;
        match ack {
            AppendAtOutcome::Appended(ack) | AppendAtOutcome::Duplicate(ack) => {
                self.wait_durable(ack.next_offset).await?;
                Ok(ack)
            }
        }
    }

    /// Appends a batch that already carries its offsets (the replication
    /// path): stored only if its base offset equals the next expected offset.
    /// A batch whose whole range is already stored is reported as
    /// [`AppendAtOutcome::Duplicate`] without writing (after that range is
    /// durable).
    ///
    /// # Errors
    /// [`WalError::Gap`] if it starts past the next offset,
    /// [`WalError::Overlap`] if it straddles it, limit and state errors as
    /// [`Wal::append_encoded`].
    pub async fn append_at(&self, batch: EncodedBatch) -> Result<AppendAtOutcome, WalError> {
        self.enqueue_at(batch).await?.durable().await
    }

    /// The first half of [`Wal::append_at`]: checks and enqueues the batch
    /// (waiting only for memory under `max_pending_bytes`) and returns a
    /// handle that resolves once it is durable. Calls take effect in call
    /// order, so a caller can enqueue batch after batch and await their
    /// durability concurrently (pipelining) — the replication ingest does.
    ///
    /// # Errors
    /// As [`Wal::append_at`], for the enqueue step.
    pub async fn enqueue_at(&self, batch: EncodedBatch) -> Result<PendingAppend, WalError> {
        let base = batch.base_offset();
        let outcome = self.enqueue(batch, Some(base)).await?;
        Ok(PendingAppend {
            outcome,
            progress: self.shared.progress.subscribe(),
            sync_mode: self.shared.config.sync_mode,
        })
    }

    async fn enqueue(
        &self,
        batch: EncodedBatch,
        expected_base: Option<u64>,
    ) -> Result<AppendAtOutcome, WalError> {
        let shared = &self.shared;
        let len = batch.len();
        let limits = &shared.config.limits;
        if len > limits.max_batch_bytes as usize {
            return Err(WalError::Limit(LimitError {
                limit: LimitName::MaxBatchBytes,
                actual: len as u64,
                max: u64::from(limits.max_batch_bytes),
            }));
        }
        loop {
            let space_freed = shared.space.notified();
            {
                let mut state = shared.state();
                if let Some(failure) = &state.failure {
                    return Err(WalError::PreviousIo(failure.clone()));
                }
                if state.closing {
                    return Err(WalError::Closed);
                }
                let next = state.next_offset;
                if let Some(base) = expected_base {
                    let ack = AppendAck {
                        base_offset: base,
                        next_offset: batch.next_offset(),
                    };
                    if batch.next_offset() <= next {
                        return Ok(AppendAtOutcome::Duplicate(ack));
                    }
                    if base > next {
                        return Err(WalError::Gap {
                            expected: next,
                            got: base,
                        });
                    }
                    if base < next {
                        return Err(WalError::Overlap {
                            expected: next,
                            base,
                            next: batch.next_offset(),
                        });
                    }
                }
                let fits = state.pending_bytes + len <= shared.config.max_pending_bytes;
                if fits || state.batches.is_empty() {
                    let mut header = *batch.header();
                    header.base_offset = next;
                    let shared_bytes = if len >= SHARE_BATCHES_FROM_BYTES {
                        // Re-addressing rewrites the batch in place when the
                        // caller holds no other reference to it.
                        let batch = if next == batch.base_offset() {
                            batch
                        } else {
                            batch.with_base_offset(next)
                        };
                        Some(batch.into_bytes())
                    } else {
                        let at = state.pending.len();
                        state.pending.extend_from_slice(batch.as_bytes());
                        if next != batch.base_offset() {
                            tributary_proto::batch::set_base_offset(&mut state.pending[at..], next);
                        }
                        None
                    };
                    state.pending_bytes += len;
                    state.batches.push(PendingBatch {
                        header,
                        shared: shared_bytes,
                    });
                    state.next_offset = header.next_offset();
                    if state.oldest_pending_at.is_none() {
                        state.oldest_pending_at = Some(Instant::now());
                    }
                    if state.writer_idle {
                        shared.writer_wake.notify_one();
                    }
                    return Ok(AppendAtOutcome::Appended(AppendAck {
                        base_offset: next,
                        next_offset: header.next_offset(),
                    }));
                }
            }
            space_freed.await;
        }
    }

    async fn wait_durable(&self, next_offset: u64) -> Result<(), WalError> {
        wait_durable(
            self.shared.config.sync_mode,
            self.shared.progress.subscribe(),
            next_offset,
        )
        .await
    }

    /// Waits until a record at `offset` is readable (the high-water mark is
    /// above it) and returns the new high-water mark. Does not poll: it is
    /// woken by the writer.
    ///
    /// # Errors
    /// [`WalError::Closed`] or [`WalError::PreviousIo`] if the WAL stops
    /// first.
    pub async fn wait_for_offset(&self, offset: u64) -> Result<u64, WalError> {
        let mut rx = self.shared.progress.subscribe();
        let progress = rx
            .wait_for(|p| p.high_water_mark > offset || p.failure.is_some() || p.closed)
            .await
            .map_err(|_| WalError::Closed)?;
        if progress.high_water_mark > offset {
            return Ok(progress.high_water_mark);
        }
        match &progress.failure {
            Some(failure) => Err(WalError::PreviousIo(failure.clone())),
            None => Err(WalError::Closed),
        }
    }

    /// Reads whole batches starting with the one that holds `from_offset`,
    /// up to about `max_bytes` (at least one batch if any is readable), never
    /// past the high-water mark. Every batch is CRC-verified. The first batch
    /// may start before `from_offset`; records below it are the caller's to
    /// skip.
    ///
    /// # Errors
    /// [`WalError::OffsetBelowLogStart`] if retention deleted `from_offset`,
    /// [`WalError::Corrupt`] naming the unreadable range if a batch on the way
    /// is damaged, I/O errors.
    pub fn read(&self, from_offset: u64, max_bytes: usize) -> Result<Vec<EncodedBatch>, WalError> {
        self.read_with(from_offset, max_bytes, &mut ReadBuffers::new())
    }

    /// Like [`Wal::read`], taking read buffers from `buffers` and leaving
    /// them there for the next call: a reader that reads the log
    /// continuously (the edge's replicator) reuses memory instead of
    /// allocating it per read.
    ///
    /// # Errors
    /// As [`Wal::read`].
    pub fn read_with(
        &self,
        from_offset: u64,
        max_bytes: usize,
        buffers: &mut ReadBuffers,
    ) -> Result<Vec<EncodedBatch>, WalError> {
        let hwm = self.high_water_mark();
        let mut out = Vec::new();
        if from_offset >= hwm {
            return Ok(out);
        }
        let plan: Vec<(u64, u64, u64)> = {
            let segments = self.shared.segments();
            let log_start = segments.values().next().map_or(0, |s| s.base_offset);
            if from_offset < log_start {
                return Err(WalError::OffsetBelowLogStart {
                    requested: from_offset,
                    log_start,
                });
            }
            segments
                .range(..=from_offset)
                .next_back()
                .into_iter()
                .chain(segments.range(from_offset + 1..))
                .map(|(&base, meta)| (base, meta.scan_start(from_offset), meta.bytes))
                .collect()
        };
        let mut budget = max_bytes;
        let mut wanted = from_offset;
        for (i, (base, start, visible)) in plan.into_iter().enumerate() {
            let start = if i == 0 { start } else { 0 };
            let path = self.shared.dir.join(log_file_name(base));
            let file = match self.shared.storage.open_read(&path) {
                Ok(f) => f,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    return Err(WalError::OffsetBelowLogStart {
                        requested: from_offset,
                        log_start: self.log_start_offset(),
                    });
                }
                Err(e) => return Err(io_err("open", &path)(e)),
            };
            let mut window = Window::with_buffers(file.as_ref(), visible, std::mem::take(buffers));
            let mut pos = start;
            // `true` once the budget or the high-water mark ends the read.
            let done = loop {
                // Read ahead no further than the budget can use (at least a
                // batch header, and enough for small batches to share a pread).
                window.set_refill(budget.clamp(MIN_READ_REFILL_BYTES, MAX_READ_REFILL_BYTES));
                match read_batch(&mut window, pos, &self.shared.config.limits)
                    .map_err(io_err("read", &path))?
                {
                    Step::End => break false,
                    Step::Batch(batch) => {
                        if batch.base_offset() >= hwm {
                            break true;
                        }
                        pos += batch.len() as u64;
                        if batch.next_offset() <= wanted {
                            continue;
                        }
                        if !out.is_empty() && batch.len() > budget {
                            break true;
                        }
                        budget = budget.saturating_sub(batch.len());
                        wanted = batch.next_offset();
                        out.push(batch);
                        if budget == 0 {
                            break true;
                        }
                    }
                    Step::Bad(reason) => {
                        let resumes =
                            find_next_valid(&mut window, pos, wanted, &self.shared.config.limits)
                                .map_err(io_err("read", &path))?;
                        let end_offset = match resumes {
                            Some((_, base)) => base,
                            None => self
                                .shared
                                .segments()
                                .get(&base)
                                .map_or(wanted, |m| m.next_offset),
                        };
                        return Err(WalError::Corrupt {
                            segment_base: base,
                            first_offset: wanted,
                            end_offset,
                            position: pos,
                            reason: reason.to_string(),
                        });
                    }
                }
            };
            *buffers = window.into_buffers();
            if done {
                return Ok(out);
            }
        }
        Ok(out)
    }

    /// Sealed segments, oldest first (what the tier service may upload).
    pub fn sealed_segments(&self) -> Vec<SealedSegment> {
        self.shared
            .segments()
            .values()
            .filter(|m| m.sealed)
            .map(|m| SealedSegment::from_meta(&self.shared.dir, m))
            .collect()
    }

    /// Seals the active segment now (if it holds any record) and starts a new
    /// one; returns when done. Used before a topic moves or to tier a
    /// partial segment.
    ///
    /// # Errors
    /// [`WalError::Closed`], [`WalError::PreviousIo`].
    pub async fn roll(&self) -> Result<(), WalError> {
        let target = {
            let mut state = self.shared.state();
            if let Some(failure) = &state.failure {
                return Err(WalError::PreviousIo(failure.clone()));
            }
            if state.closing {
                return Err(WalError::Closed);
            }
            state.roll_requests += 1;
            self.shared.writer_wake.notify_one();
            state.roll_requests
        };
        let mut rx = self.shared.progress.subscribe();
        let progress = rx
            .wait_for(|p| p.rolls >= target || p.failure.is_some() || p.closed)
            .await
            .map_err(|_| WalError::Closed)?;
        if progress.rolls >= target {
            return Ok(());
        }
        match &progress.failure {
            Some(failure) => Err(WalError::PreviousIo(failure.clone())),
            None => Err(WalError::Closed),
        }
    }

    /// Deletes the oldest sealed segments that are entirely below
    /// `safe_offset` (acknowledged centrally or tiered: the caller decides)
    /// while a retention limit asks for it: total size over
    /// `retention_max_bytes`, or newest record older than
    /// `retention_max_age` at `now_ms` (ms since the Unix epoch). Never
    /// deletes the active segment. Deletion happens only here.
    ///
    /// # Errors
    /// I/O errors; segments deleted before the error stay deleted.
    pub fn apply_retention(
        &self,
        safe_offset: u64,
        now_ms: i64,
    ) -> Result<RetentionReport, WalError> {
        let config = &self.shared.config;
        let mut report = RetentionReport::default();
        let mut segments = self.shared.segments_mut();
        let mut total: u64 = segments.values().map(|s| s.bytes).sum();
        let candidates: Vec<u64> = segments
            .values()
            .filter(|s| s.sealed)
            .map(|s| s.base_offset)
            .collect();
        for base in candidates {
            let Some(meta) = segments.get(&base) else {
                break;
            };
            if meta.next_offset > safe_offset {
                break;
            }
            let over_size = config.retention_max_bytes.is_some_and(|max| total > max);
            let over_age = config.retention_max_age.is_some_and(|age| {
                let newest = meta.max_timestamp_ms.unwrap_or(i64::MIN);
                now_ms.saturating_sub(newest) > age.as_millis() as i64
            });
            if !over_size && !over_age {
                break;
            }
            let (next, bytes) = (meta.next_offset, meta.bytes);
            segments.remove(&base);
            let dir = &self.shared.dir;
            for name in [log_file_name(base), segment::index_file_name(base)] {
                let path = dir.join(name);
                self.shared
                    .storage
                    .remove(&path)
                    .map_err(io_err("remove", &path))?;
            }
            self.shared
                .storage
                .sync_dir(dir)
                .map_err(io_err("fsync dir", dir))?;
            total -= bytes;
            info!(dir = %dir.display(), base, next, bytes, over_size, over_age, "retention deleted a sealed segment");
            report.deleted.push((base, next, bytes));
        }
        report.log_start = segments.values().next().map_or(0, |s| s.base_offset);
        Ok(report)
    }

    /// Flushes and syncs everything pending, stops the writer and waits for
    /// it.
    ///
    /// # Errors
    /// [`WalError::PreviousIo`] if the final flush failed.
    pub async fn close(mut self) -> Result<(), WalError> {
        self.begin_close();
        let mut rx = self.shared.progress.subscribe();
        let progress = rx
            .wait_for(|p| p.closed || p.failure.is_some())
            .await
            .map_err(|_| WalError::Closed)?
            .clone();
        if let Some(handle) = self.writer.take() {
            let _ = handle.join();
        }
        match progress.failure {
            Some(failure) => Err(WalError::PreviousIo(failure)),
            None => Ok(()),
        }
    }

    fn begin_close(&self) {
        let mut state = self.shared.state();
        state.closing = true;
        self.shared.writer_wake.notify_one();
    }
}

impl Drop for Wal {
    fn drop(&mut self) {
        self.begin_close();
        if let Some(handle) = self.writer.take() {
            let _ = handle.join();
        }
    }
}

/// An enqueued [`Wal::enqueue_at`] batch on its way to durability.
#[derive(Debug)]
#[must_use = "the batch is not acknowledged until `durable` resolves"]
pub struct PendingAppend {
    outcome: AppendAtOutcome,
    progress: watch::Receiver<Progress>,
    sync_mode: SyncMode,
}

impl PendingAppend {
    /// What the enqueue decided (appended or duplicate, with offsets).
    pub fn outcome(&self) -> AppendAtOutcome {
        self.outcome
    }

    /// Resolves once the batch's range is durable per the sync mode.
    ///
    /// # Errors
    /// [`WalError::PreviousIo`] or [`WalError::Closed`] if the WAL stops
    /// first.
    pub async fn durable(self) -> Result<AppendAtOutcome, WalError> {
        let next = match self.outcome {
            AppendAtOutcome::Appended(a) | AppendAtOutcome::Duplicate(a) => a.next_offset,
        };
        wait_durable(self.sync_mode, self.progress, next).await?;
        Ok(self.outcome)
    }
}

async fn wait_durable(
    sync_mode: SyncMode,
    mut rx: watch::Receiver<Progress>,
    next_offset: u64,
) -> Result<(), WalError> {
    if sync_mode == SyncMode::Async {
        return Ok(());
    }
    let progress = rx
        .wait_for(|p| p.high_water_mark >= next_offset || p.failure.is_some() || p.closed)
        .await
        .map_err(|_| WalError::Closed)?;
    if progress.high_water_mark >= next_offset {
        return Ok(());
    }
    match &progress.failure {
        Some(failure) => Err(WalError::PreviousIo(failure.clone())),
        None => Err(WalError::Closed),
    }
}

/// Lists the sealed segments of the WAL in `dir` without opening it (for a
/// separate process such as the tier service). Segments whose seal index is
/// missing or invalid are not listed.
///
/// # Errors
/// I/O errors listing or reading the directory.
pub fn list_sealed_segments(dir: &Path) -> Result<Vec<SealedSegment>, WalError> {
    let storage = FsStorage;
    let mut out = Vec::new();
    for name in storage.list(dir).map_err(io_err("list", dir))? {
        let Some(WalFile::Index(base)) = parse_file_name(&name) else {
            continue;
        };
        let path = dir.join(&name);
        let bytes = match storage::read_file(&storage, &path, 64 * 1024 * 1024) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io_err("read", &path)(e)),
        };
        if let Ok(meta) = SegmentMeta::decode_index(base, &bytes) {
            out.push(SealedSegment::from_meta(dir, &meta));
        }
    }
    out.sort_by_key(|s| s.base_offset);
    Ok(out)
}

#[cfg(test)]
mod tests;
