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

use object_store::PutPayload;
use tracing::{info, warn};
use tributary_archive::bucket::Bucket;
pub use tributary_archive::owner::{OwnerObjectState, OwnerParseError, encode, read_owner};
use tributary_proto::cluster::ClusterId;
use tributary_proto::keys::StorageKeys;

use crate::error::TierError;
use crate::tiering::Tiering;

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
