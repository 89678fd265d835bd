//! What every daemon (broker, edge agent, tier service) does the same way:
//! logging to stderr ([`init_logging`]), waiting for SIGTERM or SIGINT
//! ([`shutdown_signal`]), and the systemd service integration
//! (`Type=notify` with `WatchdogSec`): readiness, stopping and watchdog
//! notifications. The notify functions are no-ops when the process does
//! not run under systemd (no `NOTIFY_SOCKET`). Also the bucket bounds of
//! the replication stage histograms both ends publish
//! ([`STAGE_BUCKETS_SECONDS`]).

use std::time::Duration;

use sd_notify::NotifyState;

/// Upper bounds of the replication stage histograms' buckets, in seconds:
/// 10 µs to 10 s in 1-2-5 steps (a `+Inf` bucket follows). The edge's
/// `tributary_edge_replication_stage_seconds` and the broker's
/// `tributary_broker_ingest_stage_seconds` both use them, so the two sides
/// compare bucket by bucket.
pub const STAGE_BUCKETS_SECONDS: [f64; 19] = [
    0.000_01, 0.000_02, 0.000_05, 0.000_1, 0.000_2, 0.000_5, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05,
    0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0,
];

/// How log events are written to stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// Human-readable lines (coloured only on a terminal).
    #[default]
    Text,
    /// One JSON object per event, for log collectors.
    Json,
}

/// Installs the process's tracing subscriber: events go to stderr in
/// `format`, filtered by `RUST_LOG` or, when that is unset or invalid, by
/// `default_filter` (an `EnvFilter` directive such as `"info"` or
/// `"info,openraft=warn"`). Colour only on a terminal: journald and files
/// get plain text. Call once, at start-up.
pub fn init_logging(format: LogFormat, default_filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// The signal that asked the process to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopSignal {
    /// SIGTERM (`systemctl stop`, `kill`).
    Terminate,
    /// SIGINT (Ctrl-C).
    Interrupt,
}

/// A signal handler could not be installed.
#[derive(Debug, thiserror::Error)]
#[error("installing the {signal} handler: {source}")]
pub struct SignalError {
    /// `SIGTERM` or `SIGINT`.
    pub signal: &'static str,
    /// The OS error.
    pub source: std::io::Error,
}

/// Waits for SIGTERM or SIGINT, whichever comes first, and logs which one
/// arrived (`SIGTERM received` / `SIGINT received`, level info).
///
/// # Errors
/// [`SignalError`] when a handler could not be installed (then the caller
/// cannot be stopped gracefully and should say so).
pub async fn shutdown_signal() -> Result<StopSignal, SignalError> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate()).map_err(|source| SignalError {
            signal: "SIGTERM",
            source,
        })?;
        tokio::select! {
            _ = term.recv() => {
                tracing::info!("SIGTERM received");
                Ok(StopSignal::Terminate)
            }
            result = tokio::signal::ctrl_c() => {
                result.map_err(|source| SignalError { signal: "SIGINT", source })?;
                tracing::info!("SIGINT received");
                Ok(StopSignal::Interrupt)
            }
        }
    }
    #[cfg(not(unix))]
    {
        tokio::signal::ctrl_c()
            .await
            .map_err(|source| SignalError {
                signal: "SIGINT",
                source,
            })?;
        tracing::info!("SIGINT received");
        Ok(StopSignal::Interrupt)
    }
}

/// Tells systemd that start-up finished (`READY=1`).
pub fn notify_ready() {
    if let Err(e) = sd_notify::notify(&[NotifyState::Ready]) {
        tracing::warn!(error = %e, "sd_notify READY failed");
    }
}

/// Tells systemd that shutdown began (`STOPPING=1`).
pub fn notify_stopping() {
    let _ = sd_notify::notify(&[NotifyState::Stopping]);
}

/// Sends one watchdog keep-alive (`WATCHDOG=1`).
pub fn notify_watchdog() {
    let _ = sd_notify::notify(&[NotifyState::Watchdog]);
}

