//! Raw quinn fan-in: N client connections into one server, no Tributary
//! code on the path, to see how quinn's own per-byte cost grows with the
//! connection count on this machine (the ceiling for `fan_in scale`).
//!
//! Same shape as `edge-swarm` against the broker: the clients share up to
//! 64 client endpoints on the caller's tokio runtime; the server has its
//! own thread and a two-worker runtime (the broker's default on two cores),
//! one task per connection reading its stream in order and counting. Each
//! connection writes its share of the bytes in 20 kB chunks (a `fan_in`
//! batch) on one unidirectional stream, all released together once every
//! connection is up. The server acknowledges nothing beyond QUIC.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use broker_core::tls::BROKER_SERVER_NAME;
use bytes::Bytes;
use tokio::sync::watch;

/// The server's model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerKind {
    /// quinn: a task per connection on a two-worker runtime.
    Quinn,
    /// One loop on one thread over quinn-proto ([`super::raw_loop_server`]).
    Loop,
}

/// One run's figures.
#[derive(Debug, Clone, Copy)]
pub struct RawFanIn {
    /// Bytes received in all.
    pub bytes: u64,
    /// From the release of the writes to the end of the last stream.
    pub seconds: f64,
    /// CPU seconds of this whole process (clients and server) over the
    /// same interval.
    pub cpu_seconds: f64,
    /// CPU seconds of the server's threads alone over the same interval.
    pub server_cpu_seconds: f64,
}

impl RawFanIn {
    /// Bytes per second.
    pub fn rate(&self) -> f64 {
        self.bytes as f64 / self.seconds
    }
}

/// CPU seconds (user + system) in a `/proc/…/stat` line: its fields 14
/// and 15 (11 and 12 after the command's closing parenthesis), at 100
/// ticks per second.
fn stat_cpu_seconds(stat: &str) -> f64 {
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or(vec![], |(_, rest)| rest.split_whitespace().collect());
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}

/// This process's CPU seconds.
fn own_cpu_seconds() -> f64 {
    stat_cpu_seconds(&std::fs::read_to_string("/proc/self/stat").unwrap_or_default())
}

/// Name of the server runtime's threads.
const SERVER_THREAD: &str = "raw-server";

/// CPU seconds of this process's threads named [`SERVER_THREAD`].
fn server_cpu_seconds() -> f64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0.0;
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("stat")).ok())
        .filter(|stat| stat.contains(&format!("({SERVER_THREAD})")))
        .map(|stat| stat_cpu_seconds(&stat))
        .sum()
}

