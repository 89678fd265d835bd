//! `edge-agent`: the on-device agent (`run`), a command-line producer for
//! it (`publish`), certificate enrollment (`enroll`) and a configuration
//! check for deployment pipelines
//! (`check-config`, or `run --check-config`: `ok` and status 0, or one
//! `error:` line per problem and status 1). Errors print one line,
//! `error: ...`, and exit 1.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use broker_core::service;
use clap::{ArgGroup, Args, Parser, Subcommand, ValueEnum};
use tributary_edge::Agent;
use tributary_edge::api;
use tributary_edge::client::{self, LocalClient, OneRecord};
use tributary_edge::config::{self, AgentConfig, Overrides};
use tributary_proto::keys::TopicName;
use tributary_proto::limits::Limits;

/// Tributary edge agent: local ingest API, per-topic WALs under a disk
/// budget, checkpoints of what the central cluster acknowledged.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the agent until SIGTERM or SIGINT.
    Run(RunArgs),
    /// Publish to a running agent through its local API and print the
    /// assigned offsets as JSON.
    Publish(PublishArgs),
    /// Check the configuration (file, flags and environment, as `run`
    /// loads it) without starting: TLS files, the data directory,
    /// addresses. Prints `ok`, or one `error:` line per problem and exits 1.
    CheckConfig(RunArgs),
    /// Get this device's client certificate from a broker with a one-time
    /// enrollment token (`tribctl edges token EDGE_ID`). The key is made
    /// here (mode 0600) and never sent: only a certificate signing request
    /// is. Certificate and key go where the configuration's [tls] says; a
    /// running agent picks them up by itself.
    Enroll(EnrollArgs),
}

#[derive(Debug, Args)]
struct EnrollArgs {
    /// The broker's HTTPS admin address, host:port (a name or address its
    /// certificate carries).
    #[arg(long)]
    broker: String,
    /// The enrollment token, trib-enroll.<edge_id>.<hex> (used once).
    #[arg(long, env = "TRIB_EDGE_ENROLL_TOKEN", hide_env_values = true)]
    token: String,
    /// The cluster CA to verify the broker with (PEM); default tls.ca.
    /// Copied to tls.ca when that file does not exist yet.
    #[arg(long)]
    ca: Option<PathBuf>,
    /// Configuration file: where [tls] cert, key and ca go, and edge_id.
    #[arg(long, short, env = "TRIB_EDGE_CONFIG")]
    config: Option<PathBuf>,
    /// Where the certificate goes (instead of [tls] cert).
    #[arg(long, env = "TRIB_EDGE_TLS_CERT")]
    tls_cert: Option<PathBuf>,
    /// Where the key goes (instead of [tls] key).
    #[arg(long, env = "TRIB_EDGE_TLS_KEY")]
    tls_key: Option<PathBuf>,
    /// The CA file of the agent (instead of [tls] ca).
    #[arg(long, env = "TRIB_EDGE_TLS_CA")]
    tls_ca: Option<PathBuf>,
    /// Enroll even when [tls] cert is a certificate of another edge id:
    /// the device takes the token's identity (refused otherwise).
    #[arg(long)]
    replace_identity: bool,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Args)]
