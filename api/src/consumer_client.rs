//! A small blocking client of the broker's consumer HTTP API
//! (`docs/consumer-api.md`), feature `client`. HTTPS verifying the broker
//! against the cluster CA ([`ConsumerClient::new_with_tls`], feature
//! `tls`), or plain `http://` to a broker on loopback
//! ([`ConsumerClient::new`]); bearer token on every request. Used by the
//! tests and `tribctl`; a service can use it as is.
//!
//! Answers of receive, read and peek may carry gap notices
//! ([`ReceiveResponse::gaps`](crate::consumer::ReceiveResponse::gaps)):
//! offset ranges that hold no record (declared holes, damaged central
//! bytes). The broker moves the cursor past them; a caller that tracks
//! offsets should treat each as delivered.
//!
//! ```no_run
//! use tributary_api::consumer::{AttachRequest, StartPosition};
//! use tributary_api::consumer_client::ConsumerClient;
//! # fn main() -> Result<(), tributary_api::client::ClientError> {
//! let client = ConsumerClient::new("http://127.0.0.1:7400", "dev-token"); // or new_with_tls
//! let attach = AttachRequest { start: StartPosition::Earliest, ..AttachRequest::default() };
//! let session = client.attach("/default/jobs", "workers", &attach)?;
//! let batch = client.receive("/default/jobs", "workers", session.consumer_id, 10, 1000)?;
//! let offsets: Vec<u64> = batch.messages.iter().map(|m| m.offset).collect();
//! client.ack("/default/jobs", "workers", session.consumer_id, &offsets)?;
//! # Ok(()) }
//! ```

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

pub use crate::client::ClientError;
use crate::client::{DEFAULT_TIMEOUT, HttpClient};
use crate::consumer::{
    AckRequest, AckResponse, AckUpToRequest, AckUpToResponse, AttachRequest, AttachResponse,
    NackRequest, NackResponse, PublishRecord, PublishRequest, PublishResponse, ReceiveRequest,
    ReceiveResponse, ReplayResponse, SeekRequest, SessionRequest, SubscriptionState, ValueEncoding,
};

/// A client of one broker's consumer API.
#[derive(Debug, Clone)]
pub struct ConsumerClient {
    http: HttpClient,
}

fn topic_path(topic: &str) -> String {
    // `/ns/topic` → `/v1/topics/ns/topic`; names never contain `/` or
    // characters that need escaping (see `keys`).
    format!("/v1/topics{topic}")
}

impl ConsumerClient {
    /// A client of `base_url` (e.g. `http://127.0.0.1:7400`) presenting
    /// `token`. Requests time out after [`DEFAULT_TIMEOUT`] (longer than
    /// the longest long-poll).
    pub fn new(base_url: &str, token: &str) -> ConsumerClient {
        ConsumerClient {
            http: HttpClient::new(base_url, Some(token), DEFAULT_TIMEOUT),
        }
    }

    /// A client of `base_url` (e.g. `https://broker-1:7400`) over HTTPS:
    /// the broker's certificate must chain to `tls.ca`; `tls.client_cert`
    /// is presented when set (feature `tls`).
    ///
    /// # Errors
    /// [`ClientError::TlsFile`] for an unreadable file or a world-readable
    /// key.
    #[cfg(feature = "tls")]
    pub fn new_with_tls(
        base_url: &str,
        token: &str,
        tls: &crate::client::ClientTls,
    ) -> Result<ConsumerClient, ClientError> {
        Ok(ConsumerClient {
            http: HttpClient::with_tls(base_url, Some(token), DEFAULT_TIMEOUT, tls)?,
        })
    }

    fn sub_path(topic: &str, subscription: &str, action: &str) -> String {
        format!("{}/subscriptions/{subscription}{action}", topic_path(topic))
    }

    /// `POST path` with a JSON body.
    ///
    /// # Errors
    /// [`ClientError`].
    pub fn post<B: Serialize, R: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<R, ClientError> {
        self.http.post(path, body)
    }

    /// `GET path` with query pairs.
    ///
    /// # Errors
    /// [`ClientError`].
    pub fn get<R: DeserializeOwned>(
        &self,
        path: &str,
        query: &[(&str, String)],
    ) -> Result<R, ClientError> {
        let query: Vec<(&str, &str)> = query.iter().map(|(k, v)| (*k, v.as_str())).collect();
        self.http.get(path, &query)
    }

    /// `DELETE path`.
    ///
    /// # Errors
    /// [`ClientError`].
    pub fn delete<R: DeserializeOwned>(&self, path: &str) -> Result<R, ClientError> {
        self.http.delete(path)
    }

    /// Attaches a consumer (creating the subscription on first attach).
    ///
    /// # Errors
    /// [`ClientError`]; `409` for a busy exclusive subscription or a type
    /// mismatch, `404` for an unknown topic.
    pub fn attach(
        &self,
        topic: &str,
        subscription: &str,
        request: &AttachRequest,
    ) -> Result<AttachResponse, ClientError> {
        self.post(&Self::sub_path(topic, subscription, "/attach"), request)
    }

    /// Ends a session; its leases are redelivered at once.
    ///
    /// # Errors
    /// [`ClientError`].
    pub fn detach(
        &self,
        topic: &str,
        subscription: &str,
        consumer_id: u64,
    ) -> Result<Value, ClientError> {
        self.post(
            &Self::sub_path(topic, subscription, "/detach"),
            &SessionRequest { consumer_id },
        )
    }

