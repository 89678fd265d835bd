//! The commit order of `docs/architecture.md`, for every sealed segment of every topic
//! under the broker's data directory:
//!
//! 1. pick up a sealed segment (its `.index` exists: immutable);
//! 2. upload it under its deterministic key, create-if-absent: an object
//!    already there is kept if it is exactly the one this segment makes;
//!    one with other bytes is never replaced when a committed descriptor
//!    names it (the segment is refused, [`TierError::ObjectConflict`]),
//!    and replaced only when it is an uncommitted leftover;
//! 3. verify the stored object (size, and index + footer byte for byte,
//!    which carry the batches CRC; optionally the whole batches region);
//! 4. commit its descriptor and `segments/cur` in one Raft transaction,
//!    through the broker's admin API;
//! 5. ask the broker to apply local retention, whose safe offset is the
//!    committed tiered offset the broker reads from Raft itself.
//!
//! Only topics the broker beside it owns now are tiered: one owned by
//! another broker (the storage API says `owned_here: false`, or answers
//! `409 not_owner`) is skipped quietly, nothing uploaded
//! ([`PassReport::skipped_not_owner`]).
//!
//! Segments of a topic go strictly in offset order, and a topic stops at
//! its first failing segment (the broker refuses a descriptor that does not
//! continue the committed ones). Every step is idempotent, so a crash
//! anywhere is repaired by running again: the redo starts at the first step
//! whose result is missing (crash-point table in `FORMAT.md`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use backon::{ExponentialBuilder, Retryable};
use broker_core::wal::{SealedSegment, list_sealed_segments};
use serde::Deserialize;
use tokio::sync::watch;
use tracing::{debug, error, info, warn};
use tributary_proto::archive::{ArchiveTail, SegmentDescriptor, holes_cover_exactly};
use tributary_proto::keys::{NamespaceName, StorageKeys, TopicName};

use crate::broker_api::BrokerClient;
use crate::error::TierError;
use crate::faults::Faults;
use crate::metrics::STATS;
use crate::upload::{
    UploadTuning, expected_tail_with_holes, holes_in_segment, upload_segment_with_mode,
    verify_object,
};
use tributary_archive::bucket::Bucket;
use tributary_proto::archive::HoleRange;

/// Retry settings for each step (`[retry]` in the configuration).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetryTuning {
    /// Attempts of one step before the topic's pass gives up (the next
    /// pass starts again). Default 6.
    pub attempts_max: usize,
    /// First backoff, ms. Default 200.
    pub min_delay_ms: u64,
    /// Largest backoff, ms. Default 10000.
    pub max_delay_ms: u64,
}

impl Default for RetryTuning {
    fn default() -> Self {
        RetryTuning {
            attempts_max: 6,
            min_delay_ms: 200,
            max_delay_ms: 10_000,
        }
    }
}

/// Milliseconds since the Unix epoch (the tier service's only clock read
/// for descriptors).
pub use broker_core::clock::now_ms;

/// What one pass did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PassReport {
    /// Topics looked at.
    pub topics: usize,
    /// Sealed segments found.
    pub sealed_segments: u64,
    /// Segments newly committed in this pass.
    pub committed: u64,
    /// Bytes uploaded (objects newly written).
    pub uploaded_bytes: u64,
    /// Time spent storing and verifying them.
    pub upload_time: Duration,
    /// Per committed segment: ms from its seal (the `.index` file's
    /// modification time) to its committed descriptor.
    pub seal_to_commit_ms: Vec<u64>,
    /// Local segments the broker deleted after trim calls.
    pub trimmed_segments: u64,
    /// Archived segments removed by cold retention (object keys).
    pub retired: Vec<String>,
    /// Topics whose pass failed, with the error.
    pub errors: Vec<(String, String)>,
    /// Age of the oldest sealed segment left uncommitted by this pass
    /// (since its seal, the `.index` file's modification time), ms; `None`
    /// when every sealed segment is committed (no tiering backlog).
    pub backlog_age_ms: Option<u64>,
    /// Local sealed segments found damaged (not uploaded):
    /// `(topic, base_offset, next_offset)`.
    pub damaged: Vec<(String, u64, u64)>,
    /// Per topic while it is tiered: seal ages (ms) of its sealed segments
    /// not committed when the pass began, in offset order.
    pub pending_ages_ms: Vec<u64>,
    /// Topics skipped because another broker owns them (nothing uploaded).
    pub skipped_not_owner: u64,
    /// Segments refused because a committed object with other bytes is at
    /// their key ([`TierError::ObjectConflict`]).
    pub object_conflicts: u64,
    /// Parquet files the lakehouse writer stored (dated and `_rejected`).
    pub lakehouse_files: u64,
    /// Records written to `_rejected` files (they did not fit the columns).
    pub lakehouse_rejected: u64,
    /// Topics whose lakehouse write failed in this pass, with the error
    /// (also in `errors`): `/health` turns `lakehouse_stalled` once one
    /// keeps failing.
    pub lakehouse_errors: Vec<(String, String)>,
}

