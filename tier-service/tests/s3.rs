//! The tier service against a real S3 server (moto, started by
//! `tributary_test_support::moto` from the `moto_server` that
//! `TRIB_TEST_MOTO_SERVER` names). The tests need it and fail, naming the
//! tool, without it; `./scripts/test` and `.ci/run` install it:
//!
//! ```sh
//! python3 -m venv /tmp/tributary-moto && /tmp/tributary-moto/bin/pip install 'moto[server]==5.2.5'   # ~45 s
//! TRIB_TEST_MOTO_SERVER=/tmp/tributary-moto/bin/moto_server cargo test -p tier-service --test s3
//! ```
//!
//! The same code path serves s3s-fs (`cargo install s3s-fs@0.14.1 --locked
//! --features binary`): point a `TierConfig` at it with `path_style`.

mod common;

use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use broker_core::wal::{Wal, WalConfig};
use bytes::Bytes;
use common::{Harness, assert_contiguous, record_for};
use tributary_archive::reader::{Archive, SegmentObjectInfo, Start};
use tributary_archive::{Bucket, StoreConfig};
use tributary_proto::batch::{Codec, Record};
use tributary_proto::keys::{StorageKeys, TopicName};
use tributary_proto::limits::Limits;
use tributary_test_support::moto::Moto;
use tributary_tier::faults::Faults;
use tributary_tier::service;
use tributary_tier::upload::{UploadTuning, upload_segment, verify_object};

const BUCKET: &str = "tributary-test";

fn store_config(endpoint: &str) -> StoreConfig {
    common::s3_store(endpoint, BUCKET)
}

#[test]
fn tiering_and_reading_through_s3() {
    let moto = Moto::start();
    let endpoint = moto.endpoint();
    let h = Harness::with_retention(&["/s3/line"], false);
    h.runtime.block_on(async {
        common::create_bucket(&endpoint, BUCKET).await;
    });
    h.write(3000, 25);
    h.set_archive(Bucket::open(&store_config(&endpoint)).unwrap());
    let mut config = h.tier_config();
    config.store = store_config(&endpoint);
    config.upload.part_size_bytes = 5 * 1024 * 1024;
    config.upload.multipart_threshold_bytes = 5 * 1024 * 1024;
    config.upload.full_verify = true;
    let run = |config| {
        h.runtime
            .block_on(service::run(
                config,
                Faults::none(),
                true,
                std::future::pending(),
            ))
            .unwrap()
    };
    let report = run(config.clone());
    assert!(!report.has_errors(), "{report:?}");
    let topic = h.topics[0].clone();
    let end = h.wal(&topic).next_offset();
    let descriptors = h.descriptors(&topic);
    assert_contiguous(&topic, &descriptors, 0, end);

    let bucket = Bucket::open(&store_config(&endpoint)).unwrap();
    let archive = Archive::new(bucket.clone(), StorageKeys::default());
    let (objects, _) = h.runtime.block_on(archive.segments(&topic)).unwrap();
    assert_eq!(objects.len(), descriptors.len());
    for object in &objects {
        let verdict = h.runtime.block_on(archive.verify(object, &mut |_| {}));
        assert!(verdict.damage.is_empty(), "{verdict:?}");
    }
    let mut next = 0;
    h.runtime
        .block_on(archive.read(&topic, Start::Offset(0), &mut |r| {
            assert_eq!(r.record, record_for(topic.as_str(), r.offset));
            next = r.offset + 1;
            ControlFlow::Continue(())
        }))
        .unwrap();
    assert_eq!(next, end);

    // A committed object deleted from the bucket is uploaded again.
    let victim = descriptors[1].object_id.clone();
    h.runtime.block_on(bucket.delete(&victim)).unwrap();
    let report = run(config);
    assert_eq!(report.reconcile.reuploaded, vec![victim.clone()]);
    assert_eq!(
        h.runtime.block_on(bucket.head(&victim)).unwrap(),
        Some(descriptors[1].size)
    );
}

