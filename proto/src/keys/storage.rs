//! [`StorageKeys`]: the paths under the configured storage prefix (segment
//! descriptors, `segments/cur`, topic state, retired mark, missing-object
//! marks) and the object
//! keys of segment objects.

use super::metadata_key::{padded, topic_in};
use super::names::{check_len, check_part};
use super::{
    DEFAULT_STORAGE_PREFIX, KeyParseError, NameError, NameErrorKind, NamePart,
    SEGMENT_OBJECT_SUFFIX, TopicName,
};

/// Last part of the pointer to the latest published segment descriptor.
const SEGMENTS_CUR: &str = "cur";

/// A key under the storage prefix.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum StorageKey {
    /// `{prefix}/storage/topics/{ns}/{topic}/segments/{start:020}`: durable
    /// segment descriptor.
    SegmentDescriptor {
        /// Topic.
        topic: TopicName,
        /// First offset of the segment.
        start_offset: u64,
    },
    /// `{prefix}/storage/topics/{ns}/{topic}/segments/cur`: pointer to the
    /// latest published descriptor.
    SegmentsCur {
        /// Topic.
        topic: TopicName,
    },
    /// `{prefix}/storage/topics/{ns}/{topic}/state`: sealed mobility marker.
    TopicState {
        /// Topic.
        topic: TopicName,
    },
    /// `{prefix}/storage/topics/{ns}/{topic}/retired`: cold-retention low
    /// mark, `{"below_offset": N}`: offsets below N were removed from the
    /// archive on purpose (descriptor and object).
    Retired {
        /// Topic.
        topic: TopicName,
    },
    /// `{prefix}/storage/topics/{ns}/{topic}/missing/{start:020}`: the
    /// archive audit found the object of the committed descriptor at
    /// `start` missing or damaged (cleared once it is uploaded again).
    Missing {
        /// Topic.
        topic: TopicName,
        /// Start offset of the descriptor whose object is missing.
        start_offset: u64,
    },
    /// `{prefix}/storage/topics/{ns}/{topic}/lakehouse`: the lakehouse
    /// writer's progress, `{"next_offset": N, "layout": ...}`: every record
    /// of the committed segments below N is in the topic's Parquet files.
    Lakehouse {
        /// Topic.
        topic: TopicName,
    },
}

/// A parsed segment object key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SegmentObject {
    /// Topic.
    pub topic: TopicName,
    /// First offset in the segment.
    pub start_offset: u64,
    /// Last offset in the segment (inclusive), `>= start_offset`.
    pub end_offset: u64,
}

/// Storage paths and object keys under a configured prefix (default
/// [`DEFAULT_STORAGE_PREFIX`]).
///
/// The prefix is `/` followed by one or more valid names separated by `/`,
/// no trailing `/`, at most [`super::MAX_NAME_BYTES`] bytes; e.g. `/tributary` or
/// `/prod/tributary`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StorageKeys {
    /// Invariant: valid per the rules above.
    prefix: String,
}

impl Default for StorageKeys {
    fn default() -> Self {
        StorageKeys {
            prefix: DEFAULT_STORAGE_PREFIX.to_owned(),
        }
    }
}

impl StorageKeys {
    /// Validates `prefix`.
    ///
    /// # Errors
    /// [`NameError`] with `what = StoragePrefix`.
    pub fn new(prefix: &str) -> Result<StorageKeys, NameError> {
        let fail = |kind| NameError::new(NamePart::StoragePrefix, prefix, kind);
        check_len(NamePart::StoragePrefix, prefix).map_err(fail)?;
        let Some(rest) = prefix.strip_prefix('/') else {
            return Err(fail(NameErrorKind::MissingLeadingSlash {
                part: NamePart::StoragePrefix,
            }));
        };
        for part in rest.split('/') {
            if part.is_empty() && !rest.is_empty() {
                return Err(fail(NameErrorKind::EmptyComponent {
                    part: NamePart::StoragePrefix,
                }));
            }
            check_part(NamePart::StoragePrefix, part).map_err(fail)?;
        }
        Ok(StorageKeys {
            prefix: prefix.to_owned(),
        })
    }

    /// The prefix, e.g. `/tributary`.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// `{prefix}/storage/topics/{ns}/{topic}`.
    fn topic_root(&self, topic: &TopicName) -> String {
        format!("{}/storage/topics{topic}", self.prefix)
    }

    /// `{prefix}/storage/topics/{ns}/{topic}/segments/{start:020}`.
    pub fn segment_descriptor(&self, topic: &TopicName, start_offset: u64) -> String {
        self.key(&StorageKey::SegmentDescriptor {
            topic: topic.clone(),
            start_offset,
        })
    }

    /// `{prefix}/storage/topics/{ns}/{topic}/segments/cur`.
    pub fn segments_cur(&self, topic: &TopicName) -> String {
        self.key(&StorageKey::SegmentsCur {
            topic: topic.clone(),
        })
    }

