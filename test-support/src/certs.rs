//! Development certificates for tests: thin helpers over
//! `broker_core::dev_certs` (a CA plus broker and edge certificates, the
//! same files `tribctl certs` writes) that panic instead of returning
//! errors, and load them as the daemons do (`TlsIdentity::load`); an HTTPS
//! agent that trusts only that CA ([`https_agent`]); and [`write_private`]
//! for configuration files that hold a token (the daemons refuse
//! world-readable ones).

use std::path::Path;
use std::time::Duration;

use broker_core::dev_certs;
use broker_core::tls::TlsIdentity;

/// Writes a development CA (reused if `dir` already has one; its key goes
/// to the sibling directory `{dir}-ca`, see [`ca_key`]) and the
/// certificates of broker ids `brokers` and edges `edges` into `dir`.
///
/// # Panics
/// If a file cannot be written or an edge id is not a valid name.
pub fn issue(dir: &Path, brokers: &[u64], edges: &[&str]) {
    let edges: Vec<String> = edges.iter().map(|e| (*e).to_owned()).collect();
    dev_certs::issue(dir, brokers, &edges)
        .unwrap_or_else(|e| panic!("development certificates in {}: {e}", dir.display()));
}

/// The CA private key of the development certificates in `dir`
/// (`{dir}-ca/ca.key`, apart from the files devices get).
///
/// # Panics
/// If `dir` has no last component.
pub fn ca_key(dir: &Path) -> std::path::PathBuf {
    dev_certs::ca_key_path(dir).unwrap_or_else(|| panic!("{}: no CA key directory", dir.display()))
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

/// Writes `text` to `path` with mode 0600 (owner only), as a configuration
/// file holding a token must be.
///
/// # Panics
/// If the file cannot be written.
pub fn write_private(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
            .unwrap_or_else(|e| panic!("chmod 600 {}: {e}", path.display()));
    }
}

/// A ureq agent for `https://` URLs of brokers whose certificates chain to
/// the development CA in `dir` (`{dir}/ca.pem`), trusting no other root;
/// plain `http://` URLs work too. Statuses of 400 and above are answers,
/// not errors; requests time out after 40 s.
///
/// # Panics
/// If the CA file is missing or malformed.
pub fn https_agent(dir: &Path) -> ureq::Agent {
    https_agent_trusting(&[dir.to_path_buf()])
}

/// [`https_agent`] trusting the development CAs of every directory in
/// `dirs` (tests running in one process, each with its own CA).
///
/// # Panics
/// If a CA file is missing or malformed.
pub fn https_agent_trusting(dirs: &[std::path::PathBuf]) -> ureq::Agent {
    https_agent_with_timeout(dirs, Duration::from_secs(40))
}

/// [`https_agent_trusting`] with requests timing out after `timeout`.
///
/// # Panics
/// If a CA file is missing or malformed.
pub fn https_agent_with_timeout(dirs: &[std::path::PathBuf], timeout: Duration) -> ureq::Agent {
    let pems: Vec<Vec<u8>> = dirs.iter().map(|dir| ca_pem(dir)).collect();
    https_agent_with_roots(&pems, timeout)
}

/// The development CA certificate (PEM) of the certificates in `dir`.
///
/// # Panics
/// If `dir/ca.pem` cannot be read.
pub fn ca_pem(dir: &Path) -> Vec<u8> {
    let ca = dir.join("ca.pem");
    std::fs::read(&ca).unwrap_or_else(|e| panic!("{}: {e}", ca.display()))
}

/// An HTTPS agent trusting the CA certificates `pems` (PEM text, read
/// before: a test that keeps CAs of other tests running in the same
/// process must not read files those tests may have deleted since).
///
/// # Panics
/// If a PEM holds no certificate.
pub fn https_agent_with_roots(pems: &[Vec<u8>], timeout: Duration) -> ureq::Agent {
    let mut roots: Vec<ureq::tls::Certificate<'static>> = Vec::new();
    for pem in pems {
        let before = roots.len();
        roots.extend(ureq::tls::parse_pem(pem).filter_map(|item| match item {
            Ok(ureq::tls::PemItem::Certificate(cert)) => Some(cert.to_owned()),
            _ => None,
        }));
        assert!(roots.len() > before, "a CA PEM without a certificate");
    }
    ureq::Agent::config_builder()
        .timeout_global(Some(timeout))
        .http_status_as_error(false)
        .tls_config(
            ureq::tls::TlsConfig::builder()
                .root_certs(ureq::tls::RootCerts::new_with_certs(&roots))
                .unversioned_rustls_crypto_provider(std::sync::Arc::new(
                    rustls::crypto::ring::default_provider(),
                ))
                .build(),
        )
        .build()
        .into()
}
