//! The local API's protection: `local_api_token_file` (a bearer token every
//! route but `/health` requires) and `[local_api_tls]` (HTTPS with this
//! certificate). Both optional on a loopback `local_api`; a `local_api` on
//! any other address (a LAN, `0.0.0.0`) is refused without a token, so the
//! agent never takes records from the network unauthenticated.
//!
//! ```toml
//! local_api = "0.0.0.0:7500"
//! local_api_token_file = "/etc/tributary/edge-api-token"  # chmod 600
//! [local_api_tls]
//! cert = "/etc/tributary/edge-api.pem"
//! key = "/etc/tributary/edge-api.key"                     # chmod 600
//! ```
//!
//! Without `local_api_token_file`, the token is read from
//! `$CREDENTIALS_DIRECTORY/edge-api-token` when that file exists (systemd
//! `LoadCredential=edge-api-token:/etc/tributary/edge-api-token`). Token
//! and key files every user may read are refused, as the broker's are
//! (`broker_core::secrets`).

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Deserialize;

use super::ConfigError;

/// The systemd credential name of the local API token.
pub const TOKEN_CREDENTIAL: &str = "edge-api-token";
/// Shortest token accepted, characters.
pub const MIN_TOKEN_CHARS: usize = 16;

/// `[local_api_tls]` as written.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LocalApiTls {
    /// The listener's certificate chain (PEM), leaf first.
    pub cert: PathBuf,
    /// Its private key (PEM, not readable by every user).
    pub key: PathBuf,
}

/// A bearer token; never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiToken(String);

impl std::fmt::Debug for ApiToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiToken(<redacted>)")
    }
}

impl ApiToken {
    /// Whether `presented` is this token. Compares SHA-256 digests, so the
    /// time taken says nothing about how much of the token was right.
    pub fn matches(&self, presented: &str) -> bool {
        let digest = |s: &str| ring::digest::digest(&ring::digest::SHA256, s.as_bytes());
        digest(&self.0).as_ref() == digest(presented).as_ref()
    }
}

/// The local API's protection, validated.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LocalApiSecurity {
    /// The bearer token every route but `/health` requires; `None`: no
    /// token (only on a loopback `local_api`).
    pub token: Option<ApiToken>,
    /// HTTPS with this certificate and key; `None`: plain HTTP.
    pub tls: Option<LocalApiTls>,
}

/// Reads the token (`token_file`, else the systemd credential) and checks
/// the combination with `local_api`.
///
/// # Errors
/// [`ConfigError::Invalid`] naming `local_api_token_file` (unreadable,
/// world-readable, empty or shorter than [`MIN_TOKEN_CHARS`]),
/// `local_api_tls.cert` / `local_api_tls.key` (not a file), or `local_api`
/// (not loopback and no token).
pub fn resolve(
    local_api: SocketAddr,
    token_file: Option<PathBuf>,
    tls: Option<LocalApiTls>,
) -> Result<LocalApiSecurity, ConfigError> {
    let (field, path) = match token_file {
        Some(path) => ("local_api_token_file", Some(path)),
        None => (
            "$CREDENTIALS_DIRECTORY/edge-api-token",
            broker_core::secrets::credential_path(TOKEN_CREDENTIAL),
        ),
    };
    let token = match path {
        Some(path) => {
            let token = broker_core::secrets::read_token_file(&path, "local API token")
                .map_err(|e| ConfigError::invalid(field, e.to_string()))?;
            if token.chars().count() < MIN_TOKEN_CHARS {
                return Err(ConfigError::invalid(
                    field,
                    format!(
                        "{}: the token has fewer than {MIN_TOKEN_CHARS} characters (e.g. `openssl rand -hex 24 > FILE`)",
                        path.display()
                    ),
                ));
            }
            Some(ApiToken(token))
        }
        None => None,
    };
    if let Some(tls) = &tls {
        for (setting, path) in [
            ("local_api_tls.cert", &tls.cert),
            ("local_api_tls.key", &tls.key),
        ] {
            if !path.is_file() {
                return Err(ConfigError::invalid(
                    setting,
                    format!("{} is not a readable file", path.display()),
                ));
            }
        }
    }
    if token.is_none() && !local_api.ip().is_loopback() {
        return Err(ConfigError::invalid(
            "local_api",
            format!(
                "{local_api} is reachable from other hosts, so it needs a bearer token: set \
                 local_api_token_file (a file holding the token, chmod 600) or the systemd credential \
                 {TOKEN_CREDENTIAL}, or bind 127.0.0.1"
            ),
        ));
    }
    Ok(LocalApiSecurity { token, tls })
}
