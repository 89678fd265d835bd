//! The archive prefix's owner object, `{prefix}/cluster-owner.json`
//! (`docs/archive-format.md`, "Prefix owner"): which cluster archives
//! under a prefix. Its format and how to read it; the tier service claims
//! it at start (its `owner` module), `tribctl archive ls` shows it.

use bytes::Bytes;
use serde::Deserialize;
use tributary_proto::cluster::{ClusterId, ClusterIdError};
use tributary_proto::keys::StorageKeys;

use crate::bucket::Bucket;
use crate::error::BucketError;

/// The owner object's format version (its `format` field).
pub const OWNER_FORMAT: u64 = 1;

/// Largest owner object read, bytes: the object is ~70 bytes; anything
/// larger is not an owner object (and is not read into memory).
pub const OWNER_OBJECT_MAX_BYTES: u64 = 4096;

/// Why bytes are not an owner object.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OwnerParseError {
    /// Larger than [`OWNER_OBJECT_MAX_BYTES`].
    #[error("{0} bytes, more than an owner object's {OWNER_OBJECT_MAX_BYTES}")]
    TooLarge(u64),
    /// Not the JSON object `{"format", "cluster_id"}`.
    #[error("not an owner object's JSON: {0}")]
    NotJson(String),
    /// A `format` this version does not know.
    #[error("format {0}, this version reads format {OWNER_FORMAT}")]
    Format(u64),
    /// `cluster_id` is not a cluster id.
    #[error("{0}")]
    ClusterId(#[from] ClusterIdError),
}

/// The owner object's JSON (unknown fields are ignored).
#[derive(Deserialize)]
struct OwnerObject {
    format: u64,
    cluster_id: String,
}

/// The owner object's bytes for `cluster`:
/// `{"format":1,"cluster_id":"<uuid>"}` and a newline.
pub fn encode(cluster: ClusterId) -> Vec<u8> {
    format!("{{\"format\":{OWNER_FORMAT},\"cluster_id\":\"{cluster}\"}}\n").into_bytes()
}

/// The cluster an owner object names.
///
/// # Errors
/// [`OwnerParseError`] for anything but an owner object of format
/// [`OWNER_FORMAT`] naming a valid (non-nil) cluster id.
pub fn parse(bytes: &[u8]) -> Result<ClusterId, OwnerParseError> {
    let len = u64::try_from(bytes.len()).unwrap_or(u64::MAX);
    if len > OWNER_OBJECT_MAX_BYTES {
        return Err(OwnerParseError::TooLarge(len));
    }
    let object: OwnerObject =
        serde_json::from_slice(bytes).map_err(|e| OwnerParseError::NotJson(e.to_string()))?;
    if object.format != OWNER_FORMAT {
        return Err(OwnerParseError::Format(object.format));
    }
    Ok(ClusterId::parse(&object.cluster_id)?)
}

/// What a bucket holds at the owner key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnerObjectState {
    /// No owner object.
    Absent,
    /// An owner object naming this cluster.
    Names(ClusterId),
    /// Something that is not an owner object.
    Damaged(OwnerParseError),
}

/// Reads the owner object of the archive under `keys` (one HEAD, and one
/// GET of at most [`OWNER_OBJECT_MAX_BYTES`] when present).
///
/// # Errors
/// Store errors.
pub async fn read_owner(
    bucket: &Bucket,
    keys: &StorageKeys,
) -> Result<OwnerObjectState, BucketError> {
    let key = keys.owner_object();
    let Some(size) = bucket.head(&key).await? else {
        return Ok(OwnerObjectState::Absent);
    };
    if size > OWNER_OBJECT_MAX_BYTES {
        return Ok(OwnerObjectState::Damaged(OwnerParseError::TooLarge(size)));
    }
    let bytes = if size == 0 {
        Bytes::new()
    } else {
        bucket.get_suffix(&key, size).await?.0
    };
    Ok(match parse(&bytes) {
        Ok(id) => OwnerObjectState::Names(id),
        Err(e) => OwnerObjectState::Damaged(e),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9";

    #[test]
    fn encode_then_parse() {
        let id = ClusterId::parse(ID).unwrap();
        let bytes = encode(id);
        assert_eq!(
            String::from_utf8(bytes.clone()).unwrap(),
            format!("{{\"format\":1,\"cluster_id\":\"{ID}\"}}\n")
        );
        assert_eq!(parse(&bytes), Ok(id));
    }

    #[test]
    fn unknown_fields_are_ignored() {
        let text = format!(r#"{{"cluster_id":"{ID}","format":1,"note":"x"}}"#);
        assert_eq!(parse(text.as_bytes()), Ok(ClusterId::parse(ID).unwrap()));
    }

    #[test]
    fn garbled_objects_are_refused() {
        let cases: Vec<Vec<u8>> = vec![
            Vec::new(),
            b"garbage".to_vec(),
            b"{}".to_vec(),
            br#"{"format":1}"#.to_vec(),
            format!(r#"{{"cluster_id":"{ID}"}}"#).into_bytes(),
            format!(r#"{{"format":"1","cluster_id":"{ID}"}}"#).into_bytes(),
            format!(r#"{{"format":1,"cluster_id":"{ID}""#).into_bytes(),
            format!(r#"["{ID}"]"#).into_bytes(),
            vec![0xff, 0xfe, 0x00],
        ];
        for bytes in cases {
            assert!(
                matches!(parse(&bytes), Err(OwnerParseError::NotJson(_))),
                "{:?}",
                String::from_utf8_lossy(&bytes)
            );
        }
    }

    #[test]
    fn wrong_format_or_id_is_refused() {
        let text = format!(r#"{{"format":2,"cluster_id":"{ID}"}}"#);
        assert_eq!(parse(text.as_bytes()), Err(OwnerParseError::Format(2)));
        let nil = r#"{"format":1,"cluster_id":"00000000-0000-0000-0000-000000000000"}"#;
        assert_eq!(
            parse(nil.as_bytes()),
            Err(OwnerParseError::ClusterId(ClusterIdError::Nil))
        );
        let short = r#"{"format":1,"cluster_id":"0f1e2d3c"}"#;
        assert!(matches!(
            parse(short.as_bytes()),
            Err(OwnerParseError::ClusterId(ClusterIdError::NotUuid(_)))
        ));
    }

    #[test]
    fn oversized_objects_are_refused_unread() {
        let mut text = format!(r#"{{"format":1,"cluster_id":"{ID}","pad":""#);
        text.push_str(&" ".repeat(5000));
        text.push_str("\"}");
        assert!(matches!(
            parse(text.as_bytes()),
            Err(OwnerParseError::TooLarge(_))
        ));
    }
}
