//! Reading an archive bucket with no broker and no Raft: list topics and
//! segments, read records from an offset or a timestamp, verify objects.
//! The tier service's reconciliation and `tribctl archive` use it.
//!
//! Reaching the first record at an offset takes two ranged reads of the
//! object: a suffix read of [`TAIL_READ_BYTES`] (footer and index), then
//! one read from the index block holding the offset, streamed onward.

use std::ops::ControlFlow;
use std::sync::Arc;

use futures::StreamExt;
use futures::future::BoxFuture;
use tributary_proto::archive::{
    ArchiveError, ArchiveIndex, BatchSplitter, Block, Damage, FOOTER_BYTES, Footer, HoleRange,
    SegmentDescriptor, SegmentVerifier, TAIL_READ_BYTES, reader_limits,
};
use tributary_proto::batch::{EncodedBatch, Record};
use tributary_proto::keys::{NamespaceName, StorageKeys, TopicName};

use crate::bucket::Bucket;
use crate::error::BucketError;

/// One segment object as listed (no read of the object yet).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentObjectInfo {
    /// Object key.
    pub key: String,
    /// First offset (from the key).
    pub start_offset: u64,
    /// Last offset, inclusive (from the key).
    pub end_offset: u64,
    /// Object size, bytes (from the listing).
    pub size: u64,
}

/// Where to start reading a topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// From this offset.
    Offset(u64),
    /// From the first record (in offset order) whose timestamp is at least
    /// this, ms since the Unix epoch.
    Timestamp(i64),
}

/// One record read from the archive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchivedRecord {
    /// Its offset.
    pub offset: u64,
    /// The record.
    pub record: Record,
}

/// The verdict on one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentVerdict {
    /// The object.
    pub object: SegmentObjectInfo,
    /// Its footer, if readable.
    pub footer: Option<Footer>,
    /// Damaged offset ranges; empty when intact.
    pub damage: Vec<Damage>,
    /// Declared holes the object carries (offsets with no record on
    /// purpose, not damage), if its tail was readable.
    pub holes: Vec<HoleRange>,
    /// Records in verified batches.
    pub records_ok: u64,
}

/// Where a reader finds the segment descriptor committed for an object
/// (the broker: its copy of the Raft metadata). With one
/// ([`Archive::with_committed`]), an object whose footer disagrees with the
/// descriptor committed under its key is refused as damaged
/// ([`ArchiveError::NotCommitted`]) instead of being read: another object
/// stored at a committed key (a wrong backup restored, a stray upload)
/// is never served as the topic's records. Without one (`tribctl
/// archive`, which reads a bucket with no broker) the bucket is taken as
/// it is.
pub trait CommittedDescriptors: Send + Sync {
    /// The descriptor committed at `key` (a descriptor key,
    /// [`StorageKeys::segment_descriptor`]); `None` when there is none.
    ///
    /// # Errors
    /// Why the metadata could not be read, as text.
    fn descriptor<'a>(
        &'a self,
        key: &'a str,
    ) -> BoxFuture<'a, Result<Option<SegmentDescriptor>, String>>;
}

/// An archive bucket under a storage prefix.
#[derive(Clone)]
pub struct Archive {
    bucket: Bucket,
    keys: StorageKeys,
    committed: Option<Arc<dyn CommittedDescriptors>>,
}

impl std::fmt::Debug for Archive {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Archive")
            .field("bucket", &self.bucket)
            .field("keys", &self.keys)
            .field("checks_descriptors", &self.committed.is_some())
            .finish()
    }
}

impl Archive {
    /// The archive in `bucket` under the prefix of `keys`.
    pub fn new(bucket: Bucket, keys: StorageKeys) -> Archive {
        Archive {
            bucket,
            keys,
            committed: None,
        }
    }

    /// This archive, checking every object it opens against the
    /// descriptor `committed` holds for it (see [`CommittedDescriptors`]).
    #[must_use]
    pub fn with_committed(mut self, committed: Arc<dyn CommittedDescriptors>) -> Archive {
        self.committed = Some(committed);
        self
    }

