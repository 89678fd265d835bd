//! The NDJSON batch format of `POST /v1/topics/{ns}/{topic}/batch`.
//!
//! One JSON object per line:
//!
//! | field | type | meaning |
//! |---|---|---|
//! | `value` | string | the value as UTF-8 text |
//! | `value_b64` | string | the value as standard base64 (with padding) |
//! | `key` | string | optional key, UTF-8 text |
//! | `key_b64` | string | optional key, standard base64 |
//! | `headers` | object of string → string | optional headers, kept in the order written; names beginning with `mqtt.` are refused (the agent's own, [`crate::mqtt::conn::RESERVED_HEADER_PREFIX`]) |
//! | `timestamp_ms` | integer 0 to 253402300799999 | optional; ms since the Unix epoch (up to 9999-12-31T23:59:59.999Z), else the agent's clock |
//! | `producer_id` | string | optional, 1 to [`MAX_PRODUCER_ID_BYTES`] bytes of visible ASCII: who sends the batch ([`crate::sequence`]) |
//! | `sequence` | integer ≥ 0 | optional, with `producer_id`: the record's number in that producer's stream |
//!
//! Exactly one of `value` and `value_b64`; at most one of `key` and
//! `key_b64`; no other fields. `producer_id` and `sequence` come together
//! on every line of a body or on none; every line has the same
//! `producer_id` and the sequences are consecutive ([`Producer`]). They
//! are not part of the stored record. Lines holding only whitespace are skipped
//! (so a trailing newline is fine); line numbers count every line from 1.
//! The whole body is parsed before anything is stored, and the first bad
//! line is reported ([`LineError`]).

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use serde::de::{MapAccess, Visitor};
use serde::{Deserialize, Deserializer};
use tributary_proto::Record;

/// One NDJSON line as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    value: Option<String>,
    value_b64: Option<String>,
    key: Option<String>,
    key_b64: Option<String>,
    #[serde(default)]
    headers: OrderedHeaders,
    timestamp_ms: Option<i64>,
    producer_id: Option<String>,
    sequence: Option<u64>,
}

/// Longest `producer_id` accepted, bytes.
pub const MAX_PRODUCER_ID_BYTES: usize = 200;

/// The producer of a batch whose lines carry `producer_id` and `sequence`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Producer {
    /// The `producer_id` of every line.
    pub id: String,
    /// The `sequence` of the first line.
    pub first_sequence: u64,
    /// The `sequence` of the last line (`first_sequence` + records − 1).
    pub last_sequence: u64,
}

/// A JSON object of string → string, in document order, duplicates kept.
#[derive(Debug, Default)]
struct OrderedHeaders(Vec<(String, String)>);

impl<'de> Deserialize<'de> for OrderedHeaders {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct HeadersVisitor;

        impl<'de> Visitor<'de> for HeadersVisitor {
            type Value = OrderedHeaders;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object of string header values")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<OrderedHeaders, A::Error> {
                let mut out = Vec::new();
                while let Some((name, value)) = map.next_entry::<String, String>()? {
                    out.push((name, value));
                }
                Ok(OrderedHeaders(out))
            }
        }

        deserializer.deserialize_map(HeadersVisitor)
    }
}

/// A refused NDJSON line: its number (from 1), the field at fault (if one)
/// and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {}{reason}", field.as_deref().map(|f| format!("{f}: ")).unwrap_or_default())]
pub struct LineError {
    /// Line number, from 1.
    pub line: usize,
    /// The field at fault (`value`, `value_b64`, `headers.x`, ...), `None`
    /// when the line is not a JSON object at all.
    pub field: Option<String>,
    /// What is wrong.
    pub reason: String,
}

/// Why a batch body was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NdjsonError {
    /// A line is malformed.
    #[error(transparent)]
    Line(#[from] LineError),
    /// The body holds no record.
    #[error("body: no records (one JSON object per line expected)")]
    Empty,
}

/// A parsed batch: the records and the line number of each (for errors
/// that come later, such as a record over `max_record_bytes`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedBatch {
    /// The records, in body order.
    pub records: Vec<Record>,
    /// `lines[i]` is the line number of `records[i]`.
    pub lines: Vec<usize>,
    /// The producer and sequence range, when the lines carry them.
    pub producer: Option<Producer>,
}

