//! Names and metadata key paths: the only place that formats or parses a
//! metadata key, an object key or a topic name.
//!
//! # Names
//! A topic name is `/{namespace}/{topic}`: exactly two parts after a leading
//! `/`. Every single name (namespace, topic part, subscription, schema
//! subject, role, binding id, storage prefix part) follows one rule set, so a
//! name can always sit between two `/` of a key without escaping:
//!
//! | rule | error |
//! |---|---|
//! | not empty | [`NameErrorKind::Empty`] |
//! | not `.` or `..` (path traversal in object stores and directories) | [`NameErrorKind::DotName`] |
//! | no control characters (U+0000–U+001F, U+007F–U+009F) | [`NameErrorKind::ControlChar`] |
//! | only ASCII letters, digits, `-`, `_`, `.` | [`NameErrorKind::DisallowedChar`] |
//! | at most [`MAX_NAME_BYTES`] bytes (a topic name: all of `/ns/topic`) | [`NameErrorKind::TooLong`] |
//! | a topic name starts with `/` and has exactly two parts | [`NameErrorKind::MissingLeadingSlash`], [`NameErrorKind::WrongPartCount`] |
//! | a schema subject does not start with `_` (reserved for `_global`, `_index`) | [`NameErrorKind::Reserved`] |
//!
//! The character set is deliberately conservative: it is safe in URLs, file
//! names, S3 object keys and shells, and it excludes `/` so a name never
//! changes the shape of a key. Case is significant.
//!
//! # Key paths
//! [`MetadataKey`] enumerates every path of the metadata layout
//! (`seeds/001_4a7643a8a6858094.txt`, with `/edge/checkpoints/{ns}/{topic}`
//! and the storage prefix from `docs/architecture.md`); its `Display` builds a key and
//! [`MetadataKey::parse`] reads one back. The free functions in [`cluster`],
//! [`namespaces`], [`topics`], [`schemas`], [`auth`] and [`edge`] are
//! shorthands for building single keys and the prefixes that are listed or
//! watched. Storage paths depend on the configured prefix and live on
//! [`StorageKeys`].
//!
//! Numbers in keys are canonical decimal `u64` (no sign, no leading zeros),
//! except offsets and timestamps that must sort: those are zero-padded to
//! [`PADDED_DIGITS`] digits, the width of `u64::MAX`, so lexicographic key
//! order is numeric order.
//!
//! # Object keys
//! Object stores have no root directory: an object key never starts with
//! `/`. The object key of a segment is its storage path with the leading `/`
//! of the prefix removed: prefix `/tributary` gives
//! `tributary/storage/topics/{ns}/{topic}/segments/{start:020}-{end:020}.seg`.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Longest name in bytes: a whole topic name `/{ns}/{topic}` and each single
/// name (namespace, subscription, subject, role, binding id, storage prefix).
pub const MAX_NAME_BYTES: usize = 255;

/// Width of zero-padded offsets and timestamps in keys: the number of decimal
/// digits of `u64::MAX`, so every `u64` fits and key order is numeric order.
pub const PADDED_DIGITS: usize = 20;
const _: () = assert!(u64::MAX / 10u64.pow(PADDED_DIGITS as u32 - 1) >= 1);

/// Default prefix of the storage paths.
pub const DEFAULT_STORAGE_PREFIX: &str = "/tributary";

/// Topic suffix of partition `n`: `{topic}{PARTITION_INFIX}{n}`.
pub const PARTITION_INFIX: &str = "-part-";

/// File suffix of a segment object.
pub const SEGMENT_OBJECT_SUFFIX: &str = ".seg";

/// Last part of the pointer to the latest published segment descriptor.
const SEGMENTS_CUR: &str = "cur";

/// The characters allowed in names besides ASCII letters and digits, as
/// named in error messages.
const ALLOWED_DESCRIPTION: &str = "ASCII letters, digits, '-', '_', '.'";

// ---------------------------------------------------------------------------
// Name errors
// ---------------------------------------------------------------------------

/// Which kind of name (or which part of a topic name) an error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NamePart {
    /// A whole topic name `/{namespace}/{topic}`.
    TopicName,
    /// A namespace, alone or as the first part of a topic name.
    Namespace,
    /// The second part of a topic name.
    Topic,
    /// A subscription name.
    Subscription,
    /// A schema registry subject.
    Subject,
    /// An RBAC role name.
    Role,
    /// An RBAC binding id.
    Binding,
    /// The storage path prefix, e.g. `/tributary`.
    StoragePrefix,
}

impl fmt::Display for NamePart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NamePart::TopicName => "topic name",
            NamePart::Namespace => "namespace",
            NamePart::Topic => "topic",
            NamePart::Subscription => "subscription name",
            NamePart::Subject => "schema subject",
            NamePart::Role => "role name",
            NamePart::Binding => "binding id",
            NamePart::StoragePrefix => "storage prefix",
        })
    }
}

/// What is wrong with a name. `part` is the offending part (for a topic name,
/// its namespace or topic part); byte positions `at` count within that part.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NameErrorKind {
    /// The part is empty.
    #[error("{part} is empty")]
    Empty {
        /// The empty part.
        part: NamePart,
    },
    /// The part is `.` or `..`.
    #[error("{part} must not be '.' or '..'")]
    DotName {
        /// The offending part.
        part: NamePart,
    },
    /// A control character.
    #[error("{part} contains control character {ch:?} at byte {at}")]
    ControlChar {
        /// The offending part.
        part: NamePart,
        /// The character.
        ch: char,
        /// Its byte position within the part.
        at: usize,
    },
    /// A character outside the allowed set.
    #[error("{part} contains {ch:?} at byte {at}; allowed: {ALLOWED_DESCRIPTION}")]
    DisallowedChar {
        /// The offending part.
        part: NamePart,
        /// The character.
        ch: char,
        /// Its byte position within the part.
        at: usize,
    },
    /// Longer than [`MAX_NAME_BYTES`].
    #[error("{part} is {len} bytes long; at most {max}")]
    TooLong {
        /// The offending name.
        part: NamePart,
        /// Its length, bytes.
        len: usize,
        /// The maximum, bytes.
        max: usize,
    },
    /// A topic name or storage prefix that does not start with `/`.
    #[error("{part} must start with '/'")]
    MissingLeadingSlash {
        /// The offending name.
        part: NamePart,
    },
    /// A topic name without exactly two parts.
    #[error("{part} must have exactly {expected} parts separated by '/', found {found}")]
    WrongPartCount {
        /// The offending name.
        part: NamePart,
        /// Parts required.
        expected: usize,
        /// Parts found.
        found: usize,
    },
    /// A name reserved for internal keys (a subject starting with `_`).
    #[error("{part} must not start with '_' (reserved)")]
    Reserved {
        /// The offending name.
        part: NamePart,
    },
}

/// A refused name: what it was meant to be, the input itself, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what} {input:?}: {kind}")]
pub struct NameError {
    /// What the input was parsed as.
    pub what: NamePart,
    /// The refused input, unchanged.
    pub input: String,
    /// The rule it breaks.
    pub kind: NameErrorKind,
}

impl NameError {
    fn new(what: NamePart, input: &str, kind: NameErrorKind) -> NameError {
        NameError {
            what,
            input: input.to_owned(),
            kind,
        }
    }
}

/// Checks one part against the rule set (not the length, which the caller
/// checks once for the whole name).
fn check_part(part: NamePart, value: &str) -> Result<(), NameErrorKind> {
    if value.is_empty() {
        return Err(NameErrorKind::Empty { part });
    }
    if value == "." || value == ".." {
        return Err(NameErrorKind::DotName { part });
    }
    for (at, ch) in value.char_indices() {
        if ch.is_control() {
            return Err(NameErrorKind::ControlChar { part, ch, at });
        }
        if !(ch.is_ascii_alphanumeric() || matches!(ch, '-' | '_' | '.')) {
            return Err(NameErrorKind::DisallowedChar { part, ch, at });
        }
    }
    Ok(())
}

fn check_len(part: NamePart, value: &str) -> Result<(), NameErrorKind> {
    if value.len() > MAX_NAME_BYTES {
        return Err(NameErrorKind::TooLong {
            part,
            len: value.len(),
            max: MAX_NAME_BYTES,
        });
    }
    Ok(())
}

/// Validates a single name of kind `what`.
fn check_single(what: NamePart, value: &str) -> Result<(), NameError> {
    check_len(what, value)
        .and_then(|()| check_part(what, value))
        .and_then(|()| {
            if what == NamePart::Subject && value.starts_with('_') {
                Err(NameErrorKind::Reserved { part: what })
            } else {
                Ok(())
            }
        })
        .map_err(|kind| NameError::new(what, value, kind))
}

// ---------------------------------------------------------------------------
// Single-part names
// ---------------------------------------------------------------------------

macro_rules! single_name {
    ($(#[$doc:meta])* $name:ident, $part:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            /// Validates `name` (see the module doc for the rules).
            ///
            /// # Errors
            /// [`NameError`] naming the broken rule.
            pub fn new(name: &str) -> Result<Self, NameError> {
                check_single($part, name)?;
                Ok($name(name.to_owned()))
            }

            /// The name.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl FromStr for $name {
            type Err = NameError;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                $name::new(s)
            }
        }

        impl TryFrom<String> for $name {
            type Error = NameError;

            fn try_from(s: String) -> Result<Self, Self::Error> {
                check_single($part, &s)?;
                Ok($name(s))
            }
        }

        impl From<$name> for String {
            fn from(name: $name) -> String {
                name.0
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
    };
}

single_name!(
    /// A validated namespace name, the first part of a topic name.
    NamespaceName,
    NamePart::Namespace
);
single_name!(
    /// A validated subscription name.
    SubscriptionName,
    NamePart::Subscription
);
single_name!(
    /// A validated schema registry subject; must not start with `_`, which
    /// is reserved for `/schemas/_global` and `/schemas/_index`.
    SubjectName,
    NamePart::Subject
);
single_name!(
    /// A validated RBAC role name.
    RoleName,
    NamePart::Role
);
single_name!(
    /// A validated RBAC binding id.
    BindingId,
    NamePart::Binding
);

// ---------------------------------------------------------------------------
// Topic names
// ---------------------------------------------------------------------------

/// A validated topic name `/{namespace}/{topic}`.
///
/// Serialized (serde) as its string form; deserializing validates.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct TopicName {
    /// The whole name, `/ns/topic`.
    full: String,
    /// Byte position of the `/` between namespace and topic.
    /// Invariant: `full[1..split]` is the namespace, `full[split + 1..]` the
    /// topic, both valid parts.
    split: usize,
}

