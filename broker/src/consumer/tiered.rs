//! Tiered read: consumer reads below the local WAL's log start are served
//! from the archive the tier service wrote (issue 5 "Tiered read", issue 6
//! "Consumer API"), through the tier service's reader
//! ([`tributary_archive::reader::Archive`]), and continue in the local WAL
//! where the archive part ends. Offsets, keys, headers and timestamps are
//! the stored ones, so a consumer cannot tell where a record came from.
//!
//! The segments are found by listing the topic's objects in the bucket
//! (the object key names its offset range, `docs/archive-format.md`);
//! every read costs one listing, one suffix read per object opened and one
//! ranged read per object.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::ControlFlow;
use std::sync::Arc;

use broker_core::metadata::MetadataStore;
use broker_core::wal::{Wal, WalError};
use tributary_api::consumer::{Gap, GapKind};
use tributary_archive::BucketError;
use tributary_archive::reader::{Archive, CommittedDescriptors, SegmentObjectInfo, Start};
use tributary_proto::Record;
use tributary_proto::archive::{Damage, SegmentDescriptor};
use tributary_proto::keys::TopicName;

use super::records::{self, ReadError};

/// Reads of a WAL race with trims; this many attempts are made when the
/// log start moves under a read.
const ATTEMPTS: usize = 4;

/// Records fetched per archive read when looking up scattered offsets.
const LOOKUP_RUN: usize = 256;

/// The first offset of `topic` readable at all: the first archived offset
/// when an archive is configured and holds the topic, else the WAL's log
/// start.
///
/// # Errors
/// [`ReadError::Archive`] if the bucket cannot be listed.
pub async fn log_start(
    wal: &Wal,
    archive: Option<&Archive>,
    topic: &TopicName,
) -> Result<u64, ReadError> {
    let local = wal.log_start_offset();
    let Some(archive) = archive else {
        return Ok(local);
    };
    if local == 0 {
        return Ok(0);
    }
    let (objects, _) = archive
        .segments(topic)
        .await
        .map_err(|e| ReadError::Archive(e.to_string()))?;
    Ok(objects.first().map_or(local, |o| o.start_offset.min(local)))
}

/// Runs an archive read to completion. The reader takes `&mut dyn FnMut`
/// callbacks, so its futures are not `Send`; this drives one on a blocking
/// thread with the runtime's handle, so callers stay `Send`.
pub(super) async fn drive<T, F>(make: F) -> Result<T, ReadError>
where
    T: Send + 'static,
    F: AsyncFnOnce() -> Result<T, ReadError> + Send + 'static,
{
    let handle = tokio::runtime::Handle::current();
    tokio::task::spawn_blocking(move || handle.block_on(make()))
        .await
        .map_err(|e| ReadError::Task(e.to_string()))?
}

fn not_configured(offset: u64, log_start: u64) -> ReadError {
    ReadError::Tiered { offset, log_start }
}

/// What [`archive_range`] read.
struct ArchivePart {
    /// Records by offset.
    records: Vec<(u64, Record)>,
    /// Declared holes the read stepped over, as gap notices.
    holes: Vec<Gap>,
    /// Record bytes read ([`records::record_bytes`]).
    bytes: usize,
    /// The read stopped at its count or byte limit before `until`.
    full: bool,
}

