//! Lakehouse export benchmark (one run, every figure printed; not a timed
//! test): the UCI household power data set (`TRIB_DEMO_CSV`, or
//! `scripts/fetch-demo-data`'s cache) archived as the tier service stores
//! it (zstd batches of 250 records, 64 MiB segments), then `tribctl archive
//! export` of the whole topic as JSON lines, as raw Parquet and as Parquet
//! with typed columns (`--json-columns infer`), timed side by side in the
//! same run. Prints records/s and MB/s (of record values) per format, and
//! the bytes of each output against the archive's segment objects.
//!
//! ```sh
//! cargo bench -p ctl --bench lakehouse_export            # every row
//! TRIB_BENCH_ROWS=200000 cargo bench -p ctl --bench lakehouse_export
//! TRIB_BENCH_BUCKET=/tmp/uci-archive cargo bench ...   # build once, reuse
//! ```

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use bytes::Bytes;
use tributary_proto::batch::{Codec, Record};

#[path = "../tests/support/mod.rs"]
mod support;

const TOPIC: &str = "/plant1/household-power";
const CHANNELS: usize = 7;

fn data_set() -> PathBuf {
    if let Some(path) = std::env::var_os("TRIB_DEMO_CSV") {
        return PathBuf::from(path);
    }
    let out = Command::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../scripts/fetch-demo-data"
    ))
    .output()
    .expect("run scripts/fetch-demo-data");
    assert!(out.status.success(), "fetch-demo-data failed");
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// The demo's readings: value `{"date_time": ..., channel: number, ...}`
/// (the CSV's text of each number), key the date_time, timestamp its
/// minute (UTC). Rows with a missing reading (`?`) are skipped.
fn readings(csv: &Path, limit: usize) -> Vec<Record> {
    let text = std::fs::read_to_string(csv).expect("read csv");
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().expect("header").split(',').collect();
    assert_eq!(header.len(), CHANNELS + 1, "not the UCI data set");
    let mut out = Vec::new();
    for line in lines {
        if out.len() >= limit {
            break;
        }
        let fields: Vec<&str> = line.trim_end().split(',').collect();
        if fields.len() != CHANNELS + 1 || fields.iter().any(|f| f.contains('?')) {
            continue;
        }
        let ts = chrono::NaiveDateTime::parse_from_str(fields[0], "%Y-%m-%d %H:%M:%S")
            .expect("date_time")
            .and_utc()
            .timestamp_millis();
        let mut value = format!("{{\"date_time\":\"{}\"", fields[0]);
        for (name, field) in header[1..].iter().zip(&fields[1..]) {
            value.push_str(&format!(",\"{name}\":{field}"));
        }
        value.push('}');
        out.push(Record {
            timestamp_ms: ts,
            key: Some(Bytes::copy_from_slice(fields[0].as_bytes())),
            headers: Vec::new(),
            value: Bytes::from(value),
        });
    }
    out
}

fn dir_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let meta = entry.metadata().expect("metadata");
            if meta.is_dir() {
                stack.push(entry.path());
            } else {
                total += meta.len();
            }
        }
    }
    total
}

fn main() {
    let limit: usize = std::env::var("TRIB_BENCH_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(usize::MAX);
    let csv = data_set();
    let records = readings(&csv, limit);
    let count = records.len() as u64;
    let value_bytes: u64 = records.iter().map(|r| r.value.len() as u64).sum();
    let dir = tempfile::tempdir().expect("tempdir");
    // TRIB_BENCH_BUCKET: build the archive there once and reuse it.
    let bucket = std::env::var_os("TRIB_BENCH_BUCKET")
        .map(PathBuf::from)
        .unwrap_or_else(|| dir.path().join("bucket"));
    let started = Instant::now();
    if !bucket.exists() {
        build(dir.path(), &bucket, &records);
    }
    let archive_bytes = dir_bytes(&bucket);
    println!(
        "archive: {count} records, {:.1} MB of values, {:.1} MB of segment objects (ready in {:.1} s)",
        value_bytes as f64 / 1e6,
        archive_bytes as f64 / 1e6,
        started.elapsed().as_secs_f64()
    );
    run(&bucket, dir.path(), count, value_bytes, archive_bytes);
}

fn build(dir: &Path, bucket: &Path, records: &[Record]) {
    support::build_bucket_with(
        dir,
        bucket,
        TOPIC,
        records.len() as u64,
        &|o| records[o as usize].clone(),
        250,
        64 * 1024 * 1024,
        Some(Codec::Zstd),
    );
}

fn run(bucket: &Path, dir: &Path, count: u64, value_bytes: u64, archive_bytes: u64) {
    let mut rows = Vec::new();
    for (name, args) in [
        ("jsonl", vec!["--format", "jsonl"]),
        ("parquet (raw value)", vec!["--format", "parquet"]),
        (
            "parquet (typed columns)",
            vec!["--format", "parquet", "--json-columns", "infer"],
        ),
    ] {
        let out = dir.join("out");
        let started = Instant::now();
        let status = Command::new(env!("CARGO_BIN_EXE_tribctl"))
            .arg("archive")
            .arg("--bucket")
            .arg(bucket)
            .args(["export", TOPIC, "--out"])
            .arg(&out)
            .args(&args)
            .env_remove("TRIB_ARCHIVE_BUCKET")
            .status()
            .expect("tribctl");
        let secs = started.elapsed().as_secs_f64();
        assert!(status.success(), "{name}: {status}");
        let bytes = std::fs::metadata(&out).expect("output").len();
        std::fs::remove_file(&out).expect("remove output");
        rows.push((name, secs, bytes));
    }
    let jsonl_rate = count as f64 / rows[0].1;
    println!("| export | records/s | MB/s of values | × jsonl | output MB | × archive bytes |");
    println!("|---|---|---|---|---|---|");
    for (name, secs, bytes) in &rows {
        let rate = count as f64 / secs;
        println!(
            "| {name} | {:.0} | {:.1} | {:.2} | {:.1} | {:.2} |",
            rate,
            value_bytes as f64 / secs / 1e6,
            rate / jsonl_rate,
            *bytes as f64 / 1e6,
            *bytes as f64 / archive_bytes as f64
        );
    }
}
