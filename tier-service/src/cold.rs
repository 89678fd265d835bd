//! Cold retention: optional limits on how long and how much of a topic's
//! archive is kept (`[cold_retention]` in the configuration).
//!
//! ```toml
//! [cold_retention]
//! max_age_ms = 2592000000          # every topic: 30 days (default: keep forever)
//! # max_bytes = 1099511627776      # every topic: archived bytes
//! [cold_retention.topics."/plant1/events"]
//! max_age_ms = 604800000           # this topic: 7 days (replaces the defaults)
//! ```
//!
//! A segment is removed when its newest record (`max_timestamp_ms`) is
//! older than `max_age_ms`, or while the topic's archived bytes exceed
//! `max_bytes`; oldest first, and never the newest segment (`segments/cur`,
//! which defines the tiered offset).
//!
//! Order: **descriptor first, then object.** The broker deletes the
//! descriptor and raises the topic's `retired` low mark in one Raft
//! transaction (`DELETE /v1/storage/topics/{ns}/{topic}/segments/{start}`);
//! then the object is deleted. So a descriptor never points at an object
//! that retention deleted. A crash between the two leaves an object below
//! the low mark with no descriptor: reconciliation deletes it (it is never
//! adopted: the broker refuses descriptors below the low mark), and the
//! tiering pass never uploads a local segment below it again.

use std::collections::BTreeMap;

use serde::Deserialize;
use tracing::info;
use tributary_proto::archive::SegmentDescriptor;
use tributary_proto::keys::TopicName;

use crate::error::TierError;
use crate::tiering::Tiering;

/// Limits for one topic's archive. Both `None`: keep everything.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ColdLimits {
    /// Remove segments whose newest record is older than this, ms.
    #[serde(default)]
    pub max_age_ms: Option<u64>,
    /// Remove the oldest segments while the archive holds more than this,
    /// bytes (object sizes).
    #[serde(default)]
    pub max_bytes: Option<u64>,
}

/// `[cold_retention]`: default limits and per-topic replacements.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ColdRetention {
    /// Remove segments whose newest record is older than this, ms.
    #[serde(default)]
    pub max_age_ms: Option<u64>,
    /// Remove the oldest segments while a topic's archive holds more than
    /// this, bytes.
    #[serde(default)]
    pub max_bytes: Option<u64>,
    /// Per topic (`/ns/topic`): limits that replace the defaults.
    #[serde(default)]
    pub topics: BTreeMap<String, ColdLimits>,
}

impl ColdRetention {
    /// The limits that apply to `topic`.
    pub fn limits_for(&self, topic: &TopicName) -> ColdLimits {
        self.topics
            .get(topic.as_str())
            .copied()
            .unwrap_or(ColdLimits {
                max_age_ms: self.max_age_ms,
                max_bytes: self.max_bytes,
            })
    }

    /// Checks the per-topic names.
    ///
    /// # Errors
    /// [`TierError::Config`] naming a key that is not a topic name.
    pub fn validate(&self) -> Result<(), TierError> {
        for name in self.topics.keys() {
            TopicName::new(name)
                .map_err(|e| TierError::Config(format!("cold_retention.topics.{name:?}: {e}")))?;
        }
        Ok(())
    }
}

/// Start offsets of the descriptors to remove, oldest first: pure, so the
/// rule is tested without I/O. `descriptors` are in offset order; the last
/// one is never selected.
pub fn select(descriptors: &[SegmentDescriptor], limits: ColdLimits, now_ms: i64) -> Vec<u64> {
    let mut total: u64 = descriptors.iter().map(|d| d.size).sum();
    let mut out = Vec::new();
    for d in descriptors.iter().take(descriptors.len().saturating_sub(1)) {
        let over_size = limits.max_bytes.is_some_and(|max| total > max);
        let over_age = limits.max_age_ms.is_some_and(|age| {
            now_ms.saturating_sub(d.max_timestamp_ms) > i64::try_from(age).unwrap_or(i64::MAX)
        });
        if !over_size && !over_age {
            break;
        }
        out.push(d.start_offset);
        total -= d.size;
    }
    out
}

