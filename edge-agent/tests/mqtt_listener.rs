//! The MQTT listener in process over real TCP and a real WAL and metadata
//! store: the QoS 2 session state machine across a restart, including the
//! crash window between the WAL append and recording the packet id.

mod common;

use broker_core::metadata::MetadataStore;
use bytes::{Bytes, BytesMut};
use common::*;
use rumqttc::mqttbytes::QoS;
use rumqttc::mqttbytes::v4::{self, Packet};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tributary_edge::mqtt::{MqttConfig, MqttFileConfig, config::MqttTopicFileConfig};
use tributary_proto::batch::Record;
use tributary_proto::intent::StreamIntent;
use tributary_proto::keys::{NamespaceName, edge};

fn mqtt_config() -> MqttConfig {
    let file = MqttFileConfig {
        listen: Some("127.0.0.1:0".parse().unwrap()),
        topics: vec![MqttTopicFileConfig {
            filter: "s/#".into(),
            topic: "/e1/t".into(),
        }],
        ..MqttFileConfig::default()
    };
    MqttConfig::resolve(file, &NamespaceName::new("e1").unwrap()).unwrap()
}

/// An agent in `dir` with the WAL topic `/e1/t` and the MQTT listener.
fn listener_config(dir: &std::path::Path) -> tributary_edge::config::AgentConfig {
    let mut config = config(dir);
    config
        .topics
        .push(topic("/e1/t", StreamIntent::EventStream));
    config.mqtt = Some(mqtt_config());
    config
}

struct Client {
    stream: TcpStream,
    buf: BytesMut,
}

impl Client {
    async fn connect(addr: std::net::SocketAddr, id: &str, clean: bool) -> (Client, bool) {
        let stream = TcpStream::connect(addr).await.unwrap();
        let mut c = Client {
            stream,
            buf: BytesMut::new(),
        };
        let mut connect = v4::Connect::new(id);
        connect.clean_session = clean;
        c.send(Packet::Connect(connect)).await;
        match c.recv().await {
            Packet::ConnAck(ack) => {
                assert_eq!(ack.code, v4::ConnectReturnCode::Success);
                (c, ack.session_present)
            }
            other => panic!("expected CONNACK, got {other:?}"),
        }
    }

    async fn send(&mut self, packet: Packet) {
        let mut out = BytesMut::new();
        packet.write(&mut out, 1 << 20).unwrap();
        self.stream.write_all(&out).await.unwrap();
    }

    async fn recv(&mut self) -> Packet {
        loop {
            match Packet::read(&mut self.buf, 1 << 20) {
                Ok(p) => return p,
                Err(rumqttc::mqttbytes::Error::InsufficientBytes(_)) => {}
                Err(e) => panic!("decode: {e}"),
            }
            let n = tokio::time::timeout(
                std::time::Duration::from_secs(5),
                self.stream.read_buf(&mut self.buf),
            )
            .await
            .expect("an answer within 5 s")
            .unwrap();
            assert!(n > 0, "connection closed");
        }
    }

    async fn publish_qos2(&mut self, pkid: u16, dup: bool, payload: &str) {
        let mut p = v4::Publish::new("s/a", QoS::ExactlyOnce, payload.as_bytes().to_vec());
        p.pkid = pkid;
        p.dup = dup;
        self.send(Packet::Publish(p)).await;
        assert_eq!(self.recv().await, Packet::PubRec(v4::PubRec::new(pkid)));
    }

    /// Whether the agent closes this connection within 5 s (EOF; 3.1.1
    /// has no server DISCONNECT), skipping anything it sent before.
    async fn closed_by_agent(&mut self) -> bool {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            match tokio::time::timeout_at(deadline, self.stream.read_buf(&mut self.buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => return true,
                Ok(Ok(_)) => {}
                Err(_) => return false,
            }
        }
    }

    async fn release(&mut self, pkid: u16) {
        self.send(Packet::PubRel(v4::PubRel::new(pkid))).await;
        assert_eq!(self.recv().await, Packet::PubComp(v4::PubComp::new(pkid)));
    }
}

/// [`listener_config`] with segments of two records (1 % of the topic's
/// budget, at least a batch) deleted once acknowledged.
fn deleting_config(dir: &std::path::Path) -> tributary_edge::config::AgentConfig {
    let mut config = listener_config(dir);
    config.limits = small_limits();
    let t = config.topics.last_mut().expect("the topic");
    t.disk_budget_bytes = Some(100_000);
    t.retain_until = Some(tributary_edge::config::RetainUntil::Acknowledged);
    config
}

