//! Topic ownership seen from the edge, against scripted brokers: QUIC
//! servers on real sockets on 127.0.0.1 (mutual TLS with dev certificates)
//! whose answers the test decides per `Hello`. They stand in for a
//! cluster whose brokers redirect to a topic's owner, report archived
//! offsets and, after a failover, welcome the edge below its checkpoint.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use broker_core::dev_certs::{self, broker_paths, edge_paths};
use broker_core::tls::{ALPN_REPLICATION, TlsIdentity};
use bytes::{Bytes, BytesMut};
use common::{config, get, post, start, topic};
use tributary_edge::config::RetainUntil;
use tributary_edge::{Agent, AgentConfig};
use tributary_proto::intent::StreamIntent;
use tributary_proto::replication::frame::{self, ErrorCode, Frame, Redirect};

/// Bound on every wait.
const WAIT: Duration = Duration::from_secs(20);

/// How a scripted broker answers a `Hello` for a topic.
#[derive(Debug, Clone)]
enum Answer {
    /// `Welcome` at what this broker acknowledged so far, then an `Ack`
    /// for every batch.
    Accept,
    /// `Welcome` at this offset (a new owner after a failover), then
    /// acknowledge as [`Answer::Accept`].
    WelcomeAt(u64),
    /// `Redirect` to the owner.
    Redirect(Redirect),
    /// `Error` with this code.
    Refuse(ErrorCode),
}

/// A batch a scripted broker received.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Received {
    topic: String,
    base_offset: u64,
    next_offset: u64,
    /// The record batch, verbatim.
    bytes: Bytes,
}

type Script = Arc<dyn Fn(&str) -> Answer + Send + Sync>;