/// Parses an NDJSON body. Records without `timestamp_ms` get `now_ms`.
///
/// # Errors
/// [`NdjsonError::Line`] for the first bad line (not UTF-8, not a JSON
/// object, unknown or mistyped field, missing or doubled value, bad
/// base64, negative timestamp, `producer_id` without `sequence` or the
/// reverse, on some lines only, changing, or not consecutive);
/// [`NdjsonError::Empty`] without any record.
pub fn parse(body: &[u8], now_ms: i64) -> Result<ParsedBatch, NdjsonError> {
    let mut records = Vec::new();
    let mut lines = Vec::new();
    let mut producer: Option<Producer> = None;
    for (index, raw) in body.split(|&b| b == b'\n').enumerate() {
        let line = index + 1;
        if raw.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let (record, sequenced) = parse_line(raw, line, now_ms)?;
        producer = next_producer(producer, sequenced, lines.first().copied(), line)?;
        records.push(record);
        lines.push(line);
    }
    if records.is_empty() {
        return Err(NdjsonError::Empty);
    }
    Ok(ParsedBatch {
        records,
        lines,
        producer,
    })
}

/// The producer after `line`, whose own `producer_id` and `sequence` are
/// `sequenced`; `first_line` is the first record's line (`None` when `line`
/// is the first).
fn next_producer(
    producer: Option<Producer>,
    sequenced: Option<(String, u64)>,
    first_line: Option<usize>,
    line: usize,
) -> Result<Option<Producer>, LineError> {
    let err = |field: &str, reason: String| LineError {
        line,
        field: Some(field.to_owned()),
        reason,
    };
    let Some(first_line) = first_line else {
        return Ok(sequenced.map(|(id, sequence)| Producer {
            id,
            first_sequence: sequence,
            last_sequence: sequence,
        }));
    };
    match (producer, sequenced) {
        (None, None) => Ok(None),
        (None, Some(_)) => Err(err(
            "producer_id",
            format!(
                "given here but not on line {first_line}: give `producer_id` and `sequence` on every line of a request or on none"
            ),
        )),
        (Some(_), None) => Err(err(
            "producer_id",
            format!(
                "missing (line {first_line} has one): give `producer_id` and `sequence` on every line of a request or on none"
            ),
        )),
        (Some(mut producer), Some((id, sequence))) => {
            if id != producer.id {
                return Err(err(
                    "producer_id",
                    format!(
                        "must be the same on every line of a request ({:?} on line {first_line}); got {id:?}",
                        producer.id
                    ),
                ));
            }
            let expected = producer.last_sequence.checked_add(1);
            if expected != Some(sequence) {
                let expected = expected.map_or(
                    "none (the previous line is at the largest sequence)".to_owned(),
                    |e| e.to_string(),
                );
                return Err(err(
                    "sequence",
                    format!(
                        "sequences of a request are consecutive: expected {expected}; got {sequence}"
                    ),
                ));
            }
            producer.last_sequence = sequence;
            Ok(Some(producer))
        }
    }
}

/// Checks a `producer_id`: 1 to [`MAX_PRODUCER_ID_BYTES`] bytes of
/// visible ASCII.
fn check_producer_id(id: &str) -> Result<(), String> {
    if id.is_empty() || id.len() > MAX_PRODUCER_ID_BYTES {
        return Err(format!(
            "1 to {MAX_PRODUCER_ID_BYTES} bytes; got {}",
            id.len()
        ));
    }
    if !id.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("visible ASCII only (no spaces or control characters)".into());
    }
    Ok(())
}

/// One line's record and its `producer_id` and `sequence`, if given.
type ParsedLine = (Record, Option<(String, u64)>);

