//! The `[enroll]` CA of a broker ([`EnrollConfig`], [`Signer`]): loads the
//! CA certificate and key (the key from `ca_key`, else
//! `$CREDENTIALS_DIRECTORY/enroll-ca-key`, refused when every user may read
//! it), checks that the brokers trust that CA (it must be one of the
//! certificates of `tls.ca`, else the edges it signs would be refused at
//! the handshake) and that the key is the certificate's, and signs
//! enrolling edges' certificates with rcgen: the CSR (PKCS#10, its
//! self-signature checked) contributes only its public key; identity,
//! validity, key usage and serial number are the broker's.

use std::path::{Path, PathBuf};

use rcgen::{
    CertificateParams, CertificateSigningRequestParams, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, PublicKeyData, SerialNumber,
};
use serde::Deserialize;
use tributary_proto::keys::NamespaceName;

/// Name of the systemd credential holding the CA key when `ca_key` is not
/// set (`LoadCredential=enroll-ca-key:/path/to/ca.key`).
pub const CA_KEY_CREDENTIAL: &str = "enroll-ca-key";

/// Default validity of a signed edge certificate, days.
pub const DEFAULT_CERT_VALIDITY_DAYS: u32 = 365;

/// Longest validity of a signed edge certificate, days (ten years).
pub const MAX_CERT_VALIDITY_DAYS: u32 = 3650;

/// `[enroll]`: the CA this broker signs enrolling edges' certificates with.
/// Without it, `POST /v1/enroll` answers `503 enrollment_disabled`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnrollConfig {
    /// The CA certificate (PEM): one of the certificates in `tls.ca`.
    pub ca_cert: PathBuf,
    /// Its private key (PEM, PKCS#8; not world-readable). Default:
    /// `$CREDENTIALS_DIRECTORY/enroll-ca-key`.
    #[serde(default)]
    pub ca_key: Option<PathBuf>,
    /// Days a signed certificate is valid, 1 to [`MAX_CERT_VALIDITY_DAYS`].
    /// Default [`DEFAULT_CERT_VALIDITY_DAYS`].
    #[serde(default = "default_validity")]
    pub cert_validity_days: u32,
}

fn default_validity() -> u32 {
    DEFAULT_CERT_VALIDITY_DAYS
}

/// Why the `[enroll]` CA cannot be used; each names its setting.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SignerError {
    /// `ca_key` is unset and there is no `$CREDENTIALS_DIRECTORY/enroll-ca-key`.
    #[error(
        "enroll.ca_key: not set, and no systemd credential {CA_KEY_CREDENTIAL} \
         ($CREDENTIALS_DIRECTORY/{CA_KEY_CREDENTIAL})"
    )]
    NoKey,
    /// The key file is world-readable or unreadable.
    #[error("enroll.ca_key: {0}")]
    KeySecret(#[from] broker_core::secrets::SecretFileError),
    /// A file is unusable.
    #[error("{setting}: {}: {reason}", path.display())]
    File {
        /// `enroll.ca_cert` or `enroll.ca_key`.
        setting: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The CA certificate is not among the brokers' trusted CAs.
    #[error(
        "enroll.ca_cert: {} is not one of the CA certificates of tls.ca ({}): the brokers \
         would refuse every certificate it signs",
        ca_cert.display(),
        tls_ca.display()
    )]
    NotTrusted {
        /// `enroll.ca_cert`.
        ca_cert: PathBuf,
        /// `tls.ca`.
        tls_ca: PathBuf,
    },
    /// `cert_validity_days` out of range.
    #[error("enroll.cert_validity_days: must be from 1 to {MAX_CERT_VALIDITY_DAYS}, got {0}")]
    Validity(u32),
}

/// A CSR that cannot be signed (`400 invalid_csr`).
#[derive(Debug, thiserror::Error)]
#[error("csr: {0}")]
pub struct CsrError(String);

/// A signed certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signed {
    /// The certificate, PEM.
    pub pem: String,
    /// Its serial number, lowercase hex.
    pub serial: String,
    /// Start of validity, seconds since the epoch.
    pub not_before_s: u64,
    /// End of validity, seconds since the epoch.
    pub not_after_s: u64,
}

