//! Namespaces: [`NamespacePolicy`], and creating, checking and listing
//! namespaces (`/namespaces/{ns}/policy`).

use serde::{Deserialize, Serialize};
use tributary_api::admin::PlanAction;
use tributary_proto::keys::{self, MetadataKey, NamespaceName};

use super::{Catalog, CatalogError, to_json};
use crate::metadata::Txn;

/// Namespace-wide defaults stored at `/namespaces/{ns}/policy`
/// (`seeds/001_4a7643a8a6858094.txt`). 0 means unlimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct NamespacePolicy {
    /// Producers per topic, 0 = unlimited.
    pub max_producers_per_topic: u32,
    /// Consumers per topic, 0 = unlimited.
    pub max_consumers_per_topic: u32,
    /// Largest message, bytes, 0 = unlimited.
    pub max_message_size: u64,
}

impl Catalog<'_> {
    /// Whether `/namespaces/{ns}/policy` exists.
    ///
    /// # Errors
    /// [`CatalogError::Metadata`].
    pub async fn namespace_exists(&self, namespace: &NamespaceName) -> Result<bool, CatalogError> {
        Ok(self
            .store
            .get(&keys::namespaces::policy(namespace))
            .await?
            .is_some())
    }

    /// Creates `namespace` with the default [`NamespacePolicy`];
    /// idempotent: an existing namespace is [`PlanAction::Unchanged`] and keeps
    /// its policy.
    ///
    /// # Errors
    /// [`CatalogError::Metadata`].
    pub async fn create_namespace(
        &self,
        namespace: &NamespaceName,
    ) -> Result<PlanAction, CatalogError> {
        let key = keys::namespaces::policy(namespace);
        let policy = to_json(&key, &NamespacePolicy::default())?;
        match self.store.compare_and_swap(&key, None, policy).await? {
            outcome if outcome.applied => Ok(PlanAction::Create),
            _ => Ok(PlanAction::Unchanged),
        }
    }

    /// Every namespace, sorted by name. Scans `/namespaces/`, which also
    /// holds every topic's registry entry: cost grows with the topic count.
    ///
    /// # Errors
    /// [`CatalogError::Metadata`].
    pub async fn list_namespaces(&self) -> Result<Vec<NamespaceName>, CatalogError> {
        let entries = self.store.list(&keys::namespaces::all_prefix()).await?;
        Ok(entries
            .into_iter()
            .filter_map(|(key, _)| match MetadataKey::parse(&key) {
                Ok(MetadataKey::NamespacePolicy { namespace }) => Some(namespace),
                _ => None,
            })
            .collect())
    }

    /// Adds the namespace's creation (default [`NamespacePolicy`], guarded by
    /// `when_absent`) to `txn` when it does not exist; returns the
    /// transaction and whether it added the creation. For callers that
    /// build one transaction of several creates (the broker's `apply`).
    ///
    /// # Errors
    /// [`CatalogError::Metadata`].
    pub async fn add_namespace(
        &self,
        namespace: &NamespaceName,
        txn: Txn,
    ) -> Result<(Txn, bool), CatalogError> {
        if self.namespace_exists(namespace).await? {
            return Ok((txn, false));
        }
        let key = keys::namespaces::policy(namespace);
        let policy = to_json(&key, &NamespacePolicy::default())?;
        Ok((txn.when_absent(key.clone()).put(key, policy), true))
    }
}
