//! The agent's configuration: a TOML file ([`FileConfig`]), overridden by
//! command-line flags and environment variables ([`Overrides`]), validated
//! into an [`AgentConfig`]. Precedence: flag, then environment, then file,
//! then default. Every error names the field at fault
//! ([`ConfigError::field`]). The documented example lives in
//! `docs/edge-agent.md`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use broker_core::catalog::TopicSpec;
use broker_core::tls::TlsPaths;
use serde::Deserialize;
use tributary_proto::Limits;
use tributary_proto::intent::{Persistence, StreamIntent};
use tributary_proto::keys::{NamespaceName, TopicName};
use tributary_proto::limits::{BATCH_HEADER_BYTES, RECORD_BYTES_MIN};

use crate::budget::FullPolicy;

mod identity;
pub mod local_api;
mod replication;

pub use identity::{certificate_edge_id, enroll_paths};
use identity::{resolve_edge_id, resolve_tls};

pub use replication::{
    DEFAULT_IDLE_TIMEOUT_MS, DEFAULT_KEEP_ALIVE_MS, DEFAULT_UNHEALTHY_AFTER_MS,
    ReplicationFileConfig, ReplicationSettings, RetainUntil,
};

/// The QUIC congestion controller of the replication connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CongestionController {
    /// Cubic (RFC 9438), quinn's default: backs off on every loss. Right
    /// for shared, mostly loss-free links. The default.
    #[default]
    Cubic,
    /// BBR (quinn's implementation): paces at the measured bottleneck rate
    /// and does not treat random loss as congestion. Use it on lossy radio
    /// or satellite links, where Cubic leaves much of the link idle
    /// (`docs/benchmarks.md`, "Thin link").
    Bbr,
    /// A window of twice the bandwidth-delay product of
    /// `bandwidth_cap_bytes_per_s` (required) and the minimum RTT, not
    /// shrunk by loss ([`crate::declared_rate`]). For a dedicated lossy
    /// link whose rate the operator knows: it uses the link like BBR
    /// without overfilling its queue.
    DeclaredRate,
}

/// Default local API address: loopback only.
pub const DEFAULT_LOCAL_API: &str = "127.0.0.1:7500";
/// Default capacity of a realtime topic's ring, records.
pub const DEFAULT_RING_RECORDS: u32 = 10_000;
/// Largest ring capacity, records (bounds the memory of one topic).
pub const MAX_RING_RECORDS: u32 = 10_000_000;
/// Default bound on the number of topics (each durable topic has a WAL
/// writer, its buffers and open files).
pub const DEFAULT_MAX_TOPICS: u32 = 256;
/// Largest `max_topics`.
pub const MAX_TOPICS_CEILING: u32 = 65_536;
/// Default interval between checkpoint writes, ms.
pub const DEFAULT_CHECKPOINT_INTERVAL_MS: u64 = 1000;
/// Largest checkpoint interval, ms.
pub const MAX_CHECKPOINT_INTERVAL_MS: u64 = 60_000;
/// A disk budget must hold at least this many batches of `max_batch_bytes`
/// (one being written next to one sealed segment that `drop_oldest` can
/// delete).
pub const MIN_BUDGET_BATCHES: u64 = 2;

/// Errors loading or validating the configuration.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file is not valid TOML for this schema (unknown field, wrong
    /// type, bad value).
    #[error("{}: line {line}: {}{message}", path.display(), if field.is_empty() { String::new() } else { format!("{field}: ") })]
    Parse {
        /// The file.
        path: PathBuf,
        /// Line of the error, from 1 (0 when unknown).
        line: usize,
        /// The field path, e.g. `topics[1].full_policy`; for an error of
        /// the TOML text itself (a syntax error, a duplicate key), the key
        /// it points at, or empty when it points at no key.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// A value is out of range or contradicts another.
    #[error("{field}: {reason}")]
    Invalid {
        /// The field path, e.g. `topics[0].name`.
        field: String,
        /// What is wrong.
        reason: String,
    },
}

impl ConfigError {
    /// The field at fault, if the error is about one.
    pub fn field(&self) -> Option<&str> {
        match self {
            ConfigError::Read { .. } => None,
            ConfigError::Parse { field, .. } if field.is_empty() => None,
            ConfigError::Parse { field, .. } | ConfigError::Invalid { field, .. } => Some(field),
        }
    }

