//! The writer thread: the only code that writes, syncs, rolls and seals
//! segment files. One per WAL.

use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Instant;

use tracing::{debug, error};

use super::commit::{FlushDecision, GroupCommit, age_roll_due};
use super::mark::{MARK_FILE_NAME, MarkWriter, SyncMark};
use super::recovery::{create_segment, write_seal};
use super::segment::{SegmentMeta, log_file_name};
use super::storage::AppendFile;
use super::{PendingBatch, Shared, SyncMode, WalError, io_err};

/// Stack size of a writer thread, bytes: it only shuffles buffers.
const WRITER_STACK_BYTES: usize = 256 * 1024;

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

enum Work {
    /// Write this group, then serve roll requests up to `roll_to` if set.
    Group {
        bytes: Vec<u8>,
        batches: Vec<PendingBatch>,
        roll_to: Option<u64>,
        /// A hole declared with the group (see [`AppendState::skip_to`]).
        skip_to: Option<u64>,
    },
    /// Serve roll requests up to this count.
    Roll(u64),
    /// `segment_max_age` reached.
    AgeRoll,
    /// Everything is flushed and the WAL is closing.
    Close,
}

struct Writer {
    shared: Arc<Shared>,
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
}

pub(crate) fn spawn(
    shared: Arc<Shared>,
    active_base: u64,
    file: Box<dyn AppendFile>,
) -> Result<JoinHandle<()>, WalError> {
    let active_bytes = shared.segments().get(&active_base).map_or(0, |m| m.bytes);
    let policy = GroupCommit {
        flush_interval: shared.config.flush_interval,
        flush_max_batch_bytes: shared.config.flush_max_batch_bytes,
    };
    let dir = shared.dir.clone();
    let mark = MarkWriter::open(shared.storage.as_ref(), &dir, shared.mark_seq)
        .map_err(io_err("open", &dir.join(MARK_FILE_NAME)))?;
    let active_first_write_at = (active_bytes > 0).then(|| shared.config.clock.now());
    let writer = Writer {
        shared,
        policy,
        file,
        active_base,
        active_bytes,
        written_back: active_bytes,
        active_first_write_at,
        rolls_done: 0,
        spare_bytes: Vec::new(),
        spare_batches: Vec::new(),
        mark,
    };
    thread::Builder::new()
        .name("wal-writer".into())
        .stack_size(WRITER_STACK_BYTES)
        .spawn(move || writer.run())
        .map_err(io_err("spawn writer for", &dir))
}

impl Writer {
    fn run(mut self) {
        loop {
            let result = match self.next_work() {
                Work::Group {
                    bytes,
                    batches,
                    roll_to,
                    skip_to,
                } => self
                    .write_group(bytes, batches, skip_to)
                    .and_then(|()| match roll_to {
                        Some(target) => self.serve_rolls(target),
                        None => Ok(()),
                    }),
                Work::Roll(target) => self.serve_rolls(target),
                Work::AgeRoll => self.roll(),
                Work::Close => {
                    let result = self
                        .file
                        .sync_data()
                        .map_err(io_err("fdatasync", &self.active_path()))
                        .and_then(|()| self.write_mark(true));
                    match result {
                        Ok(()) => self.shared.progress.send_modify(|p| p.closed = true),
                        Err(e) => self.fail(e),
                    }
                    return;
                }
            };
            if let Err(e) = result {
                self.fail(e);
                return;
            }
        }
    }

    fn active_path(&self) -> std::path::PathBuf {
        self.shared.dir.join(log_file_name(self.active_base))
    }

    fn next_work(&mut self) -> Work {
        let shared = self.shared.clone();
        let mut state = shared.state();
        loop {
            let now = self.shared.config.clock.now();
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
            if flush {
                std::mem::swap(&mut state.pending, &mut self.spare_bytes);
                std::mem::swap(&mut state.batches, &mut self.spare_batches);
                state.pending_bytes = 0;
                state.oldest_pending_at = None;
                let roll_to = rolls_wanted.then_some(state.roll_requests);
                let skip_to = state.skip_to.take();
                drop(state);
                self.shared.space.notify_waiters();
                return Work::Group {
                    bytes: std::mem::take(&mut self.spare_bytes),
                    batches: std::mem::take(&mut self.spare_batches),
                    roll_to,
                    skip_to,
                };
            }
            if decision == FlushDecision::Idle {
                if rolls_wanted {
                    return Work::Roll(state.roll_requests);
                }
                if state.closing {
                    return Work::Close;
                }
            }
            let age_due = age_roll_due(
                self.shared.config.segment_max_age,
                self.active_first_write_at,
            );
            if age_due.is_some_and(|due| now >= due) {
                return Work::AgeRoll;
            }
            let linger = match decision {
                FlushDecision::WaitUntil(deadline) => Some(deadline),
                _ => None,
            };
            let wake_at = match (linger, age_due) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            state.writer_idle = true;
            state = match wake_at {
                Some(at) => {
                    let timeout = at.saturating_duration_since(now);
                    match self.shared.writer_wake.wait_timeout(state, timeout) {
                        Ok((guard, _)) => guard,
                        Err(poisoned) => poisoned.into_inner().0,
                    }
                }
                None => match self.shared.writer_wake.wait(state) {
                    Ok(guard) => guard,
                    Err(poisoned) => poisoned.into_inner(),
                },
            };
            state.writer_idle = false;
        }
    }

