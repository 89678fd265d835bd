//! `tier-service`: seals old WAL segments of a broker into object storage
//! and records their descriptors in Raft through the broker's admin API.
//! Library and design: `tributary_tier` (`tier-service/src/lib.rs`).
//! `tier-service check-config` (or `--check-config`) checks a
//! configuration and exits: `ok` and status 0, or one `error:` line per
//! problem and status 1.

use std::path::PathBuf;
use std::process::ExitCode;

use broker_core::service::{RenamedEnv, error_chain, legacy_env};
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use tributary_archive::StoreConfig;
use tributary_tier::config::TierConfig;
use tributary_tier::faults::Faults;
use tributary_tier::service;

/// Tributary tier service: seal → upload → verify → commit descriptor → trim.
#[derive(Debug, Parser)]
#[command(version, about, args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    args: TierArgs,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Check the configuration (file, flags and environment) without
    /// starting: TLS files, token, data directory, bucket, addresses.
    /// Prints `ok`, or one `error:` line per problem and exits 1.
    CheckConfig(Box<TierArgs>),
}

/// The bucket flag's environment variable for the tier service (the
/// archive crate's own, shared with `tribctl`, is the old name).
const BUCKET_ENV: &str = "TRIB_TIER_BUCKET";

/// Environment variables renamed to `TRIB_TIER_*`; the old names are
/// still read, with a warning.
const RENAMED_ENV: &[RenamedEnv] = &[
    RenamedEnv {
        arg: "data_dir",
        new: "TRIB_TIER_DATA_DIR",
        old: "TRIB_DATA_DIR",
    },
    RenamedEnv {
        arg: "broker_url",
        new: "TRIB_TIER_BROKER_URL",
        old: "TRIB_ADMIN_URL",
    },
    RenamedEnv {
        arg: "broker_ca",
        new: "TRIB_TIER_BROKER_CA",
        old: "TRIB_CA",
    },
    RenamedEnv {
        arg: "broker_cert",
        new: "TRIB_TIER_BROKER_CERT",
        old: "TRIB_CLIENT_CERT",
    },
    RenamedEnv {
        arg: "broker_key",
        new: "TRIB_TIER_BROKER_KEY",
        old: "TRIB_CLIENT_KEY",
    },
    RenamedEnv {
        arg: "token_file",
        new: "TRIB_TIER_TOKEN_FILE",
        old: "TRIB_ADMIN_TOKEN_FILE",
    },
    RenamedEnv {
        arg: "token",
        new: "TRIB_TIER_TOKEN",
        old: "TRIB_ADMIN_TOKEN",
    },
    RenamedEnv {
        arg: "url",
        new: BUCKET_ENV,
        old: "TRIB_ARCHIVE_BUCKET",
    },
];

#[derive(Debug, Args)]
struct TierArgs {
    /// TOML configuration file (flags and environment override it).
    #[arg(long, short = 'c', env = "TRIB_TIER_CONFIG")]
    config: Option<PathBuf>,
    /// Check the configuration and exit (as `tier-service check-config`).
    #[arg(long)]
    check_config: bool,
    /// The broker data directory whose sealed segments are tiered.
    #[arg(long, env = "TRIB_TIER_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// Storage prefix of keys and objects (default /tributary).
    #[arg(long)]
    prefix: Option<String>,
    /// Base URL of the broker's admin API (default https://127.0.0.1:7400).
    #[arg(long, env = "TRIB_TIER_BROKER_URL")]
    broker_url: Option<String>,
    /// The cluster CA (PEM) the broker's certificate must chain to
    /// (required for an https:// broker URL).
    #[arg(long, env = "TRIB_TIER_BROKER_CA")]
    broker_ca: Option<PathBuf>,
    /// Client certificate (PEM) presented to the broker; with --broker-key.
    #[arg(long, env = "TRIB_TIER_BROKER_CERT", requires = "broker_key")]
    broker_cert: Option<PathBuf>,
    /// Private key (PEM, not world-readable) of --broker-cert.
    #[arg(long, env = "TRIB_TIER_BROKER_KEY", requires = "broker_cert")]
    broker_key: Option<PathBuf>,
    /// File holding the bearer token (must not be world-readable).
    #[arg(long, env = "TRIB_TIER_TOKEN_FILE")]
    token_file: Option<PathBuf>,
    /// Bearer token of the admin API.
    #[arg(long, env = "TRIB_TIER_TOKEN", hide_env_values = true)]
    token: Option<String>,
    #[command(flatten)]
    store: StoreConfig,
    /// Pause between passes, ms.
    #[arg(long)]
    poll_interval_ms: Option<u64>,
    /// Address of the `GET /metrics` listener (default 127.0.0.1:7600).
    #[arg(long, env = "TRIB_TIER_METRICS_LISTEN")]
    metrics_listen: Option<std::net::SocketAddr>,
    /// Objects at least this large go up as multipart uploads, bytes.
    #[arg(long)]
    multipart_threshold_bytes: Option<u64>,
    /// Multipart part size, bytes.
    #[arg(long)]
    part_size_bytes: Option<usize>,
    /// Also read back every uploaded object's batches and check their CRC.
    #[arg(long)]
    full_verify: bool,
    /// Reconcile, tier everything sealed once, then exit (status 1 if
    /// anything failed).
    #[arg(long)]
    once: bool,
    /// Log format.
    #[arg(long, value_parser = ["text", "json"], default_value = "text")]
    log_format: String,
}

