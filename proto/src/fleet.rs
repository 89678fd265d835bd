//! Fleet visibility: what a broker records about the edges that hold
//! replication connections to it ([`EdgeEntry`], one per edge and broker at
//! `/fleet/edges/{edge_id}/{broker_id}`, see [`crate::keys::fleet`]), and
//! the cluster-wide view of every edge that `GET /v1/edges` and
//! `tribctl edges list` show ([`merge`]).
//!
//! Each broker writes only its own entries: when an edge connects, when its
//! last connection to the broker ends, and, at most once per report
//! interval, when a topic's offsets moved. An entry that claims a
//! connection on a broker whose lease has lapsed is shown as disconnected
//! (the broker died before it could say so). Pure: time comes in as
//! `now_ms`, broker liveness as a function.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One broker's record of one edge: the JSON value at
/// `/fleet/edges/{edge_id}/{broker_id}`. Unknown fields are ignored (a
/// newer broker may add some).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EdgeEntry {
    /// Replication connections the edge holds to this broker now; 0 once
    /// the last one ended.
    pub connections: u32,
    /// Remote address (`ip:port`) of the edge's newest connection.
    pub remote_addr: String,
    /// While connected: when the first of the open connections was made;
    /// else when the last one ended. Ms since the Unix epoch.
    pub since_ms: u64,
    /// The last time this broker knew the edge connected: when the entry
    /// was written while connected, else when the last connection ended.
    /// Ms since the Unix epoch.
    pub last_seen_ms: u64,
    /// The topics the edge streamed to this broker, by name
    /// (`/{ns}/{topic}`).
    #[serde(default)]
    pub topics: BTreeMap<String, TopicEntry>,
}

/// One topic's offsets as the broker last saw them on the edge's stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicEntry {
    /// Next offset the broker holds durably for the topic: everything below
    /// it was acknowledged to the edge.
    pub acknowledged_offset: u64,
    /// The edge's own high-water mark (its `Progress` frames); `None` from
    /// an edge that does not report it (it predates them).
    pub edge_high_water_mark: Option<u64>,
    /// When the broker last changed these values, ms since the Unix epoch.
    pub updated_ms: u64,
}

/// A broker's lease as [`merge`] needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BrokerLease {
    /// The lease is held now.
    pub live: bool,
    /// When it was last renewed, ms since the Unix epoch.
    pub renewed_at_ms: u64,
}

/// One edge as the whole cluster knows it: the element of `GET /v1/edges`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EdgeView {
    /// The edge id (its certificate identity and namespace).
    pub edge_id: String,
    /// Whether it holds a replication connection to a live broker now.
    pub connected: bool,
    /// Since when it is connected (the first open connection) or, when
    /// disconnected, since when it is not; ms since the Unix epoch.
    pub since_ms: u64,
    /// When a broker last knew it connected: `now` while connected, ms
    /// since the Unix epoch.
    pub last_seen_ms: u64,
    /// The brokers it holds connections to now (ids, ascending); empty
    /// while disconnected.
    pub brokers: Vec<u64>,
    /// The broker that saw it last (connected: the newest connection's).
    pub last_broker: u64,
    /// Remote address of that connection (`ip:port`).
    pub remote_addr: String,
    /// Per topic, the newest report of any broker.
    pub topics: Vec<TopicView>,
}

/// One topic of an [`EdgeView`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicView {
    /// `/{ns}/{topic}`.
    pub topic: String,
    /// The broker whose report this is (the one the stream ran on).
    pub broker_id: u64,
    /// The edge's high-water mark: the next offset its WAL assigns; `None`
    /// when the edge does not report it.
    pub edge_high_water_mark: Option<u64>,
    /// Everything below this offset is durable centrally.
    pub acknowledged_offset: u64,
    /// Records the edge holds that the broker has not acknowledged:
    /// `edge_high_water_mark - acknowledged_offset` (0 if the report is
    /// older than the acknowledgement); `None` without the edge's mark.
    pub lag_records: Option<u64>,
    /// When the broker last updated these values, ms since the Unix epoch.
    pub updated_ms: u64,
}