impl TopicName {
    /// Parses and validates `/{namespace}/{topic}`.
    ///
    /// # Errors
    /// [`NameError`] with `what = TopicName` naming the broken rule and, for
    /// part rules, which part.
    pub fn new(name: &str) -> Result<TopicName, NameError> {
        Self::check(name)
            .map(|split| TopicName {
                full: name.to_owned(),
                split,
            })
            .map_err(|kind| NameError::new(NamePart::TopicName, name, kind))
    }

    /// Builds `/{namespace}/{topic}` from a namespace and a topic part.
    ///
    /// # Errors
    /// [`NameError`] when `topic` breaks a rule or the whole name is longer
    /// than [`MAX_NAME_BYTES`].
    pub fn from_parts(namespace: &NamespaceName, topic: &str) -> Result<TopicName, NameError> {
        TopicName::new(&format!("/{namespace}/{topic}"))
    }

    /// Returns the position of the middle `/`.
    fn check(name: &str) -> Result<usize, NameErrorKind> {
        check_len(NamePart::TopicName, name)?;
        let Some(rest) = name.strip_prefix('/') else {
            return Err(if name.is_empty() {
                NameErrorKind::Empty {
                    part: NamePart::TopicName,
                }
            } else {
                NameErrorKind::MissingLeadingSlash {
                    part: NamePart::TopicName,
                }
            });
        };
        let mut parts = rest.split('/');
        let (Some(namespace), Some(topic), None) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(NameErrorKind::WrongPartCount {
                part: NamePart::TopicName,
                expected: 2,
                found: rest.split('/').count(),
            });
        };
        check_part(NamePart::Namespace, namespace)?;
        check_part(NamePart::Topic, topic)?;
        Ok(1 + namespace.len())
    }

    /// The whole name, `/{namespace}/{topic}`.
    pub fn as_str(&self) -> &str {
        &self.full
    }

    /// The namespace part.
    pub fn namespace(&self) -> &str {
        &self.full[1..self.split]
    }

    /// The namespace part as a [`NamespaceName`].
    pub fn namespace_name(&self) -> NamespaceName {
        // Valid by the struct invariant, and shorter than the whole name.
        NamespaceName(self.namespace().to_owned())
    }

    /// The topic part (after the namespace).
    pub fn topic(&self) -> &str {
        &self.full[self.split + 1..]
    }

    /// This topic with `suffix` appended to its topic part, e.g. the
    /// dead-letter topic `/{ns}/{topic}-dlq` for suffix `-dlq`.
    ///
    /// # Errors
    /// [`NameError`] when the suffix adds a `/` (wrong part count) or a
    /// disallowed character, or the result is longer than [`MAX_NAME_BYTES`].
    pub fn with_suffix(&self, suffix: &str) -> Result<TopicName, NameError> {
        TopicName::new(&format!("{}{suffix}", self.full))
    }

    /// Partition `index` of this topic: `/{ns}/{topic}-part-{index}`.
    ///
    /// # Errors
    /// [`NameError`] ([`NameErrorKind::TooLong`]) when the partition name is
    /// longer than [`MAX_NAME_BYTES`].
    pub fn partition(&self, index: u32) -> Result<TopicName, NameError> {
        self.with_suffix(&format!("{PARTITION_INFIX}{index}"))
    }

    /// Splits a partition name into its base topic and index; `None` when
    /// the topic part does not end in `-part-{n}` with a canonical decimal
    /// `u32` and a non-empty, valid base. The last `-part-` counts, so
    /// partitions of a topic whose own name contains `-part-` parse back.
    pub fn partition_of(&self) -> Option<(TopicName, u32)> {
        let topic = self.topic();
        let at = topic.rfind(PARTITION_INFIX)?;
        let index = parse_canonical_u64(&topic[at + PARTITION_INFIX.len()..])?;
        let index = u32::try_from(index).ok()?;
        let base = TopicName::new(&self.full[..self.split + 1 + at]).ok()?;
        Some((base, index))
    }
}

impl fmt::Display for TopicName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.full)
    }
}

impl FromStr for TopicName {
    type Err = NameError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        TopicName::new(s)
    }
}

impl TryFrom<String> for TopicName {
    type Error = NameError;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        match TopicName::check(&s) {
            Ok(split) => Ok(TopicName { full: s, split }),
            Err(kind) => Err(NameError::new(NamePart::TopicName, &s, kind)),
        }
    }
}

impl From<TopicName> for String {
    fn from(name: TopicName) -> String {
        name.full
    }
}

impl AsRef<str> for TopicName {
    fn as_ref(&self) -> &str {
        &self.full
    }
}

// ---------------------------------------------------------------------------
// Numbers in keys
// ---------------------------------------------------------------------------

/// Canonical decimal: digits only, no leading zero except `"0"`, fits `u64`.
fn parse_canonical_u64(s: &str) -> Option<u64> {
    let canonical =
        !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) && (s == "0" || !s.starts_with('0'));
    if canonical { s.parse().ok() } else { None }
}

/// Exactly [`PADDED_DIGITS`] decimal digits that fit `u64`.
fn parse_padded_u64(s: &str) -> Option<u64> {
    if s.len() == PADDED_DIGITS && s.bytes().all(|b| b.is_ascii_digit()) {
        s.parse().ok()
    } else {
        None
    }
}

// ---------------------------------------------------------------------------
// Key parse errors
// ---------------------------------------------------------------------------

/// A key string that is not a well-formed Tributary key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyParseError {
    /// The key matches no known path shape.
    #[error("key {key:?} matches no known {expected} path")]
    Unknown {
        /// The key.
        key: String,
        /// What was expected ("metadata", "storage", "segment object",
        /// "subscription", ...).
        expected: &'static str,
    },
    /// A name inside the key is invalid.
    #[error("key {key:?}: {source}")]
    Name {
        /// The key.
        key: String,
        /// The invalid name.
        source: NameError,
    },
    /// A numeric part is not in its canonical form (decimal without leading
    /// zeros, or exactly 20 digits where padded) or does not fit.
    #[error("key {key:?}: {field} {value:?} is not a valid {form}")]
    Number {
        /// The key.
        key: String,
        /// Which number ("broker_id", "start_offset", ...).
        field: &'static str,
        /// The text found.
        value: String,
        /// The form expected.
        form: &'static str,
    },
    /// `/namespaces/{a}/topics/{b}/{topic}` with `a != b`.
    #[error("key {key:?}: namespace {outer:?} holds a topic of namespace {inner:?}")]
    NamespaceMismatch {
        /// The key.
        key: String,
        /// The namespace after `/namespaces/`.
        outer: String,
        /// The namespace of the registered topic.
        inner: String,
    },
    /// A segment object key whose end offset is below its start offset.
    #[error("key {key:?}: segment end offset {end} is below start offset {start}")]
    SegmentRange {
        /// The key.
        key: String,
        /// Start offset.
        start: u64,
        /// End offset.
        end: u64,
    },
}

fn canonical(key: &str, field: &'static str, value: &str) -> Result<u64, KeyParseError> {
    parse_canonical_u64(value).ok_or_else(|| KeyParseError::Number {
        key: key.to_owned(),
        field,
        value: value.to_owned(),
        form: "decimal u64 without leading zeros",
    })
}

fn padded(key: &str, field: &'static str, value: &str) -> Result<u64, KeyParseError> {
    parse_padded_u64(value).ok_or_else(|| KeyParseError::Number {
        key: key.to_owned(),
        field,
        value: value.to_owned(),
        form: "20-digit zero-padded u64",
    })
}

fn topic_in(key: &str, namespace: &str, topic: &str) -> Result<TopicName, KeyParseError> {
    let joined = format!("/{namespace}/{topic}");
    TopicName::new(&joined).map_err(|source| KeyParseError::Name {
        key: key.to_owned(),
        source,
    })
}

fn name_in<T, F>(key: &str, value: &str, make: F) -> Result<T, KeyParseError>
where
    F: FnOnce(&str) -> Result<T, NameError>,
{
    make(value).map_err(|source| KeyParseError::Name {
        key: key.to_owned(),
        source,
    })
}

// ---------------------------------------------------------------------------
// Metadata keys
// ---------------------------------------------------------------------------

/// The keys under `/topics/{ns}/{topic}`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum TopicKey {
    /// `/topics/{ns}/{topic}`: existence marker, value = partition count.
    Marker,
    /// `/topics/{ns}/{topic}/delivery`: `"Reliable"` or `"NonReliable"`.
    Delivery,
    /// `/topics/{ns}/{topic}/policy`: per-topic policy overrides.
    Policy,
    /// `/topics/{ns}/{topic}/intent`: the expanded stream settings.
    Intent,
    /// `/topics/{ns}/{topic}/producers/{producer_id}`.
    Producer {
        /// Producer id.
        producer_id: u64,
    },
    /// `/topics/{ns}/{topic}/subscriptions/{sub}` and its sub-keys.
    Subscription {
        /// Subscription name.
        name: SubscriptionName,
        /// Which key of the subscription.
        key: SubscriptionKey,
    },
}

/// The keys of one subscription.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SubscriptionKey {
    /// `.../subscriptions/{sub}`: subscription metadata.
    Metadata,
    /// `.../subscriptions/{sub}/cursor`: consumer progress offset (u64).
    Cursor,
    /// `.../subscriptions/{sub}/failure_policy`.
    FailurePolicy,
    /// `.../subscriptions/{sub}/dispatch_config`.
    DispatchConfig,
}

impl SubscriptionKey {
    /// The path suffix after `/subscriptions/{sub}`, `""` for the metadata.
    fn suffix(self) -> &'static str {
        match self {
            SubscriptionKey::Metadata => "",
            SubscriptionKey::Cursor => "/cursor",
            SubscriptionKey::FailurePolicy => "/failure_policy",
            SubscriptionKey::DispatchConfig => "/dispatch_config",
        }
    }
}

