//! `tribctl archive export`: a range of a topic's archived records to a
//! file, as JSON lines, CSV, Parquet or the raw record batches.
//!
//! The files appear only when the export is complete: each is written as
//! `{path}.partial` and renamed, so an interrupted or refused export leaves
//! no half file under the name a reader would open ([`output`]). Refused
//! before anything is read: an output inside the local bucket directory,
//! an existing output without `--force`, `--out` and `--rejected` naming
//! the same file, a `--from-offset` past the archived records.
//!
//! The summary on stderr counts the rows of `--out` and those of
//! `--rejected` apart.
//!
//! Parquet ([`tributary_lakehouse::table`] has the layout): columns
//! `offset`, `timestamp`, `key`, `headers`, `value`; with `--json-columns
//! FIELD:TYPE,...` (or `--json-columns infer`: from the first
//! `--infer-rows` values) the value's fields become typed columns and
//! `_extra`. A value that does not fit stops the export with an error
//! naming its offset, unless `--rejected FILE` is given: such records go
//! there (Parquet: `offset`, `timestamp`, `key`, `headers`, `value`,
//! `_reason`) and the export goes on.
//!
//! CSV: a header line, then `offset,timestamp,timestamp_ms,key,key_b64,
//! headers,value,value_b64`; `timestamp` is RFC 3339, `headers` a JSON
//! array of `{"name","value"}`, and a key or value that is not UTF-8 is in
//! the `_b64` column (standard base64) with the text column empty.

use std::io::Write;
use std::ops::ControlFlow;
use std::path::PathBuf;

use anyhow::{anyhow, bail};
use base64::Engine as _;
use clap::{Args, ValueEnum};
use tributary_archive::reader::{Archive, ArchivedRecord};
use tributary_lakehouse::schema::DEFAULT_INFER_ROWS;
use tributary_lakehouse::{JsonColumns, Layout, ParquetOptions, TableError, TableWriter};
use tributary_proto::archive::ArchiveError;
use tributary_proto::keys::TopicName;

use super::lines::{Limited, LineWriter, RecordWriter, ValueAs};
use super::output::{self, OutFile, Output, Staged};
use super::{RangeArgs, RecordCount, say_hole};

/// Output formats of `export`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ExportFormat {
    /// Record lines as `cat` prints them.
    Jsonl,
    /// Comma-separated values with a header line.
    Csv,
    /// Apache Parquet, zstd-compressed.
    Parquet,
    /// The record batches verbatim (FORMAT.md layout), whole batches, so
    /// the first and last may hold records just outside the range.
    Batches,
}

/// A count of at least 1 (clap's ranged parsers do not cover `usize`).
fn at_least_one(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

/// Options of `export` besides the range.
#[derive(Debug, Args)]
pub struct ExportArgs {
    /// Output file.
    #[arg(long)]
    out: PathBuf,
    /// Output format.
    #[arg(long, value_enum, default_value_t = ExportFormat::Jsonl)]
    format: ExportFormat,
    /// How values are written in `jsonl` (see `cat`).
    #[arg(long, value_enum, default_value_t = ValueAs::Auto)]
    value_as: ValueAs,
    /// Parquet only: typed columns from JSON object values, as
    /// `FIELD:TYPE,...` (types bool, int64, double, string, timestamp,
    /// json), or `infer` to infer them from the first `--infer-rows` values.
    #[arg(long)]
    json_columns: Option<String>,
    /// Values `--json-columns infer` looks at (at least 1).
    #[arg(long, default_value_t = DEFAULT_INFER_ROWS, value_parser = at_least_one)]
    infer_rows: usize,
    /// Parquet with `--json-columns`: write records whose value does not
    /// fit here (Parquet, with `_reason`) instead of stopping the export.
    #[arg(long)]
    rejected: Option<PathBuf>,
    /// Parquet: largest row group, rows (at least 1).
    #[arg(long, default_value_t = ParquetOptions::default().row_group_rows, value_parser = at_least_one)]
    row_group_rows: usize,
    /// Parquet: zstd level (1..=22; higher is smaller and slower).
    #[arg(long, default_value_t = ParquetOptions::default().zstd_level,
          value_parser = clap::value_parser!(i32).range(1..=22))]
    zstd_level: i32,
    /// Replace `--out` (and `--rejected`) if it exists; without it an
    /// existing file is refused.
    #[arg(long)]
    force: bool,
}

