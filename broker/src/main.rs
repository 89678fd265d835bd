//! `broker`: the central ingestion node. Stores what edges send, keeps
//! metadata in Raft and serves consumers and the admin API.
//! `broker check-config` (or `--check-config`) checks a configuration and
//! exits: `ok` and status 0, or one `error:` line per problem and status 1.
//! Fatal errors print one line, `error: ...`, and exit 1.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use broker_core::service::{self, RenamedEnv};
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};
use tributary_broker::config::{BrokerConfig, parse_member};
use tributary_broker::raft::NodeId;

/// Tributary broker: Raft metadata cluster and admin API (QUIC ingest and
/// consumers follow).
#[derive(Debug, Parser)]
#[command(version, about, args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    args: BrokerArgs,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Check the configuration (file, flags and environment) without
    /// starting: TLS files and the certificate's identity, the data
    /// directory, addresses. Prints `ok`, or one `error:` line per problem
    /// and exits 1.
    CheckConfig(BrokerArgs),
}

/// Environment variables renamed to `TRIB_BROKER_*`; the old names are
/// still read, with a warning.
const RENAMED_ENV: &[RenamedEnv] = &[
    RenamedEnv {
        arg: "node_id",
        new: "TRIB_BROKER_NODE_ID",
        old: "TRIB_NODE_ID",
    },
    RenamedEnv {
        arg: "data_dir",
        new: "TRIB_BROKER_DATA_DIR",
        old: "TRIB_DATA_DIR",
    },
    RenamedEnv {
        arg: "admin_token",
        new: "TRIB_BROKER_ADMIN_TOKEN",
        old: "TRIB_ADMIN_TOKEN",
    },
    RenamedEnv {
        arg: "admin_token_file",
        new: "TRIB_BROKER_ADMIN_TOKEN_FILE",
        old: "TRIB_ADMIN_TOKEN_FILE",
    },
];

#[derive(Debug, Args)]
struct BrokerArgs {
    /// TOML configuration file; flags and environment override it.
    #[arg(long, short = 'c', env = "TRIB_BROKER_CONFIG")]
    config: Option<PathBuf>,
    /// Check the configuration and exit (as `broker check-config`).
    #[arg(long)]
    check_config: bool,
    /// Raft node id (>= 1).
    #[arg(long, env = "TRIB_BROKER_NODE_ID", allow_negative_numbers = true)]
    node_id: Option<NodeId>,
    /// Data directory (Raft state, topic WALs).
    #[arg(long, env = "TRIB_BROKER_DATA_DIR")]
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
    #[arg(long, env = "TRIB_BROKER_ADMIN_TOKEN", hide_env_values = true)]
    admin_token: Option<String>,
    /// File holding the admin token (must not be world-readable); exclusive
    /// with --admin-token. Without both, $CREDENTIALS_DIRECTORY/admin-token
    /// is read if it exists.
    #[arg(long, env = "TRIB_BROKER_ADMIN_TOKEN_FILE")]
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
    /// Sign enrolling edges' certificates with this CA certificate (PEM;
    /// one of --tls-ca's), as `[enroll] ca_cert`.
    #[arg(long, requires = "enroll_ca_key")]
    enroll_ca_cert: Option<PathBuf>,
    /// The private key of --enroll-ca-cert (PEM, not world-readable), as
    /// `[enroll] ca_key`.
    #[arg(long, requires = "enroll_ca_cert")]
    enroll_ca_key: Option<PathBuf>,
    /// Log format: text on a terminal, json for log collectors.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

fn merge(cli: BrokerArgs) -> anyhow::Result<BrokerConfig> {
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
    if let (Some(ca_cert), Some(ca_key)) = (cli.enroll_ca_cert, cli.enroll_ca_key) {
        let validity = config.enroll.as_ref().map_or(
            tributary_broker::enroll::signer::DEFAULT_CERT_VALIDITY_DAYS,
            |e| e.cert_validity_days,
        );
        config.enroll = Some(tributary_broker::enroll::EnrollConfig {
            ca_cert,
            ca_key: Some(ca_key),
            cert_validity_days: validity,
        });
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

/// Parses the command line; a renamed environment variable set under its
/// old name only is read under that name (with a warning).
fn parse_cli() -> Cli {
    let mut command = Cli::command();
    for renamed in service::legacy_env(RENAMED_ENV) {
        command = command
            .mut_arg(renamed.arg, |a| a.env(renamed.old))
            .mut_subcommand("check-config", |s| {
                s.mut_arg(renamed.arg, |a| a.env(renamed.old))
            });
    }
    Cli::from_arg_matches(&command.get_matches()).unwrap_or_else(|e| e.exit())
}

/// `check-config`: `ok`, or every problem (one line each) and status 1.
fn check_config(args: BrokerArgs) -> ExitCode {
    match merge(args) {
        Ok(config) => tributary_broker::check::check(config).finish(),
        Err(e) => {
            let mut report = broker_core::check::Report::new();
            report.problem(service::error_chain(e.as_ref()));
            report.finish()
        }
    }
}

fn main() -> ExitCode {
    let cli = parse_cli();
    let args = match cli.command {
        Some(Command::CheckConfig(args)) => return check_config(args),
        None if cli.args.check_config => return check_config(cli.args),
        None => cli.args,
    };
    service::init_logging(args.log_format.into(), "info,openraft=warn");
    let result = merge(args).and_then(|config| {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?;
        runtime.block_on(tributary_broker::server::run(config, shutdown_signal()))?;
        Ok(())
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", service::error_chain(e.as_ref()));
            ExitCode::FAILURE
        }
    }
}
