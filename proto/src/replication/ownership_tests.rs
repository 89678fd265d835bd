//! Protocol version 2: redirects to a topic's owner, the archived offset,
//! and refusing other versions.

use bytes::BytesMut;

use super::edge::{EdgeError, EdgeEvent, EdgeStream, Window};
use super::frame::{self, ErrorCode, Frame, Hello, PROTOCOL_VERSION, Redirect};
use super::ingest::{IngestAction, IngestStream};
use crate::intent::StreamIntent;
use crate::limits::Limits;

fn roundtrip(frame: &Frame) -> Frame {
    let mut buf = BytesMut::from(&frame.to_bytes()[..]);
    let decoded = frame::decode(&mut buf, &Limits::default())
        .expect("decodes")
        .expect("complete");
    assert!(buf.is_empty());
    decoded
}

fn redirect() -> Redirect {
    Redirect {
        broker_id: 2,
        ingest_addr: "127.0.0.1:7412".into(),
        epoch: 7,
    }
}

#[test]
fn redirect_and_archived_frames_round_trip_and_reject_bad_payloads() {
    for frame in [
        Frame::Redirect(redirect()),
        Frame::Archived {
            archived_offset: 18_150,
        },
    ] {
        assert_eq!(roundtrip(&frame), frame);
    }
    // An Archived payload of 7 bytes, a Redirect without an address.
    let mut short = BytesMut::from(&[8u8, 0, 0, 0, 11, 1, 2, 3, 4, 5, 6, 7][..]);
    assert!(matches!(
        frame::decode(&mut short, &Limits::default()),
        Err(frame::FrameError::Malformed {
            kind: "archived",
            ..
        })
    ));
    let json = br#"{"broker_id":2,"ingest_addr":"","epoch":1}"#;
    let mut raw = BytesMut::new();
    raw.extend_from_slice(&(json.len() as u32 + 1).to_le_bytes());
    raw.extend_from_slice(&[10]);
    raw.extend_from_slice(json);
    assert!(matches!(
        frame::decode(&mut raw, &Limits::default()),
        Err(frame::FrameError::Malformed {
            kind: "redirect",
            ..
        })
    ));
}

fn hello(protocol: u32) -> Frame {
    Frame::Hello(Hello {
        protocol,
        topic: "/plant1/power".into(),
        settings: Some(StreamIntent::AuditLog.expand()),
        ack_datagrams: true,
        progress: false,
        tip: false,
        cluster_id: false,
    })
}

#[test]
fn a_broker_refuses_an_edge_of_another_protocol_version_naming_both() {
    for (protocol, upgrade) in [(1, "upgrade the edge agent"), (3, "upgrade the broker")] {
        let mut broker = IngestStream::new("plant1".into(), Limits::default());
        match broker.on_frame(hello(protocol)) {
            IngestAction::Refuse(Frame::Error { code, message }) => {
                assert_eq!(code, ErrorCode::UnsupportedProtocol);
                assert!(
                    message.contains(&format!("protocol {protocol}")),
                    "{message}"
                );
                assert!(message.contains(upgrade), "{message}");
                assert!(!code.is_retryable());
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
    }
}

#[test]
fn a_redirect_instead_of_the_welcome_ends_the_edge_stream_naming_the_owner() {
    let mut broker = IngestStream::new("plant1".into(), Limits::default());
    assert!(matches!(
        broker.on_frame(hello(PROTOCOL_VERSION)),
        IngestAction::Open(..)
    ));
    let frame = broker.redirect(redirect());
    // The broker's stream is closed: nothing more is accepted on it.
    assert!(matches!(
        broker.on_frame(Frame::Ack { next_offset: 1 }),
        IngestAction::Refuse(_)
    ));
    let mut edge = EdgeStream::new("/plant1/power".into(), None, Window::default());
    assert_eq!(
        edge.on_frame(frame, 0, 10),
        Err(EdgeError::Redirected(redirect()))
    );
    // After a welcome, a redirect is a protocol violation.
    let mut edge = EdgeStream::new("/plant1/power".into(), None, Window::default());
    let _ = edge.on_frame(Frame::Welcome { high_water_mark: 0 }, 0, 10);
    assert!(matches!(
        edge.on_frame(Frame::Redirect(redirect()), 0, 10),
        Err(EdgeError::Protocol(_))
    ));
}

#[test]
fn the_archived_offset_rises_only_and_never_past_what_the_stream_acknowledged() {
    let mut broker = IngestStream::new("plant1".into(), Limits::default());
    let _ = broker.on_frame(hello(PROTOCOL_VERSION));
    assert_eq!(
        broker.archived(5),
        None,
        "no archived frame before the welcome"
    );
    let welcome = broker.welcome(100);
    assert_eq!(
        broker.archived(101),
        None,
        "above the stream's high-water mark"
    );
    let archived = broker.archived(60).expect("frame");

    let mut edge = EdgeStream::new("/plant1/power".into(), None, Window::default());
    // Archived before the welcome is a protocol violation.
    assert!(matches!(
        edge.on_frame(archived.clone(), 0, 200),
        Err(EdgeError::Protocol(_))
    ));
    let mut edge = EdgeStream::new("/plant1/power".into(), None, Window::default());
    assert_eq!(
        edge.on_frame(welcome, 0, 200),
        Ok(EdgeEvent::Resumed { from: 100 })
    );
    assert_eq!(
        edge.on_frame(archived, 0, 200),
        Ok(EdgeEvent::Archived {
            archived_offset: 60
        })
    );
    // Lower or equal: nothing new.
    assert_eq!(
        edge.on_frame(
            Frame::Archived {
                archived_offset: 40
            },
            0,
            200
        ),
        Ok(EdgeEvent::AlreadyAcked)
    );
    // Above what the edge saw acknowledged: clamped to it.
    assert_eq!(
        edge.on_frame(
            Frame::Archived {
                archived_offset: 150
            },
            0,
            200
        ),
        Ok(EdgeEvent::Archived {
            archived_offset: 100
        })
    );
}
