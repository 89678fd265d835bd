//! TLS helpers (rustls, ring provider): load PEM files, build the mutual-TLS
//! QUIC server and client configs that require a certificate chaining to the
//! deployment's CA, the broker's HTTPS server config (optional client
//! certificate) and the HTTPS client config that trusts only that CA, and
//! read the verified peer's identity. Private key files every user may read
//! are refused ([`load_key`]).
//!
//! Identity: the first DNS name in the certificate's subject alternative
//! names, else its subject common name. `tribctl certs` issues edge
//! certificates whose identity is the edge id (which owns the namespace of
//! the same name) and broker certificates whose identity is `broker-{id}`
//! and which also carry the DNS name [`BROKER_SERVER_NAME`], the name clients
//! verify when connecting to any broker.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// DNS name every broker certificate carries; clients verify it. No edge
/// may have it as its id ([`tributary_proto::keys::reserved_edge_id`]).
pub const BROKER_SERVER_NAME: &str = tributary_proto::keys::BROKER_SERVER_NAME;
/// ALPN protocol of Raft traffic between brokers.
pub const ALPN_RAFT: &[u8] = b"tributary-raft/1";
/// ALPN protocol of edge → broker replication.
pub const ALPN_REPLICATION: &[u8] = b"tributary-replication/1";

/// Paths of this process's certificate chain, private key and the CA that
/// peers must chain to (all PEM).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsPaths {
    /// Certificate chain, leaf first.
    pub cert: PathBuf,
    /// PKCS#8, PKCS#1 or SEC1 private key.
    pub key: PathBuf,
    /// CA certificate(s) that peers' certificates must chain to.
    pub ca: PathBuf,
}

/// TLS setup errors.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// A PEM file could not be read or parsed.
    #[error("{}: {reason}", path.display())]
    Pem {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// rustls refused the configuration (bad key, no CA, ...).
    #[error("TLS configuration: {0}")]
    Config(String),
    /// A private key file every user on the host may read.
    #[error(transparent)]
    Secret(#[from] crate::secrets::SecretFileError),
    /// A file of the setting `setting` (`tls.cert`, `broker.ca`, ...) is
    /// unusable: [`TlsPaths::load_identity`] names the setting an operator
    /// has to fix. The inner error is part of the message (and not
    /// repeated as a source).
    #[error("{setting}: {error}")]
    Setting {
        /// The setting, e.g. `tls.key`.
        setting: String,
        /// What is wrong with its file.
        error: Box<TlsError>,
    },
}

impl TlsError {
    /// This error under the name of the setting whose file it is about.
    pub fn for_setting(self, setting: impl Into<String>) -> TlsError {
        TlsError::Setting {
            setting: setting.into(),
            error: Box::new(self),
        }
    }
}

impl TlsPaths {
    /// Loads the identity like [`TlsIdentity::load`], each failure named
    /// by its setting under `section` (`{section}.cert`, `{section}.key`,
    /// `{section}.ca`), so that `tls.cert: /etc/...: No such file or
    /// directory` tells the operator which line of the configuration to fix.
    ///
    /// # Errors
    /// [`TlsError::Setting`] around the first failure.
    pub fn load_identity(&self, section: &str) -> Result<TlsIdentity, TlsError> {
        let certs = load_certs(&self.cert).map_err(|e| e.for_setting(format!("{section}.cert")))?;
        let key = load_key(&self.key).map_err(|e| e.for_setting(format!("{section}.key")))?;
        let roots = load_roots(&self.ca).map_err(|e| e.for_setting(format!("{section}.ca")))?;
        TlsIdentity::from_parts(certs, key, roots, &self.cert, &self.key)
            .map_err(|e| e.for_setting(format!("{section}.key")))
    }

    /// Every problem with these files, each named by its setting under
    /// `section` (see [`TlsPaths::load_identity`]), and the identity when
    /// there is none: what `check-config` reports.
    pub fn check(&self, section: &str) -> Result<TlsIdentity, Vec<TlsError>> {
        let certs = load_certs(&self.cert).map_err(|e| e.for_setting(format!("{section}.cert")));
        let key = load_key(&self.key).map_err(|e| e.for_setting(format!("{section}.key")));
        let roots = load_roots(&self.ca).map_err(|e| e.for_setting(format!("{section}.ca")));
        match (certs, key, roots) {
            (Ok(certs), Ok(key), Ok(roots)) => {
                TlsIdentity::from_parts(certs, key, roots, &self.cert, &self.key)
                    .map_err(|e| vec![e.for_setting(format!("{section}.key"))])
            }
            (certs, key, roots) => Err([certs.err(), key.err(), roots.err()]
                .into_iter()
                .flatten()
                .collect()),
        }
    }
}

fn pem_err(path: &Path) -> impl FnOnce(String) -> TlsError + '_ {
    move |reason| TlsError::Pem {
        path: path.to_path_buf(),
        reason,
    }
}

