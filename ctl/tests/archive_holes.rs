//! The real `tribctl archive verify` and `cat` on an object that carries
//! declared holes (issue 15): the holes are listed as such and the exit
//! status is 0; the same gap without its declaration is damage (exit 1).

use std::path::Path;

use broker_core::wal::{Wal, WalConfig};
use bytes::Bytes;
use tributary_archive::Bucket;
use tributary_proto::archive::{ArchiveIndex, Footer, HoleRange};
use tributary_proto::batch::{Codec, Record};
use tributary_proto::keys::{StorageKeys, TopicName};
use tributary_tier::faults::Faults;
use tributary_tier::upload::{UploadTuning, upload_segment_with_holes};

mod support;
use support::tribctl;

const TOPIC: &str = "/plant/holes";

fn record(offset: u64) -> Record {
    Record {
        timestamp_ms: 1_750_000_000_000 + offset as i64,
        key: None,
        headers: Vec::new(),
        value: Bytes::from(format!("reading {offset}")),
    }
}

/// One sealed segment 0..25: records 0..10, hole 10..15, records 15..20,
/// hole 20..25; archived with both holes. Returns the object's key.
fn build(dir: &Path, bucket: &Path) -> String {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let topic = TopicName::new(TOPIC).unwrap();
    let wal = Wal::open(dir.join("wal"), WalConfig::default()).unwrap();
    runtime.block_on(async {
        wal.append((0..10).map(record).collect(), Codec::None)
            .await
            .unwrap();
        wal.skip_to(15).await.unwrap();
        wal.append((15..20).map(record).collect(), Codec::Zstd)
            .await
            .unwrap();
        wal.skip_to(25).await.unwrap();
        wal.roll().await.unwrap();
    });
    let segment = wal.sealed_segments().remove(0);
    assert_eq!((segment.base_offset, segment.next_offset), (0, 25));
    let key = StorageKeys::default().segment_object(&topic, 0, 24);
    let holes = [
        HoleRange {
            first_offset: 10,
            end_offset: 15,
        },
        HoleRange {
            first_offset: 20,
            end_offset: 25,
        },
    ];
    runtime
        .block_on(upload_segment_with_holes(
            &Bucket::local(bucket.to_path_buf()).unwrap(),
            &key,
            &segment,
            &holes,
            &UploadTuning::default(),
            &Faults::none(),
        ))
        .unwrap();
    key
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn verify_lists_declared_holes_and_exits_0_an_undeclared_gap_is_damage() {
    let dir = tempfile::tempdir().unwrap();
    let bucket = dir.path().join("bucket");
    let key = build(dir.path(), &bucket);

    let out = tribctl(&bucket, &["verify", TOPIC]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    assert!(
        stdout.contains("1 segments, 15 records verified"),
        "{stdout}"
    );
    assert!(stdout.contains(": OK"), "{stdout}");
    assert!(stdout.contains("declared hole 10..15"), "{stdout}");
    assert!(stdout.contains("declared hole 20..25"), "{stdout}");

    let out = tribctl(&bucket, &["cat", TOPIC, "--from-offset", "0"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let offsets: Vec<u64> = text(&out.stdout)
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["offset"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(offsets, (0..10).chain(15..20).collect::<Vec<_>>());
    let stderr = text(&out.stderr);
    assert!(stderr.contains("declared hole 10..15"), "{stderr}");
    assert!(stderr.contains("declared hole 20..25"), "{stderr}");

    // The same batches as a version-1 object that declares no hole: the
    // gap is damage.
    let path = bucket.join(&key);
    let object = std::fs::read(&path).unwrap();
    let footer = Footer::decode_from_tail(&object).unwrap();
    ArchiveIndex::decode_from_tail(&footer, &object).unwrap();
    let index_end = (footer.batches_bytes + footer.index_bytes()) as usize;
    let mut forged = object[..index_end].to_vec();
    // The trailing hole goes too: the object then ends at offset 20.
    let v1 = Footer {
        next_offset: 20,
        hole_count: 0,
        hole_offsets: 0,
        holes_crc32c: 0,
        ..footer
    };
    forged.extend_from_slice(&v1.encode());
    std::fs::remove_file(&path).unwrap();
    let forged_key = StorageKeys::default().segment_object(&TopicName::new(TOPIC).unwrap(), 0, 19);
    std::fs::write(bucket.join(&forged_key), &forged).unwrap();
    let out = tribctl(&bucket, &["verify", TOPIC]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("DAMAGED"), "{stdout}");
    assert!(stdout.contains("offsets 10.."), "{stdout}");
    assert!(
        stdout.contains("no declared hole covers the gap"),
        "{stdout}"
    );
    assert!(!stdout.contains("declared hole 10..15"), "{stdout}");
}
