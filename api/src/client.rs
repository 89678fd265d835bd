//! The one blocking HTTP client of Tributary's JSON APIs (ureq, plain
//! `http://`): the broker's admin and consumer APIs and the edge agent's
//! local API. `tribctl`, [`crate::consumer_client`] and `edge-agent publish`
//! all go through [`HttpClient`], so a refusal reads the same everywhere.
//!
//! # Errors
//! Every call ends in one of three ways besides success, each a
//! [`ClientError`] variant: no response ([`ClientError::Transport`]), a
//! status of 400 or above ([`ClientError::Api`] with the server's `error`
//! message, its `kind` when it sends one, and the whole JSON body), or a
//! response that is not the documented JSON ([`ClientError::BadResponse`]).

use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// How long one request may take end to end unless the caller says
/// otherwise: longer than the longest long-poll (30 s) and than an
/// `fsync_batch` publish on a slow disk.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// Largest response body read, bytes (a peek of 1,000 large records).
pub const MAX_RESPONSE_BYTES: u64 = 256 << 20;

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// No response: connection refused, timeout, bad URL.
    #[error("cannot reach {url}: {source}")]
    Transport {
        /// The request URL.
        url: String,
        /// What ureq reported.
        source: Box<ureq::Error>,
    },
    /// The server refused the request (status 400 or above).
    #[error("{message}")]
    Api {
        /// HTTP status.
        status: u16,
        /// The error's `kind` (`invalid_input`, `not_found`, `conflict`,
        /// …), empty when the server sends none.
        kind: String,
        /// The server's `error` message, or its body when that is not JSON.
        message: String,
        /// The whole JSON error body (`Value::Null` when it was not JSON),
        /// for fields particular to one endpoint (`errors` of a manifest,
        /// `field` of an invalid input).
        body: Value,
    },
    /// A response that is not the JSON the API documents.
    #[error("{url} answered {status} with an unexpected body: {detail}")]
    BadResponse {
        /// The request URL.
        url: String,
        /// HTTP status: 0 when the request body could not be encoded, 200
        /// for any success status whose JSON is not the expected shape.
        status: u16,
        /// What is wrong with it.
        detail: String,
    },
}

impl ClientError {
    /// The HTTP status of an [`ClientError::Api`] error.
    pub fn status(&self) -> Option<u16> {
        match self {
            ClientError::Api { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// The error `kind` of an [`ClientError::Api`] error, if the server
    /// named one.
    pub fn kind(&self) -> Option<&str> {
        match self {
            ClientError::Api { kind, .. } if !kind.is_empty() => Some(kind),
            _ => None,
        }
    }
}

/// HTTP methods the APIs use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// `GET`.
    Get,
    /// `DELETE`.
    Delete,
    /// `POST`.
    Post,
    /// `PATCH`.
    Patch,
}

/// A request body and its content type.
#[derive(Debug, Clone, Copy)]
pub struct Body<'a> {
    /// `Content-Type`.
    pub content_type: &'a str,
    /// The bytes.
    pub bytes: &'a [u8],
}

/// A client of one API base URL (e.g. `http://127.0.0.1:7400`), with an
/// optional bearer token sent on every request.
#[derive(Debug, Clone)]
pub struct HttpClient {
    base_url: String,
    authorization: Option<String>,
    agent: ureq::Agent,
}

impl HttpClient {
    /// A client of `base_url` presenting `token` (if any) as a bearer token;
    /// requests time out after `timeout`.
    pub fn new(base_url: &str, token: Option<&str>, timeout: Duration) -> HttpClient {
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(timeout))
            .build()
            .into();
        HttpClient {
            base_url: base_url.trim_end_matches('/').to_owned(),
            authorization: token.map(|token| format!("Bearer {token}")),
            agent,
        }
    }