/// Runs `export`.
///
/// # Errors
/// Option conflicts, an output path that is refused ([`output::check`]),
/// a `--from-offset` past the archived records, archive reads, output
/// errors, a value that does not fit `--json-columns` (without
/// `--rejected`).
pub async fn export(archive: &Archive, range: &RangeArgs, args: &ExportArgs) -> anyhow::Result<()> {
    if args.format != ExportFormat::Parquet
        && (args.json_columns.is_some() || args.rejected.is_some())
    {
        bail!("--json-columns and --rejected apply to --format parquet");
    }
    if args.rejected.is_some() && args.json_columns.is_none() {
        bail!("--rejected needs --json-columns: only typed columns can refuse a value");
    }
    let limits = range.limits()?;
    let topic = range.topic()?;
    let mut outputs = vec![Output {
        flag: "--out",
        path: &args.out,
    }];
    if let Some(path) = &args.rejected {
        outputs.push(Output {
            flag: "--rejected",
            path,
        });
    }
    output::check(&outputs, archive.bucket().local_root(), args.force)?;
    if let Some(from) = range.from_offset {
        check_from_offset(archive, &topic, from).await?;
    }
    let bar = RecordCount::on_stderr("export");
    let (staged, mut writer) = Staged::create(&args.out, args.force)?;
    let mut rejected_file = None;
    let records = match args.format {
        ExportFormat::Jsonl => {
            let lines = LineWriter {
                topic: &topic,
                value_as: args.value_as,
                out: &mut writer,
            };
            let mut sink = Limited::new(lines, limits);
            read(archive, &topic, range, &bar, &mut |r| sink.take(r)).await?;
            sink.finish()?.1
        }
        ExportFormat::Csv => {
            let mut sink = Limited::new(CsvRows::new(&mut writer), limits);
            read(archive, &topic, range, &bar, &mut |r| sink.take(r)).await?;
            let (mut rows, written) = sink.finish()?;
            rows.csv.flush()?;
            written
        }
        ExportFormat::Parquet => {
            let rejected = match &args.rejected {
                Some(path) => Some(Staged::create(path, args.force)?),
                None => None,
            };
            let (rejected_staged, rejected_writer) = rejected.unzip();
            let rows = ParquetRows::new(&topic, args, &mut writer, rejected_writer)?;
            let mut sink = Limited::new(rows, limits);
            read(archive, &topic, range, &bar, &mut |r| sink.take(r)).await?;
            let (rows, _taken) = sink.finish()?;
            let (main_rows, rejected_writer) = rows.close()?;
            if let (Some(staged), Some((w, count))) = (rejected_staged, rejected_writer) {
                rejected_file = Some((staged, w, count));
            }
            main_rows
        }
        ExportFormat::Batches => batches(archive, &topic, range, &bar, &mut writer).await?,
    };
    bar.finish();
    let mut past_end = None;
    if records == 0 && rejected_file.as_ref().is_none_or(|(_, _, n)| *n == 0) {
        super::ensure_archived(archive, &topic).await?;
        if let Some(from) = range.from_timestamp {
            past_end = past_the_end(archive, &topic, from).await?;
        }
    }
    staged.sync(writer)?;
    let mut said = format!(
        "exported {records} records of {topic} to {}",
        args.out.display()
    );
    let mut all = vec![staged];
    if let Some((rejected, w, count)) = rejected_file {
        rejected.sync(w)?;
        all.push(rejected);
        if let Some(path) = &args.rejected {
            said.push_str(&format!(
                "; {count} records did not fit: {}",
                path.display()
            ));
        }
    }
    output::commit(all)?;
    if let Some(note) = past_end {
        said.push_str(&format!(" ({note})"));
    }
    eprintln!("{said}");
    Ok(())
}

/// Refuses a `--from-offset` at or past the end of the archived records
/// (the range is named); a topic with no segment objects is refused as a
/// read that finds nothing is ([`super::ensure_archived`]).
///
/// # Errors
/// As said; store errors.
pub(super) async fn check_from_offset(
    archive: &Archive,
    topic: &TopicName,
    from: u64,
) -> anyhow::Result<()> {
    let (objects, _) = archive.segments(topic).await?;
    let first = objects.iter().map(|o| o.start_offset).min();
    let last = objects.iter().map(|o| o.end_offset).max();
    let (Some(first), Some(last)) = (first, last) else {
        return super::ensure_archived(archive, topic).await;
    };
    if from > last {
        bail!(
            "--from-offset {from} is past the archived records of {topic}: the archive holds offsets {first}..={last} (nothing to read)"
        );
    }
    Ok(())
}

