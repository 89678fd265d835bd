//! One simulated edge topic: its records, made up from their offsets (so
//! any range can be produced again after a reconnect, byte for byte, and a
//! test can check what the broker stored), how many exist at a given
//! moment (the production rate), and what the broker acknowledged.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use tributary_proto::Record;
use tributary_proto::batch::{EncodedBatch, RecordBatch};
use tributary_proto::limits::Limits;

use super::measure::Latencies;

/// Timestamp of offset 0's record, ms since the Unix epoch (offset `o` has
/// `TIMESTAMP_BASE_MS + o`): fixed, so the records are the same bytes in
/// every run.
pub const TIMESTAMP_BASE_MS: i64 = 1_780_000_000_000;

/// The value of the record at `offset` of the topic with `seed`, `len`
/// bytes (at least 16): the seed and the offset (little-endian), then a
/// fill byte that depends on the offset.
pub fn value_for(seed: u64, offset: u64, len: usize) -> Bytes {
    let len = len.max(16);
    let mut value = BytesMut::with_capacity(len);
    value.put_u64_le(seed);
    value.put_u64_le(offset);
    value.put_bytes((offset % 251) as u8, len - 16);
    value.freeze()
}

/// A stable seed for a topic name (FNV-1a), so a checker needs only the
/// name to know what each offset must hold.
pub fn seed_for(topic: &str) -> u64 {
    topic.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// How one topic produces records.
#[derive(Debug, Clone, Copy)]
pub struct Production {
    /// Records the topic produces in all.
    pub records: u64,
    /// Records per second, arriving `batch_records` at a time; `None`: all
    /// of them exist from the start (a backlog, sent as fast as the window
    /// allows).
    pub rate: Option<f64>,
    /// Most records per batch.
    pub batch_records: u64,
    /// Bytes of each record value.
    pub record_bytes: usize,
}

/// One topic's local log and its replication progress, kept across
/// connections.
#[derive(Debug)]
pub struct TopicLog {
    /// `/{edge}/{topic}`.
    pub name: String,
    seed: u64,
    production: Production,
    /// When production started (`None`: not yet, nothing exists).
    started: Option<Instant>,
    /// How long after [`TopicLog::start`] production begins.
    phase: Duration,
    /// Everything below it is acknowledged by the broker.
    pub acked: u64,
    /// When the first acknowledgement (of at least one record) arrived.
    pub first_ack: Option<Instant>,
    /// When the last acknowledgement that moved `acked` arrived.
    pub last_ack: Option<Instant>,
    /// Whether the swarm counted this topic as done.
    pub counted_done: bool,
    /// When the broker's first `Welcome` arrived.
    pub first_welcome: Option<Instant>,
    /// Batches sent on the current stream and not yet acknowledged: their
    /// exclusive end offset and when they were handed to QUIC.
    in_flight: VecDeque<(u64, Instant)>,
    /// Acknowledgement latency of each batch acknowledged on a stream.
    pub latencies: Latencies,
    /// Streams that ended before the topic was done.
    pub stream_failures: u64,
    /// `Ack` frames received on its streams (one may acknowledge several
    /// batches).
    pub ack_frames: u64,
    /// The last reason a stream ended early.
    pub last_error: Option<String>,
}

impl TopicLog {
    /// A topic that produces nothing until [`TopicLog::start`].
    pub fn new(name: String, production: Production) -> TopicLog {
        TopicLog {
            seed: seed_for(&name),
            name,
            production,
            started: None,
            phase: Duration::ZERO,
            acked: 0,
            first_ack: None,
            last_ack: None,
            counted_done: false,
            first_welcome: None,
            in_flight: VecDeque::new(),
            latencies: Latencies::default(),
            stream_failures: 0,
            ack_frames: 0,
            last_error: None,
        }
    }

    /// This topic's production begins `phase` after [`TopicLog::start`]:
    /// independent devices do not produce in lockstep, so a swarm spreads
    /// its topics' batch times over one batch interval.
    pub fn with_phase(mut self, phase: Duration) -> TopicLog {
        self.phase = phase;
        self
    }

    /// Production starts at `at` plus the phase (a second call changes
    /// nothing).
    pub fn start(&mut self, at: Instant) {
        self.started.get_or_insert(at + self.phase);
    }

    /// Whether production started.
    pub fn is_started(&self) -> bool {
        self.started.is_some()
    }

    /// Records produced in all (the local high-water mark once production
    /// ended).
    pub fn total(&self) -> u64 {
        self.production.records
    }

    /// The local high-water mark at `now`.
    pub fn produced(&self, now: Instant) -> u64 {
        let Some(started) = self.started else {
            return 0;
        };
        match self.production.rate {
            None => self.production.records,
            Some(rate) => {
                // Records arrive a whole batch at a time, as a producer
                // publishing batches hands them over.
                let batch = self.production.batch_records.max(1);
                let due = (now.saturating_duration_since(started).as_secs_f64() * rate) as u64;
                (due / batch * batch).min(self.production.records)
            }
        }
    }

    /// When the next record is produced after `now` (`None`: no more, or
    /// a backlog that exists already).
    pub fn next_production(&self, now: Instant) -> Option<Instant> {
        let rate = self.production.rate?;
        let started = self.started?;
        let produced = self.produced(now);
        if produced >= self.production.records || rate <= 0.0 {
            return None;
        }
        let next = produced + self.production.batch_records.max(1);
        Some(started + Duration::from_secs_f64(next as f64 / rate))
    }

    /// Whether the broker acknowledged every record.
    pub fn is_done(&self) -> bool {
        self.acked >= self.production.records
    }

    /// The batch `from..end` (at most `batch_records` records, so `end` is
    /// clamped), encoded, and its exclusive end.
    ///
    /// # Errors
    /// The encoder's, for a record larger than `limits` allow.
    pub fn batch(
        &self,
        from: u64,
        end: u64,
        limits: &Limits,
    ) -> Result<EncodedBatch, tributary_proto::batch::EncodeError> {
        let end = end.min(from + self.production.batch_records.max(1));
        let records = (from..end)
            .map(|offset| Record {
                timestamp_ms: TIMESTAMP_BASE_MS + offset as i64,
                key: None,
                headers: Vec::new(),
                value: value_for(self.seed, offset, self.production.record_bytes),
            })
            .collect();
        RecordBatch::new(from, records).encode(limits)
    }

    /// A new stream's `Welcome`: the broker holds everything below `from`
    /// (durably), and what the previous stream had in flight is forgotten.
    pub fn resumed(&mut self, from: u64, now: Instant) {
        self.first_welcome.get_or_insert(now);
        self.in_flight.clear();
        self.advance(from, now);
    }

    /// A batch ending at `end` was handed to QUIC at `now`.
    pub fn sent(&mut self, end: u64, now: Instant) {
        self.in_flight.push_back((end, now));
    }

    /// The broker acknowledged everything below `next_offset` at `now`:
    /// one latency sample per batch it covers.
    pub fn acknowledged(&mut self, next_offset: u64, now: Instant) {
        while let Some(&(end, sent)) = self.in_flight.front() {
            if end > next_offset {
                break;
            }
            self.latencies.push(now.saturating_duration_since(sent));
            self.in_flight.pop_front();
        }
        self.advance(next_offset, now);
    }

    fn advance(&mut self, next_offset: u64, now: Instant) {
        if next_offset > self.acked {
            self.acked = next_offset;
            self.first_ack.get_or_insert(now);
            self.last_ack = Some(now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 100 records of 32 bytes, ten a second, four per batch.
    const TEN_A_SECOND: Production = Production {
        records: 100,
        rate: Some(10.0),
        batch_records: 4,
        record_bytes: 32,
    };

    #[test]
    fn values_depend_on_topic_and_offset_only() {
        let a = value_for(seed_for("/e1/t0"), 7, 200);
        assert_eq!(a.len(), 200);
        assert_eq!(a, value_for(seed_for("/e1/t0"), 7, 200));
        assert_ne!(a, value_for(seed_for("/e1/t0"), 8, 200));
        assert_ne!(a, value_for(seed_for("/e2/t0"), 7, 200));
        assert_eq!(value_for(1, 2, 3).len(), 16);
    }

    #[test]
    fn rate_limited_production_and_batches() {
        let t0 = Instant::now();
        let production = TEN_A_SECOND;
        let mut log = TopicLog::new("/e/t".into(), production);
        assert_eq!(log.produced(t0 + Duration::from_secs(5)), 0, "not started");
        log.start(t0);
        assert_eq!(log.produced(t0), 0);
        // Ten records a second, four at a time.
        assert_eq!(log.produced(t0 + Duration::from_millis(1050)), 8);
        assert_eq!(log.produced(t0 + Duration::from_millis(1200)), 12);
        assert_eq!(log.produced(t0 + Duration::from_secs(60)), 100);
        assert_eq!(
            log.next_production(t0 + Duration::from_millis(1050)),
            Some(t0 + Duration::from_millis(1200))
        );
        let batch = log.batch(3, 50, &Limits::default()).unwrap();
        assert_eq!((batch.base_offset(), batch.next_offset()), (3, 7));
        log.resumed(0, t0);
        log.sent(4, t0);
        log.sent(8, t0);
        log.acknowledged(4, t0 + Duration::from_millis(5));
        assert_eq!(log.acked, 4);
        assert_eq!(log.latencies.len(), 1);
        log.resumed(6, t0 + Duration::from_millis(9));
        assert_eq!(log.acked, 6);
        log.acknowledged(100, t0 + Duration::from_millis(10));
        assert!(log.is_done());
        assert_eq!(
            log.latencies.len(),
            1,
            "the lost stream's batch has no sample"
        );
    }

    #[test]
    fn a_phase_delays_every_batch_of_the_topic() {
        let t0 = Instant::now();
        let production = TEN_A_SECOND;
        let mut log =
            TopicLog::new("/e/t".into(), production).with_phase(Duration::from_millis(250));
        log.start(t0);
        assert_eq!(log.produced(t0 + Duration::from_millis(399)), 0);
        assert_eq!(log.produced(t0 + Duration::from_millis(650)), 4);
        assert_eq!(
            log.next_production(t0),
            Some(t0 + Duration::from_millis(650))
        );
        // A backlog exists at once, phase or not.
        let backlog = Production {
            rate: None,
            ..production
        };
        let mut log = TopicLog::new("/e/b".into(), backlog).with_phase(Duration::from_secs(9));
        log.start(t0);
        assert_eq!(log.produced(t0), 100);
    }
}
