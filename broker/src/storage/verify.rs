//! The broker as the authority on its log: the rules a descriptor must
//! pass against the broker's local WAL and the archive bucket before it is
//! committed ([`commit_verified`]), and the offset below which a trim may
//! delete local segments ([`verified_trim_offset`]).
//!
//! Each refusal is a [`StorageError::Refused`] (`409`) whose kind names the
//! rule:
//! - `archive_not_configured`: the broker has no `[archive]`, so it cannot
//!   check that the object exists; it commits nothing and trims nothing;
//! - `wal_not_local`: this broker does not hold the topic's WAL, so it
//!   cannot check the log start, the high-water mark or the seals (the
//!   broker that holds it commits the topic's descriptors);
//! - `first_not_at_log_start`: a topic's first descriptor starts elsewhere
//!   than the local log start (or the retired low mark);
//! - `past_high_water_mark`: the descriptor ends at or past the WAL's
//!   high-water mark;
//! - `not_sealed`: an offset of the descriptor still held locally is not in
//!   a sealed segment;
//! - `object_missing`: no object at `object_id` in the archive bucket;
//! - `object_mismatch`: the object's size or footer (which carries its
//!   checksum) differs from the descriptor.
//!
//! An object store that cannot be reached is [`StorageError::Archive`]
//! (`503 archive_unavailable`): nothing is committed or trimmed, and the
//! caller retries.

use std::sync::Arc;

use axum::{Extension, Router};
use broker_core::metadata::MetadataStore;
use tributary_archive::reader::SegmentObjectInfo;
use tributary_archive::{Archive, BucketError};
use tributary_proto::archive::SegmentDescriptor;
use tributary_proto::keys::{StorageKeys, TopicName};

use super::local::WalView;
use super::{
    CommitOutcome, StorageError, TieredState, commit_descriptor, list_descriptors, retired_below,
};

/// The archive bucket the storage endpoints check objects in (the broker's
/// `[archive]`), as a router extension.
#[derive(Debug, Clone)]
pub struct StorageArchive(pub Arc<Archive>);

/// Adds the archive bucket to `router` so descriptor commits and trims can
/// check objects. Without it both are refused (`archive_not_configured`).
pub fn with_storage_archive(router: Router, archive: Archive) -> Router {
    router.layer(Extension(StorageArchive(Arc::new(archive))))
}

fn refused(kind: &'static str, message: String) -> StorageError {
    StorageError::Refused { kind, message }
}

/// Checks that the object `descriptor` names exists in `archive` with the
/// described size and footer (whose CRC covers the batches and index
/// CRCs): one ranged read of the object's last 112 bytes.
///
/// # Errors
/// [`StorageError::Refused`] `object_missing` / `object_mismatch`;
/// [`StorageError::Archive`] when the store cannot be reached.
pub async fn verify_object(
    archive: &Archive,
    descriptor: &SegmentDescriptor,
) -> Result<(), StorageError> {
    let object = SegmentObjectInfo {
        key: descriptor.object_id.clone(),
        start_offset: descriptor.start_offset,
        end_offset: descriptor.end_offset,
        size: descriptor.size,
    };
    let range = format!("{}..={}", descriptor.start_offset, descriptor.end_offset);
    match archive.footer(&object).await {
        Ok(footer) if descriptor.matches_footer(&footer) => Ok(()),
        Ok(footer) => Err(refused(
            "object_mismatch",
            format!(
                "object {} of segment {range} is not the described one: size {} (described {}), footer checksum {:#010x} (described {:#010x})",
                descriptor.object_id,
                footer.object_bytes(),
                descriptor.size,
                footer.footer_crc32c(),
                descriptor.checksum_crc32c
            ),
        )),
        Err(e) if e.is_not_found() => Err(refused(
            "object_missing",
            format!(
                "no object {} in the archive bucket for segment {range}",
                descriptor.object_id
            ),
        )),
        Err(e @ BucketError::Archive { .. }) => Err(refused(
            "object_mismatch",
            format!(
                "object {} of segment {range} does not match its descriptor: {e}",
                descriptor.object_id
            ),
        )),
        Err(e) => Err(StorageError::Archive(e.to_string())),
    }
}

