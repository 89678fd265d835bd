//! Tier-service health (issue 16, defect 2): while the object store is
//! unreachable and sealed segments wait, `/health` turns `503
//! upload_stalled` after `[audit] upload_stall_after_ms`, with the backlog's
//! age and the object store's last error, and `/metrics` carries
//! `tributary_tier_upload_stalled 1` and `tributary_tier_backlog_age_seconds`.
//! Against the stand-in broker of `common` and an S3 endpoint where nothing
//! listens.

mod common;

use std::time::{Duration, Instant};

use common::Harness;
use serde_json::Value;
use tributary_archive::StoreConfig;
use tributary_test_support::moto::Moto;
use tributary_test_support::ports::free_tcp;
use tributary_tier::faults::Faults;
use tributary_tier::service;

/// The tier service against the S3 endpoint `endpoint` (request timeout
/// `timeout_ms`, no retries), `upload_stall_after_ms` 1 s, with its
/// metrics listener; returns `get(path)` on that listener, the stop sender
/// and the running service.
fn start(
    h: &Harness,
    endpoint: &str,
    bucket: &str,
    timeout_ms: u64,
) -> (
    std::net::SocketAddr,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<service::RunReport, tributary_tier::error::TierError>>,
) {
    let metrics = free_tcp();
    let mut config = h.tier_config();
    config.store = StoreConfig {
        request_timeout_ms: Some(timeout_ms),
        max_retries: Some(0),
        ..common::s3_store(endpoint, bucket)
    };
    config.upload.part_size_bytes = 5 * 1024 * 1024;
    config.upload.multipart_threshold_bytes = 5 * 1024 * 1024;
    config.retry.attempts_max = 1;
    config.poll_interval_ms = 100;
    config.audit.upload_stall_after_ms = 1000;
    // The listener `main` starts next to the service.
    let listener = h
        .runtime
        .block_on(tributary_tier::metrics::bind(metrics))
        .expect("metrics listener");
    h.runtime.spawn(tributary_tier::metrics::serve(
        listener,
        std::future::pending(),
    ));
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let running = h
        .runtime
        .spawn(service::run(config, Faults::none(), false, async move {
            let _ = stop_rx.await;
        }));
    (metrics, stop_tx, running)
}

/// `GET path` on the metrics listener: status and body.
fn get(h: &Harness, metrics: std::net::SocketAddr, path: &str) -> Option<(u16, String)> {
    h.runtime.block_on(async {
        tributary_archive::install_crypto_provider();
        let response = reqwest::get(format!("http://{metrics}{path}")).await.ok()?;
        let status = response.status().as_u16();
        Some((status, response.text().await.ok()?))
    })
}

/// Polls `/health` until it answers 503 (at most `within`); returns its
/// body. Every 200 before says `upload_stalled: false`.
fn wait_stalled(h: &Harness, metrics: std::net::SocketAddr, within: Duration) -> Value {
    let deadline = Instant::now() + within;
    loop {
        if let Some((status, text)) = get(h, metrics, "/health") {
            let body: Value = serde_json::from_str(&text).unwrap();
            if status == 503 {
                return body;
            }
            assert_eq!(status, 200, "{text}");
            assert_eq!(body["upload_stalled"], false, "{text}");
        }
        assert!(Instant::now() < deadline, "never stalled");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn an_unreachable_object_store_turns_health_into_upload_stalled_with_its_error() {
    let h = Harness::new(&["/ns/stall"]);
    h.write(600, 20);
    let sealed = h.wal(&h.topics[0]).sealed_segments().len();
    assert!(sealed >= 2, "{sealed}");
    // Nothing listens on this port: every request is refused at once.
    let dead = free_tcp();
    let started = Instant::now();
    let (metrics, stop_tx, running) = start(&h, &format!("http://{dead}"), "tributary-test", 500);
    let health = wait_stalled(&h, metrics, Duration::from_secs(20));
    assert!(started.elapsed() >= Duration::from_millis(1000));
    assert_eq!(health["status"], "upload_stalled", "{health}");
    assert_eq!(health["upload_stalled"], true, "{health}");
    assert!(health["backlog_age_seconds"].is_u64(), "{health}");
    let error = health["last_error"].as_str().unwrap_or_default();
    assert!(
        error.starts_with("/ns/stall: ") && error.contains(&dead.to_string()),
        "the object store's error, naming its endpoint: {health}"
    );
    let (_, text) = get(&h, metrics, "/metrics").unwrap();
    assert!(
        text.lines().any(|l| l == "tributary_tier_upload_stalled 1"),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("tributary_tier_backlog_age_seconds ")),
        "{text}"
    );
    assert_eq!(
        h.wal(&h.topics[0]).sealed_segments().len(),
        sealed,
        "nothing trimmed"
    );
    assert!(h.descriptors(&h.topics[0]).is_empty(), "nothing committed");
    let _ = stop_tx.send(());
    h.runtime.block_on(running).unwrap().unwrap();
}

#[test]
fn a_hung_object_store_is_a_stalled_upload_while_the_pass_still_waits() {
    // A real S3 server that stops answering (SIGSTOP) while the service
    // runs, as in the tier trial: uploads wait for their 10 s timeout.
    let moto = Moto::start();
    let endpoint = moto.endpoint();
    let h = Harness::new(&["/ns/hung"]);
    h.runtime
        .block_on(common::create_bucket(&endpoint, "tributary-hung"));
    let (metrics, stop_tx, running) = start(&h, &endpoint, "tributary-hung", 10_000);
    // Healthy first: a pass over nothing has run.
    let deadline = Instant::now() + Duration::from_secs(30);
    while get(&h, metrics, "/metrics").is_none_or(|(_, t)| {
        !t.lines().any(|l| {
            l.starts_with("tributary_tier_passes_total ") && l != "tributary_tier_passes_total 0"
        })
    }) {
        assert!(Instant::now() < deadline, "no pass");
        std::thread::sleep(Duration::from_millis(50));
    }
    signal(moto.pid(), "-STOP");
    h.write(600, 20);
    let sealed = h.wal(&h.topics[0]).sealed_segments().len();
    assert!(sealed >= 2, "{sealed}");
    let written = Instant::now();
    // Stalled once the segments waited 1 s with no commit, long before the
    // pass ends (the request's timeout).
    let health = wait_stalled(&h, metrics, Duration::from_secs(8));
    assert!(written.elapsed() < Duration::from_secs(9), "{health}");
    assert_eq!(health["upload_stalled"], true, "{health}");
    assert!(health["backlog_age_seconds"].as_u64().is_some(), "{health}");
    // The running pass counts what it listed when it started: with a
    // 100 ms poll interval it may have started while `write` had sealed
    // only some of the segments (the CI run of c081b3c saw 1 of 2).
    let (_, text) = get(&h, metrics, "/metrics").unwrap();
    let backlog = text
        .lines()
        .find_map(|l| l.strip_prefix("tributary_tier_backlog_segments "))
        .and_then(|v| v.parse::<usize>().ok());
    assert!(
        backlog.is_some_and(|b| (1..=sealed).contains(&b)),
        "backlog {backlog:?} of {sealed} sealed: {text}"
    );
    assert!(h.descriptors(&h.topics[0]).is_empty(), "nothing committed");
    signal(moto.pid(), "-CONT");
    let _ = stop_tx.send(());
    h.runtime.block_on(running).unwrap().unwrap();
}

fn signal(pid: u32, sig: &str) {
    let status = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success(), "kill {sig} {pid}");
}
