//! The agent's identity in its configuration: the `[tls]` files (resolved
//! for `run`, or where `edge-agent enroll` writes them) and the edge id,
//! given or taken from the certificate.

use std::path::{Path, PathBuf};

use broker_core::tls::TlsPaths;
use tributary_proto::keys::NamespaceName;

use super::{ConfigError, Overrides, TlsFileConfig};

/// Where `edge-agent enroll` writes: `[tls]` cert, key and ca of `file`
/// with `overrides` applied, none of which need to exist yet.
///
/// # Errors
/// [`ConfigError::Invalid`] naming the first of `tls.cert`, `tls.key`,
/// `tls.ca` that is set nowhere.
pub fn enroll_paths(
    file: Option<&TlsFileConfig>,
    overrides: &Overrides,
) -> Result<TlsPaths, ConfigError> {
    let pick = |flag: &Option<PathBuf>, from_file: Option<&PathBuf>, field: &str| {
        flag.clone().or_else(|| from_file.cloned()).ok_or_else(|| {
            ConfigError::invalid(
                field,
                "not set: enroll writes the certificate, key and CA where [tls] cert, key and ca (or --tls-cert, --tls-key, --tls-ca) say",
            )
        })
    };
    Ok(TlsPaths {
        cert: pick(&overrides.tls_cert, file.map(|t| &t.cert), "tls.cert")?,
        key: pick(&overrides.tls_key, file.map(|t| &t.key), "tls.key")?,
        ca: pick(&overrides.tls_ca, file.map(|t| &t.ca), "tls.ca")?,
    })
}

pub(super) fn resolve_tls(
    file: Option<TlsFileConfig>,
    overrides: &Overrides,
) -> Result<Option<TlsPaths>, ConfigError> {
    let (cert, key, ca) = match file {
        Some(t) => (Some(t.cert), Some(t.key), Some(t.ca)),
        None => (None, None, None),
    };
    let cert = overrides.tls_cert.clone().or(cert);
    let key = overrides.tls_key.clone().or(key);
    let ca = overrides.tls_ca.clone().or(ca);
    if cert.is_none() && key.is_none() && ca.is_none() {
        return Ok(None);
    }
    let require = |value: Option<PathBuf>, field: &str| {
        let path = value.ok_or_else(|| {
            ConfigError::invalid(field, "not set; tls needs cert, key and ca together")
        })?;
        if !path.is_file() {
            return Err(ConfigError::invalid(
                field,
                format!("{} is not a readable file", path.display()),
            ));
        }
        Ok(path)
    };
    Ok(Some(TlsPaths {
        cert: require(cert, "tls.cert")?,
        key: require(key, "tls.key")?,
        ca: require(ca, "tls.ca")?,
    }))
}

/// The identity of the certificate at `path`: its first DNS subject
/// alternative name, else its common name (what the broker checks).
///
/// # Errors
/// [`ConfigError::Invalid`] (field `tls.cert`) if the file holds no
/// parsable certificate or the certificate has no identity.
pub fn certificate_edge_id(path: &Path) -> Result<String, ConfigError> {
    let certs = broker_core::tls::load_certs(path)
        .map_err(|e| ConfigError::invalid("tls.cert", e.to_string()))?;
    certs
        .first()
        .and_then(broker_core::tls::certificate_identity)
        .ok_or_else(|| {
            ConfigError::invalid(
                "tls.cert",
                format!(
                    "{}: the certificate has neither a DNS name nor a common name",
                    path.display()
                ),
            )
        })
}

pub(super) fn resolve_edge_id(
    explicit: Option<String>,
    tls: Option<&TlsPaths>,
) -> Result<NamespaceName, ConfigError> {
    let from_cert = tls.map(|t| certificate_edge_id(&t.cert)).transpose()?;
    let id = match (explicit, from_cert) {
        (Some(explicit), Some(cert)) if explicit != cert => {
            let broker = cert
                .strip_prefix("broker-")
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
            let hint = if broker {
                " (tls.cert is a broker's certificate: give this edge its own, from `edge-agent enroll` or `tribctl certs --edge`)"
            } else {
                ""
            };
            return Err(ConfigError::invalid(
                "edge_id",
                format!(
                    "{explicit:?} differs from the identity {cert:?} of tls.cert; the broker only lets {cert:?} write{hint}"
                ),
            ));
        }
        (Some(id), _) | (None, Some(id)) => id,
        (None, None) => {
            return Err(ConfigError::invalid(
                "edge_id",
                "not set and no tls.cert to take it from (config file, --edge-id or TRIB_EDGE_ID)",
            ));
        }
    };
    let name =
        NamespaceName::new(&id).map_err(|e| ConfigError::invalid("edge_id", e.to_string()))?;
    match name.reserved_for_edges() {
        Some(why) => Err(ConfigError::invalid(
            "edge_id",
            format!("{id:?} cannot be an edge id: {why}"),
        )),
        None => Ok(name),
    }
}
