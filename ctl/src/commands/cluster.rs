//! `tribctl cluster status`: the Raft cluster as the broker sees it
//! (leader, term, members, applied/snapshot/purged indexes).

use std::collections::BTreeMap;

use clap::Subcommand;
use serde::Deserialize;

use super::{CommandError, Context};

/// `tribctl cluster …`.
#[derive(Debug, Subcommand)]
pub enum ClusterCommand {
    /// Leader, term, members, last applied index.
    Status,
}

/// The cluster status as the admin API returns it (a mirror of the
/// broker's `ClusterStatus`; unknown fields are ignored).
#[derive(Debug, Deserialize)]
struct ClusterStatus {
    node_id: u64,
    leader: Option<u64>,
    term: u64,
    #[serde(default)]
    members: BTreeMap<u64, String>,
    last_applied_index: Option<u64>,
    #[serde(default)]
    snapshot_index: Option<u64>,
    #[serde(default)]
    purged_index: Option<u64>,
    state: String,
}

/// Runs `tribctl cluster …`.
///
/// # Errors
/// [`CommandError`].
pub fn run(ctx: &Context<'_>, command: &ClusterCommand) -> Result<String, CommandError> {
    let client = ctx.client()?;
    match command {
        ClusterCommand::Status => {
            let value = client.get("/v1/cluster/status", &[])?;
            ctx.render(value, |s: ClusterStatus| {
                let index = |i: Option<u64>| i.map_or_else(|| "none".to_owned(), |i| i.to_string());
                let mut text = format!(
                    "Node ID: {}\nState: {}\nLeader: {}\nTerm: {}\nLast applied index: {}\n\
                     Snapshot index: {}\nPurged index: {}\nMembers:\n",
                    s.node_id,
                    s.state,
                    s.leader
                        .map_or_else(|| "unknown".to_owned(), |l| l.to_string()),
                    s.term,
                    index(s.last_applied_index),
                    index(s.snapshot_index),
                    index(s.purged_index),
                );
                for (id, addr) in &s.members {
                    text.push_str(&format!("  {id} {addr}\n"));
                }
                text
            })
        }
    }
}
