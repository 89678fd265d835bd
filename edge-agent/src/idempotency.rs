//! Producer retries without duplicates on the HTTP path: a publish with an
//! `Idempotency-Key` header stores its records once per topic and key; a
//! retry with the same key and the same request returns the original
//! offsets, a different request with a used key is refused (409). The
//! answer is kept in the metadata store at
//! `/edge/idempotency/{ns}/{topic}/{hex key}` for [`WINDOW_MS`], so it
//! survives an agent restart. A marker committed before the append
//! ([`crate::pending`]) lets the agent tell, after a crash, whether the
//! records of a request it never answered were stored.

use std::collections::HashMap;
use std::fmt::Write;
use std::sync::{Arc, Mutex};

use broker_core::metadata::{MetadataError, MetadataStore};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tributary_proto::keys::TopicName;

use crate::manager::TopicManager;
use crate::topic::PublishAck;

/// The request header.
pub const HEADER: &str = "idempotency-key";
/// How long a key is remembered, ms (24 h).
pub const WINDOW_MS: u64 = 24 * 60 * 60 * 1000;
/// Longest key accepted, bytes.
pub const MAX_KEY_BYTES: usize = 200;

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

/// Serialises requests with the same topic and key, so a retry that
/// overtakes the original waits for its answer.
#[derive(Debug, Default)]
pub struct KeyLocks {
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl KeyLocks {
    /// The lock of `store_key`; dropped from the map when unused.
    pub fn get(&self, store_key: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut map = self.locks.lock().unwrap_or_else(|p| p.into_inner());
        map.retain(|_, l| Arc::strong_count(l) > 1);
        map.entry(store_key.to_owned()).or_default().clone()
    }
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

/// Checks a key: 1 to [`MAX_KEY_BYTES`] bytes of visible ASCII.
///
/// # Errors
/// A message naming the rule.
pub fn check_key(key: &str) -> Result<(), String> {
    if key.is_empty() || key.len() > MAX_KEY_BYTES {
        return Err(format!(
            "header {HEADER}: 1 to {MAX_KEY_BYTES} bytes; got {}",
            key.len()
        ));
    }
    if !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!("header {HEADER}: visible ASCII only"));
    }
    Ok(())
}

/// SHA-256 (hex) over `parts`, each length-prefixed.
pub fn fingerprint(parts: &[&[u8]]) -> String {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    for part in parts {
        ctx.update(&(part.len() as u64).to_be_bytes());
        ctx.update(part);
    }
    let mut out = String::with_capacity(64);
    for b in ctx.finish().as_ref() {
        let _ = write!(out, "{b:02x}");
    }
    out
}

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
