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
//! mutex (assigning the offset and fixing the CRC there); the WAL's writer
//! takes whole groups, writes them with one `write` and, for
//! `fsync_batch`, one `fdatasync`, then publishes the new high-water mark on a
//! `tokio::sync::watch` that appenders and tailing readers await. Decisions
//! (when to flush, when to roll) are pure functions in [`commit`]. The
//! writer runs on the threads of a [`WriterPool`] shared by every WAL of the
//! process, one thread at a time per WAL (see [`pool`]).
//!
//! # Files
//! This file holds the shared state (the pending group, the progress watch,
//! the segment map) and the [`Wal`] handle's lifecycle (open, roll, close);
//! `config` ([`WalConfig`]), `error` ([`WalError`]), `append` (the append
//! path, [`PendingAppend`]), `read` (the read path), `retention`, the
//! writer in `writer` and the threads that run it in `pool` are beside it.

mod append;
pub mod commit;
mod config;
mod error;
pub mod mark;
pub mod pool;
mod read;
pub mod recovery;
mod recovery_scan;
mod repair;
mod retention;
mod scan;
pub mod segment;
#[cfg(any(test, feature = "sim"))]
pub mod sim;
pub mod storage;
mod tip;
mod writer;

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Instant;

use tokio::sync::{Notify, watch};

pub use append::{AppendAck, AppendAtOutcome, PendingAppend};
pub use config::WalConfig;
pub(crate) use error::io_err;
pub use error::{UnreadableKind, UnreadableRange, WalError};
use pool::Sched;
pub use pool::WriterPool;
pub use recovery::RecoveryReport;
pub use repair::{RepairReport, ScrubReport};
pub use retention::RetentionReport;
pub use scan::ReadBuffers;
pub use segment::SealedSegment;
use segment::{SegmentMeta, WalFile, log_file_name, parse_file_name};
use storage::{FsStorage, Storage};
pub use tip::{BatchId, TIP_FILE_NAME};
pub use tributary_proto::SyncMode;
use tributary_proto::batch::BatchHeader;

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
    /// A hole declared by [`Wal::skip_to`] that the writer has not made
    /// durable yet: the offset after it.
    skip_to: Option<u64>,
    /// The highest offset [`Wal::mark_durable_through`] asked the sync
    /// mark to cover durably.
    mark_sync_through: u64,
    /// The highest offset [`Wal::sync_through`] asked to be `fdatasync`ed.
    data_sync_through: u64,
    closing: bool,
    failure: Option<Arc<str>>,
    /// Where the writer stands with its pool.
    sched: Sched,
    /// The real instant of the earliest timer registered with the pool for
    /// this WAL (the group-commit window or the segment's age).
    timer_at: Option<Instant>,
    /// Times the writer has looked at this state and gone idle (tests wait
    /// on it).
    idle_passes: u64,
}

/// What appenders and readers watch.
#[derive(Debug, Clone)]
pub(crate) struct Progress {
    /// Offset just past the last durable (and readable) record.
    high_water_mark: u64,
    /// Roll requests served (see [`AppendState::roll_requests`]).
    rolls: u64,
    /// The next offset held by the last sync mark made durable by the
    /// writer: offsets below it are never handed out again, whatever a
    /// power cut takes (see [`Wal::mark_durable_through`]).
    mark_durable_next: u64,
    /// Offsets below it are `fdatasync`ed (what [`Wal::sync_through`]
    /// waits for; in `fsync_batch` the high-water mark says it).
    data_durable_next: u64,
    failure: Option<Arc<str>>,
    closed: bool,
}

pub(crate) struct Shared {
    dir: PathBuf,
    storage: Arc<dyn Storage>,
    config: WalConfig,
    state: Mutex<AppendState>,
    /// The writer's own state; only the pool thread running the WAL locks it.
    core: Mutex<writer::WriterCore>,
    /// Signalled when the writer's work is over ([`Sched::Done`]).
    done: Condvar,
    space: Notify,
    progress: watch::Sender<Progress>,
    segments: RwLock<BTreeMap<u64, SegmentMeta>>,
    /// Unreadable ranges found by recovery and reads, and declared holes,
    /// by first offset.
    unreadable: Mutex<BTreeMap<u64, UnreadableRange>>,
    /// Segment rewrites (repairs, skips) so far: a read that planned
    /// before one and then finds damage reads again rather than report
    /// bytes at positions that moved.
    rewrites: std::sync::atomic::AtomicU64,
    /// Held for a whole [`Wal::apply_retention`]: concurrent calls (the
    /// tier service's trim, local retention) would write `wal.tip` out of
    /// order.
    retention: Mutex<()>,
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

