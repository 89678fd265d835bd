//! Delivery to consumer sessions: leased receive, cursor read (both long
//! polls), per-message and cumulative acknowledgements, and negative
//! acknowledgements (redelivery or the poison policy).

use std::time::Duration;

use tributary_api::consumer::{
    AckResponse, AckUpToResponse, GapKind, NackRequest, NackResponse, ReceiveResponse,
    ValueEncoding,
};
use tributary_proto::dispatch::{AckOutcome, Action, DispatchError};
use tributary_proto::keys::TopicName;

use super::{
    ConsumerError, ConsumerService, Sub, damage, invalid, log_actions, records, subscription_name,
    tiered,
};

/// Leased messages a receive reads at a time, checking the byte budget
/// ([`records::MAX_READ_BYTES`]) between steps.
const RECEIVE_READ_STEP: usize = 16;

/// The end of a long poll of `max_wait_ms` from `now_ms` (Unix ms).
fn deadline_after(now_ms: i64, max_wait_ms: u64) -> i64 {
    now_ms.saturating_add(i64::try_from(max_wait_ms).unwrap_or(i64::MAX))
}

/// One wait of a long poll: until the subscription changes, the WAL's
/// high-water mark passes `offset`, or `wake_at` (Unix ms) — at most 250 ms
/// after `now`, so lease expiries and deadlines are seen on time.
async fn wait_for_change(sub: &Sub, offset: u64, now: i64, wake_at: i64) {
    let wait_ms = wake_at.min(now + 250).saturating_sub(now);
    let sleep = Duration::from_millis(u64::try_from(wait_ms).unwrap_or(0).max(1));
    let wal = sub.wal();
    tokio::select! {
        _ = sub.changed.notified() => {}
        // A WAL handle whose writer ended (the topic was closed here)
        // answers at once: then only the other two, and the caller's next
        // round fetches the current handle (`ConsumerService::fresh`).
        Ok(_) = wal.wait_for_offset(offset) => {}
        _ = tokio::time::sleep(sleep) => {}
    }
}

impl ConsumerService {
    /// Whether a long poll with nothing to answer waits on: before its
    /// `deadline` (Unix ms) and while the broker is not stopping
    /// ([`ConsumerService::stop_long_polls`]).
    fn keep_waiting(&self, now: i64, deadline: i64) -> bool {
        now < deadline && !self.stopping()
    }

