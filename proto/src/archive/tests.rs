//! Tests of the archive format: layout pinned to FORMAT.md, lookups, and
//! every flipped byte detected.

use bytes::Bytes;
use proptest::prelude::*;

use super::*;
use crate::batch::EncodedBatch;
use crate::batch::{Codec, Record, RecordBatch};

/// Encodes `records_per_batch` into contiguous batches from `base`.
pub(super) fn segment(
    base: u64,
    batches: &[Vec<Record>],
    codec: Codec,
) -> (Vec<u8>, Vec<EncodedBatch>) {
    let limits = Limits::default();
    let mut offset = base;
    let mut bytes = Vec::new();
    let mut encoded = Vec::new();
    for records in batches {
        let batch = RecordBatch {
            base_offset: offset,
            codec,
            records: records.clone(),
        }
        .encode(&limits)
        .unwrap();
        offset = batch.next_offset();
        bytes.extend_from_slice(batch.as_bytes());
        encoded.push(batch);
    }
    (bytes, encoded)
}

pub(super) fn record(ts: i64, value: &[u8]) -> Record {
    Record {
        timestamp_ms: ts,
        key: Some(Bytes::from_static(b"k")),
        headers: vec![("h".into(), Bytes::from_static(b"v"))],
        value: Bytes::copy_from_slice(value),
    }
}

/// A segment of `n` single-record batches of about `value_len` bytes,
/// timestamps 1000, 1001, ...
fn simple_segment(base: u64, n: usize, value_len: usize) -> (Vec<u8>, Vec<EncodedBatch>) {
    let batches: Vec<Vec<Record>> = (0..n)
        .map(|i| vec![record(1000 + i as i64, &vec![b'x'; value_len])])
        .collect();
    segment(base, &batches, Codec::None)
}

fn build(base: u64, bytes: &[u8], chunk: usize) -> Result<(Vec<u8>, Footer), ArchiveError> {
    let mut builder = ArchiveBuilder::new(base, bytes.len() as u64, Limits::default())?;
    for piece in bytes.chunks(chunk.max(1)) {
        builder.push(piece)?;
    }
    let tail = builder.finish()?;
    let mut object = bytes.to_vec();
    object.extend_from_slice(&tail.bytes);
    Ok((object, tail.footer))
}

pub(super) fn open(object: &[u8]) -> Result<(Footer, ArchiveIndex), ArchiveError> {
    let footer = Footer::decode_from_tail(object)?;
    if footer.object_bytes() != object.len() as u64 {
        return Err(ArchiveError::ObjectSize {
            expected: footer.object_bytes(),
            actual: object.len() as u64,
        });
    }
    let index = ArchiveIndex::decode_from_tail(&footer, object)?;
    Ok((footer, index))
}

pub(super) fn verify(object: &[u8], chunk: usize) -> VerifyReport {
    let (footer, index) = open(object).unwrap();
    let mut verifier = SegmentVerifier::new(&index, reader_limits());
    for piece in object[..footer.batches_bytes as usize].chunks(chunk.max(1)) {
        verifier.push(piece);
    }
    verifier.finish()
}

fn split_all(object: &[u8], position: u64, base: u64) -> Vec<EncodedBatch> {
    let footer = Footer::decode_from_tail(object).unwrap();
    let mut splitter = BatchSplitter::new(position, base, reader_limits());
    let batches = splitter
        .push(&object[position as usize..footer.batches_bytes as usize])
        .unwrap();
    splitter.finish().unwrap();
    batches
}

#[test]
fn footer_layout_matches_format_md() {
    assert_eq!(
        (
            BASE_OFFSET_AT,
            NEXT_OFFSET_AT,
            RECORD_COUNT_AT,
            BATCH_COUNT_AT
        ),
        (8, 16, 24, 32)
    );
    assert_eq!(
        (
            BATCHES_BYTES_AT,
            INDEX_POSITION_AT,
            INDEX_BYTES_AT,
            INDEX_ENTRY_COUNT_AT
        ),
        (40, 48, 56, 60)
    );
    assert_eq!(
        (INDEX_INTERVAL_AT, HOLE_COUNT_AT, FIRST_TS_AT, MAX_TS_AT),
        (64, 68, 72, 80)
    );
    assert_eq!(
        (
            BATCHES_CRC_AT,
            INDEX_CRC_AT,
            OBJECT_BYTES_AT,
            HOLES_CRC_AT,
            FOOTER_CRC_AT
        ),
        (88, 92, 96, 104, 108)
    );
    assert_eq!(TAIL_READ_BYTES, 112 + 65536 + 16384);
    let (bytes, _) = simple_segment(7, 3, 10);
    let (object, footer) = build(7, &bytes, 1000).unwrap();
    let tail = &object[object.len() - FOOTER_BYTES..];
    assert_eq!(&tail[0..4], b"TRAR");
    assert_eq!(read_u16(tail, 4), 1);
    assert_eq!(read_u16(tail, 6), 112);
    assert_eq!(read_u64(tail, 8), 7);
    assert_eq!(read_u64(tail, 16), 10);
    assert_eq!(read_u64(tail, 24), 3);
    assert_eq!(read_u64(tail, 96), object.len() as u64);
    assert_eq!(footer.index_entry_count, 1);
    assert_eq!(
        read_u32(tail, 108),
        crc32c::crc32c(&tail[..108]),
        "footer crc covers bytes 0..108"
    );
}

