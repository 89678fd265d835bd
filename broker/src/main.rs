//! `broker`: the central ingestion node. Stores what edges send, keeps
//! metadata in Raft and serves consumers and the admin API.

use clap::Parser;

/// Tributary broker: QUIC ingest, central WALs, Raft metadata, admin API.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    /// Data directory for central WALs and Raft state.
    #[arg(
        long,
        env = "TRIB_DATA_DIR",
        default_value = "/var/lib/tributary-broker"
    )]
    data_dir: std::path::PathBuf,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    anyhow::bail!(
        "broker is not implemented yet (data dir {})",
        cli.data_dir.display()
    )
}
