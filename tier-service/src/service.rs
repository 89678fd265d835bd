//! The tier service process: one lock per data directory, reconciliation
//! at start-up, then passes every `poll_interval_ms` until shutdown (or one
//! pass with `--once`).

use std::fs::{File, TryLockError};
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tracing::{error, info};
use tributary_proto::keys::StorageKeys;

use crate::broker_api::BrokerClient;
use crate::config::TierConfig;
use crate::error::TierError;
use crate::faults::Faults;
use crate::reconcile::{ReconcileReport, reconcile};
use crate::tiering::{PassReport, Tiering};
use tributary_archive::bucket::Bucket;

/// Name of the lock file in the data directory.
pub const LOCK_FILE: &str = "tier-service.lock";

/// An exclusive lock on the data directory: one tier service per broker.
#[derive(Debug)]
pub struct DataDirLock {
    _file: File,
    path: PathBuf,
}

impl DataDirLock {
    /// Takes the lock.
    ///
    /// # Errors
    /// [`TierError::Locked`] if another process holds it; I/O errors.
    pub fn acquire(data_dir: &std::path::Path) -> Result<DataDirLock, TierError> {
        std::fs::create_dir_all(data_dir).map_err(TierError::io("create", data_dir))?;
        let path = data_dir.join(LOCK_FILE);
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(TierError::io("open", &path))?;
        match file.try_lock() {
            Ok(()) => Ok(DataDirLock { _file: file, path }),
            Err(TryLockError::WouldBlock) => Err(TierError::Locked { path }),
            Err(TryLockError::Error(e)) => Err(TierError::io("lock", &path)(e)),
        }
    }

    /// The lock file.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }
}

/// What a run did.
#[derive(Debug, Clone, Default)]
pub struct RunReport {
    /// The start-up reconciliation.
    pub reconcile: ReconcileReport,
    /// The passes, oldest first: every pass of a `once` run, the last
    /// [`REPORTS_KEPT`] of a long-running one (the metrics count them all).
    pub passes: Vec<PassReport>,
    /// The archive audits, oldest first, the last [`REPORTS_KEPT`] likewise.
    pub audits: Vec<crate::audit::AuditReport>,
}

/// How many pass and audit reports a long-running service keeps: a daemon
/// that runs for months must not grow a report per pass.
pub const REPORTS_KEPT: usize = 64;

/// Appends `item` to `list`, dropping the oldest beyond [`REPORTS_KEPT`].
fn keep_last<T>(list: &mut Vec<T>, item: T) {
    if list.len() >= REPORTS_KEPT {
        list.remove(0);
    }
    list.push(item);
}

impl RunReport {
    /// True if reconciliation or any pass reported an error or missing data.
    pub fn has_errors(&self) -> bool {
        !self.reconcile.errors.is_empty()
            || !self.reconcile.missing.is_empty()
            || self.passes.iter().any(|p| !p.errors.is_empty())
            || self.audits.iter().any(|a| !a.lost.is_empty())
            || self.passes.iter().any(|p| !p.damaged.is_empty())
    }
}

/// Builds the pipeline from `config`.
///
/// # Errors
/// Configuration and bucket errors.
pub fn build(config: &TierConfig, faults: Faults) -> Result<Tiering, TierError> {
    config.validate()?;
    let keys = StorageKeys::new(&config.prefix)?;
    let token = config.broker.resolve_token()?;
    Ok(Tiering {
        bucket: Bucket::open(&config.store)?,
        broker: BrokerClient::from_config(&config.broker, &token, &keys)?,
        keys,
        topics_dir: config.topics_dir(),
        upload: config.upload.clone(),
        retry: config.retry.clone(),
        topic_concurrency: config.topic_concurrency,
        cold: config.cold_retention.clone(),
        lakehouse: config.lakehouse.clone(),
        faults: Arc::new(faults),
    })
}

/// Runs the service until `shutdown` resolves (or, with `once`, for one
/// reconciliation and one pass).
///
/// Why `data_dir` is not a broker's data directory by its identity file
/// (`identity.json` naming an edge agent): the tier service tiers a
/// broker's WALs and writes its lock file there, so another component's
/// directory is refused before anything is touched (README, "identities
/// that keep data with its owner"). A directory without the file passes:
/// the broker may not have run yet.
pub fn foreign_data_dir(data_dir: &std::path::Path) -> Option<String> {
    match broker_core::data_dir::stored_owner(data_dir)? {
        broker_core::data_dir::Owner::Broker { .. } => None,
        other => Some(format!(
            "data_dir: {} belongs to {other} ({}); the tier service works in a broker's data \
             directory (the broker's data_dir); nothing was touched",
            data_dir.display(),
            broker_core::data_dir::identity_path(data_dir).display()
        )),
    }
}

