//! Topic-scoped requests go to the topic's owner ([`crate::cluster::Cluster::route`]).
//!
//! A route layer ([`owner_route`]) in front of the consumer API, the admin
//! endpoints that read or write a topic's data (`skip-damaged`) and the
//! storage API. For a request about topic `/{ns}/{topic}`:
//! - the topic is owned here with a fresh lease (`Local { epoch }`): the
//!   request passes, carrying [`OwnerEpoch`] for the handlers that fence
//!   their central writes with it;
//! - another live broker owns it (`Remote`): `307 Temporary Redirect` with
//!   `Location: {owner.admin_url}{path}?{query}` and
//!   `{"error", "kind": "not_owner", "owner", "epoch", "owner_url"}`; the
//!   storage API (the tier service beside this broker, which must commit
//!   through its own broker) answers `409 not_owner` with the same body
//!   instead;
//! - nobody serves it now (`Unassigned`): `503 no_owner` with
//!   `Retry-After: 1`. A topic of the catalog that has no owner and is not
//!   queued is first put in the unassigned queue (preferring this broker
//!   for a central publish), and the request waits up to
//!   [`PLACEMENT_WAIT`] for the load manager.
//!
//! Without the `Extension<Arc<Cluster>>` (a single broker, the in-process
//! tests) every topic is local, as before ownership existed.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{MatchedPath, Request};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use broker_core::catalog::{Catalog, CatalogError};
use broker_core::metadata::{MetadataStore, Precondition};
use serde_json::json;
use tributary_proto::keys::TopicName;

use super::ApiError;
use crate::cluster::{Cluster, Route};

/// How long a request for a topic without an owner waits for the load
/// manager to assign it before `503 no_owner`.
pub const PLACEMENT_WAIT: Duration = Duration::from_secs(3);

/// The ownership epoch of a topic owned here, put in the request's
/// extensions by [`owner_route`] for a `Local` route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OwnerEpoch(pub u64);

/// How a route answers for a topic owned elsewhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Answer {
    /// `307` to the owner (consumer and admin APIs).
    Redirect,
    /// `409 not_owner` (the storage API).
    Conflict,
}

/// Whether (and how) `method template` is routed to the owner: `None`
/// for requests answered from Raft on any broker (describe, delete,
/// failure policies, listing segment descriptors).
pub(crate) fn answer_for(method: &str, template: &str) -> Option<Answer> {
    const TOPIC: &str = "/v1/topics/{namespace}/{topic}";
    if let Some(rest) = template.strip_prefix("/v1/storage/topics/{namespace}/{topic}") {
        // Listing descriptors is a Raft read (tribctl archive, and the tier
        // service learns ownership from its `owner` fields).
        return (!(method == "GET" && rest == "/segments")).then_some(Answer::Conflict);
    }
    let rest = template.strip_prefix(TOPIC)?;
    if rest.is_empty() || rest == "/move" || rest.ends_with("/failure-policy") {
        return None;
    }
    Some(Answer::Redirect)
}

/// The `{namespace}` and `{topic}` segments of `path` matched by
/// `template`.
fn topic_of(template: &str, path: &str) -> Option<TopicName> {
    let mut namespace = None;
    let mut topic = None;
    for (t, p) in template.split('/').zip(path.split('/')) {
        match t {
            "{namespace}" => namespace = Some(p),
            "{topic}" => topic = Some(p),
            _ => {}
        }
    }
    TopicName::new(&format!("/{}/{}", namespace?, topic?)).ok()
}

/// The `not_owner` body and status for `topic` owned by `owner`.
fn not_owner(answer: Answer, topic: &TopicName, owner: &crate::cluster::Owner) -> ApiError {
    let status = match answer {
        Answer::Redirect => StatusCode::TEMPORARY_REDIRECT,
        Answer::Conflict => StatusCode::CONFLICT,
    };
    ApiError::new(
        status,
        "not_owner",
        format!(
            "topic {topic} is owned by broker {} (epoch {})",
            owner.broker_id, owner.epoch
        ),
    )
    .with("owner", json!(owner.broker_id))
    .with("epoch", json!(owner.epoch))
    .with("owner_url", json!(owner.admin_url))
}

/// `503 no_owner` with `Retry-After: 1`.
fn no_owner(reason: &str) -> Response {
    let mut response =
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "no_owner", reason).into_response();
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    response
}

/// The route of `topic`, placing a catalog topic nobody owns or queued
/// yet and waiting up to [`PLACEMENT_WAIT`] for its owner.
pub(crate) async fn route_placing(
    cluster: &Cluster,
    store: &dyn MetadataStore,
    topic: &TopicName,
    prefer_me: bool,
) -> Route {
    let route = cluster.route(topic);
    if !matches!(route, Route::Unassigned { .. }) || cluster.owner(topic).is_some() {
        return route;
    }
    // Only topics that exist: a request for an unknown topic must not
    // create an ownership entry (the handler answers 404).
    if Catalog::new(store).load_settings(topic).await.is_err() {
        return route;
    }
    let prefer = prefer_me.then(|| cluster.me());
    if let Err(error) = cluster.ensure_placed(topic, prefer, "first_request").await {
        tracing::warn!(%topic, %error, "cannot queue the topic for an owner");
        return route;
    }
    cluster.wait_route(topic, PLACEMENT_WAIT).await
}

