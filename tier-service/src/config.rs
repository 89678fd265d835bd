//! Tier service configuration: a TOML file, overridden by command-line
//! flags and environment variables (`tier-service --help`).
//!
//! ```toml
//! data_dir = "/var/lib/tributary-broker"   # the broker's data directory
//! prefix = "/tributary"                    # storage prefix (keys and objects)
//! poll_interval_ms = 5000                  # between passes
//! topic_concurrency = 2                    # topics tiered at once
//! metrics_listen = "127.0.0.1:7600"        # GET /metrics (Prometheus)
//!
//! [broker]
//! url = "https://127.0.0.1:7400"           # the broker's admin API (HTTPS)
//! ca = "/etc/tributary/ca.pem"             # the cluster CA (required for https)
//! # cert = "/etc/tributary/tier-1.pem"     # optional client certificate
//! # key = "/etc/tributary/tier-1.key"      # and its key (chmod 600)
//! token_file = "/etc/tributary/broker-token"  # chmod 600; or token = "..."
//!                                          # (config file then chmod 600),
//!                                          # env TRIB_TIER_TOKEN, or systemd
//!                                          # $CREDENTIALS_DIRECTORY/broker-token
//!
//! [store]
//! url = "/var/lib/tributary-archive"       # a directory, or "s3://bucket"
//! # endpoint = "http://127.0.0.1:9000"     # S3-compatible server
//! # region = "us-east-1"
//! # path_style = true
//! # access_key_id = "..."                  # else AWS_ACCESS_KEY_ID etc.
//! # secret_access_key = "..."
//! # request_timeout_ms = 30000           # one S3 request
//! # max_retries = 10                     # object_store's own retries
//! # retry_timeout_ms = 180000
//! # instance_credentials = false         # true: ask the cloud instance's metadata
//!                                        # endpoint when no keys are set; without
//!                                        # keys and without it, start-up fails
//!
//! [upload]
//! multipart_threshold_bytes = 16777216
//! part_size_bytes = 8388608
//! part_concurrency = 4
//! full_verify = false
//!
//! [cold_retention]                       # optional; default keeps everything
//! # max_age_ms = 2592000000
//! # max_bytes = 1099511627776
//!
//! [audit]                                # the continuous archive audit
//! interval_ms = 60000                    # every descriptor's object checked
//! upload_stall_after_ms = 300000         # /health: upload_stalled after this
//!                                        # long without a commit while a
//!                                        # backlog exists
//!
//! [lakehouse]                            # Parquet files of selected topics
//! topics = []                            # e.g. ["/plant1/*"]; default none
//! # infer = true                         # typed columns from JSON objects
//! # [lakehouse.columns."/plant1/power"]  # or declared per topic
//! # Voltage = "double"
//!
//! [retry]
//! attempts_max = 6
//! min_delay_ms = 200
//! max_delay_ms = 10000
//! ```

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::cold::ColdRetention;
use crate::error::TierError;
use crate::tiering::RetryTuning;
use crate::upload::UploadTuning;
use tributary_archive::bucket::StoreConfig;

/// Default admin API address of the broker.
pub const DEFAULT_BROKER_URL: &str = "https://127.0.0.1:7400";
/// Smallest multipart part S3 accepts (except the last), bytes.
pub const S3_PART_BYTES_MIN: usize = 5 * 1024 * 1024;

/// The broker's admin API (`[broker]`).
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BrokerApiConfig {
    /// Base URL. Default `https://127.0.0.1:7400`.
    #[serde(default = "default_broker_url")]
    pub url: String,
    /// Bearer token (else `token_file`, env `TRIB_TIER_TOKEN`, or
    /// `$CREDENTIALS_DIRECTORY/broker-token`). A configuration file holding
    /// it must not be world-readable.
    #[serde(default)]
    pub token: Option<String>,
    /// File holding the bearer token (must not be world-readable).
    /// Exclusive with `token`.
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    /// The cluster CA (PEM) the broker's certificate must chain to;
    /// required for an `https://` url (no system roots are trusted).
    #[serde(default)]
    pub ca: Option<PathBuf>,
    /// Client certificate (PEM) presented to the broker; with `key`.
    #[serde(default)]
    pub cert: Option<PathBuf>,
    /// Private key (PEM, not world-readable) of `cert`.
    #[serde(default)]
    pub key: Option<PathBuf>,
}

