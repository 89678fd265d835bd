//! The admin API client of `tribctl` (`docs/admin-api.md`): the one HTTP
//! client, [`tributary_api::client::HttpClient`], with the bearer token on
//! every request and JSON answers, plus how tribctl words its failures
//! ([`describe_failure`]) and reads a refused manifest's per-entry issues
//! ([`manifest_issues`]).
//!
//! Plain `http://` only (ureq without TLS): the admin API listens on
//! loopback or a management network.

use serde_json::Value;
use tributary_api::admin::ManifestIssue;
use tributary_api::client::{Body, ClientError, DEFAULT_TIMEOUT, HttpClient, Method};

/// A client of one admin API.
#[derive(Debug)]
pub struct AdminClient {
    http: HttpClient,
}

impl AdminClient {
    /// A client of the API at `base_url` (e.g. `http://127.0.0.1:7400`)
    /// presenting `token`; requests time out after [`DEFAULT_TIMEOUT`].
    pub fn new(base_url: &str, token: &str) -> AdminClient {
        AdminClient {
            http: HttpClient::new(base_url, Some(token), DEFAULT_TIMEOUT),
        }
    }

    /// `GET path` with `query` pairs.
    ///
    /// # Errors
    /// [`ClientError`].
    pub fn get(&self, path: &str, query: &[(&str, &str)]) -> Result<Value, ClientError> {
        self.http.request(Method::Get, path, query, &[], None)
    }

    /// `DELETE path`.
    ///
    /// # Errors
    /// [`ClientError`].
    pub fn delete(&self, path: &str) -> Result<Value, ClientError> {
        self.http.request(Method::Delete, path, &[], &[], None)
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
        self.http.request(method, path, query, &[], Some(body))
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
        self.http.send_json(method, path, body)
    }
}

/// tribctl's one-line wording of a failed admin API call: `cannot reach
/// the admin API at {url}: …` without a response, the server's `error`
/// message for a refusal, `admin API at {url} answered …` for a body that
/// is not the documented JSON.
pub fn describe_failure(error: &ClientError) -> String {
    match error {
        ClientError::Transport { url, source } => {
            format!("cannot reach the admin API at {url}: {source}")
        }
        ClientError::Api { message, .. } => message.clone(),
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