/// Starts an agent with [`deleting_config`] whose `/e1/t` holds client
/// `dev`'s QoS 2 record `value` (packet id `pkid`) at offset 0 and 20
/// other records after it.
async fn start_with_stored(
    config: &tributary_edge::config::AgentConfig,
    value: &str,
    pkid: u16,
) -> tributary_edge::agent::Agent {
    let agent = start(config.clone()).await;
    agent
        .topics()
        .publish(&name("/e1/t"), vec![with_headers(value, "dev", pkid)])
        .await
        .unwrap();
    publish_others(&agent).await;
    agent
}

/// Acknowledges all of `/e1/t`, which deletes its sealed segments; returns
/// the WAL's new start.
async fn delete_acknowledged(agent: &tributary_edge::agent::Agent) -> u64 {
    let topic = agent.topics().topic(&name("/e1/t")).expect("topic");
    let deleted = agent
        .topics()
        .on_acknowledged(&name("/e1/t"), topic.high_water_mark())
        .await
        .unwrap()
        .deleted_segments;
    assert!(!deleted.is_empty());
    topic.wal().expect("wal").log_start_offset()
}

/// Publishes 20 records of about 800 bytes to `/e1/t`.
async fn publish_others(agent: &tributary_edge::agent::Agent) {
    for i in 0..20 {
        let value = format!("other {i:>800}");
        agent
            .topics()
            .publish(&name("/e1/t"), vec![record(value.as_bytes())])
            .await
            .unwrap();
    }
}

/// Stores `session` as client `dev`'s (the state a SIGKILL leaves), shuts
/// `agent` down and starts it again with `config`.
async fn restart_with_session(
    agent: tributary_edge::agent::Agent,
    config: tributary_edge::config::AgentConfig,
    session: serde_json::Value,
) -> tributary_edge::agent::Agent {
    agent
        .topics()
        .store()
        .put(&edge::mqtt_session("dev"), session)
        .await
        .unwrap();
    agent.shutdown().await.unwrap();
    start(config).await
}

/// Waits (at most 5 s) until the stored session of client `dev` passes
/// `done`.
async fn wait_for_stored_session(
    agent: &tributary_edge::agent::Agent,
    done: impl Fn(&serde_json::Value) -> bool,
) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let stored = agent
            .topics()
            .store()
            .get(&edge::mqtt_session("dev"))
            .await
            .unwrap();
        if stored.as_ref().is_some_and(&done) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "session not saved: {stored:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

