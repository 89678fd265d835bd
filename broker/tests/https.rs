//! The broker binary's admin listener and its secrets, at start-up:
//! - HTTPS by default: a client that trusts the cluster CA is served, one
//!   that trusts another CA cannot connect, and nothing it sent changed the
//!   broker; plain HTTP to the HTTPS port gets no answer;
//! - `admin_plain_http = true` with a non-loopback `admin_listen` stops the
//!   broker at start-up with the field named; on loopback it serves plain
//!   HTTP and says so in the log;
//! - a world-readable configuration file holding the token, token file or
//!   TLS key stops it with the `chmod 600` to run;
//! - `$CREDENTIALS_DIRECTORY/admin-token` is the token when the config has
//!   none.

mod common;

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{Node, TOKEN, agent, get_json, wait_for_leader, write_config_with};
use tributary_test_support::ports::{free_tcp, free_udp};
use tributary_test_support::process::{Proc, wait_until};

/// A single-node config under `dir` (certificates in `dir/certs`) with
/// `extra` appended; returns its path and admin address.
fn single(dir: &Path, extra: &str) -> (PathBuf, SocketAddr) {
    let certs = dir.join("certs");
    tributary_test_support::certs::issue(&certs, &[1], &[]);
    let admin = free_tcp();
    let config = write_config_with(dir, &certs, 1, &[free_udp()], admin, 1000, extra);
    (config, admin)
}

/// Runs `broker --config config` (with `env`) to its exit, at most 30 s;
/// returns the exit status's success and stderr.
fn run_to_exit(config: &Path, env: &[(&str, &Path)]) -> (bool, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_broker"));
    command
        .arg("--config")
        .arg(config)
        .env("RUST_LOG", "warn")
        .env_remove("CREDENTIALS_DIRECTORY")
        .env_remove("TRIB_ADMIN_TOKEN");
    for (key, value) in env {
        command.env(key, value);
    }
    let mut child = command
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn broker");
    let exited = tributary_test_support::process::wait_exit(&mut child, Duration::from_secs(30));
    let mut stderr = String::new();
    if let Some(mut pipe) = child.stderr.take() {
        use std::io::Read;
        let _ = pipe.read_to_string(&mut stderr);
    }
    match exited {
        Some(code) => (code == Some(0), stderr),
        None => panic!("broker still running after 30 s: {stderr}"),
    }
}

fn namespaces(node: &Node) -> serde_json::Value {
    get_json(&node.url("/namespaces")).expect("list namespaces")
}

#[test]
fn a_client_that_does_not_trust_the_cluster_ca_cannot_connect_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (config, admin) = single(dir.path(), "");
    let mut node = Node::new(1, config, admin);
    node.start();
    wait_for_leader(std::slice::from_ref(&node));
    let before = namespaces(&node);

    let other = dir.path().join("other-ca");
    tributary_test_support::certs::issue(&other, &[1], &[]);
    let stranger = tributary_test_support::certs::https_agent(&other);
    let refused = stranger
        .post(&node.url("/namespaces"))
        .header("Authorization", &format!("Bearer {TOKEN}"))
        .send_json(serde_json::json!({ "name": "intruder" }));
    let err = refused.expect_err("a client of another CA got an answer");
    assert!(
        err.to_string().contains("invalid peer certificate"),
        "{err}"
    );
    // Plain HTTP to the HTTPS port: no HTTP answer.
    let plain = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .new_agent()
        .post(&format!("http://{admin}/v1/namespaces"))
        .header("Authorization", &format!("Bearer {TOKEN}"))
        .send_json(serde_json::json!({ "name": "intruder" }));
    assert!(plain.is_err(), "plain HTTP answered: {plain:?}");

    assert_eq!(namespaces(&node), before);
    assert!(!before.to_string().contains("intruder"), "{before}");
    // The trusted client can change it.
    let mut created = agent()
        .post(&node.url("/namespaces"))
        .header("Authorization", &format!("Bearer {TOKEN}"))
        .send_json(serde_json::json!({ "name": "plant9" }))
        .expect("create over HTTPS");
    assert!(
        created.status().is_success(),
        "{:?}",
        created.body_mut().read_to_string()
    );
    assert!(namespaces(&node).to_string().contains("plant9"));
}

