//! Topics: explicit creates from a [`TopicSpec`], implicit creates on a
//! first publish, the settings a WAL is loaded with, `describe`, listing and
//! deleting.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::json;
use tributary_api::admin::{
    CreateOutcome, DeleteOutcome, Difference, PlanAction, SubscriptionSummary, TopicDescription,
    TopicListEntry,
};
use tributary_proto::intent::{
    CLUSTER_DEFAULT_WAL_SYNC, Delivery, ExpandedStreamSettings, SubscriptionFailurePolicy,
};
use tributary_proto::keys::{
    self, MetadataKey, NamespaceName, SubscriptionKey, SubscriptionName, TopicName,
};

use super::{Catalog, CatalogError, TopicSpec, WRITE_ATTEMPTS, decode, decode_count};
use crate::metadata::{Txn, TxnOutcome};
use crate::wal::SyncMode;

/// The result of [`Catalog::create_implicit`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImplicitOutcome {
    /// Whether this call created the topic (false: it existed; its stored
    /// settings win).
    pub created: bool,
    /// Whether the namespace was created by this call.
    pub namespace_created: bool,
    /// The settings the topic is loaded with.
    pub settings: TopicLoadSettings,
}

/// What a broker needs when it loads a topic; read from metadata, never
/// from a client flag.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicLoadSettings {
    /// Dispatch strategy (`/delivery`).
    pub delivery: Delivery,
    /// The WAL sync mode: the intent's persisted `wal_sync_mode`, or
    /// [`CLUSTER_DEFAULT_WAL_SYNC`] for implicit topics.
    #[serde(with = "tributary_proto::intent::sync_mode_serde")]
    pub wal_sync_mode: SyncMode,
    /// The stored intent settings; `None` for implicit topics.
    pub intent: Option<ExpandedStreamSettings>,
}

