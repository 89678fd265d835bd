//! The metadata cluster: openraft 0.9 (`storage-v2`) over a redb log store
//! and a redb state machine holding the key → value metadata.
//!
//! The replicated command is a transaction ([`MetaCommand::Txn`]): a list of
//! conditions on current values and a list of puts/deletes applied all or
//! nothing. Put, delete, compare-and-swap and multi-key writes of the
//! `MetadataStore` trait are all transactions. Values are opaque bytes (JSON
//! by convention). TTLs are absolute expiry times chosen by the proposer, so
//! every replica applies the same state; expired keys are hidden from reads
//! and removed by a [`MetaCommand::PurgeExpired`] the leader proposes.
#![allow(
    clippy::result_large_err,
    reason = "openraft's traits fix StorageError (224 bytes) as the error type"
)]

pub mod log_store;
pub mod network;
pub mod node;
pub mod state_machine;

use std::io::Cursor;

use serde::{Deserialize, Serialize};

openraft::declare_raft_types!(
    /// Raft types of the metadata cluster: node ids are `u64`, nodes are
    /// addressed by `BasicNode { addr }` (the peer's Raft QUIC address).
    pub TypeConfig:
        D = MetaCommand,
        R = MetaResponse,
        NodeId = u64,
        Node = openraft::BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

/// A Raft node id.
pub type NodeId = u64;
/// The openraft handle for this type config.
pub type Raft = openraft::Raft<TypeConfig>;

/// One write to the metadata state machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum MetaOp {
    /// Set `key` to `value`; expires at `expires_at_ms` (ms since the Unix
    /// epoch) when set.
    Put {
        /// Metadata key (built by `tributary_proto::keys`).
        key: String,
        /// Value bytes (JSON by convention).
        value: Vec<u8>,
        /// Absolute expiry, ms since the Unix epoch.
        expires_at_ms: Option<i64>,
    },
    /// Remove `key` (no-op if absent).
    Delete {
        /// Metadata key.
        key: String,
    },
}

/// A precondition of a transaction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaCondition {
    /// Key to check.
    pub key: String,
    /// Required current value; `None` requires the key to be absent.
    pub value: Option<Vec<u8>>,
}

/// A replicated command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum MetaCommand {
    /// Applies `ops` in order if every condition holds at `now_ms` (the
    /// proposer's clock, used to treat expired keys as absent), else nothing.
    Txn {
        /// All must hold.
        conditions: Vec<MetaCondition>,
        /// Applied in order, all or nothing.
        ops: Vec<MetaOp>,
        /// Proposer's time, ms since the Unix epoch.
        now_ms: i64,
    },
    /// Deletes every key whose expiry is at or before `now_ms`.
    PurgeExpired {
        /// Proposer's time, ms since the Unix epoch.
        now_ms: i64,
    },
}

/// Result of applying a command.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaResponse {
    /// Whether the ops were applied (all conditions held).
    pub applied: bool,
    /// Current value of each condition key when the conditions were checked,
    /// in condition order (so a failed compare-and-swap reports what it saw).
    pub current: Vec<Option<Vec<u8>>>,
    /// For each `Delete` op in order: whether a live value was removed.
    pub deleted_live: Vec<bool>,
    /// Keys removed by `PurgeExpired`.
    pub purged: u64,
}

/// Creates the redb tables used by the log store and the state machine, in
/// one database file.
///
/// # Errors
/// redb errors opening the file or creating tables.
pub fn open_database(path: &std::path::Path) -> Result<redb::Database, redb::Error> {
    let db = redb::Database::create(path)?;
    let txn = db.begin_write()?;
    {
        txn.open_table(log_store::LOGS)?;
        txn.open_table(log_store::LOG_META)?;
        txn.open_table(state_machine::KV)?;
        txn.open_table(state_machine::SM_META)?;
    }
    txn.commit()?;
    Ok(db)
}