/// Records of `topic` from the archive in `[from, until)`: at most
/// `max_count` of them and at most `max_bytes` of record bytes (at least
/// one record), and the declared holes the read stepped over (as gap
/// notices), so a consumer learns of a hole in the archive as it does of
/// one in the WAL.
async fn archive_range(
    archive: &Archive,
    topic: &TopicName,
    from: u64,
    until: u64,
    max_count: usize,
    max_bytes: usize,
) -> Result<ArchivePart, ReadError> {
    if max_count == 0 || from >= until {
        return Ok(ArchivePart {
            records: Vec::new(),
            holes: Vec::new(),
            bytes: 0,
            full: max_count == 0,
        });
    }
    let archive = archive.clone();
    let topic = topic.clone();
    drive(async move || {
        let mut out = Vec::new();
        let mut holes: Vec<Gap> = Vec::new();
        let mut bytes = 0usize;
        let mut full = false;
        let read = archive
            .read_with_holes(
                &topic,
                Start::Offset(from),
                &mut |r| {
                    if r.offset >= until {
                        return ControlFlow::Break(());
                    }
                    let size = records::record_bytes(&r.record);
                    if !out.is_empty() && bytes.saturating_add(size) > max_bytes {
                        full = true;
                        return ControlFlow::Break(());
                    }
                    bytes = bytes.saturating_add(size);
                    out.push((r.offset, r.record));
                    if out.len() >= max_count {
                        full = true;
                        ControlFlow::Break(())
                    } else {
                        ControlFlow::Continue(())
                    }
                },
                &mut |hole| {
                    if hole.end_offset > from && hole.first_offset < until {
                        holes.push(Gap {
                            first_offset: hole.first_offset.max(from),
                            end_offset: hole.end_offset,
                            kind: GapKind::Hole,
                            reason: "a declared hole in the archive (no record was ever stored for these offsets)".into(),
                        });
                    }
                },
            )
            .await;
        match read {
            Ok(()) => {}
            // Damaged bytes in an object: the records before them, then
            // the damaged range as the last gap (the read stops there, as
            // at a damaged range of the WAL).
            Err(e @ BucketError::Archive { .. }) => {
                let at = out.last().map_or(from, |(o, _)| o + 1);
                holes.retain(|h| h.first_offset < at);
                holes.push(damaged_gap(&archive, &topic, at, &e).await);
                return Ok(ArchivePart {
                    records: out,
                    holes,
                    bytes,
                    full: true,
                });
            }
            // No object for a range between two that exist (deleted from
            // the bucket): the same, the missing range as the last gap.
            Err(
                ref e @ BucketError::MissingObject {
                    first_offset,
                    end_offset,
                    ..
                },
            ) => {
                let at = out.last().map_or(from, |(o, _)| o + 1);
                holes.retain(|h| h.first_offset < at);
                holes.push(Gap {
                    first_offset: at.max(first_offset),
                    end_offset,
                    kind: GapKind::Damaged,
                    reason: format!("archive: {e}"),
                });
                return Ok(ArchivePart {
                    records: out,
                    holes,
                    bytes,
                    full: true,
                });
            }
            Err(e) => return Err(ReadError::Archive(e.to_string())),
        }
        // A read that stopped at a limit: holes past its last record are
        // for the next read.
        if full {
            let last = out.last().map_or(u64::MAX, |(o, _)| *o);
            holes.retain(|h| h.first_offset <= last);
        }
        Ok(ArchivePart {
            records: out,
            holes,
            bytes,
            full,
        })
    })
    .await
}

/// The damaged range of the archive a read of `topic` failed at, from
/// `at` (the first offset it did not deliver): the range a full
/// verification of the object holding `at` finds there, else `at` to the
/// object's end (gap kind `damaged`, reason naming the object and error).
async fn damaged_gap(archive: &Archive, topic: &TopicName, at: u64, error: &BucketError) -> Gap {
    let mut gap = Gap {
        first_offset: at,
        end_offset: at + 1,
        kind: GapKind::Damaged,
        reason: format!("archive: {error}"),
    };
    let Ok((objects, _)) = archive.segments(topic).await else {
        return gap;
    };
    let Some(object) = objects
        .iter()
        .find(|o| o.start_offset <= at && at <= o.end_offset)
    else {
        return gap;
    };
    gap.end_offset = object.end_offset + 1;
    let damage = object_damage(archive, object).await;
    if let Some(damage) = damage
        .iter()
        .find(|d| d.first_offset <= at && at < d.end_offset)
    {
        gap.end_offset = damage.end_offset;
        gap.reason = format!("archive object {}: {damage}", object.key);
    }
    gap
}

