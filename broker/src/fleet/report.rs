//! The fleet reporter: writes this broker's edge entries to Raft at
//! `/fleet/edges/{edge_id}/{broker_id}` (what [`super::Fleet::due`] says
//! is due): connection changes [`super::EVENT_DELAY`] after they happen,
//! the rest every `report_interval_ms`. At start-up it first takes in the
//! entries an earlier process of this broker left ([`super::Fleet::adopt`]),
//! and rewrites those that still claim a connection as ended.

use std::sync::Arc;
use std::time::Duration;

use broker_core::metadata::{MetadataStore, Txn};
use tracing::{debug, info, warn};
use tributary_proto::fleet::EdgeEntry;
use tributary_proto::keys::{MetadataKey, NamespaceName, fleet as keys};

use super::Fleet;

/// Entries per Raft transaction.
const ENTRIES_PER_TXN: usize = 256;
/// Wait before writing again after a failed write (no Raft leader).
const RETRY: Duration = Duration::from_secs(1);

/// Runs the reporter until the task is aborted.
pub async fn run(fleet: Arc<Fleet>, store: Arc<dyn MetadataStore>) {
    adopt_own(&fleet, store.as_ref()).await;
    let interval = Duration::from_millis(fleet.config().report_interval_ms);
    let mut periodic_at = tokio::time::Instant::now() + interval;
    let mut retry_at: Option<tokio::time::Instant> = None;
    let mut failing = false;
    loop {
        let periodic = tokio::select! {
            () = fleet.changes() => {
                tokio::time::sleep(super::EVENT_DELAY).await;
                false
            }
            () = tokio::time::sleep_until(periodic_at) => {
                periodic_at = tokio::time::Instant::now() + interval;
                true
            }
            () = async {
                match retry_at {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            } => false,
        };
        match write(&fleet, store.as_ref(), periodic).await {
            Ok(written) => {
                retry_at = None;
                if failing {
                    info!(written, "edge entries written to the metadata store again");
                    failing = false;
                }
            }
            Err(e) => {
                retry_at = Some(tokio::time::Instant::now() + RETRY);
                if !failing {
                    warn!(error = %e, "writing edge entries failed; retrying every second (logged again once it works)");
                    failing = true;
                }
            }
        }
    }
}

/// Writes the connection changes not written yet (at shutdown, after
/// [`Fleet::close_all`]).
///
/// # Errors
/// The metadata store's.
pub async fn flush(
    fleet: &Fleet,
    store: &dyn MetadataStore,
) -> Result<usize, broker_core::metadata::MetadataError> {
    write(fleet, store, false).await
}

/// Writes what is due; the number of entries written.
async fn write(
    fleet: &Fleet,
    store: &dyn MetadataStore,
    periodic: bool,
) -> Result<usize, broker_core::metadata::MetadataError> {
    let due = fleet.due(periodic);
    let mut written = 0;
    let mut rest = due;
    while !rest.is_empty() {
        let tail = rest.split_off(rest.len().min(ENTRIES_PER_TXN));
        let chunk = std::mem::replace(&mut rest, tail);
        let mut txn = Txn::new();
        for (edge, entry, _) in &chunk {
            let Ok(edge) = NamespaceName::new(edge) else {
                // Edge ids are namespace names (the ingest endpoint checks
                // every stream's namespace against it); never here.
                debug!(edge, "skipping an edge id that is not a valid name");
                continue;
            };
            let value = serde_json::to_value(entry).unwrap_or_default();
            txn = txn.put(keys::edge_entry(&edge, fleet.me()), value);
        }
        // No preconditions: a transaction of plain puts always applies.
        let _ = store.txn(txn).await?;
        written += chunk.len();
        fleet.written(chunk);
    }
    Ok(written)
}

/// Takes in this broker's entries left by an earlier process, retrying
/// every second until the metadata store answers.
async fn adopt_own(fleet: &Fleet, store: &dyn MetadataStore) {
    let entries = loop {
        match store.list(&keys::edges_prefix()).await {
            Ok(entries) => break entries,
            Err(e) => {
                debug!(error = %e, "listing edge entries failed; retrying");
                tokio::time::sleep(RETRY).await;
            }
        }
    };
    let mut adopted = 0usize;
    for (key, value) in entries {
        let Ok(MetadataKey::FleetEdge { edge, broker_id }) = MetadataKey::parse(&key) else {
            continue;
        };
        if broker_id != fleet.me() {
            continue;
        }
        match serde_json::from_value::<EdgeEntry>(value) {
            Ok(entry) => {
                fleet.adopt(edge.as_str(), &entry);
                adopted += 1;
            }
            Err(e) => warn!(key, error = %e, "ignoring an edge entry that does not decode"),
        }
    }
    if adopted > 0 {
        debug!(adopted, "edge entries of an earlier process taken in");
    }
}
