//! HTTP publishes with a retry check (an `Idempotency-Key`, or NDJSON
//! `producer_id` + `sequence`) that a crash interrupts: told apart, after
//! the restart, into stored and not stored, so that the client's retry is
//! answered with the original offsets or stored once.
//!
//! Order of one such publish, with the request's key lock held:
//!
//! 1. the marker [`Pending`] is committed at
//!    `/edge/pending/{ns}/{topic}/...` (the path of the answer it stands
//!    for, [`pending_key`]): topic, high-water mark before the append
//!    (`from`), record count, fingerprint and what identifies the request;
//! 2. the records are appended, the first carrying the agent's header(s)
//!    naming the request ([`PendingRequest::headers`]), and awaited durable;
//! 3. one transaction deletes the marker and writes the answer
//!    (`/edge/idempotency/...`, [`complete`]); a failed append deletes the
//!    marker ([`abandon`]).
//!
//! A crash leaves at most the marker. [`settle_all`] runs when the agent
//! starts, before the local API, the MQTT listener or the replicator can
//! append to or delete from a WAL: it scans the topic's WAL from `from` for
//! the first record carrying the request's header; found at offset `o`, the
//! answer is written as if step 3 had run (`o`..`o + count`); absent, the
//! marker is deleted and the retry is stored as a new request. The records
//! of one publish are one WAL batch, so the first record's presence means
//! all of them are stored.
//!
//! Header names beginning with `mqtt.` or `http.` are the agent's own
//! ([`RESERVED_HEADER_PREFIXES`]): publishes that set them are refused, so
//! no record can pass for another request's.

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tributary_proto::Record;
use tributary_proto::keys::TopicName;

use broker_core::metadata::{MetadataError, MetadataStore, Txn};

use crate::idempotency::WINDOW_MS;
use crate::manager::TopicManager;
use crate::sequence;
use crate::topic::PublishAck;

/// Record header names that only the agent sets: `mqtt.` (MQTT topic and
/// QoS 2 dedupe headers, [`crate::mqtt`]) and `http.` (this module's).
pub const RESERVED_HEADER_PREFIXES: [&str; 2] = ["mqtt.", "http."];
/// Header of the first record of a publish with an `Idempotency-Key`: the
/// key.
pub const HEADER_IDEMPOTENCY_KEY: &str = "http.idempotency_key";
/// Header of the first record of a sequenced batch: its `producer_id`.
pub const HEADER_PRODUCER_ID: &str = "http.producer_id";
/// Header of the first record of a sequenced batch: its first `sequence`
/// (decimal).
pub const HEADER_SEQUENCE: &str = "http.sequence";
/// Where the markers live.
pub const PENDING_PREFIX: &str = "/edge/pending/";
const ANSWERS_PREFIX: &str = "/edge/idempotency/";

/// [`RESERVED_HEADER_PREFIXES`] for a message: `"mqtt." or "http."`.
pub fn reserved_prefixes() -> String {
    RESERVED_HEADER_PREFIXES
        .iter()
        .map(|p| format!("{p:?}"))
        .collect::<Vec<_>>()
        .join(" or ")
}

/// Whether `name` begins with one of [`RESERVED_HEADER_PREFIXES`].
pub fn is_reserved(name: &str) -> bool {
    RESERVED_HEADER_PREFIXES.iter().any(|p| name.starts_with(p))
}

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

impl PendingRequest {
    /// The headers the request's first record carries.
    pub fn headers(&self) -> Vec<(String, Bytes)> {
        match self {
            PendingRequest::Key { key } => vec![(
                HEADER_IDEMPOTENCY_KEY.to_owned(),
                Bytes::copy_from_slice(key.as_bytes()),
            )],
            PendingRequest::Producer {
                producer_id,
                first_sequence,
                ..
            } => vec![
                (
                    HEADER_PRODUCER_ID.to_owned(),
                    Bytes::copy_from_slice(producer_id.as_bytes()),
                ),
                (
                    HEADER_SEQUENCE.to_owned(),
                    Bytes::from(first_sequence.to_string()),
                ),
            ],
        }
    }

    /// Whether `record` is the first record of this request.
    fn matches(&self, record: &Record) -> bool {
        self.headers().iter().all(|(name, value)| {
            record
                .headers
                .iter()
                .any(|(n, v)| n == name && v.as_ref() == value.as_ref())
        })
    }
}

/// The marker of a publish in progress (step 1 of the module doc).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pending {
    /// The Tributary topic.
    pub topic: String,
    /// High-water mark of the topic before the append.
    pub from: u64,
    /// Records in the request.
    pub count: u64,
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

/// The high-water mark `from` of a marker for `topic` (0 before the topic
/// exists).
pub fn high_water_mark(manager: &TopicManager, topic: &TopicName) -> u64 {
    manager.topic(topic).map_or(0, |t| t.high_water_mark())
}

/// Step 3: deletes the marker of `store_key` and writes `answer` there (for
/// [`WINDOW_MS`]) in one transaction.
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
        .txn(
            Txn::new()
                .delete(pending_key(store_key))
                .put_with_ttl(store_key, answer, WINDOW_MS),
        )
        .await
        .map(drop)
}

