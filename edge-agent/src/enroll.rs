//! `edge-agent enroll`: get this device's client certificate from a broker
//! with a one-time enrollment token (`tribctl edges token EDGE_ID`). The
//! private key is made here and never leaves the device:
//!
//! 1. The token names its edge (`trib-enroll.<edge_id>.<hex>`); a
//!    configuration whose `edge_id` differs is refused before anything is
//!    made.
//! 2. A new ECDSA P-256 key is generated and written, synced, to
//!    `{tls.key}.new` before anything is sent. Its mode is 0600, except in
//!    a directory shared with one group and closed to others (mode
//!    `rwxr-x---`, as the packages make `/etc/tributary/certs`,
//!    root:tributary 0750): there the key gets that group and mode 0640, so
//!    the service's user reads what root enrolled ([`key_access`]).
//! 3. Only a certificate signing request (public key, signed by that key)
//!    goes to `POST https://{broker}/v1/enroll`, over HTTPS that trusts
//!    only the CA given with `--ca` (default `tls.ca`), with the token as
//!    bearer token.
//! 4. The answer must be a certificate for this key whose identity is the
//!    edge id. Then the certificate is written to `tls.cert` (temporary
//!    file, sync, rename) and the new key renamed over `tls.key`; with
//!    `--ca` and no `tls.ca` file yet, the CA is copied there too. A
//!    running agent picks the new pair up on its own (file change or
//!    SIGHUP: [`crate::cert_reload`]).
//!
//! On any refusal nothing is replaced: the new key is deleted and the old
//! files stay as they were. Files that could not be replaced (a directory
//! at `tls.cert`, a directory the user cannot write) are refused before
//! the key is made and the token sent, so the token stays usable.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use broker_core::tls::TlsPaths;
use rcgen::{CertificateParams, DnType, KeyPair, PublicKeyData};
use tributary_api::client::{ClientError, ClientTls, HttpClient};
use tributary_api::enroll::{ENROLL_PATH, ENROLL_TOKEN_PREFIX, EnrollRequest, EnrollResponse};

/// Longest wait for each phase of the enrollment request.
pub const ENROLL_TIMEOUT: Duration = Duration::from_secs(30);

/// Suffix of the new key's file until the certificate arrives.
pub const PENDING_KEY_SUFFIX: &str = ".new";

/// What `enroll` needs.
#[derive(Debug, Clone)]
pub struct EnrollOptions {
    /// The broker's HTTPS admin address, `host:port` or `https://host:port`;
    /// the host must be a name its certificate carries.
    pub broker: String,
    /// The enrollment token.
    pub token: String,
    /// CA to verify the broker with; `None`: `tls.ca`.
    pub ca: Option<PathBuf>,
    /// Where the certificate, key and CA go (the agent's `[tls]`).
    pub tls: TlsPaths,
    /// The configuration's `edge_id`, if it sets one.
    pub edge_id: Option<String>,
    /// Enroll even when `tls.cert` holds a certificate of another edge id
    /// (the device takes the token's identity; its topics of the old
    /// namespace are no longer opened). Without it that is refused.
    pub replace_identity: bool,
}

/// What enrolling wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Enrolled {
    /// The certificate's identity.
    pub edge_id: String,
    /// Its serial number, hex.
    pub serial: String,
    /// End of validity, ms since the epoch.
    pub not_after_ms: u64,
    /// End of validity as the certificate states it (UTC).
    pub not_after: String,
    /// The certificate file written.
    pub cert: PathBuf,
    /// The key file written.
    pub key: PathBuf,
    /// The CA file, when `--ca` was copied to it.
    pub ca_written: Option<PathBuf>,
}