/// Every metadata key outside the storage prefix.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum MetadataKey {
    /// `/cluster/leader`.
    ClusterLeader,
    /// `/cluster/register/{broker_id}` (written with a TTL).
    BrokerRegistration {
        /// Broker id.
        broker_id: u64,
    },
    /// `/cluster/brokers/{broker_id}/state`.
    BrokerState {
        /// Broker id.
        broker_id: u64,
    },
    /// `/cluster/brokers/{broker_id}/{ns}/{topic}`: assignment marker.
    BrokerAssignment {
        /// Broker id.
        broker_id: u64,
        /// Assigned topic.
        topic: TopicName,
    },
    /// `/cluster/unassigned/{ns}/{topic}`.
    Unassigned {
        /// Topic awaiting assignment.
        topic: TopicName,
    },
    /// `/cluster/load/{broker_id}`.
    BrokerLoad {
        /// Broker id.
        broker_id: u64,
    },
    /// `/cluster/load_balance`.
    LoadBalance,
    /// `/cluster/rebalancing_history/{timestamp_ms:020}`: padded so entries
    /// list in time order.
    RebalancingHistory {
        /// When the move happened, ms since the Unix epoch.
        timestamp_ms: u64,
    },
    /// `/namespaces/{ns}/policy`.
    NamespacePolicy {
        /// Namespace.
        namespace: NamespaceName,
    },
    /// `/namespaces/{ns}/topics/{ns}/{topic}`: topic registry entry.
    NamespaceTopic {
        /// The registered topic (its namespace is the outer one).
        topic: TopicName,
    },
    /// `/topics/{ns}/{topic}` and its sub-keys.
    Topic {
        /// The topic.
        topic: TopicName,
        /// Which key.
        key: TopicKey,
    },
    /// `/schemas/_global/next_schema_id`.
    NextSchemaId,
    /// `/schemas/{subject}/metadata`.
    SchemaMetadata {
        /// Subject.
        subject: SubjectName,
    },
    /// `/schemas/{subject}/compatibility`.
    SchemaCompatibility {
        /// Subject.
        subject: SubjectName,
    },
    /// `/schemas/_index/by_id/{schema_id}`.
    SchemaById {
        /// Schema id.
        schema_id: u64,
    },
    /// `/auth/roles/{role}`.
    AuthRole {
        /// Role.
        role: RoleName,
    },
    /// `/auth/bindings/{binding_id}`.
    AuthBinding {
        /// Binding id.
        binding: BindingId,
    },
    /// `/edge/checkpoints/{ns}/{topic}`: last replicated offset (u64).
    EdgeCheckpoint {
        /// The edge topic.
        topic: TopicName,
    },
}

impl fmt::Display for MetadataKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MetadataKey::ClusterLeader => f.write_str("/cluster/leader"),
            MetadataKey::BrokerRegistration { broker_id } => {
                write!(f, "/cluster/register/{broker_id}")
            }
            MetadataKey::BrokerState { broker_id } => {
                write!(f, "/cluster/brokers/{broker_id}/state")
            }
            MetadataKey::BrokerAssignment { broker_id, topic } => {
                write!(f, "/cluster/brokers/{broker_id}{topic}")
            }
            MetadataKey::Unassigned { topic } => write!(f, "/cluster/unassigned{topic}"),
            MetadataKey::BrokerLoad { broker_id } => write!(f, "/cluster/load/{broker_id}"),
            MetadataKey::LoadBalance => f.write_str("/cluster/load_balance"),
            MetadataKey::RebalancingHistory { timestamp_ms } => {
                write!(f, "/cluster/rebalancing_history/{timestamp_ms:020}")
            }
            MetadataKey::NamespacePolicy { namespace } => {
                write!(f, "/namespaces/{namespace}/policy")
            }
            MetadataKey::NamespaceTopic { topic } => {
                write!(f, "/namespaces/{}/topics{topic}", topic.namespace())
            }
            MetadataKey::Topic { topic, key } => {
                write!(f, "/topics{topic}")?;
                match key {
                    TopicKey::Marker => Ok(()),
                    TopicKey::Delivery => f.write_str("/delivery"),
                    TopicKey::Policy => f.write_str("/policy"),
                    TopicKey::Intent => f.write_str("/intent"),
                    TopicKey::Producer { producer_id } => write!(f, "/producers/{producer_id}"),
                    TopicKey::Subscription { name, key } => {
                        write!(f, "/subscriptions/{name}{}", key.suffix())
                    }
                }
            }
            MetadataKey::NextSchemaId => f.write_str("/schemas/_global/next_schema_id"),
            MetadataKey::SchemaMetadata { subject } => write!(f, "/schemas/{subject}/metadata"),
            MetadataKey::SchemaCompatibility { subject } => {
                write!(f, "/schemas/{subject}/compatibility")
            }
            MetadataKey::SchemaById { schema_id } => {
                write!(f, "/schemas/_index/by_id/{schema_id}")
            }
            MetadataKey::AuthRole { role } => write!(f, "/auth/roles/{role}"),
            MetadataKey::AuthBinding { binding } => write!(f, "/auth/bindings/{binding}"),
            MetadataKey::EdgeCheckpoint { topic } => write!(f, "/edge/checkpoints{topic}"),
        }
    }
}

impl MetadataKey {
    /// Parses a metadata key; the inverse of `Display`.
    ///
    /// # Errors
    /// [`KeyParseError`] when the key matches no path, holds an invalid name
    /// or a non-canonical number.
    pub fn parse(key: &str) -> Result<MetadataKey, KeyParseError> {
        let unknown = || KeyParseError::Unknown {
            key: key.to_owned(),
            expected: "metadata",
        };
        let Some(rest) = key.strip_prefix('/') else {
            return Err(unknown());
        };
        let parts: Vec<&str> = rest.split('/').collect();
        let parsed = match parts.as_slice() {
            ["cluster", "leader"] => MetadataKey::ClusterLeader,
            ["cluster", "register", id] => MetadataKey::BrokerRegistration {
                broker_id: canonical(key, "broker_id", id)?,
            },
            ["cluster", "brokers", id, "state"] => MetadataKey::BrokerState {
                broker_id: canonical(key, "broker_id", id)?,
            },
            ["cluster", "brokers", id, ns, topic] => MetadataKey::BrokerAssignment {
                broker_id: canonical(key, "broker_id", id)?,
                topic: topic_in(key, ns, topic)?,
            },
            ["cluster", "unassigned", ns, topic] => MetadataKey::Unassigned {
                topic: topic_in(key, ns, topic)?,
            },
            ["cluster", "load", id] => MetadataKey::BrokerLoad {
                broker_id: canonical(key, "broker_id", id)?,
            },
            ["cluster", "load_balance"] => MetadataKey::LoadBalance,
            ["cluster", "rebalancing_history", ts] => MetadataKey::RebalancingHistory {
                timestamp_ms: padded(key, "timestamp_ms", ts)?,
            },
            ["namespaces", ns, "policy"] => MetadataKey::NamespacePolicy {
                namespace: name_in(key, ns, NamespaceName::new)?,
            },
            ["namespaces", outer, "topics", inner, topic] => {
                let topic = topic_in(key, inner, topic)?;
                if outer != inner {
                    // Validate the outer one too, so the error names the
                    // real problem when it is also malformed.
                    name_in(key, outer, NamespaceName::new)?;
                    return Err(KeyParseError::NamespaceMismatch {
                        key: key.to_owned(),
                        outer: (*outer).to_owned(),
                        inner: (*inner).to_owned(),
                    });
                }
                MetadataKey::NamespaceTopic { topic }
            }
            ["topics", ns, topic, tail @ ..] => MetadataKey::Topic {
                topic: topic_in(key, ns, topic)?,
                key: match tail {
                    [] => TopicKey::Marker,
                    ["delivery"] => TopicKey::Delivery,
                    ["policy"] => TopicKey::Policy,
                    ["intent"] => TopicKey::Intent,
                    ["producers", id] => TopicKey::Producer {
                        producer_id: canonical(key, "producer_id", id)?,
                    },
                    ["subscriptions", sub, sub_tail @ ..] => TopicKey::Subscription {
                        name: name_in(key, sub, SubscriptionName::new)?,
                        key: match sub_tail {
                            [] => SubscriptionKey::Metadata,
                            ["cursor"] => SubscriptionKey::Cursor,
                            ["failure_policy"] => SubscriptionKey::FailurePolicy,
                            ["dispatch_config"] => SubscriptionKey::DispatchConfig,
                            _ => return Err(unknown()),
                        },
                    },
                    _ => return Err(unknown()),
                },
            },
            ["schemas", "_global", "next_schema_id"] => MetadataKey::NextSchemaId,
            ["schemas", "_index", "by_id", id] => MetadataKey::SchemaById {
                schema_id: canonical(key, "schema_id", id)?,
            },
            ["schemas", subject, "metadata"] => MetadataKey::SchemaMetadata {
                subject: name_in(key, subject, SubjectName::new)?,
            },
            ["schemas", subject, "compatibility"] => MetadataKey::SchemaCompatibility {
                subject: name_in(key, subject, SubjectName::new)?,
            },
            ["auth", "roles", role] => MetadataKey::AuthRole {
                role: name_in(key, role, RoleName::new)?,
            },
            ["auth", "bindings", id] => MetadataKey::AuthBinding {
                binding: name_in(key, id, BindingId::new)?,
            },
            ["edge", "checkpoints", ns, topic] => MetadataKey::EdgeCheckpoint {
                topic: topic_in(key, ns, topic)?,
            },
            _ => return Err(unknown()),
        };
        Ok(parsed)
    }

    /// The topic this key belongs to, for the keys that carry one.
    pub fn topic(&self) -> Option<&TopicName> {
        match self {
            MetadataKey::BrokerAssignment { topic, .. }
            | MetadataKey::Unassigned { topic }
            | MetadataKey::NamespaceTopic { topic }
            | MetadataKey::Topic { topic, .. }
            | MetadataKey::EdgeCheckpoint { topic } => Some(topic),
            _ => None,
        }
    }
}

impl FromStr for MetadataKey {
    type Err = KeyParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        MetadataKey::parse(s)
    }
}

/// The topic of a topic-carrying key (`/topics/...`, `/edge/checkpoints/...`,
/// `/cluster/unassigned/...`, `/cluster/brokers/{id}/{ns}/{topic}`,
/// `/namespaces/{ns}/topics/...`).
///
/// # Errors
/// [`KeyParseError`] when the key does not parse or carries no topic.
pub fn parse_topic(key: &str) -> Result<TopicName, KeyParseError> {
    match MetadataKey::parse(key)? {
        MetadataKey::BrokerAssignment { topic, .. }
        | MetadataKey::Unassigned { topic }
        | MetadataKey::NamespaceTopic { topic }
        | MetadataKey::Topic { topic, .. }
        | MetadataKey::EdgeCheckpoint { topic } => Ok(topic),
        _ => Err(KeyParseError::Unknown {
            key: key.to_owned(),
            expected: "topic-carrying",
        }),
    }
}

