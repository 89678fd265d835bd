//! `GET /metrics` of the tier service: Prometheus/OpenMetrics text
//! (`prometheus-client`) on its own small HTTP listener (`metrics_listen`,
//! default `127.0.0.1:7600`; no authentication, loopback by default), and
//! `GET /health` on the same listener: `200 {"status":"ok",...}`, or `503
//! {"status":"upload_stalled",...}` once no segment was committed for
//! `[audit] upload_stall_after_ms` while a tiering backlog exists, with the
//! backlog's age and the last error (the object store's, when it is the
//! one failing); `503 archive_data_missing` after an audit found records
//! the archive lost; `503 lakehouse_stalled` once a topic's lakehouse
//! write has failed in every pass for that long.
//!
//! | metric | type | meaning |
//! |---|---|---|
//! | `tributary_tier_passes_total` | counter | tiering passes finished |
//! | `tributary_tier_segments_committed_total` | counter | segments uploaded, verified and committed |
//! | `tributary_tier_uploaded_bytes_total` | counter | object bytes written to the bucket |
//! | `tributary_tier_upload_failures_total` | counter | topic passes that failed after their retries (upload, verify, commit or trim) |
//! | `tributary_tier_trimmed_segments_total` | counter | local segments the broker deleted after trims |
//! | `tributary_tier_reconcile_errors_total` | counter | errors and missing objects found by start-up reconciliation |
//! | `tributary_tier_sealed_segments` | gauge | local sealed segments found by the last pass |
//! | `tributary_tier_archive_reuploads_total` | counter | objects the archive audit found missing or damaged and uploaded again from the local WAL |
//! | `tributary_tier_skipped_not_owner_total` | counter | topic passes skipped because another broker owns the topic (nothing uploaded) |
//! | `tributary_tier_object_conflicts_total` | counter | segments refused because a committed object at their key holds other bytes (never replaced) |
//! | `tributary_tier_archive_missing_segments` | gauge | committed segments the last archive audit found missing or damaged with no local copy (lost from the archive) |
//! | `tributary_tier_backlog_age_seconds` | gauge | age of the oldest sealed segment waiting in the running pass or left uncommitted by the last (0: no backlog) |
//! | `tributary_tier_damaged_segments` | gauge | local sealed segments the last pass found damaged (CRC) and did not upload |
//! | `tributary_tier_upload_stalled` | gauge | 1 while `upload_stalled` holds (see `/health`), else 0 |
//! | `tributary_tier_lakehouse_failing_topics` | gauge | topics whose lakehouse write failed in the last pass (`/health` says `lakehouse_stalled` once one has failed for `upload_stall_after_ms`) |
//! | `tributary_tier_backlog_segments` | gauge | sealed segments waiting in the running pass, else those of the last pass not committed by it: an upper bound of what waits for tiering (segments tiered earlier and not yet trimmed count too) |
//!
//! Counters count since the process started. A metrics listener that cannot
//! bind is logged and the service goes on without it: archiving matters
//! more than its gauges.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tracing::{error, info};

use crate::error::TierError;
use crate::reconcile::ReconcileReport;
use crate::tiering::PassReport;

/// The `Content-Type` of the exposition (OpenMetrics 1.0 text).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// Default address of the metrics listener.
pub const DEFAULT_METRICS_LISTEN: &str = "127.0.0.1:7600";

/// Counters of the tier service, process-wide.
#[derive(Debug, Default)]
pub struct TierStats {
    passes: AtomicU64,
    committed: AtomicU64,
    uploaded_bytes: AtomicU64,
    failures: AtomicU64,
    trimmed: AtomicU64,
    reconcile_errors: AtomicU64,
    sealed: AtomicU64,
    backlog: AtomicU64,
    reuploads: AtomicU64,
    skipped_not_owner: AtomicU64,
    object_conflicts: AtomicU64,
    missing: AtomicU64,
    damaged: AtomicU64,
    /// Backlog age of the last pass, ms; `u64::MAX`: no backlog.
    backlog_age_ms: AtomicU64,
    /// When a segment was last committed (or the service started), ms
    /// since the Unix epoch.
    last_commit_ms: AtomicU64,
    stall_after_ms: AtomicU64,
    last_error: std::sync::Mutex<Option<String>>,
    /// Topics the running pass found sealed segments waiting in: topic →
    /// (when the oldest was sealed, ms since the Unix epoch; how many).
    /// Cleared at the end of each pass, whose report then speaks.
    pending: std::sync::Mutex<std::collections::BTreeMap<String, (u64, u64)>>,
    /// Topics whose lakehouse write failed in the last pass: topic →
    /// (failing since, ms since the Unix epoch; the last error).
    lakehouse_failing: std::sync::Mutex<std::collections::BTreeMap<String, (u64, String)>>,
}

