//! The shared writer pool: a few threads that do the writing of every WAL
//! in the process.
//!
//! # Why a pool
//! A thread per WAL sleeps between groups; with a thousand topics almost
//! every append found its writer asleep and paid a `futex` wake-up and two
//! context switches (FORMAT.md, "Writers"). Here an append to a WAL that is
//! already queued or being written wakes nobody, and one to an idle WAL
//! wakes a pool thread only if one is idle: under load every thread is busy
//! and takes the next queued WAL without sleeping.
//!
//! # What does not change
//! At most one thread works on a WAL at a time (its [`Sched`] state, kept
//! under the WAL's state lock), and it does exactly what the per-WAL thread
//! did, in the same order: write a group, `fdatasync` it per the sync mode,
//! write the sync mark, publish the high-water mark; roll and seal; close.
//! Each WAL's files, groups, marks and seals are its own, so the recovery
//! table and its crash tests hold unchanged. Groups of different WALs are
//! written (and synced) concurrently by different pool threads.
//!
//! # Scheduling
//! - A WAL is `Idle` (nothing to do now; maybe a timer), `Queued` (in the
//!   ready queue) or `Running` (a pool thread holds it), or `Done` (closed
//!   or failed: never scheduled again).
//! - An append, roll request, declared hole or close makes an `Idle` WAL
//!   `Queued`. The thread that runs a WAL keeps running it while no other
//!   WAL is waiting, and otherwise puts it at the back of the queue after one
//!   unit of work, so a busy topic cannot starve the others.
//! - A WAL that waits for a deadline (the group-commit window, the segment's
//!   age) registers a timer; the pool runs the WAL when it is due. Timers
//!   hold the WAL weakly, and a stale timer (the WAL ran since) does nothing.
//! - Lock order: a WAL's state lock, then the pool's queue lock; a pool
//!   thread never holds the queue lock while it takes a WAL's locks.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::fmt;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, Weak};
use std::thread;
use std::time::Instant;

use super::Shared;

/// Stack size of a pool thread, bytes: it only shuffles buffers.
const WRITER_STACK_BYTES: usize = 256 * 1024;

/// Threads of the process-wide pool: two per core, at least 2, at most 8.
/// More than one per core because a thread in `fsync_batch` spends most of
/// its time blocked in `fdatasync`, and a disk completes more syncs with
/// several in flight (FORMAT.md, "Writers": ~2,400/s one at a time, ~5,000/s
/// with 16 in flight on the benchmark machine).
fn default_threads() -> usize {
    let cores = thread::available_parallelism().map_or(1, |n| n.get());
    (2 * cores).clamp(2, 8)
}

/// Where a WAL stands with the pool. Kept in the WAL's state, changed only
/// under its lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sched {
    /// Nothing to do now (a timer may be set).
    Idle,
    /// In the ready queue.
    Queued,
    /// A pool thread is working on it.
    Running,
    /// Closed or failed: its writer work is over.
    Done,
}

/// A pool of writer threads that WALs share. Cheap to clone (one `Arc`).
///
/// Every [`crate::wal::WalConfig`] names the pool its WAL uses; the default
/// is [`WriterPool::shared`], one pool per process. A pool made with
/// [`WriterPool::new`] stops its threads once the last handle is dropped
/// (every WAL using it holds one).
#[derive(Clone)]
pub struct WriterPool {
    owner: Arc<PoolOwner>,
}

/// Dropped with the last [`WriterPool`] handle: tells the threads to stop.
struct PoolOwner {
    inner: Arc<PoolInner>,
}

pub(crate) struct PoolInner {
    queue: Mutex<Queue>,
    work: Condvar,
    threads: usize,
}

#[derive(Default)]
struct Queue {
    ready: VecDeque<Arc<Shared>>,
    timers: BinaryHeap<Reverse<Timer>>,
    /// Threads waiting on `work`.
    idle: usize,
    /// Timers registered so far: orders timers due at the same instant.
    timer_seq: u64,
    shutdown: bool,
}

struct Timer {
    at: Instant,
    seq: u64,
    wal: Weak<Shared>,
}