#[test]
fn multipart_upload_of_a_large_segment_through_s3() {
    let moto = Moto::start();
    let endpoint = moto.endpoint();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let wal = Wal::open(
        dir.path().join("wal"),
        WalConfig {
            segment_max_bytes: 64 * 1024 * 1024,
            limits: Limits::default(),
            ..WalConfig::default()
        },
    )
    .unwrap();
    // ~12 MiB of poorly compressible values.
    let mut state = 0x1234_5678u64;
    runtime.block_on(async {
        for i in 0..200u64 {
            let records = (0..4)
                .map(|j| {
                    let value: Vec<u8> = (0..16 * 1024)
                        .map(|_| {
                            state = state.wrapping_mul(6364136223846793005).wrapping_add(1);
                            (state >> 56) as u8
                        })
                        .collect();
                    Record {
                        timestamp_ms: 1_700_000_000_000 + (i * 4 + j) as i64,
                        key: None,
                        headers: Vec::new(),
                        value: Bytes::from(value),
                    }
                })
                .collect();
            wal.append(records, Codec::None).await.unwrap();
        }
        wal.roll().await.unwrap();
        common::create_bucket(&endpoint, BUCKET).await;
    });
    let segment = wal.sealed_segments().remove(0);
    assert!(segment.bytes > 12 * 1024 * 1024);
    let bucket = Bucket::open(&store_config(&endpoint)).unwrap();
    let topic = TopicName::new("/s3/big").unwrap();
    let key =
        StorageKeys::default().segment_object(&topic, segment.base_offset, segment.next_offset - 1);
    let tuning = UploadTuning {
        multipart_threshold_bytes: 5 * 1024 * 1024,
        part_size_bytes: 5 * 1024 * 1024,
        part_concurrency: 2,
        full_verify: true,
    };
    let started = Instant::now();
    let tail = runtime
        .block_on(upload_segment(
            &bucket,
            &key,
            &segment,
            &tuning,
            &Faults::none(),
        ))
        .unwrap();
    let elapsed = started.elapsed();
    runtime
        .block_on(verify_object(&bucket, &key, &tail, true))
        .unwrap();
    eprintln!(
        "multipart upload of {} bytes to moto in {elapsed:?} ({:.1} MiB/s)",
        tail.footer.object_bytes(),
        tail.footer.object_bytes() as f64 / elapsed.as_secs_f64() / 1048576.0
    );
    let archive = Archive::new(bucket, StorageKeys::default());
    let object = SegmentObjectInfo {
        key,
        start_offset: segment.base_offset,
        end_offset: segment.next_offset - 1,
        size: tail.footer.object_bytes(),
    };
    let verdict = runtime.block_on(archive.verify(&object, &mut |_| {}));
    assert!(verdict.damage.is_empty(), "{verdict:?}");
    assert_eq!(verdict.records_ok, 800);
}

/// Appends `count` records of 16 KiB of poorly compressible bytes to `wal`
/// (4 per batch) and rolls: one segment of about `count * 16` KiB.
fn write_large(runtime: &tokio::runtime::Runtime, wal: &Wal, count: u64, seed: u64) {
    let mut state = seed;
    runtime.block_on(async {
        for i in 0..count / 4 {
            let records = (0..4)
                .map(|j| {
                    let value: Vec<u8> = (0..16 * 1024)
                        .map(|_| {
                            state = state.wrapping_mul(6364136223846793005).wrapping_add(1);
                            (state >> 56) as u8
                        })
                        .collect();
                    Record {
                        timestamp_ms: 1_700_000_000_000 + (i * 4 + j) as i64,
                        key: None,
                        headers: Vec::new(),
                        value: Bytes::from(value),
                    }
                })
                .collect();
            wal.append(records, Codec::None).await.unwrap();
        }
        wal.roll().await.unwrap();
    });
}