/// The counters of this process ([`crate::service::run`] updates them).
pub static STATS: TierStats = TierStats {
    passes: AtomicU64::new(0),
    committed: AtomicU64::new(0),
    uploaded_bytes: AtomicU64::new(0),
    failures: AtomicU64::new(0),
    trimmed: AtomicU64::new(0),
    reconcile_errors: AtomicU64::new(0),
    sealed: AtomicU64::new(0),
    backlog: AtomicU64::new(0),
    reuploads: AtomicU64::new(0),
    skipped_not_owner: AtomicU64::new(0),
    object_conflicts: AtomicU64::new(0),
    missing: AtomicU64::new(0),
    damaged: AtomicU64::new(0),
    backlog_age_ms: AtomicU64::new(u64::MAX),
    last_commit_ms: AtomicU64::new(0),
    stall_after_ms: AtomicU64::new(300_000),
    last_error: std::sync::Mutex::new(None),
    pending: std::sync::Mutex::new(std::collections::BTreeMap::new()),
    lakehouse_failing: std::sync::Mutex::new(std::collections::BTreeMap::new()),
};

/// What `/health` reports.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Health {
    /// `ok`, `upload_stalled`, `archive_data_missing` (the last audit
    /// found committed segments in no object and no local copy: records
    /// lost from the archive, an operator must act), or
    /// `lakehouse_stalled` (the first that holds, in this order).
    pub status: &'static str,
    /// Whether no segment was committed for `stall_after_ms` while a
    /// backlog exists.
    pub upload_stalled: bool,
    /// Age of the oldest sealed segment not yet committed, seconds; `None`:
    /// no backlog.
    pub backlog_age_seconds: Option<u64>,
    /// When a segment was last committed (or the service started), ms
    /// since the Unix epoch.
    pub last_commit_ms: u64,
    /// The stall threshold, ms.
    pub stall_after_ms: u64,
    /// Committed segments the last archive audit found missing or damaged
    /// with no local copy to upload again.
    pub archive_missing_segments: u64,
    /// The last pass error (topic and error text, which names the object
    /// store's failure), if any pass failed since the last commit.
    pub last_error: Option<String>,
    /// Whether a topic's lakehouse write has failed in every pass for
    /// `stall_after_ms` (its archive is fine; its Parquet files lag).
    pub lakehouse_stalled: bool,
    /// Topics whose lakehouse write failed in the last pass.
    pub lakehouse_failing_topics: u64,
    /// The longest-failing topic's lakehouse error (topic and error text).
    pub lakehouse_error: Option<String>,
}

impl TierStats {
    /// Adds a finished pass.
    pub fn on_pass(&self, pass: &PassReport) {
        self.passes.fetch_add(1, Ordering::Relaxed);
        self.committed.fetch_add(pass.committed, Ordering::Relaxed);
        self.uploaded_bytes
            .fetch_add(pass.uploaded_bytes, Ordering::Relaxed);
        self.failures
            .fetch_add(pass.errors.len() as u64, Ordering::Relaxed);
        self.trimmed
            .fetch_add(pass.trimmed_segments, Ordering::Relaxed);
        self.skipped_not_owner
            .fetch_add(pass.skipped_not_owner, Ordering::Relaxed);
        self.object_conflicts
            .fetch_add(pass.object_conflicts, Ordering::Relaxed);
        self.sealed.store(pass.sealed_segments, Ordering::Relaxed);
        self.backlog_age_ms
            .store(pass.backlog_age_ms.unwrap_or(u64::MAX), Ordering::Relaxed);
        self.damaged
            .store(pass.damaged.len() as u64, Ordering::Relaxed);
        let mut last_error = self
            .last_error
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if pass.committed > 0 {
            let now = u64::try_from(crate::tiering::now_ms()).unwrap_or(0);
            self.last_commit_ms.store(now, Ordering::Relaxed);
            *last_error = None;
        }
        if let Some((topic, error)) = pass.errors.last() {
            *last_error = Some(format!("{topic}: {error}"));
        }
        drop(last_error);
        self.backlog.store(
            pass.sealed_segments.saturating_sub(pass.committed),
            Ordering::Relaxed,
        );
        self.pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clear();
        let now = u64::try_from(crate::tiering::now_ms()).unwrap_or(0);
        self.note_lakehouse(&pass.lakehouse_errors, now);
    }

