//! The JSON shapes of the broker's consumer HTTP API (`docs/consumer-api.md`),
//! shared by the server (`broker/src/consumer/`) and the Rust client
//! ([`crate::consumer_client`], feature `client`). No I/O here.
//!
//! Semantics come from the seed pages: `seeds/002_3b2157864a3f5448.txt`
//! (subscriptions, durable vs ephemeral, pause/resume/unsubscribe, cursor
//! reads, per-message leases) and `seeds/000_d502aacc865e81b1.txt` (failure
//! policies, dead-letter headers).
//!
//! Every request body rejects unknown fields, so a misspelt field is a `400`
//! naming it rather than a silently ignored option.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::admin::PolicySource;
use tributary_proto::intent::SubscriptionFailurePolicy;

/// Most messages one receive, read or peek returns.
pub const MAX_MESSAGES_PER_CALL: u32 = 1000;
/// Longest long-poll wait, ms.
pub const MAX_WAIT_MS: u64 = 30_000;
/// Most offsets in one ack or nack request.
pub const MAX_OFFSETS_PER_CALL: usize = 10_000;

/// The dead-letter headers, in the order they are written
/// (`seeds/000_d502aacc865e81b1.txt`, "poison_policy = dead_letter").
pub const DEAD_LETTER_HEADERS: [&str; 8] = [
    "x-original-topic",
    "x-original-subscription",
    "x-original-topic-offset",
    "x-original-producer-id",
    "x-original-broker-addr",
    "x-poison-policy",
    "x-delivery-attempt",
    "x-failure-reason",
];

/// How consumers of one subscription share its messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SubscriptionType {
    /// One consumer at a time; a second attach is refused (`409`).
    Exclusive,
    /// Every consumer leases messages; each message goes to one of them.
    #[default]
    Shared,
    /// Many consumers attach; only the oldest live one receives. When its
    /// session ends, the next one takes over (its leases are redelivered).
    Failover,
}

impl SubscriptionType {
    /// The snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            SubscriptionType::Exclusive => "exclusive",
            SubscriptionType::Shared => "shared",
            SubscriptionType::Failover => "failover",
        }
    }
}

/// Where a new subscription starts (ignored when it already exists).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StartPosition {
    /// The first offset still stored: `"earliest"`.
    Earliest,
    /// The high-water mark at attach: only later messages, `"latest"`.
    #[default]
    Latest,
    /// A given offset: `{"offset": 42}`; must lie in `[log start, high-water mark]`.
    Offset(u64),
    /// The first message with a timestamp at or after this instant, ms
    /// since the Unix epoch: `{"timestamp": 1767225600000}`.
    Timestamp(i64),
}

/// `POST …/subscriptions/{sub}/attach`. `Default` is what an empty JSON
/// body means: shared, latest, durable when new.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttachRequest {
    /// Subscription type; must match the stored one of an existing
    /// subscription. Default `shared`.
    #[serde(default, rename = "type")]
    pub subscription_type: SubscriptionType,
    /// Start position of a new subscription. Default `latest`.
    #[serde(default)]
    pub start: StartPosition,
    /// `true`: durable, metadata and cursor persist in Raft; `false`:
    /// ephemeral, nothing is persisted and the subscription is removed
    /// when its last consumer's session ends. Absent: a new subscription
    /// is durable, an existing one is joined as it is; given, it must
    /// match an existing subscription (else `409 durability_mismatch`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub durable: Option<bool>,
    /// A label for logs and the subscription state.
    #[serde(default)]
    pub consumer_name: Option<String>,
}

fn yes() -> bool {
    true
}

/// The answer to an attach.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttachResponse {
    /// The topic.
    pub topic: String,
    /// The subscription.
    pub subscription: String,
    /// This consumer's session id: pass it on every later call.
    pub consumer_id: u64,
    /// The subscription's type.
    #[serde(rename = "type")]
    pub subscription_type: SubscriptionType,
    /// Whether the subscription is durable.
    pub durable: bool,
    /// Whether this attach created the subscription.
    pub created: bool,
    /// Everything below this offset is acknowledged.
    pub cursor: u64,
    /// The topic's high-water mark.
    pub high_water_mark: u64,
    /// Whether this consumer receives now (always, except a failover
    /// standby).
    pub active: bool,
    /// The session ends this long after the consumer's last call, ms.
    pub session_timeout_ms: u64,
    /// The subscription's failure policy.
    pub failure_policy: SubscriptionFailurePolicy,
    /// Where the policy came from.
    pub policy_source: PolicySource,
}

