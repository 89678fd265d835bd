//! Producer retries without duplicates on the HTTP path: a publish with an
//! `Idempotency-Key` header stores its records once per topic and key; a
//! retry with the same key and the same request returns the original
//! offsets, a different request with a used key is refused (409). The
//! answer is kept in the metadata store at
//! `/edge/idempotency/{ns}/{topic}/{hex key}` for [`WINDOW_MS`], so it
//! survives an agent restart. A marker committed before the append
//! ([`crate::pending`]) lets the agent tell, after a crash, whether the
//! records of a request it never answered were stored.

use std::fmt::Write;

use broker_core::metadata::{MetadataError, MetadataStore};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tributary_proto::keys::TopicName;

use crate::manager::TopicManager;
use crate::topic::PublishAck;

pub use broker_core::idempotency::{HEADER, KeyLocks, MAX_KEY_BYTES, WINDOW_MS};

/// What a used key answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Remembered {
    /// SHA-256 (hex) of the request: query, record headers, body.
    pub fingerprint: String,
    /// The original answer.
    pub base_offset: u64,
    /// The original answer.
    pub next_offset: u64,
    /// The original answer.
    pub count: u64,
}

/// The locks of this process.
pub static LOCKS: std::sync::LazyLock<KeyLocks> = std::sync::LazyLock::new(KeyLocks::default);

/// The metadata key of `key` on `topic`.
pub fn store_key(topic: &TopicName, key: &str) -> String {
    let mut out = format!("/edge/idempotency{topic}/");
    for b in key.bytes() {
        let _ = write!(out, "{b:02x}");
    }
    out
}

pub use broker_core::idempotency::{check_key, fingerprint};

/// The remembered answer of `store_key`, if live.
///
/// # Errors
/// [`MetadataError`] from the store (an unreadable value counts as absent).
pub async fn lookup(
    manager: &TopicManager,
    store_key: &str,
) -> Result<Option<Remembered>, MetadataError> {
    let value = manager.store().get(store_key).await?;
    Ok(value.and_then(|v| serde_json::from_value(v).ok()))
}

/// The value remembered at a key's store key: `fingerprint` and the
/// answer `ack` (written with [`crate::pending::complete`]).
pub fn answer(fingerprint: String, ack: &PublishAck) -> Value {
    serde_json::to_value(Remembered {
        fingerprint,
        base_offset: ack.base_offset,
        next_offset: ack.next_offset,
        count: ack.count,
    })
    .unwrap_or_default()
}
