//! One real single-node broker on 127.0.0.1 with no edge agent: the target
//! of `edge-swarm` runs (tests and the fan-in benchmark). Certificates
//! (CA and `broker-1`), ports and the configuration file are written by
//! [`SoloBroker::new`]; nothing starts until asked.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use tributary_test_support::ports::{free_tcp, free_udp};
use tributary_test_support::process::{Proc, wait_for_tcp};

use crate::cluster::child_log_filter;

/// Writes (mode 0600: it holds the token) the configuration of a
/// single-node broker, node 1, with data in `data`, plain-HTTP admin API on
/// `admin`, QUIC ingest on `ingest`, Raft on a free port, admin token
/// `e2e-test-token` and the certificates `broker-1` and `ca` of `certs`;
/// `extra` is appended (whole sections).
pub fn write_single_node_config(
    path: &Path,
    data: &Path,
    admin: SocketAddr,
    ingest: SocketAddr,
    certs: &Path,
    extra: &str,
) {
    write_node_config(
        path,
        data,
        (admin, true),
        ingest,
        certs,
        "e2e-test-token",
        extra,
    );
}

/// Like [`write_single_node_config`], with the admin API over HTTPS (the
/// broker's certificate) and `token` as the admin token.
pub fn write_single_node_https_config(
    path: &Path,
    data: &Path,
    admin: SocketAddr,
    ingest: SocketAddr,
    certs: &Path,
    token: &str,
    extra: &str,
) {
    write_node_config(path, data, (admin, false), ingest, certs, token, extra);
}

fn write_node_config(
    path: &Path,
    data: &Path,
    (admin, plain_http): (SocketAddr, bool),
    ingest: SocketAddr,
    certs: &Path,
    token: &str,
    extra: &str,
) {
    tributary_test_support::certs::write_private(
        path,
        &format!(
            r#"node_id = 1
data_dir = "{data}"
raft_listen = "{raft}"
admin_listen = "{admin}"
admin_plain_http = {plain_http}
ingest_listen = "{ingest}"
admin_token = "{token}"
[tls]
cert = "{certs}/broker-1.pem"
key = "{certs}/broker-1.key"
ca = "{certs}/ca.pem"
{extra}
"#,
            data = data.display(),
            raft = free_udp(),
            certs = certs.display(),
        ),
    );
}

/// A standalone broker.
pub struct SoloBroker {
    /// The broker process.
    pub broker: Proc,
    /// Its ingest (QUIC) address.
    pub ingest: SocketAddr,
    /// Its admin API (plain HTTP on loopback, `/metrics` too).
    pub admin: SocketAddr,
    /// Its data directory (central topics under `topics/{ns}/{topic}`).
    pub data: PathBuf,
    /// The development CA and certificates (edge certificates are issued
    /// here by the swarm).
    pub certs: PathBuf,
}

impl SoloBroker {
    /// Writes certificates and configuration under `dir` for the broker
    /// binary `binary`; `extra` is appended to the configuration (whole
    /// sections); `cpu` pins the broker to that core (`taskset -c`).
    pub fn new(dir: &Path, binary: &Path, extra: &str, cpu: Option<usize>) -> SoloBroker {
        let certs = dir.join("certs");
        tributary_test_support::certs::issue(&certs, &[1], &[]);
        let ingest = free_udp();
        let admin = free_tcp();
        let data = dir.join("broker");
        let config = dir.join("broker.toml");
        write_single_node_config(&config, &data, admin, ingest, &certs, extra);
        let mut command = match cpu {
            Some(cpu) => {
                let mut c = Command::new("taskset");
                c.arg("-c").arg(cpu.to_string()).arg(binary);
                c
            }
            None => Command::new(binary),
        };
        command
            .arg("--config")
            .arg(&config)
            .env("RUST_LOG", child_log_filter());
        SoloBroker {
            broker: Proc::new("broker", command),
            ingest,
            admin,
            data,
            certs,
        }
    }

    /// Starts the broker and waits (at most 30 s) for its admin listener.
    pub fn start(&mut self) {
        self.broker.start();
        wait_for_tcp("broker admin API", self.admin, Duration::from_secs(30));
    }

    /// The WAL directory of central topic `topic` (`/{ns}/{name}`).
    pub fn wal_dir(&self, topic: &str) -> PathBuf {
        self.data.join("topics").join(topic.trim_start_matches('/'))
    }
}