/// How long a verification of an archive object is reused: reads that
/// keep meeting the same damaged object (a subscription waiting at it, a
/// poll loop of peeks) verify it once in this time, not once each.
const VERIFIED_FOR: std::time::Duration = std::time::Duration::from_secs(30);

/// Verifications remembered, at most (the oldest are dropped past it).
const VERIFIED_MAX: usize = 64;

/// Recent verifications: (object key, size) → (when, damage found).
type Verified = BTreeMap<(String, u64), (std::time::Instant, Vec<Damage>)>;

static VERIFIED: std::sync::Mutex<Verified> = std::sync::Mutex::new(BTreeMap::new());

/// The damage a full verification of `object` finds (remembered for
/// [`VERIFIED_FOR`]; an object written again has another size or is
/// verified again after that).
async fn object_damage(archive: &Archive, object: &SegmentObjectInfo) -> Vec<Damage> {
    let id = (object.key.clone(), object.size);
    let now = std::time::Instant::now();
    {
        let verified = VERIFIED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((at, damage)) = verified.get(&id)
            && now.duration_since(*at) < VERIFIED_FOR
        {
            return damage.clone();
        }
    }
    let damage = archive.verify(object, &mut |_| {}).await.damage;
    let mut verified = VERIFIED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    verified.retain(|_, (at, _)| now.duration_since(*at) < VERIFIED_FOR);
    while verified.len() >= VERIFIED_MAX {
        let Some(oldest) = verified
            .iter()
            .min_by_key(|(_, (at, _))| *at)
            .map(|(k, _)| k.clone())
        else {
            break;
        };
        verified.remove(&oldest);
    }
    verified.insert(id, (now, damage.clone()));
    damage
}

/// Whether the last of `gaps` is a damaged range (a read stopped there).
fn ends_damaged(gaps: &[Gap]) -> bool {
    gaps.last().is_some_and(|g| g.kind == GapKind::Damaged)
}

/// `next` moved past every gap in `gaps` that starts at or before it.
fn past_gaps(mut next: u64, gaps: &[Gap]) -> u64 {
    for gap in gaps {
        if gap.first_offset <= next && next < gap.end_offset {
            next = gap.end_offset;
        }
    }
    next
}

/// Up to `max_count` records from `from` (below the high-water mark), in
/// offset order: from the archive while below the WAL's log start, then
/// from the WAL.
///
/// # Errors
/// [`ReadError::Tiered`] for an offset below the log start with no archive
/// configured; [`ReadError::NotArchived`] when the archive ends (or has a
/// gap) below the log start; [`ReadError::Archive`]; WAL errors.
pub async fn read_range(
    wal: &Arc<Wal>,
    archive: Option<&Archive>,
    topic: &TopicName,
    from: u64,
    max_count: usize,
    gaps: &mut Vec<Gap>,
) -> Result<Vec<(u64, Record)>, ReadError> {
    let mut out: Vec<(u64, Record)> = Vec::new();
    let mut bytes = 0usize;
    let mut next = from;
    for _ in 0..ATTEMPTS {
        let log_start = wal.log_start_offset();
        if next < log_start {
            let archive = archive.ok_or_else(|| not_configured(next, log_start))?;
            let part = archive_range(
                archive,
                topic,
                next,
                log_start,
                max_count - out.len(),
                records::MAX_READ_BYTES.saturating_sub(bytes),
            )
            .await?;
            let (got, holes) = (part.records, part.holes);
            bytes = bytes.saturating_add(part.bytes);
            if ends_damaged(&holes) {
                gaps.extend(holes);
                out.extend(got);
                return Ok(out);
            }
            let expect = past_gaps(next, &holes);
            match got.first() {
                Some((first, _)) if *first == expect => {}
                None if expect >= log_start => {}
                _ => {
                    return Err(ReadError::NotArchived {
                        offset: next,
                        log_start,
                    });
                }
            }
            next = past_gaps(got.last().map_or(expect, |(last, _)| last + 1), &holes);
            gaps.extend(holes);
            out.extend(got);
            if part.full {
                return Ok(out);
            }
            if next < log_start {
                return Err(ReadError::NotArchived {
                    offset: next,
                    log_start,
                });
            }
        }
        let want = max_count - out.len();
        let budget = records::MAX_READ_BYTES.saturating_sub(bytes).max(1);
        let read = records::blocking(wal, move |w| {
            let mut found = Vec::new();
            records::read_range_blocking(w, next, want, budget, &mut found).map(|got| (got, found))
        });
        match read.await {
            Ok((got, found)) => {
                out.extend(got);
                gaps.extend(found);
                return Ok(out);
            }
            // Trimmed under the read: the archive has it now.
            Err(ReadError::Wal(WalError::OffsetBelowLogStart { .. })) => {}
            Err(e) => return Err(e),
        }
    }
    Err(ReadError::Task(format!(
        "offset {next}: the log start kept moving during {ATTEMPTS} attempts"
    )))
}

