//! `/metrics` of the real broker, edge agent and tier service: the metric
//! names an operator's dashboards rely on exist, and their values follow
//! traffic, tiering and a broker restart; all three serve one exposition
//! format (OpenMetrics text, HELP sentences, one label set per family, an
//! `edge` label on every edge series), and every metric the fleet
//! dashboard (`docs/grafana-fleet.json`) queries is exposed. Every process
//! exits 0 on SIGTERM.

use std::collections::BTreeSet;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use tributary_test_support::openmetrics;

use tributary_test_support::ports::free_tcp;
use tributary_test_support::process::{Proc, bin_path};
use tributary_tests::cluster::{Pair, metric_value as value, try_scrape};

fn scrape(url: &str) -> String {
    try_scrape(url).expect("scrape")
}

fn wait_for(what: &str, url: &str, series: &str, ok: impl Fn(u64) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let text = match try_scrape(url) {
            Ok(text) => text,
            Err(e) if Instant::now() < deadline => {
                eprintln!("{what}: {url} not up yet: {e}");
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
            Err(e) => panic!("{what}: {url} not up after 60 s: {e}"),
        };
        if value(&text, series).is_some_and(&ok) {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: {series} = {:?} after 60 s\n{text}",
            value(&text, series)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

const TOPIC_LABEL: &str = "{topic=\"/plant1/readings\"}";

/// The `Content-Type` and body of `url`.
fn scrape_typed(url: &str) -> (String, String) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(30)))
        .build()
        .into();
    let mut response = agent.get(url).call().expect("scrape");
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    (
        content_type,
        response.body_mut().read_to_string().expect("body"),
    )
}

/// Every `tributary_*` name in `text`.
fn metric_names(text: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("tributary_") {
        let name: String = rest[at..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
            .collect();
        rest = &rest[at + name.len()..];
        names.push(name);
    }
    names
}

/// Every PromQL expression of the dashboard: panel targets and template
/// variable queries.
fn dashboard_queries(dashboard: &Value) -> Vec<String> {
    let mut queries = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().into_iter().flatten() {
            queries.push(target["expr"].as_str().expect("expr").to_owned());
        }
    }
    for variable in dashboard["templating"]["list"]
        .as_array()
        .expect("templating")
    {
        if variable["type"] == "query" {
            queries.push(variable["query"].as_str().expect("query").to_owned());
        }
    }
    queries
}

/// The three expositions pass the shared checks; the sample names they
/// expose (a counter's with `_total`).
fn one_format_on_all_three(urls: &[(&str, &str)]) -> BTreeSet<String> {
    let mut exposed = BTreeSet::new();
    for (daemon, url) in urls {
        let (content_type, text) = scrape_typed(url);
        assert_eq!(
            content_type, "application/openmetrics-text; version=1.0.0; charset=utf-8",
            "{daemon}"
        );
        // prometheus_client ends each HELP with a period itself: ours
        // must not add a second one.
        for help in text.lines().filter(|l| l.starts_with("# HELP ")) {
            assert!(
                help.ends_with('.') && !help.ends_with(".."),
                "{daemon}: {help}"
            );
        }
        let families =
            openmetrics::parse(&text).unwrap_or_else(|e| panic!("{daemon}: {e}\n{text}"));
        for (name, family) in families {
            if *daemon == "edge-agent" {
                for (sample, labels, _) in &family.samples {
                    assert!(
                        labels.iter().any(|(k, v)| k == "edge" && v == "plant1"),
                        "{sample} without edge=\"plant1\""
                    );
                }
            }
            if family.kind == "counter" {
                exposed.insert(format!("{name}_total"));
            } else {
                exposed.insert(name);
            }
        }
    }
    exposed
}