    /// The lakehouse errors of a pass that ended at `now_ms`: a topic keeps
    /// the time it started failing while it fails pass after pass, and
    /// leaves once a pass writes it (or no longer fails it).
    pub fn note_lakehouse(&self, errors: &[(String, String)], now_ms: u64) {
        let mut failing = self
            .lakehouse_failing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *failing = errors
            .iter()
            .map(|(topic, error)| {
                let since = failing.get(topic).map_or(now_ms, |(since, _)| *since);
                (topic.clone(), (since, error.clone()))
            })
            .collect();
    }

    /// What the running pass found waiting in `topic`: `Some((oldest
    /// sealed at, ms since the Unix epoch; segments))`, or `None` once
    /// none waits. `/health` sees a backlog (and a stalled upload) while
    /// a pass hangs on the object store, not only when it ends.
    pub fn note_pending(&self, topic: &str, waiting: Option<(u64, u64)>) {
        let mut pending = self
            .pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match waiting {
            Some(w) => pending.insert(topic.to_owned(), w),
            None => pending.remove(topic),
        };
    }

    /// A segment was committed at `now_ms` (the stall clock restarts).
    pub fn note_commit(&self, now_ms: u64) {
        self.last_commit_ms.fetch_max(now_ms, Ordering::Relaxed);
    }

    /// The running pass's backlog: (oldest sealed at, segments), if any.
    fn live_backlog(&self) -> Option<(u64, u64)> {
        let pending = self
            .pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let oldest = pending.values().map(|(since, _)| *since).min()?;
        Some((oldest, pending.values().map(|(_, n)| n).sum()))
    }

    /// Starts the stall clock at `now_ms` with threshold `stall_after_ms`.
    pub fn configure(&self, stall_after_ms: u64, now_ms: u64) {
        self.stall_after_ms.store(stall_after_ms, Ordering::Relaxed);
        self.last_commit_ms.store(now_ms, Ordering::Relaxed);
    }

    /// The health at `now_ms` (ms since the Unix epoch).
    pub fn health(&self, now_ms: u64) -> Health {
        let backlog = self.backlog_age_ms.load(Ordering::Relaxed);
        let last_pass = (backlog != u64::MAX).then_some(backlog);
        let live = self
            .live_backlog()
            .map(|(since, _)| now_ms.saturating_sub(since));
        let last_commit_ms = self.last_commit_ms.load(Ordering::Relaxed);
        let stall_after_ms = self.stall_after_ms.load(Ordering::Relaxed);
        // The last pass left a backlog (it failed), or the running one has
        // had a segment waiting that long.
        let upload_stalled = (last_pass.is_some() || live.is_some_and(|age| age >= stall_after_ms))
            && now_ms.saturating_sub(last_commit_ms) >= stall_after_ms;
        let backlog = last_pass.max(live);
        let archive_missing_segments = self.missing.load(Ordering::Relaxed);
        let (lakehouse_failing_topics, lakehouse_oldest) = {
            let failing = self
                .lakehouse_failing
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let oldest = failing
                .iter()
                .min_by_key(|(_, (since, _))| *since)
                .map(|(topic, (since, error))| (*since, format!("{topic}: {error}")));
            (failing.len() as u64, oldest)
        };
        let lakehouse_stalled = lakehouse_oldest
            .as_ref()
            .is_some_and(|(since, _)| now_ms.saturating_sub(*since) >= stall_after_ms);
        Health {
            status: if upload_stalled {
                "upload_stalled"
            } else if archive_missing_segments > 0 {
                "archive_data_missing"
            } else if lakehouse_stalled {
                "lakehouse_stalled"
            } else {
                "ok"
            },
            upload_stalled,
            backlog_age_seconds: backlog.map(|ms| ms / 1000),
            last_commit_ms,
            stall_after_ms,
            archive_missing_segments,
            last_error: self
                .last_error
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone(),
            lakehouse_stalled,
            lakehouse_failing_topics,
            lakehouse_error: lakehouse_oldest.map(|(_, error)| error),
        }
    }