/// A scripted broker: answers every stream of every connection per its
/// script and records what it saw.
struct Broker {
    endpoint: quinn::Endpoint,
    addr: String,
    script: Arc<Mutex<Script>>,
    /// Topics of the `Hello`s received, in order.
    hellos: Arc<Mutex<Vec<String>>>,
    /// Batches received, in order.
    batches: Arc<Mutex<Vec<Received>>>,
    /// Next offset acknowledged per topic.
    acked: Arc<Mutex<HashMap<String, u64>>>,
    /// The send half of each topic's latest stream (for `Archived`).
    streams: Arc<Mutex<HashMap<String, Arc<tokio::sync::Mutex<quinn::SendStream>>>>>,
    /// Connections accepted.
    connections: Arc<AtomicU64>,
    /// The live connections (to close them: a broker going away).
    conns: Arc<Mutex<Vec<quinn::Connection>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Broker {
    /// A broker with broker `id`'s certificate from `certs`, answering
    /// with `script`.
    fn start(certs: &std::path::Path, id: u64, script: Script) -> Broker {
        let tls = TlsIdentity::load(&broker_paths(certs, id)).unwrap();
        let server = tls.quic_server(ALPN_REPLICATION).unwrap();
        let endpoint = quinn::Endpoint::server(server, "127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = endpoint.local_addr().unwrap().to_string();
        let mut broker = Broker {
            endpoint: endpoint.clone(),
            addr,
            script: Arc::new(Mutex::new(script)),
            hellos: Arc::default(),
            batches: Arc::default(),
            acked: Arc::default(),
            streams: Arc::default(),
            connections: Arc::default(),
            conns: Arc::default(),
            task: tokio::spawn(async {}),
        };
        broker.task = tokio::spawn(serve(
            endpoint,
            broker.script.clone(),
            broker.hellos.clone(),
            broker.batches.clone(),
            broker.acked.clone(),
            broker.streams.clone(),
            broker.connections.clone(),
            broker.conns.clone(),
        ));
        broker
    }

    fn set_script(&self, script: Script) {
        *self.script.lock().unwrap() = script;
    }

    fn hellos(&self) -> Vec<String> {
        self.hellos.lock().unwrap().clone()
    }

    fn batches(&self, topic: &str) -> Vec<Received> {
        self.batches
            .lock()
            .unwrap()
            .iter()
            .filter(|b| b.topic == topic)
            .cloned()
            .collect()
    }

    fn acked(&self, topic: &str) -> u64 {
        self.acked.lock().unwrap().get(topic).copied().unwrap_or(0)
    }

    /// Sends `frame` on `topic`'s latest stream.
    async fn send(&self, topic: &str, frame: Frame) {
        let send = self.streams.lock().unwrap().get(topic).cloned();
        let send = send.expect("the topic has a stream");
        send.lock()
            .await
            .write_all(&frame.to_bytes())
            .await
            .unwrap();
    }

    /// Closes every connection (the edge reconnects).
    fn drop_connections(&self) {
        for conn in self.conns.lock().unwrap().drain(..) {
            conn.close(0u32.into(), b"failover");
        }
    }

    fn stop(self) {
        self.task.abort();
        self.endpoint.close(0u32.into(), b"done");
    }
}

#[allow(clippy::too_many_arguments)]
async fn serve(
    endpoint: quinn::Endpoint,
    script: Arc<Mutex<Script>>,
    hellos: Arc<Mutex<Vec<String>>>,
    batches: Arc<Mutex<Vec<Received>>>,
    acked: Arc<Mutex<HashMap<String, u64>>>,
    streams: Arc<Mutex<HashMap<String, Arc<tokio::sync::Mutex<quinn::SendStream>>>>>,
    connections: Arc<AtomicU64>,
    conns: Arc<Mutex<Vec<quinn::Connection>>>,
) {
    while let Some(incoming) = endpoint.accept().await {
        let Ok(conn) = incoming.await else { continue };
        connections.fetch_add(1, Ordering::SeqCst);
        conns.lock().unwrap().push(conn.clone());
        let (script, hellos, batches, acked, streams) = (
            script.clone(),
            hellos.clone(),
            batches.clone(),
            acked.clone(),
            streams.clone(),
        );
        tokio::spawn(async move {
            while let Ok((send, mut recv)) = conn.accept_bi().await {
                let send = Arc::new(tokio::sync::Mutex::new(send));
                let (script, hellos, batches, acked, streams) = (
                    script.clone(),
                    hellos.clone(),
                    batches.clone(),
                    acked.clone(),
                    streams.clone(),
                );
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
                                    hellos.lock().unwrap().push(topic.clone());
                                    streams.lock().unwrap().insert(topic.clone(), send.clone());
                                    let answer = (script.lock().unwrap())(&topic);
                                    let mut acked = acked.lock().unwrap();
                                    match answer {
                                        Answer::Accept => Frame::Welcome {
                                            high_water_mark: acked
                                                .get(&topic)
                                                .copied()
                                                .unwrap_or(0),
                                        },
                                        Answer::WelcomeAt(offset) => {
                                            acked.insert(topic.clone(), offset);
                                            Frame::Welcome {
                                                high_water_mark: offset,
                                            }
                                        }
                                        Answer::Redirect(r) => Frame::Redirect(r),
                                        Answer::Refuse(code) => Frame::Error {
                                            code,
                                            message: "no owner yet".into(),
                                        },
                                    }
                                }
                                Frame::Batch { codec, payload } => {
                                    let batch =
                                        frame::open_batch(codec, payload, &limits).expect("batch");
                                    batches.lock().unwrap().push(Received {
                                        topic: topic.clone(),
                                        base_offset: batch.base_offset(),
                                        next_offset: batch.next_offset(),
                                        bytes: batch.as_bytes().clone(),
                                    });
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
                            let ends = matches!(answer, Frame::Redirect(_) | Frame::Error { .. });
                            let mut send = send.lock().await;
                            if send.write_all(&answer.to_bytes()).await.is_err() {
                                return;
                            }
                            if ends {
                                let _ = send.finish();
                                return;
                            }
                        }
                    }
                });
            }
        });
    }
}

/// Dev certificates for brokers 1 and 2 and edge `e1` in `dir/certs`.
fn certs(dir: &std::path::Path) -> std::path::PathBuf {
    let certs = dir.join("certs");
    dev_certs::issue(&certs, &[1, 2], &["e1".into()]).unwrap();
    certs
}

/// An agent config for `e1` bootstrapping from `brokers`.
fn agent_config(
    dir: &std::path::Path,
    certs: &std::path::Path,
    brokers: &[&Broker],
) -> AgentConfig {
    let mut c = config(&dir.join("edge"));
    c.brokers = brokers.iter().map(|b| b.addr.clone()).collect();
    c.tls = Some(edge_paths(certs, "e1"));
    c.topics = vec![topic("/e1/t", StreamIntent::EventStream)];
    c
}

