//! [`SwappableClientCert`]: the client certificate a QUIC or TLS client
//! presents, replaceable while the process runs. rustls asks the resolver
//! at every handshake, so after [`SwappableClientCert::replace`] every new
//! connection presents the new certificate while open connections keep the
//! one they were made with (a TLS session's certificate cannot change).
//! The edge agent's certificate rotation (SIGHUP or changed files) swaps
//! it; the trusted CA is not part of it and does not change.

use std::sync::{Arc, RwLock};

use rustls::SignatureScheme;
use rustls::client::ResolvesClientCert;
use rustls::sign::CertifiedKey;

/// A client certificate and key that can be replaced at any time; cheap to
/// read (one `Arc` clone per handshake).
#[derive(Debug)]
pub struct SwappableClientCert {
    current: RwLock<Arc<CertifiedKey>>,
}

impl SwappableClientCert {
    /// Presents `initial` until replaced.
    pub fn new(initial: Arc<CertifiedKey>) -> SwappableClientCert {
        SwappableClientCert {
            current: RwLock::new(initial),
        }
    }

    /// The certificate presented from now on.
    pub fn current(&self) -> Arc<CertifiedKey> {
        match self.current.read() {
            Ok(guard) => guard.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Presents `next` at every handshake from now on.
    pub fn replace(&self, next: Arc<CertifiedKey>) {
        match self.current.write() {
            Ok(mut guard) => *guard = next,
            Err(poisoned) => *poisoned.into_inner() = next,
        }
    }
}

impl ResolvesClientCert for SwappableClientCert {
    /// The current certificate, whatever the server hints (as rustls's own
    /// single-certificate resolver does).
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

#[cfg(all(test, feature = "dev-certs"))]
mod tests {
    use super::*;
    use crate::tls::TlsIdentity;

    #[test]
    fn handshakes_after_a_replace_present_the_new_certificate() {
        let dir = tempfile::tempdir().unwrap();
        let certs = dir.path().join("certs");
        crate::dev_certs::issue(&certs, &[], &["e1".into(), "e2".into()]).unwrap();
        let e1 = TlsIdentity::load(&crate::dev_certs::edge_paths(&certs, "e1")).unwrap();
        let e2 = TlsIdentity::load(&crate::dev_certs::edge_paths(&certs, "e2")).unwrap();
        let slot = SwappableClientCert::new(e1.certified_key().unwrap());
        let leaf = |slot: &SwappableClientCert| {
            let key = slot.resolve(&[], &[]).unwrap();
            crate::tls::certificate_identity(&key.cert[0])
        };
        assert_eq!(leaf(&slot).as_deref(), Some("e1"));
        slot.replace(e2.certified_key().unwrap());
        assert_eq!(leaf(&slot).as_deref(), Some("e2"));
        assert!(slot.has_certs());
    }
}