/// Loads every certificate in a PEM file.
///
/// # Errors
/// [`TlsError::Pem`] if unreadable, malformed or empty.
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| pem_err(path)(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_err(path)(e.to_string()))?;
    if certs.is_empty() {
        return Err(pem_err(path)("no certificate found".into()));
    }
    Ok(certs)
}

/// Loads the first private key in a PEM file.
///
/// # Errors
/// [`TlsError::Secret`] if every user may read the file (`chmod 600` it);
/// [`TlsError::Pem`] if unreadable, malformed or without a key.
pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    crate::secrets::refuse_world_readable(path, "TLS private key")?;
    PrivateKeyDer::from_pem_file(path).map_err(|e| pem_err(path)(e.to_string()))
}

/// Loads the CA certificate(s) of a PEM file as the only trusted roots.
///
/// # Errors
/// [`TlsError::Pem`] if unreadable, malformed, empty or not a usable CA.
pub fn load_roots(path: &Path) -> Result<rustls::RootCertStore, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    for ca in load_certs(path)? {
        roots.add(ca).map_err(|e| pem_err(path)(e.to_string()))?;
    }
    Ok(roots)
}

/// ALPN protocols of the broker's HTTPS listener, preferred first.
pub const ALPN_HTTPS: &[&[u8]] = &[b"h2", b"http/1.1"];

/// A rustls client configuration for HTTPS to a broker: trusts only the CA
/// certificate(s) in `ca` (no web PKI roots: the cluster CA is private),
/// TLS 1.3 or 1.2, and presents `client` (certificate chain, key) when
/// given. ALPN is left to the HTTP client.
///
/// # Errors
/// [`TlsError`] for unreadable files, a world-readable key or a key that
/// is not the certificate's.
pub fn https_client_config(
    ca: &Path,
    client: Option<(&Path, &Path)>,
) -> Result<rustls::ClientConfig, TlsError> {
    let config_err = |e: &dyn std::fmt::Display| TlsError::Config(e.to_string());
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| config_err(&e))?
        .with_root_certificates(load_roots(ca)?);
    match client {
        Some((cert, key)) => builder
            .with_client_auth_cert(load_certs(cert)?, load_key(key)?)
            .map_err(|e| pem_err(key)(format!("client certificate {}: {e}", cert.display()))),
        None => Ok(builder.with_no_client_auth()),
    }
}

/// The process's loaded TLS material.
#[derive(Debug)]
pub struct TlsIdentity {
    certs: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    roots: Arc<rustls::RootCertStore>,
}

