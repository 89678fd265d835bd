//! Poison messages and the dead-letter topic: copying a message there
//! with the origin headers (`DEAD_LETTER_HEADERS`), made with the
//! subscription lock released, and replaying dead-lettered messages back
//! to their topic. A dead-letter topic in another namespace than the
//! subscription's topic, or a system topic, is never written or created
//! ([`check_dead_letter_target`]), whatever policy is stored: the copy
//! waits, logged once, until the policy is changed.

use broker_core::catalog::{Catalog, CatalogError};
use bytes::Bytes;
use serde_json::json;
use tokio::sync::MutexGuard;
use tracing::{error, info};
use tributary_api::consumer::ReplayResponse;
use tributary_proto::intent::{PoisonPolicy, check_dead_letter_target};
use tributary_proto::keys::{self, SubscriptionName, TopicName};

use super::session::{DeadLetterCopy, Subscription};
use super::{ConsumerError, ConsumerService, Sub, invalid, subscription_name, tiered};
use crate::replication::topics::TopicError;

/// The prefix of the subscription whose cursor tracks a replay of
/// `{sub}`'s dead letters: `replay.{sub}`.
const REPLAY_PREFIX: &str = "replay.";

/// `replay.{name}`, the subscription that holds the replay cursor of
/// `name`'s dead letters.
///
/// # Errors
/// [`ConsumerError::Invalid`] when `name` is longer than
/// [`keys::MAX_NAME_BYTES`] less the 7-byte prefix.
fn replay_subscription(name: &SubscriptionName) -> Result<SubscriptionName, ConsumerError> {
    SubscriptionName::new(&format!("{REPLAY_PREFIX}{name}")).map_err(|_| {
        invalid(
            "subscription",
            format!(
                "subscription: at most {} bytes (its dead letters' replay cursor is `{REPLAY_PREFIX}{{name}}`), this one has {}",
                keys::MAX_NAME_BYTES - REPLAY_PREFIX.len(),
                name.as_str().len()
            ),
        )
    })
}

impl ConsumerService {
    /// Whether `name` is a subscription of `topic`: stored (durable) or
    /// loaded on this broker (ephemeral).
    async fn subscription_known(
        &self,
        topic: &TopicName,
        name: &SubscriptionName,
    ) -> Result<bool, ConsumerError> {
        if self
            .subs
            .lock()
            .await
            .contains_key(&(topic.clone(), name.clone()))
        {
            return Ok(true);
        }
        Ok(self
            .store
            .get(&keys::topics::subscription(topic, name))
            .await?
            .is_some())
    }
}

/// Refuses to create a subscription whose dead letters could not be
/// replayed (its name leaves no room for `replay.`): at most 248 bytes.
///
/// # Errors
/// [`ConsumerError::Invalid`] naming the limit.
pub(super) fn check_replayable(name: &SubscriptionName) -> Result<(), ConsumerError> {
    replay_subscription(name).map(|_| ())
}

/// The dead-letter topic of a subscription of `topic` whose policy names
/// `dead_letter_topic` (default: `topic`'s `-dlq`), checked with
/// [`check_dead_letter_target`].
///
/// # Errors
/// [`ConsumerError::Invalid`] with field `dead_letter_topic` (a policy
/// error: nothing is written, see [`dead_letter_refusal`]) for a name that
/// is not a topic's, or a topic that may not receive this subscription's
/// dead letters: another namespace's or a system topic (a policy stored
/// before the check was made when policies are set).
pub(super) fn dead_letter_target(
    topic: &TopicName,
    dead_letter_topic: Option<&str>,
) -> Result<TopicName, ConsumerError> {
    let field = "dead_letter_topic";
    let dlq = match dead_letter_topic {
        Some(name) => {
            TopicName::new(name).map_err(|e| invalid(field, format!("{field} {name}: {e}")))?
        }
        None => topic
            .with_suffix("-dlq")
            .map_err(|e| invalid(field, format!("dead-letter topic of {topic}: {e}")))?,
    };
    check_dead_letter_target(topic, &dlq).map_err(|e| invalid(field, e.to_string()))?;
    Ok(dlq)
}

/// The message of `error` when it is a policy error of the dead-letter
/// topic ([`dead_letter_target`]): retrying cannot help until an operator
/// changes the policy.
/// An edge replicating into the dead-letter topic (it became edge-fed
/// after the policy was set, so the policy check passed then) is one too:
/// the topic takes no central copy until the policy names another.
pub(super) fn dead_letter_refusal(error: &ConsumerError) -> Option<&str> {
    match error {
        ConsumerError::Invalid { field, message } if field == "dead_letter_topic" => Some(message),
        ConsumerError::Conflict {
            kind: "writer_conflict",
            message,
        } => Some(message),
        _ => None,
    }
}

