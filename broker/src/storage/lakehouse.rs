//! `PUT /v1/storage/topics/{ns}/{topic}/lakehouse`: the tier service's
//! lakehouse writer records its progress in Raft
//! (`{prefix}/storage/topics/{ns}/{topic}/lakehouse`).
//!
//! Body `{"next_offset": N, "layout": L}`: every record of the committed
//! segments below `N` is in the topic's Parquet files, written with layout
//! `L` (the writer's description of its columns). The broker keeps the
//! rules that make a crash anywhere repairable by redoing:
//! - progress only rises (a lower `next_offset` is `409 lakehouse_regress`;
//!   the same one is `200 unchanged`), and never passes the committed
//!   tiered offset (`409 beyond_archive`): no file claims records the
//!   archive does not hold;
//! - the layout, once recorded, is fixed (`409 layout_fixed`): every file
//!   of a topic has the same columns;
//! - on a cluster the write is fenced by the topic's ownership epoch like a
//!   descriptor commit (`409 not_owner`).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Extension, Path, Query, State};
use axum::http::StatusCode;
use broker_core::metadata::TxnOutcome;
use serde::Deserialize;
use serde_json::{Value, json};

use super::commit::{check_fence, fenced};
use super::http::{PrefixQuery, storage_keys};
use super::{StorageError, tiered_state};
use crate::admin::{AdminState, topic_from_path};
use crate::cluster::Cluster;
use crate::http::owner_route::fence_for;
use crate::http::{ApiError, ApiResult, ok, parse_json};

/// Attempts of the compare-and-set before `contended`.
const ATTEMPTS: usize = 5;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Progress {
    next_offset: u64,
    #[serde(default)]
    layout: Value,
}

fn refused(kind: &'static str, message: String) -> ApiError {
    StorageError::Refused { kind, message }.into()
}

pub(super) async fn put_progress(
    State(state): State<AdminState>,
    cluster: Option<Extension<Arc<Cluster>>>,
    Path((namespace, topic)): Path<(String, String)>,
    params: Result<Query<PrefixQuery>, QueryRejection>,
    body: Bytes,
) -> ApiResult {
    let topic = topic_from_path(&namespace, &topic)?;
    let keys = storage_keys(params)?;
    let progress: Progress = parse_json(&body)?;
    let cluster = cluster.map(|Extension(c)| c);
    let fence = fence_for(cluster.as_ref(), &topic)?;
    let key = keys.lakehouse(&topic);
    let value = json!({ "next_offset": progress.next_offset, "layout": progress.layout });
    for _ in 0..ATTEMPTS {
        let tiered = tiered_state(&*state.store, &keys, &topic).await?;
        if tiered
            .tiered_offset
            .is_none_or(|t| progress.next_offset > t)
        {
            return Err(refused(
                "beyond_archive",
                format!(
                    "lakehouse progress {} of {topic} passes the committed tiered offset {:?}",
                    progress.next_offset, tiered.tiered_offset
                ),
            ));
        }
        let old = state.store.get(&key).await.map_err(StorageError::from)?;
        if let Some(old) = &old {
            let old_next = old["next_offset"].as_u64().unwrap_or(0);
            if !old["layout"].is_null() && old["layout"] != progress.layout {
                return Err(refused(
                    "layout_fixed",
                    format!(
                        "the lakehouse layout of {topic} is fixed: {}",
                        old["layout"]
                    ),
                ));
            }
            if progress.next_offset < old_next {
                return Err(refused(
                    "lakehouse_regress",
                    format!(
                        "lakehouse progress of {topic} is {old_next}; {} would go back",
                        progress.next_offset
                    ),
                ));
            }
            if progress.next_offset == old_next && old["layout"] == progress.layout {
                return ok(
                    StatusCode::OK,
                    json!({ "outcome": "unchanged", "progress": old }),
                );
            }
        }
        let txn = match &old {
            Some(old) => fenced(fence.as_ref()).when_equals(key.clone(), old.clone()),
            None => fenced(fence.as_ref()).when_absent(key.clone()),
        }
        .put(key.clone(), value.clone());
        match state.store.txn(txn).await.map_err(StorageError::from)? {
            TxnOutcome::Applied => {
                return ok(
                    StatusCode::OK,
                    json!({ "outcome": "committed", "progress": value }),
                );
            }
            TxnOutcome::ConditionFailed { key: failed, .. } => {
                check_fence(fence.as_ref(), &failed, &topic)?;
            }
        }
    }
    Err(StorageError::Contended.into())
}