#[test]
fn index_interval_bounds_the_entry_count() {
    assert_eq!(index_interval_for(0), MIN_INDEX_INTERVAL_BYTES);
    assert_eq!(index_interval_for(64 * 1024 * 1024), 16389);
    assert_eq!(index_interval_for(MAX_BATCHES_BYTES), 1_048_833);
    // About 4100 batches of ~4.2 KiB: more batches than index entries
    // allowed, and the interval above the minimum.
    let (bytes, batches) = simple_segment(0, 4100, 4150);
    assert!(index_interval_for(bytes.len() as u64) > MIN_INDEX_INTERVAL_BYTES);
    let (object, footer) = build(0, &bytes, 1 << 20).unwrap();
    assert!(footer.index_entry_count <= MAX_INDEX_ENTRIES);
    assert!(footer.index_entry_count > 2000);
    assert!(footer.tail_bytes() <= TAIL_READ_BYTES);
    let (_, index) = open(&object).unwrap();
    for (i, batch) in batches.iter().enumerate().step_by(97) {
        let block = index.block_for_offset(batch.base_offset()).unwrap();
        let found = split_all(&object, block.position, block.base_offset);
        assert!(
            found.iter().any(|b| b.base_offset() == batch.base_offset()),
            "batch {i}"
        );
    }
    assert!(verify(&object, 1 << 16).is_intact());
}

#[test]
fn lookups_by_offset_and_timestamp() {
    // 40 batches of 3 records, ~1 KiB each: several index blocks.
    let batches: Vec<Vec<Record>> = (0..40)
        .map(|i| {
            (0..3)
                .map(|j| record(10_000 + i * 10 - j, &[b'a'; 300]))
                .collect()
        })
        .collect();
    let (bytes, encoded) = segment(500, &batches, Codec::None);
    let (object, footer) = build(500, &bytes, 333).unwrap();
    let (_, index) = open(&object).unwrap();
    assert!(index.entries().len() > 3);
    assert_eq!((footer.base_offset, footer.next_offset), (500, 620));
    assert_eq!(footer.first_timestamp_ms, 10_000);
    assert_eq!(footer.max_timestamp_ms, 10_390);
    assert_eq!(index.block_for_offset(499), None);
    assert_eq!(index.block_for_offset(620), None);
    for offset in 500..620 {
        let block = index.block_for_offset(offset).unwrap();
        assert!(block.base_offset <= offset);
        let found = split_all(&object, block.position, block.base_offset);
        let holder = found
            .iter()
            .find(|b| b.base_offset() <= offset && offset < b.next_offset())
            .unwrap();
        // The holding batch lies inside the block.
        assert!(found.iter().position(|b| b == holder).unwrap() < 40);
    }
    // Timestamps: records go 10000, 9999, 9998, 10010, ...
    let all: Vec<(u64, i64)> = encoded
        .iter()
        .flat_map(|b| {
            let base = b.base_offset();
            b.decode(&Limits::default())
                .unwrap()
                .records
                .into_iter()
                .enumerate()
                .map(move |(i, r)| (base + i as u64, r.timestamp_ms))
        })
        .collect();
    for t in [0, 9_998, 10_000, 10_001, 10_155, 10_390] {
        let expected = all.iter().find(|(_, ts)| *ts >= t).map(|(o, _)| *o);
        let block = index.block_for_timestamp(t).unwrap();
        let found = split_all(&object, block.position, block.base_offset);
        let first = found.iter().find_map(|b| {
            let base = b.base_offset();
            b.decode(&Limits::default())
                .unwrap()
                .records
                .iter()
                .position(|r| r.timestamp_ms >= t)
                .map(|i| base + i as u64)
        });
        assert_eq!(first, expected, "timestamp {t}");
    }
    assert_eq!(index.block_for_timestamp(10_391), None);
}

