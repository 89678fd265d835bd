//! [`TableWriter`]: records (offset, [`Record`]) into a Parquet file, in
//! one of three [`Layout`]s.
//!
//! Every layout starts with the same four columns:
//!
//! | column | Arrow type | |
//! |---|---|---|
//! | `offset` | UInt64, not null | the record's offset (device to archive) |
//! | `timestamp` | Timestamp(ms, "UTC"), not null | the record's timestamp |
//! | `key` | Binary, nullable | null when the record has none |
//! | `headers` | Map<Utf8, Binary>, not null | in record order; a repeated name's n-th use is `name#n` ([`unique_names`]) |
//!
//! then `value` (Binary) for [`Layout::Raw`]; one nullable column per
//! typed field and `_extra` (Utf8, the fields the schema does not name as a
//! JSON object, null when none) for [`Layout::Json`]; `value` and
//! `_reason` (Utf8) for [`Layout::Rejected`].
//!
//! Encodings: `offset` and `timestamp` delta-encoded, `key` front-coded
//! (DELTA_BYTE_ARRAY), `key` and `value` without a dictionary; typed
//! columns with a dictionary that falls back to delta (integers, strings)
//! or byte-stream-split (doubles) when it outgrows its page.
//!
//! The file is zstd-compressed (level 1 by default), with statistics on every column (min/max
//! of `offset` and `timestamp` per row group and page let readers skip),
//! and row groups of at most [`ParquetOptions::row_group_rows`] rows. The
//! same records with the same options give the same bytes, so a retried
//! write of a deterministic key stores the same object.

use std::io::Write;
use std::sync::Arc;

use arrow_array::builder::{
    BinaryBuilder, BooleanBuilder, Float64Builder, Int64Builder, MapBuilder, StringBuilder,
    TimestampMillisecondBuilder, UInt64Builder,
};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::schema::types::ColumnPath;
use tributary_proto::batch::Record;

use crate::schema::{Cell, ColumnType, JsonColumns, RowError};

/// Rows buffered before they become one Arrow batch handed to the writer.
const BATCH_ROWS: usize = 8192;

/// What the columns after the fixed four are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Layout {
    /// `value` as bytes, unchanged.
    Raw,
    /// The value's JSON fields as typed columns, and `_extra`.
    Json(JsonColumns),
    /// `value` and `_reason`: records that did not fit a [`Layout::Json`].
    Rejected,
}

/// Parquet writer settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParquetOptions {
    /// Largest row group, rows. Default 131,072: a few MiB per group for
    /// telemetry-sized records, so a reader fetching one group by HTTP
    /// range from S3 reads little it does not need.
    pub row_group_rows: usize,
    /// zstd level, 1..=22. Default 1: the fastest, and on typed columns
    /// (mostly dictionary- and delta-encoded) within a few percent of
    /// level 3's size.
    pub zstd_level: i32,
    /// Key-value metadata written in the footer (topic, offsets).
    pub metadata: Vec<(String, String)>,
}

impl Default for ParquetOptions {
    fn default() -> Self {
        ParquetOptions {
            row_group_rows: 131_072,
            zstd_level: 1,
            metadata: Vec::new(),
        }
    }
}

/// Errors writing Parquet.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TableError {
    /// Arrow or Parquet refused (a bad option, an I/O error of the output).
    #[error("parquet: {0}")]
    Parquet(#[from] parquet::errors::ParquetError),
    /// Building a batch failed.
    #[error("arrow: {0}")]
    Arrow(#[from] arrow_schema::ArrowError),
    /// The record does not fit the typed columns; nothing of it was written.
    #[error(transparent)]
    Row(#[from] RowError),
    /// Two columns of the layout have the same name (a layout made by an
    /// older inference): readers such as pyarrow refuse such a file, so
    /// none is written.
    #[error(
        "two columns are named `{0}`: a Parquet file with duplicate column names is unreadable"
    )]
    DuplicateColumn(String),
}

