//! The refetch path in both state machines: the broker asks for a damaged
//! range it acknowledged, the edge answers with `Repair` batches covering
//! it exactly (or says it no longer holds it), and both sides refuse
//! anything else.

use super::edge::{EdgeError, EdgeEvent, EdgeStream, RefetchAnswer, Window};
use super::frame::{ErrorCode, Frame, Hello, PROTOCOL_VERSION};
use super::ingest::{IngestAction, IngestStream, RepairBatch};
use crate::batch::{EncodedBatch, Record, RecordBatch};
use crate::intent::StreamIntent;
use crate::limits::Limits;

fn batch(base: u64, count: usize) -> EncodedBatch {
    RecordBatch::new(base, vec![Record::default(); count])
        .encode(&Limits::default())
        .unwrap()
}

fn streaming_edge(high_water_mark: u64) -> EdgeStream {
    let mut edge = EdgeStream::new(
        "/plant1/power".into(),
        Some(StreamIntent::TaskQueue.expand()),
        Window::default(),
    );
    let event = edge.on_frame(Frame::Welcome { high_water_mark }, 0, high_water_mark);
    assert!(matches!(event, Ok(EdgeEvent::Resumed { .. })));
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
fn a_refetch_is_answered_with_repair_batches_covering_the_range_exactly() {
    let mut broker = streaming_broker(100);
    let mut edge = streaming_edge(100);
    let request = broker.refetch(40, 60).expect("a refetch frame");
    assert_eq!(
        request,
        Frame::Refetch {
            first_offset: 40,
            end_offset: 60
        }
    );
    // The same range is asked for once at a time; past the stream's end never.
    assert_eq!(broker.refetch(40, 60), None);
    assert_eq!(broker.refetch(90, 101), None);
    assert_eq!(
        edge.on_frame(request, 0, 100),
        Ok(EdgeEvent::Refetch {
            first_offset: 40,
            end_offset: 60
        })
    );
    assert_eq!(
        edge.answer_refetch(0),
        Some(RefetchAnswer::Resend {
            first_offset: 40,
            end_offset: 60
        })
    );
    let parts = [batch(40, 5), batch(45, 15)];
    for (i, part) in parts.iter().enumerate() {
        edge.on_repair_sent(part.header());
        match broker.on_frame(Frame::repair(part, i == 1)) {
            IngestAction::Repair(RepairBatch {
                first_offset,
                end_offset,
                batch,
                complete,
            }) => {
                assert_eq!((first_offset, end_offset), (40, 60));
                assert_eq!(&batch, part);
                assert_eq!(complete, i == 1);
            }
            other => panic!("expected a repair, got {other:?}"),
        }
    }
    assert_eq!(edge.pending_refetches(), 0);
    assert_eq!(broker.pending_refetches(), 0);
    // Repairs are not acknowledged and took no room: the window is as before.
    assert_eq!(edge.in_flight(), 0);
    assert_eq!(edge.acked(), 100);
}

#[test]
fn an_edge_that_no_longer_holds_the_range_says_so_with_its_log_start() {
    let mut broker = streaming_broker(100);
    let mut edge = streaming_edge(100);
    let request = broker.refetch(10, 20).unwrap();
    assert!(matches!(
        edge.on_frame(request, 50, 100),
        Ok(EdgeEvent::Refetch { .. })
    ));
    let Some(RefetchAnswer::Unavailable(answer)) = edge.answer_refetch(50) else {
        panic!("expected unavailable");
    };
    assert_eq!(
        answer,
        Frame::RefetchUnavailable {
            first_offset: 10,
            end_offset: 20,
            log_start: 50
        }
    );
    assert!(matches!(
        broker.on_frame(answer),
        IngestAction::RefetchUnavailable {
            first_offset: 10,
            end_offset: 20,
            log_start: 50
        }
    ));
    assert_eq!(broker.pending_refetches(), 0);
    assert_eq!(edge.answer_refetch(50), None);
}

#[test]
fn a_partial_answer_then_unavailable_drops_the_request() {
    let mut broker = streaming_broker(100);
    let request = broker.refetch(40, 60).unwrap();
    let mut edge = streaming_edge(100);
    let _ = edge.on_frame(request, 0, 100).unwrap();
    let part = batch(40, 5);
    edge.on_repair_sent(part.header());
    assert!(matches!(
        broker.on_frame(Frame::repair(&part, false)),
        IngestAction::Repair(RepairBatch {
            complete: false,
            ..
        })
    ));
    // The edge's own copy is damaged further on.
    let answer = edge.refetch_unavailable(0).unwrap();
    assert!(matches!(
        broker.on_frame(answer),
        IngestAction::RefetchUnavailable { .. }
    ));
    assert_eq!(broker.pending_refetches(), 0);
}

#[test]
fn the_broker_refuses_repairs_nobody_asked_for_or_that_do_not_fit() {
    // No request.
    let mut broker = streaming_broker(100);
    assert_eq!(
        refusal_code(broker.on_frame(Frame::repair(&batch(40, 5), false))),
        ErrorCode::Malformed
    );
    // Not where the answer continues, or past the range's end.
    for bad in [batch(41, 5), batch(40, 25)] {
        let mut broker = streaming_broker(100);
        let _ = broker.refetch(40, 60).unwrap();
        assert_eq!(
            refusal_code(broker.on_frame(Frame::repair(&bad, false))),
            ErrorCode::Malformed
        );
    }
    // Bytes that fail the CRC.
    let mut broker = streaming_broker(100);
    let _ = broker.refetch(40, 60).unwrap();
    let mut bytes = batch(40, 20).as_bytes().to_vec();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    let frame = Frame::Repair {
        codec: super::frame::WireCodec::None,
        payload: bytes.into(),
    };
    assert_eq!(refusal_code(broker.on_frame(frame)), ErrorCode::Corrupt);
    // An answer for another range.
    let mut broker = streaming_broker(100);
    let _ = broker.refetch(40, 60).unwrap();
    let wrong = Frame::RefetchUnavailable {
        first_offset: 41,
        end_offset: 60,
        log_start: 0,
    };
    assert_eq!(refusal_code(broker.on_frame(wrong)), ErrorCode::Malformed);
}

#[test]
fn the_edge_refuses_a_refetch_of_what_the_broker_never_acknowledged() {
    let mut edge = streaming_edge(100);
    let result = edge.on_frame(
        Frame::Refetch {
            first_offset: 90,
            end_offset: 110,
        },
        0,
        200,
    );
    assert!(matches!(result, Err(EdgeError::Protocol(_))), "{result:?}");
    // Before the Welcome, too.
    let mut fresh = EdgeStream::new("/plant1/power".into(), None, Window::default());
    let early = fresh.on_frame(
        Frame::Refetch {
            first_offset: 0,
            end_offset: 1,
        },
        0,
        10,
    );
    assert!(matches!(early, Err(EdgeError::Protocol(_))));
}
