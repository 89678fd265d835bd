//! Record lines (`cat`, `export --format jsonl`): one JSON object per
//! record, and how its value is written ([`ValueAs`]).
//!
//! `{"topic", "offset", "timestamp_ms", "timestamp", "key", "headers":
//! [{"name", "value"}], "value"}`: `timestamp` is RFC 3339 in UTC with
//! milliseconds beside the epoch ms. A key or header value that is not
//! valid UTF-8 is written as `key_b64` / `value_b64` (standard base64)
//! instead; a missing key is `"key": null`. The value as [`ValueAs`] says.

use std::io::Write;
use std::ops::ControlFlow;

use base64::Engine as _;
use clap::ValueEnum;
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};
use tributary_archive::reader::ArchivedRecord;
use tributary_proto::batch::Record;
use tributary_proto::keys::TopicName;

/// How a record's value is written in a line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum ValueAs {
    /// A value that is JSON is embedded as JSON (`"value": {"p": 4.2}`);
    /// otherwise valid UTF-8 is a string, anything else `value_b64`.
    #[default]
    Auto,
    /// Every value must be JSON and is embedded as JSON; one that is not
    /// stops the output with an error naming its offset.
    Json,
    /// Valid UTF-8 as a string (JSON text stays a string), else `value_b64`.
    String,
    /// Always `value_b64`.
    Base64,
}

fn b64(bytes: &[u8]) -> Value {
    Value::String(base64::engine::general_purpose::STANDARD.encode(bytes))
}

/// `bytes` under `name` when UTF-8, else base64 under `{name}_b64`.
fn bytes_field(map: &mut Map<String, Value>, name: &str, bytes: &[u8]) {
    match std::str::from_utf8(bytes) {
        Ok(text) => {
            map.insert(name.to_owned(), Value::String(text.to_owned()));
        }
        Err(_) => {
            map.insert(format!("{name}_b64"), b64(bytes));
        }
    }
}

/// One record's line: its fields, and a JSON value embedded as its text.
#[derive(Debug, serde::Serialize)]
pub struct RecordLine {
    #[serde(flatten)]
    fields: Map<String, Value>,
    /// A value that is JSON, as written less the whitespace between its
    /// tokens: parsed into a `Value`, an integer beyond 64 bits became a
    /// rounded double and a repeated name lost all but its last.
    #[serde(skip_serializing_if = "Option::is_none")]
    value: Option<Box<RawValue>>,
}

