//! Namespace and topic endpoints: `GET/POST /v1/namespaces`, `GET/POST
//! /v1/topics`, `GET/DELETE /v1/topics/{ns}/{topic}`, over
//! [`broker_core::catalog::Catalog`], and `POST
//! /v1/topics/{ns}/{topic}/skip-damaged` over the broker's damage service.

use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use std::sync::Arc;

use axum::Extension;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use broker_core::catalog::{Catalog, TopicSpec};
use serde::Deserialize;
use serde_json::json;
use tributary_proto::keys::NamespaceName;

use super::{AdminState, status_of, topic_from_path};
use crate::http::{ApiError, ApiResult, ok, parse_json, query};
use crate::replication::damage::{DamageService, SkipError, damaged_of};
use crate::replication::topics::TopicError;

pub(super) async fn list_namespaces(State(state): State<AdminState>) -> ApiResult {
    let namespaces = Catalog::new(&*state.store).list_namespaces().await?;
    ok(StatusCode::OK, json!({ "namespaces": namespaces }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateNamespaceRequest {
    name: String,
}

pub(super) async fn create_namespace(State(state): State<AdminState>, body: Bytes) -> ApiResult {
    let request: CreateNamespaceRequest = parse_json(&body)?;
    let namespace = NamespaceName::new(&request.name).map_err(|e| ApiError::name("name", e))?;
    super::refuse_system_namespace(namespace.as_str(), &format!("namespace {namespace}"))?;
    let action = Catalog::new(&*state.store)
        .create_namespace(&namespace)
        .await?;
    ok(
        status_of(action),
        json!({ "namespace": namespace, "action": action }),
    )
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ListTopicsQuery {
    namespace: Option<String>,
}

pub(super) async fn list_topics(
    State(state): State<AdminState>,
    params: Result<Query<ListTopicsQuery>, QueryRejection>,
) -> ApiResult {
    let params = query(params)?;
    let namespace = params
        .namespace
        .as_deref()
        .map(NamespaceName::new)
        .transpose()
        .map_err(|e| ApiError::name("namespace", e))?;
    let topics = Catalog::new(&*state.store)
        .list_topics(namespace.as_ref())
        .await?;
    ok(StatusCode::OK, json!({ "topics": topics }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateTopicRequest {
    name: String,
    intent: String,
    #[serde(default)]
    partitions: i64,
}

pub(super) async fn create_topic(State(state): State<AdminState>, body: Bytes) -> ApiResult {
    let request: CreateTopicRequest = parse_json(&body)?;
    let spec = TopicSpec::parse(&request.name, &request.intent, request.partitions)?;
    super::refuse_system_write(spec.name())?;
    let outcome = Catalog::new(&*state.store).create_topic(&spec).await?;
    ok(status_of(outcome.action), outcome)
}

/// The catalog's description, with `damaged_ranges` (the topic's damaged
/// ranges in this broker's WAL, empty when none or the topic is not open
/// here) and `holes` (declared and skipped holes from Raft).
pub(super) async fn describe_topic(
    State(state): State<AdminState>,
    damage: Option<Extension<Arc<DamageService>>>,
    cluster: Option<Extension<Arc<crate::cluster::Cluster>>>,
    Path((namespace, topic)): Path<(String, String)>,
) -> ApiResult {
    let topic = topic_from_path(&namespace, &topic)?;
    let candidates: Vec<u64> = state.cluster.status().members.keys().copied().collect();
    let mut description = Catalog::new(&*state.store)
        .describe(&topic, &candidates)
        .await?;
    // Any broker answers from Raft; the owner is this broker's view of
    // `/cluster/*` (kept by a watch), which also knows brokers that are
    // not Raft voters.
    if let Some(Extension(cluster)) = &cluster {
        let owner = cluster.owner(&topic);
        description.broker_id = owner.map(|(b, _)| b);
        description.epoch = owner.map(|(_, e)| e);
    }
    let mut value = serde_json::to_value(&description)
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()))?;
    if let (Some(Extension(damage)), Some(object)) = (damage, value.as_object_mut()) {
        let damaged = match damage.topics().get(&topic).await {
            Some(wal) => damaged_of(&topic, &wal),
            None => Vec::new(),
        };
        object.insert("damaged_ranges".into(), json!(damaged));
        let holes = damage.topics().holes(&topic).await.map_err(|e| {
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string())
        })?;
        object.insert("holes".into(), json!(holes));
    }
    ok(StatusCode::OK, value)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SkipDamagedRequest {
    first_offset: u64,
    end_offset: u64,
    #[serde(default)]
    reason: Option<String>,
}

/// `POST /v1/topics/{ns}/{topic}/skip-damaged`: an operator gives up on a
/// damaged range nothing can heal. `200 {"hole": HoleRecord}`; `409
/// not_damaged` (with `damaged_ranges`) unless the range is exactly one
/// damaged range of the topic; `404` for an unknown topic; `501` without
/// the broker's WALs.
pub(super) async fn skip_damaged(
    damage: Option<Extension<Arc<DamageService>>>,
    Path((namespace, topic)): Path<(String, String)>,
    body: Bytes,
) -> ApiResult {
    let topic = topic_from_path(&namespace, &topic)?;
    let request: SkipDamagedRequest = parse_json(&body)?;
    let Some(Extension(damage)) = damage else {
        return Err(ApiError::new(
            StatusCode::NOT_IMPLEMENTED,
            "not_supported",
            "this admin API has no access to the broker's WALs",
        ));
    };
    let reason = request.reason.unwrap_or_else(|| "no reason given".into());
    match damage
        .skip(&topic, request.first_offset, request.end_offset, &reason)
        .await
    {
        Ok(hole) => ok(StatusCode::OK, json!({ "hole": hole })),
        Err(ref e @ SkipError::NotDamaged { ref damaged, .. }) => {
            Err(
                ApiError::new(StatusCode::CONFLICT, "not_damaged", e.to_string())
                    .with("damaged_ranges", json!(damaged)),
            )
        }
        Err(SkipError::Topic(TopicError::Catalog(e))) => Err(e.into()),
        Err(e) => Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            e.to_string(),
        )),
    }
}

pub(super) async fn delete_topic(
    State(state): State<AdminState>,
    Path((namespace, topic)): Path<(String, String)>,
) -> ApiResult {
    let topic = topic_from_path(&namespace, &topic)?;
    super::refuse_system_write(&topic)?;
    // Read before the delete, which removes the writer marker with the
    // rest of the topic's keys.
    let edge_fed = crate::replication::topics::Writer::Edge
        .writes(state.store.as_ref(), &topic)
        .await
        .map_err(broker_core::catalog::CatalogError::from)?;
    let mut outcome = Catalog::new(&*state.store).delete_topic(&topic).await?;
    if edge_fed {
        outcome.edge_fed = true;
        outcome.note = Some(format!(
            "an edge replicates into {topic}: its stream is closed, and the edge's next contact creates the topic again with the edge's intent, its records at the same offsets; stop publishing to it at the edge to remove it for good"
        ));
    }
    ok(StatusCode::OK, outcome)
}
