//! The writer: the only code that writes, syncs, rolls and seals segment
//! files. Its state per WAL is a [`WriterCore`]; the threads of a
//! [`super::pool::WriterPool`] run it, one thread at a time per WAL.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use tracing::{debug, error, warn};

use super::commit::{FlushDecision, GroupCommit, age_roll_due};
use super::config::WalConfig;
use super::mark::{MARK_FILE_NAME, MarkWriter, SyncMark};
use super::pool::{PoolInner, Sched};
use super::recovery::{create_segment, write_seal};
use super::segment::{SegmentMeta, log_file_name};
use super::storage::{AppendFile, Storage};
use super::{AppendState, PendingBatch, Shared, SyncMode, WalError, io_err};

/// The buffers of one `writev` for `batches`: each shared batch by
/// reference, and each run of copied batches as one slice of `copied`
/// starting at `*at` (advanced past them). Their concatenation is exactly
/// the batches' bytes, in order.
fn gather<'a>(batches: &'a [PendingBatch], copied: &'a [u8], at: &mut usize) -> Vec<&'a [u8]> {
    let mut buffers: Vec<&'a [u8]> = Vec::new();
    let mut run_start = *at;
    for batch in batches {
        match &batch.shared {
            Some(bytes) => {
                if *at > run_start {
                    buffers.push(&copied[run_start..*at]);
                }
                buffers.push(&bytes[..]);
                run_start = *at;
            }
            None => *at += batch.header.batch_length as usize,
        }
    }
    if *at > run_start {
        buffers.push(&copied[run_start..*at]);
    }
    buffers
}

/// Write-behind step, bytes: in the modes that do not `fdatasync` each
/// group, the writer asks the kernel to start writing the active segment to
/// the device every time this much more was appended
/// ([`AppendFile::start_writeback`]). Without it the `fdatasync` that seals
/// a full 64 MiB segment waits for all of it at once (about 50 ms on a
/// virtio disk), and every acknowledgement waits behind that.
const WRITE_BEHIND_BYTES: u64 = 8 * 1024 * 1024;

/// What a WAL's writer does next, decided under its state lock.
enum Next {
    /// Write the pending group (taken with [`WriterCore::take_group`]),
    /// then serve roll requests up to `roll_to` if set.
    Group { roll_to: Option<u64> },
    /// Serve roll requests up to this count.
    Roll(u64),
    /// `segment_max_age` reached.
    AgeRoll,
    /// Write and `fdatasync` the sync mark ([`super::Wal::mark_durable_through`]).
    SyncMark,
    /// `fdatasync` the active segment, then the sync mark
    /// ([`super::Wal::sync_through`]).
    SyncData,
    /// Everything is flushed and the WAL is closing.
    Close,
    /// Nothing to do until this instant (of the WAL's clock), or until an
    /// append, roll, hole or close arrives.
    Wait(Option<Instant>),
}

/// A WAL's writer state: the active segment file and what the writer knows
/// about it. Only the pool thread that runs the WAL (its [`Sched`] is
/// `Running`) touches it.
pub(crate) struct WriterCore {
    policy: GroupCommit,
    file: Box<dyn AppendFile>,
    active_base: u64,
    active_bytes: u64,
    /// Bytes of the active segment whose writeback was started (or that
    /// were already there when the writer started).
    written_back: u64,
    active_first_write_at: Option<Instant>,
    rolls_done: u64,
    spare_bytes: Vec<u8>,
    spare_batches: Vec<PendingBatch>,
    mark: MarkWriter,
    /// The next offset of the last mark this writer made durable.
    mark_durable_next: u64,
    /// Offsets below it were `fdatasync`ed by [`Next::SyncData`].
    data_durable_next: u64,
    /// The next offset of the last mark written (synced or not), or the
    /// recovered next offset before the first.
    pub(crate) mark_written_next: u64,
    /// Segments sealed while the disk was full, whose seal index could not
    /// be written: written at a later roll, else recovery reseals them.
    unindexed: Vec<SegmentMeta>,
}

