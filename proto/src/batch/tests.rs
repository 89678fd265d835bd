//! Tests of the record batch format: encode/decode round trips (property
//! tests), limits, and every kind of damaged byte reported as a decode error.

use super::*;
use proptest::prelude::*;

fn arb_record() -> impl Strategy<Value = Record> {
    (
        -1_000_000i64..1_000_000,
        proptest::option::of(proptest::collection::vec(any::<u8>(), 0..16)),
        proptest::collection::vec(
            ("[a-z-]{0,8}", proptest::collection::vec(any::<u8>(), 0..8)),
            0..3,
        ),
        proptest::collection::vec(any::<u8>(), 0..64),
    )
        .prop_map(|(ts, key, headers, value)| Record {
            timestamp_ms: 1_700_000_000_000 + ts,
            key: key.map(Bytes::from),
            headers: headers
                .into_iter()
                .map(|(n, v)| (n, Bytes::from(v)))
                .collect(),
            value: Bytes::from(value),
        })
}

fn arb_batch() -> impl Strategy<Value = RecordBatch> {
    (
        0u64..u64::MAX / 2,
        prop_oneof![Just(Codec::None), Just(Codec::Zstd)],
        proptest::collection::vec(arb_record(), 1..12),
    )
        .prop_map(|(base_offset, codec, records)| RecordBatch {
            base_offset,
            codec,
            records,
        })
}

fn decode_all(bytes: Bytes) -> Result<RecordBatch, DecodeError> {
    let limits = Limits::default();
    EncodedBatch::from_bytes(bytes, &limits)?.decode(&limits)
}

proptest! {
    #[test]
    fn round_trip(batch in arb_batch()) {
        let limits = Limits::default();
        let encoded = batch.encode(&limits).unwrap();
        prop_assert_eq!(encoded.base_offset(), batch.base_offset);
        prop_assert_eq!(encoded.record_count() as usize, batch.records.len());
        let decoded = decode_all(encoded.as_bytes().clone()).unwrap();
        prop_assert_eq!(&decoded, &batch);
        // Re-encoding is byte-identical: no layer ever needs to re-encode,
        // but if one did, the CRC would not change.
        let again = decoded.encode(&limits).unwrap();
        prop_assert_eq!(again.as_bytes(), encoded.as_bytes());
    }

    #[test]
    fn any_single_bit_flip_is_detected(batch in arb_batch(), bit in any::<prop::sample::Index>()) {
        let encoded = batch.encode(&Limits::default()).unwrap();
        let mut bytes = encoded.as_bytes().to_vec();
        let bit = bit.index(bytes.len() * 8);
        bytes[bit / 8] ^= 1 << (bit % 8);
        prop_assert!(decode_all(Bytes::from(bytes)).is_err());
    }

    #[test]
    fn any_truncation_is_detected(batch in arb_batch(), cut in any::<prop::sample::Index>()) {
        let encoded = batch.encode(&Limits::default()).unwrap();
        let cut = cut.index(encoded.len());
        let err = decode_all(encoded.as_bytes().slice(..cut)).unwrap_err();
        let is_truncated = matches!(err, DecodeError::Truncated { .. });
        prop_assert!(is_truncated, "{:?}", err);
    }

    #[test]
    fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = decode_all(Bytes::from(bytes));
    }

    #[test]
    fn garbage_behind_a_valid_header_never_panics(
        batch in arb_batch(),
        tail in proptest::collection::vec(any::<u8>(), 0..128),
    ) {
        // A CRC-valid batch whose records section is arbitrary: only a faulty
        // encoder produces it, and the decoder must still refuse cleanly.
        let encoded = batch.encode(&Limits::default()).unwrap();
        let mut bytes = encoded.as_bytes()[..HEADER_LEN].to_vec();
        bytes.extend_from_slice(&tail);
        let len = bytes.len() as u32;
        bytes[LENGTH_AT..LENGTH_AT + 4].copy_from_slice(&len.to_le_bytes());
        bytes[RECORDS_BYTES_AT..RECORDS_BYTES_AT + 4]
            .copy_from_slice(&(tail.len() as u32).to_le_bytes());
        let crc = crc32c::crc32c(&bytes[CRC_START..]);
        bytes[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_le_bytes());
        let _ = decode_all(Bytes::from(bytes));
    }

    #[test]
    fn rebasing_keeps_records_and_fixes_crc(batch in arb_batch(), new_base in 0u64..u64::MAX / 2) {
        let limits = Limits::default();
        let encoded = batch.encode(&limits).unwrap().with_base_offset(new_base);
        let decoded = decode_all(encoded.as_bytes().clone()).unwrap();
        prop_assert_eq!(decoded.base_offset, new_base);
        prop_assert_eq!(decoded.records, batch.records);
    }
}

