//! What a broker does with its local copy of a topic when it opens the
//! topic as owner at epoch `E`, and with copies of topics another broker
//! owns.
//!
//! Each local WAL has an ownership marker,
//! `{data_dir}/ownership/{ns}/{topic}` (JSON `{"epoch": E}`, written
//! atomically), naming the epoch under which it was written. Opening as
//! owner at epoch `E` ([`decide`]):
//!
//! | local WAL | marker | action |
//! |---|---|---|
//! | none or empty | any | start fresh at the topic's start offset |
//! | holds data | `E` | resume it (a restart within the same ownership) |
//! | holds data | none, `E == 1` | adopt it: data from before ownership existed, and nobody else ever owned the topic |
//! | holds data | other, or none with `E > 1` | quarantine it, start fresh |
//!
//! The **start offset** of a fresh WAL is the end of the topic's committed
//! archive (`segments/cur`) or the `state` marker's `next_offset` after a
//! graceful unload, whichever is higher: nothing below it is lost (it is in
//! the archive) and an edge re-sends everything above it from its retained
//! log ("two copies until archived"), with the same offsets and bytes.
//!
//! A quarantined copy is moved to
//! `{data_dir}/quarantine/{ns}/{topic}.epoch-{e}.{ms}`: never served,
//! uploaded or resumed, kept for an operator to inspect or delete.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use broker_core::metadata::MetadataStore;
use broker_core::wal::storage::{FsStorage, Storage, write_file_atomic};
use serde::{Deserialize, Serialize};
use tributary_proto::keys::{StorageKeys, TopicName};

/// The marker's content.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnershipMarker {
    /// The epoch the local WAL was written under.
    pub epoch: u64,
}

/// What to do with the local copy when opening at an epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Open the local WAL as it is.
    Resume,
    /// Open the local WAL (pre-ownership data) and mark it.
    Adopt,
    /// No local data: create the WAL at the start offset.
    Fresh,
    /// Move the local copy (written under `stale_epoch`, `None`: unmarked)
    /// aside, then start fresh.
    Quarantine {
        /// The marker's epoch.
        stale_epoch: Option<u64>,
    },
}

/// The table in the module docs.
pub fn decide(has_data: bool, marker: Option<u64>, epoch: u64) -> Decision {
    match (has_data, marker) {
        (false, _) => Decision::Fresh,
        (true, Some(e)) if e == epoch => Decision::Resume,
        (true, None) if epoch == 1 => Decision::Adopt,
        (true, stale_epoch) => Decision::Quarantine { stale_epoch },
    }
}

/// Paths of a broker's ownership markers and quarantine.
///
/// The set of marked topics is read from disk once and then kept in
/// memory, updated by [`Layout::write_marker`] and [`Layout::quarantine`]
/// (the only writers of markers): [`Layout::marked_topics`] runs on every
/// ownership change, and with thousands of topics a directory scan and a
/// file read per topic each time made a fleet's first contact quadratic.
#[derive(Debug, Clone)]
pub struct Layout {
    /// `{data_dir}/topics`.
    pub topics: PathBuf,
    /// `{data_dir}/ownership`.
    pub markers: PathBuf,
    /// `{data_dir}/quarantine`.
    pub quarantine: PathBuf,
    /// Marked topics and their epochs; `None` until first read from disk.
    marked: Arc<Mutex<Option<BTreeMap<TopicName, u64>>>>,
}

impl Layout {
    /// The layout beside the topics directory `topics_dir`.
    pub fn beside(topics_dir: &Path) -> Layout {
        let root = topics_dir.parent().unwrap_or(topics_dir).to_path_buf();
        Layout {
            topics: topics_dir.to_path_buf(),
            markers: root.join("ownership"),
            quarantine: root.join("quarantine"),
            marked: Arc::default(),
        }
    }

    fn wal_dir(&self, topic: &TopicName) -> PathBuf {
        self.topics.join(topic.namespace()).join(topic.topic())
    }

