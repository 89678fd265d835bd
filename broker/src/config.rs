//! Broker configuration: a TOML file, overridden by command-line flags and
//! environment variables (see `broker --help` and `configs/`).
//!
//! ```toml
//! node_id = 1
//! data_dir = "/var/lib/tributary-broker"
//! raft_listen = "127.0.0.1:7401"     # QUIC, Raft between brokers
//! admin_listen = "127.0.0.1:7400"    # HTTPS admin + consumer API
//! ingest_listen = "127.0.0.1:7402"   # QUIC, edges replicate here
//! admin_token_file = "/etc/tributary/admin-token"  # chmod 600; or
//! # admin_token = "change-me"        # (config file then chmod 600), or env
//!                                    # TRIB_BROKER_ADMIN_TOKEN, or systemd
//!                                    # $CREDENTIALS_DIRECTORY/admin-token
//! # admin_plain_http = true          # plain HTTP: only on a loopback
//!                                    # admin_listen
//!
//! [tls]                              # made by `tribctl certs`
//! cert = "/etc/tributary/broker-1.pem"
//! key = "/etc/tributary/broker-1.key"
//! ca = "/etc/tributary/ca.pem"
//!
//! [members]                          # omit for a single node; read only
//!                                    # when the cluster first forms
//! 1 = "10.0.0.1:7401"
//! 2 = "10.0.0.2:7401"
//! 3 = "10.0.0.3:7401"
//!
//! [wal]                              # central topic WALs
//! segment_max_age_ms = 60000         # seal the active segment after 1 min
//!
//! [retention]                        # only without a tier service ([archive]):
//! interval_ms = 60000                # delete what every durable subscription
//! # max_age_ms = 604800000           # acked, or what is older than this
//!
//! [budget]                           # optional: un-archived WAL bound
//! unarchived_bytes = 10737418240     # refuse new batches above 10 GiB
//! # topics = { "/plant1/readings" = 1073741824 }
//!
//! [ingest]                           # the QUIC endpoint edges replicate to
//! receive_budget_bytes = 1073741824  # bytes in flight from all edges (1 GiB)
//!
//! [fleet]                            # edges in `tribctl edges list`
//! report_interval_ms = 15000         # connected edges' entries to Raft
//! progress_interval_ms = 1000        # edges report their high-water mark
//!
//! [archive]                          # the tier service's bucket: required with a
//! prefix = "/tributary"              # tier service (descriptor checks, trims),
//!                                    # and for reads below the local WAL
//! [archive.store]                    # same keys as tier-service's [store]
//! url = "/var/lib/tributary-archive" # a directory, or "s3://bucket"
//! # endpoint = "http://127.0.0.1:9000"
//!
//! [enroll]                           # optional: sign enrolling edges
//! ca_cert = "/etc/tributary/certs/ca.pem"     # one of tls.ca's CAs
//! ca_key = "/etc/tributary/certs-ca/ca.key"   # chmod 600; or systemd
//!                                    # $CREDENTIALS_DIRECTORY/enroll-ca-key
//! # cert_validity_days = 365
//! ```

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use broker_core::tls::TlsPaths;
use serde::Deserialize;

use crate::raft::NodeId;

