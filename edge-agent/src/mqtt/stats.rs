//! Counters of the MQTT listener and bridge, rendered in `/metrics` as
//! `tributary_edge_mqtt_*` (see `docs/edge-agent.md`, "MQTT").

use std::collections::HashSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// The counters; every field is a monotonic count except
/// `connections_open` and `sessions_in_memory`.
#[derive(Debug, Default)]
pub struct MqttStats {
    /// CONNECTs accepted.
    pub connections_accepted: AtomicU64,
    /// Connections refused because `max_connections` were open.
    pub connections_refused_limit: AtomicU64,
    /// Connections open now (gauge).
    pub connections_open: AtomicU64,
    /// Client ids whose session the listener holds in memory now (gauge;
    /// kept by [`super::session::SessionStore`]).
    pub sessions_in_memory: std::sync::Arc<AtomicU64>,
    /// CONNECTs refused for a bad username or password.
    pub auth_failures: AtomicU64,
    /// CONNECTs of an unsupported protocol name or level.
    pub bad_protocol: AtomicU64,
    /// Packets the codec refused as malformed.
    pub malformed_packets: AtomicU64,
    /// Packets over `max_packet_bytes`.
    pub packets_too_large: AtomicU64,
    /// PUBLISH packets received, by QoS.
    pub publishes: [AtomicU64; 3],
    /// Records stored from MQTT.
    pub records_stored: AtomicU64,
    /// Payload bytes stored from MQTT.
    pub bytes_stored: AtomicU64,
    /// PUBLISHes refused: the topic matches no rule.
    pub unmapped_refused: AtomicU64,
    /// PUBLISHes refused: a full disk budget or file system (0x97).
    pub refused_full: AtomicU64,
    /// PUBLISHes refused: their record (payload, topic header, properties)
    /// is over the agent's `max_record_bytes` (0x83).
    pub records_too_large: AtomicU64,
    /// PUBLISHes refused: a user property name begins with `mqtt.` (0x83).
    pub reserved_property_refused: AtomicU64,
    /// QoS 1 resends (DUP) of a packet id already stored and acknowledged
    /// on this session since the agent started: stored again.
    pub qos1_redeliveries: AtomicU64,
    /// QoS 2 resends of a packet id already stored: not stored again.
    pub qos2_duplicates: AtomicU64,
    /// Sessions removed because their expiry interval passed.
    pub sessions_expired: AtomicU64,
    /// SUBSCRIBEs refused.
    pub subscribe_refused: AtomicU64,
    /// Connections closed because the client did not read.
    pub slow_clients: AtomicU64,
    /// Messages the bridge stored and acknowledged to the local broker.
    pub bridge_records: AtomicU64,
    /// Bridge connection failures.
    pub bridge_errors: AtomicU64,
    /// Unmapped MQTT topics already logged (bounded).
    pub unmapped_logged: Mutex<HashSet<String>>,
    anonymous: AtomicU64,
}

