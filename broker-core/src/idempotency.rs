//! What retries without duplicates share between the edge agent's HTTP
//! publish and the broker's central publish: the `Idempotency-Key` header
//! and its rules, the SHA-256 fingerprints of a request and of the records
//! it stored, and the per-key locks that make requests with one key run
//! one after the other.

use std::collections::HashMap;
use std::fmt::Write;
use std::sync::{Arc, Mutex};

use tributary_proto::Record;

/// The request header (HTTP header names are case-insensitive).
pub const HEADER: &str = "idempotency-key";
/// How long a key is remembered, ms (24 h).
pub const WINDOW_MS: u64 = 24 * 60 * 60 * 1000;
/// Longest key accepted, bytes.
pub const MAX_KEY_BYTES: usize = 200;

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

/// The request's key from the raw values of its `Idempotency-Key`
/// headers: `None` without one; once, 1 to [`MAX_KEY_BYTES`] bytes of
/// visible ASCII.
///
/// # Errors
/// A message naming the rule broken.
pub fn request_key<'a>(values: &[&'a [u8]]) -> Result<Option<&'a str>, String> {
    let key = match values {
        [] => return Ok(None),
        [one] => *one,
        _ => return Err(format!("header {HEADER}: given more than once")),
    };
    let key = std::str::from_utf8(key)
        .ok()
        .filter(|k| k.bytes().all(|b| b.is_ascii_graphic()))
        .ok_or_else(|| format!("header {HEADER}: visible ASCII only"))?;
    check_key(key)?;
    Ok(Some(key))
}

/// SHA-256 (lowercase hex) over `parts`, each length-prefixed (u64 big
/// endian), so no two different lists of parts hash alike by shifting
/// bytes between neighbours.
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

/// SHA-256 (hex) of `records` as stored: each record's timestamp, key
/// (absent and empty differ), headers and value, length-prefixed.
pub fn records_digest(records: &[Record]) -> String {
    let mut parts: Vec<&[u8]> = Vec::new();
    let stamps: Vec<[u8; 8]> = records
        .iter()
        .map(|r| r.timestamp_ms.to_be_bytes())
        .collect();
    for (r, stamp) in records.iter().zip(&stamps) {
        parts.push(stamp);
        match &r.key {
            Some(key) => {
                parts.push(b"k");
                parts.push(key);
            }
            None => parts.push(b"-"),
        }
        for (name, value) in &r.headers {
            parts.push(b"h");
            parts.push(name.as_bytes());
            parts.push(value);
        }
        parts.push(b"v");
        parts.push(&r.value);
    }
    fingerprint(&parts)
}

/// Serialises requests with the same key (any string naming topic and
/// key), so a retry that overtakes the original waits for its answer.
#[derive(Debug, Default)]
pub struct KeyLocks {
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl KeyLocks {
    /// The lock of `key`; dropped from the map when unused.
    pub fn get(&self, key: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut map = self.locks.lock().unwrap_or_else(|p| p.into_inner());
        map.retain(|_, l| Arc::strong_count(l) > 1);
        map.entry(key.to_owned()).or_default().clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_digests() {
        assert!(check_key("order-17").is_ok());
        assert!(check_key("").is_err());
        assert!(check_key("a b").is_err());
        assert!(check_key(&"x".repeat(MAX_KEY_BYTES + 1)).is_err());
        // Length prefixes: moving a byte between parts changes the hash.
        assert_ne!(fingerprint(&[b"ab", b"c"]), fingerprint(&[b"a", b"bc"]));
        let record = |key: Option<&'static [u8]>| Record {
            timestamp_ms: 5,
            key: key.map(bytes::Bytes::from_static),
            headers: Vec::new(),
            value: bytes::Bytes::from_static(b"v"),
        };
        assert_ne!(
            records_digest(&[record(None)]),
            records_digest(&[record(Some(b""))])
        );
        assert_eq!(records_digest(&[record(None)]).len(), 64);
        assert_eq!(request_key(&[]), Ok(None));
        assert_eq!(request_key(&[b"k-1"]), Ok(Some("k-1")));
        assert!(
            request_key(&[b"a", b"b"])
                .unwrap_err()
                .contains("more than once")
        );
        assert!(
            request_key(&[b"\xff"])
                .unwrap_err()
                .contains("visible ASCII")
        );
        assert!(request_key(&[b""]).unwrap_err().contains("1 to 200 bytes"));
    }
}
