//! A subscription at a damaged range (stored bytes that fail verification,
//! `UnreadableKind::Damaged`): delivery stops before it, re-reads it while
//! it may heal (H2's re-fetch rewrites the segment), and after
//! `damage_wait_ms` applies the poison policy: `dead_letter` (and `none`)
//! move past it with a gap notice of kind `damaged`, `dead_letter` first
//! writing a dead-letter entry that names the range; `block` halts delivery
//! at its first offset until it heals or an operator skips it (it then
//! reads as a hole: a gap notice as for any hole).
//!
//! No lease is granted at or past a known damaged range's first offset,
//! and a lease whose offset turned out unreadable is taken back before the
//! response (`Dispatcher::return_unread`), so nothing stays "in flight"
//! that no consumer received.

use broker_core::wal::{UnreadableKind, WalError};
use bytes::Bytes;
use serde_json::json;
use tracing::{error, info, warn};
use tributary_api::consumer::{DamageState, DamagedRange, Gap, GapKind};
use tributary_proto::Record;
use tributary_proto::intent::PoisonPolicy;

use std::ops::ControlFlow;

use tributary_archive::BucketError;
use tributary_archive::reader::{Archive, Start};

use super::records::ReadError;
use super::{ConsumerError, ConsumerService, Sub, records};

/// Header of a dead-letter entry that describes a damaged range instead of
/// copying a message: `FIRST..END` (offsets of the original topic). Such
/// entries are never replayed.
pub const DAMAGED_RANGE_HEADER: &str = "x-damaged-range";

/// The damaged range a subscription waits (or is blocked) at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DamageWait {
    /// First unreadable offset.
    pub first: u64,
    /// Exclusive end.
    pub end: u64,
    /// What the WAL said.
    pub reason: String,
    /// When the subscription first reached it, ms since the Unix epoch.
    pub since_ms: i64,
    /// Policy `block` applied.
    pub blocked: bool,
}

impl DamageWait {
    /// The API's view, with the wait of `wait_ms`.
    pub fn view(&self, wait_ms: i64) -> DamagedRange {
        DamagedRange {
            first_offset: self.first,
            end_offset: self.end,
            reason: self.reason.clone(),
            since_ms: self.since_ms,
            policy_at_ms: self.since_ms.saturating_add(wait_ms),
            state: if self.blocked {
                DamageState::Blocked
            } else {
                DamageState::Waiting
            },
        }
    }
}

/// What a re-read of a damaged range's first offset found.
enum Probe {
    /// Readable again (healed), or no longer in the local WAL.
    Readable,
    /// Now a hole (an operator skipped it): read as a gap notice.
    Hole,
    /// Still damaged: the range as the WAL reports it now.
    Damaged(Gap),
}

/// Removes a trailing `damaged` gap from `gaps` (the read stopped there).
pub(super) fn take_damaged(gaps: &mut Vec<Gap>) -> Option<Gap> {
    if gaps.last().is_some_and(|g| g.kind == GapKind::Damaged) {
        gaps.pop()
    } else {
        None
    }
}

/// For a read that is answered at once (a peek, a replay): removes the
/// trailing damaged gap of `gaps`; when nothing was read before it, the
/// read started in the damaged range and is refused naming it.
///
/// # Errors
/// [`ConsumerError::Damaged`] with the range and why.
pub(super) fn refuse_a_read_that_starts_damaged(
    read_nothing: bool,
    gaps: &mut Vec<Gap>,
) -> Result<(), ConsumerError> {
    if let Some(damaged) = take_damaged(gaps)
        && read_nothing
        && gaps.is_empty()
    {
        return Err(ConsumerError::Damaged {
            first_offset: damaged.first_offset,
            end_offset: damaged.end_offset,
            reason: damaged.reason,
        });
    }
    Ok(())
}

impl ConsumerService {
    /// The wait at a damaged range before the poison policy applies, ms.
    pub(super) fn damage_wait_ms(&self) -> i64 {
        i64::try_from(self.config.damage_wait_ms).unwrap_or(i64::MAX)
    }

