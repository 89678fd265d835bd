//! The append path: encoding or re-addressing a batch into the pending
//! group under the state lock (offsets assigned there), backpressure on
//! `max_pending_bytes`, and waiting until a range is durable per the sync
//! mode ([`PendingAppend`]).

use tokio::sync::watch;
use tributary_proto::batch::{Codec, EncodedBatch, Record, RecordBatch};
use tributary_proto::limits::{LimitError, LimitName};

use super::{PendingBatch, Progress, SyncMode, Wal, WalError};

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

/// Batches of at least this many bytes wait for the writer as the caller's
/// own bytes (shared, not copied; `append` re-addresses them in place when
/// it holds the only reference) and reach the file through `writev`; a
/// shared batch keeps its whole allocation alive until written (at the
/// broker, the receive buffer it was cut from). Smaller ones are copied
/// into the group's buffer by the appending task: that costs less than one
/// more iovec and one more cross-thread free in the writer thread.
const SHARE_BATCHES_FROM_BYTES: usize = 16 * 1024;

impl Wal {
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
    /// durable) if it is the stored batch ([`Wal::verify_stored`], which
    /// reads the WAL on this thread).
    ///
    /// # Errors
    /// [`WalError::Gap`] if it starts past the next offset,
    /// [`WalError::Overlap`] if it straddles it, [`WalError::NotStoredBatch`]
    /// if its range holds another batch, limit and state errors as
    /// [`Wal::append_encoded`].
    pub async fn append_at(&self, batch: EncodedBatch) -> Result<AppendAtOutcome, WalError> {
        let id = super::BatchId::of(batch.header());
        let outcome = self.enqueue_at(batch).await?.durable().await?;
        if let AppendAtOutcome::Duplicate(_) = outcome {
            self.verify_stored(&id)?;
        }
        Ok(outcome)
    }

    /// The first half of [`Wal::append_encoded`]: enqueues the batch at the
    /// next offsets (waiting only for memory under `max_pending_bytes`)
    /// and returns a handle that resolves once it is durable. When this
    /// returns, the batch's offsets are assigned: a later call gets later
    /// ones.
    ///
    /// # Errors
    /// As [`Wal::append_encoded`], for the enqueue step.
    pub async fn enqueue_encoded(&self, batch: EncodedBatch) -> Result<PendingAppend, WalError> {
        let outcome = self.enqueue(batch, None).await?;
        Ok(PendingAppend {
            outcome,
            progress: self.shared.progress.subscribe(),
            sync_mode: self.shared.config.sync_mode,
        })
    }