/// Why enrolling failed (nothing was replaced).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EnrollError {
    /// The token is not an enrollment token.
    #[error(
        "--token is not an enrollment token (trib-enroll.<edge_id>.<64 hex>, from `tribctl edges token EDGE_ID`)"
    )]
    NotAToken,
    /// The token enrolls another edge than the configured one.
    #[error(
        "the token enrolls edge {token_edge:?} but this agent's edge_id is {configured:?}: \
         mint a token for {configured:?}"
    )]
    WrongEdge {
        /// The token's edge.
        token_edge: String,
        /// The configured edge id.
        configured: String,
    },
    /// `tls.cert` is a certificate of another edge: enrolling would change
    /// the device's identity (and the namespace its topics are in).
    #[error(
        "{cert} is the certificate of edge {current:?}, the token is for {token_edge:?}: enrolling \
         would make this device {token_edge:?} and leave the topics of {current:?} unreplicated; \
         mint a token for {current:?} (tribctl edges token {current}), or pass --replace-identity \
         to change the device's identity"
    )]
    IdentityChange {
        /// The current certificate's edge id.
        current: String,
        /// The token's edge.
        token_edge: String,
        /// The certificate file.
        cert: String,
    },
    /// No CA to verify the broker with.
    #[error(
        "no CA to verify the broker: tls.ca {} does not exist; pass --ca FILE (the cluster CA)",
        .0.display()
    )]
    NoCa(PathBuf),
    /// A file could not be written or read.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// Key or CSR generation failed.
    #[error("generating the key and CSR: {0}")]
    Key(#[from] rcgen::Error),
    /// The broker refused or could not be reached.
    #[error("{0}")]
    Broker(String),
    /// The broker's answer is not a certificate for this key and edge.
    #[error("the broker's answer is unusable: {0}")]
    BadCertificate(String),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> EnrollError + '_ {
    move |source| EnrollError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The edge id of an enrollment token.
fn token_edge(token: &str) -> Option<&str> {
    let (edge, secret) = token.strip_prefix(ENROLL_TOKEN_PREFIX)?.rsplit_once('.')?;
    (!edge.is_empty() && secret.len() == 64).then_some(edge)
}

/// `path` with `suffix` added to its file name.
fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(suffix);
    path.with_file_name(name)
}

/// Who may read a new private key, from its directory's mode bits and
/// group: `(mode, group)`, the group to give the file or `None` to leave
/// the creator's. A directory that its group may enter and read and others
/// may not (`dir_mode & 0o050 == 0o050`, `dir_mode & 0o007 == 0`) is shared
/// with that group on purpose: the key is 0640 with the directory's group.
/// Anywhere else 0600.
#[must_use]
pub fn key_access(dir_mode: u32, dir_gid: u32) -> (u32, Option<u32>) {
    if dir_mode & 0o050 == 0o050 && dir_mode & 0o007 == 0 {
        (0o640, Some(dir_gid))
    } else {
        (0o600, None)
    }
}

/// Writes `bytes` to `path` with `mode` (and `group`, if given), synced (a
/// new file, or an old one truncated and its mode set).
fn write_synced(
    path: &Path,
    bytes: &[u8],
    mode: u32,
    group: Option<u32>,
) -> Result<(), EnrollError> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    // Created without any group access; the group is set before the mode
    // opens to it.
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode & 0o600)
        .open(path)
        .map_err(io(path))?;
    if group.is_some() {
        std::os::unix::fs::fchown(&file, None, group).map_err(io(path))?;
    }
    file.set_permissions(std::fs::Permissions::from_mode(mode))
        .map_err(io(path))?;
    file.write_all(bytes).map_err(io(path))?;
    file.sync_all().map_err(io(path))
}

/// Makes the entries of `path`'s directory durable.
/// Refuses a file `enroll` could not replace: a directory at `path`, or a
/// directory where `{path}.tmp` cannot be created (the temporary file is
/// removed again).
fn check_replaceable(path: &Path) -> Result<(), EnrollError> {
    if path.is_dir() {
        return Err(io(path)(std::io::Error::new(
            std::io::ErrorKind::IsADirectory,
            "is a directory, not a file; nothing was sent",
        )));
    }
    let tmp = with_suffix(path, ".tmp");
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp)
        .map_err(io(&tmp))?;
    let _ = std::fs::remove_file(&tmp);
    Ok(())
}

fn sync_parent(path: &Path) -> Result<(), EnrollError> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(dir))
}

/// The base URL of `broker` (`host:port` gets `https://`).
fn base_url(broker: &str) -> String {
    if broker.contains("://") {
        broker.trim_end_matches('/').to_owned()
    } else {
        format!("https://{broker}")
    }
}

/// A refusal in the operator's words: the broker's message, prefixed with
/// what failed.
fn describe(url: &str, error: &ClientError) -> String {
    match error {
        ClientError::Api {
            status, message, ..
        } => {
            format!("the broker at {url} refused the enrollment ({status}): {message}")
        }
        other => format!("enrolling at {url}: {other}"),
    }
}

