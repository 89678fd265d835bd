//! The start-up reconciliation pass: makes the bucket and the committed
//! descriptors agree before tiering resumes.
//!
//! | found | decision |
//! |---|---|
//! | descriptor, object of the recorded size | fine (full checks: `tribctl archive verify`) |
//! | descriptor, object missing or of another size, local segment present | upload it again; the rebuilt object must match the descriptor |
//! | descriptor, object missing, no local segment | reported loudly (`missing`): those offsets are lost from the archive |
//! | object without descriptor, overlapping a committed segment | deleted (a leftover of another attempt) |
//! | object without descriptor, intact | adopted: its descriptor is committed (if the broker refuses it because an earlier segment is not committed yet, the pass commits both in order) |
//! | object without descriptor, damaged | deleted (the pass uploads the local segment again; reported loudly if there is none) |
//! | object without descriptor, below the cold-retention low mark | deleted (cold retention removed its descriptor, then stopped before the object) |
//! | staging files of interrupted local multipart uploads | deleted |
//!
//! Objects are deleted only when no descriptor references them.

use std::collections::{BTreeMap, BTreeSet};

use futures::StreamExt;
use tracing::{error, info, warn};
use tributary_proto::archive::{
    ArchiveIndex, Footer, SegmentDescriptor, SegmentVerifier, TAIL_READ_BYTES, reader_limits,
};
use tributary_proto::keys::TopicName;

use crate::error::TierError;
use crate::tiering::{Tiering, now_ms, sealed_segments};
use tributary_archive::bucket::Bucket;
use tributary_archive::reader::Archive;

/// What reconciliation found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReconcileReport {
    /// Topics looked at.
    pub topics: usize,
    /// Orphan objects whose descriptor was committed.
    pub adopted: Vec<String>,
    /// Orphan objects deleted (overlapping or damaged).
    pub deleted: Vec<String>,
    /// Objects uploaded again for a descriptor whose object was missing.
    pub reuploaded: Vec<String>,
    /// Intact orphans left for the tiering pass (an earlier segment is not
    /// committed yet) or kept because they hold the only copy.
    pub pending: Vec<String>,
    /// Descriptors whose object is gone with no local copy:
    /// `(topic, start, end, object key)`.
    pub missing: Vec<(String, u64, u64, String)>,
    /// Keys under the segments prefix that are not segment objects (left
    /// alone).
    pub foreign: Vec<String>,
    /// Staging files of interrupted local uploads removed.
    pub staging_removed: usize,
    /// Topics whose reconciliation failed, with the error.
    pub errors: Vec<(String, String)>,
}

/// Reconciles every topic known locally, in the bucket or to the broker.
pub async fn reconcile(tiering: &Tiering) -> ReconcileReport {
    let mut report = ReconcileReport::default();
    let mut topics: BTreeSet<TopicName> = BTreeSet::new();
    match tiering.local_topics() {
        Ok(local) => topics.extend(local.into_iter().map(|(t, _)| t)),
        Err(e) => report.errors.push(("*".into(), e.to_string())),
    }
    let archive = Archive::new(tiering.bucket.clone(), tiering.keys.clone());
    match tiering
        .retry("list bucket topics", || archive.topics())
        .await
    {
        Ok(found) => topics.extend(found),
        Err(e) => report.errors.push(("*".into(), e.to_string())),
    }
    match tiering
        .retry("list storage topics", || tiering.broker.topics())
        .await
    {
        Ok(found) => topics.extend(found),
        Err(e) => report.errors.push(("*".into(), e.to_string())),
    }
    report.topics = topics.len();
    for topic in topics {
        if let Err(e) = reconcile_topic(tiering, &archive, &topic, &mut report).await {
            error!(%topic, error = %e, "reconciliation failed for this topic");
            report.errors.push((topic.to_string(), e.to_string()));
        }
    }
    for key in &report.missing {
        error!(
            topic = key.0,
            start = key.1,
            end = key.2,
            object = key.3,
            "ARCHIVE DATA MISSING: a committed descriptor's object is gone and no local copy exists"
        );
    }
    report
}

