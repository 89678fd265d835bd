//! Seeded simulation of edge and broker streams over a link that delays,
//! reorders nothing (QUIC streams are ordered) but drops whole connections at
//! random moments. After every step the broker log must be a gap-free,
//! duplicate-free prefix of the edge log, batch for batch and byte for byte;
//! at the end both are equal. Every acknowledgement is also repeated as a
//! datagram, which the simulated link loses, duplicates and reorders. The
//! seed is printed on failure.

use std::collections::VecDeque;

use bytes::Bytes;
use rand::{RngExt, SeedableRng, rngs::StdRng};

use super::edge::{EdgeError, EdgeEvent, EdgeStream, Window};
use super::frame::AckDatagram;
use super::frame::{ErrorCode, Frame, HoleCause};
use super::ingest::{Acknowledgement, IngestAction, IngestStream};
use crate::batch::{EncodedBatch, Record, RecordBatch};
use crate::intent::StreamIntent;
use crate::limits::Limits;

struct Sim {
    rng: StdRng,
    edge_log: Vec<EncodedBatch>,
    broker_log: Vec<EncodedBatch>,
    edge: EdgeStream,
    broker: IngestStream,
    to_broker: VecDeque<Frame>,
    to_edge: VecDeque<Frame>,
    /// Acknowledgement datagrams in flight (delivered in any order).
    ack_datagrams: Vec<u64>,
    checkpoint: u64,
    connections: u64,
    compress: bool,
}

fn next_offset(log: &[EncodedBatch]) -> u64 {
    log.last().map_or(0, EncodedBatch::next_offset)
}

impl Sim {
    fn new(seed: u64) -> Sim {
        let mut sim = Sim {
            rng: StdRng::seed_from_u64(seed),
            edge_log: Vec::new(),
            broker_log: Vec::new(),
            edge: new_edge(),
            broker: IngestStream::new("plant1".into(), Limits::default()),
            to_broker: VecDeque::new(),
            to_edge: VecDeque::new(),
            ack_datagrams: Vec::new(),
            checkpoint: 0,
            connections: 0,
            compress: seed.is_multiple_of(2),
        };
        sim.connect();
        sim
    }

    fn connect(&mut self) {
        self.edge = new_edge();
        self.broker = IngestStream::new("plant1".into(), Limits::default());
        self.to_broker.clear();
        self.to_edge.clear();
        self.ack_datagrams.clear();
        self.to_broker.push_back(self.edge.hello());
        self.connections += 1;
    }

    fn publish(&mut self) {
        let base = next_offset(&self.edge_log);
        let count = self.rng.random_range(1..5);
        let records = (0..count)
            .map(|i| Record {
                timestamp_ms: 1_700_000_000_000,
                value: Bytes::from(format!("record {}", base + i)),
                ..Record::default()
            })
            .collect();
        let batch = RecordBatch::new(base, records)
            .encode(&Limits::default())
            .expect("encode");
        self.edge_log.push(batch);
    }

    fn edge_send(&mut self) {
        let hwm = next_offset(&self.edge_log);
        while let Some(offset) = self.edge.next_to_send(hwm) {
            let batch = self
                .edge_log
                .iter()
                .find(|b| b.base_offset() == offset)
                .expect("the WAL has a batch starting at every resume point")
                .clone();
            self.edge.on_sent(batch.header(), batch.len());
            self.to_broker
                .push_back(Frame::batch(&batch, self.compress));
        }
    }

    fn deliver_to_broker(&mut self) {
        let Some(frame) = self.to_broker.pop_front() else {
            return;
        };
        match self.broker.on_frame(frame) {
            IngestAction::Open(_, topic) => {
                assert_eq!(topic.as_str(), "/plant1/power");
                let hwm = next_offset(&self.broker_log);
                let welcome = self.broker.welcome(hwm);
                self.to_edge.push_back(welcome);
            }
            IngestAction::Append(batch) => {
                let next = next_offset(&self.broker_log);
                if batch.next_offset() <= next {
                    // Duplicate: acknowledged without writing.
                } else {
                    assert_eq!(batch.base_offset(), next, "overlap reached the log");
                    self.broker_log.push(batch.clone());
                }
                let ack = self
                    .broker
                    .acknowledger(0)
                    .on_stored(batch.next_offset())
                    .frame;
                // The datagram copy: lost 30 % of the time, sometimes twice.
                for _ in 0..self.rng.random_range(0..3) {
                    if self.rng.random_bool(0.7) {
                        self.ack_datagrams.push(batch.next_offset());
                    }
                }
                self.to_edge.push_back(ack);
            }
            IngestAction::Refuse(frame) => panic!("broker refused: {frame:?}"),
            IngestAction::DeclareHole(hole) => panic!("no hole in this simulation: {hole:?}"),
            other => panic!("no refetch in this simulation: {other:?}"),
        }
    }

