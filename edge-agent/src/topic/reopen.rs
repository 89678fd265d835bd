//! A topic's side of [`crate::recovery`]: recording a latched WAL failure,
//! refusing publishes while it lasts, and reopening the WAL (then sealing
//! its active segment when the disk is full, so retention can free it).

use std::sync::Arc;

use broker_core::wal::{Wal, WalError};
use tracing::{debug, error, info, warn};

use super::{PublishError, Topic, TopicLog, lock};
use crate::budget;
use crate::recovery::{FaultKind, FaultReport, should_seal};

fn kind_of(e: &WalError) -> FaultKind {
    if e.is_disk_full() {
        FaultKind::DiskFull
    } else {
        FaultKind::Io
    }
}

impl Topic {
    /// The latched WAL failure the topic is recovering from, if any.
    pub fn fault(&self) -> Option<FaultReport> {
        lock(&self.reopener).report()
    }

    fn refusal(&self, kind: FaultKind, wal: &Wal, detail: String) -> PublishError {
        let (topic, path) = (self.name.clone(), wal.dir().to_path_buf());
        match kind {
            FaultKind::DiskFull => PublishError::DiskFull {
                topic,
                path,
                detail,
            },
            FaultKind::Io => PublishError::WalStopped {
                topic,
                path,
                detail,
            },
        }
    }

    /// The refusal for a publish while the WAL is faulted (nothing is
    /// appended: the handle is latched), or `None`.
    pub(super) fn fault_refusal(&self, wal: &Wal) -> Option<PublishError> {
        let report = self.fault()?;
        Some(self.refusal(report.state, wal, report.error))
    }

    /// Counts `count` records refused by `refusal` if it is a full disk.
    pub(super) fn count_refusal(&self, refusal: &PublishError, count: u64) {
        if matches!(refusal, PublishError::DiskFull { .. }) {
            self.counters
                .disk_full_records
                .fetch_add(count, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// An append failed with `source`. A failure that latches the WAL
    /// (an I/O error) starts a fault, so the agent reopens it; the answer
    /// names a full disk as such.
    pub(super) fn note_failure(&self, wal: &Wal, source: WalError) -> PublishError {
        if !matches!(source, WalError::Io { .. } | WalError::PreviousIo(_)) {
            return PublishError::Wal {
                topic: self.name.clone(),
                source,
            };
        }
        let kind = kind_of(&source);
        let detail = source.to_string();
        let dir = wal.dir().display().to_string();
        let started = lock(&self.reopener).failed(self.clock.now(), kind, &dir, &detail);
        if started {
            warn!(
                topic = %self.name,
                path = %dir,
                state = kind.as_str(),
                error = %detail,
                "the topic's WAL stopped after an I/O failure; publishes are refused until it is reopened, which the agent retries with backoff"
            );
        }
        self.refusal(kind, wal, detail)
    }

    /// Reopens the WAL if the topic is faulted and the next attempt is
    /// due: drops the latched handle, opens the WAL again on the same
    /// directory (recovery decides what is on disk and truncates a partial
    /// write at the end), seals the active segment when the disk is full
    /// and the broker acknowledged records of it ([`should_seal`]), runs
    /// retention at the safe offset ([`Topic::safe_offset`]) and then accepts publishes
    /// again. Returns whether the WAL was reopened. A failed attempt
    /// schedules the next one (backoff).
    pub async fn recover_if_due(&self) -> bool {
        if !lock(&self.reopener).due(self.clock.now()) {
            return false;
        }
        let TopicLog::Wal(slot) = &self.log else {
            return false;
        };
        let Some(old) = self.wal() else {
            return false; // closed
        };
        let Some(kind) = lock(&self.reopener).fault_kind() else {
            return false;
        };
        let maintenance = self.maintenance.lock().await;
        let old_size = old.size_bytes();
        let old_hwm = old.high_water_mark();
        let (dir, config) = (old.dir().to_path_buf(), old.config().clone());
        let opened = tokio::task::spawn_blocking(move || Wal::open(dir, config))
            .await
            .map_err(|e| WalError::Config(format!("open task failed: {e}")))
            .and_then(|r| r);
        let wal = match opened {
            Ok(wal) => Arc::new(wal),
            Err(e) => {
                self.attempt_failed(&e, "reopening the WAL failed");
                return false;
            }
        };
        {
            let mut slot = lock(slot);
            if slot.is_none() {
                return false; // closed meanwhile; the new handle closes on drop
            }
            *slot = Some(wal.clone());
        }
        // The replicator may still hold the old handle; it reads what it
        // can and its stream restarts on the new one.
        drop(old);
        let new_size = wal.size_bytes();
        if new_size >= old_size {
            self.budget.add(new_size - old_size);
            self.agent_budget.add(new_size - old_size);
        } else {
            budget::release(&self.budget, &self.agent_budget, old_size - new_size);
        }
        let hwm = wal.high_water_mark();
        if hwm < old_hwm {
            error!(topic = %self.name, high_water_mark = hwm, before = old_hwm, "the reopened WAL ends below the high-water mark it had: recovery dropped durable records");
        }
        self.counters
            .wal_reopens
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        info!(
            topic = %self.name,
            path = %wal.dir().display(),
            high_water_mark = hwm,
            before = old_hwm,
            bytes = new_size,
            "reopened the WAL after a latched I/O failure"
        );
        drop(maintenance);
        let sealed = wal.sealed_segments();
        let sealed_bytes: u64 = sealed.iter().map(|s| s.bytes).sum();
        let active_base = sealed
            .last()
            .map_or_else(|| wal.log_start_offset(), |s| s.next_offset);
        let active_bytes = new_size.saturating_sub(sealed_bytes);
        // What retention may delete: below the acknowledged offset, or with
        // retain_until = "archived" below the archived one too.
        let acknowledged = self.safe_offset();
        if should_seal(kind, active_base, active_bytes, acknowledged) {
            if let Err(e) = wal.roll().await {
                self.attempt_failed(&e, "sealing the active segment to free space failed");
                return true;
            }
            info!(topic = %self.name, active_base, acknowledged, bytes = active_bytes, "disk full: sealed the active segment so that retention can delete what the broker acknowledged");
        }
        match self.delete_sealed_below(&wal, acknowledged).await {
            Ok(report) => {
                let freed: u64 = report.deleted.iter().map(|d| d.2).sum();
                if freed > 0 {
                    info!(topic = %self.name, segments = report.deleted.len(), bytes = freed, "freed acknowledged segments");
                }
            }
            Err(e) => warn!(topic = %self.name, error = %e, "retention after reopening failed"),
        }
        lock(&self.reopener).reopened(self.clock.now());
        true
    }

    fn attempt_failed(&self, e: &WalError, what: &'static str) {
        let kind = kind_of(e);
        let mut reopener = lock(&self.reopener);
        let first = reopener.report().is_some_and(|r| r.failed_reopens == 0);
        reopener.attempt_failed(self.clock.now(), kind, &e.to_string());
        drop(reopener);
        if first {
            warn!(topic = %self.name, state = kind.as_str(), error = %e, "{what}; retrying with backoff");
        } else {
            debug!(topic = %self.name, state = kind.as_str(), error = %e, "{what}; retrying with backoff");
        }
    }
}