    /// Leases up to `max` messages to `consumer`, waiting up to `max_wait_ms`
    /// for the first one.
    ///
    /// # Errors
    /// [`ConsumerError::NotFound`] for an unknown subscription or session.
    pub async fn receive(
        &self,
        topic: &TopicName,
        subscription: &str,
        consumer: u64,
        max: u32,
        max_wait_ms: u64,
        encoding: ValueEncoding,
    ) -> Result<ReceiveResponse, ConsumerError> {
        let name = subscription_name(subscription)?;
        let mut sub = self.sub(topic, &name).await?;
        let deadline = deadline_after(self.now_ms(), max_wait_ms);
        loop {
            // A long poll outlives a topic closed here meanwhile.
            sub = self.current(sub).await?;
            let moved_past = self.check_damage(&sub, false).await?;
            let now = self.now_ms();
            let (deliveries, active, paused, cursor, next_due, hwm) = {
                let mut st = self.session(&sub, consumer).await?;
                let hwm = sub.wal().high_water_mark();
                let active = st.is_active(consumer);
                let paused = st.meta().paused;
                let mut deliveries = Vec::new();
                if active && !paused {
                    // Nothing is leased at or past a known damaged range.
                    let limit = st.lease_limit(hwm);
                    let (leased, actions) = st.lease(now, consumer, max as usize, limit);
                    deliveries = leased;
                    log_actions(&sub, &actions);
                    st = self.flush_dead_letters(&sub, st).await;
                }
                let dispatcher = st.dispatcher();
                (
                    deliveries,
                    active,
                    paused,
                    dispatcher.cursor(),
                    dispatcher.poll_timeout(),
                    hwm,
                )
            };
            if deliveries.is_empty() && moved_past.is_empty() && self.keep_waiting(now, deadline) {
                let wake = next_due.unwrap_or(deadline).min(deadline);
                wait_for_change(&sub, hwm, now, wake).await;
                continue;
            }
            let leased: Vec<u64> = deliveries.iter().map(|d| d.offset).collect();
            let mut gaps = Vec::new();
            // Read in steps up to records::MAX_READ_BYTES (at least one
            // step): the leases past it are given back unread, so a receive
            // of 1,000 large messages does not hold them all at once.
            let mut found = std::collections::BTreeMap::new();
            let (mut bytes, mut read) = (0usize, 0usize);
            for step in leased.chunks(RECEIVE_READ_STEP) {
                let got = match tiered::read_offsets(
                    &sub.wal(),
                    self.archive(),
                    &sub.topic,
                    step,
                    &mut gaps,
                )
                .await
                {
                    Ok(got) => got,
                    Err(e) => {
                        // Nobody receives them: given back unread (not a
                        // failed delivery), offered again by the next read.
                        let mut st = self.session(&sub, consumer).await?;
                        st.return_unread(leased.iter().copied(), now);
                        return Err(e.into());
                    }
                };
                bytes = got
                    .values()
                    .map(records::record_bytes)
                    .fold(bytes, usize::saturating_add);
                found.extend(got);
                read += step.len();
                let damaged = gaps.last().is_some_and(|g| g.kind == GapKind::Damaged);
                if damaged || bytes >= records::MAX_READ_BYTES {
                    break;
                }
            }
            // Each read step names the part of a hole it crossed: one
            // notice per range in the answer.
            super::records::merge_gaps(&mut gaps);
            if read < leased.len() {
                let mut st = self.session(&sub, consumer).await?;
                st.return_unread(leased[read..].iter().copied(), now);
            }
            let offsets = &leased[..read];
            let deliveries: Vec<_> = deliveries
                .into_iter()
                .filter(|d| offsets.contains(&d.offset))
                .collect();
            if let Some(damaged) = damage::take_damaged(&mut gaps) {
                // Leased a moment ago and unreadable: taken back, never
                // handed out (the subscription waits at the range).
                self.note_damage(&sub, &damaged).await;
                let mut st = self.session(&sub, consumer).await?;
                st.return_unread(
                    offsets
                        .iter()
                        .copied()
                        .filter(|&o| o >= damaged.first_offset),
                    now,
                );
            }
            let mut cursor = if gaps.is_empty() {
                cursor
            } else {
                self.settle_gaps(&sub, consumer, &mut gaps, offsets).await?
            };
            let messages: Vec<_> = deliveries
                .iter()
                .filter_map(|d| {
                    found.get(&d.offset).map(|record| {
                        let mut m = records::to_message(d.offset, record, encoding);
                        m.attempt = d.attempt;
                        m.lease_deadline_ms = Some(d.deadline_ms);
                        m
                    })
                })
                .collect();
            gaps.extend(moved_past);
            if messages.is_empty() && gaps.is_empty() && self.keep_waiting(now, deadline) {
                wait_for_change(&sub, hwm, now, deadline.min(now + 250)).await;
                continue;
            }
            let (blocked_at, damaged) = {
                let st = self.session(&sub, consumer).await?;
                cursor = cursor.max(st.dispatcher().cursor());
                self.halt_view(&st)
            };
            return Ok(ReceiveResponse {
                messages,
                cursor,
                high_water_mark: hwm,
                active,
                paused,
                blocked_at,
                gaps,
                damaged,
            });
        }
    }

    /// Cursor read: up to `max` records from the cursor, without leases; the
    /// same records come back until acknowledged with
    /// [`ConsumerService::ack_up_to`].
    ///
    /// # Errors
    /// As [`ConsumerService::receive`].
    pub async fn read(
        &self,
        topic: &TopicName,
        subscription: &str,
        consumer: u64,
        max: u32,
        max_wait_ms: u64,
        encoding: ValueEncoding,
    ) -> Result<ReceiveResponse, ConsumerError> {
        let name = subscription_name(subscription)?;
        let mut sub = self.sub(topic, &name).await?;
        let deadline = deadline_after(self.now_ms(), max_wait_ms);
        loop {
            // A long poll outlives a topic closed here meanwhile.
            sub = self.current(sub).await?;
            let moved_past = self.check_damage(&sub, true).await?;
            let (cursor, active, paused, limit) = {
                let st = self.session(&sub, consumer).await?;
                (
                    st.dispatcher().cursor(),
                    st.is_active(consumer),
                    st.meta().paused,
                    st.lease_limit(sub.wal().high_water_mark()),
                )
            };
            let hwm = sub.wal().high_water_mark();
            let now = self.now_ms();
            let readable = active && !paused && cursor < limit;
            if !readable && moved_past.is_empty() && self.keep_waiting(now, deadline) {
                wait_for_change(&sub, cursor.max(hwm), now, deadline.min(now + 250)).await;
                continue;
            }
            let mut gaps = Vec::new();
            let records = if readable {
                tiered::read_range(
                    &sub.wal(),
                    self.archive(),
                    &sub.topic,
                    cursor,
                    max as usize,
                    &mut gaps,
                )
                .await?
            } else {
                Vec::new()
            };
            if let Some(damaged) = damage::take_damaged(&mut gaps) {
                self.note_damage(&sub, &damaged).await;
            }
            let mut cursor = if gaps.is_empty() {
                cursor
            } else {
                self.settle_gaps(&sub, consumer, &mut gaps, &[]).await?
            };
            gaps.extend(moved_past);
            if records.is_empty() && gaps.is_empty() && self.keep_waiting(now, deadline) {
                wait_for_change(&sub, cursor.max(hwm), now, deadline.min(now + 250)).await;
                continue;
            }
            let (blocked_at, damaged) = {
                let st = self.session(&sub, consumer).await?;
                cursor = cursor.max(st.dispatcher().cursor());
                self.halt_view(&st)
            };
            return Ok(ReceiveResponse {
                messages: records
                    .iter()
                    .map(|(offset, record)| records::to_message(*offset, record, encoding))
                    .collect(),
                cursor,
                high_water_mark: hwm,
                active,
                paused,
                blocked_at,
                gaps,
                damaged,
            });
        }
    }

