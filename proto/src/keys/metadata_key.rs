//! [`MetadataKey`]: every metadata key path outside the storage prefix, its
//! `Display` (the one place a key string is formatted) and its parser, with
//! [`KeyParseError`].

use std::fmt;
use std::str::FromStr;

use super::{
    BindingId, NameError, NamespaceName, PrincipalName, RoleName, SubjectName, SubscriptionName,
    TopicName, parse_canonical_u64, parse_padded_u64,
};

/// A key string that is not a well-formed Tributary key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyParseError {
    /// The key matches no known path shape.
    #[error("key {key:?} matches no known {expected} path")]
    Unknown {
        /// The key.
        key: String,
        /// What was expected ("metadata", "storage", "segment object",
        /// "subscription", ...).
        expected: &'static str,
    },
    /// A name inside the key is invalid.
    #[error("key {key:?}: {source}")]
    Name {
        /// The key.
        key: String,
        /// The invalid name.
        source: NameError,
    },
    /// A numeric part is not in its canonical form (decimal without leading
    /// zeros, or exactly 20 digits where padded) or does not fit.
    #[error("key {key:?}: {field} {value:?} is not a valid {form}")]
    Number {
        /// The key.
        key: String,
        /// Which number ("broker_id", "start_offset", ...).
        field: &'static str,
        /// The text found.
        value: String,
        /// The form expected.
        form: &'static str,
    },
    /// `/namespaces/{a}/topics/{b}/{topic}` with `a != b`.
    #[error("key {key:?}: namespace {outer:?} holds a topic of namespace {inner:?}")]
    NamespaceMismatch {
        /// The key.
        key: String,
        /// The namespace after `/namespaces/`.
        outer: String,
        /// The namespace of the registered topic.
        inner: String,
    },
    /// A segment object key whose end offset is below its start offset.
    #[error("key {key:?}: segment end offset {end} is below start offset {start}")]
    SegmentRange {
        /// The key.
        key: String,
        /// Start offset.
        start: u64,
        /// End offset.
        end: u64,
    },
}

fn canonical(key: &str, field: &'static str, value: &str) -> Result<u64, KeyParseError> {
    parse_canonical_u64(value).ok_or_else(|| KeyParseError::Number {
        key: key.to_owned(),
        field,
        value: value.to_owned(),
        form: "decimal u64 without leading zeros",
    })
}

pub(super) fn padded(key: &str, field: &'static str, value: &str) -> Result<u64, KeyParseError> {
    parse_padded_u64(value).ok_or_else(|| KeyParseError::Number {
        key: key.to_owned(),
        field,
        value: value.to_owned(),
        form: "20-digit zero-padded u64",
    })
}

pub(super) fn topic_in(
    key: &str,
    namespace: &str,
    topic: &str,
) -> Result<TopicName, KeyParseError> {
    let joined = format!("/{namespace}/{topic}");
    TopicName::new(&joined).map_err(|source| KeyParseError::Name {
        key: key.to_owned(),
        source,
    })
}

fn name_in<T, F>(key: &str, value: &str, make: F) -> Result<T, KeyParseError>
where
    F: FnOnce(&str) -> Result<T, NameError>,
{
    make(value).map_err(|source| KeyParseError::Name {
        key: key.to_owned(),
        source,
    })
}

// ---------------------------------------------------------------------------
// Metadata keys
// ---------------------------------------------------------------------------

/// The keys under `/topics/{ns}/{topic}`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum TopicKey {
    /// `/topics/{ns}/{topic}`: existence marker, value = partition count.
    Marker,
    /// `/topics/{ns}/{topic}/delivery`: `"Reliable"` or `"NonReliable"`.
    Delivery,
    /// `/topics/{ns}/{topic}/policy`: per-topic policy overrides.
    Policy,
    /// `/topics/{ns}/{topic}/intent`: the expanded stream settings.
    Intent,
    /// `/topics/{ns}/{topic}/producers/{producer_id}`.
    Producer {
        /// Producer id.
        producer_id: u64,
    },
    /// `/topics/{ns}/{topic}/holes/{first_offset:020}`: a declared hole
    /// (offsets no record is stored for), padded so holes list in offset
    /// order.
    Hole {
        /// First offset of the hole.
        first_offset: u64,
    },
    /// `/topics/{ns}/{topic}/idempotency/{hex key}`: what a central
    /// publish with an `Idempotency-Key` stored (or is storing), kept 24 h.
    Idempotency {
        /// The key's bytes as lowercase hex (2 to 400 digits).
        key_hex: String,
    },
    /// `/topics/{ns}/{topic}/subscriptions/{sub}` and its sub-keys.
    Subscription {
        /// Subscription name.
        name: SubscriptionName,
        /// Which key of the subscription.
        key: SubscriptionKey,
    },
}

