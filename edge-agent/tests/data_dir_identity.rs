//! The real `edge-agent` binary and its data directory's identity file
//! (`identity.json`): a changed `edge_id` on a directory holding another
//! edge's unreplicated backlog, a broker's directory, a garbled file are
//! refused at start and by `check-config`, naming the values, with every
//! stored file left byte-for-byte; a directory from before identity files
//! starts and gets the file.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use broker_core::data_dir::Owner;
use tributary_test_support::ports::{free_tcp, free_udp};
use tributary_test_support::process::{Proc, output_within, wait_for_tcp};
use tributary_test_support::tree::files;

const BIN: &str = env!("CARGO_BIN_EXE_edge-agent");

/// `edge-agent ARGS` without any `TRIB_EDGE_*` variable of the test's
/// environment, logging off.
fn command(args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args(args).env("RUST_LOG", "off");
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("TRIB_EDGE_") {
            cmd.env_remove(name);
        }
    }
    cmd
}

/// Runs `edge-agent ARGS` to its end (at most 60 s).
fn run(args: &[&str]) -> Output {
    output_within(command(args), Duration::from_secs(60))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// An edge agent `edge_id` with its certificate, an unreachable broker
/// (so nothing is replicated: a backlog) and the data directory
/// `{dir}/data`; returns the config file and the local API address.
fn config(dir: &Path, edge_id: &str) -> (PathBuf, SocketAddr) {
    let certs = dir.join("certs");
    if !certs.join("ca.pem").exists() {
        tributary_test_support::certs::issue(&certs, &[1], &["plant1", "plant2"]);
    }
    let local_api = free_tcp();
    let path = dir.join(format!("edge-{edge_id}.toml"));
    let text = format!(
        r#"data_dir = "{data}"
edge_id = "{edge_id}"
brokers = ["{broker}"]
local_api = "{local_api}"
[tls]
cert = "{certs}/edge-{edge_id}.pem"
key = "{certs}/edge-{edge_id}.key"
ca = "{certs}/ca.pem"
"#,
        data = dir.join("data").display(),
        broker = free_udp(),
        certs = certs.display(),
    );
    std::fs::write(&path, text).unwrap();
    (path, local_api)
}

/// Runs the agent of `config`, publishes `values` to `/{ns}/events` through
/// the CLI and stops it with SIGTERM; returns the offsets assigned.
fn run_and_publish(config: &(PathBuf, SocketAddr), ns: &str, values: &[&str]) -> Vec<u64> {
    let (path, api) = config;
    let mut agent = Proc::new(
        "edge-agent",
        command(&["run", "-c", path.to_str().unwrap()]),
    );
    agent.start();
    wait_for_tcp("edge-agent local API", *api, Duration::from_secs(60));
    let mut offsets = Vec::new();
    for value in values {
        let out = run(&[
            "publish",
            "--local-api",
            &api.to_string(),
            "--topic",
            &format!("/{ns}/events"),
            value,
        ]);
        assert!(out.status.success(), "{out:?}");
        let answer: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        offsets.push(answer["base_offset"].as_u64().unwrap());
    }
    assert_eq!(agent.terminate(), Some(0));
    offsets
}

/// Runs `run` and `check-config` on `config`: both fail with `message`
/// (`check-config` as a `data_dir` problem), and change nothing in `data`.
fn both_refuse(config: &Path, data: &Path, message: &str) {
    let before = files(data);
    let out = run(&["run", "-c", config.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(text(&out.stderr), format!("error: {message}\n"));
    let out = run(&["check-config", "-c", config.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(text(&out.stdout), "");
    assert_eq!(text(&out.stderr), format!("error: data_dir: {message}\n"));
    assert!(before == files(data), "the data directory is untouched");
}

#[test]
fn a_changed_edge_id_is_refused_and_the_backlog_is_kept_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let plant1 = config(dir.path(), "plant1");
    assert_eq!(run_and_publish(&plant1, "plant1", &["a", "b"]), [0, 1]);
    let identity = data.join("identity.json");
    assert_eq!(
        std::fs::read(&identity).unwrap(),
        Owner::EdgeAgent {
            edge_id: "plant1".into()
        }
        .encode()
    );
    assert!(
        files(&data.join("topics/plant1/events"))
            .keys()
            .any(|p| p.extension().is_some_and(|e| e == "log")),
        "the backlog is in a WAL segment"
    );

    let plant2 = config(dir.path(), "plant2");
    both_refuse(
        &plant2.0,
        &data,
        &format!(
            "{identity}: this data directory belongs to edge-agent edge_id \"plant1\", but the \
             configuration is edge-agent edge_id \"plant2\": the records under \
             {data}/topics/plant1 not yet replicated would never be sent; refusing to start. Set \
             edge_id = \"plant1\" back and let the backlog drain, then move {data} aside to start \
             under the new edge_id",
            identity = identity.display(),
            data = data.display()
        ),
    );

    // Set back: it runs on, with the same log.
    assert_eq!(run_and_publish(&plant1, "plant1", &["c"]), [2]);
}

#[test]
fn a_data_dir_from_before_identity_files_starts_and_gets_the_file_unless_its_topics_are_another_edges()
 {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let identity = data.join("identity.json");
    let plant1 = config(dir.path(), "plant1");
    assert_eq!(run_and_publish(&plant1, "plant1", &["a"]), [0]);
    // As the previous version left it: the same files, no identity file.
    std::fs::remove_file(&identity).unwrap();

    // Another edge_id: refused by the topics' namespace; no file written.
    let plant2 = config(dir.path(), "plant2");
    both_refuse(
        &plant2.0,
        &data,
        &format!(
            "{data} has no identity.json and holds the topics of namespace(s) plant1 (under \
             {data}/topics), not of edge_id \"plant2\": edge_id was changed, and their records \
             not yet replicated would never be sent; refusing to start. Set edge_id back to the \
             old value and let the backlog drain, then move {data} aside to start under a new \
             edge_id",
            data = data.display()
        ),
    );
    assert!(!identity.exists());

    // Its own edge_id: a note from check-config, then the agent adopts it.
    let out = run(&["check-config", "-c", plant1.0.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(text(&out.stdout), "ok\n");
    assert_eq!(
        text(&out.stderr),
        format!(
            "note: data_dir: {} has no identity file yet (written before identity files): \
             start-up writes {} for edge-agent edge_id \"plant1\"\n",
            data.display(),
            identity.display()
        )
    );
    assert!(!identity.exists(), "check-config writes nothing");
    assert_eq!(run_and_publish(&plant1, "plant1", &["b"]), [1]);
    assert_eq!(
        std::fs::read(&identity).unwrap(),
        Owner::EdgeAgent {
            edge_id: "plant1".into()
        }
        .encode()
    );
    let out = run(&["check-config", "-c", plant1.0.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(text(&out.stderr), "");
}

#[test]
fn a_garbled_identity_file_is_refused_and_left_as_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let identity = data.join("identity.json");
    let plant1 = config(dir.path(), "plant1");
    assert_eq!(run_and_publish(&plant1, "plant1", &["a"]), [0]);
    std::fs::write(
        &identity,
        b"{\"format_version\": 1, \"component\": \"edge-ag",
    )
    .unwrap();
    both_refuse(
        &plant1.0,
        &data,
        &format!(
            "{}: not an identity file: EOF while parsing a string at line 1 column 43; refusing \
             to start and leaving the file as it is. If it was damaged, restore it (the format \
             is in FORMAT.md, \"Data directory identity\"), or remove it to have it written from \
             this configuration (edge-agent edge_id \"plant1\") at the next start",
            identity.display()
        ),
    );
}

#[test]
fn a_brokers_data_dir_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let plant1 = config(dir.path(), "plant1");
    // A broker's directory as a broker from before identity files left it.
    std::fs::create_dir_all(data.join("raft")).unwrap();
    std::fs::write(data.join("raft/raft.redb"), b"raft state").unwrap();
    let wal = data.join("topics/plant1/events/00000000000000000000.log");
    std::fs::create_dir_all(wal.parent().unwrap()).unwrap();
    std::fs::write(&wal, b"batches").unwrap();
    both_refuse(
        &plant1.0,
        &data,
        &format!(
            "{data} has no identity.json but holds {data}/raft, so it is a broker's data \
             directory: refusing to start edge-agent edge_id \"plant1\" on it. Point data_dir at \
             this edge-agent's own directory",
            data = data.display()
        ),
    );
    // And as a broker of this version wrote it.
    std::fs::write(
        data.join("identity.json"),
        Owner::Broker { node_id: 1 }.encode(),
    )
    .unwrap();
    both_refuse(
        &plant1.0,
        &data,
        &format!(
            "{}: this data directory belongs to broker node_id 1, but the configuration is \
             edge-agent edge_id \"plant1\", another component; refusing to start. Point \
             data_dir at this edge-agent's own directory",
            data.join("identity.json").display()
        ),
    );
}