impl MqttStats {
    /// Adds one to `counter`.
    pub fn count(&self, counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Adds `n` to `counter`.
    pub fn add(&self, counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// A fresh number for a client that sent an empty client id.
    pub fn next_anonymous(&self) -> u64 {
        self.anonymous.fetch_add(1, Ordering::Relaxed)
    }

    /// Adds the `tributary_edge_mqtt_*` families to `out`.
    pub fn add_to(&self, out: &mut crate::metrics::Exposition) {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let counters: [(&str, &str, u64); 19] = [
            (
                "connections",
                "MQTT CONNECT packets the listener accepted.",
                get(&self.connections_accepted),
            ),
            (
                "connections_refused_limit",
                "MQTT connections refused because max_connections were open.",
                get(&self.connections_refused_limit),
            ),
            (
                "auth_failures",
                "MQTT CONNECT packets refused for a bad username or password.",
                get(&self.auth_failures),
            ),
            (
                "bad_protocol",
                "MQTT CONNECT packets refused for an unsupported protocol level.",
                get(&self.bad_protocol),
            ),
            (
                "malformed_packets",
                "MQTT packets refused as malformed.",
                get(&self.malformed_packets),
            ),
            (
                "packets_too_large",
                "MQTT packets refused for exceeding max_packet_bytes.",
                get(&self.packets_too_large),
            ),
            (
                "records",
                "Records stored from MQTT PUBLISH packets.",
                get(&self.records_stored),
            ),
            (
                "bytes",
                "Payload bytes stored from MQTT PUBLISH packets.",
                get(&self.bytes_stored),
            ),
            (
                "unmapped_topic",
                "PUBLISH packets refused because their topic matches no rule.",
                get(&self.unmapped_refused),
            ),
            (
                "refused_full",
                "PUBLISH packets refused because a disk budget or the disk was full.",
                get(&self.refused_full),
            ),
            (
                "records_too_large",
                "PUBLISH packets refused because their record is over max_record_bytes.",
                get(&self.records_too_large),
            ),
            (
                "reserved_property_refused",
                "PUBLISH packets refused because a user property name begins with mqtt. (the agent's own headers).",
                get(&self.reserved_property_refused),
            ),
            (
                "qos1_redeliveries",
                "QoS 1 resends of an acknowledged packet id, which are stored again.",
                get(&self.qos1_redeliveries),
            ),
            (
                "qos2_duplicates",
                "QoS 2 resends the listener recognised and did not store again.",
                get(&self.qos2_duplicates),
            ),
            (
                "sessions_expired",
                "Sessions removed from memory and the metadata store because their expiry interval passed since their connection ended.",
                get(&self.sessions_expired),
            ),
            (
                "subscribe_refused",
                "SUBSCRIBE packets the listener refused.",
                get(&self.subscribe_refused),
            ),
            (
                "slow_clients",
                "MQTT connections closed because the client did not read.",
                get(&self.slow_clients),
            ),
            (
                "bridge_records",
                "Bridged messages stored and acknowledged to the local broker.",
                get(&self.bridge_records),
            ),
            (
                "bridge_errors",
                "Connection errors of the bridge to the local broker.",
                get(&self.bridge_errors),
            ),
        ];
        for (name, help, value) in counters {
            let labels = out.labels(&[]);
            out.counter(
                &format!("tributary_edge_mqtt_{name}"),
                help,
                [(labels, value)],
            );
        }
        let publishes: Vec<_> = self
            .publishes
            .iter()
            .enumerate()
            .map(|(qos, c)| (out.labels(&[("qos", &qos.to_string())]), get(c)))
            .collect();
        out.counter(
            "tributary_edge_mqtt_publishes",
            "MQTT PUBLISH packets received, by QoS.",
            publishes,
        );
        out.gauge(
            "tributary_edge_mqtt_connections_open",
            "MQTT connections open now.",
            [(out.labels(&[]), get(&self.connections_open))],
        );
        out.gauge(
            "tributary_edge_mqtt_sessions_in_memory",
            "MQTT client ids whose session the listener holds in memory now: connected clients and persistent sessions.",
            [(out.labels(&[]), get(&self.sessions_in_memory))],
        );
    }
}

/// Most distinct unmapped topics logged; later ones are only counted.
pub const UNMAPPED_LOG_LIMIT: usize = 1024;

/// Logs `topic` as unmapped the first time it is seen.
pub fn log_unmapped_once(logged: &Mutex<HashSet<String>>, topic: &str) {
    let mut set = logged.lock().unwrap_or_else(|p| p.into_inner());
    if set.len() < UNMAPPED_LOG_LIMIT && set.insert(topic.to_owned()) {
        tracing::warn!(mqtt_topic = %topic, "MQTT PUBLISH refused: the topic matches no [[mqtt.topics]] rule (logged once per topic; counted in tributary_edge_mqtt_unmapped_topic_total)");
    }
}