impl std::fmt::Debug for BrokerApiConfig {
    /// Every setting except the token's value (`<redacted>`).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BrokerApiConfig")
            .field("url", &self.url)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("token_file", &self.token_file)
            .field("ca", &self.ca)
            .field("cert", &self.cert)
            .field("key", &self.key)
            .finish()
    }
}

impl Default for BrokerApiConfig {
    fn default() -> Self {
        BrokerApiConfig {
            url: default_broker_url(),
            token: None,
            token_file: None,
            ca: None,
            cert: None,
            key: None,
        }
    }
}

impl BrokerApiConfig {
    /// The bearer token: `token`, else the contents of `token_file`, else
    /// env `TRIB_TIER_TOKEN`, else `$CREDENTIALS_DIRECTORY/broker-token` if
    /// it exists; empty if none. (The binary also reads the old name
    /// `TRIB_ADMIN_TOKEN`, with a warning.)
    ///
    /// # Errors
    /// [`TierError::Config`] if both `token` and `token_file` are set, or a
    /// token file is world-readable, unreadable or empty.
    pub fn resolve_token(&self) -> Result<String, TierError> {
        let what = "broker token file";
        let read = |path: &Path| {
            broker_core::secrets::read_token_file(path, what)
                .map_err(|e| TierError::Config(e.to_string()))
        };
        match (&self.token, &self.token_file) {
            (Some(_), Some(_)) => Err(TierError::Config(
                "broker.token and broker.token_file are exclusive: set one".into(),
            )),
            (Some(token), None) => Ok(token.clone()),
            (None, Some(path)) => read(path),
            (None, None) => match std::env::var("TRIB_TIER_TOKEN") {
                Ok(token) => Ok(token),
                Err(_) => match broker_core::secrets::credential_path("broker-token") {
                    Some(path) => read(&path),
                    None => Ok(String::new()),
                },
            },
        }
    }
}

fn default_broker_url() -> String {
    DEFAULT_BROKER_URL.to_owned()
}

fn default_prefix() -> String {
    tributary_proto::keys::DEFAULT_STORAGE_PREFIX.to_owned()
}

fn default_poll_interval_ms() -> u64 {
    5000
}

fn default_topic_concurrency() -> usize {
    2
}

fn default_metrics_listen() -> std::net::SocketAddr {
    std::net::SocketAddr::from(([127, 0, 0, 1], 7600))
}

/// The tier service's settings after merging file, flags and environment.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TierConfig {
    /// The broker's data directory; topic WALs are under `topics/`.
    pub data_dir: PathBuf,
    /// Storage prefix of keys and objects. Default `/tributary`.
    #[serde(default = "default_prefix")]
    pub prefix: String,
    /// Pause between passes, ms. Default 5000.
    #[serde(default = "default_poll_interval_ms")]
    pub poll_interval_ms: u64,
    /// Topics tiered at once. Default 2.
    #[serde(default = "default_topic_concurrency")]
    pub topic_concurrency: usize,
    /// Address of the `GET /metrics` listener (no authentication). Default
    /// 127.0.0.1:7600.
    #[serde(default = "default_metrics_listen")]
    pub metrics_listen: std::net::SocketAddr,
    /// The broker's admin API.
    #[serde(default)]
    pub broker: BrokerApiConfig,
    /// The bucket.
    #[serde(default)]
    pub store: StoreConfig,
    /// Upload settings.
    #[serde(default)]
    pub upload: UploadTuning,
    /// Retry settings.
    #[serde(default)]
    pub retry: RetryTuning,
    /// Cold retention of the archive (default: keep forever).
    #[serde(default)]
    pub cold_retention: ColdRetention,
    /// The continuous archive audit ([`crate::audit`]).
    #[serde(default)]
    pub audit: AuditConfig,
    /// The continuous lakehouse writer ([`crate::lakehouse`]); off unless
    /// `topics` selects some.
    #[serde(default)]
    pub lakehouse: crate::lakehouse::LakehouseConfig,
}

/// `[audit]`: how often the archive audit checks every committed
/// descriptor's object, and when `/health` reports `upload_stalled`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuditConfig {
    /// Time between two audits, ms (the first runs after the first pass).
    /// Default 60000; at least 100.
    pub interval_ms: u64,
    /// `upload_stalled` (`/health`, `tributary_tier_upload_stalled`) once
    /// no segment was committed for this long while a tiering backlog
    /// exists, ms. Default 300000.
    pub upload_stall_after_ms: u64,
}