/// Why a read from `--from-timestamp` found nothing when that is because
/// every archived record is older (the latest timestamp is named), for a
/// note on stderr. Not an error, unlike a `--from-offset` past the end: a
/// "since" query of a scheduled export that finds nothing new is normal,
/// and its output (nothing, or an empty file) is the right answer. One
/// footer read per object.
///
/// # Errors
/// Store errors, damaged footers.
pub(super) async fn past_the_end(
    archive: &Archive,
    topic: &TopicName,
    from_ms: i64,
) -> anyhow::Result<Option<String>> {
    let (objects, _) = archive.segments(topic).await?;
    let mut latest: Option<i64> = None;
    for object in &objects {
        let footer = archive.footer(object).await?;
        latest = latest.max(Some(footer.max_timestamp_ms));
    }
    Ok(latest.filter(|&latest| from_ms > latest).map(|latest| {
        format!(
            "no record of {topic} at or after --from-timestamp {}: the latest archived record's timestamp is {} ({latest} ms)",
            rfc3339(from_ms),
            rfc3339(latest),
        )
    }))
}

/// `ms` since the Unix epoch in RFC 3339 with milliseconds, or the number
/// when it is before the epoch.
fn rfc3339(ms: i64) -> String {
    u64::try_from(ms).map_or_else(
        |_| format!("{ms} ms"),
        |ms| {
            humantime::format_rfc3339_millis(
                std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms),
            )
            .to_string()
        },
    )
}

async fn read(
    archive: &Archive,
    topic: &TopicName,
    range: &RangeArgs,
    bar: &RecordCount,
    take: &mut dyn FnMut(ArchivedRecord) -> ControlFlow<()>,
) -> anyhow::Result<()> {
    archive
        .read_with_holes(
            topic,
            range.start(),
            &mut |r| {
                let flow = take(r);
                if flow.is_continue() {
                    bar.add(1);
                }
                flow
            },
            &mut say_hole,
        )
        .await?;
    Ok(())
}

async fn batches(
    archive: &Archive,
    topic: &TopicName,
    range: &RangeArgs,
    bar: &RecordCount,
    writer: &mut OutFile,
) -> anyhow::Result<u64> {
    let limits = range.limits()?;
    let mut written = 0u64;
    let mut error = None;
    archive
        .read_batches_with_holes(
            topic,
            range.start(),
            &mut |batch| {
                if limits.past(batch.base_offset(), written) {
                    return Ok(ControlFlow::Break(()));
                }
                if let Err(e) = writer.write_all(batch.as_bytes()) {
                    error = Some(e);
                    return Ok::<_, ArchiveError>(ControlFlow::Break(()));
                }
                bar.add(u64::from(batch.record_count()));
                written += u64::from(batch.record_count());
                // Nothing past a complete range is read (a damaged batch
                // after it must not fail the export).
                if limits.complete(batch.next_offset().saturating_sub(1), written) {
                    return Ok(ControlFlow::Break(()));
                }
                Ok(ControlFlow::Continue(()))
            },
            &mut say_hole,
        )
        .await?;
    match error {
        Some(e) => Err(e.into()),
        None => Ok(written),
    }
}

/// CSV rows (see the module doc).
struct CsvRows<'a> {
    csv: csv::Writer<&'a mut OutFile>,
    header_written: bool,
}

impl<'a> CsvRows<'a> {
    fn new(out: &'a mut OutFile) -> CsvRows<'a> {
        CsvRows {
            csv: csv::Writer::from_writer(out),
            header_written: false,
        }
    }
}

impl RecordWriter for CsvRows<'_> {
    fn write(&mut self, r: ArchivedRecord) -> anyhow::Result<()> {
        if !std::mem::replace(&mut self.header_written, true) {
            self.csv.write_record([
                "offset",
                "timestamp",
                "timestamp_ms",
                "key",
                "key_b64",
                "headers",
                "value",
                "value_b64",
            ])?;
        }
        let (key, key_b64) = match &r.record.key {
            Some(k) => text_or_b64(k),
            None => (String::new(), String::new()),
        };
        let headers: Vec<serde_json::Value> = r
            .record
            .headers
            .iter()
            .map(|(name, v)| match std::str::from_utf8(v) {
                Ok(t) => serde_json::json!({ "name": name, "value": t }),
                Err(_) => serde_json::json!({ "name": name, "value_b64": b64(v) }),
            })
            .collect();
        let (value, value_b64) = text_or_b64(&r.record.value);
        self.csv.write_record([
            r.offset.to_string(),
            tributary_lakehouse::time::rfc3339_ms(r.record.timestamp_ms).unwrap_or_default(),
            r.record.timestamp_ms.to_string(),
            key,
            key_b64,
            serde_json::Value::Array(headers).to_string(),
            value,
            value_b64,
        ])?;
        Ok(())
    }
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn text_or_b64(bytes: &[u8]) -> (String, String) {
    match std::str::from_utf8(bytes) {
        Ok(t) => (t.to_owned(), String::new()),
        Err(_) => (String::new(), b64(bytes)),
    }
}

type Out<'a> = &'a mut OutFile;

/// The rejected file's output, with its row count.
type RejectedOut = (OutFile, u64);

/// Parquet rows; with `--json-columns infer` the first values are held
/// until the columns are known.
struct ParquetRows<'a> {
    topic: &'a TopicName,
    options: ParquetOptions,
    /// `Some(n)`: inferring from the first `n` values.
    infer_rows: Option<usize>,
    held: Vec<ArchivedRecord>,
    out: Option<Out<'a>>,
    writer: Option<TableWriter<Out<'a>>>,
    rejected_out: Option<OutFile>,
    rejected: Option<TableWriter<OutFile>>,
    layout: Option<Layout>,
}

