//! Issue 15, defect 1, as the fault tests observed it: 16 damaged bytes 1 MB
//! into a 5 MB active `fsync_batch` segment, default limits. Recovery used
//! to take the damage for a torn write (its window was 16 MiB), cut about
//! 4 MB of fsynced, acknowledged records and hand their offsets to new
//! records. Only the public WAL API is used, so the same file runs against
//! older commits to show the "before".

use std::time::Duration;

use bytes::Bytes;
use tributary_proto::batch::{Codec, Record};

use broker_core::wal::{SyncMode, Wal, WalConfig};

const RECORDS_PER_BATCH: usize = 100;
const BATCHES: usize = 560;

fn record(offset: usize) -> Record {
    Record {
        timestamp_ms: 1_700_000_000_000,
        key: None,
        headers: Vec::new(),
        value: Bytes::from(format!("{offset:08}-{}", "x".repeat(80))),
    }
}

#[test]
fn sixteen_damaged_bytes_1_mb_into_a_5_mb_active_segment_lose_no_acknowledged_record() {
    let dir = tempfile::tempdir().unwrap();
    let config = WalConfig {
        sync_mode: SyncMode::FsyncBatch,
        segment_max_bytes: 64 * 1024 * 1024,
        flush_interval: Duration::ZERO,
        ..WalConfig::default()
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let total = RECORDS_PER_BATCH * BATCHES;
    runtime.block_on(async {
        let wal = Wal::open(dir.path(), config.clone()).unwrap();
        for b in 0..BATCHES {
            let records = (0..RECORDS_PER_BATCH)
                .map(|i| record(b * RECORDS_PER_BATCH + i))
                .collect();
            wal.append(records, Codec::None).await.unwrap();
        }
        wal.close().await.unwrap();
    });
    let segment = dir.path().join(format!("{:020}.log", 0));
    let mut bytes = std::fs::read(&segment).unwrap();
    let len = bytes.len();
    assert!(len > 5_000_000, "a 5 MB active segment: {len}");
    for byte in &mut bytes[1_000_000..1_000_016] {
        *byte ^= 0x5a;
    }
    std::fs::write(&segment, &bytes).unwrap();

    let wal = Wal::open(dir.path(), config).unwrap();
    let report = wal.recovery_report().clone();
    println!("recovery report: {report:?}");
    println!(
        "high-water mark after recovery: {} (records acknowledged: {total})",
        wal.high_water_mark()
    );
    let next = runtime
        .block_on(wal.append(vec![record(total)], Codec::None))
        .unwrap()
        .base_offset;
    println!("offset given to the next record: {next}");
    assert!(
        std::fs::metadata(&segment).unwrap().len() as usize > len,
        "the damaged bytes are kept and the new batch goes after them"
    );
    assert!(report.truncated.is_none(), "nothing cut: {report:?}");
    assert_eq!(
        next, total as u64,
        "no acknowledged offset is handed out again"
    );
    // Every record outside the damaged batch reads back with its own bytes.
    let mut from = 0u64;
    let mut intact = 0usize;
    while from < total as u64 {
        match wal.read(from, 1 << 20) {
            Ok(batches) => {
                for batch in batches {
                    let decoded = batch.decode(&wal.config().limits).unwrap();
                    for (i, r) in decoded.records.iter().enumerate() {
                        let offset = decoded.base_offset + i as u64;
                        if offset >= from && offset < total as u64 {
                            assert!(r.value.starts_with(format!("{offset:08}-").as_bytes()));
                            intact += 1;
                        }
                    }
                    from = batch.next_offset();
                }
            }
            Err(e) => {
                println!("unreadable: {e}");
                from += RECORDS_PER_BATCH as u64;
            }
        }
    }
    assert_eq!(intact, total - RECORDS_PER_BATCH, "only the damaged batch");
}