    fn deliver_to_edge(&mut self) {
        let Some(frame) = self.to_edge.pop_front() else {
            return;
        };
        let start = self.edge_log.first().map_or(0, EncodedBatch::base_offset);
        let hwm = next_offset(&self.edge_log);
        let event = self.edge.on_frame(frame, start, hwm);
        self.on_edge_event(event);
    }

    fn deliver_ack_datagram(&mut self) {
        if self.ack_datagrams.is_empty() {
            return;
        }
        let any = self.rng.random_range(0..self.ack_datagrams.len());
        let next_offset = self.ack_datagrams.swap_remove(any);
        let event = self.edge.on_datagram_ack(next_offset);
        self.on_edge_event(event);
    }

    fn on_edge_event(&mut self, event: Result<EdgeEvent, EdgeError>) {
        match event {
            Ok(EdgeEvent::Resumed { from }) => assert!(from >= self.checkpoint),
            Ok(EdgeEvent::Acked { next_offset }) => {
                assert!(next_offset > self.checkpoint);
                self.checkpoint = next_offset;
            }
            Ok(EdgeEvent::AlreadyAcked) => {}
            Ok(
                other @ (EdgeEvent::Refetch { .. }
                | EdgeEvent::Archived { .. }
                | EdgeEvent::ProgressRequested { .. }
                | EdgeEvent::Tip { .. }
                | EdgeEvent::ClusterId { .. }),
            ) => {
                panic!(
                    "no refetch, archive, progress, tip or cluster id in this simulation: {other:?}"
                )
            }
            Err(e) => panic!("edge error: {e}"),
        }
    }

    fn check_prefix(&self) {
        assert!(self.broker_log.len() <= self.edge_log.len());
        for (b, e) in self.broker_log.iter().zip(&self.edge_log) {
            assert_eq!(b.as_bytes(), e.as_bytes(), "broker log diverged");
        }
        assert!(self.checkpoint <= next_offset(&self.broker_log));
    }
}

fn new_edge() -> EdgeStream {
    EdgeStream::new(
        "/plant1/power".into(),
        Some(StreamIntent::TaskQueue.expand()),
        Window {
            batches: 4,
            bytes: 1 << 20,
        },
    )
}

fn run(seed: u64) {
    let mut sim = Sim::new(seed);
    for _ in 0..2_000 {
        match sim.rng.random_range(0..100) {
            0..30 => sim.publish(),
            30..55 => sim.deliver_to_broker(),
            55..70 => sim.deliver_to_edge(),
            70..80 => sim.deliver_ack_datagram(),
            80..97 => sim.edge_send(),
            _ => sim.connect(),
        }
        sim.check_prefix();
    }
    // Heal: no more disconnects; everything converges.
    for _ in 0..100_000 {
        sim.edge_send();
        sim.deliver_to_broker();
        sim.deliver_to_edge();
        sim.deliver_ack_datagram();
        if sim.to_broker.is_empty()
            && sim.to_edge.is_empty()
            && sim.checkpoint == next_offset(&sim.edge_log)
        {
            break;
        }
    }
    sim.check_prefix();
    assert_eq!(sim.broker_log.len(), sim.edge_log.len(), "did not converge");
    assert_eq!(sim.checkpoint, next_offset(&sim.edge_log));
    assert!(sim.connections > 1);
}

#[test]
fn broker_log_is_always_a_prefix_and_converges_over_200_seeds() {
    for seed in 0..200 {
        let result = std::panic::catch_unwind(|| run(seed));
        assert!(result.is_ok(), "simulation failed for seed {seed}");
    }
}

#[test]
fn a_tip_is_reported_only_when_asked_and_only_before_the_welcome() {
    let tip = Frame::Tip {
        base_offset: 5,
        next_offset: 9,
        crc32c: 7,
    };
    let mut edge = new_edge().with_tip_check();
    let Frame::Hello(hello) = edge.hello() else {
        panic!("hello")
    };
    assert!(hello.tip);
    assert_eq!(
        edge.on_frame(tip.clone(), 0, 10),
        Ok(EdgeEvent::Tip {
            base_offset: 5,
            next_offset: 9,
            crc32c: 7
        })
    );
    assert_eq!(
        edge.on_frame(Frame::Welcome { high_water_mark: 9 }, 0, 10),
        Ok(EdgeEvent::Resumed { from: 9 })
    );
    assert!(matches!(
        edge.on_frame(tip.clone(), 0, 10),
        Err(EdgeError::Protocol(_))
    ));
    // Not asked: a protocol violation.
    let mut edge = new_edge();
    let Frame::Hello(hello) = edge.hello() else {
        panic!("hello")
    };
    assert!(!hello.tip);
    assert!(matches!(
        edge.on_frame(tip, 0, 10),
        Err(EdgeError::Protocol(_))
    ));
}

