//! Bridge mode: the agent is a client of a local broker (Mosquitto on the
//! gateway) with a persistent session (`clean_session = false`), subscribes
//! to `[mqtt.bridge] subscriptions` with QoS 1 and acknowledges each
//! message (manual acks) only after [`TopicManager::publish`] returned,
//! i.e. once its record is durable. A message the agent did not
//! acknowledge (it crashed, the disk budget is full) stays queued in the
//! local broker's session and is delivered again: at least once, nothing
//! lost; a crash between the append and the PUBACK stores it twice. A
//! message that can never be stored (its record over `max_record_bytes`,
//! or its topic matching no rule) is acknowledged, logged and counted, so
//! it cannot hold up the queue behind it.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};
use tokio::sync::watch;
use tracing::{info, warn};
use tributary_proto::Record;

use super::config::BridgeConfig;
use super::mapping::{self, HEADER_MQTT_TOPIC, MappingRule};
use super::stats::MqttStats;
use crate::manager::{TopicError, TopicManager};
use crate::topic::PublishError;

/// Pause before retrying a publish the agent refused (a full budget).
const RETRY: Duration = Duration::from_millis(500);
/// Largest MQTT packet the bridge reads, bytes: the protocol's largest
/// Remaining Length (MQTT 3.1.1 §2.2.3). A smaller limit would make a
/// larger message queued at the local broker end every connection while
/// being read, and be delivered again, for ever: the bridge reads it and
/// refuses it as too large instead (bound the local broker's
/// `message_size_limit` where memory is tight).
const MAX_INCOMING_PACKET: usize = 268_435_455;

/// Longest wait, when the bridge stops, for the acknowledgements still
/// queued to reach the local broker (they go out before the DISCONNECT).
const ACK_FLUSH: Duration = Duration::from_secs(2);

/// Runs the bridge until `stop` turns true.
///
/// The connection's event loop runs on its own task, always polled, and
/// hands each PUBLISH to this one, which stores it and queues its PUBACK
/// (`AsyncClient::ack`, awaited: it waits for room in the client's queue,
/// which the event loop keeps draining). A single task that stored and
/// then tried to queue the PUBACK without waiting dropped most PUBACKs of
/// a backlog burst (the queue was full), and the local broker delivered
/// those messages again at every reconnect. On stop the queued PUBACKs go
/// out before the DISCONNECT (bounded by [`ACK_FLUSH`]).
pub async fn run(
    config: BridgeConfig,
    rules: Vec<MappingRule>,
    manager: Arc<TopicManager>,
    stats: Arc<MqttStats>,
    mut stop: watch::Receiver<bool>,
) {
    let mut options = MqttOptions::new(config.client_id.clone(), config.host.clone(), config.port);
    options.set_clean_session(false);
    options.set_manual_acks(true);
    options.set_keep_alive(Duration::from_secs(30));
    options.set_max_packet_size(MAX_INCOMING_PACKET, 65_536);
    if let Some((user, password)) = &config.login {
        options.set_credentials(user.clone(), password.clone());
    }
    let (client, events) = AsyncClient::new(options, 256);
    // Unbounded: what waits here is what the local broker sent without a
    // PUBACK yet (its in-flight window per client), already in memory.
    let (publishes, mut incoming) = tokio::sync::mpsc::unbounded_channel();
    let (stopped_tx, stopped_rx) = watch::channel(false);
    let connection = tokio::spawn(drive(
        events,
        client.clone(),
        config,
        publishes,
        stats.clone(),
        stopped_rx,
    ));
    loop {
        let p: rumqttc::Publish = tokio::select! {
            p = incoming.recv() => match p {
                Some(p) => p,
                None => break,
            },
            _ = stop.wait_for(|&s| s) => break,
        };
        let stored = tokio::select! {
            s = store(&p, &rules, &manager, &stats) => s,
            _ = stop.wait_for(|&s| s) => break,
        };
        if stored && let Err(e) = client.ack(&p).await {
            warn!(error = %e, "mqtt bridge: acknowledging failed (the broker resends)");
        }
    }
    let _ = stopped_tx.send(true);
    let abort = connection.abort_handle();
    let flushed = async {
        let _ = client.disconnect().await;
        let _ = connection.await;
    };
    if tokio::time::timeout(ACK_FLUSH, flushed).await.is_err() {
        abort.abort();
    }
}