/// # Errors
/// Start-up errors (configuration, bucket, lock, an archive prefix owned
/// by another cluster or a damaged owner object, see [`crate::owner`]). Errors inside passes are
/// logged and reported in the [`RunReport`], and the next pass retries.
pub async fn run(
    config: TierConfig,
    faults: Faults,
    once: bool,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<RunReport, TierError> {
    if let Some(why) = foreign_data_dir(&config.data_dir) {
        return Err(TierError::Config(why));
    }
    let tiering = build(&config, faults)?;
    let lock = DataDirLock::acquire(&config.data_dir)?;
    info!(
        data_dir = %config.data_dir.display(),
        bucket = tiering.bucket.description(),
        broker = config.broker.url,
        lock = %lock.path().display(),
        once,
        "tier service started"
    );
    // Before anything reads, writes or deletes an object: the prefix must
    // be this cluster's (or unclaimed, then it is claimed). A refusal
    // stops the service with the bucket untouched.
    crate::owner::claim_prefix(&tiering).await?;
    // systemd (`Type=notify`, `WatchdogSec`): ready once the bucket, the
    // broker client, the lock and the prefix's owner are in place;
    // reconciliation may take long.
    broker_core::service::notify_ready();
    let watchdog = tokio::spawn(broker_core::service::watchdog_loop());
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        broker_core::service::notify_stopping();
        let _ = stop_tx.send(true);
    });
    let mut report = RunReport {
        reconcile: reconcile(&tiering).await,
        passes: Vec::new(),
        audits: Vec::new(),
    };
    crate::metrics::STATS.configure(
        config.audit.upload_stall_after_ms,
        u64::try_from(crate::tiering::now_ms()).unwrap_or(0),
    );
    crate::metrics::STATS.on_reconcile(&report.reconcile);
    let r = &report.reconcile;
    info!(
        topics = r.topics,
        adopted = r.adopted.len(),
        deleted = r.deleted.len(),
        reuploaded = r.reuploaded.len(),
        missing = r.missing.len(),
        staging_removed = r.staging_removed,
        errors = r.errors.len(),
        "reconciliation done"
    );
    let poll = Duration::from_millis(config.poll_interval_ms);
    let audit_every = Duration::from_millis(config.audit.interval_ms);
    let mut next_audit = std::time::Instant::now();
    let mut last_errors: std::collections::HashMap<String, String> =
        std::collections::HashMap::new();
    loop {
        let pass = tiering.run_pass(&stop_rx).await;
        // The archive audit, between passes (never concurrent with an
        // upload), every `[audit] interval_ms`.
        if std::time::Instant::now() >= next_audit {
            let audit = crate::audit::audit(&tiering).await;
            crate::metrics::STATS.on_audit(&audit);
            if !audit.reuploaded.is_empty() || !audit.lost.is_empty() || !audit.errors.is_empty() {
                info!(
                    topics = audit.topics,
                    checked = audit.checked,
                    reuploaded = audit.reuploaded.len(),
                    lost = audit.lost.len(),
                    errors = audit.errors.len(),
                    "archive audit done"
                );
            }
            keep_last(&mut report.audits, audit);
            next_audit = std::time::Instant::now() + audit_every;
        }
        if pass.committed > 0 || !pass.errors.is_empty() {
            info!(
                topics = pass.topics,
                committed = pass.committed,
                uploaded_bytes = pass.uploaded_bytes,
                trimmed = pass.trimmed_segments,
                errors = pass.errors.len(),
                "pass done"
            );
        }
        // A refusal that repeats every pass is logged once, again when it
        // changes, and "resolved" when the topic's pass succeeds again.
        for (topic, e) in &pass.errors {
            if last_errors.get(topic) != Some(e) {
                error!(
                    topic,
                    error = e,
                    "tiering of this topic failed; retried every pass"
                );
            }
        }
        let failing: std::collections::HashMap<String, String> =
            pass.errors.iter().cloned().collect();
        for topic in last_errors.keys() {
            if !failing.contains_key(topic) {
                info!(topic, "tiering of this topic no longer fails");
            }
        }
        last_errors = failing;
        crate::metrics::STATS.on_pass(&pass);
        keep_last(&mut report.passes, pass);
        if once || *stop_rx.borrow() {
            break;
        }
        let mut rx = stop_rx.clone();
        tokio::select! {
            () = tokio::time::sleep(poll) => {}
            _ = rx.changed() => {}
        }
        if *stop_rx.borrow() {
            break;
        }
    }
    watchdog.abort();
    info!("tier service stopped");
    Ok(report)
}
