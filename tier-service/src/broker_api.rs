//! The tier service's client of the broker admin API's storage endpoints
//! (`broker/src/storage/`): descriptors are committed through the broker,
//! which writes them into Raft; the tier service never touches Raft itself.

use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};
use tributary_proto::archive::SegmentDescriptor;
use tributary_proto::cluster::ClusterId;
use tributary_proto::keys::{StorageKeys, TopicName};
use tributary_proto::replication::hole::HoleRecord;

use crate::error::TierError;
use tributary_archive::bucket::install_crypto_provider;

/// How long one admin API request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// A topic's committed descriptors and tiered offset.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct CommittedSegments {
    /// Descriptors by start offset.
    pub segments: Vec<SegmentDescriptor>,
    /// Start offset `segments/cur` points to.
    pub cur: Option<u64>,
    /// Offset past the `cur` descriptor's last record.
    pub tiered_offset: Option<u64>,
    /// Cold-retention low mark: offsets below it were removed on purpose.
    #[serde(default)]
    pub retired_below: Option<u64>,
    /// The topic's declared holes (Raft `/topics/{ns}/{topic}/holes/`),
    /// by first offset; an older broker sends none.
    #[serde(default)]
    pub holes: Vec<HoleRecord>,
    /// The archive audit's missing-object marks (Raft
    /// `{prefix}/storage/topics/{ns}/{topic}/missing/`); an older broker
    /// sends none.
    #[serde(default)]
    pub missing: Vec<MissingMark>,
    /// Whether this broker serves the topic now (a broker of a cluster);
    /// `None` from a broker without topic ownership (it owns everything).
    #[serde(default)]
    pub owned_here: Option<bool>,
    /// The topic's owner, if it has one (a broker of a cluster).
    #[serde(default)]
    pub owner: Option<u64>,
    /// The lakehouse writer's progress (`{"next_offset", "layout"}`), if
    /// it ever wrote the topic.
    #[serde(default)]
    pub lakehouse: Option<Value>,
}

/// The archive audit's mark of a committed descriptor whose object is
/// missing or damaged.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, serde::Serialize)]
pub struct MissingMark {
    /// Start offset of the descriptor.
    pub start_offset: u64,
    /// Its last offset, inclusive.
    pub end_offset: u64,
    /// The object key.
    pub object_id: String,
    /// What the audit found.
    pub reason: String,
    /// Whether the broker's local WAL still held the range.
    pub local_copy: bool,
    /// When the audit found it, ms since the Unix epoch.
    pub detected_at_ms: i64,
}

/// What a commit did.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct CommitReply {
    /// `committed` or `unchanged`.
    pub outcome: String,
    /// The topic's tiered offset afterwards.
    pub tiered_offset: Option<u64>,
}

/// What a trim did.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct TrimReply {
    /// The safe offset the broker used (from Raft).
    pub tiered_offset: Option<u64>,
    /// Whether the topic's WAL is open on the broker.
    pub wal_open: bool,
    /// `(base, next, bytes)` of each deleted local segment.
    pub deleted: Vec<(u64, u64, u64)>,
}

/// Client of the broker's storage endpoints.
#[derive(Clone)]
pub struct BrokerClient {
    http: reqwest::Client,
    base: String,
    token: String,
    prefix: String,
}

impl std::fmt::Debug for BrokerClient {
    /// The base URL and prefix; never the token.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BrokerClient")
            .field("base", &self.base)
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl BrokerClient {
    /// A client of the admin API at `base_url` with bearer `token`, for
    /// the storage prefix of `keys`.
    ///
    /// # Errors
    /// [`TierError::Config`] if the HTTP client cannot be built.
    pub fn new(base_url: &str, token: &str, keys: &StorageKeys) -> Result<BrokerClient, TierError> {
        install_crypto_provider();
        // No redirects: the tier service commits through its own broker
        // only (which answers 409 not_owner, never a redirect).
        let http = reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| TierError::Config(format!("HTTP client: {e}")))?;
        Ok(BrokerClient::with_http(http, base_url, token, keys))
    }