impl ConsumerService {
    /// Makes every pending dead-letter copy of `sub`: takes them out under
    /// the lock `st`, releases it for the appends, then takes it again to
    /// record each outcome (a confirmed copy finishes its message; a failed
    /// one stays pending, retried on the next tick), persists the cursor if
    /// a copy was made, and returns it. Without pending copies the lock is
    /// kept throughout.
    pub(super) async fn flush_dead_letters<'a>(
        &self,
        sub: &'a Sub,
        mut st: MutexGuard<'a, Subscription>,
    ) -> MutexGuard<'a, Subscription> {
        let copies = st.take_dead_letters();
        if copies.is_empty() {
            return st;
        }
        drop(st);
        let mut outcomes = Vec::with_capacity(copies.len());
        for copy in copies {
            let outcome = self.copy_to_dead_letter(sub, &copy).await;
            outcomes.push((copy, outcome));
        }
        let mut st = sub.state.lock().await;
        let mut copied = false;
        for (copy, outcome) in outcomes {
            let (offset, attempt) = (copy.offset, copy.attempt);
            match outcome {
                Ok(dlq_offset) => {
                    copied = true;
                    st.clear_dead_letter_refusal();
                    st.dead_letter_copied(&copy);
                    info!(topic = %sub.topic, subscription = %sub.name, offset, attempt, dlq_offset, "poison message copied to the dead-letter topic");
                }
                Err(e) => {
                    // A dead-letter topic's first copy waits for its owner
                    // to be placed: expected, not an error.
                    let placing = matches!(
                        &e,
                        ConsumerError::Conflict { kind: "not_owner", message } if message.contains("no owner yet")
                    );
                    if let Some(why) = dead_letter_refusal(&e) {
                        // A policy error: the message waits (as under
                        // `block`) until the policy changes; said once per
                        // subscription and target, not every tick.
                        if st.note_dead_letter_refusal(why) {
                            error!(topic = %sub.topic, subscription = %sub.name, offset, error = %e, "poison message not dead-lettered: the failure policy's dead_letter_topic is refused; delivery waits at it until the policy is changed (tribctl/PUT .../failure-policy)");
                        }
                    } else if placing {
                        info!(topic = %sub.topic, subscription = %sub.name, offset, reason = %e, "dead-letter copy waits for the dead-letter topic's owner; retrying");
                    } else if st.note_dead_letter_refusal(&e.to_string()) {
                        // Retried every tick: said again only when the
                        // reason changes (a dead-letter topic owned by
                        // another broker wrote 64,195 lines in 8 minutes
                        // in a trial). Shown by GET …/subscriptions/{sub}.
                        error!(topic = %sub.topic, subscription = %sub.name, offset, error = %e, "copy to the dead-letter topic failed; retried every tick, logged again when the reason changes (a dead-letter topic owned by another broker: move the topic to the dead-letter topic's owner)");
                    }
                    st.dead_letter_failed(copy);
                }
            }
        }
        if copied {
            // The cursor may now pass the copied messages: persisted at
            // once, so a crash does not copy them again (before, each crash
            // within the persist interval made another copy of each).
            self.persist(sub, &mut st, true).await;
        }
        st
    }

    /// Appends `copy`'s message to the dead-letter topic with the origin
    /// headers; returns its offset there.
    async fn copy_to_dead_letter(
        &self,
        sub: &Sub,
        copy: &DeadLetterCopy,
    ) -> Result<u64, ConsumerError> {
        let offset = copy.offset;
        let dlq = dead_letter_target(&sub.topic, copy.dead_letter_topic.as_deref())?;
        let found = tiered::read_offsets(
            &sub.wal(),
            self.archive(),
            &sub.topic,
            &[offset],
            &mut Vec::new(),
        )
        .await?;
        let Some(original) = found.get(&offset) else {
            return Err(ConsumerError::Internal(format!(
                "offset {offset} not readable"
            )));
        };
        let mut record = original.clone();
        let policy = match copy.poison_policy {
            PoisonPolicy::DeadLetter => "dead_letter",
            PoisonPolicy::Block => "block",
            PoisonPolicy::None => "none",
        };
        let values = [
            sub.topic.to_string(),
            sub.name.to_string(),
            offset.to_string(),
            sub.producer_id.clone(),
            self.broker_addr.clone(),
            policy.to_string(),
            copy.attempt.to_string(),
            copy.reason.clone(),
        ];
        for (name, value) in tributary_api::consumer::DEAD_LETTER_HEADERS
            .iter()
            .zip(values)
        {
            record
                .headers
                .push(((*name).to_string(), Bytes::from(value)));
        }
        self.check_dead_letter_owner(&dlq).await?;
        let ack = self.topics.append_central(&dlq, vec![record], true).await?;
        // The cursor passes the source message next (and retention may
        // then trim it): the copy must outlive a power cut, whatever the
        // dead-letter topic's sync mode (an implicit one does not sync).
        self.topics
            .open_existing(&dlq, false)
            .await?
            .sync_through(ack.next_offset)
            .await
            .map_err(TopicError::from)?;
        Ok(ack.base_offset)
    }

    /// Moves the messages `subscription` dead-lettered from the dead-letter
    /// topic back to `topic` (appended as new records without the
    /// `x-original-*`/poison headers, with `x-replayed-from` =
    /// `{dlq}@{offset}`). Progress through the dead-letter topic is a
    /// durable cursor at `/topics/{dlq}/subscriptions/replay.{sub}/cursor`,
    /// so a message is replayed once (at least once across a crash).
    ///
    /// # Errors
    /// [`ConsumerError::NotFound`], [`ConsumerError::Conflict`]
    /// (`writer_conflict` for a topic an edge writes).
    pub async fn replay_dlq(
        &self,
        topic: &TopicName,
        subscription: &str,
    ) -> Result<ReplayResponse, ConsumerError> {
        let name = subscription_name(subscription)?;
        let policy = Catalog::new(self.store.as_ref())
            .failure_policy(topic, &name)
            .await?
            .policy;
        let dlq = dead_letter_target(topic, policy.dead_letter_topic.as_deref())?;
        let replay_name = replay_subscription(&name)?;
        let dlq_wal = match self.topics.open_existing(&dlq, false).await {
            Ok(wal) => wal,
            Err(TopicError::Catalog(CatalogError::TopicNotFound { .. })) => {
                // Nothing was ever dead-lettered; a name that is not a
                // subscription either is a mistake (as below).
                if !self.subscription_known(topic, &name).await? {
                    return Err(ConsumerError::NotFound(format!(
                        "subscription {name} of {topic} does not exist and has no dead-lettered messages in {dlq}"
                    )));
                }
                return Ok(ReplayResponse {
                    dead_letter_topic: dlq.to_string(),
                    replayed: 0,
                    offsets: Vec::new(),
                    dead_letter_cursor: 0,
                });
            }
            Err(e) => return Err(e.into()),
        };
        let cursor_key = keys::topics::subscription_cursor(&dlq, &replay_name);
        let stored_cursor = self.store.get(&cursor_key).await?.and_then(|v| v.as_u64());
        // Entries the tier service archived and trimmed from the local WAL
        // are read from the archive, as a peek reads them: before, the
        // replay started at the local log start, replayed none of them and
        // moved its cursor past them for good.
        let archive = self.archive();
        let log_start = tiered::log_start(&dlq_wal, archive, &dlq).await?;
        let from = stored_cursor.unwrap_or(0).max(log_start);
        let mut gaps = Vec::new();
        let found = tiered::read_range(&dlq_wal, archive, &dlq, from, 10_000, &mut gaps).await?;
        // A damaged range of the dead-letter topic (damaged central bytes,
        // or an archive object) holds nothing to replay: a read that
        // starts in it is refused, naming it; one that meets it later
        // stops before it, and the next replay starts there.
        super::damage::refuse_a_read_that_starts_damaged(found.is_empty(), &mut gaps)?;
        let end = found
            .last()
            .map_or(from, |(o, _)| o + 1)
            .max(gaps.last().map_or(from, |g| g.end_offset));
        let topic_text = topic.to_string();
        let sub_text = name.to_string();
        let mut replay = Vec::new();
        // A crash between a copy and the cursor write that follows it can
        // copy a message twice: one replay per original offset.
        let mut seen = std::collections::HashSet::new();
        let mut any_entry = false;
        for (offset, record) in found {
            let header = |n: &str| {
                record
                    .headers
                    .iter()
                    .find(|(k, _)| k == n)
                    .map(|(_, v)| v.clone())
            };
            if header("x-original-topic").as_deref() != Some(topic_text.as_bytes())
                || header("x-original-subscription").as_deref() != Some(sub_text.as_bytes())
            {
                continue;
            }
            any_entry = true;
            // An entry naming a damaged range holds no message to replay.
            if header(super::damage::DAMAGED_RANGE_HEADER).is_some() {
                continue;
            }
            if let Some(original) = header("x-original-topic-offset")
                && !seen.insert(original)
            {
                continue;
            }
            let mut record = record;
            record.headers.retain(|(k, _)| {
                !tributary_api::consumer::DEAD_LETTER_HEADERS.contains(&k.as_str())
            });
            record.headers.push((
                "x-replayed-from".into(),
                Bytes::from(format!("{dlq}@{offset}")),
            ));
            replay.push(record);
        }
        // A name that was never a subscription here (no cursor, no
        // metadata, not loaded, no entry read) is a mistake: say so rather
        // than store a replay cursor for it.
        if !any_entry && stored_cursor.is_none() && !self.subscription_known(topic, &name).await? {
            return Err(ConsumerError::NotFound(format!(
                "subscription {name} of {topic} does not exist and has no dead-lettered messages in {dlq}"
            )));
        }
        let mut offsets = Vec::new();
        if !replay.is_empty() {
            let count = replay.len() as u64;
            let ack = self.topics.append_central(topic, replay, false).await?;
            offsets = (ack.base_offset..ack.base_offset + count).collect();
        }
        self.put_fenced(topic, &cursor_key, json!(end)).await?;
        info!(%topic, subscription = %name, dlq = %dlq, replayed = offsets.len(), "replayed dead-lettered messages");
        Ok(ReplayResponse {
            dead_letter_topic: dlq.to_string(),
            replayed: offsets.len() as u64,
            offsets,
            dead_letter_cursor: end,
        })
    }
}
