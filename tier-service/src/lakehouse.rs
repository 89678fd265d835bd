//! The continuous lakehouse writer: after tiering, every committed segment
//! of a selected topic becomes Parquet files in the bucket, one per UTC
//! date of its records (Hive-style partitions), readable by DuckDB,
//! pandas, Spark or Trino straight from the bucket:
//!
//! `{prefix}/lakehouse/{ns}/{topic}/date=YYYY-MM-DD/{start:020}-{end:020}.parquet`
//!
//! where `start..=end` are the segment's offsets (so a file names the
//! segment it came from; its rows are that segment's records of that
//! date). Records that do not fit the topic's typed columns go to
//! `{prefix}/lakehouse/{ns}/{topic}/_rejected/{start:020}-{end:020}.parquet`
//! with their reason — never dropped.
//!
//! Per segment, in offset order (the same discipline as tiering):
//! 1. read the segment's records from its archived object (the committed
//!    copy, so the files hold exactly what the archive holds);
//! 2. write each date's file, then the rejected file, overwriting: the
//!    same records and layout give the same bytes, so a redo stores the
//!    same objects (fault point `lakehouse_after_put` after the first);
//! 3. record the progress (`next_offset` = the segment's end + 1, and the
//!    layout) in Raft through the broker (fault point
//!    `lakehouse_before_progress` just before), which refuses progress
//!    that goes back, passes the archive, or changes a fixed layout.
//!
//! A crash between any two steps is repaired by the next pass redoing the
//! segment: no row is in two files (a row's file is fixed by its segment
//! and date) and none is skipped (progress moves only after the files).
//!
//! The layout is decided once per topic, at its first segment with
//! records, and then fixed (in Raft): the columns declared for the topic
//! in `[lakehouse.columns]`, else (with `infer = true`, the default)
//! columns inferred from the JSON objects among that segment's first
//! `infer_rows` values when they are more than half of them (the other
//! values then go to `_rejected`, as misfits of declared columns do), else
//! the raw layout (`value` as bytes).
//!
//! Cold retention removes the Parquet files of the segments it retires
//! ([`sweep_below`]).

use std::collections::BTreeMap;
use std::ops::ControlFlow;

use serde::{Deserialize, Serialize};
use tracing::{info, warn};
use tributary_archive::reader::{Archive, ArchivedRecord, Start};
use tributary_lakehouse::schema::DEFAULT_INFER_ROWS;
use tributary_lakehouse::time::utc_date;
use tributary_lakehouse::{JsonColumns, Layout, ParquetOptions, TableError, TableWriter};
use tributary_proto::archive::SegmentDescriptor;
use tributary_proto::keys::TopicName;

use crate::error::TierError;
use crate::tiering::{PassReport, Tiering};

/// `[lakehouse]` of the configuration.
///
/// ```toml
/// [lakehouse]
/// topics = ["/plant1/*", "/plant2/power"]   # default: none
/// infer = true                              # infer typed columns from JSON objects
/// infer_rows = 1000
/// row_group_rows = 131072
/// [lakehouse.columns."/plant1/power"]       # declared columns of one topic
/// Global_active_power = "double"
/// Voltage = "double"
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LakehouseConfig {
    /// Topics written as Parquet: `/ns/topic`, `/ns/*` (every topic of a
    /// namespace) or `*` (every topic). Default none: the writer is off.
    pub topics: Vec<String>,
    /// Infer typed columns from a topic's first values when they are JSON
    /// objects (default true); false keeps the raw layout unless columns
    /// are declared.
    pub infer: bool,
    /// Values inference looks at. Default 1000.
    pub infer_rows: usize,
    /// Largest row group, rows. Default 131,072.
    pub row_group_rows: usize,
    /// Declared columns per topic (`field = "type"`; types bool, int64,
    /// double, string, timestamp, json), in field-name order.
    pub columns: BTreeMap<String, BTreeMap<String, String>>,
}

impl Default for LakehouseConfig {
    fn default() -> Self {
        LakehouseConfig {
            topics: Vec::new(),
            infer: true,
            infer_rows: DEFAULT_INFER_ROWS,
            row_group_rows: ParquetOptions::default().row_group_rows,
            columns: BTreeMap::new(),
        }
    }
}

impl LakehouseConfig {
    /// Whether `topic` is written as Parquet.
    pub fn selects(&self, topic: &TopicName) -> bool {
        let name = topic.as_str();
        self.topics.iter().any(|p| match p.strip_suffix('*') {
            Some("") => true,
            Some(prefix) => name.starts_with(prefix),
            None => p == name,
        })
    }