/// How values, keys and header values are returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ValueEncoding {
    /// As `value` text when valid UTF-8, else as `value_b64`.
    #[default]
    Text,
    /// Always as `value_b64` (standard base64 with padding).
    Base64,
}

/// `POST …/receive` (leases) and `POST …/read` (cursor read).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReceiveRequest {
    /// The session from attach.
    pub consumer_id: u64,
    /// At most this many messages, 1 to [`MAX_MESSAGES_PER_CALL`]. Default 100.
    #[serde(default = "default_max_messages")]
    pub max_messages: u32,
    /// Wait up to this long for a first message, ms, at most
    /// [`MAX_WAIT_MS`]. Default 0 (answer at once).
    #[serde(default)]
    pub max_wait_ms: u64,
    /// Encoding of values. Default `text`.
    #[serde(default)]
    pub encoding: ValueEncoding,
}

fn default_max_messages() -> u32 {
    100
}

/// One record header as returned.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MessageHeader {
    /// Header name.
    pub name: String,
    /// The value as text (UTF-8, encoding `text`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// The value as base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_b64: Option<String>,
}

/// One message as returned.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// The record's offset (the same from edge to archive).
    pub offset: u64,
    /// The record's timestamp, ms since the Unix epoch.
    pub timestamp_ms: i64,
    /// Key as text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Key as base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_b64: Option<String>,
    /// Headers in stored order (duplicates kept).
    #[serde(default)]
    pub headers: Vec<MessageHeader>,
    /// Value as text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// Value as base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_b64: Option<String>,
    /// Delivery number of this message on this subscription (1 = first);
    /// 0 for cursor reads and peeks.
    #[serde(default)]
    pub attempt: u32,
    /// When the lease ends, ms since the Unix epoch (receive only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_deadline_ms: Option<i64>,
}

impl Message {
    /// The first header called `name`, as text (base64 values are not
    /// decoded).
    pub fn header_text(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|h| h.name == name)
            .and_then(|h| h.value.as_deref())
    }
}

/// The answer to receive, read and peek.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReceiveResponse {
    /// The messages, by offset (receive: due redeliveries first).
    pub messages: Vec<Message>,
    /// The subscription's cursor (peek: the next offset to peek).
    pub cursor: u64,
    /// The topic's high-water mark.
    pub high_water_mark: u64,
    /// Whether this consumer is the one receiving (failover).
    #[serde(default = "yes")]
    pub active: bool,
    /// Whether the subscription is paused.
    #[serde(default)]
    pub paused: bool,
    /// The offset delivery is halted at (poison policy `block`).
    #[serde(default)]
    pub blocked_at: Option<u64>,
    /// Offset ranges reached by this read that hold no record (declared
    /// holes, damaged central bytes), by first offset. They count as
    /// delivered: the cursor moves past them, and no message ever comes
    /// for their offsets. Nothing is skipped silently; a range may be named
    /// again by a later read (like a redelivery). Absent when empty, and
    /// older clients ignore it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gaps: Vec<Gap>,
    /// The damaged range this read stopped at (bytes stored but failing
    /// verification; the broker may still heal it by re-fetching it): every
    /// good message before it was returned, none at or after it. Absent
    /// when the read reached no damage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub damaged: Option<DamagedRange>,
}

/// A damaged range a subscription waits at: its offsets are stored but fail
/// verification. The subscription re-reads it (it heals when the broker
/// rewrites the segment) until `policy_at_ms`; then the poison policy
/// decides (`dead_letter`: a dead-letter entry names the range and a gap
/// notice of kind `damaged` moves past it; `block`: delivery stays halted
/// at `first_offset` until it heals or an operator skips it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DamagedRange {
    /// First unreadable offset.
    pub first_offset: u64,
    /// Exclusive end of the unreadable range.
    pub end_offset: u64,
    /// What the WAL reported (segment, byte position, failed check).
    pub reason: String,
    /// When the subscription first reached it, ms since the Unix epoch.
    pub since_ms: i64,
    /// When the wait ends and the poison policy applies, ms since the Unix
    /// epoch (`since_ms` + `damage_wait_ms`).
    pub policy_at_ms: i64,
    /// `waiting` (re-reading until `policy_at_ms`) or `blocked` (policy
    /// `block` applied: halted until it heals or is skipped).
    pub state: DamageState,
}