/// S3 faults: a fault proxy between the tier service and moto answers
/// about a third of the requests with 500/503, connection resets (before
/// relaying, mid-body, after the server handled the request), cut
/// responses and stalls past the request timeout, on a seeded schedule
/// (`TRIB_TEST_FAULT_SEED` overrides the seed). One run of the service
/// must still tier everything (single PUTs and a 3-part multipart upload),
/// no descriptor may be committed while its object is not fully stored
/// (checked at every commit, directly against moto), and afterwards every
/// descriptor matches its object and no orphan object remains.
#[test]
fn uploads_through_a_faulty_s3_finish_and_commit_only_stored_objects() {
    use tributary_test_support::fault_proxy::{FAULT_KINDS, Fault, FaultProxy};
    let seed: u64 = std::env::var("TRIB_TEST_FAULT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x00c0_ffee);
    let moto = Moto::start();
    let endpoint = moto.endpoint();
    let upstream = moto.addr();
    let mut h = Harness::new(&["/s3/faulty"]);
    let big = h.add_topic(
        "/s3/big",
        WalConfig {
            segment_max_bytes: 64 * 1024 * 1024,
            retention_max_bytes: Some(0),
            ..WalConfig::default()
        },
    );
    h.runtime.block_on(async {
        common::create_bucket(&endpoint, BUCKET).await;
    });
    // Small segments (single PUTs) on one topic, one ~11 MiB segment
    // (multipart, 3 parts of 5 MiB) on the other.
    h.write(2500, 25);
    write_large(&h.runtime, &h.wal(&big), 700, seed);
    let ends: Vec<u64> = h.topics.iter().map(|t| h.wal(t).next_offset()).collect();
    let sealed: Vec<Vec<(u64, u64)>> = h
        .topics
        .iter()
        .map(|t| {
            h.wal(t)
                .sealed_segments()
                .iter()
                .map(|s| (s.base_offset, s.next_offset))
                .collect()
        })
        .collect();
    assert!(sealed[0].len() >= 6, "{:?}", sealed[0]);
    // At least one segment over 5 MiB (320 records of 16 KiB): multipart.
    assert!(
        sealed[1].iter().any(|(b, n)| n - b >= 320),
        "{:?}",
        sealed[1]
    );

    let stall = Duration::from_millis(2500);
    let proxy = h
        .runtime
        .block_on(FaultProxy::start(upstream, seed, 35, stall));
    let direct = Bucket::open(&store_config(&endpoint)).unwrap();
    *h.commits.bucket.lock().unwrap() = Some(direct.clone());
    h.set_archive(direct.clone());

    let mut config = h.tier_config();
    config.store = StoreConfig {
        // A 1.5 s request timeout makes stalls fail fast; two retries
        // inside object_store, the rest is the tier service's backoff.
        request_timeout_ms: Some(1500),
        max_retries: Some(2),
        ..store_config(&format!("http://{}", proxy.addr))
    };
    config.upload.part_size_bytes = 5 * 1024 * 1024;
    config.upload.multipart_threshold_bytes = 5 * 1024 * 1024;
    config.upload.part_concurrency = 2;
    config.upload.full_verify = true;
    config.retry.attempts_max = 10;
    config.retry.min_delay_ms = 20;
    config.retry.max_delay_ms = 500;
    // Whatever the schedule: a part upload reset in the middle of its
    // body, and a completed multipart upload whose answer is lost (the
    // retried complete finds no upload: the object must be checked again,
    // not uploaded from scratch or given up).
    proxy.force("partNumber=2", Fault::ResetMidBody);
    proxy.force(".seg?uploadId=", Fault::ResetAfterServer);
    proxy.arm();
    let started = Instant::now();
    let report = h
        .runtime
        .block_on(service::run(
            config,
            Faults::none(),
            true,
            std::future::pending(),
        ))
        .unwrap();
    let elapsed = started.elapsed();
    proxy.disarm();
    let log = proxy.log();
    let faults: Vec<Fault> = log
        .iter()
        .map(|s| s.fault)
        .filter(|f| *f != Fault::Pass)
        .collect();
    eprintln!(
        "seed {seed:#x}: {} requests, {} faults, in {elapsed:?}",
        log.len(),
        faults.len()
    );
    for seen in log.iter().filter(|s| s.fault != Fault::Pass) {
        eprintln!("  #{} {:?} {}", seen.n, seen.fault, seen.request);
    }
    assert!(
        !report.has_errors(),
        "seed {seed:#x}: one run must finish despite the faults: {report:?}"
    );
    for kind in FAULT_KINDS {
        assert!(
            faults.contains(&kind),
            "seed {seed:#x}: {kind:?} never injected ({} faults)",
            faults.len()
        );
    }
    assert!(
        log.iter()
            .any(|s| s.fault == Fault::ResetMidBody && s.request.contains("partNumber=2")),
        "seed {seed:#x}: no fault hit a multipart part"
    );
    assert!(
        log.iter().any(|s| s.fault == Fault::ResetAfterServer
            && s.request.starts_with("POST ")
            && s.request.contains("uploadId=")),
        "seed {seed:#x}: no completed multipart upload lost its answer"
    );
    // Nothing was committed for an object not fully stored.
    assert_eq!(
        h.commits.violations.lock().unwrap().clone(),
        Vec::<String>::new()
    );
    assert_eq!(h.violations(), Vec::<String>::new());
    let total_segments: usize = sealed.iter().map(Vec::len).sum();
    assert!(h.commits.checked.load(std::sync::atomic::Ordering::Relaxed) >= total_segments as u64);

    // Afterwards: every descriptor matches its object, exactly the sealed
    // ranges are committed, no orphan object, every record reads back.
    let archive = Archive::new(direct.clone(), StorageKeys::default());
    for ((topic, end), sealed) in h.topics.iter().zip(&ends).zip(&sealed) {
        let descriptors = h.descriptors(topic);
        assert_contiguous(topic, &descriptors, 0, *end);
        let ranges: Vec<(u64, u64)> = descriptors
            .iter()
            .map(|d| (d.start_offset, d.next_offset()))
            .collect();
        assert_eq!(&ranges, sealed, "{topic}");
        let (objects, foreign) = h.runtime.block_on(archive.segments(topic)).unwrap();
        assert!(foreign.is_empty(), "{foreign:?}");
        assert_eq!(
            objects.iter().map(|o| o.key.clone()).collect::<Vec<_>>(),
            descriptors
                .iter()
                .map(|d| d.object_id.clone())
                .collect::<Vec<_>>(),
            "{topic}: objects vs descriptors"
        );
        for (object, d) in objects.iter().zip(&descriptors) {
            assert_eq!(object.size, d.size);
            let verdict = h.runtime.block_on(archive.verify(object, &mut |_| {}));
            assert!(verdict.damage.is_empty(), "{verdict:?}");
            assert!(d.matches_footer(verdict.footer.as_ref().unwrap()), "{d:?}");
            assert_eq!(verdict.records_ok, d.record_count);
        }
        if topic.as_str() == "/s3/faulty" {
            let mut next = 0;
            h.runtime
                .block_on(archive.read(topic, Start::Offset(0), &mut |r| {
                    assert_eq!(r.offset, next);
                    assert_eq!(r.record, record_for(topic.as_str(), r.offset));
                    next += 1;
                    ControlFlow::Continue(())
                }))
                .unwrap();
            assert_eq!(next, *end);
        }
        // Local segments were trimmed only after their commit.
        assert!(h.wal(topic).sealed_segments().is_empty(), "{topic}");
    }
}

/// Create-if-absent on S3: object_store sends `If-None-Match: *`, so a
/// second create of a key is refused by the store itself; and the tiering
/// path never replaces a committed object whose bytes differ.
#[test]
fn uploads_through_s3_never_replace_a_committed_object() {
    let moto = Moto::start();
    let endpoint = moto.endpoint();
    let h = Harness::with_retention(&["/s3/create"], false);
    h.runtime.block_on(async {
        common::create_bucket(&endpoint, BUCKET).await;
    });
    let bucket = Bucket::open(&store_config(&endpoint)).unwrap();
    h.runtime.block_on(async {
        bucket
            .put("probe/key", Bytes::from_static(b"first").into(), true)
            .await
            .unwrap();
        let second = bucket
            .put("probe/key", Bytes::from_static(b"second").into(), true)
            .await;
        assert!(
            matches!(
                &second,
                Err(tributary_archive::BucketError::Store {
                    source: object_store::Error::AlreadyExists { .. }
                        | object_store::Error::Precondition { .. },
                    ..
                })
            ),
            "S3 create-if-absent: {second:?}"
        );
        let (bytes, size) = bucket.get_suffix("probe/key", 5).await.unwrap();
        assert_eq!((bytes.as_ref(), size), (&b"first"[..], 5));
    });

    h.write(300, 25);
    h.set_archive(bucket.clone());
    let mut config = h.tier_config();
    config.store = store_config(&endpoint);
    config.upload.part_size_bytes = 5 * 1024 * 1024;
    config.upload.multipart_threshold_bytes = 5 * 1024 * 1024;
    let report = h
        .runtime
        .block_on(service::run(
            config.clone(),
            Faults::none(),
            true,
            std::future::pending(),
        ))
        .unwrap();
    assert!(!report.has_errors(), "{report:?}");
    let topic = h.topics[0].clone();
    let descriptors = h.descriptors(&topic);
    let first = descriptors[0].clone();
    // Other bytes at the committed key (another writer's).
    let other = Bytes::from(vec![7u8; usize::try_from(first.size).unwrap()]);
    h.runtime
        .block_on(bucket.put(&first.object_id, other.clone().into(), false))
        .unwrap();
    let tiering = service::build(&config, Faults::none()).unwrap();
    let dir = h
        .data_dir
        .join("topics")
        .join(topic.namespace())
        .join(topic.topic());
    let sealed = broker_core::wal::list_sealed_segments(&dir).unwrap();
    let segment = sealed
        .iter()
        .find(|s| s.base_offset == first.start_offset)
        .unwrap();
    let mut pass = tributary_tier::tiering::PassReport::default();
    let result = h
        .runtime
        .block_on(tiering.tier_segment(&topic, segment, &mut pass));
    assert!(
        matches!(
            &result,
            Err(tributary_tier::TierError::ObjectConflict { .. })
        ),
        "{result:?}"
    );
    let (stored, size) = h
        .runtime
        .block_on(bucket.get_suffix(&first.object_id, 16))
        .unwrap();
    assert_eq!(size, first.size);
    assert_eq!(stored.as_ref(), &other[other.len() - 16..], "replaced");
}
