//! [`TopicSpec`]: a validated request to create (or, through the broker's
//! `apply`, declare) a topic, and the metadata keys it stands for.

use serde_json::{Value, json};
use tributary_proto::intent::StreamIntent;
use tributary_proto::keys::{self, TopicName};

use super::{CatalogError, KEYS_PER_TOPIC, MAX_PARTITIONS, to_json};

/// A validated request to create a topic: name, canonical intent and
/// partition count. Construction checks that the partition count is at most
/// [`MAX_PARTITIONS`] and that every partition name and dead-letter topic
/// name is valid, so a create never fails half-way on a name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicSpec {
    name: TopicName,
    intent: StreamIntent,
    partitions: u32,
    /// Invariant: `partitions` names, `name-part-0 …`.
    partition_names: Vec<TopicName>,
}

impl TopicSpec {
    /// A spec for `name` with `intent` and `partitions` (0 =
    /// non-partitioned).
    ///
    /// # Errors
    /// [`CatalogError::InvalidPartitions`] above [`MAX_PARTITIONS`];
    /// [`CatalogError::InvalidName`] (field `name`) when a partition or
    /// dead-letter topic name would be invalid (too long).
    pub fn new(
        name: TopicName,
        intent: StreamIntent,
        partitions: u32,
    ) -> Result<TopicSpec, CatalogError> {
        if partitions > MAX_PARTITIONS {
            return Err(CatalogError::InvalidPartitions {
                value: partitions.to_string(),
                max: MAX_PARTITIONS,
            });
        }
        let invalid = |source| CatalogError::InvalidName {
            field: "name",
            source,
        };
        let partition_names = (0..partitions)
            .map(|index| name.partition(index))
            .collect::<Result<Vec<_>, _>>()
            .map_err(invalid)?;
        let settings = intent.expand();
        for topic in std::iter::once(&name).chain(&partition_names) {
            settings.dlq_topic(topic).map_err(invalid)?;
        }
        Ok(TopicSpec {
            name,
            intent,
            partitions,
            partition_names,
        })
    }

    /// Parses untyped input (an API request): a topic name, an intent name
    /// or alias, and a partition count.
    ///
    /// # Errors
    /// [`CatalogError::InvalidName`] (field `name`),
    /// [`CatalogError::InvalidIntent`] listing the valid names,
    /// [`CatalogError::InvalidPartitions`] for negative or too large counts,
    /// and those of [`TopicSpec::new`].
    pub fn parse(name: &str, intent: &str, partitions: i64) -> Result<TopicSpec, CatalogError> {
        let name = TopicName::new(name).map_err(|source| CatalogError::InvalidName {
            field: "name",
            source,
        })?;
        let intent = StreamIntent::parse(intent)?;
        let partitions = u32::try_from(partitions)
            .ok()
            .filter(|&p| p <= MAX_PARTITIONS)
            .ok_or(CatalogError::InvalidPartitions {
                value: partitions.to_string(),
                max: MAX_PARTITIONS,
            })?;
        TopicSpec::new(name, intent, partitions)
    }

    /// The topic.
    pub fn name(&self) -> &TopicName {
        &self.name
    }

    /// The canonical intent.
    pub fn intent(&self) -> StreamIntent {
        self.intent
    }

    /// Partition count, 0 = non-partitioned.
    pub fn partitions(&self) -> u32 {
        self.partitions
    }

    /// The partition topics, `{topic}-part-0 …`.
    pub fn partition_names(&self) -> &[TopicName] {
        &self.partition_names
    }

    /// The topic and its partitions with the marker value of each.
    pub(super) fn topics(&self) -> impl Iterator<Item = (&TopicName, u32)> {
        std::iter::once((&self.name, self.partitions))
            .chain(self.partition_names.iter().map(|p| (p, 0)))
    }

    /// Every key of the topic and its partitions with the value it must
    /// hold, [`KEYS_PER_TOPIC`] per topic in the order marker, intent,
    /// delivery, registry; the topic itself first.
    pub(super) fn desired_entries(&self) -> Result<Vec<(String, Value)>, CatalogError> {
        let settings = self.intent.expand();
        let settings_json = to_json("intent", &settings)?;
        let delivery = json!(settings.delivery.as_str());
        let mut entries = Vec::with_capacity(KEYS_PER_TOPIC * (self.partitions as usize + 1));
        for (topic, count) in self.topics() {
            entries.push((keys::topics::marker(topic), json!(count)));
            entries.push((keys::topics::intent(topic), settings_json.clone()));
            entries.push((keys::topics::delivery(topic), delivery.clone()));
            entries.push((keys::namespaces::topic(topic), json!(count)));
        }
        Ok(entries)
    }
}