    /// The storage prefix this archive reads under.
    pub fn keys(&self) -> &StorageKeys {
        &self.keys
    }

    /// The bucket.
    pub fn bucket(&self) -> &Bucket {
        &self.bucket
    }

    /// Topics with at least one object, sorted.
    ///
    /// # Errors
    /// Store errors.
    pub async fn topics(&self) -> Result<Vec<TopicName>, BucketError> {
        let root = self.keys.objects_root();
        let mut out = Vec::new();
        for ns in self.bucket.list_dirs(&root).await? {
            let Ok(namespace) = NamespaceName::new(&ns) else {
                continue;
            };
            for topic in self.bucket.list_dirs(&format!("{root}{ns}/")).await? {
                if let Ok(topic) = TopicName::from_parts(&namespace, &topic) {
                    out.push(topic);
                }
            }
        }
        out.sort();
        Ok(out)
    }

    /// A topic's segment objects in offset order, and the keys under its
    /// segments prefix that are not segment objects.
    ///
    /// # Errors
    /// Store errors.
    pub async fn segments(
        &self,
        topic: &TopicName,
    ) -> Result<(Vec<SegmentObjectInfo>, Vec<String>), BucketError> {
        let mut objects = Vec::new();
        let mut foreign = Vec::new();
        for meta in self
            .bucket
            .list(&self.keys.segment_objects_prefix(topic))
            .await?
        {
            let key = meta.location.to_string();
            match self.keys.parse_segment_object(&key) {
                Ok(parsed) if &parsed.topic == topic => objects.push(SegmentObjectInfo {
                    key,
                    start_offset: parsed.start_offset,
                    end_offset: parsed.end_offset,
                    size: meta.size,
                }),
                _ => foreign.push(key),
            }
        }
        objects.sort_by_key(|o| o.start_offset);
        Ok((objects, foreign))
    }

