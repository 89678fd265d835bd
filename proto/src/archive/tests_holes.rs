//! Tests of declared holes in archive objects (format version 2): a gap is
//! accepted only when it is exactly declared, the object carries it, every
//! reader steps over it, and version-1 objects still read.

use super::tests::{open, record, segment, verify};
use super::*;
use crate::batch::Codec;

/// Batches of one record each at `offsets` (each batch one offset), back
/// to back: a segment whose gaps are wherever `offsets` skips.
fn segment_at(offsets: &[u64]) -> Vec<u8> {
    let mut bytes = Vec::new();
    for &o in offsets {
        let (b, _) = segment(o, &[vec![record(1000 + o as i64, b"v")]], Codec::None);
        bytes.extend_from_slice(&b);
    }
    bytes
}

fn hole(first_offset: u64, end_offset: u64) -> HoleRange {
    HoleRange {
        first_offset,
        end_offset,
    }
}

fn build_with(base: u64, bytes: &[u8], holes: &[HoleRange]) -> Result<Vec<u8>, ArchiveError> {
    let mut builder =
        ArchiveBuilder::new(base, bytes.len() as u64, Limits::default())?.with_holes(holes)?;
    for piece in bytes.chunks(37) {
        builder.push(piece)?;
    }
    let tail = builder.finish()?;
    let mut object = bytes.to_vec();
    object.extend_from_slice(&tail.bytes);
    Ok(object)
}

#[test]
fn a_gap_that_is_a_declared_hole_is_archived_and_read_back() {
    // 100, 101, 102, hole 103..110, 110, 111.
    let bytes = segment_at(&[100, 101, 102, 110, 111]);
    let object = build_with(100, &bytes, &[hole(103, 110)]).unwrap();
    let (footer, index) = open(&object).unwrap();
    assert_eq!(read_u16(&object[object.len() - FOOTER_BYTES..], 4), 2);
    assert_eq!(footer.format_version(), 2);
    assert_eq!((footer.base_offset, footer.next_offset), (100, 112));
    assert_eq!(footer.record_count(), 5);
    assert_eq!(footer.offset_span(), 12);
    assert_eq!(
        read_u64(&object[object.len() - FOOTER_BYTES..], 24),
        5,
        "record_count field"
    );
    assert_eq!(index.holes(), &[hole(103, 110)]);
    let report = verify(&object, 29);
    assert!(report.is_intact(), "{:?}", report.damage);
    assert_eq!((report.batches_ok, report.records_ok), (5, 5));
    let mut splitter = BatchSplitter::new(0, 100, reader_limits()).with_holes(index.holes());
    let batches = splitter
        .push(&object[..footer.batches_bytes as usize])
        .unwrap();
    let offsets: Vec<u64> = batches.iter().map(|b| b.base_offset()).collect();
    assert_eq!(offsets, [100, 101, 102, 110, 111]);
    assert_eq!(splitter.take_crossed(), [hole(103, 110)]);
    let d = SegmentDescriptor::from_footer(&footer, "k".into(), 1);
    assert_eq!((d.format_version, d.record_count), (2, 5));
    assert_eq!(d.validate(), Ok(()));
    assert!(d.matches_footer(&footer));
}

#[test]
fn an_undeclared_or_misdeclared_gap_is_a_discontinuity() {
    let bytes = segment_at(&[100, 101, 102, 110, 111]);
    for declared in [
        vec![],
        vec![hole(103, 109)],
        vec![hole(104, 110)],
        vec![hole(103, 105), hole(106, 110)],
    ] {
        match build_with(100, &bytes, &declared) {
            Err(ArchiveError::Discontinuity {
                expected, found, ..
            }) => assert_eq!((expected, found), (103, 110), "{declared:?}"),
            other => panic!("{declared:?}: {other:?}"),
        }
    }
    // A hole running into the batch after it: an overlap, refused.
    assert!(matches!(
        build_with(100, &bytes, &[hole(103, 111)]),
        Err(ArchiveError::Discontinuity { .. })
    ));
    // Two adjacent declared holes covering the gap exactly are accepted.
    let object = build_with(100, &bytes, &[hole(103, 105), hole(105, 110)]).unwrap();
    let (_, index) = open(&object).unwrap();
    assert_eq!(index.holes(), &[hole(103, 105), hole(105, 110)]);
}