    /// Adds a finished archive audit.
    pub fn on_audit(&self, report: &crate::audit::AuditReport) {
        self.reuploads
            .fetch_add(report.reuploaded.len() as u64, Ordering::Relaxed);
        let missing = report
            .lost
            .iter()
            .filter(|l| !l.object_id.is_empty())
            .count();
        self.missing.store(missing as u64, Ordering::Relaxed);
    }

    /// Adds the start-up reconciliation.
    pub fn on_reconcile(&self, report: &ReconcileReport) {
        self.reconcile_errors.fetch_add(
            (report.errors.len() + report.missing.len()) as u64,
            Ordering::Relaxed,
        );
    }

    /// The exposition of these counters.
    ///
    /// # Errors
    /// Only a formatting failure (never expected).
    pub fn render(&self) -> Result<String, std::fmt::Error> {
        let mut registry = Registry::default();
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let now = u64::try_from(crate::tiering::now_ms()).unwrap_or(0);
        for (name, help, value) in [
            (
                "tributary_tier_passes",
                "Tiering passes finished.",
                load(&self.passes),
            ),
            (
                "tributary_tier_segments_committed",
                "Segments uploaded, verified and committed.",
                load(&self.committed),
            ),
            (
                "tributary_tier_uploaded_bytes",
                "Object bytes written to the bucket.",
                load(&self.uploaded_bytes),
            ),
            (
                "tributary_tier_upload_failures",
                "Topic passes that failed after their retries (upload, verify, commit or trim).",
                load(&self.failures),
            ),
            (
                "tributary_tier_trimmed_segments",
                "Local segments the broker deleted after trim calls.",
                load(&self.trimmed),
            ),
            (
                "tributary_tier_reconcile_errors",
                "Errors and missing objects found by start-up reconciliation.",
                load(&self.reconcile_errors),
            ),
            (
                "tributary_tier_archive_reuploads",
                "Objects the archive audit found missing or damaged and uploaded again from the local WAL.",
                load(&self.reuploads),
            ),
            (
                "tributary_tier_skipped_not_owner",
                "Topic passes skipped because another broker owns the topic (nothing uploaded).",
                load(&self.skipped_not_owner),
            ),
            (
                "tributary_tier_object_conflicts",
                "Segments refused because a committed archive object at their key holds other bytes (never replaced).",
                load(&self.object_conflicts),
            ),
        ] {
            let metric: Counter<u64> = Counter::default();
            metric.inner().store(value, Ordering::Relaxed);
            registry.register(name, help.trim_end_matches('.'), metric);
        }
        for (name, help, value) in [
            (
                "tributary_tier_sealed_segments",
                "Local sealed segments found by the last pass.",
                load(&self.sealed),
            ),
            (
                "tributary_tier_backlog_segments",
                "Sealed segments waiting in the running pass, else those the last pass did not commit (upper bound of the tiering backlog).",
                self.live_backlog()
                    .map_or_else(|| load(&self.backlog), |(_, n)| n),
            ),
            (
                "tributary_tier_backlog_age_seconds",
                "Age of the oldest sealed segment the last pass left uncommitted, seconds (0: no backlog).",
                self.health(now).backlog_age_seconds.unwrap_or(0),
            ),
            (
                "tributary_tier_damaged_segments",
                "Local sealed segments the last pass found damaged (CRC) and did not upload.",
                load(&self.damaged),
            ),
            (
                "tributary_tier_upload_stalled",
                "Whether no segment was committed for upload_stall_after_ms while a backlog waits: 1 if so, else 0 (see /health).",
                u64::from(self.health(now).upload_stalled),
            ),
            (
                "tributary_tier_lakehouse_failing_topics",
                "Topics whose lakehouse write failed in the last pass.",
                self.health(now).lakehouse_failing_topics,
            ),
            (
                "tributary_tier_archive_missing_segments",
                "Committed segments the last archive audit found missing or damaged with no local copy.",
                load(&self.missing),
            ),
        ] {
            let metric: Gauge<u64, AtomicU64> = Gauge::default();
            metric.set(value);
            registry.register(name, help.trim_end_matches('.'), metric);
        }
        let mut out = String::new();
        encode(&mut out, &registry)?;
        Ok(out)
    }
}

