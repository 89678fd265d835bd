//! systemd service integration (`Type=notify` with `WatchdogSec`): readiness,
//! stopping and watchdog notifications. Every function is a no-op when the
//! process does not run under systemd (no `NOTIFY_SOCKET`).

use std::time::Duration;

use sd_notify::NotifyState;

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