    fn invalid(field: impl Into<String>, reason: impl Into<String>) -> ConfigError {
        ConfigError::Invalid {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

/// The configuration file as written. Every field is optional in the file;
/// [`AgentConfig::resolve`] says which must be set somewhere.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// Directory of the WALs and the local metadata store.
    pub data_dir: Option<PathBuf>,
    /// This edge's id, which is also the only namespace it writes to.
    pub edge_id: Option<String>,
    /// Broker addresses `host:port`, tried in order by the replicator.
    #[serde(default)]
    pub brokers: Vec<String>,
    /// Client certificate, key and CA for mutual TLS with the brokers.
    pub tls: Option<TlsFileConfig>,
    /// Address of the local HTTP API.
    pub local_api: Option<SocketAddr>,
    /// File holding the local API's bearer token ([`local_api`]).
    pub local_api_token_file: Option<PathBuf>,
    /// `[local_api_tls]`: HTTPS on the local API.
    pub local_api_tls: Option<local_api::LocalApiTls>,
    /// Agent-wide disk budget over all WALs, bytes.
    pub disk_budget_bytes: Option<u64>,
    /// Default ring capacity of realtime topics, records.
    pub realtime_ring_records: Option<u32>,
    /// Replication bandwidth cap, bytes per second.
    pub bandwidth_cap_bytes_per_s: Option<u64>,
    /// Congestion controller of the replication connection: `cubic`
    /// (default) or `bbr`.
    pub congestion_controller: Option<CongestionController>,
    /// Largest encoded record, bytes.
    pub max_record_bytes: Option<u32>,
    /// Largest encoded batch, bytes.
    pub max_batch_bytes: Option<u32>,
    /// Most topics (configured plus implicit).
    pub max_topics: Option<u32>,
    /// Interval between checkpoint writes, ms.
    pub checkpoint_interval_ms: Option<u64>,
    /// `[replication]`: keep-alive, idle timeout, `retain_until`.
    pub replication: Option<ReplicationFileConfig>,
    /// Explicitly configured topics.
    #[serde(default)]
    pub topics: Vec<TopicFileConfig>,
    /// `[mqtt]`: the MQTT listener and bridge (off when absent).
    pub mqtt: Option<crate::mqtt::MqttFileConfig>,
}

/// `[tls]` of the file.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsFileConfig {
    /// Client certificate chain (PEM), leaf first.
    pub cert: PathBuf,
    /// Private key (PEM).
    pub key: PathBuf,
    /// CA certificate(s) the brokers' certificates chain to (PEM).
    pub ca: PathBuf,
    /// How often the running agent checks `cert` and `key` for a new pair,
    /// ms ([`crate::cert_reload`]); 0: only on SIGHUP. Default 1000.
    #[serde(default)]
    pub check_interval_ms: Option<u64>,
}

/// One `[[topics]]` entry of the file.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopicFileConfig {
    /// `/{ns}/{topic}`; `ns` must be the edge id.
    pub name: String,
    /// Canonical intent or alias.
    pub intent: String,
    /// The topic's own disk budget, bytes (durable topics only).
    pub disk_budget_bytes: Option<u64>,
    /// What happens when a budget is full (durable topics only).
    pub full_policy: Option<FullPolicy>,
    /// Ring capacity, records (realtime topics only).
    pub realtime_ring_records: Option<u32>,
    /// This topic's `retain_until` (durable topics only); default
    /// `replication.retain_until`.
    pub retain_until: Option<RetainUntil>,
}

/// Values from flags and the environment; `None` leaves the file's value.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Overrides {
    /// `--data-dir`, `TRIB_EDGE_DATA_DIR`.
    pub data_dir: Option<PathBuf>,
    /// `--edge-id`, `TRIB_EDGE_ID`.
    pub edge_id: Option<String>,
    /// `--broker` (repeatable), `TRIB_EDGE_BROKERS` (comma-separated);
    /// replaces the file's list when not empty (an empty variable, such as
    /// `TRIB_EDGE_BROKERS=` in an environment file, is no override).
    pub brokers: Vec<String>,
    /// `--local-api`, `TRIB_EDGE_LOCAL_API`.
    pub local_api: Option<SocketAddr>,
    /// `--tls-cert`, `TRIB_EDGE_TLS_CERT`.
    pub tls_cert: Option<PathBuf>,
    /// `--tls-key`, `TRIB_EDGE_TLS_KEY`.
    pub tls_key: Option<PathBuf>,
    /// `--tls-ca`, `TRIB_EDGE_TLS_CA`.
    pub tls_ca: Option<PathBuf>,
    /// `--disk-budget-bytes`, `TRIB_EDGE_DISK_BUDGET_BYTES`.
    pub disk_budget_bytes: Option<u64>,
    /// `--bandwidth-cap-bytes-per-s`, `TRIB_EDGE_BANDWIDTH_CAP_BYTES_PER_S`.
    pub bandwidth_cap_bytes_per_s: Option<u64>,
}

