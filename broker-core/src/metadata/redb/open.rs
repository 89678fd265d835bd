//! Opening the store's file, read-only first, and reopening it after an
//! I/O failure.
//!
//! # Open
//! 1. A missing file is created (`Database::create`). An existing file is
//!    opened with redb's integrity check on open, which verifies every
//!    page's checksum and reports damage as an error instead of panicking
//!    (a panic while reading a damaged file is caught and reported as
//!    damage too, for builds where redb asserts).
//! 2. A read transaction checks the format version and reads every entry of
//!    every table.
//! 3. Only if a table or the format version is missing (a new file, or one
//!    whose first write never committed) does the open begin a write
//!    transaction. An initialised file is never written by the open
//!    itself, so it opens on a full filesystem (redb rewrites its header in
//!    place, which needs no new block).
//!
//! Errors are sorted into [`MetadataError::Damaged`] (bad header, truncated
//! or empty file, checksums, unreadable tables), [`MetadataError::Storage`]
//! (full filesystem, I/O failure), [`MetadataError::UnsupportedFormat`] and
//! [`MetadataError::InUse`] (held by another process),
//! [`MetadataError::Backend`] (a redb file format that needs an upgrade). Only `Damaged` justifies moving the file aside.
//!
//! # Reopen after an I/O failure
//! redb latches an I/O failure: every later write transaction of that
//! handle fails with "Previous I/O error occurred". The store therefore
//! marks itself for reopening after a write that failed with a
//! [`MetadataError::Storage`] error; the next write closes the handle and
//! opens the file again (redb repairs it from its last commit), so writes
//! resume by themselves once space is free. One `error!` line starts a
//! failure episode and one `info!` line ends it; the failures in between
//! are `debug!`.

use std::io::ErrorKind;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;
use std::time::Instant;

use ::redb::{
    Database, DatabaseError, Durability, ReadableDatabase, ReadableTable, StorageError,
    TableDefinition, TableError,
};
use tracing::{debug, error, info};

use super::{EXPIRY, FORMAT_VERSION, FORMAT_VERSION_KEY, Inner, KV, META};
use crate::metadata::MetadataError;

/// A database handle fresh from [`open_file`].
pub(super) struct OpenedFile {
    pub(super) db: Database,
    /// Whether the open created the file or its tables (it was missing,
    /// or initialised only now).
    pub(super) initialised: bool,
}

/// The current failure episode of a store's writes.
#[derive(Debug)]
pub(super) struct Fault {
    /// Whether the next write must reopen the file first.
    needs_reopen: bool,
    /// Whether the last failure was a full filesystem.
    disk_full: bool,
    /// Failed writes (and reopens) in this episode.
    failures: u64,
    since: Instant,
}

/// Whether an I/O error means the filesystem is full.
pub(super) fn io_is_disk_full(err: &std::io::Error) -> bool {
    matches!(
        err.kind(),
        ErrorKind::StorageFull | ErrorKind::QuotaExceeded
    )
}

/// Whether an I/O error while opening means the file's bytes are bad (not
/// a redb file, shorter than its header, unreadable sectors).
fn io_is_damage(err: &std::io::Error) -> bool {
    matches!(
        err.kind(),
        ErrorKind::InvalidData | ErrorKind::UnexpectedEof
    ) || err.raw_os_error() == Some(EIO)
}

/// `EIO` (the same number on every Linux architecture).
const EIO: i32 = 5;