/// The cluster-wide view of every edge in `entries` (`(edge_id,
/// broker_id, entry)`), sorted by edge id. `lease(broker_id)` says whether
/// a broker holds its lease (`None`: unknown broker, treated as dead): a
/// connection recorded by a dead broker counts as ended at the later of
/// its entry's `last_seen_ms` and the lease's last renewal.
pub fn merge<'a>(
    entries: impl IntoIterator<Item = (&'a str, u64, &'a EdgeEntry)>,
    lease: impl Fn(u64) -> Option<BrokerLease>,
    now_ms: u64,
) -> Vec<EdgeView> {
    let mut by_edge: BTreeMap<&str, Vec<(u64, &EdgeEntry)>> = BTreeMap::new();
    for (edge, broker, entry) in entries {
        by_edge.entry(edge).or_default().push((broker, entry));
    }
    by_edge
        .into_iter()
        .map(|(edge, entries)| merge_edge(edge, &entries, &lease, now_ms))
        .collect()
}

fn merge_edge(
    edge: &str,
    entries: &[(u64, &EdgeEntry)],
    lease: &impl Fn(u64) -> Option<BrokerLease>,
    now_ms: u64,
) -> EdgeView {
    // (broker, entry, connected now, last seen, since)
    let judged: Vec<(u64, &EdgeEntry, bool, u64, u64)> = entries
        .iter()
        .map(|&(broker, entry)| {
            let lease = lease(broker);
            let live = lease.is_some_and(|l| l.live);
            if entry.connections > 0 && live {
                (broker, entry, true, now_ms, entry.since_ms)
            } else if entry.connections > 0 {
                // The broker died with the connection open.
                let ended = entry.last_seen_ms.max(lease.map_or(0, |l| l.renewed_at_ms));
                (broker, entry, false, ended, ended)
            } else {
                (broker, entry, false, entry.last_seen_ms, entry.since_ms)
            }
        })
        .collect();
    let connected: Vec<_> = judged.iter().filter(|j| j.2).collect();
    let (since_ms, last_seen_ms) = if connected.is_empty() {
        (
            judged.iter().map(|j| j.4).max().unwrap_or(0),
            judged.iter().map(|j| j.3).max().unwrap_or(0),
        )
    } else {
        (connected.iter().map(|j| j.4).min().unwrap_or(0), now_ms)
    };
    // The newest connection's broker while connected, else the broker that
    // saw the edge last.
    let last = if connected.is_empty() {
        judged.iter().max_by_key(|j| (j.3, j.0))
    } else {
        connected.iter().copied().max_by_key(|j| (j.4, j.0))
    };
    let mut brokers: Vec<u64> = connected.iter().map(|j| j.0).collect();
    brokers.sort_unstable();
    let mut topics: BTreeMap<&str, TopicView> = BTreeMap::new();
    for &(broker, entry) in entries {
        for (name, t) in &entry.topics {
            let newer = topics.get(name.as_str()).is_none_or(|seen| {
                (t.updated_ms, t.acknowledged_offset) > (seen.updated_ms, seen.acknowledged_offset)
            });
            if newer {
                topics.insert(
                    name,
                    TopicView {
                        topic: name.clone(),
                        broker_id: broker,
                        edge_high_water_mark: t.edge_high_water_mark,
                        acknowledged_offset: t.acknowledged_offset,
                        lag_records: t
                            .edge_high_water_mark
                            .map(|h| h.saturating_sub(t.acknowledged_offset)),
                        updated_ms: t.updated_ms,
                    },
                );
            }
        }
    }
    EdgeView {
        edge_id: edge.to_owned(),
        connected: !connected.is_empty(),
        since_ms,
        last_seen_ms,
        brokers,
        last_broker: last.map_or(0, |j| j.0),
        remote_addr: last.map_or_else(String::new, |j| j.1.remote_addr.clone()),
        topics: topics.into_values().collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(connections: u32, since_ms: u64, last_seen_ms: u64, addr: &str) -> EdgeEntry {
        EdgeEntry {
            connections,
            remote_addr: addr.to_owned(),
            since_ms,
            last_seen_ms,
            topics: BTreeMap::new(),
        }
    }

    fn with_topic(
        mut e: EdgeEntry,
        name: &str,
        acked: u64,
        hwm: Option<u64>,
        at: u64,
    ) -> EdgeEntry {
        e.topics.insert(
            name.to_owned(),
            TopicEntry {
                acknowledged_offset: acked,
                edge_high_water_mark: hwm,
                updated_ms: at,
            },
        );
        e
    }

    fn lease(live: &'static [u64]) -> impl Fn(u64) -> Option<BrokerLease> {
        move |id| {
            Some(BrokerLease {
                live: live.contains(&id),
                renewed_at_ms: 5_000 + id,
            })
        }
    }

    #[test]
    fn a_connected_edge_is_seen_now_on_every_broker_it_holds_a_connection_to() {
        let b1 = with_topic(
            entry(1, 1_000, 1_000, "10.0.0.7:5000"),
            "/e1/a",
            90,
            Some(100),
            1_500,
        );
        let b2 = with_topic(
            entry(1, 1_200, 1_200, "10.0.0.7:5001"),
            "/e1/b",
            7,
            Some(7),
            1_300,
        );
        let views = merge([("e1", 2, &b2), ("e1", 1, &b1)], lease(&[1, 2]), 9_000);
        assert_eq!(views.len(), 1);
        let v = &views[0];
        assert!(v.connected);
        assert_eq!((v.since_ms, v.last_seen_ms), (1_000, 9_000));
        assert_eq!(v.brokers, vec![1, 2]);
        assert_eq!(
            (v.last_broker, v.remote_addr.as_str()),
            (2, "10.0.0.7:5001")
        );
        assert_eq!(v.topics.len(), 2);
        assert_eq!(v.topics[0].topic, "/e1/a");
        assert_eq!(v.topics[0].lag_records, Some(10));
        assert_eq!(v.topics[1].lag_records, Some(0));
    }

    #[test]
    fn a_disconnected_edge_keeps_its_last_offsets_and_when_it_went() {
        let b1 = with_topic(
            entry(0, 4_000, 4_000, "10.0.0.7:5000"),
            "/e1/a",
            90,
            None,
            3_000,
        );
        let v = &merge([("e1", 1, &b1)], lease(&[1]), 9_000)[0];
        assert!(!v.connected);
        assert_eq!((v.since_ms, v.last_seen_ms), (4_000, 4_000));
        assert!(v.brokers.is_empty());
        assert_eq!(v.last_broker, 1);
        assert_eq!(v.topics[0].edge_high_water_mark, None);
        assert_eq!(
            v.topics[0].lag_records, None,
            "unknown without the edge's mark"
        );
    }

    #[test]
    fn a_connection_on_a_dead_broker_counts_as_ended_at_its_last_lease_renewal() {
        let b3 = entry(1, 1_000, 2_000, "10.0.0.9:7000");
        let v = &merge([("e2", 3, &b3)], lease(&[1]), 9_000)[0];
        assert!(!v.connected);
        assert_eq!((v.since_ms, v.last_seen_ms), (5_003, 5_003));
        let unknown = &merge([("e2", 3, &b3)], |_| None, 9_000)[0];
        assert!(!unknown.connected);
        assert_eq!(unknown.last_seen_ms, 2_000);
    }

    #[test]
    fn each_topic_shows_the_newest_report_of_any_broker() {
        // The topic moved from broker 1 to broker 2: broker 2's report is newer.
        let b1 = with_topic(entry(0, 3_000, 3_000, "a:1"), "/e1/a", 50, Some(80), 2_900);
        let b2 = with_topic(entry(1, 3_100, 3_100, "a:2"), "/e1/a", 80, Some(80), 3_200);
        let v = &merge([("e1", 1, &b1), ("e1", 2, &b2)], lease(&[1, 2]), 4_000)[0];
        assert_eq!(v.topics.len(), 1);
        assert_eq!(v.topics[0].broker_id, 2);
        assert_eq!(v.topics[0].acknowledged_offset, 80);
        assert_eq!(v.topics[0].lag_records, Some(0));
        assert_eq!(v.brokers, vec![2]);
    }

    #[test]
    fn entries_decode_from_json_with_unknown_fields() {
        let json = r#"{"connections":1,"remote_addr":"1.2.3.4:5","since_ms":1,"last_seen_ms":2,
            "topics":{"/e/t":{"acknowledged_offset":3,"edge_high_water_mark":null,"updated_ms":4}},
            "added_later":true}"#;
        let e: EdgeEntry = serde_json::from_str(json).unwrap();
        assert_eq!(e.topics["/e/t"].acknowledged_offset, 3);
        let back: EdgeEntry = serde_json::from_value(serde_json::to_value(&e).unwrap()).unwrap();
        assert_eq!(back, e);
    }

    #[test]
    fn edges_are_listed_by_id() {
        let e = entry(0, 1, 1, "x:1");
        let ids: Vec<String> = merge([("zeta", 1, &e), ("alpha", 1, &e)], lease(&[1]), 2)
            .into_iter()
            .map(|v| v.edge_id)
            .collect();
        assert_eq!(ids, ["alpha", "zeta"]);
    }
}