impl<'a> ParquetRows<'a> {
    fn new(
        topic: &'a TopicName,
        args: &ExportArgs,
        out: Out<'a>,
        rejected_out: Option<OutFile>,
    ) -> anyhow::Result<ParquetRows<'a>> {
        let (layout, infer_rows) = match args.json_columns.as_deref() {
            None => (Some(Layout::Raw), None),
            Some("infer") => (None, Some(args.infer_rows.max(1))),
            Some(spec) => (
                Some(Layout::Json(
                    JsonColumns::parse_list(spec).map_err(|e| anyhow!("--json-columns: {e}"))?,
                )),
                None,
            ),
        };
        let options = ParquetOptions {
            row_group_rows: args.row_group_rows,
            zstd_level: args.zstd_level,
            metadata: vec![("tributary.topic".into(), topic.to_string())],
        };
        Ok(ParquetRows {
            topic,
            options,
            infer_rows,
            held: Vec::new(),
            out: Some(out),
            writer: None,
            rejected_out,
            rejected: None,
            layout,
        })
    }

    /// Opens the writers once the layout is known.
    fn open(&mut self) -> anyhow::Result<()> {
        let layout = match self.layout.take() {
            Some(layout) => layout,
            None => {
                // With `--rejected`, a value that is not a JSON object is
                // rejected below rather than stopping the inference.
                let rejecting = self.rejected_out.is_some();
                let columns = JsonColumns::infer(
                    self.held
                        .iter()
                        .filter(|r| {
                            !rejecting
                                || serde_json::from_slice::<
                                    serde_json::Map<String, serde_json::Value>,
                                >(&r.record.value)
                                .is_ok()
                        })
                        .map(|r| (r.offset, &r.record.value[..])),
                )
                .map_err(|e| anyhow!("--json-columns infer: {e}"))?;
                let names: Vec<String> = columns
                    .columns()
                    .iter()
                    .map(|c| format!("{}:{}", c.name, c.ty))
                    .collect();
                eprintln!("inferred columns of {}: {}", self.topic, names.join(","));
                Layout::Json(columns)
            }
        };
        let out = self
            .out
            .take()
            .ok_or_else(|| anyhow!("parquet writer opened twice"))?;
        self.writer = Some(TableWriter::new(out, layout, &self.options)?);
        if let Some(out) = self.rejected_out.take() {
            self.rejected = Some(TableWriter::new(out, Layout::Rejected, &self.options)?);
        }
        for r in std::mem::take(&mut self.held) {
            self.push(&r)?;
        }
        Ok(())
    }

    fn push(&mut self, r: &ArchivedRecord) -> anyhow::Result<()> {
        let Some(writer) = self.writer.as_mut() else {
            bail!("parquet writer not open");
        };
        match writer.push(r.offset, &r.record) {
            Ok(()) => Ok(()),
            Err(TableError::Row(e)) => match self.rejected.as_mut() {
                Some(rejected) => {
                    rejected.push_with_reason(r.offset, &r.record, &e.reason)?;
                    Ok(())
                }
                None => Err(anyhow!(
                    "{e}: the value does not fit --json-columns (give --rejected FILE to write such records apart)"
                )),
            },
            Err(e) => Err(e.into()),
        }
    }

    /// Writes the footers; returns the rows of the main file, and the
    /// rejected writer's output with its row count.
    fn close(mut self) -> anyhow::Result<(u64, Option<RejectedOut>)> {
        if self.writer.is_none() {
            self.open()?;
        }
        let mut rows = 0;
        if let Some(writer) = self.writer.take() {
            rows = writer.rows();
            writer.finish()?;
        }
        let rejected = match self.rejected.take() {
            Some(w) => {
                let count = w.rows();
                Some((w.finish()?, count))
            }
            None => None,
        };
        Ok((rows, rejected))
    }
}

impl RecordWriter for ParquetRows<'_> {
    fn write(&mut self, r: ArchivedRecord) -> anyhow::Result<()> {
        if self.writer.is_some() {
            return self.push(&r);
        }
        self.held.push(r);
        let enough = self.infer_rows.is_none_or(|n| self.held.len() >= n);
        if enough { self.open() } else { Ok(()) }
    }
}
