//! The `edge-agent` binary: `publish` against a running agent, `run` with a
//! config file and a graceful SIGTERM, and one-line errors.

mod common;

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use serde_json::{Value, json};
use tributary_test_support::ports::free_tcp;

const BIN: &str = env!("CARGO_BIN_EXE_edge-agent");

async fn edge_agent(args: Vec<String>) -> Output {
    tokio::task::spawn_blocking(move || {
        Command::new(BIN)
            .args(&args)
            .env_remove("TRIB_EDGE_LOCAL_API")
            .env_remove("TRIB_EDGE_CONFIG")
            .output()
            .unwrap()
    })
    .await
    .unwrap()
}

fn stdout_json(output: &Output) -> Value {
    assert!(
        output.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

/// stderr of a failed run: exactly one line starting with `error: `.
fn one_error_line(output: &Output) -> String {
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let stderr = String::from_utf8(output.stderr.clone()).unwrap();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with("error: "), "{stderr}");
    stderr.trim_end().to_owned()
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_prints_the_offsets() {
    let dir = tempfile::tempdir().unwrap();
    let agent = start(config(dir.path())).await;
    let api = agent.local_addr().to_string();

    let out = edge_agent(args(&[
        "publish",
        "--local-api",
        &api,
        "--topic",
        "/e1/t",
        "--key",
        "k",
        "--header",
        "unit=celsius",
        "--header",
        "site=north",
        "71.5",
    ]))
    .await;
    assert_eq!(
        stdout_json(&out),
        json!({"topic": "/e1/t", "base_offset": 0, "next_offset": 1, "count": 1})
    );

    let file = dir.path().join("value.bin");
    std::fs::write(&file, [0u8, 1, 2, 255]).unwrap();
    let out = edge_agent(args(&[
        "publish",
        "--local-api",
        &api,
        "--topic",
        "/e1/t",
        "--file",
        file.to_str().unwrap(),
    ]))
    .await;
    assert_eq!(stdout_json(&out)["base_offset"], json!(1));

    let ndjson = dir.path().join("batch.ndjson");
    std::fs::write(
        &ndjson,
        "{\"value\":\"a\"}\n{\"value\":\"b\",\"key\":\"kb\"}\n",
    )
    .unwrap();
    // The address can also come from an agent config file.
    let cfg = dir.path().join("edge.toml");
    std::fs::write(&cfg, format!("local_api = \"{api}\"\n")).unwrap();
    let out = edge_agent(args(&[
        "publish",
        "--config",
        cfg.to_str().unwrap(),
        "--topic",
        "/e1/t",
        "--ndjson",
        ndjson.to_str().unwrap(),
    ]))
    .await;
    assert_eq!(
        stdout_json(&out),
        json!({"topic": "/e1/t", "base_offset": 2, "next_offset": 4, "count": 2})
    );

    let stored = read_wal(&agent, "/e1/t", 0);
    let mut first = stored[0].1.clone();
    first.headers.sort();
    assert_eq!(first.key, Some(Bytes::from_static(b"k")));
    assert_eq!(
        first.headers,
        [
            ("site".to_owned(), Bytes::from_static(b"north")),
            ("unit".to_owned(), Bytes::from_static(b"celsius")),
        ]
    );
    assert_eq!(first.value, Bytes::from_static(b"71.5"));
    assert_eq!(stored[1].1.value, Bytes::from_static(&[0, 1, 2, 255]));
    assert_eq!(stored[3].1.key, Some(Bytes::from_static(b"kb")));

    // Refusals and bad arguments: one line each, exit 1.
    let line = one_error_line(
        &edge_agent(args(&[
            "publish",
            "--local-api",
            &api,
            "--topic",
            "/other/t",
            "v",
        ]))
        .await,
    );
    assert_eq!(
        line,
        "error: 403: topic /other/t is outside this edge's namespace \"e1\": edge \"e1\" may only write to /e1/..."
    );
    let line = one_error_line(
        &edge_agent(args(&[
            "publish",
            "--local-api",
            &api,
            "--topic",
            "e1/t",
            "v",
        ]))
        .await,
    );
    assert!(line.starts_with("error: --topic: "), "{line}");
    let line = one_error_line(
        &edge_agent(args(&[
            "publish",
            "--local-api",
            &api,
            "--topic",
            "/e1/t",
            "--header",
            "nope",
            "v",
        ]))
        .await,
    );
    assert_eq!(line, "error: header \"nope\": expected name=value");
    std::fs::write(&ndjson, "{\"value\":1}\n").unwrap();
    let line = one_error_line(
        &edge_agent(args(&[
            "publish",
            "--local-api",
            &api,
            "--topic",
            "/e1/t",
            "--ndjson",
            ndjson.to_str().unwrap(),
        ]))
        .await,
    );
    assert_eq!(
        line,
        "error: 400: line 1: value: invalid type: integer `1`, expected a string (column 10)"
    );
    // A file over the largest record any agent accepts, or an endless one,
    // is refused before it is read whole (the agent sees no request).
    std::fs::write(&file, vec![7u8; 1024 * 1024 + 1]).unwrap();
    for (path, flag, what) in [
        (
            file.to_str().unwrap(),
            "--file",
            "one record value (max_record_bytes, which the record's key, headers and lengths count against too)",
        ),
        (
            "/dev/zero",
            "--file",
            "one record value (max_record_bytes, which the record's key, headers and lengths count against too)",
        ),
        (
            "/dev/zero",
            "--ndjson",
            "one NDJSON request (4 × max_batch_bytes)",
        ),
    ] {
        let line = one_error_line(
            &edge_agent(args(&[
                "publish",
                "--local-api",
                &api,
                "--topic",
                "/e1/t",
                flag,
                path,
            ]))
            .await,
        );
        let max = if flag == "--file" {
            1_048_576
        } else {
            33_554_432
        };
        assert_eq!(
            line,
            format!("error: {path} is over {max} bytes, the most an edge agent accepts as {what}")
        );
    }
    assert_eq!(read_wal(&agent, "/e1/t", 0).len(), 4);
    agent.shutdown().await.unwrap();

    // Nobody listening.
    let line = one_error_line(
        &edge_agent(args(&[
            "publish",
            "--local-api",
            &api,
            "--topic",
            "/e1/t",
            "v",
        ]))
        .await,
    );
    assert!(
        line.starts_with(&format!("error: agent at {api}: ")),
        "{line}"
    );
}

fn write_config(path: &Path, data_dir: &Path, addr: SocketAddr) {
    let mut file = std::fs::File::create(path).unwrap();
    write!(
        file,
        "data_dir = {:?}\nedge_id = \"e1\"\nlocal_api = \"{addr}\"\n\n[[topics]]\nname = \"/e1/jobs\"\nintent = \"tasks\"\n",
        data_dir.display().to_string()
    )
    .unwrap();
}

async fn wait_healthy(addr: SocketAddr, child: &mut std::process::Child) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        assert!(child.try_wait().unwrap().is_none(), "agent exited early");
        let ok = tokio::task::spawn_blocking(move || {
            ureq::get(&format!("http://{addr}/health")).call().is_ok()
        })
        .await
        .unwrap();
        if ok {
            return;
        }
        assert!(Instant::now() < deadline, "agent did not become healthy");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn stop(mut child: std::process::Child) -> (Option<i32>, String) {
    let pid = child.id().to_string();
    let status = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(status.success());
    tokio::task::spawn_blocking(move || {
        let status = child.wait().unwrap();
        let mut stderr = String::new();
        if let Some(mut pipe) = child.stderr.take() {
            std::io::Read::read_to_string(&mut pipe, &mut stderr).unwrap();
        }
        (status.code(), stderr)
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_serves_until_sigterm_and_restarts_where_it_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let cfg = dir.path().join("edge.toml");
    let addr = free_tcp();
    write_config(&cfg, &data, addr);
    let api = addr.to_string();

    for round in 0..2u64 {
        let mut child = Command::new(BIN)
            .args(["run", "--config", cfg.to_str().unwrap()])
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        wait_healthy(addr, &mut child).await;
        for i in 0..3 {
            let out = edge_agent(args(&[
                "publish",
                "--local-api",
                &api,
                "--topic",
                "/e1/jobs",
                "job",
            ]))
            .await;
            assert_eq!(stdout_json(&out)["base_offset"], json!(round * 3 + i));
        }
        let (code, stderr) = stop(child).await;
        assert_eq!(code, Some(0), "{stderr}");
        assert!(stderr.contains("SIGTERM received"), "{stderr}");
        assert!(stderr.contains("edge agent stopped"), "{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    assert!(
        data.join("topics/e1/jobs/00000000000000000000.log")
            .exists()
    );

    // A bad configuration: one line, exit 1.
    std::fs::write(
        &cfg,
        "data_dir = \"x\"\nedge_id = \"e1\"\nfull_policy = \"refuse\"\n",
    )
    .unwrap();
    let out = edge_agent(args(&["run", "--config", cfg.to_str().unwrap()])).await;
    let line = one_error_line(&out);
    assert!(
        line.starts_with(&format!(
            "error: {}: line 3: full_policy: unknown field `full_policy`",
            cfg.display()
        )),
        "{line}"
    );
    let out = edge_agent(args(&["run", "--data-dir", data.to_str().unwrap()])).await;
    assert_eq!(
        one_error_line(&out),
        "error: edge_id: not set and no tls.cert to take it from (config file, --edge-id or TRIB_EDGE_ID)"
    );
}
