//! The real `broker` binary and its data directory's identity file
//! (`identity.json`): a changed `node_id`, an edge agent's directory and a
//! garbled file are refused at start and by `check-config`, naming the
//! values, with every stored file left byte-for-byte (before this, a
//! changed `node_id` started and hung on the other node's Raft state); a
//! directory from before identity files starts and gets the file. And
//! `[members]` edited on an existing node is reported as ignored.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use broker_core::data_dir::Owner;
use tributary_test_support::ports::{free_tcp, free_udp};
use tributary_test_support::process::{Proc, output_within, wait_until};
use tributary_test_support::tree::files;

/// Every environment variable the broker reads: the tests set their own.
const ENV: &[&str] = &[
    "TRIB_BROKER_CONFIG",
    "TRIB_BROKER_NODE_ID",
    "TRIB_BROKER_DATA_DIR",
    "TRIB_BROKER_ADMIN_TOKEN",
    "TRIB_BROKER_ADMIN_TOKEN_FILE",
    "TRIB_NODE_ID",
    "TRIB_DATA_DIR",
    "TRIB_ADMIN_TOKEN",
    "TRIB_ADMIN_TOKEN_FILE",
    "CREDENTIALS_DIRECTORY",
];

fn broker(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_broker"));
    cmd.args(args).env("RUST_LOG", "off");
    for name in ENV {
        cmd.env_remove(name);
    }
    cmd
}