#[test]
fn every_flipped_footer_or_index_byte_is_detected() {
    let (bytes, _) = simple_segment(42, 60, 200);
    let (object, _) = build(42, &bytes, 4096).unwrap();
    let (footer, _) = open(&object).unwrap();
    assert!(footer.index_entry_count >= 2);
    let tail_start = object.len() - footer.tail_bytes() as usize;
    for at in tail_start..object.len() {
        for flip in [0x01u8, 0x80, 0xff] {
            let mut bad = object.clone();
            bad[at] ^= flip;
            assert!(
                open(&bad).is_err(),
                "flip {flip:#x} at byte {at} not detected"
            );
        }
    }
    // Truncated or extended objects.
    assert!(open(&object[1..]).is_err());
    let mut longer = object.clone();
    longer.insert(0, 0);
    assert!(open(&longer).is_err());
}

#[test]
fn every_flipped_batch_byte_is_reported_with_its_offset_range() {
    let (bytes, encoded) = simple_segment(1000, 50, 150);
    let (object, footer) = build(1000, &bytes, 4096).unwrap();
    let clean = verify(&object, 777);
    assert!(clean.is_intact(), "{clean:?}");
    assert_eq!((clean.batches_ok, clean.records_ok), (50, 50));
    let mut starts = Vec::new();
    let mut at = 0u64;
    for batch in &encoded {
        starts.push((at, at + batch.len() as u64, batch.base_offset()));
        at += batch.len() as u64;
    }
    for pos in 0..footer.batches_bytes {
        let mut bad = object.clone();
        bad[pos as usize] ^= 0x20;
        let report = verify(&bad, 1000);
        assert!(!report.is_intact(), "flip at byte {pos} not detected");
        let (_, _, offset) = *starts
            .iter()
            .find(|(s, e, _)| *s <= pos && pos < *e)
            .unwrap();
        assert!(
            report
                .damage
                .iter()
                .any(|d| d.first_offset <= offset && offset < d.end_offset),
            "flip at byte {pos} (offset {offset}): {:?}",
            report.damage
        );
        for d in &report.damage {
            assert!(d.first_offset >= 1000 && d.end_offset <= 1050, "{d}");
        }
    }
}

#[test]
fn damage_skips_to_the_next_index_entry() {
    let (bytes, _) = simple_segment(0, 200, 100);
    let (object, _) = build(0, &bytes, 4096).unwrap();
    let (_, index) = open(&object).unwrap();
    let second = index.entries()[1];
    let third = index.entries()[2];
    let mut bad = object.clone();
    bad[second.position as usize + 60] ^= 1;
    let report = verify(&bad, 512);
    assert_eq!(report.damage.len(), 1, "{:?}", report.damage);
    let d = &report.damage[0];
    assert_eq!(d.position, u64::from(second.position));
    assert_eq!(d.end_offset, u64::from(third.relative_offset));
    assert!(d.first_offset >= u64::from(second.relative_offset));
    assert_eq!(report.records_ok, 200 - (d.end_offset - d.first_offset));
}

#[test]
fn batches_crc_catches_what_batch_crcs_do_not() {
    let (bytes, _) = simple_segment(0, 5, 10);
    let (object, mut footer) = build(0, &bytes, 4096).unwrap();
    // A footer claiming another batches CRC (re-sealed with a valid
    // footer CRC): every batch verifies, the region does not.
    footer.batches_crc32c ^= 1;
    let mut forged = object[..object.len() - FOOTER_BYTES].to_vec();
    forged.extend_from_slice(&footer.encode());
    let report = verify(&forged, 100);
    assert_eq!(report.damage.len(), 1);
    assert_eq!(
        (report.damage[0].first_offset, report.damage[0].end_offset),
        (0, 5)
    );
    assert!(
        report.damage[0].reason.contains("batches region crc"),
        "{:?}",
        report.damage
    );
}

