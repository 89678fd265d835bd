//! The broker's replication endpoint on real QUIC sockets (127.0.0.1) with
//! mutual TLS, driven by a minimal edge client speaking the frames:
//! acceptance, duplicates, resume, and every refusal (no client certificate,
//! another CA, another edge's namespace, invalid topic name, oversized
//! record, gap, truncated and garbage frames) — each refused stream stores
//! nothing and the broker keeps serving.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use broker_core::tls::{ALPN_REPLICATION, BROKER_SERVER_NAME, TlsIdentity};
use bytes::{Bytes, BytesMut};
use tributary_broker::config::BrokerConfig;
use tributary_proto::batch::{Record, RecordBatch};
use tributary_proto::intent::StreamIntent;
use tributary_proto::limits::Limits;
use tributary_proto::replication::frame::{
    self, AckDatagram, ErrorCode, Frame, Hello, PROTOCOL_VERSION,
};
use tributary_test_support::ports::{free_tcp, free_udp};

struct Broker {
    ingest: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

async fn start_broker(dir: &Path, certs: &Path) -> Broker {
    let ingest = free_udp();
    let text = format!(
        r#"node_id = 1
data_dir = "{data}"
raft_listen = "{raft}"
admin_listen = "{admin}"
ingest_listen = "{ingest}"
admin_token = "ingest-test-token"
[tls]
cert = "{certs}/broker-1.pem"
key = "{certs}/broker-1.key"
ca = "{certs}/ca.pem"
"#,
        data = dir.display(),
        raft = free_udp(),
        admin = free_tcp(),
        certs = certs.display(),
    );
    let config: BrokerConfig = toml::from_str(&text).expect("config");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let shutdown = async {
            let _ = stopped.await;
        };
        tributary_broker::server::run(config, shutdown)
            .await
            .expect("broker run");
    });
    Broker {
        ingest,
        stop: Some(stop),
        task,
    }
}

impl Broker {
    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = self.task.await;
    }
}

fn client(identity: &TlsIdentity) -> quinn::Endpoint {
    let mut endpoint =
        quinn::Endpoint::client("127.0.0.1:0".parse().expect("addr")).expect("client endpoint");
    endpoint.set_default_client_config(
        identity
            .quic_client(ALPN_REPLICATION)
            .expect("client config"),
    );
    endpoint
}

