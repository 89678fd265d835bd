//! One loaded subscription's consumer-session rules, without I/O: which
//! consumer sessions exist and which one is active (exclusive: the only one;
//! failover: the oldest live one; shared: all), when a session expires,
//! when an ephemeral subscription ends, when the failure policy is re-read,
//! and which poison messages wait for their copy to the dead-letter topic.
//! Leases, redelivery backoff and poison decisions are the
//! [`Dispatcher`]'s; this machine owns it and adds the sessions around it.
//!
//! Time arrives as `now_ms` arguments (ms since the Unix epoch, from the
//! service's injected clock); the shell in [`super`] carries out what the
//! calls return (WAL reads, dead-letter appends, cursor writes to Raft).
//!
//! Dead-letter copies are a three-step protocol so the append never runs
//! under the subscription lock: [`Subscription::take_dead_letters`] hands
//! out every pending copy, the shell appends them with the lock released,
//! then reports each with [`Subscription::dead_letter_copied`] or
//! [`Subscription::dead_letter_failed`] (failed copies are retried on the
//! next call).

use std::collections::BTreeMap;

use tributary_api::consumer::{ConsumerState, SubscriptionType};
use tributary_proto::dispatch::{AckOutcome, Action, DispatchError, Dispatcher, Lease};
use tributary_proto::intent::{PoisonPolicy, SubscriptionFailurePolicy};

use super::SubscriptionMeta;

/// The timing rules of consumer sessions, ms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SessionTimings {
    /// A session ends this long after its last call (strictly longer
    /// silence expires it).
    pub session_timeout_ms: i64,
    /// A durable subscription's stored failure policy is re-read this often.
    pub policy_refresh_ms: i64,
}

/// One consumer session.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Session {
    /// The consumer's label, if it gave one.
    name: Option<String>,
    /// Its last call, ms since the Unix epoch.
    last_seen_ms: i64,
}

/// A message to copy to the dead-letter topic, with what the copy's headers
/// need from the failure policy in force when it was taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DeadLetterCopy {
    /// The poison message's offset.
    pub offset: u64,
    /// Deliveries made (`x-delivery-attempt`).
    pub attempt: u32,
    /// Why the last delivery failed (`x-failure-reason`).
    pub reason: String,
    /// The policy's `dead_letter_topic` (default: the topic's `-dlq`).
    pub dead_letter_topic: Option<String>,
    /// The policy's poison policy (`x-poison-policy`).
    pub poison_policy: PoisonPolicy,
}

/// Why an attach is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AttachRefusal {
    /// The subscription has another type.
    TypeMismatch {
        /// Its type.
        existing: SubscriptionType,
    },
    /// Exclusive, and this consumer session holds it.
    Busy {
        /// The attached consumer.
        holder: u64,
    },
}

/// Why a call naming a consumer session is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SessionError {
    /// The subscription was removed (unsubscribed, or an ephemeral one ended).
    Removed,
    /// No such session (expired, detached or never attached).
    NoSession,
}

/// What a tick decided.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Tick {
    /// Sessions that expired, each with how many leases it gave back.
    pub expired: Vec<(u64, usize)>,
    /// Poison decisions of expired leases (dead-letter copies are also
    /// queued: [`Subscription::take_dead_letters`]).
    pub actions: Vec<Action>,
    /// Re-read the stored failure policy now (then
    /// [`Subscription::set_policy`]).
    pub refresh_policy: bool,
}

/// One loaded subscription: its sessions and its [`Dispatcher`].
#[derive(Debug)]
pub(crate) struct Subscription {
    dispatcher: Dispatcher,
    meta: SubscriptionMeta,
    durable: bool,
    timings: SessionTimings,
    /// By consumer id; ids grow, so the first is the oldest session.
    sessions: BTreeMap<u64, Session>,
    /// Dead-letter copies not yet made or confirmed.
    pending_dead_letters: Vec<(u64, u32, String)>,
    last_policy_refresh_ms: i64,
    removed: bool,
}

impl Subscription {
    /// A subscription loaded at `now_ms`, delivering from `dispatcher`'s
    /// cursor; a `durable` one persists its cursor and re-reads its stored
    /// failure policy, an ephemeral one ends with its last session.
    pub fn new(
        dispatcher: Dispatcher,
        meta: SubscriptionMeta,
        durable: bool,
        timings: SessionTimings,
        now_ms: i64,
    ) -> Subscription {
        Subscription {
            dispatcher,
            durable,
            meta,
            timings,
            sessions: BTreeMap::new(),
            pending_dead_letters: Vec::new(),
            last_policy_refresh_ms: now_ms,
            removed: false,
        }
    }

