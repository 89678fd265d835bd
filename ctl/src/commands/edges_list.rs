//! `tribctl edges list [EDGE...]`: every edge the cluster knows (admin API
//! `GET /v1/edges`, whichever broker answers): whether it is connected and
//! since when, when it was last seen, the brokers it holds connections to
//! and its remote address; under each edge, its topics with the broker the
//! stream runs on, the edge's own high-water mark, what the broker
//! acknowledged and the lag between them. `--output json` prints the API's
//! answer ([`tributary_api::fleet::EdgeList`]).
//!
//! Text layout (columns as wide as their widest cell, times RFC 3339 UTC):
//!
//! ```text
//! EDGE    CONNECTED  SINCE                     LAST SEEN                 BROKERS  REMOTE
//! plant1  yes        2026-12-01T10:00:00.123Z  now                       1        10.0.0.7:41234
//!   TOPIC             BROKER  EDGE HWM  ACKNOWLEDGED  LAG
//!   /plant1/readings  1       1000      990           10
//! ```

use clap::Args;
use tributary_api::fleet::{EdgeList, EdgeView};
use tributary_lakehouse::time::rfc3339_ms;

use super::{CommandError, Context};

/// `tribctl edges list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// Only these edges (by id); default every edge.
    pub edges: Vec<String>,
}

/// Runs `tribctl edges list`.
///
/// # Errors
/// [`CommandError`].
pub fn list(ctx: &Context<'_>, args: &ListArgs) -> Result<String, CommandError> {
    let mut value = ctx.client()?.get("/v1/edges", &[])?;
    if !args.edges.is_empty()
        && let Some(edges) = value.get_mut("edges").and_then(|e| e.as_array_mut())
    {
        edges.retain(|e| {
            e["edge_id"]
                .as_str()
                .is_some_and(|id| args.edges.iter().any(|wanted| wanted == id))
        });
    }
    ctx.render(value, |list: EdgeList| table(&list.edges))
}

fn time(ms: u64) -> String {
    i64::try_from(ms)
        .ok()
        .and_then(rfc3339_ms)
        .unwrap_or_else(|| ms.to_string())
}

fn or_dash(value: Option<u64>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

/// `rows` as lines of columns as wide as their widest cell, each line
/// starting with `indent`.
fn columns(rows: &[Vec<String>], indent: &str) -> String {
    let mut widths: Vec<usize> = Vec::new();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if widths.len() <= i {
                widths.push(0);
            }
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        let mut line = indent.to_owned();
        for (i, cell) in row.iter().enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<width$}  ", width = widths[i]));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// The text form of `edges`.
fn table(edges: &[EdgeView]) -> String {
    if edges.is_empty() {
        return "no edges known\n".to_owned();
    }
    let header = |cells: &[&str]| cells.iter().map(|c| (*c).to_owned()).collect::<Vec<_>>();
    let mut rows = vec![header(&[
        "EDGE",
        "CONNECTED",
        "SINCE",
        "LAST SEEN",
        "BROKERS",
        "REMOTE",
    ])];
    for e in edges {
        rows.push(vec![
            e.edge_id.clone(),
            if e.connected { "yes" } else { "no" }.to_owned(),
            time(e.since_ms),
            if e.connected {
                "now".to_owned()
            } else {
                time(e.last_seen_ms)
            },
            if e.brokers.is_empty() {
                "-".to_owned()
            } else {
                e.brokers
                    .iter()
                    .map(u64::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            },
            e.remote_addr.clone(),
        ]);
    }
    // Edge rows first (aligned together), each followed by its topics.
    let edge_lines = columns(&rows, "");
    let mut lines = edge_lines.lines();
    let mut out = String::new();
    if let Some(head) = lines.next() {
        out.push_str(head);
        out.push('\n');
    }
    for (e, line) in edges.iter().zip(lines) {
        out.push_str(line);
        out.push('\n');
        if e.topics.is_empty() {
            continue;
        }
        let mut topic_rows = vec![header(&[
            "TOPIC",
            "BROKER",
            "EDGE HWM",
            "ACKNOWLEDGED",
            "LAG",
        ])];
        for t in &e.topics {
            topic_rows.push(vec![
                t.topic.clone(),
                t.broker_id.to_string(),
                or_dash(t.edge_high_water_mark),
                t.acknowledged_offset.to_string(),
                or_dash(t.lag_records),
            ]);
        }
        out.push_str(&columns(&topic_rows, "  "));
    }
    out
}

#[cfg(test)]
mod tests {
    use tributary_api::fleet::TopicView;

    use super::*;

    #[test]
    fn edges_and_their_topics_print_in_aligned_columns() {
        let edges = vec![
            EdgeView {
                edge_id: "plant1".into(),
                connected: true,
                since_ms: 1_764_583_200_123,
                last_seen_ms: 1_764_583_300_000,
                brokers: vec![1, 3],
                last_broker: 3,
                remote_addr: "10.0.0.7:41234".into(),
                topics: vec![TopicView {
                    topic: "/plant1/readings".into(),
                    broker_id: 1,
                    edge_high_water_mark: Some(1000),
                    acknowledged_offset: 990,
                    lag_records: Some(10),
                    updated_ms: 0,
                }],
            },
            EdgeView {
                edge_id: "press-12".into(),
                connected: false,
                since_ms: 1_764_583_000_000,
                last_seen_ms: 1_764_583_000_000,
                brokers: vec![],
                last_broker: 2,
                remote_addr: "10.0.0.8:5000".into(),
                topics: vec![TopicView {
                    topic: "/press-12/a".into(),
                    broker_id: 2,
                    edge_high_water_mark: None,
                    acknowledged_offset: 7,
                    lag_records: None,
                    updated_ms: 0,
                }],
            },
        ];
        assert_eq!(
            table(&edges),
            "EDGE      CONNECTED  SINCE                     LAST SEEN                 BROKERS  REMOTE\n\
             plant1    yes        2025-12-01T10:00:00.123Z  now                       1,3      10.0.0.7:41234\n\
             \x20 TOPIC             BROKER  EDGE HWM  ACKNOWLEDGED  LAG\n\
             \x20 /plant1/readings  1       1000      990           10\n\
             press-12  no         2025-12-01T09:56:40.000Z  2025-12-01T09:56:40.000Z  -        10.0.0.8:5000\n\
             \x20 TOPIC        BROKER  EDGE HWM  ACKNOWLEDGED  LAG\n\
             \x20 /press-12/a  2       -         7             -\n"
        );
        assert_eq!(table(&[]), "no edges known\n");
    }
}
