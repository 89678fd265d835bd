//! The continuous lakehouse writer, with the real `tier-service` binary
//! against the stand-in broker (the real storage router over a real
//! metadata store):
//! - killed at each step of the Parquet write and run again, every
//!   archived record is in exactly one Parquet file (dated or `_rejected`),
//!   in the partition of its date, none skipped, and the progress in Raft
//!   reaches the tiered offset;
//! - the layout is fixed by the first segment and the broker refuses
//!   progress that goes back or changes it;
//! - against moto (S3), pyarrow's S3 filesystem reads the `date=`
//!   partitions back with the same counts (needs `TRIB_TEST_PYTHON`, a
//!   python with pyarrow; `./scripts/test` installs one).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;

use arrow_array::Array;
use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, Int64Type, TimestampMillisecondType, UInt64Type};
use bytes::Bytes;
use common::Harness;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use tributary_proto::batch::{Codec, Record};
use tributary_proto::keys::{StorageKeys, TopicName};

const TOPIC: &str = "/plant/lake";
/// 2006-12-16T00:00:00Z.
const DAY0_MS: i64 = 1_166_227_200_000;
/// One record every 45 minutes: segments span dates.
const STEP_MS: i64 = 45 * 60_000;

/// JSON objects; every 97th (from 60, past the 50 values inference looks at) has a string where `n` is an integer.
fn lake_record(offset: u64) -> Record {
    let value = if offset % 97 == 60 {
        format!(r#"{{"n":"bad","p":{offset}.25}}"#)
    } else {
        format!(
            r#"{{"n":{offset},"p":{offset}.25,"site":"s{}"}}"#,
            offset % 3
        )
    };
    Record {
        timestamp_ms: DAY0_MS + offset as i64 * STEP_MS,
        key: Some(Bytes::from(format!("k{}", offset % 4))),
        headers: vec![("unit".into(), Bytes::from_static(b"kW"))],
        value: Bytes::from(value),
    }
}

/// Appends `count` records in batches of 30 and seals them.
fn write(h: &Harness, topic: &TopicName, count: u64) {
    let wal = h.wal(topic);
    h.runtime.block_on(async {
        let mut left = count;
        while left > 0 {
            let n = left.min(30);
            let base = wal.next_offset();
            wal.append((base..base + n).map(lake_record).collect(), Codec::Zstd)
                .await
                .unwrap();
            left -= n;
        }
        wal.roll().await.unwrap();
    });
}

fn config_file(h: &Harness, dir: &Path) -> std::path::PathBuf {
    let path = dir.join("tier.toml");
    std::fs::write(
        &path,
        format!(
            "data_dir = \"{}\"\n[lakehouse]\ntopics = [\"/plant/*\"]\ninfer_rows = 50\nrow_group_rows = 40\n",
            h.data_dir.display()
        ),
    )
    .unwrap();
    path
}

fn run_tier(h: &Harness, config: &Path, fault: Option<&str>) -> bool {
    let mut cmd = h.tier_command();
    cmd.arg("--config").arg(config);
    if let Some(fault) = fault {
        cmd.env("TRIB_TIER_FAULT", fault);
    }
    let out = cmd.output().unwrap();
    if out.status.signal().is_some() {
        return true;
    }
    assert!(
        out.status.success(),
        "tier-service ({fault:?}) failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    false
}

/// Every record batch of the Parquet file at `path`.
fn read_parquet(path: &Path) -> Vec<arrow_array::RecordBatch> {
    ParquetRecordBatchReaderBuilder::try_new(File::open(path).unwrap())
        .unwrap()
        .build()
        .unwrap()
        .map(|b| b.unwrap())
        .collect()
}

/// One row read back from a lakehouse file.
#[derive(Debug, Clone, PartialEq)]
struct Row {
    offset: u64,
    timestamp: i64,
    n: Option<i64>,
    p: Option<f64>,
}

/// Every Parquet file under the topic's lakehouse prefix: (key relative to
/// the bucket, rows).
fn lakehouse_files(h: &Harness, topic: &TopicName) -> BTreeMap<String, Vec<Row>> {
    let prefix = StorageKeys::default().lakehouse_objects_prefix(topic);
    let mut out = BTreeMap::new();
    let root = h.bucket_dir.join(&prefix);
    let mut dirs = vec![root.clone()];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            let name = path.strip_prefix(&root).unwrap().display().to_string();
            if !name.ends_with(".parquet") {
                continue; // an object store staging file
            }
            let mut rows = Vec::new();
            for b in read_parquet(&path) {
                let o = b
                    .column_by_name("offset")
                    .unwrap()
                    .as_primitive::<UInt64Type>();
                let t = b
                    .column_by_name("timestamp")
                    .unwrap()
                    .as_primitive::<TimestampMillisecondType>();
                let n = b
                    .column_by_name("n")
                    .map(|c| c.as_primitive::<Int64Type>().clone());
                let p = b
                    .column_by_name("p")
                    .map(|c| c.as_primitive::<Float64Type>().clone());
                for i in 0..b.num_rows() {
                    rows.push(Row {
                        offset: o.value(i),
                        timestamp: t.value(i),
                        n: n.as_ref().filter(|c| !c.is_null(i)).map(|c| c.value(i)),
                        p: p.as_ref().filter(|c| !c.is_null(i)).map(|c| c.value(i)),
                    });
                }
            }
            out.insert(name, rows);
        }
    }
    out
}