impl Clone for TlsIdentity {
    fn clone(&self) -> Self {
        TlsIdentity {
            certs: self.certs.clone(),
            key: self.key.clone_key(),
            roots: self.roots.clone(),
        }
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl TlsIdentity {
    /// Loads certificate, key and CA from `paths`.
    ///
    /// # Errors
    /// [`TlsError`] for unreadable files, an unusable CA, or a key that is
    /// not the certificate's ([`TlsError::Pem`] naming the key file): caught
    /// here, at start-up, rather than when the first connection is set up.
    pub fn load(paths: &TlsPaths) -> Result<TlsIdentity, TlsError> {
        let certs = load_certs(&paths.cert)?;
        let key = load_key(&paths.key)?;
        let roots = load_roots(&paths.ca)?;
        TlsIdentity::from_parts(certs, key, roots, &paths.cert, &paths.key)
    }

    /// The identity from loaded parts, once the key is known to be the
    /// certificate's (the paths name the files in the error).
    fn from_parts(
        certs: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
        roots: rustls::RootCertStore,
        cert_path: &Path,
        key_path: &Path,
    ) -> Result<TlsIdentity, TlsError> {
        rustls::sign::CertifiedKey::from_der(certs.clone(), key.clone_key(), &provider()).map_err(
            |e| {
                pem_err(key_path)(format!(
                    "not the key of the certificate {}: {e}",
                    cert_path.display()
                ))
            },
        )?;
        Ok(TlsIdentity {
            certs,
            key,
            roots: Arc::new(roots),
        })
    }

    /// The identity of this process's own (leaf) certificate, as peers see
    /// it ([`certificate_identity`]); `None` if it cannot be parsed.
    pub fn identity(&self) -> Option<String> {
        certificate_identity(self.certs.first()?)
    }

    /// Checks that this identity's certificate is a client certificate
    /// that chains to its CA (`ca`) and is valid now, as a broker checks
    /// it in the handshake.
    ///
    /// # Errors
    /// [`TlsError::Config`] naming why (another CA, expired, not for client
    /// authentication).
    pub fn verify_client_chain(&self) -> Result<(), TlsError> {
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            self.roots.clone(),
            provider(),
        )
        .build()
        .map_err(|e| TlsError::Config(e.to_string()))?;
        let (leaf, intermediates) = self
            .certs
            .split_first()
            .ok_or_else(|| TlsError::Config("no certificate".into()))?;
        verifier
            .verify_client_cert(leaf, intermediates, rustls::pki_types::UnixTime::now())
            .map(|_| ())
            .map_err(|e| {
                TlsError::Config(format!(
                    "the certificate is not a valid client certificate of the CA in tls.ca: {e}"
                ))
            })
    }

    /// The certificate chain, leaf first.
    pub fn certs(&self) -> &[CertificateDer<'static>] {
        &self.certs
    }

    /// The certificate chain and its signing key as rustls presents them
    /// (ring provider).
    ///
    /// # Errors
    /// [`TlsError::Config`] if the key is unusable (checked at load: not
    /// expected).
    pub fn certified_key(&self) -> Result<Arc<rustls::sign::CertifiedKey>, TlsError> {
        rustls::sign::CertifiedKey::from_der(self.certs.clone(), self.key.clone_key(), &provider())
            .map(Arc::new)
            .map_err(|e| TlsError::Config(e.to_string()))
    }

    /// The rustls server config of the broker's HTTPS listener: this
    /// identity's certificate, TLS 1.3 or 1.2, ALPN h2 and http/1.1
    /// ([`ALPN_HTTPS`]), and an optional client certificate: a client may
    /// present none, but one it presents must chain to the CA (a
    /// certificate from another CA fails the handshake).
    ///
    /// # Errors
    /// [`TlsError::Config`] if rustls rejects the key or roots.
    pub fn https_server(&self) -> Result<rustls::ServerConfig, TlsError> {
        let config_err = |e: &dyn std::fmt::Display| TlsError::Config(e.to_string());
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            self.roots.clone(),
            provider(),
        )
        .allow_unauthenticated()
        .build()
        .map_err(|e| config_err(&e))?;
        let mut tls = rustls::ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .map_err(|e| config_err(&e))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(self.certs.clone(), self.key.clone_key())
            .map_err(|e| config_err(&e))?;
        tls.alpn_protocols = ALPN_HTTPS.iter().map(|p| p.to_vec()).collect();
        Ok(tls)
    }

