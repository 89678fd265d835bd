//! [`ClusterId`]: which central cluster acknowledged an edge's records.
//!
//! Offsets and topic names are the same in every Tributary cluster, so an
//! edge cannot tell two clusters apart by them: one that a configuration
//! change points at another cluster (staging → production under one CA)
//! would take that cluster's `Welcome`, `Ack` and `Archived` for its own.
//! Each cluster therefore has a random 128-bit id, kept at `/cluster/id`
//! in Raft and written once; the broker sends it to an edge that asks
//! (`Hello` field `cluster_id`, frame `ClusterId`), and the edge keeps the
//! first one it got at `/edge/cluster` (FORMAT.md, "Cluster identity").
//!
//! Text form: a UUID (RFC 9562), 36 characters `8-4-4-4-12` of lower-case
//! hex; new ids are version 4 (random). On the wire: the 16 bytes in text
//! order. The nil id (all zero) is never valid: a zeroed buffer is not a
//! cluster.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Bytes of a cluster id on the wire.
pub const CLUSTER_ID_BYTES: usize = 16;

/// Characters of a cluster id's text form (the hyphenated UUID).
const TEXT_LEN: usize = 36;

/// A central cluster's identity: 128 bits, never all zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClusterId(uuid::Uuid);

/// Why bytes or text are not a cluster id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterIdError {
    /// The text is not 36 characters of the form `8-4-4-4-12` hex.
    #[error("cluster id {0:?} is not a UUID (36 characters, 8-4-4-4-12 hex digits)")]
    NotUuid(String),
    /// All 128 bits are zero.
    #[error("the nil cluster id (all zero) is not a cluster")]
    Nil,
}

impl ClusterId {
    /// A new version-4 id from 16 random bytes (the caller's RNG: this
    /// crate reads no randomness), with the version and variant bits set
    /// (so never nil).
    pub fn from_random(bytes: [u8; CLUSTER_ID_BYTES]) -> ClusterId {
        ClusterId(uuid::Builder::from_random_bytes(bytes).into_uuid())
    }

    /// The id carried in 16 bytes (the `ClusterId` frame).
    ///
    /// # Errors
    /// [`ClusterIdError::Nil`] for all-zero bytes.
    pub fn from_bytes(bytes: [u8; CLUSTER_ID_BYTES]) -> Result<ClusterId, ClusterIdError> {
        let id = uuid::Uuid::from_bytes(bytes);
        if id.is_nil() {
            return Err(ClusterIdError::Nil);
        }
        Ok(ClusterId(id))
    }

    /// The 16 bytes, in text order.
    pub fn to_bytes(self) -> [u8; CLUSTER_ID_BYTES] {
        self.0.into_bytes()
    }

    /// Parses the text form (upper- or lower-case hex; only the hyphenated
    /// form, not the braced, URN or 32-digit ones).
    ///
    /// # Errors
    /// [`ClusterIdError`] for anything but a non-nil `8-4-4-4-12` UUID.
    pub fn parse(text: &str) -> Result<ClusterId, ClusterIdError> {
        let not_uuid = || ClusterIdError::NotUuid(text.chars().take(64).collect());
        if text.len() != TEXT_LEN {
            return Err(not_uuid());
        }
        let id = uuid::Uuid::try_parse(text).map_err(|_| not_uuid())?;
        ClusterId::from_bytes(id.into_bytes())
    }
}

impl fmt::Display for ClusterId {
    /// The hyphenated lower-case form.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0.hyphenated(), f)
    }
}

impl FromStr for ClusterId {
    type Err = ClusterIdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ClusterId::parse(s)
    }
}

impl Serialize for ClusterId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ClusterId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        ClusterId::parse(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn text_form_is_a_version_4_uuid_and_round_trips() {
        let id = ClusterId::from_random([0xff; 16]);
        assert_eq!(id.to_string(), "ffffffff-ffff-4fff-bfff-ffffffffffff");
        let id = ClusterId::from_random([0; 16]);
        assert_eq!(id.to_string(), "00000000-0000-4000-8000-000000000000");
        assert_eq!(ClusterId::parse(&id.to_string()), Ok(id));
        assert_eq!(
            ClusterId::parse("0A1B2C3D-0000-4000-8000-00000000000F")
                .unwrap()
                .to_string(),
            "0a1b2c3d-0000-4000-8000-00000000000f"
        );
        let json = serde_json::to_value(id).unwrap();
        assert_eq!(json, serde_json::json!(id.to_string()));
        assert_eq!(serde_json::from_value::<ClusterId>(json).unwrap(), id);
    }

    #[test]
    fn bad_text_and_the_nil_id_are_refused() {
        for bad in [
            "",
            "00000000-0000-4000-8000-00000000000",
            "00000000-0000-4000-8000-0000000000000",
            "00000000+0000-4000-8000-000000000000",
            "0000000g-0000-4000-8000-000000000000",
            "000000000000-4000-8000-000000000000-",
            "éééééééé-0000-4000-8000-0000000000",
            // Other UUID forms than the hyphenated one.
            "00000000000040008000000000000001",
            "{00000000-0000-4000-8000-000000000001}",
            "urn:uuid:00000000-0000-4000-8000-000000000001",
        ] {
            assert!(
                matches!(ClusterId::parse(bad), Err(ClusterIdError::NotUuid(_))),
                "{bad:?}"
            );
        }
        assert_eq!(
            ClusterId::parse("00000000-0000-0000-0000-000000000000"),
            Err(ClusterIdError::Nil)
        );
        assert_eq!(ClusterId::from_bytes([0; 16]), Err(ClusterIdError::Nil));
        assert!(serde_json::from_value::<ClusterId>(serde_json::json!(7)).is_err());
    }

    proptest! {
        #[test]
        fn any_non_nil_bytes_round_trip(bytes in any::<[u8; 16]>()) {
            prop_assume!(bytes != [0; 16]);
            let id = ClusterId::from_bytes(bytes).unwrap();
            prop_assert_eq!(id.to_bytes(), bytes);
            prop_assert_eq!(ClusterId::parse(&id.to_string()), Ok(id));
        }

        #[test]
        fn parsing_text_never_panics(text in ".{0,40}") {
            let _ = ClusterId::parse(&text);
        }
    }
}