    /// Checks the patterns and declared columns.
    ///
    /// # Errors
    /// [`TierError::Config`] naming the bad entry.
    pub fn validate(&self) -> Result<(), TierError> {
        for p in &self.topics {
            let ok = p == "*"
                || p.strip_suffix("/*")
                    .is_some_and(|ns| ns.starts_with('/') && !ns[1..].contains('/'))
                || TopicName::new(p).is_ok();
            if !ok {
                return Err(TierError::Config(format!(
                    "lakehouse.topics: `{p}` is not /ns/topic, /ns/* or *"
                )));
            }
        }
        for topic in self.columns.keys() {
            // Columns of a topic the writer never writes are a typo in the
            // name or in lakehouse.topics (they were ignored silently).
            let selected = TopicName::new(topic).is_ok_and(|t| self.selects(&t));
            if !selected {
                return Err(TierError::Config(format!(
                    "lakehouse.columns.\"{topic}\": not a topic lakehouse.topics selects ({})",
                    if self.topics.is_empty() {
                        "none: the writer is off".to_owned()
                    } else {
                        self.topics.join(", ")
                    }
                )));
            }
            self.declared(topic)?;
        }
        if self.infer_rows == 0 || self.row_group_rows == 0 {
            return Err(TierError::Config(
                "lakehouse.infer_rows and lakehouse.row_group_rows must be at least 1".into(),
            ));
        }
        Ok(())
    }

    fn declared(&self, topic: &str) -> Result<Option<JsonColumns>, TierError> {
        let Some(fields) = self.columns.get(topic) else {
            return Ok(None);
        };
        JsonColumns::declared(fields.iter().map(|(f, t)| (f.as_str(), t.as_str())))
            .map(Some)
            .map_err(|e| TierError::Config(format!("lakehouse.columns.\"{topic}\": {e}")))
    }
}

/// A topic's layout as recorded in Raft with the progress.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum StoredLayout {
    /// `value` as bytes.
    Raw,
    /// Typed columns.
    Json {
        /// The columns.
        columns: JsonColumns,
    },
}

impl StoredLayout {
    fn layout(&self) -> Layout {
        match self {
            StoredLayout::Raw => Layout::Raw,
            StoredLayout::Json { columns } => Layout::Json(columns.clone()),
        }
    }
}

/// The progress value in Raft (`{prefix}/storage/topics/{ns}/{topic}/lakehouse`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Progress {
    /// Every record of the committed segments below this offset is written.
    pub next_offset: u64,
    /// The fixed layout; `None` until a segment with records was written.
    #[serde(default)]
    pub layout: Option<StoredLayout>,
}

/// Writes the committed segments of `topic` not yet written (module doc).
/// Stops between segments once `stop()` says so.
///
/// # Errors
/// Bucket, broker and Parquet errors after their retries; the next pass
/// redoes the segment that failed.
pub async fn pass(
    tiering: &Tiering,
    topic: &TopicName,
    report: &mut PassReport,
    stop: &(dyn Fn() -> bool + Sync),
) -> Result<(), TierError> {
    let config = &tiering.lakehouse;
    if !config.selects(topic) {
        return Ok(());
    }
    let committed = tiering.owned_segments(topic).await?;
    let mut progress: Progress = match &committed.lakehouse {
        Some(v) => serde_json::from_value(v.clone()).map_err(|e| TierError::Inconsistent {
            topic: topic.to_string(),
            reason: format!("lakehouse progress {v} does not parse: {e}"),
        })?,
        None => Progress::default(),
    };
    if let Some(fixed) = &progress.layout
        && let Some(declared) = config.declared(topic.as_str())?
        && *fixed != (StoredLayout::Json { columns: declared })
    {
        let mut said = LAYOUT_DRIFT_SAID
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if said.insert(topic.to_string()) {
            warn!(%topic, "[lakehouse.columns] for this topic differ from the layout fixed at its first written segment; the fixed layout is kept (one schema per topic's files): write the new columns under another topic, or use `tribctl archive export --json-columns`");
        }
    }
    let retired_below = committed.retired_below.unwrap_or(0);
    if progress.next_offset < retired_below {
        warn!(%topic, next = progress.next_offset, retired_below, "cold retention retired segments before the lakehouse writer reached them; they are not written");
    }
    let archive = Archive::new(tiering.bucket.clone(), tiering.keys.clone());
    let mut segments = committed.segments;
    segments.sort_by_key(|d| d.start_offset);
    let from = progress.next_offset.max(retired_below);
    for d in segments.iter().filter(|d| d.end_offset >= from) {
        if stop() {
            return Ok(());
        }
        if d.start_offset < progress.next_offset {
            return Err(TierError::Inconsistent {
                topic: topic.to_string(),
                reason: format!(
                    "lakehouse progress {} is inside segment {}..={}",
                    progress.next_offset, d.start_offset, d.end_offset
                ),
            });
        }
        let records = read_segment(&archive, topic, d).await?;
        if progress.layout.is_none() && !records.is_empty() {
            progress.layout = Some(choose_layout(config, topic, &records)?);
        }
        let (files, rejected) = match &progress.layout {
            Some(layout) => write_segment(tiering, topic, d, layout, &records).await?,
            None => (0, 0),
        };
        tiering.faults.hit("lakehouse_before_progress");
        progress.next_offset = d.next_offset();
        let value = serde_json::to_value(&progress).map_err(|e| TierError::Inconsistent {
            topic: topic.to_string(),
            reason: e.to_string(),
        })?;
        tiering
            .retry("record lakehouse progress", || {
                tiering.broker.put_lakehouse(topic, &value)
            })
            .await?;
        report.lakehouse_files += files;
        report.lakehouse_rejected += rejected;
        info!(%topic, start = d.start_offset, end = d.end_offset, records = records.len(), files, rejected, "segment written to the lakehouse");
    }
    Ok(())
}

