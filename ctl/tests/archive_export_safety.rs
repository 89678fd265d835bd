//! `tribctl archive export` with outputs a fresh user gets wrong, against
//! a local bucket built by the tier service's upload path. Each bad input
//! is refused before anything is written, names what is wrong, and leaves
//! the bucket byte for byte as it was and no output (nor `.partial`)
//! behind:
//! - an `--out` or `--rejected` inside the bucket directory (also through
//!   `..` or a symlink);
//! - an existing output without `--force` (with it, replaced);
//! - `--out` and `--rejected` naming the same file;
//! - a `--from-offset` past the archived records.
//!
//! And what a good export says: the rows of `--out` and of `--rejected`
//! counted apart, exactly; inferred columns with distinct names that
//! pyarrow reads (needs `TRIB_TEST_PYTHON`, a python with pyarrow;
//! `./scripts/test` installs one).

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::path::{Path, PathBuf};

use arrow_array::RecordBatch;
use arrow_array::cast::AsArray;
use arrow_array::types::{Int64Type, UInt64Type};
use bytes::Bytes;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use tributary_proto::batch::Record;

mod support;
use support::{build_bucket, tribctl};

const TOPIC: &str = "/plant/power";
const BASE_MS: i64 = 1_166_289_840_000; // 2006-12-16T17:24:00Z

/// JSON objects, except offset 13 (a string where `p` is a number) and
/// offset 21 (not JSON).
fn record(offset: u64) -> Record {
    let value = match offset {
        13 => r#"{"p":"n/a","n":13}"#.to_owned(),
        21 => "garbage".to_owned(),
        _ => format!(r#"{{"p":{offset}.5,"n":{offset}}}"#),
    };
    Record {
        timestamp_ms: BASE_MS + offset as i64 * 60_000,
        key: None,
        headers: Vec::new(),
        value: Bytes::from(value),
    }
}

/// Values whose field `offset` is inferred as `value_offset`, beside a
/// field `value_offset`.
fn colliding_record(offset: u64) -> Record {
    Record {
        timestamp_ms: BASE_MS + offset as i64,
        key: Some(Bytes::from(format!("k{offset}"))),
        headers: Vec::new(),
        value: Bytes::from(format!(
            r#"{{"offset":{offset},"value_offset":{},"key":"d{}","ts":{offset}}}"#,
            -(offset as i64),
            offset % 4
        )),
    }
}

/// Every file under `dir` with its bytes.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                todo.push(path);
            } else {
                out.insert(path.clone(), std::fs::read(&path).unwrap());
            }
        }
    }
    out
}