#[test]
fn edge_refuses_a_broker_that_is_ahead_or_needs_deleted_data() {
    let mut edge = new_edge();
    let err = edge
        .on_frame(
            Frame::Welcome {
                high_water_mark: 11,
            },
            0,
            10,
        )
        .unwrap_err();
    assert_eq!(
        err,
        EdgeError::BrokerAhead {
            broker: 11,
            local: 10
        }
    );
    let mut edge = new_edge();
    let err = edge
        .on_frame(Frame::Welcome { high_water_mark: 3 }, 5, 10)
        .unwrap_err();
    assert_eq!(
        err,
        EdgeError::LocalDataMissing {
            broker: 3,
            local_start: 5
        }
    );
}

#[test]
fn a_resume_over_missing_offsets_declares_them_first() {
    let mut edge = new_edge();
    assert!(matches!(
        edge.on_frame(Frame::Welcome { high_water_mark: 3 }, 5, 10),
        Err(EdgeError::LocalDataMissing { .. })
    ));
    assert!(matches!(
        edge.resume_over_missing(11, 10),
        Err(EdgeError::BrokerAhead { .. })
    ));
    assert_eq!(
        edge.resume_over_missing(3, 10),
        Ok(EdgeEvent::Resumed { from: 3 })
    );
    assert_eq!(edge.next_to_send(10), Some(3));
    let hole = edge.hole(3, 5, HoleCause::Lost, "dropped".into());
    assert!(matches!(
        hole,
        Frame::Hole {
            first_offset: 3,
            end_offset: 5,
            ..
        }
    ));
    assert_eq!(edge.next_to_send(10), Some(5));
    // Only while the Welcome is pending.
    assert!(matches!(
        edge.resume_over_missing(5, 10),
        Err(EdgeError::Protocol(_))
    ));
}

/// An edge welcomed at `high_water_mark` with a local log of offsets
/// 0..10.
fn streaming_edge(high_water_mark: u64) -> EdgeStream {
    let mut edge = new_edge();
    assert_eq!(
        edge.on_frame(Frame::Welcome { high_water_mark }, 0, 10),
        Ok(EdgeEvent::Resumed {
            from: high_water_mark
        })
    );
    edge
}

#[test]
fn edge_rejects_acks_it_never_asked_for() {
    let mut edge = streaming_edge(0);
    assert!(matches!(
        edge.on_frame(Frame::Ack { next_offset: 5 }, 0, 10),
        Err(EdgeError::Protocol(_))
    ));
}

#[test]
fn either_copy_of_an_acknowledgement_advances_the_edge_once() {
    let mut edge = streaming_edge(0);
    for base in [0, 5] {
        let batch = RecordBatch::new(base, vec![Record::default(); 5])
            .encode(&Limits::default())
            .unwrap();
        edge.on_sent(batch.header(), batch.len());
    }
    assert_eq!(edge.in_flight(), 2);
    // The datagram for the second batch overtakes both Ack frames.
    assert_eq!(
        edge.on_datagram_ack(10),
        Ok(EdgeEvent::Acked { next_offset: 10 })
    );
    assert_eq!(edge.in_flight(), 0);
    assert_eq!(
        edge.on_frame(Frame::Ack { next_offset: 5 }, 0, 10),
        Ok(EdgeEvent::AlreadyAcked)
    );
    assert_eq!(
        edge.on_frame(Frame::Ack { next_offset: 10 }, 0, 10),
        Ok(EdgeEvent::AlreadyAcked)
    );
    // Late and duplicated datagrams change nothing.
    assert_eq!(edge.on_datagram_ack(5), Ok(EdgeEvent::AlreadyAcked));
    assert_eq!(edge.on_datagram_ack(10), Ok(EdgeEvent::AlreadyAcked));
    assert_eq!(edge.acked(), 10);
    // The stream's own acknowledgements must still rise.
    assert!(matches!(
        edge.on_frame(Frame::Ack { next_offset: 10 }, 0, 10),
        Err(EdgeError::Protocol(_))
    ));
}

#[test]
fn ack_datagrams_before_the_welcome_or_beyond_what_was_sent_are_refused() {
    let mut edge = new_edge();
    assert!(matches!(
        edge.on_datagram_ack(0),
        Err(EdgeError::Protocol(_))
    ));
    let mut edge = streaming_edge(3);
    assert_eq!(edge.on_datagram_ack(3), Ok(EdgeEvent::AlreadyAcked));
    assert!(matches!(
        edge.on_datagram_ack(4),
        Err(EdgeError::Protocol(_))
    ));
}

