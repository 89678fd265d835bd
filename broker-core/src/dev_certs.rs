//! Development certificates (feature `dev-certs`, rcgen): a CA plus broker
//! and edge certificates, so a new user can start without openssl. Used by
//! `tribctl certs` and by tests.
//!
//! Files written to the output directory `{out}` (PEM), all of which may be
//! copied to the machines that use them:
//! - `ca.pem`: the CA certificate (every broker and edge trusts it);
//! - `broker-{id}.pem`, `broker-{id}.key`: identity `broker-{id}`, DNS names
//!   `tributary-broker` (what clients verify) and `localhost`, IP 127.0.0.1;
//! - `edge-{edge_id}.pem`, `edge-{edge_id}.key`: identity `{edge_id}`, which
//!   owns the namespace of the same name.
//!
//! The CA's private key is written apart, to `{ca_dir}/ca.key` (directory
//! mode 0700, file 0600), `{ca_dir}` being `{out}-ca` beside `{out}` unless
//! given ([`default_ca_dir`]): copying `{out}` to a device never copies
//! the key that can sign certificates. The CA is reused when both files
//! exist, so more certificates can be added later; a `{out}/ca.key` left
//! by the old layout is moved to `{ca_dir}` ([`Issued::ca_key_moved_from`]).
//! A broker's `[enroll]` section names `{out}/ca.pem` and
//! `{ca_dir}/ca.key` to sign enrolling edges' certificates.
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
        "invalid edge id {0:?}: use 1-63 ASCII letters, digits, '-' or '_', not starting with '_' \
         and not 'default' (it is also the edge's namespace; those are the system's)"
    )]
    InvalidEdgeId(String),
    /// A broker host that is neither an IP address nor a DNS name.
    #[error("invalid broker host {0:?}: give a DNS name (broker-1.example.net) or an IP address")]
    InvalidHost(String),
    /// Only one of `{out}/ca.pem` and `{ca_dir}/ca.key` exists.
    #[error(
        "{} exists but {} does not (the CA certificate and its key belong together): \
         restore the missing one, or remove the other to make a new CA",
        present.display(),
        missing.display()
    )]
    HalfCa {
        /// The file that exists.
        present: PathBuf,
        /// The file that is missing.
        missing: PathBuf,
    },
    /// No CA key directory can be derived from the output directory (it has
    /// no last component, like `/`).
    #[error("{}: name the CA key directory (tribctl certs --ca-dir DIR)", .0.display())]
    NoCaDir(PathBuf),
}

/// What [`issue`] did with the CA.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Issued {
    /// The CA certificate, `{out}/ca.pem`.
    pub ca_cert: PathBuf,
    /// The CA private key, `{ca_dir}/ca.key`.
    pub ca_key: PathBuf,
    /// A new CA was made (none existed).
    pub ca_created: bool,
    /// The old layout's `{out}/ca.key` that was moved to `ca_key`.
    pub ca_key_moved_from: Option<PathBuf>,
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
    write_private(&key, key_pem)
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

/// The default directory of the CA key for output directory `out`: its
/// sibling `{out}-ca` (`certs` → `certs-ca`); `None` when `out` has no last
/// component.
pub fn default_ca_dir(out: &Path) -> Option<PathBuf> {
    let absolute = std::path::absolute(out).ok()?;
    let name = absolute.file_name()?.to_str()?;
    Some(absolute.with_file_name(format!("{name}-ca")))
}

/// The CA key file of output directory `out` in the default layout:
/// `{default_ca_dir(out)}/ca.key`.
pub fn ca_key_path(out: &Path) -> Option<PathBuf> {
    default_ca_dir(out).map(|dir| dir.join(CA_KEY_FILE))
}

/// File name of the CA certificate in the output directory.
pub const CA_CERT_FILE: &str = "ca.pem";
/// File name of the CA key in the CA key directory.
pub const CA_KEY_FILE: &str = "ca.key";

/// Creates `dir` (and its parents) and makes it owner-only (0700).
fn private_dir(dir: &Path) -> Result<(), DevCertError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(io(dir))
}