/// The loaded `[enroll]` CA.
pub struct Signer {
    issuer: Issuer<'static, KeyPair>,
    ca_pem: String,
    validity_days: u32,
}

impl std::fmt::Debug for Signer {
    /// Never the key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer")
            .field("validity_days", &self.validity_days)
            .finish_non_exhaustive()
    }
}

fn file_err<'a>(setting: &'static str, path: &'a Path) -> impl FnOnce(String) -> SignerError + 'a {
    move |reason| SignerError::File {
        setting,
        path: path.to_path_buf(),
        reason,
    }
}

impl Signer {
    /// Loads the CA of `config`, checking it against the brokers' trusted
    /// CAs in `tls_ca` (the `tls.ca` file).
    ///
    /// # Errors
    /// [`SignerError`] naming the setting.
    pub fn load(config: &EnrollConfig, tls_ca: &Path) -> Result<Signer, SignerError> {
        if !(1..=MAX_CERT_VALIDITY_DAYS).contains(&config.cert_validity_days) {
            return Err(SignerError::Validity(config.cert_validity_days));
        }
        let key_path = match &config.ca_key {
            Some(path) => path.clone(),
            None => broker_core::secrets::credential_path(CA_KEY_CREDENTIAL)
                .ok_or(SignerError::NoKey)?,
        };
        broker_core::secrets::refuse_world_readable(&key_path, "enrollment CA private key")?;
        let cert_path = &config.ca_cert;
        let ca_pem = std::fs::read_to_string(cert_path)
            .map_err(|e| file_err("enroll.ca_cert", cert_path)(e.to_string()))?;
        let ca_der = broker_core::tls::load_certs(cert_path)
            .map_err(|e| file_err("enroll.ca_cert", cert_path)(e.to_string()))?
            .swap_remove(0);
        let trusted = broker_core::tls::load_certs(tls_ca)
            .map_err(|e| file_err("enroll.ca_cert", tls_ca)(format!("tls.ca: {e}")))?;
        if !trusted.iter().any(|c| c.as_ref() == ca_der.as_ref()) {
            return Err(SignerError::NotTrusted {
                ca_cert: cert_path.clone(),
                tls_ca: tls_ca.to_path_buf(),
            });
        }
        let key_pem = std::fs::read_to_string(&key_path)
            .map_err(|e| file_err("enroll.ca_key", &key_path)(e.to_string()))?;
        let key = KeyPair::from_pem(&key_pem).map_err(|e| {
            file_err("enroll.ca_key", &key_path)(format!("not a usable private key: {e}"))
        })?;
        let spki = {
            use x509_parser::prelude::{FromDer, X509Certificate};
            let (_, parsed) = X509Certificate::from_der(ca_der.as_ref())
                .map_err(|e| file_err("enroll.ca_cert", cert_path)(e.to_string()))?;
            if !parsed.is_ca() {
                return Err(file_err("enroll.ca_cert", cert_path)(
                    "not a CA certificate (basic constraints without cA)".into(),
                ));
            }
            parsed.public_key().raw.to_vec()
        };
        if key.subject_public_key_info() != spki {
            return Err(file_err("enroll.ca_key", &key_path)(format!(
                "not the key of the CA certificate {}",
                cert_path.display()
            )));
        }
        let issuer = Issuer::from_ca_cert_pem(&ca_pem, key)
            .map_err(|e| file_err("enroll.ca_cert", cert_path)(e.to_string()))?;
        Ok(Signer {
            issuer,
            ca_pem,
            validity_days: config.cert_validity_days,
        })
    }