/// The Arrow schema of a layout (see the module doc).
pub fn schema(layout: &Layout) -> SchemaRef {
    let mut fields = vec![
        Field::new("offset", DataType::UInt64, false),
        Field::new(
            "timestamp",
            DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())),
            false,
        ),
        Field::new("key", DataType::Binary, true),
        Field::new("headers", headers_type(), false),
    ];
    match layout {
        Layout::Raw => fields.push(Field::new("value", DataType::Binary, false)),
        Layout::Json(columns) => {
            for c in columns.columns() {
                fields.push(Field::new(&c.name, arrow_type(c.ty), true));
            }
            fields.push(Field::new("_extra", DataType::Utf8, true));
        }
        Layout::Rejected => {
            fields.push(Field::new("value", DataType::Binary, false));
            fields.push(Field::new("_reason", DataType::Utf8, false));
        }
    }
    Arc::new(Schema::new(fields))
}

fn arrow_type(ty: ColumnType) -> DataType {
    match ty {
        ColumnType::Bool => DataType::Boolean,
        ColumnType::Int64 => DataType::Int64,
        ColumnType::Double => DataType::Float64,
        ColumnType::String | ColumnType::Json => DataType::Utf8,
        ColumnType::Timestamp => DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())),
    }
}

fn headers_builder() -> MapBuilder<StringBuilder, BinaryBuilder> {
    MapBuilder::new(None, StringBuilder::new(), BinaryBuilder::new())
}

/// The `headers` map type exactly as [`MapBuilder`] builds it.
fn headers_type() -> DataType {
    use arrow_array::Array as _;
    headers_builder().finish().data_type().clone()
}

/// A builder per typed column.
enum Typed {
    Bool(BooleanBuilder),
    Int(Int64Builder),
    Double(Float64Builder),
    Str(StringBuilder),
    Timestamp(TimestampMillisecondBuilder),
}

impl Typed {
    fn new(ty: ColumnType) -> Typed {
        match ty {
            ColumnType::Bool => Typed::Bool(BooleanBuilder::new()),
            ColumnType::Int64 => Typed::Int(Int64Builder::new()),
            ColumnType::Double => Typed::Double(Float64Builder::new()),
            ColumnType::String | ColumnType::Json => Typed::Str(StringBuilder::new()),
            ColumnType::Timestamp => {
                Typed::Timestamp(TimestampMillisecondBuilder::new().with_timezone("UTC"))
            }
        }
    }

    /// Appends `cell`, which [`JsonColumns::fit`] made for this type.
    fn append(&mut self, cell: Cell) {
        match (self, cell) {
            (Typed::Bool(b), Cell::Bool(v)) => b.append_value(v),
            (Typed::Int(b), Cell::Int(v)) => b.append_value(v),
            (Typed::Double(b), Cell::Double(v)) => b.append_value(v),
            (Typed::Str(b), Cell::Str(v)) => b.append_value(v),
            (Typed::Timestamp(b), Cell::Timestamp(v)) => b.append_value(v),
            (Typed::Bool(b), _) => b.append_null(),
            (Typed::Int(b), _) => b.append_null(),
            (Typed::Double(b), _) => b.append_null(),
            (Typed::Str(b), _) => b.append_null(),
            (Typed::Timestamp(b), _) => b.append_null(),
        }
    }

    fn finish(&mut self) -> ArrayRef {
        match self {
            Typed::Bool(b) => Arc::new(b.finish()),
            Typed::Int(b) => Arc::new(b.finish()),
            Typed::Double(b) => Arc::new(b.finish()),
            Typed::Str(b) => Arc::new(b.finish()),
            Typed::Timestamp(b) => Arc::new(b.finish()),
        }
    }
}

/// The builders after the fixed four.
enum Tail {
    Raw(BinaryBuilder),
    Json {
        columns: JsonColumns,
        typed: Vec<Typed>,
        extra: StringBuilder,
    },
    Rejected {
        value: BinaryBuilder,
        reason: StringBuilder,
    },
}

/// Writes records into one Parquet file (see the module doc).
pub struct TableWriter<W: Write + Send> {
    writer: ArrowWriter<W>,
    schema: SchemaRef,
    offset: UInt64Builder,
    timestamp: TimestampMillisecondBuilder,
    key: BinaryBuilder,
    headers: MapBuilder<StringBuilder, BinaryBuilder>,
    tail: Tail,
    buffered: usize,
    rows: u64,
}