async fn health() -> Response {
    let now = u64::try_from(crate::tiering::now_ms()).unwrap_or(0);
    let health = STATS.health(now);
    let status = if health.status != "ok" {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    };
    (status, axum::Json(health)).into_response()
}

async fn metrics() -> Response {
    match STATS.render() {
        Ok(text) => ([(header::CONTENT_TYPE, CONTENT_TYPE)], text).into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

/// Binds the `GET /metrics` and `/health` listener on `addr`
/// (`metrics_listen`).
///
/// # Errors
/// [`TierError::Listen`] naming the address and the setting (the address
/// is in use, or not one of this host's).
pub async fn bind(addr: SocketAddr) -> Result<tokio::net::TcpListener, TierError> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|error| TierError::Listen {
            what: "metrics",
            setting: "metrics_listen",
            addr,
            error,
        })
}

/// Serves `GET /metrics` and `GET /health` on `listener` (see [`bind`])
/// until `shutdown` resolves. A failure after start-up is logged and ends
/// the task.
pub async fn serve(
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let addr = listener
        .local_addr()
        .map_or_else(|_| "?".to_owned(), |a| a.to_string());
    info!(%addr, "metrics at /metrics");
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/health", get(health));
    if let Err(e) = axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
    {
        error!(%addr, error = %e, "metrics listener failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_moves_the_counters_and_gauges() {
        let stats = TierStats::default();
        let pass = PassReport {
            topics: 2,
            sealed_segments: 5,
            committed: 3,
            uploaded_bytes: 4096,
            trimmed_segments: 2,
            errors: vec![("/a/b".into(), "boom".into())],
            ..PassReport::default()
        };
        stats.on_pass(&pass);
        stats.on_pass(&pass);
        let text = stats.render().unwrap();
        for line in [
            "# TYPE tributary_tier_passes counter",
            "tributary_tier_passes_total 2",
            "tributary_tier_segments_committed_total 6",
            "tributary_tier_uploaded_bytes_total 8192",
            "tributary_tier_upload_failures_total 2",
            "tributary_tier_trimmed_segments_total 4",
            "tributary_tier_reconcile_errors_total 0",
            "tributary_tier_sealed_segments 5",
            "tributary_tier_backlog_segments 2",
            "tributary_tier_backlog_age_seconds 0",
            "tributary_tier_upload_stalled 0",
            "tributary_tier_archive_missing_segments 0",
            "tributary_tier_archive_reuploads_total 0",
            "tributary_tier_skipped_not_owner_total 0",
            "tributary_tier_object_conflicts_total 0",
            "tributary_tier_lakehouse_failing_topics 0",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    /// A topic whose lakehouse write fails pass after pass turns `/health`
    /// into `lakehouse_stalled` once it has failed for the stall threshold
    /// (its first failure's time is kept), and back to `ok` once a pass
    /// writes it.
    #[test]
    fn a_lakehouse_write_failing_for_the_stall_threshold_is_lakehouse_stalled() {
        let stats = TierStats::default();
        // A pass with no tiering backlog (uploads are fine).
        stats.on_pass(&PassReport::default());
        stats.configure(60_000, 1_000_000);
        let failing = vec![(
            "/plant/line-1".to_owned(),
            "archive object missing".to_owned(),
        )];
        stats.note_lakehouse(&failing, 1_000_000);
        let health = stats.health(1_030_000);
        assert_eq!(
            (
                health.status,
                health.lakehouse_stalled,
                health.lakehouse_failing_topics
            ),
            ("ok", false, 1)
        );
        // The next pass fails it again: the clock runs from the first.
        stats.note_lakehouse(&failing, 1_040_000);
        let health = stats.health(1_060_000);
        assert_eq!(
            (health.status, health.lakehouse_stalled),
            ("lakehouse_stalled", true)
        );
        assert_eq!(
            health.lakehouse_error.as_deref(),
            Some("/plant/line-1: archive object missing")
        );
        assert!(
            stats
                .render()
                .unwrap()
                .lines()
                .any(|l| l == "tributary_tier_lakehouse_failing_topics 1")
        );
        // Written by the next pass: healthy, and a later failure starts
        // its clock again.
        stats.note_lakehouse(&[], 1_070_000);
        assert_eq!(stats.health(1_070_000).status, "ok");
        stats.note_lakehouse(&failing, 1_080_000);
        assert_eq!(stats.health(1_100_000).status, "ok");
    }
}