impl PartialEq for Timer {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Timer {}
impl PartialOrd for Timer {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Timer {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

/// What a pool thread does next.
enum Job {
    Run(Arc<Shared>),
    Timer(Instant, Arc<Shared>),
}

impl fmt::Debug for WriterPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WriterPool")
            .field("threads", &self.owner.inner.threads)
            .finish()
    }
}

impl Default for WriterPool {
    /// [`WriterPool::shared`].
    fn default() -> WriterPool {
        WriterPool::shared()
    }
}

impl WriterPool {
    /// The process-wide pool (started on first use) with two threads per
    /// core, at least 2 and at most 8.
    ///
    /// # Panics
    /// If the operating system refuses to start its first thread.
    pub fn shared() -> WriterPool {
        static SHARED: OnceLock<WriterPool> = OnceLock::new();
        SHARED
            .get_or_init(|| {
                WriterPool::new(default_threads()).expect("starting the WAL writer pool's threads")
            })
            .clone()
    }

    /// A pool of its own with `threads` threads (at least 1).
    ///
    /// # Errors
    /// The operating system's error if a thread cannot be started.
    pub fn new(threads: usize) -> std::io::Result<WriterPool> {
        let threads = threads.max(1);
        let inner = Arc::new(PoolInner {
            queue: Mutex::new(Queue::default()),
            work: Condvar::new(),
            threads,
        });
        for i in 0..threads {
            let inner = inner.clone();
            thread::Builder::new()
                .name(format!("wal-writer-{i}"))
                .stack_size(WRITER_STACK_BYTES)
                .spawn(move || inner.serve())?;
        }
        Ok(WriterPool {
            owner: Arc::new(PoolOwner { inner }),
        })
    }

    /// Threads in this pool.
    pub fn threads(&self) -> usize {
        self.owner.inner.threads
    }

    pub(crate) fn inner(&self) -> &PoolInner {
        &self.owner.inner
    }
}

impl Drop for PoolOwner {
    fn drop(&mut self) {
        self.inner.lock().shutdown = true;
        self.inner.work.notify_all();
    }
}

impl PoolInner {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Puts `wal` at the back of the ready queue and wakes an idle thread
    /// if there is one. The caller holds `wal`'s state lock and has set it
    /// `Queued`.
    pub(crate) fn push(&self, wal: Arc<Shared>) {
        let mut queue = self.lock();
        queue.ready.push_back(wal);
        if queue.idle > 0 {
            self.work.notify_one();
        }
    }

    /// Whether another WAL waits for a thread.
    pub(crate) fn others_waiting(&self) -> bool {
        !self.lock().ready.is_empty()
    }

    /// Runs `wal` at `at` (real time). The caller holds `wal`'s state lock.
    pub(crate) fn add_timer(&self, at: Instant, wal: &Arc<Shared>) {
        let mut queue = self.lock();
        queue.timer_seq += 1;
        let seq = queue.timer_seq;
        let earliest = queue.timers.peek().is_none_or(|Reverse(t)| at < t.at);
        queue.timers.push(Reverse(Timer {
            at,
            seq,
            wal: Arc::downgrade(wal),
        }));
        // A sleeping thread may be waiting for a later timer.
        if earliest && queue.idle > 0 {
            self.work.notify_one();
        }
    }

    /// A pool thread: takes queued WALs and due timers until shut down.
    fn serve(&self) {
        while let Some(job) = self.next_job() {
            match job {
                Job::Run(wal) => wal.run_queued(self),
                Job::Timer(at, wal) => wal.run_timer(at, self),
            }
        }
    }

    fn next_job(&self) -> Option<Job> {
        let mut queue = self.lock();
        loop {
            if let Some(wal) = queue.ready.pop_front() {
                return Some(Job::Run(wal));
            }
            let now = Instant::now();
            while let Some(Reverse(timer)) = queue.timers.peek() {
                if timer.at > now {
                    break;
                }
                let at = timer.at;
                let wal = timer.wal.upgrade();
                queue.timers.pop();
                if let Some(wal) = wal {
                    return Some(Job::Timer(at, wal));
                }
            }
            if queue.shutdown {
                // Every WAL that used this pool held a handle to it and is
                // done: timers left can only name WALs that are gone.
                return None;
            }
            let next_timer = queue.timers.peek().map(|Reverse(t)| t.at);
            queue.idle += 1;
            queue = match next_timer {
                Some(at) => {
                    let wait = at.saturating_duration_since(now);
                    match self.work.wait_timeout(queue, wait) {
                        Ok((guard, _)) => guard,
                        Err(poisoned) => poisoned.into_inner().0,
                    }
                }
                None => self.work.wait(queue).unwrap_or_else(|p| p.into_inner()),
            };
            queue.idle -= 1;
        }
    }
}