    /// QUIC server config that requires a client certificate chaining to the
    /// CA and speaks `alpn`.
    ///
    /// # Errors
    /// [`TlsError::Config`] if rustls rejects the key or roots.
    pub fn quic_server(&self, alpn: &[u8]) -> Result<quinn::ServerConfig, TlsError> {
        let config_err = |e: &dyn std::fmt::Display| TlsError::Config(e.to_string());
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            self.roots.clone(),
            provider(),
        )
        .build()
        .map_err(|e| config_err(&e))?;
        let mut tls = rustls::ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| config_err(&e))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(self.certs.clone(), self.key.clone_key())
            .map_err(|e| config_err(&e))?;
        tls.alpn_protocols = vec![alpn.to_vec()];
        let crypto =
            quinn::crypto::rustls::QuicServerConfig::try_from(tls).map_err(|e| config_err(&e))?;
        let mut config = quinn::ServerConfig::with_crypto(Arc::new(crypto));
        config.transport_config(Arc::new(transport_config()));
        Ok(config)
    }

    /// QUIC client config that presents this identity, verifies the server
    /// against the CA and speaks `alpn`.
    ///
    /// # Errors
    /// [`TlsError::Config`] if rustls rejects the key or roots.
    pub fn quic_client(&self, alpn: &[u8]) -> Result<quinn::ClientConfig, TlsError> {
        self.quic_client_with_transport(alpn, transport_config())
    }

    /// Like [`TlsIdentity::quic_client`] with other transport settings
    /// (start from [`transport_config`]), e.g. another congestion
    /// controller.
    ///
    /// # Errors
    /// [`TlsError::Config`] if rustls rejects the key or roots.
    pub fn quic_client_with_transport(
        &self,
        alpn: &[u8],
        transport: quinn::TransportConfig,
    ) -> Result<quinn::ClientConfig, TlsError> {
        let config_err = |e: &dyn std::fmt::Display| TlsError::Config(e.to_string());
        let mut tls = rustls::ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| config_err(&e))?
            .with_root_certificates(self.roots.clone())
            .with_client_auth_cert(self.certs.clone(), self.key.clone_key())
            .map_err(|e| config_err(&e))?;
        tls.alpn_protocols = vec![alpn.to_vec()];
        quic_client_config(tls, transport)
    }

    /// Like [`TlsIdentity::quic_client_with_transport`], presenting
    /// whatever certificate `client_cert` resolves to at each handshake
    /// (a [`crate::client_cert::SwappableClientCert`] lets a running
    /// process rotate its certificate: new connections use the new one).
    /// This identity's CA stays the only trusted root.
    ///
    /// TLS session resumption is off: a resumed TLS 1.3 session carries
    /// the client certificate of the session it resumes, so after a
    /// rotation the server would still see the old certificate (and, for a
    /// revoked one, refuse it for good). Every connection makes a full
    /// handshake with the current certificate.
    ///
    /// # Errors
    /// [`TlsError::Config`] if rustls rejects the roots.
    pub fn quic_client_with_resolver(
        &self,
        alpn: &[u8],
        transport: quinn::TransportConfig,
        client_cert: Arc<dyn rustls::client::ResolvesClientCert>,
    ) -> Result<quinn::ClientConfig, TlsError> {
        let config_err = |e: &dyn std::fmt::Display| TlsError::Config(e.to_string());
        let mut tls = rustls::ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| config_err(&e))?
            .with_root_certificates(self.roots.clone())
            .with_client_cert_resolver(client_cert);
        tls.resumption = rustls::client::Resumption::disabled();
        tls.alpn_protocols = vec![alpn.to_vec()];
        quic_client_config(tls, transport)
    }
}

/// The quinn client config of a rustls client config.
fn quic_client_config(
    tls: rustls::ClientConfig,
    transport: quinn::TransportConfig,
) -> Result<quinn::ClientConfig, TlsError> {
    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(tls)
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let mut config = quinn::ClientConfig::new(Arc::new(crypto));
    config.transport_config(Arc::new(transport));
    Ok(config)
}

/// Transport settings shared by all Tributary QUIC endpoints: keepalive every
/// [`KEEP_ALIVE`], idle timeout [`IDLE_TIMEOUT`], otherwise quinn's defaults
/// (Cubic congestion control).
///
/// The idle timeout in effect on a connection is the smaller of both
/// sides' (RFC 9000 §10.1): an edge agent asks for less (5 s by default,
/// its `[replication] idle_timeout_ms`) and pings more often (1 s), so it
/// notices a dead broker within seconds; the broker keeps these values for
/// clients that ask for nothing shorter (consumers, tribctl).
pub fn transport_config() -> quinn::TransportConfig {
    transport_config_with(KEEP_ALIVE, IDLE_TIMEOUT)
}

