//! The real `edge-agent` binary with its local API on a LAN address: refused
//! without a token (at start and by `check-config`, one line naming
//! `local_api`); with a token and `[local_api_tls]`, HTTPS where every
//! route but `/health` answers `401` without the token or with a wrong one
//! and works with the right one. Issue 21.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;
use tributary_test_support::ports::free_tcp;
use tributary_test_support::process::{Proc, output_within};

const TOKEN: &str = "lan-token-0123456789abcdef";

fn command(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_edge-agent"));
    cmd.args(args).env("RUST_LOG", "off");
    for (name, _) in std::env::vars_os() {
        let name_text = name.to_string_lossy();
        if name_text.starts_with("TRIB_EDGE_") || name_text == "CREDENTIALS_DIRECTORY" {
            cmd.env_remove(name);
        }
    }
    cmd
}

/// Runs `edge-agent ARGS` to its end (at most 60 s).
fn edge_agent(args: &[&str]) -> Output {
    output_within(command(args), Duration::from_secs(60))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A configuration in `dir` with the local API on all addresses at `port`
/// and `extra` lines at the top level.
fn config(dir: &Path, port: u16, extra: &str) -> PathBuf {
    let path = dir.join("edge.toml");
    std::fs::write(
        &path,
        format!(
            "data_dir = \"{data}\"\nedge_id = \"e1\"\nlocal_api = \"0.0.0.0:{port}\"\n{extra}\n\
             [[topics]]\nname = \"/e1/t\"\nintent = \"event_stream\"\n",
            data = dir.join("data").display()
        ),
    )
    .unwrap();
    path
}

#[test]
fn a_lan_local_api_without_a_token_is_refused_at_start_and_by_check_config() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_tcp().port();
    let path = config(dir.path(), port, "");
    let path = path.to_str().unwrap();
    let line = format!(
        "error: local_api: 0.0.0.0:{port} is reachable from other hosts, so it needs a bearer token: \
         set local_api_token_file (a file holding the token, chmod 600) or the systemd credential \
         edge-api-token, or bind 127.0.0.1\n"
    );
    let out = edge_agent(&["check-config", "-c", path]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = text(&out.stderr);
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors, [line.trim_end()], "{stderr}");
    let out = edge_agent(&["run", "-c", path]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(text(&out.stderr), line);
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "nothing listens"
    );
    assert!(!dir.path().join("data").exists(), "nothing was created");
}

fn write_private(path: &Path, text: &str) {
    tributary_test_support::certs::write_private(path, text);
}

#[test]
fn the_lan_api_over_tls_wants_the_right_bearer_token_on_every_route_but_health() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    // A certificate whose names include `localhost`, from the dev CA.
    tributary_test_support::certs::issue(&certs, &[1], &[]);
    let token_file = dir.path().join("api-token");
    write_private(&token_file, &format!("{TOKEN}\n"));
    let port = free_tcp().port();
    let path = config(
        dir.path(),
        port,
        &format!(
            "local_api_token_file = \"{token}\"\n[local_api_tls]\ncert = \"{certs}/broker-1.pem\"\nkey = \"{certs}/broker-1.key\"\n",
            token = token_file.display(),
            certs = certs.display(),
        ),
    );
    let out = edge_agent(&["check-config", "-c", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(text(&out.stdout), "ok\n");
    let mut agent = Proc::new(
        "edge-agent",
        command(&["run", "-c", path.to_str().unwrap()]),
    );
    agent.start();
    let https = tributary_test_support::certs::https_agent(&certs);
    let base = format!("https://localhost:{port}");
    // `/health` is open: load balancers probe it without a token.
    let deadline = Instant::now() + Duration::from_secs(30);
    let health = loop {
        match https.get(&format!("{base}/health")).call() {
            Ok(mut r) => {
                break (
                    r.status().as_u16(),
                    r.body_mut().read_json::<Value>().unwrap(),
                );
            }
            Err(e) => {
                assert!(
                    Instant::now() < deadline,
                    "no HTTPS answer within 30 s: {e}"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    };
    assert_eq!(health.0, 200, "{}", health.1);
    assert_eq!(health.1["status"], "ok");

    let publish = |token: Option<&str>| {
        let mut request = https.post(&format!("{base}/v1/topics/e1/t/records?key=k"));
        if let Some(token) = token {
            request = request.header("authorization", &format!("Bearer {token}"));
        }
        let mut response = request.send("reading 1").expect("publish");
        let challenge = response
            .headers()
            .get("www-authenticate")
            .map(|v| v.to_str().unwrap().to_owned());
        (
            response.status().as_u16(),
            challenge,
            response.body_mut().read_json::<Value>().unwrap(),
        )
    };
    let (status, challenge, body) = publish(None);
    assert_eq!(
        (status, challenge.as_deref()),
        (401, Some("Bearer")),
        "{body}"
    );
    assert_eq!(body["kind"], "unauthorized");
    let (status, _, body) = publish(Some("lan-token-0123456789abcdeX"));
    assert_eq!(status, 401, "{body}");
    assert_eq!(
        body["error"],
        "the bearer token is not this agent's local API token"
    );
    let (status, _, body) = publish(Some(TOKEN));
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        (body["base_offset"].as_u64(), body["next_offset"].as_u64()),
        (Some(0), Some(1)),
        "the refused requests stored nothing: {body}"
    );
    // The other routes too.
    let metrics = https.get(&format!("{base}/metrics")).call().unwrap();
    assert_eq!(metrics.status().as_u16(), 401);
    // The scheme in any case (RFC 9110, section 11.1), as the broker.
    let lower = https
        .get(&format!("{base}/metrics"))
        .header("authorization", &format!("bearer {TOKEN}"))
        .call()
        .unwrap();
    assert_eq!(lower.status().as_u16(), 200);
    let mut metrics = https
        .get(&format!("{base}/metrics"))
        .header("authorization", &format!("Bearer {TOKEN}"))
        .call()
        .unwrap();
    assert_eq!(metrics.status().as_u16(), 200);
    let text = metrics.body_mut().read_to_string().unwrap();
    assert!(
        text.lines()
            .any(|l| l == "tributary_edge_records_in_total{edge=\"e1\",topic=\"/e1/t\"} 1"),
        "{text}"
    );
    let topics = https.get(&format!("{base}/v1/topics")).call().unwrap();
    assert_eq!(topics.status().as_u16(), 401);
    // Plain HTTP on the TLS port gets no HTTP answer.
    let plain = ureq::get(&format!("http://127.0.0.1:{port}/health")).call();
    assert!(plain.is_err(), "{plain:?}");
    assert_eq!(agent.terminate(), Some(0), "exit status on SIGTERM");
}
