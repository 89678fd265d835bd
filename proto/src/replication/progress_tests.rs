//! `ProgressRequest` / `Progress` in both state machines: negotiated by the
//! Hello's `progress` flag, so an edge or broker that predates them never
//! receives a frame type it does not know.

use super::edge::{EdgeError, EdgeEvent, EdgeStream, Window};
use super::frame::{ErrorCode, Frame, Hello, PROTOCOL_VERSION};
use super::ingest::{IngestAction, IngestStream};
use crate::intent::StreamIntent;
use crate::limits::Limits;

fn edge() -> EdgeStream {
    EdgeStream::new(
        "/plant1/power".into(),
        Some(StreamIntent::TaskQueue.expand()),
        Window::default(),
    )
}

/// A broker stream opened by `hello` and welcomed at `high_water_mark`.
fn broker_after(hello: Frame, high_water_mark: u64) -> IngestStream {
    let mut broker = IngestStream::new("plant1".into(), Limits::default());
    assert!(matches!(broker.on_frame(hello), IngestAction::Open(..)));
    let _ = broker.welcome(high_water_mark);
    broker
}

#[test]
fn a_new_edge_reports_its_high_water_mark_when_asked_and_only_when_it_changed() {
    let mut edge = edge();
    let hello = edge.hello();
    assert!(matches!(&hello, Frame::Hello(h) if h.progress && h.ack_datagrams));
    let mut broker = broker_after(hello, 100);
    // Not before the broker asked.
    assert_eq!(edge.progress(120), None);
    assert_eq!(edge.progress_interval_ms(), None);
    let welcome = Frame::Welcome {
        high_water_mark: 100,
    };
    assert_eq!(
        edge.on_frame(welcome, 0, 120),
        Ok(EdgeEvent::Resumed { from: 100 })
    );
    let request = broker.progress_request(1_000).expect("asked once");
    assert_eq!(request, Frame::ProgressRequest { interval_ms: 1_000 });
    assert_eq!(broker.progress_request(1_000), None, "asked only once");
    assert_eq!(
        edge.on_frame(request, 0, 120),
        Ok(EdgeEvent::ProgressRequested { interval_ms: 1_000 })
    );
    assert_eq!(edge.progress_interval_ms(), Some(1_000));
    let first = edge.progress(120).expect("first report");
    assert_eq!(
        first,
        Frame::Progress {
            high_water_mark: 120
        }
    );
    assert_eq!(edge.progress(120), None, "unchanged: nothing to send");
    let second = edge.progress(135).expect("changed");
    for (frame, hwm) in [(first, 120), (second, 135)] {
        match broker.on_frame(frame) {
            IngestAction::Progress { high_water_mark } => assert_eq!(high_water_mark, hwm),
            other => panic!("expected Progress, got {other:?}"),
        }
    }
}

#[test]
fn an_edge_that_predates_progress_is_never_asked() {
    // A Hello as an older edge writes it: no `progress` field.
    let old: Hello = serde_json::from_str(&format!(
        r#"{{"protocol":{PROTOCOL_VERSION},"topic":"/plant1/power","settings":null,"ack_datagrams":true}}"#
    ))
    .expect("old hello");
    assert!(!old.progress);
    let mut broker = broker_after(Frame::Hello(old), 0);
    assert_eq!(broker.progress_request(1_000), None);
}

#[test]
fn a_new_edge_sends_nothing_to_a_broker_that_never_asks() {
    // An older broker ignores the Hello's `progress` and never asks.
    let mut edge = edge();
    let _ = edge.on_frame(Frame::Welcome { high_water_mark: 5 }, 0, 9);
    assert_eq!(edge.progress(9), None);
    assert_eq!(edge.progress(10), None);
}

#[test]
fn progress_out_of_turn_is_refused_on_both_sides() {
    // A Progress frame the broker did not ask for.
    let mut broker = broker_after(edge().hello(), 0);
    match broker.on_frame(Frame::Progress { high_water_mark: 3 }) {
        IngestAction::Refuse(Frame::Error { code, .. }) => assert_eq!(code, ErrorCode::Malformed),
        other => panic!("expected a refusal, got {other:?}"),
    }
    // No request before the welcome.
    let mut broker = IngestStream::new("plant1".into(), Limits::default());
    let _ = broker.on_frame(edge().hello());
    assert_eq!(broker.progress_request(1_000), None);
    // A ProgressRequest before the Welcome is a protocol violation.
    let mut edge = edge();
    assert!(matches!(
        edge.on_frame(Frame::ProgressRequest { interval_ms: 5 }, 0, 0),
        Err(EdgeError::Protocol(_))
    ));
}