fn parse_line(raw: &[u8], line: usize, now_ms: i64) -> Result<ParsedLine, LineError> {
    let err = |field: Option<&str>, reason: String| LineError {
        line,
        field: field.map(str::to_owned),
        reason,
    };
    let text = std::str::from_utf8(raw).map_err(|e| err(None, format!("not UTF-8: {e}")))?;
    if !text.trim_start().starts_with('{') {
        return Err(err(
            None,
            "not a JSON object (one object per line expected)".into(),
        ));
    }
    let mut de = serde_json::Deserializer::from_str(text);
    let parsed: Line = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        // `.` is the whole line, `?` a position serde could not name.
        let field = (path != "." && path != "?").then_some(path);
        let inner = e.into_inner();
        // serde_json appends "at line 1 column N": within this one line.
        let reason = match (inner.line(), inner.column()) {
            (0, _) => inner.to_string(),
            (_, column) => {
                let message = inner.to_string();
                let message = message
                    .rsplit_once(" at line ")
                    .map_or(message.as_str(), |(m, _)| m)
                    .to_owned();
                format!("{message} (column {column})")
            }
        };
        LineError {
            line,
            field,
            reason,
        }
    })?;
    de.end()
        .map_err(|e| err(None, format!("trailing characters after the object: {e}")))?;
    let value = match (parsed.value, parsed.value_b64) {
        (Some(text), None) => Bytes::from(text.into_bytes()),
        (None, Some(b64)) => decode_b64(&b64).map_err(|r| err(Some("value_b64"), r))?,
        (None, None) => {
            return Err(err(
                Some("value"),
                "missing: give `value` (UTF-8 text) or `value_b64` (base64)".into(),
            ));
        }
        (Some(_), Some(_)) => {
            return Err(err(
                Some("value"),
                "give either `value` or `value_b64`, not both".into(),
            ));
        }
    };
    let key = match (parsed.key, parsed.key_b64) {
        (Some(text), None) => Some(Bytes::from(text.into_bytes())),
        (None, Some(b64)) => Some(decode_b64(&b64).map_err(|r| err(Some("key_b64"), r))?),
        (None, None) => None,
        (Some(_), Some(_)) => {
            return Err(err(
                Some("key"),
                "give either `key` or `key_b64`, not both".into(),
            ));
        }
    };
    let timestamp_ms = match parsed.timestamp_ms {
        Some(ts) => tributary_proto::limits::check_timestamp_ms(ts)
            .map_err(|why| err(Some("timestamp_ms"), why))?,
        None => now_ms,
    };
    let sequenced = match (parsed.producer_id, parsed.sequence) {
        (Some(id), Some(sequence)) => {
            check_producer_id(&id).map_err(|r| err(Some("producer_id"), r))?;
            Some((id, sequence))
        }
        (None, None) => None,
        (Some(_), None) => {
            return Err(err(
                Some("sequence"),
                "missing: give `producer_id` and `sequence` together, or neither".into(),
            ));
        }
        (None, Some(_)) => {
            return Err(err(
                Some("producer_id"),
                "missing: give `producer_id` and `sequence` together, or neither".into(),
            ));
        }
    };
    if let Some((name, _)) = parsed
        .headers
        .0
        .iter()
        .find(|(name, _)| crate::mqtt::conn::is_reserved_header(name))
    {
        return Err(err(
            Some(&format!("headers.{name}")),
            format!(
                "header names beginning with {:?} are the agent's own",
                crate::mqtt::conn::RESERVED_HEADER_PREFIX
            ),
        ));
    }
    let headers = parsed
        .headers
        .0
        .into_iter()
        .map(|(name, value)| (name, Bytes::from(value.into_bytes())))
        .collect();
    let record = Record {
        timestamp_ms,
        key,
        headers,
        value,
    };
    Ok((record, sequenced))
}

