//! Declarative `apply` (`seeds/000_d502aacc865e81b1.txt`, "Declarative
//! State"): the [`plan`] of a validated [`Manifest`] against the store (per
//! namespace and topic: create, update or unchanged) and [`apply`], which
//! writes all of it in one transaction, on top of the catalog's
//! [`Catalog::compare`] and [`Catalog::add_namespace`]; and `POST
//! /v1/apply`.
//!
//! **What `apply` may update.** Changing the intent of an existing topic
//! (including giving an implicit topic an intent) rewrites `/intent` and
//! `/delivery` of the topic and its partitions; the topic's WAL uses the
//! new sync mode the next time it is loaded, and subscriptions keep their
//! persisted failure policies (the seed never overwrites those); refused
//! for a topic an edge replicates into (field `intent`: the edge's
//! configuration owns its settings, and a different central intent stops
//! its replication). Growing
//! the partition count of a partitioned topic creates the new partitions.
//! Shrinking it, or turning a non-partitioned topic into a partitioned one
//! or back, would strand stored records and is refused
//! ([`ApplyError::ManifestConflict`], field `partitions`), as is a new
//! partition whose name an existing topic already has. `apply` never
//! deletes topics or namespaces that the manifest does not mention.

use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use broker_core::catalog::{Catalog, CatalogError};
use broker_core::metadata::{MAX_TXN_OPS, Txn, TxnOutcome};
use serde::Deserialize;
use serde_json::json;
use tributary_api::admin::{ApplyReport, ItemKind, ManifestIssue, Plan, PlanAction, PlanItem};
use tributary_proto::keys::{NamespaceName, TopicName};

use super::{AdminState, Manifest, ManifestErrors, parse_manifest};
use crate::http::{ApiError, ApiResult, ok, query};

/// File name used in manifest errors when the request names none.
pub const DEFAULT_MANIFEST_NAME: &str = "manifest";

/// Why a manifest was not applied; nothing of it was.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ApplyError {
    /// A manifest that does not validate (or whose plan does not fit one
    /// transaction); nothing was applied.
    #[error(transparent)]
    InvalidManifest(ManifestErrors),
    /// A valid manifest that asks for a change the catalog refuses
    /// (shrinking partitions, a taken partition name); nothing was applied.
    #[error(transparent)]
    ManifestConflict(ManifestErrors),
    /// The catalog failed (concurrent change, inconsistent or failing
    /// store).
    #[error(transparent)]
    Catalog(#[from] CatalogError),
}

/// `400 invalid_manifest` / `409 manifest_conflict` with every issue in
/// `errors`; catalog errors as in [`super`].
impl From<ApplyError> for ApiError {
    fn from(err: ApplyError) -> ApiError {
        let message = err.to_string();
        match err {
            ApplyError::InvalidManifest(errors) => {
                ApiError::new(StatusCode::BAD_REQUEST, "invalid_manifest", message)
                    .with("errors", json!(errors.issues))
            }
            ApplyError::ManifestConflict(errors) => {
                ApiError::new(StatusCode::CONFLICT, "manifest_conflict", message)
                    .with("errors", json!(errors.issues))
            }
            ApplyError::Catalog(err) => err.into(),
        }
    }
}

/// The plan of `manifest` against the store of `catalog`, without writing.
///
/// # Errors
/// As [`apply`].
pub async fn plan(catalog: &Catalog<'_>, manifest: &Manifest) -> Result<Plan, ApplyError> {
    Ok(prepare(catalog, manifest).await?.0)
}

