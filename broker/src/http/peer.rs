//! The client certificate a request arrived with: the HTTPS listener
//! verifies an optional client certificate against the cluster CA and, when
//! one was presented, inserts its identity into every request of that
//! connection as the [`PeerCertificate`] extension. The auth layer maps that
//! identity to a certificate principal (`/auth/principals/{name}`).

/// The identity of a verified client certificate (its first DNS SAN, else
/// its common name: [`broker_core::tls::certificate_identity`]), present on
/// a request only when the client presented a certificate chaining to the
/// cluster CA. Absent on plain-HTTP (loopback) listeners and for clients
/// without a certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerCertificate {
    /// The certificate's identity, e.g. `tier-1`.
    pub identity: String,
    /// Its `notBefore`, seconds since the Unix epoch (`None`: unreadable):
    /// a revocation of the edge of that name refuses certificates that
    /// started before it ([`crate::auth::model::Snapshot::edge_revoked`]).
    pub not_before_s: Option<i64>,
}