/// The keys of one subscription.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SubscriptionKey {
    /// `.../subscriptions/{sub}`: subscription metadata.
    Metadata,
    /// `.../subscriptions/{sub}/cursor`: consumer progress offset (u64).
    Cursor,
    /// `.../subscriptions/{sub}/acked`: offsets finished above the cursor
    /// (acknowledged or dead-lettered out of order), with the cursor they
    /// belong to.
    Acked,
    /// `.../subscriptions/{sub}/failure_policy`.
    FailurePolicy,
    /// `.../subscriptions/{sub}/dispatch_config`.
    DispatchConfig,
}

impl SubscriptionKey {
    /// The path suffix after `/subscriptions/{sub}`, `""` for the metadata.
    fn suffix(self) -> &'static str {
        match self {
            SubscriptionKey::Metadata => "",
            SubscriptionKey::Cursor => "/cursor",
            SubscriptionKey::Acked => "/acked",
            SubscriptionKey::FailurePolicy => "/failure_policy",
            SubscriptionKey::DispatchConfig => "/dispatch_config",
        }
    }
}

/// Every metadata key outside the storage prefix.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum MetadataKey {
    /// `/cluster/leader`.
    ClusterLeader,
    /// `/cluster/id`: the cluster's identity
    /// ([`crate::cluster::ClusterId`], a JSON string), written once.
    ClusterId,
    /// `/cluster/register/{broker_id}` (written with a TTL).
    BrokerRegistration {
        /// Broker id.
        broker_id: u64,
    },
    /// `/cluster/brokers/{broker_id}/state`.
    BrokerState {
        /// Broker id.
        broker_id: u64,
    },
    /// `/cluster/brokers/{broker_id}/{ns}/{topic}`: assignment marker.
    BrokerAssignment {
        /// Broker id.
        broker_id: u64,
        /// Assigned topic.
        topic: TopicName,
    },
    /// `/cluster/unassigned/{ns}/{topic}`.
    Unassigned {
        /// Topic awaiting assignment.
        topic: TopicName,
    },
    /// `/cluster/load/{broker_id}`.
    BrokerLoad {
        /// Broker id.
        broker_id: u64,
    },
    /// `/cluster/load_balance`.
    LoadBalance,
    /// `/cluster/rebalancing_history/{timestamp_ms:020}`: padded so entries
    /// list in time order.
    RebalancingHistory {
        /// When the move happened, ms since the Unix epoch.
        timestamp_ms: u64,
    },
    /// `/namespaces/{ns}/policy`.
    NamespacePolicy {
        /// Namespace.
        namespace: NamespaceName,
    },
    /// `/namespaces/{ns}/topics/{ns}/{topic}`: topic registry entry.
    NamespaceTopic {
        /// The registered topic (its namespace is the outer one).
        topic: TopicName,
    },
    /// `/topics/{ns}/{topic}` and its sub-keys.
    Topic {
        /// The topic.
        topic: TopicName,
        /// Which key.
        key: TopicKey,
    },
    /// `/schemas/_global/next_schema_id`.
    NextSchemaId,
    /// `/schemas/{subject}/metadata`.
    SchemaMetadata {
        /// Subject.
        subject: SubjectName,
    },
    /// `/schemas/{subject}/compatibility`.
    SchemaCompatibility {
        /// Subject.
        subject: SubjectName,
    },
    /// `/schemas/_index/by_id/{schema_id}`.
    SchemaById {
        /// Schema id.
        schema_id: u64,
    },
    /// `/auth/roles/{role}`.
    AuthRole {
        /// Role.
        role: RoleName,
    },
    /// `/auth/bindings/{binding_id}`.
    AuthBinding {
        /// Binding id.
        binding: BindingId,
    },
    /// `/auth/principals/{name}`: a principal (never its token, only the
    /// token's SHA-256).
    AuthPrincipal {
        /// Principal.
        principal: PrincipalName,
    },
    /// `/auth/enrollments/{edge_id}`: the edge's enrollment token (never
    /// the token, only its SHA-256), its expiry and whether it was used.
    AuthEnrollment {
        /// The edge id (also its namespace).
        edge: NamespaceName,
    },
    /// `/auth/revoked_edges/{edge_id}`: the edge's certificates issued up
    /// to the revocation time are refused by every broker.
    AuthRevokedEdge {
        /// The edge id (also its namespace).
        edge: NamespaceName,
    },
    /// `/edge/checkpoints/{ns}/{topic}`: last replicated offset (u64).
    EdgeCheckpoint {
        /// The edge topic.
        topic: TopicName,
    },
    /// `/edge/archived/{ns}/{topic}`: the archived offset the broker last
    /// reported (u64): everything below it is committed in the archive.
    EdgeArchived {
        /// The edge topic.
        topic: TopicName,
    },
    /// `/edge/cluster`: the id of the central cluster this edge's
    /// checkpoints and archived offsets belong to (a JSON string), written
    /// on its first replication stream to a cluster that sends one.
    EdgeCluster,
    /// `/fleet/edges/{edge_id}/{broker_id}`: what broker `broker_id` knows
    /// of edge `edge_id`'s replication connections (central store; JSON
    /// `tributary_proto::fleet::EdgeEntry`).
    FleetEdge {
        /// The edge id (the namespace it writes to).
        edge: NamespaceName,
        /// The broker that wrote the entry.
        broker_id: u64,
    },
}