/// Keep-alive interval of [`transport_config`].
pub const KEEP_ALIVE: Duration = Duration::from_secs(5);
/// Idle timeout of [`transport_config`].
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// [`transport_config`] with another keep-alive interval and idle timeout
/// (an idle timeout beyond QUIC's varint range is left at quinn's default).
pub fn transport_config_with(
    keep_alive: Duration,
    idle_timeout: Duration,
) -> quinn::TransportConfig {
    let mut transport = quinn::TransportConfig::default();
    transport.keep_alive_interval(Some(keep_alive));
    if let Ok(idle) = quinn::IdleTimeout::try_from(idle_timeout) {
        transport.max_idle_timeout(Some(idle));
    }
    transport
}

/// Kernel buffer size asked for each QUIC UDP socket, bytes, for both
/// directions. Linux's default (about 208 KiB) holds ~150 full-size
/// datagrams: a receiver descheduled for a millisecond at a few hundred MB/s
/// overflows it, and every datagram the kernel drops there is a loss to the
/// congestion controller. The kernel caps the request at
/// `net.core.rmem_max` / `wmem_max`.
pub const UDP_BUFFER_BYTES: usize = 4 * 1024 * 1024;

/// Kernel buffer size asked for the broker's ingest socket, bytes, both
/// directions: one socket takes the datagrams of every edge, and on busy
/// cores its reader thread is sometimes descheduled long enough to overflow
/// 4 MiB (at 1,000 edges sending backlogs the edges lost 2,318 and 13,709
/// packets in two runs with 4 MiB, none in two with 16 MiB, which took
/// 20 % more records/s; `docs/benchmarks.md`, "Fan-in"). The broker's package raises
/// `net.core.rmem_max` / `wmem_max` to this (`/usr/lib/sysctl.d/`).
pub const INGEST_UDP_BUFFER_BYTES: usize = 16 * 1024 * 1024;

/// Binds a UDP socket for a QUIC endpoint on `addr`, with send and receive
/// buffers of [`UDP_BUFFER_BYTES`] as far as the kernel allows (a smaller
/// grant is logged once per socket with the sysctl to raise, and is not an
/// error).
///
/// # Errors
/// The bind error.
pub fn bind_udp(addr: std::net::SocketAddr) -> std::io::Result<std::net::UdpSocket> {
    bind_udp_with(addr, UDP_BUFFER_BYTES)
}

/// [`bind_udp`] asking for `buffer_bytes` instead (the broker's ingest
/// socket: [`INGEST_UDP_BUFFER_BYTES`]).
///
/// # Errors
/// The bind error.
pub fn bind_udp_with(
    addr: std::net::SocketAddr,
    buffer_bytes: usize,
) -> std::io::Result<std::net::UdpSocket> {
    let socket = std::net::UdpSocket::bind(addr)?;
    let state = quinn::udp::UdpSocketState::new((&socket).into())?;
    let _ = state.set_recv_buffer_size((&socket).into(), buffer_bytes);
    let _ = state.set_send_buffer_size((&socket).into(), buffer_bytes);
    // Linux reports twice what it grants (its bookkeeping overhead).
    let granted = state.recv_buffer_size((&socket).into()).unwrap_or(0);
    if granted < buffer_bytes {
        tracing::info!(
            %addr,
            granted_bytes = granted,
            wanted_bytes = buffer_bytes,
            "UDP receive buffer capped by the kernel; raise net.core.rmem_max and \
             net.core.wmem_max for fast links"
        );
    }
    Ok(socket)
}

/// A QUIC client endpoint on a [`bind_udp`] socket at `addr` (port 0 for
/// any), on the current tokio runtime.
///
/// # Errors
/// The bind error, or the runtime's if there is none.
pub fn client_endpoint(addr: std::net::SocketAddr) -> std::io::Result<quinn::Endpoint> {
    quinn::Endpoint::new(
        quinn::EndpointConfig::default(),
        None,
        bind_udp(addr)?,
        Arc::new(quinn::TokioRuntime),
    )
}