struct RunArgs {
    /// Configuration file (TOML); flags and environment override it.
    #[arg(long, short, env = "TRIB_EDGE_CONFIG")]
    config: Option<PathBuf>,
    /// Check the configuration and exit (as `edge-agent check-config`).
    #[arg(long)]
    check_config: bool,
    /// Data directory (WALs, local metadata).
    #[arg(long, env = "TRIB_EDGE_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// Edge id (= the namespace this agent writes); default: the identity
    /// of the TLS client certificate.
    #[arg(long, env = "TRIB_EDGE_ID")]
    edge_id: Option<String>,
    /// Broker address host:port (repeatable; the environment variable takes
    /// a comma-separated list). Replaces the file's list.
    #[arg(long = "broker", env = "TRIB_EDGE_BROKERS", value_delimiter = ',')]
    brokers: Vec<String>,
    /// Local API address.
    #[arg(long, env = "TRIB_EDGE_LOCAL_API")]
    local_api: Option<SocketAddr>,
    /// Client certificate chain (PEM).
    #[arg(long, env = "TRIB_EDGE_TLS_CERT")]
    tls_cert: Option<PathBuf>,
    /// Client private key (PEM).
    #[arg(long, env = "TRIB_EDGE_TLS_KEY")]
    tls_key: Option<PathBuf>,
    /// CA certificate the brokers chain to (PEM).
    #[arg(long, env = "TRIB_EDGE_TLS_CA")]
    tls_ca: Option<PathBuf>,
    /// Agent-wide disk budget, bytes.
    #[arg(
        long,
        env = "TRIB_EDGE_DISK_BUDGET_BYTES",
        allow_negative_numbers = true
    )]
    disk_budget_bytes: Option<u64>,
    /// Replication bandwidth cap, bytes per second.
    #[arg(
        long,
        env = "TRIB_EDGE_BANDWIDTH_CAP_BYTES_PER_S",
        allow_negative_numbers = true
    )]
    bandwidth_cap_bytes_per_s: Option<u64>,
    /// Log format on stderr; the level comes from RUST_LOG (default info).
    #[arg(long, env = "TRIB_EDGE_LOG_FORMAT", value_enum, default_value = "text")]
    log_format: LogFormat,
}

#[derive(Debug, Args)]
#[command(group(ArgGroup::new("source").required(true).args(["value", "file", "ndjson"])))]
struct PublishArgs {
    /// Topic, /{ns}/{topic}.
    #[arg(long)]
    topic: String,
    /// Record key (UTF-8).
    #[arg(long, conflicts_with = "ndjson")]
    key: Option<String>,
    /// Record header name=value (repeatable).
    #[arg(long = "header", conflicts_with = "ndjson")]
    headers: Vec<String>,
    /// The record value as text.
    value: Option<String>,
    /// Read the record value from this file (bytes as they are).
    #[arg(long)]
    file: Option<PathBuf>,
    /// Publish this NDJSON file as one batch (one JSON object per line).
    #[arg(long)]
    ndjson: Option<PathBuf>,
    /// Local API address of the agent.
    #[arg(long, env = "TRIB_EDGE_LOCAL_API")]
    local_api: Option<SocketAddr>,
    /// Read the local API address from this agent configuration file.
    #[arg(long, short, env = "TRIB_EDGE_CONFIG")]
    config: Option<PathBuf>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) if args.check_config => return check_config(&args),
        Command::CheckConfig(args) => return check_config(&args),
        Command::Run(args) => run(args),
        Command::Publish(args) => publish(args),
        Command::Enroll(args) => enroll(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", service::error_chain(e.as_ref()));
            ExitCode::FAILURE
        }
    }
}

impl From<LogFormat> for service::LogFormat {
    fn from(format: LogFormat) -> service::LogFormat {
        match format {
            LogFormat::Text => service::LogFormat::Text,
            LogFormat::Json => service::LogFormat::Json,
        }
    }
}

fn overrides(args: &RunArgs) -> Overrides {
    Overrides {
        data_dir: args.data_dir.clone(),
        edge_id: args.edge_id.clone(),
        brokers: args.brokers.clone(),
        local_api: args.local_api,
        tls_cert: args.tls_cert.clone(),
        tls_key: args.tls_key.clone(),
        tls_ca: args.tls_ca.clone(),
        disk_budget_bytes: args.disk_budget_bytes,
        bandwidth_cap_bytes_per_s: args.bandwidth_cap_bytes_per_s,
    }
}

/// `check-config`: `ok`, or every problem (one line each) and status 1.
fn check_config(args: &RunArgs) -> ExitCode {
    tributary_edge::check::check(args.config.as_deref(), &overrides(args)).finish()
}

