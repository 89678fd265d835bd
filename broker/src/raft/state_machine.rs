//! The metadata state machine on redb: the key → value table, the last
//! applied log id and membership, and snapshots persisted to disk.
//!
//! Applying a batch of entries is one redb transaction, so after a crash the
//! state machine is exactly at its recorded `last_applied`. Apply commits are
//! not fsync'd themselves (see `apply`); openraft re-applies the durable log
//! after `last_applied` on start-up. Snapshots are written to `snapshots/current.snap`
//! atomically (temporary file, fsync, rename, directory fsync) and their
//! metadata recorded in redb, so a restarted node always has the snapshot that
//! covers the log entries openraft has purged.
//!
//! Snapshot file layout (little-endian): magic `TRSN`, version u8 (1),
//! u32 length + JSON of the [`SnapshotMeta`], u64 entry count, then per entry
//! u32 key length, key (UTF-8), i64 expiry (`i64::MAX` = none), u32 value
//! length, value; finally CRC-32C of everything before it.

use std::io::{Cursor, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use openraft::storage::{RaftStateMachine, Snapshot, SnapshotMeta};
use openraft::{
    Entry, EntryPayload, LogId, OptionalSend, RaftSnapshotBuilder, StorageError, StorageIOError,
    StoredMembership,
};
use redb::{
    Database, Durability, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition,
    WriteTransaction,
};

use broker_core::metadata::{Watch, WatchEvent, WatchHub};

use super::{MetaCommand, MetaOp, MetaResponse, NodeId, TypeConfig};

/// Metadata keys → encoded value (8-byte expiry + value bytes).
pub const KV: TableDefinition<&str, &[u8]> = TableDefinition::new("meta_kv");
/// `last_applied`, `membership` (JSON), `snapshot_seq` (u64 JSON).
pub const SM_META: TableDefinition<&str, &[u8]> = TableDefinition::new("sm_meta");

const LAST_APPLIED: &str = "last_applied";
const MEMBERSHIP: &str = "membership";
const SNAPSHOT_SEQ: &str = "snapshot_seq";
const SNAPSHOT_MAGIC: &[u8; 4] = b"TRSN";
const SNAPSHOT_VERSION: u8 = 1;
const NO_EXPIRY: i64 = i64::MAX;

type Meta = SnapshotMeta<NodeId, openraft::BasicNode>;
type Membership = StoredMembership<NodeId, openraft::BasicNode>;
/// Stored entries: key and encoded value (see [`encode_value`]).
pub type Entries = Vec<(String, Vec<u8>)>;

/// Encodes a stored value: expiry (ms since the Unix epoch, `i64::MAX` for
/// none) then the value bytes.
pub fn encode_value(value: &[u8], expires_at_ms: Option<i64>) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + value.len());
    out.extend_from_slice(&expires_at_ms.unwrap_or(NO_EXPIRY).to_le_bytes());
    out.extend_from_slice(value);
    out
}

/// Decodes a stored value into (value, expiry); `None` if shorter than 8
/// bytes (never written by this code).
pub fn decode_value(raw: &[u8]) -> Option<(&[u8], Option<i64>)> {
    let (expiry, value) = raw.split_first_chunk::<8>()?;
    let expiry = i64::from_le_bytes(*expiry);
    Some((value, (expiry != NO_EXPIRY).then_some(expiry)))
}

/// The value of a stored entry if it is live at `now_ms`.
pub fn live_value(raw: &[u8], now_ms: i64) -> Option<Vec<u8>> {
    let (value, expiry) = decode_value(raw)?;
    match expiry {
        Some(at) if at <= now_ms => None,
        _ => Some(value.to_vec()),
    }
}

/// A `Put` watch event; a value that is not JSON (never written by the
/// metadata store) is reported as a JSON string of its bytes, lossily.
fn put_event(key: &str, value: &[u8]) -> WatchEvent {
    let value = serde_json::from_slice(value)
        .unwrap_or_else(|_| serde_json::Value::String(String::from_utf8_lossy(value).into_owned()));
    WatchEvent::Put {
        key: key.to_string(),
        value,
    }
}

