//! [`Comparison`]: a [`TopicSpec`] against the store, key by key. `create`
//! uses it to decide between create, unchanged and conflict; the broker's
//! `apply` to plan updates.

use serde_json::Value;
use tributary_api::admin::{Difference, PlanAction};
use tributary_proto::intent::ExpandedStreamSettings;
use tributary_proto::keys::TopicName;

use super::{Catalog, CatalogError, KEYS_PER_TOPIC, TopicSpec, decode, decode_count, render};
use crate::metadata::Txn;

/// Reads of one comparison in flight at once.
pub const CONCURRENT_READS: usize = 64;

/// One key of a topic spec, its stored and its desired value.
#[derive(Debug)]
struct Entry {
    key: String,
    current: Option<Value>,
    desired: Value,
}

impl Entry {
    fn matches(&self) -> bool {
        self.current.as_ref() == Some(&self.desired)
    }

    fn precondition(&self, txn: Txn) -> Txn {
        match &self.current {
            Some(value) => txn.when_equals(self.key.clone(), value.clone()),
            None => txn.when_absent(self.key.clone()),
        }
    }
}

/// A topic spec against the store: what is stored under each of its keys,
/// the differences, and the transaction steps that make the store match.
#[derive(Debug)]
pub struct Comparison {
    /// Keys of the spec ([`TopicSpec::desired_entries`] order).
    entries: Vec<Entry>,
    /// Stored partition count; `None` when the topic does not exist.
    existing_partitions: Option<u32>,
    /// Differences from the stored topic; for a missing topic, the
    /// partition names that are taken by existing topics.
    differences: Vec<Difference>,
    /// Partitions this spec would add whose name an existing topic already
    /// has (all partitions of a missing topic, the new ones of a growing
    /// topic).
    taken: Vec<TopicName>,
}

impl Comparison {
    /// What making the store match the spec is: create (no topic marker),
    /// unchanged (every key holds its desired value) or update.
    pub fn action(&self) -> PlanAction {
        match self.existing_partitions {
            None => PlanAction::Create,
            Some(_) if self.entries.iter().all(Entry::matches) => PlanAction::Unchanged,
            Some(_) => PlanAction::Update,
        }
    }

    /// Adds the writes that make the store match the spec: a precondition
    /// on the topic marker (absent, or its read value) and on every key it
    /// rewrites, and a put for every key that differs.
    pub fn add_writes(&self, mut txn: Txn) -> Txn {
        for (index, entry) in self.entries.iter().enumerate() {
            if index == 0 || !entry.matches() {
                txn = entry.precondition(txn);
            }
            if !entry.matches() {
                txn = txn.put(entry.key.clone(), entry.desired.clone());
            }
        }
        txn
    }

    /// Preconditions that keep an `unchanged` verdict true at commit time:
    /// the topic marker and intent still hold what was read.
    pub fn add_guards(&self, mut txn: Txn) -> Txn {
        for entry in self.entries.iter().take(2) {
            txn = entry.precondition(txn);
        }
        txn
    }

    /// The stored partition count; `None` when the topic does not exist.
    pub fn existing_partitions(&self) -> Option<u32> {
        self.existing_partitions
    }

    /// Differences from the stored topic (for a missing topic: the
    /// partition names taken by existing topics).
    pub fn differences(&self) -> &[Difference] {
        &self.differences
    }

    /// The differences, by value.
    pub fn into_differences(self) -> Vec<Difference> {
        self.differences
    }

    /// Partitions the spec would add whose name an existing topic already
    /// has.
    pub fn taken(&self) -> &[TopicName] {
        &self.taken
    }
}

impl Catalog<'_> {
    /// Reads every key of `spec` (and its partitions) from the store and
    /// compares it with the value the spec needs. Reads key by key, not from
    /// one snapshot: callers guard what they write with the comparison's
    /// preconditions. Up to [`CONCURRENT_READS`] reads are in flight at
    /// once: on Raft each is a linearizable read (a read-index round trip
    /// through the leader), and one after the other a topic of 64
    /// partitions took tens of seconds on a three-broker cluster.
    ///
    /// # Errors
    /// [`CatalogError::Inconsistent`] for a stored value that does not
    /// decode; [`CatalogError::Metadata`].
    pub async fn compare(&self, spec: &TopicSpec) -> Result<Comparison, CatalogError> {
        use futures::{StreamExt as _, TryStreamExt as _};
        let store = self.store;
        let entries: Vec<Entry> = futures::stream::iter(spec.desired_entries()?)
            .map(|(key, desired)| async move {
                let current = store.get(&key).await?;
                Ok::<_, CatalogError>(Entry {
                    key,
                    current,
                    desired,
                })
            })
            .buffered(CONCURRENT_READS)
            .try_collect()
            .await?;
        let marker = &entries[0];
        let existing_partitions = marker
            .current
            .as_ref()
            .map(|value| decode_count(&marker.key, value))
            .transpose()?;
        // Partitions the spec adds whose marker already exists.
        let first_new = existing_partitions.unwrap_or(0) as usize;
        let taken: Vec<TopicName> = spec
            .partition_names()
            .iter()
            .enumerate()
            .skip(first_new)
            .filter(|(index, _)| entries[KEYS_PER_TOPIC * (index + 1)].current.is_some())
            .map(|(_, name)| name.clone())
            .collect();
        let mut differences = Vec::new();
        match existing_partitions {
            None => {
                for name in &taken {
                    differences.push(Difference::new(
                        "partitions",
                        format!("topic {name} exists"),
                        format!("{} partitions", spec.partitions()),
                    ));
                }
            }
            Some(existing) => {
                if existing != spec.partitions() {
                    differences.push(Difference::new("partitions", existing, spec.partitions()));
                }
                let intent = &entries[1];
                let desired_intent = spec.intent().expand();
                match &intent.current {
                    None => differences.push(Difference::new(
                        "intent",
                        "none (implicit topic)",
                        desired_intent.intent,
                    )),
                    Some(value) => {
                        let stored: ExpandedStreamSettings = decode(&intent.key, value.clone())?;
                        if stored.intent != desired_intent.intent {
                            differences.push(Difference::new(
                                "intent",
                                stored.intent,
                                desired_intent.intent,
                            ));
                        } else if let (Value::Object(have), Value::Object(want)) =
                            (value, &intent.desired)
                        {
                            for (field, wanted) in want {
                                let had = have.get(field).unwrap_or(&Value::Null);
                                if had != wanted {
                                    differences.push(Difference::new(
                                        field,
                                        render(had),
                                        render(wanted),
                                    ));
                                }
                            }
                        }
                    }
                }
                let delivery = &entries[2];
                if !delivery.matches() {
                    differences.push(Difference::new(
                        "delivery",
                        delivery.current.as_ref().map_or("none".into(), render),
                        render(&delivery.desired),
                    ));
                }
                if differences.is_empty() {
                    let stale = entries.iter().filter(|e| !e.matches()).count();
                    if stale > 0 {
                        differences.push(Difference::new(
                            "metadata_keys",
                            format!("{stale} keys missing or different"),
                            "rewritten to match the intent",
                        ));
                    }
                }
            }
        }
        Ok(Comparison {
            entries,
            existing_partitions,
            differences,
            taken,
        })
    }
}
