//! Failure-policy endpoints (`GET`, `PUT`, `PATCH
//! /v1/topics/{ns}/{topic}/subscriptions/{sub}/failure-policy`) and the
//! partial update behind `PATCH`: [`FailurePolicyPatch`] applied with
//! [`patch_failure_policy`] on top of the catalog's read-modify-write.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use broker_core::catalog::{Catalog, CatalogError, validate_policy};
use serde::{Deserialize, Deserializer, Serialize};
use tributary_api::admin::FailurePolicyView;
use tributary_proto::intent::{BackoffStrategy, PoisonPolicy, SubscriptionFailurePolicy};
use tributary_proto::keys::{SubscriptionName, TopicName};

use super::{AdminState, topic_from_path};
use crate::http::{ApiError, ApiResult, ok, parse_json};

/// A partial failure policy: `None` fields keep their current value. For
/// `dead_letter_topic`, an absent field keeps it and JSON `null` clears it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FailurePolicyPatch {
    /// New `max_redelivery_count`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_redelivery_count: Option<u32>,
    /// New `ack_timeout_ms`, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ack_timeout_ms: Option<u64>,
    /// New `base_redelivery_delay_ms`, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_redelivery_delay_ms: Option<u64>,
    /// New `max_redelivery_delay_ms`, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_redelivery_delay_ms: Option<u64>,
    /// New `backoff_strategy`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff_strategy: Option<BackoffStrategy>,
    /// New `poison_policy`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub poison_policy: Option<PoisonPolicy>,
    /// `Some(Some(t))` sets, `Some(None)` clears, `None` keeps.
    #[serde(
        default,
        deserialize_with = "present_or_null",
        skip_serializing_if = "Option::is_none"
    )]
    pub dead_letter_topic: Option<Option<String>>,
}

fn present_or_null<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Option<String>>, D::Error> {
    Option::<String>::deserialize(d).map(Some)
}

impl FailurePolicyPatch {
    /// `policy` with the fields of this patch applied.
    pub fn apply_to(&self, policy: &SubscriptionFailurePolicy) -> SubscriptionFailurePolicy {
        SubscriptionFailurePolicy {
            max_redelivery_count: self
                .max_redelivery_count
                .unwrap_or(policy.max_redelivery_count),
            ack_timeout_ms: self.ack_timeout_ms.unwrap_or(policy.ack_timeout_ms),
            base_redelivery_delay_ms: self
                .base_redelivery_delay_ms
                .unwrap_or(policy.base_redelivery_delay_ms),
            max_redelivery_delay_ms: self
                .max_redelivery_delay_ms
                .unwrap_or(policy.max_redelivery_delay_ms),
            backoff_strategy: self.backoff_strategy.unwrap_or(policy.backoff_strategy),
            poison_policy: self.poison_policy.unwrap_or(policy.poison_policy),
            dead_letter_topic: match &self.dead_letter_topic {
                Some(topic) => topic.clone(),
                None => policy.dead_letter_topic.clone(),
            },
        }
    }
}

/// Applies `patch` to the current policy of `subscription` (stored, or
/// the one it would inherit) and stores the result; fields the patch
/// leaves out keep their current values.
///
/// # Errors
/// As [`Catalog::set_failure_policy`]: [`CatalogError::InvalidPolicy`] /
/// [`CatalogError::PolicyOutOfRange`] naming the field for a result that
/// does not validate; [`CatalogError::TopicNotFound`];
/// [`CatalogError::ConcurrentChange`]; [`CatalogError::Metadata`].
pub async fn patch_failure_policy(
    catalog: &Catalog<'_>,
    topic: &TopicName,
    subscription: &SubscriptionName,
    patch: &FailurePolicyPatch,
) -> Result<FailurePolicyView, CatalogError> {
    catalog
        .update_failure_policy(topic, subscription, |current| {
            let policy = patch.apply_to(current);
            validate_policy(&policy, topic)?;
            Ok(policy)
        })
        .await
}

fn policy_path(
    namespace: &str,
    topic: &str,
    subscription: &str,
) -> Result<(TopicName, SubscriptionName), ApiError> {
    let topic = topic_from_path(namespace, topic)?;
    let subscription =
        SubscriptionName::new(subscription).map_err(|e| ApiError::name("subscription", e))?;
    Ok((topic, subscription))
}

pub(super) async fn get_failure_policy(
    State(state): State<AdminState>,
    Path((namespace, topic, subscription)): Path<(String, String, String)>,
) -> ApiResult {
    let (topic, subscription) = policy_path(&namespace, &topic, &subscription)?;
    let view = Catalog::new(&*state.store)
        .failure_policy(&topic, &subscription)
        .await?;
    ok(StatusCode::OK, view)
}

