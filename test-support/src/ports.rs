//! Free loopback ports for the servers a test starts: bound once to check
//! the port is free, then released for the server to bind.
//!
//! The ports come from below the kernel's ephemeral range
//! (`/proc/sys/net/ipv4/ip_local_port_range`, usually 32768–60999), not from
//! it: every client socket (an edge's QUIC endpoint, an HTTP connection)
//! takes an ephemeral port, so a port the kernel picked for a server could
//! be taken by some client while the server is down between a kill and its
//! restart on the same address ("Address already in use"). Each process
//! walks the range from its own starting point, so parallel test processes
//! rarely try the same port.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};

/// The lowest port handed out.
const LOW: u32 = 10_000;

/// The range below the ephemeral ports, `[LOW, ephemeral low)`, or `None`
/// when it is too small to be worth using.
fn range() -> Option<(u32, u32)> {
    let text = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok();
    let ephemeral_low = text
        .as_deref()
        .and_then(|t| t.split_whitespace().next())
        .and_then(|n| n.parse::<u32>().ok())
        .unwrap_or(32_768);
    (ephemeral_low > LOW + 2_000).then_some((LOW, ephemeral_low))
}

/// Ports tried so far by this process (the walk's position).
static NEXT: AtomicU32 = AtomicU32::new(0);

/// This process's starting point in a range of `len` ports.
fn start(len: u32) -> u32 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    (std::process::id().wrapping_mul(7_919) ^ nanos) % len
}

fn pick(bind: impl Fn(SocketAddr) -> std::io::Result<SocketAddr>) -> SocketAddr {
    static START: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    if let Some((low, high)) = range() {
        let len = high - low;
        let first = *START.get_or_init(|| start(len));
        for _ in 0..len {
            let i = NEXT.fetch_add(1, Ordering::Relaxed);
            let port = low + (first + i) % len;
            if let Ok(addr) = bind(SocketAddr::from(([127, 0, 0, 1], port as u16))) {
                return addr;
            }
        }
    }
    bind(SocketAddr::from(([127, 0, 0, 1], 0))).expect("free loopback port")
}

/// A free UDP port on 127.0.0.1 (QUIC ingest and Raft listeners).
///
/// # Panics
/// If no UDP socket can be bound on the loopback interface.
pub fn free_udp() -> SocketAddr {
    pick(|addr| std::net::UdpSocket::bind(addr).and_then(|s| s.local_addr()))
}

/// A free TCP port on 127.0.0.1 (HTTP APIs, `/metrics`).
///
/// # Panics
/// If no TCP listener can be bound on the loopback interface.
pub fn free_tcp() -> SocketAddr {
    pick(|addr| std::net::TcpListener::bind(addr).and_then(|s| s.local_addr()))
}