fn one_record(value_len: usize) -> RecordBatch {
    RecordBatch::new(
        7,
        vec![Record {
            timestamp_ms: 1,
            key: None,
            headers: vec![],
            value: Bytes::from(vec![b'x'; value_len]),
        }],
    )
}

#[test]
fn empty_batch_is_refused() {
    assert_eq!(
        RecordBatch::new(0, vec![]).encode(&Limits::default()),
        Err(EncodeError::Empty)
    );
}

#[test]
fn record_over_max_record_bytes_names_the_limit() {
    let limits = Limits {
        max_record_bytes: 100,
        max_batch_bytes: 1000,
    };
    // offset delta, ts delta, key marker, header count: 4 bytes; length varint: 1 byte.
    assert!(one_record(95).encode(&limits).is_ok());
    let err = one_record(96).encode(&limits).unwrap_err();
    match &err {
        EncodeError::Limit {
            record_index,
            error,
        } => {
            assert_eq!(*record_index, Some(0));
            assert_eq!(error.limit, LimitName::MaxRecordBytes);
            assert_eq!(error.actual, 101);
            assert_eq!(error.max, 100);
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(err.to_string().contains("max_record_bytes"));
}

#[test]
fn batch_exactly_at_max_batch_bytes_is_accepted_and_one_more_byte_is_not() {
    let limits = Limits {
        max_record_bytes: 1000,
        max_batch_bytes: 200,
    };
    // 48 header + 4 fixed + 2-byte length varint + value = 200 → value = 146.
    let fits = one_record(146).encode(&limits).unwrap();
    assert_eq!(fits.len(), 200);
    let err = one_record(147).encode(&limits).unwrap_err();
    assert!(matches!(
        err,
        EncodeError::Limit {
            error: LimitError {
                limit: LimitName::MaxBatchBytes,
                ..
            },
            ..
        }
    ));
    // The decoder applies the same limit to bytes it is given.
    let smaller = Limits {
        max_record_bytes: 100,
        max_batch_bytes: 199,
    };
    assert!(matches!(
        EncodedBatch::from_bytes(fits.as_bytes().clone(), &smaller),
        Err(DecodeError::LengthOutOfBounds {
            length: 200,
            max: 199
        })
    ));
}

#[test]
fn decompression_is_bounded_by_the_declared_size() {
    let limits = Limits::default();
    let mut batch = one_record(10_000);
    batch.codec = Codec::Zstd;
    let encoded = batch.encode(&limits).unwrap();
    assert!(encoded.len() < 200, "zstd should shrink repeated bytes");
    // Lie about the decompressed size (and fix the CRC): the decoder must
    // refuse rather than allocate what the stream expands to.
    let mut bytes = encoded.as_bytes().to_vec();
    bytes[RECORDS_BYTES_AT..RECORDS_BYTES_AT + 4].copy_from_slice(&100u32.to_le_bytes());
    let crc = crc32c::crc32c(&bytes[CRC_START..]);
    bytes[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_le_bytes());
    let verified = EncodedBatch::from_bytes(Bytes::from(bytes), &limits).unwrap();
    assert!(matches!(
        verified.decode(&limits),
        Err(DecodeError::Decompress(_))
    ));
}

#[test]
fn header_fields_are_where_format_md_says() {
    let encoded = one_record(3).encode(&Limits::default()).unwrap();
    let b = encoded.as_bytes();
    assert_eq!(&b[0..4], b"TRIB");
    assert_eq!(
        u32::from_le_bytes([b[4], b[5], b[6], b[7]]) as usize,
        b.len()
    );
    assert_eq!(b[12], 1);
    assert_eq!(b[13], 0);
    assert_eq!(u64::from_le_bytes(b[16..24].try_into().unwrap()), 7);
    assert_eq!(u32::from_le_bytes(b[24..28].try_into().unwrap()), 1);
    assert_eq!(
        crc32c::crc32c(&b[12..]),
        u32::from_le_bytes([b[8], b[9], b[10], b[11]])
    );
}