    /// The delivery state (cursor, leases, policy).
    pub fn dispatcher(&self) -> &Dispatcher {
        &self.dispatcher
    }

    /// Type, durability, pause flag.
    pub fn meta(&self) -> &SubscriptionMeta {
        &self.meta
    }

    /// The consumer that receives on an exclusive or failover subscription:
    /// the oldest live session.
    pub fn active_consumer(&self) -> Option<u64> {
        self.sessions.keys().next().copied()
    }

    /// Whether `consumer` may receive now.
    pub fn is_active(&self, consumer: u64) -> bool {
        match self.meta.subscription_type {
            SubscriptionType::Failover | SubscriptionType::Exclusive => {
                self.active_consumer() == Some(consumer)
            }
            SubscriptionType::Shared => true,
        }
    }

    /// The sessions as the state API shows them.
    pub fn consumers(&self) -> Vec<ConsumerState> {
        self.sessions
            .iter()
            .map(|(&id, s)| ConsumerState {
                consumer_id: id,
                consumer_name: s.name.clone(),
                active: self.is_active(id),
                last_seen_ms: s.last_seen_ms,
            })
            .collect()
    }

    /// Opens a session at `now_ms` asking for `requested` type, named by
    /// `next_id` (called only if the attach is accepted); returns its id and
    /// whether it is active.
    ///
    /// # Errors
    /// [`AttachRefusal`] for another type, or an exclusive subscription
    /// with a session.
    pub fn attach(
        &mut self,
        now_ms: i64,
        requested: SubscriptionType,
        name: Option<String>,
        next_id: impl FnOnce() -> u64,
    ) -> Result<(u64, bool), AttachRefusal> {
        if self.meta.subscription_type != requested {
            return Err(AttachRefusal::TypeMismatch {
                existing: self.meta.subscription_type,
            });
        }
        if self.meta.subscription_type == SubscriptionType::Exclusive
            && let Some(holder) = self.active_consumer()
        {
            return Err(AttachRefusal::Busy { holder });
        }
        let consumer = next_id();
        self.sessions.insert(
            consumer,
            Session {
                name,
                last_seen_ms: now_ms,
            },
        );
        Ok((consumer, self.is_active(consumer)))
    }

    /// Records a call of `consumer` at `now_ms` (keeps its session alive).
    ///
    /// # Errors
    /// [`SessionError`] for a removed subscription or an unknown session.
    pub fn touch(&mut self, now_ms: i64, consumer: u64) -> Result<(), SessionError> {
        if self.removed {
            return Err(SessionError::Removed);
        }
        let session = self
            .sessions
            .get_mut(&consumer)
            .ok_or(SessionError::NoSession)?;
        session.last_seen_ms = now_ms;
        Ok(())
    }

    /// Ends session `consumer`; its leases are ready for redelivery at
    /// `now_ms`. Returns how many leases it gave back.
    pub fn detach(&mut self, now_ms: i64, consumer: u64) -> usize {
        self.sessions.remove(&consumer);
        self.dispatcher.release(consumer, now_ms)
    }

    /// The periodic work at `now_ms`: ends sessions silent for longer than
    /// the session timeout (their leases are redelivered at once), processes
    /// expired leases, and says whether the failure policy is due for a
    /// re-read. `None` once the subscription is removed.
    pub fn tick(&mut self, now_ms: i64) -> Option<Tick> {
        if self.removed {
            return None;
        }
        let timeout = self.timings.session_timeout_ms;
        let expired: Vec<u64> = self
            .sessions
            .iter()
            .filter(|(_, s)| now_ms.saturating_sub(s.last_seen_ms) > timeout)
            .map(|(&id, _)| id)
            .collect();
        let expired = expired
            .into_iter()
            .map(|id| (id, self.detach(now_ms, id)))
            .collect();
        let actions = self.dispatcher.on_timeout(now_ms);
        self.queue_dead_letters(&actions);
        let refresh_policy = self.durable
            && now_ms.saturating_sub(self.last_policy_refresh_ms) >= self.timings.policy_refresh_ms;
        if refresh_policy {
            self.last_policy_refresh_ms = now_ms;
        }
        Some(Tick {
            expired,
            actions,
            refresh_policy,
        })
    }

    /// Ends an ephemeral subscription whose last session ended: returns
    /// true once (the shell then forgets it).
    pub fn end_if_unused(&mut self) -> bool {
        if self.durable || self.removed || !self.sessions.is_empty() {
            return false;
        }
        self.removed = true;
        true
    }

