//! Topic ownership in the admin API: `brokers` of `GET /v1/cluster/status`,
//! `POST /v1/topics/{ns}/{topic}/move` ([`Cluster::move_topic`]) and `POST
//! /v1/cluster/rebalance` ([`Cluster::rebalance`]). Without the
//! `Extension<Arc<Cluster>>` (a broker without ownership, the in-process
//! tests) the status has no `brokers` and the two writes answer `501
//! not_supported`.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Extension, Path};
use axum::http::StatusCode;
use serde_json::json;
use tributary_api::cluster::{
    BrokerView, DEFAULT_MAX_MOVES, MoveRequest, MoveResponse, PlannedMove, RebalanceRequest,
    RebalanceResponse,
};
use tributary_proto::cluster::BrokerLifecycle;
use tributary_proto::cluster::placement::MoveError;

use super::topic_from_path;
use crate::cluster::{Cluster, ClusterError};
use crate::http::{ApiError, ApiResult, ok, parse_json};

/// The brokers of `cluster` as the status shows them.
pub(super) fn brokers(cluster: &Cluster) -> Vec<BrokerView> {
    cluster
        .brokers()
        .into_iter()
        .map(|b| BrokerView {
            broker_id: b.broker_id,
            ingest_addr: b.ingest_addr,
            admin_url: b.admin_url,
            live: b.live,
            lifecycle: match b.lifecycle {
                BrokerLifecycle::Active => "active",
                BrokerLifecycle::Draining => "draining",
            }
            .to_owned(),
            lease_age_ms: b.lease_age_ms,
            topics_owned: b.topics_owned,
            bytes_in_per_s: b.bytes_in_per_s,
        })
        .collect()
}

fn cluster_of(cluster: Option<Extension<Arc<Cluster>>>) -> Result<Arc<Cluster>, ApiError> {
    cluster.map(|Extension(c)| c).ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_IMPLEMENTED,
            "not_supported",
            "this broker runs without topic ownership (no cluster)",
        )
    })
}

/// Ownership errors as responses: `409` with the rule's kind
/// (`not_assigned`, `target_not_live`, `already_there`, `pinned`,
/// `contended`), `500 internal` for metadata failures.
fn cluster_error(err: ClusterError) -> ApiError {
    let message = err.to_string();
    let kind = match &err {
        ClusterError::Move(MoveError::NotAssigned(_)) => "not_assigned",
        ClusterError::Move(MoveError::TargetNotLive(_)) => "target_not_live",
        ClusterError::Move(MoveError::AlreadyThere { .. }) => "already_there",
        ClusterError::Move(MoveError::Pinned { .. }) => "pinned",
        ClusterError::Move(_) => "move_refused",
        ClusterError::Contended(_) => "contended",
        ClusterError::CentralWritten(_) => "central_written",
        ClusterError::TopicNotFound(_) => {
            return ApiError::new(StatusCode::NOT_FOUND, "not_found", message);
        }
        _ => {
            tracing::error!(error = %err, "admin API: ownership change failed");
            return ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message);
        }
    };
    ApiError::new(StatusCode::CONFLICT, kind, message)
}

/// `POST /v1/topics/{ns}/{topic}/move {"to": N}`: `200` [`MoveResponse`].
/// Answered by any broker. The owner first stores its subscriptions'
/// acknowledged progress (batched cursors), so consumers resume at the new
/// owner where they left off; elsewhere the old owner hands it over within
/// a tick of seeing the move.
pub(super) async fn move_topic(
    cluster: Option<Extension<Arc<Cluster>>>,
    consumers: Option<Extension<Arc<crate::consumer::ConsumerService>>>,
    Path((namespace, topic)): Path<(String, String)>,
    body: Bytes,
) -> ApiResult {
    let cluster = cluster_of(cluster)?;
    let topic = topic_from_path(&namespace, &topic)?;
    let request: MoveRequest = parse_json(&body)?;
    let change = cluster
        .check_move(&topic, request.to)
        .await
        .map_err(cluster_error)?;
    // Asked of the owner, the move first stores its subscriptions'
    // acknowledged progress; asked elsewhere, the old owner hands it over
    // within a tick once it sees the move (`ConsumerService::hand_off`).
    if let crate::cluster::Route::Local { .. } = cluster.route(&topic)
        && let Some(Extension(consumers)) = &consumers
    {
        consumers.persist_topic(&topic).await;
    }
    let from = cluster.owner(&topic).map(|(b, _)| b);
    let epoch = cluster.apply_move(&change).await.map_err(cluster_error)?;
    tracing::info!(%topic, from, to = request.to, epoch, "topic moved by an operator");
    ok(
        StatusCode::OK,
        MoveResponse {
            topic,
            from,
            to: request.to,
            epoch,
        },
    )
}

/// `POST /v1/cluster/rebalance {"dry_run", "max_moves"}`: `200`
/// [`RebalanceResponse`] (an empty body counts as `{}`).
pub(super) async fn rebalance(cluster: Option<Extension<Arc<Cluster>>>, body: Bytes) -> ApiResult {
    let cluster = cluster_of(cluster)?;
    let request: RebalanceRequest = if body.is_empty() {
        RebalanceRequest {
            dry_run: false,
            max_moves: None,
        }
    } else {
        parse_json(&body)?
    };
    let max_moves = request.max_moves.unwrap_or(DEFAULT_MAX_MOVES);
    let changes = cluster
        .rebalance(request.dry_run, max_moves)
        .await
        .map_err(cluster_error)?;
    let moves: Vec<PlannedMove> = changes
        .into_iter()
        .map(|c| PlannedMove {
            from: c.previous_owner(),
            topic: c.topic,
            to: c.to,
            epoch: c.assignment.epoch,
            reason: c.assignment.reason,
        })
        .collect();
    tracing::info!(dry_run = request.dry_run, moves = moves.len(), "rebalance");
    ok(
        StatusCode::OK,
        json!(RebalanceResponse {
            dry_run: request.dry_run,
            moves,
        }),
    )
}
