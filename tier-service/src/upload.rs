//! Steps 2 and 3 of the commit order: upload a sealed segment as an archive
//! object, streamed from the file, and verify what the store holds.
//!
//! The batches region is the segment file, read in chunks and passed both
//! to an [`ArchiveBuilder`] (which checks every batch on the way) and to
//! the store; the builder's index and footer follow. Memory stays at about
//! `part_size_bytes * (part_concurrency + 1)` for multipart uploads and
//! `multipart_threshold_bytes` for single PUTs, whatever the segment size.

use broker_core::wal::SealedSegment;
use bytes::Bytes;
use futures::StreamExt;
use object_store::PutPayload;
use tokio::task::{JoinError, JoinSet};
use tributary_proto::archive::{ArchiveBuilder, ArchiveTail, Footer, HoleRange, reader_limits};
use tributary_proto::replication::hole::HoleRecord;

use crate::error::TierError;
use crate::faults::Faults;
use tributary_archive::bucket::Bucket;

/// Upload settings (`[upload]` in the configuration).
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct UploadTuning {
    /// Objects of at least this size go up as multipart uploads. Default
    /// 16 MiB.
    pub multipart_threshold_bytes: u64,
    /// Multipart part size. Default 8 MiB (S3 needs at least 5 MiB).
    pub part_size_bytes: usize,
    /// Parts in flight at once. Default 4.
    pub part_concurrency: usize,
    /// Also read the whole batches region back and check its CRC, not only
    /// size, footer and index. Default false.
    pub full_verify: bool,
}

impl Default for UploadTuning {
    fn default() -> Self {
        UploadTuning {
            multipart_threshold_bytes: 16 * 1024 * 1024,
            part_size_bytes: 8 * 1024 * 1024,
            part_concurrency: 4,
            full_verify: false,
        }
    }
}

/// Bytes read from a segment file per read call.
const READ_CHUNK_BYTES: usize = 1024 * 1024;

/// Reads a sealed segment file in chunks, exactly `segment.bytes` long:
/// one positioned read per chunk on the blocking pool (tokio's file type
/// would split a part into 2 MiB operations, each with a copy).
struct SegmentFile {
    file: std::sync::Arc<std::fs::File>,
    path: std::path::PathBuf,
    position: u64,
    remaining: u64,
}

impl SegmentFile {
    async fn open(segment: &SealedSegment) -> Result<SegmentFile, TierError> {
        let path = segment.log_path.clone();
        let file = std::fs::File::open(&path).map_err(TierError::io("open", &path))?;
        let len = file.metadata().map_err(TierError::io("stat", &path))?.len();
        if len != segment.bytes {
            return Err(TierError::Inconsistent {
                topic: path.display().to_string(),
                reason: format!(
                    "sealed segment file is {len} bytes, its seal index says {}",
                    segment.bytes
                ),
            });
        }
        Ok(SegmentFile {
            file: std::sync::Arc::new(file),
            path,
            position: 0,
            remaining: segment.bytes,
        })
    }

    /// The next chunk of at most `max` bytes; empty at the end.
    async fn next(&mut self, max: usize) -> Result<Bytes, TierError> {
        use std::os::unix::fs::FileExt;
        let want = (max as u64).min(self.remaining) as usize;
        if want == 0 {
            return Ok(Bytes::new());
        }
        let file = self.file.clone();
        let position = self.position;
        let buf = tokio::task::spawn_blocking(move || {
            let mut buf = vec![0u8; want];
            file.read_exact_at(&mut buf, position).map(|()| buf)
        })
        .await
        .map_err(|e| TierError::io("read", &self.path)(std::io::Error::other(e)))?
        .map_err(TierError::io("read", &self.path))?;
        self.position += want as u64;
        self.remaining -= want as u64;
        Ok(Bytes::from(buf))
    }
}

fn segment_error(
    segment: &SealedSegment,
) -> impl FnOnce(tributary_proto::archive::ArchiveError) -> TierError + '_ {
    move |source| TierError::archive("segment", segment.log_path.display().to_string(), source)
}

/// The declared holes of a topic (as the broker lists them from Raft)
/// that share an offset with `segment`, ascending: the ones its archive
/// object must carry. A hole that only partly lies in the segment is
/// included, and the builder refuses it (it is not a gap of this segment).
pub fn holes_in_segment(holes: &[HoleRecord], segment: &SealedSegment) -> Vec<HoleRange> {
    let mut out: Vec<HoleRange> = holes
        .iter()
        .map(|h| HoleRange {
            first_offset: h.first_offset,
            end_offset: h.end_offset,
        })
        .filter(|h| h.overlaps(segment.base_offset, segment.next_offset))
        .collect();
    out.sort();
    out
}

fn builder_for(segment: &SealedSegment, holes: &[HoleRange]) -> Result<ArchiveBuilder, TierError> {
    ArchiveBuilder::new(segment.base_offset, segment.bytes, reader_limits())
        .and_then(|b| b.with_holes(holes))
        .map_err(segment_error(segment))
}

