//! Certificate enrollment with the real binaries on 127.0.0.1: a
//! single-node broker serving its admin API over HTTPS with an `[enroll]`
//! CA ([`EnrollBroker`]), `tribctl edges token|revoke` against it, and an
//! edge that has no certificate until `edge-agent enroll` gets it one
//! ([`EnrollingEdge`]).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use tributary_test_support::ports::{free_tcp, free_udp};
use tributary_test_support::process::{Proc, bin_path, wait_for_tcp, wait_until};

use crate::cluster::child_log_filter;

/// The bootstrap admin token of the broker.
pub const TOKEN: &str = "enroll-test-token";

/// The edge id enrolled.
pub const EDGE: &str = "plant1";

/// The topic the edge replicates.
pub const TOPIC: &str = "/plant1/readings";

/// A single-node broker with HTTPS admin API and `[enroll]`, its
/// development CA (no edge certificate is issued).
pub struct EnrollBroker {
    /// The broker process.
    pub broker: Proc,
    /// Its HTTPS admin address.
    pub admin: SocketAddr,
    /// Its QUIC ingest address.
    pub ingest: SocketAddr,
    /// Its data directory.
    pub data: PathBuf,
    /// The development certificates (`ca.pem`, `broker-1.*`); the CA key
    /// is in `{certs}-ca`.
    pub certs: PathBuf,
}

impl EnrollBroker {
    /// Writes certificates and configuration under `dir`; starts nothing.
    pub fn new(dir: &Path) -> EnrollBroker {
        let certs = dir.join("certs");
        tributary_test_support::certs::issue(&certs, &[1], &[]);
        let admin = free_tcp();
        let ingest = free_udp();
        let data = dir.join("broker");
        let config = dir.join("broker.toml");
        crate::solo::write_single_node_https_config(
            &config,
            &data,
            admin,
            ingest,
            &certs,
            TOKEN,
            &format!(
                "[enroll]\nca_cert = \"{certs}/ca.pem\"\nca_key = \"{ca_key}\"",
                certs = certs.display(),
                ca_key = tributary_test_support::certs::ca_key(&certs).display(),
            ),
        );
        let mut command = Command::new(bin_path("broker"));
        command
            .arg("--config")
            .arg(&config)
            .env("RUST_LOG", child_log_filter());
        EnrollBroker {
            broker: Proc::new("broker", command),
            admin,
            ingest,
            data,
            certs,
        }
    }

    /// Starts the broker and waits until its admin API answers an
    /// authenticated call (Raft has a leader).
    pub fn start(&mut self) {
        self.broker.start();
        wait_for_tcp("broker admin API", self.admin, Duration::from_secs(30));
        wait_until("the broker's admin API", Duration::from_secs(60), || {
            self.tribctl(&["cluster", "status"]).status.success()
        });
    }

    /// The cluster CA.
    pub fn ca(&self) -> PathBuf {
        self.certs.join("ca.pem")
    }

    /// Runs `tribctl` against this broker (HTTPS, the cluster CA, the
    /// bootstrap token).
    pub fn tribctl(&self, args: &[&str]) -> Output {
        let url = format!("https://{}", self.admin);
        let ca = self.ca();
        Command::new(bin_path("tribctl"))
            .args(["--admin-url", &url, "--ca", ca.to_str().unwrap_or_default()])
            .args(["--token", TOKEN])
            .args(args)
            .env_remove("TRIB_ADMIN_URL")
            .env_remove("TRIB_ADMIN_TOKEN")
            .env_remove("TRIB_CA")
            .output()
            .expect("run tribctl")
    }

    /// `tribctl edges token EDGE --ttl {ttl}`: the token (the last line).
    ///
    /// # Panics
    /// If tribctl fails.
    pub fn mint(&self, edge: &str, ttl: &str) -> String {
        let out = self.tribctl(&["edges", "token", edge, "--ttl", ttl]);
        let stdout = text(&out.stdout);
        assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
        stdout.lines().last().unwrap_or_default().to_owned()
    }
}

/// Lossy UTF-8.
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// An edge whose `[tls]` files do not exist until it enrolls.
pub struct EnrollingEdge {
    /// The configuration file.
    pub config: PathBuf,
    /// Where `[tls] cert` points.
    pub cert: PathBuf,
    /// Where `[tls] key` points.
    pub key: PathBuf,
    /// Where `[tls] ca` points.
    pub ca: PathBuf,
    /// The local API.
    pub api: SocketAddr,
    /// The data directory.
    pub data: PathBuf,
}

impl EnrollingEdge {
    /// The configuration of edge [`EDGE`] under `dir/{name}`, replicating
    /// [`TOPIC`] (`event_stream`) to `ingest`; `tls_extra` is added to its
    /// `[tls]` section.
    pub fn new(dir: &Path, name: &str, ingest: SocketAddr, tls_extra: &str) -> EnrollingEdge {
        let home = dir.join(name);
        std::fs::create_dir_all(&home).expect("edge dir");
        let tls = home.join("tls");
        let (cert, key, ca) = (
            tls.join("plant1.pem"),
            tls.join("plant1.key"),
            tls.join("ca.pem"),
        );
        let api = free_tcp();
        let data = home.join("data");
        let config = home.join("edge.toml");
        std::fs::write(
            &config,
            format!(
                r#"data_dir = "{data}"
edge_id = "{EDGE}"
brokers = ["{ingest}"]
local_api = "{api}"
checkpoint_interval_ms = 200
[tls]
cert = "{cert}"
key = "{key}"
ca = "{ca}"
{tls_extra}
[replication]
retain_until = "acknowledged"
[[topics]]
name = "{TOPIC}"
intent = "event_stream"
"#,
                data = data.display(),
                cert = cert.display(),
                key = key.display(),
                ca = ca.display(),
            ),
        )
        .expect("edge config");
        EnrollingEdge {
            config,
            cert,
            key,
            ca,
            api,
            data,
        }
    }

    /// `edge-agent enroll --broker {admin} --token {token} --ca {ca} -c
    /// {config}`.
    pub fn enroll(&self, admin: SocketAddr, token: &str, ca: &Path) -> Output {
        Command::new(bin_path("edge-agent"))
            .args(["enroll", "--broker", &admin.to_string(), "--token", token])
            .arg("--ca")
            .arg(ca)
            .arg("-c")
            .arg(&self.config)
            .env_remove("TRIB_EDGE_ENROLL_TOKEN")
            .env_remove("TRIB_EDGE_CONFIG")
            .env_remove("TRIB_EDGE_TLS_CERT")
            .env_remove("TRIB_EDGE_TLS_KEY")
            .env_remove("TRIB_EDGE_TLS_CA")
            .output()
            .expect("run edge-agent enroll")
    }

    /// The `edge-agent run` process of this edge, its output appended to
    /// `log` (log level `info`, so certificate reloads are in it).
    pub fn agent(&self, log: &Path) -> Proc {
        let mut command = Command::new(bin_path("edge-agent"));
        command
            .arg("run")
            .arg("--config")
            .arg(&self.config)
            .env("RUST_LOG", "info");
        Proc::logged("edge-agent", command, log).expect("edge log")
    }

    /// The files of the `[tls]` directory, sorted.
    pub fn tls_files(&self) -> Vec<String> {
        let Some(dir) = self.cert.parent() else {
            return Vec::new();
        };
        let Ok(entries) = std::fs::read_dir(dir) else {
            return Vec::new();
        };
        let mut names: Vec<String> = entries
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .collect();
        names.sort();
        names
    }
}