/// The file names in `dir`.
fn names_in(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Runs an export that must fail; returns its stderr.
fn refused(bucket: &Path, args: &[&str]) -> String {
    let out = tribctl(bucket, args);
    assert_eq!(out.status.code(), Some(1), "{args:?} should fail: {out:?}");
    stderr(&out)
}

/// The batches and column names of a Parquet file; the names must be
/// distinct.
fn read_parquet(path: &Path) -> (Vec<RecordBatch>, Vec<String>) {
    let builder = ParquetRecordBatchReaderBuilder::try_new(File::open(path).unwrap()).unwrap();
    let names: Vec<String> = builder
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    let distinct: BTreeSet<&String> = names.iter().collect();
    assert_eq!(distinct.len(), names.len(), "duplicate columns: {names:?}");
    let batches = builder.build().unwrap().map(|b| b.unwrap()).collect();
    (batches, names)
}

fn rows(batches: &[RecordBatch]) -> usize {
    batches.iter().map(RecordBatch::num_rows).sum()
}

#[test]
fn an_output_inside_the_bucket_is_refused_and_the_archive_stays_intact() {
    let dir = tempfile::tempdir().unwrap();
    let bucket = dir.path().join("bucket");
    let objects = build_bucket(dir.path(), &bucket, TOPIC, 40, record);
    let before = snapshot(&bucket);
    let root = bucket.canonicalize().unwrap();
    let object = bucket.join(&objects[0].0);
    assert!(object.is_file());
    std::os::unix::fs::symlink(bucket.join("tributary"), dir.path().join("link")).unwrap();
    std::fs::create_dir(dir.path().join("other")).unwrap();
    let outside = dir.path().join("out.parquet");

    let cases: Vec<(&str, PathBuf)> = vec![
        ("--out", object.clone()),
        ("--out", bucket.join("new.jsonl")),
        ("--out", bucket.clone()),
        ("--out", dir.path().join("other/../bucket/x.jsonl")),
        ("--out", dir.path().join("link/x.jsonl")),
        ("--rejected", object.clone()),
    ];
    for (flag, path) in &cases {
        let p = path.to_str().unwrap();
        let mut args = vec!["export", TOPIC];
        if *flag == "--out" {
            args.extend(["--force", "--out", p]);
        } else {
            args.extend([
                "--format",
                "parquet",
                "--json-columns",
                "p:double",
                "--rejected",
                p,
                "--out",
                outside.to_str().unwrap(),
            ]);
        }
        let err = refused(&bucket, &args);
        assert_eq!(
            err,
            format!(
                "error: {flag} {p} is inside the bucket directory {r}: an export never writes into the archive it reads (choose a path outside {r})\n",
                r = root.display()
            ),
            "{args:?}"
        );
    }
    assert_eq!(snapshot(&bucket), before, "the bucket is unchanged");
    assert_eq!(
        names_in(dir.path()),
        ["bucket", "link", "other", "wal"].map(String::from).into()
    );
    let out = tribctl(&bucket, &["verify"]);
    assert!(out.status.success(), "{out:?}");
}

#[test]
fn an_existing_output_is_kept_unless_force_is_given() {
    let dir = tempfile::tempdir().unwrap();
    let bucket = dir.path().join("bucket");
    build_bucket(dir.path(), &bucket, TOPIC, 40, record);
    let out = dir.path().join("out.jsonl");
    let out_s = out.to_str().unwrap();
    std::fs::write(&out, "keep me\n").unwrap();

    let err = refused(&bucket, &["export", TOPIC, "--out", out_s]);
    assert_eq!(
        err,
        format!("error: --out {out_s} exists: give --force to replace it\n")
    );
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "keep me\n");

    let said = tribctl(&bucket, &["export", TOPIC, "--force", "--out", out_s]);
    assert!(said.status.success(), "{said:?}");
    assert_eq!(
        stderr(&said),
        format!("exported 40 records of {TOPIC} to {out_s}\n")
    );
    assert_eq!(std::fs::read_to_string(&out).unwrap().lines().count(), 40);

    // --rejected as well; the main output is not created either.
    let typed = dir.path().join("typed.parquet");
    let rejected = dir.path().join("rejected.parquet");
    std::fs::write(&rejected, "old").unwrap();
    let args = [
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
    ];
    let err = refused(&bucket, &args);
    assert_eq!(
        err,
        format!(
            "error: --rejected {} exists: give --force to replace it\n",
            rejected.display()
        )
    );
    assert_eq!(std::fs::read(&rejected).unwrap(), b"old");
    assert!(!typed.exists());
    let mut forced = args.to_vec();
    forced.push("--force");
    let said = tribctl(&bucket, &forced);
    assert!(said.status.success(), "{said:?}");
    assert_eq!(rows(&read_parquet(&rejected).0), 2);
    assert_eq!(rows(&read_parquet(&typed).0), 38);

    // A directory is never an output, --force or not.
    let err = refused(
        &bucket,
        &[
            "export",
            TOPIC,
            "--force",
            "--out",
            dir.path().to_str().unwrap(),
        ],
    );
    assert!(err.contains("is a directory: give a file path"), "{err}");

    // A stale `.partial` (an interrupted export) is not truncated; with
    // --force it is replaced and gone after the export.
    let fresh = dir.path().join("fresh.jsonl");
    let partial = dir.path().join("fresh.jsonl.partial");
    std::fs::write(&partial, "stale").unwrap();
    let err = refused(
        &bucket,
        &["export", TOPIC, "--out", fresh.to_str().unwrap()],
    );
    assert!(
        err.contains(&format!("create {}", partial.display()))
            && err.contains("remove it or give --force"),
        "{err}"
    );
    assert_eq!(std::fs::read(&partial).unwrap(), b"stale");
    assert!(!fresh.exists());
    let said = tribctl(
        &bucket,
        &["export", TOPIC, "--force", "--out", fresh.to_str().unwrap()],
    );
    assert!(said.status.success(), "{said:?}");
    assert!(!partial.exists());
    assert_eq!(std::fs::read_to_string(&fresh).unwrap().lines().count(), 40);
}