    /// Marks the subscription removed (unsubscribe): every later call
    /// naming a session is refused and nothing is persisted.
    pub fn remove(&mut self) {
        self.removed = true;
    }

    /// Leases up to `max` messages below `high_water_mark` to `consumer` at
    /// `now_ms`, if it is active and the subscription is not paused (else
    /// nothing). Also returns the poison decisions of leases that expired.
    pub fn lease(
        &mut self,
        now_ms: i64,
        consumer: u64,
        max: usize,
        high_water_mark: u64,
    ) -> (Vec<Lease>, Vec<Action>) {
        if !self.is_active(consumer) || self.meta.paused {
            return (Vec::new(), Vec::new());
        }
        let (deliveries, actions) = self
            .dispatcher
            .lease(now_ms, consumer, max, high_water_mark);
        self.queue_dead_letters(&actions);
        (deliveries, actions)
    }

    /// Acknowledges `offset` for `consumer`.
    ///
    /// # Errors
    /// [`DispatchError::NotLeased`] if another consumer holds its lease.
    pub fn ack(&mut self, consumer: u64, offset: u64) -> Result<AckOutcome, DispatchError> {
        self.dispatcher.ack_by(consumer, offset)
    }

    /// Acknowledges everything below `end` (cursor read).
    ///
    /// # Errors
    /// [`DispatchError::BeyondEnd`] past `high_water_mark`.
    pub fn ack_up_to(
        &mut self,
        end: u64,
        high_water_mark: u64,
    ) -> Result<AckOutcome, DispatchError> {
        self.dispatcher.ack_up_to(end, high_water_mark)
    }

    /// Negative acknowledgement of `offset` by `consumer` at `now_ms`:
    /// redelivery after the backoff (or `delay_ms`), or the poison decision
    /// (a dead-letter copy is queued).
    ///
    /// # Errors
    /// [`DispatchError::NotLeased`] unless `consumer` holds the lease.
    pub fn nack(
        &mut self,
        now_ms: i64,
        consumer: u64,
        offset: u64,
        delay_ms: Option<u64>,
        reason: &str,
    ) -> Result<Option<Action>, DispatchError> {
        let action = self
            .dispatcher
            .nack(now_ms, consumer, offset, delay_ms, reason)?;
        self.queue_dead_letters(action.as_slice());
        Ok(action)
    }

    /// Applies a failure policy read from the store; returns whether it
    /// differed (a change lifts a block).
    pub fn set_policy(&mut self, policy: SubscriptionFailurePolicy) -> bool {
        if &policy == self.dispatcher.policy() {
            return false;
        }
        self.dispatcher.set_policy(policy);
        true
    }

    /// Pauses (`true`) or resumes delivery.
    pub fn set_paused(&mut self, paused: bool) {
        self.meta.paused = paused;
    }

    /// Moves the cursor to `cursor` (admin seek): forgets leases and
    /// redeliveries. Dead-letter copies still to be made are made (their
    /// confirmation then changes nothing).
    pub fn seek(&mut self, cursor: u64) {
        self.dispatcher.seek(cursor);
    }

    /// The cursor to write now, if any: batching per the persist policy,
    /// `force` for shutdown, seek and pause. Never for an ephemeral or
    /// removed subscription.
    pub fn poll_persist(&mut self, now_ms: i64, force: bool) -> Option<u64> {
        if !self.durable || self.removed {
            return None;
        }
        self.dispatcher.poll_persist(now_ms, force)
    }

    fn queue_dead_letters(&mut self, actions: &[Action]) {
        for action in actions {
            if let Action::DeadLetter {
                offset,
                attempt,
                reason,
            } = action
            {
                self.pending_dead_letters
                    .push((*offset, *attempt, reason.clone()));
            }
        }
    }

    /// Takes every pending dead-letter copy out, to be made with the lock
    /// released and reported back.
    pub fn take_dead_letters(&mut self) -> Vec<DeadLetterCopy> {
        let policy = self.dispatcher.policy();
        std::mem::take(&mut self.pending_dead_letters)
            .into_iter()
            .map(|(offset, attempt, reason)| DeadLetterCopy {
                offset,
                attempt,
                reason,
                dead_letter_topic: policy.dead_letter_topic.clone(),
                poison_policy: policy.poison_policy,
            })
            .collect()
    }