/// The broker's settings after merging file, flags and environment.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BrokerConfig {
    /// Raft node id, unique in the cluster, at least 1. Default 1.
    #[serde(default = "default_node_id")]
    pub node_id: NodeId,
    /// Directory for Raft state and topic WALs.
    pub data_dir: PathBuf,
    /// QUIC address for Raft traffic between brokers. Default 127.0.0.1:7401.
    #[serde(default = "default_raft_listen")]
    pub raft_listen: SocketAddr,
    /// Address of the admin, consumer and storage APIs (HTTPS with the
    /// `[tls]` certificate). Default 127.0.0.1:7400.
    #[serde(default = "default_admin_listen")]
    pub admin_listen: SocketAddr,
    /// Serve `admin_listen` over plain HTTP instead of HTTPS. Allowed only
    /// when `admin_listen` is a loopback address (the log says so at
    /// start-up); any other address is a start-up error. Default false.
    #[serde(default)]
    pub admin_plain_http: bool,
    /// QUIC address where edges replicate. Default 127.0.0.1:7402.
    #[serde(default = "default_ingest_listen")]
    pub ingest_listen: SocketAddr,
    /// Bearer token the admin API requires (the bootstrap admin). After
    /// [`BrokerConfig::resolve_secrets`], also the token read from
    /// `admin_token_file` or `$CREDENTIALS_DIRECTORY/admin-token`. A
    /// configuration file that holds it must not be world-readable.
    #[serde(default)]
    pub admin_token: Option<String>,
    /// File holding the admin token (one line; must not be
    /// world-readable). Exclusive with `admin_token`.
    #[serde(default)]
    pub admin_token_file: Option<PathBuf>,
    /// This broker's certificate, key and the cluster CA.
    pub tls: Option<TlsPaths>,
    /// Raft members by node id (this node included); empty = single node.
    #[serde(default)]
    pub members: BTreeMap<NodeId, String>,
    /// Raft timing and snapshot settings.
    #[serde(default)]
    pub raft: RaftTuning,
    /// Central topic WAL settings.
    #[serde(default)]
    pub wal: WalTuning,
    /// Consumer settings (`[consumers]`: cursor persistence batching,
    /// session timeout); see [`crate::consumer::ConsumerConfig`].
    #[serde(default)]
    pub consumers: crate::consumer::ConsumerConfig,
    /// The archive bucket the tier service writes (`[archive]`), read when
    /// a consumer asks for offsets below the local WAL (tiered read), and
    /// where the storage API checks each descriptor's object before
    /// committing it or trimming below it. None: such reads fail with `503
    /// archive_not_configured`, and descriptor commits and trims with `409
    /// archive_not_configured` (the broker cannot verify, so it refuses).
    #[serde(default)]
    pub archive: Option<ArchiveConfig>,
    /// Local retention for deployments without a tier service
    /// (`[retention]`); see [`crate::storage::retention`].
    #[serde(default)]
    pub retention: LocalRetention,
    /// The un-archived WAL byte budget (`[budget]`); off unless a limit is
    /// set. See [`crate::budget`].
    #[serde(default)]
    pub budget: crate::budget::BudgetConfig,
    /// Topic ownership: lease timing and the addresses other brokers
    /// redirect to (`[cluster]`); see [`crate::cluster`].
    #[serde(default)]
    pub cluster: ClusterTuning,
    /// The CA that signs enrolling edges' certificates (`[enroll]`); see
    /// [`crate::enroll`]. None: `POST /v1/enroll` answers `503
    /// enrollment_disabled`.
    #[serde(default)]
    pub enroll: Option<crate::enroll::EnrollConfig>,
    /// Fleet visibility (`[fleet]`): how often edge entries are written to
    /// Raft and edges report their high-water mark; see [`crate::fleet`].
    #[serde(default)]
    pub fleet: crate::fleet::FleetConfig,
    /// The edge ingest endpoint (`[ingest]`).
    #[serde(default)]
    pub ingest: IngestTuning,
}

/// `[ingest]`: the QUIC endpoint edges replicate to.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IngestTuning {
    /// Bytes all edge connections together may have sent and the broker
    /// not yet read (QUIC connection flow control, shared by the
    /// connections); default
    /// [`DEFAULT_RECEIVE_BUDGET_BYTES`](crate::replication::receive_budget::DEFAULT_RECEIVE_BUDGET_BYTES)
    /// (1 GiB), at least 1 MiB. See [`crate::replication::receive_budget`].
    pub receive_budget_bytes: Option<u64>,
}

impl IngestTuning {
    /// The receive budget in effect, bytes.
    pub fn receive_budget(&self) -> u64 {
        self.receive_budget_bytes
            .unwrap_or(crate::replication::receive_budget::DEFAULT_RECEIVE_BUDGET_BYTES)
    }
}

/// `[cluster]`: the broker's lease and advertised addresses.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterTuning {
    /// Lease time to live, ms. Default 5000. A dead broker's topics move
    /// within about this plus one heartbeat.
    pub lease_ttl_ms: u64,
    /// Lease renewal and load-manager interval, ms. Default 1000.
    pub heartbeat_ms: u64,
    /// A broker stops serving its topics this long before its lease could
    /// lapse, ms: the wall-clock skew tolerated between brokers. Default
    /// 1500.
    pub lease_margin_ms: u64,
    /// The ingest address edges are redirected to. Default `ingest_listen`.
    pub advertised_ingest: Option<String>,
    /// The admin API base URL consumers are redirected to. Default
    /// `https://{admin_listen}` (`http://` with `admin_plain_http`).
    pub advertised_admin_url: Option<String>,
    /// How long a broker stopped with SIGTERM holds the centrally written
    /// topics it keeps (no edge copy) for its restart before they are
    /// taken over at the archive's end, ms. Default 60000; at most
    /// `lease_ttl_ms` turns the hold off.
    pub restart_hold_ms: u64,
}

