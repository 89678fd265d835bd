//! `[mqtt]` of the agent's configuration file: the listener address,
//! optional TLS and password file, the limits, the topic mapping rules and
//! `[mqtt.bridge]`. [`MqttFileConfig`] is the file as written,
//! [`MqttConfig`] the validated form; `docs/edge-agent.md` ("MQTT")
//! documents every field.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use tributary_proto::keys::{NamespaceName, TopicName};

use super::mapping::{MappingRule, TopicFilter};
use crate::config::ConfigError;

/// Default listener address: loopback, the MQTT port.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:1883";
/// Default largest packet accepted, bytes (the agent's default
/// `max_record_bytes`, 1 MiB, plus room for the topic and properties).
pub const DEFAULT_MAX_PACKET_BYTES: u32 = 1_048_576 + 65_536;
/// Default receive maximum: QoS 1/2 publishes in flight per client.
pub const DEFAULT_RECEIVE_MAXIMUM: u16 = 64;
/// Default most simultaneous MQTT connections.
pub const DEFAULT_MAX_CONNECTIONS: u32 = 256;

/// The largest MQTT packet, bytes: a Remaining Length of at most
/// 268,435,455 (MQTT 3.1.1 §2.2.3, 5.0 §2.1.4) plus the fixed header's
/// type byte and 4 length bytes.
pub const MAX_MQTT_PACKET_BYTES: u32 = 268_435_455 + 5;

/// `[mqtt]` as written.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MqttFileConfig {
    /// Listener address (default [`DEFAULT_LISTEN`]).
    pub listen: Option<SocketAddr>,
    /// File of `username:password` lines; unset: no authentication.
    pub password_file: Option<PathBuf>,
    /// Largest packet accepted, bytes.
    pub max_packet_bytes: Option<u32>,
    /// QoS 1/2 publishes in flight per client.
    pub receive_maximum: Option<u16>,
    /// Most simultaneous connections.
    pub max_connections: Option<u32>,
    /// Server certificate and key (PEM): the listener speaks MQTT over TLS.
    pub tls: Option<MqttTlsFileConfig>,
    /// Mapping rules, first match wins.
    #[serde(default)]
    pub topics: Vec<MqttTopicFileConfig>,
    /// `[mqtt.bridge]`: subscribe to a local broker instead of (or beside)
    /// listening.
    pub bridge: Option<BridgeFileConfig>,
}

/// `[mqtt.tls]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MqttTlsFileConfig {
    /// Certificate chain (PEM), leaf first.
    pub cert: PathBuf,
    /// Private key (PEM).
    pub key: PathBuf,
}

/// One `[[mqtt.topics]]` rule.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MqttTopicFileConfig {
    /// MQTT topic filter (`+` one level, `#` the rest).
    pub filter: String,
    /// Tributary topic `/{ns}/{topic}` the matching messages go to.
    pub topic: String,
}

/// `[mqtt.bridge]` as written.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BridgeFileConfig {
    /// The local broker, `host:port`.
    pub address: String,
    /// Client id of the agent's persistent session at that broker.
    pub client_id: String,
    /// Topic filters subscribed with QoS 1.
    pub subscriptions: Vec<String>,
    /// Optional username and password for the local broker.
    pub username: Option<String>,
    /// Password (with `username`).
    pub password: Option<String>,
}

/// Validated `[mqtt]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MqttConfig {
    /// Listener address.
    pub listen: SocketAddr,
    /// Accepted `username → password`; `None`: no authentication.
    pub credentials: Option<HashMap<String, String>>,
    /// Largest packet accepted, bytes.
    pub max_packet_bytes: u32,
    /// QoS 1/2 publishes in flight per client.
    pub receive_maximum: u16,
    /// Most simultaneous connections.
    pub max_connections: u32,
    /// Server certificate and key paths.
    pub tls: Option<MqttTlsFileConfig>,
    /// Mapping rules, first match wins.
    pub rules: Vec<MappingRule>,
    /// The bridge, when configured.
    pub bridge: Option<BridgeConfig>,
    /// How often sessions past their expiry interval are removed from
    /// memory and the metadata store ([`DEFAULT_SESSION_SWEEP_INTERVAL`];
    /// not in the file: tests shorten it).
    pub session_sweep_interval: std::time::Duration,
}

/// How often expired sessions are swept by default: 60 s.
pub const DEFAULT_SESSION_SWEEP_INTERVAL: std::time::Duration = std::time::Duration::from_secs(60);

/// Validated `[mqtt.bridge]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BridgeConfig {
    /// Host of the local broker.
    pub host: String,
    /// Port of the local broker.
    pub port: u16,
    /// Client id of the persistent session.
    pub client_id: String,
    /// Filters subscribed with QoS 1.
    pub subscriptions: Vec<String>,
    /// Username and password, if any.
    pub login: Option<(String, String)>,
}

