//! The audit log: one record per admin action (the routes the permission
//! table marks `audited`), refused ones included, appended to this
//! broker's central topic `/_system/audit-broker-{node_id}` (intent
//! `audit_log`, created at start-up if absent), so it is archived like any
//! other topic.
//!
//! Per broker because, until topics have one leader across the cluster,
//! each broker owns its local WALs: two brokers appending to one topic
//! would write diverging logs under the same offsets.
//!
//! Record: key = the principal's name, value = JSON [`AuditRecord`]; never a
//! token or a request body. The append happens after the response is
//! built, off the request path, through a bounded queue: the action has
//! already been committed (or refused) when the record is written, so a
//! failed append cannot undo it; it is logged and counted
//! (`tributary_broker_audit_failures_total`) instead of failing the
//! request. A full queue counts as a failure too.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use broker_core::catalog::{Catalog, CatalogError, TopicSpec};
use broker_core::metadata::MetadataStore;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tributary_proto::Record;
use tributary_proto::intent::StreamIntent;
use tributary_proto::keys::{NameError, TopicName};

use crate::replication::topics::TopicStore;

/// How many records may wait for their append before new ones are dropped
/// (and counted as failures).
pub const AUDIT_QUEUE: usize = 4096;

/// One audit record (the JSON value of a record of the audit topic).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditRecord {
    /// When the response was built, ms since the Unix epoch.
    pub at_ms: u64,
    /// The principal's name; `anonymous` when no credential was presented,
    /// the name inside a presented but unknown named token otherwise
    /// (`unknown` if none parses).
    pub principal: String,
    /// `token`, `certificate`, `bootstrap` or `unknown` (not authenticated).
    pub principal_kind: String,
    /// Method and path as sent, e.g. `POST /v1/topics`.
    pub action: String,
    /// The route template, e.g. `/v1/topics/{namespace}/{topic}`.
    pub route: String,
    /// The namespace acted on, when the request names one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// The topic acted on (after the namespace), when named.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic: Option<String>,
    /// What the action named besides a topic, set by the handler: the
    /// principal created (`principal tier-1 (token)`), the binding granted
    /// (`binding <id>: tier-1 role tier on namespace plant1`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// The HTTP status answered.
    pub status: u16,
    /// `ok` (2xx), `refused` (401/403) or `failed` (anything else).
    pub outcome: String,
    /// For a refusal: `unauthorized` or `forbidden`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
}

/// A response extension a handler sets to name what it acted on (see
/// [`AuditRecord::target`]); the guard copies it into the audit record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditTarget(pub String);

/// Counters of the audit log, process-wide.
#[derive(Debug)]
pub struct AuditStats {
    appended: AtomicU64,
    failures: AtomicU64,
}

impl AuditStats {
    /// (records appended, records lost) so far.
    pub fn snapshot(&self) -> (u64, u64) {
        (
            self.appended.load(Ordering::Relaxed),
            self.failures.load(Ordering::Relaxed),
        )
    }
}

/// The audit counters of this process.
pub static AUDIT: AuditStats = AuditStats {
    appended: AtomicU64::new(0),
    failures: AtomicU64::new(0),
};

/// True for an audit topic (`/_system/audit-broker-{id}`) given as
/// namespace and topic. The guard does not audit the tier service's
/// successful storage calls on these topics: each would append a record to
/// the topic whose archiving it is, so an idle broker would seal, archive
/// and audit one segment per `segment_max_age_ms` forever.
pub fn is_audit_topic(namespace: Option<&str>, topic: Option<&str>) -> bool {
    namespace == Some(AUDIT_NAMESPACE) && topic.is_some_and(|t| t.starts_with("audit-broker-"))
}

/// The namespace of the audit topics.
pub const AUDIT_NAMESPACE: &str = "_system";

/// The audit topic of broker `node_id`: `/_system/audit-broker-{node_id}`.
///
/// # Errors
/// Never for a `u64` id (the name rules hold); typed for the caller.
pub fn audit_topic(node_id: u64) -> Result<TopicName, NameError> {
    TopicName::new(&format!("/_system/audit-broker-{node_id}"))
}

/// Where the guard sends audit records.
#[derive(Debug, Clone)]
pub struct AuditSink {
    tx: mpsc::Sender<AuditRecord>,
}

impl AuditSink {
    /// Starts the task that creates `topic` (intent `audit_log`, not
    /// partitioned) if absent, retrying every second until the catalog
    /// accepts it (a cluster without a leader yet), then appends queued
    /// records to it. Records queue (up to [`AUDIT_QUEUE`]) meanwhile, so
    /// start-up never waits for the metadata store.
    pub fn spawn(
        store: Arc<dyn MetadataStore>,
        topics: Arc<TopicStore>,
        topic: TopicName,
    ) -> (AuditSink, tokio::task::JoinHandle<()>) {
        let (tx, mut rx) = mpsc::channel::<AuditRecord>(AUDIT_QUEUE);
        let task = tokio::spawn(async move {
            if let Err(error) = ensure_topic(&*store, &topic).await {
                tracing::error!(%error, %topic, "audit log: invalid audit topic");
                return;
            }
            let mut pending = Vec::new();
            while rx.recv_many(&mut pending, 256).await > 0 {
                let count = pending.len() as u64;
                let records = pending.drain(..).map(to_record).collect();
                match topics.append_central(&topic, records, false).await {
                    Ok(_) => {
                        AUDIT.appended.fetch_add(count, Ordering::Relaxed);
                    }
                    Err(error) => {
                        AUDIT.failures.fetch_add(count, Ordering::Relaxed);
                        tracing::error!(%error, %topic, lost = count, "audit log: append failed");
                    }
                }
            }
        });
        (AuditSink { tx }, task)
    }

    /// Queues `record` without waiting; a full queue drops it (logged,
    /// counted).
    pub fn record(&self, record: AuditRecord) {
        if self.tx.try_send(record).is_err() {
            AUDIT.failures.fetch_add(1, Ordering::Relaxed);
            tracing::error!("audit log: queue full or closed, record dropped");
        }
    }
}

/// Creates the audit topic if absent, retrying transient failures every
/// second.
///
/// # Errors
/// Only a spec error (which retrying cannot fix).
async fn ensure_topic(store: &dyn MetadataStore, topic: &TopicName) -> Result<(), CatalogError> {
    let spec = TopicSpec::new(topic.clone(), StreamIntent::AuditLog, 0)?;
    loop {
        match Catalog::new(store).create_topic(&spec).await {
            Ok(_) => return Ok(()),
            Err(error) => {
                tracing::warn!(%error, %topic, "audit log: cannot create the audit topic yet; retrying");
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
        }
    }
}

fn to_record(record: AuditRecord) -> Record {
    // Serializing this struct cannot fail.
    let value = serde_json::to_vec(&record).unwrap_or_default();
    Record {
        timestamp_ms: i64::try_from(record.at_ms).unwrap_or(i64::MAX),
        key: Some(Bytes::from(record.principal.into_bytes())),
        headers: Vec::new(),
        value: Bytes::from(value),
    }
}