    /// A client of the broker `[broker]` names: over HTTPS when `ca` is set
    /// (the broker's certificate must chain to it; no other root is
    /// trusted), presenting `cert`/`key` when set.
    ///
    /// # Errors
    /// [`TierError::Config`] for unreadable TLS files, a world-readable
    /// key, or an HTTP client that cannot be built.
    pub fn from_config(
        config: &crate::config::BrokerApiConfig,
        token: &str,
        keys: &StorageKeys,
    ) -> Result<BrokerClient, TierError> {
        let Some(ca) = &config.ca else {
            return BrokerClient::new(&config.url, token, keys);
        };
        install_crypto_provider();
        let client = config.cert.as_deref().zip(config.key.as_deref());
        let tls = broker_core::tls::https_client_config(ca, client)
            .map_err(|e| TierError::Config(format!("[broker] TLS: {e}")))?;
        let http = reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .use_preconfigured_tls(tls)
            .build()
            .map_err(|e| TierError::Config(format!("HTTP client: {e}")))?;
        Ok(BrokerClient::with_http(http, &config.url, token, keys))
    }

    fn with_http(http: reqwest::Client, base_url: &str, token: &str, keys: &StorageKeys) -> Self {
        BrokerClient {
            http,
            base: base_url.trim_end_matches('/').to_owned(),
            token: token.to_owned(),
            prefix: keys.prefix().to_owned(),
        }
    }

    fn url(&self, path: &str) -> String {
        // The prefix is a validated storage prefix: letters, digits, `-`,
        // `_`, `.` and `/`, all safe in a query string.
        format!("{}/v1/storage{path}?prefix={}", self.base, self.prefix)
    }

    async fn send(
        &self,
        what: &'static str,
        request: reqwest::RequestBuilder,
    ) -> Result<(u16, Value), TierError> {
        let response =
            request
                .bearer_auth(&self.token)
                .send()
                .await
                .map_err(|e| TierError::Broker {
                    what,
                    status: None,
                    kind: None,
                    message: e.to_string(),
                })?;
        let status = response.status().as_u16();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        if (200..300).contains(&status) {
            return Ok((status, body));
        }
        Err(TierError::Broker {
            what,
            status: Some(status),
            kind: body["kind"].as_str().map(str::to_owned),
            message: body["error"]
                .as_str()
                .map_or_else(|| body.to_string(), str::to_owned),
        })
    }

    fn decode<T: serde::de::DeserializeOwned>(
        what: &'static str,
        body: Value,
    ) -> Result<T, TierError> {
        serde_json::from_value(body).map_err(|e| TierError::Broker {
            what,
            status: None,
            kind: None,
            message: format!("unexpected reply: {e}"),
        })
    }

    /// The broker's cluster id (`GET /v1/storage/cluster`): `Ok(None)` from
    /// an older broker without the endpoint (`404`) or a cluster whose id
    /// is not committed yet (`null`).
    ///
    /// # Errors
    /// [`TierError::Broker`], also for a reply whose `cluster_id` is
    /// neither `null` nor a cluster id.
    pub async fn cluster_id(&self) -> Result<Option<ClusterId>, TierError> {
        const WHAT: &str = "read cluster id";
        let url = format!("{}/v1/storage/cluster", self.base);
        let body = match self.send(WHAT, self.http.get(url)).await {
            Ok((_, body)) => body,
            Err(TierError::Broker {
                status: Some(404), ..
            }) => return Ok(None),
            Err(e) => return Err(e),
        };
        let unexpected = |message: String| TierError::Broker {
            what: WHAT,
            status: None,
            kind: None,
            message,
        };
        match &body["cluster_id"] {
            Value::Null => Ok(None),
            Value::String(text) => ClusterId::parse(text)
                .map(Some)
                .map_err(|e| unexpected(format!("unexpected reply: {e}"))),
            other => Err(unexpected(format!(
                "unexpected reply: cluster_id is {other}"
            ))),
        }
    }

    /// The committed descriptors of `topic`, and its declared holes.
    ///
    /// # Errors
    /// [`TierError::Broker`].
    pub async fn segments(&self, topic: &TopicName) -> Result<CommittedSegments, TierError> {
        let url = self.url(&format!("/topics{topic}/segments"));
        let (_, body) = self.send("list segments", self.http.get(url)).await?;
        BrokerClient::decode("list segments", body)
    }

