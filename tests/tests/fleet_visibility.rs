//! Fleet visibility with the real broker, edge agent and `tribctl` (issue
//! 21): the edge's `/health` turns `unhealthy` while no broker answers for
//! longer than `[replication] unhealthy_after_ms` and `ok` once one does;
//! `tribctl edges list` shows the edge connected with its exact high-water
//! mark, then gone (connected flips, last seen stops), then back (last
//! seen moves on); the broker's edge metrics follow; the broker's JSON log
//! has one `edge connected` and one `edge disconnected` line per
//! connection, with plain values.

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use tributary_test_support::process::{Proc, bin_path};
use tributary_tests::cluster::{Pair, TOPIC, metric_value, try_scrape};

/// The setting under test: unhealthy after 1.5 s without anything leaving.
const UNHEALTHY_AFTER_MS: u64 = 1_500;

fn health(pair: &Pair) -> Option<(u16, Value)> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into();
    let mut response = agent
        .get(&format!("http://{}/health", pair.edge_api))
        .call()
        .ok()?;
    let status = response.status().as_u16();
    Some((status, response.body_mut().read_json().ok()?))
}

/// Polls (at most 30 s) until `check` accepts the edge's `/health`.
fn wait_health(pair: &Pair, what: &str, check: impl Fn(u16, &Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let seen = health(pair);
        if let Some((status, body)) = &seen
            && check(*status, body)
        {
            return body.clone();
        }
        assert!(Instant::now() < deadline, "{what}: /health is {seen:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `tribctl edges list` against the pair's broker, with `args` after it.
fn edges_list(pair: &Pair, args: &[&str]) -> std::process::Output {
    Command::new(bin_path("tribctl"))
        .args(["--admin-url", &format!("http://{}", pair.broker_admin)])
        .args(["--token", "e2e-test-token"])
        .args(args)
        .args(["edges", "list"])
        .env_remove("TRIB_ADMIN_URL")
        .output()
        .expect("tribctl")
}

/// The edge `plant1` as `tribctl edges list --output json` shows it.
fn plant1(pair: &Pair) -> Value {
    let out = edges_list(pair, &["--output", "json"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let list: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let edges = list["edges"].as_array().expect("edges");
    assert_eq!(edges.len(), 1, "{list}");
    assert_eq!(edges[0]["edge_id"], "plant1");
    edges[0].clone()
}

/// Polls (at most 30 s) until `check` accepts `plant1`'s entry.
fn wait_edge(pair: &Pair, what: &str, check: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let edge = plant1(pair);
        if check(&edge) {
            return edge;
        }
        assert!(Instant::now() < deadline, "{what}: {edge}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn topic_of(edge: &Value) -> &Value {
    let topics = edge["topics"].as_array().expect("topics");
    assert_eq!(topics.len(), 1, "{edge}");
    assert_eq!(topics[0]["topic"], TOPIC);
    &topics[0]
}

fn publish(pair: &Pair, from: u64, to: u64) {
    let body: String = (from..to)
        .map(|i| format!("{{\"value\":\"reading {i}\"}}\n"))
        .collect();
    assert_eq!(pair.publish_ndjson(body), Ok((from, to)));
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64
}

#[test]
fn edges_list_health_metrics_and_logs_follow_an_edge_going_away_and_coming_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut pair = Pair::new(dir.path(), "event_stream", None);
    // The edge: unhealthy after 1.5 s of nothing leaving.
    let edge_toml = dir.path().join("edge.toml");
    let text = std::fs::read_to_string(&edge_toml).expect("edge.toml");
    std::fs::write(
        &edge_toml,
        text.replace(
            "[replication]\n",
            &format!("[replication]\nunhealthy_after_ms = {UNHEALTHY_AFTER_MS}\n"),
        ),
    )
    .expect("edge.toml");
    // The broker: JSON logs at info into a file, edge entries reported
    // every 300 ms.
    let broker_toml = dir.path().join("broker.toml");
    let mut text = std::fs::read_to_string(&broker_toml).expect("broker.toml");
    text.push_str("\n[fleet]\nreport_interval_ms = 300\n");
    tributary_test_support::certs::write_private(&broker_toml, &text);
    let broker_log = dir.path().join("broker.log");
    let mut command = Command::new(bin_path("broker"));
    command
        .arg("--config")
        .arg(&broker_toml)
        .args(["--log-format", "json"])
        .env("RUST_LOG", "warn,tributary_broker::fleet=info");
    pair.broker = Proc::logged("broker", command, &broker_log).expect("broker log");

    // No broker yet: unhealthy once the setting has passed, and saying why.
    // The stall clock starts with the agent, so the earliest it may turn
    // unhealthy is measured from before it starts (waiting for its API may
    // itself take longer than the setting on a loaded machine).
    let started = Instant::now();
    pair.edge.start();
    pair.wait_for_edge();
    let body = wait_health(&pair, "unhealthy without a broker", |status, body| {
        status == 503 && body["status"] == "unhealthy"
    });
    assert!(
        started.elapsed() >= Duration::from_millis(UNHEALTHY_AFTER_MS - 500),
        "unhealthy after {:?}, before the setting",
        started.elapsed()
    );
    let replication = &body["replication"];
    assert_eq!(replication["state"], "disconnected", "{body}");
    assert_eq!(replication["unhealthy_after_ms"], UNHEALTHY_AFTER_MS);
    assert!(
        replication["stalled_for_ms"].as_u64() > Some(UNHEALTHY_AFTER_MS),
        "{body}"
    );
    assert!(
        replication["stalls"][0]
            .as_str()
            .is_some_and(|s| s.starts_with("no connection to any broker for ")),
        "{body}"
    );
    let edge_metrics = format!("http://{}/metrics", pair.edge_api);
    let text = try_scrape(&edge_metrics).expect("edge metrics");
    assert_eq!(
        metric_value(
            &text,
            "tributary_edge_replication_connected{edge=\"plant1\"}"
        ),
        Some(0),
        "{text}"
    );
    assert!(
        metric_value(
            &text,
            "tributary_edge_replication_stalled_seconds{edge=\"plant1\"}"
        ) >= Some(1),
        "{text}"
    );
    publish(&pair, 0, 100);

    // The broker comes: healthy again, everything acknowledged.
    pair.broker.start();
    wait_health(&pair, "ok with a broker", |status, body| {
        status == 200 && body["status"] == "ok"
    });
    pair.wait_acknowledged(100, Duration::from_secs(30));
    let edge = wait_edge(&pair, "connected with its high-water mark", |e| {
        e["connected"] == true && topic_of(e)["edge_high_water_mark"] == 100
    });
    assert_eq!(edge["brokers"], serde_json::json!([1]));
    assert_eq!(edge["last_broker"], 1);
    assert!(
        edge["remote_addr"]
            .as_str()
            .is_some_and(|a| a.starts_with("127.0.0.1:")),
        "{edge}"
    );
    let topic = topic_of(&edge);
    assert_eq!(
        (
            topic["acknowledged_offset"].clone(),
            topic["lag_records"].clone(),
            topic["broker_id"].clone()
        ),
        (100.into(), 0.into(), 1.into()),
        "{edge}"
    );
    let connected_since = edge["since_ms"].as_u64().expect("since");
    // The text table.
    let out = edges_list(&pair, &[]);
    let table = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let lines: Vec<&str> = table.lines().collect();
    assert!(
        lines[0].starts_with("EDGE    CONNECTED  SINCE") && lines[0].ends_with("BROKERS  REMOTE"),
        "{table}"
    );
    assert!(lines[1].starts_with("plant1  yes        "), "{table}");
    assert!(lines[1].contains("  now  "), "{table}");
    assert_eq!(
        lines[2],
        "  TOPIC             BROKER  EDGE HWM  ACKNOWLEDGED  LAG"
    );
    assert_eq!(
        lines[3],
        "  /plant1/readings  1       100       100           0"
    );

    // More records: the exact new mark.
    publish(&pair, 100, 150);
    pair.wait_acknowledged(150, Duration::from_secs(30));
    wait_edge(&pair, "high-water mark 150", |e| {
        topic_of(e)["edge_high_water_mark"] == 150 && topic_of(e)["acknowledged_offset"] == 150
    });
    let broker_metrics = format!("http://{}/metrics", pair.broker_admin);
    let text = try_scrape(&broker_metrics).expect("broker metrics");
    assert_eq!(
        metric_value(&text, "tributary_broker_edge_connected{edge=\"plant1\"}"),
        Some(1),
        "{text}"
    );
    let seen_s = metric_value(
        &text,
        "tributary_broker_edge_last_seen_timestamp_seconds{edge=\"plant1\"}",
    )
    .expect("last seen");
    assert!(seen_s.abs_diff(now_ms() / 1000) <= 2, "{seen_s}\n{text}");

    // The edge goes away: disconnected, last seen stays where it left.
    let before_stop = now_ms();
    assert_eq!(
        pair.edge.terminate(),
        Some(0),
        "edge exit status on SIGTERM"
    );
    let gone = wait_edge(&pair, "disconnected", |e| e["connected"] == false);
    let last_seen = gone["last_seen_ms"].as_u64().expect("last seen");
    assert!(last_seen >= before_stop && last_seen <= now_ms(), "{gone}");
    assert_eq!(gone["since_ms"].as_u64(), Some(last_seen), "{gone}");
    assert_eq!(gone["brokers"], serde_json::json!([]));
    assert_eq!(topic_of(&gone)["edge_high_water_mark"], 150, "kept: {gone}");
    let text = try_scrape(&broker_metrics).expect("broker metrics");
    assert_eq!(
        metric_value(&text, "tributary_broker_edge_connected{edge=\"plant1\"}"),
        Some(0),
        "{text}"
    );
    assert_eq!(
        metric_value(
            &text,
            "tributary_broker_edge_last_seen_timestamp_seconds{edge=\"plant1\"}"
        ),
        Some(last_seen / 1000),
        "{text}"
    );
    std::thread::sleep(Duration::from_millis(1_100));
    let still_gone = plant1(&pair);
    assert_eq!(still_gone["connected"], false);
    assert_eq!(
        still_gone["last_seen_ms"].as_u64(),
        Some(last_seen),
        "last seen stopped"
    );
    // The table says when.
    let table = String::from_utf8_lossy(&edges_list(&pair, &[]).stdout).into_owned();
    assert!(
        table
            .lines()
            .nth(1)
            .is_some_and(|l| l.starts_with("plant1  no ")),
        "{table}"
    );

    // It comes back: connected again, since later, last seen moving.
    pair.edge.start();
    let back = wait_edge(&pair, "connected again", |e| e["connected"] == true);
    let since = back["since_ms"].as_u64().expect("since");
    assert!(since > last_seen && since > connected_since, "{back}");
    assert!(back["last_seen_ms"].as_u64() > Some(last_seen), "{back}");
    assert_eq!(topic_of(&back)["edge_high_water_mark"], 150);
    let text = try_scrape(&broker_metrics).expect("broker metrics");
    assert_eq!(
        metric_value(&text, "tributary_broker_edge_connected{edge=\"plant1\"}"),
        Some(1),
        "{text}"
    );

    assert_eq!(
        pair.edge.terminate(),
        Some(0),
        "edge exit status on SIGTERM"
    );
    wait_edge(&pair, "disconnected again", |e| e["connected"] == false);
    assert_eq!(
        pair.broker.terminate(),
        Some(0),
        "broker exit status on SIGTERM"
    );

    // The broker's JSON log: a connect and a disconnect line per
    // connection (two), with plain values.
    let log = std::fs::read_to_string(&broker_log).expect("broker log");
    let lines: Vec<Value> = log
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .collect();
    let with = |message: &str| -> Vec<&Value> {
        lines
            .iter()
            .filter(|l| l["fields"]["message"] == message)
            .map(|l| &l["fields"])
            .collect()
    };
    let connects = with("edge connected");
    let disconnects = with("edge disconnected");
    assert_eq!((connects.len(), disconnects.len()), (2, 2), "{log}");
    for line in connects.iter().chain(&disconnects) {
        assert_eq!(line["edge"], "plant1", "{line}");
        assert_eq!(line["broker"], 1, "{line}");
        assert!(
            line["remote_addr"]
                .as_str()
                .is_some_and(|a| a.starts_with("127.0.0.1:")),
            "{line}"
        );
    }
    for line in &disconnects {
        assert_eq!(line["topics"], TOPIC, "{line}");
        assert!(
            line["reason"].as_str().is_some_and(|r| !r.is_empty()),
            "{line}"
        );
        assert_eq!(line["connections"], 0, "{line}");
    }
    // No field anywhere in the log is a Debug rendering of an Option.
    for line in &lines {
        if let Some(fields) = line["fields"].as_object() {
            for (name, value) in fields {
                assert!(
                    !value.as_str().is_some_and(|v| v.starts_with("Some(")),
                    "{name} = {value} in {line}"
                );
            }
        }
    }
}