#[test]
fn the_same_file_for_out_and_rejected_is_refused_and_no_partial_output_is_left() {
    let dir = tempfile::tempdir().unwrap();
    let bucket = dir.path().join("bucket");
    build_bucket(dir.path(), &bucket, TOPIC, 40, record);
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    let same = dir.path().join("same.parquet");
    let before = names_in(dir.path());
    for rejected in [same.clone(), dir.path().join("sub/../same.parquet")] {
        let err = refused(
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
                same.to_str().unwrap(),
            ],
        );
        assert_eq!(
            err,
            format!(
                "error: --out {} and --rejected {} are the same file: give two different files\n",
                same.display(),
                rejected.display()
            )
        );
        assert_eq!(names_in(dir.path()), before, "nothing written");
    }

    // A failure after the main output was started (the rejected file's
    // stale `.partial` cannot be replaced without --force) leaves neither.
    let out = dir.path().join("out.parquet");
    let stale = dir.path().join("rej.parquet.partial");
    std::fs::write(&stale, "stale").unwrap();
    let err = refused(
        &bucket,
        &[
            "export",
            TOPIC,
            "--format",
            "parquet",
            "--json-columns",
            "p:double,n:int64",
            "--rejected",
            dir.path().join("rej.parquet").to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ],
    );
    assert!(err.contains("remove it or give --force"), "{err}");
    let mut expected = before.clone();
    expected.insert("rej.parquet.partial".into());
    assert_eq!(names_in(dir.path()), expected);
    assert_eq!(std::fs::read(&stale).unwrap(), b"stale");
}

#[test]
fn a_from_offset_past_the_archive_is_refused_naming_the_range() {
    let dir = tempfile::tempdir().unwrap();
    let bucket = dir.path().join("bucket");
    build_bucket(dir.path(), &bucket, TOPIC, 40, record);
    let out = dir.path().join("out.jsonl");
    let out_s = out.to_str().unwrap();
    for from in ["40", "200000"] {
        for format in ["jsonl", "csv", "parquet", "batches"] {
            let err = refused(
                &bucket,
                &[
                    "export",
                    TOPIC,
                    "--from-offset",
                    from,
                    "--format",
                    format,
                    "--out",
                    out_s,
                ],
            );
            assert_eq!(
                err,
                format!(
                    "error: --from-offset {from} is past the archived records of {TOPIC}: the archive holds offsets 0..=39 (nothing to read)\n"
                )
            );
            assert!(!out.exists() && !dir.path().join("out.jsonl.partial").exists());
        }
    }
    // The last archived offset is still a start.
    let said = tribctl(
        &bucket,
        &["export", TOPIC, "--from-offset", "39", "--out", out_s],
    );
    assert!(said.status.success(), "{said:?}");
    assert_eq!(
        stderr(&said),
        format!("exported 1 records of {TOPIC} to {out_s}\n")
    );
    // An unknown topic is named as before, with --from-offset too.
    let err = refused(
        &bucket,
        &[
            "export",
            "/plant/typo",
            "--from-offset",
            "0",
            "--out",
            dir.path().join("t.jsonl").to_str().unwrap(),
        ],
    );
    assert_eq!(
        err,
        "error: the archive has no segment objects of /plant/typo (check the topic name and --prefix)\n"
    );
}

/// A `--from-timestamp` after the last archived record's is a "since"
/// query with nothing new: an empty export (as a scheduled export expects),
/// and the summary says why, naming the latest timestamp (it said only
/// "exported 0 records").
#[test]
fn a_from_timestamp_past_the_archive_exports_nothing_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let bucket = dir.path().join("bucket");
    build_bucket(dir.path(), &bucket, TOPIC, 40, record);
    // The last record (offset 39) is at BASE_MS + 39 min.
    for format in ["jsonl", "csv", "parquet", "batches"] {
        let out = dir.path().join(format!("out.{format}"));
        let out_s = out.to_str().unwrap();
        let said = tribctl(
            &bucket,
            &[
                "export",
                TOPIC,
                "--from-timestamp",
                "2006-12-16T18:03:00.001Z",
                "--format",
                format,
                "--out",
                out_s,
            ],
        );
        assert!(said.status.success(), "{format}: {said:?}");
        assert_eq!(
            stderr(&said),
            format!(
                "exported 0 records of {TOPIC} to {out_s} (no record of {TOPIC} at or after --from-timestamp 2006-12-16T18:03:00.001Z: the latest archived record's timestamp is 2006-12-16T18:03:00.000Z (1166292180000 ms))\n"
            ),
            "{format}"
        );
        assert!(out.exists(), "{format}");
    }
    // The last record's own timestamp still reads it.
    let out = dir.path().join("last.jsonl");
    let out_s = out.to_str().unwrap();
    let said = tribctl(
        &bucket,
        &[
            "export",
            TOPIC,
            "--from-timestamp",
            "2006-12-16T18:03:00Z",
            "--out",
            out_s,
        ],
    );
    assert!(said.status.success(), "{said:?}");
    assert_eq!(
        stderr(&said),
        format!("exported 1 records of {TOPIC} to {out_s}\n")
    );
}

