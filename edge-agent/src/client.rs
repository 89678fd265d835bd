//! A blocking client of the local API, used by `edge-agent publish`: the
//! two publish routes on [`tributary_api::client::HttpClient`], so a failed
//! call is a [`ClientError`] like every other Tributary client's. Also the
//! parsing of `--header name=value` arguments ([`parse_header`]).

use std::net::SocketAddr;

use tributary_api::client::{Body, ClientError, DEFAULT_TIMEOUT, HttpClient, Method};
use tributary_proto::keys::TopicName;

use crate::api::{PublishResponse, RECORD_HEADER_PREFIX};

/// A `--header` argument that is not `name=value` (or has an empty name).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("header {0:?}: expected name=value")]
pub struct HeaderArgError(pub String);

/// One record for [`LocalClient::publish_record`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OneRecord {
    /// Key, UTF-8.
    pub key: Option<String>,
    /// Headers `(name, value)`.
    pub headers: Vec<(String, String)>,
    /// The value.
    pub value: Vec<u8>,
}

/// Parses a `name=value` header argument.
///
/// # Errors
/// [`HeaderArgError`] without `=` or with an empty name.
pub fn parse_header(arg: &str) -> Result<(String, String), HeaderArgError> {
    match arg.split_once('=') {
        Some((name, value)) if !name.is_empty() => Ok((name.to_owned(), value.to_owned())),
        _ => Err(HeaderArgError(arg.to_owned())),
    }
}

/// A client of the agent at one local API address. Requests time out after
/// [`DEFAULT_TIMEOUT`] (an `fsync_batch` publish waits for the disk).
#[derive(Debug)]
pub struct LocalClient {
    addr: SocketAddr,
    http: HttpClient,
}

impl LocalClient {
    /// A client of the agent listening on `addr`.
    pub fn new(addr: SocketAddr) -> LocalClient {
        LocalClient {
            addr,
            http: HttpClient::new(&format!("http://{addr}"), None, DEFAULT_TIMEOUT),
        }
    }

    /// The local API address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    fn path(topic: &TopicName, route: &str) -> String {
        // Topic names hold only URL-safe characters.
        format!("/v1/topics{}/{route}", topic.as_str())
    }

    fn publish(
        &self,
        path: &str,
        query: &[(&str, &str)],
        headers: &[(&str, &str)],
        body: Body<'_>,
    ) -> Result<PublishResponse, ClientError> {
        let value = self
            .http
            .request(Method::Post, path, query, headers, Some(body))?;
        serde_json::from_value(value).map_err(|e| ClientError::BadResponse {
            url: format!("{}{path}", self.http.base_url()),
            status: 200,
            detail: e.to_string(),
        })
    }

    /// Publishes one record.
    ///
    /// # Errors
    /// [`ClientError::Transport`], [`ClientError::Api`] with the agent's
    /// message, [`ClientError::BadResponse`].
    pub fn publish_record(
        &self,
        topic: &TopicName,
        record: &OneRecord,
    ) -> Result<PublishResponse, ClientError> {
        let query: Vec<(&str, &str)> = record.key.iter().map(|k| ("key", k.as_str())).collect();
        let names: Vec<String> = record
            .headers
            .iter()
            .map(|(name, _)| format!("{RECORD_HEADER_PREFIX}{name}"))
            .collect();
        let headers: Vec<(&str, &str)> = names
            .iter()
            .zip(&record.headers)
            .map(|(name, (_, value))| (name.as_str(), value.as_str()))
            .collect();
        let body = Body {
            content_type: "application/octet-stream",
            bytes: &record.value,
        };
        self.publish(&Self::path(topic, "records"), &query, &headers, body)
    }

    /// Publishes an NDJSON batch body as is.
    ///
    /// # Errors
    /// As [`LocalClient::publish_record`].
    pub fn publish_ndjson(
        &self,
        topic: &TopicName,
        body: &[u8],
    ) -> Result<PublishResponse, ClientError> {
        let body = Body {
            content_type: "application/x-ndjson",
            bytes: body,
        };
        self.publish(&Self::path(topic, "batch"), &[], &[], body)
    }
}

/// How `edge-agent publish` words a failed call, in one line: `agent at
/// {addr}: …` when the agent could not be reached, `{status}: {message}`
/// when it refused, `unexpected response from the agent: …` otherwise.
pub fn describe_failure(addr: SocketAddr, error: &ClientError) -> String {
    match error {
        ClientError::Transport { source, .. } => format!("agent at {addr}: {source}"),
        ClientError::Api {
            status, message, ..
        } => format!("{status}: {message}"),
        other => format!("unexpected response from the agent: {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_arguments() {
        assert_eq!(
            parse_header("unit=celsius").unwrap(),
            ("unit".to_owned(), "celsius".to_owned())
        );
        assert_eq!(
            parse_header("a=b=c").unwrap(),
            ("a".to_owned(), "b=c".to_owned())
        );
        assert_eq!(parse_header("k=").unwrap(), ("k".to_owned(), String::new()));
        assert_eq!(
            parse_header("novalue").unwrap_err().to_string(),
            "header \"novalue\": expected name=value"
        );
        assert_eq!(parse_header("=v"), Err(HeaderArgError("=v".to_owned())));
    }

    #[test]
    fn failures_read_as_the_cli_prints_them() {
        let addr: SocketAddr = "127.0.0.1:7300".parse().unwrap();
        let refused = ClientError::Api {
            status: 507,
            kind: String::new(),
            message: "disk budget full".to_owned(),
            body: serde_json::Value::Null,
        };
        assert_eq!(describe_failure(addr, &refused), "507: disk budget full");
        let bad = ClientError::BadResponse {
            url: "http://127.0.0.1:7300/v1/topics/e1/t/records".to_owned(),
            status: 200,
            detail: "missing field `count`".to_owned(),
        };
        assert_eq!(
            describe_failure(addr, &bad),
            "unexpected response from the agent: http://127.0.0.1:7300/v1/topics/e1/t/records \
             answered 200 with an unexpected body: missing field `count`"
        );
    }
}