impl<W: Write + Send> TableWriter<W> {
    /// A writer of `layout` into `out`.
    ///
    /// # Errors
    /// [`TableError::Parquet`] for a bad option (zstd level);
    /// [`TableError::DuplicateColumn`] when two columns share a name.
    pub fn new(
        out: W,
        layout: Layout,
        options: &ParquetOptions,
    ) -> Result<TableWriter<W>, TableError> {
        let schema = schema(&layout);
        let mut names = std::collections::BTreeSet::new();
        for field in schema.fields() {
            if !names.insert(field.name().as_str()) {
                return Err(TableError::DuplicateColumn(field.name().clone()));
            }
        }
        let metadata: Vec<KeyValue> = options
            .metadata
            .iter()
            .map(|(k, v)| KeyValue::new(k.clone(), v.clone()))
            .collect();
        let mut props = WriterProperties::builder()
            .set_compression(Compression::ZSTD(ZstdLevel::try_new(options.zstd_level)?))
            .set_max_row_group_row_count(Some(options.row_group_rows.max(1)))
            .set_statistics_enabled(EnabledStatistics::Page)
            .set_key_value_metadata((!metadata.is_empty()).then_some(metadata));
        // Offsets and timestamps rise by small steps: delta-encoded they
        // take a few bits each. Keys and values are mostly distinct, so a
        // dictionary only costs time; keys (device ids, date-times) share
        // prefixes with their neighbours: front-coded (DELTA_BYTE_ARRAY).
        for (column, encoding) in [
            ("offset", Some(Encoding::DELTA_BINARY_PACKED)),
            ("timestamp", Some(Encoding::DELTA_BINARY_PACKED)),
            ("key", Some(Encoding::DELTA_BYTE_ARRAY)),
            ("value", None),
        ] {
            let path = ColumnPath::from(column);
            props = props.set_column_dictionary_enabled(path.clone(), false);
            if let Some(encoding) = encoding {
                props = props.set_column_encoding(path, encoding);
            }
        }
        // Typed columns keep their dictionary (readings repeat values);
        // one that outgrows it falls back to an encoding that suits it.
        if let Layout::Json(columns) = &layout {
            for c in columns.columns() {
                let fallback = match c.ty {
                    ColumnType::String | ColumnType::Json => Encoding::DELTA_BYTE_ARRAY,
                    ColumnType::Int64 | ColumnType::Timestamp => Encoding::DELTA_BINARY_PACKED,
                    ColumnType::Double => Encoding::BYTE_STREAM_SPLIT,
                    ColumnType::Bool => continue,
                };
                props = props.set_column_encoding(ColumnPath::from(c.name.as_str()), fallback);
            }
        }
        let props = props.build();
        let writer = ArrowWriter::try_new(out, schema.clone(), Some(props))?;
        let tail = match layout {
            Layout::Raw => Tail::Raw(BinaryBuilder::new()),
            Layout::Json(columns) => Tail::Json {
                typed: columns.columns().iter().map(|c| Typed::new(c.ty)).collect(),
                columns,
                extra: StringBuilder::new(),
            },
            Layout::Rejected => Tail::Rejected {
                value: BinaryBuilder::new(),
                reason: StringBuilder::new(),
            },
        };
        Ok(TableWriter {
            writer,
            schema,
            offset: UInt64Builder::new(),
            timestamp: TimestampMillisecondBuilder::new().with_timezone("UTC"),
            key: BinaryBuilder::new(),
            headers: headers_builder(),
            tail,
            buffered: 0,
            rows: 0,
        })
    }

    /// Rows written so far.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Appends one record of a [`Layout::Raw`] or [`Layout::Json`] table.
    ///
    /// # Errors
    /// [`TableError::Row`] when the value does not fit the typed columns
    /// (nothing of the record is written); [`TableError::Parquet`] when the
    /// output fails.
    pub fn push(&mut self, offset: u64, record: &Record) -> Result<(), TableError> {
        self.push_with_reason(offset, record, "")
    }