/// The tiering pipeline and everything it needs.
#[derive(Debug, Clone)]
pub struct Tiering {
    /// Where objects go.
    pub bucket: Bucket,
    /// Key builder for the storage prefix.
    pub keys: StorageKeys,
    /// The broker's admin API.
    pub broker: BrokerClient,
    /// `{broker data_dir}/topics`: one WAL directory per `{ns}/{topic}`.
    pub topics_dir: PathBuf,
    /// Upload settings.
    pub upload: UploadTuning,
    /// Retry settings.
    pub retry: RetryTuning,
    /// Topics tiered at once. At least 1.
    pub topic_concurrency: usize,
    /// Crash injection (tests).
    pub faults: Arc<Faults>,
    /// Cold retention of the archive.
    pub cold: crate::cold::ColdRetention,
    /// The continuous lakehouse writer (`[lakehouse]`).
    pub lakehouse: crate::lakehouse::LakehouseConfig,
}

impl Tiering {
    /// Runs `op` with exponential backoff and jitter while it fails with a
    /// retryable error, up to `retry.attempts_max` attempts.
    ///
    /// # Errors
    /// The last error.
    pub async fn retry<T, E, F, Fut>(&self, what: &'static str, mut op: F) -> Result<T, TierError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: Into<TierError>,
    {
        let op = || {
            let attempt = op();
            async move { attempt.await.map_err(Into::into) }
        };
        let backoff = ExponentialBuilder::default()
            .with_jitter()
            .with_min_delay(Duration::from_millis(self.retry.min_delay_ms))
            .with_max_delay(Duration::from_millis(self.retry.max_delay_ms))
            .with_max_times(self.retry.attempts_max.saturating_sub(1));
        op.retry(backoff)
            .when(TierError::is_retryable)
            .notify(|err, delay| warn!(what, error = %err, delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX), "retrying"))
            .await
    }

    /// The topics with a WAL directory under [`Tiering::topics_dir`].
    /// Directories whose names are not valid namespace or topic names are
    /// skipped with a warning.
    ///
    /// # Errors
    /// I/O errors listing the directory (a missing one is empty).
    pub fn local_topics(&self) -> Result<Vec<(TopicName, PathBuf)>, TierError> {
        local_topics(&self.topics_dir)
    }

