//! HTTP publishes with a retry check (an `Idempotency-Key`, or NDJSON
//! `producer_id` + `sequence`) that a crash interrupts: told apart, after
//! the restart, into stored and not stored, so that the client's retry is
//! answered with the original offsets or stored once.
//!
//! Order of one such publish, with the request's key lock held:
//!
//! 1. the topic claims the batch's content (no batch with identical
//!    records is enqueued by anyone else until step 2 is done,
//!    `topic/claims.rs`), and the marker [`Pending`] is committed at
//!    `/edge/pending/{ns}/{topic}/...` (the path of the answer it stands
//!    for, [`pending_key`]): topic, the WAL's next offset (`from`), record
//!    count, a SHA-256 of the records as they will be stored
//!    ([`records_digest`]: timestamps, keys, headers, values), the
//!    request's fingerprint and what identifies it;
//! 2. the records are enqueued as one WAL batch, the claim ends, and the
//!    batch is awaited durable;
//! 3. one transaction deletes the marker and writes the answer
//!    (`/edge/idempotency/...`, [`complete`]); a failed append deletes the
//!    marker ([`abandon`]). Both are committed without an `fsync`: a crash
//!    that loses them leaves the synced marker, settled as below into the
//!    same outcome. So a keyed request costs one metadata `fsync` (the
//!    marker), as it did before the markers (the answer).
//!
//! A crash leaves at most the marker. [`settle_all`] runs when the agent
//! starts, before the local API, the MQTT listener or the replicator can
//! append to or delete from a WAL. Per topic it scans the WAL from the
//! lowest `from` and gives each marker the first batch at or above its
//! `from` with its record count and digest that no answer and no other
//! marker has taken; found at offset `o`, the answer is written as if
//! step 3 had run (`o`..`o + count`); absent, the marker is deleted and the
//! retry is stored as a new request. The stored records stay exactly what
//! the client sent. The claim makes the first match the request's own
//! batch: an identical batch of another request lands before `from` or
//! after the request's batch, and none lands after `from` at all if the
//! request's batch was never enqueued (its publishers wait for the claim,
//! and the crash ends them too).

use std::collections::{BTreeMap, HashSet};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tributary_proto::keys::TopicName;

use broker_core::metadata::{MetadataError, MetadataStore, Txn};

use crate::idempotency::{Remembered, WINDOW_MS};
use crate::manager::TopicManager;
use crate::sequence;
use crate::topic::PublishAck;

/// Where the markers live.
pub const PENDING_PREFIX: &str = "/edge/pending/";
const ANSWERS_PREFIX: &str = "/edge/idempotency/";

/// What identifies the request whose records are being stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum PendingRequest {
    /// A publish with an `Idempotency-Key`.
    Key {
        /// The header's value.
        key: String,
    },
    /// An NDJSON batch with `producer_id` and `sequence`.
    Producer {
        /// The batch's `producer_id`.
        producer_id: String,
        /// Sequence of its first line.
        first_sequence: u64,
        /// Sequence of its last line.
        last_sequence: u64,
    },
}

pub use broker_core::idempotency::records_digest;

/// The marker of a publish in progress (step 1 of the module doc).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pending {
    /// The Tributary topic.
    pub topic: String,
    /// The WAL's next offset when the marker was committed (the content
    /// claimed): the request's batch, if it was enqueued, is at or above.
    pub from: u64,
    /// Records in the request.
    pub count: u64,
    /// [`records_digest`] of them.
    pub records_digest: String,
    /// SHA-256 (hex) of the request, as in the answer.
    pub fingerprint: String,
    /// What identifies it.
    pub request: PendingRequest,
}

/// The marker key of the answer at `store_key` (`/edge/idempotency/...`
/// becomes `/edge/pending/...`).
pub fn pending_key(store_key: &str) -> String {
    let rest = store_key.strip_prefix(ANSWERS_PREFIX).unwrap_or(store_key);
    format!("{PENDING_PREFIX}{}", rest.trim_start_matches('/'))
}

/// The answer at `store_key` from the marker's offsets: what step 3 writes.
///
/// # Errors
/// [`MetadataError`] reading a producer's window.
async fn answer(
    manager: &TopicManager,
    store_key: &str,
    pending: &Pending,
    ack: &PublishAck,
) -> Result<Value, MetadataError> {
    let fingerprint = pending.fingerprint.clone();
    Ok(match &pending.request {
        PendingRequest::Key { .. } => crate::idempotency::answer(fingerprint, ack),
        PendingRequest::Producer {
            first_sequence,
            last_sequence,
            ..
        } => {
            let state = sequence::load(manager, store_key).await?;
            sequence::answer(state, *first_sequence, *last_sequence, fingerprint, ack)
        }
    })
}

/// Step 1: commits `pending` as the marker of `store_key`.
///
/// # Errors
/// [`MetadataError`]: nothing may be appended then.
pub async fn mark(
    manager: &TopicManager,
    store_key: &str,
    pending: &Pending,
) -> Result<(), MetadataError> {
    let value = serde_json::to_value(pending).unwrap_or_default();
    manager.store().put(&pending_key(store_key), value).await
}

