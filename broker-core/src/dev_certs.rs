//! Development certificates (feature `dev-certs`, rcgen): a CA plus broker
//! and edge certificates, so a new user can start without openssl. Used by
//! `tribctl certs` and by tests.
//!
//! Files written to the output directory (PEM):
//! - `ca.pem`, `ca.key`: the CA (reused if present, so more certificates can
//!   be added later);
//! - `broker-{id}.pem`, `broker-{id}.key`: identity `broker-{id}`, DNS names
//!   `tributary-broker` (what clients verify) and `localhost`, IP 127.0.0.1;
//! - `edge-{edge_id}.pem`, `edge-{edge_id}.key`: identity `{edge_id}`, which
//!   owns the namespace of the same name.
//!
//! Valid until 2036, keys unencrypted (mode 0600): for development only.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

use crate::tls::{BROKER_SERVER_NAME, TlsPaths};

/// Errors making development certificates.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DevCertError {
    /// Reading or writing a file.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// rcgen failed or an existing CA file is unreadable.
    #[error("certificate generation: {0}")]
    Rcgen(#[from] rcgen::Error),
    /// An edge id that cannot be a namespace.
    #[error(
        "invalid edge id {0:?}: use 1-63 ASCII letters, digits, '-' or '_' (it is also the edge's namespace)"
    )]
    InvalidEdgeId(String),
    /// Only one of `ca.pem` and `ca.key` exists.
    #[error("{} has only one of ca.pem and ca.key", .0.display())]
    HalfCa(PathBuf),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> DevCertError + '_ {
    move |source| DevCertError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn write_pair(dir: &Path, stem: &str, cert_pem: &str, key_pem: &str) -> Result<(), DevCertError> {
    let cert = dir.join(format!("{stem}.pem"));
    let key = dir.join(format!("{stem}.key"));
    std::fs::write(&cert, cert_pem).map_err(io(&cert))?;
    std::fs::write(&key, key_pem).map_err(io(&key))?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).map_err(io(&key))?;
    Ok(())
}

fn ca_params() -> Result<CertificateParams, DevCertError> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params
        .distinguished_name
        .push(DnType::CommonName, "Tributary development CA");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params.not_after = rcgen::date_time_ymd(2036, 1, 1);
    Ok(params)
}

/// Loads the CA from `dir` or creates it.
fn load_or_create_ca(dir: &Path) -> Result<Issuer<'static, KeyPair>, DevCertError> {
    let cert_path = dir.join("ca.pem");
    let key_path = dir.join("ca.key");
    if cert_path.exists() && key_path.exists() {
        let cert = std::fs::read_to_string(&cert_path).map_err(io(&cert_path))?;
        let key_pem = std::fs::read_to_string(&key_path).map_err(io(&key_path))?;
        let key = KeyPair::from_pem(&key_pem)?;
        return Ok(Issuer::from_ca_cert_pem(&cert, key)?);
    }
    if cert_path.exists() || key_path.exists() {
        return Err(DevCertError::HalfCa(dir.to_path_buf()));
    }
    let key = KeyPair::generate()?;
    let params = ca_params()?;
    let cert = params.self_signed(&key)?;
    write_pair(dir, "ca", &cert.pem(), &key.serialize_pem())?;
    Ok(Issuer::new(params, key))
}

fn leaf(
    issuer: &Issuer<'static, KeyPair>,
    identity: &str,
    extra_dns: &[&str],
    server: bool,
) -> Result<(String, String), DevCertError> {
    let mut names = vec![identity.to_string()];
    names.extend(extra_dns.iter().map(|s| s.to_string()));
    let mut params = CertificateParams::new(names)?;
    if server {
        params
            .subject_alt_names
            .push(SanType::IpAddress(std::net::IpAddr::from([127, 0, 0, 1])));
    }
    params.distinguished_name.push(DnType::CommonName, identity);
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    if server {
        params
            .extended_key_usages
            .push(ExtendedKeyUsagePurpose::ServerAuth);
    }
    params.not_after = rcgen::date_time_ymd(2036, 1, 1);
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, issuer)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// True if `edge` can be an edge id (and so a namespace).
pub fn is_valid_edge_id(edge: &str) -> bool {
    !edge.is_empty()
        && edge.len() <= 63
        && edge
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// The files of broker `id` in `dir`.
pub fn broker_paths(dir: &Path, id: u64) -> TlsPaths {
    TlsPaths {
        cert: dir.join(format!("broker-{id}.pem")),
        key: dir.join(format!("broker-{id}.key")),
        ca: dir.join("ca.pem"),
    }
}

/// The files of edge `edge_id` in `dir`.
pub fn edge_paths(dir: &Path, edge_id: &str) -> TlsPaths {
    TlsPaths {
        cert: dir.join(format!("edge-{edge_id}.pem")),
        key: dir.join(format!("edge-{edge_id}.key")),
        ca: dir.join("ca.pem"),
    }
}

/// Creates (or reuses) the CA in `dir` and issues certificates for the
/// given brokers and edges, overwriting existing ones of the same name.
///
/// # Errors
/// [`DevCertError`] for an invalid edge id (checked before anything is
/// written), I/O or rcgen failures.
pub fn issue(dir: &Path, brokers: &[u64], edges: &[String]) -> Result<(), DevCertError> {
    if let Some(bad) = edges.iter().find(|e| !is_valid_edge_id(e)) {
        return Err(DevCertError::InvalidEdgeId(bad.clone()));
    }
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let issuer = load_or_create_ca(dir)?;
    for id in brokers {
        let identity = format!("broker-{id}");
        let (cert, key) = leaf(&issuer, &identity, &[BROKER_SERVER_NAME, "localhost"], true)?;
        write_pair(dir, &identity, &cert, &key)?;
    }
    for edge in edges {
        let (cert, key) = leaf(&issuer, edge, &[], false)?;
        write_pair(dir, &format!("edge-{edge}"), &cert, &key)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::{TlsIdentity, certificate_identity, load_certs};

    #[test]
    fn issued_certificates_load_and_carry_their_identity() {
        let dir = tempfile::tempdir().unwrap();
        issue(dir.path(), &[3], &["plant1".into()]).unwrap();
        let broker = broker_paths(dir.path(), 3);
        TlsIdentity::load(&broker).unwrap();
        let cert = &load_certs(&broker.cert).unwrap()[0];
        assert_eq!(certificate_identity(cert).as_deref(), Some("broker-3"));
        let edge = edge_paths(dir.path(), "plant1");
        let cert = &load_certs(&edge.cert).unwrap()[0];
        assert_eq!(certificate_identity(cert).as_deref(), Some("plant1"));
        // A second call reuses the CA: the first edge still chains to it.
        let ca_before = std::fs::read(dir.path().join("ca.pem")).unwrap();
        issue(dir.path(), &[], &["plant2".into()]).unwrap();
        assert_eq!(std::fs::read(dir.path().join("ca.pem")).unwrap(), ca_before);
    }

    #[test]
    fn invalid_edge_ids_are_refused_before_writing() {
        let dir = tempfile::tempdir().unwrap();
        for bad in ["", "a/b", "..", "x y", &"a".repeat(64)] {
            let err = issue(dir.path(), &[], &[bad.to_string()]).unwrap_err();
            assert!(matches!(err, DevCertError::InvalidEdgeId(_)), "{bad:?}");
        }
        assert!(!dir.path().join("ca.pem").exists());
    }
}