    /// Where delivery halts: the poison block's offset (or a blocked damaged
    /// range's first offset), and the damaged range it waits or is blocked
    /// at.
    pub(super) fn halt_view(
        &self,
        st: &super::session::Subscription,
    ) -> (Option<u64>, Option<tributary_api::consumer::DamagedRange>) {
        let damage = st.damage();
        let blocked = st
            .dispatcher()
            .blocked_at()
            .or(damage.filter(|d| d.blocked).map(|d| d.first));
        (blocked, damage.map(|d| d.view(self.damage_wait_ms())))
    }

    /// Settles the offsets of `gaps` (ranges a read found holding no record)
    /// for `consumer`: its leased offsets inside them are acknowledged, and a
    /// gap that starts at or below the cursor moves the cursor to its end.
    /// Names the edge's declaration (Raft `/topics/{ns}/{topic}/holes/…`)
    /// in the reason of a declared hole. Returns the cursor after that.
    ///
    /// # Errors
    /// [`ConsumerError::NotFound`] if the session ended meanwhile.
    async fn settle_gaps(
        &self,
        sub: &Sub,
        consumer: u64,
        gaps: &mut [tributary_api::consumer::Gap],
        leased: &[u64],
    ) -> Result<u64, ConsumerError> {
        if let Ok(declared) = self.topics.holes(&sub.topic).await {
            for gap in gaps.iter_mut() {
                if let Some(hole) = declared
                    .iter()
                    .find(|h| h.first_offset <= gap.first_offset && gap.first_offset < h.end_offset)
                {
                    gap.reason = format!(
                        "hole {}..{} declared by the edge ({}): {}",
                        hole.first_offset, hole.end_offset, hole.cause, hole.reason
                    );
                }
            }
        }
        let mut st = self.session(sub, consumer).await?;
        let hwm = sub.wal().high_water_mark();
        let inside = |o: u64| gaps.iter().any(|g| g.first_offset <= o && o < g.end_offset);
        for &offset in leased.iter().filter(|&&o| inside(o)) {
            // Leased to this consumer a moment ago: cannot be refused.
            let _ = st.ack(consumer, offset);
        }
        for gap in gaps.iter() {
            if st.dispatcher().cursor() >= gap.first_offset {
                let _ = st.ack_up_to(gap.end_offset.min(hwm), hwm);
            }
        }
        self.persist(sub, &mut st, false).await;
        sub.changed.notify_waiters();
        Ok(st.dispatcher().cursor())
    }

    /// Acknowledges leased messages one by one.
    ///
    /// # Errors
    /// [`ConsumerError::Invalid`] for an offset at or beyond the high-water
    /// mark (nothing acknowledged); [`ConsumerError::Conflict`]
    /// (`not_leased`) at the first offset leased to another consumer (the
    /// offsets before it stay acknowledged).
    pub async fn ack(
        &self,
        topic: &TopicName,
        subscription: &str,
        consumer: u64,
        offsets: &[u64],
    ) -> Result<AckResponse, ConsumerError> {
        let name = subscription_name(subscription)?;
        let sub = self.sub(topic, &name).await?;
        let mut st = self.session(&sub, consumer).await?;
        let hwm = sub.wal().high_water_mark();
        if let Some(bad) = offsets.iter().find(|&&o| o >= hwm) {
            return Err(invalid(
                "offsets",
                format!(
                    "offsets: {bad} is at or beyond the high-water mark {hwm}; nothing was acknowledged"
                ),
            ));
        }
        let mut acked = Vec::new();
        let mut no_op = Vec::new();
        for &offset in offsets {
            match st.ack(consumer, offset) {
                Ok(AckOutcome::Acked { .. }) => acked.push(offset),
                Ok(AckOutcome::NoOp) => no_op.push(offset),
                Err(e) => {
                    self.persist(&sub, &mut st, false).await;
                    sub.changed.notify_waiters();
                    return Err(ConsumerError::Conflict {
                        kind: "not_leased",
                        message: format!(
                            "{e}: another consumer holds its lease; acknowledged before it: {acked:?}"
                        ),
                    });
                }
            }
        }
        self.persist(&sub, &mut st, false).await;
        sub.changed.notify_waiters();
        Ok(AckResponse {
            acked,
            no_op,
            cursor: st.dispatcher().cursor(),
        })
    }

