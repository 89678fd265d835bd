//! The tier service against a real S3 server (moto), behind an environment
//! variable so CI does not depend on it:
//!
//! ```sh
//! python3 -m venv /tmp/moto-venv && /tmp/moto-venv/bin/pip install 'moto[server]'   # ~45 s
//! TRIB_TEST_MOTO_SERVER=/tmp/moto-venv/bin/moto_server cargo test -p tier-service --test s3
//! ```
//!
//! Without the variable the test passes at once, saying it was skipped.
//! The same code path serves s3s-fs (`cargo install s3s-fs@0.14.1 --locked
//! --features binary`): point a `TierConfig` at it with `path_style`.

mod common;

use std::net::TcpStream;
use std::ops::ControlFlow;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use broker_core::batch::{Codec, Record};
use broker_core::keys::{StorageKeys, TopicName};
use broker_core::limits::Limits;
use broker_core::wal::{Wal, WalConfig};
use bytes::Bytes;
use common::{Harness, assert_contiguous, record_for};
use tributary_tier::faults::Faults;
use tributary_tier::reader::{Archive, SegmentObjectInfo, Start};
use tributary_tier::service;
use tributary_tier::upload::{UploadTuning, upload_segment, verify_object};
use tributary_tier::{Bucket, StoreConfig};

const BUCKET: &str = "tributary-test";

struct Moto(Child);

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_moto(binary: &str) -> (Moto, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new(binary)
        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {binary}: {e}"));
    let moto = Moto(child);
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "moto_server did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    (moto, format!("http://127.0.0.1:{port}"))
}

fn store_config(endpoint: &str) -> StoreConfig {
    StoreConfig {
        url: Some(format!("s3://{BUCKET}")),
        endpoint: Some(endpoint.to_owned()),
        region: Some("us-east-1".into()),
        path_style: Some(true),
        allow_http: Some(true),
        access_key_id: Some("testing".into()),
        secret_access_key: Some("testing".into()),
        session_token: None,
    }
}

#[test]
fn tiering_and_reading_through_s3() {
    let Ok(binary) = std::env::var("TRIB_TEST_MOTO_SERVER") else {
        eprintln!("skipped: set TRIB_TEST_MOTO_SERVER to a moto_server binary to run");
        return;
    };
    let (_moto, endpoint) = start_moto(&binary);
    let h = Harness::with_retention(&["/s3/line"], false);
    h.runtime.block_on(async {
        tributary_tier::install_crypto_provider();
        let status = reqwest::Client::new()
            .put(format!("{endpoint}/{BUCKET}"))
            .send()
            .await
            .unwrap()
            .status();
        assert!(status.is_success(), "create bucket: {status}");
    });
    h.write(3000, 25);
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
    let Ok(binary) = std::env::var("TRIB_TEST_MOTO_SERVER") else {
        eprintln!("skipped: set TRIB_TEST_MOTO_SERVER to a moto_server binary to run");
        return;
    };
    let (_moto, endpoint) = start_moto(&binary);
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
        tributary_tier::install_crypto_provider();
        let status = reqwest::Client::new()
            .put(format!("{endpoint}/{BUCKET}"))
            .send()
            .await
            .unwrap()
            .status();
        assert!(status.is_success());
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