fn damaged(path: &Path, reason: impl Into<String>) -> MetadataError {
    MetadataError::Damaged {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// Sorts a redb error into the store's errors (see the module doc).
/// `reading`: the error came from reading an opened file's tables, where
/// every failure but a full filesystem means damage.
pub(super) fn classify(
    path: &Path,
    op: &'static str,
    err: ::redb::Error,
    reading: bool,
) -> MetadataError {
    let storage = |disk_full: bool, source: Box<dyn std::error::Error + Send + Sync>| {
        MetadataError::Storage {
            path: path.to_path_buf(),
            op,
            disk_full,
            source,
        }
    };
    match err {
        ::redb::Error::Corrupted(reason) => damaged(path, format!("{op}: DB corrupted: {reason}")),
        ::redb::Error::Io(io) if io_is_disk_full(&io) => storage(true, Box::new(io)),
        ::redb::Error::Io(io) if reading || io_is_damage(&io) => {
            damaged(path, format!("{op}: {io}"))
        }
        ::redb::Error::Io(io) => storage(false, Box::new(io)),
        err @ (::redb::Error::PreviousIo | ::redb::Error::DatabaseClosed) => {
            storage(false, Box::new(err))
        }
        err @ (::redb::Error::TableTypeMismatch { .. }
        | ::redb::Error::TypeDefinitionChanged { .. }
        | ::redb::Error::TableIsMultimap(_)
        | ::redb::Error::TableIsNotMultimap(_)) => damaged(path, format!("{op}: {err}")),
        err => MetadataError::Backend {
            op,
            source: Box::new(err),
        },
    }
}

/// Runs `f`, reporting a panic inside redb (possible while it reads a
/// damaged file in builds with debug assertions) as damage.
fn guarded<T>(
    path: &Path,
    op: &'static str,
    f: impl FnOnce() -> Result<T, MetadataError>,
) -> Result<T, MetadataError> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(result) => result,
        Err(panic) => {
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "(no message)".to_owned());
            Err(damaged(
                path,
                format!("{op}: redb panicked reading the file: {message}"),
            ))
        }
    }
}

/// Opens the store's file at `path`, creating it if it does not exist;
/// writes only when a table is missing (see the module doc).
///
/// # Errors
/// [`MetadataError::Damaged`], [`MetadataError::Storage`],
/// [`MetadataError::UnsupportedFormat`], [`MetadataError::Backend`].
pub(super) fn open_file(path: &Path) -> Result<OpenedFile, MetadataError> {
    let exists = match std::fs::symlink_metadata(path) {
        Ok(_) => true,
        Err(e) if e.kind() == ErrorKind::NotFound => false,
        Err(e) => return Err(classify(path, "inspect the file", e.into(), false)),
    };
    let db = if exists {
        guarded(path, "open the database", || {
            Database::builder()
                .set_check_integrity_on_open(true)
                .open(path)
                .map_err(|e| classify_open(path, e))
        })?
    } else {
        Database::create(path).map_err(|e| classify_open(path, e))?
    };
    let missing = guarded(path, "read the tables", || check_tables(path, &db))?;
    if missing {
        init_tables(path, &db)?;
    }
    Ok(OpenedFile {
        db,
        initialised: missing,
    })
}

fn classify_open(path: &Path, err: DatabaseError) -> MetadataError {
    let op = "open the database";
    match err {
        DatabaseError::Storage(StorageError::Corrupted(reason)) => {
            damaged(path, format!("{op}: DB corrupted: {reason}"))
        }
        DatabaseError::Storage(storage) => classify(path, op, storage.into(), false),
        DatabaseError::DatabaseAlreadyOpen => MetadataError::InUse {
            path: path.to_path_buf(),
        },
        other => MetadataError::Backend {
            op,
            source: Box::new(::redb::Error::from(other)),
        },
    }
}

/// Opens one table for reading; `Ok(None)` if it does not exist.
fn read_table<K: ::redb::Key + 'static, V: ::redb::Value + 'static>(
    path: &Path,
    txn: &::redb::ReadTransaction,
    table: TableDefinition<K, V>,
) -> Result<Option<::redb::ReadOnlyTable<K, V>>, MetadataError> {
    match txn.open_table(table) {
        Ok(table) => Ok(Some(table)),
        Err(TableError::TableDoesNotExist(_)) => Ok(None),
        Err(e) => Err(classify(path, "open a table", e.into(), true)),
    }
}

