//! The broker's side of tiered storage: what the tier service
//! (`tier-service/`) commits and asks for through the admin API's
//! `/v1/storage` endpoints, and local WAL retention.
//!
//! - this file: the committed state of a topic's segments in metadata
//!   ([`tiered_state`], [`list_descriptors`], [`retired_below`]) and
//!   [`StorageError`];
//! - `commit.rs`: [`commit_descriptor`], the metadata rules a segment
//!   descriptor must pass to be committed (continuity, idempotence);
//! - `verify.rs`: [`commit_verified`], the broker's own rules against its
//!   local WAL and the archive bucket, and [`verified_trim_offset`], the
//!   only safe offset a trim uses;
//! - `local.rs`: the broker's local WALs ([`LocalSegments`]): `trim`
//!   ([`trim_wal`]) and `seal` ([`seal_wal`]);
//! - `unload.rs`: the sealed mobility marker ([`unload_step`]);
//! - `retire.rs`: cold retention of the oldest descriptor
//!   ([`retire_descriptor`]);
//! - `http.rs`: the `/v1/storage` endpoints (documented with the admin API
//!   in [`crate::admin`]);
//! - [`retention`]: local retention when no tier service runs.

mod commit;
mod http;
mod lakehouse;
mod local;
pub mod retention;
mod retire;
mod unload;
mod verify;

use broker_core::metadata::{MetadataError, MetadataStore};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tributary_proto::archive::SegmentDescriptor;
use tributary_proto::keys::{StorageKey, StorageKeys, TopicName};

pub use self::commit::{CommitOutcome, commit_descriptor};
pub(crate) use self::http::routes;
pub use self::local::{
    LocalSegments, SealReport, TrimReport, WalView, seal_wal, trim_wal, with_local_segments,
};
pub use self::retire::retire_descriptor;
pub use self::unload::{TopicState, UnloadOutcome, unload_step};
pub use self::verify::{
    StorageArchive, check_against_wal, commit_verified, verified_trim_offset, verify_object,
    with_storage_archive,
};

/// A topic's committed storage state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TieredState {
    /// Start offset of the descriptor `segments/cur` points to.
    pub cur: Option<u64>,
    /// Offset just past the `cur` descriptor's last record: every offset
    /// below it (from the first descriptor's start) is in committed
    /// segments. The safe offset for the broker's local retention.
    pub tiered_offset: Option<u64>,
}

/// Why a descriptor was not committed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StorageError {
    /// The descriptor contradicts itself or its key.
    #[error("invalid descriptor: {0}")]
    Invalid(String),
    /// Another descriptor is committed at the same start offset.
    #[error("a different descriptor is committed at {key}")]
    Conflict {
        /// Its key.
        key: String,
        /// The committed one.
        committed: Box<SegmentDescriptor>,
    },
    /// The descriptor does not continue the committed segments.
    #[error("segment {start}..={end} does not continue the committed segments: {reason}")]
    NotContiguous {
        /// Its start offset.
        start: u64,
        /// Its end offset.
        end: u64,
        /// Gap or overlap, with the neighbour.
        reason: String,
    },
    /// Committed metadata that does not parse (a damaged store).
    #[error("stored storage metadata is inconsistent: {0}")]
    Inconsistent(String),
    /// Concurrent commits kept changing `segments/cur`.
    #[error("segments/cur kept changing; retry")]
    Contended,
    /// No descriptor at that start offset.
    #[error("no committed descriptor at {key}")]
    NotFound {
        /// The descriptor key.
        key: String,
    },
    /// A cold-retention delete that would break the committed range: not
    /// the oldest descriptor, or the `cur` one.
    #[error("{message}")]
    Refused {
        /// `not_oldest` or `is_cur`.
        kind: &'static str,
        /// Why.
        message: String,
    },
    /// The archive bucket could not be reached to check an object (retry
    /// later; nothing was committed or trimmed).
    #[error("archive bucket unavailable: {0}")]
    Archive(String),
    /// The metadata store failed.
    #[error(transparent)]
    Metadata(#[from] MetadataError),
}

/// `value` of `key` as a descriptor, or [`StorageError::Inconsistent`].
fn decode_descriptor(key: &str, value: Value) -> Result<SegmentDescriptor, StorageError> {
    serde_json::from_value(value)
        .map_err(|e| StorageError::Inconsistent(format!("{key}: not a segment descriptor: {e}")))
}

/// The committed `cur` and tiered offset of `topic`.
///
/// # Errors
/// [`StorageError::Inconsistent`] if `cur` points at a missing or
/// malformed descriptor; metadata errors.
pub async fn tiered_state(
    store: &dyn MetadataStore,
    keys: &StorageKeys,
    topic: &TopicName,
) -> Result<TieredState, StorageError> {
    let cur_key = keys.segments_cur(topic);
    let Some(cur) = store.get(&cur_key).await? else {
        return Ok(TieredState {
            cur: None,
            tiered_offset: None,
        });
    };
    let start = cur
        .as_str()
        .and_then(|v| StorageKeys::parse_segments_cur_value(v).ok())
        .ok_or_else(|| {
            StorageError::Inconsistent(format!("{cur_key}: {cur} is not a padded offset"))
        })?;
    let key = keys.segment_descriptor(topic, start);
    let value = store
        .get(&key)
        .await?
        .ok_or_else(|| StorageError::Inconsistent(format!("{cur_key} points at missing {key}")))?;
    let descriptor = decode_descriptor(&key, value)?;
    Ok(TieredState {
        cur: Some(start),
        tiered_offset: Some(descriptor.next_offset()),
    })
}

/// The committed tiered offset of `topic` (see [`TieredState`]): what the
/// broker's local retention may use as its safe offset.
///
/// # Errors
/// As [`tiered_state`].
pub async fn tiered_offset(
    store: &dyn MetadataStore,
    keys: &StorageKeys,
    topic: &TopicName,
) -> Result<Option<u64>, StorageError> {
    Ok(tiered_state(store, keys, topic).await?.tiered_offset)
}

/// Every committed descriptor of `topic`, by start offset.
///
/// # Errors
/// [`StorageError::Inconsistent`] for a value that is not a descriptor;
/// metadata errors.
pub async fn list_descriptors(
    store: &dyn MetadataStore,
    keys: &StorageKeys,
    topic: &TopicName,
) -> Result<Vec<SegmentDescriptor>, StorageError> {
    let mut out = Vec::new();
    for (key, value) in store.list(&keys.segments_prefix(topic)).await? {
        if let Ok(StorageKey::SegmentDescriptor { .. }) = keys.parse(&key) {
            out.push(decode_descriptor(&key, value)?);
        }
    }
    Ok(out)
}

/// The cold-retention low mark of `topic`: offsets below it were removed
/// from the archive on purpose ([`retire_descriptor`]); `None` if nothing
/// was.
///
/// # Errors
/// [`StorageError::Inconsistent`] for a malformed value; metadata errors.
pub async fn retired_below(
    store: &dyn MetadataStore,
    keys: &StorageKeys,
    topic: &TopicName,
) -> Result<Option<u64>, StorageError> {
    let key = keys.retired(topic);
    match store.get(&key).await? {
        None => Ok(None),
        Some(v) => v["below_offset"]
            .as_u64()
            .map(Some)
            .ok_or_else(|| StorageError::Inconsistent(format!("{key}: {v} has no below_offset"))),
    }
}