    /// One pass over every local topic: tiers all sealed segments not yet
    /// committed, then asks for trimming. Stops between segments once
    /// `shutdown` is true.
    pub async fn run_pass(&self, shutdown: &watch::Receiver<bool>) -> PassReport {
        let mut report = PassReport::default();
        let topics = match self.local_topics() {
            Ok(t) => t,
            Err(e) => {
                report.errors.push(("*".into(), e.to_string()));
                return report;
            }
        };
        report.topics = topics.len();
        let results = futures::StreamExt::collect::<Vec<_>>(futures::StreamExt::buffer_unordered(
            futures::stream::iter(topics.into_iter().map(|(topic, dir)| async move {
                let mut topic_report = PassReport::default();
                let result = self
                    .tier_topic(&topic, &dir, &mut topic_report, shutdown)
                    .await;
                (topic, result, topic_report)
            })),
            self.topic_concurrency.max(1),
        ))
        .await;
        for (topic, result, r) in results {
            report.sealed_segments += r.sealed_segments;
            report.committed += r.committed;
            report.uploaded_bytes += r.uploaded_bytes;
            report.upload_time += r.upload_time;
            report.seal_to_commit_ms.extend(r.seal_to_commit_ms);
            report.trimmed_segments += r.trimmed_segments;
            report.retired.extend(r.retired);
            report.skipped_not_owner += r.skipped_not_owner;
            report.lakehouse_files += r.lakehouse_files;
            report.lakehouse_rejected += r.lakehouse_rejected;
            report.lakehouse_errors.extend(r.lakehouse_errors);
            if let Err(TierError::ObjectConflict { key, reason }) = &result {
                report.object_conflicts += 1;
                error!(%topic, key, reason, "ARCHIVE OBJECT CONFLICT: a committed object at this segment's key holds other bytes; it is not replaced and the segment is refused");
            }
            // Segments are committed in offset order: after a failure the
            // oldest left is the first pending one not committed.
            let left = if result.is_err() || *shutdown.borrow() {
                r.pending_ages_ms.get(r.committed as usize).copied()
            } else {
                None
            };
            report.backlog_age_ms = report.backlog_age_ms.max(left);
            let mut reported = DAMAGE_REPORTED
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Err(TierError::DamagedSegment {
                base_offset,
                next_offset,
                reason,
                ..
            }) = &result
            {
                if reported.insert((topic.to_string(), *base_offset)) {
                    error!(%topic, base_offset, next_offset, reason, "DAMAGED LOCAL SEGMENT: not uploaded; tiering of this topic waits at it until the segment is healed or its damaged range is declared a hole (tribctl topics skip-damaged)");
                }
                report
                    .damaged
                    .push((topic.to_string(), *base_offset, *next_offset));
                continue;
            }
            // Healed (or gone): report it again if it is damaged again.
            reported.retain(|(t, _)| *t != topic.as_str());
            drop(reported);
            if let Err(e) = result {
                // Logged by the service once per distinct error.
                debug!(%topic, error = %e, "tiering stopped for this topic until the next pass");
                report.errors.push((topic.to_string(), e.to_string()));
            }
        }
        report
    }

    /// Tiers the sealed segments of one topic in offset order, then asks
    /// the broker to trim.
    ///
    /// # Errors
    /// The first step that failed after its retries, or an inconsistency
    /// between the local segments and the committed descriptors.
    ///
    /// A topic the broker does not own now is skipped (`Ok`, counted in
    /// [`PassReport::skipped_not_owner`], logged at debug): nothing is
    /// uploaded, committed or trimmed for it.
    pub async fn tier_topic(
        &self,
        topic: &TopicName,
        dir: &Path,
        report: &mut PassReport,
        shutdown: &watch::Receiver<bool>,
    ) -> Result<(), TierError> {
        match self.tier_owned_topic(topic, dir, report, shutdown).await {
            Err(e) if e.is_not_owner() => {
                debug!(%topic, error = %e, "not owned by this broker: skipped, nothing uploaded");
                report.skipped_not_owner += 1;
                Ok(())
            }
            other => other,
        }
    }

    /// The committed descriptors of `topic`, or [`TierError::NotOwner`]
    /// when the broker says it does not own the topic now.
    pub(crate) async fn owned_segments(
        &self,
        topic: &TopicName,
    ) -> Result<crate::broker_api::CommittedSegments, TierError> {
        let committed = self
            .retry("list descriptors", || self.broker.segments(topic))
            .await?;
        if committed.owned_here == Some(false) {
            return Err(TierError::NotOwner {
                topic: topic.to_string(),
                owner: committed.owner,
            });
        }
        Ok(committed)
    }

