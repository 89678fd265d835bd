//! `tribctl archive`: browse, read, verify and export an archive bucket
//! (a local directory or an S3 bucket) with no broker and no Raft.
//!
//! - `ls [TOPIC]`: topics, or a topic's segments with their footers;
//!   `--compare-broker` also lists the Raft descriptors through the admin
//!   API and reports every disagreement with the bucket.
//! - `cat TOPIC`: records as JSON lines ([`lines`]), from an offset or a
//!   timestamp (ms or RFC 3339).
//! - `verify [TOPIC...]`: every checksum of every object, offset continuity
//!   across objects, record counts; exit status 1 if anything is damaged.
//!   `--against-descriptors` (needs `--admin-url`) also compares with the
//!   descriptors in Raft ([`descriptors`]): exit status 1 when one points
//!   at a missing object or the first object starts above the topic's
//!   retained history.
//!   Declared holes an object carries are listed (`declared hole a..b`),
//!   not counted as damage; `cat` and `export` say on stderr when they
//!   step over one.
//! - `export TOPIC --out FILE`: a range as JSON lines, CSV, Parquet (with
//!   optional typed columns from JSON values) or raw record batches
//!   ([`export`]).

use std::collections::BTreeMap;
use std::io::{BufWriter, IsTerminal, Write};

use anyhow::{Context as _, anyhow, bail};
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{Value, json};
use tributary_archive::reader::{Archive, SegmentObjectInfo, SegmentVerdict, Start};
use tributary_archive::{Bucket, StoreConfig};
use tributary_proto::archive::{Footer, HoleRange};
use tributary_proto::keys::{StorageKeys, TopicName};

use crate::client::AdminClient;

mod count;
mod descriptors;
mod export;
mod lines;
mod output;
mod table;
use crate::commands::OutputFormat;
use count::RecordCount;
use export::ExportArgs;
use lines::{Limited, Limits, LineWriter, ValueAs};

/// `tribctl archive` options.
#[derive(Debug, Args)]
pub struct ArchiveArgs {
    #[command(flatten)]
    store: StoreConfig,
    /// Storage prefix the objects are under.
    #[arg(long, default_value = tributary_proto::keys::DEFAULT_STORAGE_PREFIX)]
    prefix: String,
    #[command(subcommand)]
    command: ArchiveCommand,
}

#[derive(Debug, Subcommand)]
enum ArchiveCommand {
    /// List topics, or a topic's segments.
    Ls {
        /// Topic (`/ns/topic`); without it, every topic.
        topic: Option<String>,
        /// With TOPIC: also list its descriptors committed in Raft (admin
        /// API at --admin-url, which must be given) and report
        /// disagreements with the bucket; exit 1 when there are any.
        #[arg(long)]
        compare_broker: bool,
    },
    /// Print records as JSON lines.
    Cat {
        #[command(flatten)]
        range: RangeArgs,
        /// How values are written: `auto` embeds a value that is JSON as
        /// JSON, else UTF-8 text as a string, else `value_b64`; `json`
        /// requires JSON; `string` never embeds; `base64` always encodes.
        #[arg(long, value_enum, default_value_t = ValueAs::Auto)]
        value_as: ValueAs,
    },
    /// Verify every checksum and offset continuity.
    Verify {
        /// Topics; without any, every topic in the bucket (and, with
        /// `--against-descriptors`, every topic with descriptors).
        topics: Vec<String>,
        /// Also compare with the descriptors committed in Raft (admin API
        /// at `--admin-url`, which must be given): fails when a descriptor
        /// points at a missing object or the first object starts above the
        /// topic's retained history.
        #[arg(long)]
        against_descriptors: bool,
    },
    /// Export a range of records to a file (JSON lines, CSV, Parquet or
    /// raw batches).
    Export {
        #[command(flatten)]
        range: RangeArgs,
        #[command(flatten)]
        args: ExportArgs,
    },
}

