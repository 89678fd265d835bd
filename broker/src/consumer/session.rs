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
use super::damage::DamageWait;
use tributary_api::consumer::Gap;

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
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AttachRefusal {
    /// The subscription has another type.
    TypeMismatch {
        /// Its type.
        existing: SubscriptionType,
    },
    /// Exclusive, and another live consumer session (of another name)
    /// holds it.
    Busy {
        /// The attached consumer.
        holder: u64,
        /// Its `consumer_name`, if it gave one.
        holder_name: Option<String>,
        /// When its session expires unless it calls again, ms from now.
        expires_in_ms: i64,
    },
}

/// An accepted attach.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Attached {
    /// The new session's id.
    pub consumer_id: u64,
    /// Whether it receives now.
    pub active: bool,
    /// The earlier session of the same `consumer_name` it replaced (ended
    /// at once, its leases ready for redelivery), with how many leases it
    /// gave back.
    pub replaced: Option<(u64, usize)>,
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
    /// Why the last dead-letter copy was refused by the policy check (the
    /// refusal already logged), until a copy succeeds.
    dead_letter_refusal: Option<String>,
    last_policy_refresh_ms: i64,
    removed: bool,
    /// A session was ever attached: an ephemeral subscription ends only
    /// after its last session did, never between its creation and the
    /// attach that created it (a tick may run in between).
    ever_attached: bool,
    /// The damaged range delivery waits or is blocked at.
    damage: Option<DamageWait>,
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
            dead_letter_refusal: None,
            last_policy_refresh_ms: now_ms,
            removed: false,
            ever_attached: false,
            damage: None,
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

    /// The damaged range delivery waits or is blocked at.
    pub fn damage(&self) -> Option<&DamageWait> {
        self.damage.as_ref()
    }

    /// The offset nothing is leased at or past: the high-water mark, or a
    /// known damaged range's first offset below it.
    pub fn lease_limit(&self, high_water_mark: u64) -> u64 {
        self.damage
            .as_ref()
            .map_or(high_water_mark, |d| d.first.min(high_water_mark))
    }

    /// A read stopped at damaged `gap` at `now_ms`: remembered as the range
    /// delivery waits at (the earliest one wins; the wait of a range already
    /// known keeps its start). Returns whether it is new.
    pub fn note_damage(&mut self, gap: &Gap, now_ms: i64) -> bool {
        match &mut self.damage {
            Some(d) if d.first == gap.first_offset => {
                d.end = gap.end_offset;
                d.reason.clone_from(&gap.reason);
                false
            }
            Some(d) if d.first < gap.first_offset => false,
            _ => {
                self.damage = Some(DamageWait {
                    first: gap.first_offset,
                    end: gap.end_offset,
                    reason: gap.reason.clone(),
                    since_ms: now_ms,
                    blocked: false,
                });
                true
            }
        }
    }

    /// The damaged range healed or was skipped; returns whether one was
    /// known.
    pub fn clear_damage(&mut self) -> bool {
        self.damage.take().is_some()
    }

    /// Poison policy `block` at the damaged range.
    pub fn block_damage(&mut self) {
        if let Some(d) = &mut self.damage {
            d.blocked = true;
        }
    }

    /// Moves past the damaged range (its dead-letter entry is written):
    /// finishes its offsets without delivering them. Returns false (nothing
    /// changes) if delivery has not reached it.
    pub fn skip_damage(&mut self) -> bool {
        let Some(d) = &self.damage else {
            return false;
        };
        if !self.dispatcher.skip_range(d.first, d.end) {
            return false;
        }
        self.damage = None;
        true
    }

    /// Takes back the leases of `offsets` that could not be read (never
    /// handed to the consumer) at `now_ms`.
    pub fn return_unread(&mut self, offsets: impl IntoIterator<Item = u64>, now_ms: i64) {
        for offset in offsets {
            let _ = self.dispatcher.return_unread(offset, now_ms);
        }
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
    /// `next_id` (called only if the attach is accepted).
    ///
    /// A consumer re-attaching with the `name` of a session that still
    /// exists (it restarted before its old session timed out) takes that
    /// session over at once: the old session ends and its leases are ready
    /// for redelivery. Failover keeps its order: the new session is the
    /// newest.
    ///
    /// # Errors
    /// [`AttachRefusal`] for another type, or an exclusive subscription
    /// held by a session of another name.
    pub fn attach(
        &mut self,
        now_ms: i64,
        requested: SubscriptionType,
        name: Option<String>,
        next_id: impl FnOnce() -> u64,
    ) -> Result<Attached, AttachRefusal> {
        if self.meta.subscription_type != requested {
            return Err(AttachRefusal::TypeMismatch {
                existing: self.meta.subscription_type,
            });
        }
        let same_name = name.as_ref().and_then(|n| {
            self.sessions
                .iter()
                .find(|(_, s)| s.name.as_ref() == Some(n))
                .map(|(&id, _)| id)
        });
        if self.meta.subscription_type == SubscriptionType::Exclusive
            && let Some(holder) = self.active_consumer()
            && Some(holder) != same_name
        {
            let session = &self.sessions[&holder];
            let expires_at = session
                .last_seen_ms
                .saturating_add(self.timings.session_timeout_ms)
                .saturating_add(1);
            return Err(AttachRefusal::Busy {
                holder,
                holder_name: session.name.clone(),
                expires_in_ms: expires_at.saturating_sub(now_ms).max(0),
            });
        }
        let replaced = same_name.map(|old| {
            let (held, _) = self.end_failed(now_ms, old, "consumer session taken over");
            (old, held)
        });
        let consumer = next_id();
        self.ever_attached = true;
        self.sessions.insert(
            consumer,
            Session {
                name,
                last_seen_ms: now_ms,
            },
        );
        Ok(Attached {
            consumer_id: consumer,
            active: self.is_active(consumer),
            replaced,
        })
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

    /// Ends session `consumer` that timed out or was taken over: each lease
    /// it held is a failed delivery (`reason`), redelivered at once or
    /// given to the poison policy ([`Dispatcher::release_failed`]; a
    /// dead-letter copy is queued). Returns how many leases it held.
    fn end_failed(&mut self, now_ms: i64, consumer: u64, reason: &str) -> (usize, Vec<Action>) {
        self.sessions.remove(&consumer);
        let held = self.dispatcher.in_flight_of(consumer);
        let actions = self.dispatcher.release_failed(consumer, now_ms, reason);
        self.queue_dead_letters(&actions);
        (held, actions)
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
        let mut actions = Vec::new();
        let expired = expired
            .into_iter()
            .map(|id| {
                let (held, poison) = self.end_failed(now_ms, id, "consumer session timed out");
                actions.extend(poison);
                (id, held)
            })
            .collect();
        let timed_out = self.dispatcher.on_timeout(now_ms);
        self.queue_dead_letters(&timed_out);
        actions.extend(timed_out);
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
        if self.durable || self.removed || !self.ever_attached || !self.sessions.is_empty() {
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
        self.damage = None;
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

    /// Records that dead-letter copies are refused for `why` (a policy
    /// error); true when that is news (not the refusal recorded last), so
    /// it is logged once, not on every retry.
    pub fn note_dead_letter_refusal(&mut self, why: &str) -> bool {
        if self.dead_letter_refusal.as_deref() == Some(why) {
            return false;
        }
        self.dead_letter_refusal = Some(why.to_owned());
        true
    }

    /// Why dead-letter copies are refused, while they are (the last
    /// refusal noted, until a copy is made).
    pub fn dead_letter_refused(&self) -> Option<&str> {
        self.dead_letter_refusal.as_deref()
    }

    /// A dead-letter copy was made: a later refusal is news again.
    pub fn clear_dead_letter_refusal(&mut self) {
        self.dead_letter_refusal = None;
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

    fn attached(consumer_id: u64, active: bool) -> Result<Attached, AttachRefusal> {
        Ok(Attached {
            consumer_id,
            active,
            replaced: None,
        })
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
            attached(7, true)
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
        // Created, not yet attached (a tick between the two steps of an
        // attach): it does not end. Under a loaded test run this removed
        // the subscription its attach was about to join.
        assert_eq!(sub.tick(0).map(|t| t.expired), Some(vec![]));
        assert!(!sub.end_if_unused());
        assert_eq!(
            sub.attach(0, SubscriptionType::Shared, None, || 1),
            attached(1, true)
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
            attached(1, true)
        );
        assert_eq!(
            sub.attach(5, SubscriptionType::Failover, Some("b".into()), || 2),
            attached(2, false)
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
            attached(1, true)
        );
        assert_eq!(
            sub.attach(1, SubscriptionType::Exclusive, None, || unreachable!()),
            Err(AttachRefusal::Busy {
                holder: 1,
                holder_name: None,
                expires_in_ms: 30_000
            })
        );
        assert_eq!(sub.detach(2, 1), 0);
        assert_eq!(
            sub.attach(3, SubscriptionType::Exclusive, None, || 2),
            attached(2, true)
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

    #[test]
    fn a_consumer_reattaching_with_its_name_takes_over_its_own_session_at_once() {
        let mut sub = subscription(SubscriptionType::Exclusive, true, 3);
        assert_eq!(
            sub.attach(0, SubscriptionType::Exclusive, Some("a".into()), || 1),
            attached(1, true)
        );
        assert_eq!(
            sub.lease(0, 1, 2, 5).0,
            vec![lease(0, 1, 1_000), lease(1, 1, 1_000)]
        );
        // Another name: refused, naming the holder and when it expires.
        assert_eq!(
            sub.attach(10_000, SubscriptionType::Exclusive, Some("b".into()), || 9),
            Err(AttachRefusal::Busy {
                holder: 1,
                holder_name: Some("a".into()),
                expires_in_ms: 20_001
            })
        );
        // The same name (the process restarted): takes over at once, the
        // two leases come back without waiting for their deadline.
        assert_eq!(
            sub.attach(10_000, SubscriptionType::Exclusive, Some("a".into()), || 2),
            Ok(Attached {
                consumer_id: 2,
                active: true,
                replaced: Some((1, 2))
            })
        );
        assert_eq!(sub.touch(10_001, 1), Err(SessionError::NoSession));
        assert_eq!(
            sub.lease(10_001, 2, 3, 5).0,
            vec![
                lease(0, 2, 11_001),
                lease(1, 2, 11_001),
                lease(2, 1, 11_001)
            ]
        );
        // Shared: the same rule, other names are untouched.
        let mut shared = subscription(SubscriptionType::Shared, true, 3);
        let _ = shared.attach(0, SubscriptionType::Shared, Some("x".into()), || 1);
        let _ = shared.attach(0, SubscriptionType::Shared, Some("y".into()), || 2);
        let again = shared.attach(5, SubscriptionType::Shared, Some("x".into()), || 3);
        assert_eq!(again.map(|a| a.replaced), Ok(Some((1, 0))));
        let ids: Vec<u64> = shared.consumers().iter().map(|c| c.consumer_id).collect();
        assert_eq!(ids, vec![2, 3]);
        // A message that crashes its consumer each time: every take-over
        // counts as a failed delivery, so after max_redelivery_count (3)
        // redeliveries it is dead-lettered instead of looping for ever (a
        // trial reached attempt 4 with a limit of 1 and no dead letter).
        let mut crashing = subscription(SubscriptionType::Exclusive, true, 3);
        let _ = crashing.attach(0, SubscriptionType::Exclusive, Some("w".into()), || 100);
        for restart in 0..4u64 {
            let consumer = 100 + restart;
            let leased = crashing.lease(0, consumer, 1, 5).0;
            assert_eq!(leased.len(), 1, "restart {restart}");
            assert_eq!(
                (leased[0].offset, leased[0].attempt),
                (0, restart as u32 + 1)
            );
            let _ = crashing.attach(0, SubscriptionType::Exclusive, Some("w".into()), || {
                consumer + 1
            });
        }
        let copies = crashing.take_dead_letters();
        assert_eq!(copies.len(), 1, "{copies:?}");
        assert_eq!((copies[0].offset, copies[0].attempt), (0, 4));
        assert_eq!(copies[0].reason, "consumer session taken over");
    }
}