/// Sends watchdog keep-alives forever at [`watchdog_period`] (returns at
/// once when systemd does not watch this process). Spawn it on the runtime
/// whose liveness it should prove.
pub async fn watchdog_loop() {
    let Some(period) = watchdog_period() else {
        return;
    };
    let mut ticker = tokio::time::interval(period);
    loop {
        ticker.tick().await;
        notify_watchdog();
    }
}

/// How often to send watchdog keep-alives: half of `WatchdogSec`, or `None`
/// when systemd does not watch this process.
pub fn watchdog_period() -> Option<Duration> {
    sd_notify::watchdog_enabled().map(|timeout| timeout / 2)
}

/// The message of `error` followed by its causes, `: `-separated, each
/// said once: a cause whose text the message so far already holds is left
/// out. Many errors put their source into their own message (`{source}`)
/// and also return it from `source()`, so printing the whole chain
/// (anyhow's `{:#}`) would say `Address already in use (os error 98)`
/// twice. The daemons print fatal errors with this.
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(e) = cause {
        let said = e.to_string();
        if !said.is_empty() && !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        cause = e.source();
    }
    text
}

/// An environment variable renamed to the daemons' one scheme
/// (`TRIB_EDGE_*`, `TRIB_BROKER_*`, `TRIB_TIER_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RenamedEnv {
    /// The command-line argument (clap id) the variable sets.
    pub arg: &'static str,
    /// The name to use.
    pub new: &'static str,
    /// The name earlier releases read; still read while `new` is unset.
    pub old: &'static str,
}

/// `tribctl`'s environment variables (the broker it talks to and its
/// credentials). Some were the daemons' names once; a daemon no longer
/// reads them, because a shell set up for `tribctl` (as the README's quick
/// start does) would otherwise configure every daemon started from it.
pub const TRIBCTL_ENV: &[&str] = &[
    "TRIB_ADMIN_URL",
    "TRIB_ADMIN_TOKEN",
    "TRIB_CA",
    "TRIB_CLIENT_CERT",
    "TRIB_CLIENT_KEY",
    "TRIB_ARCHIVE_BUCKET",
];

/// Of `renamed`, the variables to read under their old name: those whose
/// old name is set and new name is not, unless the old name is one of
/// [`TRIBCTL_ENV`]. Prints a warning on stderr for each (naming the new
/// name), for an old name ignored because the new one is set too, and for
/// a `tribctl` variable that is not read. Call before parsing the command
/// line, then make each returned argument read `old` (clap: `mut_arg(arg,
/// |a| a.env(old))`).
pub fn legacy_env(renamed: &'static [RenamedEnv]) -> Vec<&'static RenamedEnv> {
    let mut used = Vec::new();
    for r in renamed {
        if std::env::var_os(r.old).is_none() {
            continue;
        }
        if TRIBCTL_ENV.contains(&r.old) {
            if std::env::var_os(r.new).is_none() {
                eprintln!(
                    "warning: environment variable {} is tribctl's and is not read here; set {} \
                     to configure this daemon",
                    r.old, r.new
                );
            }
            continue;
        }
        if std::env::var_os(r.new).is_some() {
            eprintln!(
                "warning: environment variable {} is ignored: {} is set (the new name of {})",
                r.old, r.new, r.old
            );
        } else {
            eprintln!(
                "warning: environment variable {} is deprecated: rename it {} (read {} this time)",
                r.old, r.new, r.old
            );
            used.push(r);
        }
    }
    used
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("admin listener on 127.0.0.1:7400: {source}")]
    struct Listen {
        source: std::io::Error,
    }

    #[derive(Debug, thiserror::Error)]
    #[error("starting the broker")]
    struct Start {
        #[source]
        source: Listen,
    }

    #[test]
    fn a_cause_already_in_the_message_is_said_once() {
        let inner = Listen {
            source: std::io::Error::from_raw_os_error(98),
        };
        assert_eq!(
            error_chain(&inner),
            "admin listener on 127.0.0.1:7400: Address already in use (os error 98)"
        );
        let outer = Start { source: inner };
        assert_eq!(
            error_chain(&outer),
            "starting the broker: admin listener on 127.0.0.1:7400: Address already in use (os error 98)"
        );
    }
}