impl MqttConfig {
    /// Validates `file` for the edge `edge_id`: every rule's filter and
    /// topic (in the edge's namespace), the limits, the password file
    /// (read now).
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the field (`mqtt.topics[i].filter`,
    /// `mqtt.password_file`, ...).
    pub fn resolve(
        file: MqttFileConfig,
        edge_id: &NamespaceName,
    ) -> Result<MqttConfig, ConfigError> {
        let invalid = |field: &str, reason: String| ConfigError::Invalid {
            field: field.to_owned(),
            reason,
        };
        let listen = match file.listen {
            Some(addr) => addr,
            None => DEFAULT_LISTEN
                .parse()
                .map_err(|e| invalid("mqtt.listen", format!("{e}")))?,
        };
        let credentials = match &file.password_file {
            Some(path) => Some(
                read_password_file(path).map_err(|reason| invalid("mqtt.password_file", reason))?,
            ),
            None => None,
        };
        // As the local API needs a token off loopback: a listener other
        // hosts reach takes records only from clients with a password.
        if credentials.is_none() && !listen.ip().is_loopback() {
            return Err(invalid(
                "mqtt.listen",
                format!(
                    "{listen} is reachable from other hosts, so it needs passwords: set \
                     mqtt.password_file (lines user:password, chmod 600), or bind 127.0.0.1"
                ),
            ));
        }
        let max_packet_bytes = file.max_packet_bytes.unwrap_or(DEFAULT_MAX_PACKET_BYTES);
        if !(64..=MAX_MQTT_PACKET_BYTES).contains(&max_packet_bytes) {
            return Err(invalid(
                "mqtt.max_packet_bytes",
                format!(
                    "must be from 64 to {MAX_MQTT_PACKET_BYTES} (the largest packet MQTT can frame: 256 MiB of Remaining Length plus its 5-byte fixed header); got {max_packet_bytes}"
                ),
            ));
        }
        let receive_maximum = file.receive_maximum.unwrap_or(DEFAULT_RECEIVE_MAXIMUM);
        if receive_maximum == 0 {
            return Err(invalid("mqtt.receive_maximum", "must be at least 1".into()));
        }
        let max_connections = file.max_connections.unwrap_or(DEFAULT_MAX_CONNECTIONS);
        if max_connections == 0 {
            return Err(invalid("mqtt.max_connections", "must be at least 1".into()));
        }
        let mut rules = Vec::with_capacity(file.topics.len());
        for (i, rule) in file.topics.iter().enumerate() {
            let filter = TopicFilter::parse(&rule.filter)
                .map_err(|reason| invalid(&format!("mqtt.topics[{i}].filter"), reason))?;
            let topic = TopicName::new(&rule.topic)
                .map_err(|e| invalid(&format!("mqtt.topics[{i}].topic"), e.to_string()))?;
            if topic.namespace() != edge_id.as_str() {
                return Err(invalid(
                    &format!("mqtt.topics[{i}].topic"),
                    format!("{topic} is outside this edge's namespace \"{edge_id}\""),
                ));
            }
            rules.push(MappingRule { filter, topic });
        }
        if rules.is_empty() {
            return Err(invalid(
                "mqtt.topics",
                "at least one [[mqtt.topics]] rule (filter → topic) is needed".into(),
            ));
        }
        let bridge = match file.bridge {
            Some(b) => Some(resolve_bridge(b).map_err(|(f, r)| invalid(&f, r))?),
            None => None,
        };
        Ok(MqttConfig {
            listen,
            credentials,
            max_packet_bytes,
            receive_maximum,
            max_connections,
            tls: file.tls,
            rules,
            bridge,
            session_sweep_interval: DEFAULT_SESSION_SWEEP_INTERVAL,
        })
    }
}

fn resolve_bridge(b: BridgeFileConfig) -> Result<BridgeConfig, (String, String)> {
    let (host, port) = b
        .address
        .rsplit_once(':')
        .and_then(|(h, p)| Some((h.to_owned(), p.parse::<u16>().ok()?)))
        .ok_or_else(|| {
            (
                "mqtt.bridge.address".to_owned(),
                format!("expected host:port; got {:?}", b.address),
            )
        })?;
    if b.client_id.is_empty() {
        return Err((
            "mqtt.bridge.client_id".into(),
            "must not be empty (the persistent session is keyed by it)".into(),
        ));
    }
    if b.subscriptions.is_empty() {
        return Err((
            "mqtt.bridge.subscriptions".into(),
            "at least one topic filter is needed".into(),
        ));
    }
    for (i, s) in b.subscriptions.iter().enumerate() {
        TopicFilter::parse(s).map_err(|r| (format!("mqtt.bridge.subscriptions[{i}]"), r))?;
    }
    let login = match (b.username, b.password) {
        (Some(u), Some(p)) => Some((u, p)),
        (None, None) => None,
        _ => {
            return Err((
                "mqtt.bridge.username".into(),
                "username and password go together".into(),
            ));
        }
    };
    Ok(BridgeConfig {
        host,
        port,
        client_id: b.client_id,
        subscriptions: b.subscriptions,
        login,
    })
}

/// Reads `username:password` lines (`#` comments and blank lines skipped).
/// Refused when every user may read it, as every other secret file
/// ([`broker_core::secrets::refuse_world_readable`]).
fn read_password_file(path: &Path) -> Result<HashMap<String, String>, String> {
    broker_core::secrets::refuse_world_readable(path, "MQTT password file")
        .map_err(|e| e.to_string())?;
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut out = HashMap::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim_end_matches('\r');
        if line.trim().is_empty() || line.trim_start().starts_with('#') {
            continue;
        }
        let (user, password) = line.split_once(':').ok_or_else(|| {
            format!(
                "{} line {}: expected username:password",
                path.display(),
                n + 1
            )
        })?;
        if user.is_empty() {
            return Err(format!("{} line {}: empty username", path.display(), n + 1));
        }
        out.insert(user.to_owned(), password.to_owned());
    }
    Ok(out)
}
