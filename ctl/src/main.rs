//! `tribctl`: Tributary's admin CLI and archive browser.
//!
//! Admin commands talk to the broker's admin HTTP API (`docs/admin-api.md`)
//! at `--admin-url` (env `TRIB_ADMIN_URL`, default
//! `https://127.0.0.1:7400`, verified against the cluster CA of `--ca`) with
//! the bearer token from `--token` (env `TRIB_ADMIN_TOKEN`). Errors print one `error: …` line per problem to
//! stderr and exit with status 1 (2 for command-line usage errors).

mod archive;
mod certs;
mod client;
mod commands;

use std::io::Write;
use std::process::ExitCode;

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

use crate::commands::apply::ApplyArgs;
use crate::commands::cluster::ClusterCommand;
use crate::commands::namespaces::NamespacesCommand;
use crate::commands::topics::TopicsCommand;
use crate::commands::{CommandError, Context, OutputFormat};

/// Tributary admin CLI: certificates, topics, failure policies, declarative
/// apply, archive browsing.
#[derive(Debug, Parser)]
#[command(name = "tribctl", version, about)]
struct Cli {
    /// Base URL of the broker's admin API.
    #[arg(
        long,
        env = "TRIB_ADMIN_URL",
        default_value = "https://127.0.0.1:7400",
        global = true,
        value_parser = parse_admin_url
    )]
    admin_url: String,
    /// The cluster CA (PEM) the broker's certificate must chain to;
    /// required for an https:// --admin-url (no system roots are trusted).
    #[arg(long, env = "TRIB_CA", global = true)]
    ca: Option<std::path::PathBuf>,
    /// Client certificate (PEM) to present to the broker; with
    /// --client-key.
    #[arg(long, env = "TRIB_CLIENT_CERT", global = true, requires = "client_key")]
    client_cert: Option<std::path::PathBuf>,
    /// Private key (PEM, not world-readable) of --client-cert.
    #[arg(long, env = "TRIB_CLIENT_KEY", global = true, requires = "client_cert")]
    client_key: Option<std::path::PathBuf>,
    /// Bearer token of the admin API.
    #[arg(long, env = "TRIB_ADMIN_TOKEN", hide_env_values = true, global = true)]
    token: Option<String>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = OutputFormat::Text, global = true)]
    output: OutputFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create a development CA and broker/edge certificates (rcgen).
    Certs(certs::CertsArgs),
    /// Topics: create with an intent, describe, list, delete, failure
    /// policies.
    #[command(subcommand)]
    Topics(TopicsCommand),
    /// Namespaces: create, list.
    #[command(subcommand)]
    Namespaces(NamespacesCommand),
    /// Apply a declarative manifest: all of it or nothing.
    Apply(ApplyArgs),
    /// Cluster status.
    #[command(subcommand)]
    Cluster(ClusterCommand),
    /// Principals, tokens, role bindings and roles.
    #[command(subcommand)]
    Auth(commands::auth::AuthCommand),
    /// Edges: the fleet list, enrollment tokens (`edge-agent enroll`) and
    /// revocation.
    #[command(subcommand)]
    Edges(commands::edges::EdgesCommand),
    /// Browse, read, verify and export an archive bucket (no broker
    /// needed).
    Archive(Box<archive::ArchiveArgs>),
}

/// An admin URL with its scheme: `https://host:port` (or `http://` for a
/// broker's plain-HTTP loopback API), refused otherwise with the fix.
fn parse_admin_url(url: &str) -> Result<String, String> {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"));
    match rest {
        Some(host) if !host.is_empty() && !host.starts_with('/') => Ok(url.to_owned()),
        Some(_) => Err("no host after the scheme".to_owned()),
        None => Err(format!(
            "give the scheme: https://{url} (or http:// for a broker's plain-HTTP loopback API)"
        )),
    }
}

fn run(cli: &Cli, admin_url_given: bool) -> anyhow::Result<String> {
    if cli.client_cert.is_some() && cli.ca.is_none() {
        anyhow::bail!("--client-cert needs --ca (the cluster CA that signed the broker)");
    }
    client::set_tls(cli.ca.clone().map(|ca| tributary_api::client::ClientTls {
        ca,
        client_cert: cli.client_cert.clone().zip(cli.client_key.clone()),
    }));
    let ctx = Context {
        admin_url: &cli.admin_url,
        token: cli.token.as_deref(),
        output: cli.output,
    };
    Ok(match &cli.command {
        Command::Certs(args) => certs::run(args)?,
        Command::Topics(command) => commands::topics::run(&ctx, command)?,
        Command::Namespaces(command) => commands::namespaces::run(&ctx, command)?,
        Command::Apply(args) => commands::apply::run(&ctx, args)?,
        Command::Cluster(command) => commands::cluster::run(&ctx, command)?,
        Command::Auth(command) => commands::auth::run(&ctx, command)?,
        Command::Edges(command) => commands::edges::run(&ctx, command)?,
        Command::Archive(args) => {
            let broker = archive::BrokerAccess {
                admin_url: &cli.admin_url,
                admin_url_given,
                token: cli.token.as_deref(),
            };
            archive::run(args, cli.output, &broker)?;
            String::new()
        }
    })
}

/// Prints `err` to stderr: one line per manifest issue, else one line.
fn report(err: &anyhow::Error) {
    let mut stderr = std::io::stderr().lock();
    let issues = match err.downcast_ref() {
        Some(CommandError::Client(error)) => client::manifest_issues(error),
        _ => Vec::new(),
    };
    if !issues.is_empty() {
        for issue in &issues {
            let _ = writeln!(stderr, "error: {issue}");
        }
        let _ = writeln!(stderr, "error: nothing applied");
    } else {
        // Each cause said once (many put their source in their own text).
        let _ = writeln!(
            stderr,
            "error: {}",
            broker_core::service::error_chain(err.as_ref())
        );
    }
}

/// The command line: `archive`'s bucket options (`--bucket`, `--prefix`,
/// `--s3-*`) are global, so they may follow its subcommand too
/// (`tribctl archive ls --bucket DIR`).
fn command() -> clap::Command {
    Cli::command().mut_subcommand("archive", |archive| {
        archive.mut_args(|arg| {
            if arg.is_positional() {
                arg
            } else {
                arg.global(true)
            }
        })
    })
}

fn main() -> ExitCode {
    let matches = command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    // `archive verify --against-descriptors` must not compare with a
    // defaulted broker address.
    let admin_url_given = matches
        .value_source("admin_url")
        .is_some_and(|source| source != ValueSource::DefaultValue);
    match run(&cli, admin_url_given) {
        Ok(text) => match std::io::stdout().lock().write_all(text.as_bytes()) {
            Ok(()) => ExitCode::SUCCESS,
            // A closed pipe (`tribctl … | head`) is not worth a message.
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
            Err(e) => {
                report(&anyhow::Error::new(e).context("cannot write to stdout"));
                ExitCode::FAILURE
            }
        },
        Err(err) => {
            report(&err);
            ExitCode::FAILURE
        }
    }
}
