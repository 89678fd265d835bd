//! One subscription's delivery state, without I/O: cursor, per-message
//! leases, redelivery with backoff, poison handling (dead letter, block,
//! drop) and batched cursor persistence. The broker's consumer API drives it;
//! time arrives as `now_ms` arguments (ms since the Unix epoch).
//!
//! Semantics (seed pages `000_…` for failure policies, `002_…` for cursors
//! and leases):
//! - The **cursor** is the offset below which everything is finished
//!   (acknowledged, dead-lettered or dropped). It only moves forward, except
//!   by [`Dispatcher::seek`].
//! - **Leases**: [`Dispatcher::lease`] hands out ready redeliveries first
//!   (lowest offset first), then new offsets up to the high-water mark, each
//!   with a visibility deadline of `ack_timeout_ms`. A lease that is neither
//!   acknowledged nor nacked by its deadline counts as a failed delivery.
//!   Leased messages never block their siblings.
//! - **Redelivery**: after failed delivery number `n` (1-based), the message
//!   is delivered again after `policy.redelivery_delay_ms(n)` — while
//!   `n <= max_redelivery_count`. After that the poison policy applies:
//!   `dead_letter` asks the driver to copy it to the dead-letter topic
//!   ([`Action::DeadLetter`]) and finishes it only once the driver confirms
//!   ([`Dispatcher::dead_lettered`]), so a crash in between redelivers rather
//!   than loses it; `block` halts delivery of every later offset until it is
//!   acknowledged, the policy changes ([`Dispatcher::set_policy`]) or an admin
//!   seeks past it; `none` drops it.
//! - **Cursor reads**: [`Dispatcher::ack_up_to`] acknowledges everything
//!   below an offset at once; acknowledging an older offset is a no-op.
//! - **Persistence**: [`Dispatcher::poll_persist`] says when to write the
//!   cursor: every `persist_every_acks` acknowledgements or
//!   `persist_interval_ms`, whichever first. After a crash, delivery resumes
//!   from the persisted cursor: at-least-once, redelivering at most what was
//!   acknowledged since.

use std::collections::BTreeMap;

use crate::intent::{PoisonPolicy, SubscriptionFailurePolicy};

/// Who holds a lease (the driver's consumer session id).
pub type ConsumerId = u64;

/// One message leased to a consumer: which offset, which attempt, and
/// until when (not a topic's [`crate::intent::Delivery`] guarantee).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    /// The message's offset.
    pub offset: u64,
    /// 1 for the first delivery, 2 for the first redelivery, ...
    pub attempt: u32,
    /// When the lease expires, ms since the Unix epoch.
    pub deadline_ms: i64,
}

/// Something the driver must do.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum Action {
    /// Copy `offset` to the dead-letter topic with the origin headers, then
    /// call [`Dispatcher::dead_lettered`].
    DeadLetter {
        /// The poison message.
        offset: u64,
        /// Deliveries made (`x-delivery-attempt`).
        attempt: u32,
        /// Why the last delivery failed (`x-failure-reason`).
        reason: String,
    },
    /// Delivery halts at `offset` (poison policy `block`).
    Blocked {
        /// The poison message.
        offset: u64,
    },
    /// `offset` was dropped (poison policy `none`).
    Dropped {
        /// The dropped message.
        offset: u64,
    },
}

/// Outcome of an acknowledgement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckOutcome {
    /// Recorded; the cursor is now at `cursor`.
    Acked {
        /// The cursor after the acknowledgement.
        cursor: u64,
    },
    /// Already finished or never delivered: nothing changed.
    NoOp,
}