fn run(args: RunArgs) -> anyhow::Result<()> {
    service::init_logging(args.log_format.into(), "info");
    let config = AgentConfig::load(args.config.as_deref(), &overrides(&args))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async {
        let agent = Agent::start(config).await?;
        service::notify_ready();
        let watchdog = tokio::spawn(service::watchdog_loop());
        service::shutdown_signal().await?;
        service::notify_stopping();
        watchdog.abort();
        agent.shutdown().await?;
        Ok(())
    })
}

fn enroll(args: EnrollArgs) -> anyhow::Result<()> {
    let file = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            config::parse_file(path, &text)?
        }
        None => config::FileConfig::default(),
    };
    let overrides = Overrides {
        tls_cert: args.tls_cert,
        tls_key: args.tls_key,
        tls_ca: args.tls_ca,
        ..Overrides::default()
    };
    let options = tributary_edge::enroll::EnrollOptions {
        broker: args.broker,
        token: args.token,
        ca: args.ca,
        tls: config::enroll_paths(file.tls.as_ref(), &overrides)?,
        edge_id: file.edge_id,
        replace_identity: args.replace_identity,
    };
    let enrolled = tributary_edge::enroll::enroll(&options)?;
    println!(
        "enrolled edge {}: certificate {} (serial {}, valid until {}), key {}",
        enrolled.edge_id,
        enrolled.cert.display(),
        enrolled.serial,
        enrolled.not_after,
        enrolled.key.display()
    );
    if let Some(ca) = &enrolled.ca_written {
        println!("CA: {}", ca.display());
    }
    Ok(())
}

fn local_api(args: &PublishArgs) -> anyhow::Result<SocketAddr> {
    if let Some(addr) = args.local_api {
        return Ok(addr);
    }
    if let Some(path) = &args.config {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        if let Some(addr) = config::parse_file(path, &text)?.local_api {
            return Ok(addr);
        }
    }
    Ok(config::DEFAULT_LOCAL_API.parse()?)
}

/// Reads `path` whole, up to `max` bytes: a larger file (or an endless one,
/// like `/dev/zero`) is refused once `max` is passed, naming the limit
/// `what`, instead of being read into memory.
fn read(path: &Path, max: usize, what: &str) -> anyhow::Result<Vec<u8>> {
    use std::io::Read as _;
    let file = std::fs::File::open(path).with_context(|| format!("reading {}", path.display()))?;
    let mut bytes = Vec::new();
    file.take(max as u64 + 1)
        .read_to_end(&mut bytes)
        .with_context(|| format!("reading {}", path.display()))?;
    if bytes.len() > max {
        anyhow::bail!(
            "{} is over {max} bytes, the most an edge agent accepts as {what}",
            path.display()
        );
    }
    Ok(bytes)
}

fn publish(args: PublishArgs) -> anyhow::Result<()> {
    let topic = TopicName::new(&args.topic).context("--topic")?;
    let client = LocalClient::new(local_api(&args)?);
    let response = if let Some(path) = &args.ndjson {
        let max = Limits::default().max_batch_bytes as usize * api::BATCH_BODY_FACTOR;
        client.publish_ndjson(
            &topic,
            &read(path, max, "one NDJSON request (4 × max_batch_bytes)")?,
        )
    } else {
        let value = match (&args.value, &args.file) {
            (Some(text), _) => text.clone().into_bytes(),
            (None, Some(path)) => read(
                path,
                Limits::default().max_record_bytes as usize,
                "one record value (max_record_bytes, which the record's key, headers and lengths count against too)",
            )?,
            (None, None) => anyhow::bail!("give VALUE, --file or --ndjson"),
        };
        let headers = args
            .headers
            .iter()
            .map(|h| client::parse_header(h))
            .collect::<Result<Vec<_>, _>>()?;
        let record = OneRecord {
            key: args.key.clone(),
            headers,
            value,
        };
        client.publish_record(&topic, &record)
    }
    .map_err(|e| anyhow::anyhow!(client::describe_failure(client.addr(), &e)))?;
    println!("{}", serde_json::to_string(&response)?);
    Ok(())
}