    /// Leases up to `max_messages`, waiting up to `max_wait_ms` for the
    /// first.
    ///
    /// # Errors
    /// [`ClientError`].
    pub fn receive(
        &self,
        topic: &str,
        subscription: &str,
        consumer_id: u64,
        max_messages: u32,
        max_wait_ms: u64,
    ) -> Result<ReceiveResponse, ClientError> {
        self.post(
            &Self::sub_path(topic, subscription, "/receive"),
            &ReceiveRequest {
                consumer_id,
                max_messages,
                max_wait_ms,
                encoding: ValueEncoding::Text,
            },
        )
    }

    /// Cursor read: up to `max_messages` from the cursor, without leases.
    ///
    /// # Errors
    /// [`ClientError`].
    pub fn read(
        &self,
        topic: &str,
        subscription: &str,
        consumer_id: u64,
        max_messages: u32,
        max_wait_ms: u64,
    ) -> Result<ReceiveResponse, ClientError> {
        self.post(
            &Self::sub_path(topic, subscription, "/read"),
            &ReceiveRequest {
                consumer_id,
                max_messages,
                max_wait_ms,
                encoding: ValueEncoding::Text,
            },
        )
    }

    /// Acknowledges leased messages.
    ///
    /// # Errors
    /// [`ClientError`]; `409 not_leased` for a message leased to another
    /// consumer.
    pub fn ack(
        &self,
        topic: &str,
        subscription: &str,
        consumer_id: u64,
        offsets: &[u64],
    ) -> Result<AckResponse, ClientError> {
        self.post(
            &Self::sub_path(topic, subscription, "/ack"),
            &AckRequest {
                consumer_id,
                offsets: offsets.to_vec(),
            },
        )
    }

    /// Acknowledges everything up to and including `offset`.
    ///
    /// # Errors
    /// [`ClientError`].
    pub fn ack_up_to(
        &self,
        topic: &str,
        subscription: &str,
        consumer_id: u64,
        offset: u64,
    ) -> Result<AckUpToResponse, ClientError> {
        self.post(
            &Self::sub_path(topic, subscription, "/ack-up-to"),
            &AckUpToRequest {
                consumer_id,
                offset,
            },
        )
    }

    /// Negative acknowledgement of leased messages.
    ///
    /// # Errors
    /// [`ClientError`].
    pub fn nack(
        &self,
        topic: &str,
        subscription: &str,
        request: &NackRequest,
    ) -> Result<NackResponse, ClientError> {
        self.post(&Self::sub_path(topic, subscription, "/nack"), request)
    }

    /// Moves a subscription's cursor.
    ///
    /// # Errors
    /// [`ClientError`].
    pub fn seek(
        &self,
        topic: &str,
        subscription: &str,
        request: &SeekRequest,
    ) -> Result<Value, ClientError> {
        self.post(&Self::sub_path(topic, subscription, "/seek"), request)
    }

    /// A subscription's state.
    ///
    /// # Errors
    /// [`ClientError`].
    pub fn state(&self, topic: &str, subscription: &str) -> Result<SubscriptionState, ClientError> {
        self.get(&Self::sub_path(topic, subscription, ""), &[])
    }

    /// Publishes records centrally (one record batch).
    ///
    /// # Errors
    /// [`ClientError`]; `409` if an edge replicates into the topic.
    pub fn publish(
        &self,
        topic: &str,
        records: Vec<PublishRecord>,
    ) -> Result<PublishResponse, ClientError> {
        self.post(
            &format!("{}/records", topic_path(topic)),
            &PublishRequest { records },
        )
    }

    /// Publishes records centrally and returns only once they are also
    /// committed in the archive (`?ack=archived`), waiting at most
    /// `max_wait_ms` on the broker: for central-written topics, which have
    /// no edge copy (`docs/consumer-api.md`).
    ///
    /// # Errors
    /// [`ClientError`]; `504 archive_pending` when the archive did not
    /// commit them in time (they are stored: do not publish them again).
    pub fn publish_archived(
        &self,
        topic: &str,
        records: Vec<PublishRecord>,
        max_wait_ms: u64,
    ) -> Result<PublishResponse, ClientError> {
        self.post(
            &format!(
                "{}/records?ack=archived&max_wait_ms={max_wait_ms}",
                topic_path(topic)
            ),
            &PublishRequest { records },
        )
    }

    /// Reads records of `topic` from `offset` without a subscription.
    ///
    /// # Errors
    /// [`ClientError`].
    pub fn peek(
        &self,
        topic: &str,
        offset: Option<u64>,
        max_messages: u32,
    ) -> Result<ReceiveResponse, ClientError> {
        let mut query = vec![("max_messages", max_messages.to_string())];
        if let Some(offset) = offset {
            query.push(("offset", offset.to_string()));
        }
        self.get(&format!("{}/records", topic_path(topic)), &query)
    }

    /// Moves the subscription's dead-lettered messages back to the topic.
    ///
    /// # Errors
    /// [`ClientError`].
    pub fn replay_dlq(
        &self,
        topic: &str,
        subscription: &str,
    ) -> Result<ReplayResponse, ClientError> {
        self.post(
            &Self::sub_path(topic, subscription, "/replay-dlq"),
            &serde_json::json!({}),
        )
    }
}
