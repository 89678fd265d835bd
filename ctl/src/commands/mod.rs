//! `tribctl topics | namespaces | apply | cluster | auth | edges`: admin commands over the
//! broker's admin HTTP API, one module per command group. Each command
//! returns the text to print; with `--output json` that is the API's JSON
//! response, pretty-printed. This module holds what they share: the
//! [`Context`] (API address, token, output format), [`CommandError`] and
//! the rendering helpers.
//!
//! Text formats (stable, tested in `ctl/tests/`):
//! - `topics describe` follows the seed's sample output
//!   (`seeds/000_d502aacc865e81b1.txt`): `Topic`, `Owner` (the seed's
//!   `Broker ID`, with the ownership epoch), `Delivery`, `Intent` lines,
//!   then `Partitions` and `Subscriptions`.
//! - `apply` prints one line per plan item, `{action:<9} {kind} {name}
//!   ({intent}, {partitions})`, then a summary line.

pub mod apply;
pub mod auth;
pub mod cluster;
pub mod edges;
pub mod edges_list;
pub mod namespaces;
pub mod subscriptions;
pub mod topics;

use std::path::PathBuf;

use clap::ValueEnum;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tributary_api::client::ClientError;
use tributary_proto::keys::{NameError, TopicName};

use crate::client::{self, AdminClient};

/// How read commands print.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// Human-readable text.
    Text,
    /// The admin API's JSON response, pretty-printed.
    Json,
}

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    /// The admin API call failed, worded by [`client::describe_failure`]
    /// (which already says everything: the error is not a source, so the
    /// one-line report does not repeat it).
    #[error("{}", client::describe_failure(.0))]
    Client(ClientError),
    /// A name given on the command line is invalid.
    #[error(transparent)]
    Name(#[from] NameError),
    /// No token from `--token` or `TRIB_ADMIN_TOKEN`.
    #[error("no admin token: pass --token or set TRIB_ADMIN_TOKEN")]
    MissingToken,
    /// Nothing to change in `set-failure-policy`.
    #[error(
        "nothing to change: pass at least one of --max-redelivery-count, --ack-timeout-ms, \
         --base-redelivery-delay-ms, --max-redelivery-delay-ms, --backoff-strategy, \
         --dead-letter-topic, --poison-policy"
    )]
    NothingToChange,
    /// The manifest file could not be read.
    #[error("cannot read {path}: {source}")]
    ReadFile {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A response that decodes as JSON but not as the documented shape.
    #[error("unexpected admin API response: {0}")]
    Decode(String),
    /// `topics unload` waited `--wait-ms` and the tier service had not
    /// committed everything sealed.
    #[error(
        "{topic} is sealed up to offset {sealed_offset} but tiered only up to {} after \
         {waited_ms} ms: is the tier service running? (call again to keep waiting)",
        tiered_offset.map_or_else(|| "nothing".to_owned(), |o| o.to_string())
    )]
    UnloadPending {
        /// The topic.
        topic: String,
        /// Next offset after the sealed segments.
        sealed_offset: u64,
        /// Next offset after the committed descriptors, if any.
        tiered_offset: Option<u64>,
        /// How long it waited, ms.
        waited_ms: u64,
    },
}

impl From<ClientError> for CommandError {
    fn from(error: ClientError) -> CommandError {
        CommandError::Client(error)
    }
}

/// An admin command with what it needs to reach the API.
#[derive(Debug)]
pub struct Context<'a> {
    /// Admin API base URL.
    pub admin_url: &'a str,
    /// Bearer token.
    pub token: Option<&'a str>,
    /// Output format.
    pub output: OutputFormat,
}

impl Context<'_> {
    pub(crate) fn client(&self) -> Result<AdminClient, CommandError> {
        match self.token {
            Some(token) if !token.is_empty() => Ok(AdminClient::new(self.admin_url, token)),
            _ => Err(CommandError::MissingToken),
        }
    }

    /// `value` as this context's output: pretty JSON, or `text(value)`.
    pub(crate) fn render<T: DeserializeOwned>(
        &self,
        value: Value,
        text: impl FnOnce(T) -> String,
    ) -> Result<String, CommandError> {
        match self.output {
            OutputFormat::Json => Ok(pretty(&value)),
            OutputFormat::Text => Ok(text(decode(value)?)),
        }
    }
}

pub(crate) fn pretty(value: &Value) -> String {
    // Serializing a Value cannot fail.
    let mut text = serde_json::to_string_pretty(value).unwrap_or_default();
    text.push('\n');
    text
}

pub(crate) fn decode<T: DeserializeOwned>(value: Value) -> Result<T, CommandError> {
    serde_json::from_value(value).map_err(|e| CommandError::Decode(e.to_string()))
}

pub(crate) fn topic_path(topic: &str) -> Result<String, CommandError> {
    let topic = TopicName::new(topic)?;
    Ok(format!(
        "/v1/topics/{}/{}",
        topic.namespace(),
        topic.topic()
    ))
}

pub(crate) fn partitions_text(partitions: u32) -> String {
    match partitions {
        0 => "non-partitioned".to_owned(),
        1 => "1 partition".to_owned(),
        n => format!("{n} partitions"),
    }
}
