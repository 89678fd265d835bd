//! `[replication]` of the agent's configuration: the QUIC keep-alive and
//! idle timeout of the replication connections (how fast a dead broker is
//! noticed), `retain_until` (how long the edge keeps what the broker
//! acknowledged) and `unhealthy_after_ms` (how long nothing may leave the
//! device before `/health` says `unhealthy`, [`crate::health`]).

use std::time::Duration;

use serde::Deserialize;

use super::ConfigError;

/// Default QUIC keep-alive interval of the replication connections, ms.
pub const DEFAULT_KEEP_ALIVE_MS: u64 = 1_000;
/// Default QUIC idle timeout of the replication connections, ms: a broker
/// silent this long is dead and the edge fails over. The connection uses
/// the smaller of this and the broker's own idle timeout.
pub const DEFAULT_IDLE_TIMEOUT_MS: u64 = 5_000;
/// Smallest keep-alive interval, ms.
pub const MIN_KEEP_ALIVE_MS: u64 = 100;
/// Largest idle timeout, ms (10 minutes).
pub const MAX_IDLE_TIMEOUT_MS: u64 = 600_000;
/// Default `unhealthy_after_ms`: two minutes without anything leaving the
/// device (no broker connection, or a backlog nothing acknowledges). Long
/// enough for a broker restart or failover (seconds) and the reconnect
/// backoff (at most 30 s), short enough to alert before a disk budget
/// sized for hours fills.
pub const DEFAULT_UNHEALTHY_AFTER_MS: u64 = 120_000;
/// Smallest `unhealthy_after_ms`.
pub const MIN_UNHEALTHY_AFTER_MS: u64 = 100;
/// Largest `unhealthy_after_ms` (a week).
pub const MAX_UNHEALTHY_AFTER_MS: u64 = 7 * 24 * 3_600_000;

/// Below which offset local retention may delete a durable topic's sealed
/// segments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RetainUntil {
    /// Below `min(acknowledged, archived)`: a record stays on the edge
    /// until the broker reports it committed in the archive, so two copies
    /// exist until then (a broker whose disk is lost costs nothing). The
    /// default.
    #[default]
    Archived,
    /// Below the acknowledged offset (the behaviour before archived
    /// offsets): one copy, on the broker's disk, between acknowledgement
    /// and archive.
    Acknowledged,
}

impl RetainUntil {
    /// The setting as written in the file.
    pub fn as_str(self) -> &'static str {
        match self {
            RetainUntil::Archived => "archived",
            RetainUntil::Acknowledged => "acknowledged",
        }
    }
}

/// `[replication]` as written.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplicationFileConfig {
    /// QUIC keep-alive interval, ms.
    pub keep_alive_ms: Option<u64>,
    /// QUIC idle timeout, ms.
    pub idle_timeout_ms: Option<u64>,
    /// Default `retain_until` of durable topics.
    pub retain_until: Option<RetainUntil>,
    /// Nothing left the device this long: `/health` is `unhealthy`, ms.
    pub unhealthy_after_ms: Option<u64>,
}

/// `[replication]`, validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicationSettings {
    /// QUIC keep-alive interval (a PING when nothing else was sent).
    pub keep_alive: Duration,
    /// QUIC idle timeout: no packet from the broker this long ends the
    /// connection.
    pub idle_timeout: Duration,
    /// Default `retain_until` of durable topics (a topic's own setting
    /// wins).
    pub retain_until: RetainUntil,
    /// Nothing could leave the device this long (no broker connection, or a
    /// backlog nothing acknowledges): `/health` answers `unhealthy`.
    pub unhealthy_after: Duration,
}

impl Default for ReplicationSettings {
    fn default() -> ReplicationSettings {
        ReplicationSettings {
            keep_alive: Duration::from_millis(DEFAULT_KEEP_ALIVE_MS),
            idle_timeout: Duration::from_millis(DEFAULT_IDLE_TIMEOUT_MS),
            retain_until: RetainUntil::default(),
            unhealthy_after: Duration::from_millis(DEFAULT_UNHEALTHY_AFTER_MS),
        }
    }
}

impl ReplicationSettings {
    /// Validates `file`.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming `replication.keep_alive_ms` or
    /// `replication.idle_timeout_ms`: a keep-alive below
    /// [`MIN_KEEP_ALIVE_MS`], an idle timeout above [`MAX_IDLE_TIMEOUT_MS`],
    /// or an idle timeout not at least twice the keep-alive (one lost PING
    /// would end the connection); `replication.unhealthy_after_ms` outside
    /// [`MIN_UNHEALTHY_AFTER_MS`]..=[`MAX_UNHEALTHY_AFTER_MS`].
    pub fn resolve(
        file: Option<ReplicationFileConfig>,
    ) -> Result<ReplicationSettings, ConfigError> {
        let file = file.unwrap_or_default();
        let keep_alive_ms = file.keep_alive_ms.unwrap_or(DEFAULT_KEEP_ALIVE_MS);
        let idle_timeout_ms = file.idle_timeout_ms.unwrap_or(DEFAULT_IDLE_TIMEOUT_MS);
        if keep_alive_ms < MIN_KEEP_ALIVE_MS {
            return Err(ConfigError::invalid(
                "replication.keep_alive_ms",
                format!("{keep_alive_ms} is below {MIN_KEEP_ALIVE_MS} ms"),
            ));
        }
        if idle_timeout_ms > MAX_IDLE_TIMEOUT_MS {
            return Err(ConfigError::invalid(
                "replication.idle_timeout_ms",
                format!("{idle_timeout_ms} is above {MAX_IDLE_TIMEOUT_MS} ms"),
            ));
        }
        if idle_timeout_ms < 2 * keep_alive_ms {
            return Err(ConfigError::invalid(
                "replication.idle_timeout_ms",
                format!(
                    "{idle_timeout_ms} ms must be at least twice replication.keep_alive_ms ({keep_alive_ms} ms), or one lost keep-alive ends the connection"
                ),
            ));
        }
        let unhealthy_after_ms = file
            .unhealthy_after_ms
            .unwrap_or(DEFAULT_UNHEALTHY_AFTER_MS);
        if !(MIN_UNHEALTHY_AFTER_MS..=MAX_UNHEALTHY_AFTER_MS).contains(&unhealthy_after_ms) {
            return Err(ConfigError::invalid(
                "replication.unhealthy_after_ms",
                format!(
                    "must be from {MIN_UNHEALTHY_AFTER_MS} to {MAX_UNHEALTHY_AFTER_MS} ms, got {unhealthy_after_ms}"
                ),
            ));
        }
        Ok(ReplicationSettings {
            keep_alive: Duration::from_millis(keep_alive_ms),
            idle_timeout: Duration::from_millis(idle_timeout_ms),
            retain_until: file.retain_until.unwrap_or_default(),
            unhealthy_after: Duration::from_millis(unhealthy_after_ms),
        })
    }
}