/// A configured topic, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicConfig {
    /// The topic, in the agent's namespace.
    pub name: TopicName,
    /// Its canonical intent.
    pub intent: StreamIntent,
    /// Its own disk budget, bytes; `None`: only the agent budget applies.
    pub disk_budget_bytes: Option<u64>,
    /// What happens when a budget is full.
    pub full_policy: FullPolicy,
    /// Ring capacity for a realtime topic, records; `None`: the agent
    /// default.
    pub realtime_ring_records: Option<u32>,
    /// This topic's `retain_until`; `None`: the agent's
    /// [`ReplicationSettings::retain_until`].
    pub retain_until: Option<RetainUntil>,
}

/// The validated configuration of an agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentConfig {
    /// Directory of the WALs (`topics/{ns}/{topic}/`) and the local
    /// metadata store (`metadata.redb`).
    pub data_dir: PathBuf,
    /// The edge id: the namespace this agent owns.
    pub edge_id: NamespaceName,
    /// Broker addresses, `host:port`.
    pub brokers: Vec<String>,
    /// Mutual-TLS material for the replicator.
    pub tls: Option<TlsPaths>,
    /// How often the certificate and key files are checked for a new pair
    /// (`[tls] check_interval_ms`); `None`: only on SIGHUP.
    pub tls_check_interval: Option<Duration>,
    /// Local HTTP API address.
    pub local_api: SocketAddr,
    /// The local API's bearer token and TLS ([`local_api`]).
    pub local_api_security: local_api::LocalApiSecurity,
    /// Agent-wide disk budget, bytes; `None`: unlimited.
    pub disk_budget_bytes: Option<u64>,
    /// Default ring capacity of realtime topics, records.
    pub realtime_ring_records: u32,
    /// Replication bandwidth cap, bytes per second; `None`: uncapped.
    pub bandwidth_cap_bytes_per_s: Option<u64>,
    /// Congestion controller of the replication connection.
    pub congestion_controller: CongestionController,
    /// Record and batch size limits of every topic.
    pub limits: Limits,
    /// Most topics.
    pub max_topics: u32,
    /// Interval between checkpoint writes.
    pub checkpoint_interval: Duration,
    /// `[replication]`: keep-alive, idle timeout, default `retain_until`.
    pub replication: ReplicationSettings,
    /// Configured topics.
    pub topics: Vec<TopicConfig>,
    /// `[mqtt]`, validated; `None`: no MQTT listener.
    pub mqtt: Option<crate::mqtt::MqttConfig>,
}

impl AgentConfig {
    /// A configuration with defaults for `data_dir` and `edge_id` (tests,
    /// embedding): local API on [`DEFAULT_LOCAL_API`], no budget, no
    /// topics.
    pub fn new(data_dir: impl Into<PathBuf>, edge_id: NamespaceName) -> AgentConfig {
        AgentConfig {
            data_dir: data_dir.into(),
            edge_id,
            brokers: Vec::new(),
            tls: None,
            tls_check_interval: Some(Duration::from_millis(
                crate::cert_reload::DEFAULT_CHECK_INTERVAL_MS,
            )),
            local_api: default_local_api(),
            local_api_security: local_api::LocalApiSecurity::default(),
            disk_budget_bytes: None,
            realtime_ring_records: DEFAULT_RING_RECORDS,
            bandwidth_cap_bytes_per_s: None,
            congestion_controller: CongestionController::default(),
            limits: Limits::default(),
            max_topics: DEFAULT_MAX_TOPICS,
            checkpoint_interval: Duration::from_millis(DEFAULT_CHECKPOINT_INTERVAL_MS),
            replication: ReplicationSettings::default(),
            topics: Vec::new(),
            mqtt: None,
        }
    }

