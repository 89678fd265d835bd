//! Transactions and their outcomes: [`Txn`] (preconditions and write ops,
//! validated into [`ValidatedTxn`] once), [`TxnOutcome`], [`CasOutcome`].

use serde_json::Value;

use super::{MAX_TXN_OPS, MetadataError, encode_value, validate_key};

/// A condition of a transaction on one key's current live value.
#[derive(Debug, Clone, PartialEq)]
pub struct Precondition {
    /// The key.
    pub key: String,
    /// `Some(v)`: the key must hold exactly `v`; `None`: it must be absent.
    pub expected: Option<Value>,
}

/// One write of a transaction.
#[derive(Debug, Clone, PartialEq)]
pub enum WriteOp {
    /// Store `value` at `key`; with `ttl_ms`, the key expires `ttl_ms` after
    /// the transaction applies; without, any earlier TTL is removed.
    Put {
        /// The key.
        key: String,
        /// The value.
        value: Value,
        /// Time to live, ms, above 0.
        ttl_ms: Option<u64>,
    },
    /// Remove `key` (no effect if absent).
    Delete {
        /// The key.
        key: String,
    },
}

impl WriteOp {
    /// The key written.
    pub fn key(&self) -> &str {
        match self {
            WriteOp::Put { key, .. } | WriteOp::Delete { key } => key,
        }
    }
}

/// An atomic multi-key write: preconditions, then ops.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Txn {
    /// All must hold for any op to apply.
    pub preconditions: Vec<Precondition>,
    /// Applied in order when the preconditions hold.
    pub ops: Vec<WriteOp>,
}

impl Txn {
    /// An empty transaction.
    pub fn new() -> Txn {
        Txn::default()
    }

    /// Requires `key` to hold `value`.
    pub fn when_equals(mut self, key: impl Into<String>, value: Value) -> Txn {
        self.preconditions.push(Precondition {
            key: key.into(),
            expected: Some(value),
        });
        self
    }

    /// Requires `key` to be absent.
    pub fn when_absent(mut self, key: impl Into<String>) -> Txn {
        self.preconditions.push(Precondition {
            key: key.into(),
            expected: None,
        });
        self
    }

    /// Adds a put.
    pub fn put(mut self, key: impl Into<String>, value: Value) -> Txn {
        self.ops.push(WriteOp::Put {
            key: key.into(),
            value,
            ttl_ms: None,
        });
        self
    }

    /// Adds a put with a TTL, ms.
    pub fn put_with_ttl(mut self, key: impl Into<String>, value: Value, ttl_ms: u64) -> Txn {
        self.ops.push(WriteOp::Put {
            key: key.into(),
            value,
            ttl_ms: Some(ttl_ms),
        });
        self
    }

    /// Adds a delete.
    pub fn delete(mut self, key: impl Into<String>) -> Txn {
        self.ops.push(WriteOp::Delete { key: key.into() });
        self
    }

    /// Checks sizes, keys, values and TTLs, and encodes every put's value as
    /// compact JSON: what an implementation applies.
    ///
    /// # Errors
    /// [`MetadataError::TooManyOps`], [`MetadataError::InvalidKey`],
    /// [`MetadataError::ValueTooLarge`] or [`MetadataError::ZeroTtl`].
    pub fn validate(self) -> Result<ValidatedTxn, MetadataError> {
        let count = self.preconditions.len() + self.ops.len();
        if count > MAX_TXN_OPS {
            return Err(MetadataError::TooManyOps {
                count,
                max: MAX_TXN_OPS,
            });
        }
        for precondition in &self.preconditions {
            validate_key(&precondition.key)?;
        }
        let ops = self
            .ops
            .into_iter()
            .map(|op| {
                validate_key(op.key())?;
                Ok(match op {
                    WriteOp::Put { key, value, ttl_ms } => {
                        if ttl_ms == Some(0) {
                            return Err(MetadataError::ZeroTtl { key });
                        }
                        let json = encode_value(&key, &value)?;
                        EncodedOp::Put {
                            key,
                            value,
                            json,
                            ttl_ms,
                        }
                    }
                    WriteOp::Delete { key } => EncodedOp::Delete { key },
                })
            })
            .collect::<Result<_, MetadataError>>()?;
        Ok(ValidatedTxn {
            preconditions: self.preconditions,
            ops,
        })
    }
}

/// A [`Txn`] that passed [`Txn::validate`].
#[derive(Debug, Clone, PartialEq)]
pub struct ValidatedTxn {
    /// As in the transaction.
    pub preconditions: Vec<Precondition>,
    /// The ops, puts with their encoded value.
    pub ops: Vec<EncodedOp>,
}

/// A validated [`WriteOp`].
#[derive(Debug, Clone, PartialEq)]
pub enum EncodedOp {
    /// A put.
    Put {
        /// The key.
        key: String,
        /// The value (for watch events).
        value: Value,
        /// `value` as compact JSON, at most [`MAX_VALUE_BYTES`].
        json: Vec<u8>,
        /// Time to live, ms, above 0.
        ttl_ms: Option<u64>,
    },
    /// A delete.
    Delete {
        /// The key.
        key: String,
    },
}

/// The result of a transaction.
#[derive(Debug, Clone, PartialEq)]
#[must_use]
pub enum TxnOutcome {
    /// Every op applied.
    Applied,
    /// Nothing applied: the first precondition that did not hold.
    ConditionFailed {
        /// Its position in [`Txn::preconditions`].
        index: usize,
        /// Its key.
        key: String,
        /// The key's live value at the time.
        current: Option<Value>,
    },
}

impl TxnOutcome {
    /// Whether the transaction applied.
    pub fn applied(&self) -> bool {
        matches!(self, TxnOutcome::Applied)
    }
}

/// The result of a compare-and-swap.
#[derive(Debug, Clone, PartialEq)]
#[must_use]
pub struct CasOutcome {
    /// Whether the new value was stored.
    pub applied: bool,
    /// The key's value afterwards: the new value when applied, else the
    /// value that did not match (`None`: absent).
    pub current: Option<Value>,
}