/// The index and footer the segment's object must end with, computed from
/// the local file without uploading (to judge an object already stored).
///
/// # Errors
/// I/O errors; [`BucketError::Archive`](tributary_archive::BucketError::Archive) if the segment is damaged.
pub async fn expected_tail(segment: &SealedSegment) -> Result<ArchiveTail, TierError> {
    expected_tail_with_holes(segment, &[]).await
}

/// As [`expected_tail`], for a segment whose gaps may be the declared
/// `holes` ([`holes_in_segment`]).
///
/// # Errors
/// As [`expected_tail`]; a gap that is not exactly declared holes is
/// damage.
pub async fn expected_tail_with_holes(
    segment: &SealedSegment,
    holes: &[HoleRange],
) -> Result<ArchiveTail, TierError> {
    let mut file = SegmentFile::open(segment).await?;
    let mut builder = builder_for(segment, holes)?;
    loop {
        let chunk = file.next(READ_CHUNK_BYTES).await?;
        if chunk.is_empty() {
            break;
        }
        builder.push(&chunk).map_err(segment_error(segment))?;
    }
    let tail = builder.finish().map_err(segment_error(segment))?;
    check_against_seal(segment, &tail.footer)?;
    Ok(tail)
}

/// The built footer must agree with the seal index.
fn check_against_seal(segment: &SealedSegment, footer: &Footer) -> Result<(), TierError> {
    if footer.next_offset != segment.next_offset {
        return Err(TierError::archive(
            "segment",
            segment.log_path.display().to_string(),
            tributary_proto::archive::ArchiveError::Mismatch {
                field: "next_offset (seal index vs batches)",
                expected: segment.next_offset,
                actual: footer.next_offset,
            },
        ));
    }
    Ok(())
}

/// Uploads `segment` as the archive object `key` (replacing any object
/// there) and returns the index and footer it ends with.
///
/// # Errors
/// I/O and store errors (retryable); [`BucketError::Archive`](tributary_archive::BucketError::Archive) if the local
/// segment is damaged (nothing is completed then: a multipart upload is
/// aborted, a single PUT never starts).
pub async fn upload_segment(
    bucket: &Bucket,
    key: &str,
    segment: &SealedSegment,
    tuning: &UploadTuning,
    faults: &Faults,
) -> Result<ArchiveTail, TierError> {
    upload_segment_with_holes(bucket, key, segment, &[], tuning, faults).await
}

/// As [`upload_segment`], for a segment whose gaps may be the declared
/// `holes` ([`holes_in_segment`]): the object carries them.
///
/// # Errors
/// As [`upload_segment`]; a gap that is not exactly declared holes is
/// damage.
pub async fn upload_segment_with_holes(
    bucket: &Bucket,
    key: &str,
    segment: &SealedSegment,
    holes: &[HoleRange],
    tuning: &UploadTuning,
    faults: &Faults,
) -> Result<ArchiveTail, TierError> {
    upload_segment_with_mode(bucket, key, segment, holes, tuning, faults, false).await
}