#[test]
fn the_summary_counts_written_and_rejected_rows_apart() {
    let dir = tempfile::tempdir().unwrap();
    let bucket = dir.path().join("bucket");
    build_bucket(dir.path(), &bucket, TOPIC, 40, record);
    for (max, written, misfits) in [(None, 38, 2), (Some("20"), 19, 1), (Some("10"), 10, 0)] {
        let typed = dir.path().join("typed.parquet");
        let rejected = dir.path().join("rejected.parquet");
        let mut args = vec![
            "export",
            TOPIC,
            "--format",
            "parquet",
            "--json-columns",
            "p:double,n:int64",
            "--force",
            "--rejected",
            rejected.to_str().unwrap(),
            "--out",
            typed.to_str().unwrap(),
        ];
        if let Some(max) = max {
            args.extend(["--max-records", max]);
        }
        let out = tribctl(&bucket, &args);
        assert!(out.status.success(), "{out:?}");
        assert_eq!(
            stderr(&out),
            format!(
                "exported {written} records of {TOPIC} to {}; {misfits} records did not fit: {}\n",
                typed.display(),
                rejected.display()
            )
        );
        assert_eq!(rows(&read_parquet(&typed).0), written);
        assert_eq!(rows(&read_parquet(&rejected).0), misfits);
    }
}

#[test]
fn inferred_columns_have_distinct_names_and_pyarrow_reads_the_file() {
    let python = tributary_test_support::python::python_with(&["pyarrow"]);
    let dir = tempfile::tempdir().unwrap();
    let bucket = dir.path().join("bucket");
    let topic = "/plant/collide";
    build_bucket(dir.path(), &bucket, topic, 50, colliding_record);
    let out = dir.path().join("collide.parquet");
    let said = tribctl(
        &bucket,
        &[
            "export",
            topic,
            "--format",
            "parquet",
            "--json-columns",
            "infer",
            "--out",
            out.to_str().unwrap(),
        ],
    );
    assert!(said.status.success(), "{said:?}");
    assert_eq!(
        stderr(&said),
        format!(
            "inferred columns of {topic}: value_key:string,value_offset:int64,ts:int64,value_offset_2:int64\nexported 50 records of {topic} to {}\n",
            out.display()
        )
    );
    let (batches, names) = read_parquet(&out);
    assert_eq!(
        names,
        [
            "offset",
            "timestamp",
            "key",
            "headers",
            "value_key",
            "value_offset",
            "ts",
            "value_offset_2",
            "_extra"
        ]
    );
    let b = &batches[0];
    let col = |n: &str| b.column_by_name(n).unwrap().clone();
    let offsets = col("offset");
    let offsets = offsets.as_primitive::<UInt64Type>();
    let from_value = col("value_offset");
    let from_value = from_value.as_primitive::<Int64Type>();
    let negated = col("value_offset_2");
    let negated = negated.as_primitive::<Int64Type>();
    for i in 0..b.num_rows() {
        let o = offsets.value(i) as i64;
        assert_eq!((from_value.value(i), negated.value(i)), (o, -o));
    }

    let script = "import json, sys\nimport pyarrow.parquet as pq\n\
        t = pq.read_table(sys.argv[1])\n\
        print(json.dumps({'columns': t.column_names, 'rows': t.num_rows,\n\
          'sum_value_offset': sum(t.column('value_offset').to_pylist()),\n\
          'sum_value_offset_2': sum(t.column('value_offset_2').to_pylist())}))\n";
    let read = std::process::Command::new(python)
        .args(["-c", script])
        .arg(&out)
        .output()
        .unwrap();
    assert!(read.status.success(), "pyarrow: {}", stderr(&read));
    let got: serde_json::Value = serde_json::from_slice(&read.stdout).unwrap();
    assert_eq!(got["rows"], 50);
    assert_eq!(got["columns"], serde_json::json!(names));
    assert_eq!(got["sum_value_offset"], 1225);
    assert_eq!(got["sum_value_offset_2"], -1225);
}