fn records(value: &str, n: usize) -> Vec<u8> {
    format!("{{\"value\":\"{value}\"}}\n")
        .repeat(n)
        .into_bytes()
}

async fn publish(agent: &Agent, topic: &str, ndjson: &[u8]) {
    let path = format!("/v1/topics/e1/{topic}/batch");
    let r = post(agent.local_addr(), &path, &[], ndjson).await;
    assert_eq!(r.status, 200, "{}", r.text);
}

/// `/v1/topics/e1/{topic}` field `field` as a number.
async fn stat(agent: &Agent, topic: &str, field: &str) -> u64 {
    let path = format!("/v1/topics/e1/{topic}");
    get(agent.local_addr(), &path).await.body[field]
        .as_u64()
        .unwrap_or_else(|| panic!("{field} of /e1/{topic}"))
}

/// Polls `check` every 20 ms until it holds, at most `limit`.
async fn wait_until(what: &str, limit: Duration, mut check: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + limit;
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn metric(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// Offsets of `batches`, as `(base, next)` pairs.
fn ranges(batches: &[Received]) -> Vec<(u64, u64)> {
    batches
        .iter()
        .map(|b| (b.base_offset, b.next_offset))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_sends_the_topic_to_its_owner_with_exact_offsets_while_others_stay() {
    let dir = tempfile::tempdir().unwrap();
    let certs = certs(dir.path());
    let owner = Broker::start(&certs, 2, Arc::new(|_| Answer::Accept));
    let redirect = Redirect {
        broker_id: 2,
        ingest_addr: owner.addr.clone(),
        epoch: 7,
    };
    // The bootstrap broker owns /e1/u but not /e1/t.
    let bootstrap = Broker::start(
        &certs,
        1,
        Arc::new(move |topic| match topic {
            "/e1/t" => Answer::Redirect(redirect.clone()),
            _ => Answer::Accept,
        }),
    );
    let mut c = agent_config(dir.path(), &certs, &[&bootstrap]);
    c.topics.push(topic("/e1/u", StreamIntent::EventStream));
    let agent = start(c).await;
    publish(&agent, "t", &records("a", 10)).await;
    publish(&agent, "u", &records("b", 3)).await;
    publish(&agent, "t", &records("c", 5)).await;
    wait_until("/e1/t acknowledged by its owner", WAIT, async || {
        stat(&agent, "t", "acknowledged_offset").await == 15
    })
    .await;
    wait_until(
        "/e1/u acknowledged by the bootstrap broker",
        WAIT,
        async || stat(&agent, "u", "acknowledged_offset").await == 3,
    )
    .await;

    // The owner got /e1/t exactly once, offsets contiguous from 0, the
    // bytes the edge stored; the bootstrap broker none of it.
    let at_owner = owner.batches("/e1/t");
    assert_eq!(ranges(&at_owner), [(0, 10), (10, 15)]);
    let wal = agent
        .topics()
        .topic(&common::name("/e1/t"))
        .unwrap()
        .wal()
        .unwrap();
    let local: Vec<Bytes> = wal
        .read(0, 1 << 20)
        .unwrap()
        .iter()
        .map(|b| b.as_bytes().clone())
        .collect();
    assert_eq!(
        at_owner.iter().map(|b| b.bytes.clone()).collect::<Vec<_>>(),
        local
    );
    assert_eq!(bootstrap.batches("/e1/t"), []);
    assert_eq!(ranges(&bootstrap.batches("/e1/u")), [(0, 3)]);
    assert!(owner.batches("/e1/u").is_empty());
    assert_eq!(owner.hellos(), ["/e1/t"]);
    assert_eq!(owner.acked("/e1/t"), 15);

    let metrics = get(agent.local_addr(), "/metrics").await.text;
    assert_eq!(
        metric(
            &metrics,
            "tributary_edge_replication_redirects_total{edge=\"e1\"}"
        ),
        Some(1),
        "{metrics}"
    );
    assert_eq!(
        metric(
            &metrics,
            "tributary_edge_replication_connects_total{edge=\"e1\"}"
        ),
        Some(2),
        "one bootstrap connection, one to the owner"
    );
    drop(wal);
    agent.shutdown().await.unwrap();
    owner.stop();
    bootstrap.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_loop_between_two_brokers_backs_off_and_ends_once_one_accepts() {
    let dir = tempfile::tempdir().unwrap();
    let certs = certs(dir.path());
    let b = Broker::start(&certs, 2, Arc::new(|_| Answer::Accept));
    let a = Broker::start(&certs, 1, Arc::new(|_| Answer::Accept));
    let (a_addr, b_addr) = (a.addr.clone(), b.addr.clone());
    // Each names the other as the owner.
    a.set_script(Arc::new(move |_| {
        Answer::Redirect(Redirect {
            broker_id: 2,
            ingest_addr: b_addr.clone(),
            epoch: 1,
        })
    }));
    b.set_script(Arc::new(move |_| {
        Answer::Redirect(Redirect {
            broker_id: 1,
            ingest_addr: a_addr.clone(),
            epoch: 1,
        })
    }));
    let agent = start(agent_config(dir.path(), &certs, &[&a])).await;
    publish(&agent, "t", &records("a", 4)).await;
    let observed = Duration::from_secs(4);
    tokio::time::sleep(observed).await;
    let hellos = a.hellos().len() + b.hellos().len();
    // 5 Hellos per attempt (the bootstrap's and 4 hops), then waits of 1,
    // 2, 4 s: about 15 in 4 s. Without the bound the two would bounce the
    // stream thousands of times.
    assert!(
        (5..=20).contains(&hellos),
        "{hellos} Hellos in {observed:?}"
    );
    let metrics = get(agent.local_addr(), "/metrics").await.text;
    let loops = metric(
        &metrics,
        "tributary_edge_replication_redirect_loops_total{edge=\"e1\"}",
    )
    .unwrap();
    assert!((1..=4).contains(&loops), "{loops} loops\n{metrics}");
    assert_eq!(stat(&agent, "t", "acknowledged_offset").await, 0);

    // The brokers agree again: B owns the topic. The edge gets there.
    b.set_script(Arc::new(|_| Answer::Accept));
    wait_until("/e1/t acknowledged by B", WAIT, async || {
        stat(&agent, "t", "acknowledged_offset").await == 4
    })
    .await;
    assert_eq!(ranges(&b.batches("/e1/t")), [(0, 4)]);
    assert!(a.batches("/e1/t").is_empty());
    agent.shutdown().await.unwrap();
    a.stop();
    b.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_refusing_for_now_sends_the_topic_back_to_bootstrap_and_unavailable_retries_in_a_second()
 {
    let dir = tempfile::tempdir().unwrap();
    let certs = certs(dir.path());
    let owner = Broker::start(
        &certs,
        2,
        Arc::new(|_| Answer::Refuse(ErrorCode::Unavailable)),
    );
    let redirect = Redirect {
        broker_id: 2,
        ingest_addr: owner.addr.clone(),
        epoch: 3,
    };
    let bootstrap_refusals = Arc::new(AtomicU64::new(0));
    let refusals = bootstrap_refusals.clone();
    // The bootstrap broker redirects once, then has no owner for the topic
    // (a failover under way) twice, then owns it.
    let hellos = Arc::new(AtomicU64::new(0));
    let seen = hellos.clone();
    let bootstrap = Broker::start(
        &certs,
        1,
        Arc::new(move |_| match seen.fetch_add(1, Ordering::SeqCst) {
            0 => Answer::Redirect(redirect.clone()),
            1 | 2 => {
                refusals.fetch_add(1, Ordering::SeqCst);
                Answer::Refuse(ErrorCode::Unavailable)
            }
            _ => Answer::Accept,
        }),
    );
    let agent = start(agent_config(dir.path(), &certs, &[&bootstrap])).await;
    let started = tokio::time::Instant::now();
    publish(&agent, "t", &records("a", 6)).await;
    wait_until(
        "/e1/t acknowledged by the bootstrap broker",
        WAIT,
        async || stat(&agent, "t", "acknowledged_offset").await == 6,
    )
    .await;
    let took = started.elapsed();
    assert_eq!(owner.hellos(), ["/e1/t"], "the owner was tried once");
    assert_eq!(bootstrap.hellos().len(), 4);
    assert_eq!(bootstrap_refusals.load(Ordering::SeqCst), 2);
    // Two retryable refusals, 1 s each: not 2 × 5 s.
    assert!(
        took >= Duration::from_millis(1_900) && took < Duration::from_secs(6),
        "{took:?}"
    );
    assert_eq!(ranges(&bootstrap.batches("/e1/t")), [(0, 6)]);
    agent.shutdown().await.unwrap();
    owner.stop();
    bootstrap.stop();
}

/// Config for the retention tests: a 64 KiB budget over 2 KiB batches, so
/// WAL segments are 2 KiB and a few batches make several of them.
fn retention_config(
    dir: &std::path::Path,
    certs: &std::path::Path,
    broker: &Broker,
    retain_until: Option<RetainUntil>,
) -> AgentConfig {
    let mut c = agent_config(dir, certs, &[broker]);
    c.limits = common::small_limits();
    c.disk_budget_bytes = Some(64 * 1024);
    c.topics[0].retain_until = retain_until;
    c
}

/// The sealed segments of `/e1/t`'s WAL now (start offset, next offset).
fn sealed_segments(agent: &Agent) -> Vec<(u64, u64)> {
    agent
        .topics()
        .topic(&common::name("/e1/t"))
        .unwrap()
        .wal()
        .unwrap()
        .sealed_segments()
        .iter()
        .map(|s| (s.base_offset, s.next_offset))
        .collect()
}

/// Publishes `batches` batches of 4 records of about 300 bytes to `/e1/t`.
async fn publish_batches(agent: &Agent, batches: usize) {
    for i in 0..batches {
        publish(agent, "t", &records(&format!("{i:03}").repeat(100), 4)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn archived_frames_gate_deletion_and_the_archived_offset_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let certs = certs(dir.path());
    let broker = Broker::start(&certs, 1, Arc::new(|_| Answer::Accept));
    let c = retention_config(dir.path(), &certs, &broker, None);
    let agent = start(c.clone()).await;
    publish_batches(&agent, 8).await;
    wait_until("everything acknowledged", WAIT, async || {
        stat(&agent, "t", "acknowledged_offset").await == 32
    })
    .await;
    let wal = agent
        .topics()
        .topic(&common::name("/e1/t"))
        .unwrap()
        .wal()
        .unwrap();
    let sealed: Vec<(u64, u64)> = wal
        .sealed_segments()
        .iter()
        .map(|s| (s.base_offset, s.next_offset))
        .collect();
    assert!(sealed.len() >= 3, "{sealed:?}");
    // Acknowledged but not archived: every segment stays. (A checkpoint
    // pass ran: the acknowledged offset is what the API shows.)
    assert_eq!(stat(&agent, "t", "log_start_offset").await, 0);
    assert_eq!(wal.sealed_segments().len(), sealed.len());

    // Archived up to inside the third segment: the first two go, the
    // third (straddling it) stays.
    let archived = sealed[2].0 + 1;
    broker
        .send(
            "/e1/t",
            Frame::Archived {
                archived_offset: archived,
            },
        )
        .await;
    wait_until(
        "segments below the archived offset deleted",
        WAIT,
        async || stat(&agent, "t", "log_start_offset").await == sealed[2].0,
    )
    .await;
    assert_eq!(stat(&agent, "t", "archived_offset").await, archived);
    assert_eq!(
        common::read_wal(&agent, "/e1/t", sealed[2].0)
            .first()
            .map(|r| r.0),
        Some(sealed[2].0)
    );
    let metrics = get(agent.local_addr(), "/metrics").await.text;
    assert_eq!(
        metric(
            &metrics,
            "tributary_edge_unarchived_records{edge=\"e1\",topic=\"/e1/t\"}"
        ),
        Some(32 - archived),
        "{metrics}"
    );
    drop(wal);
    agent.shutdown().await.unwrap();

    // Restarted (the broker still holds 0..32): the archived offset is
    // read back, nothing more is deleted, nothing is re-sent.
    let agent = start(c).await;
    assert_eq!(stat(&agent, "t", "archived_offset").await, archived);
    assert_eq!(stat(&agent, "t", "acknowledged_offset").await, 32);
    assert_eq!(stat(&agent, "t", "log_start_offset").await, sealed[2].0);
    wait_until("the edge reconnected", WAIT, async || {
        broker.hellos().len() == 2
    })
    .await;
    // An Archived frame below the stored offset changes nothing; one at
    // the end deletes every sealed segment.
    broker
        .send(
            "/e1/t",
            Frame::Archived {
                archived_offset: archived - 1,
            },
        )
        .await;
    broker
        .send(
            "/e1/t",
            Frame::Archived {
                archived_offset: 32,
            },
        )
        .await;
    wait_until("every sealed segment deleted", WAIT, async || {
        stat(&agent, "t", "archived_offset").await == 32 && sealed_segments(&agent).is_empty()
    })
    .await;
    assert_eq!(ranges(&broker.batches("/e1/t")).len(), 8, "nothing re-sent");
    agent.shutdown().await.unwrap();
    broker.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_welcome_below_the_checkpoint_resends_exactly_the_missing_offsets_with_the_same_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let certs = certs(dir.path());
    let broker = Broker::start(&certs, 1, Arc::new(|_| Answer::Accept));
    let agent = start(retention_config(dir.path(), &certs, &broker, None)).await;
    publish_batches(&agent, 8).await;
    wait_until("everything acknowledged", WAIT, async || {
        stat(&agent, "t", "acknowledged_offset").await == 32
    })
    .await;
    // The old owner archived 0..12 before it died.
    broker
        .send(
            "/e1/t",
            Frame::Archived {
                archived_offset: 12,
            },
        )
        .await;
    wait_until("archived offset recorded", WAIT, async || {
        stat(&agent, "t", "archived_offset").await == 12
    })
    .await;
    let first_copy = broker.batches("/e1/t");
    assert_eq!(first_copy.len(), 8);

    // Failover: the new owner opens the topic at the archive's end, 12,
    // below the edge's checkpoint 32.
    broker.set_script(Arc::new(|_| Answer::WelcomeAt(12)));
    broker.drop_connections();
    wait_until("the missing offsets re-sent", WAIT, async || {
        broker.batches("/e1/t").len() == 8 + 5 && broker.acked("/e1/t") == 32
    })
    .await;
    let resent = &broker.batches("/e1/t")[8..];
    // Exactly 12..32, batch for batch what the first owner got.
    assert_eq!(resent, &first_copy[3..]);
    assert_eq!(resent[0].base_offset, 12);
    assert_eq!(stat(&agent, "t", "acknowledged_offset").await, 32);
    // New records continue after them.
    publish(&agent, "t", &records("after", 2)).await;
    wait_until("the next batch", WAIT, async || broker.acked("/e1/t") == 34).await;
    assert_eq!(ranges(&broker.batches("/e1/t")[13..]), [(32, 34)]);
    agent.shutdown().await.unwrap();
    broker.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_retain_until_acknowledged_a_welcome_below_the_deleted_range_stops_with_local_data_missing()
 {
    let dir = tempfile::tempdir().unwrap();
    let certs = certs(dir.path());
    let broker = Broker::start(&certs, 1, Arc::new(|_| Answer::Accept));
    let agent = start(retention_config(
        dir.path(),
        &certs,
        &broker,
        Some(RetainUntil::Acknowledged),
    ))
    .await;
    publish_batches(&agent, 8).await;
    // The acknowledged offset is raised before the segments below it are
    // deleted: wait for the deletion itself (no sealed segment left), or
    // the log start read next may still move.
    wait_until("acknowledged segments deleted", WAIT, async || {
        stat(&agent, "t", "acknowledged_offset").await == 32 && sealed_segments(&agent).is_empty()
    })
    .await;
    let start_offset = stat(&agent, "t", "log_start_offset").await;
    assert!(start_offset > 12, "log start {start_offset}");
    broker.set_script(Arc::new(|_| Answer::WelcomeAt(12)));
    broker.drop_connections();
    wait_until("the edge tried the new owner", WAIT, async || {
        broker.hellos().len() >= 2
    })
    .await;
    // The range 12..start is gone from the edge: nothing is sent, nothing
    // skipped silently (the checkpoint stays where it was).
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(broker.batches("/e1/t").len(), 8);
    assert_eq!(stat(&agent, "t", "acknowledged_offset").await, 32);
    assert_eq!(stat(&agent, "t", "log_start_offset").await, start_offset);
    agent.shutdown().await.unwrap();
    broker.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_gone_silent_is_noticed_within_the_idle_timeout_and_the_next_broker_takes_over() {
    use tributary_test_support::relay::{LinkConfig, Relay, RelayConfig};
    let dir = tempfile::tempdir().unwrap();
    let certs = certs(dir.path());
    let first = Broker::start(&certs, 1, Arc::new(|_| Answer::Accept));
    let second = Broker::start(&certs, 2, Arc::new(|_| Answer::Accept));
    // The first broker is reached through a relay the test can cut: its
    // host vanishes without a word (no close, no reset).
    let relay = Relay::start(
        RelayConfig::symmetric(7, LinkConfig::perfect()),
        first.addr.parse().unwrap(),
    )
    .unwrap();
    let mut c = agent_config(dir.path(), &certs, &[&first, &second]);
    c.brokers[0] = relay.addr().to_string();
    let agent = start(c).await;
    publish(&agent, "t", &records("a", 5)).await;
    wait_until("acknowledged by the first broker", WAIT, async || {
        stat(&agent, "t", "acknowledged_offset").await == 5
    })
    .await;
    relay.cut();
    let cut_at = tokio::time::Instant::now();
    publish(&agent, "t", &records("b", 3)).await;
    wait_until("acknowledged by the second broker", WAIT, async || {
        stat(&agent, "t", "acknowledged_offset").await == 8
    })
    .await;
    let took = cut_at.elapsed();
    // The default idle timeout is 5 s (keep-alive 1 s), then the next
    // bootstrap broker: well under the old 30 s.
    assert!(
        took >= Duration::from_secs(4) && took < Duration::from_secs(9),
        "failover took {took:?}"
    );
    let metrics = get(agent.local_addr(), "/metrics").await.text;
    assert_eq!(
        metric(
            &metrics,
            "tributary_edge_replication_connections_lost_total{edge=\"e1\",reason=\"timed_out\"}"
        ),
        Some(1),
        "{metrics}"
    );
    // The second broker had nothing: it got everything, exactly once,
    // from the retained log (nothing was archived, so nothing was deleted).
    assert_eq!(ranges(&second.batches("/e1/t")), [(0, 5), (5, 8)]);
    assert_eq!(ranges(&first.batches("/e1/t")), [(0, 5)]);
    agent.shutdown().await.unwrap();
    relay.shutdown();
    first.stop();
    second.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_whose_connection_fails_sends_its_topics_back_to_bootstrap() {
    let dir = tempfile::tempdir().unwrap();
    let certs = certs(dir.path());
    // The "owner" closes every connection right after its handshake.
    let tls = TlsIdentity::load(&broker_paths(&certs, 2)).unwrap();
    let server = tls.quic_server(ALPN_REPLICATION).unwrap();
    let closer = quinn::Endpoint::server(server, "127.0.0.1:0".parse().unwrap()).unwrap();
    let closed = Arc::new(AtomicU64::new(0));
    let closer_task = {
        let (closer, closed) = (closer.clone(), closed.clone());
        tokio::spawn(async move {
            while let Some(incoming) = closer.accept().await {
                if let Ok(conn) = incoming.await {
                    closed.fetch_add(1, Ordering::SeqCst);
                    conn.close(1u32.into(), b"going away");
                }
            }
        })
    };
    let redirect = Redirect {
        broker_id: 2,
        ingest_addr: closer.local_addr().unwrap().to_string(),
        epoch: 4,
    };
    let hellos = Arc::new(AtomicU64::new(0));
    let seen = hellos.clone();
    // Redirects the first Hello there; owns the topic after that.
    let bootstrap = Broker::start(
        &certs,
        1,
        Arc::new(move |_| match seen.fetch_add(1, Ordering::SeqCst) {
            0 => Answer::Redirect(redirect.clone()),
            _ => Answer::Accept,
        }),
    );
    let agent = start(agent_config(dir.path(), &certs, &[&bootstrap])).await;
    publish(&agent, "t", &records("a", 7)).await;
    wait_until(
        "/e1/t acknowledged by the bootstrap broker",
        WAIT,
        async || stat(&agent, "t", "acknowledged_offset").await == 7,
    )
    .await;
    assert_eq!(
        closed.load(Ordering::SeqCst),
        1,
        "the owner was dialled once"
    );
    assert_eq!(bootstrap.hellos(), ["/e1/t", "/e1/t"]);
    assert_eq!(ranges(&bootstrap.batches("/e1/t")), [(0, 7)]);
    agent.shutdown().await.unwrap();
    closer_task.abort();
    closer.close(0u32.into(), b"done");
    bootstrap.stop();
}
