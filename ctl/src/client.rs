//! The admin API client of `tribctl` (`docs/admin-api.md`): the one HTTP
//! client, [`tributary_api::client::HttpClient`], with the bearer token on
//! every request and JSON answers, plus how tribctl words its failures
//! ([`describe_failure`]) and reads a refused manifest's per-entry issues
//! ([`manifest_issues`]).
//!
//! HTTPS verifying the broker against the cluster CA given once per
//! process with `--ca` ([`set_tls`]; optional client certificate with
//! `--client-cert`/`--client-key`), or plain `http://` to a broker that
//! serves it on loopback. An `https://` URL without `--ca` fails every call
//! with [`ClientError::HttpsWithoutCa`].

use std::sync::OnceLock;

use serde_json::Value;
use tributary_api::admin::ManifestIssue;
use tributary_api::client::{Body, ClientError, ClientTls, DEFAULT_TIMEOUT, HttpClient, Method};

/// The TLS settings of this process's admin clients (from `--ca`,
/// `--client-cert`, `--client-key`).
static TLS: OnceLock<Option<ClientTls>> = OnceLock::new();

/// Sets the TLS settings every [`AdminClient`] of this process uses; the
/// first call wins.
pub fn set_tls(tls: Option<ClientTls>) {
    let _ = TLS.set(tls);
}

/// A client of one admin API.
#[derive(Debug)]
pub struct AdminClient {
    http: Result<HttpClient, ClientError>,
}

impl AdminClient {
    /// A client of the API at `base_url` (e.g. `https://127.0.0.1:7400`)
    /// presenting `token`, with the TLS settings of [`set_tls`]; requests
    /// time out after [`DEFAULT_TIMEOUT`]. If the client cannot be built
    /// (`https://` without `--ca`, an unreadable CA), every call returns
    /// that error.
    pub fn new(base_url: &str, token: &str) -> AdminClient {
        let tls = TLS.get().and_then(Option::as_ref);
        AdminClient {
            http: HttpClient::for_url(base_url, Some(token), DEFAULT_TIMEOUT, tls),
        }
    }

    /// The HTTP client, or the error that kept it from being built (again).
    fn http(&self) -> Result<&HttpClient, ClientError> {
        self.http.as_ref().map_err(|e| match e {
            ClientError::HttpsWithoutCa { url } => ClientError::HttpsWithoutCa { url: url.clone() },
            ClientError::TlsFile { path, reason } => ClientError::TlsFile {
                path: path.clone(),
                reason: reason.clone(),
            },
            other => ClientError::BadResponse {
                url: String::new(),
                status: 0,
                detail: other.to_string(),
            },
        })
    }

    /// `GET path` with `query` pairs.
    ///
    /// # Errors
    /// [`ClientError`].
    pub fn get(&self, path: &str, query: &[(&str, &str)]) -> Result<Value, ClientError> {
        self.http()?.request(Method::Get, path, query, &[], None)
    }

    /// `DELETE path`.
    ///
    /// # Errors
    /// [`ClientError`].
    pub fn delete(&self, path: &str) -> Result<Value, ClientError> {
        self.http()?.request(Method::Delete, path, &[], &[], None)
    }

    /// `method path` with `query` pairs and a body of `content_type`.
    ///
    /// # Errors
    /// [`ClientError`].
    pub fn send(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, &str)],
        content_type: &str,
        body: &[u8],
    ) -> Result<Value, ClientError> {
        let body = Body {
            content_type,
            bytes: body,
        };
        self.http()?.request(method, path, query, &[], Some(body))
    }

    /// `method path` with a JSON body.
    ///
    /// # Errors
    /// [`ClientError`].
    pub fn send_json(
        &self,
        method: Method,
        path: &str,
        body: &Value,
    ) -> Result<Value, ClientError> {
        self.http()?.send_json(method, path, body)
    }
}

/// tribctl's one-line wording of a failed admin API call: `cannot reach
/// the admin API at {url}: …` without a response, the server's `error`
/// message for a refusal, `admin API at {url} answered …` for a body that
/// is not the documented JSON.
pub fn describe_failure(error: &ClientError) -> String {
    match error {
        ClientError::Transport { url, source, hint } => {
            let hint = hint.map(|h| format!(" ({h})")).unwrap_or_default();
            format!("cannot reach the admin API at {url}: {source}{hint}")
        }
        ClientError::Api { message, .. } => message.clone(),
        // Says what it is about itself: the URL, or the TLS file (`--ca
        // /nonexistent` read "admin API at /nonexistent: ...").
        other @ (ClientError::HttpsWithoutCa { .. } | ClientError::TlsFile { .. }) => {
            other.to_string()
        }
        other => format!("admin API at {other}"),
    }
}

/// The per-entry issues of a refused manifest: the `errors` field of the
/// error body (empty for other errors, or when `errors` is not a list of
/// issues).
pub fn manifest_issues(error: &ClientError) -> Vec<ManifestIssue> {
    match error {
        ClientError::Api { body, .. } => body
            .get("errors")
            .and_then(|errors| serde_json::from_value(errors.clone()).ok())
            .unwrap_or_default(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_read_as_before() {
        let bad = ClientError::BadResponse {
            url: "http://127.0.0.1:7400/v1/topics".to_owned(),
            status: 502,
            detail: "expected value".to_owned(),
        };
        assert_eq!(
            describe_failure(&bad),
            "admin API at http://127.0.0.1:7400/v1/topics answered 502 with an unexpected \
             body: expected value"
        );
        let refused = ClientError::Api {
            status: 409,
            kind: "conflict".to_owned(),
            message: "topic /default/x already exists".to_owned(),
            body: Value::Null,
        };
        assert_eq!(
            describe_failure(&refused),
            "topic /default/x already exists"
        );
        assert!(manifest_issues(&refused).is_empty());
    }
}