/// Enrolls this device (see the module doc).
///
/// # Errors
/// [`EnrollError`]; nothing was replaced.
pub fn enroll(options: &EnrollOptions) -> Result<Enrolled, EnrollError> {
    let edge = token_edge(&options.token).ok_or(EnrollError::NotAToken)?;
    if let Some(configured) = &options.edge_id
        && configured != edge
    {
        return Err(EnrollError::WrongEdge {
            token_edge: edge.to_owned(),
            configured: configured.clone(),
        });
    }
    let tls = &options.tls;
    // A certificate already here names the device's identity; a token for
    // another edge changes it only when asked to. (An unreadable file is
    // no identity: enrolling replaces it.)
    let current = broker_core::tls::load_certs(&tls.cert)
        .ok()
        .and_then(|certs| {
            certs
                .first()
                .and_then(broker_core::tls::certificate_identity)
        });
    if let Some(current) = current
        && current != edge
        && !options.replace_identity
    {
        return Err(EnrollError::IdentityChange {
            current,
            token_edge: edge.to_owned(),
            cert: tls.cert.display().to_string(),
        });
    }
    let ca = options.ca.clone().unwrap_or_else(|| tls.ca.clone());
    if !ca.is_file() {
        return Err(EnrollError::NoCa(ca));
    }
    for path in [&tls.cert, &tls.key, &tls.ca] {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io(dir))?;
        }
    }
    // Every file to be replaced must be replaceable before the token is
    // spent: a refusal after the broker signed would leave the token used
    // and, at worst, the new key beside the old certificate.
    check_replaceable(&tls.key)?;
    check_replaceable(&tls.cert)?;
    if options.ca.is_some() && !tls.ca.exists() {
        check_replaceable(&tls.ca)?;
    }
    let key = KeyPair::generate()?;
    let pending = with_suffix(&tls.key, PENDING_KEY_SUFFIX);
    let key_dir = tls
        .key
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let (mode, group) = {
        use std::os::unix::fs::MetadataExt;
        let dir = std::fs::metadata(key_dir).map_err(io(key_dir))?;
        key_access(dir.mode(), dir.gid())
    };
    write_synced(&pending, key.serialize_pem().as_bytes(), mode, group)?;
    let result = request_and_install(options, edge, &key, &pending, &ca);
    if result.is_err() {
        let _ = std::fs::remove_file(&pending);
    }
    result
}

fn request_and_install(
    options: &EnrollOptions,
    edge: &str,
    key: &KeyPair,
    pending: &Path,
    ca: &Path,
) -> Result<Enrolled, EnrollError> {
    let tls = &options.tls;
    let mut params = CertificateParams::new(vec![edge.to_owned()])?;
    params.distinguished_name.push(DnType::CommonName, edge);
    let csr = params.serialize_request(key)?.pem()?;
    let url = base_url(&options.broker);
    let client = HttpClient::with_tls(
        &url,
        Some(&options.token),
        ENROLL_TIMEOUT,
        &ClientTls {
            ca: ca.to_path_buf(),
            client_cert: None,
        },
    )
    .map_err(|e| EnrollError::Broker(describe(&url, &e)))?;
    let answer: EnrollResponse = client
        .post(ENROLL_PATH, &EnrollRequest { csr })
        .map_err(|e| EnrollError::Broker(describe(&url, &e)))?;
    let not_after = check_answer(&answer, edge, key)?;
    let cert_tmp = with_suffix(&tls.cert, ".tmp");
    write_synced(&cert_tmp, answer.certificate.as_bytes(), 0o644, None)?;
    let mut ca_written = None;
    if options.ca.is_some() && !tls.ca.exists() {
        let bytes = std::fs::read(ca).map_err(io(ca))?;
        let ca_tmp = with_suffix(&tls.ca, ".tmp");
        write_synced(&ca_tmp, &bytes, 0o644, None)?;
        std::fs::rename(&ca_tmp, &tls.ca).map_err(io(&tls.ca))?;
        ca_written = Some(tls.ca.clone());
    }
    std::fs::rename(pending, &tls.key).map_err(io(&tls.key))?;
    std::fs::rename(&cert_tmp, &tls.cert).map_err(io(&tls.cert))?;
    sync_parent(&tls.key)?;
    sync_parent(&tls.cert)?;
    Ok(Enrolled {
        edge_id: answer.edge_id,
        serial: answer.serial,
        not_after_ms: answer.not_after_ms,
        not_after,
        cert: tls.cert.clone(),
        key: tls.key.clone(),
        ca_written,
    })
}

