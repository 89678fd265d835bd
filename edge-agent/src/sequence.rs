//! Producer retries without duplicates on the NDJSON batch path, like
//! Kafka's idempotent producer: the lines of a batch carry `producer_id`
//! and consecutive `sequence` numbers ([`crate::ndjson::Producer`]). Per
//! topic and producer, the agent remembers the last [`WINDOW_BATCHES`]
//! stored batches (sequence range, offsets, SHA-256 of the body) in the
//! metadata store at `/edge/idempotency/{ns}/{topic}/producers/{hex id}`
//! for [`WINDOW_MS`] after the producer's last request, so it survives an
//! agent restart. [`decide`] is the whole rule, without I/O:
//!
//! | request range | answer |
//! |---|---|
//! | unknown producer (or forgotten after 24 h), any range | store |
//! | starts at the last stored sequence + 1 | store |
//! | equals a remembered batch, same body | that batch's answer, nothing stored |
//! | equals a remembered batch, another body | [`Refusal::Reused`] (409) |
//! | starts at or below the last stored sequence otherwise | [`Refusal::Duplicate`] (409) |
//! | starts past the last stored sequence + 1 | [`Refusal::Gap`] (409) |
//!
//! A gap is refused rather than stored so that a producer whose earlier
//! batch got lost in transit resends it first: the topic keeps the
//! producer's order. As for `Idempotency-Key`, a marker committed before
//! the append ([`crate::pending`]) settles a batch a crash left unanswered.

use std::fmt::Write;

use broker_core::metadata::{MetadataError, MetadataStore};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tributary_proto::keys::TopicName;

use crate::idempotency::WINDOW_MS;
use crate::manager::TopicManager;
use crate::topic::PublishAck;

/// Batches remembered per producer.
pub const WINDOW_BATCHES: usize = 5;

/// A stored batch of a producer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoredBatch {
    /// Sequence of its first record.
    pub first_sequence: u64,
    /// Sequence of its last record.
    pub last_sequence: u64,
    /// The answer: offset of the first record.
    pub base_offset: u64,
    /// The answer: offset just past the last record.
    pub next_offset: u64,
    /// SHA-256 (hex) of the request body.
    pub fingerprint: String,
}

impl StoredBatch {
    /// The answer the batch got.
    pub fn ack(&self) -> PublishAck {
        PublishAck {
            base_offset: self.base_offset,
            next_offset: self.next_offset,
            count: self.next_offset.saturating_sub(self.base_offset),
        }
    }
}

/// What the agent remembers of a producer on a topic: its last stored
/// batches, oldest first, at most [`WINDOW_BATCHES`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProducerState {
    /// Oldest first.
    pub batches: Vec<StoredBatch>,
}

impl ProducerState {
    /// The last stored sequence, `None` for an unknown producer.
    pub fn last_sequence(&self) -> Option<u64> {
        self.batches.last().map(|b| b.last_sequence)
    }

    /// Adds `batch` as the newest, forgetting the oldest beyond
    /// [`WINDOW_BATCHES`].
    pub fn remember(&mut self, batch: StoredBatch) {
        self.batches.push(batch);
        let excess = self.batches.len().saturating_sub(WINDOW_BATCHES);
        self.batches.drain(..excess);
    }
}

/// Why a sequenced batch is not stored (409).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The range of a remembered batch with another body.
    #[error(
        "sequences {first}..={last} were stored (at offset {base_offset}) for another request body"
    )]
    Reused {
        /// First sequence of the request.
        first: u64,
        /// Last sequence of the request.
        last: u64,
        /// Where the remembered batch was stored.
        base_offset: u64,
    },
    /// At or below the last stored sequence, not a remembered batch (older
    /// than the window, or overlapping one partially).
    #[error(
        "sequences {first}..={last}: the last stored sequence is {last_sequence} and the range is not one of the last {WINDOW_BATCHES} stored batches"
    )]
    Duplicate {
        /// First sequence of the request.
        first: u64,
        /// Last sequence of the request.
        last: u64,
        /// The producer's last stored sequence.
        last_sequence: u64,
    },
    /// Starts past the last stored sequence + 1.
    #[error("sequence gap: the next sequence expected is {expected}; got {first}")]
    Gap {
        /// The last stored sequence + 1.
        expected: u64,
        /// First sequence of the request.
        first: u64,
    },
}