#[derive(Debug, Args)]
struct RangeArgs {
    /// Topic (`/ns/topic`).
    topic: String,
    /// First offset (default: the first in the archive).
    #[arg(long, conflicts_with = "from_timestamp", allow_negative_numbers = true)]
    from_offset: Option<u64>,
    /// Start at the first record (in offset order) with a timestamp at or
    /// after this: ms since the Unix epoch, or RFC 3339
    /// (`2006-12-16T17:24:00Z`).
    #[arg(long, value_parser = parse_timestamp)]
    from_timestamp: Option<i64>,
    /// Last offset, inclusive.
    #[arg(long, allow_negative_numbers = true)]
    to_offset: Option<u64>,
    /// Stop after this many records.
    #[arg(long, allow_negative_numbers = true)]
    max_records: Option<u64>,
}

impl RangeArgs {
    fn start(&self) -> Start {
        match (self.from_offset, self.from_timestamp) {
            (_, Some(t)) => Start::Timestamp(t),
            (Some(o), None) => Start::Offset(o),
            (None, None) => Start::Offset(0),
        }
    }

    fn topic(&self) -> anyhow::Result<TopicName> {
        parse_topic(&self.topic)
    }

    /// The stop conditions.
    ///
    /// # Errors
    /// A `--to-offset` before `--from-offset`: nothing could be read.
    fn limits(&self) -> anyhow::Result<Limits> {
        if let (Some(from), Some(to)) = (self.from_offset, self.to_offset)
            && to < from
        {
            bail!("--to-offset {to} is before --from-offset {from}: no offset is in that range");
        }
        Ok(Limits {
            to_offset: self.to_offset,
            max_records: self.max_records,
        })
    }
}

/// After a read that found no record: an error when the bucket holds no
/// segment object of `topic` at all (a mistyped name or prefix would read
/// as nothing otherwise). Listed only then, so a read lists once.
///
/// # Errors
/// No such topic in the archive; store errors.
async fn ensure_archived(archive: &Archive, topic: &TopicName) -> anyhow::Result<()> {
    if archive.segments(topic).await?.0.is_empty() {
        bail!("the archive has no segment objects of {topic} (check the topic name and --prefix)");
    }
    Ok(())
}

fn parse_timestamp(s: &str) -> Result<i64, String> {
    tributary_lakehouse::time::parse_timestamp_arg(s)
}

fn parse_topic(name: &str) -> anyhow::Result<TopicName> {
    TopicName::new(name).map_err(|e| anyhow!("{e}"))
}

/// Where the admin API is, for `ls --compare-broker` and `verify
/// --against-descriptors`.
pub struct BrokerAccess<'a> {
    /// Base URL.
    pub admin_url: &'a str,
    /// Whether `--admin-url` (or `TRIB_ADMIN_URL`) was given rather than
    /// defaulted: `verify --against-descriptors` requires it.
    pub admin_url_given: bool,
    /// Bearer token.
    pub token: Option<&'a str>,
}

