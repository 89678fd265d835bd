//! Subscription failure policies: the catalog's limits
//! ([`validate_policy`]), the policy a first attach inherits and persists,
//! reading it, and replacing it.

use serde_json::Value;
use tributary_api::admin::{FailurePolicyView, PolicySource};
use tributary_proto::intent::SubscriptionFailurePolicy;
use tributary_proto::keys::{self, SubscriptionName, TopicName};

use super::{Catalog, CatalogError, WRITE_ATTEMPTS, decode, to_json};
use crate::metadata::{Txn, TxnOutcome};

/// Most redeliveries a failure policy may ask for.
pub const MAX_REDELIVERY_COUNT: u32 = 10_000;

/// Longest ack timeout, base delay or maximum delay of a failure policy, ms
/// (one day).
pub const MAX_POLICY_DURATION_MS: u64 = 86_400_000;

/// Checks an operator-supplied policy of a subscription of `topic`:
/// [`SubscriptionFailurePolicy::validate_for`] plus the catalog's limits.
///
/// # Errors
/// [`CatalogError::InvalidPolicy`] or [`CatalogError::PolicyOutOfRange`],
/// naming the field.
pub fn validate_policy(
    policy: &SubscriptionFailurePolicy,
    topic: &TopicName,
) -> Result<(), CatalogError> {
    let limits = [
        (
            "max_redelivery_count",
            u64::from(policy.max_redelivery_count),
            u64::from(MAX_REDELIVERY_COUNT),
        ),
        (
            "ack_timeout_ms",
            policy.ack_timeout_ms,
            MAX_POLICY_DURATION_MS,
        ),
        (
            "base_redelivery_delay_ms",
            policy.base_redelivery_delay_ms,
            MAX_POLICY_DURATION_MS,
        ),
        (
            "max_redelivery_delay_ms",
            policy.max_redelivery_delay_ms,
            MAX_POLICY_DURATION_MS,
        ),
    ];
    for (field, value, max) in limits {
        if value > max {
            return Err(CatalogError::PolicyOutOfRange { field, value, max });
        }
    }
    policy.validate_for(topic).map_err(CatalogError::policy)
}

