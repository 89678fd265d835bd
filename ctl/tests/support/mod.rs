//! Shared by the archive CLI tests: a local bucket built by the tier
//! service's upload path from real WAL segments, and running `tribctl`.
#![allow(dead_code, clippy::too_many_arguments)]

use std::path::Path;
use std::process::{Command, Output};

use broker_core::wal::{Wal, WalConfig};
use tributary_archive::Bucket;
use tributary_proto::batch::{Codec, Record};
use tributary_proto::keys::{StorageKeys, TopicName};
use tributary_proto::limits::Limits;
use tributary_tier::faults::Faults;
use tributary_tier::upload::{UploadTuning, upload_segment};

/// Writes `count` records (`record(offset)`) into a WAL with small segments, seals them all,
/// uploads every segment into `bucket`, returns (key, start, end) per
/// object.
pub fn build_bucket(
    dir: &Path,
    bucket: &Path,
    topic: &str,
    count: u64,
    record: fn(u64) -> Record,
) -> Vec<(String, u64, u64)> {
    build_bucket_with(dir, bucket, topic, count, &record, 20, 64 * 1024, None)
}

/// [`build_bucket`] with batches of `per_batch` records, each compressed
/// with `codec` (`None`: zstd every other batch), and segments of
/// `segment_max_bytes`.
pub fn build_bucket_with(
    dir: &Path,
    bucket: &Path,
    topic: &str,
    count: u64,
    record: &dyn Fn(u64) -> Record,
    per_batch: u64,
    segment_max_bytes: u64,
    codec: Option<Codec>,
) -> Vec<(String, u64, u64)> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let topic = TopicName::new(topic).unwrap();
    let config = WalConfig {
        limits: Limits {
            max_record_bytes: 16 * 1024,
            max_batch_bytes: 64 * 1024,
        },
        segment_max_bytes,
        max_pending_bytes: 64 * 1024 * 1024,
        ..WalConfig::default()
    };
    let wal = Wal::open(dir.join("wal"), config).unwrap();
    runtime.block_on(async {
        let mut offset = 0;
        while offset < count {
            let n = (count - offset).min(per_batch);
            let records = (offset..offset + n).map(record).collect();
            let codec = codec.unwrap_or(if (offset / per_batch).is_multiple_of(2) {
                Codec::Zstd
            } else {
                Codec::None
            });
            wal.append(records, codec).await.unwrap();
            offset += n;
        }
        wal.roll().await.unwrap();
    });
    let bucket = Bucket::local(bucket.to_path_buf()).unwrap();
    let keys = StorageKeys::default();
    let mut out = Vec::new();
    for segment in wal.sealed_segments() {
        let key = keys.segment_object(&topic, segment.base_offset, segment.next_offset - 1);
        runtime
            .block_on(upload_segment(
                &bucket,
                &key,
                &segment,
                &UploadTuning::default(),
                &Faults::none(),
            ))
            .unwrap();
        out.push((key, segment.base_offset, segment.next_offset - 1));
    }
    out
}

/// Runs `tribctl archive --bucket BUCKET ARGS...`.
pub fn tribctl(bucket: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tribctl"))
        .arg("archive")
        .arg("--bucket")
        .arg(bucket)
        .args(args)
        .env_remove("TRIB_ARCHIVE_BUCKET")
        .output()
        .unwrap()
}