/// The redb-backed state machine. Cheap to clone.
#[derive(Clone)]
pub struct StateMachine {
    db: Arc<Database>,
    snapshot_dir: PathBuf,
    hub: Arc<WatchHub>,
    /// Held by every copy openraft's tasks own (see [`LogStore`]'s).
    ///
    /// [`LogStore`]: super::log_store::LogStore
    _held_by_raft: Option<Arc<()>>,
}

fn sm_read<E: std::error::Error + 'static>(e: E) -> StorageError<NodeId> {
    StorageIOError::<NodeId>::read_state_machine(&e).into()
}

fn sm_write<E: std::error::Error + 'static>(e: E) -> StorageError<NodeId> {
    StorageIOError::<NodeId>::write_state_machine(&e).into()
}

fn snap_err<E: std::error::Error + 'static>(e: E) -> StorageError<NodeId> {
    StorageIOError::<NodeId>::write_snapshot(None, &e).into()
}

fn put_json<T: serde::Serialize>(
    txn: &WriteTransaction,
    key: &str,
    value: &T,
) -> Result<(), StorageError<NodeId>> {
    let bytes = serde_json::to_vec(value).map_err(sm_write)?;
    let mut table = txn.open_table(SM_META).map_err(sm_write)?;
    table.insert(key, bytes.as_slice()).map_err(sm_write)?;
    Ok(())
}

impl StateMachine {
    /// A state machine on `db`, keeping snapshot files in `snapshot_dir`.
    ///
    /// # Errors
    /// Creating `snapshot_dir`.
    pub fn new(db: Arc<Database>, snapshot_dir: &Path) -> std::io::Result<StateMachine> {
        std::fs::create_dir_all(snapshot_dir)?;
        Ok(StateMachine {
            db,
            snapshot_dir: snapshot_dir.to_path_buf(),
            hub: Arc::new(WatchHub::new()),
            _held_by_raft: None,
        })
    }

    /// A clone of this state machine marked as handed to openraft: every
    /// clone made from it holds `token`.
    pub fn held_by_raft(&self, token: Arc<()>) -> StateMachine {
        StateMachine {
            _held_by_raft: Some(token),
            ..self.clone()
        }
    }

    /// Watches changes applied to this replica under `prefix`, in apply
    /// order, from now on. A snapshot installed on this replica replaces the
    /// state without per-key events; watchers then see a lag and re-list.
    pub fn watch(&self, prefix: &str) -> Watch {
        self.hub.subscribe(prefix)
    }

    fn get_json<T: serde::de::DeserializeOwned>(
        &self,
        key: &str,
    ) -> Result<Option<T>, StorageError<NodeId>> {
        let txn = self.db.begin_read().map_err(sm_read)?;
        let table = txn.open_table(SM_META).map_err(sm_read)?;
        match table.get(key).map_err(sm_read)? {
            Some(v) => Ok(Some(serde_json::from_slice(v.value()).map_err(sm_read)?)),
            None => Ok(None),
        }
    }

    /// The live value of `key` at `now_ms` (local read; linearizability is
    /// the caller's, see the store).
    ///
    /// # Errors
    /// redb read errors.
    pub fn get(&self, key: &str, now_ms: i64) -> Result<Option<Vec<u8>>, StorageError<NodeId>> {
        let txn = self.db.begin_read().map_err(sm_read)?;
        let table = txn.open_table(KV).map_err(sm_read)?;
        Ok(table
            .get(key)
            .map_err(sm_read)?
            .and_then(|v| live_value(v.value(), now_ms)))
    }