#[test]
fn builder_refuses_damaged_segments() {
    let (bytes, _) = simple_segment(10, 5, 20);
    let limits = Limits::default();
    // Wrong base offset.
    let mut b = ArchiveBuilder::new(11, bytes.len() as u64, limits).unwrap();
    assert!(matches!(
        b.push(&bytes),
        Err(ArchiveError::Discontinuity {
            position: 0,
            expected: 11,
            found: 10
        })
    ));
    assert!(b.push(&[]).is_err(), "errors are sticky");
    // Truncated.
    let short = &bytes[..bytes.len() - 1];
    let mut b = ArchiveBuilder::new(10, short.len() as u64, limits).unwrap();
    b.push(short).unwrap();
    assert!(matches!(
        b.finish(),
        Err(ArchiveError::BatchesTruncated { .. })
    ));
    // More or fewer bytes than announced.
    let mut b = ArchiveBuilder::new(10, bytes.len() as u64 - 5, limits).unwrap();
    assert!(matches!(b.push(&bytes), Err(ArchiveError::Mismatch { .. })));
    let mut b = ArchiveBuilder::new(10, bytes.len() as u64 + 5, limits).unwrap();
    b.push(&bytes).unwrap();
    assert!(matches!(b.finish(), Err(ArchiveError::Mismatch { .. })));
    // Damaged batch: position and offset named.
    let mut bad = bytes.clone();
    let second = EncodedBatch::from_bytes(Bytes::copy_from_slice(&bytes), &limits);
    assert!(second.is_err(), "several batches are not one");
    let first_len = read_u32(&bytes, 4) as usize;
    bad[first_len + 50] ^= 1;
    let mut b = ArchiveBuilder::new(10, bad.len() as u64, limits).unwrap();
    match b.push(&bad) {
        Err(ArchiveError::Batch {
            position, offset, ..
        }) => assert_eq!((position, offset), (first_len as u64, 11)),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        ArchiveBuilder::new(0, 0, limits),
        Err(ArchiveError::Empty)
    ));
    assert!(matches!(
        ArchiveBuilder::new(0, MAX_BATCHES_BYTES + 1, limits),
        Err(ArchiveError::TooLarge { .. })
    ));
}

#[test]
fn descriptor_follows_the_footer() {
    let (bytes, _) = simple_segment(5, 4, 10);
    let (object, footer) = build(5, &bytes, 64).unwrap();
    let d = SegmentDescriptor::from_footer(&footer, "k".into(), 77);
    d.validate().unwrap();
    assert_eq!((d.start_offset, d.end_offset, d.record_count), (5, 8, 4));
    assert_eq!(d.size, object.len() as u64);
    assert_eq!(d.next_offset(), 9);
    assert!(d.matches_footer(&footer));
    let mut later = d.clone();
    later.created_at_ms = 99;
    assert!(d.same_object(&later));
    later.batches_crc32c ^= 1;
    assert!(!d.same_object(&later));
    let json = serde_json::to_value(&d).unwrap();
    assert_eq!(json["object_id"], "k");
    let back: SegmentDescriptor = serde_json::from_value(json).unwrap();
    assert_eq!(back, d);
    let mut bad = d.clone();
    bad.record_count += 1;
    assert!(bad.validate().is_err());
}

fn arb_records() -> impl Strategy<Value = Vec<Vec<Record>>> {
    let record = (0i64..5_000, proptest::collection::vec(any::<u8>(), 0..300))
        .prop_map(|(ts, value)| record(1_700_000_000_000 + ts, &value));
    proptest::collection::vec(proptest::collection::vec(record, 1..6), 1..60)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn round_trip(
        base in 0u64..1 << 60,
        batches in arb_records(),
        zstd in any::<bool>(),
        chunk in 1usize..5000,
    ) {
        let codec = if zstd { Codec::Zstd } else { Codec::None };
        let (bytes, encoded) = segment(base, &batches, codec);
        let (object, footer) = build(base, &bytes, chunk).unwrap();
        let (read_footer, index) = open(&object).unwrap();
        prop_assert_eq!(read_footer, footer);
        prop_assert_eq!(&object[..bytes.len()], &bytes[..]);
        let records: u64 = batches.iter().map(|b| b.len() as u64).sum();
        prop_assert_eq!(footer.record_count(), records);
        prop_assert_eq!(footer.batch_count, batches.len() as u64);
        let all = split_all(&object, 0, base);
        prop_assert_eq!(&all, &encoded);
        // Every offset: its block holds it.
        for offset in (base..base + records).step_by(7) {
            let block = index.block_for_offset(offset).unwrap();
            let found = split_all(&object, block.position, block.base_offset);
            prop_assert!(found.iter().any(|b| b.base_offset() <= offset && offset < b.next_offset()));
        }
        let report = verify(&object, chunk);
        prop_assert!(report.is_intact(), "{:?}", report);
        prop_assert_eq!(report.records_ok, records);
    }
}