    /// The CA certificate, PEM.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// Signs a client certificate for `edge` with the public key of
    /// `csr_pem` (whose self-signature must verify): identity `edge` (DNS
    /// name and common name), key usage digital signature, extended key
    /// usage client authentication, not a CA, serial number `serial` (16
    /// bytes, the first bit cleared so it is positive), valid from
    /// `not_before_s` for the configured number of days. Nothing the CSR
    /// asks for besides its key is used.
    ///
    /// # Errors
    /// [`CsrError`]: not PEM, not a CSR, a bad self-signature, an
    /// extension or key algorithm rcgen does not support.
    pub fn sign(
        &self,
        csr_pem: &str,
        edge: &NamespaceName,
        not_before_s: u64,
        mut serial: [u8; 16],
    ) -> Result<Signed, CsrError> {
        let csr = CertificateSigningRequestParams::from_pem(csr_pem)
            .map_err(|e| CsrError(csr_reason(&e)))?;
        let mut params = CertificateParams::new(vec![edge.as_str().to_owned()])
            .map_err(|e| CsrError(format!("edge id {edge}: {e}")))?;
        params
            .distinguished_name
            .push(DnType::CommonName, edge.as_str());
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        serial[0] &= 0x7f;
        params.serial_number = Some(SerialNumber::from_slice(&serial));
        let not_after_s = not_before_s + u64::from(self.validity_days) * 86_400;
        // rcgen's date type is the Unix epoch plus a duration here.
        let epoch = rcgen::date_time_ymd(1970, 1, 1);
        params.not_before = epoch + std::time::Duration::from_secs(not_before_s);
        params.not_after = epoch + std::time::Duration::from_secs(not_after_s);
        params.use_authority_key_identifier_extension = true;
        let cert = CertificateSigningRequestParams {
            params,
            public_key: csr.public_key,
        }
        .signed_by(&self.issuer)
        .map_err(|e| CsrError(format!("cannot sign its key: {e}")))?;
        Ok(Signed {
            pem: cert.pem(),
            serial: crate::auth::model::hex(&serial),
            not_before_s,
            not_after_s,
        })
    }
}