/// Where a subscription stands at a [`DamagedRange`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DamageState {
    /// Re-reading the range until the wait ends.
    Waiting,
    /// Halted at the range (poison policy `block`).
    Blocked,
}

/// Offsets `first_offset..end_offset` that hold no record: a gap notice in a
/// [`ReceiveResponse`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gap {
    /// First offset of the range.
    pub first_offset: u64,
    /// Exclusive end of the range: the next offset that may hold a record.
    pub end_offset: u64,
    /// Why the range holds no record.
    pub kind: GapKind,
    /// Detail (what the edge or the broker's WAL reported).
    pub reason: String,
}

/// Why a [`Gap`] holds no record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GapKind {
    /// A declared hole: the edge could not send these offsets (damaged or
    /// lost at the edge) and declared them; no record will ever exist.
    Hole,
    /// The broker's own WAL holds bytes for these offsets that fail
    /// verification (damaged central storage).
    Damaged,
}

/// `POST …/ack`: per-message acknowledgement of leased messages.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AckRequest {
    /// The session.
    pub consumer_id: u64,
    /// Offsets to acknowledge (1 to [`MAX_OFFSETS_PER_CALL`]).
    pub offsets: Vec<u64>,
}

/// The answer to an ack.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AckResponse {
    /// Offsets newly acknowledged.
    pub acked: Vec<u64>,
    /// Offsets already finished or never delivered (nothing changed).
    pub no_op: Vec<u64>,
    /// The cursor after the call.
    pub cursor: u64,
}

/// `POST …/ack-up-to`: cursor-read acknowledgement.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AckUpToRequest {
    /// The session.
    pub consumer_id: u64,
    /// The last processed offset: it and everything below it are
    /// acknowledged. Below the cursor: a no-op.
    pub offset: u64,
}

/// The answer to ack-up-to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AckUpToResponse {
    /// Whether the cursor moved.
    pub acked: bool,
    /// The cursor after the call.
    pub cursor: u64,
}

/// `POST …/nack`: delivery failed; redeliver after the backoff (or
/// `delay_ms`) or apply the poison policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NackRequest {
    /// The session; must hold the leases.
    pub consumer_id: u64,
    /// Offsets to nack.
    pub offsets: Vec<u64>,
    /// Redeliver after this long instead of the policy's backoff, ms.
    #[serde(default)]
    pub delay_ms: Option<u64>,
    /// Why (`x-failure-reason` if the message is dead-lettered).
    #[serde(default)]
    pub reason: Option<String>,
}

/// The answer to a nack.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NackResponse {
    /// Offsets scheduled for redelivery.
    pub redelivery: Vec<u64>,
    /// Offsets copied to the dead-letter topic (and finished).
    pub dead_lettered: Vec<u64>,
    /// Offsets due for the dead-letter topic whose copy has not succeeded
    /// yet (the broker retries it; the subscription does not move past
    /// them until it does). Absent from brokers before this field.
    #[serde(default)]
    pub dead_letter_pending: Vec<u64>,
    /// Offsets dropped (poison policy `none`).
    pub dropped: Vec<u64>,
    /// The offset delivery halts at (poison policy `block`).
    pub blocked_at: Option<u64>,
    /// The cursor after the call.
    pub cursor: u64,
}

/// A body with just the session: `POST …/detach`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionRequest {
    /// The session.
    pub consumer_id: u64,
}

/// `POST …/seek`: exactly one of `offset` and `timestamp_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SeekRequest {
    /// Move the cursor to this offset (`[log start, high-water mark]`).
    #[serde(default)]
    pub offset: Option<u64>,
    /// Move the cursor to the first message at or after this instant, ms
    /// since the Unix epoch.
    #[serde(default)]
    pub timestamp_ms: Option<i64>,
}

/// One record to publish centrally: exactly one of `value` and `value_b64`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PublishRecord {
    /// Value as text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// Value as base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_b64: Option<String>,
    /// Optional key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Headers, name → text value. A name given twice in the object is
    /// refused (a JSON object's last value would silently win).
    #[serde(
        default,
        skip_serializing_if = "BTreeMap::is_empty",
        deserialize_with = "unique_headers"
    )]
    pub headers: BTreeMap<String, String>,
    /// Timestamp, ms since the Unix epoch; default the broker's clock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp_ms: Option<i64>,
}