impl fmt::Display for MetadataKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MetadataKey::ClusterLeader => f.write_str("/cluster/leader"),
            MetadataKey::ClusterId => f.write_str("/cluster/id"),
            MetadataKey::BrokerRegistration { broker_id } => {
                write!(f, "/cluster/register/{broker_id}")
            }
            MetadataKey::BrokerState { broker_id } => {
                write!(f, "/cluster/brokers/{broker_id}/state")
            }
            MetadataKey::BrokerAssignment { broker_id, topic } => {
                write!(f, "/cluster/brokers/{broker_id}{topic}")
            }
            MetadataKey::Unassigned { topic } => write!(f, "/cluster/unassigned{topic}"),
            MetadataKey::BrokerLoad { broker_id } => write!(f, "/cluster/load/{broker_id}"),
            MetadataKey::LoadBalance => f.write_str("/cluster/load_balance"),
            MetadataKey::RebalancingHistory { timestamp_ms } => {
                write!(f, "/cluster/rebalancing_history/{timestamp_ms:020}")
            }
            MetadataKey::NamespacePolicy { namespace } => {
                write!(f, "/namespaces/{namespace}/policy")
            }
            MetadataKey::NamespaceTopic { topic } => {
                write!(f, "/namespaces/{}/topics{topic}", topic.namespace())
            }
            MetadataKey::Topic { topic, key } => {
                write!(f, "/topics{topic}")?;
                match key {
                    TopicKey::Marker => Ok(()),
                    TopicKey::Delivery => f.write_str("/delivery"),
                    TopicKey::Policy => f.write_str("/policy"),
                    TopicKey::Intent => f.write_str("/intent"),
                    TopicKey::Producer { producer_id } => write!(f, "/producers/{producer_id}"),
                    TopicKey::Hole { first_offset } => write!(f, "/holes/{first_offset:020}"),
                    TopicKey::Idempotency { key_hex } => write!(f, "/idempotency/{key_hex}"),
                    TopicKey::Subscription { name, key } => {
                        write!(f, "/subscriptions/{name}{}", key.suffix())
                    }
                }
            }
            MetadataKey::NextSchemaId => f.write_str("/schemas/_global/next_schema_id"),
            MetadataKey::SchemaMetadata { subject } => write!(f, "/schemas/{subject}/metadata"),
            MetadataKey::SchemaCompatibility { subject } => {
                write!(f, "/schemas/{subject}/compatibility")
            }
            MetadataKey::SchemaById { schema_id } => {
                write!(f, "/schemas/_index/by_id/{schema_id}")
            }
            MetadataKey::AuthRole { role } => write!(f, "/auth/roles/{role}"),
            MetadataKey::AuthBinding { binding } => write!(f, "/auth/bindings/{binding}"),
            MetadataKey::AuthPrincipal { principal } => {
                write!(f, "/auth/principals/{principal}")
            }
            MetadataKey::AuthEnrollment { edge } => write!(f, "/auth/enrollments/{edge}"),
            MetadataKey::AuthRevokedEdge { edge } => write!(f, "/auth/revoked_edges/{edge}"),
            MetadataKey::EdgeCheckpoint { topic } => write!(f, "/edge/checkpoints{topic}"),
            MetadataKey::EdgeArchived { topic } => write!(f, "/edge/archived{topic}"),
            MetadataKey::EdgeCluster => f.write_str("/edge/cluster"),
            MetadataKey::FleetEdge { edge, broker_id } => {
                write!(f, "/fleet/edges/{edge}/{broker_id}")
            }
        }
    }
}