    /// The base URL, without a trailing `/`.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// `method path` with `query` pairs, extra `headers` and an optional
    /// `body`; the JSON response of a status below 400.
    ///
    /// # Errors
    /// [`ClientError`].
    pub fn request(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, &str)],
        headers: &[(&str, &str)],
        body: Option<Body<'_>>,
    ) -> Result<Value, ClientError> {
        let url = format!("{}{path}", self.base_url);
        let response = match method {
            Method::Get => self.decorate(self.agent.get(&url), query, headers).call(),
            Method::Delete => self
                .decorate(self.agent.delete(&url), query, headers)
                .call(),
            Method::Post | Method::Patch => {
                let request = match method {
                    Method::Post => self.agent.post(&url),
                    _ => self.agent.patch(&url),
                };
                let request = self.decorate(request, query, headers);
                match body {
                    Some(body) => request.content_type(body.content_type).send(body.bytes),
                    None => request.send_empty(),
                }
            }
        };
        finish(&url, response)
    }

    /// `request` with the bearer token, `headers` and `query` pairs.
    fn decorate<B>(
        &self,
        mut request: ureq::RequestBuilder<B>,
        query: &[(&str, &str)],
        headers: &[(&str, &str)],
    ) -> ureq::RequestBuilder<B> {
        if let Some(authorization) = &self.authorization {
            request = request.header("Authorization", authorization);
        }
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        for (key, value) in query {
            request = request.query(*key, *value);
        }
        request
    }

    /// `GET path` with `query` pairs, decoded as `R`.
    ///
    /// # Errors
    /// [`ClientError`].
    pub fn get<R: DeserializeOwned>(
        &self,
        path: &str,
        query: &[(&str, &str)],
    ) -> Result<R, ClientError> {
        let url = format!("{}{path}", self.base_url);
        decode(&url, self.request(Method::Get, path, query, &[], None)?)
    }

    /// `DELETE path`, decoded as `R`.
    ///
    /// # Errors
    /// [`ClientError`].
    pub fn delete<R: DeserializeOwned>(&self, path: &str) -> Result<R, ClientError> {
        let url = format!("{}{path}", self.base_url);
        decode(&url, self.request(Method::Delete, path, &[], &[], None)?)
    }

    /// `method path` with `body` encoded as JSON, decoded as `R`.
    ///
    /// # Errors
    /// [`ClientError`]; [`ClientError::BadResponse`] with status 0 if `body`
    /// does not encode.
    pub fn send_json<B: Serialize + ?Sized, R: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: &B,
    ) -> Result<R, ClientError> {
        let url = format!("{}{path}", self.base_url);
        let bytes = serde_json::to_vec(body).map_err(|e| ClientError::BadResponse {
            url: url.clone(),
            status: 0,
            detail: format!("request body: {e}"),
        })?;
        let body = Body {
            content_type: "application/json",
            bytes: &bytes,
        };
        decode(&url, self.request(method, path, &[], &[], Some(body))?)
    }

    /// `POST path` with a JSON body, decoded as `R`.
    ///
    /// # Errors
    /// As [`HttpClient::send_json`].
    pub fn post<B: Serialize + ?Sized, R: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<R, ClientError> {
        self.send_json(Method::Post, path, body)
    }
}

fn decode<R: DeserializeOwned>(url: &str, value: Value) -> Result<R, ClientError> {
    serde_json::from_value(value).map_err(|e| ClientError::BadResponse {
        url: url.to_owned(),
        status: 200,
        detail: e.to_string(),
    })
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
        .with_config()
        .limit(MAX_RESPONSE_BYTES)
        .read_to_string()
        .map_err(|e| bad(e.to_string()))?;
    if status >= 400 {
        let Ok(body) = serde_json::from_str::<Value>(&text) else {
            return Err(ClientError::Api {
                status,
                kind: String::new(),
                message: text.trim().to_owned(),
                body: Value::Null,
            });
        };
        let field = |name: &str| body.get(name).and_then(Value::as_str).map(str::to_owned);
        let message = field("error").ok_or_else(|| bad(format!("no error message in {body}")))?;
        return Err(ClientError::Api {
            status,
            kind: field("kind").unwrap_or_default(),
            message,
            body,
        });
    }
    serde_json::from_str(&text).map_err(|e| {
        let shown: String = text.chars().take(200).collect();
        bad(format!("{e}: {shown:?}"))
    })
}