/// Checks the format version and reads every entry of every table in one
/// read transaction. Returns whether something is missing (the file needs
/// [`init_tables`]).
fn check_tables(path: &Path, db: &Database) -> Result<bool, MetadataError> {
    let read = |e: ::redb::Error| classify(path, "read the tables", e, true);
    let txn = db.begin_read().map_err(|e| read(e.into()))?;
    let mut missing = false;
    match read_table(path, &txn, META)? {
        Some(meta) => {
            let found = meta
                .get(FORMAT_VERSION_KEY)
                .map_err(|e| read(e.into()))?
                .map(|g| g.value());
            match found {
                Some(FORMAT_VERSION) => {}
                Some(found) => {
                    return Err(MetadataError::UnsupportedFormat {
                        found,
                        expected: FORMAT_VERSION,
                    });
                }
                None => missing = true,
            }
        }
        None => missing = true,
    }
    match read_table(path, &txn, KV)? {
        Some(kv) => {
            for entry in kv.iter().map_err(|e| read(e.into()))? {
                let (key, value) = entry.map_err(|e| read(e.into()))?;
                // Touch the bytes: a damaged leaf shows here.
                let _ = (key.value().len(), value.value().len());
            }
        }
        None => missing = true,
    }
    match read_table(path, &txn, EXPIRY)? {
        Some(expiry) => {
            for entry in expiry.iter().map_err(|e| read(e.into()))? {
                let (key, at) = entry.map_err(|e| read(e.into()))?;
                let _ = (key.value().len(), at.value());
            }
        }
        None => missing = true,
    }
    Ok(missing)
}

/// Writes the format version and creates the tables, in one durable write
/// transaction, so read transactions always find them.
fn init_tables(path: &Path, db: &Database) -> Result<(), MetadataError> {
    let fail = |op: &'static str| move |e: ::redb::Error| classify(path, op, e, false);
    let mut txn = db
        .begin_write()
        .map_err(|e| fail("begin a write")(e.into()))?;
    txn.set_durability(Durability::Immediate)
        .map_err(|e| fail("set durability")(e.into()))?;
    {
        let mut meta = txn
            .open_table(META)
            .map_err(|e| fail("open a table")(e.into()))?;
        let found = meta
            .get(FORMAT_VERSION_KEY)
            .map_err(|e| fail("read the format version")(e.into()))?
            .map(|g| g.value());
        if found.is_none() {
            meta.insert(FORMAT_VERSION_KEY, FORMAT_VERSION)
                .map_err(|e| fail("write the format version")(e.into()))?;
        }
        txn.open_table(KV)
            .map_err(|e| fail("open a table")(e.into()))?;
        txn.open_table(EXPIRY)
            .map_err(|e| fail("open a table")(e.into()))?;
    }
    txn.commit().map_err(|e| fail("commit")(e.into()))
}

impl Inner {
    /// Turns a [`MetadataError::Backend`] wrapping a redb I/O error into
    /// [`MetadataError::Storage`] naming the file; other errors pass.
    pub(super) fn name_storage_error(&self, err: MetadataError) -> MetadataError {
        match err {
            MetadataError::Backend { op, source } => match source.downcast::<::redb::Error>() {
                Ok(redb_err) => match *redb_err {
                    ::redb::Error::Io(io) => MetadataError::Storage {
                        path: self.path.clone(),
                        op,
                        disk_full: io_is_disk_full(&io),
                        source: Box::new(io),
                    },
                    err @ (::redb::Error::PreviousIo | ::redb::Error::DatabaseClosed) => {
                        MetadataError::Storage {
                            path: self.path.clone(),
                            op,
                            disk_full: self.fault().as_ref().is_some_and(|f| f.disk_full),
                            source: Box::new(err),
                        }
                    }
                    other => MetadataError::Backend {
                        op,
                        source: Box::new(other),
                    },
                },
                Err(source) => MetadataError::Backend { op, source },
            },
            other => other,
        }
    }

