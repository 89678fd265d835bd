//! Free loopback ports for the servers a test starts: bound once to learn a
//! port the kernel picked, then released for the server to bind.

use std::net::SocketAddr;

/// A free UDP port on 127.0.0.1 (QUIC ingest and Raft listeners).
///
/// # Panics
/// If no UDP socket can be bound on the loopback interface.
pub fn free_udp() -> SocketAddr {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .expect("free udp port")
}

/// A free TCP port on 127.0.0.1 (HTTP APIs, `/metrics`).
///
/// # Panics
/// If no TCP listener can be bound on the loopback interface.
pub fn free_tcp() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .expect("free tcp port")
}