    /// Live entries whose key starts with `prefix`, sorted by key.
    ///
    /// # Errors
    /// redb read errors.
    pub fn list(
        &self,
        prefix: &str,
        now_ms: i64,
    ) -> Result<Vec<(String, Vec<u8>)>, StorageError<NodeId>> {
        let txn = self.db.begin_read().map_err(sm_read)?;
        let table = txn.open_table(KV).map_err(sm_read)?;
        let mut out = Vec::new();
        for item in table.range(prefix..).map_err(sm_read)? {
            let (key, value) = item.map_err(sm_read)?;
            if !key.value().starts_with(prefix) {
                break;
            }
            if let Some(v) = live_value(value.value(), now_ms) {
                out.push((key.value().to_string(), v));
            }
        }
        Ok(out)
    }

    /// Earliest expiry among stored keys, if any (for the purge timer).
    ///
    /// # Errors
    /// redb read errors.
    pub fn earliest_expiry(&self) -> Result<Option<i64>, StorageError<NodeId>> {
        let txn = self.db.begin_read().map_err(sm_read)?;
        let table = txn.open_table(KV).map_err(sm_read)?;
        let mut earliest: Option<i64> = None;
        for item in table.iter().map_err(sm_read)? {
            let (_, value) = item.map_err(sm_read)?;
            if let Some((_, Some(at))) = decode_value(value.value()) {
                earliest = Some(earliest.map_or(at, |e| e.min(at)));
            }
        }
        Ok(earliest)
    }

    fn apply_command(
        txn: &WriteTransaction,
        command: &MetaCommand,
        events: &mut Vec<WatchEvent>,
    ) -> Result<MetaResponse, StorageError<NodeId>> {
        let mut table = txn.open_table(KV).map_err(sm_write)?;
        match command {
            MetaCommand::Txn {
                conditions,
                ops,
                now_ms,
            } => {
                let mut current = Vec::with_capacity(conditions.len());
                let mut holds = true;
                for condition in conditions {
                    let value = table
                        .get(condition.key.as_str())
                        .map_err(sm_write)?
                        .and_then(|v| live_value(v.value(), *now_ms));
                    holds &= value == condition.value;
                    current.push(value);
                }
                let mut deleted_live = Vec::new();
                if holds {
                    for op in ops {
                        match op {
                            MetaOp::Put {
                                key,
                                value,
                                expires_at_ms,
                            } => {
                                let raw = encode_value(value, *expires_at_ms);
                                table
                                    .insert(key.as_str(), raw.as_slice())
                                    .map_err(sm_write)?;
                                events.push(put_event(key, value));
                            }
                            MetaOp::Delete { key } => {
                                let removed = table.remove(key.as_str()).map_err(sm_write)?;
                                let live = removed
                                    .as_ref()
                                    .is_some_and(|v| live_value(v.value(), *now_ms).is_some());
                                if removed.is_some() {
                                    events.push(WatchEvent::Delete { key: key.clone() });
                                }
                                deleted_live.push(live);
                            }
                        }
                    }
                }
                Ok(MetaResponse {
                    applied: holds,
                    current,
                    deleted_live,
                    purged: 0,
                })
            }
            MetaCommand::PurgeExpired { now_ms } => {
                let mut expired = Vec::new();
                for item in table.iter().map_err(sm_write)? {
                    let (key, raw) = item.map_err(sm_write)?;
                    if matches!(decode_value(raw.value()), Some((_, Some(at))) if at <= *now_ms) {
                        expired.push(key.value().to_string());
                    }
                }
                for key in &expired {
                    table.remove(key.as_str()).map_err(sm_write)?;
                }
                let purged = expired.len() as u64;
                events.extend(expired.into_iter().map(|key| WatchEvent::Delete { key }));
                Ok(MetaResponse {
                    applied: true,
                    purged,
                    ..MetaResponse::default()
                })
            }
        }
    }

    fn snapshot_path(&self) -> PathBuf {
        self.snapshot_dir.join("current.snap")
    }