impl MetadataKey {
    /// Parses a metadata key; the inverse of `Display`.
    ///
    /// # Errors
    /// [`KeyParseError`] when the key matches no path, holds an invalid name
    /// or a non-canonical number.
    pub fn parse(key: &str) -> Result<MetadataKey, KeyParseError> {
        let unknown = || KeyParseError::Unknown {
            key: key.to_owned(),
            expected: "metadata",
        };
        let Some(rest) = key.strip_prefix('/') else {
            return Err(unknown());
        };
        let parts: Vec<&str> = rest.split('/').collect();
        let parsed = match parts.as_slice() {
            ["cluster", "leader"] => MetadataKey::ClusterLeader,
            ["cluster", "id"] => MetadataKey::ClusterId,
            ["cluster", "register", id] => MetadataKey::BrokerRegistration {
                broker_id: canonical(key, "broker_id", id)?,
            },
            ["cluster", "brokers", id, "state"] => MetadataKey::BrokerState {
                broker_id: canonical(key, "broker_id", id)?,
            },
            ["cluster", "brokers", id, ns, topic] => MetadataKey::BrokerAssignment {
                broker_id: canonical(key, "broker_id", id)?,
                topic: topic_in(key, ns, topic)?,
            },
            ["cluster", "unassigned", ns, topic] => MetadataKey::Unassigned {
                topic: topic_in(key, ns, topic)?,
            },
            ["cluster", "load", id] => MetadataKey::BrokerLoad {
                broker_id: canonical(key, "broker_id", id)?,
            },
            ["cluster", "load_balance"] => MetadataKey::LoadBalance,
            ["cluster", "rebalancing_history", ts] => MetadataKey::RebalancingHistory {
                timestamp_ms: padded(key, "timestamp_ms", ts)?,
            },
            ["namespaces", ns, "policy"] => MetadataKey::NamespacePolicy {
                namespace: name_in(key, ns, NamespaceName::new)?,
            },
            ["namespaces", outer, "topics", inner, topic] => {
                let topic = topic_in(key, inner, topic)?;
                if outer != inner {
                    // Validate the outer one too, so the error names the
                    // real problem when it is also malformed.
                    name_in(key, outer, NamespaceName::new)?;
                    return Err(KeyParseError::NamespaceMismatch {
                        key: key.to_owned(),
                        outer: (*outer).to_owned(),
                        inner: (*inner).to_owned(),
                    });
                }
                MetadataKey::NamespaceTopic { topic }
            }
            ["topics", ns, topic, tail @ ..] => MetadataKey::Topic {
                topic: topic_in(key, ns, topic)?,
                key: match tail {
                    [] => TopicKey::Marker,
                    ["delivery"] => TopicKey::Delivery,
                    ["policy"] => TopicKey::Policy,
                    ["intent"] => TopicKey::Intent,
                    ["producers", id] => TopicKey::Producer {
                        producer_id: canonical(key, "producer_id", id)?,
                    },
                    ["holes", first] => TopicKey::Hole {
                        first_offset: padded(key, "first_offset", first)?,
                    },
                    ["idempotency", hex]
                        if (2..=400).contains(&hex.len())
                            && hex.len() % 2 == 0
                            && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) =>
                    {
                        TopicKey::Idempotency {
                            key_hex: (*hex).to_owned(),
                        }
                    }
                    ["subscriptions", sub, sub_tail @ ..] => TopicKey::Subscription {
                        name: name_in(key, sub, SubscriptionName::new)?,
                        key: match sub_tail {
                            [] => SubscriptionKey::Metadata,
                            ["cursor"] => SubscriptionKey::Cursor,
                            ["acked"] => SubscriptionKey::Acked,
                            ["failure_policy"] => SubscriptionKey::FailurePolicy,
                            ["dispatch_config"] => SubscriptionKey::DispatchConfig,
                            _ => return Err(unknown()),
                        },
                    },
                    _ => return Err(unknown()),
                },
            },
            ["schemas", "_global", "next_schema_id"] => MetadataKey::NextSchemaId,
            ["schemas", "_index", "by_id", id] => MetadataKey::SchemaById {
                schema_id: canonical(key, "schema_id", id)?,
            },
            ["schemas", subject, "metadata"] => MetadataKey::SchemaMetadata {
                subject: name_in(key, subject, SubjectName::new)?,
            },
            ["schemas", subject, "compatibility"] => MetadataKey::SchemaCompatibility {
                subject: name_in(key, subject, SubjectName::new)?,
            },
            ["auth", "roles", role] => MetadataKey::AuthRole {
                role: name_in(key, role, RoleName::new)?,
            },
            ["auth", "bindings", id] => MetadataKey::AuthBinding {
                binding: name_in(key, id, BindingId::new)?,
            },
            ["auth", "principals", name] => MetadataKey::AuthPrincipal {
                principal: name_in(key, name, PrincipalName::new)?,
            },
            ["auth", "enrollments", edge] => MetadataKey::AuthEnrollment {
                edge: name_in(key, edge, NamespaceName::new)?,
            },
            ["auth", "revoked_edges", edge] => MetadataKey::AuthRevokedEdge {
                edge: name_in(key, edge, NamespaceName::new)?,
            },
            ["edge", "checkpoints", ns, topic] => MetadataKey::EdgeCheckpoint {
                topic: topic_in(key, ns, topic)?,
            },
            ["edge", "archived", ns, topic] => MetadataKey::EdgeArchived {
                topic: topic_in(key, ns, topic)?,
            },
            ["edge", "cluster"] => MetadataKey::EdgeCluster,
            ["fleet", "edges", edge, id] => MetadataKey::FleetEdge {
                edge: name_in(key, edge, NamespaceName::new)?,
                broker_id: canonical(key, "broker_id", id)?,
            },
            _ => return Err(unknown()),
        };
        Ok(parsed)
    }

    /// The topic this key belongs to, for the keys that carry one.
    pub fn topic(&self) -> Option<&TopicName> {
        match self {
            MetadataKey::BrokerAssignment { topic, .. }
            | MetadataKey::Unassigned { topic }
            | MetadataKey::NamespaceTopic { topic }
            | MetadataKey::Topic { topic, .. }
            | MetadataKey::EdgeCheckpoint { topic }
            | MetadataKey::EdgeArchived { topic } => Some(topic),
            _ => None,
        }
    }
}