/// Refuses a dead-letter topic an edge replicates into (`409
/// writer_conflict`): dead-letter copies are central writes, which such a
/// topic refuses (its edge assigns the offsets), so the subscription
/// would stall at its first poison message, retrying the copy for ever.
async fn refuse_edge_fed_dead_letter(
    state: &AdminState,
    dead_letter_topic: Option<&str>,
) -> Result<(), ApiError> {
    let Some(name) = dead_letter_topic else {
        return Ok(());
    };
    // A malformed name is refused by the policy's own validation.
    let Ok(dlq) = TopicName::new(name) else {
        return Ok(());
    };
    if crate::replication::topics::Writer::Edge
        .writes(state.store.as_ref(), &dlq)
        .await
        .map_err(CatalogError::from)?
    {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "writer_conflict",
            format!(
                "dead_letter_topic {dlq} is written by edge replication, and dead-letter copies are central writes it refuses: name a topic no edge writes (such as the default {{topic}}-dlq); nothing was changed"
            ),
        )
        .with("field", serde_json::json!("dead_letter_topic")));
    }
    Ok(())
}

pub(super) async fn put_failure_policy(
    State(state): State<AdminState>,
    Path((namespace, topic, subscription)): Path<(String, String, String)>,
    body: Bytes,
) -> ApiResult {
    let (topic, subscription) = policy_path(&namespace, &topic, &subscription)?;
    let policy: SubscriptionFailurePolicy = parse_json(&body)?;
    refuse_edge_fed_dead_letter(&state, policy.dead_letter_topic.as_deref()).await?;
    let view = Catalog::new(&*state.store)
        .set_failure_policy(&topic, &subscription, &policy)
        .await?;
    ok(StatusCode::OK, view)
}

pub(super) async fn patch_failure_policy_handler(
    State(state): State<AdminState>,
    Path((namespace, topic, subscription)): Path<(String, String, String)>,
    body: Bytes,
) -> ApiResult {
    let (topic, subscription) = policy_path(&namespace, &topic, &subscription)?;
    let patch: FailurePolicyPatch = parse_json(&body)?;
    refuse_edge_fed_dead_letter(&state, patch.dead_letter_topic.clone().flatten().as_deref())
        .await?;
    let view =
        patch_failure_policy(&Catalog::new(&*state.store), &topic, &subscription, &patch).await?;
    ok(StatusCode::OK, view)
}

#[cfg(test)]
mod tests {

    use serde_json::{Value, json};

    use super::*;

    use broker_core::catalog::fixture::{fixture, spec, sub, topic};

    fn policy_json(max: u32, base: u64, poison: &str, dlq: Option<&str>) -> Value {
        json!({
            "max_redelivery_count": max, "ack_timeout_ms": 30000,
            "base_redelivery_delay_ms": base, "max_redelivery_delay_ms": 60000,
            "backoff_strategy": "exponential", "poison_policy": poison,
            "dead_letter_topic": dlq
        })
    }

    #[tokio::test]
    async fn patch_keeps_unspecified_fields() {
        let f = fixture();
        let c = f.catalog();
        let t = topic("/default/jobs");
        c.create_topic(&spec(t.as_str(), "task_queue", 0))
            .await
            .unwrap();
        let s = sub("pool");
        let patch: FailurePolicyPatch =
            serde_json::from_value(json!({"max_redelivery_count": 8})).unwrap();
        let view = patch_failure_policy(&c, &t, &s, &patch).await.unwrap();
        assert_eq!(
            serde_json::to_value(&view.policy).unwrap(),
            policy_json(8, 1000, "dead_letter", Some("/default/jobs-dlq"))
        );
        let patch: FailurePolicyPatch = serde_json::from_value(
            json!({"poison_policy": "block", "dead_letter_topic": null, "ack_timeout_ms": 45000}),
        )
        .unwrap();
        assert_eq!(patch.dead_letter_topic, Some(None));
        let view = patch_failure_policy(&c, &t, &s, &patch).await.unwrap();
        let mut expected = policy_json(8, 1000, "block", None);
        expected["ack_timeout_ms"] = json!(45000);
        assert_eq!(serde_json::to_value(&view.policy).unwrap(), expected);
        assert_eq!(
            f.dump().await["/topics/default/jobs/subscriptions/pool/failure_policy"],
            expected
        );
        // Switching back to dead_letter without a topic is refused.
        let patch: FailurePolicyPatch =
            serde_json::from_value(json!({"poison_policy": "dead_letter"})).unwrap();
        let err = patch_failure_policy(&c, &t, &s, &patch).await.unwrap_err();
        assert_eq!(err.field(), Some("dead_letter_topic"));
        let empty: FailurePolicyPatch = serde_json::from_value(json!({})).unwrap();
        assert_eq!(empty, FailurePolicyPatch::default());
        assert!(serde_json::from_value::<FailurePolicyPatch>(json!({"max_retries": 1})).is_err());
    }
}