/// Runs `tribctl archive`; writes to stdout itself (output can be large).
///
/// # Errors
/// Bucket, read and output errors; damage found by `verify`.
pub fn run(
    args: &ArchiveArgs,
    output: OutputFormat,
    broker: &BrokerAccess<'_>,
) -> anyhow::Result<()> {
    let keys = StorageKeys::new(&args.prefix).map_err(|e| anyhow!("--prefix: {e}"))?;
    // Every archive command only reads the bucket.
    let bucket = Bucket::open_existing(&args.store)?;
    let archive = Archive::new(bucket, keys.clone());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?;
    let stdout = std::io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let result = runtime.block_on(async {
        match &args.command {
            ArchiveCommand::Ls {
                topic,
                compare_broker,
            } => {
                if *compare_broker {
                    if topic.is_none() {
                        bail!(
                            "--compare-broker compares one topic with its descriptors: name it (archive ls TOPIC --compare-broker), or check every topic with `archive verify --against-descriptors`"
                        );
                    }
                    if !broker.admin_url_given {
                        bail!(
                            "--compare-broker compares the bucket with a broker's descriptors: give --admin-url (or TRIB_ADMIN_URL); it is not defaulted"
                        );
                    }
                }
                ls(
                    &archive,
                    &keys,
                    topic.as_deref(),
                    *compare_broker,
                    broker,
                    output,
                    &mut out,
                )
                .await
            }
            ArchiveCommand::Cat { range, value_as } => {
                let limits = range.limits()?;
                let topic = range.topic()?;
                let lines = LineWriter {
                    topic: &topic,
                    value_as: *value_as,
                    out: &mut out,
                };
                let mut sink = Limited::new(lines, limits);
                archive
                    .read_with_holes(&topic, range.start(), &mut |r| sink.take(r), &mut say_hole)
                    .await?;
                if sink.finish()?.1 == 0 {
                    if let Some(from) = range.from_offset {
                        export::check_from_offset(&archive, &topic, from).await?;
                    }
                    ensure_archived(&archive, &topic).await?;
                    if let Some(from) = range.from_timestamp
                        && let Some(note) = export::past_the_end(&archive, &topic, from).await?
                    {
                        eprintln!("{note}");
                    }
                }
                Ok(())
            }
            ArchiveCommand::Verify {
                topics,
                against_descriptors: false,
            } => verify(&archive, topics, None, output, &mut out).await,
            ArchiveCommand::Verify {
                topics,
                against_descriptors: true,
            } => {
                if !broker.admin_url_given {
                    bail!(
                        "--against-descriptors compares the bucket with a broker's descriptors: give --admin-url (or TRIB_ADMIN_URL); it is not defaulted"
                    );
                }
                let topics = descriptors::topics(&archive, &keys, topics, broker).await?;
                verify(&archive, &topics, Some((&keys, broker)), output, &mut out).await
            }
            ArchiveCommand::Export { range, args } => export::export(&archive, range, args).await,
        }
    });
    // What was read before an error (the intact records before a damaged
    // batch) is still written out.
    let flushed = out.flush().map_err(anyhow::Error::from);
    match result.and(flushed) {
        Err(e) if is_broken_pipe(&e) => Ok(()),
        other => other,
    }
}

/// Tells the operator (on stderr, so record lines stay records) that a
/// read stepped over a declared hole.
fn say_hole(hole: HoleRange) {
    eprintln!("declared hole {hole}: no records for these offsets (skipped)");
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// A progress bar on stderr when it is a terminal, hidden otherwise.
fn progress(total_bytes: u64, what: &str) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total_bytes);
    if let Ok(style) = ProgressStyle::with_template(
        "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(what.to_owned());
    bar
}

// ---------------------------------------------------------------------------
// ls
// ---------------------------------------------------------------------------

/// The cluster id the prefix's owner object names (`None` without one),
/// said on stderr; a damaged owner object is a warning there, not an
/// error (`ls` reads the archive either way).
async fn prefix_owner(archive: &Archive) -> anyhow::Result<Option<String>> {
    use tributary_archive::owner::{OwnerObjectState, read_owner};
    let key = archive.keys().owner_object();
    Ok(match read_owner(archive.bucket(), archive.keys()).await? {
        OwnerObjectState::Names(cluster) => {
            eprintln!("prefix owner: cluster {cluster} ({key})");
            Some(cluster.to_string())
        }
        OwnerObjectState::Absent => None,
        OwnerObjectState::Damaged(reason) => {
            eprintln!(
                "warning: {key} is not an owner object ({reason}); a tier service refuses to start on this prefix"
            );
            None
        }
    })
}