/// Errors of dispatcher calls.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DispatchError {
    /// A nack for a message the caller does not hold a lease on.
    #[error("offset {offset} is not leased to consumer {consumer}")]
    NotLeased {
        /// The offset.
        offset: u64,
        /// The caller.
        consumer: ConsumerId,
    },
    /// An acknowledgement beyond what exists.
    #[error("offset {offset} is beyond the high-water mark {high_water_mark}")]
    BeyondEnd {
        /// The offset.
        offset: u64,
        /// The topic's high-water mark.
        high_water_mark: u64,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum SlotState {
    Leased {
        consumer: ConsumerId,
        deadline_ms: i64,
    },
    Ready {
        at_ms: i64,
    },
    AwaitingDeadLetter,
    Done,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Slot {
    attempts: u32,
    state: SlotState,
}

/// When the cursor is written (defaults from the seed: 1000 acks or 5 s).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PersistPolicy {
    /// Write after this many acknowledgements.
    pub every_acks: u32,
    /// Write after this long, ms.
    pub interval_ms: i64,
}

impl Default for PersistPolicy {
    fn default() -> Self {
        PersistPolicy {
            every_acks: 1000,
            interval_ms: 5000,
        }
    }
}

/// Most ranges [`Dispatcher::done_above`] reports.
pub const MAX_DONE_RANGES: usize = 256;

/// Most offsets [`Dispatcher::restore_done`] marks finished.
pub const MAX_RESTORED_OFFSETS: u64 = 1 << 20;

/// One subscription's delivery state.
#[derive(Debug, Clone)]
pub struct Dispatcher {
    policy: SubscriptionFailurePolicy,
    persist: PersistPolicy,
    cursor: u64,
    next_new: u64,
    slots: BTreeMap<u64, Slot>,
    blocked_at: Option<u64>,
    persisted: u64,
    acks_since_persist: u32,
    last_persist_ms: i64,
}

impl Dispatcher {
    /// A dispatcher resuming at `cursor` (the persisted cursor or the
    /// subscription's start position).
    pub fn new(
        cursor: u64,
        policy: SubscriptionFailurePolicy,
        persist: PersistPolicy,
        now_ms: i64,
    ) -> Dispatcher {
        Dispatcher {
            policy,
            persist,
            cursor,
            next_new: cursor,
            slots: BTreeMap::new(),
            blocked_at: None,
            persisted: cursor,
            acks_since_persist: 0,
            last_persist_ms: now_ms,
        }
    }

    /// Everything below this offset is finished.
    pub fn cursor(&self) -> u64 {
        self.cursor
    }

    /// The offset delivery is halted at (poison policy `block`).
    pub fn blocked_at(&self) -> Option<u64> {
        self.blocked_at
    }

    /// Messages leased and not yet acknowledged.
    pub fn in_flight(&self) -> usize {
        self.slots
            .values()
            .filter(|s| matches!(s.state, SlotState::Leased { .. }))
            .count()
    }

    /// Leases `consumer` holds.
    pub fn in_flight_of(&self, consumer: ConsumerId) -> usize {
        self.slots
            .values()
            .filter(|s| matches!(s.state, SlotState::Leased { consumer: c, .. } if c == consumer))
            .count()
    }

    /// The next offset never leased yet.
    pub fn next_new(&self) -> u64 {
        self.next_new
    }

    /// Leases up to `max` messages to `consumer`: due redeliveries first,
    /// then new offsets, all below `high_water_mark` (the driver passes a
    /// lower limit to lease nothing at or past an offset it cannot read).
    /// Expired leases are processed first; their actions are returned too.
    pub fn lease(
        &mut self,
        now_ms: i64,
        consumer: ConsumerId,
        max: usize,
        high_water_mark: u64,
    ) -> (Vec<Lease>, Vec<Action>) {
        let actions = self.on_timeout(now_ms);
        let deadline_ms = now_ms.saturating_add(self.policy.ack_timeout_ms as i64);
        let mut out = Vec::new();
        for (&offset, slot) in self.slots.iter_mut() {
            if out.len() >= max {
                break;
            }
            if self.blocked_at.is_some_and(|b| offset > b) || offset >= high_water_mark {
                break;
            }
            if let SlotState::Ready { at_ms } = slot.state
                && at_ms <= now_ms
            {
                slot.attempts += 1;
                slot.state = SlotState::Leased {
                    consumer,
                    deadline_ms,
                };
                out.push(Lease {
                    offset,
                    attempt: slot.attempts,
                    deadline_ms,
                });
            }
        }
        while out.len() < max && self.next_new < high_water_mark && self.blocked_at.is_none() {
            let offset = self.next_new;
            self.next_new += 1;
            if self
                .slots
                .get(&offset)
                .is_some_and(|s| s.state == SlotState::Done)
            {
                // Finished before a restart or a move ([`Dispatcher::restore_done`]).
                continue;
            }
            self.slots.insert(
                offset,
                Slot {
                    attempts: 1,
                    state: SlotState::Leased {
                        consumer,
                        deadline_ms,
                    },
                },
            );
            out.push(Lease {
                offset,
                attempt: 1,
                deadline_ms,
            });
        }
        (out, actions)
    }

    /// Acknowledges one message. Acknowledging a finished or never-delivered
    /// offset is a no-op.
    pub fn ack(&mut self, offset: u64) -> AckOutcome {
        let Some(slot) = self.slots.get_mut(&offset) else {
            return AckOutcome::NoOp;
        };
        if slot.state == SlotState::Done {
            return AckOutcome::NoOp;
        }
        slot.state = SlotState::Done;
        if self.blocked_at == Some(offset) {
            self.blocked_at = None;
        }
        self.acks_since_persist += 1;
        self.advance();
        AckOutcome::Acked {
            cursor: self.cursor,
        }
    }

    /// Acknowledges one message on behalf of `consumer` (per-message leases).
    /// A message leased to another consumer is refused; a message whose
    /// lease already expired (waiting for redelivery) is accepted as a late
    /// acknowledgement; a finished or never-delivered offset is a no-op.
    ///
    /// # Errors
    /// [`DispatchError::NotLeased`] if another consumer holds the lease.
    pub fn ack_by(
        &mut self,
        consumer: ConsumerId,
        offset: u64,
    ) -> Result<AckOutcome, DispatchError> {
        if let Some(Slot {
            state: SlotState::Leased {
                consumer: holder, ..
            },
            ..
        }) = self.slots.get(&offset)
            && *holder != consumer
        {
            return Err(DispatchError::NotLeased { offset, consumer });
        }
        Ok(self.ack(offset))
    }

    /// Gives back every lease `consumer` holds (its session ended): each
    /// message is ready for redelivery at `now_ms`, without counting a failed
    /// delivery. Returns how many leases were released.
    pub fn release(&mut self, consumer: ConsumerId, now_ms: i64) -> usize {
        let mut released = 0;
        for slot in self.slots.values_mut() {
            if let SlotState::Leased {
                consumer: holder, ..
            } = slot.state
                && holder == consumer
            {
                slot.state = SlotState::Ready { at_ms: now_ms };
                released += 1;
            }
        }
        released
    }

    /// Ends every lease `consumer` holds as a failed delivery (its session
    /// timed out or was taken over: the consumer died or restarted while
    /// holding them, perhaps because of them): each is ready again at once
    /// while its attempts allow, past `max_redelivery_count` the poison
    /// policy applies, as for a nack with no delay. So a message that
    /// crashes its consumer every time reaches the policy instead of
    /// looping. Returns the poison actions.
    pub fn release_failed(
        &mut self,
        consumer: ConsumerId,
        now_ms: i64,
        reason: &str,
    ) -> Vec<Action> {
        let held: Vec<u64> = self
            .slots
            .iter()
            .filter_map(|(&offset, slot)| match slot.state {
                SlotState::Leased {
                    consumer: holder, ..
                } if holder == consumer => Some(offset),
                _ => None,
            })
            .collect();
        held.into_iter()
            .filter_map(|offset| self.fail(now_ms, offset, Some(0), reason))
            .collect()
    }

    /// Takes back the lease of `offset` that the driver could not read (so
    /// never handed to the consumer): it is ready again at `now_ms` and the
    /// attempt does not count. Returns whether it was leased.
    pub fn return_unread(&mut self, offset: u64, now_ms: i64) -> bool {
        match self.slots.get_mut(&offset) {
            Some(slot) if matches!(slot.state, SlotState::Leased { .. }) => {
                slot.attempts = slot.attempts.saturating_sub(1);
                slot.state = SlotState::Ready { at_ms: now_ms };
                true
            }
            _ => false,
        }
    }

    /// Finishes `first..end` without delivering it: an unreadable range the
    /// poison policy moved past (its dead-letter entry is written). Leases
    /// and redeliveries in it are forgotten. Refused (returns false, nothing
    /// changes) unless every offset below `first` was leased at least once
    /// (`first <= next_new`), so nothing before the range is skipped.
    pub fn skip_range(&mut self, first: u64, end: u64) -> bool {
        if first > self.next_new || end <= first {
            return false;
        }
        if self.cursor >= first {
            self.slots = self.slots.split_off(&end);
            self.cursor = self.cursor.max(end);
        } else {
            self.mark_done(first, end);
        }
        self.next_new = self.next_new.max(end);
        if self.blocked_at.is_some_and(|b| first <= b && b < end) {
            self.blocked_at = None;
        }
        self.acks_since_persist += 1;
        self.advance();
        true
    }

    /// The failure policy in force.
    pub fn policy(&self) -> &SubscriptionFailurePolicy {
        &self.policy
    }

    /// The last cursor [`Dispatcher::poll_persist`] handed out (or the
    /// starting cursor).
    pub fn persisted_cursor(&self) -> u64 {
        self.persisted
    }

    /// Cursor-read acknowledgement: everything below `offset` is finished.
    /// An offset at or below the cursor is a no-op.
    ///
    /// # Errors
    /// [`DispatchError::BeyondEnd`] past `high_water_mark`.
    pub fn ack_up_to(
        &mut self,
        offset: u64,
        high_water_mark: u64,
    ) -> Result<AckOutcome, DispatchError> {
        if offset > high_water_mark {
            return Err(DispatchError::BeyondEnd {
                offset,
                high_water_mark,
            });
        }
        if offset <= self.cursor {
            return Ok(AckOutcome::NoOp);
        }
        self.acks_since_persist += 1;
        self.cursor = offset;
        self.next_new = self.next_new.max(offset);
        self.slots = self.slots.split_off(&offset);
        if self.blocked_at.is_some_and(|b| b < offset) {
            self.blocked_at = None;
        }
        self.advance();
        Ok(AckOutcome::Acked {
            cursor: self.cursor,
        })
    }

    /// Negative acknowledgement: delivery failed for `reason`; redeliver
    /// after the policy's backoff (or `delay_ms` if given) or apply the
    /// poison policy.
    ///
    /// # Errors
    /// [`DispatchError::NotLeased`] unless `consumer` holds the lease.
    pub fn nack(
        &mut self,
        now_ms: i64,
        consumer: ConsumerId,
        offset: u64,
        delay_ms: Option<u64>,
        reason: &str,
    ) -> Result<Option<Action>, DispatchError> {
        match self.slots.get(&offset).map(|s| &s.state) {
            Some(SlotState::Leased {
                consumer: holder, ..
            }) if *holder == consumer => {}
            _ => return Err(DispatchError::NotLeased { offset, consumer }),
        }
        Ok(self.fail(now_ms, offset, delay_ms, reason))
    }

    /// Processes expired leases as failed deliveries ("ack timeout").
    pub fn on_timeout(&mut self, now_ms: i64) -> Vec<Action> {
        let expired: Vec<u64> = self
            .slots
            .iter()
            .filter_map(|(&offset, slot)| match slot.state {
                SlotState::Leased { deadline_ms, .. } if deadline_ms <= now_ms => Some(offset),
                _ => None,
            })
            .collect();
        expired
            .into_iter()
            .filter_map(|offset| self.fail(now_ms, offset, None, "ack timeout"))
            .collect()
    }

    fn fail(
        &mut self,
        now_ms: i64,
        offset: u64,
        delay_ms: Option<u64>,
        reason: &str,
    ) -> Option<Action> {
        let policy = &self.policy;
        let slot = self.slots.get_mut(&offset)?;
        let failed = slot.attempts;
        if failed <= policy.max_redelivery_count {
            let delay = delay_ms.unwrap_or_else(|| policy.redelivery_delay_ms(failed));
            slot.state = SlotState::Ready {
                at_ms: now_ms.saturating_add(delay as i64),
            };
            return None;
        }
        match policy.poison_policy {
            PoisonPolicy::DeadLetter => {
                slot.state = SlotState::AwaitingDeadLetter;
                Some(Action::DeadLetter {
                    offset,
                    attempt: failed,
                    reason: reason.to_string(),
                })
            }
            PoisonPolicy::Block => {
                // It stays deliverable (someone must be able to ack it),
                // at the longest delay; nothing after it is delivered.
                slot.state = SlotState::Ready {
                    at_ms: now_ms.saturating_add(policy.max_redelivery_delay_ms as i64),
                };
                self.blocked_at = Some(self.blocked_at.map_or(offset, |b| b.min(offset)));
                Some(Action::Blocked { offset })
            }
            PoisonPolicy::None => {
                slot.state = SlotState::Done;
                self.advance();
                Some(Action::Dropped { offset })
            }
        }
    }

    /// Confirms that `offset` is durably in the dead-letter topic.
    pub fn dead_lettered(&mut self, offset: u64) -> AckOutcome {
        match self.slots.get(&offset).map(|s| &s.state) {
            Some(SlotState::AwaitingDeadLetter) => self.ack(offset),
            _ => AckOutcome::NoOp,
        }
    }

    /// Replaces the failure policy (an operator's override). A block caused
    /// by the old policy is lifted: the message is retried under the new one.
    pub fn set_policy(&mut self, policy: SubscriptionFailurePolicy) {
        self.policy = policy;
        self.blocked_at = None;
    }

    /// Moves the cursor to `offset` (admin seek): forgets all delivery state;
    /// the next lease starts there.
    pub fn seek(&mut self, offset: u64) {
        self.cursor = offset;
        self.next_new = offset;
        self.slots.clear();
        self.blocked_at = None;
        self.acks_since_persist = self.acks_since_persist.max(1);
    }

    /// The earliest instant something is due (a lease deadline or a
    /// redelivery), ms since the Unix epoch.
    pub fn poll_timeout(&self) -> Option<i64> {
        self.slots
            .values()
            .filter_map(|s| match s.state {
                SlotState::Leased { deadline_ms, .. } => Some(deadline_ms),
                SlotState::Ready { at_ms } => Some(at_ms),
                _ => None,
            })
            .min()
    }

    /// The cursor to persist now, if the batching policy says so (`force`
    /// for shutdown). The caller writes it to
    /// `/topics/{ns}/{topic}/subscriptions/{sub}/cursor`.
    pub fn poll_persist(&mut self, now_ms: i64, force: bool) -> Option<u64> {
        if self.cursor == self.persisted && self.acks_since_persist == 0 {
            return None;
        }
        let due = force
            || self.acks_since_persist >= self.persist.every_acks
            || now_ms.saturating_sub(self.last_persist_ms) >= self.persist.interval_ms;
        if !due {
            return None;
        }
        self.persisted = self.cursor;
        self.acks_since_persist = 0;
        self.last_persist_ms = now_ms;
        Some(self.cursor)
    }

    /// The offsets finished above the cursor (acknowledged or
    /// dead-lettered while an earlier one is still open), as `(first, end)`
    /// ranges, lowest first, at most [`MAX_DONE_RANGES`]. Persisted with
    /// the cursor, so a restart or a move does not deliver them again.
    pub fn done_above(&self) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = Vec::new();
        for (&offset, slot) in &self.slots {
            if slot.state != SlotState::Done {
                continue;
            }
            let full = out.len() == MAX_DONE_RANGES;
            match out.last_mut() {
                Some((_, end)) if *end == offset => *end += 1,
                _ if full => break,
                _ => out.push((offset, offset + 1)),
            }
        }
        out
    }

    /// Marks `ranges` (from [`Dispatcher::done_above`], stored with this
    /// cursor) finished: they are never leased. Offsets below the cursor
    /// are ignored; at most [`MAX_RESTORED_OFFSETS`] offsets are taken (a
    /// stored value is input from disk).
    pub fn restore_done(&mut self, ranges: &[(u64, u64)]) {
        let mut budget = MAX_RESTORED_OFFSETS;
        for &(first, end) in ranges {
            let first = first.max(self.cursor);
            let end = end.min(first.saturating_add(budget));
            self.mark_done(first, end);
            budget -= end.saturating_sub(first);
            if budget == 0 {
                break;
            }
        }
        self.advance();
        self.next_new = self.next_new.max(self.cursor);
    }

    /// Marks `first..end` finished (not advancing the cursor).
    fn mark_done(&mut self, first: u64, end: u64) {
        for offset in first..end {
            self.slots.insert(
                offset,
                Slot {
                    attempts: 0,
                    state: SlotState::Done,
                },
            );
        }
    }

    fn advance(&mut self) {
        while let Some(entry) = self.slots.first_entry() {
            if *entry.key() != self.cursor || entry.get().state != SlotState::Done {
                break;
            }
            entry.remove();
            self.cursor += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::intent::BackoffStrategy;

    fn policy(max_redelivery_count: u32, poison: PoisonPolicy) -> SubscriptionFailurePolicy {
        SubscriptionFailurePolicy {
            max_redelivery_count,
            ack_timeout_ms: 30_000,
            base_redelivery_delay_ms: 1000,
            max_redelivery_delay_ms: 60_000,
            backoff_strategy: BackoffStrategy::Exponential,
            poison_policy: poison,
            dead_letter_topic: Some("/default/jobs-dlq".into()),
        }
    }

    /// A dispatcher at `cursor`: 3 redeliveries, then the dead-letter topic.
    fn dead_letter_at(cursor: u64) -> Dispatcher {
        Dispatcher::new(
            cursor,
            policy(3, PoisonPolicy::DeadLetter),
            PersistPolicy::default(),
            0,
        )
    }

    fn offsets(deliveries: &[Lease]) -> Vec<u64> {
        deliveries.iter().map(|d| d.offset).collect()
    }

    #[test]
    fn leases_do_not_block_siblings_and_the_cursor_follows_the_acked_prefix() {
        let mut d = dead_letter_at(10);
        let (a, _) = d.lease(0, 1, 2, 20);
        let (b, _) = d.lease(0, 2, 2, 20);
        assert_eq!((offsets(&a), offsets(&b)), (vec![10, 11], vec![12, 13]));
        assert_eq!(d.ack(12), AckOutcome::Acked { cursor: 10 });
        assert_eq!(d.ack(10), AckOutcome::Acked { cursor: 11 });
        assert_eq!(d.ack(11), AckOutcome::Acked { cursor: 13 });
        assert_eq!(d.ack(11), AckOutcome::NoOp);
        assert_eq!(d.ack(99), AckOutcome::NoOp);
        assert_eq!(d.in_flight(), 1);
    }

    /// What is finished above the cursor survives a restart or a move:
    /// the trial's dead-lettered 581 above cursor 576 was delivered and
    /// dead-lettered again after a broker SIGKILL, and acknowledged
    /// messages above the cursor were redelivered after a move.
    #[test]
    fn offsets_finished_above_the_cursor_are_restored_and_never_leased_again() {
        let mut d = dead_letter_at(10);
        let (a, _) = d.lease(0, 1, 6, 20);
        assert_eq!(offsets(&a), vec![10, 11, 12, 13, 14, 15]);
        for o in [12, 13, 15] {
            assert_eq!(d.ack(o), AckOutcome::Acked { cursor: 10 });
        }
        assert_eq!(d.done_above(), vec![(12, 14), (15, 16)]);
        // Restored by the next owner, with the cursor it was stored with.
        let mut e = dead_letter_at(10);
        e.restore_done(&d.done_above());
        let (b, _) = e.lease(0, 1, 10, 18);
        assert_eq!(offsets(&b), vec![10, 11, 14, 16, 17]);
        assert_eq!(e.ack(10), AckOutcome::Acked { cursor: 11 });
        assert_eq!(e.ack(11), AckOutcome::Acked { cursor: 14 });
        assert_eq!(e.ack(14), AckOutcome::Acked { cursor: 16 });
        assert_eq!(e.done_above(), vec![]);
        // A range at the cursor moves it at once; ranges below it and
        // beyond the bound are ignored.
        let mut f = dead_letter_at(5);
        f.restore_done(&[(0, 3), (5, 7), (9, u64::MAX)]);
        assert_eq!(f.cursor(), 7);
        assert_eq!(f.lease(0, 1, 3, 100).0.len(), 2, "7 and 8 only");
        assert_eq!(
            f.done_above().first(),
            Some(&(9, 9 + MAX_RESTORED_OFFSETS - 2))
        );
    }

    #[test]
    fn an_unread_lease_is_taken_back_and_a_skipped_range_is_never_leased() {
        let mut d = dead_letter_at(0);
        // Leased 0..6; 3..6 could not be read: taken back, not an attempt.
        let (a, _) = d.lease(0, 1, 6, 10);
        assert_eq!(offsets(&a), vec![0, 1, 2, 3, 4, 5]);
        for o in 3..6 {
            assert!(d.return_unread(o, 0));
        }
        assert!(!d.return_unread(3, 0), "only a lease is taken back");
        assert_eq!(d.in_flight(), 3);
        // A limit below the returned offsets leases none of them.
        assert_eq!(d.lease(0, 1, 10, 3).0, vec![]);
        // Skipping 3..6 is refused until every offset before it was leased
        // (here it was), then finishes it: never leased again.
        assert!(!d.skip_range(7, 9), "7 was never leased: refused");
        assert!(d.skip_range(3, 6));
        assert_eq!(d.cursor(), 0);
        for o in 0..3 {
            let _ = d.ack(o);
        }
        assert_eq!(d.cursor(), 6);
        let (b, _) = d.lease(1, 1, 10, 8);
        assert_eq!(offsets(&b), vec![6, 7]);
        assert_eq!(b[0].attempt, 1);
        assert!(!d.skip_range(8, 8), "an empty range");
        // Skipping at the cursor moves it.
        let mut e = Dispatcher::new(
            5,
            policy(3, PoisonPolicy::Block),
            PersistPolicy::default(),
            0,
        );
        assert!(e.skip_range(5, 9));
        assert_eq!((e.cursor(), e.next_new()), (9, 9));
    }

    #[test]
    fn nack_redelivers_with_exponential_backoff_then_dead_letters() {
        let mut d = Dispatcher::new(
            0,
            policy(2, PoisonPolicy::DeadLetter),
            PersistPolicy::default(),
            0,
        );
        let (first, _) = d.lease(0, 1, 1, 1);
        assert_eq!(first[0].attempt, 1);
        assert_eq!(d.nack(0, 1, 0, None, "boom"), Ok(None));
        // Due after 1000 ms (attempt 1), not before.
        assert!(d.lease(999, 1, 1, 1).0.is_empty());
        let (second, _) = d.lease(1000, 1, 1, 1);
        assert_eq!((second[0].offset, second[0].attempt), (0, 2));
        assert_eq!(d.nack(1000, 1, 0, None, "boom"), Ok(None));
        // Attempt 2 failed: 2000 ms.
        assert!(d.lease(2999, 1, 1, 1).0.is_empty());
        let (third, _) = d.lease(3000, 1, 1, 1);
        assert_eq!(third[0].attempt, 3);
        // Third failure exceeds max_redelivery_count = 2.
        assert_eq!(
            d.nack(3000, 1, 0, None, "still broken"),
            Ok(Some(Action::DeadLetter {
                offset: 0,
                attempt: 3,
                reason: "still broken".into()
            }))
        );
        // Not finished until the copy is confirmed.
        assert_eq!(d.cursor(), 0);
        assert_eq!(d.dead_lettered(0), AckOutcome::Acked { cursor: 1 });
    }

    #[test]
    fn an_expired_lease_is_redelivered_to_another_consumer() {
        let mut d = Dispatcher::new(
            0,
            policy(5, PoisonPolicy::DeadLetter),
            PersistPolicy::default(),
            0,
        );
        let (a, _) = d.lease(0, 1, 1, 1);
        assert_eq!(a[0].deadline_ms, 30_000);
        assert!(d.lease(29_999, 2, 1, 1).0.is_empty());
        // Deadline at 30 s; first redelivery 1 s later.
        assert!(d.lease(30_000, 2, 1, 1).0.is_empty());
        let (b, _) = d.lease(31_000, 2, 1, 1);
        assert_eq!((b[0].offset, b[0].attempt), (0, 2));
        // The first consumer lost its lease.
        assert_eq!(
            d.nack(31_000, 1, 0, None, "late"),
            Err(DispatchError::NotLeased {
                offset: 0,
                consumer: 1
            })
        );
    }

    #[test]
    fn block_halts_later_offsets_until_acked_or_seeked() {
        let mut d = Dispatcher::new(
            0,
            policy(0, PoisonPolicy::Block),
            PersistPolicy::default(),
            0,
        );
        let (a, _) = d.lease(0, 1, 1, 5);
        assert_eq!(offsets(&a), vec![0]);
        assert_eq!(
            d.nack(0, 1, 0, None, "bad"),
            Ok(Some(Action::Blocked { offset: 0 }))
        );
        assert_eq!(d.blocked_at(), Some(0));
        // Nothing new is delivered; the poison message comes back after the
        // maximum delay so someone can acknowledge it.
        assert!(d.lease(59_999, 1, 10, 5).0.is_empty());
        let (again, _) = d.lease(60_000, 1, 10, 5);
        assert_eq!(offsets(&again), vec![0]);
        assert_eq!(d.ack(0), AckOutcome::Acked { cursor: 1 });
        assert_eq!(offsets(&d.lease(60_000, 1, 10, 5).0), vec![1, 2, 3, 4]);

        let mut d = Dispatcher::new(
            0,
            policy(0, PoisonPolicy::Block),
            PersistPolicy::default(),
            0,
        );
        let _ = d.lease(0, 1, 1, 5);
        let _ = d.nack(0, 1, 0, None, "bad");
        d.seek(1);
        assert_eq!(d.blocked_at(), None);
        assert_eq!(offsets(&d.lease(0, 1, 10, 5).0), vec![1, 2, 3, 4]);
    }

    #[test]
    fn a_policy_change_lifts_a_block() {
        let mut d = Dispatcher::new(
            0,
            policy(0, PoisonPolicy::Block),
            PersistPolicy::default(),
            0,
        );
        let _ = d.lease(0, 1, 1, 3);
        let _ = d.nack(0, 1, 0, None, "bad");
        d.set_policy(policy(0, PoisonPolicy::DeadLetter));
        assert_eq!(d.blocked_at(), None);
        // Offset 0 is still pending (redelivered at 60 s); later ones flow.
        assert_eq!(offsets(&d.lease(1, 1, 10, 3).0), vec![1, 2]);
    }

    #[test]
    fn cursor_reads_ack_up_to_and_older_acks_are_no_ops() {
        let mut d = dead_letter_at(0);
        assert_eq!(d.ack_up_to(5, 10), Ok(AckOutcome::Acked { cursor: 5 }));
        assert_eq!(d.ack_up_to(3, 10), Ok(AckOutcome::NoOp));
        assert_eq!(
            d.ack_up_to(11, 10),
            Err(DispatchError::BeyondEnd {
                offset: 11,
                high_water_mark: 10
            })
        );
        assert_eq!(offsets(&d.lease(0, 1, 2, 10).0), vec![5, 6]);
    }

    #[test]
    fn the_cursor_is_persisted_every_n_acks_or_interval_and_on_force() {
        let persist = PersistPolicy {
            every_acks: 3,
            interval_ms: 5000,
        };
        let mut d = Dispatcher::new(0, policy(3, PoisonPolicy::DeadLetter), persist, 0);
        let _ = d.lease(0, 1, 10, 10);
        assert_eq!(d.poll_persist(0, false), None);
        let _ = d.ack(0);
        let _ = d.ack(1);
        assert_eq!(d.poll_persist(100, false), None);
        let _ = d.ack(2);
        assert_eq!(d.poll_persist(100, false), Some(3));
        let _ = d.ack(3);
        assert_eq!(d.poll_persist(5099, false), None);
        assert_eq!(d.poll_persist(5100, false), Some(4));
        let _ = d.ack(4);
        assert_eq!(d.poll_persist(5101, true), Some(5));
        assert_eq!(d.poll_persist(99_999, true), None);
    }

    #[test]
    fn a_foreign_lease_cannot_be_acked_and_released_leases_come_back_at_once() {
        let mut d = dead_letter_at(0);
        let (a, _) = d.lease(0, 1, 2, 3);
        assert_eq!(offsets(&a), vec![0, 1]);
        assert_eq!(
            d.ack_by(2, 0),
            Err(DispatchError::NotLeased {
                offset: 0,
                consumer: 2
            })
        );
        assert_eq!(d.ack_by(1, 0), Ok(AckOutcome::Acked { cursor: 1 }));
        assert_eq!(d.ack_by(2, 0), Ok(AckOutcome::NoOp));
        assert_eq!(d.release(1, 10), 1);
        let (b, _) = d.lease(10, 2, 5, 3);
        assert_eq!(
            b.iter().map(|x| (x.offset, x.attempt)).collect::<Vec<_>>(),
            vec![(1, 2), (2, 1)]
        );
        // A late ack of an expired lease is accepted.
        let _ = d.on_timeout(40_000);
        assert_eq!(d.ack_by(1, 2), Ok(AckOutcome::Acked { cursor: 1 }));
    }

    #[test]
    fn poison_none_drops_and_moves_on() {
        let mut d = Dispatcher::new(
            0,
            policy(0, PoisonPolicy::None),
            PersistPolicy::default(),
            0,
        );
        let _ = d.lease(0, 1, 1, 2);
        assert_eq!(
            d.nack(0, 1, 0, None, "x"),
            Ok(Some(Action::Dropped { offset: 0 }))
        );
        assert_eq!(d.cursor(), 1);
    }

    #[test]
    fn an_explicit_nack_delay_overrides_the_backoff() {
        let mut d = dead_letter_at(0);
        let _ = d.lease(0, 1, 1, 1);
        let _ = d.nack(0, 1, 0, Some(0), "retry now");
        assert_eq!(offsets(&d.lease(0, 1, 1, 1).0), vec![0]);
        assert_eq!(d.poll_timeout(), Some(30_000));
    }
}