/// The records at `offsets` (each below the high-water mark), by offset:
/// those below the WAL's log start from the archive.
///
/// # Errors
/// As [`read_range`].
pub async fn read_offsets(
    wal: &Arc<Wal>,
    archive: Option<&Archive>,
    topic: &TopicName,
    offsets: &[u64],
    gaps: &mut Vec<Gap>,
) -> Result<BTreeMap<u64, Record>, ReadError> {
    let mut out = BTreeMap::new();
    let mut wanted: BTreeSet<u64> = offsets.iter().copied().collect();
    for _ in 0..ATTEMPTS {
        let log_start = wal.log_start_offset();
        while let Some(&first) = wanted.first()
            && first < log_start
        {
            let archive = archive.ok_or_else(|| not_configured(first, log_start))?;
            let part = archive_range(
                archive,
                topic,
                first,
                log_start,
                LOOKUP_RUN,
                records::MAX_READ_BYTES,
            )
            .await?;
            let (got, holes) = (part.records, part.holes);
            if ends_damaged(&holes) {
                // The records before the damage; nothing at or past it.
                for (offset, record) in got {
                    if wanted.remove(&offset) {
                        out.insert(offset, record);
                    }
                }
                wanted.retain(|&o| {
                    !holes
                        .iter()
                        .any(|h| h.kind == GapKind::Hole && h.first_offset <= o && o < h.end_offset)
                });
                let mut holes = holes;
                if wanted.is_empty() {
                    // The damage lies past every offset asked for: a
                    // later read meets it.
                    holes.pop();
                }
                gaps.extend(holes);
                return Ok(out);
            }
            let first_record = past_gaps(first, &holes);
            if !holes.is_empty() {
                wanted.retain(|&o| {
                    !holes
                        .iter()
                        .any(|h| h.first_offset <= o && o < h.end_offset)
                });
                gaps.extend(holes);
            }
            if first_record >= log_start && got.is_empty() {
                continue;
            }
            if got.first().map(|(o, _)| *o) != Some(first_record) {
                return Err(ReadError::NotArchived {
                    offset: first,
                    log_start,
                });
            }
            let end = got.last().map_or(first + 1, |(o, _)| o + 1);
            for (offset, record) in got {
                if wanted.remove(&offset) {
                    out.insert(offset, record);
                }
            }
            // Whatever is left below `end` is not in the archive's run.
            wanted.retain(|&o| o >= end);
        }
        let rest: Vec<u64> = wanted.iter().copied().collect();
        if rest.is_empty() {
            return Ok(out);
        }
        let read = records::blocking(wal, move |w| {
            let mut found = Vec::new();
            records::read_offsets_blocking(w, &rest, &mut found).map(|got| (got, found))
        });
        match read.await {
            Ok((got, found)) => {
                out.extend(got);
                gaps.extend(found);
                return Ok(out);
            }
            Err(ReadError::Wal(WalError::OffsetBelowLogStart { .. })) => {}
            Err(e) => return Err(e),
        }
    }
    Err(ReadError::Task(format!(
        "offsets {offsets:?}: the log start kept moving during {ATTEMPTS} attempts"
    )))
}