/// The topic, subscription name and key kind of a subscription key
/// (`/topics/{ns}/{topic}/subscriptions/{sub}[/cursor|/failure_policy|/dispatch_config]`).
///
/// # Errors
/// [`KeyParseError`] when the key is not a subscription key.
pub fn parse_subscription_key(
    key: &str,
) -> Result<(TopicName, SubscriptionName, SubscriptionKey), KeyParseError> {
    match MetadataKey::parse(key)? {
        MetadataKey::Topic {
            topic,
            key: TopicKey::Subscription { name, key: kind },
        } => Ok((topic, name, kind)),
        _ => Err(KeyParseError::Unknown {
            key: key.to_owned(),
            expected: "subscription",
        }),
    }
}

/// Builders for `/cluster/...`.
pub mod cluster {
    use super::{MetadataKey, TopicName};

    /// `/cluster/leader`.
    pub fn leader() -> String {
        MetadataKey::ClusterLeader.to_string()
    }

    /// `/cluster/register/{broker_id}`.
    pub fn register(broker_id: u64) -> String {
        MetadataKey::BrokerRegistration { broker_id }.to_string()
    }

    /// `/cluster/register/`: every registration.
    pub fn register_prefix() -> String {
        "/cluster/register/".to_owned()
    }

    /// `/cluster/brokers/{broker_id}/state`.
    pub fn broker_state(broker_id: u64) -> String {
        MetadataKey::BrokerState { broker_id }.to_string()
    }

    /// `/cluster/brokers/{broker_id}/{ns}/{topic}`.
    pub fn broker_assignment(broker_id: u64, topic: &TopicName) -> String {
        MetadataKey::BrokerAssignment {
            broker_id,
            topic: topic.clone(),
        }
        .to_string()
    }

    /// `/cluster/brokers/{broker_id}/`: the prefix a broker watches for its
    /// assignments. It also matches `.../state`, which
    /// [`MetadataKey::parse`] tells apart.
    pub fn broker_prefix(broker_id: u64) -> String {
        format!("/cluster/brokers/{broker_id}/")
    }

    /// `/cluster/unassigned/{ns}/{topic}`.
    pub fn unassigned(topic: &TopicName) -> String {
        MetadataKey::Unassigned {
            topic: topic.clone(),
        }
        .to_string()
    }

    /// `/cluster/unassigned/`: the queue the load manager watches.
    pub fn unassigned_prefix() -> String {
        "/cluster/unassigned/".to_owned()
    }

    /// `/cluster/load/{broker_id}`.
    pub fn load(broker_id: u64) -> String {
        MetadataKey::BrokerLoad { broker_id }.to_string()
    }

    /// `/cluster/load/`: every load report.
    pub fn load_prefix() -> String {
        "/cluster/load/".to_owned()
    }

    /// `/cluster/load_balance`.
    pub fn load_balance() -> String {
        MetadataKey::LoadBalance.to_string()
    }

    /// `/cluster/rebalancing_history/{timestamp_ms:020}`.
    pub fn rebalancing_history(timestamp_ms: u64) -> String {
        MetadataKey::RebalancingHistory { timestamp_ms }.to_string()
    }

    /// `/cluster/rebalancing_history/`: entries list in time order.
    pub fn rebalancing_history_prefix() -> String {
        "/cluster/rebalancing_history/".to_owned()
    }
}

/// Builders for `/namespaces/...`.
pub mod namespaces {
    use super::{MetadataKey, NamespaceName, TopicName};

    /// `/namespaces/{ns}/policy`.
    pub fn policy(namespace: &NamespaceName) -> String {
        MetadataKey::NamespacePolicy {
            namespace: namespace.clone(),
        }
        .to_string()
    }

    /// `/namespaces/{ns}/topics/{ns}/{topic}`.
    pub fn topic(topic: &TopicName) -> String {
        MetadataKey::NamespaceTopic {
            topic: topic.clone(),
        }
        .to_string()
    }

    /// `/namespaces/{ns}/topics/`: the topic registry of a namespace.
    pub fn topics_prefix(namespace: &NamespaceName) -> String {
        format!("/namespaces/{namespace}/topics/")
    }

    /// `/namespaces/{ns}/`: everything of one namespace.
    pub fn prefix(namespace: &NamespaceName) -> String {
        format!("/namespaces/{namespace}/")
    }

    /// `/namespaces/`: every namespace.
    pub fn all_prefix() -> String {
        "/namespaces/".to_owned()
    }
}

/// Builders for `/topics/...`.
pub mod topics {
    use super::{
        MetadataKey, NamespaceName, SubscriptionKey, SubscriptionName, TopicKey, TopicName,
    };

    fn key(topic: &TopicName, key: TopicKey) -> String {
        MetadataKey::Topic {
            topic: topic.clone(),
            key,
        }
        .to_string()
    }

    fn subscription_key(
        topic: &TopicName,
        name: &SubscriptionName,
        kind: SubscriptionKey,
    ) -> String {
        key(
            topic,
            TopicKey::Subscription {
                name: name.clone(),
                key: kind,
            },
        )
    }

    /// `/topics/{ns}/{topic}`: existence marker (partition count).
    pub fn marker(topic: &TopicName) -> String {
        key(topic, TopicKey::Marker)
    }

    /// `/topics/{ns}/{topic}/delivery`.
    pub fn delivery(topic: &TopicName) -> String {
        key(topic, TopicKey::Delivery)
    }

    /// `/topics/{ns}/{topic}/policy`.
    pub fn policy(topic: &TopicName) -> String {
        key(topic, TopicKey::Policy)
    }

    /// `/topics/{ns}/{topic}/intent`.
    pub fn intent(topic: &TopicName) -> String {
        key(topic, TopicKey::Intent)
    }

    /// `/topics/{ns}/{topic}/producers/{producer_id}`.
    pub fn producer(topic: &TopicName, producer_id: u64) -> String {
        key(topic, TopicKey::Producer { producer_id })
    }

    /// `/topics/{ns}/{topic}/producers/`.
    pub fn producers_prefix(topic: &TopicName) -> String {
        format!("/topics{topic}/producers/")
    }

    /// `/topics/{ns}/{topic}/subscriptions/{sub}`.
    pub fn subscription(topic: &TopicName, name: &SubscriptionName) -> String {
        subscription_key(topic, name, SubscriptionKey::Metadata)
    }

    /// `/topics/{ns}/{topic}/subscriptions/{sub}/cursor`.
    pub fn subscription_cursor(topic: &TopicName, name: &SubscriptionName) -> String {
        subscription_key(topic, name, SubscriptionKey::Cursor)
    }

    /// `/topics/{ns}/{topic}/subscriptions/{sub}/failure_policy`.
    pub fn subscription_failure_policy(topic: &TopicName, name: &SubscriptionName) -> String {
        subscription_key(topic, name, SubscriptionKey::FailurePolicy)
    }

    /// `/topics/{ns}/{topic}/subscriptions/{sub}/dispatch_config`.
    pub fn subscription_dispatch_config(topic: &TopicName, name: &SubscriptionName) -> String {
        subscription_key(topic, name, SubscriptionKey::DispatchConfig)
    }

    /// `/topics/{ns}/{topic}/subscriptions/`: every subscription key of a
    /// topic, sub-keys included; [`super::parse_subscription_key`] sorts
    /// them out.
    pub fn subscriptions_prefix(topic: &TopicName) -> String {
        format!("/topics{topic}/subscriptions/")
    }

    /// `/topics/{ns}/{topic}/`: every sub-key of one topic (not the marker,
    /// and not topics whose name merely starts with this one's).
    pub fn topic_prefix(topic: &TopicName) -> String {
        format!("/topics{topic}/")
    }

    /// `/topics/{ns}/`: every key of every topic in a namespace.
    pub fn namespace_prefix(namespace: &NamespaceName) -> String {
        format!("/topics/{namespace}/")
    }

    /// `/topics/`: every topic key.
    pub fn all_prefix() -> String {
        "/topics/".to_owned()
    }
}

/// Builders for `/schemas/...`.
pub mod schemas {
    use super::{MetadataKey, SubjectName};

    /// `/schemas/_global/next_schema_id`.
    pub fn next_schema_id() -> String {
        MetadataKey::NextSchemaId.to_string()
    }

    /// `/schemas/{subject}/metadata`.
    pub fn metadata(subject: &SubjectName) -> String {
        MetadataKey::SchemaMetadata {
            subject: subject.clone(),
        }
        .to_string()
    }

    /// `/schemas/{subject}/compatibility`.
    pub fn compatibility(subject: &SubjectName) -> String {
        MetadataKey::SchemaCompatibility {
            subject: subject.clone(),
        }
        .to_string()
    }

    /// `/schemas/_index/by_id/{schema_id}`.
    pub fn by_id(schema_id: u64) -> String {
        MetadataKey::SchemaById { schema_id }.to_string()
    }
}

/// Builders for `/auth/...`.
pub mod auth {
    use super::{BindingId, MetadataKey, RoleName};

    /// `/auth/roles/{role}`.
    pub fn role(role: &RoleName) -> String {
        MetadataKey::AuthRole { role: role.clone() }.to_string()
    }

    /// `/auth/bindings/{binding_id}`.
    pub fn binding(binding: &BindingId) -> String {
        MetadataKey::AuthBinding {
            binding: binding.clone(),
        }
        .to_string()
    }

    /// `/auth/`: brokers watch it and reload RBAC on any change.
    pub fn prefix() -> String {
        "/auth/".to_owned()
    }
}

/// Builders for `/edge/...`.
pub mod edge {
    use super::{MetadataKey, TopicName};

    /// `/edge/checkpoints/{ns}/{topic}`.
    pub fn checkpoint(topic: &TopicName) -> String {
        MetadataKey::EdgeCheckpoint {
            topic: topic.clone(),
        }
        .to_string()
    }

    /// `/edge/checkpoints/`: every checkpoint.
    pub fn checkpoints_prefix() -> String {
        "/edge/checkpoints/".to_owned()
    }
}

// ---------------------------------------------------------------------------
// Storage keys and object keys
// ---------------------------------------------------------------------------