    /// Appends one record of a [`Layout::Rejected`] table with why it was
    /// rejected (for the other layouts the reason is ignored).
    ///
    /// # Errors
    /// As [`TableWriter::push`].
    pub fn push_with_reason(
        &mut self,
        offset: u64,
        record: &Record,
        why: &str,
    ) -> Result<(), TableError> {
        // Fit first, so a value that does not fit leaves no partial row.
        match &mut self.tail {
            Tail::Raw(value) => value.append_value(&record.value),
            Tail::Json {
                columns,
                typed,
                extra,
            } => {
                let row = columns.fit(offset, &record.value)?;
                for (builder, cell) in typed.iter_mut().zip(row.cells) {
                    builder.append(cell);
                }
                extra.append_option(row.extra);
            }
            Tail::Rejected { value, reason } => {
                value.append_value(&record.value);
                reason.append_value(why);
            }
        }
        self.offset.append_value(offset);
        self.timestamp.append_value(record.timestamp_ms);
        self.key.append_option(record.key.as_deref());
        for (name, value) in unique_names(&record.headers) {
            self.headers.keys().append_value(name);
            self.headers.values().append_value(value);
        }
        self.headers.append(true)?;
        self.buffered += 1;
        self.rows += 1;
        if self.buffered >= BATCH_ROWS {
            self.flush_batch()?;
        }
        Ok(())
    }

    fn flush_batch(&mut self) -> Result<(), TableError> {
        if self.buffered == 0 {
            return Ok(());
        }
        let mut arrays: Vec<ArrayRef> = vec![
            Arc::new(self.offset.finish()),
            Arc::new(self.timestamp.finish()),
            Arc::new(self.key.finish()),
            Arc::new(self.headers.finish()),
        ];
        match &mut self.tail {
            Tail::Raw(value) => arrays.push(Arc::new(value.finish())),
            Tail::Json { typed, extra, .. } => {
                arrays.extend(typed.iter_mut().map(Typed::finish));
                arrays.push(Arc::new(extra.finish()));
            }
            Tail::Rejected { value, reason } => {
                arrays.push(Arc::new(value.finish()));
                arrays.push(Arc::new(reason.finish()));
            }
        }
        let batch = RecordBatch::try_new(self.schema.clone(), arrays)?;
        self.writer.write(&batch)?;
        self.buffered = 0;
        Ok(())
    }

    /// Writes what is buffered and the footer; returns the output.
    ///
    /// # Errors
    /// [`TableError::Parquet`] when the output fails.
    pub fn finish(mut self) -> Result<W, TableError> {
        self.flush_batch()?;
        Ok(self.writer.into_inner()?)
    }
}