/// The records of segment `d`, from its archived object.
///
/// The archive reader's callbacks are not `Send`, so the read runs on a
/// blocking thread that drives it on the service's runtime.
async fn read_segment(
    archive: &Archive,
    topic: &TopicName,
    d: &SegmentDescriptor,
) -> Result<Vec<ArchivedRecord>, TierError> {
    let (archive, topic, d) = (archive.clone(), topic.clone(), d.clone());
    let handle = tokio::runtime::Handle::current();
    let name = topic.to_string();
    tokio::task::spawn_blocking(move || handle.block_on(read_segment_here(&archive, &topic, &d)))
        .await
        .map_err(|e| TierError::Inconsistent {
            topic: name,
            reason: format!("archive read task: {e}"),
        })?
}

async fn read_segment_here(
    archive: &Archive,
    topic: &TopicName,
    d: &SegmentDescriptor,
) -> Result<Vec<ArchivedRecord>, TierError> {
    let mut records = Vec::new();
    let mut holes = Vec::new();
    archive
        .read_with_holes(
            topic,
            Start::Offset(d.start_offset),
            &mut |r| {
                if r.offset > d.end_offset {
                    return ControlFlow::Break(());
                }
                records.push(r);
                ControlFlow::Continue(())
            },
            &mut |h| holes.push((h.first_offset, h.end_offset)),
        )
        .await
        .map_err(|e| TierError::Inconsistent {
            topic: topic.to_string(),
            reason: format!(
                "reading archived segment {}..={}: {e}",
                d.start_offset, d.end_offset
            ),
        })?;
    let offsets: Vec<u64> = records.iter().map(|r| r.offset).collect();
    if let Some((first, end)) = uncovered(d.start_offset, d.end_offset, &offsets, &holes) {
        // The reader starts at the first object it finds: with the
        // segment's own object missing it read the next one's records (a
        // trial saw a segment recorded as written with 0 records, and
        // never written once the object was back).
        return Err(TierError::Inconsistent {
            topic: topic.to_string(),
            reason: format!(
                "reading archived segment {}..={}: offsets {first}..{end} are in no archive \
                 object and no declared hole (its object is missing: see the archive audit, \
                 `tribctl archive verify`); the segment is written once they are back",
                d.start_offset, d.end_offset
            ),
        });
    }
    Ok(records)
}

