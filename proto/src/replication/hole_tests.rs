//! The `Hole` frame in both state machines: the edge tracks a declared hole
//! like a sent batch, the broker accepts one only at its next expected
//! offset and expects the next batch at its end.

use super::edge::{EdgeEvent, EdgeStream, Window};
use super::frame::{ErrorCode, Frame, Hello, HoleCause, PROTOCOL_VERSION};
use super::ingest::{DeclaredHole, IngestAction, IngestStream};
use crate::batch::{EncodedBatch, Record, RecordBatch};
use crate::intent::StreamIntent;
use crate::limits::Limits;

fn batch(base: u64, count: usize) -> EncodedBatch {
    RecordBatch::new(base, vec![Record::default(); count])
        .encode(&Limits::default())
        .unwrap()
}

fn streaming_edge(high_water_mark: u64, local_hwm: u64) -> EdgeStream {
    let mut edge = EdgeStream::new(
        "/plant1/power".into(),
        Some(StreamIntent::TaskQueue.expand()),
        Window {
            batches: 4,
            bytes: 1 << 20,
        },
    );
    let event = edge.on_frame(Frame::Welcome { high_water_mark }, 0, local_hwm);
    assert_eq!(
        event,
        Ok(EdgeEvent::Resumed {
            from: high_water_mark
        })
    );
    edge
}

fn streaming_broker(high_water_mark: u64) -> IngestStream {
    let mut broker = IngestStream::new("plant1".into(), Limits::default());
    let opened = broker.on_frame(Frame::Hello(Hello {
        protocol: PROTOCOL_VERSION,
        topic: "/plant1/power".into(),
        settings: Some(StreamIntent::TaskQueue.expand()),
        ack_datagrams: false,
        progress: false,
        tip: false,
        cluster_id: false,
    }));
    assert!(matches!(opened, IngestAction::Open(..)));
    let _ = broker.welcome(high_water_mark);
    broker
}

fn refusal_code(action: IngestAction) -> ErrorCode {
    match action {
        IngestAction::Refuse(Frame::Error { code, .. }) => code,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn the_edge_tracks_a_hole_like_a_sent_batch_until_it_is_acknowledged() {
    let mut edge = streaming_edge(0, 30);
    let first = batch(0, 5);
    edge.on_sent(first.header(), first.len());
    assert_eq!(edge.next_to_send(30), Some(5));
    let frame = edge.hole(5, 20, HoleCause::Damaged, "crc mismatch".into());
    assert_eq!(
        frame,
        Frame::Hole {
            first_offset: 5,
            end_offset: 20,
            cause: HoleCause::Damaged,
            reason: "crc mismatch".into(),
        }
    );
    assert_eq!(edge.in_flight(), 2);
    assert_eq!(edge.next_to_send(30), Some(20));
    let after = batch(20, 10);
    edge.on_sent(after.header(), after.len());
    // The broker acknowledges the hole's end like a batch's.
    assert_eq!(
        edge.on_frame(Frame::Ack { next_offset: 5 }, 0, 30),
        Ok(EdgeEvent::Acked { next_offset: 5 })
    );
    assert_eq!(
        edge.on_frame(Frame::Ack { next_offset: 20 }, 0, 30),
        Ok(EdgeEvent::Acked { next_offset: 20 })
    );
    assert_eq!(edge.in_flight(), 1);
    assert_eq!(
        edge.on_frame(Frame::Ack { next_offset: 30 }, 0, 30),
        Ok(EdgeEvent::Acked { next_offset: 30 })
    );
    assert_eq!(edge.acked(), 30);
    assert_eq!(edge.in_flight(), 0);
}

#[test]
#[should_panic(expected = "a hole starts where the last batch ended")]
fn the_edge_never_declares_a_hole_anywhere_but_at_its_next_offset() {
    let mut edge = streaming_edge(4, 30);
    let _ = edge.hole(6, 9, HoleCause::Lost, String::new());
}

#[test]
fn the_broker_accepts_a_hole_only_at_its_next_expected_offset_and_then_expects_its_end() {
    let mut broker = streaming_broker(10);
    let action = broker.on_frame(Frame::Hole {
        first_offset: 10,
        end_offset: 25,
        cause: HoleCause::Lost,
        reason: "acknowledged offsets missing after recovery".into(),
    });
    let IngestAction::DeclareHole(hole) = action else {
        panic!("expected DeclareHole, got {action:?}");
    };
    assert_eq!(
        hole,
        DeclaredHole {
            first_offset: 10,
            end_offset: 25,
            cause: HoleCause::Lost,
            reason: "acknowledged offsets missing after recovery".into(),
        }
    );
    // The next batch starts at the hole's end.
    let next = batch(25, 3);
    assert!(matches!(
        broker.on_frame(Frame::batch(&next, false)),
        IngestAction::Append(b) if b.base_offset() == 25
    ));
    // A later batch past the expected 28 is a gap.
    assert_eq!(
        refusal_code(broker.on_frame(Frame::batch(&batch(30, 1), false))),
        ErrorCode::Gap
    );

    // A hole after the expected offset is a gap, one below it an overlap.
    let mut broker = streaming_broker(10);
    assert_eq!(
        refusal_code(broker.on_frame(Frame::Hole {
            first_offset: 11,
            end_offset: 25,
            cause: HoleCause::Damaged,
            reason: String::new(),
        })),
        ErrorCode::Gap
    );
    let mut broker = streaming_broker(10);
    assert_eq!(
        refusal_code(broker.on_frame(Frame::Hole {
            first_offset: 5,
            end_offset: 25,
            cause: HoleCause::Damaged,
            reason: String::new(),
        })),
        ErrorCode::Overlap
    );
    // Before the Welcome a hole is out of order.
    let mut broker = IngestStream::new("plant1".into(), Limits::default());
    assert_eq!(
        refusal_code(broker.on_frame(Frame::Hole {
            first_offset: 0,
            end_offset: 1,
            cause: HoleCause::Damaged,
            reason: String::new(),
        })),
        ErrorCode::Malformed
    );
}