fn with_headers(value: &str, client: &str, pkid: u16) -> Record {
    Record {
        timestamp_ms: NOW_MS as i64,
        key: None,
        headers: vec![
            ("mqtt.topic".into(), Bytes::from_static(b"s/a")),
            (
                "mqtt.client_id".into(),
                Bytes::copy_from_slice(client.as_bytes()),
            ),
            ("mqtt.packet_id".into(), Bytes::from(pkid.to_string())),
        ],
        value: Bytes::copy_from_slice(value.as_bytes()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qos2_resends_after_a_restart_are_stored_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let config = listener_config(dir.path());

    // The state a SIGKILL leaves between the WAL append and recording the
    // packet id: pkid 7's record is in the WAL, its entry still pending;
    // pkid 9's entry is pending but its record never reached the WAL.
    let agent = start(config.clone()).await;
    agent
        .topics()
        .publish(&name("/e1/t"), vec![with_headers("seven", "dev", 7)])
        .await
        .unwrap();
    let session = json!({"client_id": "dev", "qos2": {
        "7": {"state": "pending", "topic": "/e1/t", "from": 0},
        "9": {"state": "pending", "topic": "/e1/t", "from": 1},
    }});
    let agent = restart_with_session(agent, config.clone(), session).await;
    let addr = agent.mqtt_addr().expect("mqtt listener");
    let (mut c, present) = Client::connect(addr, "dev", false).await;
    assert!(present, "the stored session is resumed");
    c.publish_qos2(7, true, "seven").await; // found in the WAL: not stored
    c.publish_qos2(9, true, "nine").await; // not in the WAL: stored
    c.publish_qos2(9, true, "nine").await; // now received: not stored
    c.release(7).await;
    c.release(9).await;
    c.publish_qos2(10, false, "ten").await;
    c.publish_qos2(10, true, "ten").await;
    // A PUBREL for an id the agent does not know: PUBCOMP anyway (3.1.1
    // has no reason code).
    c.release(10).await;
    c.send(Packet::PubRel(v4::PubRel::new(10))).await;
    assert_eq!(c.recv().await, Packet::PubComp(v4::PubComp::new(10)));
    c.send(Packet::Disconnect).await;
    // The connection saves its session when it ends.
    wait_for_stored_session(&agent, |s| s["qos2"] == json!({})).await;

    let values: Vec<Bytes> = read_wal(&agent, "/e1/t", 0)
        .into_iter()
        .map(|(_, r)| r.value)
        .collect();
    assert_eq!(values, vec!["seven", "nine", "ten"]);
    let stored = agent
        .topics()
        .store()
        .get(&edge::mqtt_session("dev"))
        .await
        .unwrap()
        .expect("session stored");
    assert_eq!(stored["qos2"], json!({}), "released ids are forgotten");
    agent.shutdown().await.unwrap();

    // A clean start drops the stored session.
    let agent = start(config).await;
    let (_c, present) = Client::connect(agent.mqtt_addr().unwrap(), "dev", true).await;
    assert!(!present);
    assert!(
        agent
            .topics()
            .store()
            .get(&edge::mqtt_session("dev"))
            .await
            .unwrap()
            .is_none()
    );
}

/// A graceful shutdown with clients still connected returns only after each
/// connection has saved its session: the unreleased QoS 2 id is there at the
/// next start (in the same process, right away: the metadata store is free),
/// so the client's resend after the restart is not stored twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_with_connected_clients_saves_their_sessions_first() {
    let dir = tempfile::tempdir().unwrap();
    let config = listener_config(dir.path());

    for round in 0..3u16 {
        let agent = start(config.clone()).await;
        let addr = agent.mqtt_addr().expect("mqtt listener");
        let (mut c, present) = Client::connect(addr, "dev", false).await;
        assert_eq!(present, round > 0, "round {round}");
        let pkid = 100 + round;
        c.publish_qos2(pkid, false, "once").await;
        // A second, idle client that never sent CONNECT.
        let _silent = TcpStream::connect(addr).await.unwrap();
        agent.shutdown().await.unwrap();

        let agent = start(config.clone()).await;
        let stored = agent
            .topics()
            .store()
            .get(&edge::mqtt_session("dev"))
            .await
            .unwrap()
            .expect("session saved at shutdown");
        assert_eq!(
            stored["qos2"][pkid.to_string()]["state"],
            json!("received"),
            "round {round}: {stored}"
        );
        let (mut c, present) = Client::connect(agent.mqtt_addr().unwrap(), "dev", false).await;
        assert!(present);
        c.publish_qos2(pkid, true, "once").await; // a resend: not stored again
        c.release(pkid).await;
        let values = read_wal(&agent, "/e1/t", 0).len();
        assert_eq!(values, usize::from(round) + 1, "round {round}");
        agent.shutdown().await.unwrap();
    }
}

/// Session take-over (MQTT 3.1.1 §3.1.4) while the connection holding the
/// session is busy with a packet: here a resent QoS 2 PUBLISH whose
/// pending id makes the agent scan 32 MB of WAL. The new connection gets
/// the session only after the old one finished that packet and let go;
/// the old one is closed. Before, the new connection took the session from
/// the store at once, the old one missed the take-over (it was not
/// waiting for it) and lived on, and when it ended it put its stale
/// session back over the new one's: the next connection then stored a
/// resent QoS 2 message a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_taken_over_mid_packet_is_handed_over_whole() {
    let dir = tempfile::tempdir().unwrap();
    let config = listener_config(dir.path());
    let agent = start(config.clone()).await;
    let value = "x".repeat(1024);
    for _ in 0..64 {
        let records = (0..500).map(|_| record(value.as_bytes())).collect();
        agent
            .topics()
            .publish(&name("/e1/t"), records)
            .await
            .unwrap();
    }
    let bulk = 64 * 500;
    // pkid 9 is pending from offset 0 and its record is not in the WAL:
    // its resend scans all of it.
    let session = json!({"client_id": "dev", "qos2": {
        "9": {"state": "pending", "topic": "/e1/t", "from": 0},
    }});
    let agent = restart_with_session(agent, config, session).await;
    let addr = agent.mqtt_addr().expect("mqtt listener");
    let (mut old, present) = Client::connect(addr, "dev", false).await;
    assert!(present);
    let mut resend = v4::Publish::new("s/a", QoS::ExactlyOnce, b"nine".to_vec());
    resend.pkid = 9;
    resend.dup = true;
    old.send(Packet::Publish(resend)).await;
    // Pacing, not synchronisation: let the scan start (the outcome below
    // must hold whenever the take-over lands).
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    let (mut new, present) = Client::connect(addr, "dev", false).await;
    assert!(present);
    assert!(
        old.closed_by_agent().await,
        "the connection whose session was taken over is closed"
    );
    new.publish_qos2(9, true, "nine").await; // stored by the old connection
    new.publish_qos2(11, false, "eleven").await;
    new.send(Packet::Disconnect).await;
    // The new connection saves its session as it ends...
    wait_for_stored_session(&agent, |s| s["qos2"]["11"]["state"] == json!("received")).await;
    // ... and only then does the old client's socket close. Pacing: give a
    // connection that wrongly outlived the take-over time to end and put
    // its session back.
    drop(old);
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;

    let (mut next, present) = Client::connect(addr, "dev", false).await;
    assert!(present);
    next.publish_qos2(11, true, "eleven").await; // a resend: not stored again
    next.release(11).await;
    next.release(9).await;
    let values: Vec<Bytes> = read_wal(&agent, "/e1/t", bulk)
        .into_iter()
        .map(|(_, r)| r.value)
        .collect();
    assert_eq!(values, vec!["nine", "eleven"]);
    agent.shutdown().await.unwrap();
}