/// Loads the CA (`{out}/ca.pem`, `{ca_dir}/ca.key`) or creates it; moves a
/// `{out}/ca.key` of the old layout to `{ca_dir}` first.
fn load_or_create_ca(
    out: &Path,
    ca_dir: &Path,
) -> Result<(Issuer<'static, KeyPair>, Issued), DevCertError> {
    let cert_path = out.join(CA_CERT_FILE);
    let key_path = ca_dir.join(CA_KEY_FILE);
    let mut issued = Issued {
        ca_cert: cert_path.clone(),
        ca_key: key_path.clone(),
        ca_created: false,
        ca_key_moved_from: None,
    };
    let old_key = out.join(CA_KEY_FILE);
    if old_key.exists() && !key_path.exists() {
        private_dir(ca_dir)?;
        std::fs::rename(&old_key, &key_path).map_err(io(&old_key))?;
        issued.ca_key_moved_from = Some(old_key);
    }
    match (cert_path.exists(), key_path.exists()) {
        (true, true) => {
            let cert = std::fs::read_to_string(&cert_path).map_err(io(&cert_path))?;
            let key_pem = std::fs::read_to_string(&key_path).map_err(io(&key_path))?;
            let key = KeyPair::from_pem(&key_pem)?;
            return Ok((Issuer::from_ca_cert_pem(&cert, key)?, issued));
        }
        (true, false) => {
            return Err(DevCertError::HalfCa {
                present: cert_path,
                missing: key_path,
            });
        }
        (false, true) => {
            return Err(DevCertError::HalfCa {
                present: key_path,
                missing: cert_path,
            });
        }
        (false, false) => {}
    }
    let key = KeyPair::generate()?;
    let params = ca_params()?;
    let cert = params.self_signed(&key)?;
    private_dir(ca_dir)?;
    write_private(&key_path, &key.serialize_pem())?;
    std::fs::write(&cert_path, cert.pem()).map_err(io(&cert_path))?;
    issued.ca_created = true;
    Ok((Issuer::new(params, key), issued))
}

fn write_private(path: &Path, text: &str) -> Result<(), DevCertError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(io(path))?;
    file.write_all(text.as_bytes()).map_err(io(path))?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(io(path))
}