async fn reconcile_topic(
    tiering: &Tiering,
    archive: &Archive,
    topic: &TopicName,
    report: &mut ReconcileReport,
) -> Result<(), TierError> {
    let bucket = &tiering.bucket;
    report.staging_removed += sweep_staging(bucket, &tiering.keys.segment_objects_prefix(topic));
    let (objects, foreign) = tiering
        .retry("list segment objects", || archive.segments(topic))
        .await?;
    report.foreign.extend(foreign);
    let committed = tiering
        .retry("list descriptors", || tiering.broker.segments(topic))
        .await?;
    let dir = tiering
        .topics_dir
        .join(topic.namespace())
        .join(topic.topic());
    let local: BTreeMap<u64, _> = sealed_segments(&dir)
        .await?
        .into_iter()
        .map(|s| (s.base_offset, s))
        .collect();
    let sizes: BTreeMap<&str, u64> = objects.iter().map(|o| (o.key.as_str(), o.size)).collect();
    let referenced: BTreeSet<&str> = committed
        .segments
        .iter()
        .map(|d| d.object_id.as_str())
        .collect();

    // Descriptors whose object is missing or of the wrong size.
    for d in &committed.segments {
        if sizes.get(d.object_id.as_str()) == Some(&d.size) {
            continue;
        }
        match local
            .get(&d.start_offset)
            .filter(|s| s.next_offset == d.next_offset())
        {
            Some(segment) => {
                warn!(%topic, object = d.object_id, "committed object missing or wrong size; uploading it again from the local segment");
                crate::audit::reupload(tiering, topic, &committed, d, segment).await?;
                report.reuploaded.push(d.object_id.clone());
            }
            None => report.missing.push((
                topic.to_string(),
                d.start_offset,
                d.end_offset,
                d.object_id.clone(),
            )),
        }
    }

    // Objects without a descriptor, in offset order.
    let retired_below = committed.retired_below.unwrap_or(0);
    for object in objects
        .iter()
        .filter(|o| !referenced.contains(o.key.as_str()))
    {
        if object.end_offset < retired_below {
            info!(%topic, key = object.key, retired_below, "object removed from Raft by cold retention; deleting it");
            tiering
                .retry("delete retired object", || bucket.delete(&object.key))
                .await?;
            report.deleted.push(object.key.clone());
            continue;
        }
        let overlaps = committed
            .segments
            .iter()
            .any(|d| d.start_offset <= object.end_offset && object.start_offset <= d.end_offset);
        if overlaps {
            info!(%topic, key = object.key, "orphan object overlaps a committed segment; deleting it");
            tiering
                .retry("delete orphan", || bucket.delete(&object.key))
                .await?;
            report.deleted.push(object.key.clone());
            continue;
        }
        let checked = tiering
            .retry("check orphan", || {
                check_object(bucket, &object.key, object.start_offset, object.end_offset)
            })
            .await?;
        match checked {
            Ok(footer) => {
                let descriptor =
                    SegmentDescriptor::from_footer(&footer, object.key.clone(), now_ms());
                match tiering
                    .retry("adopt", || tiering.broker.commit(topic, &descriptor))
                    .await
                {
                    Ok(_) => {
                        info!(%topic, key = object.key, "adopted an intact orphan object");
                        report.adopted.push(object.key.clone());
                        tiering.faults.hit("reconcile_after_adopt");
                    }
                    // Rebalanced away: the owner's tier service uploads
                    // and commits the segment (create-if-absent, the same
                    // key and bytes).
                    Err(e) if e.is_not_owner() => {
                        info!(%topic, key = object.key, reason = %e, "orphan object of a topic another broker owns: left to that broker's tier service");
                        report.pending.push(object.key.clone());
                    }
                    Err(TierError::Broker {
                        status: Some(409),
                        message,
                        ..
                    }) => {
                        if local.contains_key(&object.start_offset) {
                            info!(%topic, key = object.key, message, "orphan not adoptable yet; the pass commits it in order");
                        } else {
                            error!(%topic, key = object.key, message, "intact orphan object cannot be committed and no local copy exists; kept");
                        }
                        report.pending.push(object.key.clone());
                    }
                    Err(e) => return Err(e),
                }
            }
            Err(reason) => {
                if local.contains_key(&object.start_offset) {
                    warn!(%topic, key = object.key, reason, "damaged orphan object; deleting it (the local segment is uploaded again)");
                } else {
                    error!(%topic, key = object.key, reason, "damaged orphan object with no local copy; deleting it: offsets lost");
                }
                tiering
                    .retry("delete orphan", || bucket.delete(&object.key))
                    .await?;
                report.deleted.push(object.key.clone());
            }
        }
    }
    Ok(())
}

/// Fully checks the object at `key`: footer, index, every batch, and that
/// it holds offsets `start..=end`. Returns its footer, or why it is bad.
///
/// # Errors
/// Store errors (the object could not be read: not a verdict on it).
async fn check_object(
    bucket: &Bucket,
    key: &str,
    start: u64,
    end: u64,
) -> Result<Result<Footer, String>, TierError> {
    let (tail, size) = bucket.get_suffix(key, TAIL_READ_BYTES).await?;
    let footer = match Footer::decode_from_tail(&tail) {
        Ok(f) => f,
        Err(e) => return Ok(Err(e.to_string())),
    };
    if footer.object_bytes() != size {
        return Ok(Err(format!(
            "object is {size} bytes, its footer says {}",
            footer.object_bytes()
        )));
    }
    if footer.base_offset != start || footer.end_offset() != end {
        return Ok(Err(format!(
            "holds offsets {}..={}, its key says {start}..={end}",
            footer.base_offset,
            footer.end_offset()
        )));
    }
    let index = match ArchiveIndex::decode_from_tail(&footer, &tail) {
        Ok(i) => i,
        Err(e) => return Ok(Err(e.to_string())),
    };
    let mut verifier = SegmentVerifier::new(&index, reader_limits());
    let mut stream = bucket
        .get_range_stream(key, 0..footer.batches_bytes)
        .await?;
    while let Some(chunk) = stream.next().await {
        verifier.push(&chunk?);
    }
    let verdict = verifier.finish();
    Ok(match verdict.damage.first() {
        None => Ok(footer),
        Some(d) => Err(d.to_string()),
    })
}

/// Deletes staging files (`{key}#{n}`) that interrupted multipart uploads
/// left in a local bucket under `prefix`. Only one tier service runs per
/// data directory (it holds a lock), so none is in use.
fn sweep_staging(bucket: &Bucket, prefix: &str) -> usize {
    let Some(root) = bucket.local_root() else {
        return 0;
    };
    let dir = root.join(prefix.trim_end_matches('/'));
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.contains(".seg#") && std::fs::remove_file(entry.path()).is_ok() {
            info!(file = %entry.path().display(), "removed the staging file of an interrupted upload");
            removed += 1;
        }
    }
    removed
}