/// A QoS 2 entry left `pending` (its append completed, the connection
/// saved nothing since, then the agent died) whose range of the WAL was
/// acknowledged and deleted before the client resent: the resend is not
/// stored again. Before, the look-up began at the WAL's new start, did
/// not find the record and stored a second copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resend_whose_range_was_deleted_is_not_stored_again() {
    let dir = tempfile::tempdir().unwrap();
    let config = deleting_config(dir.path());
    let agent = start_with_stored(&config, "five", 5).await;
    let start_after = delete_acknowledged(&agent).await;
    assert!(
        start_after > 1,
        "offset 0 deleted: log starts at {start_after}"
    );
    let session = json!({"client_id": "dev", "qos2": {
        "5": {"state": "pending", "topic": "/e1/t", "from": 0},
    }});
    let agent = restart_with_session(agent, config, session).await;
    let (mut c, present) = Client::connect(agent.mqtt_addr().unwrap(), "dev", false).await;
    assert!(present);
    c.publish_qos2(5, true, "five").await;
    c.release(5).await;
    let hwm = agent
        .topics()
        .topic(&name("/e1/t"))
        .expect("topic")
        .high_water_mark();
    assert_eq!(hwm, 21, "nothing stored");
    agent.shutdown().await.unwrap();
}

/// A QoS 2 message whose entry a crash left `pending` but whose record
/// never reached the WAL, resent only after the WAL past its entry was
/// acknowledged and deleted: stored (once). The agent settles every pending
/// entry when the listener starts, before anything can delete from a WAL;
/// looked up only at the resend, the deleted range would have been taken
/// for the stored record and the message lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_entries_are_settled_at_start_before_their_range_can_go() {
    let dir = tempfile::tempdir().unwrap();
    let config = deleting_config(dir.path());
    let agent = start_with_stored(&config, "seven", 7).await;
    // 7 was stored at offset 0; 9 was about to be stored at 21 when the
    // agent died.
    let session = json!({"client_id": "dev", "qos2": {
        "7": {"state": "pending", "topic": "/e1/t", "from": 0},
        "9": {"state": "pending", "topic": "/e1/t", "from": 21},
    }});
    let agent = restart_with_session(agent, config, session).await;
    let stored = agent
        .topics()
        .store()
        .get(&edge::mqtt_session("dev"))
        .await
        .unwrap()
        .expect("session");
    assert_eq!(
        stored["qos2"],
        json!({"7": {"state": "received"}}),
        "settled at start"
    );
    // While the client is away the WAL moves on past both entries.
    publish_others(&agent).await;
    let log_start = delete_acknowledged(&agent).await;
    assert!(log_start > 21, "log starts at {log_start}");

    let (mut c, present) = Client::connect(agent.mqtt_addr().unwrap(), "dev", false).await;
    assert!(present);
    c.publish_qos2(9, true, "nine").await;
    c.publish_qos2(7, true, "seven").await;
    c.release(9).await;
    c.release(7).await;
    let values: Vec<Bytes> = read_wal(&agent, "/e1/t", 41)
        .into_iter()
        .map(|(_, r)| r.value)
        .collect();
    assert_eq!(values, vec!["nine"], "9 stored once, 7 not again");
    agent.shutdown().await.unwrap();
}