    /// The first half of [`Wal::append_at`]: checks and enqueues the batch
    /// (waiting only for memory under `max_pending_bytes`) and returns a
    /// handle that resolves once it is durable. Calls take effect in call
    /// order, so a caller can enqueue batch after batch and await their
    /// durability concurrently (pipelining) — the replication ingest does.
    /// A [`AppendAtOutcome::Duplicate`] is not checked against the stored
    /// batch: the caller does that ([`Wal::verify_stored`]) once durable.
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
                        state.oldest_pending_at = Some(shared.config.clock.now());
                    }
                    shared.wake(&mut state);
                    return Ok(AppendAtOutcome::Appended(AppendAck {
                        base_offset: next,
                        next_offset: header.next_offset(),
                    }));
                }
            }
            space_freed.await;
        }
    }

    /// Returns once a durable sync mark says offsets below `next_offset`
    /// were handed out, so that no power cut lets this WAL hand them out
    /// again (recovery declares lost ones a hole; FORMAT.md, "Sync mark").
    /// The edge calls it before it sends records to the broker: otherwise
    /// an `os_cache_flush` topic that loses its unsynced tail in a power cut
    /// would give new records the offsets of records the broker already
    /// holds. One `fdatasync` of the mark serves every caller waiting
    /// meanwhile. In `fsync_batch` it returns at once: readable records
    /// are durable there, and recovery finds them.
    ///
    /// # Errors
    /// [`WalError::PreviousIo`] or [`WalError::Closed`] if the WAL stops
    /// first.
    pub async fn mark_durable_through(&self, next_offset: u64) -> Result<(), WalError> {
        if self.shared.config.sync_mode == SyncMode::FsyncBatch {
            return Ok(());
        }
        self.sync_request(
            next_offset,
            |s| &mut s.mark_sync_through,
            |p| p.mark_durable_next,
        )
        .await
    }

    /// Asks the writer to raise the request `slot` selects to
    /// `next_offset` and waits until the progress `reached` reports it.
    async fn sync_request(
        &self,
        next_offset: u64,
        slot: fn(&mut super::AppendState) -> &mut u64,
        reached: fn(&Progress) -> u64,
    ) -> Result<(), WalError> {
        let rx = self.shared.progress.subscribe();
        if reached(&rx.borrow()) >= next_offset {
            return Ok(());
        }
        {
            let mut state = self.shared.state();
            if let Some(failure) = &state.failure {
                return Err(WalError::PreviousIo(failure.clone()));
            }
            if state.closing {
                return Err(WalError::Closed);
            }
            let requested = slot(&mut state);
            if *requested < next_offset {
                *requested = next_offset;
                self.shared.wake(&mut state);
            }
        }
        wait_progress(rx, |p| reached(p) >= next_offset).await
    }

    /// Returns once every record below `next_offset` survives a power cut,
    /// whatever the WAL's sync mode: in `fsync_batch` once they are durable
    /// (each group is `fdatasync`ed), otherwise after one `fdatasync` of
    /// the active segment and the sync mark that serves every caller
    /// waiting meanwhile. For the rare write that must outlive a power cut
    /// in a topic that does not sync (a dead-letter copy whose source
    /// message the cursor then passes).
    ///
    /// # Errors
    /// [`WalError::PreviousIo`] (the sync failed: the WAL stops) or
    /// [`WalError::Closed`] if the WAL stops first.
    pub async fn sync_through(&self, next_offset: u64) -> Result<(), WalError> {
        if self.shared.config.sync_mode == SyncMode::FsyncBatch {
            return self.wait_durable(next_offset).await;
        }
        self.sync_request(
            next_offset,
            |s| &mut s.data_sync_through,
            |p| p.data_durable_next,
        )
        .await
    }

    async fn wait_durable(&self, next_offset: u64) -> Result<(), WalError> {
        wait_durable(
            self.shared.config.sync_mode,
            self.shared.progress.subscribe(),
            next_offset,
        )
        .await
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

    /// Resolves once the batch's range is durable per the sync mode. A
    /// duplicate's range is at least written (readable, even with
    /// [`SyncMode::Async`]) when this resolves, so that it can be compared
    /// with the stored batch.
    ///
    /// # Errors
    /// [`WalError::PreviousIo`] or [`WalError::Closed`] if the WAL stops
    /// first.
    pub async fn durable(self) -> Result<AppendAtOutcome, WalError> {
        let (next, mode) = self.target();
        wait_durable(mode, self.progress, next).await?;
        Ok(self.outcome)
    }

    /// What [`PendingAppend::durable`] would resolve to if it were awaited
    /// now, without waiting: `None` while the batch is not durable yet (and
    /// the WAL neither failed nor closed).
    pub fn durable_now(&self) -> Option<Result<AppendAtOutcome, WalError>> {
        let (next, mode) = self.target();
        let wait = std::pin::pin!(wait_durable(mode, self.progress.clone(), next));
        match wait.poll(&mut std::task::Context::from_waker(std::task::Waker::noop())) {
            std::task::Poll::Ready(done) => Some(done.map(|()| self.outcome)),
            std::task::Poll::Pending => None,
        }
    }

    /// The offset the batch waits for, and the sync mode that decides what
    /// "durable" means for it (a duplicate in [`SyncMode::Async`] waits
    /// until its range is at least written, to be compared).
    fn target(&self) -> (u64, SyncMode) {
        match self.outcome {
            AppendAtOutcome::Appended(a) => (a.next_offset, self.sync_mode),
            AppendAtOutcome::Duplicate(a) if self.sync_mode == SyncMode::Async => {
                (a.next_offset, SyncMode::OsCacheFlush)
            }
            AppendAtOutcome::Duplicate(a) => (a.next_offset, self.sync_mode),
        }
    }
}

async fn wait_durable(
    sync_mode: SyncMode,
    rx: watch::Receiver<Progress>,
    next_offset: u64,
) -> Result<(), WalError> {
    if sync_mode == SyncMode::Async {
        return Ok(());
    }
    wait_progress(rx, |p| p.high_water_mark >= next_offset).await
}

/// Waits until the writer's progress satisfies `reached`.
///
/// # Errors
/// [`WalError::PreviousIo`] if the writer failed first, [`WalError::Closed`]
/// if it closed first.
pub(super) async fn wait_progress(
    mut rx: watch::Receiver<Progress>,
    reached: impl Fn(&Progress) -> bool,
) -> Result<(), WalError> {
    let progress = rx
        .wait_for(|p| reached(p) || p.failure.is_some() || p.closed)
        .await
        .map_err(|_| WalError::Closed)?;
    if reached(&progress) {
        return Ok(());
    }
    match &progress.failure {
        Some(failure) => Err(WalError::PreviousIo(failure.clone())),
        None => Err(WalError::Closed),
    }
}