    /// Reads `path` (when given), applies `overrides` and validates.
    ///
    /// # Errors
    /// [`ConfigError::Read`], [`ConfigError::Parse`] naming the line and
    /// field, [`ConfigError::Invalid`] naming the field.
    pub fn load(path: Option<&Path>, overrides: &Overrides) -> Result<AgentConfig, ConfigError> {
        let file = match path {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                    path: path.to_path_buf(),
                    source,
                })?;
                parse_file(path, &text)?
            }
            None => FileConfig::default(),
        };
        AgentConfig::resolve(file, overrides)
    }

    /// Merges `file` and `overrides` and validates every field.
    ///
    /// Required somewhere: `data_dir`; `edge_id` unless `tls.cert` is set
    /// (then the certificate's identity is the edge id; an explicit
    /// `edge_id` must equal it).
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the field.
    pub fn resolve(file: FileConfig, overrides: &Overrides) -> Result<AgentConfig, ConfigError> {
        let data_dir = overrides
            .data_dir
            .clone()
            .or(file.data_dir)
            .ok_or_else(|| {
                ConfigError::invalid(
                    "data_dir",
                    "not set (config file, --data-dir or TRIB_EDGE_DATA_DIR)",
                )
            })?;
        if data_dir.as_os_str().is_empty() {
            return Err(ConfigError::invalid("data_dir", "must not be empty"));
        }
        let check_ms = file
            .tls
            .as_ref()
            .and_then(|t| t.check_interval_ms)
            .unwrap_or(crate::cert_reload::DEFAULT_CHECK_INTERVAL_MS);
        let tls_check_interval = (check_ms > 0).then(|| Duration::from_millis(check_ms));
        let tls = resolve_tls(file.tls, overrides)?;
        let edge_id = resolve_edge_id(overrides.edge_id.clone().or(file.edge_id), tls.as_ref())?;
        let brokers = if overrides.brokers.iter().all(String::is_empty) {
            file.brokers
        } else {
            overrides.brokers.clone()
        };
        for (i, broker) in brokers.iter().enumerate() {
            check_broker_address(broker)
                .map_err(|r| ConfigError::invalid(format!("brokers[{i}]"), r))?;
        }
        if !brokers.is_empty() && tls.is_none() {
            // Replication is mutual TLS only: without it the agent would
            // run, take records and never send one (a config trial's
            // finding), with nothing but a log line to say so.
            return Err(ConfigError::invalid(
                "brokers",
                "replication needs mutual TLS: add a [tls] table with cert, key and ca \
                 (edge-agent enroll writes them), or leave brokers out to keep records on \
                 this device only",
            ));
        }
        let limits = resolve_limits(file.max_record_bytes, file.max_batch_bytes)?;
        let replication = ReplicationSettings::resolve(file.replication)?;
        let disk_budget_bytes = overrides.disk_budget_bytes.or(file.disk_budget_bytes);
        if let Some(budget) = disk_budget_bytes {
            check_budget(budget, &limits)
                .map_err(|r| ConfigError::invalid("disk_budget_bytes", r))?;
        }
        let realtime_ring_records = file.realtime_ring_records.unwrap_or(DEFAULT_RING_RECORDS);
        check_ring(realtime_ring_records)
            .map_err(|r| ConfigError::invalid("realtime_ring_records", r))?;
        let bandwidth_cap_bytes_per_s = overrides
            .bandwidth_cap_bytes_per_s
            .or(file.bandwidth_cap_bytes_per_s);
        if bandwidth_cap_bytes_per_s == Some(0) {
            return Err(ConfigError::invalid(
                "bandwidth_cap_bytes_per_s",
                "must be above 0 (leave it out for no cap)",
            ));
        }
        let congestion_controller = file.congestion_controller.unwrap_or_default();
        if congestion_controller == CongestionController::DeclaredRate
            && bandwidth_cap_bytes_per_s.is_none()
        {
            return Err(ConfigError::invalid(
                "congestion_controller",
                "\"declared_rate\" needs bandwidth_cap_bytes_per_s, the link's rate",
            ));
        }
        let max_topics = file.max_topics.unwrap_or(DEFAULT_MAX_TOPICS);
        if !(1..=MAX_TOPICS_CEILING).contains(&max_topics) {
            return Err(ConfigError::invalid(
                "max_topics",
                format!("must be from 1 to {MAX_TOPICS_CEILING}, got {max_topics}"),
            ));
        }
        let checkpoint_ms = file
            .checkpoint_interval_ms
            .unwrap_or(DEFAULT_CHECKPOINT_INTERVAL_MS);
        if !(1..=MAX_CHECKPOINT_INTERVAL_MS).contains(&checkpoint_ms) {
            return Err(ConfigError::invalid(
                "checkpoint_interval_ms",
                format!("must be from 1 to {MAX_CHECKPOINT_INTERVAL_MS}, got {checkpoint_ms}"),
            ));
        }
        let mut topics: Vec<TopicConfig> = Vec::with_capacity(file.topics.len());
        for (i, topic) in file.topics.into_iter().enumerate() {
            let topic = resolve_topic(i, topic, &edge_id, &limits)?;
            if let Some(j) = topics.iter().position(|t| t.name == topic.name) {
                return Err(ConfigError::invalid(
                    format!("topics[{i}].name"),
                    format!("{} is already configured as topics[{j}]", topic.name),
                ));
            }
            topics.push(topic);
        }
        if topics.len() > max_topics as usize {
            return Err(ConfigError::invalid(
                "topics",
                format!(
                    "{} topics configured, more than max_topics = {max_topics}",
                    topics.len()
                ),
            ));
        }
        let mqtt = match file.mqtt {
            Some(m) => Some(crate::mqtt::MqttConfig::resolve(m, &edge_id)?),
            None => None,
        };
        let local_api = overrides
            .local_api
            .or(file.local_api)
            .unwrap_or_else(default_local_api);
        let local_api_security =
            local_api::resolve(local_api, file.local_api_token_file, file.local_api_tls)?;
        Ok(AgentConfig {
            mqtt,
            data_dir,
            edge_id,
            brokers,
            tls,
            tls_check_interval,
            local_api,
            local_api_security,
            disk_budget_bytes,
            realtime_ring_records,
            bandwidth_cap_bytes_per_s,
            congestion_controller,
            limits,
            max_topics,
            checkpoint_interval: Duration::from_millis(checkpoint_ms),
            replication,
            topics,
        })
    }

    /// The configured topic `name`, if any.
    pub fn topic(&self, name: &TopicName) -> Option<&TopicConfig> {
        self.topics.iter().find(|t| &t.name == name)
    }

    /// The `retain_until` of topic `name`: its own, else the agent's.
    pub fn retain_until(&self, name: &TopicName) -> RetainUntil {
        self.topic(name)
            .and_then(|t| t.retain_until)
            .unwrap_or(self.replication.retain_until)
    }
}