fn load(cli: TierArgs) -> Result<TierConfig, String> {
    let mut config = match &cli.config {
        Some(path) => TierConfig::from_file(path).map_err(|e| e.to_string())?,
        None => {
            let data_dir = cli
                .data_dir
                .clone()
                .ok_or("--data-dir (or a --config file) is required")?;
            TierConfig::new(data_dir)
        }
    };
    if let Some(dir) = cli.data_dir {
        config.data_dir = dir;
    }
    if let Some(prefix) = cli.prefix {
        config.prefix = prefix;
    }
    if let Some(url) = cli.broker_url {
        config.broker.url = url;
    }
    if let Some(token) = cli.token {
        config.broker.token = Some(token);
    }
    if let Some(path) = cli.token_file {
        config.broker.token_file = Some(path);
    }
    if let Some(ca) = cli.broker_ca {
        config.broker.ca = Some(ca);
    }
    if let Some(cert) = cli.broker_cert {
        config.broker.cert = Some(cert);
    }
    if let Some(key) = cli.broker_key {
        config.broker.key = Some(key);
    }
    config.store = cli.store.or(config.store);
    if let Some(ms) = cli.poll_interval_ms {
        config.poll_interval_ms = ms;
    }
    if let Some(addr) = cli.metrics_listen {
        config.metrics_listen = addr;
    }
    if let Some(bytes) = cli.multipart_threshold_bytes {
        config.upload.multipart_threshold_bytes = bytes;
    }
    if let Some(bytes) = cli.part_size_bytes {
        config.upload.part_size_bytes = bytes;
    }
    config.upload.full_verify |= cli.full_verify;
    Ok(config)
}

/// Resolves on SIGTERM or SIGINT (at once if no handler can be installed).
async fn shutdown_signal() {
    if let Err(e) = broker_core::service::shutdown_signal().await {
        tracing::error!(error = %e, "no shutdown signal; stopping");
    }
    tracing::info!("shutdown requested; finishing the current segment");
}

/// Parses the command line: the bucket flag reads `TRIB_TIER_BUCKET`, and
/// a renamed environment variable set under its old name only is read
/// under that name (with a warning).
fn parse_cli() -> Cli {
    let mut command = Cli::command()
        .mut_arg("url", |a| a.env(BUCKET_ENV))
        .mut_subcommand("check-config", |s| s.mut_arg("url", |a| a.env(BUCKET_ENV)));
    for renamed in legacy_env(RENAMED_ENV) {
        command = command
            .mut_arg(renamed.arg, |a| a.env(renamed.old))
            .mut_subcommand("check-config", |s| {
                s.mut_arg(renamed.arg, |a| a.env(renamed.old))
            });
    }
    Cli::from_arg_matches(&command.get_matches()).unwrap_or_else(|e| e.exit())
}

/// `check-config`: `ok`, or every problem (one line each) and status 1.
fn check_config(args: TierArgs) -> ExitCode {
    match load(args) {
        Ok(config) => {
            let mut report = tributary_tier::check::check(&config);
            // The archive owner needs a valid configuration and the broker.
            if report.problems().is_empty() {
                match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => {
                        runtime.block_on(tributary_tier::check::check_owner(&config, &mut report))
                    }
                    Err(e) => report.note(format!("archive owner not checked: tokio runtime: {e}")),
                }
            }
            report.finish()
        }
        Err(e) => {
            let mut report = broker_core::check::Report::new();
            report.problem(e);
            report.finish()
        }
    }
}

fn main() -> ExitCode {
    let cli = parse_cli();
    let args = match cli.command {
        Some(Command::CheckConfig(args)) => return check_config(*args),
        None if cli.args.check_config => return check_config(cli.args),
        None => cli.args,
    };
    let log_format = match args.log_format.as_str() {
        "json" => broker_core::service::LogFormat::Json,
        _ => broker_core::service::LogFormat::Text,
    };
    broker_core::service::init_logging(log_format, "info");
    let once = args.once;
    let config = match load(args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let faults = match Faults::from_env() {
        Ok(f) => f,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: tokio runtime: {}", error_chain(&e));
            return ExitCode::FAILURE;
        }
    };
    // One shutdown signal for both the service and the metrics listener.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let wait = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|&s| s).await;
    };
    if !once {
        // Bound before anything runs: without its metrics and health
        // listener the service does not start (as the broker and the edge
        // agent do not).
        let listener = match runtime.block_on(tributary_tier::metrics::bind(config.metrics_listen))
        {
            Ok(listener) => listener,
            Err(e) => {
                eprintln!("error: {}", error_chain(&e));
                return ExitCode::FAILURE;
            }
        };
        runtime.spawn(tributary_tier::metrics::serve(
            listener,
            wait(stop_rx.clone()),
        ));
    }
    runtime.spawn(async move {
        shutdown_signal().await;
        let _ = stop_tx.send(true);
    });
    match runtime.block_on(service::run(config, faults, once, wait(stop_rx))) {
        Ok(report) if once && report.has_errors() => ExitCode::FAILURE,
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", error_chain(&e));
            ExitCode::FAILURE
        }
    }
}
