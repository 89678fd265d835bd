//! Acknowledgements that arrive as QUIC datagrams ahead of their `Ack`
//! frames: an in-process agent replicates to a scripted broker on a real
//! QUIC socket on 127.0.0.1 (mutual TLS with dev certificates). The script
//! stands in for a broker whose stream packets carrying `Ack` frames are
//! lost on the return path, which neither the real broker nor the test
//! relay can do on demand (the relay cannot tell stream packets from
//! datagrams inside QUIC's encryption).

mod common;

use std::time::Duration;

use broker_core::batch::EncodedBatch;
use broker_core::dev_certs::{self, broker_paths, edge_paths};
use broker_core::intent::StreamIntent;
use broker_core::replication::frame::{self, AckDatagram, Frame};
use broker_core::tls::{ALPN_REPLICATION, TlsIdentity};
use bytes::BytesMut;
use common::{config, get, post, start, topic};

/// Bound on every wait.
const WAIT: Duration = Duration::from_secs(20);

/// Reads frames from `recv` into `buf` until one is complete.
async fn next_frame(recv: &mut quinn::RecvStream, buf: &mut BytesMut) -> Frame {
    let limits = broker_core::Limits::default();
    loop {
        if let Some(frame) = frame::decode(buf, &limits).expect("edge sends valid frames") {
            return frame;
        }
        let chunk = tokio::time::timeout(WAIT, recv.read_chunk(64 * 1024, true))
            .await
            .expect("edge sends within the wait")
            .expect("stream readable")
            .expect("stream open");
        buf.extend_from_slice(&chunk.bytes);
    }
}

/// The next batch frame, opened.
async fn next_batch(recv: &mut quinn::RecvStream, buf: &mut BytesMut) -> EncodedBatch {
    match next_frame(recv, buf).await {
        Frame::Batch { codec, payload } => {
            frame::open_batch(codec, payload, &broker_core::Limits::default()).expect("batch")
        }
        other => panic!("expected a batch, got {other:?}"),
    }
}

async fn acknowledged(addr: std::net::SocketAddr) -> u64 {
    get(addr, "/v1/topics/e1/t").await.body["acknowledged_offset"]
        .as_u64()
        .expect("acknowledged_offset")
}

async fn wait_acknowledged(addr: std::net::SocketAddr, offset: u64) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while acknowledged(addr).await != offset {
        assert!(
            tokio::time::Instant::now() < deadline,
            "acknowledged offset {} != {offset} after {WAIT:?}",
            acknowledged(addr).await
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledgements_arriving_only_as_datagrams_advance_the_edge_and_late_ack_frames_are_harmless()
 {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    dev_certs::issue(&certs, &[1], &["e1".into()]).unwrap();
    let broker_tls = TlsIdentity::load(&broker_paths(&certs, 1)).unwrap();
    let server = broker_tls.quic_server(ALPN_REPLICATION).unwrap();
    let endpoint = quinn::Endpoint::server(server, "127.0.0.1:0".parse().unwrap()).unwrap();

    let mut agent_config = config(&dir.path().join("edge"));
    agent_config.brokers = vec![endpoint.local_addr().unwrap().to_string()];
    agent_config.tls = Some(edge_paths(&certs, "e1"));
    agent_config.topics = vec![topic("/e1/t", StreamIntent::EventStream)];
    let agent = start(agent_config).await;
    let addr = agent.local_addr();
    let r = post(
        addr,
        "/v1/topics/e1/t/batch",
        &[],
        b"{\"value\":\"a\"}\n".repeat(10).as_slice(),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);

    let conn = tokio::time::timeout(WAIT, endpoint.accept())
        .await
        .expect("edge connects")
        .expect("endpoint open")
        .await
        .expect("handshake");
    let (mut send, mut recv) = tokio::time::timeout(WAIT, conn.accept_bi())
        .await
        .expect("edge opens a stream")
        .expect("stream");
    let stream_id = u64::from(recv.id());
    let mut buf = BytesMut::new();
    assert!(matches!(
        next_frame(&mut recv, &mut buf).await,
        Frame::Hello(_)
    ));
    send.write_all(&Frame::Welcome { high_water_mark: 0 }.to_bytes())
        .await
        .unwrap();
    let first = next_batch(&mut recv, &mut buf).await;
    assert_eq!((first.base_offset(), first.next_offset()), (0, 10));

    // Only the datagram: the edge's acknowledged offset moves with it.
    conn.send_datagram(
        AckDatagram {
            stream_id,
            next_offset: 10,
        }
        .to_bytes(),
    )
    .unwrap();
    wait_acknowledged(addr, 10).await;

    // A datagram for another stream is ignored; the late Ack frame for the
    // same batch does not break the stream: the next batch comes on it.
    conn.send_datagram(
        AckDatagram {
            stream_id: stream_id + 4,
            next_offset: 99,
        }
        .to_bytes(),
    )
    .unwrap();
    send.write_all(&Frame::Ack { next_offset: 10 }.to_bytes())
        .await
        .unwrap();
    let r = post(
        addr,
        "/v1/topics/e1/t/batch",
        &[],
        b"{\"value\":\"b\"}\n".repeat(5).as_slice(),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let second = next_batch(&mut recv, &mut buf).await;
    assert_eq!((second.base_offset(), second.next_offset()), (10, 15));
    assert_eq!(acknowledged(addr).await, 10);

    // This time the Ack frame comes first and the datagram is stale.
    send.write_all(&Frame::Ack { next_offset: 15 }.to_bytes())
        .await
        .unwrap();
    wait_acknowledged(addr, 15).await;
    conn.send_datagram(
        AckDatagram {
            stream_id,
            next_offset: 15,
        }
        .to_bytes(),
    )
    .unwrap();

    let metrics = get(addr, "/metrics").await.text;
    let count = |path: &str| {
        let name = format!("tributary_edge_replication_acks_total{{path=\"{path}\"}} ");
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name.as_str()))
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    assert_eq!(count("datagram"), Some(1), "{metrics}");
    assert_eq!(count("stream"), Some(1), "{metrics}");
    assert_eq!(
        agent
            .replication_stats()
            .connects
            .load(std::sync::atomic::Ordering::Relaxed),
        1,
        "the stream never broke"
    );
    agent.shutdown().await.unwrap();
    endpoint.close(0u32.into(), b"done");
}
