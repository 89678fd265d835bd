//! Fencing of the consumer's central writes by topic ownership: cursor
//! writes (and the other subscription keys written while serving) carry
//! the owner's precondition ([`crate::cluster::Cluster::fence`]), so a
//! broker that lost a topic writes nothing for it; dead-letter copies go
//! only to a dead-letter topic this broker owns. Without a cluster
//! ([`ConsumerService::set_cluster`] never called) nothing is fenced.

use std::sync::Arc;

use broker_core::metadata::{Precondition, Txn, TxnOutcome};
use serde_json::{Value, json};
use tributary_proto::keys::{self, TopicName};

use super::{ConsumerError, ConsumerService};
use crate::cluster::{Cluster, Route};

/// A `409 not_owner` refusal.
fn not_owner(message: String) -> ConsumerError {
    ConsumerError::Conflict {
        kind: "not_owner",
        message,
    }
}

impl ConsumerService {
    /// Fences central writes by `cluster`'s ownership (a broker of a
    /// cluster). Only the first call counts.
    pub fn set_cluster(&self, cluster: Arc<Cluster>) {
        let _ = self.cluster.set(cluster);
    }

    /// The precondition of a central write about `topic`: `None` without a
    /// cluster.
    ///
    /// # Errors
    /// `409 not_owner` when this broker does not serve `topic` now.
    pub(super) fn fence(&self, topic: &TopicName) -> Result<Option<Precondition>, ConsumerError> {
        let Some(cluster) = self.cluster.get() else {
            return Ok(None);
        };
        match cluster.route(topic) {
            Route::Local { epoch } => cluster.fence(topic, epoch).map(Some).ok_or_else(|| {
                not_owner(format!("broker {} no longer owns {topic}", cluster.me()))
            }),
            Route::Remote(owner) => Err(not_owner(format!(
                "topic {topic} is owned by broker {} (epoch {})",
                owner.broker_id, owner.epoch
            ))),
            Route::Unassigned { reason } => Err(not_owner(reason)),
        }
    }

    /// `txn` with `topic`'s fence as its first precondition.
    ///
    /// # Errors
    /// As [`ConsumerService::fence`].
    pub(super) fn fenced_txn(
        &self,
        topic: &TopicName,
    ) -> Result<(Txn, Option<String>), ConsumerError> {
        let fence = self.fence(topic)?;
        let key = fence.as_ref().map(|f| f.key.clone());
        let mut txn = Txn::new();
        txn.preconditions.extend(fence);
        Ok((txn, key))
    }

    /// `Err(not_owner)` when `outcome` failed on the fence `fence_key`.
    pub(super) fn check_fenced(
        topic: &TopicName,
        outcome: &TxnOutcome,
        fence_key: Option<&str>,
    ) -> Result<(), ConsumerError> {
        match outcome {
            TxnOutcome::ConditionFailed { key, .. } if Some(key.as_str()) == fence_key => {
                Err(not_owner(format!(
                    "this broker lost ownership of {topic} ({key} changed); nothing was written"
                )))
            }
            _ => Ok(()),
        }
    }

    /// Whether `sub` was deleted on any broker, with its topic (`DELETE
    /// /v1/topics/…`) or by itself: a durable subscription's stored
    /// metadata (`/topics/{ns}/{topic}/subscriptions/{sub}`) is gone, an
    /// ephemeral one's topic marker is. Read from this broker's applied
    /// copy and, when absent there, confirmed through the leader (a
    /// follower's copy that has not applied the creation yet does not
    /// count); a metadata error, or no answer within a second, counts as
    /// not deleted. The metadata is what a topic created again under the
    /// name does not bring back, so a quick re-create does not hide the
    /// delete. Such a subscription is forgotten by the next tick, and no
    /// cursor is written for it meanwhile: a write would put a key of the
    /// deleted subscription back, which a topic created again would find.
    pub(super) async fn deleted(&self, sub: &super::Sub) -> bool {
        let key = if sub.durable {
            keys::topics::subscription(&sub.topic, &sub.name)
        } else {
            keys::topics::marker(&sub.topic)
        };
        let confirm = std::time::Duration::from_secs(1);
        matches!(self.store.get_local(&key).await, Ok(None))
            && matches!(
                tokio::time::timeout(confirm, self.store.get(&key)).await,
                Ok(Ok(None))
            )
    }