/// The listener keeps in memory the sessions of connected clients and the
/// persistent ones: anonymous and clean-session clients' sessions end with
/// their connection. Before, every client id ever seen (each anonymous
/// connection its own) kept its session in memory for the life of the
/// agent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_leave_memory_when_their_connection_ends() {
    let dir = tempfile::tempdir().unwrap();
    let agent = start(listener_config(dir.path())).await;
    let addr = agent.mqtt_addr().expect("mqtt listener");
    let sessions = || async {
        let reply = get(agent.local_addr(), "/metrics").await;
        reply
            .text
            .lines()
            .filter(|l| l.starts_with("tributary_edge_mqtt_sessions_in_memory"))
            .find_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .expect("the gauge")
    };
    let (mut connected, _) = Client::connect(addr, "connected", true).await;
    for i in 0..20 {
        let (id, clean) = match i % 3 {
            0 => (String::new(), true),
            1 => (format!("clean-{i}"), true),
            _ => (format!("persistent-{i}"), false),
        };
        let (mut c, _) = Client::connect(addr, &id, clean).await;
        c.publish_qos2(1, false, "x").await;
        c.send(Packet::Disconnect).await;
        assert!(c.closed_by_agent().await);
    }
    // 6 persistent sessions and the connected client's.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while sessions().await != 7 {
        assert!(
            std::time::Instant::now() < deadline,
            "{} sessions in memory, 7 expected",
            sessions().await
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    connected.send(Packet::Disconnect).await;
    assert!(connected.closed_by_agent().await);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while sessions().await != 6 {
        assert!(
            std::time::Instant::now() < deadline,
            "the clean session stays in memory"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    agent.shutdown().await.unwrap();
}

/// A client that trickles its CONNECT a byte at a time is closed once the
/// CONNECT time (10 s) has passed in all: before, each byte restarted it,
/// so a few such sockets held every `max_connections` place without
/// authenticating.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connect_trickled_byte_by_byte_is_cut_off_after_the_connect_time() {
    let dir = tempfile::tempdir().unwrap();
    let agent = start(listener_config(dir.path())).await;
    let mut connect = BytesMut::new();
    Packet::Connect(v4::Connect::new("slow"))
        .write(&mut connect, 1 << 20)
        .unwrap();
    let mut stream = TcpStream::connect(agent.mqtt_addr().unwrap())
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let mut sent = 0;
    let closed_after = loop {
        // Never the last byte: the CONNECT stays incomplete.
        if sent + 1 < connect.len() {
            if stream.write_all(&connect[sent..=sent]).await.is_err() {
                break started.elapsed();
            }
            sent += 1;
        }
        let mut byte = [0u8; 1];
        match tokio::time::timeout(std::time::Duration::from_secs(2), stream.read(&mut byte)).await
        {
            Ok(Ok(0)) | Ok(Err(_)) => break started.elapsed(),
            Ok(Ok(_)) => panic!("an answer to an incomplete CONNECT"),
            Err(_) => {}
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(16),
            "still open after {sent} bytes in {:?}",
            started.elapsed()
        );
    };
    assert!(
        closed_after >= std::time::Duration::from_secs(9),
        "closed after {closed_after:?}"
    );
    agent.shutdown().await.unwrap();
}

/// A 5.0 PUBLISH with a user property named like the agent's own headers
/// (`mqtt.` and more) is refused with 0x83 and nothing is stored: a
/// client could otherwise write another client's `mqtt.client_id` and
/// `mqtt.packet_id`, which the QoS 2 crash recovery looks for, and make
/// that client's resend look stored (lost), or hide its own (stored twice,
/// as a fresh-user trial showed). Other user properties are kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_property_named_like_the_agents_headers_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let agent = start(listener_config(dir.path())).await;
    let (mut c, _) = V5Client::connect(agent.mqtt_addr().unwrap(), "props", true, 0).await;
    for (pkid, (name, value)) in [(1u16, ("mqtt.packet_id", "5")), (2, ("site", "north"))] {
        let properties = m5::PublishProperties {
            user_properties: vec![(name.into(), value.into())],
            ..Default::default()
        };
        let mut publish = m5::Publish::new("s/a", m5q::AtLeastOnce, name, Some(properties));
        publish.pkid = pkid;
        match c.exchange(m5::Packet::Publish(publish)).await {
            m5::Packet::PubAck(ack) => {
                let want = if pkid == 1 {
                    m5::PubAckReason::ImplementationSpecificError
                } else {
                    m5::PubAckReason::Success
                };
                assert_eq!((ack.pkid, ack.reason), (pkid, want));
            }
            other => panic!("{other:?}"),
        }
    }
    let records = read_wal(&agent, "/e1/t", 0);
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].1.value, "site");
    assert!(
        records[0]
            .1
            .headers
            .iter()
            .any(|(n, v)| n == "site" && v == "north")
    );
    agent.shutdown().await.unwrap();
}

/// A clean session ends with its connection (3.1.1 §3.1.2.4): a later
/// CONNECT of that client id without a clean session finds no session,
/// and a message reusing a packet id of the old one is new and stored.
/// Before, the old session stayed in memory and was resumed (session
/// present), and the new message was taken for a resend: acknowledged
/// (PUBREC, PUBCOMP) and never stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_session_ends_with_its_connection() {
    let dir = tempfile::tempdir().unwrap();
    let agent = start(listener_config(dir.path())).await;
    let addr = agent.mqtt_addr().unwrap();
    let (mut c, _) = Client::connect(addr, "c1", true).await;
    c.publish_qos2(1, false, "first").await; // no PUBREL
    c.send(Packet::Disconnect).await;
    assert!(c.closed_by_agent().await);
    let (mut c, present) = Client::connect(addr, "c1", false).await;
    assert!(!present, "the clean session ended with its connection");
    c.publish_qos2(1, false, "second").await;
    c.release(1).await;
    let values: Vec<Bytes> = read_wal(&agent, "/e1/t", 0)
        .into_iter()
        .map(|(_, r)| r.value)
        .collect();
    assert_eq!(values, vec!["first", "second"]);
    agent.shutdown().await.unwrap();
}

