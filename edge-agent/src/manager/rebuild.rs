//! Rebuilding the local store's topics from the WAL directories on disk,
//! after the metadata store lost them (damaged and replaced, or deleted).

use broker_core::catalog::Catalog;
use tracing::warn;
use tributary_proto::keys::TopicName;

use super::{OpenError, TOPICS_DIR};
use crate::config::AgentConfig;

/// Recreates, with the implicit-topic defaults, every topic of this edge's
/// namespace that has a WAL directory (`{data_dir}/topics/{ns}/{topic}/`
/// holding segment files) but no stored settings: the metadata store lost
/// them (damaged and replaced, or deleted). Configured topics were created
/// from the configuration just before. Returns the topics recreated.
pub(super) async fn recreate_wal_topics(
    config: &AgentConfig,
    catalog: &Catalog<'_>,
) -> Result<Vec<TopicName>, OpenError> {
    let namespace_dir = config
        .data_dir
        .join(TOPICS_DIR)
        .join(config.edge_id.as_str());
    let entries = match std::fs::read_dir(&namespace_dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => {
            warn!(dir = %namespace_dir.display(), error = %e, "cannot list the topic directories; topics without stored settings are not recreated");
            return Ok(Vec::new());
        }
    };
    let mut recreated = Vec::new();
    for entry in entries.flatten() {
        let dir = entry.path();
        if !dir.is_dir() {
            continue;
        }
        let Some(topic) = entry.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        let Ok(name) = TopicName::new(&format!("/{}/{topic}", config.edge_id.as_str())) else {
            warn!(dir = %dir.display(), "directory under topics/ is not a topic name; ignored");
            continue;
        };
        let has_segments = std::fs::read_dir(&dir).is_ok_and(|files| {
            files.flatten().any(|f| {
                f.file_name()
                    .to_str()
                    .is_some_and(|n| n.ends_with(broker_core::wal::segment::LOG_SUFFIX))
            })
        });
        if !has_segments {
            continue;
        }
        let outcome = catalog.create_implicit(&name, false).await?;
        if outcome.created {
            warn!(
                topic = %name,
                dir = %dir.display(),
                "topic found on disk without stored settings (the metadata store lost them): \
                 recreated with the implicit-topic defaults; its records are kept"
            );
            recreated.push(name);
        }
    }
    recreated.sort();
    Ok(recreated)
}