fn leaf(
    issuer: &Issuer<'static, KeyPair>,
    identity: &str,
    extra_dns: &[&str],
    server_hosts: Option<&[String]>,
) -> Result<(String, String), DevCertError> {
    let server = server_hosts.is_some();
    let mut names = vec![identity.to_string()];
    names.extend(extra_dns.iter().map(|s| s.to_string()));
    let mut ips = vec![std::net::IpAddr::from([127, 0, 0, 1])];
    for host in server_hosts.unwrap_or_default() {
        match host.parse::<std::net::IpAddr>() {
            Ok(ip) if !ips.contains(&ip) => ips.push(ip),
            Ok(_) => {}
            Err(_) if !names.contains(host) => names.push(host.clone()),
            Err(_) => {}
        }
    }
    let mut params = CertificateParams::new(names)?;
    if server {
        params
            .subject_alt_names
            .extend(ips.into_iter().map(SanType::IpAddress));
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

/// True if `edge` can be a new edge's id
/// ([`tributary_proto::keys::new_edge_id_problem`]).
pub fn is_valid_edge_id(edge: &str) -> bool {
    tributary_proto::keys::new_edge_id_problem(edge).is_none()
}

/// True if `host` is an IP address or a DNS name (labels of 1-63 ASCII
/// letters, digits or '-', not starting or ending with '-', at most 253
/// bytes in all, the last label not all digits: RFC 3696 §2, so that a
/// mistyped address such as `999.1.1.1` is refused, not taken for a name).
pub fn is_valid_host(host: &str) -> bool {
    if host.parse::<std::net::IpAddr>().is_ok() {
        return true;
    }
    let numeric_tld = host
        .rsplit('.')
        .next()
        .is_some_and(|tld| tld.bytes().all(|b| b.is_ascii_digit()));
    !host.is_empty()
        && !numeric_tld
        && host.len() <= 253
        && host.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
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

/// Creates (or reuses) the CA (`{dir}/ca.pem`, key in
/// [`default_ca_dir`]`(dir)`) and issues certificates for the given brokers
/// and edges into `dir`, overwriting existing ones of the same name.
///
/// # Errors
/// As [`issue_with_ca_dir`]; [`DevCertError::NoCaDir`] when `dir` has no
/// last component.
pub fn issue(dir: &Path, brokers: &[u64], edges: &[String]) -> Result<Issued, DevCertError> {
    let ca_dir = default_ca_dir(dir).ok_or_else(|| DevCertError::NoCaDir(dir.to_path_buf()))?;
    issue_with_ca_dir(dir, &ca_dir, brokers, edges)
}

/// [`issue`] with the CA key in `ca_dir`.
///
/// # Errors
/// [`DevCertError`] for an invalid edge id (checked before anything is
/// written), half a CA, I/O or rcgen failures.
pub fn issue_with_ca_dir(
    dir: &Path,
    ca_dir: &Path,
    brokers: &[u64],
    edges: &[String],
) -> Result<Issued, DevCertError> {
    issue_for_hosts(dir, ca_dir, brokers, &[], edges)
}

/// [`issue_with_ca_dir`], each broker certificate also carrying
/// `broker_hosts`: DNS names or IP addresses (as subject alternative names)
/// that clients reach the brokers' HTTPS listeners by (enrollment,
/// `tribctl`, consumers following a redirect), besides `localhost` and
/// `127.0.0.1`.
///
/// # Errors
/// As [`issue_with_ca_dir`]; [`DevCertError::InvalidHost`] for a name
/// that is neither an IP address nor a DNS name (checked before anything
/// is written).
pub fn issue_for_hosts(
    dir: &Path,
    ca_dir: &Path,
    brokers: &[u64],
    broker_hosts: &[String],
    edges: &[String],
) -> Result<Issued, DevCertError> {
    if let Some(bad) = edges.iter().find(|e| !is_valid_edge_id(e)) {
        return Err(DevCertError::InvalidEdgeId(bad.clone()));
    }
    if let Some(bad) = broker_hosts.iter().find(|h| !is_valid_host(h)) {
        return Err(DevCertError::InvalidHost(bad.clone()));
    }
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let (issuer, issued) = load_or_create_ca(dir, ca_dir)?;
    for id in brokers {
        let identity = format!("broker-{id}");
        let (cert, key) = leaf(
            &issuer,
            &identity,
            &[BROKER_SERVER_NAME, "localhost"],
            Some(broker_hosts),
        )?;
        write_pair(dir, &identity, &cert, &key)?;
    }
    for edge in edges {
        let (cert, key) = leaf(&issuer, edge, &[], None)?;
        write_pair(dir, &format!("edge-{edge}"), &cert, &key)?;
    }
    Ok(issued)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::{TlsIdentity, certificate_identity, load_certs};
    use std::os::unix::fs::PermissionsExt;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn issued_certificates_load_and_carry_their_identity() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("certs");
        let issued = issue(&out, &[3], &["plant1".into()]).unwrap();
        assert!(issued.ca_created);
        let broker = broker_paths(&out, 3);
        TlsIdentity::load(&broker).unwrap();
        let cert = &load_certs(&broker.cert).unwrap()[0];
        assert_eq!(certificate_identity(cert).as_deref(), Some("broker-3"));
        let edge = edge_paths(&out, "plant1");
        let cert = &load_certs(&edge.cert).unwrap()[0];
        assert_eq!(certificate_identity(cert).as_deref(), Some("plant1"));
        // A second call reuses the CA: the first edge still chains to it.
        let ca_before = std::fs::read(out.join("ca.pem")).unwrap();
        let again = issue(&out, &[], &["plant2".into()]).unwrap();
        assert!(!again.ca_created);
        assert_eq!(std::fs::read(out.join("ca.pem")).unwrap(), ca_before);
    }

    #[test]
    fn the_ca_key_is_written_beside_the_output_directory_not_in_it() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("certs");
        let issued = issue(&out, &[1], &["plant1".into()]).unwrap();
        let ca_dir = dir.path().join("certs-ca");
        assert_eq!(issued.ca_key, ca_dir.join("ca.key"));
        assert_eq!(ca_key_path(&out).unwrap(), ca_dir.join("ca.key"));
        assert_eq!(mode(&ca_dir), 0o700);
        assert_eq!(mode(&issued.ca_key), 0o600);
        let mut in_out: Vec<String> = std::fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        in_out.sort();
        assert_eq!(
            in_out,
            [
                "broker-1.key",
                "broker-1.pem",
                "ca.pem",
                "edge-plant1.key",
                "edge-plant1.pem"
            ]
        );
        for key in ["broker-1.key", "edge-plant1.key"] {
            assert_eq!(mode(&out.join(key)), 0o600, "{key}");
        }
        // An explicit CA directory.
        let other = dir.path().join("vault");
        let issued = issue_with_ca_dir(&dir.path().join("b"), &other, &[1], &[]).unwrap();
        assert_eq!(issued.ca_key, other.join("ca.key"));
        assert!(other.join("ca.key").exists());
    }

    #[test]
    fn a_ca_key_of_the_old_layout_is_moved_out_and_half_a_ca_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("certs");
        issue(&out, &[], &["plant1".into()]).unwrap();
        let key = ca_key_path(&out).unwrap();
        // The old layout: the key inside the output directory.
        std::fs::rename(&key, out.join("ca.key")).unwrap();
        let issued = issue(&out, &[], &["plant2".into()]).unwrap();
        assert_eq!(issued.ca_key_moved_from, Some(out.join("ca.key")));
        assert!(!issued.ca_created);
        assert!(!out.join("ca.key").exists());
        assert!(key.exists());
        // plant2 chains to the same CA as plant1.
        let roots = crate::tls::load_roots(&out.join("ca.pem")).unwrap();
        assert_eq!(roots.len(), 1);
        std::fs::remove_file(&key).unwrap();
        let err = issue(&out, &[], &["plant3".into()])
            .unwrap_err()
            .to_string();
        assert!(err.contains("ca.pem exists but"), "{err}");
        assert!(err.contains("certs-ca/ca.key does not"), "{err}");
        assert!(!out.join("edge-plant3.pem").exists());
    }

    /// The DNS names and IP addresses of the certificate at `path`.
    fn sans(path: &Path) -> (Vec<String>, Vec<String>) {
        use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};
        let der = load_certs(path).unwrap().remove(0);
        let (_, parsed) = X509Certificate::from_der(der.as_ref()).unwrap();
        let san = parsed.subject_alternative_name().unwrap().unwrap();
        let (mut dns, mut ips) = (Vec::new(), Vec::new());
        for name in &san.value.general_names {
            match name {
                GeneralName::DNSName(d) => dns.push((*d).to_string()),
                GeneralName::IPAddress(ip) => ips.push(format!("{ip:?}")),
                _ => {}
            }
        }
        (dns, ips)
    }

    #[test]
    fn broker_certificates_carry_the_given_hosts_and_bad_hosts_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("certs");
        let ca_dir = dir.path().join("ca");
        let hosts = [
            "broker-1.example.net".to_string(),
            "10.0.0.7".into(),
            "::1".into(),
            "localhost".into(),
        ];
        issue_for_hosts(&out, &ca_dir, &[1], &hosts, &["plant1".into()]).unwrap();
        let (dns, ips) = sans(&broker_paths(&out, 1).cert);
        assert_eq!(
            dns,
            [
                "broker-1",
                BROKER_SERVER_NAME,
                "localhost",
                "broker-1.example.net"
            ]
        );
        assert_eq!(
            ips,
            [
                format!("{:?}", [127u8, 0, 0, 1].as_slice()),
                format!("{:?}", [10u8, 0, 0, 7].as_slice()),
                format!(
                    "{:?}",
                    [0u8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1].as_slice()
                ),
            ]
        );
        // Edges carry only their identity.
        assert_eq!(sans(&edge_paths(&out, "plant1").cert).0, ["plant1"]);
        for bad in [
            "",
            "a b",
            "-x.example",
            "x..y",
            "ex ample.net",
            &"a".repeat(64),
            "999.1.1.1",
            "10.0.0.256",
            "1234",
        ] {
            let other = dir.path().join("other");
            let err = issue_for_hosts(&other, &ca_dir, &[1], &[bad.to_string()], &[]).unwrap_err();
            assert!(matches!(err, DevCertError::InvalidHost(_)), "{bad:?}");
            assert!(!other.exists(), "{bad:?}: nothing written");
        }
    }

    #[test]
    fn invalid_edge_ids_are_refused_before_writing() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("certs");
        for bad in [
            "",
            "a/b",
            "..",
            "x y",
            &"a".repeat(64),
            "_system",
            "_x",
            "default",
        ] {
            let err = issue(&out, &[], &[bad.to_string()]).unwrap_err();
            assert!(matches!(err, DevCertError::InvalidEdgeId(_)), "{bad:?}");
        }
        assert!(!out.join("ca.pem").exists());
        assert!(!dir.path().join("certs-ca").exists());
    }
}