/// The route layer described in the module doc; state: the metadata store
/// (to check that a topic without an owner exists before placing it).
pub(crate) async fn owner_route(
    axum::extract::State(store): axum::extract::State<Arc<dyn MetadataStore>>,
    mut request: Request,
    next: Next,
) -> Response {
    let Some(cluster) = request.extensions().get::<Arc<Cluster>>().cloned() else {
        return next.run(request).await;
    };
    let template = request
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_default();
    let method = request.method().as_str().to_owned();
    let Some(answer) = answer_for(&method, &template) else {
        return next.run(request).await;
    };
    // The original URI: inside the nested `/v1` router the prefix is gone.
    let uri = request
        .extensions()
        .get::<axum::extract::OriginalUri>()
        .map_or_else(|| request.uri().clone(), |u| u.0.clone());
    let Some(topic) = topic_of(&template, uri.path()) else {
        // Bad names: the handler answers 400 naming the field.
        return next.run(request).await;
    };
    let publish = method == "POST" && template.ends_with("/records");
    match route_placing(&cluster, &*store, &topic, publish).await {
        Route::Local { epoch } => {
            request.extensions_mut().insert(OwnerEpoch(epoch));
            next.run(request).await
        }
        Route::Remote(owner) => {
            let mut response = not_owner(answer, &topic, &owner).into_response();
            if answer == Answer::Redirect {
                let query = uri.query().map(|q| format!("?{q}")).unwrap_or_default();
                let location = format!(
                    "{}{}{query}",
                    owner.admin_url.trim_end_matches('/'),
                    uri.path()
                );
                match HeaderValue::from_str(&location) {
                    Ok(value) => {
                        response.headers_mut().insert(header::LOCATION, value);
                    }
                    Err(_) => {
                        tracing::error!(%topic, owner = owner.broker_id, admin_url = %owner.admin_url, "owner's admin URL is not a valid header value");
                        return no_owner(&format!(
                            "topic {topic} is owned by broker {} whose admin URL is unusable",
                            owner.broker_id
                        ));
                    }
                }
            }
            tracing::debug!(%topic, owner = owner.broker_id, epoch = owner.epoch, "request for a topic owned elsewhere");
            super::drain_body(request).await;
            response
        }
        Route::Unassigned { reason } => {
            // A topic that does not exist has no owner to wait for: the
            // handler answers 404 (it was a `503 no_owner` with
            // `Retry-After: 1`, for ever).
            let missing = matches!(
                Catalog::new(&*store).load_settings(&topic).await,
                Err(CatalogError::TopicNotFound { .. })
            );
            if missing {
                return next.run(request).await;
            }
            super::drain_body(request).await;
            no_owner(&reason)
        }
    }
}

/// The fence of a central write to `topic` from a handler: `Ok(None)`
/// without a cluster (single broker), the owner's precondition when this
/// broker owns `topic` now, else a `409 not_owner` / `503 no_owner`
/// error as the storage API answers.
///
/// # Errors
/// The refusal as an [`ApiError`].
pub(crate) fn fence_for(
    cluster: Option<&Arc<Cluster>>,
    topic: &TopicName,
) -> Result<Option<Precondition>, ApiError> {
    let Some(cluster) = cluster else {
        return Ok(None);
    };
    match cluster.route(topic) {
        Route::Local { epoch } => cluster.fence(topic, epoch).map(Some).ok_or_else(|| {
            ApiError::new(
                StatusCode::CONFLICT,
                "not_owner",
                format!("broker {} no longer owns {topic}", cluster.me()),
            )
        }),
        Route::Remote(owner) => Err(not_owner(Answer::Conflict, topic, &owner)),
        Route::Unassigned { reason } => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "no_owner",
            reason,
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routed_templates() {
        let sub = "/v1/topics/{namespace}/{topic}/subscriptions/{subscription}";
        assert_eq!(
            answer_for("GET", "/v1/topics/{namespace}/{topic}/records"),
            Some(Answer::Redirect)
        );
        assert_eq!(
            answer_for("POST", &format!("{sub}/receive")),
            Some(Answer::Redirect)
        );
        assert_eq!(answer_for("GET", sub), Some(Answer::Redirect));
        assert_eq!(answer_for("GET", "/v1/topics/{namespace}/{topic}"), None);
        assert_eq!(answer_for("DELETE", "/v1/topics/{namespace}/{topic}"), None);
        assert_eq!(answer_for("PUT", &format!("{sub}/failure-policy")), None);
        assert_eq!(
            answer_for("POST", "/v1/storage/topics/{namespace}/{topic}/trim"),
            Some(Answer::Conflict)
        );
        assert_eq!(
            answer_for("GET", "/v1/storage/topics/{namespace}/{topic}/segments"),
            None
        );
        assert_eq!(answer_for("GET", "/v1/namespaces"), None);
    }

    #[test]
    fn topic_from_template_and_path() {
        let t = topic_of(
            "/v1/topics/{namespace}/{topic}/subscriptions/{subscription}/ack",
            "/v1/topics/agents/jobs/subscriptions/s/ack",
        );
        assert_eq!(t, Some(TopicName::new("/agents/jobs").unwrap()));
        assert_eq!(topic_of("/v1/namespaces", "/v1/namespaces"), None);
    }
}