/// Runs `connections` connections writing `total_bytes` in all.
///
/// # Panics
/// If the transfer does not finish within two minutes.
pub async fn run(
    kind: ServerKind,
    server: quinn::ServerConfig,
    client: quinn::ClientConfig,
    connections: usize,
    total_bytes: u64,
) -> RawFanIn {
    const CHUNK: usize = 20_000;
    let received = Arc::new(AtomicU64::new(0));
    let finished = Arc::new(AtomicUsize::new(0));
    let last = Arc::new(Mutex::new(None::<Instant>));
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let (stop, stop_rx) = watch::channel(false);
    let loop_stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let server_thread = if kind == ServerKind::Loop {
        let counters = super::raw_loop_server::Counters {
            received: received.clone(),
            finished: finished.clone(),
            last: last.clone(),
        };
        let loop_stop = loop_stop.clone();
        let socket = broker_core::tls::bind_udp(SocketAddr::from(([127, 0, 0, 1], 0)))
            .expect("server socket");
        addr_tx
            .send(socket.local_addr().expect("addr"))
            .expect("send addr");
        std::thread::Builder::new()
            .name(SERVER_THREAD.into())
            .spawn(move || super::raw_loop_server::serve(socket, server, counters, loop_stop))
            .expect("server thread")
    } else {
        let (received, finished, last) = (received.clone(), finished.clone(), last.clone());
        let mut stop_rx = stop_rx.clone();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name(SERVER_THREAD)
                .enable_all()
                .build()
                .expect("server runtime");
            runtime.block_on(async move {
                let endpoint = super::raw_server_endpoint(server);
                addr_tx
                    .send(endpoint.local_addr().expect("addr"))
                    .expect("send addr");
                let accept = async {
                    while let Some(incoming) = endpoint.accept().await {
                        let (received, finished, last) =
                            (received.clone(), finished.clone(), last.clone());
                        tokio::spawn(async move {
                            let conn = incoming.await.ok()?;
                            let mut recv = conn.accept_uni().await.ok()?;
                            while let Ok(Some(chunk)) = recv.read_chunk(usize::MAX, true).await {
                                received.fetch_add(chunk.bytes.len() as u64, Ordering::Relaxed);
                            }
                            *last.lock().expect("last") = Some(Instant::now());
                            finished.fetch_add(1, Ordering::SeqCst);
                            // Keep the connection until the run ends.
                            conn.closed().await;
                            Some(())
                        });
                    }
                };
                tokio::select! {
                    () = accept => {}
                    _ = stop_rx.wait_for(|s| *s) => {}
                }
                endpoint.close(0u32.into(), b"done");
            });
        })
    };
    let target = addr_rx.recv().expect("server address");
    let endpoints: Vec<quinn::Endpoint> = (0..connections.clamp(1, 64))
        .map(|_| {
            let mut e = broker_core::tls::client_endpoint(SocketAddr::from(([127, 0, 0, 1], 0)))
                .expect("client endpoint");
            e.set_default_client_config(client.clone());
            e
        })
        .collect();
    let share = total_bytes / connections as u64;
    let (go_tx, go) = watch::channel(false);
    let chunk = Bytes::from(
        (0..CHUNK)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect::<Vec<u8>>(),
    );
    let mut ready = Vec::with_capacity(connections);
    let mut writers = Vec::with_capacity(connections);
    for i in 0..connections {
        let endpoint = endpoints[i % endpoints.len()].clone();
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        ready.push(ready_rx);
        let mut go = go.clone();
        let chunk = chunk.clone();
        writers.push(tokio::spawn(async move {
            let conn = endpoint
                .connect(target, BROKER_SERVER_NAME)
                .ok()?
                .await
                .ok()?;
            let mut stream = conn.open_uni().await.ok()?;
            let _ = ready_tx.send(());
            go.wait_for(|g| *g).await.ok()?;
            let mut sent = 0u64;
            while sent < share {
                let n = (share - sent).min(CHUNK as u64) as usize;
                stream.write_chunk(chunk.slice(..n)).await.ok()?;
                sent += n as u64;
            }
            stream.finish().ok()?;
            let _ = stream.stopped().await;
            Some(conn)
        }));
    }
    for r in ready {
        r.await.expect("a connection failed to open");
    }
    let cpu_before = own_cpu_seconds();
    let server_before = server_cpu_seconds();
    let released = Instant::now();
    go_tx.send(true).expect("release");
    let deadline = released + Duration::from_secs(120);
    while finished.load(Ordering::SeqCst) < connections {
        assert!(Instant::now() < deadline, "raw fan-in did not finish");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let end = last.lock().expect("last").unwrap_or_else(Instant::now);
    let cpu_seconds = own_cpu_seconds() - cpu_before;
    let server_cpu_seconds = server_cpu_seconds() - server_before;
    let mut conns = Vec::new();
    for w in writers {
        if let Ok(Some(conn)) = w.await {
            conns.push(conn);
        }
    }
    for c in &conns {
        c.close(0u32.into(), b"done");
    }
    for e in &endpoints {
        e.wait_idle().await;
    }
    let _ = stop.send(true);
    loop_stop.store(true, Ordering::Relaxed);
    let _ = server_thread.join();
    RawFanIn {
        bytes: received.load(Ordering::Relaxed),
        seconds: (end - released).as_secs_f64(),
        cpu_seconds,
        server_cpu_seconds,
    }
}