impl WriterCore {
    /// The writer of a WAL just recovered in `dir`: `file` is its active
    /// segment (base `active_base`, `active_bytes` long), `mark_seq` the
    /// sequence of the sync mark recovery read.
    pub(crate) fn new(
        storage: &dyn Storage,
        dir: &Path,
        config: &WalConfig,
        active_base: u64,
        active_bytes: u64,
        file: Box<dyn AppendFile>,
        mark_seq: u64,
    ) -> Result<WriterCore, WalError> {
        let mark = MarkWriter::open(storage, dir, mark_seq)
            .map_err(io_err("open", &dir.join(MARK_FILE_NAME)))?;
        Ok(WriterCore {
            policy: GroupCommit {
                flush_interval: config.flush_interval,
                flush_max_batch_bytes: config.flush_max_batch_bytes,
            },
            file,
            active_base,
            active_bytes,
            written_back: active_bytes,
            active_first_write_at: (active_bytes > 0).then(|| config.clock.now()),
            rolls_done: 0,
            spare_bytes: Vec::new(),
            spare_batches: Vec::new(),
            mark,
            mark_durable_next: 0,
            data_durable_next: 0,
            mark_written_next: active_base,
            unindexed: Vec::new(),
        })
    }
}

impl Shared {
    /// Makes an idle WAL runnable: the caller changed `state` (an append, a
    /// roll request, a hole, a close) and holds its lock. A WAL that is
    /// queued or running will see the change itself; nobody is woken.
    pub(crate) fn wake(self: &Arc<Shared>, state: &mut AppendState) {
        if state.sched == Sched::Idle {
            state.sched = Sched::Queued;
            self.config.writers.inner().push(self.clone());
        }
    }

    /// Runs a WAL a pool thread took from the ready queue.
    pub(crate) fn run_queued(self: &Arc<Shared>, pool: &PoolInner) {
        {
            let mut state = self.state();
            // Invariant: a WAL is in the ready queue at most once, and only
            // while `Queued`.
            debug_assert_eq!(state.sched, Sched::Queued, "{}", self.dir.display());
            state.sched = Sched::Running;
        }
        self.run(pool);
    }

    /// Runs a WAL whose timer for `at` (real time) is due, unless the timer
    /// is stale or the WAL is queued, running or done already.
    pub(crate) fn run_timer(self: &Arc<Shared>, at: Instant, pool: &PoolInner) {
        {
            let mut state = self.state();
            if state.timer_at != Some(at) {
                return;
            }
            state.timer_at = None;
            if state.sched != Sched::Idle {
                return;
            }
            state.sched = Sched::Running;
        }
        self.run(pool);
    }

    /// The writer's loop for one turn on a pool thread: works until nothing
    /// is left to do now (the WAL goes `Idle`, with a timer if it waits for
    /// a deadline), or after one unit of work if another WAL waits for a
    /// thread (then this one goes to the back of the queue).
    fn run(self: &Arc<Shared>, pool: &PoolInner) {
        let mut core = self.core.lock().unwrap_or_else(|p| p.into_inner());
        let mut worked = false;
        loop {
            let yield_turn = worked && pool.others_waiting();
            let (next, taken) = {
                let mut state = self.state();
                let next = core.next(self, &state);
                match next {
                    Next::Wait(at) => {
                        state.sched = Sched::Idle;
                        state.idle_passes += 1;
                        if let Some(at) = at {
                            self.set_timer(&mut state, at, pool);
                        }
                        return;
                    }
                    _ if yield_turn => {
                        state.sched = Sched::Queued;
                        pool.push(self.clone());
                        return;
                    }
                    Next::Group { .. } => {
                        let taken = core.take_group(&mut state);
                        (next, Some(taken))
                    }
                    _ => (next, None),
                }
            };
            if taken.is_some() {
                self.space.notify_waiters();
            }
            worked = true;
            let result = match next {
                Next::Group { roll_to } => {
                    let (bytes, batches, skip_to) = taken.unwrap_or_default();
                    core.write_group(self, bytes, batches, skip_to)
                        .and_then(|()| match roll_to {
                            Some(target) => core.serve_rolls(self, target),
                            None => Ok(()),
                        })
                }
                Next::Roll(target) => core.serve_rolls(self, target),
                Next::AgeRoll => core.roll(self),
                Next::SyncMark => core.write_mark(self, true),
                Next::SyncData => core.sync_data(self),
                Next::Close => {
                    let result = core
                        .file
                        .sync_data()
                        .map_err(io_err("fdatasync", &core.active_path(self)))
                        .and_then(|()| core.write_mark(self, true));
                    match result {
                        Ok(()) => {
                            self.progress.send_modify(|p| p.closed = true);
                            self.finish();
                        }
                        Err(e) => self.fail(e),
                    }
                    return;
                }
                Next::Wait(_) => Ok(()),
            };
            if let Err(e) = result {
                self.fail(e);
                return;
            }
        }
    }