#[test]
fn broker_edge_and_tier_metrics_follow_traffic_tiering_and_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Disk budgets (agent-wide and the topic's own), so their families
    // are exposed for the dashboard check.
    let mut pair = Pair::new_with(
        dir.path(),
        "event_stream",
        None,
        "disk_budget_bytes = 1073741824",
        "disk_budget_bytes = 536870912",
    );
    // Seal quiet central segments quickly so the tier service archives them.
    let broker_toml = dir.path().join("broker.toml");
    let mut text = std::fs::read_to_string(&broker_toml).expect("broker.toml");
    text.push_str("[wal]\nsegment_max_age_ms = 300\n");
    // The bucket the tier service writes: the broker checks each
    // descriptor's object there before committing it.
    text.push_str(&format!(
        "[archive.store]\nurl = \"{}\"\n",
        dir.path().join("archive").display()
    ));
    std::fs::write(&broker_toml, text).expect("broker.toml");
    let admin = pair.broker_admin;
    let broker_metrics = format!("http://{admin}/metrics");
    let edge_metrics = format!("http://{}/metrics", pair.edge_api);
    let tier_addr = free_tcp();
    let tier_metrics = format!("http://{tier_addr}/metrics");

    pair.broker.start();
    pair.edge.start();
    pair.wait_for_edge();
    let mut tier = Command::new(bin_path("tier-service"));
    tier.arg("--data-dir")
        .arg(&pair.broker_data)
        .arg("--bucket")
        .arg(dir.path().join("archive"))
        .args(["--broker-url", &format!("http://{admin}")])
        .args(["--token", "e2e-test-token", "--poll-interval-ms", "200"])
        .arg("--metrics-listen")
        .arg(tier_addr.to_string())
        .env("RUST_LOG", "warn");
    let mut tier = Proc::with_stdio("tier-service", tier);
    tier.start();

    // Before traffic: a leader, nothing ingested, nothing tiered.
    let text = wait_for(
        "raft leader",
        &broker_metrics,
        "tributary_broker_raft_is_leader",
        |v| v == 1,
    );
    assert_eq!(
        value(&text, "tributary_broker_raft_leader_id"),
        Some(1),
        "{text}"
    );
    assert!(
        value(&text, "tributary_broker_raft_term").unwrap_or(0) >= 1,
        "{text}"
    );
    assert_eq!(
        value(&text, "tributary_broker_ingest_records_total"),
        Some(0),
        "{text}"
    );
    assert!(
        text.contains("# TYPE tributary_broker_ingest_bytes counter"),
        "{text}"
    );
    let text = wait_for(
        "tier up",
        &tier_metrics,
        "tributary_tier_passes_total",
        |v| v >= 1,
    );
    assert_eq!(
        value(&text, "tributary_tier_segments_committed_total"),
        Some(0),
        "{text}"
    );
    assert_eq!(
        value(&text, "tributary_tier_upload_failures_total"),
        Some(0),
        "{text}"
    );
    let text = scrape(&edge_metrics);
    assert_eq!(
        value(
            &text,
            &format!("tributary_edge_records_in_total{TOPIC_LABEL}")
        ),
        Some(0),
        "{text}"
    );

    // 1,000 records through the edge.
    let body: String = (0..1000)
        .map(|i| format!("{{\"value\":\"reading {i}\",\"key\":\"k{i}\"}}\n"))
        .collect();
    assert_eq!(pair.publish_ndjson(body), Ok((0, 1000)));
    pair.wait_acknowledged(1000, Duration::from_secs(60));
    let text = scrape(&broker_metrics);
    assert_eq!(
        value(&text, "tributary_broker_ingest_records_total"),
        Some(1000),
        "{text}"
    );
    assert_eq!(
        value(&text, "tributary_broker_ingest_batches_total"),
        Some(1),
        "{text}"
    );
    assert!(
        value(&text, "tributary_broker_ingest_bytes_total").unwrap_or(0) > 1000,
        "{text}"
    );
    assert_eq!(
        value(
            &text,
            &format!("tributary_broker_topic_high_water_mark{TOPIC_LABEL}")
        ),
        Some(1000),
        "{text}"
    );
    let text = wait_for(
        "edge checkpoint in metrics",
        &edge_metrics,
        &format!("tributary_edge_replication_lag_records{TOPIC_LABEL}"),
        |v| v == 0,
    );
    assert_eq!(
        value(
            &text,
            &format!("tributary_edge_records_in_total{TOPIC_LABEL}")
        ),
        Some(1000),
        "{text}"
    );
    assert_eq!(
        value(&text, "tributary_edge_replication_connects_total"),
        Some(1),
        "{text}"
    );
    assert_eq!(
        value(&text, "tributary_edge_replication_reconnects_total"),
        Some(0),
        "{text}"
    );
    assert!(value(&text, "tributary_edge_replication_wire_bytes_total").unwrap_or(0) > 0);
    // One batch, one acknowledgement that advanced the offset: counted
    // under whichever copy (Ack frame or datagram) arrived first.
    let acks = |path: &str| {
        value(
            &text,
            &format!("tributary_edge_replication_acks_total{{path=\"{path}\"}}"),
        )
    };
    assert_eq!(
        acks("stream").zip(acks("datagram")).map(|(s, d)| s + d),
        Some(1),
        "{text}"
    );

    // The tier service archives the sealed segment; the broker sees it.
    let text = wait_for(
        "tiered",
        &broker_metrics,
        &format!("tributary_broker_topic_tiered_offset{TOPIC_LABEL}"),
        |v| v == 1000,
    );
    assert_eq!(
        value(
            &text,
            &format!("tributary_broker_topic_tier_backlog_records{TOPIC_LABEL}")
        ),
        Some(0),
        "{text}"
    );
    // The broker sees the descriptor as soon as Raft applies it, a moment
    // before the tier service's commit call returns and counts it.
    let text = wait_for(
        "segment committed",
        &tier_metrics,
        "tributary_tier_segments_committed_total",
        |v| v >= 1,
    );
    assert!(
        value(&text, "tributary_tier_uploaded_bytes_total").unwrap_or(0) > 0,
        "{text}"
    );

    // One format on all three; the fleet dashboard asks only for what they
    // expose.
    let exposed = one_format_on_all_three(&[
        ("broker", &broker_metrics),
        ("edge-agent", &edge_metrics),
        ("tier-service", &tier_metrics),
    ]);
    let dashboard: Value = serde_json::from_str(include_str!("../../docs/grafana-fleet.json"))
        .expect("dashboard JSON");
    let queries = dashboard_queries(&dashboard);
    assert!(queries.len() >= 12, "{queries:?}");
    let used: BTreeSet<String> = queries.iter().flat_map(|q| metric_names(q)).collect();
    let missing: Vec<&String> = used.difference(&exposed).collect();
    assert!(
        missing.is_empty(),
        "the dashboard queries metrics no daemon exposes: {missing:?}\nexposed: {exposed:?}"
    );
    for needed in [
        "tributary_broker_edge_connected",
        "tributary_edge_replication_lag_records",
        "tributary_edge_backlog_bytes",
        "tributary_edge_disk_used_bytes",
        "tributary_broker_topic_tier_backlog_records",
        "tributary_tier_backlog_age_seconds",
    ] {
        assert!(used.contains(needed), "the dashboard shows no {needed}");
    }

    // A broker restart: the edge reconnects and the counter says so.
    assert_eq!(
        pair.broker.terminate(),
        Some(0),
        "broker exit status on SIGTERM"
    );
    pair.broker.start();
    wait_for(
        "reconnect",
        &edge_metrics,
        "tributary_edge_replication_reconnects_total",
        |v| v >= 1,
    );

    // A broker SIGKILL and restart on the same address: the new process
    // answers the edge's next packet with a stateless reset the edge
    // accepts (the reset key survives restarts), so the edge reconnects
    // without waiting out its 30 s idle timeout, and the loss is counted
    // as `reset`, not `timed_out`.
    let lost = |reason: &str| {
        format!("tributary_edge_replication_connections_lost_total{{reason=\"{reason}\"}}")
    };
    let before = scrape(&edge_metrics);
    pair.wait_acknowledged(1000, Duration::from_secs(60));
    pair.broker.kill();
    pair.broker.start();
    let text = wait_for(
        "reset after a broker SIGKILL",
        &edge_metrics,
        &lost("reset"),
        |v| v >= 1,
    );
    assert_eq!(
        value(&text, &lost("timed_out")),
        value(&before, &lost("timed_out")),
        "{text}"
    );
    let body: String = (1000..1100)
        .map(|i| format!("{{\"value\":\"reading {i}\"}}\n"))
        .collect();
    assert_eq!(pair.publish_ndjson(body), Ok((1000, 1100)));
    pair.wait_acknowledged(1100, Duration::from_secs(60));

    assert_eq!(
        tier.terminate(),
        Some(0),
        "tier-service exit status on SIGTERM"
    );
    assert_eq!(
        pair.edge.terminate(),
        Some(0),
        "edge-agent exit status on SIGTERM"
    );
    assert_eq!(
        pair.broker.terminate(),
        Some(0),
        "broker exit status on SIGTERM"
    );
}