impl Default for AuditConfig {
    fn default() -> Self {
        AuditConfig {
            interval_ms: 60_000,
            upload_stall_after_ms: 300_000,
        }
    }
}

impl TierConfig {
    /// A configuration with defaults for everything but the data directory
    /// (bucket: `{data_dir}/archive`).
    pub fn new(data_dir: PathBuf) -> TierConfig {
        TierConfig {
            store: StoreConfig {
                url: Some(data_dir.join("archive").display().to_string()),
                ..StoreConfig::default()
            },
            data_dir,
            prefix: default_prefix(),
            poll_interval_ms: default_poll_interval_ms(),
            topic_concurrency: default_topic_concurrency(),
            metrics_listen: default_metrics_listen(),
            broker: BrokerApiConfig::default(),
            upload: UploadTuning::default(),
            retry: RetryTuning::default(),
            cold_retention: ColdRetention::default(),
            audit: AuditConfig::default(),
            lakehouse: crate::lakehouse::LakehouseConfig::default(),
        }
    }

    /// Reads a TOML file.
    ///
    /// # Errors
    /// [`TierError::Config`] naming the file and the problem, also when
    /// the file holds `broker.token` and every user may read it.
    pub fn from_file(path: &Path) -> Result<TierConfig, TierError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| TierError::Config(format!("{}: {e}", path.display())))?;
        let config: TierConfig = toml::from_str(&text)
            .map_err(|e| TierError::Config(format!("{}: {e}", path.display())))?;
        if config.broker.token.is_some() {
            broker_core::secrets::refuse_world_readable(
                path,
                "configuration file holding broker.token",
            )
            .map_err(|e| TierError::Config(e.to_string()))?;
        }
        Ok(config)
    }

    /// `{data_dir}/topics`.
    pub fn topics_dir(&self) -> PathBuf {
        self.data_dir.join("topics")
    }

    /// Checks the settings against each other.
    ///
    /// # Errors
    /// [`TierError::Config`] naming the setting: the first of
    /// [`TierConfig::problems`].
    pub fn validate(&self) -> Result<(), TierError> {
        match self.problems().into_iter().next() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Every setting that contradicts another or cannot work, each naming
    /// the setting (`check-config` reports them all).
    pub fn problems(&self) -> Vec<TierError> {
        let mut problems = Vec::new();
        if let Err(e) = tributary_proto::keys::StorageKeys::new(&self.prefix) {
            problems.push(TierError::Config(format!("prefix: {e}")));
        }
        let mut fail = |m: &str| problems.push(TierError::Config(m.to_owned()));
        if self.upload.part_size_bytes == 0 || self.upload.part_concurrency == 0 {
            fail("upload.part_size_bytes and upload.part_concurrency must be above 0");
        }
        let is_s3 = self
            .store
            .url
            .as_deref()
            .is_some_and(|u| u.starts_with("s3://"));
        if is_s3 && self.upload.part_size_bytes < S3_PART_BYTES_MIN {
            fail("upload.part_size_bytes must be at least 5 MiB for S3");
        }
        if self.store.url.is_none() {
            fail("store.url is not set (--bucket)");
        }
        if self.retry.attempts_max == 0 {
            fail("retry.attempts_max must be at least 1");
        }
        if self.retry.min_delay_ms > self.retry.max_delay_ms {
            fail("retry.min_delay_ms must not be above retry.max_delay_ms");
        }
        if self.topic_concurrency == 0 {
            fail("topic_concurrency must be at least 1");
        }
        if self.audit.interval_ms < 100 {
            fail("audit.interval_ms must be at least 100");
        }
        if self.broker.cert.is_some() != self.broker.key.is_some() {
            fail("broker.cert and broker.key go together");
        }
        let scheme = self.broker.url.to_ascii_lowercase();
        if !scheme.starts_with("http://") && !scheme.starts_with("https://") {
            fail("broker.url must start with https:// (or http:// for a broker on loopback)");
        }
        if self.poll_interval_ms < 100 {
            fail("poll_interval_ms must be at least 100");
        }
        if self.broker.url.to_ascii_lowercase().starts_with("https://") && self.broker.ca.is_none()
        {
            fail(
                "broker.url is https://: set broker.ca to the cluster CA that signed the broker's certificate",
            );
        }
        problems.extend(self.cold_retention.validate().err());
        problems.extend(self.lakehouse.validate().err());
        problems
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_example_parses() {
        let doc = include_str!("config.rs");
        let example: String = doc
            .lines()
            .skip_while(|l| !l.starts_with("//! ```toml"))
            .skip(1)
            .take_while(|l| !l.starts_with("//! ```"))
            .map(|l| l.trim_start_matches("//!").trim_start())
            .collect::<Vec<_>>()
            .join("\n");
        let config: TierConfig = toml::from_str(&example).unwrap();
        assert_eq!(config.prefix, "/tributary");
        assert_eq!(config.broker.token, None);
        assert_eq!(
            config.broker.token_file.as_deref(),
            Some(Path::new("/etc/tributary/broker-token"))
        );
        assert_eq!(
            config.broker.ca.as_deref(),
            Some(Path::new("/etc/tributary/ca.pem"))
        );
        assert_eq!(config.upload, UploadTuning::default());
        assert_eq!(config.retry, RetryTuning::default());
        config.validate().unwrap();
        let err = toml::from_str::<TierConfig>("data_dir = \"/x\"\nbogus = 1\n").unwrap_err();
        assert!(err.to_string().contains("bogus"), "{err}");
    }

    #[test]
    fn a_broker_url_that_is_not_http_and_a_zero_poll_interval_are_problems() {
        let config: TierConfig = toml::from_str(
            "data_dir = \"/x\"\npoll_interval_ms = 0\n[store]\nurl = \"/b\"\n\
             [broker]\nurl = \"ftp://127.0.0.1:7400\"\ntoken = \"t\"\n",
        )
        .unwrap();
        let problems: Vec<String> = config.problems().iter().map(ToString::to_string).collect();
        assert_eq!(
            problems,
            [
                "invalid configuration: broker.url must start with https:// (or http:// for a broker on \
                 loopback)",
                "invalid configuration: poll_interval_ms must be at least 100",
            ]
        );
    }

    #[test]
    fn a_retry_minimum_above_its_maximum_is_a_problem() {
        let config: TierConfig = toml::from_str(
            "data_dir = \"/x\"\n[store]\nurl = \"/b\"\n[broker]\nurl = \"http://127.0.0.1:7400\"\n\
             token = \"t\"\n[retry]\nmin_delay_ms = 10000\nmax_delay_ms = 1\n",
        )
        .unwrap();
        let problems: Vec<String> = config.problems().iter().map(ToString::to_string).collect();
        assert_eq!(
            problems,
            ["invalid configuration: retry.min_delay_ms must not be above retry.max_delay_ms"]
        );
    }

    #[cfg(unix)]
    #[test]
    fn tokens_in_world_readable_files_are_refused_and_never_shown() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let set_mode = |path: &Path, mode: u32| {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        let config = dir.path().join("tier.toml");
        let base = "data_dir = \"/x\"\n[store]\nurl = \"/a\"\n[broker]\nurl = \"https://b:7400\"\nca = \"/ca.pem\"\n";
        std::fs::write(&config, format!("{base}token = \"s3cret-token\"\n")).unwrap();
        set_mode(&config, 0o644);
        let err = TierConfig::from_file(&config).unwrap_err().to_string();
        assert!(
            err.contains(&format!("chmod 600 {}", config.display())),
            "{err}"
        );
        set_mode(&config, 0o600);
        let loaded = TierConfig::from_file(&config).unwrap();
        loaded.validate().unwrap();
        assert!(!format!("{loaded:?}").contains("s3cret"), "{loaded:?}");

        let token = dir.path().join("broker-token");
        std::fs::write(&token, "s3cret-token\n").unwrap();
        set_mode(&token, 0o644);
        std::fs::write(
            &config,
            format!("{base}token_file = \"{}\"\n", token.display()),
        )
        .unwrap();
        set_mode(&config, 0o644); // no token inside: fine
        let loaded = TierConfig::from_file(&config).unwrap();
        let err = loaded.broker.resolve_token().unwrap_err().to_string();
        assert!(
            err.contains(&format!("chmod 600 {}", token.display())),
            "{err}"
        );
        assert!(!err.contains("s3cret"), "{err}");
        set_mode(&token, 0o600);
        assert_eq!(loaded.broker.resolve_token().unwrap(), "s3cret-token");

        // https:// without the CA is refused by validate().
        let mut no_ca = loaded.clone();
        no_ca.broker.ca = None;
        let err = no_ca.validate().unwrap_err().to_string();
        assert!(err.contains("broker.ca"), "{err}");
    }
}