    /// Registers a timer for `at` (the WAL's clock) unless an earlier one is
    /// set already.
    fn set_timer(self: &Arc<Shared>, state: &mut AppendState, at: Instant, pool: &PoolInner) {
        // The pool sleeps in real time; the WAL's clock may be a test's.
        let real = Instant::now() + at.saturating_duration_since(self.config.clock.now());
        if state.timer_at.is_none_or(|set| real < set) {
            state.timer_at = Some(real);
            pool.add_timer(real, self);
        }
    }

    /// The writer's work is over (closed or failed): never scheduled again;
    /// wakes [`Shared::wait_done`].
    fn finish(&self) {
        self.state().sched = Sched::Done;
        self.done.notify_all();
    }

    /// Blocks until the writer's work is over (after a close was begun).
    pub(crate) fn wait_done(&self) {
        let mut state = self.state();
        while state.sched != Sched::Done {
            state = self.done.wait(state).unwrap_or_else(|p| p.into_inner());
        }
    }

    fn fail(&self, e: WalError) {
        error!(dir = %self.dir.display(), error = %e, "WAL writer stopped");
        let message: Arc<str> = Arc::from(e.to_string());
        {
            let mut state = self.state();
            state.failure = Some(message.clone());
            state.sched = Sched::Done;
        }
        self.done.notify_all();
        self.progress.send_modify(|p| p.failure = Some(message));
        self.space.notify_waiters();
    }
}

/// A group taken from the pending state: the copied bytes, the batches and
/// a hole declared with it (see [`Wal::skip_to`](super::Wal::skip_to)).
type TakenGroup = (Vec<u8>, Vec<PendingBatch>, Option<u64>);

impl WriterCore {
    fn active_path(&self, shared: &Shared) -> std::path::PathBuf {
        shared.dir.join(log_file_name(self.active_base))
    }