/// The first range of `start..=end` (`first..end`, end exclusive) that
/// neither a record of `offsets` (ascending, within the range) nor a hole
/// of `holes` (`first..end` ranges, ascending) covers; `None` when every
/// offset is covered.
fn uncovered(start: u64, end: u64, offsets: &[u64], holes: &[(u64, u64)]) -> Option<(u64, u64)> {
    let mut next = start;
    let mut records = offsets.iter().copied().peekable();
    let mut holes = holes.iter().copied().peekable();
    while next <= end {
        while records.peek().is_some_and(|&o| o < next) {
            records.next();
        }
        if records.peek() == Some(&next) {
            records.next();
            next += 1;
            continue;
        }
        match holes.peek().copied() {
            Some((first, hole_end)) if first <= next && next < hole_end => {
                holes.next();
                next = hole_end;
                continue;
            }
            Some((_, hole_end)) if hole_end <= next => {
                holes.next();
                continue;
            }
            _ => {}
        }
        let covered_again = [
            records.peek().copied(),
            holes.peek().map(|&(first, _)| first),
        ]
        .into_iter()
        .flatten()
        .filter(|&o| o > next)
        .min()
        .unwrap_or(end + 1);
        return Some((next, covered_again.min(end + 1)));
    }
    None
}

fn choose_layout(
    config: &LakehouseConfig,
    topic: &TopicName,
    records: &[ArchivedRecord],
) -> Result<StoredLayout, TierError> {
    if let Some(columns) = config.declared(topic.as_str())? {
        return Ok(StoredLayout::Json { columns });
    }
    if !config.infer {
        return Ok(StoredLayout::Raw);
    }
    // One malformed value must not fix the raw layout for good: the
    // columns come from the objects when most values are objects.
    let sample: Vec<&ArchivedRecord> = records.iter().take(config.infer_rows).collect();
    let objects: Vec<&ArchivedRecord> = sample
        .iter()
        .copied()
        .filter(|r| {
            serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(&r.record.value)
                .is_ok()
        })
        .collect();
    let from = if objects.len() * 2 > sample.len() {
        objects
    } else {
        sample
    };
    match JsonColumns::infer(from.iter().map(|r| (r.offset, &r.record.value[..]))) {
        Ok(columns) => {
            info!(%topic, columns = columns.columns().iter().map(|c| c.name.as_str()).collect::<Vec<_>>().join(","), "lakehouse columns inferred and fixed");
            Ok(StoredLayout::Json { columns })
        }
        Err(e) => {
            info!(%topic, reason = %e, "lakehouse layout: raw values");
            Ok(StoredLayout::Raw)
        }
    }
}

/// Writes one segment's files; returns (files written, rejected rows).
async fn write_segment(
    tiering: &Tiering,
    topic: &TopicName,
    d: &SegmentDescriptor,
    layout: &StoredLayout,
    records: &[ArchivedRecord],
) -> Result<(u64, u64), TierError> {
    let options = ParquetOptions {
        row_group_rows: tiering.lakehouse.row_group_rows,
        metadata: vec![
            ("tributary.topic".into(), topic.to_string()),
            (
                "tributary.segment".into(),
                format!("{}-{}", d.start_offset, d.end_offset),
            ),
        ],
        ..ParquetOptions::default()
    };
    let parquet = |e: TableError| TierError::Inconsistent {
        topic: topic.to_string(),
        reason: format!(
            "parquet of segment {}..={}: {e}",
            d.start_offset, d.end_offset
        ),
    };
    let mut by_date: BTreeMap<String, Vec<&ArchivedRecord>> = BTreeMap::new();
    for r in records {
        by_date
            .entry(utc_date(r.record.timestamp_ms))
            .or_default()
            .push(r);
    }
    let mut rejected: Vec<(&ArchivedRecord, String)> = Vec::new();
    let mut files = 0;
    for (date, rows) in by_date {
        let mut writer =
            TableWriter::new(Vec::new(), layout.layout(), &options).map_err(parquet)?;
        for r in rows {
            match writer.push(r.offset, &r.record) {
                Ok(()) => {}
                Err(TableError::Row(e)) => rejected.push((r, e.reason)),
                Err(e) => return Err(parquet(e)),
            }
        }
        if writer.rows() == 0 {
            continue;
        }
        let bytes = writer.finish().map_err(parquet)?;
        let key = tiering
            .keys
            .lakehouse_object(topic, &date, d.start_offset, d.end_offset);
        put(tiering, &key, bytes).await?;
        files += 1;
        tiering.faults.hit("lakehouse_after_put");
    }
    let count = rejected.len() as u64;
    if !rejected.is_empty() {
        rejected.sort_by_key(|(r, _)| r.offset);
        let mut writer =
            TableWriter::new(Vec::new(), Layout::Rejected, &options).map_err(parquet)?;
        for (r, why) in &rejected {
            writer
                .push_with_reason(r.offset, &r.record, why)
                .map_err(parquet)?;
        }
        let key = tiering
            .keys
            .lakehouse_rejected_object(topic, d.start_offset, d.end_offset);
        put(tiering, &key, writer.finish().map_err(parquet)?).await?;
        files += 1;
        warn!(%topic, start = d.start_offset, end = d.end_offset, rejected = count, key, "records that do not fit the lakehouse columns written to _rejected");
    }
    Ok((files, count))
}

