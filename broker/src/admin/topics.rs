//! Namespace and topic endpoints: `GET/POST /v1/namespaces`, `GET/POST
//! /v1/topics`, `GET/DELETE /v1/topics/{ns}/{topic}`, over
//! [`broker_core::catalog::Catalog`].

use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use broker_core::catalog::{Catalog, TopicSpec};
use serde::Deserialize;
use serde_json::json;
use tributary_proto::keys::NamespaceName;

use super::{AdminState, status_of, topic_from_path};
use crate::http::{ApiError, ApiResult, ok, parse_json, query};

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
    let outcome = Catalog::new(&*state.store).create_topic(&spec).await?;
    ok(status_of(outcome.action), outcome)
}

pub(super) async fn describe_topic(
    State(state): State<AdminState>,
    Path((namespace, topic)): Path<(String, String)>,
) -> ApiResult {
    let topic = topic_from_path(&namespace, &topic)?;
    let candidates: Vec<u64> = state.cluster.status().members.keys().copied().collect();
    let description = Catalog::new(&*state.store)
        .describe(&topic, &candidates)
        .await?;
    ok(StatusCode::OK, description)
}

pub(super) async fn delete_topic(
    State(state): State<AdminState>,
    Path((namespace, topic)): Path<(String, String)>,
) -> ApiResult {
    let topic = topic_from_path(&namespace, &topic)?;
    let outcome = Catalog::new(&*state.store).delete_topic(&topic).await?;
    ok(StatusCode::OK, outcome)
}
