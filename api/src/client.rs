//! The one blocking HTTP client of Tributary's JSON APIs (ureq): the
//! broker's admin and consumer APIs (HTTPS: [`HttpClient::with_tls`],
//! feature `tls`, trusting only the cluster CA) and the edge agent's local
//! API (plain `http://` on loopback). `tribctl`, [`crate::consumer_client`] and `edge-agent publish`
//! all go through [`HttpClient`], so a refusal reads the same everywhere.
//!
//! # Errors
//! Every call ends in one of three ways besides success, each a
//! [`ClientError`] variant: no response ([`ClientError::Transport`]), a
//! status of 400 or above ([`ClientError::Api`] with the server's `error`
//! message, its `kind` when it sends one, and the whole JSON body), or a
//! response that is not the documented JSON ([`ClientError::BadResponse`]).
//!
//! # Redirects
//! A broker answers a request about a topic another broker owns with `307`
//! and the owner's URL; [`HttpClient::request`] follows it itself (same
//! method, body and bearer token; at most [`MAX_REDIRECTS`] hops; https
//! only to https; [`ClientError::Redirect`] otherwise).

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

/// Most `307`/`308` redirects one call follows (a broker that does not own
/// a topic redirects to its owner: one hop; more means ownership is
/// moving under the call).
pub const MAX_REDIRECTS: usize = 5;

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// An `https://` URL without a CA to verify the server against (the
    /// cluster CA is private: no system roots are trusted).
    #[error(
        "{url} is HTTPS: name the cluster CA that signed the broker's certificate (tribctl: --ca FILE or TRIB_CA)"
    )]
    HttpsWithoutCa {
        /// The base URL.
        url: String,
    },
    /// A TLS file (CA, client certificate or key) is unreadable, not PEM,
    /// or (a key) readable by every user.
    #[error("{path}: {reason}")]
    TlsFile {
        /// The file.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// No response: connection refused, timeout, bad URL, a TLS failure.
    #[error("cannot reach {url}: {source}{}", hint.map(|h| format!(" ({h})")).unwrap_or_default())]
    Transport {
        /// The request URL.
        url: String,
        /// What ureq reported.
        source: Box<ureq::Error>,
        /// The likely cause where the error names a symptom
        /// ([`transport_hint`]): the wrong scheme for the server, a CA
        /// that did not sign its certificate.
        hint: Option<&'static str>,
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
    /// A `307`/`308` redirect not followed: no usable `Location`, more
    /// than [`MAX_REDIRECTS`] hops, or from `https://` to another scheme.
    #[error("redirect from {url} not followed: {reason}")]
    Redirect {
        /// The URL that answered with the redirect.
        url: String,
        /// Why it was not followed.
        reason: String,
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

/// A client of one API base URL (e.g. `https://127.0.0.1:7400`), with an
/// optional bearer token sent on every request.
#[derive(Clone)]
pub struct HttpClient {
    base_url: String,
    authorization: Option<String>,
    agent: ureq::Agent,
}

impl std::fmt::Debug for HttpClient {
    /// The base URL, and whether a token is set (never its value).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpClient")
            .field("base_url", &self.base_url)
            .field("token", &self.authorization.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// How an [`HttpClient`] talks HTTPS (feature `tls`): the PEM file of the
/// CA the server's certificate must chain to (the only root trusted), and
/// optionally a client certificate chain and its key.
#[cfg(feature = "tls")]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientTls {
    /// CA certificate(s), PEM.
    pub ca: std::path::PathBuf,
    /// Client certificate chain (PEM, leaf first) and its private key
    /// (PEM, must not be world-readable).
    pub client_cert: Option<(std::path::PathBuf, std::path::PathBuf)>,
}

#[cfg(feature = "tls")]
fn tls_config(tls: &ClientTls) -> Result<ureq::tls::TlsConfig, ClientError> {
    use ureq::tls::{Certificate, ClientCert, PemItem, PrivateKey, RootCerts, TlsConfig};
    let file_err = |path: &std::path::Path, reason: String| ClientError::TlsFile {
        path: path.display().to_string(),
        reason,
    };
    let read =
        |path: &std::path::Path| std::fs::read(path).map_err(|e| file_err(path, e.to_string()));
    let certs = |path: &std::path::Path| -> Result<Vec<Certificate<'static>>, ClientError> {
        let bytes = read(path)?;
        let mut certs = Vec::new();
        for item in ureq::tls::parse_pem(&bytes) {
            if let PemItem::Certificate(cert) = item.map_err(|e| file_err(path, e.to_string()))? {
                certs.push(cert);
            }
        }
        if certs.is_empty() {
            return Err(file_err(path, "no certificate found".into()));
        }
        Ok(certs)
    };
    let client_cert = match &tls.client_cert {
        Some((cert, key)) => {
            #[cfg(unix)]
            {
                use std::os::unix::fs::PermissionsExt;
                if let Ok(meta) = std::fs::metadata(key) {
                    let mode = meta.permissions().mode() & 0o7777;
                    if mode & 0o004 != 0 {
                        return Err(file_err(
                            key,
                            format!(
                                "TLS private key is readable by every user (mode {mode:04o}); \
                                 run `chmod 600 {}`",
                                key.display()
                            ),
                        ));
                    }
                }
            }
            let key_pem = read(key)?;
            let private =
                PrivateKey::from_pem(&key_pem).map_err(|e| file_err(key, e.to_string()))?;
            Some(ClientCert::new_with_certs(&certs(cert)?, private))
        }
        None => None,
    };
    Ok(TlsConfig::builder()
        .root_certs(RootCerts::new_with_certs(&certs(&tls.ca)?))
        .client_cert(client_cert)
        .unversioned_rustls_crypto_provider(std::sync::Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .build())
}

/// Limits each phase of a ureq request to `$timeout` on an agent's config
/// builder: connect, send the request and its body, wait for the response
/// head, read the body. Name resolution has no limit of its own: with any
/// limit over it (ureq's global or per-call timeout included) ureq 3
/// resolves on a new thread per request, which costs more than the rest of
/// a small request to a local API (one `clone3` per request). A request can
/// thus take up to about five times `$timeout` when every phase is slow. A
/// macro because ureq's builder type cannot be named outside ureq.
#[macro_export]
macro_rules! phase_timeouts {
    ($config:expr, $timeout:expr $(,)?) => {{
        let timeout: Option<::std::time::Duration> = Some($timeout);
        $config
            .timeout_connect(timeout)
            .timeout_send_request(timeout)
            .timeout_send_body(timeout)
            .timeout_recv_response(timeout)
            .timeout_recv_body(timeout)
    }};
}

impl HttpClient {
    /// A client of `base_url` presenting `token` (if any) as a bearer token;
    /// each phase of a request is limited to `timeout` ([`crate::phase_timeouts!`]). With feature `tls`, an
    /// `https://` URL trusts no CA (every handshake fails): use
    /// [`HttpClient::with_tls`].
    pub fn new(base_url: &str, token: Option<&str>, timeout: Duration) -> HttpClient {
        #[allow(unused_mut)]
        let mut config = crate::phase_timeouts!(
            ureq::Agent::config_builder()
                .http_status_as_error(false)
                .max_redirects(0),
            timeout,
        );
        #[cfg(feature = "tls")]
        {
            // Not ureq's default (the web PKI roots, compiled out): no root.
            config = config.tls_config(
                ureq::tls::TlsConfig::builder()
                    .root_certs(ureq::tls::RootCerts::new_with_certs(&[]))
                    .unversioned_rustls_crypto_provider(std::sync::Arc::new(
                        rustls::crypto::ring::default_provider(),
                    ))
                    .build(),
            );
        }
        HttpClient {
            base_url: base_url.trim_end_matches('/').to_owned(),
            authorization: token.map(|token| format!("Bearer {token}")),
            agent: config.build().into(),
        }
    }

    /// [`HttpClient::with_tls`] when `tls` is given, else
    /// [`HttpClient::new`] for an `http://` URL (feature `tls`).
    ///
    /// # Errors
    /// [`ClientError::HttpsWithoutCa`] for an `https://` URL without
    /// `tls`; those of [`HttpClient::with_tls`].
    #[cfg(feature = "tls")]
    pub fn for_url(
        base_url: &str,
        token: Option<&str>,
        timeout: Duration,
        tls: Option<&ClientTls>,
    ) -> Result<HttpClient, ClientError> {
        match tls {
            Some(tls) => HttpClient::with_tls(base_url, token, timeout, tls),
            None if base_url
                .get(..8)
                .is_some_and(|s| s.eq_ignore_ascii_case("https://")) =>
            {
                Err(ClientError::HttpsWithoutCa {
                    url: base_url.to_owned(),
                })
            }
            None => Ok(HttpClient::new(base_url, token, timeout)),
        }
    }

    /// Like [`HttpClient::new`], over HTTPS verifying the server against
    /// `tls.ca` only, presenting `tls.client_cert` when set (feature
    /// `tls`).
    ///
    /// # Errors
    /// [`ClientError::TlsFile`] for an unreadable or malformed file, or a
    /// world-readable key.
    #[cfg(feature = "tls")]
    pub fn with_tls(
        base_url: &str,
        token: Option<&str>,
        timeout: Duration,
        tls: &ClientTls,
    ) -> Result<HttpClient, ClientError> {
        let agent = crate::phase_timeouts!(
            ureq::Agent::config_builder()
                .http_status_as_error(false)
                .max_redirects(0),
            timeout,
        )
        .tls_config(tls_config(tls)?)
        .build()
        .into();
        Ok(HttpClient {
            base_url: base_url.trim_end_matches('/').to_owned(),
            authorization: token.map(|token| format!("Bearer {token}")),
            agent,
        })
    }

    /// The base URL, without a trailing `/`.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// `method path` with `query` pairs, extra `headers` and an optional
    /// `body`; the JSON response of a status below 400.
    ///
    /// A `307 Temporary Redirect` or `308 Permanent Redirect` (a broker
    /// that does not own the topic names its owner) is followed here, not
    /// by ureq: the same method, body, headers and bearer token go to the
    /// `Location` (ureq would drop `Authorization` on a cross-port hop), at
    /// most [`MAX_REDIRECTS`] hops, over the same TLS configuration, and
    /// never from `https://` to anything else.
    ///
    /// # Errors
    /// [`ClientError`]; [`ClientError::Redirect`] for a redirect not
    /// followed.
    pub fn request(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, &str)],
        headers: &[(&str, &str)],
        body: Option<Body<'_>>,
    ) -> Result<Value, ClientError> {
        let mut url = format!("{}{path}", self.base_url);
        // The query is part of the first URL only: a `Location` carries it.
        let mut query = query;
        let mut hops = 0;
        loop {
            let response = self.send_once(method, &url, query, headers, body);
            let location = match &response {
                Ok(r) if matches!(r.status().as_u16(), 307 | 308) => r
                    .headers()
                    .get("location")
                    .map(|v| v.to_str().map(str::to_owned)),
                _ => None,
            };
            let Some(location) = location else {
                return finish(&url, response);
            };
            let refuse = |reason: String| ClientError::Redirect {
                url: url.clone(),
                reason,
            };
            let location =
                location.map_err(|_| refuse("the Location header is not text".into()))?;
            hops += 1;
            if hops > MAX_REDIRECTS {
                return Err(refuse(format!(
                    "more than {MAX_REDIRECTS} redirects (last to {location})"
                )));
            }
            let next = resolve(&url, &location).ok_or_else(|| {
                refuse(format!(
                    "Location {location:?} is not an http(s) URL or path"
                ))
            })?;
            if is_https(&url) && !is_https(&next) {
                return Err(refuse(format!(
                    "refusing to follow an https request to {next}"
                )));
            }
            url = next;
            query = &[];
        }
    }

    /// One request to `url`, no redirect followed.
    fn send_once(
        &self,
        method: Method,
        url: &str,
        query: &[(&str, &str)],
        headers: &[(&str, &str)],
        body: Option<Body<'_>>,
    ) -> Result<ureq::http::Response<ureq::Body>, ureq::Error> {
        match method {
            Method::Get => self.decorate(self.agent.get(url), query, headers).call(),
            Method::Delete => self.decorate(self.agent.delete(url), query, headers).call(),
            Method::Post | Method::Patch => {
                let request = match method {
                    Method::Post => self.agent.post(url),
                    _ => self.agent.patch(url),
                };
                let request = self.decorate(request, query, headers);
                match body {
                    Some(body) => request.content_type(body.content_type).send(body.bytes),
                    None => request.send_empty(),
                }
            }
        }
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

fn is_https(url: &str) -> bool {
    url.get(..8)
        .is_some_and(|s| s.eq_ignore_ascii_case("https://"))
}

/// `location` (absolute `http(s)://…`, or an absolute path `/…` on the
/// origin of `base`) as a URL; `None` for anything else.
fn resolve(base: &str, location: &str) -> Option<String> {
    let lower = location.get(..8).unwrap_or(location).to_ascii_lowercase();
    if lower.starts_with("https://") || lower.starts_with("http://") {
        return Some(location.to_owned());
    }
    if !location.starts_with('/') || location.starts_with("//") {
        return None;
    }
    let scheme_end = base.find("://")? + 3;
    let origin_end = base[scheme_end..]
        .find('/')
        .map_or(base.len(), |i| scheme_end + i);
    Some(format!("{}{location}", &base[..origin_end]))
}

fn decode<R: DeserializeOwned>(url: &str, value: Value) -> Result<R, ClientError> {
    serde_json::from_value(value).map_err(|e| ClientError::BadResponse {
        url: url.to_owned(),
        status: 200,
        detail: e.to_string(),
    })
}

/// The likely cause of a transport `error` of a request to `url`, where
/// the error itself names only a symptom:
///
/// - an `http://` URL whose server answered something that is not HTTP
///   (a TLS listener answers a plain request with a TLS alert);
/// - an `https://` URL whose server did not answer in TLS (plain HTTP);
/// - a server certificate the CA given does not verify (another
///   cluster's CA, or the wrong file).
pub fn transport_hint(url: &str, error: &ureq::Error) -> Option<&'static str> {
    if url.starts_with("http://") && matches!(error, ureq::Error::Protocol(_)) {
        return Some(
            "the server did not answer in HTTP: if it serves HTTPS, use https:// and the cluster CA",
        );
    }
    #[cfg(feature = "tls")]
    {
        let rustls_error = match error {
            ureq::Error::Rustls(e) => Some(e),
            ureq::Error::Io(e) => e.get_ref().and_then(|e| e.downcast_ref::<rustls::Error>()),
            _ => None,
        };
        match rustls_error {
            Some(rustls::Error::InvalidMessage(rustls::InvalidMessage::InvalidContentType)) => {
                return Some(
                    "the server did not answer in TLS: if it serves plain HTTP, use http://",
                );
            }
            Some(rustls::Error::InvalidCertificate(
                rustls::CertificateError::BadSignature | rustls::CertificateError::UnknownIssuer,
            )) => {
                return Some(
                    "the CA given did not sign the server's certificate: name the CA of the server's cluster",
                );
            }
            _ => {}
        }
    }
    None
}

fn finish(
    url: &str,
    response: Result<ureq::http::Response<ureq::Body>, ureq::Error>,
) -> Result<Value, ClientError> {
    let response = response.map_err(|source| ClientError::Transport {
        url: url.to_owned(),
        hint: transport_hint(url, &source),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_resolve_against_the_origin() {
        let base = "https://127.0.0.1:7400/v1/topics/a/b/records?offset=1";
        assert_eq!(
            resolve(base, "/v1/x?y=1").as_deref(),
            Some("https://127.0.0.1:7400/v1/x?y=1")
        );
        assert_eq!(
            resolve(base, "https://127.0.0.1:7410/v1/x").as_deref(),
            Some("https://127.0.0.1:7410/v1/x")
        );
        assert_eq!(resolve("http://h:1", "/p").as_deref(), Some("http://h:1/p"));
        assert_eq!(resolve(base, "//evil/x"), None);
        assert_eq!(resolve(base, "relative/x"), None);
        assert_eq!(resolve(base, "ftp://h/x"), None);
        assert!(is_https("HTTPS://h") && !is_https("http://h"));
    }
}