    async fn tier_owned_topic(
        &self,
        topic: &TopicName,
        dir: &Path,
        report: &mut PassReport,
        shutdown: &watch::Receiver<bool>,
    ) -> Result<(), TierError> {
        let sealed = sealed_segments(dir).await?;
        report.sealed_segments += sealed.len() as u64;
        if sealed.is_empty() {
            return self.after_tiering(topic, report, shutdown).await;
        }
        let committed = self.owned_segments(topic).await?;
        let by_start: BTreeMap<u64, SegmentDescriptor> = committed
            .segments
            .into_iter()
            .map(|d| (d.start_offset, d))
            .collect();
        let mut tiered = committed.tiered_offset;
        let retired_below = committed.retired_below.unwrap_or(0);
        // What waits, by base offset → sealed at (ms since the Unix
        // epoch), for `/health` while this pass runs, and the report.
        let listed_at = u64::try_from(now_ms()).unwrap_or(0);
        let mut waiting: BTreeMap<u64, u64> = sealed
            .iter()
            .filter(|s| s.next_offset > retired_below && !by_start.contains_key(&s.base_offset))
            .map(|s| {
                let age = ms_since_modified(&s.index_path).unwrap_or(0);
                (s.base_offset, listed_at.saturating_sub(age))
            })
            .collect();
        report.pending_ages_ms = waiting
            .values()
            .map(|since| listed_at.saturating_sub(*since))
            .collect();
        let note_waiting = |waiting: &BTreeMap<u64, u64>| {
            let oldest = waiting.values().min().copied();
            STATS.note_pending(
                topic.as_str(),
                oldest.map(|since| (since, waiting.len() as u64)),
            );
        };
        note_waiting(&waiting);
        for segment in &sealed {
            if *shutdown.borrow() {
                return Ok(());
            }
            if segment.next_offset <= retired_below {
                // Removed from the archive by cold retention: not again.
                continue;
            }
            if let Some(d) = by_start.get(&segment.base_offset) {
                if d.next_offset() == segment.next_offset {
                    continue;
                }
                return Err(inconsistent(
                    topic,
                    format!(
                        "local segment {}..{} but the committed descriptor at {} ends at {}",
                        segment.base_offset, segment.next_offset, d.start_offset, d.end_offset
                    ),
                ));
            }
            if let Some((_, d)) = by_start
                .range(..segment.next_offset)
                .next_back()
                .filter(|(_, d)| d.next_offset() > segment.base_offset)
            {
                if d.next_offset() == segment.next_offset
                    && after_skipped_range(&committed.holes, segment, d.start_offset).is_some()
                {
                    // Archived with the skipped lost range before it (see
                    // below); the trim has not removed it yet.
                    continue;
                }
                return Err(inconsistent(
                    topic,
                    format!(
                        "local segment {}..{} overlaps committed segment {}..={}",
                        segment.base_offset, segment.next_offset, d.start_offset, d.end_offset
                    ),
                ));
            }
            // A segment lost from the broker's disk leaves its offsets
            // between the archive's end and the next local segment. Once an
            // operator skipped them (declared holes, `skip-damaged`), the
            // next segment's object starts at the archive's end and
            // carries them, so the archive stays contiguous.
            let mut object = std::borrow::Cow::Borrowed(segment);
            if let Some(t) = tiered
                && segment.base_offset > t
            {
                let Some(widened) = after_skipped_range(&committed.holes, segment, t) else {
                    return Err(inconsistent(
                        topic,
                        format!(
                            "offsets {t}..{} are neither committed nor in a local sealed segment \
                             (a segment lost from the broker's disk: it heals when the edge sends \
                             the range again, or skip it with `tribctl topics skip-damaged {topic} \
                             --range {t}..{}`)",
                            segment.base_offset, segment.base_offset
                        ),
                    ));
                };
                info!(%topic, first_offset = t, end_offset = segment.base_offset, "a skipped lost segment: the next segment's object starts at the archive's end and carries the hole");
                object = std::borrow::Cow::Owned(widened);
            }
            let holes = holes_in_segment(&committed.holes, &object);
            let descriptor = self
                .tier_segment_with_holes(topic, &object, &holes, report)
                .await
                .map_err(|e| damaged_segment(topic, &object, e))?;
            tiered = Some(descriptor.next_offset());
            STATS.note_commit(u64::try_from(now_ms()).unwrap_or(0));
            waiting.remove(&segment.base_offset);
            note_waiting(&waiting);
        }
        STATS.note_pending(topic.as_str(), None);
        let trimmable = tiered.is_some_and(|t| sealed.iter().any(|s| s.next_offset <= t));
        if trimmable && !*shutdown.borrow() {
            match self.retry("trim", || self.broker.trim(topic)).await? {
                Some(reply) => {
                    report.trimmed_segments += reply.deleted.len() as u64;
                    if !reply.deleted.is_empty() {
                        info!(%topic, deleted = reply.deleted.iter().map(|(base, next, _)| format!("{base}..{next}")).collect::<Vec<_>>().join(","), safe_offset = reply.tiered_offset, "broker trimmed local segments");
                    }
                }
                None => {
                    warn!(%topic, "the broker does not expose its WALs for trimming; its own retention must use the tiered offset")
                }
            }
            self.faults.hit("after_trim");
        }
        self.after_tiering(topic, report, shutdown).await
    }