    /// Puts `value` at `key` (a key under `topic`) only while this broker
    /// owns `topic`.
    ///
    /// # Errors
    /// `409 not_owner`; metadata errors.
    pub(super) async fn put_fenced(
        &self,
        topic: &TopicName,
        key: &str,
        value: Value,
    ) -> Result<(), ConsumerError> {
        let (txn, fence_key) = self.fenced_txn(topic)?;
        if fence_key.is_none() {
            self.store.put(key, value).await?;
            return Ok(());
        }
        let outcome = self.store.txn(txn.put(key, value)).await?;
        Self::check_fenced(topic, &outcome, fence_key.as_deref())
    }

    /// Writes `name`'s cursor and the offsets finished above it
    /// ([`with_cursor`]) in one transaction, fenced by ownership.
    ///
    /// # Errors
    /// `409 not_owner` when the fence fails; metadata errors.
    pub(super) async fn put_cursor(
        &self,
        topic: &TopicName,
        name: &tributary_proto::keys::SubscriptionName,
        cursor: u64,
        done_above: &[(u64, u64)],
    ) -> Result<(), ConsumerError> {
        let (txn, fence_key) = self.fenced_txn(topic)?;
        let outcome = self
            .store
            .txn(with_cursor(txn, topic, name, cursor, done_above))
            .await?;
        Self::check_fenced(topic, &outcome, fence_key.as_deref())
    }

    /// Whether a dead-letter copy may be appended to `dlq` here: always
    /// without a cluster; with one, only when this broker owns `dlq` (a
    /// dead-letter topic nobody owns yet is queued, preferring this broker,
    /// and the copy is retried on a later tick).
    ///
    /// # Errors
    /// `409 not_owner`: the copy stays pending (not dead-lettered yet).
    pub(super) async fn check_dead_letter_owner(
        &self,
        dlq: &TopicName,
    ) -> Result<(), ConsumerError> {
        let Some(cluster) = self.cluster.get() else {
            return Ok(());
        };
        match cluster.route(dlq) {
            Route::Local { .. } => Ok(()),
            Route::Remote(owner) => Err(not_owner(format!(
                "dead-letter topic {dlq} is owned by broker {} (epoch {}); the copy is not written here",
                owner.broker_id, owner.epoch
            ))),
            Route::Unassigned { reason } => {
                if cluster.owner(dlq).is_none()
                    && let Err(e) = cluster
                        .ensure_placed(dlq, Some(cluster.me()), "dead_letter")
                        .await
                {
                    tracing::warn!(%dlq, error = %e, "cannot queue the dead-letter topic for an owner");
                }
                Err(not_owner(format!(
                    "dead-letter topic {dlq} has no owner yet ({reason}); the copy is retried"
                )))
            }
        }
    }
}

/// `txn` writing `name`'s cursor and, at
/// `/topics/{ns}/{topic}/subscriptions/{sub}/acked`, the offsets finished
/// above it as `{"cursor": C, "ranges": [[first, end], …]}` (deleted when
/// there are none): a broker that loads the subscription after a restart
/// or a move does not deliver them again ([`acked_above`]).
pub(super) fn with_cursor(
    txn: Txn,
    topic: &TopicName,
    name: &tributary_proto::keys::SubscriptionName,
    cursor: u64,
    done_above: &[(u64, u64)],
) -> Txn {
    let txn = txn.put(
        keys::topics::subscription_cursor(topic, name),
        json!(cursor),
    );
    let acked = keys::topics::subscription_acked(topic, name);
    if done_above.is_empty() {
        txn.delete(acked)
    } else {
        txn.put(acked, json!({"cursor": cursor, "ranges": done_above}))
    }
}

/// The finished ranges stored at `value` (an `acked` key) if they belong
/// to `cursor`: written with another cursor (a seek or a later cursor
/// write by a broker that had none) they are stale and ignored, as is a
/// value that does not decode (logged by the caller's absence of ranges).
pub(super) fn acked_above(value: Option<&Value>, cursor: u64) -> Vec<(u64, u64)> {
    let Some(value) = value else {
        return Vec::new();
    };
    if value.get("cursor").and_then(Value::as_u64) != Some(cursor) {
        return Vec::new();
    }
    value
        .get("ranges")
        .and_then(Value::as_array)
        .map(|ranges| {
            ranges
                .iter()
                .filter_map(|r| Some((r.get(0)?.as_u64()?, r.get(1)?.as_u64()?)))
                .filter(|(first, end)| first < end)
                .collect()
        })
        .unwrap_or_default()
}
