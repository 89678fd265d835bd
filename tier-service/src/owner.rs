//! The archive prefix's owner: one cluster archives under a `{prefix}` of
//! a bucket (`docs/archive-format.md`, "Prefix owner").
//!
//! Two clusters sharing a bucket and prefix would each take the other's
//! objects for orphans of their own, and reconciliation deletes an orphan
//! that overlaps a committed segment: the other cluster's records, whose
//! local copies may be trimmed already, would be lost. So at every start,
//! before any upload, reconciliation or delete, the service claims the
//! prefix ([`claim_prefix`]):
//!
//! | owner object `{prefix}/cluster-owner.json` | decision |
//! |---|---|
//! | absent (a new archive, or one from before this object) | written, create-if-absent, with this cluster's id; go on |
//! | names this cluster | go on |
//! | names another cluster | refuse to start ([`TierError::PrefixOwnedByOther`]) |
//! | not an owner object (unparsable, too large, unknown format) | refuse to start ([`TierError::OwnerObjectDamaged`]); never overwritten |
//! | the broker has no cluster id (older broker, or not committed yet) | go on unchecked, with a warning |
//!
//! The object is never replaced or deleted by the service.

use bytes::Bytes;
use object_store::PutPayload;
use serde::Deserialize;
use tracing::{info, warn};
use tributary_archive::bucket::Bucket;
use tributary_proto::cluster::{ClusterId, ClusterIdError};
use tributary_proto::keys::StorageKeys;

use crate::error::TierError;
use crate::tiering::Tiering;

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
    #[error("format {0}, this tier service reads format {OWNER_FORMAT}")]
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
) -> Result<OwnerObjectState, TierError> {
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

/// The refusal a found owner object means for cluster `ours` (`None`:
/// absent or ours), for `check-config`.
pub fn refusal(
    found: OwnerObjectState,
    ours: ClusterId,
    bucket: &Bucket,
    keys: &StorageKeys,
) -> Option<TierError> {
    judge(found, ours, bucket, keys).err()
}

/// What the start-up claim found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ownership {
    /// The prefix had no owner object; it now names this cluster.
    Claimed(ClusterId),
    /// The owner object already named this cluster.
    Ours(ClusterId),
    /// The broker gave no cluster id: nothing was checked or written.
    Unchecked,
}

/// The verdict on a found owner object for cluster `ours`: `Ok(true)` if
/// it is ours, `Ok(false)` if absent, the refusal otherwise.
fn judge(
    found: OwnerObjectState,
    ours: ClusterId,
    bucket: &Bucket,
    keys: &StorageKeys,
) -> Result<bool, TierError> {
    match found {
        OwnerObjectState::Absent => Ok(false),
        OwnerObjectState::Names(owner) if owner == ours => Ok(true),
        OwnerObjectState::Names(owner) => Err(TierError::PrefixOwnedByOther {
            bucket: bucket.description().to_owned(),
            prefix: keys.prefix().to_owned(),
            key: keys.owner_object(),
            owner,
            ours,
        }),
        OwnerObjectState::Damaged(reason) => Err(TierError::OwnerObjectDamaged {
            bucket: bucket.description().to_owned(),
            prefix: keys.prefix().to_owned(),
            key: keys.owner_object(),
            ours,
            reason,
        }),
    }
}

/// Claims the archive under `keys` for cluster `ours`: goes on if the
/// owner object names it, writes the object (create-if-absent) if there
/// is none, refuses otherwise. Nothing is overwritten or deleted.
///
/// # Errors
/// [`TierError::PrefixOwnedByOther`], [`TierError::OwnerObjectDamaged`],
/// store errors.
pub async fn claim(
    bucket: &Bucket,
    keys: &StorageKeys,
    ours: ClusterId,
) -> Result<Ownership, TierError> {
    if judge(read_owner(bucket, keys).await?, ours, bucket, keys)? {
        return Ok(Ownership::Ours(ours));
    }
    let key = keys.owner_object();
    match bucket.put(&key, PutPayload::from(encode(ours)), true).await {
        Ok(()) => Ok(Ownership::Claimed(ours)),
        // Another tier service created it meanwhile: judge what it wrote.
        Err(e) => {
            let e = TierError::from(e);
            if !e.is_already_exists() {
                return Err(e);
            }
            if judge(read_owner(bucket, keys).await?, ours, bucket, keys)? {
                Ok(Ownership::Ours(ours))
            } else {
                Err(e)
            }
        }
    }
}

/// The start-up claim of the service's prefix: asks the broker for its
/// cluster id (retried as other broker calls are), then [`claim`]s.
///
/// # Errors
/// Broker errors after the retries, and [`claim`]'s.
pub async fn claim_prefix(tiering: &Tiering) -> Result<Ownership, TierError> {
    let Some(ours) = tiering
        .retry("read cluster id", || tiering.broker.cluster_id())
        .await?
    else {
        warn!(
            prefix = tiering.keys.prefix(),
            "the broker gives no cluster id (an older broker, or a cluster whose id is not \
             committed yet): the archive prefix's owner is not checked"
        );
        return Ok(Ownership::Unchecked);
    };
    let ownership = claim(&tiering.bucket, &tiering.keys, ours).await?;
    match ownership {
        Ownership::Claimed(id) => info!(
            cluster_id = %id,
            key = tiering.keys.owner_object(),
            "claimed the archive prefix for this cluster"
        ),
        Ownership::Ours(id) => {
            info!(cluster_id = %id, "the archive prefix belongs to this cluster")
        }
        Ownership::Unchecked => {}
    }
    Ok(ownership)
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

    #[tokio::test]
    async fn claim_writes_keeps_and_refuses() {
        let dir = tempfile::tempdir().unwrap();
        let bucket = Bucket::local(dir.path().to_path_buf()).unwrap();
        let keys = StorageKeys::default();
        let ours = ClusterId::parse(ID).unwrap();
        let other = ClusterId::from_random([7; 16]);
        assert_eq!(
            claim(&bucket, &keys, ours).await.unwrap(),
            Ownership::Claimed(ours)
        );
        let path = dir.path().join(keys.owner_object());
        assert_eq!(std::fs::read(&path).unwrap(), encode(ours));
        assert_eq!(
            claim(&bucket, &keys, ours).await.unwrap(),
            Ownership::Ours(ours)
        );
        let err = claim(&bucket, &keys, other).await.unwrap_err();
        assert!(
            matches!(err, TierError::PrefixOwnedByOther { owner, ours: o, .. } if owner == ours && o == other),
            "{err}"
        );
        std::fs::write(&path, b"{garbled").unwrap();
        let err = claim(&bucket, &keys, ours).await.unwrap_err();
        assert!(matches!(err, TierError::OwnerObjectDamaged { .. }), "{err}");
        assert_eq!(std::fs::read(&path).unwrap(), b"{garbled");
    }
}
