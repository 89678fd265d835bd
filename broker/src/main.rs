//! `broker`: the central ingestion node. Stores what edges send, keeps
//! metadata in Raft and serves consumers and the admin API.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use broker_core::service;
use clap::{Parser, ValueEnum};
use tributary_broker::config::{BrokerConfig, parse_member};
use tributary_broker::raft::NodeId;

/// Tributary broker: Raft metadata cluster and admin API (QUIC ingest and
/// consumers follow).
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    /// TOML configuration file; flags and environment override it.
    #[arg(long, short = 'c', env = "TRIB_BROKER_CONFIG")]
    config: Option<PathBuf>,
    /// Raft node id (>= 1).
    #[arg(long, env = "TRIB_NODE_ID")]
    node_id: Option<NodeId>,
    /// Data directory (Raft state, topic WALs).
    #[arg(long, env = "TRIB_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// QUIC address for Raft traffic between brokers.
    #[arg(long)]
    raft_listen: Option<SocketAddr>,
    /// Address of the admin and consumer API (HTTPS with --tls-cert).
    #[arg(long)]
    admin_listen: Option<SocketAddr>,
    /// Serve the admin and consumer API over plain HTTP: only with a
    /// loopback --admin-listen (a start-up error otherwise).
    #[arg(long)]
    admin_plain_http: bool,
    /// QUIC address where edges replicate.
    #[arg(long)]
    ingest_listen: Option<SocketAddr>,
    /// Bearer token required by the admin API.
    #[arg(long, env = "TRIB_ADMIN_TOKEN", hide_env_values = true)]
    admin_token: Option<String>,
    /// File holding the admin token (must not be world-readable); exclusive
    /// with --admin-token. Without both, $CREDENTIALS_DIRECTORY/admin-token
    /// is read if it exists.
    #[arg(long, env = "TRIB_ADMIN_TOKEN_FILE")]
    admin_token_file: Option<PathBuf>,
    /// Raft member as ID=HOST:PORT (repeat for every member, this node
    /// included). None: a single-node cluster.
    #[arg(long = "member", value_parser = parse_member)]
    members: Vec<(NodeId, String)>,
    /// This broker's certificate (PEM).
    #[arg(long)]
    tls_cert: Option<PathBuf>,
    /// This broker's private key (PEM).
    #[arg(long)]
    tls_key: Option<PathBuf>,
    /// The cluster CA certificate (PEM).
    #[arg(long)]
    tls_ca: Option<PathBuf>,
    /// Log format: text on a terminal, json for log collectors.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

fn merge(cli: Cli) -> anyhow::Result<BrokerConfig> {
    let mut config = match &cli.config {
        Some(path) => BrokerConfig::from_file(path)?,
        None => {
            let data_dir = cli
                .data_dir
                .clone()
                .ok_or_else(|| anyhow::anyhow!("--data-dir (or --config) is required"))?;
            toml::from_str::<BrokerConfig>(&format!(
                "data_dir = {:?}",
                data_dir.display().to_string()
            ))?
        }
    };
    if let Some(v) = cli.node_id {
        config.node_id = v;
    }
    if let Some(v) = cli.data_dir {
        config.data_dir = v;
    }
    if let Some(v) = cli.raft_listen {
        config.raft_listen = v;
    }
    if let Some(v) = cli.admin_listen {
        config.admin_listen = v;
    }
    if let Some(v) = cli.ingest_listen {
        config.ingest_listen = v;
    }
    if cli.admin_plain_http {
        config.admin_plain_http = true;
    }
    if let Some(v) = cli.admin_token {
        config.admin_token = Some(v);
    }
    if let Some(v) = cli.admin_token_file {
        config.admin_token_file = Some(v);
    }
    if !cli.members.is_empty() {
        config.members = cli.members.into_iter().collect();
    }
    match (cli.tls_cert, cli.tls_key, cli.tls_ca) {
        (Some(cert), Some(key), Some(ca)) => {
            config.tls = Some(broker_core::tls::TlsPaths { cert, key, ca });
        }
        (None, None, None) => {}
        _ => anyhow::bail!("--tls-cert, --tls-key and --tls-ca go together"),
    }
    Ok(config)
}

impl From<LogFormat> for service::LogFormat {
    fn from(format: LogFormat) -> service::LogFormat {
        match format {
            LogFormat::Text => service::LogFormat::Text,
            LogFormat::Json => service::LogFormat::Json,
        }
    }
}

/// Resolves on SIGTERM or SIGINT (at once if no handler can be installed:
/// a broker that cannot be stopped gracefully should not run).
async fn shutdown_signal() {
    if let Err(e) = service::shutdown_signal().await {
        tracing::error!(error = %e, "no shutdown signal; stopping");
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    service::init_logging(cli.log_format.into(), "info,openraft=warn");
    let result = merge(cli).and_then(|config| {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?;
        runtime.block_on(tributary_broker::server::run(config, shutdown_signal()))?;
        Ok(())
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