    fn marker_path(&self, topic: &TopicName) -> PathBuf {
        self.markers.join(topic.namespace()).join(topic.topic())
    }

    /// Whether the local WAL directory holds any segment file.
    pub fn has_data(&self, topic: &TopicName) -> bool {
        std::fs::read_dir(self.wal_dir(topic)).is_ok_and(|entries| {
            entries.flatten().any(|e| {
                matches!(
                    broker_core::wal::segment::parse_file_name(&e.file_name().to_string_lossy()),
                    Some(broker_core::wal::segment::WalFile::Log(_))
                )
            })
        })
    }

    /// The marker's epoch, if a readable marker exists.
    pub fn marker(&self, topic: &TopicName) -> Option<u64> {
        let bytes = std::fs::read(self.marker_path(topic)).ok()?;
        match serde_json::from_slice::<OwnershipMarker>(&bytes) {
            Ok(marker) => Some(marker.epoch),
            Err(e) => {
                tracing::warn!(%topic, error = %e, "ownership marker does not decode; treating the local copy as unmarked");
                None
            }
        }
    }

    /// Writes the marker for `epoch` (atomically, durable).
    ///
    /// # Errors
    /// I/O errors.
    pub fn write_marker(&self, topic: &TopicName, epoch: u64) -> std::io::Result<()> {
        let path = self.marker_path(topic);
        let storage = FsStorage;
        if let Some(parent) = path.parent() {
            storage.create_dir_all(parent)?;
        }
        let bytes = serde_json::to_vec(&OwnershipMarker { epoch }).unwrap_or_default();
        write_file_atomic(&storage, &path, &bytes)?;
        if let Some(marked) = self.marked_cache().as_mut() {
            marked.insert(topic.clone(), epoch);
        }
        Ok(())
    }

    fn marked_cache(&self) -> std::sync::MutexGuard<'_, Option<BTreeMap<TopicName, u64>>> {
        self.marked.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Moves the local WAL of `topic` into the quarantine and removes its
    /// marker; returns where it went.
    ///
    /// # Errors
    /// I/O errors.
    pub fn quarantine(
        &self,
        topic: &TopicName,
        stale_epoch: Option<u64>,
        now_ms: u64,
    ) -> std::io::Result<PathBuf> {
        let storage = FsStorage;
        let dir = self.quarantine.join(topic.namespace());
        storage.create_dir_all(&dir)?;
        let to = dir.join(format!(
            "{}.epoch-{}.{now_ms}",
            topic.topic(),
            stale_epoch.map_or_else(|| "none".to_owned(), |e| e.to_string())
        ));
        let from = self.wal_dir(topic);
        storage.rename(&from, &to)?;
        storage.sync_dir(&dir)?;
        if let Some(parent) = from.parent() {
            storage.sync_dir(parent)?;
        }
        let marker = self.marker_path(topic);
        if marker.exists() {
            storage.remove(&marker)?;
        }
        if let Some(marked) = self.marked_cache().as_mut() {
            marked.remove(topic);
        }
        Ok(to)
    }

    /// Every topic with a marker (and so a local WAL directory), with its
    /// epoch: read from disk on the first call, from memory after.
    pub fn marked_topics(&self) -> Vec<(TopicName, u64)> {
        let mut marked = self.marked_cache();
        let marked = marked.get_or_insert_with(|| self.scan_marked_topics().into_iter().collect());
        marked.iter().map(|(t, e)| (t.clone(), *e)).collect()
    }

    /// [`Layout::marked_topics`] from the marker files.
    fn scan_marked_topics(&self) -> Vec<(TopicName, u64)> {
        let mut out = Vec::new();
        let Ok(namespaces) = std::fs::read_dir(&self.markers) else {
            return out;
        };
        for ns in namespaces.flatten() {
            let Ok(files) = std::fs::read_dir(ns.path()) else {
                continue;
            };
            for file in files.flatten() {
                let name = format!(
                    "/{}/{}",
                    ns.file_name().to_string_lossy(),
                    file.file_name().to_string_lossy()
                );
                if let Ok(topic) = TopicName::new(&name)
                    && let Some(epoch) = self.marker(&topic)
                {
                    out.push((topic, epoch));
                }
            }
        }
        out
    }

