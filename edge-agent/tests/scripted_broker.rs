//! The replicator against a scripted broker: an in-process agent replicates
//! to a QUIC server on a real socket on 127.0.0.1 (mutual TLS with dev
//! certificates) whose answers the test writes frame by frame. The script
//! stands in for what the real broker and the test relay cannot do on
//! demand: lose exactly the packets that carry `Ack` frames (the relay
//! cannot tell them from datagrams inside QUIC's encryption), or hold an
//! acknowledgement while a paced batch waits.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use broker_core::dev_certs::{self, broker_paths, edge_paths};
use broker_core::tls::{ALPN_REPLICATION, TlsIdentity};
use bytes::BytesMut;
use common::{config, get, post, start, topic};
use tributary_edge::{Agent, AgentConfig};
use tributary_proto::batch::EncodedBatch;
use tributary_proto::intent::StreamIntent;
use tributary_proto::replication::frame::{self, AckDatagram, Frame};

/// Bound on every wait.
const WAIT: Duration = Duration::from_secs(20);

/// The broker side of one edge connection and its one topic stream, after
/// the edge's Hello.
struct ScriptedBroker {
    endpoint: quinn::Endpoint,
    conn: quinn::Connection,
    send: quinn::SendStream,
    recv: quinn::RecvStream,
    buf: BytesMut,
    /// The stream's QUIC id, as acknowledgement datagrams name it.
    stream_id: u64,
}

impl ScriptedBroker {
    /// Starts an agent for edge `e1` with topic `/e1/t` (changed by
    /// `configure`) that replicates to a scripted broker, publishes
    /// `first_batch` (NDJSON) and waits for the edge's connection and Hello,
    /// which must ask for acknowledgement datagrams.
    async fn start(
        dir: &std::path::Path,
        configure: impl FnOnce(&mut AgentConfig),
        first_batch: &[u8],
    ) -> (Agent, ScriptedBroker) {
        let certs = dir.join("certs");
        dev_certs::issue(&certs, &[1], &["e1".into()]).unwrap();
        let broker_tls = TlsIdentity::load(&broker_paths(&certs, 1)).unwrap();
        let server = broker_tls.quic_server(ALPN_REPLICATION).unwrap();
        let endpoint = quinn::Endpoint::server(server, "127.0.0.1:0".parse().unwrap()).unwrap();
        let mut agent_config = config(&dir.join("edge"));
        agent_config.brokers = vec![endpoint.local_addr().unwrap().to_string()];
        agent_config.tls = Some(edge_paths(&certs, "e1"));
        agent_config.topics = vec![topic("/e1/t", StreamIntent::EventStream)];
        configure(&mut agent_config);
        let agent = start(agent_config).await;
        publish(agent.local_addr(), first_batch).await;

        let conn = tokio::time::timeout(WAIT, endpoint.accept())
            .await
            .expect("edge connects")
            .expect("endpoint open")
            .await
            .expect("handshake");
        let (send, recv) = tokio::time::timeout(WAIT, conn.accept_bi())
            .await
            .expect("edge opens a stream")
            .expect("stream");
        let stream_id = u64::from(recv.id());
        let mut broker = ScriptedBroker {
            endpoint,
            conn,
            send,
            recv,
            buf: BytesMut::new(),
            stream_id,
        };
        match broker.next_frame().await {
            Frame::Hello(hello) => assert!(hello.ack_datagrams, "{hello:?}"),
            other => panic!("expected a Hello, got {other:?}"),
        }
        (agent, broker)
    }

    /// The next frame from the edge.
    async fn next_frame(&mut self) -> Frame {
        let limits = tributary_proto::Limits::default();
        loop {
            if let Some(frame) =
                frame::decode(&mut self.buf, &limits).expect("edge sends valid frames")
            {
                return frame;
            }
            let chunk = tokio::time::timeout(WAIT, self.recv.read_chunk(64 * 1024, true))
                .await
                .expect("edge sends within the wait")
                .expect("stream readable")
                .expect("stream open");
            self.buf.extend_from_slice(&chunk.bytes);
        }
    }

    /// The next batch frame, opened.
    async fn next_batch(&mut self) -> EncodedBatch {
        match self.next_frame().await {
            Frame::Batch { codec, payload } => {
                frame::open_batch(codec, payload, &tributary_proto::Limits::default())
                    .expect("batch")
            }
            other => panic!("expected a batch, got {other:?}"),
        }
    }

