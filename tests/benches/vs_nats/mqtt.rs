//! The MQTT cases of the peer benchmark (issue 20): the same MQTT 3.1.1
//! client and load (rumqttc, QoS 1, one PUBLISH outstanding per client:
//! the next leaves when the previous one's PUBACK arrived) against
//! - the edge agent's `[mqtt]` listener (a PUBACK leaves once the record is
//!   durable per the topic's sync mode: `fsync_batch` or `os_cache_flush`),
//! - nats-server's own MQTT listener (`mqtt { }`; JetStream-backed, with a
//!   file stream capturing the subject the topic maps to, at the same
//!   `sync_interval` as the JetStream cases).
//!
//! Both sides are checked afterwards: the agent's high-water mark grew by
//! exactly the acknowledged count, the NATS stream holds at least it.
//!
//! nats-server answers a QoS 1 PUBLISH once it has taken the message in;
//! whether that PUBACK waits for the capturing stream's write is nats-server's
//! business (it implements MQTT sessions in JetStream, but a message published
//! by an MQTT client reaches a stream as a core NATS publish). The check after
//! the run waits (bounded) for the stream to hold every acknowledged message.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_nats::jetstream;
use rumqttc::{AsyncClient, Event, EventLoop, MqttOptions, Packet, QoS};
use tributary_test_support::ports::free_tcp;
use tributary_tests::mqtt::MqttEdge;

use super::common::scratch_dir;
use super::{
    Durability, MAX_RECORDS_PER_PRODUCER, Measured, STEP_MAX, Settings, connect, file_stream,
    random_value, runtime, standalone_server, stream_messages,
};

/// The MQTT topic both sides receive (NATS subject `bench.mqtt`).
const TOPIC: &str = "bench/mqtt";

/// One MQTT 3.1.1 connection with its event loop, connected (CONNACK seen).
async fn mqtt_client(addr: SocketAddr, id: &str, payload_bytes: usize) -> (AsyncClient, EventLoop) {
    let mut options = MqttOptions::new(id, addr.ip().to_string(), addr.port());
    options
        .set_keep_alive(Duration::from_secs(30))
        .set_clean_session(true)
        .set_max_packet_size(payload_bytes + 1024, payload_bytes + 1024);
    let (client, mut events) = AsyncClient::new(options, 4);
    let deadline = Instant::now() + STEP_MAX;
    loop {
        match tokio::time::timeout(Duration::from_secs(5), events.poll()).await {
            Ok(Ok(Event::Incoming(Packet::ConnAck(_)))) => return (client, events),
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                assert!(Instant::now() < deadline, "MQTT connect {addr}: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(_) => assert!(Instant::now() < deadline, "MQTT connect {addr}: timed out"),
        }
    }
}

/// Publishes `payload` with QoS 1 and waits for its PUBACK.
async fn publish_acked(client: &AsyncClient, events: &mut EventLoop, payload: &[u8]) {
    client
        .publish(TOPIC, QoS::AtLeastOnce, false, payload.to_vec())
        .await
        .expect("queue PUBLISH");
    loop {
        match tokio::time::timeout(super::ACK_TIMEOUT, events.poll()).await {
            Ok(Ok(Event::Incoming(Packet::PubAck(_)))) => return,
            Ok(Ok(_)) => {}
            Ok(Err(e)) => panic!("MQTT connection failed while waiting for a PUBACK: {e}"),
            Err(_) => panic!("no PUBACK within {:?}", super::ACK_TIMEOUT),
        }
    }
}

/// `producers` clients publishing to `addr` for `window`; returns the
/// acknowledged count (the warm-up publish not included) and the seconds.
async fn drive(addr: SocketAddr, s: &Settings, prefix: &str) -> (u64, f64) {
    let payload = Arc::new(random_value(s.record_bytes, 11));
    // Warm-up: one acknowledged publish, on its own connection.
    let (warm, mut warm_events) =
        mqtt_client(addr, &format!("{prefix}-warm"), s.record_bytes).await;
    publish_acked(&warm, &mut warm_events, &payload).await;
    let mut clients = Vec::with_capacity(s.producers);
    for i in 0..s.producers {
        clients.push(mqtt_client(addr, &format!("{prefix}-{i}"), s.record_bytes).await);
    }
    let acked = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let deadline = start + Duration::from_secs(s.publish_seconds);
    let mut tasks = Vec::new();
    for (client, mut events) in clients {
        let (acked, payload) = (acked.clone(), payload.clone());
        tasks.push(tokio::spawn(async move {
            let mut mine = 0u64;
            while Instant::now() < deadline && mine < MAX_RECORDS_PER_PRODUCER {
                publish_acked(&client, &mut events, &payload).await;
                mine += 1;
                acked.fetch_add(1, Ordering::Relaxed);
            }
            let _ = client.disconnect().await;
            let _ = tokio::time::timeout(Duration::from_secs(1), events.poll()).await;
        }));
    }
    for task in tasks {
        task.await.expect("MQTT producer task");
    }
    (acked.load(Ordering::Relaxed), start.elapsed().as_secs_f64())
}

/// MQTT QoS 1 into the edge agent's listener (no broker: the PUBACK
/// promises local durability).
pub fn tributary_mqtt(s: &Settings, durability: Durability) -> Measured {
    let dir = scratch_dir("vsnats-mqtt-edge");
    let rules = format!(
        "max_connections = {}\n\n[[mqtt.topics]]\nfilter = \"{TOPIC}\"\ntopic = \"/plant1/readings\"\n",
        s.producers + 8
    );
    let mut edge = MqttEdge::new(dir.path(), durability.intent(), &rules);
    edge.start();
    let state = tributary_tests::cluster::Pair::api_client(edge.api);
    let hwm = || {
        state
            .edge_offsets()
            .map(|(hwm, _)| hwm)
            .expect("edge topic state")
    };
    let (records, seconds) = runtime().block_on(drive(edge.mqtt, s, "trib"));
    assert_eq!(
        hwm(),
        records + 1,
        "the edge stored what it acknowledged (and the warm-up)"
    );
    assert_eq!(edge.edge.terminate(), Some(0));
    Measured::whole(records, seconds)
}

/// The same client and load against nats-server's MQTT listener.
pub fn nats_mqtt(s: &Settings, durability: Durability) -> Measured {
    let dir = scratch_dir("vsnats-mqtt-js");
    let mut server = standalone_server(s, dir.path(), "mqtt", durability);
    let mqtt_addr = free_tcp();
    let mut conf = std::fs::read_to_string(&server.conf).expect("nats config");
    conf.push_str(&format!("mqtt {{\n  listen: \"{mqtt_addr}\"\n}}\n"));
    std::fs::write(&server.conf, conf).expect("nats config");
    server.start();
    let url = server.url();
    let result = runtime().block_on(async {
        let admin = jetstream::new(connect(&url).await);
        file_stream(&admin, "MQTT_IN", "bench.mqtt").await;
        let (records, seconds) = drive(mqtt_addr, s, "nats").await;
        // Every acknowledged message (and the warm-up) in the stream.
        let deadline = Instant::now() + Duration::from_secs(30);
        let stored = loop {
            let stored = stream_messages(&admin, "MQTT_IN").await.unwrap_or(0);
            if stored > records || Instant::now() > deadline {
                break stored;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert!(
            stored > records,
            "the stream holds {stored} of the {records} acknowledged messages (+1 warm-up)"
        );
        Measured::whole(records, seconds)
    });
    server.terminate();
    result
}
