//! `tribctl`: Tributary's admin CLI and archive browser.

mod certs;

use clap::{Parser, Subcommand};

/// Tributary admin CLI: certificates, topics, failure policies, declarative
/// apply, archive browsing.
#[derive(Debug, Parser)]
#[command(name = "tribctl", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create a development CA and broker/edge certificates (rcgen).
    Certs(certs::CertsArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Certs(args) => certs::run(&args),
    }
}