use rumqttc::v5::mqttbytes::QoS as m5q;
use rumqttc::v5::mqttbytes::v5 as m5;

/// An MQTT 5.0 client over raw TCP (rumqttc's codec).
struct V5Client {
    stream: TcpStream,
    buf: BytesMut,
}

impl V5Client {
    /// Connects as `id` with `clean_start` and a session expiry of
    /// `expiry_s`; returns the client and whether a session was present.
    async fn connect(
        addr: std::net::SocketAddr,
        id: &str,
        clean_start: bool,
        expiry_s: u32,
    ) -> (V5Client, bool) {
        let mut c = V5Client {
            stream: TcpStream::connect(addr).await.unwrap(),
            buf: BytesMut::new(),
        };
        let properties = m5::ConnectProperties {
            session_expiry_interval: Some(expiry_s),
            ..m5::ConnectProperties::new()
        };
        let connect = m5::Connect {
            keep_alive: 60,
            client_id: id.into(),
            clean_start,
            properties: Some(properties),
        };
        match c.exchange(m5::Packet::Connect(connect, None, None)).await {
            m5::Packet::ConnAck(ack) => {
                assert_eq!(ack.code, m5::ConnectReturnCode::Success);
                (c, ack.session_present)
            }
            other => panic!("expected CONNACK, got {other:?}"),
        }
    }

    async fn send(&mut self, packet: m5::Packet) {
        let mut out = BytesMut::new();
        packet.write(&mut out, None).unwrap();
        self.stream.write_all(&out).await.unwrap();
    }

    /// Sends `packet` and returns the next packet the agent sends.
    async fn exchange(&mut self, packet: m5::Packet) -> m5::Packet {
        self.send(packet).await;
        loop {
            match m5::Packet::read(&mut self.buf, None) {
                Ok(p) => return p,
                Err(rumqttc::v5::mqttbytes::Error::InsufficientBytes(_)) => {}
                Err(e) => panic!("decode: {e}"),
            }
            let n = tokio::time::timeout(
                std::time::Duration::from_secs(5),
                self.stream.read_buf(&mut self.buf),
            )
            .await
            .expect("an answer within 5 s")
            .unwrap();
            assert!(n > 0, "connection closed");
        }
    }

    /// PUBLISH QoS 2 `payload` as `pkid`, expecting PUBREC 0.
    async fn publish_qos2(&mut self, pkid: u16, payload: &str) {
        let mut publish = m5::Publish::new("s/a", m5q::ExactlyOnce, payload.to_owned(), None);
        publish.pkid = pkid;
        match self.exchange(m5::Packet::Publish(publish)).await {
            m5::Packet::PubRec(rec) => {
                assert_eq!((rec.pkid, rec.reason), (pkid, m5::PubRecReason::Success));
            }
            other => panic!("expected PUBREC, got {other:?}"),
        }
    }

    /// DISCONNECT, with `expiry_s` as the new session expiry if given; waits
    /// for the agent to close the connection.
    async fn disconnect(mut self, expiry_s: Option<u32>) {
        let properties = expiry_s.map(|e| m5::DisconnectProperties {
            session_expiry_interval: Some(e),
            reason_string: None,
            user_properties: Vec::new(),
            server_reference: None,
        });
        self.send(m5::Packet::Disconnect(m5::Disconnect {
            reason_code: m5::DisconnectReasonCode::NormalDisconnection,
            properties,
        }))
        .await;
        let mut rest = Vec::new();
        let read = self.stream.read_to_end(&mut rest);
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), read)
            .await
            .expect("closed within 5 s");
    }
}

