//! The pure model of enrollment and revocation (no I/O; time is an
//! argument): enrollment tokens and their stored record, the decision on a
//! presented token, and which certificates a revocation covers.
//!
//! # Tokens
//! `trib-enroll.<edge_id>.<64 lowercase hex>` from 32 bytes of the system
//! CSPRNG. The broker stores only its SHA-256 at
//! `/auth/enrollments/{edge_id}` ([`StoredEnrollment`]): one token per edge
//! (minting again replaces it), usable once, until `expires_at_ms`.
//!
//! # Revocation
//! `/auth/revoked_edges/{edge_id}` holds the revocation time `R` (ms). A
//! certificate of that edge is refused when its validity starts
//! (`notBefore`, whole seconds) at or before `R` ([`revokes`]): every
//! certificate issued up to the revocation, development certificates
//! (valid from 1975) included. A certificate signed later starts after `R`
//! ([`not_before_s`]), so a re-enrolled device (a new token minted after
//! the revocation) is accepted while the old one stays refused.

use serde::{Deserialize, Serialize};
use subtle::ConstantTimeEq;
use tributary_api::enroll::ENROLL_TOKEN_PREFIX;

use crate::auth::model::{hex, sha256_hex};

/// How far a new certificate's validity is backdated, seconds, so a broker
/// whose clock is behind the signing broker's does not refuse it as not yet
/// valid (never to at or before the edge's revocation, see
/// [`not_before_s`]).
pub const BACKDATE_S: u64 = 300;

/// The stored value of `/auth/enrollments/{edge_id}`: never the token,
/// only its SHA-256 (hex).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredEnrollment {
    /// The edge the token enrolls (equals the key's last part).
    pub edge_id: String,
    /// SHA-256 of the whole token string, lowercase hex.
    pub token_sha256: String,
    /// When it was minted, ms since the Unix epoch.
    pub created_at_ms: u64,
    /// Who minted it.
    pub created_by: String,
    /// When it stops being usable, ms since the Unix epoch.
    pub expires_at_ms: u64,
    /// When it was used, ms since the Unix epoch (`None`: not yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used_at_ms: Option<u64>,
    /// Serial number (hex) of the certificate it was used for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
}

impl StoredEnrollment {
    /// This record once its token enrolled the certificate `serial` at
    /// `now_ms`.
    pub fn consumed(&self, now_ms: u64, serial: &str) -> StoredEnrollment {
        StoredEnrollment {
            used_at_ms: Some(now_ms),
            serial: Some(serial.to_owned()),
            ..self.clone()
        }
    }
}

/// A new enrollment token for `edge`: `trib-enroll.<edge>.<64 hex>`.
///
/// # Errors
/// The CSPRNG failed (`ring::error::Unspecified`).
pub fn new_token(edge: &str) -> Result<String, ring::error::Unspecified> {
    use ring::rand::SecureRandom;
    let mut secret = [0u8; 32];
    ring::rand::SystemRandom::new().fill(&mut secret)?;
    Ok(format!("{ENROLL_TOKEN_PREFIX}{edge}.{}", hex(&secret)))
}

/// The edge id of a well-formed enrollment token, `None` for any other
/// string (an admin token, a truncated token).
pub fn token_edge(token: &str) -> Option<&str> {
    let rest = token.strip_prefix(ENROLL_TOKEN_PREFIX)?;
    let (edge, secret) = rest.rsplit_once('.')?;
    let well_formed = secret.len() == 64
        && secret
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    (well_formed && !edge.is_empty()).then_some(edge)
}

/// Why a presented enrollment token is refused (each a 401 with its
/// [`TokenRefusal::kind`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenRefusal {
    /// Not an enrollment token, none was minted for its edge, or it is not
    /// the one minted last (minting replaces; revoking deletes).
    #[error(
        "unknown enrollment token: mint one with `tribctl edges token EDGE_ID` (a newer token \
         or a revocation of the edge replaces it)"
    )]
    Unknown,
    /// Used already.
    #[error(
        "the enrollment token of edge {edge} was already used (at {used_at_ms} ms since the \
         epoch): a token enrolls once; mint a new one with `tribctl edges token {edge}`"
    )]
    Used {
        /// The edge.
        edge: String,
        /// When it was used.
        used_at_ms: u64,
    },
    /// Its time to live is over.
    #[error(
        "the enrollment token of edge {edge} expired at {expires_at_ms} ms since the epoch: \
         mint a new one with `tribctl edges token {edge}`"
    )]
    Expired {
        /// The edge.
        edge: String,
        /// When it expired.
        expires_at_ms: u64,
    },
}

impl TokenRefusal {
    /// The error `kind` of the response
    /// ([`tributary_api::enroll::refusal`]).
    pub fn kind(&self) -> &'static str {
        use tributary_api::enroll::refusal;
        match self {
            TokenRefusal::Unknown => refusal::TOKEN_UNKNOWN,
            TokenRefusal::Used { .. } => refusal::TOKEN_USED,
            TokenRefusal::Expired { .. } => refusal::TOKEN_EXPIRED,
        }
    }
}

