//! [`SyncMode`]: when a WAL append counts as done. It comes from a topic's
//! stream intent (`seeds/000_d502aacc865e81b1.txt`, "wal_sync"), travels in
//! metadata and configuration by its name, and is carried out by the WAL in
//! `broker-core`.

use std::fmt;
use std::str::FromStr;

/// When an append counts as done (from the topic's stream intent).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SyncMode {
    /// Acknowledged when enqueued; written by the WAL's writer soon after.
    /// Survives nothing.
    Async,
    /// Acknowledged when the group's `write` returned (kernel page cache).
    /// Survives a process crash or SIGKILL, not a power cut.
    OsCacheFlush,
    /// Acknowledged when the group's `fdatasync` returned. Survives power loss.
    FsyncBatch,
}

impl SyncMode {
    /// The name used in configuration and metadata.
    pub fn as_str(self) -> &'static str {
        match self {
            SyncMode::Async => "async",
            SyncMode::OsCacheFlush => "os_cache_flush",
            SyncMode::FsyncBatch => "fsync_batch",
        }
    }
}

impl fmt::Display for SyncMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for SyncMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "async" => Ok(SyncMode::Async),
            "os_cache_flush" => Ok(SyncMode::OsCacheFlush),
            "fsync_batch" => Ok(SyncMode::FsyncBatch),
            other => Err(format!(
                "unknown sync mode {other:?}; valid: async, os_cache_flush, fsync_batch"
            )),
        }
    }
}