/// A key under the storage prefix.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum StorageKey {
    /// `{prefix}/storage/topics/{ns}/{topic}/segments/{start:020}`: durable
    /// segment descriptor.
    SegmentDescriptor {
        /// Topic.
        topic: TopicName,
        /// First offset of the segment.
        start_offset: u64,
    },
    /// `{prefix}/storage/topics/{ns}/{topic}/segments/cur`: pointer to the
    /// latest published descriptor.
    SegmentsCur {
        /// Topic.
        topic: TopicName,
    },
    /// `{prefix}/storage/topics/{ns}/{topic}/state`: sealed mobility marker.
    TopicState {
        /// Topic.
        topic: TopicName,
    },
    /// `{prefix}/storage/topics/{ns}/{topic}/retired`: cold-retention low
    /// mark, `{"below_offset": N}`: offsets below N were removed from the
    /// archive on purpose (descriptor and object).
    Retired {
        /// Topic.
        topic: TopicName,
    },
}

/// A parsed segment object key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SegmentObject {
    /// Topic.
    pub topic: TopicName,
    /// First offset in the segment.
    pub start_offset: u64,
    /// Last offset in the segment (inclusive), `>= start_offset`.
    pub end_offset: u64,
}

/// Storage paths and object keys under a configured prefix (default
/// [`DEFAULT_STORAGE_PREFIX`]).
///
/// The prefix is `/` followed by one or more valid names separated by `/`,
/// no trailing `/`, at most [`MAX_NAME_BYTES`] bytes; e.g. `/tributary` or
/// `/prod/tributary`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StorageKeys {
    /// Invariant: valid per the rules above.
    prefix: String,
}

impl Default for StorageKeys {
    fn default() -> Self {
        StorageKeys {
            prefix: DEFAULT_STORAGE_PREFIX.to_owned(),
        }
    }
}

impl StorageKeys {
    /// Validates `prefix`.
    ///
    /// # Errors
    /// [`NameError`] with `what = StoragePrefix`.
    pub fn new(prefix: &str) -> Result<StorageKeys, NameError> {
        let fail = |kind| NameError::new(NamePart::StoragePrefix, prefix, kind);
        check_len(NamePart::StoragePrefix, prefix).map_err(fail)?;
        let Some(rest) = prefix.strip_prefix('/') else {
            return Err(fail(NameErrorKind::MissingLeadingSlash {
                part: NamePart::StoragePrefix,
            }));
        };
        for part in rest.split('/') {
            check_part(NamePart::StoragePrefix, part).map_err(fail)?;
        }
        Ok(StorageKeys {
            prefix: prefix.to_owned(),
        })
    }

    /// The prefix, e.g. `/tributary`.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// `{prefix}/storage/topics/{ns}/{topic}`.
    fn topic_root(&self, topic: &TopicName) -> String {
        format!("{}/storage/topics{topic}", self.prefix)
    }

    /// `{prefix}/storage/topics/{ns}/{topic}/segments/{start:020}`.
    pub fn segment_descriptor(&self, topic: &TopicName, start_offset: u64) -> String {
        self.key(&StorageKey::SegmentDescriptor {
            topic: topic.clone(),
            start_offset,
        })
    }

    /// `{prefix}/storage/topics/{ns}/{topic}/segments/cur`.
    pub fn segments_cur(&self, topic: &TopicName) -> String {
        self.key(&StorageKey::SegmentsCur {
            topic: topic.clone(),
        })
    }

    /// `{prefix}/storage/topics/{ns}/{topic}/segments/`: lists the
    /// descriptors in offset order, followed by `cur`.
    pub fn segments_prefix(&self, topic: &TopicName) -> String {
        format!("{}/segments/", self.topic_root(topic))
    }

    /// `{prefix}/storage/topics/{ns}/{topic}/state`.
    pub fn topic_state(&self, topic: &TopicName) -> String {
        self.key(&StorageKey::TopicState {
            topic: topic.clone(),
        })
    }

    /// `{prefix}/storage/topics/{ns}/{topic}/retired`.
    pub fn retired(&self, topic: &TopicName) -> String {
        self.key(&StorageKey::Retired {
            topic: topic.clone(),
        })
    }

    /// Builds a storage key.
    pub fn key(&self, key: &StorageKey) -> String {
        match key {
            StorageKey::SegmentDescriptor {
                topic,
                start_offset,
            } => format!("{}/segments/{start_offset:020}", self.topic_root(topic)),
            StorageKey::SegmentsCur { topic } => {
                format!("{}/segments/{SEGMENTS_CUR}", self.topic_root(topic))
            }
            StorageKey::TopicState { topic } => format!("{}/state", self.topic_root(topic)),
            StorageKey::Retired { topic } => format!("{}/retired", self.topic_root(topic)),
        }
    }

    /// The value stored at `segments/cur`: the padded start offset of the
    /// latest descriptor (the last part of its key).
    pub fn segments_cur_value(start_offset: u64) -> String {
        format!("{start_offset:020}")
    }

    /// Parses the value stored at `segments/cur`.
    ///
    /// # Errors
    /// [`KeyParseError::Number`] unless it is 20 digits.
    pub fn parse_segments_cur_value(value: &str) -> Result<u64, KeyParseError> {
        padded(value, "start_offset", value)
    }

    /// Parses a key under this prefix; the inverse of [`StorageKeys::key`].
    ///
    /// # Errors
    /// [`KeyParseError`] when the key is not under this prefix's
    /// `storage/topics/`, or malformed.
    pub fn parse(&self, key: &str) -> Result<StorageKey, KeyParseError> {
        let unknown = || KeyParseError::Unknown {
            key: key.to_owned(),
            expected: "storage",
        };
        let rest = key
            .strip_prefix(self.prefix.as_str())
            .and_then(|r| r.strip_prefix("/storage/topics/"))
            .ok_or_else(unknown)?;
        let parts: Vec<&str> = rest.split('/').collect();
        match parts.as_slice() {
            [ns, topic, "segments", "cur"] => Ok(StorageKey::SegmentsCur {
                topic: topic_in(key, ns, topic)?,
            }),
            [ns, topic, "segments", start] => Ok(StorageKey::SegmentDescriptor {
                topic: topic_in(key, ns, topic)?,
                start_offset: padded(key, "start_offset", start)?,
            }),
            [ns, topic, "state"] => Ok(StorageKey::TopicState {
                topic: topic_in(key, ns, topic)?,
            }),
            [ns, topic, "retired"] => Ok(StorageKey::Retired {
                topic: topic_in(key, ns, topic)?,
            }),
            _ => Err(unknown()),
        }
    }

    /// Topic and start offset of a descriptor key (not `segments/cur`).
    ///
    /// # Errors
    /// [`KeyParseError`] when the key is not a descriptor key.
    pub fn parse_segment_descriptor(&self, key: &str) -> Result<(TopicName, u64), KeyParseError> {
        match self.parse(key)? {
            StorageKey::SegmentDescriptor {
                topic,
                start_offset,
            } => Ok((topic, start_offset)),
            _ => Err(KeyParseError::Unknown {
                key: key.to_owned(),
                expected: "segment descriptor",
            }),
        }
    }

    /// The object-store form of the prefix: without its leading `/`.
    fn object_prefix(&self) -> &str {
        // The prefix starts with '/' by the struct invariant.
        &self.prefix[1..]
    }

    /// `{prefix}/storage/topics/` without the leading `/`: the root of
    /// every segment object, for browsing a bucket.
    pub fn objects_root(&self) -> String {
        format!("{}/storage/topics/", self.object_prefix())
    }

    /// `{prefix}/storage/topics/{ns}/{topic}/segments/` without the leading
    /// `/`: every segment object of a topic, in offset order.
    pub fn segment_objects_prefix(&self, topic: &TopicName) -> String {
        format!("{}/storage/topics{topic}/segments/", self.object_prefix())
    }

    /// The object key of the segment holding offsets `start_offset..=end_offset`:
    /// `{prefix}/storage/topics/{ns}/{topic}/segments/{start:020}-{end:020}.seg`
    /// without the leading `/`.
    ///
    /// # Panics
    /// If `end_offset < start_offset`: a segment holds at least one record,
    /// and both offsets come from a sealed segment, so this is a caller bug.
    pub fn segment_object(&self, topic: &TopicName, start_offset: u64, end_offset: u64) -> String {
        assert!(
            start_offset <= end_offset,
            "segment end offset {end_offset} below start offset {start_offset}"
        );
        format!(
            "{}{start_offset:020}-{end_offset:020}{SEGMENT_OBJECT_SUFFIX}",
            self.segment_objects_prefix(topic)
        )
    }