    fn fault(&self) -> std::sync::MutexGuard<'_, Option<Fault>> {
        self.fault
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether writes are failing (a failure episode is open).
    pub(super) fn is_faulted(&self) -> bool {
        self.fault().is_some()
    }

    /// Closes the handle and opens the file again. Leaves the store closed
    /// (`None`) if the open fails; the next operation tries again.
    fn reopen(&self) -> Result<(), MetadataError> {
        let mut slot = self.db_slot_mut();
        // Dropping the handle closes the file and releases its lock, which
        // the open below needs.
        *slot = None;
        let opened = open_file(&self.path)?;
        *slot = Some(opened.db);
        Ok(())
    }

    /// Runs a write `f` on the database: reopens the file first when the
    /// previous write failed, and records the episode (see the module doc).
    /// The caller holds the write lock.
    pub(super) fn write_with<T>(
        &self,
        op: &'static str,
        f: impl FnOnce(&Database) -> Result<T, MetadataError>,
    ) -> Result<T, MetadataError> {
        let reopen = self.fault().as_ref().is_some_and(|f| f.needs_reopen);
        if reopen {
            if let Err(e) = self.reopen() {
                self.record_failure("reopen the database", &e);
                return Err(e);
            }
            debug!(path = %self.path.display(), "metadata store reopened after a failed write");
        }
        let result = {
            let slot = self.db_slot();
            match slot.as_ref() {
                Some(db) => f(db).map_err(|e| self.name_storage_error(e)),
                None => Err(self.closed_error(op)),
            }
        };
        match &result {
            Ok(_) => self.record_success(),
            Err(e @ MetadataError::Storage { .. }) => self.record_failure(op, e),
            Err(_) => {}
        }
        result
    }

    /// Runs a read `f` on the database; opens the file first if an earlier
    /// reopen left the store closed.
    pub(super) fn read_with<T>(
        &self,
        op: &'static str,
        f: impl FnOnce(&Database) -> Result<T, MetadataError>,
    ) -> Result<T, MetadataError> {
        if self.db_slot().is_none() {
            let _writer = self.lock_writes();
            if self.db_slot().is_none()
                && let Err(e) = self.reopen()
            {
                self.record_failure("reopen the database", &e);
                return Err(e);
            }
        }
        let slot = self.db_slot();
        match slot.as_ref() {
            Some(db) => f(db).map_err(|e| self.name_storage_error(e)),
            None => Err(self.closed_error(op)),
        }
    }

    fn closed_error(&self, op: &'static str) -> MetadataError {
        MetadataError::Storage {
            path: self.path.clone(),
            op,
            disk_full: self.fault().as_ref().is_some_and(|f| f.disk_full),
            source: "the store is closed after a failed reopen; the next operation tries again"
                .into(),
        }
    }

    fn record_failure(&self, op: &'static str, err: &MetadataError) {
        let disk_full = err.is_disk_full();
        let mut fault = self.fault();
        match fault.as_mut() {
            Some(fault) => {
                fault.failures += 1;
                fault.disk_full = disk_full;
                fault.needs_reopen = true;
                debug!(path = %self.path.display(), op, failures = fault.failures, error = %err, "metadata store write failed again");
            }
            None => {
                error!(
                    path = %self.path.display(),
                    op,
                    disk_full,
                    error = %err,
                    "metadata store write failed; writes fail with a storage error until one succeeds, \
                     and each later write reopens the file first (no restart needed once the cause, \
                     e.g. a full filesystem, is gone)"
                );
                *fault = Some(Fault {
                    needs_reopen: true,
                    disk_full,
                    failures: 1,
                    since: Instant::now(),
                });
            }
        }
    }

    fn record_success(&self) {
        if let Some(fault) = self.fault().take() {
            info!(
                path = %self.path.display(),
                failed_writes = fault.failures,
                seconds = fault.since.elapsed().as_secs(),
                "metadata store writable again"
            );
        }
    }
}
