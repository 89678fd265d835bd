//! Unsigned LEB128 varints and ZigZag for signed values, as used inside a
//! record batch (see `FORMAT.md`).
//!
//! A `u64` takes 1 to 10 bytes. Decoding rejects encodings longer than 10
//! bytes and a 10th byte carrying bits above bit 63, so every value has at most
//! one accepted encoding length and decoding never overflows.

/// Largest encoded size of a `u64`, in bytes.
pub const MAX_VARINT_BYTES: usize = 10;

/// Why a varint could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum VarintError {
    /// The input ended inside the varint.
    #[error("varint truncated")]
    Truncated,
    /// More than 10 bytes, or bits above bit 63.
    #[error("varint overflows u64")]
    Overflow,
}

/// Appends `value` as an unsigned LEB128 varint.
pub fn put_u64(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// Number of bytes [`put_u64`] writes for `value` (1..=10).
pub fn len_u64(value: u64) -> usize {
    let bits = 64 - (value | 1).leading_zeros() as usize;
    bits.div_ceil(7)
}

/// Appends `value` ZigZag-encoded as a varint.
pub fn put_i64(out: &mut Vec<u8>, value: i64) {
    put_u64(out, zigzag(value));
}

/// ZigZag maps signed to unsigned so small magnitudes stay short.
pub fn zigzag(value: i64) -> u64 {
    ((value << 1) ^ (value >> 63)) as u64
}

/// Inverse of [`zigzag`].
pub fn unzigzag(value: u64) -> i64 {
    ((value >> 1) as i64) ^ -((value & 1) as i64)
}

/// Reads a varint from the front of `input`, returning the value and the
/// number of bytes consumed.
///
/// # Errors
/// [`VarintError::Truncated`] if `input` ends first, [`VarintError::Overflow`]
/// if the encoding does not fit a `u64`.
pub fn get_u64(input: &[u8]) -> Result<(u64, usize), VarintError> {
    let mut value: u64 = 0;
    for (i, &byte) in input.iter().enumerate().take(MAX_VARINT_BYTES) {
        let low = u64::from(byte & 0x7f);
        if i == MAX_VARINT_BYTES - 1 && byte > 1 {
            return Err(VarintError::Overflow);
        }
        value |= low << (7 * i);
        if byte & 0x80 == 0 {
            return Ok((value, i + 1));
        }
    }
    if input.len() >= MAX_VARINT_BYTES {
        Err(VarintError::Overflow)
    } else {
        Err(VarintError::Truncated)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn u64_round_trip(v in any::<u64>()) {
            let mut buf = Vec::new();
            put_u64(&mut buf, v);
            prop_assert_eq!(buf.len(), len_u64(v));
            prop_assert_eq!(get_u64(&buf), Ok((v, buf.len())));
        }

        #[test]
        fn i64_round_trip(v in any::<i64>()) {
            prop_assert_eq!(unzigzag(zigzag(v)), v);
        }

        #[test]
        fn every_strict_prefix_is_truncated(v in 128u64..) {
            let mut buf = Vec::new();
            put_u64(&mut buf, v);
            for cut in 0..buf.len() {
                prop_assert_eq!(get_u64(&buf[..cut]), Err(VarintError::Truncated));
            }
        }
    }

    #[test]
    fn rejects_eleven_byte_and_overflowing_encodings() {
        assert_eq!(get_u64(&[0xff; 11]), Err(VarintError::Overflow));
        let mut too_big = vec![0xff; 9];
        too_big.push(0x02);
        assert_eq!(get_u64(&too_big), Err(VarintError::Overflow));
        let mut max = vec![0xff; 9];
        max.push(0x01);
        assert_eq!(get_u64(&max), Ok((u64::MAX, 10)));
    }
}