/// MQTT 5.0 §3.1.2.11.2: a session resumed by a CONNECT with session
/// expiry 0, or whose DISCONNECT sets it to 0, ends with that connection,
/// stored copy included. Before, the stored copy stayed (stale: it still
/// held a QoS 2 id the client had since released), a later persistent
/// CONNECT resumed it (session present), and a new message reusing the id
/// was taken for a resend: acknowledged and never stored (found by a
/// fresh-user trial).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_ended_by_expiry_zero_leaves_no_stored_copy() {
    let dir = tempfile::tempdir().unwrap();
    let agent = start(listener_config(dir.path())).await;
    let addr = agent.mqtt_addr().unwrap();
    // Resumed with expiry 0, released there, then resumed persistently.
    let (mut c, _) = V5Client::connect(addr, "a", false, 600).await;
    c.publish_qos2(1, "a-first").await;
    c.disconnect(None).await;
    let (mut c, present) = V5Client::connect(addr, "a", false, 0).await;
    assert!(present);
    match c
        .exchange(m5::Packet::PubRel(m5::PubRel::new(1, None)))
        .await
    {
        m5::Packet::PubComp(comp) => assert_eq!(comp.reason, m5::PubCompReason::Success),
        other => panic!("{other:?}"),
    }
    c.disconnect(None).await;
    let (mut c, present) = V5Client::connect(addr, "a", false, 600).await;
    assert!(!present, "the session ended with the expiry-0 connection");
    c.publish_qos2(1, "a-second").await;
    c.disconnect(Some(0)).await;
    // Ended by its DISCONNECT.
    let (mut c, present) = V5Client::connect(addr, "a", false, 600).await;
    assert!(!present, "the session ended with its DISCONNECT's expiry 0");
    c.publish_qos2(1, "a-third").await;
    c.disconnect(None).await;
    let values: Vec<Bytes> = read_wal(&agent, "/e1/t", 0)
        .into_iter()
        .map(|(_, r)| r.value)
        .collect();
    assert_eq!(values, vec!["a-first", "a-second", "a-third"]);
    agent.shutdown().await.unwrap();
}

/// A CONNECT announcing more than 64 KiB is refused as soon as its header
/// arrives, before any authentication: the agent does not wait for (and
/// buffer) a PUBLISH-sized first packet on each of its connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connect_over_64_kib_is_refused_at_its_header() {
    let dir = tempfile::tempdir().unwrap();
    let agent = start(listener_config(dir.path())).await;
    let mut stream = TcpStream::connect(agent.mqtt_addr().unwrap())
        .await
        .unwrap();
    // CONNECT, remaining length 64 KiB + 1 (variable byte integer).
    let len = 64 * 1024 + 1;
    stream
        .write_all(&[
            0x10,
            (len & 0x7f) as u8 | 0x80,
            ((len >> 7) & 0x7f) as u8 | 0x80,
            (len >> 14) as u8,
        ])
        .await
        .unwrap();
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(
        std::time::Duration::from_secs(2),
        stream.read_to_end(&mut rest),
    )
    .await;
    assert!(closed.is_ok(), "still open 2 s after the header");
    agent.shutdown().await.unwrap();
}

/// The agent names a client that connected with an empty client id
/// `"\0anonymous-N"`. A CONNECT with a NUL in its client id is malformed
/// (MQTT 3.1.1 §1.5.3, [MQTT-1.5.3-2]) and closed without a CONNACK;
/// before, the codec accepted it, and a client sending `"\0anonymous-0"`
/// took the anonymous client's session over and cut its connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nul_in_a_client_id_cannot_take_an_anonymous_session_over() {
    let dir = tempfile::tempdir().unwrap();
    let agent = start(listener_config(dir.path())).await;
    let addr = agent.mqtt_addr().unwrap();
    let (mut anonymous, present) = Client::connect(addr, "", true).await;
    assert!(!present);
    for n in 0..3 {
        let mut intruder = Client {
            stream: TcpStream::connect(addr).await.unwrap(),
            buf: BytesMut::new(),
        };
        intruder
            .send(Packet::Connect(v4::Connect::new(format!(
                "\0anonymous-{n}"
            ))))
            .await;
        assert!(
            intruder.closed_by_agent().await,
            "anonymous-{n}: still open"
        );
        assert!(
            intruder.buf.is_empty(),
            "anonymous-{n}: the agent answered {:?}",
            intruder.buf
        );
    }
    anonymous.send(Packet::PingReq).await;
    assert_eq!(anonymous.recv().await, Packet::PingResp);
    agent.shutdown().await.unwrap();
}

/// An agent with the listener and the manual clock the test moves; its
/// sessions are swept every `sweep`.
async fn start_with_clock(
    dir: &std::path::Path,
    sweep: std::time::Duration,
) -> (
    tributary_edge::Agent,
    std::sync::Arc<broker_core::clock::ManualClock>,
) {
    let mut config = listener_config(dir);
    if let Some(mqtt) = config.mqtt.as_mut() {
        mqtt.session_sweep_interval = sweep;
    }
    let clock = std::sync::Arc::new(broker_core::clock::ManualClock::new(NOW_MS));
    let agent = tributary_edge::Agent::start_with_clock(config, clock.clone())
        .await
        .expect("agent starts");
    (agent, clock)
}