/// The append failed: deletes the marker of `store_key`.
///
/// # Errors
/// [`MetadataError`].
pub async fn abandon(manager: &TopicManager, store_key: &str) -> Result<(), MetadataError> {
    manager
        .store()
        .delete(&pending_key(store_key))
        .await
        .map(drop)
}

/// The offset of the first record at or above `from` in the WAL of `topic`
/// that passes `hit`; `None` if there is none, the topic has no WAL, or
/// the WAL cannot be read (a damaged batch is skipped).
pub fn find_record(
    manager: &TopicManager,
    topic: &TopicName,
    from: u64,
    hit: impl Fn(&Record) -> bool,
) -> Option<u64> {
    let wal = manager.topic(topic).and_then(|t| t.wal())?;
    let limits = manager.config().limits;
    let mut next = from.max(wal.log_start_offset());
    loop {
        let batches = match wal.read(next, 1 << 20) {
            Ok(b) if !b.is_empty() => b,
            _ => return None,
        };
        for batch in batches {
            next = batch.next_offset();
            let Ok(decoded) = batch.decode(&limits) else {
                continue;
            };
            if let Some(i) = decoded.records.iter().position(&hit) {
                return Some(decoded.base_offset + i as u64);
            }
        }
    }
}

/// Settles the marker `pending` of `store_key` (module doc): returns the
/// answer when its records are in the WAL, `None` when they are not (the
/// marker is then deleted).
///
/// # Errors
/// [`MetadataError`] writing the answer or deleting the marker.
pub async fn settle(
    manager: &TopicManager,
    store_key: &str,
    pending: &Pending,
) -> Result<Option<PublishAck>, MetadataError> {
    let found = TopicName::new(pending.topic.as_str()).ok().and_then(|topic| {
        find_record(manager, &topic, pending.from, |r| pending.request.matches(r))
    });
    let Some(base_offset) = found else {
        abandon(manager, store_key).await?;
        return Ok(None);
    };
    let ack = PublishAck {
        base_offset,
        next_offset: base_offset + pending.count,
        count: pending.count,
    };
    let value = answer(manager, store_key, pending, &ack).await?;
    complete(manager, store_key, value).await?;
    Ok(Some(ack))
}

/// The marker of `store_key`, if any (an unreadable one counts as absent).
///
/// # Errors
/// [`MetadataError`].
pub async fn load(manager: &TopicManager, store_key: &str) -> Result<Option<Pending>, MetadataError> {
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
}

/// Settles every marker a crash left (module doc). Run at start, before
/// anything can append to or delete from a WAL.
///
/// # Errors
/// [`MetadataError`] listing the markers or writing a settlement.
pub async fn settle_all(manager: &TopicManager) -> Result<Settled, MetadataError> {
    let markers = manager.store().list(PENDING_PREFIX).await?;
    let mut settled = Settled::default();
    for (key, value) in markers {
        let store_key = format!(
            "{ANSWERS_PREFIX}{}",
            key.strip_prefix(PENDING_PREFIX).unwrap_or(&key)
        );
        let Ok(pending) = serde_json::from_value::<Pending>(value) else {
            tracing::warn!(key, "unreadable publish marker: deleted");
            settled.unreadable += 1;
            manager.store().delete(&key).await?;
            continue;
        };
        match settle(manager, &store_key, &pending).await? {
            Some(_) => settled.stored += 1,
            None => settled.not_stored += 1,
        }
    }
    Ok(settled)
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn a_request_matches_only_a_record_with_all_its_headers() {
        let request = PendingRequest::Producer {
            producer_id: "press-4".into(),
            first_sequence: 7,
            last_sequence: 9,
        };
        let record = |headers: Vec<(&str, &str)>| Record {
            timestamp_ms: 0,
            key: None,
            headers: headers
                .into_iter()
                .map(|(n, v)| (n.to_owned(), Bytes::copy_from_slice(v.as_bytes())))
                .collect(),
            value: Bytes::new(),
        };
        let first = record(vec![
            ("x", "1"),
            (HEADER_PRODUCER_ID, "press-4"),
            (HEADER_SEQUENCE, "7"),
        ]);
        assert!(request.matches(&first));
        assert!(!request.matches(&record(vec![(HEADER_PRODUCER_ID, "press-4")])));
        assert!(!request.matches(&record(vec![
            (HEADER_PRODUCER_ID, "press-4"),
            (HEADER_SEQUENCE, "8")
        ])));
        let key = PendingRequest::Key { key: "o-1".into() };
        assert!(key.matches(&record(vec![(HEADER_IDEMPOTENCY_KEY, "o-1")])));
        assert!(!key.matches(&record(vec![(HEADER_IDEMPOTENCY_KEY, "o-12")])));
    }

    #[test]
    fn the_agents_header_prefixes_are_reserved() {
        assert!(is_reserved("mqtt.topic"));
        assert!(is_reserved("http.idempotency_key"));
        assert!(!is_reserved("http"));
        assert!(!is_reserved("x-http.a"));
    }
}
