//! `tribctl archive` for analysts, against a local bucket built by the tier
//! service's upload path: JSON values embedded as JSON, RFC 3339
//! timestamps, and exports to CSV and Parquet (raw and with typed columns),
//! read back with the parquet crate. Each bad input gets its documented
//! outcome and leaves no output file.

use std::fs::File;
use std::path::Path;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, Int64Type, TimestampMillisecondType, UInt64Type};
use arrow_array::{Array, RecordBatch};
use bytes::Bytes;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use serde_json::Value;
use tributary_proto::batch::Record;

mod support;
use support::{build_bucket, tribctl};

const TOPIC: &str = "/plant/power";
const BASE_MS: i64 = 1_166_289_840_000; // 2006-12-16T17:24:00Z

/// JSON objects, except offset 13 (a string where `p` is a number) and
/// offset 21 (not JSON).
fn record(offset: u64) -> Record {
    let value = match offset {
        13 => r#"{"p":"n/a","n":13,"site":"a"}"#.to_owned(),
        21 => "garbage".to_owned(),
        _ => format!(
            r#"{{"p":{}.5,"n":{offset},"site":"{}"}}"#,
            offset,
            if offset.is_multiple_of(2) { "a" } else { "b" }
        ),
    };
    Record {
        timestamp_ms: BASE_MS + offset as i64 * 60_000,
        key: offset
            .is_multiple_of(3)
            .then(|| Bytes::from(format!("k{offset}"))),
        headers: vec![("unit".into(), Bytes::from_static(b"kW"))],
        value: Bytes::from(value),
    }
}

fn binary_record(offset: u64) -> Record {
    Record {
        timestamp_ms: BASE_MS,
        key: None,
        headers: Vec::new(),
        value: Bytes::from(vec![0xff, offset as u8]),
    }
}

fn read_parquet(path: &Path) -> (Vec<RecordBatch>, Vec<String>) {
    let builder = ParquetRecordBatchReaderBuilder::try_new(File::open(path).unwrap()).unwrap();
    let names = builder
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    let batches = builder.build().unwrap().map(|b| b.unwrap()).collect();
    (batches, names)
}

fn column<'a>(batch: &'a RecordBatch, name: &str) -> &'a dyn Array {
    batch.column_by_name(name).unwrap().as_ref()
}

