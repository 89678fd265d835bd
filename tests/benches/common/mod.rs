//! Pieces shared by the benchmarks of `tributary-tests`: locating (or
//! building) the release binaries, a raw quinn bulk transfer with the same
//! TLS setup as replication, a fixed-window congestion controller to compare
//! against, and publishing incompressible records to an edge.

#![allow(dead_code)] // each bench uses a different subset

pub mod raw_fan_in;
pub mod raw_loop_server;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use broker_core::tls::{ALPN_REPLICATION, BROKER_SERVER_NAME};
use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use tokio::sync::watch;

/// Makes sure `target/release/broker` and `target/release/edge-agent` are
/// up to date: runs `cargo build --release -p broker -p edge-agent` (a no-op
/// when they are fresh) with the cargo that runs the bench. With
/// `TRIBUTARY_BENCH_NO_BUILD` set, only checks that they exist (to profile
/// or to run against binaries built earlier).
///
/// # Panics
/// If the build fails or, without building, a binary is missing.
pub fn build_release_binaries() {
    if std::env::var_os("TRIBUTARY_BENCH_NO_BUILD").is_some() {
        for name in ["broker", "edge-agent"] {
            tributary_test_support::process::bin_path(name);
        }
        return;
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    eprintln!("building the release binaries: cargo build --release -p broker -p edge-agent");
    let status = std::process::Command::new(cargo)
        .args(["build", "--release", "-p", "broker", "-p", "edge-agent"])
        .status()
        .expect("run cargo");
    assert!(
        status.success(),
        "cargo build --release -p broker -p edge-agent failed"
    );
}

/// A scratch directory under `target/bench-tmp` (on the same disk as the
/// build, not a tmpfs), removed when dropped.
pub fn scratch_dir(name: &str) -> tempfile::TempDir {
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench-tmp");
    std::fs::create_dir_all(&base).expect("target/bench-tmp");
    tempfile::Builder::new()
        .prefix(name)
        .tempdir_in(base)
        .expect("scratch dir")
}

/// Server and client QUIC configs exactly as broker and edge build them
/// (`TlsIdentity::quic_server` / `quic_client`, replication ALPN), from the
/// development certificates in `certs`; `transport` replaces the shared
/// transport settings when given.
pub fn quic_configs(
    certs: &Path,
    transport: Option<quinn::TransportConfig>,
) -> (quinn::ServerConfig, quinn::ClientConfig) {
    tributary_test_support::certs::issue(certs, &[1], &["plant1"]);
    let broker = tributary_test_support::certs::broker_identity(certs, 1);
    let edge = tributary_test_support::certs::edge_identity(certs, "plant1");
    let mut server = broker.quic_server(ALPN_REPLICATION).expect("server config");
    let mut client = edge.quic_client(ALPN_REPLICATION).expect("client config");
    if let Some(transport) = transport {
        let transport = Arc::new(transport);
        server.transport_config(transport.clone());
        client.transport_config(transport);
    }
    (server, client)
}

/// The transport Tributary uses: keepalive 5 s, idle timeout 30 s, quinn's
/// defaults otherwise (Cubic).
pub fn tributary_transport() -> quinn::TransportConfig {
    broker_core::tls::transport_config()
}

/// A congestion "controller" with a constant window: it ignores loss. Stands
/// for the case where the operator declared the link's rate (the edge's
/// `bandwidth_cap_bytes_per_s`), so the window can be sized from it.
#[derive(Debug, Clone)]
pub struct FixedWindow {
    window: u64,
}

impl quinn::congestion::Controller for FixedWindow {
    fn on_congestion_event(
        &mut self,
        _now: Instant,
        _sent: Instant,
        _is_persistent_congestion: bool,
        _lost_bytes: u64,
    ) {
    }

    fn on_mtu_update(&mut self, _new_mtu: u16) {}

    fn window(&self) -> u64 {
        self.window
    }

    fn clone_box(&self) -> Box<dyn quinn::congestion::Controller> {
        Box::new(self.clone())
    }

    fn initial_window(&self) -> u64 {
        self.window
    }

    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any> {
        self
    }
}

/// Builds [`FixedWindow`] controllers of `0` bytes.
#[derive(Debug)]
pub struct FixedWindowFactory(pub u64);

impl quinn::congestion::ControllerFactory for FixedWindowFactory {
    fn build(
        self: Arc<Self>,
        _now: Instant,
        _current_mtu: u16,
    ) -> Box<dyn quinn::congestion::Controller> {
        Box::new(FixedWindow { window: self.0 })
    }
}

/// A raw quinn bulk transfer: one client thread writes `total_bytes` (or
/// until stopped) on one unidirectional stream in 64 KiB chunks; one server
/// thread reads in order (as the broker does, so a lost packet holds up
/// what follows it) and counts. Each side has its own thread and current-thread
/// tokio runtime, like two processes.
pub struct RawBulk {
    received: Arc<AtomicU64>,
    first_byte: Arc<OnceLock<Instant>>,
    last_byte: Arc<OnceLock<Instant>>,
    stop: watch::Sender<bool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl RawBulk {
    /// Starts a transfer. `route` gets the server's address and returns the
    /// one the client dials (a relay in front of it, or the same).
    pub fn start(
        server: quinn::ServerConfig,
        client: quinn::ClientConfig,
        route: impl FnOnce(SocketAddr) -> SocketAddr,
        total_bytes: u64,
    ) -> RawBulk {
        RawBulk::start_pinned(server, client, route, total_bytes, None)
    }

    /// [`RawBulk::start`] with the client thread pinned to core `pin.0` and
    /// the server thread to core `pin.1` (as the edge and the broker are
    /// with `taskset`).
    pub fn start_pinned(
        server: quinn::ServerConfig,
        client: quinn::ClientConfig,
        route: impl FnOnce(SocketAddr) -> SocketAddr,
        total_bytes: u64,
        pin: Option<(usize, usize)>,
    ) -> RawBulk {
        let received = Arc::new(AtomicU64::new(0));
        let first_byte = Arc::new(OnceLock::new());
        let last_byte = Arc::new(OnceLock::new());
        let (stop, stop_rx) = watch::channel(false);
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let server_thread = {
            let received = received.clone();
            let first_byte = first_byte.clone();
            let last_byte = last_byte.clone();
            let mut stop_rx = stop_rx.clone();
            std::thread::spawn(move || {
                if let Some((_, cpu)) = pin {
                    pin_this_thread(cpu);
                }
                runtime().block_on(async move {
                    let endpoint = raw_server_endpoint(server);
                    addr_tx
                        .send(endpoint.local_addr().expect("addr"))
                        .expect("send addr");
                    let mut linger = stop_rx.clone();
                    let serve = async {
                        let conn = endpoint.accept().await?.await.ok()?;
                        let mut recv = conn.accept_uni().await.ok()?;
                        while let Ok(Some(chunk)) = recv.read_chunk(usize::MAX, true).await {
                            let _ = first_byte.set(Instant::now());
                            received.fetch_add(chunk.bytes.len() as u64, Ordering::Relaxed);
                        }
                        let _ = last_byte.set(Instant::now());
                        // Keep the connection until stopped.
                        let _ = linger.wait_for(|s| *s).await;
                        Some(())
                    };
                    tokio::select! {
                        _ = serve => {}
                        _ = stop_rx.wait_for(|s| *s) => {}
                    }
                    endpoint.close(0u32.into(), b"done");
                });
            })
        };
        let target = route(addr_rx.recv().expect("server address"));
        let client_thread = {
            let mut stop_rx = stop_rx;
            std::thread::spawn(move || {
                if let Some((cpu, _)) = pin {
                    pin_this_thread(cpu);
                }
                runtime().block_on(async move {
                    let mut endpoint =
                        broker_core::tls::client_endpoint(SocketAddr::from(([127, 0, 0, 1], 0)))
                            .expect("client endpoint");
                    endpoint.set_default_client_config(client);
                    let mut linger = stop_rx.clone();
                    let send = async {
                        let conn = endpoint
                            .connect(target, BROKER_SERVER_NAME)
                            .ok()?
                            .await
                            .ok()?;
                        let mut stream = conn.open_uni().await.ok()?;
                        let mut data = vec![0u8; 64 * 1024];
                        StdRng::seed_from_u64(1).fill(&mut data[..]);
                        let chunk = Bytes::from(data);
                        let mut sent = 0u64;
                        while sent < total_bytes {
                            let n = (total_bytes - sent).min(chunk.len() as u64) as usize;
                            stream.write_chunk(chunk.slice(..n)).await.ok()?;
                            sent += n as u64;
                        }
                        stream.finish().ok()?;
                        let _ = stream.stopped().await;
                        let _ = linger.wait_for(|s| *s).await;
                        Some(conn)
                    };
                    tokio::select! {
                        _ = send => {}
                        _ = stop_rx.wait_for(|s| *s) => {}
                    }
                    endpoint.close(0u32.into(), b"done");
                });
            })
        };
        RawBulk {
            received,
            first_byte,
            last_byte,
            stop,
            threads: vec![server_thread, client_thread],
        }
    }

    /// Bytes the server has read.
    pub fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }

    /// When the server read its first byte.
    pub fn first_byte(&self) -> Option<Instant> {
        self.first_byte.get().copied()
    }

    /// When the server read the end of the stream.
    pub fn last_byte(&self) -> Option<Instant> {
        self.last_byte.get().copied()
    }

    /// Stops both sides and joins their threads.
    pub fn stop(mut self) {
        let _ = self.stop.send(true);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// A quinn server endpoint on 127.0.0.1 for the raw transfers, on the
/// current tokio runtime, with the product's sockets (`tls::bind_udp`:
/// large kernel buffers), so only the application differs.
///
/// # Panics
/// If the socket cannot be bound.
pub fn raw_server_endpoint(server: quinn::ServerConfig) -> quinn::Endpoint {
    let socket =
        broker_core::tls::bind_udp(SocketAddr::from(([127, 0, 0, 1], 0))).expect("server socket");
    quinn::Endpoint::new(
        quinn::EndpointConfig::default(),
        Some(server),
        socket,
        Arc::new(quinn::TokioRuntime),
    )
    .expect("server endpoint")
}

/// Pins the calling thread to core `cpu` with `taskset -p` (its thread id
/// from `/proc/thread-self`).
///
/// # Panics
/// If `taskset` is missing or fails: a pinned measurement that is not
/// pinned would be wrong.
pub fn pin_this_thread(cpu: usize) {
    let link = std::fs::read_link("/proc/thread-self").expect("/proc/thread-self");
    let tid = link
        .file_name()
        .and_then(|n| n.to_str())
        .expect("thread id")
        .to_string();
    pin_pid(&tid, cpu, false);
}

/// Pins process (or thread) `pid` to core `cpu` with `taskset -p`, all its
/// threads with `all`.
///
/// # Panics
/// If `taskset` is missing or fails.
pub fn pin_pid(pid: &str, cpu: usize, all: bool) {
    let mut command = std::process::Command::new("taskset");
    if all {
        command.arg("-a");
    }
    let status = command
        .args(["-p", "-c", &cpu.to_string(), pid])
        .stdout(std::process::Stdio::null())
        .status()
        .expect("run taskset (util-linux)");
    assert!(status.success(), "taskset -p -c {cpu} {pid} failed");
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// NDJSON bodies of `records` incompressible records (`value_bytes` random
/// bytes each, sent as `value_b64`); `variants` different bodies seeded
/// from `seed`, so a long run reuses them instead of generating each.
pub fn random_bodies(
    variants: usize,
    records: usize,
    value_bytes: usize,
    seed: u64,
) -> Vec<String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut value = vec![0u8; value_bytes];
    (0..variants)
        .map(|_| {
            let mut body = String::with_capacity(records * (value_bytes * 4 / 3 + 20));
            for _ in 0..records {
                rng.fill(&mut value[..]);
                body.push_str("{\"value_b64\":\"");
                body.push_str(&STANDARD.encode(&value));
                body.push_str("\"}\n");
            }
            body
        })
        .collect()
}

/// `bytes` with a unit, 10^6-based.
pub fn megabytes(bytes: f64) -> String {
    format!("{:.1} MB", bytes / 1e6)
}
