//! The `ClusterId` frame and its negotiation: exact bytes, refused
//! payloads, and that neither side sends or takes it unless the edge's
//! `Hello` asked (FORMAT.md, "Cluster identity").

use bytes::{BufMut, BytesMut};

use super::edge::{EdgeError, EdgeEvent, EdgeStream, Window};
use super::frame::{Frame, FrameError, Hello, PROTOCOL_VERSION, decode};
use super::ingest::{IngestAction, IngestStream};
use crate::cluster::ClusterId;
use crate::intent::StreamIntent;
use crate::limits::Limits;

fn id(byte: u8) -> ClusterId {
    ClusterId::from_random([byte; 16])
}

fn hello(cluster_id: bool) -> Hello {
    Hello {
        protocol: PROTOCOL_VERSION,
        topic: "/plant1/power".into(),
        settings: Some(StreamIntent::AuditLog.expand()),
        ack_datagrams: true,
        progress: true,
        tip: true,
        cluster_id,
    }
}

fn edge() -> EdgeStream {
    EdgeStream::new("/plant1/power".into(), None, Window::default())
}

#[test]
fn the_frame_has_exact_bytes_and_round_trips() {
    let frame = Frame::ClusterId { id: id(0x11) };
    let mut wire = BytesMut::from(frame.to_bytes().as_ref());
    let mut expected = vec![17, 0, 0, 0, 15];
    expected.extend_from_slice(&id(0x11).to_bytes());
    assert_eq!(wire.as_ref(), &expected[..]);
    assert_eq!(id(0x11).to_string(), "11111111-1111-4111-9111-111111111111");
    assert_eq!(decode(&mut wire, &Limits::default()), Ok(Some(frame)));
    assert!(wire.is_empty());
}

#[test]
fn a_payload_of_another_length_or_the_nil_id_is_malformed() {
    for payload in [vec![], vec![7; 15], vec![7; 17], vec![7; 32], vec![0; 16]] {
        let mut wire = BytesMut::new();
        wire.put_u32_le(payload.len() as u32 + 1);
        wire.put_u8(15);
        wire.put_slice(&payload);
        let err = decode(&mut wire, &Limits::default()).unwrap_err();
        assert!(
            matches!(
                err,
                FrameError::Malformed {
                    kind: "cluster_id",
                    ..
                }
            ),
            "{} bytes: {err}",
            payload.len()
        );
    }
}

#[test]
fn a_hello_without_the_field_is_the_older_hello_and_reads_as_not_asking() {
    let old = br#"{"protocol":2,"topic":"/plant1/power","settings":null,"tip":true}"#;
    let parsed: Hello = serde_json::from_slice(old).unwrap();
    assert!(!parsed.cluster_id);
    let json = serde_json::to_value(hello(false)).unwrap();
    assert!(json.get("cluster_id").is_none(), "{json}");
    let json = serde_json::to_value(hello(true)).unwrap();
    assert_eq!(json["cluster_id"], true);
    // What an edge that checks sends.
    let Frame::Hello(sent) = edge().with_cluster_check().hello() else {
        panic!("hello");
    };
    assert!(sent.cluster_id);
    let Frame::Hello(sent) = edge().hello() else {
        panic!("hello");
    };
    assert!(!sent.cluster_id);
}

#[test]
fn the_broker_sends_the_id_only_when_asked_once_and_before_the_welcome() {
    // Not asked (an older edge): nothing, before or after the welcome.
    let mut broker = IngestStream::new("plant1".into(), Limits::default());
    assert!(!broker.wants_cluster_id());
    assert!(broker.cluster_id(id(1)).is_none(), "before the hello");
    let IngestAction::Open(..) = broker.on_frame(Frame::Hello(hello(false))) else {
        panic!("not opened");
    };
    assert!(!broker.wants_cluster_id());
    assert_eq!(broker.cluster_id(id(1)), None);
    let _ = broker.welcome(0);
    assert_eq!(broker.cluster_id(id(1)), None);

    // Asked: exactly once, before the welcome.
    let mut broker = IngestStream::new("plant1".into(), Limits::default());
    let IngestAction::Open(..) = broker.on_frame(Frame::Hello(hello(true))) else {
        panic!("not opened");
    };
    assert!(broker.wants_cluster_id());
    assert_eq!(
        broker.cluster_id(id(1)),
        Some(Frame::ClusterId { id: id(1) })
    );
    assert!(!broker.wants_cluster_id());
    assert_eq!(broker.cluster_id(id(1)), None);

    // Asked, but the welcome went first: too late.
    let mut broker = IngestStream::new("plant1".into(), Limits::default());
    let IngestAction::Open(..) = broker.on_frame(Frame::Hello(hello(true))) else {
        panic!("not opened");
    };
    let _ = broker.welcome(3);
    assert_eq!(broker.cluster_id(id(1)), None);
}

#[test]
fn the_edge_takes_the_id_only_when_asked_and_only_first() {
    let cluster = Frame::ClusterId { id: id(2) };
    let mut stream = edge().with_cluster_check();
    assert_eq!(
        stream.on_frame(cluster.clone(), 0, 10),
        Ok(EdgeEvent::ClusterId { id: id(2) })
    );
    assert!(
        matches!(
            stream.on_frame(cluster.clone(), 0, 10),
            Err(EdgeError::Protocol(_))
        ),
        "twice"
    );

    // After another frame (an older broker's Tip or Welcome): a violation.
    let mut stream = edge().with_cluster_check().with_tip_check();
    let tip = Frame::Tip {
        base_offset: 0,
        next_offset: 5,
        crc32c: 1,
    };
    assert!(matches!(
        stream.on_frame(tip, 0, 10),
        Ok(EdgeEvent::Tip { .. })
    ));
    assert!(matches!(
        stream.on_frame(cluster.clone(), 0, 10),
        Err(EdgeError::Protocol(_))
    ));

    // An older broker sends none: the stream goes on as before.
    let mut stream = edge().with_cluster_check();
    assert_eq!(
        stream.on_frame(Frame::Welcome { high_water_mark: 4 }, 0, 10),
        Ok(EdgeEvent::Resumed { from: 4 })
    );

    // Not asked: a violation.
    let mut stream = edge();
    assert!(matches!(
        stream.on_frame(cluster, 0, 10),
        Err(EdgeError::Protocol(_))
    ));
}

#[test]
fn the_mismatch_error_names_both_ids_and_what_to_do() {
    let text = EdgeError::OtherCluster {
        expected: id(0xaa),
        found: id(0xbb),
        broker: "10.0.0.9:7000".into(),
    }
    .to_string();
    for needle in [
        "aaaaaaaa-aaaa-4aaa-aaaa-aaaaaaaaaaaa",
        "bbbbbbbb-bbbb-4bbb-bbbb-bbbbbbbbbbbb",
        "10.0.0.9:7000",
        "Point `brokers` back",
        "fresh data directory",
    ] {
        assert!(text.contains(needle), "{needle}: {text}");
    }
}
