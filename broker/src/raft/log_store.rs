//! The Raft log on redb: entries by index, plus the vote, the committed log id
//! and the last purged log id. Every write is a redb transaction committed
//! with redb's default (immediate, fsync'd) durability before openraft is told
//! it is done.

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{Entry, LogId, OptionalSend, RaftLogReader, StorageError, StorageIOError, Vote};
use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{NodeId, TypeConfig};

/// Log entries by index (JSON-encoded `Entry`).
pub const LOGS: TableDefinition<u64, &[u8]> = TableDefinition::new("raft_logs");
/// `vote`, `committed`, `last_purged` (JSON).
pub const LOG_META: TableDefinition<&str, &[u8]> = TableDefinition::new("raft_log_meta");

const VOTE: &str = "vote";
const COMMITTED: &str = "committed";
const LAST_PURGED: &str = "last_purged";

/// The redb-backed Raft log. Cheap to clone (the database is shared).
#[derive(Clone)]
pub struct LogStore {
    db: Arc<Database>,
    /// Held by every copy openraft's tasks own, so the node can tell when
    /// they are all gone ([`super::node::MetaNode::shutdown`]).
    _held_by_raft: Option<Arc<()>>,
}

impl LogStore {
    /// A log store on `db` (created by [`super::open_database`]).
    pub fn new(db: Arc<Database>) -> LogStore {
        LogStore {
            db,
            _held_by_raft: None,
        }
    }

    /// This store, marked as handed to openraft: every clone made from it
    /// holds `token`, so its weak count tells whether a task still has one.
    pub fn held_by_raft(self, token: Arc<()>) -> LogStore {
        LogStore {
            _held_by_raft: Some(token),
            ..self
        }
    }

    fn get_meta<T: DeserializeOwned>(&self, key: &str) -> Result<Option<T>, StorageError<NodeId>> {
        let txn = self.db.begin_read().map_err(log_read)?;
        let table = txn.open_table(LOG_META).map_err(log_read)?;
        let Some(value) = table.get(key).map_err(log_read)? else {
            return Ok(None);
        };
        let parsed = serde_json::from_slice(value.value()).map_err(log_read)?;
        Ok(Some(parsed))
    }

    fn put_meta<T: Serialize>(&self, key: &str, value: &T) -> Result<(), StorageError<NodeId>> {
        let bytes = serde_json::to_vec(value).map_err(log_write)?;
        let txn = self.db.begin_write().map_err(log_write)?;
        {
            let mut table = txn.open_table(LOG_META).map_err(log_write)?;
            table.insert(key, bytes.as_slice()).map_err(log_write)?;
        }
        txn.commit().map_err(log_write)?;
        Ok(())
    }
}

fn log_read<E: std::error::Error + 'static>(e: E) -> StorageError<NodeId> {
    StorageIOError::<NodeId>::read_logs(&e).into()
}

fn log_write<E: std::error::Error + 'static>(e: E) -> StorageError<NodeId> {
    StorageIOError::<NodeId>::write_logs(&e).into()
}

fn bounds<RB: RangeBounds<u64>>(range: &RB) -> (u64, Option<u64>) {
    let start = match range.start_bound() {
        Bound::Included(&s) => s,
        Bound::Excluded(&s) => s.saturating_add(1),
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => Some(e.saturating_add(1)),
        Bound::Excluded(&e) => Some(e),
        Bound::Unbounded => None,
    };
    (start, end)
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError<NodeId>> {
        let (start, end) = bounds(&range);
        let txn = self.db.begin_read().map_err(log_read)?;
        let table = txn.open_table(LOGS).map_err(log_read)?;
        let iter = match end {
            Some(end) if end <= start => return Ok(Vec::new()),
            Some(end) => table.range(start..end),
            None => table.range(start..),
        }
        .map_err(log_read)?;
        let mut out = Vec::new();
        for item in iter {
            let (_, value) = item.map_err(log_read)?;
            out.push(serde_json::from_slice(value.value()).map_err(log_read)?);
        }
        Ok(out)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError<NodeId>> {
        let last_purged: Option<LogId<NodeId>> = self.get_meta(LAST_PURGED)?;
        let last_entry = {
            let txn = self.db.begin_read().map_err(log_read)?;
            let table = txn.open_table(LOGS).map_err(log_read)?;
            match table.last().map_err(log_read)? {
                Some((_, value)) => {
                    let entry: Entry<TypeConfig> =
                        serde_json::from_slice(value.value()).map_err(log_read)?;
                    Some(entry.log_id)
                }
                None => None,
            }
        };
        Ok(LogState {
            last_purged_log_id: last_purged,
            last_log_id: last_entry.or(last_purged),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError<NodeId>> {
        self.put_meta(VOTE, vote)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError<NodeId>> {
        self.get_meta(VOTE)
    }

    async fn save_committed(
        &mut self,
        committed: Option<LogId<NodeId>>,
    ) -> Result<(), StorageError<NodeId>> {
        // A hint for faster start-up (openraft re-applies up to it); not
        // fsync'd on its own, durable with the next log append.
        let bytes = serde_json::to_vec(&committed).map_err(log_write)?;
        let mut txn = self.db.begin_write().map_err(log_write)?;
        txn.set_durability(Durability::None).map_err(log_write)?;
        {
            let mut table = txn.open_table(LOG_META).map_err(log_write)?;
            table
                .insert(COMMITTED, bytes.as_slice())
                .map_err(log_write)?;
        }
        txn.commit().map_err(log_write)?;
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<NodeId>>, StorageError<NodeId>> {
        Ok(self.get_meta::<Option<LogId<NodeId>>>(COMMITTED)?.flatten())
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let txn = self.db.begin_write().map_err(log_write)?;
        {
            let mut table = txn.open_table(LOGS).map_err(log_write)?;
            for entry in entries {
                let bytes = serde_json::to_vec(&entry).map_err(log_write)?;
                table
                    .insert(entry.log_id.index, bytes.as_slice())
                    .map_err(log_write)?;
            }
        }
        // Durable (fsync'd) when commit returns: only then is openraft told.
        txn.commit().map_err(log_write)?;
        callback.log_io_completed(Ok(()));
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
        let txn = self.db.begin_write().map_err(log_write)?;
        {
            let mut table = txn.open_table(LOGS).map_err(log_write)?;
            table
                .retain_in(log_id.index.., |_, _| false)
                .map_err(log_write)?;
        }
        txn.commit().map_err(log_write)?;
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
        let bytes = serde_json::to_vec(&Some(log_id)).map_err(log_write)?;
        let txn = self.db.begin_write().map_err(log_write)?;
        {
            // Record the purge point first in the same transaction: after a
            // crash either both or neither are visible.
            let mut meta = txn.open_table(LOG_META).map_err(log_write)?;
            meta.insert(LAST_PURGED, bytes.as_slice())
                .map_err(log_write)?;
            let mut table = txn.open_table(LOGS).map_err(log_write)?;
            table
                .retain_in(..=log_id.index, |_, _| false)
                .map_err(log_write)?;
        }
        txn.commit().map_err(log_write)?;
        Ok(())
    }
}