    /// `copy` is durably in the dead-letter topic: its message is finished
    /// (if it still waits for that: a seek forgets it).
    pub fn dead_letter_copied(&mut self, copy: &DeadLetterCopy) {
        let _ = self.dispatcher.dead_lettered(copy.offset);
    }

    /// `copy` failed: it is made again by the next
    /// [`Subscription::take_dead_letters`].
    pub fn dead_letter_failed(&mut self, copy: DeadLetterCopy) {
        self.pending_dead_letters
            .push((copy.offset, copy.attempt, copy.reason));
    }

    /// Whether a copy of `offset` is still to be made.
    pub fn dead_letter_pending(&self, offset: u64) -> bool {
        self.pending_dead_letters
            .iter()
            .any(|(o, _, _)| *o == offset)
    }
}

#[cfg(test)]
mod tests {
    use tributary_proto::dispatch::PersistPolicy;
    use tributary_proto::intent::BackoffStrategy;

    use super::*;

    const TIMINGS: SessionTimings = SessionTimings {
        session_timeout_ms: 30_000,
        policy_refresh_ms: 2_000,
    };

    fn policy(max_redelivery_count: u32) -> SubscriptionFailurePolicy {
        SubscriptionFailurePolicy {
            max_redelivery_count,
            ack_timeout_ms: 1_000,
            base_redelivery_delay_ms: 500,
            max_redelivery_delay_ms: 60_000,
            backoff_strategy: BackoffStrategy::Exponential,
            poison_policy: PoisonPolicy::DeadLetter,
            dead_letter_topic: Some("/default/jobs-dlq".into()),
        }
    }

    fn subscription(kind: SubscriptionType, durable: bool, max_redeliveries: u32) -> Subscription {
        let meta = SubscriptionMeta {
            subscription_type: kind,
            durable,
            paused: false,
            created_ms: 0,
        };
        let dispatcher = Dispatcher::new(0, policy(max_redeliveries), PersistPolicy::default(), 0);
        Subscription::new(dispatcher, meta, durable, TIMINGS, 0)
    }

    fn lease(offset: u64, attempt: u32, deadline_ms: i64) -> Lease {
        Lease {
            offset,
            attempt,
            deadline_ms,
        }
    }

    #[test]
    fn a_lease_that_times_out_is_redelivered_after_the_backoff_then_dead_lettered() {
        let mut sub = subscription(SubscriptionType::Shared, true, 1);
        assert_eq!(
            sub.attach(0, SubscriptionType::Shared, None, || 7),
            Ok((7, true))
        );
        assert_eq!(sub.lease(0, 7, 10, 1), (vec![lease(0, 1, 1_000)], vec![]));
        // The deadline passes at 1000: a failed delivery, redelivery after
        // the base delay (500 ms), not before.
        let tick = sub.tick(1_000).expect("not removed");
        assert_eq!(tick.actions, vec![]);
        assert_eq!(sub.dispatcher().poll_timeout(), Some(1_500));
        assert_eq!(sub.lease(1_499, 7, 10, 1), (vec![], vec![]));
        assert_eq!(
            sub.lease(1_500, 7, 10, 1),
            (vec![lease(0, 2, 2_500)], vec![])
        );
        // The second timeout exceeds max_redelivery_count 1: dead letter.
        let tick = sub.tick(2_500).expect("not removed");
        let dead_letter = Action::DeadLetter {
            offset: 0,
            attempt: 2,
            reason: "ack timeout".into(),
        };
        assert_eq!(tick.actions, vec![dead_letter]);
        assert!(sub.dead_letter_pending(0));
        let copies = sub.take_dead_letters();
        let copy = DeadLetterCopy {
            offset: 0,
            attempt: 2,
            reason: "ack timeout".into(),
            dead_letter_topic: Some("/default/jobs-dlq".into()),
            poison_policy: PoisonPolicy::DeadLetter,
        };
        assert_eq!(copies, vec![copy.clone()]);
        assert!(!sub.dead_letter_pending(0));
        // A failed copy is handed out again; a confirmed one finishes it.
        sub.dead_letter_failed(copy.clone());
        assert_eq!(sub.take_dead_letters(), vec![copy.clone()]);
        assert_eq!(sub.dispatcher().cursor(), 0);
        sub.dead_letter_copied(&copy);
        assert_eq!(sub.dispatcher().cursor(), 1);
        assert_eq!(sub.take_dead_letters(), vec![]);
    }