/// JSON text without the whitespace between its tokens (a line holds one
/// record), every token as written.
fn compact(text: &str) -> std::borrow::Cow<'_, str> {
    if !text
        .bytes()
        .any(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
    {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    let (mut in_string, mut escaped) = (false, false);
    for c in text.chars() {
        if in_string {
            out.push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
        } else if c == '"' {
            in_string = true;
            out.push(c);
        } else if !matches!(c, ' ' | '\t' | '\n' | '\r') {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// `bytes` as embedded JSON, if they are JSON.
fn json_value(bytes: &[u8]) -> Result<Box<RawValue>, serde_json::Error> {
    let raw: &RawValue = serde_json::from_slice(bytes)?;
    RawValue::from_string(compact(raw.get()).into_owned())
}

/// One record as a JSON line (see the module doc).
///
/// # Errors
/// With [`ValueAs::Json`], a message naming the offset of a value that is
/// not JSON.
pub fn record_json(
    topic: &TopicName,
    offset: u64,
    record: &Record,
    value_as: ValueAs,
) -> Result<RecordLine, String> {
    let mut map = Map::new();
    map.insert("topic".into(), json!(topic));
    map.insert("offset".into(), json!(offset));
    map.insert("timestamp_ms".into(), json!(record.timestamp_ms));
    map.insert(
        "timestamp".into(),
        json!(tributary_lakehouse::time::rfc3339_ms(record.timestamp_ms)),
    );
    match &record.key {
        Some(key) => bytes_field(&mut map, "key", key),
        None => {
            map.insert("key".into(), Value::Null);
        }
    }
    let headers: Vec<Value> = record
        .headers
        .iter()
        .map(|(name, value)| {
            let mut h = Map::new();
            h.insert("name".into(), json!(name));
            bytes_field(&mut h, "value", value);
            Value::Object(h)
        })
        .collect();
    map.insert("headers".into(), Value::Array(headers));
    let mut value = None;
    match value_as {
        ValueAs::Auto => match json_value(&record.value) {
            Ok(v) => value = Some(v),
            Err(_) => bytes_field(&mut map, "value", &record.value),
        },
        ValueAs::Json => {
            let v = json_value(&record.value).map_err(|e| {
                format!(
                    "offset {offset}: the value is {}; use --value-as auto, string or base64",
                    tributary_lakehouse::schema::json_error(&e)
                )
            })?;
            value = Some(v);
        }
        ValueAs::String => bytes_field(&mut map, "value", &record.value),
        ValueAs::Base64 => {
            map.insert("value_b64".into(), b64(&record.value));
        }
    }
    Ok(RecordLine { fields: map, value })
}

/// Where a range ends: an inclusive last offset and a record count.
#[derive(Debug, Clone, Copy, Default)]
pub struct Limits {
    /// Last offset, inclusive.
    pub to_offset: Option<u64>,
    /// Records at most.
    pub max_records: Option<u64>,
}

impl Limits {
    /// Whether a record at `offset` is past the range, `written` taken.
    pub fn past(&self, offset: u64, written: u64) -> bool {
        self.to_offset.is_some_and(|to| offset > to)
            || self.max_records.is_some_and(|max| written >= max)
    }

    /// Whether the range is complete once the record at `offset` is taken
    /// as the `written`-th: nothing after it may be read (a damaged batch
    /// past the range must not fail the output).
    pub fn complete(&self, offset: u64, written: u64) -> bool {
        self.to_offset.is_some_and(|to| offset >= to)
            || self.max_records.is_some_and(|max| written >= max)
    }
}

/// Writes one record to an output: a line, a CSV row, a Parquet row.
pub trait RecordWriter {
    /// Writes `r`.
    ///
    /// # Errors
    /// What stops the output.
    fn write(&mut self, r: ArchivedRecord) -> anyhow::Result<()>;
}

/// Feeds records to a [`RecordWriter`] within a range's limits; remembers
/// the first error.
pub struct Limited<W> {
    writer: W,
    limits: Limits,
    written: u64,
    error: Option<anyhow::Error>,
}

impl<W: RecordWriter> Limited<W> {
    /// Records of `limits` into `writer`.
    pub fn new(writer: W, limits: Limits) -> Limited<W> {
        Limited {
            writer,
            limits,
            written: 0,
            error: None,
        }
    }

    /// Takes one record; `Break` past the range or on an error.
    pub fn take(&mut self, r: ArchivedRecord) -> ControlFlow<()> {
        if self.limits.past(r.offset, self.written) {
            return ControlFlow::Break(());
        }
        let offset = r.offset;
        match self.writer.write(r) {
            Ok(()) => {
                self.written += 1;
                if self.limits.complete(offset, self.written) {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            }
            Err(e) => {
                self.error = Some(e);
                ControlFlow::Break(())
            }
        }
    }

    /// The writer and the records it took.
    ///
    /// # Errors
    /// The first error, which stopped the output.
    pub fn finish(self) -> anyhow::Result<(W, u64)> {
        match self.error {
            Some(e) => Err(e),
            None => Ok((self.writer, self.written)),
        }
    }
}

/// Record lines (see the module doc) into `out`.
pub struct LineWriter<'a> {
    /// The records' topic.
    pub topic: &'a TopicName,
    /// How values are written.
    pub value_as: ValueAs,
    /// The output.
    pub out: &'a mut dyn Write,
}

impl RecordWriter for LineWriter<'_> {
    fn write(&mut self, r: ArchivedRecord) -> anyhow::Result<()> {
        let line = record_json(self.topic, r.offset, &r.record, self.value_as)
            .map_err(anyhow::Error::msg)?;
        serde_json::to_writer(&mut *self.out, &line)?;
        self.out.write_all(b"\n")?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(value: &str, value_as: ValueAs) -> String {
        let topic = TopicName::new("/plant1/lake").expect("topic");
        let record = Record {
            timestamp_ms: 0,
            key: None,
            headers: Vec::new(),
            value: bytes::Bytes::copy_from_slice(value.as_bytes()),
        };
        let line = record_json(&topic, 5, &record, value_as).expect("line");
        serde_json::to_string(&line).expect("serializes")
    }

    /// A JSON value is embedded as written, less the whitespace between
    /// tokens (one record per line): integers beyond 64 bits keep their
    /// digits (they were rounded doubles) and strings keep their spaces.
    #[test]
    fn a_json_value_is_embedded_as_written_on_one_line() {
        let written = "{\n  \"a\": -9223372036854775809,\n  \"s\": \"two  spaces \\\" and a quote\",\n  \"n\": [18446744073709551616, 1.5e3]\n}\n";
        for value_as in [ValueAs::Auto, ValueAs::Json] {
            let out = line(written, value_as);
            assert_eq!(
                out,
                r#"{"headers":[],"key":null,"offset":5,"timestamp":"1970-01-01T00:00:00.000Z","timestamp_ms":0,"topic":"/plant1/lake","value":{"a":-9223372036854775809,"s":"two  spaces \" and a quote","n":[18446744073709551616,1.5e3]}}"#
            );
        }
        // Not JSON: a string, as before.
        assert!(line("not json", ValueAs::Auto).ends_with(r#""value":"not json"}"#));
    }
}