/// Polls the connection's event loop until the bridge stops: subscribes
/// on every CONNACK, forwards every PUBLISH to `publishes`, retries a
/// failed connection every second. Once `stopped`, polls on until the
/// DISCONNECT queued after the last PUBACKs is sent (or the connection
/// fails).
async fn drive(
    mut events: rumqttc::EventLoop,
    client: AsyncClient,
    config: BridgeConfig,
    publishes: tokio::sync::mpsc::UnboundedSender<rumqttc::Publish>,
    stats: Arc<MqttStats>,
    stopped: watch::Receiver<bool>,
) {
    let mut failing = false;
    loop {
        match events.poll().await {
            Ok(Event::Incoming(Packet::ConnAck(ack))) => {
                failing = false;
                info!(broker = %format!("{}:{}", config.host, config.port), session_present = ack.session_present, "mqtt bridge connected");
                for filter in &config.subscriptions {
                    if let Err(e) = client.try_subscribe(filter.clone(), QoS::AtLeastOnce) {
                        warn!(error = %e, filter, "mqtt bridge: subscribe failed");
                    }
                }
            }
            Ok(Event::Incoming(Packet::Publish(p))) => {
                // Not stored once the bridge stops: not acknowledged, the
                // local broker delivers it again.
                let _ = publishes.send(p);
            }
            Ok(Event::Outgoing(rumqttc::Outgoing::Disconnect)) if *stopped.borrow() => return,
            Ok(_) => {}
            Err(e) => {
                if *stopped.borrow() {
                    return;
                }
                stats.count(&stats.bridge_errors);
                if !failing {
                    warn!(error = %e, "mqtt bridge: connection to the local broker failed; retrying every second");
                    failing = true;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

/// Stores one bridged message, retrying while the agent refuses it;
/// `true` once durable (or unmapped: acknowledged and counted, as nothing
/// could ever store it).
async fn store(
    p: &rumqttc::Publish,
    rules: &[MappingRule],
    manager: &TopicManager,
    stats: &MqttStats,
) -> bool {
    let Some(topic) = mapping::map_topic(rules, &p.topic).cloned() else {
        stats.count(&stats.unmapped_refused);
        super::stats::log_unmapped_once(&stats.unmapped_logged, &p.topic);
        return true;
    };
    let record = Record {
        timestamp_ms: manager.now_ms(),
        key: None,
        headers: vec![(
            HEADER_MQTT_TOPIC.to_owned(),
            Bytes::copy_from_slice(p.topic.as_bytes()),
        )],
        value: p.payload.clone(),
    };
    let mut logged = false;
    loop {
        match manager.publish(&topic, vec![record.clone()]).await {
            Ok(_) => {
                stats.count(&stats.bridge_records);
                stats.count(&stats.records_stored);
                stats.add(&stats.bytes_stored, p.payload.len() as u64);
                return true;
            }
            Err(TopicError::Publish(PublishError::TooLarge { .. })) => {
                stats.count(&stats.records_too_large);
                warn!(
                    mqtt_topic = %p.topic,
                    payload_bytes = p.payload.len(),
                    max_record_bytes = manager.config().limits.max_record_bytes,
                    "mqtt bridge: a message too large to store is acknowledged to the local broker and dropped (counted in tributary_edge_mqtt_records_too_large_total)"
                );
                return true;
            }
            Err(e) => {
                if !logged {
                    warn!(error = %e, topic = %topic, "mqtt bridge: the agent refused a message; not acknowledged, retrying");
                    logged = true;
                }
                if manager.is_closing() {
                    return false;
                }
                tokio::time::sleep(RETRY).await;
            }
        }
    }
}