/// The stage histograms of both ends (`tributary_edge_replication_stage_seconds`,
/// `tributary_broker_ingest_stage_seconds`) count every batch of a run
/// without reconnects exactly once per stage, and their times nest: a
/// batch's time in the broker after it was received lies inside the edge's
/// wait for its acknowledgement.
#[test]
fn stage_histograms_count_every_batch_once() {
    const BATCHES: u64 = 5;
    const RECORDS: u64 = 100;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut pair = Pair::new(dir.path(), "event_stream", None);
    let broker_metrics = format!("http://{}/metrics", pair.broker_admin);
    let edge_metrics = format!("http://{}/metrics", pair.edge_api);
    pair.broker.start();
    pair.edge.start();
    pair.wait_for_edge();
    for batch in 0..BATCHES {
        let body: String = (0..RECORDS)
            .map(|i| format!("{{\"value\":\"reading {batch}.{i}\"}}\n"))
            .collect();
        let first = batch * RECORDS;
        assert_eq!(pair.publish_ndjson(body), Ok((first, first + RECORDS)));
    }
    pair.wait_acknowledged(BATCHES * RECORDS, Duration::from_secs(60));

    let edge_stage = |stage: &str| {
        format!("tributary_edge_replication_stage_seconds_count{{stage=\"{stage}\"}}")
    };
    let broker_stage =
        |stage: &str| format!("tributary_broker_ingest_stage_seconds_count{{stage=\"{stage}\"}}");
    // The broker counts its `ack` once the Ack frame is written, which may
    // be just after the edge took the datagram that repeats it.
    let broker_text = wait_for(
        "broker ack stage",
        &broker_metrics,
        &broker_stage("ack"),
        |v| v == BATCHES,
    );
    let edge_text = scrape(&edge_metrics);
    let mut series = Vec::new();
    for (daemon, text, name) in [
        (
            "edge-agent",
            &edge_text,
            "tributary_edge_replication_stage_seconds",
        ),
        (
            "broker",
            &broker_text,
            "tributary_broker_ingest_stage_seconds",
        ),
    ] {
        let families = openmetrics::parse(text).unwrap_or_else(|e| panic!("{daemon}: {e}\n{text}"));
        let family = families
            .get(name)
            .unwrap_or_else(|| panic!("{daemon}: no {name}\n{text}"));
        assert_eq!(family.kind, "histogram", "{daemon}");
        series.push(family.clone());
    }
    let (edge, broker) = (&series[0], &series[1]);
    let stage = |family: &openmetrics::MetricFamily, stage: &str| {
        family
            .histogram(&[("stage", stage)])
            .unwrap_or_else(|| panic!("no stage {stage} in\n{edge_text}\n{broker_text}"))
    };
    // Exact: every batch was read, framed, sent and acknowledged once, on
    // one connection. Reads take one or several batches per step.
    assert_eq!(
        value(&edge_text, "tributary_edge_replication_connects_total"),
        Some(1),
        "{edge_text}"
    );
    for name in ["compress", "queue", "send", "ack"] {
        assert_eq!(
            value(&edge_text, &edge_stage(name)),
            Some(BATCHES),
            "edge {name}\n{edge_text}"
        );
    }
    let reads = stage(edge, "read").count;
    assert!(
        (1.0..=BATCHES as f64).contains(&reads),
        "read steps {reads}"
    );
    assert_eq!(
        value(&broker_text, "tributary_broker_ingest_batches_total"),
        Some(BATCHES),
        "{broker_text}"
    );
    for name in ["receive", "decode", "append", "durable", "ack"] {
        assert_eq!(
            value(&broker_text, &broker_stage(name)),
            Some(BATCHES),
            "broker {name}\n{broker_text}"
        );
    }
    // Nested times, on the one monotonic clock of the host: the broker
    // decodes a frame only after the edge handed all of it to quinn, and
    // sends the acknowledgement (its datagram first) only once durable.
    let ack_wait = stage(edge, "ack").sum;
    let in_broker: f64 = ["decode", "append", "durable"]
        .iter()
        .map(|s| stage(broker, s).sum)
        .sum();
    assert!(ack_wait > 0.0, "{edge_text}");
    assert!(
        in_broker <= ack_wait,
        "broker {in_broker} s inside the edge's ack wait {ack_wait} s\n{edge_text}\n{broker_text}"
    );

    assert_eq!(pair.edge.terminate(), Some(0));
    assert_eq!(pair.broker.terminate(), Some(0));
}
