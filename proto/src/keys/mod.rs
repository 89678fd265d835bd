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
//! (`seeds/001_4a7643a8a6858094.txt`, with `/edge/checkpoints/{ns}/{topic}`,
//! the storage prefix from `docs/architecture.md`, and `/fleet/edges/...`,
//! the brokers' view of their edges); its `Display` builds a key and
//! [`MetadataKey::parse`] reads one back. The free functions in [`cluster`],
//! [`namespaces`], [`topics`], [`schemas`], [`auth`] and [`edge`] are
//! shorthands for building single keys and the prefixes that are listed or
//! watched ([`fleet`] too). Storage paths depend on the configured prefix and live on
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
//!
//! # Files
//! - `names`: the name types ([`TopicName`], [`NamespaceName`], ...) and
//!   their errors ([`NameError`]).
//! - `metadata_key`: [`MetadataKey`], its parser and [`KeyParseError`].
//! - [`cluster`], [`namespaces`], [`topics`], [`schemas`], [`auth`],
//!   [`edge`]: the per-area key and prefix builders.
//! - `storage`: [`StorageKeys`], the storage paths and object keys.

mod metadata_key;
mod names;
mod storage;

pub mod auth;
pub mod cluster;
pub mod edge;
pub mod fleet;
pub mod namespaces;
pub mod schemas;
pub mod topics;

#[cfg(test)]
mod tests;

pub use metadata_key::{
    KeyParseError, MetadataKey, SubscriptionKey, TopicKey, parse_subscription_key, parse_topic,
};
pub use names::{
    BROKER_IDENTITY_PREFIX, BROKER_SERVER_NAME, BindingId, NameError, NameErrorKind, NamePart,
    NamespaceName, PrincipalName, RoleName, SubjectName, SubscriptionName, TopicName,
    is_broker_identity, new_edge_id_problem, reserved_edge_id,
};
pub use storage::{SegmentObject, StorageKey, StorageKeys};

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