fn decode_b64(text: &str) -> Result<Bytes, String> {
    STANDARD
        .decode(text)
        .map(Bytes::from)
        .map_err(|e| format!("not valid standard base64: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line_err(body: &str) -> LineError {
        match parse(body.as_bytes(), 7) {
            Err(NdjsonError::Line(e)) => e,
            other => panic!("expected a line error, got {other:?}"),
        }
    }

    #[test]
    fn parses_every_field() {
        let body = concat!(
            "{\"value\":\"hello\"}\n",
            "\n",
            "{\"value_b64\":\"AAEC/w==\",\"key\":\"k1\",\"headers\":{\"z\":\"1\",\"a\":\"2\",\"z\":\"3\"},\"timestamp_ms\":42}\n",
            "  {\"value\":\"\",\"key_b64\":\"/w==\"}  \n",
        );
        let parsed = parse(body.as_bytes(), 1000).unwrap();
        assert_eq!(parsed.lines, [1, 3, 4]);
        assert_eq!(parsed.producer, None);
        assert_eq!(
            parsed.records,
            [
                Record {
                    timestamp_ms: 1000,
                    key: None,
                    headers: vec![],
                    value: Bytes::from_static(b"hello"),
                },
                Record {
                    timestamp_ms: 42,
                    key: Some(Bytes::from_static(b"k1")),
                    headers: vec![
                        ("z".into(), Bytes::from_static(b"1")),
                        ("a".into(), Bytes::from_static(b"2")),
                        ("z".into(), Bytes::from_static(b"3")),
                    ],
                    value: Bytes::from_static(&[0, 1, 2, 255]),
                },
                Record {
                    timestamp_ms: 1000,
                    key: Some(Bytes::from_static(&[255])),
                    headers: vec![],
                    value: Bytes::new(),
                },
            ]
        );
    }

    #[test]
    fn empty_bodies_are_refused() {
        assert_eq!(parse(b"", 0), Err(NdjsonError::Empty));
        assert_eq!(parse(b"\n \n\t\n", 0), Err(NdjsonError::Empty));
        assert_eq!(
            NdjsonError::Empty.to_string(),
            "body: no records (one JSON object per line expected)"
        );
    }

    #[test]
    fn bad_json_names_the_line() {
        let e = line_err("{\"value\":\"a\"}\n{\"value\": \"b\"\n");
        assert_eq!(e.line, 2);
        assert_eq!(e.field, None);
        assert_eq!(
            e.to_string(),
            "line 2: EOF while parsing an object (column 13)"
        );
        let e = line_err("[1,2]");
        assert_eq!(
            e.to_string(),
            "line 1: not a JSON object (one object per line expected)"
        );
        let e = line_err("{\"value\":\"a\"} x");
        assert_eq!(e.line, 1);
        assert!(e.reason.starts_with("trailing characters"), "{e}");
    }

    #[test]
    fn missing_and_doubled_values() {
        let e = line_err("{\"value\":\"a\"}\n{\"key\":\"k\"}");
        assert_eq!(
            e.to_string(),
            "line 2: value: missing: give `value` (UTF-8 text) or `value_b64` (base64)"
        );
        let e = line_err("{\"value\":\"a\",\"value_b64\":\"YQ==\"}");
        assert_eq!(
            e.to_string(),
            "line 1: value: give either `value` or `value_b64`, not both"
        );
        let e = line_err("{\"value\":\"a\",\"key\":\"a\",\"key_b64\":\"YQ==\"}");
        assert_eq!(e.field.as_deref(), Some("key"));
    }

    #[test]
    fn bad_base64_names_the_field() {
        let e = line_err("{\"value_b64\":\"not base64!\"}");
        assert_eq!(e.line, 1);
        assert_eq!(e.field.as_deref(), Some("value_b64"));
        assert!(e.reason.starts_with("not valid standard base64"), "{e}");
        let e = line_err("{\"value\":\"v\",\"key_b64\":\"@@\"}");
        assert_eq!(e.field.as_deref(), Some("key_b64"));
    }

    #[test]
    fn mistyped_and_unknown_fields_are_named() {
        let e = line_err("{\"value\":5}");
        assert_eq!(e.field.as_deref(), Some("value"));
        assert_eq!(
            e.to_string(),
            "line 1: value: invalid type: integer `5`, expected a string (column 10)"
        );
        let e = line_err("{\"value\":\"a\",\"headers\":{\"h\":1}}");
        assert_eq!(e.field.as_deref(), Some("headers.h"));
        let e = line_err("{\"value\":\"a\",\"vlaue\":\"b\"}");
        assert!(e.reason.starts_with("unknown field `vlaue`"), "{e}");
        let e = line_err("{\"value\":\"a\",\"timestamp_ms\":-1}");
        assert_eq!(
            e.to_string(),
            "line 1: timestamp_ms: must be ms since the Unix epoch, from 0 (1970-01-01) to 253402300799999 (9999-12-31T23:59:59.999Z); got -1"
        );
        let e = line_err("{\"value\":\"a\",\"timestamp_ms\":253402300800000}");
        assert_eq!(e.field.as_deref(), Some("timestamp_ms"));
        assert!(e.to_string().ends_with("got 253402300800000"), "{e}");
        let e = line_err("{\"value\":\"a\",\"timestamp_ms\":1.5}");
        assert_eq!(e.field.as_deref(), Some("timestamp_ms"));
    }

    #[test]
    fn non_utf8_lines_are_refused() {
        let e = match parse(b"{\"value\":\"a\"}\n\xff\xfe\n", 0) {
            Err(NdjsonError::Line(e)) => e,
            other => panic!("{other:?}"),
        };
        assert_eq!(e.line, 2);
        assert!(e.reason.starts_with("not UTF-8"), "{e}");
    }

    #[test]
    fn producer_and_sequences_are_read_but_not_stored() {
        let body = concat!(
            "{\"value\":\"a\",\"producer_id\":\"p-1\",\"sequence\":7}\n",
            "\n",
            "{\"sequence\":8,\"value\":\"b\",\"producer_id\":\"p-1\"}\n",
        );
        let parsed = parse(body.as_bytes(), 5).unwrap();
        assert_eq!(
            parsed.producer,
            Some(Producer {
                id: "p-1".into(),
                first_sequence: 7,
                last_sequence: 8,
            })
        );
        let plain = parse(b"{\"value\":\"a\"}\n{\"value\":\"b\"}\n", 5).unwrap();
        assert_eq!(
            parsed.records, plain.records,
            "the record is the same without them"
        );
    }

    #[test]
    fn producer_fields_come_together_on_every_line() {
        let e = line_err("{\"value\":\"a\",\"producer_id\":\"p\"}");
        assert_eq!(
            e.to_string(),
            "line 1: sequence: missing: give `producer_id` and `sequence` together, or neither"
        );
        let e = line_err("{\"value\":\"a\",\"sequence\":0}");
        assert_eq!(e.field.as_deref(), Some("producer_id"));
        let e =
            line_err("{\"value\":\"a\",\"producer_id\":\"p\",\"sequence\":0}\n{\"value\":\"b\"}");
        assert_eq!((e.line, e.field.as_deref()), (2, Some("producer_id")));
        assert!(e.reason.starts_with("missing (line 1 has one)"), "{e}");
        let e =
            line_err("{\"value\":\"a\"}\n\n{\"value\":\"b\",\"producer_id\":\"p\",\"sequence\":0}");
        assert_eq!(
            e.to_string(),
            "line 3: producer_id: given here but not on line 1: give `producer_id` and `sequence` on every line of a request or on none"
        );
    }

    #[test]
    fn one_producer_and_consecutive_sequences_per_request() {
        let e = line_err(concat!(
            "{\"value\":\"a\",\"producer_id\":\"p\",\"sequence\":0}\n",
            "{\"value\":\"b\",\"producer_id\":\"q\",\"sequence\":1}\n",
        ));
        assert_eq!(
            e.to_string(),
            "line 2: producer_id: must be the same on every line of a request (\"p\" on line 1); got \"q\""
        );
        let e = line_err(concat!(
            "{\"value\":\"a\",\"producer_id\":\"p\",\"sequence\":0}\n",
            "{\"value\":\"b\",\"producer_id\":\"p\",\"sequence\":2}\n",
        ));
        assert_eq!(
            e.to_string(),
            "line 2: sequence: sequences of a request are consecutive: expected 1; got 2"
        );
        let e = line_err(concat!(
            "{\"value\":\"a\",\"producer_id\":\"p\",\"sequence\":18446744073709551615}\n",
            "{\"value\":\"b\",\"producer_id\":\"p\",\"sequence\":0}\n",
        ));
        assert_eq!((e.line, e.field.as_deref()), (2, Some("sequence")));
    }

    #[test]
    fn bad_producer_ids_and_sequences_are_named() {
        let e = line_err("{\"value\":\"a\",\"producer_id\":\"\",\"sequence\":0}");
        assert_eq!(e.to_string(), "line 1: producer_id: 1 to 200 bytes; got 0");
        let long = "x".repeat(MAX_PRODUCER_ID_BYTES + 1);
        let e = line_err(&format!(
            "{{\"value\":\"a\",\"producer_id\":\"{long}\",\"sequence\":0}}"
        ));
        assert_eq!(
            e.to_string(),
            "line 1: producer_id: 1 to 200 bytes; got 201"
        );
        let ok = "x".repeat(MAX_PRODUCER_ID_BYTES);
        assert!(
            parse(
                format!("{{\"value\":\"a\",\"producer_id\":\"{ok}\",\"sequence\":0}}").as_bytes(),
                0
            )
            .is_ok()
        );
        let e = line_err("{\"value\":\"a\",\"producer_id\":\"a b\",\"sequence\":0}");
        assert_eq!(e.field.as_deref(), Some("producer_id"));
        let e = line_err("{\"value\":\"a\",\"producer_id\":5,\"sequence\":0}");
        assert_eq!(e.field.as_deref(), Some("producer_id"));
        for bad in ["\"1\"", "-1", "1.5", "null"] {
            let e = line_err(&format!(
                "{{\"value\":\"a\",\"producer_id\":\"p\",\"sequence\":{bad}}}"
            ));
            assert_eq!(e.field.as_deref(), Some("sequence"), "{bad}: {e}");
        }
    }
}