    #[test]
    fn an_ephemeral_subscription_ends_when_its_last_session_expires() {
        let mut sub = subscription(SubscriptionType::Shared, false, 3);
        assert_eq!(
            sub.attach(0, SubscriptionType::Shared, None, || 1),
            Ok((1, true))
        );
        assert_eq!(sub.touch(10_000, 1), Ok(()));
        // 30 s of silence is allowed; longer ends the session.
        assert_eq!(sub.tick(40_000).expect("live").expired, vec![]);
        assert!(!sub.end_if_unused());
        let tick = sub.tick(40_001).expect("live");
        assert_eq!(tick.expired, vec![(1, 0)]);
        assert!(!tick.refresh_policy, "ephemeral policies are not re-read");
        assert_eq!(sub.touch(40_001, 1), Err(SessionError::NoSession));
        assert!(sub.end_if_unused());
        assert!(!sub.end_if_unused(), "ends once");
        assert_eq!(sub.tick(40_002), None);
        assert_eq!(sub.touch(40_002, 1), Err(SessionError::Removed));
        assert_eq!(sub.poll_persist(40_002, true), None);
    }

    #[test]
    fn failover_moves_to_the_next_session_when_the_active_one_expires() {
        let mut sub = subscription(SubscriptionType::Failover, true, 3);
        assert_eq!(
            sub.attach(0, SubscriptionType::Failover, None, || 1),
            Ok((1, true))
        );
        assert_eq!(
            sub.attach(5, SubscriptionType::Failover, Some("b".into()), || 2),
            Ok((2, false))
        );
        assert_eq!(sub.lease(5, 2, 10, 3), (vec![], vec![]), "standby");
        let leased = sub.lease(5, 1, 2, 3).0;
        assert_eq!(leased, vec![lease(0, 1, 1_005), lease(1, 1, 1_005)]);
        assert_eq!(sub.touch(20_000, 2), Ok(()));
        // Consumer 1 is silent for over 30 s: its two leases come back
        // at once (no backoff) and consumer 2 takes over.
        let tick = sub.tick(30_001).expect("live");
        assert_eq!(tick.expired, vec![(1, 2)]);
        assert!(tick.refresh_policy);
        assert_eq!(sub.active_consumer(), Some(2));
        assert!(sub.is_active(2));
        assert_eq!(
            sub.lease(30_001, 2, 10, 3).0,
            vec![
                lease(0, 2, 31_001),
                lease(1, 2, 31_001),
                lease(2, 1, 31_001)
            ]
        );
        let consumers = sub.consumers();
        assert_eq!(consumers.len(), 1);
        assert_eq!(
            (
                consumers[0].consumer_id,
                consumers[0].active,
                consumers[0].last_seen_ms
            ),
            (2, true, 20_000)
        );
        // Durable: not ended by losing its sessions.
        let _ = sub.detach(30_002, 2);
        assert!(!sub.end_if_unused());
    }

    #[test]
    fn exclusive_refuses_a_second_session_and_every_type_refuses_a_mismatch() {
        let mut sub = subscription(SubscriptionType::Exclusive, true, 3);
        assert_eq!(
            sub.attach(0, SubscriptionType::Shared, None, || 1),
            Err(AttachRefusal::TypeMismatch {
                existing: SubscriptionType::Exclusive
            })
        );
        assert_eq!(
            sub.attach(0, SubscriptionType::Exclusive, None, || 1),
            Ok((1, true))
        );
        assert_eq!(
            sub.attach(1, SubscriptionType::Exclusive, None, || unreachable!()),
            Err(AttachRefusal::Busy { holder: 1 })
        );
        assert_eq!(sub.detach(2, 1), 0);
        assert_eq!(
            sub.attach(3, SubscriptionType::Exclusive, None, || 2),
            Ok((2, true))
        );
    }

    #[test]
    fn paused_delivers_nothing_and_a_policy_change_is_applied_once() {
        let mut sub = subscription(SubscriptionType::Shared, true, 3);
        let _ = sub.attach(0, SubscriptionType::Shared, None, || 1);
        sub.set_paused(true);
        assert_eq!(sub.lease(0, 1, 10, 5), (vec![], vec![]));
        sub.set_paused(false);
        assert_eq!(sub.lease(0, 1, 1, 5).0, vec![lease(0, 1, 1_000)]);
        assert!(!sub.set_policy(policy(3)));
        assert!(sub.set_policy(policy(0)));
        assert_eq!(sub.dispatcher().policy(), &policy(0));
        // Refresh is due every 2 s from the load.
        assert!(!sub.tick(1_999).expect("live").refresh_policy);
        assert!(sub.tick(2_000).expect("live").refresh_policy);
        assert!(!sub.tick(3_999).expect("live").refresh_policy);
    }
}