    /// `{prefix}/storage/topics/{ns}/{topic}/segments/`: lists the
    /// descriptors in offset order, followed by `cur`.
    pub fn segments_prefix(&self, topic: &TopicName) -> String {
        format!("{}/segments/", self.topic_root(topic))
    }

    /// `{prefix}/storage/topics/{ns}/{topic}/state`.
    pub fn topic_state(&self, topic: &TopicName) -> String {
        self.key(&StorageKey::TopicState {
            topic: topic.clone(),
        })
    }

    /// `{prefix}/storage/topics/{ns}/{topic}/retired`.
    pub fn retired(&self, topic: &TopicName) -> String {
        self.key(&StorageKey::Retired {
            topic: topic.clone(),
        })
    }

    /// `{prefix}/storage/topics/{ns}/{topic}/missing/{start:020}`: the
    /// archive audit's mark for the descriptor at `start_offset` whose
    /// object is missing or damaged.
    pub fn missing(&self, topic: &TopicName, start_offset: u64) -> String {
        self.key(&StorageKey::Missing {
            topic: topic.clone(),
            start_offset,
        })
    }

    /// `{prefix}/storage/topics/{ns}/{topic}/lakehouse`: the lakehouse
    /// writer's progress.
    pub fn lakehouse(&self, topic: &TopicName) -> String {
        self.key(&StorageKey::Lakehouse {
            topic: topic.clone(),
        })
    }

    /// `{prefix}/lakehouse/{ns}/{topic}/` without the leading `/`: every
    /// Parquet object the lakehouse writer made for a topic.
    pub fn lakehouse_objects_prefix(&self, topic: &TopicName) -> String {
        format!("{}/lakehouse{topic}/", self.object_prefix())
    }

    /// The Parquet object of the records dated `date` (`YYYY-MM-DD`, UTC)
    /// of the segment `start_offset..=end_offset`:
    /// `{prefix}/lakehouse/{ns}/{topic}/date={date}/{start:020}-{end:020}.parquet`
    /// without the leading `/` (a Hive-style partition).
    pub fn lakehouse_object(
        &self,
        topic: &TopicName,
        date: &str,
        start_offset: u64,
        end_offset: u64,
    ) -> String {
        format!(
            "{}date={date}/{start_offset:020}-{end_offset:020}.parquet",
            self.lakehouse_objects_prefix(topic)
        )
    }

    /// The Parquet object of the records of segment
    /// `start_offset..=end_offset` that did not fit the topic's typed
    /// columns: `{prefix}/lakehouse/{ns}/{topic}/_rejected/{start:020}-{end:020}.parquet`
    /// (a leading `_` keeps it out of Hive-style dataset reads).
    pub fn lakehouse_rejected_object(
        &self,
        topic: &TopicName,
        start_offset: u64,
        end_offset: u64,
    ) -> String {
        format!(
            "{}_rejected/{start_offset:020}-{end_offset:020}.parquet",
            self.lakehouse_objects_prefix(topic)
        )
    }

    /// `{prefix}/storage/topics/{ns}/{topic}/missing/`: lists the missing
    /// marks in offset order.
    pub fn missing_prefix(&self, topic: &TopicName) -> String {
        format!("{}/missing/", self.topic_root(topic))
    }

    /// Builds a storage key.
    pub fn key(&self, key: &StorageKey) -> String {
        match key {
            StorageKey::SegmentDescriptor {
                topic,
                start_offset,
            } => format!("{}/segments/{start_offset:020}", self.topic_root(topic)),
            StorageKey::SegmentsCur { topic } => {
                format!("{}/segments/{SEGMENTS_CUR}", self.topic_root(topic))
            }
            StorageKey::TopicState { topic } => format!("{}/state", self.topic_root(topic)),
            StorageKey::Retired { topic } => format!("{}/retired", self.topic_root(topic)),
            StorageKey::Missing {
                topic,
                start_offset,
            } => format!("{}/missing/{start_offset:020}", self.topic_root(topic)),
            StorageKey::Lakehouse { topic } => format!("{}/lakehouse", self.topic_root(topic)),
        }
    }

    /// The value stored at `segments/cur`: the padded start offset of the
    /// latest descriptor (the last part of its key).
    pub fn segments_cur_value(start_offset: u64) -> String {
        format!("{start_offset:020}")
    }

    /// Parses the value stored at `segments/cur`.
    ///
    /// # Errors
    /// [`KeyParseError::Number`] unless it is 20 digits.
    pub fn parse_segments_cur_value(value: &str) -> Result<u64, KeyParseError> {
        padded(value, "start_offset", value)
    }

