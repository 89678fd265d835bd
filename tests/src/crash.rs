//! What the WAL crash test's child writes, so the parent can check every
//! acknowledged record byte for byte.

use broker_core::wal::{SyncMode, WalConfig};
use bytes::Bytes;
use tributary_proto::Limits;
use tributary_proto::batch::Record;

/// The WAL directory of topic `topic` under the crash test's `dir`.
pub fn topic_dir(dir: impl AsRef<std::path::Path>, topic: u64) -> std::path::PathBuf {
    dir.as_ref().join(format!("t{topic}"))
}

/// WAL settings for the crash test: small segments (64 KiB) so that rolls and
/// seals happen while the child is being killed.
pub fn crash_wal_config(mode: SyncMode) -> WalConfig {
    WalConfig {
        sync_mode: mode,
        segment_max_bytes: 64 * 1024,
        index_interval_bytes: 1024,
        limits: Limits {
            max_record_bytes: 4096,
            max_batch_bytes: 16 * 1024,
        },
        ..WalConfig::default()
    }
}

/// The records of append `seq` of `producer` in `generation`: 1 to 4 records
/// whose values are unique and derivable from their coordinates.
pub fn records_for(generation: u64, producer: u64, seq: u64) -> Vec<Record> {
    let count = (seq % 4 + 1) as usize;
    (0..count)
        .map(|j| Record {
            timestamp_ms: 1_700_000_000_000 + seq as i64,
            key: Some(Bytes::from(format!("p{producer}"))),
            headers: vec![("gen".into(), Bytes::from(generation.to_string()))],
            value: Bytes::from(value_for(generation, producer, seq, j)),
        })
        .collect()
}

/// The value of record `j` of append `seq`: unique across the whole test,
/// with a length that varies between 20 and about 400 bytes.
pub fn value_for(generation: u64, producer: u64, seq: u64, j: usize) -> String {
    let id = format!("g{generation}-p{producer}-s{seq}-r{j}");
    let pad = ((seq * 31 + j as u64 * 7) % 380) as usize;
    format!("{id}:{}", "x".repeat(pad))
}