/// Computes the plan and the one transaction that carries it out.
async fn prepare(catalog: &Catalog<'_>, manifest: &Manifest) -> Result<(Plan, Txn), ApplyError> {
    let file = manifest.file();
    let mut plan = Plan::default();
    let mut txn = Txn::new();

    let mut namespaces: Vec<NamespaceName> = manifest.namespaces().to_vec();
    for spec in manifest.topics() {
        let ns = spec.name().namespace_name();
        if !namespaces.contains(&ns) {
            namespaces.push(ns);
        }
    }
    for namespace in &namespaces {
        let (next, created) = catalog.add_namespace(namespace, txn).await?;
        txn = next;
        plan.items.push(PlanItem {
            kind: ItemKind::Namespace,
            name: namespace.to_string(),
            action: if created {
                PlanAction::Create
            } else {
                PlanAction::Unchanged
            },
            intent: None,
            partitions: None,
            changes: Vec::new(),
        });
    }

    let mut issues = Vec::new();
    for (index, spec) in manifest.topics().iter().enumerate() {
        let comparison = catalog.compare(spec).await?;
        let action = comparison.action();
        // An edge that replicates into the topic sends its own intent at
        // every connection, and a different central one refuses its
        // stream from then on (a config trial): the edge's configuration
        // owns the settings of a topic it feeds.
        let intent_changes = action == PlanAction::Update
            && comparison.differences().iter().any(|d| d.field == "intent");
        let edge_fed = intent_changes
            && crate::replication::topics::Writer::Edge
                .writes(catalog.store(), spec.name())
                .await
                .map_err(CatalogError::from)?;
        let refusal = match (action, comparison.existing_partitions()) {
            _ if edge_fed => Some((
                "intent",
                "an edge replicates into this topic: its intent comes from the edge's \
                 configuration ([[topics]] intent), and a different one here would stop \
                 that replication; a topic keeps its settings for its life (to change them, \
                 recreate it under another name on both sides)"
                    .to_owned(),
            )),
            _ if !comparison.taken().is_empty() => {
                let names: Vec<&str> = comparison.taken().iter().map(TopicName::as_str).collect();
                Some((
                    "partitions",
                    format!(
                        "partition names already used by existing topics: {}",
                        names.join(", ")
                    ),
                ))
            }
            (PlanAction::Update, Some(existing))
                if existing != spec.partitions()
                    && !(existing > 0 && spec.partitions() > existing) =>
            {
                Some((
                    "partitions",
                    format!(
                        "existing topic has {existing} partitions, requested {}; \
                         only a partitioned topic's partition count can grow",
                        spec.partitions()
                    ),
                ))
            }
            _ => None,
        };
        if let Some((field, message)) = refusal {
            issues.push(ManifestIssue::entry(
                file,
                "topics",
                index,
                Some(spec.name().as_str()),
                Some(field),
                message,
            ));
            continue;
        }
        txn = match action {
            PlanAction::Unchanged => comparison.add_guards(txn),
            PlanAction::Create | PlanAction::Update => comparison.add_writes(txn),
        };
        if intent_changes {
            // An edge's first contact between this read and the commit
            // fails the transaction (a concurrent change) instead.
            txn = txn.when_absent(crate::replication::topics::Writer::Edge.marker_key(spec.name()));
        }
        plan.items.push(PlanItem {
            kind: ItemKind::Topic,
            name: spec.name().to_string(),
            action,
            intent: Some(spec.intent()),
            partitions: Some(spec.partitions()),
            changes: if action == PlanAction::Update {
                comparison.into_differences()
            } else {
                Vec::new()
            },
        });
    }
    if !issues.is_empty() {
        return Err(ApplyError::ManifestConflict(ManifestErrors {
            file: file.to_owned(),
            issues,
        }));
    }
    let size = txn.preconditions.len() + txn.ops.len();
    if size > MAX_TXN_OPS {
        return Err(ApplyError::InvalidManifest(ManifestErrors::document(
            file,
            format!(
                "applying needs {size} preconditions and writes in one atomic \
                 transaction, at most {MAX_TXN_OPS}; split the manifest"
            ),
        )));
    }
    Ok((plan, txn))
}