    /// Decides what to do next from `state` and the clock. Takes nothing.
    fn next(&self, shared: &Shared, state: &AppendState) -> Next {
        let now = shared.config.clock.now();
        let rolls_wanted = state.roll_requests > self.rolls_done;
        let skip_wanted = state.skip_to.is_some();
        let decision = self
            .policy
            .decide(state.pending_bytes, state.oldest_pending_at, now);
        let flush = match decision {
            FlushDecision::FlushNow => true,
            FlushDecision::WaitUntil(_) => state.closing || rolls_wanted || skip_wanted,
            FlushDecision::Idle => skip_wanted,
        };
        // Only while a mark newer than the durable one can be written: a
        // request past what is written waits for the group that writes it.
        // Before the next group, so that sustained appends (every decision
        // `FlushNow`) cannot starve a waiting request; after a sync the two
        // are equal, so groups cannot starve either.
        if state.mark_sync_through > self.mark_durable_next
            && self.mark_written_next > self.mark_durable_next
        {
            return Next::SyncMark;
        }
        // The same for a data sync: only while written records are not
        // synced yet.
        if state.data_sync_through > self.data_durable_next
            && self.mark_written_next > self.data_durable_next
        {
            return Next::SyncData;
        }
        if flush {
            return Next::Group {
                roll_to: rolls_wanted.then_some(state.roll_requests),
            };
        }
        if decision == FlushDecision::Idle {
            if rolls_wanted {
                return Next::Roll(state.roll_requests);
            }
            if state.closing {
                return Next::Close;
            }
        }
        let age_due = age_roll_due(shared.config.segment_max_age, self.active_first_write_at);
        if age_due.is_some_and(|due| now >= due) {
            return Next::AgeRoll;
        }
        let linger = match decision {
            FlushDecision::WaitUntil(deadline) => Some(deadline),
            _ => None,
        };
        Next::Wait(match (linger, age_due) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        })
    }

    /// Takes the pending group out of `state`, leaving the spare buffers.
    fn take_group(&mut self, state: &mut AppendState) -> TakenGroup {
        std::mem::swap(&mut state.pending, &mut self.spare_bytes);
        std::mem::swap(&mut state.batches, &mut self.spare_batches);
        state.pending_bytes = 0;
        state.oldest_pending_at = None;
        (
            std::mem::take(&mut self.spare_bytes),
            std::mem::take(&mut self.spare_batches),
            state.skip_to.take(),
        )
    }

    fn write_group(
        &mut self,
        shared: &Shared,
        mut bytes: Vec<u8>,
        mut batches: Vec<PendingBatch>,
        skip_to: Option<u64>,
    ) -> Result<(), WalError> {
        let config = &shared.config;
        let mut i = 0;
        let mut at = 0usize;
        while i < batches.len() {
            let mut run = 0u64;
            let mut j = i;
            while j < batches.len() {
                let len = u64::from(batches[j].header.batch_length);
                let used = self.active_bytes + run;
                if used > 0 && used + len > config.segment_max_bytes {
                    break;
                }
                run += len;
                j += 1;
            }
            if j == i {
                self.roll(shared)?;
                continue;
            }
            let path = self.active_path(shared);
            let buffers = gather(&batches[i..j], &bytes, &mut at);
            self.file
                .append_vectored(&buffers)
                .map_err(io_err("write", &path))?;
            if config.sync_mode == SyncMode::FsyncBatch {
                self.file.sync_data().map_err(io_err("fdatasync", &path))?;
            }
            let now = shared.config.clock.now();
            {
                let mut segments = shared.segments_mut();
                let meta = segments
                    .get_mut(&self.active_base)
                    .expect("WAL invariant: the active segment is in the map");
                for batch in &batches[i..j] {
                    let position = meta.bytes;
                    meta.note_batch(&batch.header, position, config.index_interval_bytes);
                }
                meta.first_write_at.get_or_insert(now);
            }
            self.active_first_write_at.get_or_insert(now);
            self.active_bytes += run;
            self.write_behind(shared, config.sync_mode);
            self.write_mark(shared, false)?;
            let hwm = batches[j - 1].header.next_offset();
            self.publish(shared, hwm);
            i = j;
        }
        if let Some(end) = skip_to {
            let hwm = {
                let mut segments = shared.segments_mut();
                let meta = segments
                    .get_mut(&self.active_base)
                    .expect("WAL invariant: the active segment is in the map");
                meta.next_offset = meta.next_offset.max(end);
                meta.next_offset
            };
            // A hole is durable only once the mark that declares it is.
            self.write_mark(shared, true)?;
            self.publish(shared, hwm);
        }
        debug_assert_eq!(at, bytes.len());
        bytes.clear();
        batches.clear();
        self.spare_bytes = bytes;
        self.spare_batches = batches;
        Ok(())
    }

    /// Raises the high-water mark to `hwm` (never lowers it: a declared
    /// hole may have raised it past the group just written).
    fn publish(&self, shared: &Shared, hwm: u64) {
        shared
            .progress
            .send_modify(|p| p.high_water_mark = p.high_water_mark.max(hwm));
    }

    /// Writes the sync mark for the active segment as it now is (see
    /// `mark.rs`), and syncs it when `sync` is set or, in `fsync_batch`,
    /// when its last sync is old.
    fn write_mark(&mut self, shared: &Shared, sync: bool) -> Result<(), WalError> {
        let durable = shared.config.sync_mode == SyncMode::FsyncBatch;
        let next_offset = shared
            .segments()
            .get(&self.active_base)
            .map_or(self.active_base, |m| m.next_offset);
        let mark = SyncMark {
            segment_base: self.active_base,
            position: self.active_bytes,
            next_offset,
            durable,
        };
        let path = shared.dir.join(MARK_FILE_NAME);
        let now = shared.config.clock.now();
        self.mark.write(mark).map_err(io_err("write", &path))?;
        self.mark_written_next = next_offset;
        if sync {
            self.mark.sync(now).map_err(io_err("fdatasync", &path))?;
            self.mark_durable_next = self.mark_durable_next.max(next_offset);
            let durable_next = self.mark_durable_next;
            shared
                .progress
                .send_modify(|p| p.mark_durable_next = p.mark_durable_next.max(durable_next));
            Ok(())
        } else if durable {
            self.mark
                .sync_if_due(now)
                .map_err(io_err("fdatasync", &path))
        } else {
            Ok(())
        }
    }

    /// `fdatasync`s the active segment (earlier segments were synced when
    /// they were sealed) and then the sync mark: every record written so
    /// far survives a power cut.
    fn sync_data(&mut self, shared: &Shared) -> Result<(), WalError> {
        self.file
            .sync_data()
            .map_err(io_err("fdatasync", &self.active_path(shared)))?;
        self.write_mark(shared, true)?;
        self.data_durable_next = self.mark_written_next;
        let durable_next = self.data_durable_next;
        shared
            .progress
            .send_modify(|p| p.data_durable_next = p.data_durable_next.max(durable_next));
        Ok(())
    }

    /// Starts writeback of the unsynced part of the active segment once it
    /// reaches [`WRITE_BEHIND_BYTES`]. Advisory: a failure is logged and
    /// left to the next `fdatasync` to report.
    fn write_behind(&mut self, shared: &Shared, sync_mode: SyncMode) {
        if sync_mode == SyncMode::FsyncBatch {
            return; // every group is synced already
        }
        let pending = self.active_bytes - self.written_back;
        if pending < WRITE_BEHIND_BYTES {
            return;
        }
        if let Err(e) = self.file.start_writeback(self.written_back, pending) {
            debug!(path = %self.active_path(shared).display(), error = %e, "starting writeback");
        }
        self.written_back = self.active_bytes;
    }

    fn serve_rolls(&mut self, shared: &Shared, target: u64) -> Result<(), WalError> {
        self.roll(shared)?;
        self.rolls_done = target;
        shared.progress.send_modify(|p| p.rolls = target);
        Ok(())
    }

    /// Seals the active segment (if it has data) and starts the next one.
    fn roll(&mut self, shared: &Shared) -> Result<(), WalError> {
        if self.active_bytes == 0 {
            self.active_first_write_at = None;
            return Ok(());
        }
        let storage = shared.storage.as_ref();
        let dir = &shared.dir;
        self.file
            .sync_data()
            .map_err(io_err("fdatasync", &self.active_path(shared)))?;
        let meta = shared
            .segments()
            .get(&self.active_base)
            .cloned()
            .expect("WAL invariant: the active segment is in the map");
        // Indexes that a full disk kept from being written before.
        self.unindexed
            .retain(|waiting| write_seal(storage, dir, waiting).is_err());
        match write_seal(storage, dir, &meta) {
            Ok(()) => {}
            // On a full disk the index (a few KiB) may not fit, while
            // sealing is what lets retention delete this segment and free
            // its megabytes once it is safe: seal without it (the data is
            // synced; recovery rebuilds a missing index by scanning). A
            // default edge, without a budget, stayed full for good.
            Err(e) if e.is_disk_full() => {
                warn!(dir = %dir.display(), base = meta.base_offset, error = %e, "disk full: segment sealed without its index (written later, or rebuilt at the next start)");
                self.unindexed.push(meta.clone());
            }
            Err(e) => return Err(e),
        }
        let next = meta.next_offset;
        let file = create_segment(storage, dir, next)?;
        {
            let mut segments = shared.segments_mut();
            if let Some(sealed) = segments.get_mut(&self.active_base) {
                sealed.sealed = true;
            }
            segments.insert(next, SegmentMeta::empty(next));
        }
        debug!(dir = %dir.display(), base = meta.base_offset, next, bytes = meta.bytes, "sealed segment");
        self.file = file;
        self.active_base = next;
        self.active_bytes = 0;
        self.written_back = 0;
        self.active_first_write_at = None;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tributary_proto::batch::{Record, RecordBatch};
    use tributary_proto::limits::Limits;

    /// A batch of `len` bytes of `fill`, shared or copied, with the header
    /// of some real batch (gather reads only its length).
    fn pending(len: usize, fill: u8, shared: bool) -> (PendingBatch, Vec<u8>) {
        let real = RecordBatch::new(0, vec![Record::default()])
            .encode(&Limits::default())
            .unwrap();
        let mut header = *real.header();
        header.batch_length = len as u32;
        let bytes = vec![fill; len];
        let batch = PendingBatch {
            header,
            shared: shared.then(|| bytes::Bytes::from(bytes.clone())),
        };
        (batch, bytes)
    }

    #[test]
    fn gather_writes_runs_of_copied_batches_as_one_slice_and_shared_ones_in_place() {
        let shapes = [
            (100, false),
            (200, false),
            (20_000, true),
            (50, false),
            (50, false),
            (30_000, true),
            (10, false),
        ];
        let mut batches = Vec::new();
        let mut copied = b"earlier run:".to_vec();
        let mut expected = Vec::new();
        for (k, &(len, shared)) in shapes.iter().enumerate() {
            let (batch, bytes) = pending(len, k as u8, shared);
            if !shared {
                copied.extend_from_slice(&bytes);
            }
            expected.extend_from_slice(&bytes);
            batches.push(batch);
        }
        let mut at = b"earlier run:".len();
        let buffers = gather(&batches, &copied, &mut at);
        let lens: Vec<usize> = buffers.iter().map(|b| b.len()).collect();
        assert_eq!(lens, vec![300, 20_000, 100, 30_000, 10]);
        assert_eq!(at, copied.len());
        // Shared batches are not copied.
        let first_shared = batches[2].shared.as_ref().map(|b| b.as_ptr());
        assert_eq!(Some(buffers[1].as_ptr()), first_shared);
        assert_eq!(buffers.concat(), expected);
        assert!(gather(&[], &copied, &mut at).is_empty());
    }
}
