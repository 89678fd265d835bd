//! Local retention: [`Wal::apply_retention`] deletes the oldest sealed
//! segments below a safe offset while a size or age limit asks for it.

use tracing::info;

use super::segment::{self, log_file_name};
use super::{Wal, WalError, io_err};

/// What [`Wal::apply_retention`] deleted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RetentionReport {
    /// `(base_offset, next_offset, bytes)` of each deleted segment.
    pub deleted: Vec<(u64, u64, u64)>,
    /// First offset still stored afterwards.
    pub log_start: u64,
}

impl Wal {
    /// Deletes the oldest sealed segments that are entirely below
    /// `safe_offset` (acknowledged centrally or tiered: the caller decides)
    /// while a retention limit asks for it: total size over
    /// `retention_max_bytes`, or newest record older than
    /// `retention_max_age` at `now_ms` (ms since the Unix epoch). Never
    /// deletes the active segment. Deletion happens only here. The last
    /// deleted batch is recorded first (`wal.tip`, module `tip`).
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
        let _one_at_a_time = self
            .shared
            .retention
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        // Decide first (under the read lock), then record the last batch
        // to be deleted (`wal.tip`: reading it needs the lock), then delete.
        let doomed: Vec<(u64, u64, u64)> = {
            let segments = self.shared.segments();
            let mut total: u64 = segments.values().map(|s| s.bytes).sum();
            let mut doomed = Vec::new();
            for meta in segments.values().filter(|s| s.sealed) {
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
                total -= meta.bytes;
                doomed.push((meta.base_offset, meta.next_offset, meta.bytes));
            }
            doomed
        };
        if let Some(&(_, next, _)) = doomed.last() {
            self.record_tip(next);
        }
        let mut segments = self.shared.segments_mut();
        // Checked under the segments lock, which the writer's close also
        // needs: a handle whose writer ended (`close_writer`, the directory
        // about to be opened again) changes no file any more.
        if self.shared.state().closing {
            return Err(WalError::Closed);
        }
        for (base, next, bytes) in doomed {
            if segments.remove(&base).is_none() {
                // Deleted by a concurrent call.
                continue;
            }
            let dir = &self.shared.dir;
            // The index goes first: a crash between the two leaves a `.log`
            // without an index, which recovery reseals (and retention
            // deletes again later); an `.index` without its `.log` is then
            // never ours, and recovery reports it as lost data.
            for (name, is_index) in [
                (segment::index_file_name(base), true),
                (log_file_name(base), false),
            ] {
                let path = dir.join(name);
                match self.shared.storage.remove(&path) {
                    // A lost segment's data file (recovery found only its
                    // index), or the index of a segment sealed on a full
                    // disk: nothing to remove.
                    Err(e)
                        if e.kind() == std::io::ErrorKind::NotFound && (bytes == 0 || is_index) => {
                    }
                    removed => removed.map_err(io_err("remove", &path))?,
                }
                self.shared
                    .storage
                    .sync_dir(dir)
                    .map_err(io_err("fsync dir", dir))?;
            }
            info!(dir = %dir.display(), base, next, bytes, "retention deleted a sealed segment");
            report.deleted.push((base, next, bytes));
        }
        report.log_start = segments.values().next().map_or(0, |s| s.base_offset);
        Ok(report)
    }
}