    /// The lakehouse writer, then cold retention, for `topic`.
    async fn after_tiering(
        &self,
        topic: &TopicName,
        report: &mut PassReport,
        shutdown: &watch::Receiver<bool>,
    ) -> Result<(), TierError> {
        let lakehouse = crate::lakehouse::pass(self, topic, report, &|| *shutdown.borrow()).await;
        if let Err(e) = &lakehouse {
            if e.is_not_owner() {
                return lakehouse;
            }
            report
                .lakehouse_errors
                .push((topic.to_string(), e.to_string()));
        }
        // A failing lakehouse write does not hold cold retention back (the
        // error is still this topic's result for the pass).
        self.cold_pass(topic, report, shutdown).await?;
        lakehouse
    }

    /// Cold retention for `topic`, when it has limits.
    async fn cold_pass(
        &self,
        topic: &TopicName,
        report: &mut PassReport,
        shutdown: &watch::Receiver<bool>,
    ) -> Result<(), TierError> {
        if self.cold.limits_for(topic) == crate::cold::ColdLimits::default() || *shutdown.borrow() {
            return Ok(());
        }
        let committed = self.owned_segments(topic).await?;
        let removed = crate::cold::apply(self, topic, &committed.segments, now_ms()).await?;
        // The lakehouse files of retired segments go too (also those a
        // crash between the retirement and this sweep left).
        let below = removed
            .iter()
            .filter_map(|key| self.keys.parse_segment_object(key).ok())
            .map(|o| o.end_offset + 1)
            .chain(committed.retired_below)
            .max();
        if let Some(below) = below {
            crate::lakehouse::sweep_below(self, topic, below).await?;
        }
        report.retired.extend(removed);
        Ok(())
    }

    /// Steps 2–4 for one segment. Returns the committed descriptor.
    ///
    /// # Errors
    /// The failing step's error after its retries.
    pub async fn tier_segment(
        &self,
        topic: &TopicName,
        segment: &SealedSegment,
        report: &mut PassReport,
    ) -> Result<SegmentDescriptor, TierError> {
        self.tier_segment_with_holes(topic, segment, &[], report)
            .await
    }

    /// As [`Tiering::tier_segment`], for a segment whose gaps may be the
    /// declared `holes` (those of the topic inside the segment's offsets):
    /// the object carries them.
    ///
    /// # Errors
    /// As [`Tiering::tier_segment`].
    pub async fn tier_segment_with_holes(
        &self,
        topic: &TopicName,
        segment: &SealedSegment,
        holes: &[HoleRange],
        report: &mut PassReport,
    ) -> Result<SegmentDescriptor, TierError> {
        let key = self
            .keys
            .segment_object(topic, segment.base_offset, segment.next_offset - 1);
        self.faults.hit("before_upload");
        let started = Instant::now();
        let (tail, uploaded) = self
            .retry("upload", || self.store_object(topic, &key, segment, holes))
            .await?;
        if uploaded {
            report.uploaded_bytes += tail.footer.object_bytes();
            report.upload_time += started.elapsed();
        }
        let descriptor = SegmentDescriptor::from_footer(&tail.footer, key.clone(), now_ms());
        let reply = match self
            .retry("commit", || self.broker.commit(topic, &descriptor))
            .await
        {
            Ok(reply) => reply,
            // The broker lost the topic between the upload and the commit:
            // the object this pass created is committed by nobody, and
            // would overlap the new owner's objects for every reader of the
            // bucket. Remove it (it was created here, create-if-absent, so
            // no committed descriptor names it).
            Err(e) if e.is_not_owner() && uploaded => {
                match self.bucket.delete(&key).await {
                    Ok(()) => {
                        info!(%topic, key, "the broker lost the topic before the commit; removed the uncommitted object")
                    }
                    Err(d) => {
                        tracing::warn!(%topic, key, error = %d, "the broker lost the topic before the commit; removing the uncommitted object failed")
                    }
                }
                return Err(e);
            }
            Err(e) => return Err(e),
        };
        report.committed += 1;
        if let Some(ms) = ms_since_modified(&segment.index_path) {
            report.seal_to_commit_ms.push(ms);
        }
        info!(
            %topic,
            key,
            records = tail.footer.record_count(),
            holes = tail.holes.len(),
            bytes = tail.footer.object_bytes(),
            outcome = reply.outcome,
            tiered_offset = reply.tiered_offset,
            "segment committed"
        );
        self.faults.hit("after_commit");
        Ok(descriptor)
    }