fn run_ok(bucket: &Path, args: &[&str]) -> String {
    let out = tribctl(bucket, args);
    assert!(out.status.success(), "{args:?}: {out:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn run_err(bucket: &Path, args: &[&str]) -> String {
    let out = tribctl(bucket, args);
    assert!(!out.status.success(), "{args:?} should fail: {out:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn cat_embeds_json_values_and_takes_rfc3339_starts() {
    let dir = tempfile::tempdir().unwrap();
    let bucket = dir.path().join("bucket");
    build_bucket(dir.path(), &bucket, TOPIC, 40, record);
    // 17:34Z is offset 10.
    let out = tribctl(
        &bucket,
        &[
            "cat",
            TOPIC,
            "--from-timestamp",
            "2006-12-16T18:34:00+01:00",
            "--max-records",
            "12",
        ],
    );
    assert!(out.status.success(), "{out:?}");
    let lines: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 12);
    assert_eq!(lines[0]["offset"], 10);
    assert_eq!(lines[0]["timestamp"], "2006-12-16T17:34:00.000Z");
    assert_eq!(lines[0]["timestamp_ms"], BASE_MS + 600_000);
    assert_eq!(lines[0]["value"]["p"], 10.5, "a JSON value is embedded");
    assert_eq!(lines[11]["value"], "garbage", "other text stays a string");

    let out = tribctl(
        &bucket,
        &[
            "cat",
            TOPIC,
            "--from-offset",
            "5",
            "--max-records",
            "1",
            "--value-as",
            "string",
        ],
    );
    let line: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(line["value"], r#"{"p":5.5,"n":5,"site":"b"}"#);
    let out = tribctl(
        &bucket,
        &[
            "cat",
            TOPIC,
            "--from-offset",
            "5",
            "--max-records",
            "1",
            "--value-as",
            "base64",
        ],
    );
    let line: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(line.get("value").is_none() && line["value_b64"].is_string());

    let err = run_err(
        &bucket,
        &["cat", TOPIC, "--from-offset", "20", "--value-as", "json"],
    );
    assert!(err.contains("offset 21: the value is not JSON"), "{err}");
    let err = run_err(&bucket, &["cat", TOPIC, "--from-timestamp", "yesterday"]);
    assert!(err.contains("RFC 3339"), "{err}");
}

#[test]
fn parquet_export_raw_and_typed_with_rejects_named_by_offset() {
    let dir = tempfile::tempdir().unwrap();
    let bucket = dir.path().join("bucket");
    build_bucket(dir.path(), &bucket, TOPIC, 40, record);
    let raw = dir.path().join("raw.parquet");
    run_ok(
        &bucket,
        &[
            "export",
            TOPIC,
            "--format",
            "parquet",
            "--out",
            raw.to_str().unwrap(),
        ],
    );
    let (batches, names) = read_parquet(&raw);
    assert_eq!(names, ["offset", "timestamp", "key", "headers", "value"]);
    let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
    assert_eq!(rows, 40);
    let b = &batches[0];
    let offsets = column(b, "offset").as_primitive::<UInt64Type>();
    assert_eq!(offsets.value(7), 7);
    let ts = column(b, "timestamp").as_primitive::<TimestampMillisecondType>();
    assert_eq!(ts.value(7), BASE_MS + 7 * 60_000);
    let keys = column(b, "key").as_binary::<i32>();
    assert!(keys.is_null(1) && keys.value(3) == b"k3");
    let values = column(b, "value").as_binary::<i32>();
    assert_eq!(values.value(21), b"garbage");
    assert_eq!(values.value(5), record(5).value.as_ref());

    // Typed columns: a misfit stops the export, naming its offset, and
    // leaves no file.
    let typed = dir.path().join("typed.parquet");
    let err = run_err(
        &bucket,
        &[
            "export",
            TOPIC,
            "--format",
            "parquet",
            "--json-columns",
            "p:double,n:int64",
            "--out",
            typed.to_str().unwrap(),
        ],
    );
    assert!(err.contains("offset 13: field `p`"), "{err}");
    assert!(!typed.exists() && !dir.path().join("typed.parquet.partial").exists());

    // With --rejected, misfits go there with their reason.
    let rejected = dir.path().join("rejected.parquet");
    let said = run_ok(
        &bucket,
        &[
            "export",
            TOPIC,
            "--format",
            "parquet",
            "--json-columns",
            "p:double,n:int64",
            "--rejected",
            rejected.to_str().unwrap(),
            "--out",
            typed.to_str().unwrap(),
        ],
    );
    assert!(said.contains("2 records did not fit"), "{said}");
    let (batches, names) = read_parquet(&typed);
    assert_eq!(
        names,
        ["offset", "timestamp", "key", "headers", "p", "n", "_extra"]
    );
    let b = arrow_select_concat(&batches);
    assert_eq!(b.len(), 38);
    let p: Vec<f64> = b.0.iter().map(|(_, p, _, _)| *p).collect();
    assert_eq!(p[0], 0.5);
    assert!(
        b.0.iter()
            .all(|(o, p, n, _)| *o != 13 && *o != 21 && *p == *o as f64 + 0.5 && *n == *o as i64)
    );
    assert_eq!(
        b.0[1].3.as_deref(),
        Some(r#"{"site":"b"}"#),
        "unnamed fields in _extra"
    );
    let (rb, names) = read_parquet(&rejected);
    assert_eq!(
        names,
        ["offset", "timestamp", "key", "headers", "value", "_reason"]
    );
    let rb = &rb[0];
    let offs = column(rb, "offset").as_primitive::<UInt64Type>();
    assert_eq!((offs.value(0), offs.value(1)), (13, 21));
    let reasons = column(rb, "_reason").as_string::<i32>();
    assert!(
        reasons.value(0).contains("field `p`"),
        "{}",
        reasons.value(0)
    );
    assert!(
        reasons.value(1).contains("not JSON"),
        "{}",
        reasons.value(1)
    );

    // Inference from the first values: p double, n int64, site string.
    let inferred = dir.path().join("inferred.parquet");
    let said = run_ok(
        &bucket,
        &[
            "export",
            TOPIC,
            "--format",
            "parquet",
            "--json-columns",
            "infer",
            "--infer-rows",
            "10",
            "--to-offset",
            "12",
            "--out",
            inferred.to_str().unwrap(),
        ],
    );
    assert!(said.contains("n:int64,p:double,site:string"), "{said}");
    let (batches, _) = read_parquet(&inferred);
    let n = column(&batches[0], "n").as_primitive::<Int64Type>();
    assert_eq!(n.len(), 13);
    assert_eq!(n.value(12), 12);

    // Inference over values that are not all JSON objects: with
    // --rejected, from the objects, the others rejected (offset 21).
    let inferred = dir.path().join("inferred-rejecting.parquet");
    let rejected = dir.path().join("inferred-rejected.parquet");
    let said = run_ok(
        &bucket,
        &[
            "export",
            TOPIC,
            "--format",
            "parquet",
            "--json-columns",
            "infer",
            "--from-offset",
            "14",
            "--out",
            inferred.to_str().unwrap(),
            "--rejected",
            rejected.to_str().unwrap(),
        ],
    );
    assert!(said.contains("n:int64,p:double,site:string"), "{said}");
    let (batches, _) = read_parquet(&inferred);
    let offsets: Vec<u64> = batches
        .iter()
        .flat_map(|b| {
            column(b, "offset")
                .as_primitive::<UInt64Type>()
                .values()
                .to_vec()
        })
        .collect();
    assert_eq!(offsets, (14..40).filter(|&o| o != 21).collect::<Vec<_>>());
    let (rb, _) = read_parquet(&rejected);
    let offs = column(&rb[0], "offset").as_primitive::<UInt64Type>();
    assert_eq!((rb[0].num_rows(), offs.value(0)), (1, 21));
}

/// (offset, p, n, _extra) of every typed row.
struct Typed(Vec<(u64, f64, i64, Option<String>)>);

impl Typed {
    fn len(&self) -> usize {
        self.0.len()
    }
}

fn arrow_select_concat(batches: &[RecordBatch]) -> Typed {
    let mut out = Vec::new();
    for b in batches {
        let o = column(b, "offset").as_primitive::<UInt64Type>();
        let p = column(b, "p").as_primitive::<Float64Type>();
        let n = column(b, "n").as_primitive::<Int64Type>();
        let e = column(b, "_extra").as_string::<i32>();
        for i in 0..b.num_rows() {
            out.push((
                o.value(i),
                p.value(i),
                n.value(i),
                (!e.is_null(i)).then(|| e.value(i).to_owned()),
            ));
        }
    }
    Typed(out)
}

#[test]
fn csv_export_and_bad_inputs_get_their_outcomes() {
    let dir = tempfile::tempdir().unwrap();
    let bucket = dir.path().join("bucket");
    build_bucket(dir.path(), &bucket, TOPIC, 40, record);
    let csv_path = dir.path().join("out.csv");
    run_ok(
        &bucket,
        &[
            "export",
            TOPIC,
            "--format",
            "csv",
            "--to-offset",
            "9",
            "--out",
            csv_path.to_str().unwrap(),
        ],
    );
    let mut reader = csv::Reader::from_path(&csv_path).unwrap();
    let header: Vec<String> = reader
        .headers()
        .unwrap()
        .iter()
        .map(str::to_owned)
        .collect();
    assert_eq!(
        header,
        [
            "offset",
            "timestamp",
            "timestamp_ms",
            "key",
            "key_b64",
            "headers",
            "value",
            "value_b64"
        ]
    );
    let rows: Vec<csv::StringRecord> = reader.records().map(|r| r.unwrap()).collect();
    assert_eq!(rows.len(), 10);
    assert_eq!(&rows[3][0], "3");
    assert_eq!(&rows[3][1], "2006-12-16T17:27:00.000Z");
    assert_eq!(&rows[3][3], "k3");
    assert_eq!(&rows[3][5], r#"[{"name":"unit","value":"kW"}]"#);
    assert_eq!(&rows[3][6], r#"{"p":3.5,"n":3,"site":"b"}"#);

    let out = dir.path().join("x.parquet");
    let out_s = out.to_str().unwrap();
    // Options that need Parquet or typed columns.
    let err = run_err(
        &bucket,
        &[
            "export",
            TOPIC,
            "--json-columns",
            "p:double",
            "--out",
            out_s,
        ],
    );
    assert!(err.contains("apply to --format parquet"), "{err}");
    let err = run_err(
        &bucket,
        &[
            "export",
            TOPIC,
            "--format",
            "parquet",
            "--rejected",
            "r.parquet",
            "--out",
            out_s,
        ],
    );
    assert!(err.contains("--rejected needs --json-columns"), "{err}");
    // A schema that does not parse.
    let err = run_err(
        &bucket,
        &[
            "export",
            TOPIC,
            "--format",
            "parquet",
            "--json-columns",
            "p:decimal",
            "--out",
            out_s,
        ],
    );
    assert!(err.contains("unknown column type `decimal`"), "{err}");
    let err = run_err(
        &bucket,
        &[
            "export",
            TOPIC,
            "--format",
            "parquet",
            "--json-columns",
            "offset:int64",
            "--out",
            out_s,
        ],
    );
    assert!(err.contains("reserved column name"), "{err}");
    assert!(!out.exists());

    // An empty range (a start after the last timestamp): a valid Parquet
    // file with no rows (raw), and a clear refusal when there is nothing to
    // infer from. (A --from-offset past the archive is refused: see
    // archive_export_safety.rs.)
    run_ok(
        &bucket,
        &[
            "export",
            TOPIC,
            "--format",
            "parquet",
            "--from-timestamp",
            "2030-01-01T00:00:00Z",
            "--out",
            out_s,
        ],
    );
    let (batches, names) = read_parquet(&out);
    assert_eq!(batches.iter().map(RecordBatch::num_rows).sum::<usize>(), 0);
    assert_eq!(names.len(), 5);
    let err = run_err(
        &bucket,
        &[
            "export",
            TOPIC,
            "--format",
            "parquet",
            "--from-timestamp",
            "2030-01-01T00:00:00Z",
            "--json-columns",
            "infer",
            "--out",
            dir.path().join("y.parquet").to_str().unwrap(),
        ],
    );
    assert!(err.contains("no value to infer from"), "{err}");

    // Binary values: raw Parquet keeps the bytes; typed columns refuse.
    let bin_bucket = dir.path().join("bin");
    build_bucket(
        &dir.path().join("w2"),
        &bin_bucket,
        "/plant/blobs",
        5,
        binary_record,
    );
    let bin = dir.path().join("bin.parquet");
    run_ok(
        &bin_bucket,
        &[
            "export",
            "/plant/blobs",
            "--format",
            "parquet",
            "--out",
            bin.to_str().unwrap(),
        ],
    );
    let (batches, _) = read_parquet(&bin);
    assert_eq!(
        column(&batches[0], "value").as_binary::<i32>().value(4),
        [0xff, 4]
    );
    let err = run_err(
        &bin_bucket,
        &[
            "export",
            "/plant/blobs",
            "--format",
            "parquet",
            "--json-columns",
            "infer",
            "--out",
            dir.path().join("z.parquet").to_str().unwrap(),
        ],
    );
    assert!(
        err.contains("value at offset 0 is not a JSON object"),
        "{err}"
    );
}

/// A record may repeat a header name (MQTT 5 user properties do); a
/// Parquet MAP may not (DuckDB refuses the file: "Map keys must be
/// unique"). The export keeps every header, the n-th use of a name as
/// `name#n` (avoiding names the record holds), and DuckDB reads it.
#[test]
fn repeated_header_names_are_made_unique_and_duckdb_reads_the_export() {
    let python = tributary_test_support::python::python_with(&["duckdb"]);
    let dir = tempfile::tempdir().unwrap();
    let bucket = dir.path().join("bucket");
    let headers = |pairs: &[(&str, &'static [u8])]| -> Vec<(String, Bytes)> {
        pairs
            .iter()
            .map(|(n, v)| ((*n).to_owned(), Bytes::from_static(v)))
            .collect()
    };
    support::build_bucket_with(
        dir.path(),
        &bucket,
        TOPIC,
        2,
        &|offset| Record {
            timestamp_ms: BASE_MS,
            key: None,
            headers: if offset == 0 {
                headers(&[
                    ("dup", b"1"),
                    ("dup", b"2"),
                    ("", b"e"),
                    ("content-type", b"text/x"),
                    ("content-type", b"spoof"),
                    ("dup#2", b"3"),
                ])
            } else {
                headers(&[("unit", b"kW")])
            },
            value: Bytes::from_static(b"{}"),
        },
        20,
        64 * 1024,
        None,
    );
    let out = dir.path().join("dup.parquet");
    run_ok(
        &bucket,
        &[
            "export",
            TOPIC,
            "--format",
            "parquet",
            "--out",
            out.to_str().unwrap(),
        ],
    );
    let query = format!(
        "import duckdb\nfor (keys, values) in duckdb.sql(\"select map_keys(headers), map_values(headers) from '{}' order by \\\"offset\\\"\").fetchall():\n    print(keys, [bytes(v).decode() for v in values])",
        out.display()
    );
    let result = std::process::Command::new(&python)
        .args(["-c", &query])
        .output()
        .unwrap();
    assert!(result.status.success(), "{result:?}");
    assert_eq!(
        String::from_utf8_lossy(&result.stdout),
        "['dup', 'dup#2#2', '', 'content-type', 'content-type#2', 'dup#2'] ['1', '2', 'e', 'text/x', 'spoof', '3']\n['unit'] ['kW']\n"
    );
}
