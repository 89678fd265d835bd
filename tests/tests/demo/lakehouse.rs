//! The demo's archive as an analyst reads it: `tribctl archive export
//! --format parquet` (raw, and with `--json-columns infer`), read back with
//! pyarrow and DuckDB (`TRIB_TEST_PYTHON`, see `tests/py/demo_parquet.py` of this crate).

use std::ops::ControlFlow;
use std::path::Path;
use std::process::Command;

use base64::Engine as _;
use serde_json::Value;
use tributary_archive::reader::{Archive, Start};
use tributary_archive::{Bucket, StoreConfig};
use tributary_proto::keys::{StorageKeys, TopicName};
use tributary_test_support::process::bin_path;
use tributary_tests::demo::{CHANNELS, parse_row};

/// The demo's readings topic.
const READINGS: &str = "/plant1/household-power";

fn export(archive: &Path, out: &Path, extra: &[&str]) {
    let output = Command::new(bin_path("tribctl"))
        .arg("archive")
        .arg("--bucket")
        .arg(archive)
        .args(["export", READINGS, "--format", "parquet", "--out"])
        .arg(out)
        .args(extra)
        .env_remove("TRIB_ARCHIVE_BUCKET")
        .output()
        .expect("run tribctl");
    assert!(
        output.status.success(),
        "tribctl archive export {extra:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Every record's value in offset order, read from the archive.
fn archived_values(archive: &Path) -> Vec<Vec<u8>> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let bucket = Bucket::open(&StoreConfig {
        url: Some(archive.display().to_string()),
        ..StoreConfig::default()
    })
    .expect("bucket");
    let archive = Archive::new(bucket, StorageKeys::default());
    let topic = TopicName::new(READINGS).expect("topic");
    let mut values = Vec::new();
    runtime
        .block_on(archive.read(&topic, Start::Offset(0), &mut |r| {
            assert_eq!(r.offset, values.len() as u64, "archive offsets contiguous");
            values.push(r.record.value.to_vec());
            ControlFlow::Continue(())
        }))
        .expect("read archive");
    values
}

/// Exports the readings of the demo's archive to Parquet and checks what
/// pyarrow and DuckDB read: `rows` rows, every offset once, values
/// byte-equal to the archive, the UCI channels typed as doubles, and
/// `avg(Global_active_power)` equal to the one computed from the first
/// `rows` rows of `csv`.
pub fn check_parquet_export(archive: &Path, csv: &Path, rows: u64) {
    let python = tributary_test_support::python::python_with(&["pyarrow", "duckdb"]);
    let dir = tempfile::tempdir().expect("tempdir");
    let raw = dir.path().join("raw.parquet");
    let typed = dir.path().join("typed.parquet");
    export(archive, &raw, &[]);
    export(archive, &typed, &["--json-columns", "infer"]);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("py/demo_parquet.py");
    let out = Command::new(python)
        .arg(script)
        .arg(&raw)
        .arg(&typed)
        .args(CHANNELS)
        .output()
        .expect("run python");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got: Value = serde_json::from_slice(&out.stdout).expect("json");

    assert_eq!(got["raw_rows"], rows);
    assert_eq!(got["raw_distinct"], rows);
    assert_eq!(
        got["raw_offsets_in_order"],
        serde_json::json!([0, 1, 2, rows - 1])
    );
    let values = archived_values(archive);
    assert_eq!(values.len() as u64, rows);
    let b64 = base64::engine::general_purpose::STANDARD;
    let parquet_values: Vec<Vec<u8>> = got["raw_values_b64"]
        .as_array()
        .expect("values")
        .iter()
        .map(|v| b64.decode(v.as_str().expect("b64")).expect("base64"))
        .collect();
    assert!(
        parquet_values == values,
        "Parquet values differ from the archive's"
    );

    assert_eq!(got["typed_rows"], rows);
    assert_eq!(got["typed_distinct"], rows);
    for channel in CHANNELS {
        assert_eq!(got["types"][channel], "DOUBLE", "{channel}: {got:#}");
    }
    assert_eq!(got["types"]["offset"], "UBIGINT");
    assert_eq!(got["types"]["timestamp"], "TIMESTAMP WITH TIME ZONE");
    assert_eq!(got["types"]["date_time"], "VARCHAR");

    let text = std::fs::read_to_string(csv).expect("csv");
    let mut sum = 0.0;
    let mut n = 0u64;
    for (i, line) in text.lines().skip(1).take(rows as usize).enumerate() {
        let reading = parse_row(line, i as u64 + 2).expect("row");
        sum += reading.values[0];
        n += 1;
    }
    assert_eq!(n, rows);
    let from_csv = sum / n as f64;
    let from_parquet = got["avg_global_active_power"].as_f64().expect("avg");
    // Summation order differs (DuckDB sums in parallel): equal to the last
    // few bits of a double.
    assert!(
        ((from_parquet - from_csv) / from_csv).abs() < 1e-12,
        "avg(Global_active_power): Parquet {from_parquet}, CSV {from_csv}"
    );
    eprintln!("avg(Global_active_power) over {rows} rows: Parquet {from_parquet}, CSV {from_csv}");
}