#[test]
fn plain_http_is_refused_on_a_non_loopback_bind_and_logged_on_loopback() {
    let dir = tempfile::tempdir().unwrap();
    let (config, _) = single(dir.path(), "");
    let text = std::fs::read_to_string(&config).unwrap();
    let port = free_tcp().port();
    let wide = text
        .lines()
        .map(|line| {
            if line.starts_with("admin_listen") {
                format!("admin_listen = \"0.0.0.0:{port}\"\nadmin_plain_http = true")
            } else {
                line.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    tributary_test_support::certs::write_private(&config, &wide);
    let (ok, stderr) = run_to_exit(&config, &[]);
    assert!(!ok, "started with plain HTTP on 0.0.0.0: {stderr}");
    assert!(
        stderr.contains("invalid setting admin_plain_http"),
        "{stderr}"
    );
    assert!(stderr.contains("loopback"), "{stderr}");

    // On loopback: plain HTTP, and the log says so.
    let dir = tempfile::tempdir().unwrap();
    let (config, admin) = single(dir.path(), "admin_plain_http = true\n");
    // `extra` lands after [raft]: move it to the top level.
    let text = std::fs::read_to_string(&config).unwrap();
    let text = format!(
        "admin_plain_http = true\n{}",
        text.replace("admin_plain_http = true\n", "")
    );
    tributary_test_support::certs::write_private(&config, &text);
    let log = dir.path().join("broker.log");
    let mut command = Command::new(env!("CARGO_BIN_EXE_broker"));
    command.arg("--config").arg(&config).env("RUST_LOG", "info");
    let mut broker = Proc::logged("broker", command, &log).unwrap();
    broker.start();
    let url = format!("http://{admin}/v1/namespaces");
    wait_until("plain HTTP answers", Duration::from_secs(60), || {
        ureq::get(&url)
            .header("Authorization", &format!("Bearer {TOKEN}"))
            .call()
            .is_ok_and(|r| r.status() == 200)
    });
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(
        logged.contains("admin API over plain HTTP on loopback"),
        "{logged}"
    );
    broker.kill();
}

#[test]
fn world_readable_secrets_are_refused_at_start_up_with_the_chmod_to_run() {
    let dir = tempfile::tempdir().unwrap();
    let (config, _) = single(dir.path(), "");
    let mode = |path: &Path, mode: u32| {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    };
    // The config file holds admin_token.
    mode(&config, 0o644);
    let (ok, stderr) = run_to_exit(&config, &[]);
    assert!(!ok, "{stderr}");
    assert!(stderr.contains("mode 0644"), "{stderr}");
    assert!(
        stderr.contains(&format!("chmod 600 {}", config.display())),
        "{stderr}"
    );
    assert!(!stderr.contains(TOKEN), "the token was printed: {stderr}");

    // A token file instead of the token.
    let token_file = dir.path().join("admin-token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    mode(&token_file, 0o604);
    let text = std::fs::read_to_string(&config).unwrap().replace(
        &format!("admin_token = \"{TOKEN}\""),
        &format!("admin_token_file = \"{}\"", token_file.display()),
    );
    std::fs::write(&config, text).unwrap();
    mode(&config, 0o644); // no token in it any more: may be world-readable
    let (ok, stderr) = run_to_exit(&config, &[]);
    assert!(!ok, "{stderr}");
    assert!(
        stderr.contains(&format!("chmod 600 {}", token_file.display())),
        "{stderr}"
    );
    assert!(!stderr.contains(TOKEN), "the token was printed: {stderr}");
    mode(&token_file, 0o600);

    // The broker's TLS key.
    let key = dir.path().join("certs/broker-1.key");
    mode(&key, 0o644);
    let (ok, stderr) = run_to_exit(&config, &[]);
    assert!(!ok, "{stderr}");
    assert!(stderr.contains("TLS private key"), "{stderr}");
    assert!(
        stderr.contains(&format!("chmod 600 {}", key.display())),
        "{stderr}"
    );
}

#[test]
fn the_admin_token_comes_from_the_credentials_directory_when_the_config_has_none() {
    let dir = tempfile::tempdir().unwrap();
    let (config, admin) = single(dir.path(), "");
    let text = std::fs::read_to_string(&config)
        .unwrap()
        .replace(&format!("admin_token = \"{TOKEN}\"\n"), "");
    std::fs::write(&config, text).unwrap();
    let credentials = dir.path().join("credentials");
    std::fs::create_dir(&credentials).unwrap();
    tributary_test_support::certs::write_private(&credentials.join("admin-token"), TOKEN);
    let mut command = Command::new(env!("CARGO_BIN_EXE_broker"));
    command
        .arg("--config")
        .arg(&config)
        .env("RUST_LOG", "warn")
        .env_remove("TRIB_ADMIN_TOKEN")
        .env("CREDENTIALS_DIRECTORY", &credentials);
    let mut node = Node::from_proc(1, config, admin, Proc::new("broker", command));
    node.start();
    // get_json sends TOKEN: answered 200 only if the broker read it.
    wait_for_leader(std::slice::from_ref(&node));
    let wrong = agent()
        .get(&node.url("/namespaces"))
        .header("Authorization", "Bearer not-the-token")
        .call()
        .unwrap();
    assert_eq!(wrong.status(), 401);
}