impl Default for ClusterTuning {
    fn default() -> Self {
        ClusterTuning {
            lease_ttl_ms: 5000,
            heartbeat_ms: 1000,
            lease_margin_ms: 1500,
            restart_hold_ms: crate::cluster::DEFAULT_RESTART_HOLD_MS,
            advertised_ingest: None,
            advertised_admin_url: None,
        }
    }
}

/// Default `[wal] segment_max_age_ms`: central segments seal after a
/// minute, so the archive (and with it what edges may delete) trails a
/// quiet topic by about a minute plus the tier service's interval.
pub const DEFAULT_SEGMENT_MAX_AGE_MS: u64 = 60_000;

impl std::fmt::Debug for BrokerConfig {
    /// Every setting except the admin token's value (`<redacted>`).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BrokerConfig")
            .field("node_id", &self.node_id)
            .field("data_dir", &self.data_dir)
            .field("raft_listen", &self.raft_listen)
            .field("admin_listen", &self.admin_listen)
            .field("admin_plain_http", &self.admin_plain_http)
            .field("ingest_listen", &self.ingest_listen)
            .field(
                "admin_token",
                &self.admin_token.as_ref().map(|_| "<redacted>"),
            )
            .field("admin_token_file", &self.admin_token_file)
            .field("tls", &self.tls)
            .field("members", &self.members)
            .field("raft", &self.raft)
            .field("wal", &self.wal)
            .field("consumers", &self.consumers)
            .field("archive", &self.archive)
            .field("retention", &self.retention)
            .field("budget", &self.budget)
            .field("cluster", &self.cluster)
            .field("enroll", &self.enroll)
            .field("fleet", &self.fleet)
            .field("ingest", &self.ingest)
            .finish()
    }
}

/// `[retention]`: local retention when no tier service runs. Off by
/// default (then only the tier service's trims delete segments).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LocalRetention {
    /// Run retention on every open topic this often, ms: delete sealed
    /// segments every durable subscription has acknowledged (minimum
    /// persisted cursor) or older than `max_age_ms`. Default none (off).
    /// Do not set it when a tier service trims this broker.
    pub interval_ms: Option<u64>,
    /// Declared retention limit: a sealed segment whose newest record is
    /// older than this, ms, is deleted even if unacknowledged. Default
    /// none.
    pub max_age_ms: Option<u64>,
}

/// Where the tier service archives this broker's segments (`[archive]`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArchiveConfig {
    /// Storage prefix of descriptor keys and objects; must match the tier
    /// service's `prefix`. Default `/tributary`.
    #[serde(default = "default_archive_prefix")]
    pub prefix: String,
    /// The bucket (`[archive.store]`): the tier service's
    /// [`tributary_archive::StoreConfig`] (`url` = a local directory,
    /// `file:///path` or `s3://bucket`, plus S3 settings; unset S3 settings
    /// come from the `AWS_*` environment variables).
    pub store: tributary_archive::StoreConfig,
}

fn default_archive_prefix() -> String {
    tributary_proto::keys::DEFAULT_STORAGE_PREFIX.to_owned()
}

/// Central topic WAL settings (`[wal]`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WalTuning {
    /// Seal a topic's active segment this long after its first write in
    /// this process, ms, so the tier service (which only uploads sealed
    /// segments) archives the tail of a quiet topic within a bounded time.
    /// Default [`DEFAULT_SEGMENT_MAX_AGE_MS`] (one minute).
    pub segment_max_age_ms: Option<u64>,
    /// Rate of the background CRC check of sealed segments, bytes/s
    /// (default 4 MiB/s; 0 turns it off: damage is then found by reads
    /// only). Every damaged range found is reported and re-fetched.
    pub scrub_bytes_per_sec: Option<u64>,
    /// How often damaged ranges are looked for and re-fetch requests sent,
    /// ms (default 1000).
    pub damage_check_interval_ms: Option<u64>,
}