/// The local WAL rules for `descriptor` of `topic`: a first descriptor
/// starts at the log start or the retired low mark, every descriptor ends
/// below the high-water mark, and its offsets still held locally are all in
/// sealed segments.
///
/// # Errors
/// [`StorageError::Refused`] naming the rule; metadata errors.
pub async fn check_against_wal(
    store: &dyn MetadataStore,
    keys: &StorageKeys,
    topic: &TopicName,
    descriptor: &SegmentDescriptor,
    wal: &WalView,
) -> Result<(), StorageError> {
    let range = format!("{}..={}", descriptor.start_offset, descriptor.end_offset);
    if descriptor.next_offset() > wal.high_water_mark {
        return Err(refused(
            "past_high_water_mark",
            format!(
                "segment {range} ends past {topic}'s high-water mark {} (no record at or above it is durable)",
                wal.high_water_mark
            ),
        ));
    }
    if list_descriptors(store, keys, topic).await?.is_empty() {
        let retired = retired_below(store, keys, topic).await?;
        if descriptor.start_offset != wal.log_start && Some(descriptor.start_offset) != retired {
            let retired =
                retired.map_or(String::new(), |r| format!(" or the retired low mark {r}"));
            return Err(refused(
                "first_not_at_log_start",
                format!(
                    "{topic}'s first descriptor must start at the local log start {}{retired}; segment {range} would leave offsets archived nowhere",
                    wal.log_start
                ),
            ));
        }
    }
    if !wal.sealed_covers(descriptor.start_offset, descriptor.next_offset()) {
        return Err(refused(
            "not_sealed",
            format!(
                "segment {range} covers offsets of {topic} that are not in a sealed local segment (sealed: {:?})",
                wal.sealed
            ),
        ));
    }
    Ok(())
}

/// [`commit_descriptor`] after the broker's own checks: the local WAL rules
/// ([`check_against_wal`]; `wal` is `None` when this broker does not hold
/// the topic's WAL) and the object in `archive` ([`verify_object`];
/// `None` without `[archive]`). An idempotent redo of a committed
/// descriptor is answered without them. `fence` as in
/// [`commit_descriptor`].
///
/// # Errors
/// As [`commit_descriptor`], plus the refusals of this module.
pub async fn commit_verified(
    store: &dyn MetadataStore,
    keys: &StorageKeys,
    topic: &TopicName,
    descriptor: &SegmentDescriptor,
    wal: Option<&WalView>,
    archive: Option<&Archive>,
    fence: Option<&broker_core::metadata::Precondition>,
) -> Result<(CommitOutcome, TieredState), StorageError> {
    let committed = store
        .get(&keys.segment_descriptor(topic, descriptor.start_offset))
        .await?;
    if committed.is_none() {
        let Some(archive) = archive else {
            return Err(refused(
                "archive_not_configured",
                format!(
                    "this broker has no [archive] section, so it cannot check that segment {}..={} of {topic} is archived; it commits no descriptor",
                    descriptor.start_offset, descriptor.end_offset
                ),
            ));
        };
        let Some(wal) = wal else {
            return Err(refused(
                "wal_not_local",
                format!(
                    "this broker does not hold {topic}'s WAL, so it cannot check the log start, high-water mark and seals; commit through the broker that holds it"
                ),
            ));
        };
        descriptor
            .validate()
            .map_err(|e| StorageError::Invalid(e.to_owned()))?;
        check_against_wal(store, keys, topic, descriptor, wal).await?;
        verify_object(archive, descriptor).await?;
    }
    commit_descriptor(store, keys, topic, descriptor, fence).await
}

/// The offset below which a trim may delete `topic`'s local sealed
/// segments: the end of the run of committed descriptors that covers the
/// log start without a gap, each of them re-verified in `archive` (object
/// present with the described size and footer) at this moment. Stops at the
/// first descriptor whose object is missing or differs (logged). Never
/// above what committed descriptors cover, whatever `segments/cur` says.
///
/// # Errors
/// Metadata errors; [`StorageError::Archive`] when the store cannot be
/// reached.
pub async fn verified_trim_offset(
    store: &dyn MetadataStore,
    keys: &StorageKeys,
    topic: &TopicName,
    wal: &WalView,
    archive: &Archive,
) -> Result<u64, StorageError> {
    let last_sealed = wal.sealed.last().map_or(wal.log_start, |s| s.1);
    let mut covered = wal.log_start;
    for descriptor in list_descriptors(store, keys, topic).await? {
        if covered >= last_sealed {
            break;
        }
        if descriptor.next_offset() <= covered {
            continue;
        }
        if descriptor.start_offset > covered {
            break;
        }
        match verify_object(archive, &descriptor).await {
            Ok(()) => covered = descriptor.next_offset(),
            Err(StorageError::Refused { kind, message }) => {
                tracing::error!(%topic, kind, %message, "trim stops below a descriptor whose object does not verify: the local copy is kept");
                break;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(covered)
}