/// `headers` with unique names, in record order: a map's keys must be
/// unique (DuckDB refuses a Parquet MAP that repeats one: "Map keys must
/// be unique"), while a record may repeat a header name (MQTT 5 user
/// properties do). The first use of a name keeps it; its n-th use becomes
/// `name#n`, or `name#n#2`... should the record also hold a header of
/// that name. Nothing is dropped.
pub fn unique_names<V: AsRef<[u8]>>(
    headers: &[(String, V)],
) -> Vec<(std::borrow::Cow<'_, str>, &[u8])> {
    use std::borrow::Cow;
    use std::collections::{HashMap, HashSet};
    if headers.len() < 2 {
        return headers
            .iter()
            .map(|(n, v)| (Cow::Borrowed(n.as_str()), v.as_ref()))
            .collect();
    }
    let mut taken: HashSet<Cow<'_, str>> = HashSet::new();
    let mut uses: HashMap<&str, usize> = HashMap::new();
    let mut out = Vec::with_capacity(headers.len());
    for (name, value) in headers {
        let n = uses.entry(name.as_str()).or_insert(0);
        *n += 1;
        let mut unique: Cow<'_, str> = if *n == 1 {
            Cow::Borrowed(name.as_str())
        } else {
            Cow::Owned(format!("{name}#{n}"))
        };
        // A later header with a real name equal to an invented one, or
        // an invented one equal to an earlier real one.
        let mut again = 1;
        while taken.contains(&unique)
            || (*n > 1 && headers.iter().any(|(h, _)| h == unique.as_ref()))
        {
            again += 1;
            unique = Cow::Owned(format!("{name}#{n}#{again}"));
        }
        taken.insert(unique.clone());
        out.push((unique, value.as_ref()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use parquet::file::reader::{FileReader, SerializedFileReader};

    #[test]
    fn repeated_header_names_become_unique_and_nothing_is_dropped() {
        let headers: Vec<(String, &[u8])> = [
            ("dup", &b"1"[..]),
            ("dup", b"2"),
            ("", b"e"),
            ("dup", b"3"),
            ("dup#2", b"4"),
        ]
        .iter()
        .map(|(n, v)| ((*n).to_owned(), *v))
        .collect();
        let names: Vec<String> = unique_names(&headers)
            .into_iter()
            .map(|(n, _)| n.into_owned())
            .collect();
        assert_eq!(names, ["dup", "dup#2#2", "", "dup#3", "dup#2"]);
    }

    fn record(value: &str) -> Record {
        Record {
            timestamp_ms: 1_166_289_840_000,
            key: Some(Bytes::from_static(b"k")),
            headers: vec![("mqtt_topic".into(), Bytes::from_static(b"a/b"))],
            value: Bytes::copy_from_slice(value.as_bytes()),
        }
    }

    fn write(layout: Layout, values: &[&str], row_group_rows: usize) -> (Vec<u8>, Vec<RowError>) {
        let options = ParquetOptions {
            row_group_rows,
            ..ParquetOptions::default()
        };
        let mut w = TableWriter::new(Vec::new(), layout, &options).expect("writer");
        let mut refused = Vec::new();
        for (i, v) in values.iter().enumerate() {
            match w.push(i as u64, &record(v)) {
                Ok(()) => {}
                Err(TableError::Row(e)) => refused.push(e),
                Err(e) => panic!("{e}"),
            }
        }
        (w.finish().expect("finish"), refused)
    }

    #[test]
    fn the_same_records_give_the_same_bytes_with_statistics_per_row_group() {
        let values: Vec<String> = (0..1000).map(|i| format!("{{\"n\":{i}}}")).collect();
        let values: Vec<&str> = values.iter().map(String::as_str).collect();
        let (a, _) = write(Layout::Raw, &values, 300);
        let (b, _) = write(Layout::Raw, &values, 300);
        assert_eq!(a, b, "deterministic bytes");
        let reader = SerializedFileReader::new(Bytes::from(a)).expect("reads");
        let meta = reader.metadata();
        assert_eq!(meta.file_metadata().num_rows(), 1000);
        assert_eq!(meta.num_row_groups(), 4);
        let first = meta.row_group(1).column(0);
        assert_eq!(first.column_path().string(), "offset");
        let stats = first.statistics().expect("offset statistics");
        assert_eq!(stats.min_bytes_opt(), Some(&300u64.to_le_bytes()[..]));
        assert_eq!(stats.max_bytes_opt(), Some(&599u64.to_le_bytes()[..]));
    }

    #[test]
    fn a_layout_with_two_columns_of_one_name_is_refused() {
        let columns: JsonColumns = serde_json::from_str(
            r#"{"columns":[{"name":"a","field":"a","type":"int64"},{"name":"a","field":"b","type":"string"}]}"#,
        )
        .expect("parses");
        let err = TableWriter::new(
            Vec::new(),
            Layout::Json(columns),
            &ParquetOptions::default(),
        )
        .err()
        .expect("refused");
        assert!(
            matches!(&err, TableError::DuplicateColumn(n) if n == "a"),
            "{err}"
        );
        // Inferred columns never collide, even with a fixed column's name.
        let inferred = JsonColumns::infer(vec![(
            0u64,
            &br#"{"offset":1,"value_offset":2,"_extra":3}"#[..],
        )])
        .expect("infers");
        let (bytes, refused) = write(
            Layout::Json(inferred),
            &[r#"{"offset":1,"value_offset":2,"_extra":3}"#],
            10,
        );
        assert!(refused.is_empty());
        let reader = SerializedFileReader::new(Bytes::from(bytes)).expect("reads");
        let names: Vec<String> = reader
            .metadata()
            .file_metadata()
            .schema_descr()
            .root_schema()
            .get_fields()
            .iter()
            .map(|f| f.name().to_owned())
            .collect();
        assert_eq!(
            names,
            [
                "offset",
                "timestamp",
                "key",
                "headers",
                "value__extra",
                "value_offset",
                "value_offset_2",
                "_extra"
            ]
        );
    }

    #[test]
    fn a_misfit_writes_nothing_of_its_row() {
        let columns = JsonColumns::parse_list("n:int64").expect("cols");
        let (bytes, refused) = write(
            Layout::Json(columns),
            &[r#"{"n":1}"#, r#"{"n":"x"}"#, r#"{"n":3,"m":1}"#],
            1000,
        );
        assert_eq!(refused.len(), 1);
        assert_eq!(refused[0].offset, 1);
        let reader = SerializedFileReader::new(Bytes::from(bytes)).expect("reads");
        assert_eq!(reader.metadata().file_metadata().num_rows(), 2);
    }
}