pub(crate) fn default_local_api() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 7500))
}

/// Parses the TOML text of `path`.
///
/// # Errors
/// [`ConfigError::Parse`] with the line and field path.
pub fn parse_file(path: &Path, text: &str) -> Result<FileConfig, ConfigError> {
    let parse_error = |span: Option<std::ops::Range<usize>>, field: String, message: &str| {
        let line = span.map_or(0, |s| {
            text.get(..s.start)
                .map_or(0, |before| before.matches('\n').count() + 1)
        });
        ConfigError::Parse {
            path: path.to_path_buf(),
            line,
            field,
            message: message.trim().to_owned(),
        }
    };
    // The key an error of the whole document points at (a duplicate key's
    // span is the key), else nothing: serde's path for it is ".", which
    // named no field ("line 2: .: duplicate key").
    let key_at = |span: Option<std::ops::Range<usize>>| {
        span.and_then(|s| text.get(s))
            .map(str::trim)
            .filter(|key| {
                !key.is_empty()
                    && key
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
            })
            .unwrap_or_default()
            .to_owned()
    };
    let de = toml::Deserializer::parse(text)
        .map_err(|e| parse_error(e.span(), key_at(e.span()), e.message()))?;
    serde_path_to_error::deserialize(de).map_err(|e| {
        let field = e.path().to_string();
        let inner = e.into_inner();
        let field = if field == "." {
            key_at(inner.span())
        } else {
            field
        };
        parse_error(inner.span(), field, inner.message())
    })
}

fn check_broker_address(address: &str) -> Result<(), String> {
    let (host, port) = address
        .rsplit_once(':')
        .ok_or_else(|| format!("{address:?} is not host:port"))?;
    if host.is_empty() || host.chars().any(char::is_whitespace) {
        return Err(format!("{address:?} has no valid host"));
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok(()),
        _ => Err(format!("{address:?} has no valid port (1-65535)")),
    }
}