/// A JSON object of text header values into a map, refusing a name that
/// occurs twice.
fn unique_headers<'de, D>(deserializer: D) -> Result<BTreeMap<String, String>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    struct Unique;
    impl<'de> serde::de::Visitor<'de> for Unique {
        type Value = BTreeMap<String, String>;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("an object of string header values")
        }

        fn visit_map<A: serde::de::MapAccess<'de>>(
            self,
            mut map: A,
        ) -> Result<Self::Value, A::Error> {
            let mut out = BTreeMap::new();
            while let Some((name, value)) = map.next_entry::<String, String>()? {
                if out.contains_key(&name) {
                    return Err(serde::de::Error::custom(format!(
                        "header name {name:?} is given twice"
                    )));
                }
                out.insert(name, value);
            }
            Ok(out)
        }
    }
    deserializer.deserialize_map(Unique)
}

/// `POST /v1/topics/{ns}/{topic}/records`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PublishRequest {
    /// The records, stored as one record batch.
    pub records: Vec<PublishRecord>,
}

/// The answer to a publish.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublishResponse {
    /// Offset of the first record.
    pub base_offset: u64,
    /// Offset after the last record.
    pub next_offset: u64,
    /// Records stored.
    pub count: u32,
}

/// The answer to replay-dlq.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplayResponse {
    /// The dead-letter topic read.
    pub dead_letter_topic: String,
    /// Messages appended back to the topic.
    pub replayed: u64,
    /// Their new offsets in the topic.
    pub offsets: Vec<u64>,
    /// The replay cursor in the dead-letter topic after the call.
    pub dead_letter_cursor: u64,
}

/// One consumer in a subscription's state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConsumerState {
    /// Session id.
    pub consumer_id: u64,
    /// Its label.
    pub consumer_name: Option<String>,
    /// Whether it receives now.
    pub active: bool,
    /// Its last call, ms since the Unix epoch.
    pub last_seen_ms: i64,
}

/// `GET …/subscriptions/{sub}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubscriptionState {
    /// The topic.
    pub topic: String,
    /// The subscription.
    pub subscription: String,
    /// Type.
    #[serde(rename = "type")]
    pub subscription_type: SubscriptionType,
    /// Durable or ephemeral.
    pub durable: bool,
    /// Paused.
    pub paused: bool,
    /// Everything below is acknowledged.
    pub cursor: u64,
    /// The cursor last written to Raft.
    pub persisted_cursor: u64,
    /// The topic's high-water mark.
    pub high_water_mark: u64,
    /// Leased, unacknowledged messages.
    pub in_flight: u64,
    /// The offset delivery halts at (poison policy `block`).
    pub blocked_at: Option<u64>,
    /// The damaged range delivery waits or is blocked at, with the reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub damaged: Option<DamagedRange>,
    /// Why poison messages wait instead of going to the dead-letter topic:
    /// the failure policy's `dead_letter_topic` is refused (another
    /// namespace's or a system topic, or one an edge replicates into).
    /// Delivery waits at the first such message until the policy changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_letter_refused: Option<String>,
    /// Live consumers.
    pub consumers: Vec<ConsumerState>,
    /// The failure policy in force.
    pub failure_policy: SubscriptionFailurePolicy,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_positions_and_defaults_parse() {
        let r: AttachRequest = serde_json::from_str(r#"{"start": {"offset": 7}}"#).unwrap();
        assert_eq!(r.start, StartPosition::Offset(7));
        assert_eq!(r.durable, None, "durable when new, joined as it is");
        assert_eq!(r.subscription_type, SubscriptionType::Shared);
        let r: AttachRequest =
            serde_json::from_str(r#"{"type": "failover", "start": "earliest", "durable": false}"#)
                .unwrap();
        assert_eq!(
            (r.subscription_type, r.start, r.durable),
            (
                SubscriptionType::Failover,
                StartPosition::Earliest,
                Some(false)
            )
        );
        assert!(serde_json::from_str::<AttachRequest>(r#"{"strat": "earliest"}"#).is_err());
        assert_eq!(
            serde_json::from_str::<AttachRequest>("{}").unwrap(),
            AttachRequest::default()
        );
        assert!(serde_json::from_str::<AttachRequest>(r#"{"type": "key_shared"}"#).is_err());
        let r: ReceiveRequest = serde_json::from_str(r#"{"consumer_id": 3}"#).unwrap();
        assert_eq!((r.max_messages, r.max_wait_ms), (100, 0));
    }
}
