//! The real `edge-agent` with `--log-format json`: publishes refused with
//! 507 because the topic's disk budget is full are logged, once per topic
//! per 10 s (the next refusals only counted), as a JSON line whose fields
//! are plain values. Issue 21.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use tributary_test_support::ports::free_tcp;
use tributary_test_support::process::wait_exit;

#[test]
fn a_full_budget_is_logged_once_per_topic_with_plain_values() {
    let dir = tempfile::tempdir().unwrap();
    let api = free_tcp();
    let path = dir.path().join("edge.toml");
    std::fs::write(
        &path,
        format!(
            "data_dir = \"{data}\"\nedge_id = \"e1\"\nlocal_api = \"{api}\"\n\
             max_record_bytes = 4096\nmax_batch_bytes = 65536\n\
             [[topics]]\nname = \"/e1/t\"\nintent = \"event_stream\"\ndisk_budget_bytes = 131072\n",
            data = dir.path().join("data").display(),
        ),
    )
    .unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_edge-agent"));
    cmd.args(["run", "--log-format", "json", "-c"])
        .arg(&path)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("TRIB_EDGE_") {
            cmd.env_remove(name);
        }
    }
    let mut child = cmd.spawn().expect("spawn edge-agent");
    let agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(30)))
        .build()
        .new_agent();
    let url = format!("http://{api}/v1/topics/e1/t/records");
    let value = "x".repeat(4000);
    let deadline = Instant::now() + Duration::from_secs(30);
    let (mut stored, mut refused) = (0u32, 0u32);
    while refused < 25 {
        assert!(
            Instant::now() < deadline,
            "{stored} stored, {refused} refused after 30 s"
        );
        let Ok(response) = agent.post(&url).send(value.as_str()) else {
            std::thread::sleep(Duration::from_millis(50)); // still starting
            continue;
        };
        match response.status().as_u16() {
            200 => stored += 1,
            507 => refused += 1,
            other => panic!("unexpected status {other}"),
        }
    }
    assert!(stored > 10, "the budget took {stored} records first");
    // SIGTERM: the agent flushes its log and exits 0.
    assert_eq!(terminate(&mut child), Some(0), "exit status on SIGTERM");
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut stderr)
        .unwrap();
    let lines: Vec<Value> = stderr
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .filter(|v: &Value| v["target"] == "tributary_edge::refusals")
        .collect();
    assert_eq!(
        lines.len(),
        1,
        "one line for {refused} refusals within 10 s:\n{stderr}"
    );
    let fields = &lines[0]["fields"];
    assert_eq!(lines[0]["level"], "WARN");
    assert_eq!(fields["topic"], "/e1/t");
    assert_eq!(fields["kind"], "disk_budget_full");
    assert_eq!(fields["limit"], "topic disk_budget_bytes");
    assert_eq!(fields["limit_bytes"], 131072);
    assert_eq!(fields["via"], "http");
    assert_eq!(fields["suppressed"], 0);
    assert!(fields["used_bytes"].as_u64().is_some(), "{fields}");
    assert!(fields["batch_bytes"].as_u64().is_some(), "{fields}");
    assert!(
        fields["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("publish refused: the disk budget is full (HTTP 507)")),
        "{fields}"
    );
}

/// SIGTERM through `kill(1)` and the exit status within 30 s.
fn terminate(child: &mut std::process::Child) -> Option<i32> {
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    wait_exit(child, Duration::from_secs(30)).flatten()
}