    fn archive_error(object: &SegmentObjectInfo) -> impl FnOnce(ArchiveError) -> BucketError + '_ {
        move |source| BucketError::Archive {
            what: "object",
            key: object.key.clone(),
            source,
        }
    }

    fn check_footer(
        object: &SegmentObjectInfo,
        footer: &Footer,
        size: u64,
    ) -> Result<(), BucketError> {
        let err = Archive::archive_error(object);
        if footer.object_bytes() != size {
            return Err(err(ArchiveError::ObjectSize {
                expected: footer.object_bytes(),
                actual: size,
            }));
        }
        if footer.base_offset != object.start_offset || footer.end_offset() != object.end_offset {
            return Err(err(ArchiveError::Mismatch {
                field: "first offset (footer vs key)",
                expected: object.start_offset,
                actual: footer.base_offset,
            }));
        }
        Ok(())
    }

    /// With [`Archive::with_committed`]: refuses `object` when the
    /// descriptor committed for its start offset names this key and
    /// disagrees with `footer`. A descriptor naming another key, or none
    /// (an object uploaded but not yet committed), is not checked here.
    async fn check_committed(
        &self,
        object: &SegmentObjectInfo,
        footer: &Footer,
    ) -> Result<(), BucketError> {
        let Some(committed) = &self.committed else {
            return Ok(());
        };
        let Ok(parsed) = self.keys.parse_segment_object(&object.key) else {
            return Ok(());
        };
        let key = self
            .keys
            .segment_descriptor(&parsed.topic, parsed.start_offset);
        let descriptor =
            committed
                .descriptor(&key)
                .await
                .map_err(|reason| BucketError::Descriptor {
                    key: key.clone(),
                    reason,
                })?;
        match descriptor {
            Some(d) if d.object_id == object.key && !d.matches_footer(footer) => {
                Err(Archive::archive_error(object)(ArchiveError::NotCommitted {
                    committed: d.batches_crc32c,
                    found: footer.batches_crc32c,
                }))
            }
            _ => Ok(()),
        }
    }

    /// The object's footer: one suffix read of 112 bytes.
    ///
    /// # Errors
    /// Store errors, [`BucketError::Archive`] for a damaged footer (or,
    /// with [`Archive::with_committed`], one that is not the committed
    /// object's), [`BucketError::Descriptor`].
    pub async fn footer(&self, object: &SegmentObjectInfo) -> Result<Footer, BucketError> {
        let (tail, size) = self
            .bucket
            .get_suffix(&object.key, FOOTER_BYTES as u64)
            .await?;
        let footer = Footer::decode_from_tail(&tail).map_err(Archive::archive_error(object))?;
        Archive::check_footer(object, &footer, size)?;
        self.check_committed(object, &footer).await?;
        Ok(footer)
    }

    /// Footer and index: one suffix read of [`TAIL_READ_BYTES`].
    ///
    /// # Errors
    /// Store errors, [`BucketError::Archive`] for a damaged footer or index
    /// (or, with [`Archive::with_committed`], an object that is not the
    /// committed one), [`BucketError::Descriptor`].
    pub async fn open(&self, object: &SegmentObjectInfo) -> Result<ArchiveIndex, BucketError> {
        let (tail, size) = self.bucket.get_suffix(&object.key, TAIL_READ_BYTES).await?;
        let footer = Footer::decode_from_tail(&tail).map_err(Archive::archive_error(object))?;
        Archive::check_footer(object, &footer, size)?;
        self.check_committed(object, &footer).await?;
        ArchiveIndex::decode_from_tail(&footer, &tail).map_err(Archive::archive_error(object))
    }

    /// Calls `each` with every batch of `object` from `block` on (one
    /// ranged read, streamed), CRC-verified and in offset order, until it
    /// breaks.
    ///
    /// # Errors
    /// Store errors; [`BucketError::Archive`] for a damaged batch.
    pub async fn read_block_batches(
        &self,
        object: &SegmentObjectInfo,
        index: &ArchiveIndex,
        block: Block,
        each: &mut dyn FnMut(&EncodedBatch) -> Result<ControlFlow<()>, ArchiveError>,
    ) -> Result<ControlFlow<()>, BucketError> {
        self.read_block_batches_with_holes(object, index, block, each, &mut |_| {})
            .await
    }

    /// As [`Archive::read_block_batches`], also calling `on_hole` with
    /// every declared hole the read steps over, in offset order between
    /// the batches around it.
    ///
    /// # Errors
    /// As [`Archive::read_block_batches`].
    pub async fn read_block_batches_with_holes(
        &self,
        object: &SegmentObjectInfo,
        index: &ArchiveIndex,
        block: Block,
        each: &mut dyn FnMut(&EncodedBatch) -> Result<ControlFlow<()>, ArchiveError>,
        on_hole: &mut dyn FnMut(HoleRange),
    ) -> Result<ControlFlow<()>, BucketError> {
        let end = index.footer().batches_bytes;
        let mut stream = self
            .bucket
            .get_range_stream(&object.key, block.position..end)
            .await?;
        let mut splitter = BatchSplitter::new(block.position, block.base_offset, reader_limits())
            .with_holes(index.holes());
        // Holes crossed but not yet reported (they precede a later batch).
        let mut crossed: std::collections::VecDeque<HoleRange> = Default::default();
        while let Some(chunk) = stream.next().await {
            let batches = splitter
                .push(&chunk?)
                .map_err(Archive::archive_error(object))?;
            crossed.extend(splitter.take_crossed());
            for batch in &batches {
                while let Some(h) = crossed
                    .front()
                    .filter(|h| h.end_offset <= batch.base_offset())
                {
                    on_hole(*h);
                    crossed.pop_front();
                }
                if each(batch)
                    .map_err(Archive::archive_error(object))?
                    .is_break()
                {
                    return Ok(ControlFlow::Break(()));
                }
            }
        }
        splitter.check().map_err(Archive::archive_error(object))?;
        let reached = splitter.skip_holes_to(index.footer().next_offset);
        crossed.extend(splitter.take_crossed());
        crossed.into_iter().for_each(&mut *on_hole);
        if !reached {
            return Err(Archive::archive_error(object)(ArchiveError::Mismatch {
                field: "next offset (batches vs footer)",
                expected: index.footer().next_offset,
                actual: splitter.next_offset(),
            }));
        }
        splitter.finish().map_err(Archive::archive_error(object))?;
        Ok(ControlFlow::Continue(()))
    }

    /// As [`Archive::read_block_batches`], record by record.
    ///
    /// # Errors
    /// As [`Archive::read_block_batches`].
    pub async fn read_block(
        &self,
        object: &SegmentObjectInfo,
        index: &ArchiveIndex,
        block: Block,
        each: &mut dyn FnMut(ArchivedRecord) -> ControlFlow<()>,
    ) -> Result<ControlFlow<()>, BucketError> {
        self.read_block_batches(object, index, block, &mut |batch| deliver(batch, each))
            .await
    }

    /// Calls `each` with the batches of `topic` in offset order, from the
    /// one holding `start` (for a timestamp: the first batch whose
    /// `max_timestamp_ms` reaches it, which holds the first record at or
    /// after it) until it breaks or the archive ends. Reaching the first
    /// batch takes one suffix read per object looked at (for an offset:
    /// only the object holding it) and one ranged read; every later object
    /// costs one suffix read and one ranged read.
    ///
    /// # Errors
    /// Store errors; [`BucketError::Archive`] for damage;
    /// [`BucketError::MissingObject`] for a gap between objects that the
    /// read reaches (one wholly before an offset start is passed over).
    pub async fn read_batches(
        &self,
        topic: &TopicName,
        start: Start,
        each: &mut dyn FnMut(&EncodedBatch) -> Result<ControlFlow<()>, ArchiveError>,
    ) -> Result<(), BucketError> {
        self.read_batches_with_holes(topic, start, each, &mut |_| {})
            .await
    }

    /// As [`Archive::read_batches`], also calling `on_hole` with every
    /// declared hole stepped over once reading has reached `start` (for an
    /// offset: every hole that ends past it), in offset order.
    ///
    /// # Errors
    /// As [`Archive::read_batches`].
    pub async fn read_batches_with_holes(
        &self,
        topic: &TopicName,
        start: Start,
        each: &mut dyn FnMut(&EncodedBatch) -> Result<ControlFlow<()>, ArchiveError>,
        on_hole: &mut dyn FnMut(HoleRange),
    ) -> Result<(), BucketError> {
        let (objects, _) = self.segments(topic).await?;
        let mut expected: Option<u64> = None;
        let started = std::cell::Cell::new(false);
        let mut report_hole = |h: HoleRange| {
            if started.get() || matches!(start, Start::Offset(o) if h.end_offset > o) {
                on_hole(h);
            }
        };
        for object in &objects {
            // A missing range before an offset start is none of this
            // read's business (what follows it is still readable); one
            // before a timestamp start might have held the first record.
            if let Some(next) = expected
                && object.start_offset != next
                && (started.get() || !matches!(start, Start::Offset(o) if o >= object.start_offset))
            {
                return Err(BucketError::MissingObject {
                    topic: topic.to_string(),
                    first_offset: next,
                    end_offset: object.start_offset,
                });
            }
            expected = Some(object.end_offset + 1);
            if !started.get() && matches!(start, Start::Offset(o) if o > object.end_offset) {
                continue;
            }
            let index = self.open(object).await?;
            let block = match start {
                _ if started.get() => index.block_for_offset(object.start_offset),
                Start::Offset(o) => index.block_for_offset(o.max(object.start_offset)),
                Start::Timestamp(t) => index.block_for_timestamp(t),
            };
            let Some(block) = block else {
                continue;
            };
            let mut filter = |batch: &EncodedBatch| {
                if !started.get() {
                    let reached = match start {
                        Start::Offset(o) => batch.next_offset() > o,
                        Start::Timestamp(t) => batch.header().max_timestamp_ms >= t,
                    };
                    if !reached {
                        return Ok(ControlFlow::Continue(()));
                    }
                    started.set(true);
                }
                each(batch)
            };
            if self
                .read_block_batches_with_holes(object, &index, block, &mut filter, &mut report_hole)
                .await?
                .is_break()
            {
                return Ok(());
            }
        }
        Ok(())
    }

    /// Calls `each` with every record of `topic` from `start` (an offset,
    /// or the first record in offset order whose timestamp is at least the
    /// given one) in offset order, until it breaks or the archive ends.
    ///
    /// # Errors
    /// As [`Archive::read_batches`].
    pub async fn read(
        &self,
        topic: &TopicName,
        start: Start,
        each: &mut dyn FnMut(ArchivedRecord) -> ControlFlow<()>,
    ) -> Result<(), BucketError> {
        self.read_with_holes(topic, start, each, &mut |_| {}).await
    }

    /// As [`Archive::read`], also calling `on_hole` with every declared
    /// hole stepped over (see [`Archive::read_batches_with_holes`]).
    ///
    /// # Errors
    /// As [`Archive::read_batches`].
    pub async fn read_with_holes(
        &self,
        topic: &TopicName,
        start: Start,
        each: &mut dyn FnMut(ArchivedRecord) -> ControlFlow<()>,
        on_hole: &mut dyn FnMut(HoleRange),
    ) -> Result<(), BucketError> {
        let mut started = false;
        let mut filter = |r: ArchivedRecord| {
            if !started {
                let reached = match start {
                    Start::Offset(o) => r.offset >= o,
                    Start::Timestamp(t) => r.record.timestamp_ms >= t,
                };
                if !reached {
                    return ControlFlow::Continue(());
                }
                started = true;
            }
            each(r)
        };
        self.read_batches_with_holes(
            topic,
            start,
            &mut |batch| deliver(batch, &mut filter),
            on_hole,
        )
        .await
    }

    /// Verifies one object completely: footer, index, every batch, the
    /// batches CRC, and that the batches rebuild the index and footer. Two
    /// reads: the tail, then the whole batches region streamed.
    /// `progress` is called with the bytes read so far.
    pub async fn verify(
        &self,
        object: &SegmentObjectInfo,
        progress: &mut dyn FnMut(u64),
    ) -> SegmentVerdict {
        let whole = |reason: String| Damage {
            first_offset: object.start_offset,
            end_offset: object.end_offset + 1,
            position: 0,
            reason,
        };
        let mut verdict = SegmentVerdict {
            object: object.clone(),
            footer: None,
            damage: Vec::new(),
            holes: Vec::new(),
            records_ok: 0,
        };
        let index = match self.open(object).await {
            Ok(index) => index,
            Err(e) => {
                verdict.damage.push(whole(e.to_string()));
                return verdict;
            }
        };
        verdict.footer = Some(*index.footer());
        verdict.holes = index.holes().to_vec();
        let mut verifier = SegmentVerifier::new(&index, reader_limits());
        let stream = self
            .bucket
            .get_range_stream(&object.key, 0..index.footer().batches_bytes)
            .await;
        let mut stream = match stream {
            Ok(s) => s,
            Err(e) => {
                verdict.damage.push(whole(e.to_string()));
                return verdict;
            }
        };
        let mut read = 0u64;
        while let Some(chunk) = stream.next().await {
            match chunk {
                Ok(chunk) => {
                    read += chunk.len() as u64;
                    verifier.push(&chunk);
                    progress(read);
                }
                Err(e) => {
                    verdict.damage.push(whole(e.to_string()));
                    return verdict;
                }
            }
        }
        let report = verifier.finish();
        verdict.damage = report.damage;
        verdict.records_ok = report.records_ok;
        verdict
    }
}

fn deliver(
    batch: &EncodedBatch,
    each: &mut dyn FnMut(ArchivedRecord) -> ControlFlow<()>,
) -> Result<ControlFlow<()>, ArchiveError> {
    let decoded = batch
        .decode(&reader_limits())
        .map_err(|source| ArchiveError::Batch {
            // Positions are not tracked past the splitter; the offset names it.
            position: 0,
            offset: batch.base_offset(),
            source,
        })?;
    for (i, record) in decoded.records.into_iter().enumerate() {
        let offset = batch.base_offset() + i as u64;
        if each(ArchivedRecord { offset, record }).is_break() {
            return Ok(ControlFlow::Break(()));
        }
    }
    Ok(ControlFlow::Continue(()))
}
