//! `tribctl archive verify --against-descriptors`: compares the bucket with
//! the descriptors committed in Raft (through the broker's admin API at
//! `--admin-url`, which must be given): every descriptor must have its
//! object with the described size and footer, and the topic's first archived offset
//! must be where its retained history starts (the cold-retention low mark,
//! or offset 0). Missing-object marks of the archive audit are listed too.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::anyhow;
use serde_json::{Value, json};
use tributary_archive::reader::Archive;
use tributary_proto::keys::{StorageKeys, TopicName};

use super::BrokerAccess;
use crate::client::AdminClient;

/// The topics to verify: those given, else every topic in the bucket or
/// with committed descriptors (an emptied bucket lists none itself).
///
/// # Errors
/// Bucket and admin API errors; a bad topic name.
pub async fn topics(
    archive: &Archive,
    keys: &StorageKeys,
    given: &[String],
    broker: &BrokerAccess<'_>,
) -> anyhow::Result<Vec<String>> {
    if !given.is_empty() {
        return Ok(given.to_vec());
    }
    let mut out: BTreeSet<TopicName> = archive.topics().await?.into_iter().collect();
    let reply = client(broker)
        .get("/v1/storage/topics", &[("prefix", keys.prefix())])
        .map_err(crate::commands::CommandError::from)?;
    for entry in reply["topics"].as_array().into_iter().flatten() {
        if let Some(topic) = entry["topic"].as_str().and_then(|t| TopicName::new(t).ok()) {
            out.insert(topic);
        }
    }
    Ok(out.into_iter().map(|t| t.to_string()).collect())
}

/// Whether the object at `key`, of the size `descriptor` gives, has the
/// footer it describes (offsets, counts, timestamps and the CRC-32Cs of
/// its regions): another object's bytes at the key (a restore from the
/// wrong backup, a copy between topics) have the right size only by
/// chance, and were taken for this one.
async fn footer_problem(
    archive: &Archive,
    descriptor: &Value,
    key: &str,
) -> anyhow::Result<Option<(&'static str, String)>> {
    let Ok(descriptor) =
        serde_json::from_value::<tributary_proto::archive::SegmentDescriptor>(descriptor.clone())
    else {
        return Err(anyhow!(
            "the broker listed a malformed descriptor: {descriptor}"
        ));
    };
    let object = tributary_archive::reader::SegmentObjectInfo {
        key: key.to_owned(),
        start_offset: descriptor.start_offset,
        end_offset: descriptor.end_offset,
        size: descriptor.size,
    };
    let (start, end) = (descriptor.start_offset, descriptor.end_offset);
    Ok(match archive.footer(&object).await {
        Ok(footer) if descriptor.matches_footer(&footer) => None,
        Ok(footer) => Some((
            "descriptor_object_mismatch",
            format!(
                "offsets {start}..={end}: object {key} is not the object its descriptor describes (its footer says offsets {}..{}, batches CRC-32C {:#010x}; the descriptor {:#010x})",
                footer.base_offset,
                footer.next_offset,
                footer.batches_crc32c,
                descriptor.batches_crc32c
            ),
        )),
        // A damaged footer is reported by the object check itself.
        Err(tributary_archive::BucketError::Archive { .. }) => None,
        Err(e) => return Err(e.into()),
    })
}

fn client(broker: &BrokerAccess<'_>) -> AdminClient {
    AdminClient::new(broker.admin_url, broker.token.unwrap_or_default())
}

/// The problems of `topic` against its committed descriptors, as JSON
/// objects with `kind`, `first_offset`, `end_offset` (exclusive) and
/// `message`.
///
/// # Errors
/// Bucket and admin API errors.
pub async fn check(
    archive: &Archive,
    keys: &StorageKeys,
    topic: &TopicName,
    broker: &BrokerAccess<'_>,
) -> anyhow::Result<Vec<Value>> {
    let reply = client(broker)
        .get(
            &format!("/v1/storage/topics{topic}/segments"),
            &[("prefix", keys.prefix())],
        )
        .map_err(crate::commands::CommandError::from)?;
    let (objects, _) = archive.segments(topic).await?;
    let stored: BTreeMap<&str, u64> = objects.iter().map(|o| (o.key.as_str(), o.size)).collect();
    let mut problems = Vec::new();
    let segments = reply["segments"].as_array().cloned().unwrap_or_default();
    for d in &segments {
        let (Some(key), Some(size), Some(start), Some(end)) = (
            d["object_id"].as_str(),
            d["size"].as_u64(),
            d["start_offset"].as_u64(),
            d["end_offset"].as_u64(),
        ) else {
            return Err(anyhow!(
                "{topic}: the broker listed a malformed descriptor: {d}"
            ));
        };
        let problem = match stored.get(key) {
            None => Some((
                "descriptor_object_missing",
                format!("offsets {start}..={end}: the descriptor's object {key} is missing"),
            )),
            Some(&s) if s != size => Some((
                "descriptor_object_mismatch",
                format!(
                    "offsets {start}..={end}: the descriptor says {size} bytes, object {key} has {s}"
                ),
            )),
            Some(_) => footer_problem(archive, d, key).await?,
        };
        if let Some((kind, message)) = problem {
            problems.push(json!({
                "kind": kind, "segment": key, "first_offset": start, "end_offset": end + 1,
                "message": message,
            }));
        }
    }
    // The archive starts where the retained history starts.
    let history_start = reply["retired_below"].as_u64().unwrap_or(0);
    let first = objects
        .iter()
        .filter(|o| stored.contains_key(o.key.as_str()))
        .map(|o| o.start_offset)
        .min();
    let covered_from = segments
        .iter()
        .filter(|d| {
            d["object_id"]
                .as_str()
                .is_some_and(|k| stored.contains_key(k))
        })
        .filter_map(|d| d["start_offset"].as_u64())
        .min();
    if !segments.is_empty() {
        match first.or(covered_from) {
            Some(first) if first > history_start => problems.push(json!({
                "kind": "starts_above_log_start", "first_offset": history_start, "end_offset": first,
                "message": format!("the first object starts at {first}, above the topic's retained history start {history_start}: offsets {history_start}..{first} are in no object"),
            })),
            Some(_) => {}
            None => problems.push(json!({
                "kind": "starts_above_log_start", "first_offset": history_start,
                "end_offset": segments.last().and_then(|d| d["end_offset"].as_u64()).map_or(history_start, |e| e + 1),
                "message": "no committed descriptor has its object: the archive holds none of the topic's committed offsets",
            })),
        }
    }
    for mark in reply["missing"].as_array().into_iter().flatten() {
        problems.push(json!({
            "kind": "marked_missing",
            "segment": mark["object_id"],
            "first_offset": mark["start_offset"],
            "end_offset": mark["end_offset"].as_u64().map(|e| e + 1),
            "message": format!(
                "the archive audit marked offsets {}..={} missing ({}; local copy: {})",
                mark["start_offset"], mark["end_offset"],
                mark["reason"].as_str().unwrap_or(""), mark["local_copy"]
            ),
        }));
    }
    Ok(problems)
}
