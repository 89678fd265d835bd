//! Development certificates for tests: thin helpers over
//! `broker_core::dev_certs` (a CA plus broker and edge certificates, the
//! same files `tribctl certs` writes) that panic instead of returning
//! errors, and load them as the daemons do (`TlsIdentity::load`).

use std::path::Path;

use broker_core::dev_certs;
use broker_core::tls::TlsIdentity;

/// Writes a development CA (reused if `dir` already has one) and the
/// certificates of broker ids `brokers` and edges `edges` into `dir`.
///
/// # Panics
/// If a file cannot be written or an edge id is not a valid name.
pub fn issue(dir: &Path, brokers: &[u64], edges: &[&str]) {
    let edges: Vec<String> = edges.iter().map(|e| (*e).to_owned()).collect();
    dev_certs::issue(dir, brokers, &edges)
        .unwrap_or_else(|e| panic!("development certificates in {}: {e}", dir.display()));
}

/// The TLS identity of broker `id` from the certificates in `dir` (see
/// [`issue`]).
///
/// # Panics
/// If the files are missing or do not load.
pub fn broker_identity(dir: &Path, id: u64) -> TlsIdentity {
    TlsIdentity::load(&dev_certs::broker_paths(dir, id))
        .unwrap_or_else(|e| panic!("broker-{id} certificate in {}: {e}", dir.display()))
}

/// The TLS identity of edge `edge_id` from the certificates in `dir` (see
/// [`issue`]).
///
/// # Panics
/// If the files are missing or do not load.
pub fn edge_identity(dir: &Path, edge_id: &str) -> TlsIdentity {
    TlsIdentity::load(&dev_certs::edge_paths(dir, edge_id))
        .unwrap_or_else(|e| panic!("edge-{edge_id} certificate in {}: {e}", dir.display()))
}