/// rcgen's CSR errors in an operator's words.
fn csr_reason(error: &rcgen::Error) -> String {
    match error {
        rcgen::Error::CouldNotParseCertificationRequest => {
            "not a PEM certificate signing request (-----BEGIN CERTIFICATE REQUEST-----)".into()
        }
        rcgen::Error::InvalidCertificationRequestSignature => {
            // Also what rcgen says for a key and signature pair it cannot
            // verify (P-256 signed with SHA-384, say): a security trial
            // took that for tampering.
            "its signature does not verify with its own public key (altered, or a key and \
             signature algorithm pair the broker cannot verify; edge-agent enroll makes an \
             ECDSA P-256 key signed with SHA-256, which it can)"
                .into()
        }
        rcgen::Error::UnsupportedExtension => {
            "it asks for an extension the broker does not sign (only subject alternative \
             names, key usages, extended key usages and basic constraints are understood)"
                .into()
        }
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use broker_core::tls::{certificate_identity, certificate_not_before_s};
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    use std::sync::Arc;

    fn config(dir: &Path) -> EnrollConfig {
        let certs = dir.join("certs");
        broker_core::dev_certs::issue(&certs, &[1], &[]).unwrap();
        EnrollConfig {
            ca_cert: certs.join("ca.pem"),
            ca_key: broker_core::dev_certs::ca_key_path(&certs),
            cert_validity_days: 30,
        }
    }

    #[test]
    fn the_certificate_is_the_edges_for_the_csrs_key_whatever_the_csr_asks() {
        let dir = tempfile::tempdir().unwrap();
        let config = config(dir.path());
        let signer = Signer::load(&config, &config.ca_cert).unwrap();
        // A CSR asking to be someone else, a CA, for a server.
        let key = KeyPair::generate().unwrap();
        let mut asked = CertificateParams::new(vec!["broker-1".to_owned()]).unwrap();
        asked
            .distinguished_name
            .push(DnType::CommonName, "broker-1");
        asked.is_ca = IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        asked.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let csr = asked.serialize_request(&key).unwrap().pem().unwrap();
        let edge = NamespaceName::new("plant1").unwrap();
        let signed = signer.sign(&csr, &edge, 1_700_000_000, [0xff; 16]).unwrap();
        assert_eq!(signed.serial, format!("7f{}", "ff".repeat(15)));
        assert_eq!(signed.not_after_s, 1_700_000_000 + 30 * 86_400);
        let der = CertificateDer::from_pem_slice(signed.pem.as_bytes()).unwrap();
        assert_eq!(certificate_identity(&der).as_deref(), Some("plant1"));
        assert_eq!(certificate_not_before_s(&der), Some(1_700_000_000));
        use x509_parser::prelude::{FromDer, X509Certificate};
        let (_, parsed) = X509Certificate::from_der(der.as_ref()).unwrap();
        assert!(!parsed.is_ca());
        assert_eq!(
            parsed.public_key().raw,
            key.subject_public_key_info().as_slice()
        );
        let eku = parsed.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.client_auth && !eku.server_auth);
        assert_eq!(parsed.subject().to_string(), "CN=plant1");
        // It chains to the CA (the brokers' verifier accepts it).
        let roots = broker_core::tls::load_roots(&config.ca_cert).unwrap();
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            Arc::new(rustls::crypto::ring::default_provider()),
        )
        .build()
        .unwrap();
        let now = rustls::pki_types::UnixTime::since_unix_epoch(std::time::Duration::from_secs(
            1_700_000_100,
        ));
        verifier.verify_client_cert(&der, &[], now).unwrap();
    }

    #[test]
    fn a_signed_certificate_never_carries_the_brokers_server_name() {
        use broker_core::tls::{BROKER_SERVER_NAME, certificate_has_dns_name};
        let dir = tempfile::tempdir().unwrap();
        let config = config(dir.path());
        let signer = Signer::load(&config, &config.ca_cert).unwrap();
        let key = KeyPair::generate().unwrap();
        let mut asked =
            CertificateParams::new(vec!["broker-2".to_owned(), BROKER_SERVER_NAME.to_owned()])
                .unwrap();
        asked.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let csr = asked.serialize_request(&key).unwrap().pem().unwrap();
        // Even for an id the admin API now refuses (a token stored before
        // the rule), the Raft listener would not take it for a broker's.
        let edge = NamespaceName::new("broker-2").unwrap();
        let signed = signer.sign(&csr, &edge, 1_700_000_000, [1; 16]).unwrap();
        let der = CertificateDer::from_pem_slice(signed.pem.as_bytes()).unwrap();
        assert_eq!(certificate_identity(&der).as_deref(), Some("broker-2"));
        assert!(!certificate_has_dns_name(&der, BROKER_SERVER_NAME));
        // A broker's certificate carries it.
        let broker = std::fs::read(dir.path().join("certs").join("broker-1.pem")).unwrap();
        let broker = CertificateDer::from_pem_slice(&broker).unwrap();
        assert!(certificate_has_dns_name(&broker, BROKER_SERVER_NAME));
    }

    #[test]
    fn bad_csrs_are_refused_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        let config = config(dir.path());
        let signer = Signer::load(&config, &config.ca_cert).unwrap();
        let edge = NamespaceName::new("plant1").unwrap();
        let err = signer.sign("hello", &edge, 0, [1; 16]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "csr: not a PEM certificate signing request (-----BEGIN CERTIFICATE REQUEST-----)"
        );
        // A CSR whose signature was tampered with (its last byte).
        let key = KeyPair::generate().unwrap();
        let csr = CertificateParams::new(vec!["x".to_owned()])
            .unwrap()
            .serialize_request(&key)
            .unwrap();
        let mut der = csr.der().to_vec();
        let last = der.len() - 1;
        der[last] ^= 0x01;
        let pem = format!(
            "-----BEGIN CERTIFICATE REQUEST-----\n{}\n-----END CERTIFICATE REQUEST-----\n",
            base64::Engine::encode(&base64::engine::general_purpose::STANDARD, &der)
        );
        let err = signer.sign(&pem, &edge, 0, [1; 16]).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("csr: its signature does not verify with its own public key (altered"),
            "{err}"
        );
    }

    #[test]
    fn the_key_must_be_private_and_the_validity_in_range() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let mut config = config(dir.path());
        config.cert_validity_days = 0;
        let err = Signer::load(&config, &config.ca_cert).unwrap_err();
        assert_eq!(
            err.to_string(),
            "enroll.cert_validity_days: must be from 1 to 3650, got 0"
        );
        config.cert_validity_days = 1;
        let key = config.ca_key.clone().unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o640)).unwrap();
        assert!(Signer::load(&config, &config.ca_cert).is_ok());
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o604)).unwrap();
        let err = Signer::load(&config, &config.ca_cert)
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("enroll.ca_key: "), "{err}");
        assert!(err.contains("mode 0604"), "{err}");
        // Never the key in Debug output.
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        let signer = Signer::load(&config, &config.ca_cert).unwrap();
        assert!(!format!("{signer:?}").contains("PRIVATE"));
    }
}