impl Refusal {
    /// The `kind` of the 409 answer.
    pub fn kind(&self) -> &'static str {
        match self {
            Refusal::Reused { .. } => "sequence_reused",
            Refusal::Duplicate { .. } => "sequence_duplicate",
            Refusal::Gap { .. } => "sequence_gap",
        }
    }
}

/// What to do with a sequenced request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Append it, then remember it.
    Store,
    /// A retry of this batch: answer its offsets, store nothing.
    Replay(StoredBatch),
    /// Store nothing, answer 409.
    Refuse(Refusal),
}

/// The rule of the module doc: what to do with the request `first..=last`
/// whose body has `fingerprint`, given what is remembered of its producer.
pub fn decide(state: &ProducerState, first: u64, last: u64, fingerprint: &str) -> Decision {
    let Some(last_sequence) = state.last_sequence() else {
        return Decision::Store;
    };
    if let Some(batch) = state
        .batches
        .iter()
        .find(|b| b.first_sequence == first && b.last_sequence == last)
    {
        return if batch.fingerprint == fingerprint {
            Decision::Replay(batch.clone())
        } else {
            Decision::Refuse(Refusal::Reused {
                first,
                last,
                base_offset: batch.base_offset,
            })
        };
    }
    match last_sequence.checked_add(1) {
        Some(expected) if first == expected => Decision::Store,
        Some(expected) if first > expected => Decision::Refuse(Refusal::Gap { expected, first }),
        _ => Decision::Refuse(Refusal::Duplicate {
            first,
            last,
            last_sequence,
        }),
    }
}