    /// Sends `frame` on the stream.
    async fn send_frame(&mut self, frame: Frame) {
        self.send.write_all(&frame.to_bytes()).await.unwrap();
    }

    /// Sends an acknowledgement datagram for `stream_id`.
    fn send_datagram(&self, stream_id: u64, next_offset: u64) {
        self.conn
            .send_datagram(
                AckDatagram {
                    stream_id,
                    next_offset,
                }
                .to_bytes(),
            )
            .unwrap();
    }

    /// Whether the edge sent nothing more on the stream within `quiet`.
    async fn is_quiet_for(&mut self, quiet: Duration) -> bool {
        self.buf.is_empty()
            && tokio::time::timeout(quiet, self.recv.read_chunk(64 * 1024, true))
                .await
                .is_err()
    }

    fn close(self) {
        self.endpoint.close(0u32.into(), b"done");
    }
}

async fn publish(addr: SocketAddr, ndjson: &[u8]) {
    let r = post(addr, "/v1/topics/e1/t/batch", &[], ndjson).await;
    assert_eq!(r.status, 200, "{}", r.text);
}

async fn acknowledged(addr: SocketAddr) -> u64 {
    get(addr, "/v1/topics/e1/t").await.body["acknowledged_offset"]
        .as_u64()
        .expect("acknowledged_offset")
}