    fn unreadable(&self) -> MutexGuard<'_, BTreeMap<u64, UnreadableRange>> {
        self.unreadable.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A topic's write-ahead log. Cheap to share behind an `Arc`; all methods
/// take `&self`.
pub struct Wal {
    shared: Arc<Shared>,
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
        let mut core = writer::WriterCore::new(
            storage.as_ref(),
            &dir,
            &config,
            active_base,
            active.bytes,
            file,
            recovered.mark_seq,
        )?;
        core.mark_written_next = next_offset;
        let (progress, _) = watch::channel(Progress {
            high_water_mark: next_offset,
            rolls: 0,
            mark_durable_next: 0,
            data_durable_next: 0,
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
                skip_to: None,
                mark_sync_through: 0,
                data_sync_through: 0,
                closing: false,
                failure: None,
                sched: Sched::Idle,
                timer_at: None,
                idle_passes: 0,
            }),
            core: Mutex::new(core),
            done: Condvar::new(),
            space: Notify::new(),
            progress,
            segments: RwLock::new(segments),
            unreadable: Mutex::new(
                recovered
                    .report
                    .unreadable
                    .iter()
                    .map(|r| (r.first_offset, r.clone()))
                    .collect(),
            ),
            rewrites: std::sync::atomic::AtomicU64::new(0),
            retention: Mutex::new(()),
        });
        // A first pass: the writer sets the age timer of a non-empty
        // active segment.
        shared.wake(&mut shared.state());
        Ok(Wal {
            shared,
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

    /// Sealed segments, oldest first (what the tier service may upload).
    pub fn sealed_segments(&self) -> Vec<SealedSegment> {
        self.shared
            .segments()
            .values()
            .filter(|m| m.sealed)
            .map(|m| SealedSegment::from_meta(&self.shared.dir, m))
            .collect()
    }

    /// The latched I/O failure that stopped this WAL, if any: every later
    /// write returns [`WalError::PreviousIo`] with it. The owner may drop
    /// this handle and [`Wal::open`] the directory again (recovery decides
    /// what is on disk); the stopped writer writes nothing more.
    pub fn failure(&self) -> Option<Arc<str>> {
        self.shared.state().failure.clone()
    }

    /// Whether this handle's writer has stopped: ended ([`Wal::close_writer`],
    /// a close) or latched by an I/O failure ([`Wal::failure`]). It takes no
    /// more appends, and whoever owns the directory may open it again under
    /// a new handle, so a long-lived reader (a consumer subscription)
    /// should fetch the current handle.
    pub fn writer_stopped(&self) -> bool {
        let progress = self.shared.progress.borrow();
        progress.closed || progress.failure.is_some()
    }

    /// Unreadable offset ranges known to this WAL, oldest first: damaged
    /// bytes found by recovery or by reads, and declared holes, except those
    /// retention has deleted since. A metric, `/health` and the topics API
    /// show them.
    pub fn damaged_ranges(&self) -> Vec<UnreadableRange> {
        let log_start = self.log_start_offset();
        let mut map = self.shared.unreadable();
        map.retain(|_, r| r.end_offset > log_start);
        map.values().cloned().collect()
    }

    /// Records `range` (found by a read) unless a range starting at the
    /// same offset is known; returns the known one.
    pub(crate) fn note_unreadable(&self, range: UnreadableRange) -> UnreadableRange {
        let mut map = self.shared.unreadable();
        map.entry(range.first_offset)
            .or_insert_with(|| {
                // A declared hole is data nobody stored, on purpose (a log
                // continued at the broker's offset, an edge's declaration):
                // no damage, so no warning at every start.
                if matches!(range.kind, UnreadableKind::Hole) {
                    tracing::debug!(dir = %self.shared.dir.display(), %range, "WAL read stepped over a declared hole");
                } else {
                    tracing::warn!(dir = %self.shared.dir.display(), %range, "WAL found an unreadable range (read or scrub)");
                }
                range
            })
            .clone()
    }

    /// Declares the offsets from the next offset up to `end_offset` a hole:
    /// no record will ever be stored for them, the next append must start at
    /// `end_offset`, and readers get [`WalError::Unreadable`] for them.
    /// Returns once the hole is durable (the sync mark is `fdatasync`ed) and
    /// the high-water mark has passed it. A no-op if `end_offset` is not
    /// past the next offset. The broker calls it when an edge declares a
    /// hole (FORMAT.md, "Hole frame").
    ///
    /// # Errors
    /// [`WalError::Closed`], [`WalError::PreviousIo`].
    pub async fn skip_to(&self, end_offset: u64) -> Result<(), WalError> {
        self.skip(None, end_offset).await.map(|_| ())
    }

    /// As [`Wal::skip_to`], only if the next offset is `expected_next` (no
    /// append is pending or was made since the caller looked): returns
    /// whether the hole was declared. An edge whose log holds nothing
    /// unacknowledged uses it to continue at the broker's high-water mark.
    ///
    /// # Errors
    /// As [`Wal::skip_to`].
    pub async fn skip_to_from(
        &self,
        expected_next: u64,
        end_offset: u64,
    ) -> Result<bool, WalError> {
        self.skip(Some(expected_next), end_offset).await
    }

    async fn skip(&self, expected_next: Option<u64>, end_offset: u64) -> Result<bool, WalError> {
        {
            let mut state = self.shared.state();
            if let Some(failure) = &state.failure {
                return Err(WalError::PreviousIo(failure.clone()));
            }
            if state.closing {
                return Err(WalError::Closed);
            }
            if expected_next.is_some_and(|n| n != state.next_offset) {
                return Ok(false);
            }
            if end_offset <= state.next_offset {
                return Ok(true);
            }
            let first = state.next_offset;
            state.next_offset = end_offset;
            state.skip_to = Some(end_offset);
            self.shared.unreadable().insert(
                first,
                UnreadableRange {
                    first_offset: first,
                    end_offset,
                    kind: UnreadableKind::Hole,
                },
            );
            self.shared.wake(&mut state);
        }
        self.wait_for_offset(end_offset - 1).await.map(|_| true)
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
            self.shared.wake(&mut state);
            state.roll_requests
        };
        append::wait_progress(self.shared.progress.subscribe(), |p| p.rolls >= target).await
    }

    /// Flushes and syncs everything pending, ends the writer's work and
    /// waits for it.
    ///
    /// # Errors
    /// [`WalError::PreviousIo`] if the final flush failed.
    pub async fn close(self) -> Result<(), WalError> {
        self.close_writer().await
    }

    /// Ends this handle's writer as [`Wal::close`] does (pending groups are
    /// written and synced, the mark written), keeping the handle readable:
    /// appends are refused with [`WalError::Closed`] from now on. The owner
    /// of a directory calls it before anyone opens the directory again
    /// while other holders (a stream being torn down, a consumer) may keep
    /// this handle: a second writer on the same files would interleave
    /// their appends.
    ///
    /// # Errors
    /// [`WalError::PreviousIo`] if the final flush failed (or had before).
    pub async fn close_writer(&self) -> Result<(), WalError> {
        self.begin_close();
        let mut rx = self.shared.progress.subscribe();
        let progress = rx
            .wait_for(|p| p.closed || p.failure.is_some())
            .await
            .map_err(|_| WalError::Closed)?
            .clone();
        match progress.failure {
            Some(failure) => Err(WalError::PreviousIo(failure)),
            None => Ok(()),
        }
    }

    fn begin_close(&self) {
        let mut state = self.shared.state();
        state.closing = true;
        self.shared.wake(&mut state);
    }
}

impl Drop for Wal {
    /// Begins the close and blocks until the writer has flushed, synced and
    /// stopped (or failed): after the drop nothing writes to the directory,
    /// so it may be opened again.
    fn drop(&mut self) {
        self.begin_close();
        self.shared.wait_done();
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
mod damage_tests;
#[cfg(test)]
mod lost_end_tests;
#[cfg(test)]
mod repair_tests;
#[cfg(test)]
mod stray_tests;
#[cfg(test)]
mod tests;