/// The metadata key of `producer_id` on `topic`:
/// `/edge/idempotency/{ns}/{topic}/producers/{hex producer_id}`, beside the
/// `Idempotency-Key` answers ([`crate::idempotency::store_key`]; a hex key
/// never reads `producers`).
pub fn store_key(topic: &TopicName, producer_id: &str) -> String {
    let mut out = format!("/edge/idempotency{topic}/producers/");
    for b in producer_id.bytes() {
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// What is remembered at `store_key`; an unknown producer (or an
/// unreadable value) has no batch.
///
/// # Errors
/// [`MetadataError`] from the store.
pub async fn load(manager: &TopicManager, store_key: &str) -> Result<ProducerState, MetadataError> {
    let value = manager.store().get(store_key).await?;
    Ok(value
        .and_then(|v| serde_json::from_value(v).ok())
        .unwrap_or_default())
}

/// The value of `state` with the stored batch `first..=last` added:
/// offsets of `ack`, body fingerprint `fingerprint` (written with
/// [`crate::pending::complete`]).
pub fn answer(
    mut state: ProducerState,
    first: u64,
    last: u64,
    fingerprint: String,
    ack: &PublishAck,
) -> Value {
    state.remember(StoredBatch {
        first_sequence: first,
        last_sequence: last,
        base_offset: ack.base_offset,
        next_offset: ack.next_offset,
        fingerprint,
    });
    serde_json::to_value(&state).unwrap_or_default()
}

/// Stores `state` at `store_key` for [`WINDOW_MS`] from now.
///
/// # Errors
/// [`MetadataError`] from the store.
pub async fn save(
    manager: &TopicManager,
    store_key: &str,
    state: &ProducerState,
) -> Result<(), MetadataError> {
    let value: Value = serde_json::to_value(state).unwrap_or_default();
    manager
        .store()
        .put_with_ttl(store_key, value, WINDOW_MS)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(first: u64, last: u64, base: u64, fp: &str) -> StoredBatch {
        StoredBatch {
            first_sequence: first,
            last_sequence: last,
            base_offset: base,
            next_offset: base + (last - first + 1),
            fingerprint: fp.into(),
        }
    }

    /// Batches 0..=2 (offset 10), 3..=5 (offset 20), 6..=6 (offset 30).
    fn three() -> ProducerState {
        let mut state = ProducerState::default();
        state.remember(batch(0, 2, 10, "a"));
        state.remember(batch(3, 5, 20, "b"));
        state.remember(batch(6, 6, 30, "c"));
        state
    }

    #[test]
    fn an_unknown_producer_stores_any_range() {
        let empty = ProducerState::default();
        assert_eq!(decide(&empty, 0, 2, "x"), Decision::Store);
        assert_eq!(decide(&empty, 41, 41, "x"), Decision::Store);
    }

    #[test]
    fn the_next_sequence_is_stored() {
        assert_eq!(decide(&three(), 7, 9, "d"), Decision::Store);
        assert_eq!(decide(&three(), 7, 7, "a"), Decision::Store);
    }

    #[test]
    fn a_remembered_range_with_the_same_body_replays_its_answer() {
        let state = three();
        assert_eq!(
            decide(&state, 0, 2, "a"),
            Decision::Replay(batch(0, 2, 10, "a"))
        );
        assert_eq!(
            decide(&state, 6, 6, "c"),
            Decision::Replay(batch(6, 6, 30, "c"))
        );
        assert_eq!(
            batch(3, 5, 20, "b").ack(),
            PublishAck {
                base_offset: 20,
                next_offset: 23,
                count: 3
            }
        );
    }

    #[test]
    fn a_remembered_range_with_another_body_is_refused() {
        let refused = decide(&three(), 3, 5, "other");
        assert_eq!(
            refused,
            Decision::Refuse(Refusal::Reused {
                first: 3,
                last: 5,
                base_offset: 20
            })
        );
        let Decision::Refuse(r) = refused else {
            unreachable!()
        };
        assert_eq!(r.kind(), "sequence_reused");
    }

    #[test]
    fn old_or_overlapping_ranges_are_duplicates() {
        let duplicate = |first, last| {
            Decision::Refuse(Refusal::Duplicate {
                first,
                last,
                last_sequence: 6,
            })
        };
        // Inside a batch, straddling two, straddling the last sequence.
        assert_eq!(decide(&three(), 1, 2, "a"), duplicate(1, 2));
        assert_eq!(decide(&three(), 2, 4, "x"), duplicate(2, 4));
        assert_eq!(decide(&three(), 6, 8, "x"), duplicate(6, 8));
    }

    #[test]
    fn a_gap_is_refused_naming_the_expected_sequence() {
        let refused = decide(&three(), 9, 9, "x");
        assert_eq!(
            refused,
            Decision::Refuse(Refusal::Gap {
                expected: 7,
                first: 9
            })
        );
        let Decision::Refuse(r) = refused else {
            unreachable!()
        };
        assert_eq!(
            r.to_string(),
            "sequence gap: the next sequence expected is 7; got 9"
        );
        assert_eq!(r.kind(), "sequence_gap");
    }

    #[test]
    fn the_window_keeps_the_last_five_batches() {
        let mut state = ProducerState::default();
        for i in 0..7u64 {
            state.remember(batch(i, i, 100 + i, "f"));
        }
        assert_eq!(state.batches.len(), WINDOW_BATCHES);
        assert_eq!(state.batches[0].first_sequence, 2);
        assert_eq!(state.last_sequence(), Some(6));
        // Batch 1 is forgotten: a retry of it is a duplicate; batch 2 is not.
        assert_eq!(
            decide(&state, 1, 1, "f"),
            Decision::Refuse(Refusal::Duplicate {
                first: 1,
                last: 1,
                last_sequence: 6
            })
        );
        assert!(matches!(decide(&state, 2, 2, "f"), Decision::Replay(_)));
    }

    #[test]
    fn the_largest_sequence_has_no_successor() {
        let mut state = ProducerState::default();
        state.remember(batch(u64::MAX, u64::MAX, 0, "a"));
        assert!(matches!(
            decide(&state, u64::MAX, u64::MAX, "b"),
            Decision::Refuse(Refusal::Reused { .. })
        ));
        assert!(matches!(
            decide(&state, 5, 5, "b"),
            Decision::Refuse(Refusal::Duplicate { .. })
        ));
    }

    #[test]
    fn the_state_round_trips_as_json_and_keys_are_hex() {
        let state = three();
        let json = serde_json::to_value(&state).unwrap();
        assert_eq!(json["batches"][1]["first_sequence"], 3);
        assert_eq!(
            serde_json::from_value::<ProducerState>(json).unwrap(),
            state
        );
        let topic = TopicName::new("/plant1/events").unwrap();
        assert_eq!(
            store_key(&topic, "p/1"),
            "/edge/idempotency/plant1/events/producers/702f31"
        );
        assert_ne!(
            store_key(&topic, "x"),
            crate::idempotency::store_key(&topic, "x")
        );
    }
}