/// Step 3: deletes the marker of `store_key` and writes `answer` there (for
/// [`WINDOW_MS`]) in one transaction, committed without an `fsync`
/// ([`broker_core::metadata::redb::RedbStore::txn_unsynced`]): a crash that
/// loses it leaves the synced marker, which the next start settles into
/// the same answer. It reaches the disk with the next synced commit (the
/// next marker, at the latest).
///
/// # Errors
/// [`MetadataError`].
pub async fn complete(
    manager: &TopicManager,
    store_key: &str,
    answer: Value,
) -> Result<(), MetadataError> {
    manager
        .store()
        .txn_unsynced(
            Txn::new()
                .delete(pending_key(store_key))
                .put_with_ttl(store_key, answer, WINDOW_MS),
        )
        .await
        .map(drop)
}

/// The append failed, or the records are not in the WAL: deletes the
/// marker of `store_key` (unsynced, as [`complete`]: a lost delete is
/// redone at the next start).
///
/// # Errors
/// [`MetadataError`].
pub async fn abandon(manager: &TopicManager, store_key: &str) -> Result<(), MetadataError> {
    manager
        .store()
        .txn_unsynced(Txn::new().delete(pending_key(store_key)))
        .await
        .map(drop)
}

/// Base offsets of the answers recorded for `topic`: every key's and
/// every producer window's batch. Their batches belong to them.
///
/// # Errors
/// [`MetadataError`] listing them.
async fn answered_offsets(
    manager: &TopicManager,
    topic: &str,
) -> Result<HashSet<u64>, MetadataError> {
    let prefix = format!("{ANSWERS_PREFIX}{}/", topic.trim_start_matches('/'));
    let mut out = HashSet::new();
    for (_, value) in manager.store().list(&prefix).await? {
        if let Ok(answer) = serde_json::from_value::<Remembered>(value.clone()) {
            out.insert(answer.base_offset);
        } else if let Ok(window) = serde_json::from_value::<sequence::ProducerState>(value) {
            out.extend(window.batches.iter().map(|b| b.base_offset));
        }
    }
    Ok(out)
}

/// For each of `markers` (all of one topic), the base offset of the WAL
/// batch it gets (module doc): the first at or above its `from`, with its
/// record count and digest, not in `taken` and not given to a marker with
/// a lower `from`.
fn match_batches(
    manager: &TopicManager,
    topic: &TopicName,
    markers: &[&Pending],
    taken: &HashSet<u64>,
) -> Vec<Option<u64>> {
    let mut found = vec![None; markers.len()];
    let Some(wal) = manager.topic(topic).and_then(|t| t.wal()) else {
        return found;
    };
    let Some(low) = markers.iter().map(|m| m.from).min() else {
        return found;
    };
    let mut order: Vec<usize> = (0..markers.len()).collect();
    order.sort_by_key(|&i| markers[i].from);
    let limits = manager.config().limits;
    let mut next = low.max(wal.log_start_offset());
    while found.iter().any(Option::is_none) {
        let batches = match wal.read(next, 1 << 20) {
            Ok(b) if !b.is_empty() => b,
            _ => break,
        };
        for batch in batches {
            next = batch.next_offset();
            let Ok(decoded) = batch.decode(&limits) else {
                continue;
            };
            let base = decoded.base_offset;
            if taken.contains(&base) {
                continue;
            }
            let mut digest = None;
            for &i in &order {
                let m = markers[i];
                if found[i].is_some() || m.from > base || m.count != decoded.records.len() as u64 {
                    continue;
                }
                let d = digest.get_or_insert_with(|| records_digest(&decoded.records));
                if *d == m.records_digest {
                    found[i] = Some(base);
                    break;
                }
            }
        }
    }
    found
}

/// Settles `markers` (store key and marker, all of `topic`): for each, the
/// answer when its records are in the WAL, `None` when they are not (the
/// marker is then deleted).
///
/// # Errors
/// [`MetadataError`] reading the answers, writing one or deleting a marker.
async fn settle_topic(
    manager: &TopicManager,
    topic: &str,
    markers: &[(String, Pending)],
) -> Result<Vec<Option<PublishAck>>, MetadataError> {
    let taken = answered_offsets(manager, topic).await?;
    let refs: Vec<&Pending> = markers.iter().map(|(_, p)| p).collect();
    let found = match TopicName::new(topic) {
        Ok(name) => match_batches(manager, &name, &refs, &taken),
        Err(_) => vec![None; markers.len()],
    };
    let mut out = Vec::with_capacity(markers.len());
    for ((store_key, pending), base) in markers.iter().zip(found) {
        let Some(base_offset) = base else {
            abandon(manager, store_key).await?;
            out.push(None);
            continue;
        };
        let ack = PublishAck {
            base_offset,
            next_offset: base_offset + pending.count,
            count: pending.count,
        };
        let value = answer(manager, store_key, pending, &ack).await?;
        complete(manager, store_key, value).await?;
        out.push(Some(ack));
    }
    Ok(out)
}