/// Applies `topic`'s limits: for each selected segment, removes the
/// descriptor (broker, Raft), then the object. Returns the removed object
/// keys.
///
/// # Errors
/// The first failing step after its retries (what was removed before stays
/// removed; the next pass continues).
pub async fn apply(
    tiering: &Tiering,
    topic: &TopicName,
    descriptors: &[SegmentDescriptor],
    now_ms: i64,
) -> Result<Vec<String>, TierError> {
    let limits = tiering.cold.limits_for(topic);
    let mut removed = Vec::new();
    for start in select(descriptors, limits, now_ms) {
        let Some(d) = descriptors.iter().find(|d| d.start_offset == start) else {
            continue;
        };
        tiering
            .retry("retire descriptor", || tiering.broker.retire(topic, start))
            .await?;
        tiering.faults.hit("retention_after_descriptor_delete");
        tiering
            .retry("delete retired object", || {
                tiering.bucket.delete(&d.object_id)
            })
            .await?;
        info!(%topic, key = d.object_id, start = d.start_offset, end = d.end_offset, bytes = d.size, "cold retention removed a segment");
        removed.push(d.object_id.clone());
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(start: u64, size: u64, max_ts: i64) -> SegmentDescriptor {
        SegmentDescriptor {
            start_offset: start,
            end_offset: start + 9,
            record_count: 10,
            size,
            object_id: format!("k{start}"),
            format_version: 1,
            checksum_crc32c: 0,
            batches_crc32c: 0,
            batches_bytes: size / 2,
            index_position: size / 2,
            index_bytes: 16,
            first_timestamp_ms: max_ts - 5,
            max_timestamp_ms: max_ts,
            created_at_ms: 0,
        }
    }

    #[test]
    fn selects_oldest_first_and_never_the_newest() {
        let all = [d(0, 100, 1000), d(10, 100, 2000), d(20, 100, 3000)];
        let none = ColdLimits::default();
        assert_eq!(select(&all, none, 10_000), Vec::<u64>::new());
        let age = ColdLimits {
            max_age_ms: Some(1500),
            max_bytes: None,
        };
        // now 3600: ages 2600, 1600, 600.
        assert_eq!(select(&all, age, 3600), vec![0, 10]);
        // Everything expired: the newest stays.
        assert_eq!(select(&all, age, 1_000_000), vec![0, 10]);
        let size = ColdLimits {
            max_age_ms: None,
            max_bytes: Some(150),
        };
        assert_eq!(select(&all, size, 0), vec![0, 10]);
        let size = ColdLimits {
            max_age_ms: None,
            max_bytes: Some(200),
        };
        assert_eq!(select(&all, size, 0), vec![0]);
        // Stops at the first segment within both limits.
        let mixed = [d(0, 100, 5000), d(10, 100, 1000)];
        assert_eq!(select(&mixed, age, 6000), Vec::<u64>::new());
        assert_eq!(select(&[], age, 6000), Vec::<u64>::new());
    }

    #[test]
    fn topic_limits_replace_the_defaults() {
        let config: ColdRetention =
            toml::from_str("max_age_ms = 100\n[topics.\"/a/b\"]\nmax_bytes = 5\n").unwrap();
        config.validate().unwrap();
        let ab = TopicName::new("/a/b").unwrap();
        let other = TopicName::new("/a/c").unwrap();
        assert_eq!(
            config.limits_for(&ab),
            ColdLimits {
                max_age_ms: None,
                max_bytes: Some(5)
            }
        );
        assert_eq!(config.limits_for(&other).max_age_ms, Some(100));
        let bad: ColdRetention = toml::from_str("[topics.\"nope\"]\nmax_bytes = 5\n").unwrap();
        assert!(bad.validate().is_err());
        assert!(toml::from_str::<ColdRetention>("max_agee_ms = 1\n").is_err());
    }
}