    /// Parses a key under this prefix; the inverse of [`StorageKeys::key`].
    ///
    /// # Errors
    /// [`KeyParseError`] when the key is not under this prefix's
    /// `storage/topics/`, or malformed.
    pub fn parse(&self, key: &str) -> Result<StorageKey, KeyParseError> {
        let unknown = || KeyParseError::Unknown {
            key: key.to_owned(),
            expected: "storage",
        };
        let rest = key
            .strip_prefix(self.prefix.as_str())
            .and_then(|r| r.strip_prefix("/storage/topics/"))
            .ok_or_else(unknown)?;
        let parts: Vec<&str> = rest.split('/').collect();
        match parts.as_slice() {
            [ns, topic, "segments", "cur"] => Ok(StorageKey::SegmentsCur {
                topic: topic_in(key, ns, topic)?,
            }),
            [ns, topic, "segments", start] => Ok(StorageKey::SegmentDescriptor {
                topic: topic_in(key, ns, topic)?,
                start_offset: padded(key, "start_offset", start)?,
            }),
            [ns, topic, "state"] => Ok(StorageKey::TopicState {
                topic: topic_in(key, ns, topic)?,
            }),
            [ns, topic, "retired"] => Ok(StorageKey::Retired {
                topic: topic_in(key, ns, topic)?,
            }),
            [ns, topic, "missing", start] => Ok(StorageKey::Missing {
                topic: topic_in(key, ns, topic)?,
                start_offset: padded(key, "start_offset", start)?,
            }),
            [ns, topic, "lakehouse"] => Ok(StorageKey::Lakehouse {
                topic: topic_in(key, ns, topic)?,
            }),
            _ => Err(unknown()),
        }
    }

    /// Topic and start offset of a descriptor key (not `segments/cur`).
    ///
    /// # Errors
    /// [`KeyParseError`] when the key is not a descriptor key.
    pub fn parse_segment_descriptor(&self, key: &str) -> Result<(TopicName, u64), KeyParseError> {
        match self.parse(key)? {
            StorageKey::SegmentDescriptor {
                topic,
                start_offset,
            } => Ok((topic, start_offset)),
            _ => Err(KeyParseError::Unknown {
                key: key.to_owned(),
                expected: "segment descriptor",
            }),
        }
    }

    /// The object-store form of the prefix: without its leading `/`.
    fn object_prefix(&self) -> &str {
        // The prefix starts with '/' by the struct invariant.
        &self.prefix[1..]
    }

    /// `{prefix}/cluster-owner.json` without the leading `/`: the object
    /// naming the cluster that owns the archive under the prefix
    /// (`docs/archive-format.md`, "Prefix owner"). Outside `storage/` and
    /// `lakehouse/`, so no topic or segment key can be it.
    pub fn owner_object(&self) -> String {
        format!("{}/cluster-owner.json", self.object_prefix())
    }

    /// `{prefix}/storage/topics/` without the leading `/`: the root of
    /// every segment object, for browsing a bucket.
    pub fn objects_root(&self) -> String {
        format!("{}/storage/topics/", self.object_prefix())
    }

    /// `{prefix}/storage/topics/{ns}/{topic}/segments/` without the leading
    /// `/`: every segment object of a topic, in offset order.
    pub fn segment_objects_prefix(&self, topic: &TopicName) -> String {
        format!("{}/storage/topics{topic}/segments/", self.object_prefix())
    }

    /// The object key of the segment holding offsets `start_offset..=end_offset`:
    /// `{prefix}/storage/topics/{ns}/{topic}/segments/{start:020}-{end:020}.seg`
    /// without the leading `/`.
    ///
    /// # Panics
    /// If `end_offset < start_offset`: a segment holds at least one record,
    /// and both offsets come from a sealed segment, so this is a caller bug.
    pub fn segment_object(&self, topic: &TopicName, start_offset: u64, end_offset: u64) -> String {
        assert!(
            start_offset <= end_offset,
            "segment end offset {end_offset} below start offset {start_offset}"
        );
        format!(
            "{}{start_offset:020}-{end_offset:020}{SEGMENT_OBJECT_SUFFIX}",
            self.segment_objects_prefix(topic)
        )
    }

    /// Parses a segment object key under this prefix.
    ///
    /// # Errors
    /// [`KeyParseError`] when the key is not a segment object key of this
    /// prefix, an offset is not 20 digits, or `end < start`.
    pub fn parse_segment_object(&self, key: &str) -> Result<SegmentObject, KeyParseError> {
        let unknown = || KeyParseError::Unknown {
            key: key.to_owned(),
            expected: "segment object",
        };
        let rest = key
            .strip_prefix(self.object_prefix())
            .and_then(|r| r.strip_prefix("/storage/topics/"))
            .ok_or_else(unknown)?;
        let parts: Vec<&str> = rest.split('/').collect();
        let [ns, topic, "segments", file] = parts.as_slice() else {
            return Err(unknown());
        };
        let range = file
            .strip_suffix(SEGMENT_OBJECT_SUFFIX)
            .ok_or_else(unknown)?;
        let (start, end) = range.split_once('-').ok_or_else(unknown)?;
        let topic = topic_in(key, ns, topic)?;
        let start_offset = padded(key, "start_offset", start)?;
        let end_offset = padded(key, "end_offset", end)?;
        if end_offset < start_offset {
            return Err(KeyParseError::SegmentRange {
                key: key.to_owned(),
                start: start_offset,
                end: end_offset,
            });
        }
        Ok(SegmentObject {
            topic,
            start_offset,
            end_offset,
        })
    }
}