impl Catalog<'_> {
    /// Creates an intent-backed topic and its partitions in one transaction
    /// (`seeds/000_d502aacc865e81b1.txt`, "Zero-Drift Raft Expansion"),
    /// creating its namespace too when missing.
    ///
    /// An existing topic with exactly these settings is
    /// [`PlanAction::Unchanged`]; a concurrent create of the same topic is
    /// detected by the preconditions and re-checked.
    ///
    /// # Errors
    /// [`CatalogError::TopicConflict`] naming every differing field (also
    /// when a partition name is taken by an existing topic);
    /// [`CatalogError::ConcurrentChange`]; [`CatalogError::Inconsistent`];
    /// [`CatalogError::Metadata`].
    pub async fn create_topic(&self, spec: &TopicSpec) -> Result<CreateOutcome, CatalogError> {
        let outcome = |action, namespace_created| CreateOutcome {
            topic: spec.name().clone(),
            action,
            intent: spec.intent(),
            partitions: spec.partitions(),
            namespace_created,
        };
        let mut failed_key = String::new();
        // The comparison reads key by key, not from one snapshot: a create
        // racing with ours can be seen half-way (partitions without their
        // parent). A conflict is reported only when two reads in a row agree.
        let mut seen_conflict: Option<Vec<Difference>> = None;
        for _ in 0..WRITE_ATTEMPTS {
            let comparison = self.compare(spec).await?;
            match comparison.action() {
                PlanAction::Unchanged => return Ok(outcome(PlanAction::Unchanged, false)),
                PlanAction::Create | PlanAction::Update
                    if seen_conflict.as_deref() != Some(comparison.differences())
                        && !comparison.differences().is_empty() =>
                {
                    seen_conflict = Some(comparison.differences().to_vec());
                    continue;
                }
                PlanAction::Create if comparison.differences().is_empty() => {
                    let (txn, namespace_created) = self
                        .add_namespace(&spec.name().namespace_name(), Txn::new())
                        .await?;
                    match self.store.txn(comparison.add_writes(txn)).await? {
                        TxnOutcome::Applied => {
                            return Ok(outcome(PlanAction::Create, namespace_created));
                        }
                        TxnOutcome::ConditionFailed { key, .. } => failed_key = key,
                    }
                }
                PlanAction::Create | PlanAction::Update => {
                    return Err(CatalogError::TopicConflict {
                        topic: spec.name().clone(),
                        differences: comparison.into_differences(),
                    });
                }
            }
        }
        Err(CatalogError::ConcurrentChange { key: failed_key })
    }

    /// Implicit creation on the first publish to an unknown topic, with the
    /// broker fallback of the seed table: delivery `NonReliable` unless
    /// `reliable_dispatch`, no `/intent` key (so the WAL uses
    /// [`CLUSTER_DEFAULT_WAL_SYNC`] and subscriptions get
    /// [`SubscriptionFailurePolicy::broker_fallback`]), non-partitioned. The
    /// namespace is created when missing. An existing topic is left as it is
    /// and its stored settings are returned.
    ///
    /// # Errors
    /// [`CatalogError::ConcurrentChange`], [`CatalogError::Inconsistent`],
    /// [`CatalogError::Metadata`].
    pub async fn create_implicit(
        &self,
        topic: &TopicName,
        reliable_dispatch: bool,
    ) -> Result<ImplicitOutcome, CatalogError> {
        let delivery = if reliable_dispatch {
            Delivery::Reliable
        } else {
            Delivery::NonReliable
        };
        let marker = keys::topics::marker(topic);
        let mut failed_key = String::new();
        for _ in 0..WRITE_ATTEMPTS {
            if self.store.get(&marker).await?.is_some() {
                return Ok(ImplicitOutcome {
                    created: false,
                    namespace_created: false,
                    settings: self.load_settings(topic).await?,
                });
            }
            let (mut txn, namespace_created) = self
                .add_namespace(&topic.namespace_name(), Txn::new())
                .await?;
            for (key, value) in [
                (marker.clone(), json!(0)),
                (keys::topics::delivery(topic), json!(delivery.as_str())),
                (keys::namespaces::topic(topic), json!(0)),
            ] {
                txn = txn.when_absent(key.clone()).put(key, value);
            }
            match self.store.txn(txn).await? {
                TxnOutcome::Applied => {
                    return Ok(ImplicitOutcome {
                        created: true,
                        namespace_created,
                        settings: TopicLoadSettings {
                            delivery,
                            wal_sync_mode: CLUSTER_DEFAULT_WAL_SYNC,
                            intent: None,
                        },
                    });
                }
                TxnOutcome::ConditionFailed { key, .. } => failed_key = key,
            }
        }
        Err(CatalogError::ConcurrentChange { key: failed_key })
    }

    /// The number of partitions of `topic` (`{topic}-part-N`), 0 for a
    /// topic that is not partitioned.
    ///
    /// # Errors
    /// [`CatalogError::TopicNotFound`]; [`CatalogError::Inconsistent`] for
    /// a marker that is not a count; [`CatalogError::Metadata`].
    pub async fn partition_count(&self, topic: &TopicName) -> Result<u32, CatalogError> {
        self.marker(topic).await
    }

    /// The stored partition count of `topic`.
    pub(super) async fn marker(&self, topic: &TopicName) -> Result<u32, CatalogError> {
        let key = keys::topics::marker(topic);
        match self.store.get(&key).await? {
            Some(value) => decode_count(&key, &value),
            None => Err(CatalogError::TopicNotFound {
                topic: topic.clone(),
            }),
        }
    }

    pub(super) async fn stored_intent(
        &self,
        topic: &TopicName,
    ) -> Result<Option<ExpandedStreamSettings>, CatalogError> {
        let key = keys::topics::intent(topic);
        self.store
            .get(&key)
            .await?
            .map(|value| decode(&key, value))
            .transpose()
    }

    /// The settings a broker loads `topic` with, read from metadata: the
    /// persisted `wal_sync_mode` of its intent, or
    /// [`CLUSTER_DEFAULT_WAL_SYNC`] for an implicit topic
    /// (`seeds/000_d502aacc865e81b1.txt`: "Whenever a broker loads or
    /// reloads a topic … it reads /intent").
    ///
    /// # Errors
    /// [`CatalogError::TopicNotFound`]; [`CatalogError::Inconsistent`] when
    /// neither `/delivery` nor `/intent` is stored or a value does not
    /// decode; [`CatalogError::Metadata`].
    pub async fn load_settings(
        &self,
        topic: &TopicName,
    ) -> Result<TopicLoadSettings, CatalogError> {
        self.marker(topic).await?;
        let intent = self.stored_intent(topic).await?;
        let delivery_key = keys::topics::delivery(topic);
        let delivery = match self.store.get(&delivery_key).await? {
            Some(value) => decode(&delivery_key, value)?,
            None => match &intent {
                Some(settings) => settings.delivery,
                None => {
                    return Err(CatalogError::inconsistent(
                        &delivery_key,
                        "topic has neither /delivery nor /intent",
                    ));
                }
            },
        };
        Ok(TopicLoadSettings {
            delivery,
            wal_sync_mode: intent
                .as_ref()
                .map_or(CLUSTER_DEFAULT_WAL_SYNC, |s| s.wal_sync_mode),
            intent,
        })
    }

    /// The WAL sync mode `topic` must be opened with; see
    /// [`Catalog::load_settings`].
    ///
    /// # Errors
    /// As [`Catalog::load_settings`].
    pub async fn sync_mode_for(&self, topic: &TopicName) -> Result<SyncMode, CatalogError> {
        Ok(self.load_settings(topic).await?.wal_sync_mode)
    }

    /// Describes `topic` (`seeds/000_d502aacc865e81b1.txt`, sample output of
    /// `describe`). `broker_candidates` are the broker ids whose assignment
    /// key `/cluster/brokers/{id}/{ns}/{topic}` is checked, in order (the
    /// cluster members).
    ///
    /// # Errors
    /// As [`Catalog::load_settings`].
    pub async fn describe(
        &self,
        topic: &TopicName,
        broker_candidates: &[u64],
    ) -> Result<TopicDescription, CatalogError> {
        let partitions = self.marker(topic).await?;
        let settings = self.load_settings(topic).await?;
        let mut broker_id = None;
        let mut epoch = None;
        for &id in broker_candidates {
            if let Some(assignment) = self
                .store
                .get(&keys::cluster::broker_assignment(id, topic))
                .await?
            {
                broker_id = Some(id);
                epoch = assignment.get("epoch").and_then(serde_json::Value::as_u64);
                break;
            }
        }
        let mut subscriptions: BTreeMap<SubscriptionName, Option<SubscriptionFailurePolicy>> =
            BTreeMap::new();
        for (key, value) in self
            .store
            .list(&keys::topics::subscriptions_prefix(topic))
            .await?
        {
            let Ok((_, name, kind)) = keys::parse_subscription_key(&key) else {
                continue;
            };
            let slot = subscriptions.entry(name).or_default();
            if kind == SubscriptionKey::FailurePolicy {
                *slot = Some(decode(&key, value)?);
            }
        }
        let partition_topics = (0..partitions)
            .map(|index| topic.partition(index))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| CatalogError::inconsistent(&keys::topics::marker(topic), e.to_string()))?;
        let intent_summary = match &settings.intent {
            Some(intent) => intent.summary(topic),
            None => format!(
                "none (implicit topic: wal_sync={}, broker fallback failure policy)",
                settings.wal_sync_mode
            ),
        };
        Ok(TopicDescription {
            topic: topic.clone(),
            broker_id,
            epoch,
            partitions,
            partition_topics,
            delivery: settings.delivery,
            wal_sync_mode: settings.wal_sync_mode,
            intent: settings.intent,
            intent_summary,
            subscriptions: subscriptions
                .into_iter()
                .map(|(name, failure_policy)| SubscriptionSummary {
                    name,
                    failure_policy,
                })
                .collect(),
        })
    }

    /// Topics of `namespace` (all namespaces when `None`), sorted by name.
    /// Partitions of a listed partitioned topic are not listed separately.
    ///
    /// # Errors
    /// [`CatalogError::NamespaceNotFound`]; [`CatalogError::Inconsistent`]
    /// for a registry value that is not a partition count;
    /// [`CatalogError::Metadata`].
    pub async fn list_topics(
        &self,
        namespace: Option<&NamespaceName>,
    ) -> Result<Vec<TopicListEntry>, CatalogError> {
        let prefix = match namespace {
            Some(ns) => {
                if !self.namespace_exists(ns).await? {
                    return Err(CatalogError::NamespaceNotFound {
                        namespace: ns.clone(),
                    });
                }
                keys::namespaces::topics_prefix(ns)
            }
            None => keys::namespaces::all_prefix(),
        };
        let mut topics = BTreeMap::new();
        for (key, value) in self.store.list(&prefix).await? {
            if let Ok(MetadataKey::NamespaceTopic { topic }) = MetadataKey::parse(&key) {
                topics.insert(topic, decode_count(&key, &value)?);
            }
        }
        let hidden: BTreeSet<TopicName> = topics
            .keys()
            .filter(|topic| {
                topic
                    .partition_of()
                    .is_some_and(|(parent, index)| topics.get(&parent).is_some_and(|&n| index < n))
            })
            .cloned()
            .collect();
        Ok(topics
            .into_iter()
            .filter(|(name, _)| !hidden.contains(name))
            .map(|(name, partitions)| TopicListEntry { name, partitions })
            .collect())
    }

    /// Deletes `topic`, its partitions and every key under them but their
    /// producers' state (`/topics/{ns}/{topic}/producers/`, kept with the
    /// log, which the delete does not remove), in one transaction
    /// conditional on the topic marker.
    ///
    /// # Errors
    /// [`CatalogError::TopicNotFound`]; [`CatalogError::IsPartition`] for a
    /// partition of an existing partitioned topic;
    /// [`CatalogError::ConcurrentChange`]; [`CatalogError::Metadata`] (also
    /// when the keys exceed one transaction).
    pub async fn delete_topic(&self, topic: &TopicName) -> Result<DeleteOutcome, CatalogError> {
        if let Some((parent, index)) = topic.partition_of()
            && let Ok(count) = self.marker(&parent).await
            && index < count
        {
            return Err(CatalogError::IsPartition {
                topic: topic.clone(),
                parent,
                index,
            });
        }
        let marker_key = keys::topics::marker(topic);
        let Some(marker) = self.store.get(&marker_key).await? else {
            return Err(CatalogError::TopicNotFound {
                topic: topic.clone(),
            });
        };
        let partitions = decode_count(&marker_key, &marker)?;
        let mut txn = Txn::new().when_equals(marker_key, marker);
        let mut deleted_keys = 0;
        let mut topics = vec![topic.clone()];
        for index in 0..partitions {
            topics.push(topic.partition(index).map_err(|e| {
                CatalogError::inconsistent(&keys::topics::marker(topic), e.to_string())
            })?);
        }
        for name in &topics {
            for key in [keys::topics::marker(name), keys::namespaces::topic(name)] {
                // A partition may lack a key when metadata was damaged.
                if self.store.get(&key).await?.is_some() {
                    deleted_keys += 1;
                    txn = txn.delete(key);
                }
            }
            // The producers' state (the writer markers, the edge's
            // sequences) describes the log on disk, which the delete keeps:
            // a topic created again under the name continues that log, so
            // it stays (without it the log's records counted as nobody's
            // and the topic took no central write again).
            let producers = keys::topics::producers_prefix(name);
            for (key, _) in self.store.list(&keys::topics::topic_prefix(name)).await? {
                if key.starts_with(&producers) {
                    continue;
                }
                deleted_keys += 1;
                txn = txn.delete(key);
            }
        }
        match self.store.txn(txn).await? {
            TxnOutcome::Applied => Ok(DeleteOutcome {
                topic: topic.clone(),
                partitions,
                deleted_keys,
                edge_fed: false,
                note: None,
            }),
            TxnOutcome::ConditionFailed { key, .. } => Err(CatalogError::ConcurrentChange { key }),
        }
    }
}
