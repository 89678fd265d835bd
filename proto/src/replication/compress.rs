//! Wire compression of record batches for a long-lived stream: one reused
//! zstd context, and a back-off that stops trying on data that does not
//! compress (already compressed or encrypted payloads) and tries again
//! later.
//!
//! Each batch is still compressed as one independent zstd frame, so the
//! broker decodes every batch on its own ([`super::frame::open_batch`]).

use bytes::Bytes;

use super::frame::{Frame, WireCodec};
use crate::batch::EncodedBatch;

/// zstd level used on the wire (fast; ratio on JSON telemetry in
/// `docs/benchmarks.md`).
pub const WIRE_ZSTD_LEVEL: i32 = 1;
/// Consecutive batches that did not shrink before attempts pause.
pub const MISSES_BEFORE_PAUSE: u32 = 8;
/// Batches sent uncompressed without an attempt during a pause.
pub const PAUSE_BATCHES: u32 = 64;

/// Compresses batches for one stream. Not shared between threads; cheap to
/// move.
pub struct BatchCompressor {
    context: Option<zstd::bulk::Compressor<'static>>,
    misses: u32,
    paused_for: u32,
}

impl std::fmt::Debug for BatchCompressor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchCompressor")
            .field("enabled", &self.context.is_some())
            .field("misses", &self.misses)
            .field("paused_for", &self.paused_for)
            .finish()
    }
}

impl BatchCompressor {
    /// A compressor; with `enabled` false (or if zstd cannot allocate its
    /// context) every batch goes out uncompressed.
    pub fn new(enabled: bool) -> BatchCompressor {
        BatchCompressor {
            context: enabled
                .then(|| zstd::bulk::Compressor::new(WIRE_ZSTD_LEVEL).ok())
                .flatten(),
            misses: 0,
            paused_for: 0,
        }
    }

    /// The wire form of `batch`: zstd when that is smaller, otherwise the
    /// stored bytes (zero-copy).
    pub fn encode(&mut self, batch: &EncodedBatch) -> (WireCodec, Bytes) {
        let raw = batch.as_bytes();
        match self.try_compress(raw) {
            Some(packed) => (WireCodec::Zstd, Bytes::from(packed)),
            None => (WireCodec::None, raw.clone()),
        }
    }

    /// The batch frame for `batch` ([`BatchCompressor::encode`]).
    pub fn frame(&mut self, batch: &EncodedBatch) -> Frame {
        let (codec, payload) = self.encode(batch);
        Frame::Batch { codec, payload }
    }

    /// Whether the next batch will be tried (false while paused or
    /// disabled).
    pub fn will_try(&self) -> bool {
        self.context.is_some() && self.paused_for == 0
    }

    fn try_compress(&mut self, raw: &[u8]) -> Option<Vec<u8>> {
        if self.paused_for > 0 {
            self.paused_for -= 1;
            return None;
        }
        let context = self.context.as_mut()?;
        match context.compress(raw) {
            Ok(packed) if packed.len() < raw.len() => {
                self.misses = 0;
                Some(packed)
            }
            _ => {
                self.misses += 1;
                if self.misses >= MISSES_BEFORE_PAUSE {
                    self.misses = 0;
                    self.paused_for = PAUSE_BATCHES;
                }
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::{Record, RecordBatch};
    use crate::limits::Limits;
    use crate::replication::frame::open_batch;

    fn batch_of(value: Vec<u8>) -> EncodedBatch {
        let record = Record {
            value: Bytes::from(value),
            ..Record::default()
        };
        RecordBatch::new(0, vec![record])
            .encode(&Limits::default())
            .expect("encode")
    }

    fn noise(len: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    #[test]
    fn compressible_batches_shrink_and_round_trip() {
        let batch = batch_of(b"{\"voltage\":240.1,\"current\":1.2}".repeat(100));
        let mut compressor = BatchCompressor::new(true);
        for _ in 0..3 {
            let Frame::Batch { codec, payload } = compressor.frame(&batch) else {
                panic!("not a batch frame");
            };
            assert_eq!(codec, WireCodec::Zstd);
            assert!(payload.len() < batch.len() / 10);
            let opened = open_batch(codec, payload, &Limits::default()).expect("opens");
            assert_eq!(opened.as_bytes(), batch.as_bytes());
        }
    }

    #[test]
    fn incompressible_data_pauses_attempts_then_tries_again() {
        let mut compressor = BatchCompressor::new(true);
        for i in 0..MISSES_BEFORE_PAUSE {
            assert!(compressor.will_try(), "attempt {i}");
            let batch = batch_of(noise(4096, u64::from(i)));
            let Frame::Batch { codec, payload } = compressor.frame(&batch) else {
                panic!("not a batch frame");
            };
            assert_eq!(codec, WireCodec::None);
            assert_eq!(payload, *batch.as_bytes());
        }
        for _ in 0..PAUSE_BATCHES {
            assert!(!compressor.will_try());
            let _ = compressor.frame(&batch_of(noise(64, 9)));
        }
        assert!(compressor.will_try());
        // Compressible data after the pause is compressed again.
        let batch = batch_of(b"abc".repeat(1000));
        assert!(matches!(
            compressor.frame(&batch),
            Frame::Batch {
                codec: WireCodec::Zstd,
                ..
            }
        ));
    }

    #[test]
    fn disabled_never_compresses() {
        let mut compressor = BatchCompressor::new(false);
        let batch = batch_of(b"abc".repeat(1000));
        assert!(!compressor.will_try());
        assert!(matches!(
            compressor.frame(&batch),
            Frame::Batch {
                codec: WireCodec::None,
                ..
            }
        ));
    }
}