impl FromStr for MetadataKey {
    type Err = KeyParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        MetadataKey::parse(s)
    }
}

/// The topic of a topic-carrying key (`/topics/...`, `/edge/checkpoints/...`,
/// `/cluster/unassigned/...`, `/cluster/brokers/{id}/{ns}/{topic}`,
/// `/namespaces/{ns}/topics/...`).
///
/// # Errors
/// [`KeyParseError`] when the key does not parse or carries no topic.
pub fn parse_topic(key: &str) -> Result<TopicName, KeyParseError> {
    match MetadataKey::parse(key)? {
        MetadataKey::BrokerAssignment { topic, .. }
        | MetadataKey::Unassigned { topic }
        | MetadataKey::NamespaceTopic { topic }
        | MetadataKey::Topic { topic, .. }
        | MetadataKey::EdgeCheckpoint { topic }
        | MetadataKey::EdgeArchived { topic } => Ok(topic),
        _ => Err(KeyParseError::Unknown {
            key: key.to_owned(),
            expected: "topic-carrying",
        }),
    }
}

/// The topic, subscription name and key kind of a subscription key
/// (`/topics/{ns}/{topic}/subscriptions/{sub}[/cursor|/failure_policy|/dispatch_config]`).
///
/// # Errors
/// [`KeyParseError`] when the key is not a subscription key.
pub fn parse_subscription_key(
    key: &str,
) -> Result<(TopicName, SubscriptionName, SubscriptionKey), KeyParseError> {
    match MetadataKey::parse(key)? {
        MetadataKey::Topic {
            topic,
            key: TopicKey::Subscription { name, key: kind },
        } => Ok((topic, name, kind)),
        _ => Err(KeyParseError::Unknown {
            key: key.to_owned(),
            expected: "subscription",
        }),
    }
}