    /// Cursor-read acknowledgement of everything up to and including
    /// `offset`; an older offset is a no-op.
    ///
    /// # Errors
    /// [`ConsumerError::Invalid`] for an offset at or beyond the high-water
    /// mark.
    pub async fn ack_up_to(
        &self,
        topic: &TopicName,
        subscription: &str,
        consumer: u64,
        offset: u64,
    ) -> Result<AckUpToResponse, ConsumerError> {
        let name = subscription_name(subscription)?;
        let sub = self.sub(topic, &name).await?;
        let mut st = self.session(&sub, consumer).await?;
        // A standby of a failover subscription received nothing: its
        // cumulative ack would skip what the active consumer has not seen.
        if !st.is_active(consumer) {
            return Err(ConsumerError::Conflict {
                kind: "not_active",
                message: format!(
                    "consumer {consumer} is a standby of {name} (the active consumer is {}); only the consumer that receives can acknowledge up to an offset",
                    st.active_consumer()
                        .map_or_else(|| "none".to_owned(), |c| c.to_string())
                ),
            });
        }
        let hwm = sub.wal().high_water_mark();
        let end = offset.saturating_add(1);
        let outcome = st.ack_up_to(end, hwm).map_err(|e| match e {
            DispatchError::BeyondEnd { .. } => invalid(
                "offset",
                format!("offset: {offset} is at or beyond the high-water mark {hwm}"),
            ),
            other => ConsumerError::Internal(other.to_string()),
        })?;
        self.persist(&sub, &mut st, false).await;
        sub.changed.notify_waiters();
        Ok(AckUpToResponse {
            acked: matches!(outcome, AckOutcome::Acked { .. }),
            cursor: st.dispatcher().cursor(),
        })
    }

    /// Negative acknowledgement: redelivery after the backoff (or
    /// `delay_ms`), or the poison policy once attempts exceed the limit.
    ///
    /// # Errors
    /// [`ConsumerError::Conflict`] (`not_leased`) at the first offset the
    /// consumer does not hold (those before it are nacked).
    pub async fn nack(
        &self,
        topic: &TopicName,
        subscription: &str,
        request: &NackRequest,
    ) -> Result<NackResponse, ConsumerError> {
        let name = subscription_name(subscription)?;
        let sub = self.sub(topic, &name).await?;
        let mut st = self.session(&sub, request.consumer_id).await?;
        let reason = request.reason.clone().unwrap_or_else(|| "nack".into());
        if reason.len() > 1024 {
            return Err(invalid("reason", "reason: at most 1024 bytes"));
        }
        let mut response = NackResponse {
            redelivery: Vec::new(),
            dead_lettered: Vec::new(),
            dead_letter_pending: Vec::new(),
            dropped: Vec::new(),
            blocked_at: None,
            cursor: 0,
        };
        let now = self.now_ms();
        // Dead-letter copies are made after the loop (with the lock
        // released), also when it stops at an offset not leased.
        let mut poisoned = false;
        let mut refused = None;
        for &offset in &request.offsets {
            match st.nack(now, request.consumer_id, offset, request.delay_ms, &reason) {
                Ok(None) => response.redelivery.push(offset),
                Ok(Some(action)) => {
                    match &action {
                        Action::DeadLetter { offset, .. } => response.dead_lettered.push(*offset),
                        Action::Dropped { offset } => response.dropped.push(*offset),
                        Action::Blocked { .. } => {}
                    }
                    log_actions(&sub, std::slice::from_ref(&action));
                    poisoned = true;
                }
                Err(e) => {
                    refused = Some(e);
                    break;
                }
            }
        }
        if poisoned {
            st = self.flush_dead_letters(&sub, st).await;
        }
        if let Some(e) = refused {
            sub.changed.notify_waiters();
            return Err(ConsumerError::Conflict {
                kind: "not_leased",
                message: format!("{e}; nacked before it: {:?}", response.redelivery),
            });
        }
        // Copies that failed stay pending (retried on the tick).
        (response.dead_letter_pending, response.dead_lettered) = response
            .dead_lettered
            .iter()
            .partition(|&&o| st.dead_letter_pending(o));
        response.blocked_at = st.dispatcher().blocked_at();
        response.cursor = st.dispatcher().cursor();
        self.persist(&sub, &mut st, false).await;
        sub.changed.notify_waiters();
        Ok(response)
    }
}
