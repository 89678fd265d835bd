//! `tribctl cluster …`: `status`, the Raft cluster as the broker sees it
//! (leader, term, members, applied/snapshot/purged indexes) and the brokers
//! with their lease and topic counts; `rebalance`, evening out topic counts
//! across live brokers.

use std::collections::BTreeMap;

use clap::Subcommand;
use serde::Deserialize;
use tributary_api::client::Method;
use tributary_api::cluster::{BrokerView, RebalanceRequest, RebalanceResponse};

use super::{CommandError, Context};

/// `tribctl cluster …`.
#[derive(Debug, Subcommand)]
pub enum ClusterCommand {
    /// Leader, term, members, last applied index; brokers with their lease
    /// age, topics owned and lifecycle.
    Status,
    /// Move topics from the most to the least loaded live brokers (topic
    /// counts, with the load manager's hysteresis), e.g. after a broker
    /// joined. Admin API `POST /v1/cluster/rebalance`.
    Rebalance {
        /// Only print the moves; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Most moves (default 16; at least 1).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        max_moves: Option<u32>,
    },
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
    /// The cluster's id (`/cluster/id`); absent from older brokers, `null`
    /// while unreadable.
    #[serde(default)]
    cluster_id: Option<String>,
    /// Absent from a broker without topic ownership.
    #[serde(default)]
    brokers: Option<Vec<BrokerView>>,
}

/// The brokers table of `cluster status`: every broker holding a lease,
/// then each Raft member without one (its lease lapsed: down, or cut off
/// from the majority), so a dead broker stays in the table as not live.
fn brokers_text(brokers: &[BrokerView], members: &BTreeMap<u64, String>) -> String {
    let mut text = format!(
        "Brokers:\n  {:<4} {:<22} {:<30} {:<5} {:>13} {:>6} {}\n",
        "ID", "INGEST", "ADMIN URL", "LIVE", "LEASE AGE MS", "TOPICS", "LIFECYCLE"
    );
    for b in brokers {
        text.push_str(&format!(
            "  {:<4} {:<22} {:<30} {:<5} {:>13} {:>6} {}\n",
            b.broker_id,
            b.ingest_addr,
            b.admin_url,
            if b.live { "yes" } else { "no" },
            b.lease_age_ms,
            b.topics_owned,
            b.lifecycle
        ));
    }
    for id in members.keys() {
        if brokers.iter().all(|b| b.broker_id != *id) {
            text.push_str(&format!(
                "  {:<4} {:<22} {:<30} {:<5} {:>13} {:>6} {}\n",
                id, "-", "-", "no", "-", "-", "no lease (a Raft member whose lease lapsed)"
            ));
        }
    }
    text
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
                    "Cluster ID: {}\nNode ID: {}\nState: {}\nLeader: {}\nTerm: {}\n\
                     Last applied index: {}\nSnapshot index: {}\nPurged index: {}\nMembers:\n",
                    s.cluster_id.as_deref().unwrap_or("unknown"),
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
                if let Some(brokers) = &s.brokers {
                    text.push_str(&brokers_text(brokers, &s.members));
                }
                text
            })
        }
        ClusterCommand::Rebalance { dry_run, max_moves } => {
            let body = RebalanceRequest {
                dry_run: *dry_run,
                max_moves: max_moves.map(|n| n as usize),
            };
            let value = client.send_json(
                Method::Post,
                "/v1/cluster/rebalance",
                &serde_json::json!(body),
            )?;
            ctx.render(value, |r: RebalanceResponse| {
                let verb = if r.dry_run { "would move" } else { "moved" };
                let mut text = String::new();
                for m in &r.moves {
                    let from = m
                        .from
                        .map_or_else(|| "no owner".to_owned(), |b| format!("broker {b}"));
                    text.push_str(&format!(
                        "{verb} {} from {from} to broker {} (epoch {})\n",
                        m.topic, m.to, m.epoch
                    ));
                }
                if r.moves.is_empty() {
                    text.push_str("balanced: nothing to move\n");
                } else {
                    text.push_str(&format!(
                        "{} topic(s) {}\n",
                        r.moves.len(),
                        if r.dry_run {
                            "would move (dry run)"
                        } else {
                            "moved"
                        }
                    ));
                }
                text
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_without_a_lease_stays_in_the_brokers_table_as_not_live() {
        let live = BrokerView {
            broker_id: 1,
            ingest_addr: "127.0.0.1:7401".into(),
            admin_url: "https://127.0.0.1:7400".into(),
            live: true,
            lifecycle: "active".into(),
            lease_age_ms: 120,
            topics_owned: 2,
            bytes_in_per_s: 0,
        };
        let members: BTreeMap<u64, String> = [(1, "a".to_string()), (3, "c".to_string())]
            .into_iter()
            .collect();
        let text = brokers_text(&[live], &members);
        let rows: Vec<Vec<&str>> = text
            .lines()
            .skip(2)
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(rows.len(), 2, "{text}");
        assert_eq!(
            rows[0][..4],
            ["1", "127.0.0.1:7401", "https://127.0.0.1:7400", "yes"]
        );
        assert_eq!(rows[1][..6], ["3", "-", "-", "no", "-", "-"], "{text}");
        assert!(
            text.ends_with("no lease (a Raft member whose lease lapsed)\n"),
            "{text}"
        );
    }
}