async fn connect(
    endpoint: &quinn::Endpoint,
    broker: SocketAddr,
) -> Result<quinn::Connection, String> {
    // The broker may still be starting: retry for a few seconds.
    let mut last = String::new();
    for _ in 0..50 {
        match endpoint.connect(broker, BROKER_SERVER_NAME) {
            Ok(connecting) => match connecting.await {
                Ok(conn) => return Ok(conn),
                Err(e) => last = e.to_string(),
            },
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(last)
}

/// True if the broker refuses this client: the handshake fails, or (TLS 1.3
/// verifies the client certificate after the client finished) the first
/// request gets no answer because the connection is closed.
async fn is_refused(endpoint: &quinn::Endpoint, broker: SocketAddr) -> bool {
    let Ok(conn) = connect(endpoint, broker).await else {
        return true;
    };
    let attempt = async {
        let (mut send, mut recv) = conn.open_bi().await.map_err(|e| e.to_string())?;
        send.write_all(&encode(&[hello("/plant1/power")]))
            .await
            .map_err(|e| e.to_string())?;
        send.finish().map_err(|e| e.to_string())?;
        recv.read_to_end(1 << 20).await.map_err(|e| e.to_string())
    };
    match tokio::time::timeout(Duration::from_secs(10), attempt).await {
        Ok(Ok(answer)) => answer.is_empty(),
        Ok(Err(_)) | Err(_) => true,
    }
}

fn hello(topic: &str) -> Frame {
    hello_asking(topic, false)
}

/// A Hello that asks for acknowledgement datagrams or not.
fn hello_asking(topic: &str, ack_datagrams: bool) -> Frame {
    Frame::Hello(Hello {
        protocol: PROTOCOL_VERSION,
        topic: topic.into(),
        settings: Some(StreamIntent::TaskQueue.expand()),
        ack_datagrams,
        progress: false,
        tip: false,
        cluster_id: false,
    })
}

fn batch(base: u64, n: usize, value_len: usize) -> tributary_proto::batch::EncodedBatch {
    let records = (0..n)
        .map(|i| Record {
            timestamp_ms: 1_700_000_000_000 + i as i64,
            value: Bytes::from(vec![b'a' + (i % 26) as u8; value_len]),
            ..Record::default()
        })
        .collect();
    RecordBatch::new(base, records)
        .encode(&Limits {
            max_record_bytes: 4 * 1024 * 1024,
            max_batch_bytes: 16 * 1024 * 1024,
        })
        .expect("encode")
}

/// Sends `raw` bytes on a new stream, finishes it, and returns every frame
/// the broker answered with until it finished its side.
async fn exchange(conn: &quinn::Connection, raw: &[u8]) -> Vec<Frame> {
    let (mut send, mut recv) = conn.open_bi().await.expect("open stream");
    send.write_all(raw).await.expect("write");
    send.finish().expect("finish");
    let bytes = tokio::time::timeout(Duration::from_secs(20), recv.read_to_end(64 << 20))
        .await
        .expect("answer in time")
        .expect("read answer");
    let mut buf = BytesMut::from(&bytes[..]);
    let mut frames = Vec::new();
    while let Some(frame) = frame::decode(&mut buf, &Limits::default()).expect("decodable answer") {
        frames.push(frame);
    }
    frames
}

fn encode(frames: &[Frame]) -> Vec<u8> {
    let mut out = BytesMut::new();
    for f in frames {
        f.encode(&mut out);
    }
    out.to_vec()
}

/// `frames` are a `Welcome` at `welcome`, then cumulative `Ack`s in
/// ascending order, each at the end of one of the batches sent (`ends`),
/// the last at the last end: the broker answers batches it finds durable
/// together with one `Ack`.
fn assert_acked(frames: &[Frame], welcome: u64, ends: &[u64]) {
    assert_eq!(
        frames.first(),
        Some(&Frame::Welcome {
            high_water_mark: welcome
        }),
        "{frames:?}"
    );
    let acks: Vec<u64> = frames[1..]
        .iter()
        .map(|f| match f {
            Frame::Ack { next_offset } => *next_offset,
            other => panic!("not an Ack: {other:?} in {frames:?}"),
        })
        .collect();
    assert!(acks.is_sorted() && !acks.is_empty(), "{frames:?}");
    assert!(acks.iter().all(|a| ends.contains(a)), "{frames:?}");
    assert_eq!(acks.last(), ends.last(), "{frames:?}");
}

fn error_code(frames: &[Frame]) -> Option<ErrorCode> {
    frames.iter().find_map(|f| match f {
        Frame::Error { code, .. } => Some(*code),
        _ => None,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_accepts_acks_dedups_and_refuses_bad_input() {
    let dir = tempfile::tempdir().expect("tempdir");
    let certs = dir.path().join("certs");
    let rogue = dir.path().join("rogue");
    broker_core::dev_certs::issue(&certs, &[1], &["plant1".into(), "plant2".into()])
        .expect("certs");
    broker_core::dev_certs::issue(&rogue, &[], &["plant1".into()]).expect("rogue certs");
    let broker = start_broker(&dir.path().join("broker"), &certs).await;
    let plant1 =
        TlsIdentity::load(&broker_core::dev_certs::edge_paths(&certs, "plant1")).expect("tls");
    let plant2 =
        TlsIdentity::load(&broker_core::dev_certs::edge_paths(&certs, "plant2")).expect("tls");
    let endpoint = client(&plant1);
    let conn = connect(&endpoint, broker.ingest)
        .await
        .expect("plant1 connects");

    // Happy path: three batches, acknowledged in order at exact batch ends.
    let batches = [batch(0, 3, 10), batch(3, 2, 10), batch(5, 4, 10)];
    let mut frames = vec![hello("/plant1/power")];
    frames.extend(batches.iter().map(|b| Frame::batch(b, true)));
    let answer = exchange(&conn, &encode(&frames)).await;
    assert_acked(&answer, 0, &[3, 5, 9]);
    // Reconnect: resume at 9; a resent old batch is a duplicate, acked, not
    // stored twice.
    let answer = exchange(
        &conn,
        &encode(&[hello("/plant1/power"), Frame::batch(&batches[1], false)]),
    )
    .await;
    assert_eq!(
        answer,
        vec![
            Frame::Welcome { high_water_mark: 9 },
            Frame::Ack { next_offset: 5 }
        ]
    );
    // The same offsets with other records (a second device under this edge
    // id): not the stored batch, refused with Conflict, never acknowledged.
    // A new batch pipelined right behind it is not stored either.
    let other = batch(3, 2, 11);
    let answer = exchange(
        &conn,
        &encode(&[
            hello("/plant1/power"),
            Frame::batch(&other, false),
            Frame::batch(&batch(9, 1, 10), false),
        ]),
    )
    .await;
    assert_eq!(answer.first(), Some(&Frame::Welcome { high_water_mark: 9 }));
    assert_eq!(error_code(&answer), Some(ErrorCode::Conflict), "{answer:?}");
    assert!(
        !answer.iter().any(|f| matches!(f, Frame::Ack { .. })),
        "{answer:?}"
    );
    let resume = exchange(&conn, &encode(&[hello("/plant1/power")])).await;
    assert_eq!(resume, vec![Frame::Welcome { high_water_mark: 9 }]);
    // An edge that asks for the tip gets the last batch (5..9) before the
    // Welcome, its CRC as stored; a topic with no batch has no tip.
    let mut asking = hello("/plant1/power");
    if let Frame::Hello(h) = &mut asking {
        h.tip = true;
    }
    let resume = exchange(&conn, &encode(&[asking.clone()])).await;
    assert_eq!(
        resume,
        vec![
            Frame::Tip {
                base_offset: 5,
                next_offset: 9,
                crc32c: batches[2].header().crc,
            },
            Frame::Welcome { high_water_mark: 9 }
        ]
    );
    if let Frame::Hello(h) = &mut asking {
        h.topic = "/plant1/empty".into();
    }
    let resume = exchange(&conn, &encode(&[asking])).await;
    assert_eq!(resume, vec![Frame::Welcome { high_water_mark: 0 }]);

    // Refusals on streams; each stores nothing.
    let cases: Vec<(Vec<u8>, ErrorCode)> = vec![
        (encode(&[hello("/plant1/../etc")]), ErrorCode::InvalidTopic),
        (
            encode(&[
                hello("/plant1/power"),
                Frame::batch(&batch(12, 1, 10), false),
            ]),
            ErrorCode::Gap,
        ),
        (
            encode(&[
                hello("/plant1/power"),
                Frame::batch(&batch(9, 1, 2 * 1024 * 1024), false),
            ]),
            ErrorCode::TooLarge,
        ),
        (
            encode(&[Frame::Ack { next_offset: 1 }]),
            ErrorCode::Malformed,
        ),
        (
            {
                let mut raw = encode(&[
                    hello("/plant1/power"),
                    Frame::batch(&batch(9, 1, 10), false),
                ]);
                raw.truncate(raw.len() - 7);
                raw
            },
            ErrorCode::Malformed,
        ),
        (
            b"this is not a frame at all, just garbage bytes".to_vec(),
            ErrorCode::TooLarge,
        ),
        (
            {
                let good = batch(9, 1, 10);
                let mut bytes = good.as_bytes().to_vec();
                bytes[60] ^= 0x20;
                encode(&[
                    hello("/plant1/power"),
                    Frame::Batch {
                        codec: frame::WireCodec::None,
                        payload: Bytes::from(bytes),
                    },
                ])
            },
            ErrorCode::Corrupt,
        ),
    ];
    for (raw, expected) in cases {
        let answer = exchange(&conn, &raw).await;
        assert_eq!(error_code(&answer), Some(expected), "{answer:?}");
    }
    let resume = exchange(&conn, &encode(&[hello("/plant1/power")])).await;
    assert_eq!(
        resume,
        vec![Frame::Welcome { high_water_mark: 9 }],
        "a refused stream stored something"
    );

    // Another edge's valid certificate cannot write plant1's namespace.
    let other = client(&plant2);
    let conn2 = connect(&other, broker.ingest)
        .await
        .expect("plant2 connects");
    let answer = exchange(
        &conn2,
        &encode(&[
            hello("/plant1/power"),
            Frame::batch(&batch(9, 1, 10), false),
        ]),
    )
    .await;
    assert_eq!(error_code(&answer), Some(ErrorCode::NotOwner));

    // A certificate from another CA is refused in the handshake.
    let rogue_identity =
        TlsIdentity::load(&broker_core::dev_certs::edge_paths(&rogue, "plant1")).expect("tls");
    let rogue_client = {
        // The rogue trusts the real CA (to get as far as possible) but
        // presents a certificate the broker's CA did not sign.
        let mut paths = broker_core::dev_certs::edge_paths(&rogue, "plant1");
        paths.ca = certs.join("ca.pem");
        let identity = TlsIdentity::load(&paths).expect("tls");
        drop(rogue_identity);
        client(&identity)
    };
    assert!(
        is_refused(&rogue_client, broker.ingest).await,
        "a foreign CA's certificate was accepted"
    );

    // No client certificate at all is refused in the handshake.
    let anonymous = {
        let mut roots = rustls::RootCertStore::empty();
        for cert in broker_core::tls::load_certs(&certs.join("ca.pem")).expect("ca") {
            roots.add(cert).expect("root");
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .expect("tls13")
            .with_root_certificates(roots)
            .with_no_client_auth();
        tls.alpn_protocols = vec![ALPN_REPLICATION.to_vec()];
        let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(tls).expect("quic tls");
        let mut endpoint =
            quinn::Endpoint::client("127.0.0.1:0".parse().expect("addr")).expect("endpoint");
        endpoint.set_default_client_config(quinn::ClientConfig::new(Arc::new(crypto)));
        endpoint
    };
    assert!(
        is_refused(&anonymous, broker.ingest).await,
        "a client without a certificate was accepted"
    );

    // The broker still serves the good edge after all that.
    let resume = exchange(&conn, &encode(&[hello("/plant1/power")])).await;
    assert_eq!(resume, vec![Frame::Welcome { high_water_mark: 9 }]);
    broker.stop().await;
}

/// Reads from `recv` until `n` frames arrived.
async fn read_frames(recv: &mut quinn::RecvStream, n: usize) -> Vec<Frame> {
    let mut buf = BytesMut::new();
    let mut frames = Vec::new();
    while frames.len() < n {
        while let Some(frame) = frame::decode(&mut buf, &Limits::default()).expect("decodable") {
            frames.push(frame);
        }
        if frames.len() == n {
            break;
        }
        let chunk = tokio::time::timeout(Duration::from_secs(20), recv.read_chunk(1 << 16, true))
            .await
            .expect("answer in time")
            .expect("readable")
            .expect("stream open");
        buf.extend_from_slice(&chunk.bytes);
    }
    frames
}

/// Every datagram received on `conn` until none came for `quiet`.
async fn datagrams_until_quiet(conn: &quinn::Connection, quiet: Duration) -> Vec<AckDatagram> {
    let mut datagrams = Vec::new();
    while let Ok(Ok(datagram)) = tokio::time::timeout(quiet, conn.read_datagram()).await {
        datagrams.push(AckDatagram::decode(&datagram).expect("an acknowledgement datagram"));
    }
    datagrams
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ack_datagrams_go_only_to_edges_that_ask_and_the_newest_is_repeated_three_times() {
    let dir = tempfile::tempdir().expect("tempdir");
    let certs = dir.path().join("certs");
    broker_core::dev_certs::issue(&certs, &[1], &["plant1".into()]).expect("certs");
    let broker = start_broker(&dir.path().join("broker"), &certs).await;
    let plant1 =
        TlsIdentity::load(&broker_core::dev_certs::edge_paths(&certs, "plant1")).expect("tls");
    let endpoint = client(&plant1);
    let conn = connect(&endpoint, broker.ingest)
        .await
        .expect("plant1 connects");

    // An edge that predates acknowledgement datagrams: Ack frames only (an
    // old edge never reads datagrams; quinn would hold them until the
    // connection ends).
    let (mut send, mut recv) = conn.open_bi().await.expect("stream");
    send.write_all(&encode(&[
        hello("/plant1/old"),
        Frame::batch(&batch(0, 10, 8), false),
    ]))
    .await
    .expect("write");
    assert_eq!(
        read_frames(&mut recv, 2).await,
        [
            Frame::Welcome { high_water_mark: 0 },
            Frame::Ack { next_offset: 10 }
        ]
    );
    assert_eq!(
        datagrams_until_quiet(&conn, Duration::from_secs(1)).await,
        []
    );

    // An edge that asks: every acknowledgement also as a datagram for its
    // stream, and the newest sent again three times. The second batch goes
    // once the first is acknowledged, so that they get an Ack each.
    let (mut send, mut recv) = conn.open_bi().await.expect("stream");
    send.write_all(&encode(&[
        hello_asking("/plant1/new", true),
        Frame::batch(&batch(0, 10, 8), false),
    ]))
    .await
    .expect("write");
    assert_eq!(
        read_frames(&mut recv, 2).await,
        [
            Frame::Welcome { high_water_mark: 0 },
            Frame::Ack { next_offset: 10 },
        ]
    );
    send.write_all(&encode(&[Frame::batch(&batch(10, 5, 8), false)]))
        .await
        .expect("write");
    assert_eq!(
        read_frames(&mut recv, 1).await,
        [Frame::Ack { next_offset: 15 }]
    );
    let datagrams = datagrams_until_quiet(&conn, Duration::from_secs(1)).await;
    let stream_id = u64::from(send.id());
    assert!(
        datagrams.iter().all(|d| d.stream_id == stream_id),
        "{datagrams:?}"
    );
    let offsets: Vec<u64> = datagrams.iter().map(|d| d.next_offset).collect();
    // The first acknowledgement is repeated only if the second came more
    // than a repeat gap (25 ms here) later; the newest always four times.
    assert!(offsets.is_sorted(), "{offsets:?}");
    assert_eq!(
        offsets.iter().filter(|&&o| o == 15).count(),
        4,
        "{offsets:?}"
    );
    assert!(offsets.iter().all(|&o| o == 10 || o == 15), "{offsets:?}");
    assert!(offsets.contains(&10), "{offsets:?}");
    broker.stop().await;
}

fn hole(first_offset: u64, end_offset: u64) -> Frame {
    Frame::Hole {
        first_offset,
        end_offset,
        cause: frame::HoleCause::Damaged,
        reason: "crc mismatch at the edge".into(),
    }
}

/// A `Hole` frame (edge → broker): accepted at the next expected offset,
/// acknowledged at its end, the next batch starts there; the resume point
/// after a reconnect is past it; a hole anywhere else is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_hole_is_acknowledged_at_its_end_and_replication_continues_after_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let certs = dir.path().join("certs");
    broker_core::dev_certs::issue(&certs, &[1], &["plant1".into()]).expect("certs");
    let broker = start_broker(&dir.path().join("broker"), &certs).await;
    let plant1 =
        TlsIdentity::load(&broker_core::dev_certs::edge_paths(&certs, "plant1")).expect("tls");
    let endpoint = client(&plant1);
    let conn = connect(&endpoint, broker.ingest)
        .await
        .expect("plant1 connects");
    let answer = exchange(
        &conn,
        &encode(&[
            hello("/plant1/power"),
            Frame::batch(&batch(0, 3, 10), false),
            hole(3, 10),
            Frame::batch(&batch(10, 2, 10), false),
        ]),
    )
    .await;
    assert_eq!(
        answer,
        vec![
            Frame::Welcome { high_water_mark: 0 },
            Frame::Ack { next_offset: 3 },
            Frame::Ack { next_offset: 10 },
            Frame::Ack { next_offset: 12 },
        ]
    );
    let resume = exchange(&conn, &encode(&[hello("/plant1/power")])).await;
    assert_eq!(
        resume,
        vec![Frame::Welcome {
            high_water_mark: 12
        }]
    );
    for (bad, code) in [
        (hole(13, 20), ErrorCode::Gap),
        (hole(11, 20), ErrorCode::Overlap),
    ] {
        let answer = exchange(&conn, &encode(&[hello("/plant1/power"), bad])).await;
        assert_eq!(error_code(&answer), Some(code), "{answer:?}");
    }
    // Nothing moved: the next batch still belongs at 12.
    let answer = exchange(
        &conn,
        &encode(&[
            hello("/plant1/power"),
            Frame::batch(&batch(12, 1, 10), false),
        ]),
    )
    .await;
    assert_eq!(
        answer,
        vec![
            Frame::Welcome {
                high_water_mark: 12
            },
            Frame::Ack { next_offset: 13 }
        ]
    );
    broker.stop().await;
}

/// A Hello that asks for the cluster's id (`"cluster_id":true`).
fn hello_asking_cluster_id(topic: &str) -> Frame {
    let Frame::Hello(hello) = hello(topic) else {
        unreachable!("hello() builds a Hello");
    };
    Frame::Hello(Hello {
        cluster_id: true,
        ..hello
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_id_goes_first_and_only_to_edges_that_ask() {
    let dir = tempfile::tempdir().expect("tempdir");
    let certs = dir.path().join("certs");
    broker_core::dev_certs::issue(&certs, &[1], &["plant1".into()]).expect("certs");
    let plant1 =
        TlsIdentity::load(&broker_core::dev_certs::edge_paths(&certs, "plant1")).expect("tls");
    let endpoint = client(&plant1);
    let broker = start_broker(&dir.path().join("broker"), &certs).await;
    let conn = connect(&endpoint, broker.ingest)
        .await
        .expect("plant1 connects");
    // (A restart keeps the id: broker/tests/cluster_id.rs.)
    let answer = exchange(
        &conn,
        &encode(&[
            hello_asking_cluster_id("/plant1/power"),
            Frame::batch(&batch(0, 3, 10), false),
        ]),
    )
    .await;
    let Some(&Frame::ClusterId { id }) = answer.first() else {
        panic!("no cluster id first: {answer:?}");
    };
    assert_eq!(
        answer[1..],
        [
            Frame::Welcome { high_water_mark: 0 },
            Frame::Ack { next_offset: 3 }
        ]
    );
    // An edge that does not ask (older, or any Hello without the field)
    // gets exactly what it got before: no frame it does not know.
    let answer = exchange(&conn, &encode(&[hello("/plant1/power")])).await;
    assert_eq!(answer, vec![Frame::Welcome { high_water_mark: 3 }]);
    // Every stream that asks gets the same id.
    let answer = exchange(&conn, &encode(&[hello_asking_cluster_id("/plant1/power")])).await;
    assert_eq!(
        answer,
        vec![
            Frame::ClusterId { id },
            Frame::Welcome { high_water_mark: 3 }
        ]
    );
    conn.close(0u32.into(), b"done");
    broker.stop().await;
}
