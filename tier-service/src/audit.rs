//! The continuous archive audit (`[audit] interval_ms`): between passes, on
//! a schedule, checks that every committed descriptor still has its object
//! in the bucket with the described size and footer (one listing per topic,
//! one 112-byte ranged read per object), and that the topic's archived
//! ranges start where its retained history starts (the retired low mark,
//! or offset 0).
//!
//! A missing or damaged object is logged loudly (`ARCHIVE DATA MISSING`),
//! marked in Raft through the broker
//! (`{prefix}/storage/topics/{ns}/{topic}/missing/{start:020}`), and, where
//! the broker's local WAL still holds the segment, uploaded again from it,
//! verified, and the mark cleared. What nothing holds any more stays marked
//! and is reported with its exact offsets; the gauge
//! `tributary_tier_archive_missing_segments` counts those segments.

use std::collections::BTreeMap;

use tracing::{error, info, warn};
use tributary_archive::reader::{Archive, SegmentObjectInfo};
use tributary_proto::archive::SegmentDescriptor;
use tributary_proto::keys::TopicName;

use crate::broker_api::{CommittedSegments, MissingMark};
use crate::error::TierError;
use crate::tiering::{Tiering, now_ms, sealed_segments};
use crate::upload::{holes_in_segment, upload_segment_with_holes, verify_object};

/// A committed range whose object is gone and that nothing holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LostRange {
    /// The topic.
    pub topic: String,
    /// First offset.
    pub start_offset: u64,
    /// Last offset, inclusive.
    pub end_offset: u64,
    /// The object key (or `""` for a range no descriptor covers).
    pub object_id: String,
}

/// What one audit found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuditReport {
    /// Topics audited (in a cluster: those this broker owns, and those
    /// nobody owns).
    pub topics: usize,
    /// Descriptors checked.
    pub checked: u64,
    /// Objects uploaded again from the local WAL (marks cleared).
    pub reuploaded: Vec<String>,
    /// Ranges nothing holds: committed descriptors whose object is gone
    /// with no local copy, and offsets between the retained history's
    /// start and the first descriptor.
    pub lost: Vec<LostRange>,
    /// Topics whose audit failed, with the error.
    pub errors: Vec<(String, String)>,
}

/// Audits every topic with committed descriptors that this broker owns
/// (in a cluster; or that nobody owns).
pub async fn audit(tiering: &Tiering) -> AuditReport {
    let mut report = AuditReport::default();
    let archive = Archive::new(tiering.bucket.clone(), tiering.keys.clone());
    let topics = match tiering.broker.topics().await {
        Ok(topics) => topics,
        Err(e) => {
            report.errors.push(("*".into(), e.to_string()));
            return report;
        }
    };
    for topic in topics {
        if let Err(e) = audit_topic(tiering, &archive, &topic, &mut report).await {
            warn!(%topic, error = %e, "archive audit of this topic failed; retried next time");
            report.errors.push((topic.to_string(), e.to_string()));
        }
    }
    report
}

/// Why the object of `d` does not do, or `None` when it is there with the
/// described size and footer.
async fn object_problem(
    archive: &Archive,
    sizes: &BTreeMap<String, u64>,
    d: &SegmentDescriptor,
) -> Result<Option<String>, TierError> {
    match sizes.get(&d.object_id) {
        None => return Ok(Some("missing".into())),
        Some(&size) if size != d.size => {
            return Ok(Some(format!("size {size}, described {}", d.size)));
        }
        Some(_) => {}
    }
    let object = SegmentObjectInfo {
        key: d.object_id.clone(),
        start_offset: d.start_offset,
        end_offset: d.end_offset,
        size: d.size,
    };
    match archive.footer(&object).await {
        Ok(footer) if d.matches_footer(&footer) => Ok(None),
        Ok(_) => Ok(Some("footer differs from the descriptor".into())),
        Err(e) if e.is_not_found() => Ok(Some("missing".into())),
        Err(e @ tributary_archive::BucketError::Archive { .. }) => {
            Ok(Some(format!("damaged: {e}")))
        }
        Err(e) => Err(e.into()),
    }
}