fn resolve_limits(record: Option<u32>, batch: Option<u32>) -> Result<Limits, ConfigError> {
    // The defaults are also the most a broker accepts (its limits are
    // fixed): a larger record or batch would be stored here, acknowledged
    // to the publisher and then refused by every broker, stopping the
    // topic's replication for good.
    let broker = Limits::default();
    let limits = Limits {
        max_record_bytes: record.unwrap_or(broker.max_record_bytes),
        max_batch_bytes: batch.unwrap_or(broker.max_batch_bytes),
    };
    let invalid = |field, reason: String| Err(ConfigError::invalid(field, reason));
    let (r, b) = (limits.max_record_bytes, limits.max_batch_bytes);
    if r < RECORD_BYTES_MIN {
        return invalid(
            "max_record_bytes",
            format!("{r} is below {RECORD_BYTES_MIN}, the smallest encoded record"),
        );
    }
    for (field, value, max, what) in [
        ("max_record_bytes", r, broker.max_record_bytes, "record"),
        ("max_batch_bytes", b, broker.max_batch_bytes, "batch"),
    ] {
        if value > max {
            return invalid(
                field,
                format!(
                    "{value} is above {max}, the largest {what} a broker accepts: a larger one \
                     would be stored here but never replicated"
                ),
            );
        }
    }
    if b < BATCH_HEADER_BYTES + r {
        // Blame the setting that was changed.
        return match record {
            None => invalid(
                "max_batch_bytes",
                format!(
                    "{b} cannot hold one record of max_record_bytes ({r}) with the batch's \
                     {BATCH_HEADER_BYTES}-byte header"
                ),
            ),
            Some(_) => invalid(
                "max_record_bytes",
                format!(
                    "{r} does not fit a batch of max_batch_bytes ({b}) with its \
                     {BATCH_HEADER_BYTES}-byte header"
                ),
            ),
        };
    }
    debug_assert_eq!(limits.validate(), Ok(()));
    Ok(limits)
}

fn check_budget(budget: u64, limits: &Limits) -> Result<(), String> {
    let min = MIN_BUDGET_BATCHES * u64::from(limits.max_batch_bytes);
    if budget < min {
        return Err(format!(
            "{budget} is below {MIN_BUDGET_BATCHES} × max_batch_bytes = {min}"
        ));
    }
    Ok(())
}

fn check_ring(records: u32) -> Result<(), String> {
    if !(1..=MAX_RING_RECORDS).contains(&records) {
        return Err(format!(
            "must be from 1 to {MAX_RING_RECORDS} records, got {records}"
        ));
    }
    Ok(())
}

fn resolve_topic(
    i: usize,
    topic: TopicFileConfig,
    edge_id: &NamespaceName,
    limits: &Limits,
) -> Result<TopicConfig, ConfigError> {
    let field = |name: &str| format!("topics[{i}].{name}");
    let name = TopicName::new(&topic.name)
        .map_err(|e| ConfigError::invalid(field("name"), e.to_string()))?;
    let ns = edge_id.as_str();
    if name.namespace() != ns {
        return Err(ConfigError::invalid(
            field("name"),
            format!(
                "{name} is outside this edge's namespace {ns:?}; an edge writes only to /{ns}/..."
            ),
        ));
    }
    let intent = StreamIntent::parse(&topic.intent)
        .map_err(|e| ConfigError::invalid(field("intent"), e.to_string()))?;
    // Checks that the dead-letter topic name is valid too.
    TopicSpec::new(name.clone(), intent, 0)
        .map_err(|e| ConfigError::invalid(field("name"), e.to_string()))?;
    let realtime = intent.expand().persistence == Persistence::InMemory;
    if realtime {
        for (set, what) in [
            (topic.disk_budget_bytes.is_some(), "disk_budget_bytes"),
            (topic.full_policy.is_some(), "full_policy"),
            (topic.retain_until.is_some(), "retain_until"),
        ] {
            if set {
                return Err(ConfigError::invalid(
                    field(what),
                    "does not apply to the realtime intent (in memory, no WAL); set realtime_ring_records instead",
                ));
            }
        }
        if let Some(records) = topic.realtime_ring_records {
            check_ring(records)
                .map_err(|r| ConfigError::invalid(field("realtime_ring_records"), r))?;
        }
    } else {
        if topic.realtime_ring_records.is_some() {
            return Err(ConfigError::invalid(
                field("realtime_ring_records"),
                format!(
                    "only applies to the realtime intent; {} keeps a WAL (use disk_budget_bytes)",
                    intent
                ),
            ));
        }
        if let Some(budget) = topic.disk_budget_bytes {
            check_budget(budget, limits)
                .map_err(|r| ConfigError::invalid(field("disk_budget_bytes"), r))?;
        }
    }
    Ok(TopicConfig {
        name,
        intent,
        disk_budget_bytes: topic.disk_budget_bytes,
        full_policy: topic.full_policy.unwrap_or_default(),
        realtime_ring_records: topic.realtime_ring_records,
        retain_until: topic.retain_until,
    })
}

#[cfg(test)]
mod tests;