    /// Steps 2 and 3: makes the object at `key` exactly the one `segment`
    /// builds, verified, without ever replacing a committed object.
    /// Returns its tail and whether it was uploaded now (false: a verified
    /// object was already there).
    async fn store_object(
        &self,
        topic: &TopicName,
        key: &str,
        segment: &SealedSegment,
        holes: &[HoleRange],
    ) -> Result<(ArchiveTail, bool), TierError> {
        let mut create = true;
        if self.bucket.head(key).await?.is_some() {
            match self.existing_object(topic, key, segment, holes).await? {
                Some(tail) => return Ok((tail, false)),
                None => create = false,
            }
        }
        let tail = match upload_segment_with_mode(
            &self.bucket,
            key,
            segment,
            holes,
            &self.upload,
            &self.faults,
            create,
        )
        .await
        {
            Ok(tail) => tail,
            // Another writer created it meanwhile: judge what it wrote.
            Err(e) if e.is_already_exists() => {
                match self.existing_object(topic, key, segment, holes).await? {
                    Some(tail) => return Ok((tail, false)),
                    None => return Err(e),
                }
            }
            Err(e) => return Err(e),
        };
        self.faults.hit("after_upload");
        verify_object(&self.bucket, key, &tail, self.upload.full_verify).await?;
        self.faults.hit("after_verify");
        Ok((tail, true))
    }