    /// Writes snapshot bytes atomically.
    fn persist_snapshot_file(&self, bytes: &[u8]) -> Result<(), StorageError<NodeId>> {
        let path = self.snapshot_path();
        let tmp = self.snapshot_dir.join("current.snap.tmp");
        let write = || -> std::io::Result<()> {
            let mut file = std::fs::File::create(&tmp)?;
            file.write_all(bytes)?;
            file.sync_data()?;
            std::fs::rename(&tmp, &path)?;
            std::fs::File::open(&self.snapshot_dir)?.sync_all()
        };
        write().map_err(snap_err)
    }

    fn encode_snapshot(&self, meta: &Meta) -> Result<Vec<u8>, StorageError<NodeId>> {
        let meta_json = serde_json::to_vec(meta).map_err(snap_err)?;
        let mut out = Vec::new();
        out.extend_from_slice(SNAPSHOT_MAGIC);
        out.push(SNAPSHOT_VERSION);
        out.extend_from_slice(&(meta_json.len() as u32).to_le_bytes());
        out.extend_from_slice(&meta_json);
        let txn = self.db.begin_read().map_err(sm_read)?;
        let table = txn.open_table(KV).map_err(sm_read)?;
        let count = table.len().map_err(sm_read)?;
        out.extend_from_slice(&count.to_le_bytes());
        for item in table.iter().map_err(sm_read)? {
            let (key, raw) = item.map_err(sm_read)?;
            let (value, expiry) = decode_value(raw.value()).unwrap_or((&[], None));
            let key = key.value().as_bytes();
            out.extend_from_slice(&(key.len() as u32).to_le_bytes());
            out.extend_from_slice(key);
            out.extend_from_slice(&expiry.unwrap_or(NO_EXPIRY).to_le_bytes());
            out.extend_from_slice(&(value.len() as u32).to_le_bytes());
            out.extend_from_slice(value);
        }
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        Ok(out)
    }