/// Every offset below `end` in exactly one file, in its date's partition,
/// typed values as written; misfits only in `_rejected`.
fn check_exactly_once(files: &BTreeMap<String, Vec<Row>>, end: u64) {
    let mut seen = BTreeSet::new();
    for (name, rows) in files {
        for row in rows {
            assert!(
                seen.insert(row.offset),
                "offset {} in two files",
                row.offset
            );
            assert_eq!(row.timestamp, lake_record(row.offset).timestamp_ms);
            if let Some(date) = name.strip_prefix("date=") {
                let want = tributary_lakehouse::time::utc_date(row.timestamp);
                assert!(
                    date.starts_with(&format!("{want}/")),
                    "{} in {name}",
                    row.offset
                );
                assert_ne!(row.offset % 97, 60, "a misfit in {name}");
                assert_eq!(row.n, Some(row.offset as i64));
                assert_eq!(row.p, Some(row.offset as f64 + 0.25));
            } else {
                assert!(name.starts_with("_rejected/"), "{name}");
                assert_eq!(row.offset % 97, 60, "{} rejected", row.offset);
            }
        }
    }
    let want: BTreeSet<u64> = (0..end).collect();
    assert_eq!(seen.len(), want.len(), "rows vs records");
    assert_eq!(seen, want);
}

fn progress(h: &Harness, topic: &TopicName) -> serde_json::Value {
    h.runtime
        .block_on(async {
            use broker_core::metadata::MetadataStore as _;
            h.store.get(&StorageKeys::default().lakehouse(topic)).await
        })
        .unwrap()
        .unwrap_or_default()
}

#[test]
fn killed_at_each_parquet_step_every_record_lands_in_exactly_one_file() {
    let dir = tempfile::tempdir().unwrap();
    let h = Harness::new(&[TOPIC]);
    let topic = h.topics[0].clone();
    let config = config_file(&h, dir.path());
    let mut written = 0;
    let mut crashes = 0;
    for round in 1..=2u32 {
        for point in ["lakehouse_after_put", "lakehouse_before_progress"] {
            write(&h, &topic, 150);
            written += 150;
            if run_tier(&h, &config, Some(&format!("{point}:{round}"))) {
                crashes += 1;
            }
            // What is written so far is never in two files.
            let files = lakehouse_files(&h, &topic);
            let mut seen = BTreeSet::new();
            for rows in files.values() {
                for r in rows {
                    assert!(seen.insert(r.offset), "{point}:{round}: {} twice", r.offset);
                }
            }
        }
    }
    assert!(crashes >= 3, "only {crashes} runs crashed");
    assert!(!run_tier(&h, &config, None));
    let files = lakehouse_files(&h, &topic);
    check_exactly_once(&files, written);
    assert!(
        files.keys().any(|k| k.starts_with("date=2006-12-17/")),
        "{:?}",
        files.keys()
    );
    let p = progress(&h, &topic);
    assert_eq!(p["next_offset"], written);
    assert_eq!(p["layout"]["kind"], "json", "{p}");

    // The broker keeps the rules: no going back, no other layout, nothing
    // past the archive.
    let client = tributary_tier::broker_api::BrokerClient::new(
        &h.base_url,
        common::TOKEN,
        &StorageKeys::default(),
    )
    .unwrap();
    let refuse = |value: serde_json::Value, kind: &str| {
        let err = h
            .runtime
            .block_on(client.put_lakehouse(&topic, &value))
            .expect_err("refused");
        assert!(err.to_string().contains(kind), "{err}");
    };
    refuse(
        serde_json::json!({"next_offset": 10, "layout": p["layout"]}),
        "lakehouse_regress",
    );
    refuse(
        serde_json::json!({"next_offset": written, "layout": {"kind": "raw"}}),
        "layout_fixed",
    );
    refuse(
        serde_json::json!({"next_offset": written + 1, "layout": p["layout"]}),
        "beyond_archive",
    );
    // A redo of everything rewrites the same bytes under the same keys.
    let before: BTreeMap<String, Vec<u8>> = files
        .keys()
        .map(|k| {
            let path = h
                .bucket_dir
                .join(StorageKeys::default().lakehouse_objects_prefix(&topic))
                .join(k);
            (k.clone(), std::fs::read(path).unwrap())
        })
        .collect();
    h.runtime.block_on(async {
        use broker_core::metadata::MetadataStore as _;
        h.store
            .delete(&StorageKeys::default().lakehouse(&topic))
            .await
            .unwrap();
    });
    assert!(!run_tier(&h, &config, None));
    for (k, bytes) in &before {
        let path = h
            .bucket_dir
            .join(StorageKeys::default().lakehouse_objects_prefix(&topic))
            .join(k);
        assert_eq!(
            &std::fs::read(path).unwrap(),
            bytes,
            "{k} rewritten with other bytes"
        );
    }
}

