//! Upload throughput of the tier service's streamed segment upload
//! (`upload_segment`: read, check every batch, multipart or single PUT,
//! index and footer) against raw `object_store` puts of the same sizes to
//! the same store in the same run; and seal-to-commit latency of a pass.
//!
//! ```sh
//! cargo bench -p tier-service --bench upload_throughput
//! # against moto as well:
//! TRIB_TEST_MOTO_SERVER=/tmp/moto-venv/bin/moto_server cargo bench -p tier-service --bench upload_throughput
//! ```

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use broker_core::wal::{SealedSegment, Wal, WalConfig};
use bytes::Bytes;
use object_store::{ObjectStoreExt, PutPayload, WriteMultipart, path::Path as ObjectPath};
use tributary_archive::{Bucket, StoreConfig};
use tributary_proto::batch::{Codec, Record};
use tributary_proto::keys::{StorageKeys, TopicName};
use tributary_tier::faults::Faults;
use tributary_tier::service;
use tributary_tier::upload::{UploadTuning, upload_segment};

const SEGMENT_BYTES: u64 = 32 * 1024 * 1024;
const SEGMENTS: usize = 4;

fn make_segments(runtime: &tokio::runtime::Runtime, dir: &std::path::Path) -> Vec<SealedSegment> {
    let wal = Wal::open(
        dir.join("wal"),
        WalConfig {
            segment_max_bytes: SEGMENT_BYTES,
            sync_mode: broker_core::wal::SyncMode::OsCacheFlush,
            ..WalConfig::default()
        },
    )
    .unwrap();
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    runtime.block_on(async {
        while wal.sealed_segments().len() < SEGMENTS {
            let records = (0..32)
                .map(|_| {
                    let value: Vec<u8> = (0..2048)
                        .map(|_| {
                            state ^= state << 13;
                            state ^= state >> 7;
                            state ^= state << 17;
                            state as u8
                        })
                        .collect();
                    Record {
                        timestamp_ms: 1_700_000_000_000,
                        key: None,
                        headers: Vec::new(),
                        value: Bytes::from(value),
                    }
                })
                .collect();
            wal.append(records, Codec::None).await.unwrap();
        }
    });
    wal.sealed_segments().into_iter().take(SEGMENTS).collect()
}

fn compare(
    name: &str,
    runtime: &tokio::runtime::Runtime,
    bucket: &Bucket,
    segments: &[SealedSegment],
    tuning: &UploadTuning,
) {
    let topic = TopicName::new("/bench/upload").unwrap();
    let keys = StorageKeys::default();
    // Raw: the same bytes (read into memory first, not timed), same part
    // size and concurrency.
    let files: Vec<Bytes> = segments
        .iter()
        .map(|s| Bytes::from(std::fs::read(&s.log_path).unwrap()))
        .collect();
    let mut raw = Duration::ZERO;
    let mut ours = Duration::ZERO;
    let mut bytes = 0u64;
    for round in 0..3 {
        for (i, (segment, data)) in segments.iter().zip(&files).enumerate() {
            let raw_key = format!("raw/{round}/{i}");
            let started = Instant::now();
            runtime.block_on(async {
                let store = bucket.store();
                let path = ObjectPath::parse(&raw_key).unwrap();
                if (data.len() as u64) < tuning.multipart_threshold_bytes {
                    store
                        .put(&path, PutPayload::from(data.clone()))
                        .await
                        .unwrap();
                } else {
                    let upload = store.put_multipart(&path).await.unwrap();
                    let mut w = WriteMultipart::new_with_chunk_size(upload, tuning.part_size_bytes);
                    for chunk in data.chunks(tuning.part_size_bytes) {
                        w.wait_for_capacity(tuning.part_concurrency).await.unwrap();
                        w.put(data.slice_ref(chunk));
                    }
                    w.finish().await.unwrap();
                }
            });
            raw += started.elapsed();
            let key = keys.segment_object(
                &topic,
                segment.base_offset + round * 1_000_000_000,
                segment.next_offset - 1 + round * 1_000_000_000,
            );
            let started = Instant::now();
            runtime
                .block_on(upload_segment(
                    bucket,
                    &key,
                    segment,
                    tuning,
                    &Faults::none(),
                ))
                .unwrap();
            ours += started.elapsed();
            bytes += data.len() as u64;
        }
    }
    let mib = bytes as f64 / 1048576.0;
    println!(
        "{name}: {:.0} MiB in {} uploads: raw object_store {:.1} MiB/s, upload_segment {:.1} MiB/s, ratio {:.2}",
        mib,
        3 * segments.len(),
        mib / raw.as_secs_f64(),
        mib / ours.as_secs_f64(),
        raw.as_secs_f64() / ours.as_secs_f64()
    );
}

/// The service running continuously (poll every 100 ms) while a writer
/// seals a 128 KiB segment per topic every 100 ms: ms from each seal to its
/// committed descriptor.
fn seal_to_commit() {
    let h = common::Harness::new(&["/bench/a", "/bench/b"]);
    let mut config = h.tier_config();
    config.poll_interval_ms = 100;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let service = h
        .runtime
        .spawn(service::run(config, Faults::none(), false, async move {
            let _ = stop_rx.await;
        }));
    for _ in 0..60 {
        h.write(150, 50);
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(1000));
    let _ = stop_tx.send(());
    let report = h.runtime.block_on(service).unwrap().unwrap();
    let mut ms: Vec<u64> = report
        .passes
        .iter()
        .flat_map(|p| p.seal_to_commit_ms.clone())
        .collect();
    ms.sort_unstable();
    let pct = |p: f64| ms[((ms.len() - 1) as f64 * p).round() as usize];
    println!(
        "seal to committed descriptor (service polling every 100 ms, a segment sealed per topic every ~100 ms, 2 topics, local store, fsync): {} segments, p50 {} ms, p99 {} ms, max {} ms",
        ms.len(),
        pct(0.5),
        pct(0.99),
        ms[ms.len() - 1]
    );
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let segments = make_segments(&runtime, dir.path());
    let tuning = UploadTuning {
        multipart_threshold_bytes: 16 * 1024 * 1024,
        part_size_bytes: 8 * 1024 * 1024,
        part_concurrency: 4,
        full_verify: false,
    };
    let local = Bucket::local(dir.path().join("bucket")).unwrap();
    compare(
        "local directory (fsync)",
        &runtime,
        &local,
        &segments,
        &tuning,
    );
    if let Ok(binary) = std::env::var("TRIB_TEST_MOTO_SERVER") {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut moto = std::process::Command::new(binary)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            std::thread::sleep(Duration::from_millis(50));
        }
        let endpoint = format!("http://127.0.0.1:{port}");
        tributary_archive::install_crypto_provider();
        runtime.block_on(async {
            reqwest::Client::new()
                .put(format!("{endpoint}/bench"))
                .send()
                .await
                .unwrap();
        });
        let bucket = Bucket::open(&StoreConfig {
            url: Some("s3://bench".into()),
            endpoint: Some(endpoint),
            region: Some("us-east-1".into()),
            path_style: Some(true),
            allow_http: Some(true),
            access_key_id: Some("testing".into()),
            secret_access_key: Some("testing".into()),
            session_token: None,
            ..StoreConfig::default()
        })
        .unwrap();
        compare("moto S3", &runtime, &bucket, &segments, &tuning);
        let _ = moto.kill();
        let _ = moto.wait();
    }
    seal_to_commit();
}
