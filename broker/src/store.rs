//! The central [`MetadataStore`]: the trait of `broker_core::metadata` on the
//! Raft metadata node.
//!
//! Writes are Raft transactions proposed through the leader (followers
//! forward) and resolve once applied on this node; reads first pass a
//! read-index barrier through the leader, so they are linearizable on every
//! node. TTL expiry times are computed from this store's [`Clock`] when a
//! write is proposed, so all replicas agree on them.

use std::sync::Arc;

use broker_core::metadata::{
    BoxFuture, EncodedOp, MetadataError, MetadataStore, Txn, TxnOutcome, Watch, encode_value,
    validate_key, validate_prefix,
};

use broker_core::clock::Clock;
use serde_json::Value;

use crate::raft::node::{MetaNode, NodeError};
use crate::raft::{MetaCommand, MetaCondition, MetaOp, MetaResponse};

/// [`MetadataStore`] over a [`MetaNode`].
#[derive(Clone)]
pub struct RaftMetadataStore {
    node: MetaNode,
    clock: Arc<dyn Clock>,
}

fn backend(op: &'static str) -> impl FnOnce(NodeError) -> MetadataError {
    move |e| MetadataError::Backend {
        op,
        source: Box::new(e),
    }
}

fn now_ms(clock: &dyn Clock) -> i64 {
    i64::try_from(clock.now_ms()).unwrap_or(i64::MAX)
}

fn decode(key: &str, bytes: &[u8]) -> Result<Value, MetadataError> {
    serde_json::from_slice(bytes).map_err(|source| MetadataError::Corrupt {
        key: key.to_owned(),
        source,
    })
}

impl RaftMetadataStore {
    /// A store on `node`, reading TTL time from `clock`.
    pub fn new(node: MetaNode, clock: Arc<dyn Clock>) -> RaftMetadataStore {
        RaftMetadataStore { node, clock }
    }

    /// The node underneath.
    pub fn node(&self) -> &MetaNode {
        &self.node
    }

    async fn propose(&self, txn: Txn) -> Result<(MetaResponse, Vec<MetaCondition>), MetadataError> {
        let validated = txn.validate()?;
        let now = now_ms(self.clock.as_ref());
        let conditions: Vec<MetaCondition> = validated
            .preconditions
            .iter()
            .map(|p| {
                Ok(MetaCondition {
                    key: p.key.clone(),
                    value: p
                        .expected
                        .as_ref()
                        .map(|v| encode_value(&p.key, v))
                        .transpose()?,
                })
            })
            .collect::<Result<_, MetadataError>>()?;
        let ops = validated
            .ops
            .into_iter()
            .map(|op| match op {
                EncodedOp::Put {
                    key, json, ttl_ms, ..
                } => MetaOp::Put {
                    key,
                    value: json,
                    expires_at_ms: ttl_ms
                        .map(|ttl| now.saturating_add(i64::try_from(ttl).unwrap_or(i64::MAX))),
                },
                EncodedOp::Delete { key } => MetaOp::Delete { key },
            })
            .collect();
        let response = self
            .node
            .write(MetaCommand::Txn {
                conditions: conditions.clone(),
                ops,
                now_ms: now,
            })
            .await
            .map_err(backend("write"))?;
        Ok((response, conditions))
    }
}

impl RaftMetadataStore {
    /// `key` in this node's state machine as applied now.
    fn read_applied(&self, key: &str) -> Result<Option<Value>, MetadataError> {
        let now = now_ms(self.clock.as_ref());
        let raw = self
            .node
            .state_machine()
            .get(key, now)
            .map_err(|e| MetadataError::Backend {
                op: "read",
                source: Box::new(e),
            })?;
        raw.map(|bytes| decode(key, &bytes)).transpose()
    }
}

impl MetadataStore for RaftMetadataStore {
    fn get<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Value>, MetadataError>> {
        Box::pin(async move {
            validate_key(key)?;
            self.node.read_barrier().await.map_err(backend("read"))?;
            self.read_applied(key)
        })
    }

    /// This node's applied state, no read-index barrier: no round trip to
    /// the leader, and an answer also while there is none.
    fn get_local<'a>(
        &'a self,
        key: &'a str,
    ) -> BoxFuture<'a, Result<Option<Value>, MetadataError>> {
        Box::pin(async move {
            validate_key(key)?;
            self.read_applied(key)
        })
    }

    fn txn(&self, txn: Txn) -> BoxFuture<'_, Result<TxnOutcome, MetadataError>> {
        Box::pin(async move {
            let (response, conditions) = self.propose(txn).await?;
            if response.applied {
                return Ok(TxnOutcome::Applied);
            }
            for (index, (condition, current)) in
                conditions.iter().zip(&response.current).enumerate()
            {
                if &condition.value != current {
                    let current = current
                        .as_ref()
                        .map(|bytes| decode(&condition.key, bytes))
                        .transpose()?;
                    return Ok(TxnOutcome::ConditionFailed {
                        index,
                        key: condition.key.clone(),
                        current,
                    });
                }
            }
            Err(MetadataError::Task {
                op: "txn",
                reason: "transaction refused although every precondition held".into(),
            })
        })
    }

    fn delete<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<bool, MetadataError>> {
        Box::pin(async move {
            let (response, _) = self.propose(Txn::new().delete(key)).await?;
            Ok(response.deleted_live.first().copied().unwrap_or(false))
        })
    }

    fn list<'a>(
        &'a self,
        prefix: &'a str,
    ) -> BoxFuture<'a, Result<Vec<(String, Value)>, MetadataError>> {
        Box::pin(async move {
            validate_prefix(prefix)?;
            self.node.read_barrier().await.map_err(backend("read"))?;
            let now = now_ms(self.clock.as_ref());
            let entries = self.node.state_machine().list(prefix, now).map_err(|e| {
                MetadataError::Backend {
                    op: "list",
                    source: Box::new(e),
                }
            })?;
            entries
                .into_iter()
                .map(|(key, bytes)| {
                    let value = decode(&key, &bytes)?;
                    Ok((key, value))
                })
                .collect()
        })
    }

    fn watch<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Watch, MetadataError>> {
        Box::pin(async move {
            validate_prefix(prefix)?;
            Ok(self.node.state_machine().watch(prefix))
        })
    }

    fn purge_expired(&self) -> BoxFuture<'_, Result<usize, MetadataError>> {
        Box::pin(async move {
            let now = now_ms(self.clock.as_ref());
            let response = self
                .node
                .write(MetaCommand::PurgeExpired { now_ms: now })
                .await
                .map_err(backend("purge"))?;
            Ok(usize::try_from(response.purged).unwrap_or(usize::MAX))
        })
    }
}