#[test]
fn on_s3_pyarrow_reads_the_date_partitions_back_with_the_same_counts() {
    use tributary_archive::Bucket;
    let python = tributary_test_support::python::python_with(&["pyarrow"]);
    let moto = tributary_test_support::moto::Moto::start();
    let endpoint = moto.endpoint();
    let bucket_name = "tributary-lake";
    let store = common::s3_store(&endpoint, bucket_name);
    let h = Harness::with_retention(&[TOPIC], false);
    let topic = h.topics[0].clone();
    h.runtime.block_on(async {
        common::create_bucket(&endpoint, bucket_name).await;
    });
    h.set_archive(Bucket::open(&store).unwrap());
    write(&h, &topic, 400);
    let mut config = h.tier_config();
    config.store = store;
    config.upload.part_size_bytes = 5 * 1024 * 1024;
    config.upload.multipart_threshold_bytes = 5 * 1024 * 1024;
    config.lakehouse.topics = vec![TOPIC.into()];
    config.lakehouse.infer_rows = 50;
    let report = h
        .runtime
        .block_on(tributary_tier::service::run(
            config,
            tributary_tier::faults::Faults::none(),
            true,
            std::future::pending(),
        ))
        .unwrap();
    assert!(!report.has_errors(), "{report:?}");
    assert_eq!(progress(&h, &topic)["next_offset"], 400);

    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/lakehouse_s3.py");
    let path = StorageKeys::default().lakehouse_objects_prefix(&topic);
    let out = std::process::Command::new(python)
        .arg(script)
        .arg(moto.addr().to_string())
        .arg(bucket_name)
        .arg(path.trim_end_matches('/'))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // The dataset is the dated files: every record but the misfits.
    let typed: Vec<u64> = (0..400).filter(|o| o % 97 != 60).collect();
    let mut by_date = BTreeMap::new();
    for o in &typed {
        *by_date
            .entry(tributary_lakehouse::time::utc_date(
                lake_record(*o).timestamp_ms,
            ))
            .or_insert(0u64) += 1;
    }
    assert_eq!(got["rows"], typed.len());
    assert_eq!(got["distinct"], typed.len());
    assert_eq!(
        (got["min"].as_u64(), got["max"].as_u64()),
        (Some(0), Some(399))
    );
    assert_eq!(got["by_date"], serde_json::json!(by_date));
    assert_eq!(got["sum_n"], typed.iter().sum::<u64>());
    let columns: Vec<&str> = got["columns"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c.as_str())
        .collect();
    assert_eq!(
        columns,
        [
            "offset",
            "timestamp",
            "key",
            "headers",
            "n",
            "p",
            "site",
            "_extra",
            "date"
        ]
    );
}

#[test]
fn cold_retention_removes_the_parquet_files_of_retired_segments() {
    let h = Harness::new(&[TOPIC]);
    let topic = h.topics[0].clone();
    // Three segments (each write seals one).
    for _ in 0..3 {
        write(&h, &topic, 100);
    }
    let mut config = h.tier_config();
    config.lakehouse.topics = vec!["/plant/*".into()];
    config.lakehouse.infer_rows = 50;
    let run = |config: tributary_tier::TierConfig| {
        let report = h
            .runtime
            .block_on(tributary_tier::service::run(
                config,
                tributary_tier::faults::Faults::none(),
                true,
                std::future::pending(),
            ))
            .unwrap();
        assert!(!report.has_errors(), "{report:?}");
    };
    run(config.clone());
    let descriptors = h.descriptors(&topic);
    assert!(descriptors.len() >= 3, "{descriptors:?}");
    check_exactly_once(&lakehouse_files(&h, &topic), 300);
    // Every record is from 2006: a one-day limit retires all but the
    // newest segment, and their Parquet files with them.
    config.cold_retention.max_age_ms = Some(86_400_000);
    run(config);
    let kept = h.descriptors(&topic);
    assert_eq!(kept.len(), 1, "{kept:?}");
    let files = lakehouse_files(&h, &topic);
    let offsets: BTreeSet<u64> = files.values().flatten().map(|r| r.offset).collect();
    let want: BTreeSet<u64> = (kept[0].start_offset..=kept[0].end_offset).collect();
    assert_eq!(
        offsets,
        want,
        "only the kept segment's rows remain: {:?}",
        files.keys()
    );
}