/// Raft timing and snapshot settings (`[raft]`); the defaults suit a LAN.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RaftTuning {
    /// Leader heartbeat interval, ms. Default 250.
    pub heartbeat_ms: u64,
    /// Election timeout lower bound, ms. Default 1000.
    pub election_timeout_min_ms: u64,
    /// Election timeout upper bound, ms. Default 2000.
    pub election_timeout_max_ms: u64,
    /// Build a snapshot after this many applied entries. Default 5000.
    pub snapshot_every: u64,
    /// Log entries kept behind a snapshot. Default 1000.
    pub logs_kept_after_snapshot: u64,
}

impl Default for RaftTuning {
    fn default() -> Self {
        RaftTuning {
            heartbeat_ms: 250,
            election_timeout_min_ms: 1000,
            election_timeout_max_ms: 2000,
            snapshot_every: 5000,
            logs_kept_after_snapshot: 1000,
        }
    }
}

fn default_node_id() -> NodeId {
    1
}

/// Whether a `[members]` address is `host:port` with a port from 1 to
/// 65535 (whether the host resolves is `check-config`'s question: a name
/// may resolve only later).
pub(crate) fn member_address_ok(addr: &str) -> bool {
    addr.rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p != 0))
}

/// Why this node's own `[members]` address `own` may not be where
/// `raft_listen` listens (peers would call another port or host): a
/// different port, or a different IP when both are IPs and `raft_listen`
/// is not a wildcard. A host name is not resolved. Only a note for
/// `check-config`: behind a port mapping the two differ on purpose.
pub(crate) fn own_member_problem(own: &str, raft_listen: SocketAddr) -> Option<String> {
    let (host, port) = own.rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    if port != raft_listen.port() {
        return Some(format!(
            "this node's address {own} has port {port}, but raft_listen is {raft_listen}: the other nodes would call a port nobody listens on"
        ));
    }
    let ip: std::net::IpAddr = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .ok()?;
    if !raft_listen.ip().is_unspecified() && ip != raft_listen.ip() {
        return Some(format!(
            "this node's address {own} is not where raft_listen ({raft_listen}) listens"
        ));
    }
    None
}

fn default_raft_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 7401))
}

fn default_ingest_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 7402))
}

fn default_admin_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 7400))
}

/// Why a configuration is unusable.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("reading {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file is not valid TOML for this schema.
    #[error("{}: {message}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong, with line and column.
        message: String,
    },
    /// A secret file (token file, or a configuration file holding a
    /// token) is world-readable, unreadable or empty.
    #[error(transparent)]
    Secret(#[from] broker_core::secrets::SecretFileError),
    /// A setting has an invalid value.
    #[error("invalid setting {field}: {reason}")]
    Invalid {
        /// The setting.
        field: &'static str,
        /// Why.
        reason: String,
    },
}

