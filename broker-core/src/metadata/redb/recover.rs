//! Opening a store that may be damaged: [`RedbStore::open_or_recover`]
//! moves a damaged file aside (`<file>.damaged-<unix seconds>`) and starts
//! a fresh, empty store, so its owner can rebuild what it keeps there from
//! what remains true. The owner decides what that is and says so; the
//! [`StoreOpenReport`] tells it what happened.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ::redb::{ReadableDatabase, ReadableTable};
use tracing::warn;

use super::{KV, RedbStore, backend, decode, open::classify};
use crate::clock::Clock;
use crate::metadata::MetadataError;

/// What [`RedbStore::open_or_recover`] found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreOpenReport {
    /// The store's file.
    pub path: PathBuf,
    /// Whether the store is new: the file did not exist (first start, or
    /// deleted), held no tables yet, or replaced a damaged file. A new
    /// store holds no key.
    pub created: bool,
    /// Where the damaged file was moved, `<file>.damaged-<unix seconds>`
    /// (`-<n>` appended if that name is taken). `None` if it was not
    /// damaged.
    pub moved_aside: Option<PathBuf>,
    /// What was wrong with the damaged file.
    pub damage: Option<String>,
}

impl StoreOpenReport {
    /// Whether a damaged file was replaced by a fresh store.
    pub fn recovered(&self) -> bool {
        self.moved_aside.is_some()
    }
}

impl RedbStore {
    /// Opens the store at `path` like [`RedbStore::open`] and also decodes
    /// every stored value. If the file is damaged (redb refuses it: a bad
    /// header, a truncated or empty file, checksums that do not match; or
    /// it opens but a table or a value cannot be read), renames it to
    /// `<file>.damaged-<unix seconds of clock>` (the directory is fsynced),
    /// logs a warning naming both files and the damage, and creates a
    /// fresh store at `path`. Every key of the damaged file is then gone:
    /// the caller rebuilds what it needs and says what it rebuilt.
    ///
    /// Blocking, like [`RedbStore::open`].
    ///
    /// # Errors
    /// The errors of [`RedbStore::open`] other than
    /// [`MetadataError::Damaged`] (the file is held by another process, a
    /// full filesystem or an I/O failure at open, another format version:
    /// none of these is damage, and the file is left as it is), and
    /// [`MetadataError::Storage`] if the file cannot be moved aside.
    pub fn open_or_recover(
        path: impl AsRef<Path>,
        clock: Arc<dyn Clock>,
    ) -> Result<(RedbStore, StoreOpenReport), MetadataError> {
        let path = path.as_ref();
        let existed = std::fs::symlink_metadata(path).is_ok();
        let damage = match RedbStore::open_file(path, clock.clone()) {
            Ok((store, initialised)) => match store.check_values() {
                Ok(()) => {
                    let report = StoreOpenReport {
                        path: path.to_path_buf(),
                        created: !existed || initialised,
                        moved_aside: None,
                        damage: None,
                    };
                    return Ok((store, report));
                }
                Err(MetadataError::Damaged { reason, .. }) => reason,
                Err(MetadataError::Corrupt { key, source }) => {
                    format!("stored value of {key:?} is not JSON: {source}")
                }
                Err(other) => return Err(other),
            },
            Err(MetadataError::Damaged { reason, .. }) => reason,
            Err(other) => return Err(other),
        };
        // The damaged handle is closed (dropped above): its file can move.
        let aside = move_aside(path, clock.now_ms() / 1000)?;
        warn!(
            path = %path.display(),
            moved_to = %aside.display(),
            damage = %damage,
            "metadata store damaged: moved aside, starting a fresh store"
        );
        let (store, _) = RedbStore::open_file(path, clock)?;
        let report = StoreOpenReport {
            path: path.to_path_buf(),
            created: true,
            moved_aside: Some(aside),
            damage: Some(damage),
        };
        Ok((store, report))
    }

    /// Decodes every stored value (blocking).
    ///
    /// # Errors
    /// [`MetadataError::Corrupt`] for a value that is not JSON,
    /// [`MetadataError::Damaged`] for a table that cannot be read.
    fn check_values(&self) -> Result<(), MetadataError> {
        let path = &self.inner.path;
        let read = |e: ::redb::Error| classify(path, "read the values", e, true);
        self.inner.read_with("read the values", |db| {
            let txn = db.begin_read().map_err(backend("begin a read"))?;
            let kv = txn.open_table(KV).map_err(|e| read(e.into()))?;
            for entry in kv.iter().map_err(|e| read(e.into()))? {
                let (key, value) = entry.map_err(|e| read(e.into()))?;
                decode(key.value(), value.value())?;
            }
            Ok(())
        })
    }
}

/// Renames `path` to `<path>.damaged-<secs>` (or `…-<secs>-<n>` if taken)
/// and fsyncs the directory. Returns the new path.
fn move_aside(path: &Path, secs: u64) -> Result<PathBuf, MetadataError> {
    let storage = |op: &'static str, e: std::io::Error| MetadataError::Storage {
        path: path.to_path_buf(),
        op,
        disk_full: super::open::io_is_disk_full(&e),
        source: Box::new(e),
    };
    let base = format!("{}.damaged-{secs}", path.display());
    let mut aside = PathBuf::from(&base);
    let mut n = 1u32;
    while std::fs::symlink_metadata(&aside).is_ok() {
        aside = PathBuf::from(format!("{base}-{n}"));
        n += 1;
    }
    std::fs::rename(path, &aside).map_err(|e| storage("move the damaged file aside", e))?;
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| storage("sync the directory after moving the damaged file", e))?;
    Ok(aside)
}