    /// Topics that have committed descriptors.
    ///
    /// # Errors
    /// [`TierError::Broker`].
    pub async fn topics(&self) -> Result<Vec<TopicName>, TierError> {
        let (_, body) = self
            .send("list storage topics", self.http.get(self.url("/topics")))
            .await?;
        let mut out = Vec::new();
        for entry in body["topics"].as_array().into_iter().flatten() {
            if let Some(name) = entry["topic"].as_str()
                && let Ok(topic) = TopicName::new(name)
            {
                out.push(topic);
            }
        }
        Ok(out)
    }

    /// Commits `descriptor` (descriptor + `segments/cur` in one Raft
    /// transaction, by the broker).
    ///
    /// # Errors
    /// [`TierError::Broker`]: `409` with kind `conflict` or
    /// `not_contiguous` when refused (not retryable).
    pub async fn commit(
        &self,
        topic: &TopicName,
        descriptor: &SegmentDescriptor,
    ) -> Result<CommitReply, TierError> {
        let body = json!({ "topic": topic, "descriptor": descriptor });
        let (_, reply) = self
            .send(
                "commit descriptor",
                self.http.post(self.url("/descriptors")).json(&body),
            )
            .await?;
        BrokerClient::decode("commit descriptor", reply)
    }

    /// Marks the descriptor at `mark.start_offset` of `topic` as having a
    /// missing or damaged object (Raft, through the broker).
    ///
    /// # Errors
    /// [`TierError::Broker`].
    pub async fn mark_missing(
        &self,
        topic: &TopicName,
        mark: &MissingMark,
    ) -> Result<(), TierError> {
        let url = self.url(&format!("/topics{topic}/missing/{}", mark.start_offset));
        self.send("mark missing", self.http.put(url).json(mark))
            .await
            .map(|_| ())
    }

    /// Clears the missing-object mark at `start` (the object is stored
    /// again). Clearing an absent mark is fine.
    ///
    /// # Errors
    /// [`TierError::Broker`].
    pub async fn clear_missing(&self, topic: &TopicName, start: u64) -> Result<(), TierError> {
        let url = self.url(&format!("/topics{topic}/missing/{start}"));
        self.send("clear missing", self.http.delete(url))
            .await
            .map(|_| ())
    }

    /// Cold retention: removes the oldest descriptor, at `start` (the
    /// broker refuses any other, and the newest). Already gone is fine.
    ///
    /// # Errors
    /// [`TierError::Broker`].
    pub async fn retire(&self, topic: &TopicName, start: u64) -> Result<(), TierError> {
        let url = self.url(&format!("/topics{topic}/segments/{start}"));
        match self.send("retire descriptor", self.http.delete(url)).await {
            Ok(_)
            | Err(TierError::Broker {
                status: Some(404), ..
            }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Records the lakehouse writer's progress of `topic` (`{"next_offset",
    /// "layout"}`) in Raft.
    ///
    /// # Errors
    /// [`TierError::Broker`]: `409` `lakehouse_regress`, `beyond_archive`,
    /// `layout_fixed` or `not_owner` when refused.
    pub async fn put_lakehouse(
        &self,
        topic: &TopicName,
        progress: &Value,
    ) -> Result<(), TierError> {
        let url = self.url(&format!("/topics{topic}/lakehouse"));
        self.send(
            "record lakehouse progress",
            self.http.put(url).json(progress),
        )
        .await
        .map(|_| ())
    }

    /// Asks the broker to apply local retention to `topic` with its
    /// committed tiered offset as the safe offset. `None` if the broker does
    /// not expose its WALs (`501`).
    ///
    /// # Errors
    /// [`TierError::Broker`].
    pub async fn trim(&self, topic: &TopicName) -> Result<Option<TrimReply>, TierError> {
        let url = self.url(&format!("/topics{topic}/trim"));
        match self.send("trim", self.http.post(url)).await {
            Ok((_, body)) => BrokerClient::decode("trim", body).map(Some),
            Err(TierError::Broker {
                status: Some(501), ..
            }) => Ok(None),
            Err(e) => Err(e),
        }
    }
}