#[test]
fn a_topic_of_binary_values_is_written_raw_and_its_layout_stays_raw() {
    let mut h = Harness::new(&[]);
    let topic = h.add_topic("/plant/blobs", common::wal_config(true));
    let wal = h.wal(&topic);
    let value = |o: u64| Bytes::from(vec![0xff, 0x00, o as u8]);
    h.runtime.block_on(async {
        let records = (0..40)
            .map(|o| Record {
                timestamp_ms: DAY0_MS,
                key: None,
                headers: Vec::new(),
                value: value(o),
            })
            .collect();
        wal.append(records, Codec::None).await.unwrap();
        wal.roll().await.unwrap();
    });
    let mut config = h.tier_config();
    config.lakehouse.topics = vec!["*".into()];
    let report = h
        .runtime
        .block_on(tributary_tier::service::run(
            config,
            tributary_tier::faults::Faults::none(),
            true,
            std::future::pending(),
        ))
        .unwrap();
    assert!(!report.has_errors(), "{report:?}");
    assert_eq!(
        progress(&h, &topic)["layout"],
        serde_json::json!({"kind": "raw"})
    );
    let prefix = StorageKeys::default().lakehouse_objects_prefix(&topic);
    let path = h
        .bucket_dir
        .join(&prefix)
        .join("date=2006-12-16/00000000000000000000-00000000000000000039.parquet");
    let mut got = Vec::new();
    for b in read_parquet(&path) {
        let v = b
            .column_by_name("value")
            .unwrap()
            .as_binary::<i32>()
            .clone();
        got.extend((0..v.len()).map(|i| v.value(i).to_vec()));
    }
    assert_eq!(got, (0..40).map(|o| value(o).to_vec()).collect::<Vec<_>>());
}

/// A lakehouse trial: with the object of a topic's first segment missing,
/// the writer read the next object's records, kept none for the first
/// segment and recorded it as written: its records never reached the
/// lakehouse, even once the object was back. Now the segment waits for
/// its object, and is written whole once it is back.
#[test]
fn a_segment_whose_object_is_missing_waits_for_it_and_is_written_once_it_is_back() {
    let h = Harness::new(&[TOPIC]);
    let topic = h.topics[0].clone();
    let run = |lakehouse: bool| {
        let mut config = h.tier_config();
        // As `config_file`: inference sees none of the misfits.
        config.lakehouse.infer_rows = 50;
        config.lakehouse.row_group_rows = 40;
        config.lakehouse.topics = if lakehouse {
            vec!["/plant/*".into()]
        } else {
            Vec::new()
        };
        h.runtime
            .block_on(tributary_tier::service::run(
                config,
                tributary_tier::faults::Faults::none(),
                true,
                std::future::pending(),
            ))
            .unwrap()
    };
    write(&h, &topic, 100);
    write(&h, &topic, 100);
    assert!(!run(false).has_errors());
    let segments = h.bucket_dir.join(
        StorageKeys::default()
            .segments_prefix(&topic)
            .trim_start_matches('/'),
    );
    let first = segments.join("00000000000000000000-00000000000000000099.seg");
    let aside = h.data_dir.join("first-object-aside");
    std::fs::rename(&first, &aside).unwrap();

    let report = run(true);
    assert!(report.has_errors(), "{report:?}");
    // Reported as the topic's lakehouse failure (what /health's
    // `lakehouse_stalled` counts).
    assert_eq!(
        report
            .passes
            .iter()
            .flat_map(|p| &p.lakehouse_errors)
            .map(|(t, _)| t.as_str())
            .collect::<Vec<_>>(),
        vec![topic.as_str()],
        "{report:?}"
    );
    assert!(
        lakehouse_files(&h, &topic).is_empty(),
        "nothing written past the missing object"
    );
    assert_eq!(progress(&h, &topic), serde_json::Value::Null);

    std::fs::rename(&aside, &first).unwrap();
    assert!(!run(true).has_errors());
    check_exactly_once(&lakehouse_files(&h, &topic), 200);
    assert_eq!(progress(&h, &topic)["next_offset"], 200);
}