    fn write_group(
        &mut self,
        mut bytes: Vec<u8>,
        mut batches: Vec<PendingBatch>,
        skip_to: Option<u64>,
    ) -> Result<(), WalError> {
        let shared = self.shared.clone();
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
                self.roll()?;
                continue;
            }
            let path = self.active_path();
            let buffers = gather(&batches[i..j], &bytes, &mut at);
            self.file
                .append_vectored(&buffers)
                .map_err(io_err("write", &path))?;
            if config.sync_mode == SyncMode::FsyncBatch {
                self.file.sync_data().map_err(io_err("fdatasync", &path))?;
            }
            let now = self.shared.config.clock.now();
            {
                let mut segments = self.shared.segments_mut();
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
            self.write_behind(config.sync_mode);
            self.write_mark(false)?;
            let hwm = batches[j - 1].header.next_offset();
            self.publish(hwm);
            i = j;
        }
        if let Some(end) = skip_to {
            let hwm = {
                let mut segments = self.shared.segments_mut();
                let meta = segments
                    .get_mut(&self.active_base)
                    .expect("WAL invariant: the active segment is in the map");
                meta.next_offset = meta.next_offset.max(end);
                meta.next_offset
            };
            // A hole is durable only once the mark that declares it is.
            self.write_mark(true)?;
            self.publish(hwm);
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
    fn publish(&self, hwm: u64) {
        self.shared
            .progress
            .send_modify(|p| p.high_water_mark = p.high_water_mark.max(hwm));
    }

    /// Writes the sync mark for the active segment as it now is (see
    /// `mark.rs`), and syncs it when `sync` is set or, in `fsync_batch`,
    /// when its last sync is old.
    fn write_mark(&mut self, sync: bool) -> Result<(), WalError> {
        let durable = self.shared.config.sync_mode == SyncMode::FsyncBatch;
        let next_offset = self
            .shared
            .segments()
            .get(&self.active_base)
            .map_or(self.active_base, |m| m.next_offset);
        let mark = SyncMark {
            segment_base: self.active_base,
            position: self.active_bytes,
            next_offset,
            durable,
        };
        let path = self.shared.dir.join(MARK_FILE_NAME);
        let now = self.shared.config.clock.now();
        self.mark.write(mark).map_err(io_err("write", &path))?;
        let synced = if sync {
            self.mark.sync(now)
        } else if durable {
            self.mark.sync_if_due(now)
        } else {
            Ok(())
        };
        synced.map_err(io_err("fdatasync", &path))
    }

    /// Starts writeback of the unsynced part of the active segment once it
    /// reaches [`WRITE_BEHIND_BYTES`]. Advisory: a failure is logged and
    /// left to the next `fdatasync` to report.
    fn write_behind(&mut self, sync_mode: SyncMode) {
        if sync_mode == SyncMode::FsyncBatch {
            return; // every group is synced already
        }
        let pending = self.active_bytes - self.written_back;
        if pending < WRITE_BEHIND_BYTES {
            return;
        }
        if let Err(e) = self.file.start_writeback(self.written_back, pending) {
            debug!(path = %self.active_path().display(), error = %e, "starting writeback");
        }
        self.written_back = self.active_bytes;
    }

    fn serve_rolls(&mut self, target: u64) -> Result<(), WalError> {
        self.roll()?;
        self.rolls_done = target;
        self.shared.progress.send_modify(|p| p.rolls = target);
        Ok(())
    }

    /// Seals the active segment (if it has data) and starts the next one.
    fn roll(&mut self) -> Result<(), WalError> {
        if self.active_bytes == 0 {
            self.active_first_write_at = None;
            return Ok(());
        }
        let storage = self.shared.storage.as_ref();
        let dir = &self.shared.dir;
        self.file
            .sync_data()
            .map_err(io_err("fdatasync", &self.active_path()))?;
        let meta = self
            .shared
            .segments()
            .get(&self.active_base)
            .cloned()
            .expect("WAL invariant: the active segment is in the map");
        write_seal(storage, dir, &meta)?;
        let next = meta.next_offset;
        let file = create_segment(storage, dir, next)?;
        {
            let mut segments = self.shared.segments_mut();
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

    fn fail(&self, e: WalError) {
        error!(dir = %self.shared.dir.display(), error = %e, "WAL writer stopped");
        let message: Arc<str> = Arc::from(e.to_string());
        self.shared.state().failure = Some(message.clone());
        self.shared
            .progress
            .send_modify(|p| p.failure = Some(message));
        self.shared.space.notify_waiters();
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