impl Catalog<'_> {
    /// The policy a new subscription of `topic` inherits: derived from the
    /// stored intent, or the broker fallback for implicit topics.
    async fn derived_policy(
        &self,
        topic: &TopicName,
    ) -> Result<(SubscriptionFailurePolicy, PolicySource), CatalogError> {
        match self.stored_intent(topic).await? {
            Some(settings) => SubscriptionFailurePolicy::inherit(&settings, topic)
                .map(|policy| (policy, PolicySource::Intent))
                .map_err(|e| {
                    CatalogError::inconsistent(&keys::topics::intent(topic), e.to_string())
                }),
            None => Ok((
                SubscriptionFailurePolicy::broker_fallback(),
                PolicySource::BrokerFallback,
            )),
        }
    }

    async fn stored_policy(
        &self,
        topic: &TopicName,
        subscription: &SubscriptionName,
    ) -> Result<Option<(Value, SubscriptionFailurePolicy)>, CatalogError> {
        let key = keys::topics::subscription_failure_policy(topic, subscription);
        match self.store.get(&key).await? {
            Some(value) => {
                let policy = decode(&key, value.clone())?;
                Ok(Some((value, policy)))
            }
            None => Ok(None),
        }
    }

    /// A consumer attaches under `subscription`
    /// (`seeds/000_d502aacc865e81b1.txt`, "How Topic Defaults Flow to
    /// Subscriptions"): a stored policy is returned untouched (never
    /// overwritten); otherwise the policy is derived from `/intent` (broker
    /// fallback for implicit topics) and persisted with a `when_absent`
    /// precondition, so of two racing first attaches one persists and both
    /// return the same policy.
    ///
    /// # Errors
    /// [`CatalogError::TopicNotFound`]; [`CatalogError::ConcurrentChange`];
    /// [`CatalogError::Inconsistent`]; [`CatalogError::Metadata`].
    pub async fn attach_subscription(
        &self,
        topic: &TopicName,
        subscription: &SubscriptionName,
    ) -> Result<FailurePolicyView, CatalogError> {
        let key = keys::topics::subscription_failure_policy(topic, subscription);
        let view = |policy, source| FailurePolicyView {
            topic: topic.clone(),
            subscription: subscription.clone(),
            persisted: true,
            source,
            policy,
        };
        let mut failed_key = String::new();
        for _ in 0..WRITE_ATTEMPTS {
            let marker_key = keys::topics::marker(topic);
            let Some(marker) = self.store.get(&marker_key).await? else {
                return Err(CatalogError::TopicNotFound {
                    topic: topic.clone(),
                });
            };
            if let Some((_, policy)) = self.stored_policy(topic, subscription).await? {
                return Ok(view(policy, PolicySource::Stored));
            }
            let (policy, source) = self.derived_policy(topic).await?;
            let txn = Txn::new()
                .when_equals(marker_key, marker)
                .when_absent(key.clone())
                .put(key.clone(), to_json(&key, &policy)?);
            match self.store.txn(txn).await? {
                TxnOutcome::Applied => return Ok(view(policy, source)),
                TxnOutcome::ConditionFailed { key, .. } => failed_key = key,
            }
        }
        Err(CatalogError::ConcurrentChange { key: failed_key })
    }

    /// The failure policy of `subscription`: the stored one, or (not
    /// persisted) the one its first attach would persist.
    ///
    /// # Errors
    /// [`CatalogError::TopicNotFound`]; [`CatalogError::Inconsistent`];
    /// [`CatalogError::Metadata`].
    pub async fn failure_policy(
        &self,
        topic: &TopicName,
        subscription: &SubscriptionName,
    ) -> Result<FailurePolicyView, CatalogError> {
        self.marker(topic).await?;
        let (persisted, source, policy) = match self.stored_policy(topic, subscription).await? {
            Some((_, policy)) => (true, PolicySource::Stored, policy),
            None => {
                let (policy, source) = self.derived_policy(topic).await?;
                (false, source, policy)
            }
        };
        Ok(FailurePolicyView {
            topic: topic.clone(),
            subscription: subscription.clone(),
            persisted,
            source,
            policy,
        })
    }

    /// Stores `policy` for `subscription`, replacing any stored one (an
    /// explicit override always wins; later attaches keep it). The
    /// subscription need not have been attached yet.
    ///
    /// # Errors
    /// [`CatalogError::InvalidPolicy`] / [`CatalogError::PolicyOutOfRange`]
    /// naming the field; [`CatalogError::TopicNotFound`];
    /// [`CatalogError::ConcurrentChange`]; [`CatalogError::Metadata`].
    pub async fn set_failure_policy(
        &self,
        topic: &TopicName,
        subscription: &SubscriptionName,
        policy: &SubscriptionFailurePolicy,
    ) -> Result<FailurePolicyView, CatalogError> {
        validate_policy(policy, topic)?;
        self.update_failure_policy(topic, subscription, |_| Ok(policy.clone()))
            .await
    }

    /// Read-modify-write of a subscription's policy: `change` maps the
    /// current policy (stored, or the one the subscription would inherit)
    /// to the one to store, which is written conditional on the topic
    /// marker and the policy read (re-read and retried when either moved).
    /// `change` validates what it returns (see [`validate_policy`]); the
    /// broker's partial updates are built on this.
    ///
    /// # Errors
    /// Those of `change`; [`CatalogError::TopicNotFound`];
    /// [`CatalogError::ConcurrentChange`]; [`CatalogError::Inconsistent`];
    /// [`CatalogError::Metadata`].
    pub async fn update_failure_policy(
        &self,
        topic: &TopicName,
        subscription: &SubscriptionName,
        change: impl Fn(&SubscriptionFailurePolicy) -> Result<SubscriptionFailurePolicy, CatalogError>,
    ) -> Result<FailurePolicyView, CatalogError> {
        let key = keys::topics::subscription_failure_policy(topic, subscription);
        let mut failed_key = String::new();
        for _ in 0..WRITE_ATTEMPTS {
            let marker_key = keys::topics::marker(topic);
            let Some(marker) = self.store.get(&marker_key).await? else {
                return Err(CatalogError::TopicNotFound {
                    topic: topic.clone(),
                });
            };
            let stored = self.stored_policy(topic, subscription).await?;
            let current = match &stored {
                Some((_, policy)) => policy.clone(),
                None => self.derived_policy(topic).await?.0,
            };
            let policy = change(&current)?;
            let txn = Txn::new().when_equals(marker_key, marker);
            let txn = match stored {
                Some((value, _)) => txn.when_equals(key.clone(), value),
                None => txn.when_absent(key.clone()),
            };
            let txn = txn.put(key.clone(), to_json(&key, &policy)?);
            match self.store.txn(txn).await? {
                TxnOutcome::Applied => {
                    return Ok(FailurePolicyView {
                        topic: topic.clone(),
                        subscription: subscription.clone(),
                        persisted: true,
                        source: PolicySource::Stored,
                        policy,
                    });
                }
                TxnOutcome::ConditionFailed { key, .. } => failed_key = key,
            }
        }
        Err(CatalogError::ConcurrentChange { key: failed_key })
    }
}