/// The identity of the verified peer of `connection`: the first DNS subject
/// alternative name of its leaf certificate, else its subject common name.
/// `None` if the peer sent no certificate or it cannot be parsed.
pub fn peer_identity(connection: &quinn::Connection) -> Option<String> {
    certificate_identity(&peer_certificate(connection)?)
}

/// The identity of a certificate (see [`peer_identity`]).
pub fn certificate_identity(cert: &CertificateDer<'_>) -> Option<String> {
    use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};
    let (_, parsed) = X509Certificate::from_der(cert.as_ref()).ok()?;
    if let Ok(Some(san)) = parsed.subject_alternative_name() {
        for name in &san.value.general_names {
            if let GeneralName::DNSName(dns) = name {
                return Some((*dns).to_string());
            }
        }
    }
    parsed
        .subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .map(str::to_string)
}

/// Whether `cert` carries `name` among its subject alternative DNS names
/// (ASCII case ignored). Every broker certificate carries
/// [`BROKER_SERVER_NAME`] (brokers verify it when connecting to each
/// other); a certificate signed for an enrolling edge carries only the
/// edge id, so the Raft listener requires it besides the `broker-` identity.
pub fn certificate_has_dns_name(cert: &CertificateDer<'_>, name: &str) -> bool {
    use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};
    let Ok((_, parsed)) = X509Certificate::from_der(cert.as_ref()) else {
        return false;
    };
    let Ok(Some(san)) = parsed.subject_alternative_name() else {
        return false;
    };
    san.value
        .general_names
        .iter()
        .any(|n| matches!(n, GeneralName::DNSName(dns) if dns.eq_ignore_ascii_case(name)))
}

/// The start of validity (`notBefore`) of a certificate, seconds since the
/// Unix epoch; `None` if it cannot be parsed. Brokers compare it with an
/// edge's revocation time (certificates issued up to then are refused).
pub fn certificate_not_before_s(cert: &CertificateDer<'_>) -> Option<i64> {
    use x509_parser::prelude::{FromDer, X509Certificate};
    let (_, parsed) = X509Certificate::from_der(cert.as_ref()).ok()?;
    Some(parsed.validity().not_before.timestamp())
}

/// The leaf certificate the verified peer of `connection` presented.
pub fn peer_certificate(connection: &quinn::Connection) -> Option<CertificateDer<'static>> {
    let certs = connection
        .peer_identity()?
        .downcast::<Vec<CertificateDer<'static>>>()
        .ok()?;
    certs.first().cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(feature = "dev-certs")]
    #[test]
    fn a_key_that_is_not_the_certificates_is_refused_when_loading() {
        let dir = tempfile::tempdir().unwrap();
        let certs = dir.path().join("certs");
        crate::dev_certs::issue(&certs, &[], &["e1".into(), "e2".into()]).unwrap();
        let mut paths = crate::dev_certs::edge_paths(&certs, "e1");
        assert!(TlsIdentity::load(&paths).is_ok());
        paths.key = crate::dev_certs::edge_paths(&certs, "e2").key;
        let Err(err) = TlsIdentity::load(&paths) else {
            panic!("a mismatched key was loaded");
        };
        let err = err.to_string();
        assert!(
            err.contains("edge-e2.key: not the key of the certificate"),
            "{err}"
        );
        assert!(err.contains("KeyMismatch"), "{err}");
    }

    /// The kernel's cap on a socket's receive buffer, bytes.
    fn rmem_max() -> usize {
        std::fs::read_to_string("/proc/sys/net/core/rmem_max")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    }

    #[test]
    fn quic_sockets_get_the_largest_receive_buffer_the_kernel_allows() {
        let socket = bind_udp("127.0.0.1:0".parse().unwrap()).unwrap();
        let state = quinn::udp::UdpSocketState::new((&socket).into()).unwrap();
        let granted = state.recv_buffer_size((&socket).into()).unwrap();
        let plain = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let default = state.recv_buffer_size((&plain).into()).unwrap();
        let allowed = UDP_BUFFER_BYTES.min(rmem_max());
        // Linux reports twice the granted size.
        assert!(granted >= allowed, "granted {granted}, allowed {allowed}");
        if rmem_max() > default {
            assert!(granted > default, "granted {granted}, default {default}");
        }
    }
}