/// Applies `manifest` all or nothing (`seeds/000_d502aacc865e81b1.txt`,
/// "Declarative State"): computes the plan (create / update / unchanged
/// per namespace and topic) and, unless `dry_run`, writes all of it in
/// one transaction whose preconditions pin everything the plan read.
/// Applying the same manifest again plans everything `unchanged` and
/// writes nothing.
///
/// # Errors
/// [`ApplyError::ManifestConflict`] for refused updates (shrinking or
/// reshaping partitions, partition names taken), listing every entry;
/// [`ApplyError::InvalidManifest`] when the plan does not fit one
/// transaction; [`CatalogError::ConcurrentChange`] when the metadata
/// changed between planning and committing (nothing applied);
/// [`CatalogError::Inconsistent`]; [`CatalogError::Metadata`].
pub async fn apply(
    catalog: &Catalog<'_>,
    manifest: &Manifest,
    dry_run: bool,
) -> Result<ApplyReport, ApplyError> {
    let (plan, txn) = prepare(catalog, manifest).await?;
    let has_writes = plan.items.iter().any(|i| i.action != PlanAction::Unchanged);
    if dry_run || !has_writes {
        return Ok(ApplyReport {
            dry_run,
            committed: false,
            plan,
        });
    }
    match catalog.store().txn(txn).await.map_err(CatalogError::from)? {
        TxnOutcome::Applied => Ok(ApplyReport {
            dry_run,
            committed: true,
            plan,
        }),
        TxnOutcome::ConditionFailed { key, .. } => {
            Err(CatalogError::ConcurrentChange { key }.into())
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ApplyQuery {
    #[serde(default)]
    dry_run: bool,
    file: Option<String>,
}

pub(super) async fn apply_manifest(
    State(state): State<AdminState>,
    params: Result<Query<ApplyQuery>, QueryRejection>,
    body: Bytes,
) -> ApiResult {
    let params = query(params)?;
    let file = params
        .file
        .unwrap_or_else(|| DEFAULT_MANIFEST_NAME.to_owned());
    // YAML parsing is CPU work whose time a body can inflate: off the
    // async workers, so no request can stall the runtime (/health, the
    // Raft lease).
    let manifest = tokio::task::spawn_blocking(move || parse_manifest(&file, &body))
        .await
        .map_err(|e| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                format!("parsing the manifest failed: {e}"),
            )
        })?
        .map_err(ApplyError::InvalidManifest)?;
    let report = apply(&Catalog::new(&*state.store), &manifest, params.dry_run).await?;
    ok(StatusCode::OK, report)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::atomic::{AtomicBool, Ordering};

    use broker_core::metadata::redb::RedbStore;
    use broker_core::metadata::{BoxFuture, MetadataError, MetadataStore, Watch};
    use serde_json::Value;

    use super::*;

    use broker_core::catalog::fixture::{
        CatalogFixture as Fixture, default_ns_policy, fixture, topic, topic_keys,
    };

    // ---- manifests and apply ------------------------------------------------

    fn seed_manifest() -> Value {
        json!({
            "namespaces": ["agents"],
            "topics": [
                {"name": "/agents/events", "intent": "agent_event_mesh", "partitions": 3},
                {"name": "/agents/tasks", "intent": "task_queue", "partitions": 6},
                {"name": "/agents/tool-audit", "intent": "tool_invocation_log"}
            ]
        })
    }

    fn manifest(value: &Value) -> Manifest {
        Manifest::from_value("cluster-topology.yaml", value).unwrap()
    }

    #[tokio::test]
    async fn apply_the_seed_manifest_then_again_unchanged() {
        let f = fixture();
        let c = f.catalog();
        let m = manifest(&seed_manifest());
        let dry = apply(&c, &m, true).await.unwrap();
        assert_eq!(
            serde_json::to_value(&dry).unwrap(),
            json!({
                "dry_run": true,
                "committed": false,
                "plan": {"items": [
                    {"kind": "namespace", "name": "agents", "action": "create",
                     "intent": null, "partitions": null, "changes": []},
                    {"kind": "topic", "name": "/agents/events", "action": "create",
                     "intent": "event_stream", "partitions": 3, "changes": []},
                    {"kind": "topic", "name": "/agents/tasks", "action": "create",
                     "intent": "task_queue", "partitions": 6, "changes": []},
                    {"kind": "topic", "name": "/agents/tool-audit", "action": "create",
                     "intent": "audit_log", "partitions": 0, "changes": []}
                ]}
            })
        );
        assert!(f.dump().await.is_empty(), "a dry run writes nothing");

        let applied = apply(&c, &m, false).await.unwrap();
        assert!(applied.committed);
        assert_eq!(applied.plan, dry.plan);
        let mut expected = BTreeMap::new();
        expected.insert("/namespaces/agents/policy".to_owned(), default_ns_policy());
        expected.extend(topic_keys("agents", "events", "event_stream", 3));
        expected.extend(topic_keys("agents", "tasks", "task_queue", 6));
        expected.extend(topic_keys("agents", "tool-audit", "audit_log", 0));
        assert_eq!(f.dump().await, expected);

        let again = apply(&c, &m, false).await.unwrap();
        assert!(!again.committed);
        assert!(
            again
                .plan
                .items
                .iter()
                .all(|item| item.action == PlanAction::Unchanged),
            "{again:?}"
        );
        assert_eq!(again.plan.count(PlanAction::Unchanged), 4);
        assert_eq!(f.dump().await, expected);
    }

    #[tokio::test]
    async fn apply_updates_intents_and_grows_partitions() {
        let f = fixture();
        let c = f.catalog();
        apply(&c, &manifest(&seed_manifest()), false).await.unwrap();
        c.create_implicit(&topic("/agents/auto"), false)
            .await
            .unwrap();
        let changed = json!({
            "topics": [
                {"name": "/agents/events", "intent": "task_queue", "partitions": 3},
                {"name": "/agents/tasks", "intent": "tasks", "partitions": 8},
                {"name": "/agents/tool-audit", "intent": "audit_log", "partitions": 0},
                {"name": "/agents/auto", "intent": "realtime"}
            ]
        });
        let report = apply(&c, &manifest(&changed), false).await.unwrap();
        assert!(report.committed);
        assert_eq!(
            serde_json::to_value(&report.plan).unwrap(),
            json!({"items": [
                {"kind": "namespace", "name": "agents", "action": "unchanged",
                 "intent": null, "partitions": null, "changes": []},
                {"kind": "topic", "name": "/agents/events", "action": "update",
                 "intent": "task_queue", "partitions": 3, "changes": [
                    {"field": "intent", "existing": "event_stream", "requested": "task_queue"}
                 ]},
                {"kind": "topic", "name": "/agents/tasks", "action": "update",
                 "intent": "task_queue", "partitions": 8, "changes": [
                    {"field": "partitions", "existing": "6", "requested": "8"}
                 ]},
                {"kind": "topic", "name": "/agents/tool-audit", "action": "unchanged",
                 "intent": "audit_log", "partitions": 0, "changes": []},
                {"kind": "topic", "name": "/agents/auto", "action": "update",
                 "intent": "realtime", "partitions": 0, "changes": [
                    {"field": "intent", "existing": "none (implicit topic)", "requested": "realtime"}
                 ]}
            ]})
        );
        let mut expected = BTreeMap::new();
        expected.insert("/namespaces/agents/policy".to_owned(), default_ns_policy());
        expected.extend(topic_keys("agents", "events", "task_queue", 3));
        expected.extend(topic_keys("agents", "tasks", "task_queue", 8));
        expected.extend(topic_keys("agents", "tool-audit", "audit_log", 0));
        expected.extend(topic_keys("agents", "auto", "realtime", 0));
        assert_eq!(f.dump().await, expected);
        let again = apply(&c, &manifest(&changed), false).await.unwrap();
        assert_eq!(again.plan.count(PlanAction::Unchanged), 5);
    }

    /// A config trial: an intent change applied to a topic an edge
    /// replicates into stopped that replication at the edge's next
    /// connection. Refused, naming the field; nothing written.
    #[tokio::test]
    async fn an_intent_change_of_a_topic_an_edge_feeds_is_refused() {
        let f = fixture();
        let c = f.catalog();
        apply(&c, &manifest(&seed_manifest()), false).await.unwrap();
        let marker = tributary_proto::keys::topics::producer(
            &topic("/agents/tool-audit"),
            crate::replication::topics::EDGE_PRODUCER_ID,
        );
        c.store()
            .put(&marker, json!({"kind": "edge"}))
            .await
            .unwrap();
        let before = f.dump().await;
        let changed = json!({
            "topics": [{"name": "/agents/tool-audit", "intent": "task_queue"}]
        });
        let err = apply(&c, &manifest(&changed), false).await.unwrap_err();
        let ApplyError::ManifestConflict(errors) = &err else {
            panic!("{err:?}");
        };
        let lines: Vec<String> = errors.issues.iter().map(ToString::to_string).collect();
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(
            lines[0].starts_with(
                "cluster-topology.yaml: topics[0] (/agents/tool-audit): intent: an edge \
                 replicates into this topic"
            ),
            "{lines:?}"
        );
        assert_eq!(f.dump().await, before, "nothing written");
        // The same manifest as stored still applies (nothing to change).
        let report = apply(&c, &manifest(&seed_manifest()), false).await.unwrap();
        assert!(!report.committed);
    }

    #[tokio::test]
    async fn refused_updates_apply_nothing() {
        let f = fixture();
        let c = f.catalog();
        apply(&c, &manifest(&seed_manifest()), false).await.unwrap();
        let before = f.dump().await;
        let doc = json!({
            "namespaces": ["fresh"],
            "topics": [
                {"name": "/fresh/new", "intent": "task_queue"},
                {"name": "/agents/tasks", "intent": "task_queue", "partitions": 4},
                {"name": "/agents/tool-audit", "intent": "audit_log", "partitions": 2},
                {"name": "/agents/events", "intent": "event_stream", "partitions": 0}
            ]
        });
        let err = apply(&c, &manifest(&doc), false).await.unwrap_err();
        let ApplyError::ManifestConflict(errors) = &err else {
            panic!("{err:?}");
        };
        let lines: Vec<String> = errors.issues.iter().map(ToString::to_string).collect();
        assert_eq!(
            lines,
            [
                "cluster-topology.yaml: topics[1] (/agents/tasks): partitions: existing topic \
                 has 6 partitions, requested 4; only a partitioned topic's partition count can grow",
                "cluster-topology.yaml: topics[2] (/agents/tool-audit): partitions: existing \
                 topic has 0 partitions, requested 2; only a partitioned topic's partition count \
                 can grow",
                "cluster-topology.yaml: topics[3] (/agents/events): partitions: existing topic \
                 has 3 partitions, requested 0; only a partitioned topic's partition count can grow",
            ]
        );
        assert_eq!(f.dump().await, before, "not even /fresh/new was created");
        assert!(matches!(
            apply(&c, &manifest(&doc), true).await,
            Err(ApplyError::ManifestConflict(_))
        ));
    }

    #[tokio::test]
    async fn apply_refuses_partition_names_taken_by_other_topics() {
        let f = fixture();
        let c = f.catalog();
        apply(&c, &manifest(&seed_manifest()), false).await.unwrap();
        c.create_implicit(&topic("/agents/tasks-part-7"), false)
            .await
            .unwrap();
        c.create_implicit(&topic("/agents/new-part-0"), false)
            .await
            .unwrap();
        let before = f.dump().await;
        let doc = json!({"topics": [
            {"name": "/agents/tasks", "intent": "task_queue", "partitions": 8},
            {"name": "/agents/new", "intent": "task_queue", "partitions": 2}
        ]});
        let err = apply(&c, &manifest(&doc), false).await.unwrap_err();
        let ApplyError::ManifestConflict(errors) = &err else {
            panic!("{err:?}");
        };
        let lines: Vec<String> = errors.issues.iter().map(ToString::to_string).collect();
        assert_eq!(
            lines,
            [
                "cluster-topology.yaml: topics[0] (/agents/tasks): partitions: partition names \
                 already used by existing topics: /agents/tasks-part-7",
                "cluster-topology.yaml: topics[1] (/agents/new): partitions: partition names \
                 already used by existing topics: /agents/new-part-0",
            ]
        );
        assert_eq!(f.dump().await, before);
    }

    #[tokio::test]
    async fn a_manifest_larger_than_one_transaction_is_refused() {
        let f = fixture();
        let topics: Vec<Value> = (0..3)
            .map(|i| json!({"name": format!("/big/t{i}"), "intent": "tasks", "partitions": 256}))
            .collect();
        let m = manifest(&json!({ "topics": topics }));
        let err = apply(&f.catalog(), &m, false).await.unwrap_err();
        assert_eq!(
            err.to_string(),
            "manifest cluster-topology.yaml: applying needs 6170 preconditions and writes in \
             one atomic transaction, at most 4096; split the manifest; nothing applied"
        );
        assert!(f.dump().await.is_empty());
    }

    /// A store that makes one write of its own just before the first
    /// transaction it is asked to apply: a concurrent admin.
    struct Interfering {
        inner: RedbStore,
        key: String,
        armed: AtomicBool,
    }

    impl MetadataStore for Interfering {
        fn get<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Value>, MetadataError>> {
            self.inner.get(key)
        }

        fn txn(&self, txn: Txn) -> BoxFuture<'_, Result<TxnOutcome, MetadataError>> {
            Box::pin(async move {
                if self.armed.swap(false, Ordering::SeqCst) {
                    self.inner.put(&self.key, json!(9)).await?;
                }
                self.inner.txn(txn).await
            })
        }

        fn delete<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<bool, MetadataError>> {
            self.inner.delete(key)
        }

        fn list<'a>(
            &'a self,
            prefix: &'a str,
        ) -> BoxFuture<'a, Result<Vec<(String, Value)>, MetadataError>> {
            self.inner.list(prefix)
        }

        fn watch<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Watch, MetadataError>> {
            self.inner.watch(prefix)
        }

        fn purge_expired(&self) -> BoxFuture<'_, Result<usize, MetadataError>> {
            self.inner.purge_expired()
        }
    }

    #[tokio::test]
    async fn a_concurrent_change_during_apply_applies_nothing() {
        let f = fixture();
        c_apply_seed(&f).await;
        let store = Interfering {
            inner: f.store,
            key: "/topics/agents/tasks".into(),
            armed: AtomicBool::new(true),
        };
        let doc = json!({"topics": [
            {"name": "/agents/new", "intent": "tasks"},
            {"name": "/agents/tasks", "intent": "task_queue", "partitions": 6}
        ]});
        let err = apply(&Catalog::new(&store), &manifest(&doc), false)
            .await
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "metadata at /topics/agents/tasks changed concurrently; nothing was written, retry"
        );
        assert_eq!(
            store.inner.get("/topics/agents/new").await.unwrap(),
            None,
            "nothing applied"
        );
    }

    async fn c_apply_seed(f: &Fixture) {
        apply(&f.catalog(), &manifest(&seed_manifest()), false)
            .await
            .unwrap();
    }
}