/// Runs `broker ARGS` to its end (at most 60 s).
fn run(args: &[&str]) -> Output {
    output_within(broker(args), Duration::from_secs(60))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A single-node broker `node_id` with its certificate and the data
/// directory `{dir}/data`; returns the config file and the admin address.
fn config(dir: &Path, node_id: u64) -> (PathBuf, SocketAddr) {
    let certs = dir.join("certs");
    if !certs.join("ca.pem").exists() {
        tributary_test_support::certs::issue(&certs, &[1, 2], &["plant1"]);
    }
    let admin = free_tcp();
    let text = format!(
        r#"node_id = {node_id}
data_dir = "{data}"
raft_listen = "{raft}"
admin_listen = "{admin}"
admin_plain_http = true
ingest_listen = "{ingest}"
admin_token = "identity-test-token"
[tls]
cert = "{certs}/broker-{node_id}.pem"
key = "{certs}/broker-{node_id}.key"
ca = "{certs}/ca.pem"
"#,
        data = dir.join("data").display(),
        raft = free_udp(),
        ingest = free_udp(),
        certs = certs.display(),
    );
    let path = dir.join(format!("broker-{node_id}.toml"));
    tributary_test_support::certs::write_private(&path, &text);
    (path, admin)
}

/// Whether the admin API at `admin` answers an HTTP request (its server
/// runs, and with it the SIGTERM handler).
fn answers(admin: SocketAddr) -> bool {
    use std::io::{Read as _, Write as _};
    let Ok(mut stream) = std::net::TcpStream::connect(admin) else {
        return false;
    };
    let mut head = [0u8; 5];
    stream.write_all(b"GET /v1/health HTTP/1.0\r\n\r\n").is_ok()
        && stream.read_exact(&mut head).is_ok()
        && &head == b"HTTP/"
}

/// Runs the broker of `config` until its admin API answers and its Raft
/// database holds state, then stops it with SIGTERM.
fn run_once(config: &(PathBuf, SocketAddr), data: &Path) {
    let (path, admin) = config;
    let mut node = Proc::new("broker", broker(&["-c", path.to_str().unwrap()]));
    node.start();
    wait_until("broker admin API", Duration::from_secs(60), || {
        answers(*admin)
    });
    let raft = data.join("raft/raft.redb");
    wait_until("Raft state on disk", Duration::from_secs(60), || {
        std::fs::metadata(&raft).is_ok_and(|m| m.len() > 0)
    });
    assert_eq!(node.terminate(), Some(0));
}

/// Runs the broker and `check-config` on `config`: both fail with
/// `message` (`check-config` as a `data_dir` problem), and change nothing
/// in `data`.
fn both_refuse(config: &Path, data: &Path, message: &str) {
    let before = files(data);
    let out = run(&["-c", config.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(text(&out.stderr), format!("error: {message}\n"));
    let out = run(&["check-config", "-c", config.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(text(&out.stdout), "");
    assert_eq!(text(&out.stderr), format!("error: data_dir: {message}\n"));
    assert!(before == files(data), "the data directory is untouched");
}

#[test]
fn a_changed_node_id_is_refused_and_the_raft_state_is_kept_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let node1 = config(dir.path(), 1);
    run_once(&node1, &data);
    let identity = data.join("identity.json");
    assert_eq!(
        std::fs::read(&identity).unwrap(),
        Owner::Broker { node_id: 1 }.encode()
    );
    let node2 = config(dir.path(), 2);
    both_refuse(
        &node2.0,
        &data,
        &format!(
            "{}: this data directory belongs to broker node_id 1, but the configuration is \
             broker node_id 2: its Raft state is node 1's and another node must not run on it; \
             refusing to start. Set node_id = 1 back, or give this node its own empty data_dir",
            identity.display()
        ),
    );
    // Set back: it runs.
    run_once(&config(dir.path(), 1), &data);
}

#[test]
fn a_data_dir_from_before_identity_files_starts_and_gets_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let identity = data.join("identity.json");
    let node1 = config(dir.path(), 1);
    run_once(&node1, &data);
    // As the previous version left it: the same files, no identity file.
    std::fs::remove_file(&identity).unwrap();
    let out = run(&["check-config", "-c", node1.0.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(text(&out.stdout), "ok\n");
    assert_eq!(
        text(&out.stderr),
        format!(
            "note: data_dir: {} has no identity file yet (written before identity files): \
             start-up writes {} for broker node_id 1\n",
            data.display(),
            identity.display()
        )
    );
    assert!(!identity.exists(), "check-config writes nothing");
    let node1 = config(dir.path(), 1);
    run_once(&node1, &data);
    assert_eq!(
        std::fs::read(&identity).unwrap(),
        Owner::Broker { node_id: 1 }.encode()
    );
    let out = run(&["check-config", "-c", node1.0.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(text(&out.stderr), "");
}

#[test]
fn a_garbled_identity_file_is_refused_and_left_as_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let identity = data.join("identity.json");
    let node1 = config(dir.path(), 1);
    run_once(&node1, &data);
    std::fs::write(&identity, [0u8; 16]).unwrap();
    let node1 = config(dir.path(), 1);
    both_refuse(
        &node1.0,
        &data,
        &format!(
            "{}: not an identity file: expected value at line 1 column 1; refusing to start and \
             leaving the file as it is. If it was damaged, restore it (the format is in \
             FORMAT.md, \"Data directory identity\"), or remove it to have it written from this \
             configuration (broker node_id 1) at the next start",
            identity.display()
        ),
    );
}

#[test]
fn an_edge_agents_data_dir_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let node1 = config(dir.path(), 1);
    // An edge's directory as an agent from before identity files left it.
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("metadata.redb"), b"edge metadata").unwrap();
    let wal = data.join("topics/plant1/events/00000000000000000000.log");
    std::fs::create_dir_all(wal.parent().unwrap()).unwrap();
    std::fs::write(&wal, b"batches").unwrap();
    both_refuse(
        &node1.0,
        &data,
        &format!(
            "{data} has no identity.json but holds {data}/metadata.redb, so it is an edge \
             agent's data directory: refusing to start broker node_id 1 on it. Point data_dir at \
             this broker's own directory",
            data = data.display()
        ),
    );
    // And as an agent of this version wrote it.
    std::fs::write(
        data.join("identity.json"),
        Owner::EdgeAgent {
            edge_id: "plant1".into(),
        }
        .encode(),
    )
    .unwrap();
    both_refuse(
        &node1.0,
        &data,
        &format!(
            "{}: this data directory belongs to edge-agent edge_id \"plant1\", but the \
             configuration is broker node_id 1, another component; refusing to start. Point \
             data_dir at this broker's own directory",
            data.join("identity.json").display()
        ),
    );
}

/// A config trial: `[members]` added to the config of an existing node was
/// silently ignored (it is read only when a cluster forms). The broker now
/// says so at start, naming both lists, and runs on the committed one.
#[test]
fn members_added_to_an_existing_node_are_reported_as_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let node1 = config(dir.path(), 1);
    run_once(&node1, &data);
    let text = std::fs::read_to_string(&node1.0).unwrap();
    let raft = text
        .lines()
        .find_map(|l| l.strip_prefix("raft_listen = "))
        .map(|v| v.trim_matches('"').to_owned())
        .unwrap();
    let text = format!("{text}[members]\n1 = \"{raft}\"\n2 = \"127.0.0.1:9\"\n");
    tributary_test_support::certs::write_private(&node1.0, &text);
    let log = dir.path().join("broker.log");
    let mut cmd = broker(&["-c", node1.0.to_str().unwrap()]);
    cmd.env("RUST_LOG", "warn");
    let mut node = Proc::logged("broker", cmd, &log).unwrap();
    node.start();
    wait_until("broker admin API", Duration::from_secs(60), || {
        answers(node1.1)
    });
    assert_eq!(node.terminate(), Some(0));
    let logged = std::fs::read_to_string(&log).unwrap();
    let line = logged
        .lines()
        .find(|l| l.contains("[members] differs from the cluster's committed membership"))
        .unwrap_or_else(|| panic!("no warning in:\n{logged}"));
    assert!(
        line.contains(&format!("configured=1={raft},2=127.0.0.1:9"))
            && line.contains(&format!("committed=1={raft}")),
        "{line}"
    );
}