#[test]
fn holes_at_the_start_and_the_end_of_a_segment() {
    // The segment file is named 90, its first batch is 95 (a hole declared
    // while the active segment was empty) and a hole follows its last batch.
    let bytes = segment_at(&[95, 96]);
    let object = build_with(90, &bytes, &[hole(90, 95), hole(97, 120)]).unwrap();
    let (footer, index) = open(&object).unwrap();
    assert_eq!((footer.base_offset, footer.next_offset), (90, 120));
    assert_eq!(footer.record_count(), 2);
    assert_eq!(index.holes(), &[hole(90, 95), hole(97, 120)]);
    assert!(verify(&object, 1).is_intact());
    // Reading starts at the object's first offset, so the leading hole is
    // crossed (and reported) like any other.
    assert_eq!(index.block_for_offset(119).map(|b| b.base_offset), Some(90));
    let block = index.block_for_offset(90).unwrap();
    let mut splitter = BatchSplitter::new(block.position, block.base_offset, Limits::default())
        .with_holes(index.holes());
    let batches = splitter.push(&object[..bytes.len()]).unwrap();
    let offsets: Vec<u64> = batches.iter().map(|b| b.base_offset()).collect();
    assert_eq!(offsets, vec![95, 96]);
    assert_eq!(splitter.take_crossed(), vec![hole(90, 95)]);
}

#[test]
fn a_declared_hole_the_batches_hold_records_for_is_refused() {
    let bytes = segment_at(&[100, 101, 102]);
    assert_eq!(
        build_with(100, &bytes, &[hole(101, 102)]),
        Err(ArchiveError::HoleNotInSegment {
            first_offset: 101,
            end_offset: 102
        })
    );
    // Holes outside the segment's offsets are not its business.
    let object = build_with(100, &bytes, &[hole(50, 60), hole(200, 210)]).unwrap();
    let (footer, index) = open(&object).unwrap();
    assert_eq!(footer.format_version(), 1);
    assert!(index.holes().is_empty());
    // Unsorted or empty ranges are refused up front.
    assert!(matches!(
        ArchiveBuilder::new(0, 100, Limits::default())
            .unwrap()
            .with_holes(&[hole(5, 6), hole(1, 2)]),
        Err(ArchiveError::HolesInvalid { .. })
    ));
    assert!(matches!(
        ArchiveBuilder::new(0, 100, Limits::default())
            .unwrap()
            .with_holes(&[hole(5, 5)]),
        Err(ArchiveError::HolesInvalid { .. })
    ));
}

#[test]
fn an_object_without_holes_is_written_and_read_as_version_1() {
    let bytes = segment_at(&[7, 8, 9]);
    let object = build_with(7, &bytes, &[]).unwrap();
    let tail = &object[object.len() - FOOTER_BYTES..];
    assert_eq!(read_u16(tail, 4), 1);
    assert_eq!((read_u32(tail, 68), read_u32(tail, 104)), (0, 0));
    let (footer, index) = open(&object).unwrap();
    assert_eq!(footer.record_count(), 3);
    assert!(index.holes().is_empty());
    // A version-1 footer with a non-zero reserved field is still refused.
    let mut forged = object.clone();
    let at = forged.len() - FOOTER_BYTES;
    forged[at + 68] = 1;
    let crc = crc32c::crc32c(&forged[at..at + 108]);
    forged[at + 108..at + 112].copy_from_slice(&crc.to_le_bytes());
    assert_eq!(
        Footer::decode_from_tail(&forged),
        Err(ArchiveError::FooterInvalid("reserved fields are not zero"))
    );
    // A version this build does not know is refused.
    let mut v3 = object.clone();
    v3[at + 4] = 3;
    let crc = crc32c::crc32c(&v3[at..at + 108]);
    v3[at + 108..at + 112].copy_from_slice(&crc.to_le_bytes());
    assert_eq!(
        Footer::decode_from_tail(&v3),
        Err(ArchiveError::UnsupportedVersion { found: 3 })
    );
}

#[test]
fn every_flipped_tail_byte_of_an_object_with_holes_is_detected() {
    let bytes = segment_at(&[100, 101, 110, 111, 130]);
    let object = build_with(100, &bytes, &[hole(102, 110), hole(112, 130)]).unwrap();
    let (footer, _) = open(&object).unwrap();
    assert_eq!(footer.hole_count, 2);
    let tail_start = object.len() - footer.tail_bytes() as usize;
    for pos in tail_start..object.len() {
        let mut bad = object.clone();
        bad[pos] ^= 0x20;
        assert!(open(&bad).is_err(), "flip at {pos} not detected");
    }
}

#[test]
fn only_holes_covering_a_range_end_to_end_cover_it_exactly() {
    assert!(holes_cover_exactly(&[hole(100, 200)], 100, 200));
    assert!(holes_cover_exactly(
        &[hole(5, 9), hole(100, 150), hole(150, 200)],
        100,
        200
    ));
    assert!(!holes_cover_exactly(&[], 100, 200));
    assert!(!holes_cover_exactly(&[hole(100, 150)], 100, 200), "short");
    assert!(
        !holes_cover_exactly(&[hole(100, 150), hole(160, 200)], 100, 200),
        "gap"
    );
    assert!(
        !holes_cover_exactly(&[hole(90, 200)], 100, 200),
        "starts before"
    );
    assert!(
        !holes_cover_exactly(&[hole(100, 210)], 100, 200),
        "reaches past"
    );
}
