//! Tests of the ingest stream's acknowledgement path.

use super::*;
use broker_core::wal::{SyncMode, WalConfig};
use tributary_proto::batch::{Record, RecordBatch};

fn batch(base: u64) -> tributary_proto::batch::EncodedBatch {
    let record = Record {
        timestamp_ms: 1_700_000_000_000,
        key: None,
        headers: Vec::new(),
        value: Bytes::from(format!("value-{base}")),
    };
    RecordBatch::new(base, vec![record])
        .encode(&Limits::default())
        .expect("encodes")
}

/// Batches already durable behind the one being acknowledged are
/// answered by the same cumulative `Ack`; folding stops at the first
/// item that is not such a batch and hands it back, to be handled
/// next, in order. (A batch not durable yet is handed back the same
/// way: `PendingAppend::durable_now` answers `None`, tested in the WAL.)
#[tokio::test]
async fn acknowledgements_of_batches_already_durable_fold_into_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = WalConfig {
        sync_mode: SyncMode::OsCacheFlush,
        ..WalConfig::default()
    };
    let wal = Wal::open(dir.path().join("wal"), config).expect("open");
    let mut pending = Vec::new();
    for base in 0..4 {
        pending.push(wal.enqueue_at(batch(base)).await.expect("enqueue"));
    }
    tokio::time::timeout(std::time::Duration::from_secs(10), async {
        while wal.high_water_mark() < 4 {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    })
    .await
    .expect("all four durable");
    let mut pending = pending.into_iter().skip(1);
    let (tx, mut rx) = mpsc::channel(16);
    let issued = Instant::now();
    for item in [
        Out::Ack(pending.next().expect("batch 1"), issued),
        Out::Ack(pending.next().expect("batch 2"), issued),
        Out::Frame(Frame::Archived { archived_offset: 2 }),
        Out::Ack(pending.next().expect("batch 3"), issued),
    ] {
        assert!(tx.send(item).await.is_ok());
    }

    // Batch 0's Ack is being sent: 1 and 2 fold into it.
    let (next_offset, folded, next) = fold_durable(&mut rx, 1, Instant::now());
    assert_eq!(
        (next_offset, folded),
        (3, 2),
        "batches 1 and 2 folded into one Ack"
    );
    assert!(
        matches!(
            next,
            Some(Out::Frame(Frame::Archived { archived_offset: 2 }))
        ),
        "the frame between is handed back"
    );
    let (next_offset, folded, next) = fold_durable(&mut rx, 3, Instant::now());
    assert_eq!((next_offset, folded), (4, 1), "batch 3 folded");
    assert!(next.is_none(), "nothing left");
}
