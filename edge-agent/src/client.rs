//! A blocking client of the local API (ureq), used by `edge-agent publish`.

use std::net::SocketAddr;
use std::time::Duration;

use tributary_proto::keys::TopicName;

use crate::api::{PublishResponse, RECORD_HEADER_PREFIX};

/// How long one request may take end to end (an `fsync_batch` publish
/// waits for the disk).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// Errors of [`LocalClient`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// A `--header` argument is not `name=value`.
    #[error("header {0:?}: expected name=value")]
    BadHeader(String),
    /// The agent could not be reached or the response not read.
    #[error("agent at {addr}: {source}")]
    Transport {
        /// The local API address.
        addr: SocketAddr,
        /// The HTTP error.
        source: Box<ureq::Error>,
    },
    /// The agent refused the request.
    #[error("{status}: {message}")]
    Refused {
        /// HTTP status.
        status: u16,
        /// The `error` field of the response, or its body.
        message: String,
    },
    /// The response is not the expected JSON.
    #[error("unexpected response from the agent: {0}")]
    BadResponse(String),
}

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
/// [`ClientError::BadHeader`] without `=` or with an empty name.
pub fn parse_header(arg: &str) -> Result<(String, String), ClientError> {
    match arg.split_once('=') {
        Some((name, value)) if !name.is_empty() => Ok((name.to_owned(), value.to_owned())),
        _ => Err(ClientError::BadHeader(arg.to_owned())),
    }
}

/// A client of the agent at one local API address.
#[derive(Debug)]
pub struct LocalClient {
    addr: SocketAddr,
    agent: ureq::Agent,
}

impl LocalClient {
    /// A client of the agent listening on `addr`.
    pub fn new(addr: SocketAddr) -> LocalClient {
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(REQUEST_TIMEOUT))
            .build();
        LocalClient {
            addr,
            agent: ureq::Agent::new_with_config(config),
        }
    }

    fn url(&self, topic: &TopicName, route: &str) -> String {
        // Topic names hold only URL-safe characters.
        format!("http://{}/v1/topics{}/{route}", self.addr, topic.as_str())
    }

    fn transport(&self) -> impl FnOnce(ureq::Error) -> ClientError + '_ {
        move |e| ClientError::Transport {
            addr: self.addr,
            source: Box::new(e),
        }
    }

    fn finish(
        &self,
        response: Result<ureq::http::Response<ureq::Body>, ureq::Error>,
    ) -> Result<PublishResponse, ClientError> {
        let mut response = response.map_err(self.transport())?;
        let status = response.status().as_u16();
        let body = response
            .body_mut()
            .read_to_string()
            .map_err(self.transport())?;
        if status != 200 {
            let message = serde_json::from_str::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_owned))
                .unwrap_or(body);
            return Err(ClientError::Refused { status, message });
        }
        serde_json::from_str(&body).map_err(|e| ClientError::BadResponse(format!("{e}: {body}")))
    }

    /// Publishes one record.
    ///
    /// # Errors
    /// [`ClientError::Transport`], [`ClientError::Refused`] with the
    /// agent's message, [`ClientError::BadResponse`].
    pub fn publish_record(
        &self,
        topic: &TopicName,
        record: &OneRecord,
    ) -> Result<PublishResponse, ClientError> {
        let mut request = self.agent.post(self.url(topic, "records"));
        if let Some(key) = &record.key {
            request = request.query("key", key);
        }
        for (name, value) in &record.headers {
            request = request.header(format!("{RECORD_HEADER_PREFIX}{name}"), value);
        }
        self.finish(request.send(&record.value[..]))
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
        let request = self
            .agent
            .post(self.url(topic, "batch"))
            .header("content-type", "application/x-ndjson");
        self.finish(request.send(body))
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
        assert!(matches!(parse_header("=v"), Err(ClientError::BadHeader(_))));
    }
}