async fn put(tiering: &Tiering, key: &str, bytes: Vec<u8>) -> Result<(), TierError> {
    let bytes = bytes::Bytes::from(bytes);
    tiering
        .retry("put parquet", || {
            tiering.bucket.put(key, bytes.clone().into(), false)
        })
        .await
}

/// Per bucket and topic, the retired low mark already swept by this
/// process (a sweep lists the topic's lakehouse files: once per mark).
/// Topics whose declared columns differ from their fixed layout, warned
/// of once per process.
static LAYOUT_DRIFT_SAID: std::sync::Mutex<std::collections::BTreeSet<String>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

static SWEPT: std::sync::Mutex<BTreeMap<(String, String), u64>> =
    std::sync::Mutex::new(BTreeMap::new());

/// Cold retention: removes the Parquet files of the segments below
/// `below` (the retired low mark: their descriptors are gone). Idempotent;
/// lists the topic's files once per new mark (and once after a restart,
/// which repairs a crash between a retirement and its sweep).
///
/// # Errors
/// Bucket errors after their retries.
pub async fn sweep_below(
    tiering: &Tiering,
    topic: &TopicName,
    below: u64,
) -> Result<u64, TierError> {
    let id = (tiering.bucket.description().to_owned(), topic.to_string());
    let done = SWEPT
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .get(&id)
        .copied();
    if done.is_some_and(|d| d >= below) {
        return Ok(0);
    }
    let prefix = tiering.keys.lakehouse_objects_prefix(topic);
    let objects = tiering
        .retry("list lakehouse files", || tiering.bucket.list(&prefix))
        .await?;
    let mut removed = 0;
    for object in objects {
        let key = object.location.to_string();
        if segment_end(&key).is_some_and(|end| end < below) {
            tiering
                .retry("delete lakehouse file", || tiering.bucket.delete(&key))
                .await?;
            removed += 1;
        }
    }
    SWEPT
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .insert(id, below);
    if removed > 0 {
        info!(%topic, below, files = removed, "cold retention removed the lakehouse files of retired segments");
    }
    Ok(removed)
}