/// The answer's certificate must parse, carry this key and identity
/// `edge`; returns its end of validity as text.
fn check_answer(answer: &EnrollResponse, edge: &str, key: &KeyPair) -> Result<String, EnrollError> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    use x509_parser::prelude::{FromDer, X509Certificate};
    let bad = |why: String| EnrollError::BadCertificate(why);
    let der = CertificateDer::from_pem_slice(answer.certificate.as_bytes())
        .map_err(|e| bad(format!("certificate: {e}")))?;
    let (_, parsed) =
        X509Certificate::from_der(der.as_ref()).map_err(|e| bad(format!("certificate: {e}")))?;
    if parsed.public_key().raw != key.subject_public_key_info().as_slice() {
        return Err(bad("the certificate is not for the key made here".into()));
    }
    let identity = broker_core::tls::certificate_identity(&der);
    if identity.as_deref() != Some(edge) {
        return Err(bad(format!(
            "the certificate's identity is {identity:?}, not the token's edge {edge:?}"
        )));
    }
    Ok(parsed.validity().not_after.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_group_readable_only_in_a_directory_shared_with_one_group() {
        // The packaged layout: root:tributary 0750 (setgid or not).
        assert_eq!(key_access(0o040_750, 998), (0o640, Some(998)));
        assert_eq!(key_access(0o042_750, 998), (0o640, Some(998)));
        assert_eq!(key_access(0o710 | 0o040, 998), (0o640, Some(998)));
        // Private, world-readable or group-writable-only directories: 0600.
        assert_eq!(key_access(0o040_700, 998), (0o600, None));
        assert_eq!(key_access(0o040_755, 998), (0o600, None));
        assert_eq!(key_access(0o040_751, 998), (0o600, None));
        assert_eq!(key_access(0o040_710, 998), (0o600, None));
    }

    #[test]
    fn a_key_written_for_a_shared_directory_has_its_group_and_mode_0640() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o750)).unwrap();
        let meta = std::fs::metadata(dir.path()).unwrap();
        let (mode, group) = key_access(meta.mode(), meta.gid());
        let key = dir.path().join("edge.key.new");
        write_synced(&key, b"key", mode, group).unwrap();
        let written = std::fs::metadata(&key).unwrap();
        assert_eq!(written.mode() & 0o777, 0o640);
        assert_eq!(written.gid(), meta.gid());
        assert_eq!(std::fs::read(&key).unwrap(), b"key");
    }

    #[test]
    fn tokens_urls_and_pending_names() {
        let token = format!("trib-enroll.plant1.{}", "a".repeat(64));
        assert_eq!(token_edge(&token), Some("plant1"));
        assert_eq!(token_edge("trib.plant1.x"), None);
        assert_eq!(token_edge("trib-enroll.plant1.abc"), None);
        assert_eq!(base_url("10.0.0.1:7400"), "https://10.0.0.1:7400");
        assert_eq!(base_url("https://b:7400/"), "https://b:7400");
        assert_eq!(
            with_suffix(Path::new("/etc/t/plant1.key"), PENDING_KEY_SUFFIX),
            Path::new("/etc/t/plant1.key.new")
        );
    }

    #[test]
    fn a_token_for_another_edge_or_no_ca_is_refused_before_a_key_is_made() {
        let dir = tempfile::tempdir().unwrap();
        let tls = TlsPaths {
            cert: dir.path().join("e.pem"),
            key: dir.path().join("e.key"),
            ca: dir.path().join("ca.pem"),
        };
        let options = EnrollOptions {
            broker: "127.0.0.1:1".into(),
            token: format!("trib-enroll.plant2.{}", "a".repeat(64)),
            ca: None,
            tls: tls.clone(),
            edge_id: Some("plant1".into()),
            replace_identity: false,
        };
        let err = enroll(&options).unwrap_err().to_string();
        assert!(
            err.contains("enrolls edge \"plant2\" but this agent's edge_id is \"plant1\""),
            "{err}"
        );
        let options = EnrollOptions {
            edge_id: None,
            ..options
        };
        let err = enroll(&options).unwrap_err().to_string();
        assert!(err.contains("pass --ca FILE"), "{err}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);

        // A certificate of plant1 already here: a plant2 token would change
        // the device's identity. Refused, nothing made, unless asked.
        broker_core::dev_certs::issue(&dir.path().join("certs"), &[], &["plant1".into()]).unwrap();
        let plant1 = broker_core::dev_certs::edge_paths(&dir.path().join("certs"), "plant1");
        std::fs::copy(&plant1.cert, &tls.cert).unwrap();
        let before = std::fs::read(&tls.cert).unwrap();
        let err = enroll(&options).unwrap_err().to_string();
        assert!(
            err.contains("is the certificate of edge \"plant1\", the token is for \"plant2\"")
                && err.contains("--replace-identity"),
            "{err}"
        );
        assert_eq!(std::fs::read(&tls.cert).unwrap(), before);
        assert!(!tls.key.exists() && !dir.path().join("e.key.new").exists());
        // Asked: it goes on (to the missing CA here).
        let options = EnrollOptions {
            replace_identity: true,
            ..options
        };
        let err = enroll(&options).unwrap_err().to_string();
        assert!(err.contains("pass --ca FILE"), "{err}");
    }
}