impl BrokerConfig {
    /// Parses a TOML configuration file.
    ///
    /// # Errors
    /// [`ConfigError::Read`] or [`ConfigError::Parse`] (unknown keys are
    /// errors, so typos do not go unnoticed); [`ConfigError::Secret`] if
    /// the file holds `admin_token` and every user may read it.
    pub fn from_file(path: &Path) -> Result<BrokerConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let config: BrokerConfig = toml::from_str(&text).map_err(|e| ConfigError::Parse {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        if config.admin_token.is_some() {
            broker_core::secrets::refuse_world_readable(
                path,
                "configuration file holding admin_token",
            )?;
        }
        Ok(config)
    }

    /// Fills `admin_token` from `admin_token_file`, or, when neither is
    /// set, from `$CREDENTIALS_DIRECTORY/admin-token` (systemd
    /// `LoadCredential=admin-token:...`) if that file exists.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] if both `admin_token` and
    /// `admin_token_file` are set; [`ConfigError::Secret`] for a token file
    /// that is world-readable, unreadable or empty.
    pub fn resolve_secrets(&mut self) -> Result<(), ConfigError> {
        let what = "admin token file";
        match (&self.admin_token, &self.admin_token_file) {
            (Some(_), Some(_)) => Err(ConfigError::Invalid {
                field: "admin_token_file",
                reason: "set either admin_token or admin_token_file, not both".into(),
            }),
            (None, Some(path)) => {
                self.admin_token = Some(broker_core::secrets::read_token_file(path, what)?);
                Ok(())
            }
            (Some(_), None) => Ok(()),
            (None, None) => {
                if let Some(path) = broker_core::secrets::credential_path("admin-token") {
                    self.admin_token = Some(broker_core::secrets::read_token_file(&path, what)?);
                }
                Ok(())
            }
        }
    }

    /// Checks values that parse but cannot work.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the setting: the first of
    /// [`BrokerConfig::problems`].
    pub fn validate(&self) -> Result<(), ConfigError> {
        match self.problems().into_iter().next() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Every value that parses but cannot work, each a
    /// [`ConfigError::Invalid`] naming the setting (`check-config` reports
    /// them all).
    pub fn problems(&self) -> Vec<ConfigError> {
        let mut problems = Vec::new();
        let mut invalid = |field: &'static str, reason: String| {
            problems.push(ConfigError::Invalid { field, reason });
        };
        if self.node_id == 0 {
            invalid("node_id", "must be at least 1".into());
        }
        if !self.members.is_empty() && !self.members.contains_key(&self.node_id) {
            invalid(
                "members",
                format!("does not list this node ({})", self.node_id),
            );
        }
        // Raft and edge ingest are both QUIC: one UDP socket each.
        // (Port 0: each gets an ephemeral port of its own.)
        let udp_clash = self.raft_listen.port() != 0
            && self.raft_listen.port() == self.ingest_listen.port()
            && (self.raft_listen.ip() == self.ingest_listen.ip()
                || self.raft_listen.ip().is_unspecified()
                || self.ingest_listen.ip().is_unspecified());
        if udp_clash {
            invalid(
                "ingest_listen",
                format!(
                    "{} and raft_listen {} are both QUIC (UDP) on one port: each needs its own",
                    self.ingest_listen, self.raft_listen
                ),
            );
        }
        let mut by_addr: BTreeMap<&str, NodeId> = BTreeMap::new();
        for (id, addr) in &self.members {
            // Started with a port no socket can have, the broker called
            // the member for ever (check-config already refused it).
            if !member_address_ok(addr) {
                invalid(
                    "members",
                    format!("member {id}: {addr:?} is not host:port with a port from 1 to 65535"),
                );
            }
            if let Some(other) = by_addr.insert(addr.as_str(), *id) {
                invalid(
                    "members",
                    format!(
                        "members {other} and {id} share the address {addr}: each node needs its own"
                    ),
                );
            }
        }

        if self.wal.segment_max_age_ms == Some(0) {
            invalid(
                "wal.segment_max_age_ms",
                "must be at least 1 (or left out)".into(),
            );
        }
        // Local retention deletes sealed segments by cursor or age, not by
        // the archive's end: beside a tier service it deleted segments
        // that were never archived (the config trial).
        if self.retention.interval_ms.is_some() && self.archive.is_some() {
            invalid(
                "retention",
                "local retention is for a broker without a tier service; with [archive] the tier service's trims delete archived segments (remove [retention], or [archive] if no tier service runs)".into(),
            );
        }
        // 0 panicked the damage check's timer while /health said ok.
        if self.wal.damage_check_interval_ms == Some(0) {
            invalid(
                "wal.damage_check_interval_ms",
                "must be at least 1 (or left out; scrub_bytes_per_sec = 0 turns the background check off)".into(),
            );
        }
        // openraft's own rules (`Config::validate`), named by setting.
        let r = &self.raft;
        if r.heartbeat_ms == 0 {
            invalid("raft.heartbeat_ms", "must be at least 1".into());
        }
        if r.election_timeout_min_ms <= r.heartbeat_ms {
            invalid(
                "raft.election_timeout_min_ms",
                format!(
                    "must exceed raft.heartbeat_ms ({} ms), or followers start elections \
                     between heartbeats",
                    r.heartbeat_ms
                ),
            );
        }
        if r.election_timeout_max_ms <= r.election_timeout_min_ms {
            invalid(
                "raft.election_timeout_max_ms",
                format!(
                    "must exceed raft.election_timeout_min_ms ({} ms)",
                    r.election_timeout_min_ms
                ),
            );
        }
        let c = &self.cluster;
        if c.heartbeat_ms == 0 || c.lease_margin_ms + c.heartbeat_ms >= c.lease_ttl_ms {
            invalid(
                "cluster.lease_ttl_ms",
                format!(
                    "must exceed lease_margin_ms + heartbeat_ms ({} + {} ms), and heartbeat_ms must be at least 1",
                    c.lease_margin_ms, c.heartbeat_ms
                ),
            );
        }
        if self.retention.interval_ms == Some(0) {
            invalid(
                "retention.interval_ms",
                "must be at least 1 (or left out)".into(),
            );
        }
        // A limit of 0 refused every batch for good (a config trial); a
        // refresh of 0 cannot drive a timer.
        let b = &self.budget;
        if b.unarchived_bytes == Some(0) {
            invalid(
                "budget.unarchived_bytes",
                "must be at least 1 (0 refuses every batch; leave it out for no limit)".into(),
            );
        }
        for (topic, limit) in &b.topics {
            if let Err(e) = tributary_proto::keys::TopicName::new(topic) {
                invalid("budget.topics", format!("{topic:?}: {e}"));
            } else if *limit == 0 {
                invalid(
                    "budget.topics",
                    format!("{topic}: must be at least 1 (0 refuses every batch)"),
                );
            }
        }
        if b.refresh_ms == 0 {
            invalid("budget.refresh_ms", "must be at least 1".into());
        }
        if let Some(archive) = &self.archive {
            if let Err(e) = tributary_proto::keys::StorageKeys::new(&archive.prefix) {
                invalid("archive.prefix", e.to_string());
            }
            if archive.store.url.is_none() {
                invalid(
                    "archive.store.url",
                    "required in [archive.store] (a directory or s3://bucket)".into(),
                );
            }
        }
        for (field, reason) in self.fleet.problems() {
            invalid(field, reason);
        }
        if self.ingest.receive_budget() < 1024 * 1024 {
            invalid(
                "ingest.receive_budget_bytes",
                "must be at least 1048576 (1 MiB)".into(),
            );
        }
        if self.admin_plain_http && !self.admin_listen.ip().is_loopback() {
            invalid(
                "admin_plain_http",
                format!(
                    "plain HTTP is allowed only on a loopback admin_listen, not {}: \
                     leave admin_plain_http unset (HTTPS) or bind 127.0.0.1",
                    self.admin_listen
                ),
            );
        }
        if self.tls.is_none() {
            invalid(
                "tls",
                "brokers talk mutual TLS only: set tls.cert, tls.key and tls.ca \
                 (`tribctl certs --broker 1` makes development ones)"
                    .into(),
            );
        }
        match &self.admin_token {
            // Read (and checked) by resolve_secrets at start-up.
            None if self.admin_token_file.is_some() => {}
            Some(token) if token.len() >= 8 => {}
            Some(_) => invalid("admin_token", "must be at least 8 characters".into()),
            None => invalid(
                "admin_token",
                "required: admin_token_file, admin_token, TRIB_BROKER_ADMIN_TOKEN or \
                 $CREDENTIALS_DIRECTORY/admin-token"
                    .into(),
            ),
        }
        problems
    }

    /// The identity this broker's certificate must have: `broker-{node_id}`
    /// (the only identity other brokers accept on the Raft connection).
    pub fn expected_identity(&self) -> String {
        format!("broker-{}", self.node_id)
    }

    /// Raft members with this node's own address filled in for a single
    /// node.
    pub fn effective_members(&self) -> BTreeMap<NodeId, String> {
        if self.members.is_empty() {
            BTreeMap::from([(self.node_id, self.raft_listen.to_string())])
        } else {
            self.members.clone()
        }
    }
}

/// Parses `ID=HOST:PORT` as given to `--member`.
///
/// # Errors
/// A message naming the malformed part.
pub fn parse_member(text: &str) -> Result<(NodeId, String), String> {
    let (id, addr) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?}: expected ID=HOST:PORT"))?;
    let id: NodeId = id
        .parse()
        .map_err(|_| format!("{text:?}: node id {id:?} is not a number"))?;
    if addr
        .rsplit_once(':')
        .is_none_or(|(host, port)| host.is_empty() || port.parse::<u16>().is_err())
    {
        return Err(format!("{text:?}: address {addr:?} is not HOST:PORT"));
    }
    Ok((id, addr.to_string()))
}

#[cfg(test)]
mod tests;