/// The segment end offset a lakehouse file name carries
/// (`…/{start:020}-{end:020}.parquet`).
fn segment_end(key: &str) -> Option<u64> {
    let name = key.rsplit('/').next()?.strip_suffix(".parquet")?;
    let (start, end) = name.split_once('-')?;
    (start.len() == 20 && end.len() == 20)
        .then(|| end.parse().ok())
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lakehouse trial: a segment whose object was missing was recorded
    /// as written with 0 records (the reader started at the next object).
    #[test]
    fn a_segment_read_must_cover_every_offset_with_a_record_or_a_hole() {
        let all: Vec<u64> = (0..=9).collect();
        assert_eq!(uncovered(0, 9, &all, &[]), None);
        // The object of 0..=99 missing: the next one's records are past it.
        assert_eq!(uncovered(0, 99, &[], &[]), Some((0, 100)));
        // A declared hole covers what it says, and no more.
        assert_eq!(uncovered(0, 9, &[0, 1, 2, 8, 9], &[(3, 8)]), None);
        assert_eq!(uncovered(0, 9, &[0, 1, 2, 9], &[(3, 8)]), Some((8, 9)));
        assert_eq!(uncovered(0, 9, &[5, 6, 7, 8, 9], &[]), Some((0, 5)));
        assert_eq!(uncovered(0, 9, &[0, 1, 2, 3, 4], &[]), Some((5, 10)));
        // A leading hole (a lost first segment) and one reaching past.
        assert_eq!(uncovered(10, 19, &[15, 16, 17, 18, 19], &[(0, 15)]), None);
        assert_eq!(uncovered(10, 19, &[10, 11], &[(12, 40)]), None);
        assert_eq!(uncovered(10, 19, &[10, 11], &[(13, 40)]), Some((12, 13)));
    }

    #[test]
    fn patterns_select_topics_and_bad_ones_are_named() {
        let config = LakehouseConfig {
            topics: vec!["/plant1/*".into(), "/plant2/power".into()],
            ..LakehouseConfig::default()
        };
        let t = |s: &str| TopicName::new(s).expect("topic");
        assert!(config.selects(&t("/plant1/a")));
        assert!(config.selects(&t("/plant2/power")));
        assert!(!config.selects(&t("/plant2/other")));
        assert!(!config.selects(&t("/plant10/a")));
        assert!(config.validate().is_ok());
        let bad = LakehouseConfig {
            topics: vec!["plant1".into()],
            ..LakehouseConfig::default()
        };
        assert!(bad.validate().unwrap_err().to_string().contains("`plant1`"));
        let mut cols = LakehouseConfig {
            topics: vec!["/p/*".into()],
            ..LakehouseConfig::default()
        };
        cols.columns.insert(
            "/p/t".into(),
            BTreeMap::from([("x".into(), "decimal".into())]),
        );
        let err = cols.validate().unwrap_err().to_string();
        assert!(
            err.contains("lakehouse.columns.\"/p/t\"") && err.contains("decimal"),
            "{err}"
        );
        // Columns of a topic the writer does not write: a typo.
        let mut typo = config.clone();
        typo.columns.insert(
            "/plant9/zzz".into(),
            BTreeMap::from([("x".into(), "double".into())]),
        );
        assert_eq!(
            typo.validate().unwrap_err().to_string(),
            "invalid configuration: lakehouse.columns.\"/plant9/zzz\": not a topic lakehouse.topics selects (/plant1/*, /plant2/power)"
        );
        assert!(!LakehouseConfig::default().selects(&t("/a/b")));
    }

    #[test]
    fn inferred_layouts_have_distinct_column_names() {
        // `offset` is `value_offset`; the field `value_offset` beside it
        // must not be a second column of that name (pyarrow cannot read
        // such a file).
        let records: Vec<ArchivedRecord> = (0..3u64)
            .map(|i| ArchivedRecord {
                offset: i,
                record: tributary_proto::batch::Record {
                    timestamp_ms: 0,
                    key: None,
                    headers: Vec::new(),
                    value: bytes::Bytes::from(format!(
                        r#"{{"offset":{i},"value_offset":-{i},"ts":{i}}}"#
                    )),
                },
            })
            .collect();
        let topic = TopicName::new("/p/t").expect("topic");
        let layout = choose_layout(&LakehouseConfig::default(), &topic, &records).expect("layout");
        let StoredLayout::Json { columns } = layout else {
            panic!("{layout:?}");
        };
        let names: Vec<(&str, &str)> = columns
            .columns()
            .iter()
            .map(|c| (c.name.as_str(), c.field.as_str()))
            .collect();
        assert_eq!(
            names,
            [
                ("value_offset", "offset"),
                ("ts", "ts"),
                ("value_offset_2", "value_offset")
            ]
        );
    }

    #[test]
    fn columns_come_from_the_objects_when_most_values_are_objects() {
        let records = |values: &[&str]| -> Vec<ArchivedRecord> {
            values
                .iter()
                .enumerate()
                .map(|(i, v)| ArchivedRecord {
                    offset: i as u64,
                    record: tributary_proto::batch::Record {
                        timestamp_ms: 0,
                        key: None,
                        headers: Vec::new(),
                        value: bytes::Bytes::from(v.to_string()),
                    },
                })
                .collect()
        };
        let topic = TopicName::new("/p/t").expect("topic");
        let config = LakehouseConfig::default();
        let mostly = records(&[r#"{"t":1.5}"#, "garbage", r#"{"t":2.5}"#, r#"{"t":3}"#]);
        let layout = choose_layout(&config, &topic, &mostly).expect("layout");
        let StoredLayout::Json { columns } = layout else {
            panic!("{layout:?}");
        };
        assert_eq!(columns.columns()[0].name, "t");
        let half = records(&[r#"{"t":1.5}"#, "garbage", "\u{1}", r#"{"t":3}"#]);
        assert!(matches!(
            choose_layout(&config, &topic, &half).expect("layout"),
            StoredLayout::Raw
        ));
    }

    #[test]
    fn file_names_carry_the_segment_end() {
        assert_eq!(
            segment_end(
                "t/lakehouse/p/t/date=2006-12-16/00000000000000000000-00000000000000000099.parquet"
            ),
            Some(99)
        );
        assert_eq!(segment_end("t/lakehouse/p/t/other.parquet"), None);
    }
}