async fn wait_acknowledged(addr: SocketAddr, offset: u64, limit: Duration) {
    let deadline = tokio::time::Instant::now() + limit;
    while acknowledged(addr).await != offset {
        assert!(
            tokio::time::Instant::now() < deadline,
            "acknowledged offset {} != {offset} after {limit:?}",
            acknowledged(addr).await
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn records(value: &str, n: usize) -> Vec<u8> {
    format!("{{\"value\":\"{value}\"}}\n")
        .repeat(n)
        .into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledgements_arriving_only_as_datagrams_advance_the_edge_and_late_ack_frames_are_harmless()
 {
    let dir = tempfile::tempdir().unwrap();
    let (agent, mut broker) = ScriptedBroker::start(dir.path(), |_| {}, &records("a", 10)).await;
    let addr = agent.local_addr();
    let stream_id = broker.stream_id;
    broker
        .send_frame(Frame::Welcome { high_water_mark: 0 })
        .await;
    let first = broker.next_batch().await;
    assert_eq!((first.base_offset(), first.next_offset()), (0, 10));

    // Datagrams the edge cannot read (a short one, another type) are
    // skipped; only the datagram acknowledges, and the edge's acknowledged
    // offset moves with it.
    let mut wrong_type = AckDatagram {
        stream_id,
        next_offset: 10,
    }
    .to_bytes()
    .to_vec();
    wrong_type[0] = 5;
    broker.conn.send_datagram(wrong_type.into()).unwrap();
    broker
        .conn
        .send_datagram(bytes::Bytes::from_static(&[4; 16]))
        .unwrap();
    broker.send_datagram(stream_id, 10);
    wait_acknowledged(addr, 10, WAIT).await;

    // A datagram for another stream is ignored; the late Ack frame for the
    // same batch does not break the stream: the next batch comes on it.
    broker.send_datagram(stream_id + 4, 99);
    broker.send_frame(Frame::Ack { next_offset: 10 }).await;
    publish(addr, &records("b", 5)).await;
    let second = broker.next_batch().await;
    assert_eq!((second.base_offset(), second.next_offset()), (10, 15));
    assert_eq!(acknowledged(addr).await, 10);

    // This time the Ack frame comes first and the datagram is stale.
    broker.send_frame(Frame::Ack { next_offset: 15 }).await;
    wait_acknowledged(addr, 15, WAIT).await;
    broker.send_datagram(stream_id, 15);
    // One more round trip, so the stale datagram has been handled.
    publish(addr, &records("c", 2)).await;
    let third = broker.next_batch().await;
    assert_eq!((third.base_offset(), third.next_offset()), (15, 17));
    broker.send_frame(Frame::Ack { next_offset: 17 }).await;
    wait_acknowledged(addr, 17, WAIT).await;

    let metrics = get(addr, "/metrics").await.text;
    let count = |path: &str| {
        let name = format!("tributary_edge_replication_acks_total{{edge=\"e1\",path=\"{path}\"}} ");
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name.as_str()))
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    assert_eq!(count("datagram"), Some(1), "{metrics}");
    assert_eq!(count("stream"), Some(2), "{metrics}");
    assert_eq!(
        agent
            .replication_stats()
            .connects
            .load(std::sync::atomic::Ordering::Relaxed),
        1,
        "the stream never broke"
    );
    agent.shutdown().await.unwrap();
    broker.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledgements_are_recorded_while_a_batch_waits_for_the_bandwidth_cap() {
    let dir = tempfile::tempdir().unwrap();
    // 1000 B/s: the bucket starts with 1000 bytes of tokens.
    let (agent, mut broker) = ScriptedBroker::start(
        dir.path(),
        |c| c.bandwidth_cap_bytes_per_s = Some(1000),
        &records("a", 1),
    )
    .await;
    let addr = agent.local_addr();
    broker
        .send_frame(Frame::Welcome { high_water_mark: 0 })
        .await;
    let first = broker.next_batch().await;
    assert_eq!((first.base_offset(), first.next_offset()), (0, 1));

    // A ~5 KB batch (incompressible, so zstd cannot shrink it) owes the
    // bucket ~4 s of tokens before it may go.
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let big: String = (0..5000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            char::from(b'a' + (x % 26) as u8)
        })
        .collect();
    publish(addr, &records(&big, 1)).await;
    assert!(broker.is_quiet_for(Duration::from_millis(300)).await);
    // Meanwhile the first batch's acknowledgement arrives: it is recorded
    // at once, not after the wait.
    broker.send_frame(Frame::Ack { next_offset: 1 }).await;
    wait_acknowledged(addr, 1, Duration::from_secs(2)).await;
    assert!(
        broker.is_quiet_for(Duration::from_millis(100)).await,
        "the paced batch went early"
    );
    // The paced batch follows once its tokens are there.
    let second = broker.next_batch().await;
    assert_eq!((second.base_offset(), second.next_offset()), (1, 2));
    agent.shutdown().await.unwrap();
    broker.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_that_closes_every_connection_after_its_handshake_is_retried_with_backoff() {
    // What a broker refusing the edge's certificate looks like to the edge
    // under TLS 1.3: the handshake completes, then the connection closes.
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    dev_certs::issue(&certs, &[1], &["e1".into()]).unwrap();
    let broker_tls = TlsIdentity::load(&broker_paths(&certs, 1)).unwrap();
    let server = broker_tls.quic_server(ALPN_REPLICATION).unwrap();
    let endpoint = quinn::Endpoint::server(server, "127.0.0.1:0".parse().unwrap()).unwrap();
    let accepted = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let refuser = {
        let endpoint = endpoint.clone();
        let accepted = accepted.clone();
        tokio::spawn(async move {
            while let Some(incoming) = endpoint.accept().await {
                if let Ok(conn) = incoming.await {
                    accepted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    conn.close(1u32.into(), b"refused");
                }
            }
        })
    };
    let mut agent_config = config(&dir.path().join("edge"));
    agent_config.brokers = vec![endpoint.local_addr().unwrap().to_string()];
    agent_config.tls = Some(edge_paths(&certs, "e1"));
    agent_config.topics = vec![topic("/e1/t", StreamIntent::EventStream)];
    let agent = start(agent_config).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let attempts = accepted.load(std::sync::atomic::Ordering::Relaxed);
    // Backoff from 100 ms, doubling (with jitter): at most ~6 attempts in
    // 3 s; a backoff reset after every handshake made 15-30.
    assert!((2..=8).contains(&attempts), "{attempts} connections in 3 s");
    agent.shutdown().await.unwrap();
    refuser.abort();
    endpoint.close(0u32.into(), b"done");
}

#[tokio::test]
async fn a_key_that_does_not_belong_to_the_certificate_stops_the_agent_from_starting() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    dev_certs::issue(&certs, &[], &["e1".into(), "e2".into()]).unwrap();
    let mut tls = edge_paths(&certs, "e1");
    tls.key = edge_paths(&certs, "e2").key;
    let mut agent_config = config(&dir.path().join("edge"));
    agent_config.brokers = vec!["127.0.0.1:9".into()];
    agent_config.tls = Some(tls);
    let err = match Agent::start(agent_config).await {
        Ok(_) => panic!("the agent started with a mismatched key"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("KeyMismatch"), "{err}");
}

/// What [`acknowledging_broker`] acknowledged: the next offset per topic.
type Acked = std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, u64>>>;

/// A broker that answers every stream of every connection: `Welcome` at
/// the offset it has acknowledged so far for the stream's topic, then an
/// `Ack` for every batch.
fn acknowledging_broker(endpoint: quinn::Endpoint, acked: Acked) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while let Some(incoming) = endpoint.accept().await {
            let acked = acked.clone();
            tokio::spawn(async move {
                let Ok(conn) = incoming.await else { return };
                while let Ok((mut send, mut recv)) = conn.accept_bi().await {
                    let acked = acked.clone();
                    tokio::spawn(async move {
                        let limits = tributary_proto::Limits::default();
                        let mut buf = BytesMut::new();
                        let mut topic = String::new();
                        while let Ok(Some(chunk)) = recv.read_chunk(64 * 1024, true).await {
                            buf.extend_from_slice(&chunk.bytes);
                            while let Ok(Some(frame)) = frame::decode(&mut buf, &limits) {
                                let answer = match frame {
                                    Frame::Hello(hello) => {
                                        topic = hello.topic;
                                        let acked = acked.lock().unwrap();
                                        Frame::Welcome {
                                            high_water_mark: acked
                                                .get(&topic)
                                                .copied()
                                                .unwrap_or(0),
                                        }
                                    }
                                    Frame::Batch { codec, payload } => {
                                        let batch = frame::open_batch(codec, payload, &limits)
                                            .expect("batch");
                                        acked
                                            .lock()
                                            .unwrap()
                                            .insert(topic.clone(), batch.next_offset());
                                        Frame::Ack {
                                            next_offset: batch.next_offset(),
                                        }
                                    }
                                    _ => continue,
                                };
                                if send.write_all(&answer.to_bytes()).await.is_err() {
                                    return;
                                }
                            }
                        }
                    });
                }
            });
        }
    })
}

/// `Agent::shutdown` returns only once every task that held the metadata
/// store or a WAL has ended: the store opens again at once, every time,
/// right after a shutdown with replication streams (read-ahead waiting for
/// records, checkpoint task) and API connections active.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_releases_the_metadata_store_before_it_returns() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    dev_certs::issue(&certs, &[1], &["e1".into()]).unwrap();
    let broker_tls = TlsIdentity::load(&broker_paths(&certs, 1)).unwrap();
    let server = broker_tls.quic_server(ALPN_REPLICATION).unwrap();
    let endpoint = quinn::Endpoint::server(server, "127.0.0.1:0".parse().unwrap()).unwrap();
    let acked = Acked::default();
    let broker = acknowledging_broker(endpoint.clone(), acked.clone());
    let edge_dir = dir.path().join("edge");
    let mut agent_config = config(&edge_dir);
    agent_config.brokers = vec![endpoint.local_addr().unwrap().to_string()];
    agent_config.tls = Some(edge_paths(&certs, "e1"));
    agent_config.topics = vec![
        topic("/e1/t", StreamIntent::EventStream),
        topic("/e1/jobs", StreamIntent::TaskQueue),
    ];
    let store_path = edge_dir.join(tributary_edge::agent::METADATA_FILE);
    for round in 0..8u64 {
        let agent = start(agent_config.clone()).await;
        let addr = agent.local_addr();
        publish(addr, &records("r", 3)).await;
        let r = post(addr, "/v1/topics/e1/jobs/records", &[], b"job").await;
        assert_eq!(r.status, 200, "{}", r.text);
        wait_acknowledged(addr, 3 * (round + 1), WAIT).await;
        let deadline = tokio::time::Instant::now() + WAIT;
        while acked.lock().unwrap().get("/e1/jobs") != Some(&(round + 1)) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "/e1/jobs not replicated"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let manager = std::sync::Arc::downgrade(agent.topics());
        agent.shutdown().await.unwrap();
        assert_eq!(
            manager.strong_count(),
            0,
            "round {round}: a task still holds the topic manager after shutdown"
        );
        // At once: no retry, no sleep.
        let store = broker_core::metadata::redb::RedbStore::open(
            &store_path,
            std::sync::Arc::new(broker_core::clock::SystemClock),
        );
        assert!(
            store.is_ok(),
            "round {round}: the metadata store is still open after shutdown: {:?}",
            store.err()
        );
    }
    broker.abort();
    endpoint.close(0u32.into(), b"done");
}
