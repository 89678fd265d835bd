//! `tier-service`: seals old WAL segments into object storage and records
//! their descriptors in Raft.

use clap::Parser;

/// Tributary tier service: seal → upload → verify → commit descriptor → trim.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    /// The broker data directory whose sealed segments are tiered.
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
        "tier-service is not implemented yet (data dir {})",
        cli.data_dir.display()
    )
}