/// The first offset whose record has a timestamp at or after
/// `timestamp_ms`, looking in the archive first (when configured and the
/// WAL no longer starts at 0), then the WAL; the high-water mark if none.
///
/// # Errors
/// [`ReadError::Archive`], WAL errors.
pub async fn offset_for_timestamp(
    wal: &Arc<Wal>,
    archive: Option<&Archive>,
    topic: &TopicName,
    timestamp_ms: i64,
) -> Result<u64, ReadError> {
    let log_start = wal.log_start_offset();
    if let Some(archive) = archive
        && log_start > 0
    {
        let archive = archive.clone();
        let topic = topic.clone();
        let found = drive(async move || {
            let mut found = None;
            archive
                .read(&topic, Start::Timestamp(timestamp_ms), &mut |r| {
                    if r.offset < log_start {
                        found = Some(r.offset);
                    }
                    ControlFlow::Break(())
                })
                .await
                .map_err(|e| ReadError::Archive(e.to_string()))?;
            Ok(found)
        })
        .await?;
        if let Some(offset) = found {
            return Ok(offset);
        }
    }
    records::blocking(wal, move |w| {
        records::offset_for_timestamp_blocking(w, timestamp_ms)
    })
    .await
}

/// The segment descriptors the tier service committed, read from this
/// broker's copy of the metadata: every archive object a tiered read
/// opens is checked against its descriptor, so an object written over a
/// committed one is a damaged range to the consumer, never its records.
struct StoreDescriptors(Arc<dyn MetadataStore>);

/// The descriptors committed in `store`, for
/// [`Archive::with_committed`]: one read of this broker's applied copy
/// ([`MetadataStore::get_local`]) per object opened.
pub fn committed_descriptors(store: Arc<dyn MetadataStore>) -> Arc<dyn CommittedDescriptors> {
    Arc::new(StoreDescriptors(store))
}

impl CommittedDescriptors for StoreDescriptors {
    fn descriptor<'a>(
        &'a self,
        key: &'a str,
    ) -> futures::future::BoxFuture<'a, Result<Option<SegmentDescriptor>, String>> {
        // A committed descriptor never changes: this broker's applied copy
        // is enough (no read barrier through the Raft leader per object,
        // and tiered reads go on without a leader); one not applied here
        // yet is not checked, as an object not committed yet is not.
        Box::pin(async move {
            self.0
                .get_local(key)
                .await
                .map_err(|e| e.to_string())?
                .map(serde_json::from_value::<SegmentDescriptor>)
                .transpose()
                .map_err(|e| format!("descriptor {key}: {e}"))
        })
    }
}

/// Opens the archive described by `[archive]` (a local directory is
/// created if missing; S3 settings not given come from `AWS_*`), checking
/// the objects it reads against the descriptors committed in `store`.
///
/// # Errors
/// [`ConfigError::Invalid`](crate::config::ConfigError::Invalid) naming
/// `archive.prefix` or `archive.store` and the problem.
pub fn open_archive(
    config: &crate::config::ArchiveConfig,
    store: Arc<dyn MetadataStore>,
) -> Result<Archive, crate::config::ConfigError> {
    let keys = tributary_proto::keys::StorageKeys::new(&config.prefix).map_err(|e| {
        crate::config::ConfigError::Invalid {
            field: "archive.prefix",
            reason: e.to_string(),
        }
    })?;
    let bucket = tributary_archive::Bucket::open(&config.store).map_err(|e| {
        crate::config::ConfigError::Invalid {
            field: "archive.store",
            reason: e.to_string(),
        }
    })?;
    tracing::info!(bucket = bucket.description(), prefix = %config.prefix, "tiered read from the archive");
    Ok(Archive::new(bucket, keys).with_committed(committed_descriptors(store)))
}