    /// Every topic with a local WAL holding data but no marker (written
    /// before ownership existed).
    pub fn unmarked_topics(&self) -> Vec<TopicName> {
        let mut out = Vec::new();
        let Ok(namespaces) = std::fs::read_dir(&self.topics) else {
            return out;
        };
        for ns in namespaces.flatten() {
            let Ok(dirs) = std::fs::read_dir(ns.path()) else {
                continue;
            };
            for dir in dirs.flatten() {
                let name = format!(
                    "/{}/{}",
                    ns.file_name().to_string_lossy(),
                    dir.file_name().to_string_lossy()
                );
                if let Ok(topic) = TopicName::new(&name)
                    && self.has_data(&topic)
                    && self.marker(&topic).is_none()
                {
                    out.push(topic);
                }
            }
        }
        out
    }
}

/// Where a fresh WAL of `topic` starts: the committed archive's end or the
/// unload `state`'s `next_offset`, whichever is higher (0 for a new topic).
///
/// # Errors
/// Metadata errors, a malformed `segments/cur` or `state`.
pub async fn start_offset(
    store: &dyn MetadataStore,
    keys: &StorageKeys,
    topic: &TopicName,
) -> Result<u64, crate::storage::StorageError> {
    let archived = crate::storage::tiered_offset(store, keys, topic)
        .await?
        .unwrap_or(0);
    let unloaded = match store.get(&keys.topic_state(topic)).await? {
        Some(v) => v["next_offset"].as_u64().unwrap_or(0),
        None => 0,
    };
    Ok(archived.max(unloaded))
}

#[cfg(test)]
mod tests {
    use super::{Decision, Layout, decide};
    use tributary_proto::keys::TopicName;

    #[test]
    fn marked_topics_follow_markers_written_and_quarantined_and_survive_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let topics_dir = dir.path().join("topics");
        let (a, b) = (
            TopicName::new("/plant1/a").unwrap(),
            TopicName::new("/plant1/b").unwrap(),
        );
        let layout = Layout::beside(&topics_dir);
        assert_eq!(layout.marked_topics(), vec![]);
        for topic in [&a, &b] {
            std::fs::create_dir_all(topics_dir.join("plant1").join(topic.topic())).unwrap();
        }
        layout.write_marker(&a, 3).unwrap();
        layout.write_marker(&b, 1).unwrap();
        layout.write_marker(&b, 2).unwrap();
        assert_eq!(layout.marked_topics(), vec![(a.clone(), 3), (b.clone(), 2)]);
        layout.quarantine(&a, Some(3), 7).unwrap();
        assert_eq!(layout.marked_topics(), vec![(b.clone(), 2)]);
        // A restarted broker reads the same set from the marker files.
        assert_eq!(Layout::beside(&topics_dir).marked_topics(), vec![(b, 2)]);
    }

    #[test]
    fn the_local_copy_is_resumed_only_under_its_own_epoch() {
        assert_eq!(decide(false, None, 4), Decision::Fresh);
        assert_eq!(decide(false, Some(2), 4), Decision::Fresh);
        assert_eq!(decide(true, Some(4), 4), Decision::Resume);
        assert_eq!(decide(true, None, 1), Decision::Adopt);
        assert_eq!(
            decide(true, None, 2),
            Decision::Quarantine { stale_epoch: None }
        );
        assert_eq!(
            decide(true, Some(3), 4),
            Decision::Quarantine {
                stale_epoch: Some(3)
            }
        );
        // A marker above the assignment's epoch (a view that lags) is not
        // this ownership either.
        assert_eq!(
            decide(true, Some(5), 4),
            Decision::Quarantine {
                stale_epoch: Some(5)
            }
        );
    }
}