async fn audit_topic(
    tiering: &Tiering,
    archive: &Archive,
    topic: &TopicName,
    report: &mut AuditReport,
) -> Result<(), TierError> {
    let committed = tiering.broker.segments(topic).await?;
    // In a cluster, a topic another broker owns is that broker's tier
    // service's to audit (the broker takes marks only from the owner's):
    // each missing object is then reported once, not once per broker. A
    // topic nobody owns is audited by every one.
    if committed.owned_here == Some(false) && committed.owner.is_some() {
        return Ok(());
    }
    report.topics += 1;
    let (objects, _) = archive.segments(topic).await?;
    let sizes: BTreeMap<String, u64> = objects.into_iter().map(|o| (o.key, o.size)).collect();
    let dir = tiering
        .topics_dir
        .join(topic.namespace())
        .join(topic.topic());
    let local: BTreeMap<u64, _> = sealed_segments(&dir)
        .await?
        .into_iter()
        .map(|s| (s.base_offset, s))
        .collect();
    // The archived ranges start where the retained history starts.
    let history_start = committed.retired_below.unwrap_or(0);
    if let Some(first) = committed.segments.first()
        && first.start_offset > history_start
    {
        let held_locally = local
            .values()
            .next()
            .is_some_and(|s| s.base_offset <= history_start);
        if !held_locally {
            error!(%topic, start = history_start, end = first.start_offset - 1, "ARCHIVE DATA MISSING: offsets {history_start}..={} of {topic} are in no object and no local segment (the archive starts above the retained history)", first.start_offset - 1);
            report.lost.push(LostRange {
                topic: topic.to_string(),
                start_offset: history_start,
                end_offset: first.start_offset - 1,
                object_id: String::new(),
            });
        }
    }
    for d in &committed.segments {
        report.checked += 1;
        let Some(reason) = object_problem(archive, &sizes, d).await? else {
            if committed
                .missing
                .iter()
                .any(|m| m.start_offset == d.start_offset)
            {
                // Stored again since (by a reconciliation, or by hand).
                tiering.broker.clear_missing(topic, d.start_offset).await?;
            }
            continue;
        };
        let segment = local
            .get(&d.start_offset)
            .filter(|s| s.next_offset == d.next_offset());
        // Logged loudly and marked once: a range nothing holds stays marked
        // (and counted) at every later audit without logging again.
        let marked = committed
            .missing
            .iter()
            .any(|m| m.start_offset == d.start_offset);
        if !marked {
            error!(%topic, start = d.start_offset, end = d.end_offset, object = d.object_id, reason, local_copy = segment.is_some(), "ARCHIVE DATA MISSING: a committed descriptor's object is missing or damaged");
            let mark = MissingMark {
                start_offset: d.start_offset,
                end_offset: d.end_offset,
                object_id: d.object_id.clone(),
                reason,
                local_copy: segment.is_some(),
                detected_at_ms: now_ms(),
            };
            tiering.broker.mark_missing(topic, &mark).await?;
        }
        let Some(segment) = segment else {
            if !marked {
                error!(%topic, start = d.start_offset, end = d.end_offset, object = d.object_id, "ARCHIVE DATA MISSING: offsets {}..={} of {topic} are in no object and no local segment", d.start_offset, d.end_offset);
            }
            report.lost.push(LostRange {
                topic: topic.to_string(),
                start_offset: d.start_offset,
                end_offset: d.end_offset,
                object_id: d.object_id.clone(),
            });
            continue;
        };
        reupload(tiering, topic, &committed, d, segment).await?;
        tiering.broker.clear_missing(topic, d.start_offset).await?;
        info!(%topic, start = d.start_offset, end = d.end_offset, object = d.object_id, "archive audit: object uploaded again from the local segment, verified; mark cleared");
        report.reuploaded.push(d.object_id.clone());
    }
    Ok(())
}

/// Uploads the local `segment` again as the object of `d`, verifies it,
/// and checks that it rebuilds exactly the committed descriptor.
///
/// # Errors
/// Store errors; [`TierError::Inconsistent`] when the local segment makes
/// another object.
pub async fn reupload(
    tiering: &Tiering,
    topic: &TopicName,
    committed: &CommittedSegments,
    d: &SegmentDescriptor,
    segment: &broker_core::wal::SealedSegment,
) -> Result<(), TierError> {
    let bucket = &tiering.bucket;
    let tail = tiering
        .retry("re-upload", || async {
            let holes = holes_in_segment(&committed.holes, segment);
            let tail = upload_segment_with_holes(
                bucket,
                &d.object_id,
                segment,
                &holes,
                &tiering.upload,
                &tiering.faults,
            )
            .await?;
            verify_object(bucket, &d.object_id, &tail, tiering.upload.full_verify).await?;
            Ok::<_, TierError>(tail)
        })
        .await?;
    if !d.matches_footer(&tail.footer) {
        return Err(TierError::Inconsistent {
            topic: topic.to_string(),
            reason: format!(
                "the local segment at {} rebuilds an object that differs from its committed descriptor",
                d.start_offset
            ),
        });
    }
    Ok(())
}