fn open(broker: &mut IngestStream, topic: &str) -> IngestAction {
    open_asking(broker, topic, false)
}

fn open_asking(broker: &mut IngestStream, topic: &str, ack_datagrams: bool) -> IngestAction {
    broker.on_frame(Frame::Hello(super::frame::Hello {
        protocol: super::frame::PROTOCOL_VERSION,
        topic: topic.into(),
        settings: Some(StreamIntent::AuditLog.expand()),
        ack_datagrams,
        progress: false,
        tip: false,
        cluster_id: false,
    }))
}

#[test]
fn the_broker_acknowledges_with_a_frame_and_a_datagram_only_for_edges_that_ask() {
    let limits = Limits::default();
    let mut broker = IngestStream::new("plant1".into(), limits);
    // Before a Hello: frames only.
    assert_eq!(
        broker.acknowledger(4).on_stored(7),
        Acknowledgement {
            frame: Frame::Ack { next_offset: 7 },
            datagram: None,
        }
    );
    let _ = open_asking(&mut broker, "/plant1/power", true);
    let _ = broker.welcome(0);
    assert_eq!(
        broker.acknowledger(4).on_stored(12),
        Acknowledgement {
            frame: Frame::Ack { next_offset: 12 },
            datagram: Some(AckDatagram {
                stream_id: 4,
                next_offset: 12,
            }),
        }
    );
    let mut broker = IngestStream::new("plant1".into(), limits);
    let _ = open_asking(&mut broker, "/plant1/power", false);
    let _ = broker.welcome(0);
    assert_eq!(broker.acknowledger(4).on_stored(12).datagram, None);
    // A refused Hello does not turn datagrams on.
    let mut broker = IngestStream::new("plant1".into(), limits);
    let _ = open_asking(&mut broker, "/plant2/power", true);
    assert_eq!(broker.acknowledger(4).on_stored(1).datagram, None);
}

fn refusal_code(action: IngestAction) -> ErrorCode {
    match action {
        IngestAction::Refuse(Frame::Error { code, .. }) => code,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn broker_refuses_foreign_namespaces_bad_names_and_bad_batches() {
    let limits = Limits::default();
    let mut broker = IngestStream::new("plant1".into(), limits);
    assert_eq!(
        refusal_code(open(&mut broker, "/plant2/power")),
        ErrorCode::NotOwner
    );
    let mut broker = IngestStream::new("plant1".into(), limits);
    assert_eq!(
        refusal_code(open(&mut broker, "/plant1/../x")),
        ErrorCode::InvalidTopic
    );
    // A certificate for a namespace the system keeps writes nothing, not
    // even to its own namespace.
    for reserved in ["_system", "default"] {
        let mut broker = IngestStream::new(reserved.into(), limits);
        assert_eq!(
            refusal_code(open(&mut broker, &format!("/{reserved}/evil"))),
            ErrorCode::NotOwner
        );
    }
    let mut broker = IngestStream::new("plant1".into(), limits);
    assert_eq!(
        refusal_code(broker.on_frame(Frame::Ack { next_offset: 1 })),
        ErrorCode::Malformed
    );

    let batch = RecordBatch::new(0, vec![Record::default()])
        .encode(&limits)
        .unwrap();
    let mut broker = IngestStream::new("plant1".into(), limits);
    assert!(matches!(
        open(&mut broker, "/plant1/power"),
        IngestAction::Open(..)
    ));
    let _ = broker.welcome(0);
    // A flipped byte: corrupt.
    let mut bad = batch.as_bytes().to_vec();
    bad[30] ^= 1;
    let frame = Frame::Batch {
        codec: super::frame::WireCodec::None,
        payload: Bytes::from(bad),
    };
    assert_eq!(refusal_code(broker.on_frame(frame)), ErrorCode::Corrupt);
    // A gap.
    let mut broker = IngestStream::new("plant1".into(), limits);
    let _ = open(&mut broker, "/plant1/power");
    let _ = broker.welcome(0);
    let later = batch.clone().with_base_offset(5);
    assert_eq!(
        refusal_code(broker.on_frame(Frame::batch(&later, false))),
        ErrorCode::Gap
    );
    // Over the broker's limit.
    let small = Limits {
        max_record_bytes: 10,
        max_batch_bytes: 60,
    };
    let big = RecordBatch::new(
        0,
        vec![Record {
            value: Bytes::from(vec![1u8; 40]),
            ..Record::default()
        }],
    )
    .encode(&limits)
    .unwrap();
    let mut broker = IngestStream::new("plant1".into(), small);
    let _ = open(&mut broker, "/plant1/power");
    let _ = broker.welcome(0);
    assert_eq!(
        refusal_code(broker.on_frame(Frame::batch(&big, false))),
        ErrorCode::TooLarge
    );
}
