//! Operator rough edges of `tribctl archive` (issue 21): the bucket flags
//! after the subcommand, `ls` columns under their headers whatever the
//! lengths, and the export's record count.

use std::path::Path;
use std::process::{Command, Output};

mod support;

use bytes::Bytes;
use tributary_proto::batch::Record;

const TOPIC: &str = "/plant/press-7";
/// Longer than the 40 columns `ls` used to reserve for a topic.
const LONG_TOPIC: &str = "/plant/a-topic-name-well-beyond-forty-characters-long";

fn record(offset: u64) -> Record {
    Record {
        timestamp_ms: 1_750_000_000_000 + offset as i64 * 100,
        key: None,
        headers: Vec::new(),
        value: Bytes::from(format!(
            "reading {offset} {}",
            "x".repeat((offset % 300) as usize)
        )),
    }
}

/// `tribctl ARGS` with no bucket in the environment.
fn tribctl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tribctl"))
        .args(args)
        .env_remove("TRIB_ARCHIVE_BUCKET")
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The byte positions where the words of `line` start.
fn column_starts(line: &str) -> Vec<usize> {
    let bytes = line.as_bytes();
    (0..bytes.len())
        .filter(|&i| bytes[i] != b' ' && (i == 0 || bytes[i - 1] == b' '))
        .collect()
}

/// Asserts that every row's cells start where the header's words do (no
/// cell of these tables holds a space).
fn assert_aligned(table: &str, columns: usize) {
    let lines: Vec<&str> = table.lines().collect();
    let header = column_starts(lines[0]);
    assert_eq!(header.len(), columns, "{table}");
    for row in &lines[1..] {
        assert_eq!(column_starts(row), header, "row {row:?} in\n{table}");
    }
}

fn build(dir: &Path) -> std::path::PathBuf {
    let bucket = dir.join("bucket");
    // Several segments: rows whose offsets grow in width.
    let objects = support::build_bucket(&dir.join("a"), &bucket, TOPIC, 2000, record);
    assert!(objects.len() >= 3, "{objects:?}");
    support::build_bucket(&dir.join("b"), &bucket, LONG_TOPIC, 45, record);
    bucket
}

#[test]
fn bucket_flags_after_the_subcommand_and_aligned_ls_columns() {
    let dir = tempfile::tempdir().unwrap();
    let bucket = build(dir.path());
    let bucket = bucket.to_str().unwrap();

    // Before and after the subcommand: the same listing.
    let before = tribctl(&["archive", "--bucket", bucket, "ls"]);
    assert!(before.status.success(), "{before:?}");
    let after = tribctl(&["archive", "ls", "--bucket", bucket]);
    assert!(after.status.success(), "{after:?}");
    assert_eq!(text(&after.stdout), text(&before.stdout));

    let listing = text(&after.stdout);
    let lines: Vec<&str> = listing.lines().collect();
    assert_eq!(lines.len(), 3, "{listing}");
    assert!(lines[0].starts_with("TOPIC"), "{listing}");
    assert!(
        lines[1].starts_with(&format!("{LONG_TOPIC}  ")),
        "{listing}"
    );
    assert!(lines[2].starts_with(&format!("{TOPIC}  ")), "{listing}");
    assert_aligned(&listing, 5);

    // A topic's segments, with --prefix and --bucket after the topic.
    let out = tribctl(&[
        "archive",
        "ls",
        TOPIC,
        "--bucket",
        bucket,
        "--prefix",
        "/tributary",
    ]);
    assert!(out.status.success(), "{out:?}");
    let segments = text(&out.stdout);
    assert!(segments.starts_with("START"), "{segments}");
    assert!(segments.lines().count() >= 3, "{segments}");
    assert_aligned(&segments, 6);
    let first_row: Vec<&str> = segments
        .lines()
        .nth(1)
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!(first_row[0], "0", "{segments}");
}

#[test]
fn export_reports_the_records_it_wrote() {
    let dir = tempfile::tempdir().unwrap();
    let bucket = build(dir.path());
    let out_file = dir.path().join("out.jsonl");
    let out = tribctl(&[
        "archive",
        "export",
        TOPIC,
        "--from-offset",
        "10",
        "--max-records",
        "123",
        "--out",
        out_file.to_str().unwrap(),
        "--bucket",
        bucket.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        text(&out.stderr),
        format!(
            "exported 123 records of {TOPIC} to {}\n",
            out_file.display()
        )
    );
    let written = std::fs::read_to_string(&out_file).unwrap();
    assert_eq!(written.lines().count(), 123);
}