/// As [`upload_segment_with_holes`]; with `create`, only if no object is
/// at `key` (never replacing one): a single PUT is create-if-absent in the
/// store (`PutMode::Create`: atomic on a local directory and on S3, which
/// object_store sends as `If-None-Match: *`); a multipart upload (no
/// conditional complete in object_store) checks that the key is still
/// absent just before completing, and is aborted otherwise.
///
/// # Errors
/// As [`upload_segment_with_holes`]; with `create`, a store
/// `AlreadyExists` error when the key exists.
pub async fn upload_segment_with_mode(
    bucket: &Bucket,
    key: &str,
    segment: &SealedSegment,
    holes: &[HoleRange],
    tuning: &UploadTuning,
    faults: &Faults,
    create: bool,
) -> Result<ArchiveTail, TierError> {
    let mut file = SegmentFile::open(segment).await?;
    let mut builder = builder_for(segment, holes)?;
    if segment.bytes < tuning.multipart_threshold_bytes {
        let mut parts = Vec::new();
        loop {
            let chunk = file.next(READ_CHUNK_BYTES).await?;
            if chunk.is_empty() {
                break;
            }
            builder.push(&chunk).map_err(segment_error(segment))?;
            parts.push(chunk);
        }
        let tail = builder.finish().map_err(segment_error(segment))?;
        check_against_seal(segment, &tail.footer)?;
        parts.push(Bytes::from(tail.bytes.clone()));
        bucket
            .put(key, parts.into_iter().collect::<PutPayload>(), create)
            .await?;
        return Ok(tail);
    }
    let mut upload = bucket.put_multipart(key).await?;
    let part_size = tuning.part_size_bytes.max(1);
    let concurrency = tuning.part_concurrency.max(1);
    // Parts upload on their own tasks while the next part is read.
    let mut inflight: JoinSet<object_store::Result<()>> = JoinSet::new();
    let result = async {
        let mut parts_done = 0usize;
        let mut tail = None;
        while tail.is_none() {
            let chunk = file.next(part_size).await?;
            builder.push(&chunk).map_err(segment_error(segment))?;
            // The last part carries the index and footer: as many parts as
            // raw data would need, none of them tiny.
            let payload = if file.remaining == 0 {
                let built = builder.clone().finish().map_err(segment_error(segment))?;
                check_against_seal(segment, &built.footer)?;
                let payload = PutPayload::from_iter([chunk, Bytes::from(built.bytes.clone())]);
                tail = Some(built);
                payload
            } else {
                PutPayload::from(chunk)
            };
            while inflight.len() >= concurrency {
                if let Some(done) = inflight.join_next().await {
                    joined(done, key)?;
                    parts_done += 1;
                }
            }
            inflight.spawn(upload.put_part(payload));
            if parts_done == 0 && inflight.len() == 1 && tail.is_none() {
                // Let the first part reach the store before the fault point.
                if let Some(done) = inflight.join_next().await {
                    joined(done, key)?;
                    parts_done += 1;
                }
                faults.hit("mid_upload");
            }
        }
        while let Some(done) = inflight.join_next().await {
            joined(done, key)?;
        }
        if create && bucket.head(key).await?.is_some() {
            return Err(TierError::store("complete multipart", key)(
                object_store::Error::AlreadyExists {
                    path: key.to_owned(),
                    source: "an object appeared at the key during the upload".into(),
                },
            ));
        }
        upload.complete().await.map_err(|e| match e {
            // An earlier attempt of this request may have completed the
            // upload and lost the answer (object_store retries it): the
            // caller's retry checks what is stored.
            object_store::Error::NotFound { .. } => TierError::Verify {
                key: key.to_owned(),
                reason: format!(
                    "complete multipart: upload not found ({e}); the object is checked again"
                ),
            },
            e => TierError::store("complete multipart", key)(e),
        })?;
        Ok::<_, TierError>(tail)
    }
    .await;
    match result {
        Ok(Some(tail)) => Ok(tail),
        Ok(None) | Err(_) => {
            let err = match result {
                Err(err) => err,
                _ => TierError::Inconsistent {
                    topic: segment.log_path.display().to_string(),
                    reason: "empty segment".into(),
                },
            };
            inflight.abort_all();
            while inflight.join_next().await.is_some() {}
            if let Err(abort) = upload.abort().await {
                tracing::warn!(key, error = %abort, "aborting a failed multipart upload failed");
            }
            Err(err)
        }
    }
}

fn joined(done: Result<object_store::Result<()>, JoinError>, key: &str) -> Result<(), TierError> {
    done.map_err(|e| {
        TierError::store("upload part", key)(object_store::Error::Generic {
            store: "tier-service",
            source: Box::new(e),
        })
    })?
    .map_err(TierError::store("upload part", key))
}

/// Step 3: checks that the object at `key` is the one `tail` ends: its
/// size, and its last bytes (index and footer, which carry the batches
/// CRC) byte for byte; with `full`, also the batches region's CRC.
///
/// # Errors
/// [`TierError::Verify`] naming the difference; store errors.
pub async fn verify_object(
    bucket: &Bucket,
    key: &str,
    tail: &ArchiveTail,
    full: bool,
) -> Result<(), TierError> {
    let fail = |reason: String| TierError::Verify {
        key: key.to_owned(),
        reason,
    };
    let expected_size = tail.footer.object_bytes();
    let (stored_tail, size) = bucket.get_suffix(key, tail.bytes.len() as u64).await?;
    if size != expected_size {
        return Err(fail(format!(
            "object is {size} bytes, expected {expected_size}"
        )));
    }
    if stored_tail.as_ref() != tail.bytes.as_slice() {
        let reason = match Footer::decode_from_tail(&stored_tail) {
            Ok(footer) if footer == tail.footer => "index differs".to_owned(),
            Ok(_) => "footer differs".to_owned(),
            Err(e) => format!("footer unreadable: {e}"),
        };
        return Err(fail(reason));
    }
    if full {
        let mut stream = bucket
            .get_range_stream(key, 0..tail.footer.batches_bytes)
            .await?;
        let mut crc = 0u32;
        let mut seen = 0u64;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk?;
            crc = crc32c::crc32c_append(crc, &chunk);
            seen += chunk.len() as u64;
        }
        if seen != tail.footer.batches_bytes || crc != tail.footer.batches_crc32c {
            return Err(fail(format!(
                "batches region: {seen} bytes with crc {crc:#010x}, expected {} with {:#010x}",
                tail.footer.batches_bytes, tail.footer.batches_crc32c
            )));
        }
    }
    Ok(())
}