    async fn probe(&self, sub: &Sub, known: &DamageWait) -> Result<Probe, ConsumerError> {
        let first = known.first;
        let wal = sub.wal();
        if first < wal.log_start_offset()
            && let Some(archive) = self.archive()
        {
            return self.probe_archive(archive, sub, known).await;
        }
        let probe = records::blocking(&wal, move |w| match w.read(first, 1) {
            Ok(_) | Err(WalError::OffsetBelowLogStart { .. }) => Ok(Probe::Readable),
            Err(WalError::Unreadable(range)) => match range.kind {
                UnreadableKind::Damaged { .. } => {
                    Ok(Probe::Damaged(records::gap_for(first, &range)))
                }
                UnreadableKind::Hole => Ok(Probe::Hole),
            },
            Err(e) => Err(e.into()),
        })
        .await?;
        Ok(probe)
    }

    /// [`Self::probe`] of a range below the WAL's log start: one read of
    /// its first record from the archive (damaged bytes in an object, or
    /// a missing object, heal when the object is written again).
    async fn probe_archive(
        &self,
        archive: &Archive,
        sub: &Sub,
        known: &DamageWait,
    ) -> Result<Probe, ConsumerError> {
        let (archive, topic, first) = (archive.clone(), sub.topic.clone(), known.first);
        let read = super::tiered::drive(async move || {
            Ok(archive
                .read(
                    &topic,
                    Start::Offset(first),
                    &mut |_| ControlFlow::Break(()),
                )
                .await)
        })
        .await?;
        match read {
            Ok(()) => Ok(Probe::Readable),
            Err(e @ (BucketError::Archive { .. } | BucketError::MissingObject { .. })) => {
                Ok(Probe::Damaged(Gap {
                    first_offset: known.first,
                    end_offset: known.end,
                    kind: GapKind::Damaged,
                    reason: format!("archive: {e}"),
                }))
            }
            Err(e) => Err(ReadError::Archive(e.to_string()).into()),
        }
    }

    /// A read of `sub` stopped at `gap` (kind `damaged`): remembered (the
    /// wait starts now if it is new).
    pub(super) async fn note_damage(&self, sub: &Sub, gap: &Gap) {
        let now = self.now_ms();
        let mut st = sub.state.lock().await;
        if st.note_damage(gap, now) {
            warn!(topic = %sub.topic, subscription = %sub.name, first_offset = gap.first_offset, end_offset = gap.end_offset, reason = %gap.reason, wait_ms = self.config.damage_wait_ms, "delivery reached a damaged range; re-reading it until it heals or the wait ends");
        }
    }