/// MQTT 5.0 §3.1.2.11.2: a session whose expiry interval has passed since
/// its connection ended is discarded. Before, sessions never expired: a
/// client back after the interval (which, told nothing else, may have
/// dropped its own state) got "session present", and its next message
/// reusing a QoS 2 packet id still `received` in the old session was taken
/// for a resend: acknowledged (PUBREC) and never stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_past_its_expiry_interval_is_not_resumed() {
    let dir = tempfile::tempdir().unwrap();
    // The sweeper runs at start only: this is the CONNECT's own check.
    let (agent, clock) = start_with_clock(dir.path(), std::time::Duration::from_secs(3600)).await;
    let addr = agent.mqtt_addr().expect("mqtt listener");
    let (mut c, present) = V5Client::connect(addr, "exp", false, 10).await;
    assert!(!present);
    c.publish_qos2(5, "old").await;
    c.disconnect(None).await;
    // Within the interval: resumed. Its DISCONNECT sets 30 s.
    clock.advance(9_999);
    let (c, present) = V5Client::connect(addr, "exp", false, 10).await;
    assert!(present, "9.999 s after the end of a 10 s session");
    c.disconnect(Some(30)).await;
    clock.advance(29_999);
    let (c, present) = V5Client::connect(addr, "exp", false, 10).await;
    assert!(present, "29.999 s after a DISCONNECT that set 30 s");
    c.disconnect(None).await;
    clock.advance(10_000);
    let (mut c, present) = V5Client::connect(addr, "exp", false, 10).await;
    assert!(!present, "10 s after: expired");
    c.publish_qos2(5, "new").await;
    let values: Vec<Bytes> = read_wal(&agent, "/e1/t", 0)
        .into_iter()
        .map(|(_, r)| r.value)
        .collect();
    assert_eq!(
        values,
        vec!["old", "new"],
        "the new message with id 5 stored"
    );
    agent.shutdown().await.unwrap();
}

/// Expired sessions leave the metadata store and memory without their
/// client coming back; one that never expires (interval 0xFFFFFFFF) and a
/// connected one stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_sessions_are_swept_from_store_and_memory() {
    let dir = tempfile::tempdir().unwrap();
    let (agent, clock) = start_with_clock(dir.path(), std::time::Duration::from_millis(20)).await;
    let addr = agent.mqtt_addr().expect("mqtt listener");
    for (id, expiry) in [("gone", 5), ("forever", u32::MAX)] {
        let (mut c, _) = V5Client::connect(addr, id, false, expiry).await;
        c.publish_qos2(1, id).await;
        c.disconnect(None).await;
    }
    let (connected, _) = V5Client::connect(addr, "connected", false, 5).await;
    clock.advance(3_600_000);
    let metric = |text: &str, name: &str| {
        text.lines()
            .filter(|l| l.starts_with(name))
            .find_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let text = get(agent.local_addr(), "/metrics").await.text;
        let expired = metric(&text, "tributary_edge_mqtt_sessions_expired_total");
        let in_memory = metric(&text, "tributary_edge_mqtt_sessions_in_memory");
        if expired == Some(1) && in_memory == Some(2) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "expired {expired:?}, in memory {in_memory:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let stored: Vec<String> = agent
        .topics()
        .store()
        .list(edge::MQTT_SESSIONS_PREFIX)
        .await
        .unwrap()
        .into_iter()
        .map(|(_, v)| v["client_id"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(stored, ["connected", "forever"]);
    connected.disconnect(None).await;
    agent.shutdown().await.unwrap();
}

/// A session whose connection a crash ended (stored without a deadline,
/// as a connection holds it) expires its interval after the agent's
/// start; one without an interval (3.1.1, or 0xFFFFFFFF) never does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_held_when_the_agent_crashed_expires_after_the_restart() {
    let dir = tempfile::tempdir().unwrap();
    let hour = std::time::Duration::from_secs(3600);
    let (agent, _) = start_with_clock(dir.path(), hour).await;
    for (id, session) in [
        (
            "crashed",
            json!({"client_id": "crashed", "qos2": {"5": {"state": "received"}}, "session_expiry_s": 10}),
        ),
        (
            "forever",
            json!({"client_id": "forever", "qos2": {"5": {"state": "received"}}}),
        ),
    ] {
        agent
            .topics()
            .store()
            .put(&edge::mqtt_session(id), session)
            .await
            .unwrap();
    }
    agent.shutdown().await.unwrap();
    let (agent, clock) = start_with_clock(dir.path(), hour).await;
    let addr = agent.mqtt_addr().expect("mqtt listener");
    clock.advance(10_000);
    let (mut c, present) = V5Client::connect(addr, "crashed", false, 10).await;
    assert!(!present, "10 s after the restart");
    c.publish_qos2(5, "new").await;
    let (_, present) = V5Client::connect(addr, "forever", false, u32::MAX).await;
    assert!(present);
    let values: Vec<Bytes> = read_wal(&agent, "/e1/t", 0)
        .into_iter()
        .map(|(_, r)| r.value)
        .collect();
    assert_eq!(values, vec!["new"]);
    agent.shutdown().await.unwrap();
}