/// Whether `presented` may enroll now: it must hash to the stored token
/// (compared in constant time), be unused, and `now_ms` must be before its
/// expiry. A used token is reported as used even once expired.
///
/// # Errors
/// The [`TokenRefusal`].
pub fn check_token(
    stored: Option<&StoredEnrollment>,
    presented: &str,
    now_ms: u64,
) -> Result<(), TokenRefusal> {
    let Some(stored) = stored else {
        return Err(TokenRefusal::Unknown);
    };
    let hash = sha256_hex(presented.as_bytes());
    if !bool::from(hash.as_bytes().ct_eq(stored.token_sha256.as_bytes())) {
        return Err(TokenRefusal::Unknown);
    }
    if let Some(used_at_ms) = stored.used_at_ms {
        return Err(TokenRefusal::Used {
            edge: stored.edge_id.clone(),
            used_at_ms,
        });
    }
    if now_ms >= stored.expires_at_ms {
        return Err(TokenRefusal::Expired {
            edge: stored.edge_id.clone(),
            expires_at_ms: stored.expires_at_ms,
        });
    }
    Ok(())
}

/// Whether a revocation at `revoked_at_ms` covers a certificate valid from
/// `not_before_s` (seconds since the epoch): it does when the certificate's
/// validity starts at or before the revocation's second, or when its start
/// is unknown (fail closed).
pub fn revokes(revoked_at_ms: u64, not_before_s: Option<i64>) -> bool {
    match not_before_s {
        None => true,
        Some(start) => start <= i64::try_from(revoked_at_ms / 1000).unwrap_or(i64::MAX),
    }
}

/// The validity start of a certificate signed at `now_ms` for an edge
/// revoked at `revoked_at_ms` (if ever), seconds since the epoch:
/// [`BACKDATE_S`] before now, but always after the revocation's second, so
/// [`revokes`] never covers it.
pub fn not_before_s(now_ms: u64, revoked_at_ms: Option<u64>) -> u64 {
    let backdated = (now_ms / 1000).saturating_sub(BACKDATE_S);
    match revoked_at_ms {
        Some(revoked) => backdated.max(revoked / 1000 + 1),
        None => backdated,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(token: &str, expires_at_ms: u64) -> StoredEnrollment {
        StoredEnrollment {
            edge_id: "plant1".into(),
            token_sha256: sha256_hex(token.as_bytes()),
            created_at_ms: 1_000,
            created_by: "ops".into(),
            expires_at_ms,
            used_at_ms: None,
            serial: None,
        }
    }

    #[test]
    fn tokens_name_their_edge_and_are_not_admin_tokens() {
        let token = new_token("plant1").unwrap();
        assert_eq!(token.len(), "trib-enroll.plant1.".len() + 64);
        assert_eq!(token_edge(&token), Some("plant1"));
        assert_eq!(crate::auth::model::token_principal(&token), None);
        assert_eq!(token_edge(&format!("trib.plant1.{}", "0".repeat(64))), None);
        assert_eq!(token_edge("trib-enroll.plant1.abc"), None);
        assert_eq!(
            token_edge(&format!("trib-enroll..{}", "0".repeat(64))),
            None
        );
        assert_eq!(
            token_edge(&format!("trib-enroll.p.{}", "A".repeat(64))),
            None
        );
        assert_ne!(new_token("plant1").unwrap(), token);
    }

    #[test]
    fn a_token_enrolls_once_before_it_expires_and_only_if_it_is_the_stored_one() {
        let token = new_token("plant1").unwrap();
        let record = stored(&token, 10_000);
        assert_eq!(check_token(Some(&record), &token, 9_999), Ok(()));
        assert_eq!(
            check_token(Some(&record), &token, 10_000),
            Err(TokenRefusal::Expired {
                edge: "plant1".into(),
                expires_at_ms: 10_000
            })
        );
        let other = new_token("plant1").unwrap();
        assert_eq!(
            check_token(Some(&record), &other, 5_000),
            Err(TokenRefusal::Unknown)
        );
        assert_eq!(check_token(None, &token, 5_000), Err(TokenRefusal::Unknown));
        let used = record.consumed(5_000, "0a");
        assert_eq!(used.used_at_ms, Some(5_000));
        assert_eq!(used.serial.as_deref(), Some("0a"));
        // Used wins over expired: the operator learns what happened.
        for now in [5_001, 20_000] {
            let refusal = check_token(Some(&used), &token, now).unwrap_err();
            assert_eq!(refusal.kind(), "token_used");
            assert!(refusal.to_string().contains("already used (at 5000 ms"));
        }
        assert_eq!(TokenRefusal::Unknown.kind(), "token_unknown");
        let json = serde_json::to_value(&record).unwrap();
        assert!(!json.to_string().contains(&token[20..]), "{json}");
        assert!(json.get("used_at_ms").is_none(), "{json}");
    }

    #[test]
    fn a_revocation_covers_certificates_issued_up_to_it_and_new_ones_start_after_it() {
        // Revoked at 1000.5 s.
        let revoked = 1_000_500;
        assert!(revokes(revoked, Some(0)));
        assert!(revokes(revoked, Some(1_000)));
        assert!(!revokes(revoked, Some(1_001)));
        assert!(revokes(revoked, None), "unknown start: refused");
        // Signed just after the revocation: starts in the next second,
        // not backdated to before it.
        assert_eq!(not_before_s(1_000_900, Some(revoked)), 1_001);
        assert!(!revokes(revoked, Some(1_001)));
        // Long after: backdated by BACKDATE_S.
        assert_eq!(not_before_s(5_000_000, Some(revoked)), 5_000 - BACKDATE_S);
        assert_eq!(not_before_s(5_000_000, None), 5_000 - BACKDATE_S);
        assert_eq!(not_before_s(100_000, None), 0);
    }
}
