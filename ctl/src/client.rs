//! A blocking client of the broker's admin HTTP API (`docs/admin-api.md`).
//!
//! Plain `http://` only (ureq without TLS): the admin API listens on
//! loopback or a management network. Every request carries the bearer
//! token; a response with status 400 or above becomes
//! [`ClientError::Api`] with the server's `error` message and, for
//! manifests, its per-entry issues.

use serde_json::Value;
use tributary_api::admin::ManifestIssue;

/// Why an admin API call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The request did not get a response (connection refused, timeout,
    /// bad URL).
    #[error("cannot reach the admin API at {url}: {source}")]
    Transport {
        /// The request URL.
        url: String,
        /// What ureq reported.
        source: Box<ureq::Error>,
    },
    /// The server refused the request; `message` is its `error` field.
    #[error("{message}")]
    Api {
        /// HTTP status.
        status: u16,
        /// The server's message.
        message: String,
        /// Manifest issues (`errors`), empty for other errors.
        issues: Vec<ManifestIssue>,
    },
    /// A response that is not the JSON the API documents.
    #[error("admin API at {url} answered {status} with an unexpected body: {detail}")]
    BadResponse {
        /// The request URL.
        url: String,
        /// HTTP status.
        status: u16,
        /// What is wrong with it.
        detail: String,
    },
}

/// Methods with a request body.
#[derive(Debug, Clone, Copy)]
pub enum BodyMethod {
    /// `POST`.
    Post,
    /// `PATCH`.
    Patch,
}

/// A client of one admin API.
#[derive(Debug)]
pub struct AdminClient {
    base_url: String,
    authorization: String,
    agent: ureq::Agent,
}

impl AdminClient {
    /// A client of the API at `base_url` (e.g. `http://127.0.0.1:7400`)
    /// presenting `token`.
    pub fn new(base_url: &str, token: &str) -> AdminClient {
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(std::time::Duration::from_secs(60)))
            .build()
            .into();
        AdminClient {
            base_url: base_url.trim_end_matches('/').to_owned(),
            authorization: format!("Bearer {token}"),
            agent,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base_url)
    }

    /// `GET path` with `query` pairs.
    ///
    /// # Errors
    /// [`ClientError`].
    pub fn get(&self, path: &str, query: &[(&str, &str)]) -> Result<Value, ClientError> {
        let url = self.url(path);
        let mut request = self
            .agent
            .get(&url)
            .header("Authorization", &self.authorization);
        for (key, value) in query {
            request = request.query(*key, *value);
        }
        let response = request.call();
        Self::finish(&url, response)
    }

    /// `DELETE path`.
    ///
    /// # Errors
    /// [`ClientError`].
    pub fn delete(&self, path: &str) -> Result<Value, ClientError> {
        let url = self.url(path);
        let response = self
            .agent
            .delete(&url)
            .header("Authorization", &self.authorization)
            .call();
        Self::finish(&url, response)
    }

    /// `method path` with `query` pairs and a body of `content_type`.
    ///
    /// # Errors
    /// [`ClientError`].
    pub fn send(
        &self,
        method: BodyMethod,
        path: &str,
        query: &[(&str, &str)],
        content_type: &str,
        body: String,
    ) -> Result<Value, ClientError> {
        let url = self.url(path);
        let mut request = match method {
            BodyMethod::Post => self.agent.post(&url),
            BodyMethod::Patch => self.agent.patch(&url),
        }
        .header("Authorization", &self.authorization)
        .content_type(content_type);
        for (key, value) in query {
            request = request.query(*key, *value);
        }
        let response = request.send(body);
        Self::finish(&url, response)
    }

    /// `method path` with a JSON body.
    ///
    /// # Errors
    /// [`ClientError`].
    pub fn send_json(
        &self,
        method: BodyMethod,
        path: &str,
        body: &Value,
    ) -> Result<Value, ClientError> {
        self.send(method, path, &[], "application/json", body.to_string())
    }

    fn finish(
        url: &str,
        response: Result<ureq::http::Response<ureq::Body>, ureq::Error>,
    ) -> Result<Value, ClientError> {
        let response = response.map_err(|source| ClientError::Transport {
            url: url.to_owned(),
            source: Box::new(source),
        })?;
        let status = response.status().as_u16();
        let bad = |detail: String| ClientError::BadResponse {
            url: url.to_owned(),
            status,
            detail,
        };
        let text = response
            .into_body()
            .read_to_string()
            .map_err(|e| bad(e.to_string()))?;
        let body: Value = serde_json::from_str(&text).map_err(|e| {
            let shown: String = text.chars().take(200).collect();
            bad(format!("{e}: {shown:?}"))
        })?;
        if status < 400 {
            return Ok(body);
        }
        let message = body
            .get("error")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| bad(format!("no error message in {body}")))?;
        let issues = match body.get("errors") {
            Some(errors) => {
                serde_json::from_value(errors.clone()).map_err(|e| bad(format!("errors: {e}")))?
            }
            None => Vec::new(),
        };
        Err(ClientError::Api {
            status,
            message,
            issues,
        })
    }
}
