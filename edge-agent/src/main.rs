//! `edge-agent`: the on-device broker. Keeps a per-topic write-ahead log and
//! replicates it to the central cluster over QUIC.

use clap::Parser;

/// Tributary edge agent: local ingest, per-topic WAL, replication to the
/// central cluster.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    /// Data directory holding the per-topic WALs and checkpoints.
    #[arg(long, env = "TRIB_DATA_DIR", default_value = "/var/lib/tributary-edge")]
    data_dir: std::path::PathBuf,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    anyhow::bail!(
        "edge-agent is not implemented yet (data dir {})",
        cli.data_dir.display()
    )
}