    /// Re-reads the damaged range `sub` waits at (if any): forgets it once
    /// readable again or skipped; after the wait, once delivery reached it
    /// (`cursor_read`: the cursor; leases: every offset before it leased),
    /// applies the poison policy. Returns the gap notices of a range it
    /// moved past (for the response).
    ///
    /// # Errors
    /// WAL read failures other than the damage itself.
    pub(super) async fn check_damage(
        &self,
        sub: &Sub,
        cursor_read: bool,
    ) -> Result<Vec<Gap>, ConsumerError> {
        let known = sub.state.lock().await.damage().cloned();
        let Some(known) = known else {
            return Ok(Vec::new());
        };
        let probe = self.probe(sub, &known).await?;
        let now = self.now_ms();
        let mut st = sub.state.lock().await;
        let gap = match probe {
            Probe::Readable | Probe::Hole => {
                if st.clear_damage() {
                    info!(topic = %sub.topic, subscription = %sub.name, first_offset = known.first, end_offset = known.end, skipped = matches!(probe, Probe::Hole), "damaged range readable again (healed) or skipped by an operator; delivery continues");
                    sub.changed.notify_waiters();
                }
                return Ok(Vec::new());
            }
            Probe::Damaged(gap) => gap,
        };
        st.note_damage(&gap, now);
        let Some(damage) = st.damage().cloned() else {
            return Ok(Vec::new());
        };
        let reached = if cursor_read {
            st.dispatcher().cursor() >= damage.first
        } else {
            st.dispatcher().next_new() >= damage.first
        };
        if damage.blocked || !reached || now < damage.since_ms.saturating_add(self.damage_wait_ms())
        {
            return Ok(Vec::new());
        }
        let policy = st.dispatcher().policy().clone();
        if policy.poison_policy == PoisonPolicy::Block {
            st.block_damage();
            error!(topic = %sub.topic, subscription = %sub.name, first_offset = damage.first, end_offset = damage.end, reason = %damage.reason, "damaged range did not heal within damage_wait_ms: poison policy block halts delivery here until it heals or an operator skips it (tribctl topics skip-damaged)");
            sub.changed.notify_waiters();
            return Ok(Vec::new());
        }
        drop(st);
        let mut reason = format!(
            "damaged range {}..{} did not heal within {} ms; moved past by poison policy {}: {}",
            damage.first,
            damage.end,
            self.config.damage_wait_ms,
            policy.poison_policy.as_str(),
            damage.reason
        );
        if policy.poison_policy == PoisonPolicy::DeadLetter {
            match self
                .dead_letter_range(sub, &damage, policy.dead_letter_topic.as_deref())
                .await
            {
                Ok((dlq, offset)) => {
                    reason.push_str(&format!(" (dead-letter entry {dlq}@{offset})"))
                }
                Err(e) => {
                    // Retried on the next read; nothing is moved past. A
                    // refused dead-letter topic is said once.
                    if let Some(why) = super::dead_letter::dead_letter_refusal(&e) {
                        if sub.state.lock().await.note_dead_letter_refusal(why) {
                            error!(topic = %sub.topic, subscription = %sub.name, first_offset = damage.first, error = %e, "damaged range not dead-lettered: the failure policy's dead_letter_topic is refused; delivery waits at it until the policy is changed");
                        }
                        return Ok(Vec::new());
                    }
                    error!(topic = %sub.topic, subscription = %sub.name, first_offset = damage.first, error = %e, "writing the dead-letter entry of a damaged range failed; retrying");
                    return Ok(Vec::new());
                }
            }
        }
        let mut st = sub.state.lock().await;
        if st.damage().map(|d| d.first) != Some(damage.first) || !st.skip_damage() {
            return Ok(Vec::new());
        }
        error!(topic = %sub.topic, subscription = %sub.name, first_offset = damage.first, end_offset = damage.end, "{reason}");
        self.persist(sub, &mut st, true).await;
        sub.changed.notify_waiters();
        Ok(vec![Gap {
            first_offset: damage.first,
            end_offset: damage.end,
            kind: GapKind::Damaged,
            reason,
        }])
    }

    /// Appends a dead-letter entry describing `damage` (no record can be
    /// copied: none is readable): the dead-letter headers with the range's
    /// first offset, [`DAMAGED_RANGE_HEADER`], and a JSON value naming the
    /// range and the reason. Returns the dead-letter topic and the entry's
    /// offset there.
    async fn dead_letter_range(
        &self,
        sub: &Sub,
        damage: &DamageWait,
        dead_letter_topic: Option<&str>,
    ) -> Result<(String, u64), ConsumerError> {
        let dlq = super::dead_letter::dead_letter_target(&sub.topic, dead_letter_topic)?;
        let value = json!({
            "topic": sub.topic.to_string(),
            "subscription": sub.name.to_string(),
            "damaged_first_offset": damage.first,
            "damaged_end_offset": damage.end,
            "reason": damage.reason,
        });
        let values = [
            sub.topic.to_string(),
            sub.name.to_string(),
            damage.first.to_string(),
            sub.producer_id.clone(),
            self.broker_addr.clone(),
            "dead_letter".to_string(),
            "0".to_string(),
            format!("damaged range: {}", damage.reason),
        ];
        let mut headers: Vec<(String, Bytes)> = tributary_api::consumer::DEAD_LETTER_HEADERS
            .iter()
            .zip(values)
            .map(|(name, value)| ((*name).to_string(), Bytes::from(value)))
            .collect();
        headers.push((
            DAMAGED_RANGE_HEADER.to_string(),
            Bytes::from(format!("{}..{}", damage.first, damage.end)),
        ));
        let record = Record {
            timestamp_ms: self.now_ms(),
            key: None,
            headers,
            value: Bytes::from(value.to_string()),
        };
        let ack = self.topics.append_central(&dlq, vec![record], true).await?;
        Ok((dlq.to_string(), ack.base_offset))
    }
}