    /// Parses a segment object key under this prefix.
    ///
    /// # Errors
    /// [`KeyParseError`] when the key is not a segment object key of this
    /// prefix, an offset is not 20 digits, or `end < start`.
    pub fn parse_segment_object(&self, key: &str) -> Result<SegmentObject, KeyParseError> {
        let unknown = || KeyParseError::Unknown {
            key: key.to_owned(),
            expected: "segment object",
        };
        let rest = key
            .strip_prefix(self.object_prefix())
            .and_then(|r| r.strip_prefix("/storage/topics/"))
            .ok_or_else(unknown)?;
        let parts: Vec<&str> = rest.split('/').collect();
        let [ns, topic, "segments", file] = parts.as_slice() else {
            return Err(unknown());
        };
        let range = file
            .strip_suffix(SEGMENT_OBJECT_SUFFIX)
            .ok_or_else(unknown)?;
        let (start, end) = range.split_once('-').ok_or_else(unknown)?;
        let topic = topic_in(key, ns, topic)?;
        let start_offset = padded(key, "start_offset", start)?;
        let end_offset = padded(key, "end_offset", end)?;
        if end_offset < start_offset {
            return Err(KeyParseError::SegmentRange {
                key: key.to_owned(),
                start: start_offset,
                end: end_offset,
            });
        }
        Ok(SegmentObject {
            topic,
            start_offset,
            end_offset,
        })
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use proptest::strategy::Union;

    use super::*;

    fn topic(name: &str) -> TopicName {
        TopicName::new(name).expect("valid topic name")
    }

    fn sub(name: &str) -> SubscriptionName {
        SubscriptionName::new(name).expect("valid subscription name")
    }

    fn topic_err(name: &str) -> NameErrorKind {
        let err = TopicName::new(name).expect_err("invalid topic name");
        assert_eq!(err.what, NamePart::TopicName);
        assert_eq!(err.input, name);
        err.kind
    }

    // ---- topic name rules -------------------------------------------------

    #[test]
    fn valid_topic_names_split_into_parts() {
        let t = topic("/default/agent-jobs");
        assert_eq!(t.as_str(), "/default/agent-jobs");
        assert_eq!(t.namespace(), "default");
        assert_eq!(t.topic(), "agent-jobs");
        assert_eq!(t.namespace_name().as_str(), "default");
        let t = topic("/Ns.1_x/t.-_Z9");
        assert_eq!((t.namespace(), t.topic()), ("Ns.1_x", "t.-_Z9"));
        // Dots are fine inside a name, only "." and ".." alone are refused.
        assert_eq!(topic("/.a/...").topic(), "...");
    }

    #[test]
    fn topic_name_rejects_empty_input_and_empty_parts() {
        assert_eq!(
            topic_err(""),
            NameErrorKind::Empty {
                part: NamePart::TopicName
            }
        );
        assert_eq!(
            topic_err("//b"),
            NameErrorKind::Empty {
                part: NamePart::Namespace
            }
        );
        assert_eq!(
            topic_err("/a/"),
            NameErrorKind::Empty {
                part: NamePart::Topic
            }
        );
    }

    #[test]
    fn topic_name_requires_leading_slash() {
        assert_eq!(
            topic_err("default/jobs"),
            NameErrorKind::MissingLeadingSlash {
                part: NamePart::TopicName
            }
        );
    }

    #[test]
    fn topic_name_requires_exactly_two_parts() {
        for (name, found) in [
            ("/a", 1),
            ("/", 1),
            ("/a/b/c", 3),
            ("/a/b/", 3),
            ("/a//b", 3),
        ] {
            assert_eq!(
                topic_err(name),
                NameErrorKind::WrongPartCount {
                    part: NamePart::TopicName,
                    expected: 2,
                    found
                },
                "{name}"
            );
        }
    }

    #[test]
    fn topic_name_rejects_dot_parts() {
        for (name, part) in [
            ("/./b", NamePart::Namespace),
            ("/../b", NamePart::Namespace),
            ("/a/.", NamePart::Topic),
            ("/a/..", NamePart::Topic),
        ] {
            assert_eq!(topic_err(name), NameErrorKind::DotName { part }, "{name}");
        }
    }

    #[test]
    fn topic_name_rejects_control_characters() {
        assert_eq!(
            topic_err("/a/b\nc"),
            NameErrorKind::ControlChar {
                part: NamePart::Topic,
                ch: '\n',
                at: 1
            }
        );
        assert_eq!(
            topic_err("/\0/b"),
            NameErrorKind::ControlChar {
                part: NamePart::Namespace,
                ch: '\0',
                at: 0
            }
        );
        assert_eq!(
            topic_err("/a/x\u{7f}"),
            NameErrorKind::ControlChar {
                part: NamePart::Topic,
                ch: '\u{7f}',
                at: 1
            }
        );
        assert_eq!(
            topic_err("/a/\u{85}"),
            NameErrorKind::ControlChar {
                part: NamePart::Topic,
                ch: '\u{85}',
                at: 0
            }
        );
    }

    #[test]
    fn topic_name_rejects_characters_outside_the_set() {
        for (name, ch, at) in [
            ("/a/b c", ' ', 1),
            ("/a/é", 'é', 0),
            ("/a/b*", '*', 1),
            ("/a:b/c", ':', 1),
            ("/a/b\\c", '\\', 1),
            ("/a/b%2F", '%', 1),
            ("/a/b+c", '+', 1),
        ] {
            let kind = topic_err(name);
            let part = if name.starts_with("/a/") {
                NamePart::Topic
            } else {
                NamePart::Namespace
            };
            assert_eq!(
                kind,
                NameErrorKind::DisallowedChar { part, ch, at },
                "{name}"
            );
        }
        let message = TopicName::new("/a/b c").unwrap_err().to_string();
        assert_eq!(
            message,
            "invalid topic name \"/a/b c\": topic contains ' ' at byte 1; \
             allowed: ASCII letters, digits, '-', '_', '.'"
        );
    }

    #[test]
    fn topic_name_length_limit_is_255_bytes_in_total() {
        let max = format!("/ns/{}", "t".repeat(MAX_NAME_BYTES - 4));
        assert_eq!(max.len(), 255);
        assert_eq!(topic(&max).as_str(), max);
        let over = format!("{max}t");
        assert_eq!(
            topic_err(&over),
            NameErrorKind::TooLong {
                part: NamePart::TopicName,
                len: 256,
                max: 255
            }
        );
    }

    #[test]
    fn single_names_follow_the_same_rules() {
        type Check = fn(&str) -> Result<(), NameError>;
        let checks: [(NamePart, Check); 5] = [
            (NamePart::Namespace, |s| NamespaceName::new(s).map(drop)),
            (NamePart::Subscription, |s| {
                SubscriptionName::new(s).map(drop)
            }),
            (NamePart::Subject, |s| SubjectName::new(s).map(drop)),
            (NamePart::Role, |s| RoleName::new(s).map(drop)),
            (NamePart::Binding, |s| BindingId::new(s).map(drop)),
        ];
        for (part, check) in checks {
            assert_eq!(check("worker-pool.v2_A"), Ok(()), "{part}");
            let kind = |s: &str| {
                let err = check(s).expect_err(s);
                assert_eq!((err.what, err.input.as_str()), (part, s));
                err.kind
            };
            assert_eq!(kind(""), NameErrorKind::Empty { part });
            assert_eq!(kind("."), NameErrorKind::DotName { part });
            assert_eq!(kind(".."), NameErrorKind::DotName { part });
            assert_eq!(
                kind("a\tb"),
                NameErrorKind::ControlChar {
                    part,
                    ch: '\t',
                    at: 1
                }
            );
            assert_eq!(
                kind("a/b"),
                NameErrorKind::DisallowedChar {
                    part,
                    ch: '/',
                    at: 1
                }
            );
            assert_eq!(
                kind("ab\u{e9}"),
                NameErrorKind::DisallowedChar {
                    part,
                    ch: '\u{e9}',
                    at: 2
                }
            );
            assert_eq!(check(&"x".repeat(255)), Ok(()));
            assert_eq!(
                kind(&"x".repeat(256)),
                NameErrorKind::TooLong {
                    part,
                    len: 256,
                    max: 255
                }
            );
        }
    }

    #[test]
    fn subjects_starting_with_underscore_are_reserved() {
        for reserved in ["_global", "_index", "_x"] {
            assert_eq!(
                SubjectName::new(reserved).unwrap_err().kind,
                NameErrorKind::Reserved {
                    part: NamePart::Subject
                }
            );
        }
        // Only subjects: other names may start with '_'.
        assert!(SubscriptionName::new("_internal").is_ok());
    }

    #[test]
    fn names_serialize_as_strings_and_validate_when_deserialized() {
        let t = topic("/default/agent-jobs");
        let json = serde_json::to_string(&t).unwrap();
        assert_eq!(json, "\"/default/agent-jobs\"");
        assert_eq!(serde_json::from_str::<TopicName>(&json).unwrap(), t);
        assert!(serde_json::from_str::<TopicName>("\"/a/b/c\"").is_err());
        assert_eq!(
            serde_json::from_str::<SubscriptionName>("\"worker-pool\"").unwrap(),
            sub("worker-pool")
        );
        assert!(serde_json::from_str::<SubscriptionName>("\"a b\"").is_err());
    }

    // ---- partitions and suffixes ------------------------------------------

    #[test]
    fn partitions_append_part_n() {
        let t = topic("/default/agent-jobs");
        let p = t.partition(2).unwrap();
        assert_eq!(p.as_str(), "/default/agent-jobs-part-2");
        assert_eq!(p.partition_of(), Some((t.clone(), 2)));
        assert_eq!(t.partition_of(), None);
        assert_eq!(topic("/a/b-part-01").partition_of(), None);
        assert_eq!(topic("/a/b-part-").partition_of(), None);
        assert_eq!(topic("/a/-part-1").partition_of(), None);
        assert_eq!(topic("/a/b-part-4294967296").partition_of(), None);
        assert_eq!(
            topic("/a/x-part-1-part-2").partition_of(),
            Some((topic("/a/x-part-1"), 2))
        );
        let long = topic(&format!("/n/{}", "t".repeat(250)));
        assert!(matches!(
            long.partition(0).unwrap_err().kind,
            NameErrorKind::TooLong { len: 260, .. }
        ));
    }

    #[test]
    fn with_suffix_builds_dead_letter_topics() {
        let t = topic("/default/agent-jobs");
        assert_eq!(
            t.with_suffix("-dlq").unwrap().as_str(),
            "/default/agent-jobs-dlq"
        );
        assert!(matches!(
            t.with_suffix("/x").unwrap_err().kind,
            NameErrorKind::WrongPartCount { found: 3, .. }
        ));
        assert!(matches!(
            t.with_suffix(" dlq").unwrap_err().kind,
            NameErrorKind::DisallowedChar { ch: ' ', .. }
        ));
    }

    // ---- every key path, pinned -------------------------------------------

    #[test]
    fn cluster_keys() {
        let t = topic("/default/jobs");
        assert_eq!(cluster::leader(), "/cluster/leader");
        assert_eq!(cluster::register(7), "/cluster/register/7");
        assert_eq!(cluster::register_prefix(), "/cluster/register/");
        assert_eq!(cluster::broker_state(7), "/cluster/brokers/7/state");
        assert_eq!(
            cluster::broker_assignment(7, &t),
            "/cluster/brokers/7/default/jobs"
        );
        assert_eq!(cluster::broker_prefix(7), "/cluster/brokers/7/");
        assert_eq!(cluster::unassigned(&t), "/cluster/unassigned/default/jobs");
        assert_eq!(cluster::unassigned_prefix(), "/cluster/unassigned/");
        assert_eq!(cluster::load(7), "/cluster/load/7");
        assert_eq!(cluster::load_prefix(), "/cluster/load/");
        assert_eq!(cluster::load_balance(), "/cluster/load_balance");
        assert_eq!(
            cluster::rebalancing_history(1_700_000_000_000),
            "/cluster/rebalancing_history/00000001700000000000"
        );
        assert_eq!(
            cluster::rebalancing_history_prefix(),
            "/cluster/rebalancing_history/"
        );
    }

    #[test]
    fn namespace_keys() {
        let ns = NamespaceName::new("default").unwrap();
        assert_eq!(namespaces::policy(&ns), "/namespaces/default/policy");
        assert_eq!(
            namespaces::topic(&topic("/default/jobs")),
            "/namespaces/default/topics/default/jobs"
        );
        assert_eq!(
            namespaces::topics_prefix(&ns),
            "/namespaces/default/topics/"
        );
        assert_eq!(namespaces::prefix(&ns), "/namespaces/default/");
        assert_eq!(namespaces::all_prefix(), "/namespaces/");
    }

    #[test]
    fn topic_keys() {
        let t = topic("/default/jobs");
        let s = sub("worker-pool");
        assert_eq!(topics::marker(&t), "/topics/default/jobs");
        assert_eq!(topics::delivery(&t), "/topics/default/jobs/delivery");
        assert_eq!(topics::policy(&t), "/topics/default/jobs/policy");
        assert_eq!(topics::intent(&t), "/topics/default/jobs/intent");
        assert_eq!(
            topics::producer(&t, 42),
            "/topics/default/jobs/producers/42"
        );
        assert_eq!(
            topics::producers_prefix(&t),
            "/topics/default/jobs/producers/"
        );
        assert_eq!(
            topics::subscription(&t, &s),
            "/topics/default/jobs/subscriptions/worker-pool"
        );
        assert_eq!(
            topics::subscription_cursor(&t, &s),
            "/topics/default/jobs/subscriptions/worker-pool/cursor"
        );
        assert_eq!(
            topics::subscription_failure_policy(&t, &s),
            "/topics/default/jobs/subscriptions/worker-pool/failure_policy"
        );
        assert_eq!(
            topics::subscription_dispatch_config(&t, &s),
            "/topics/default/jobs/subscriptions/worker-pool/dispatch_config"
        );
        assert_eq!(
            topics::subscriptions_prefix(&t),
            "/topics/default/jobs/subscriptions/"
        );
        assert_eq!(topics::topic_prefix(&t), "/topics/default/jobs/");
        assert_eq!(
            topics::namespace_prefix(&t.namespace_name()),
            "/topics/default/"
        );
        assert_eq!(topics::all_prefix(), "/topics/");
    }

    #[test]
    fn schema_auth_and_edge_keys() {
        let subject = SubjectName::new("orders-value").unwrap();
        assert_eq!(schemas::next_schema_id(), "/schemas/_global/next_schema_id");
        assert_eq!(
            schemas::metadata(&subject),
            "/schemas/orders-value/metadata"
        );
        assert_eq!(
            schemas::compatibility(&subject),
            "/schemas/orders-value/compatibility"
        );
        assert_eq!(schemas::by_id(9), "/schemas/_index/by_id/9");
        assert_eq!(
            auth::role(&RoleName::new("admin").unwrap()),
            "/auth/roles/admin"
        );
        assert_eq!(
            auth::binding(&BindingId::new("b-1").unwrap()),
            "/auth/bindings/b-1"
        );
        assert_eq!(auth::prefix(), "/auth/");
        assert_eq!(
            edge::checkpoint(&topic("/edge1/sensors")),
            "/edge/checkpoints/edge1/sensors"
        );
        assert_eq!(edge::checkpoints_prefix(), "/edge/checkpoints/");
    }

    #[test]
    fn storage_keys_with_default_prefix() {
        let keys = StorageKeys::default();
        let t = topic("/default/jobs");
        assert_eq!(keys.prefix(), "/tributary");
        assert_eq!(
            keys.segment_descriptor(&t, 1234),
            "/tributary/storage/topics/default/jobs/segments/00000000000000001234"
        );
        assert_eq!(
            keys.segments_cur(&t),
            "/tributary/storage/topics/default/jobs/segments/cur"
        );
        assert_eq!(
            keys.segments_prefix(&t),
            "/tributary/storage/topics/default/jobs/segments/"
        );
        assert_eq!(
            keys.topic_state(&t),
            "/tributary/storage/topics/default/jobs/state"
        );
        assert_eq!(
            keys.segment_object(&t, 0, 99),
            "tributary/storage/topics/default/jobs/segments/\
             00000000000000000000-00000000000000000099.seg"
        );
        assert_eq!(
            keys.segment_objects_prefix(&t),
            "tributary/storage/topics/default/jobs/segments/"
        );
        assert_eq!(keys.objects_root(), "tributary/storage/topics/");
        assert_eq!(
            StorageKeys::segments_cur_value(1234),
            "00000000000000001234"
        );
        assert_eq!(
            StorageKeys::parse_segments_cur_value("00000000000000001234"),
            Ok(1234)
        );
        assert!(StorageKeys::parse_segments_cur_value("1234").is_err());
        // `cur` sorts after every padded descriptor.
        assert!(keys.segment_descriptor(&t, u64::MAX) < keys.segments_cur(&t));
    }

    #[test]
    fn storage_keys_with_custom_prefix() {
        let keys = StorageKeys::new("/prod/trib").unwrap();
        let t = topic("/default/jobs");
        assert_eq!(
            keys.segment_descriptor(&t, 5),
            "/prod/trib/storage/topics/default/jobs/segments/00000000000000000005"
        );
        assert_eq!(
            keys.segment_object(&t, 5, 5),
            "prod/trib/storage/topics/default/jobs/segments/\
             00000000000000000005-00000000000000000005.seg"
        );
        // A key under another prefix is not ours.
        assert!(matches!(
            keys.parse(&StorageKeys::default().segments_cur(&t)),
            Err(KeyParseError::Unknown { .. })
        ));
    }

    #[test]
    fn storage_prefix_validation() {
        let kind = |p: &str| StorageKeys::new(p).unwrap_err().kind;
        let part = NamePart::StoragePrefix;
        assert_eq!(
            kind("tributary"),
            NameErrorKind::MissingLeadingSlash { part }
        );
        assert_eq!(kind(""), NameErrorKind::MissingLeadingSlash { part });
        assert_eq!(kind("/"), NameErrorKind::Empty { part });
        assert_eq!(kind("/tributary/"), NameErrorKind::Empty { part });
        assert_eq!(kind("/a//b"), NameErrorKind::Empty { part });
        assert_eq!(kind("/a/../b"), NameErrorKind::DotName { part });
        assert_eq!(
            kind("/a b"),
            NameErrorKind::DisallowedChar {
                part,
                ch: ' ',
                at: 1
            }
        );
        assert!(matches!(
            kind(&format!("/{}", "p".repeat(255))),
            NameErrorKind::TooLong { len: 256, .. }
        ));
    }

    #[test]
    #[should_panic(expected = "below start offset")]
    fn segment_object_with_end_before_start_is_a_caller_bug() {
        let _ = StorageKeys::default().segment_object(&topic("/a/b"), 10, 9);
    }

    // ---- parsing ----------------------------------------------------------

    #[test]
    fn parse_reads_back_topics_and_subscriptions() {
        let t = topic("/default/jobs");
        let s = sub("worker-pool");
        assert_eq!(parse_topic(&topics::intent(&t)), Ok(t.clone()));
        assert_eq!(parse_topic(&topics::marker(&t)), Ok(t.clone()));
        assert_eq!(parse_topic(&edge::checkpoint(&t)), Ok(t.clone()));
        assert_eq!(parse_topic(&cluster::unassigned(&t)), Ok(t.clone()));
        assert_eq!(
            parse_topic(&cluster::broker_assignment(3, &t)),
            Ok(t.clone())
        );
        assert_eq!(parse_topic(&namespaces::topic(&t)), Ok(t.clone()));
        assert!(matches!(
            parse_topic(&cluster::leader()),
            Err(KeyParseError::Unknown { .. })
        ));
        assert_eq!(
            parse_subscription_key(&topics::subscription_cursor(&t, &s)),
            Ok((t.clone(), s.clone(), SubscriptionKey::Cursor))
        );
        assert!(matches!(
            parse_subscription_key(&topics::delivery(&t)),
            Err(KeyParseError::Unknown {
                expected: "subscription",
                ..
            })
        ));
        // A topic named like a sub-key is still the marker of that topic.
        assert_eq!(
            MetadataKey::parse("/topics/default/delivery"),
            Ok(MetadataKey::Topic {
                topic: topic("/default/delivery"),
                key: TopicKey::Marker
            })
        );
        // State vs assignment under a broker.
        assert_eq!(
            MetadataKey::parse("/cluster/brokers/3/state"),
            Ok(MetadataKey::BrokerState { broker_id: 3 })
        );
    }

    #[test]
    fn parse_rejects_malformed_keys() {
        for key in [
            "",
            "cluster/leader",
            "/cluster/leader/",
            "/cluster",
            "/topics/default",
            "/topics/default/jobs/unknown",
            "/topics/default/jobs/subscriptions/s/cursor/x",
            "/topics/default/jobs/producers",
            "/schemas/_global/other",
            "/edge/checkpoints/default",
            "/nothing/here",
        ] {
            assert!(
                matches!(MetadataKey::parse(key), Err(KeyParseError::Unknown { .. })),
                "{key:?}"
            );
        }
        for (key, field) in [
            ("/cluster/register/01", "broker_id"),
            ("/cluster/register/+1", "broker_id"),
            ("/cluster/register/", "broker_id"),
            ("/cluster/load/18446744073709551616", "broker_id"),
            ("/topics/a/b/producers/x", "producer_id"),
            ("/schemas/_index/by_id/-1", "schema_id"),
            ("/cluster/rebalancing_history/17", "timestamp_ms"),
        ] {
            match MetadataKey::parse(key) {
                Err(KeyParseError::Number { field: f, .. }) => assert_eq!(f, field, "{key}"),
                other => panic!("{key}: {other:?}"),
            }
        }
        assert!(matches!(
            MetadataKey::parse("/topics/a b/c"),
            Err(KeyParseError::Name { .. })
        ));
        assert!(matches!(
            MetadataKey::parse("/topics/a/b/subscriptions/../cursor"),
            Err(KeyParseError::Name { .. })
        ));
        assert!(matches!(
            MetadataKey::parse("/schemas/_other/metadata"),
            Err(KeyParseError::Name { .. })
        ));
        assert_eq!(
            MetadataKey::parse("/namespaces/a/topics/b/t"),
            Err(KeyParseError::NamespaceMismatch {
                key: "/namespaces/a/topics/b/t".into(),
                outer: "a".into(),
                inner: "b".into()
            })
        );
    }

    #[test]
    fn storage_parse_rejects_malformed_keys() {
        let keys = StorageKeys::default();
        for key in [
            "/tributary/storage/topics/a/b/segments/12",
            "/tributary/storage/topics/a/b/segments/1234567890123456789a",
            "/tributary/storage/topics/a/b/segments/99999999999999999999",
        ] {
            assert!(
                matches!(keys.parse(key), Err(KeyParseError::Number { .. })),
                "{key}"
            );
        }
        for key in [
            "/tributary/storage/topics/a/b",
            "/tributary/storage/topics/a/b/segments",
            "/tributary/storage/a/b/state",
            "/tributaryx/storage/topics/a/b/state",
            "tributary/storage/topics/a/b/state",
        ] {
            assert!(
                matches!(keys.parse(key), Err(KeyParseError::Unknown { .. })),
                "{key}"
            );
        }
        assert!(matches!(
            keys.parse_segment_descriptor(&keys.segments_cur(&topic("/a/b"))),
            Err(KeyParseError::Unknown { .. })
        ));
        let base = "tributary/storage/topics/a/b/segments/";
        assert_eq!(
            keys.parse_segment_object(&format!(
                "{base}00000000000000000010-00000000000000000009.seg"
            )),
            Err(KeyParseError::SegmentRange {
                key: format!("{base}00000000000000000010-00000000000000000009.seg"),
                start: 10,
                end: 9
            })
        );
        for file in [
            "00000000000000000010-00000000000000000019",
            "00000000000000000010.seg",
            "10-19.seg",
            "00000000000000000010-00000000000000000019.seg.tmp",
        ] {
            assert!(
                keys.parse_segment_object(&format!("{base}{file}")).is_err(),
                "{file}"
            );
        }
        // Object keys have no leading slash.
        assert!(
            keys.parse_segment_object(&format!(
                "/{base}00000000000000000010-00000000000000000019.seg"
            ))
            .is_err()
        );
    }

    // ---- property tests ---------------------------------------------------

    fn name_part() -> impl Strategy<Value = String> {
        "[A-Za-z0-9._-]{1,24}".prop_filter("not . or ..", |s| s != "." && s != "..")
    }

    fn arb_topic() -> impl Strategy<Value = TopicName> {
        (name_part(), name_part()).prop_map(|(n, t)| topic(&format!("/{n}/{t}")))
    }

    fn arb_sub() -> impl Strategy<Value = SubscriptionName> {
        name_part().prop_map(|s| sub(&s))
    }

    fn arb_subject() -> impl Strategy<Value = SubjectName> {
        name_part()
            .prop_filter("not reserved", |s| !s.starts_with('_'))
            .prop_map(|s| SubjectName::new(&s).unwrap())
    }

    fn arb_topic_key() -> impl Strategy<Value = TopicKey> {
        let sub_key = prop_oneof![
            Just(SubscriptionKey::Metadata),
            Just(SubscriptionKey::Cursor),
            Just(SubscriptionKey::FailurePolicy),
            Just(SubscriptionKey::DispatchConfig),
        ];
        prop_oneof![
            Just(TopicKey::Marker),
            Just(TopicKey::Delivery),
            Just(TopicKey::Policy),
            Just(TopicKey::Intent),
            any::<u64>().prop_map(|producer_id| TopicKey::Producer { producer_id }),
            (arb_sub(), sub_key).prop_map(|(name, key)| TopicKey::Subscription { name, key }),
        ]
    }

    fn arb_metadata_key() -> impl Strategy<Value = MetadataKey> {
        Union::new(vec![
            Just(MetadataKey::ClusterLeader).boxed(),
            any::<u64>()
                .prop_map(|broker_id| MetadataKey::BrokerRegistration { broker_id })
                .boxed(),
            any::<u64>()
                .prop_map(|broker_id| MetadataKey::BrokerState { broker_id })
                .boxed(),
            (any::<u64>(), arb_topic())
                .prop_map(|(broker_id, topic)| MetadataKey::BrokerAssignment { broker_id, topic })
                .boxed(),
            arb_topic()
                .prop_map(|topic| MetadataKey::Unassigned { topic })
                .boxed(),
            any::<u64>()
                .prop_map(|broker_id| MetadataKey::BrokerLoad { broker_id })
                .boxed(),
            Just(MetadataKey::LoadBalance).boxed(),
            any::<u64>()
                .prop_map(|timestamp_ms| MetadataKey::RebalancingHistory { timestamp_ms })
                .boxed(),
            name_part()
                .prop_map(|n| MetadataKey::NamespacePolicy {
                    namespace: NamespaceName::new(&n).unwrap(),
                })
                .boxed(),
            arb_topic()
                .prop_map(|topic| MetadataKey::NamespaceTopic { topic })
                .boxed(),
            (arb_topic(), arb_topic_key())
                .prop_map(|(topic, key)| MetadataKey::Topic { topic, key })
                .boxed(),
            Just(MetadataKey::NextSchemaId).boxed(),
            arb_subject()
                .prop_map(|subject| MetadataKey::SchemaMetadata { subject })
                .boxed(),
            arb_subject()
                .prop_map(|subject| MetadataKey::SchemaCompatibility { subject })
                .boxed(),
            any::<u64>()
                .prop_map(|schema_id| MetadataKey::SchemaById { schema_id })
                .boxed(),
            name_part()
                .prop_map(|r| MetadataKey::AuthRole {
                    role: RoleName::new(&r).unwrap(),
                })
                .boxed(),
            name_part()
                .prop_map(|b| MetadataKey::AuthBinding {
                    binding: BindingId::new(&b).unwrap(),
                })
                .boxed(),
            arb_topic()
                .prop_map(|topic| MetadataKey::EdgeCheckpoint { topic })
                .boxed(),
        ])
    }

    fn arb_storage_keys() -> impl Strategy<Value = StorageKeys> {
        proptest::collection::vec(name_part(), 1..4)
            .prop_map(|parts| StorageKeys::new(&format!("/{}", parts.join("/"))).unwrap())
    }

    proptest! {
        #[test]
        fn topic_name_round_trips(ns in name_part(), t in name_part()) {
            let name = format!("/{ns}/{t}");
            let parsed = TopicName::new(&name).unwrap();
            prop_assert_eq!(parsed.as_str(), name.as_str());
            prop_assert_eq!(parsed.namespace(), ns.as_str());
            prop_assert_eq!(parsed.topic(), t.as_str());
            let via_parts = TopicName::from_parts(&parsed.namespace_name(), &t).unwrap();
            prop_assert_eq!(via_parts, parsed);
        }

        #[test]
        fn metadata_key_round_trips(key in arb_metadata_key()) {
            let text = key.to_string();
            prop_assert_eq!(MetadataKey::parse(&text), Ok(key.clone()));
            if let Some(topic) = key.topic() {
                prop_assert_eq!(parse_topic(&text), Ok(topic.clone()));
            }
        }

        #[test]
        fn subscription_key_round_trips(
            t in arb_topic(),
            s in arb_sub(),
            kind in prop_oneof![
                Just(SubscriptionKey::Metadata),
                Just(SubscriptionKey::Cursor),
                Just(SubscriptionKey::FailurePolicy),
                Just(SubscriptionKey::DispatchConfig),
            ],
        ) {
            let text = match kind {
                SubscriptionKey::Metadata => topics::subscription(&t, &s),
                SubscriptionKey::Cursor => topics::subscription_cursor(&t, &s),
                SubscriptionKey::FailurePolicy => topics::subscription_failure_policy(&t, &s),
                SubscriptionKey::DispatchConfig => topics::subscription_dispatch_config(&t, &s),
            };
            prop_assert!(text.starts_with(&topics::subscriptions_prefix(&t)));
            prop_assert_eq!(parse_subscription_key(&text), Ok((t, s, kind)));
        }

        #[test]
        fn storage_keys_round_trip(keys in arb_storage_keys(), t in arb_topic(), start in any::<u64>()) {
            let descriptor = keys.segment_descriptor(&t, start);
            prop_assert!(descriptor.starts_with(&keys.segments_prefix(&t)));
            prop_assert_eq!(keys.parse_segment_descriptor(&descriptor), Ok((t.clone(), start)));
            prop_assert_eq!(
                keys.parse(&keys.segments_cur(&t)),
                Ok(StorageKey::SegmentsCur { topic: t.clone() })
            );
            prop_assert_eq!(
                keys.parse(&keys.topic_state(&t)),
                Ok(StorageKey::TopicState { topic: t.clone() })
            );
            prop_assert!(keys.retired(&t).ends_with("/retired"));
            prop_assert_eq!(
                keys.parse(&keys.retired(&t)),
                Ok(StorageKey::Retired { topic: t.clone() })
            );
            let cur = StorageKeys::segments_cur_value(start);
            prop_assert_eq!(StorageKeys::parse_segments_cur_value(&cur), Ok(start));
            prop_assert!(descriptor.ends_with(&cur));
        }

        #[test]
        fn segment_object_round_trips(
            keys in arb_storage_keys(),
            t in arb_topic(),
            start in any::<u64>(),
            len in any::<u64>(),
        ) {
            let end = start.saturating_add(len);
            let object = keys.segment_object(&t, start, end);
            prop_assert!(!object.starts_with('/'));
            prop_assert!(object.starts_with(&keys.segment_objects_prefix(&t)));
            prop_assert!(object.starts_with(&keys.objects_root()));
            prop_assert_eq!(
                keys.parse_segment_object(&object),
                Ok(SegmentObject { topic: t, start_offset: start, end_offset: end })
            );
        }

        #[test]
        fn padded_keys_sort_numerically(a in any::<u64>(), b in any::<u64>(), t in arb_topic()) {
            let keys = StorageKeys::default();
            prop_assert_eq!(
                keys.segment_descriptor(&t, a).cmp(&keys.segment_descriptor(&t, b)),
                a.cmp(&b)
            );
            prop_assert_eq!(
                cluster::rebalancing_history(a).cmp(&cluster::rebalancing_history(b)),
                a.cmp(&b)
            );
        }

        #[test]
        fn partition_round_trips(t in arb_topic(), n in any::<u32>()) {
            let p = t.partition(n).unwrap();
            prop_assert_eq!(p.partition_of(), Some((t, n)));
        }

        #[test]
        fn parsers_never_panic(s in "(/[a-z_0-9.é -]{0,12}){0,8}", raw in ".{0,64}") {
            for input in [&s, &raw] {
                let _ = TopicName::new(input);
                let _ = MetadataKey::parse(input);
                let _ = StorageKeys::default().parse(input);
                let _ = StorageKeys::default().parse_segment_object(input);
                if let Ok(t) = TopicName::new(input) {
                    prop_assert_eq!(t.as_str(), input.as_str());
                }
                if let Ok(key) = MetadataKey::parse(input) {
                    prop_assert_eq!(key.to_string(), input.as_str());
                }
            }
        }
    }
}