async fn ls(
    archive: &Archive,
    keys: &StorageKeys,
    topic: Option<&str>,
    compare_broker: bool,
    broker: &BrokerAccess<'_>,
    output: OutputFormat,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let Some(topic) = topic else {
        let mut rows = Vec::new();
        let owner = prefix_owner(archive).await?;
        let topics = archive.topics().await?;
        if topics.is_empty() {
            eprintln!(
                "note: no topic has segment objects in this bucket (check --bucket and --prefix)"
            );
        }
        for topic in topics {
            let (objects, _) = archive.segments(&topic).await?;
            let bytes: u64 = objects.iter().map(|o| o.size).sum();
            let first = objects.first().map(|o| o.start_offset);
            let last = objects.last().map(|o| o.end_offset);
            rows.push(json!({
                "topic": topic, "segments": objects.len(), "bytes": bytes,
                "first_offset": first, "last_offset": last,
            }));
        }
        if output == OutputFormat::Json {
            writeln!(
                out,
                "{}",
                serde_json::to_string_pretty(&json!({ "prefix_owner": owner, "topics": rows }))?
            )?;
        } else {
            let cell = |v: &Value| match v {
                Value::Null => "-".to_owned(),
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            let rows: Vec<Vec<String>> = rows
                .iter()
                .map(|r| {
                    ["topic", "segments", "bytes", "first_offset", "last_offset"]
                        .iter()
                        .map(|k| cell(&r[*k]))
                        .collect()
                })
                .collect();
            table::write(out, &["TOPIC", "SEGMENTS", "BYTES", "FIRST", "LAST"], &rows)?;
        }
        return Ok(());
    };
    let topic = parse_topic(topic)?;
    let (objects, foreign) = archive.segments(&topic).await?;
    if objects.is_empty() && foreign.is_empty() && !compare_broker {
        ensure_archived(archive, &topic).await?;
    }
    let mut rows = Vec::new();
    for object in &objects {
        let footer = archive.footer(object).await;
        rows.push((object.clone(), footer));
    }
    let disagreements = if compare_broker {
        Some(compare_with_broker(keys, &topic, &objects, broker)?)
    } else {
        None
    };
    if output == OutputFormat::Json {
        let segments: Vec<Value> = rows
            .iter()
            .map(|(o, f)| {
                let mut v = json!({
                    "key": o.key, "start_offset": o.start_offset, "end_offset": o.end_offset, "size": o.size,
                });
                match f {
                    Ok(f) => {
                        v["records"] = json!(f.record_count());
                        v["batches"] = json!(f.batch_count);
                        v["first_timestamp_ms"] = json!(f.first_timestamp_ms);
                        v["max_timestamp_ms"] = json!(f.max_timestamp_ms);
                    }
                    Err(e) => v["error"] = json!(e.to_string()),
                }
                v
            })
            .collect();
        let mut doc = json!({ "topic": topic, "segments": segments, "foreign": foreign });
        if let Some(d) = &disagreements {
            doc["disagreements"] = json!(d);
        }
        writeln!(out, "{}", serde_json::to_string_pretty(&doc)?)?;
    } else {
        let table_rows: Vec<Vec<String>> = rows
            .iter()
            .map(|(o, f)| match f {
                Ok(f) => vec![
                    o.start_offset.to_string(),
                    o.end_offset.to_string(),
                    f.record_count().to_string(),
                    o.size.to_string(),
                    f.first_timestamp_ms.to_string(),
                    f.max_timestamp_ms.to_string(),
                ],
                Err(e) => vec![
                    o.start_offset.to_string(),
                    o.end_offset.to_string(),
                    format!("unreadable footer: {e}"),
                ],
            })
            .collect();
        table::write(
            out,
            &[
                "START",
                "END",
                "RECORDS",
                "BYTES",
                "FIRST_TS_MS",
                "MAX_TS_MS",
            ],
            &table_rows,
        )?;
        for key in &foreign {
            writeln!(out, "not a segment object: {key}")?;
        }
        if let Some(d) = &disagreements {
            if d.is_empty() {
                writeln!(out, "bucket and Raft descriptors agree")?;
            }
            for line in d {
                writeln!(out, "DISAGREEMENT: {line}")?;
            }
        }
    }
    // A comparison a script runs must fail on a disagreement, as `verify
    // --against-descriptors` does.
    if let Some(d) = disagreements.filter(|d| !d.is_empty()) {
        out.flush()?;
        bail!(
            "the bucket and the Raft descriptors of {topic} disagree: {} disagreement(s)",
            d.len()
        );
    }
    Ok(())
}

fn compare_with_broker(
    keys: &StorageKeys,
    topic: &TopicName,
    objects: &[SegmentObjectInfo],
    broker: &BrokerAccess<'_>,
) -> anyhow::Result<Vec<String>> {
    let client = AdminClient::new(broker.admin_url, broker.token.unwrap_or_default());
    let reply = client
        .get(
            &format!("/v1/storage/topics{topic}/segments"),
            &[("prefix", keys.prefix())],
        )
        .map_err(crate::commands::CommandError::from)?;
    let mut committed: BTreeMap<String, u64> = BTreeMap::new();
    for d in reply["segments"].as_array().into_iter().flatten() {
        if let (Some(key), Some(size)) = (d["object_id"].as_str(), d["size"].as_u64()) {
            committed.insert(key.to_owned(), size);
        }
    }
    let stored: BTreeMap<&str, u64> = objects.iter().map(|o| (o.key.as_str(), o.size)).collect();
    let mut out = Vec::new();
    for (key, size) in &committed {
        match stored.get(key.as_str()) {
            None => out.push(format!("descriptor without object: {key}")),
            Some(s) if s != size => {
                out.push(format!(
                    "{key}: descriptor says {size} bytes, the object has {s}"
                ));
            }
            Some(_) => {}
        }
    }
    for key in stored.keys() {
        if !committed.contains_key(*key) {
            out.push(format!("object without descriptor: {key}"));
        }
    }
    Ok(out)
}

// ---------------------------------------------------------------------------
// verify
// ---------------------------------------------------------------------------

#[derive(Debug, Default)]
struct TopicSummary {
    segments: u64,
    records: u64,
    bytes: u64,
    damaged_segments: u64,
    problems: Vec<Value>,
    /// Declared holes (offsets with no record on purpose): not problems.
    holes: Vec<Value>,
}

async fn verify(
    archive: &Archive,
    topics: &[String],
    against: Option<(&StorageKeys, &BrokerAccess<'_>)>,
    output: OutputFormat,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let topics: Vec<TopicName> = if topics.is_empty() {
        archive.topics().await?
    } else {
        topics
            .iter()
            .map(|t| parse_topic(t))
            .collect::<anyhow::Result<_>>()?
    };
    let place = format!("bucket {}", archive.bucket().description());
    if topics.is_empty() {
        // A cron audit must not pass on a typo in --bucket or --prefix.
        bail!(
            "no topic has segment objects in {place} under the prefix: nothing to verify (check --bucket and --prefix)"
        );
    }
    let mut listing = Vec::new();
    for topic in &topics {
        let (objects, foreign) = archive.segments(topic).await?;
        listing.push((topic.clone(), objects, foreign));
    }
    let total: u64 = listing.iter().flat_map(|(_, o, _)| o).map(|o| o.size).sum();
    let bar = progress(total, "verify");
    let mut summaries = Vec::new();
    let mut damaged_total = 0;
    for (topic, objects, foreign) in &listing {
        let mut summary = TopicSummary::default();
        let mut expected: Option<u64> = None;
        for object in objects {
            summary.segments += 1;
            summary.bytes += object.size;
            if let Some(next) = expected {
                if object.start_offset > next {
                    summary.problems.push(json!({
                        "kind": "gap", "first_offset": next, "end_offset": object.start_offset,
                        "message": format!("no object holds offsets {next}..{}", object.start_offset),
                    }));
                } else if object.start_offset < next {
                    summary.problems.push(json!({
                        "kind": "overlap", "first_offset": object.start_offset, "end_offset": next,
                        "segment": object.key,
                        "message": format!("offsets {}..{next} are in two objects", object.start_offset),
                    }));
                }
            }
            expected = Some(object.end_offset + 1);
            let done_before = bar.position();
            let verdict: SegmentVerdict = archive
                .verify(object, &mut |read| bar.set_position(done_before + read))
                .await;
            bar.set_position(done_before + object.size);
            summary.records += verdict.records_ok;
            if !verdict.damage.is_empty() {
                summary.damaged_segments += 1;
            }
            for h in &verdict.holes {
                summary.holes.push(json!({
                    "segment": object.key, "first_offset": h.first_offset, "end_offset": h.end_offset,
                }));
            }
            for d in &verdict.damage {
                summary.problems.push(json!({
                    "kind": "damage",
                    "segment": object.key,
                    "segment_start": object.start_offset,
                    "segment_end": object.end_offset,
                    "first_offset": d.first_offset,
                    "end_offset": d.end_offset,
                    "position": d.position,
                    "message": d.reason,
                }));
            }
            check_footer_counts(&verdict, &mut summary);
        }
        if objects.is_empty() {
            summary.problems.push(json!({
                "kind": "missing",
                "message": format!("no segment objects for {topic} in {place} under the prefix (a wrong topic name or --prefix, or nothing archived yet)"),
            }));
        }
        for key in foreign {
            summary.problems.push(
                json!({"kind": "foreign", "segment": key, "message": "not a segment object"}),
            );
        }
        if let Some((keys, broker)) = against {
            summary
                .problems
                .extend(descriptors::check(archive, keys, topic, broker).await?);
        }
        damaged_total += summary
            .problems
            .iter()
            .filter(|p| p["kind"] != "foreign")
            .count();
        summaries.push((topic.clone(), summary));
    }
    bar.finish_and_clear();
    if output == OutputFormat::Json {
        let doc: Vec<Value> = summaries
            .iter()
            .map(|(t, s)| {
                json!({
                    "topic": t, "segments": s.segments, "records": s.records, "bytes": s.bytes,
                    "damaged_segments": s.damaged_segments, "ok": s.problems.iter().all(|p| p["kind"] == "foreign"),
                    "problems": s.problems, "holes": s.holes,
                })
            })
            .collect();
        writeln!(
            out,
            "{}",
            serde_json::to_string_pretty(&json!({ "topics": doc }))?
        )?;
    } else {
        for (topic, s) in &summaries {
            let verdict = if s.problems.iter().all(|p| p["kind"] == "foreign") {
                "OK"
            } else if s
                .problems
                .iter()
                .all(|p| p["kind"] == "foreign" || p["kind"] == "missing")
            {
                // Nothing there to be damaged: a wrong name or prefix.
                "NOT FOUND"
            } else {
                "DAMAGED"
            };
            writeln!(
                out,
                "{topic}: {} segments, {} records verified, {} bytes: {verdict}",
                s.segments, s.records, s.bytes
            )?;
            for h in &s.holes {
                writeln!(
                    out,
                    "  declared hole {}..{} in segment {} (no records on purpose, not damage)",
                    h["first_offset"],
                    h["end_offset"],
                    h["segment"].as_str().unwrap_or("")
                )?;
            }
            for p in &s.problems {
                match p["kind"].as_str() {
                    Some("damage") => writeln!(
                        out,
                        "  segment {} (offsets {}..={}): offsets {}..{} damaged at byte {}: {}",
                        p["segment"].as_str().unwrap_or(""),
                        p["segment_start"],
                        p["segment_end"],
                        p["first_offset"],
                        p["end_offset"],
                        p["position"],
                        p["message"].as_str().unwrap_or("")
                    )?,
                    // Not the topic's data: named, and not counted.
                    Some("foreign") => writeln!(
                        out,
                        "  not a segment object (ignored, not counted as a problem): {}",
                        p["segment"].as_str().unwrap_or("")
                    )?,
                    _ => writeln!(
                        out,
                        "  {}: {}",
                        p["kind"].as_str().unwrap_or(""),
                        p["message"].as_str().unwrap_or("")
                    )?,
                }
            }
        }
    }
    if damaged_total > 0 {
        out.flush()?;
        let missing = summaries
            .iter()
            .flat_map(|(_, s)| &s.problems)
            .filter(|p| p["kind"] == "missing")
            .count();
        if missing == damaged_total {
            bail!(
                "{missing} topic(s) have no segment objects in the archive (check the topic names and --prefix); nothing found is damaged"
            );
        }
        bail!("the archive is damaged: {damaged_total} problem(s) found");
    }
    Ok(())
}

/// An intact object's footer must account for exactly the verified records.
fn check_footer_counts(verdict: &SegmentVerdict, summary: &mut TopicSummary) {
    if let (Some(footer), true) = (verdict.footer.as_ref(), verdict.damage.is_empty()) {
        let footer: &Footer = footer;
        if footer.record_count() != verdict.records_ok {
            summary.problems.push(json!({
                "kind": "count",
                "segment": verdict.object.key,
                "message": format!(
                    "footer says {} records, {} verified",
                    footer.record_count(),
                    verdict.records_ok
                ),
            }));
        }
    }
}