    /// An object is already at `key`: its tail when it is exactly the one
    /// `segment` builds (an idempotent redo); `None` when it differs but
    /// no committed descriptor names it (a leftover of an upload that was
    /// never committed: replaced); [`TierError::ObjectConflict`] when it
    /// differs and is committed.
    async fn existing_object(
        &self,
        topic: &TopicName,
        key: &str,
        segment: &SealedSegment,
        holes: &[HoleRange],
    ) -> Result<Option<ArchiveTail>, TierError> {
        let expected = expected_tail_with_holes(segment, holes).await?;
        match verify_object(&self.bucket, key, &expected, self.upload.full_verify).await {
            Ok(()) => {
                info!(
                    key,
                    "object already stored and verified; not uploading again"
                );
                self.faults.hit("after_verify");
                Ok(Some(expected))
            }
            Err(TierError::Verify { reason, .. }) => {
                let committed = self.owned_segments(topic).await?;
                if committed.segments.iter().any(|d| d.object_id == key) {
                    return Err(TierError::ObjectConflict {
                        key: key.to_owned(),
                        reason,
                    });
                }
                warn!(
                    key,
                    reason,
                    "an uncommitted object with other bytes is at the key (an upload never committed); replacing it"
                );
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }
}

/// `e` as [`TierError::DamagedSegment`] when it is the segment file's own
/// bytes that failed a check (a batch CRC or frame, a truncated batch) or
/// the file is gone (a lost segment: the broker lists its range as damaged
/// and re-fetches it), else unchanged (an offset gap, for one, is not
/// damage).
fn damaged_segment(topic: &TopicName, segment: &SealedSegment, e: TierError) -> TierError {
    match e {
        TierError::Bucket(tributary_archive::BucketError::Io { op, path, source })
            if source.kind() == std::io::ErrorKind::NotFound && path == segment.log_path =>
        {
            TierError::DamagedSegment {
                topic: topic.to_string(),
                base_offset: segment.base_offset,
                next_offset: segment.next_offset,
                reason: format!("{op} {}: the data file is missing", path.display()),
            }
        }
        TierError::Bucket(tributary_archive::BucketError::Archive {
            what: "segment",
            source:
                source @ (tributary_proto::archive::ArchiveError::Batch { .. }
                | tributary_proto::archive::ArchiveError::BatchesTruncated { .. }),
            ..
        }) => TierError::DamagedSegment {
            topic: topic.to_string(),
            base_offset: segment.base_offset,
            next_offset: segment.next_offset,
            reason: source.to_string(),
        },
        other => other,
    }
}

/// Damaged local segments already reported, `(topic, base_offset)`: each
/// is logged once, not at every pass.
static DAMAGE_REPORTED: std::sync::Mutex<std::collections::BTreeSet<(String, u64)>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

/// `segment` as an object starting at `from`, when the topic's declared
/// `holes` cover exactly `from..segment.base_offset` (a lost segment an
/// operator skipped); `None` otherwise.
fn after_skipped_range(
    holes: &[tributary_proto::replication::hole::HoleRecord],
    segment: &SealedSegment,
    from: u64,
) -> Option<SealedSegment> {
    let widened = SealedSegment {
        base_offset: from,
        ..segment.clone()
    };
    let declared = holes_in_segment(holes, &widened);
    holes_cover_exactly(&declared, from, segment.base_offset).then_some(widened)
}

fn inconsistent(topic: &TopicName, reason: String) -> TierError {
    TierError::Inconsistent {
        topic: topic.to_string(),
        reason,
    }
}

fn ms_since_modified(path: &Path) -> Option<u64> {
    let modified = std::fs::metadata(path).ok()?.modified().ok()?;
    let elapsed = SystemTime::now().duration_since(modified).ok()?;
    u64::try_from(elapsed.as_millis()).ok()
}

/// The sealed segments of the WAL in `dir` (a missing directory has none).
///
/// # Errors
/// I/O errors.
pub async fn sealed_segments(dir: &Path) -> Result<Vec<SealedSegment>, TierError> {
    let dir = dir.to_path_buf();
    tokio::task::spawn_blocking(move || {
        if !dir.exists() {
            return Ok(Vec::new());
        }
        list_sealed_segments(&dir).map_err(TierError::from)
    })
    .await
    .map_err(|e| TierError::Config(format!("listing task failed: {e}")))?
}

/// The topics with a WAL directory under `topics_dir`
/// (`{topics_dir}/{ns}/{topic}`), sorted.
///
/// # Errors
/// I/O errors (a missing directory has no topics).
pub fn local_topics(topics_dir: &Path) -> Result<Vec<(TopicName, PathBuf)>, TierError> {
    let mut out = Vec::new();
    let namespaces = match std::fs::read_dir(topics_dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(TierError::io("list", topics_dir)(e)),
    };
    for ns_entry in namespaces {
        let ns_entry = ns_entry.map_err(TierError::io("list", topics_dir))?;
        if !ns_entry.path().is_dir() {
            continue;
        }
        let ns_name = ns_entry.file_name().to_string_lossy().into_owned();
        let Ok(namespace) = NamespaceName::new(&ns_name) else {
            warn!(dir = %ns_entry.path().display(), "not a namespace directory; skipped");
            continue;
        };
        let topics =
            std::fs::read_dir(ns_entry.path()).map_err(TierError::io("list", ns_entry.path()))?;
        for topic_entry in topics {
            let topic_entry = topic_entry.map_err(TierError::io("list", ns_entry.path()))?;
            if !topic_entry.path().is_dir() {
                continue;
            }
            let name = topic_entry.file_name().to_string_lossy().into_owned();
            match TopicName::from_parts(&namespace, &name) {
                Ok(topic) => out.push((topic, topic_entry.path())),
                Err(_) => {
                    warn!(dir = %topic_entry.path().display(), "not a topic directory; skipped");
                }
            }
        }
    }
    out.sort();
    Ok(out)
}