/// Settles the marker `pending` of `store_key` alone: one a failed write
/// of the metadata store left while the agent ran (the key's lock is
/// held, so its request is not in progress). Other requests in progress
/// on the topic are not considered: one with records identical to this
/// one's, timestamps included, could have its batch taken for this one's.
///
/// # Errors
/// As [`settle_all`].
pub async fn settle(
    manager: &TopicManager,
    store_key: &str,
    pending: &Pending,
) -> Result<Option<PublishAck>, MetadataError> {
    let one = [(store_key.to_owned(), pending.clone())];
    Ok(settle_topic(manager, &pending.topic, &one)
        .await?
        .pop()
        .flatten())
}

/// The marker of `store_key`, if any (an unreadable one counts as absent).
///
/// # Errors
/// [`MetadataError`].
pub async fn load(
    manager: &TopicManager,
    store_key: &str,
) -> Result<Option<Pending>, MetadataError> {
    let value = manager.store().get(&pending_key(store_key)).await?;
    Ok(value.and_then(|v| serde_json::from_value(v).ok()))
}

/// What [`settle_all`] found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Settled {
    /// Records found: the answer is written, a retry gets it.
    pub stored: usize,
    /// Not in the WAL: the marker is gone, a retry is stored.
    pub not_stored: usize,
    /// Markers that could not be decoded (deleted).
    pub unreadable: usize,
    /// Answers of realtime topics forgotten: their ring starts again at
    /// the restart and reuses the offsets they name.
    pub realtime_answers: usize,
}

/// Settles every marker a crash left (module doc), and forgets the
/// answers of realtime topics (their records did not outlive the restart;
/// a retry is stored again). Run at start, before anything can append to
/// or delete from a WAL.
///
/// # Errors
/// [`MetadataError`] listing the markers or writing a settlement.
pub async fn settle_all(manager: &TopicManager) -> Result<Settled, MetadataError> {
    let mut by_topic: BTreeMap<String, Vec<(String, Pending)>> = BTreeMap::new();
    let mut settled = Settled::default();
    for (key, value) in manager.store().list(PENDING_PREFIX).await? {
        let store_key = format!(
            "{ANSWERS_PREFIX}{}",
            key.strip_prefix(PENDING_PREFIX).unwrap_or(&key)
        );
        match serde_json::from_value::<Pending>(value) {
            Ok(pending) => by_topic
                .entry(pending.topic.clone())
                .or_default()
                .push((store_key, pending)),
            Err(_) => {
                tracing::warn!(key, "unreadable publish marker: deleted");
                settled.unreadable += 1;
                manager.store().delete(&key).await?;
            }
        }
    }
    for (topic, markers) in &by_topic {
        for outcome in settle_topic(manager, topic, markers).await? {
            match outcome {
                Some(_) => settled.stored += 1,
                None => settled.not_stored += 1,
            }
        }
    }
    for topic in manager.topics().iter().filter(|t| t.is_realtime()) {
        let prefix = format!(
            "{ANSWERS_PREFIX}{}/",
            topic.name().as_str().trim_start_matches('/')
        );
        for (key, _) in manager.store().list(&prefix).await? {
            manager.store().delete(&key).await?;
            settled.realtime_answers += 1;
        }
    }
    Ok(settled)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use tributary_proto::Record;

    #[test]
    fn marker_keys_mirror_answer_keys() {
        assert_eq!(
            pending_key("/edge/idempotency/plant1/events/6f31"),
            "/edge/pending/plant1/events/6f31"
        );
        assert_eq!(
            pending_key("/edge/idempotency/plant1/events/producers/70"),
            "/edge/pending/plant1/events/producers/70"
        );
    }

    fn record(ts: i64, key: Option<&str>, headers: &[(&str, &str)], value: &str) -> Record {
        Record {
            timestamp_ms: ts,
            key: key.map(|k| Bytes::copy_from_slice(k.as_bytes())),
            headers: headers
                .iter()
                .map(|(n, v)| ((*n).to_owned(), Bytes::copy_from_slice(v.as_bytes())))
                .collect(),
            value: Bytes::copy_from_slice(value.as_bytes()),
        }
    }

    #[test]
    fn the_digest_covers_every_part_of_every_record() {
        let base = [
            record(1, Some("k"), &[("h", "1")], "v"),
            record(2, None, &[], "w"),
        ];
        let digest = records_digest(&base);
        let changed: [[Record; 2]; 6] = [
            [record(9, Some("k"), &[("h", "1")], "v"), base[1].clone()],
            [record(1, None, &[("h", "1")], "v"), base[1].clone()],
            [record(1, Some(""), &[("h", "1")], "v"), base[1].clone()],
            [record(1, Some("k"), &[("h", "2")], "v"), base[1].clone()],
            [record(1, Some("k"), &[("h", "1")], "x"), base[1].clone()],
            // Bytes moved between fields.
            [record(1, Some("k"), &[("h", "1v")], ""), base[1].clone()],
        ];
        for records in &changed {
            assert_ne!(records_digest(records), digest, "{records:?}");
        }
        assert_eq!(records_digest(&base.clone()), digest);
    }
}