    /// Parses snapshot bytes into its meta and entries.
    ///
    /// # Errors
    /// A description of the first failed check.
    pub fn decode_snapshot(bytes: &[u8]) -> Result<(Meta, Entries), String> {
        let (body, crc) = bytes.split_last_chunk::<4>().ok_or("snapshot truncated")?;
        if crc32c::crc32c(body) != u32::from_le_bytes(*crc) {
            return Err("snapshot crc mismatch".into());
        }
        let mut at = 0usize;
        let mut take = |n: usize| -> Result<&[u8], String> {
            let out = body.get(at..at + n).ok_or("snapshot truncated")?;
            at += n;
            Ok(out)
        };
        if take(4)? != SNAPSHOT_MAGIC || take(1)? != [SNAPSHOT_VERSION] {
            return Err("snapshot bad magic or version".into());
        }
        let u32_of = |b: &[u8]| u32::from_le_bytes(b.try_into().unwrap_or([0; 4])) as usize;
        let meta_len = u32_of(take(4)?);
        let meta: Meta = serde_json::from_slice(take(meta_len)?).map_err(|e| e.to_string())?;
        let count = u64::from_le_bytes(take(8)?.try_into().unwrap_or([0; 8]));
        let mut entries = Vec::new();
        for _ in 0..count {
            let key_len = u32_of(take(4)?);
            let key = String::from_utf8(take(key_len)?.to_vec()).map_err(|e| e.to_string())?;
            let expiry = i64::from_le_bytes(take(8)?.try_into().unwrap_or([0; 8]));
            let value_len = u32_of(take(4)?);
            let value = take(value_len)?;
            let expiry = (expiry != NO_EXPIRY).then_some(expiry);
            entries.push((key, encode_value(value, expiry)));
        }
        Ok((meta, entries))
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError<NodeId>> {
        let last_applied: Option<LogId<NodeId>> = self.get_json(LAST_APPLIED)?.flatten();
        let membership: Membership = self.get_json(MEMBERSHIP)?.unwrap_or_default();
        let seq: u64 = self.get_json(SNAPSHOT_SEQ)?.unwrap_or(0) + 1;
        let snapshot_id = match &last_applied {
            Some(id) => format!("{}-{}-{seq}", id.leader_id, id.index),
            None => format!("none-{seq}"),
        };
        let meta = Meta {
            last_log_id: last_applied,
            last_membership: membership,
            snapshot_id,
        };
        let bytes = self.encode_snapshot(&meta)?;
        let txn = self.db.begin_write().map_err(sm_write)?;
        put_json(&txn, SNAPSHOT_SEQ, &seq)?;
        txn.commit().map_err(sm_write)?;
        self.persist_snapshot_file(&bytes)?;
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(bytes)),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = StateMachine;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<NodeId>>, Membership), StorageError<NodeId>> {
        let last_applied = self.get_json(LAST_APPLIED)?.flatten();
        let membership = self.get_json(MEMBERSHIP)?.unwrap_or_default();
        Ok((last_applied, membership))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<MetaResponse>, StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut txn = self.db.begin_write().map_err(sm_write)?;
        // Not fsync'd on its own: the applied state can be rebuilt from the
        // log, which is durable. It becomes durable with the next durable
        // commit on this database (every log append, and the snapshot
        // builder's commit, which precedes any log purge), so the state
        // machine is never behind the purged part of the log.
        txn.set_durability(Durability::None).map_err(sm_write)?;
        let mut responses = Vec::new();
        let mut events = Vec::new();
        let mut last = None;
        let mut membership = None;
        for entry in entries {
            last = Some(entry.log_id);
            match &entry.payload {
                EntryPayload::Blank => responses.push(MetaResponse::default()),
                EntryPayload::Normal(command) => {
                    responses.push(StateMachine::apply_command(&txn, command, &mut events)?);
                }
                EntryPayload::Membership(m) => {
                    membership = Some(StoredMembership::new(Some(entry.log_id), m.clone()));
                    responses.push(MetaResponse::default());
                }
            }
        }
        if let Some(last) = last {
            put_json(&txn, LAST_APPLIED, &Some(last))?;
        }
        if let Some(membership) = membership {
            put_json(&txn, MEMBERSHIP, &membership)?;
        }
        txn.commit().map_err(sm_write)?;
        self.hub.publish(events);
        Ok(responses)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(
        &mut self,
    ) -> Result<Box<Cursor<Vec<u8>>>, StorageError<NodeId>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &Meta,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError<NodeId>> {
        let bytes = snapshot.into_inner();
        let (_, entries) = StateMachine::decode_snapshot(&bytes).map_err(|e| {
            StorageError::from(StorageIOError::<NodeId>::read_snapshot(
                Some(meta.signature()),
                openraft::AnyError::error(e),
            ))
        })?;
        // State first, then the file: after a crash in between, the file is
        // an older but complete snapshot and the state is the new one.
        let txn = self.db.begin_write().map_err(sm_write)?;
        {
            let mut table = txn.open_table(KV).map_err(sm_write)?;
            table.retain(|_, _| false).map_err(sm_write)?;
            for (key, raw) in &entries {
                table
                    .insert(key.as_str(), raw.as_slice())
                    .map_err(sm_write)?;
            }
        }
        put_json(&txn, LAST_APPLIED, &meta.last_log_id)?;
        put_json(&txn, MEMBERSHIP, &meta.last_membership)?;
        txn.commit().map_err(sm_write)?;
        self.persist_snapshot_file(&bytes)?;
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<Snapshot<TypeConfig>>, StorageError<NodeId>> {
        // The file carries its own meta, so file and meta can never disagree.
        let bytes = match std::fs::read(self.snapshot_path()) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(StorageIOError::<NodeId>::read_snapshot(None, &e).into()),
        };
        let (meta, _) = StateMachine::decode_snapshot(&bytes).map_err(|e| {
            StorageError::from(StorageIOError::<NodeId>::read_snapshot(
                None,
                openraft::AnyError::error(e),
            ))
        })?;
        Ok(Some(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(bytes)),
        }))
    }
}
