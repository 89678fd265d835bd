//! The real `tribctl archive` against a local bucket built by the tier
//! service's upload path from real WAL segments (no broker, no Raft).

use std::path::Path;
use std::process::{Command, Output};

mod support;
use support::tribctl;

use bytes::Bytes;
use serde_json::Value;
use tributary_archive::Bucket;
use tributary_proto::batch::{EncodedBatch, Record};
use tributary_proto::keys::{StorageKeys, TopicName};
use tributary_proto::limits::Limits;

const TOPIC: &str = "/plant/press-7";

fn record(offset: u64) -> Record {
    let value = if offset % 50 == 7 {
        // Not UTF-8: printed as base64.
        Bytes::from(vec![0xff, 0xfe, offset as u8])
    } else {
        Bytes::from(format!(
            "reading {offset} {}",
            "x".repeat((offset % 300) as usize)
        ))
    };
    Record {
        timestamp_ms: 1_750_000_000_000 + offset as i64 * 100,
        key: offset
            .is_multiple_of(2)
            .then(|| Bytes::from(format!("sensor-{}", offset % 5))),
        headers: vec![("unit".into(), Bytes::from_static(b"kPa"))],
        value,
    }
}

fn build_bucket(dir: &Path, bucket: &Path, count: u64) -> Vec<(String, u64, u64)> {
    support::build_bucket(dir, bucket, TOPIC, count, record)
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn lines(o: &Output) -> Vec<Value> {
    stdout(o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn ls_cat_export_on_a_clean_bucket() {
    let dir = tempfile::tempdir().unwrap();
    let bucket = dir.path().join("bucket");
    let objects = build_bucket(dir.path(), &bucket, 2000);
    assert!(objects.len() >= 3, "{objects:?}");

    let out = tribctl(&bucket, &["ls"]);
    assert!(out.status.success(), "{out:?}");
    assert!(stdout(&out).contains(TOPIC), "{}", stdout(&out));

    let out = tribctl(&bucket, &["--output", "json", "ls", TOPIC]);
    assert!(out.status.success(), "{out:?}");
    let doc: Value = serde_json::from_str(&stdout(&out)).unwrap();
    let segments = doc["segments"].as_array().unwrap();
    assert_eq!(segments.len(), objects.len());
    let records: u64 = segments
        .iter()
        .map(|s| s["records"].as_u64().unwrap())
        .sum();
    assert_eq!(records, 2000);

    // From an offset, a few records.
    let out = tribctl(
        &bucket,
        &["cat", TOPIC, "--from-offset", "5", "--max-records", "4"],
    );
    assert!(out.status.success(), "{out:?}");
    let got = lines(&out);
    assert_eq!(got.len(), 4);
    assert_eq!(got[0]["offset"], 5);
    assert_eq!(got[0]["topic"], TOPIC);
    assert_eq!(got[0]["key"], Value::Null);
    assert_eq!(got[1]["key"], "sensor-1");
    assert_eq!(got[0]["value"], "reading 5 xxxxx");
    assert_eq!(got[0]["headers"][0]["name"], "unit");
    assert_eq!(got[0]["headers"][0]["value"], "kPa");
    assert_eq!(got[2]["offset"], 7);
    assert_eq!(got[2]["value_b64"], "//4H");
    assert!(got[2].get("value").is_none());
    assert_eq!(got[0]["timestamp_ms"], 1_750_000_000_500i64);

    // From a timestamp up to an offset, across objects.
    let t = (1_750_000_000_000i64 + 100 * 400 - 1).to_string();
    let out = tribctl(
        &bucket,
        &["cat", TOPIC, "--from-timestamp", &t, "--to-offset", "999"],
    );
    assert!(out.status.success(), "{out:?}");
    let got = lines(&out);
    assert_eq!(got.len(), 600);
    assert_eq!(got[0]["offset"], 400);
    assert_eq!(got[599]["offset"], 999);

    // Export as JSON lines and as raw batches.
    let jsonl = dir.path().join("out.jsonl");
    let out = tribctl(
        &bucket,
        &[
            "export",
            TOPIC,
            "--from-offset",
            "100",
            "--to-offset",
            "299",
            "--out",
            jsonl.to_str().unwrap(),
        ],
    );
    assert!(out.status.success(), "{out:?}");
    let text = std::fs::read_to_string(&jsonl).unwrap();
    assert_eq!(text.lines().count(), 200);
    assert!(text.lines().next().unwrap().contains("\"offset\":100"));

    let raw = dir.path().join("out.batches");
    let out = tribctl(
        &bucket,
        &[
            "export",
            TOPIC,
            "--from-offset",
            "100",
            "--to-offset",
            "299",
            "--format",
            "batches",
            "--out",
            raw.to_str().unwrap(),
        ],
    );
    assert!(out.status.success(), "{out:?}");
    let bytes = std::fs::read(&raw).unwrap();
    let limits = Limits::default();
    let mut at = 0;
    let mut offsets = Vec::new();
    while at < bytes.len() {
        let len = u32::from_le_bytes(bytes[at + 4..at + 8].try_into().unwrap()) as usize;
        let batch = EncodedBatch::from_bytes(Bytes::copy_from_slice(&bytes[at..at + len]), &limits)
            .unwrap();
        offsets.push((batch.base_offset(), batch.next_offset()));
        at += len;
    }
    assert_eq!(
        offsets.first().unwrap().0,
        100,
        "batches of 20 start at 100"
    );
    assert_eq!(offsets.last().unwrap().1, 300);
}

#[test]
fn verify_counts_a_clean_bucket_and_names_damage() {
    let dir = tempfile::tempdir().unwrap();
    let bucket = dir.path().join("bucket");
    let objects = build_bucket(dir.path(), &bucket, 3000);
    assert!(objects.len() >= 4, "{objects:?}");

    let out = tribctl(&bucket, &["verify"]);
    assert!(out.status.success(), "{out:?}");
    let text = stdout(&out);
    assert!(
        text.contains(&format!(
            "{TOPIC}: {} segments, 3000 records verified",
            objects.len()
        )),
        "{text}"
    );
    assert!(text.contains(": OK"), "{text}");

    // Flip one byte inside the second object's batches.
    let (key, start, end) = objects[1].clone();
    let path = bucket.join(&key);
    let mut bytes = std::fs::read(&path).unwrap();
    let pos = bytes.len() / 3;
    bytes[pos] ^= 0x10;
    std::fs::write(&path, &bytes).unwrap();
    let out = tribctl(&bucket, &["--output", "json", "verify", TOPIC]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let doc: Value = serde_json::from_str(&stdout(&out)).unwrap();
    let topic = &doc["topics"][0];
    assert_eq!(topic["ok"], false);
    assert_eq!(topic["damaged_segments"], 1);
    let problem = &topic["problems"][0];
    assert_eq!(problem["kind"], "damage");
    assert_eq!(problem["segment"], key.as_str());
    let (first, damaged_end) = (
        problem["first_offset"].as_u64().unwrap(),
        problem["end_offset"].as_u64().unwrap(),
    );
    assert!(
        start <= first && first < damaged_end && damaged_end <= end + 1,
        "{problem}"
    );
    assert!(
        topic["records"].as_u64().unwrap() < 3000,
        "the damaged batches are not counted"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("damaged"), "{stderr}");

    // Text output names the segment and the offset range.
    let out = tribctl(&bucket, &["verify"]);
    assert_eq!(out.status.code(), Some(1));
    let text = stdout(&out);
    assert!(text.contains("DAMAGED"), "{text}");
    assert!(
        text.contains(&format!("offsets {first}..{damaged_end} damaged")),
        "{text}"
    );

    // `cat` from the damaged object's start writes every intact record
    // before the damage, then fails naming it, each cause said once.
    let out = tribctl(
        &bucket,
        &["cat", TOPIC, "--from-offset", &start.to_string()],
    );
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let lines = stdout(&out);
    let offsets: Vec<u64> = lines
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["offset"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(offsets, (start..first).collect::<Vec<_>>(), "{lines}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert_eq!(stderr.matches("bad batch at byte").count(), 1, "{stderr}");
    assert!(
        stderr.contains(&format!("offset {first}")),
        "the error names where the damage starts: {stderr}"
    );

    // A range that ends right before the damage reads nothing of it:
    // `cat` by count and by last offset, and every export format, succeed.
    let last = first - 1;
    let count = (first - start).to_string();
    let from = start.to_string();
    for args in [
        vec![
            "cat",
            TOPIC,
            "--from-offset",
            &from,
            "--max-records",
            &count,
        ],
        vec![
            "cat",
            TOPIC,
            "--from-offset",
            &from,
            "--to-offset",
            &last.to_string(),
        ],
    ] {
        let out = tribctl(&bucket, &args);
        assert!(out.status.success(), "{args:?}: {out:?}");
        assert_eq!(
            stdout(&out).lines().count() as u64,
            first - start,
            "{args:?}"
        );
    }
    for format in ["jsonl", "csv", "parquet", "batches"] {
        let target = dir.path().join(format!("before-damage.{format}"));
        let out = tribctl(
            &bucket,
            &[
                "export",
                TOPIC,
                "--format",
                format,
                "--to-offset",
                &last.to_string(),
                "--out",
                target.to_str().unwrap(),
            ],
        );
        assert!(out.status.success(), "{format}: {out:?}");
    }

    // A missing object is a gap.
    std::fs::write(&path, {
        bytes[pos] ^= 0x10;
        &bytes
    })
    .unwrap();
    std::fs::remove_file(bucket.join(&objects[2].0)).unwrap();
    let out = tribctl(&bucket, &["verify"]);
    assert_eq!(out.status.code(), Some(1));
    let text = stdout(&out);
    assert!(
        text.contains(&format!(
            "gap: no object holds offsets {}..{}",
            objects[2].1,
            objects[2].2 + 1
        )),
        "{text}"
    );
}

#[test]
fn ls_compares_the_bucket_with_the_raft_descriptors() {
    use broker_core::clock::ManualClock;
    use broker_core::metadata::redb::RedbStore;
    use std::sync::Arc;
    use tributary_archive::reader::Archive;
    use tributary_broker::admin::{AdminState, StaticClusterView, serve};
    use tributary_broker::storage::commit_descriptor;
    use tributary_proto::archive::SegmentDescriptor;

    const TOKEN: &str = "archive-ls-token";
    let dir = tempfile::tempdir().unwrap();
    let bucket_dir = dir.path().join("bucket");
    let objects = build_bucket(dir.path(), &bucket_dir, 2000);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let store = Arc::new(
        RedbStore::open(dir.path().join("meta.redb"), Arc::new(ManualClock::new(1))).unwrap(),
    );
    let keys = StorageKeys::default();
    let topic = TopicName::new(TOPIC).unwrap();
    // Commit every object's descriptor but the last.
    let archive = Archive::new(Bucket::local(bucket_dir.clone()).unwrap(), keys.clone());
    let (listed, _) = runtime.block_on(archive.segments(&topic)).unwrap();
    for object in &listed[..listed.len() - 1] {
        let index = runtime.block_on(archive.open(object)).unwrap();
        let d = SegmentDescriptor::from_footer(index.footer(), object.key.clone(), 1);
        runtime
            .block_on(commit_descriptor(&*store, &keys, &topic, &d, None))
            .unwrap();
    }
    let state = AdminState {
        store: store.clone(),
        cluster: Arc::new(StaticClusterView::single_leader("127.0.0.1:1", 1)),
        auth: tributary_broker::auth::AuthState::new(store.clone(), Some(TOKEN.to_owned())),
    };
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    runtime.spawn(serve(listener, state, std::future::pending()));
    let verify_against = |admin_url: Option<&str>| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_tribctl"));
        if let Some(url) = admin_url {
            cmd.args(["--admin-url", url]);
        }
        cmd.args(["--token", TOKEN, "archive", "--bucket"])
            .arg(&bucket_dir)
            .args(["verify", "--against-descriptors"])
            .env_remove("TRIB_ADMIN_URL")
            .output()
            .unwrap()
    };
    // Every descriptor has its object: verify against them passes.
    let out = verify_against(Some(&url));
    assert!(out.status.success(), "{out:?}");
    // Another object of the same size at a committed key (a restore from
    // the wrong backup, a copy between topics: the same records 1 ms
    // later) is not the described object: it passed, as only sizes were
    // compared (the cluster trial).
    let other_bucket = dir.path().join("other-bucket");
    let later = |offset: u64| {
        let mut r = record(offset);
        r.timestamp_ms += 1;
        r
    };
    let other = support::build_bucket_with(
        &dir.path().join("other"),
        &other_bucket,
        TOPIC,
        2000,
        &later,
        20,
        64 * 1024,
        None,
    );
    assert_eq!(other, objects, "the same keys");
    let (key, start, end) = &objects[1];
    let original = std::fs::read(bucket_dir.join(key)).unwrap();
    let replacement = std::fs::read(other_bucket.join(key)).unwrap();
    assert_eq!(replacement.len(), original.len(), "the same size");
    assert_ne!(replacement, original);
    std::fs::write(bucket_dir.join(key), &replacement).unwrap();
    let out = verify_against(Some(&url));
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let text = stdout(&out);
    assert!(
        text.contains(&format!(
            "descriptor_object_mismatch: offsets {start}..={end}: object {key} is not the object its descriptor describes"
        )),
        "{text}"
    );
    std::fs::write(bucket_dir.join(key), &original).unwrap();
    // And one committed object disappears.
    std::fs::remove_file(bucket_dir.join(&objects[0].0)).unwrap();
    // Without --admin-url the comparison is refused, not defaulted.
    let out = verify_against(None);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(err.contains("give --admin-url"), "{err}");
    // With it: exit 1, naming the range the missing object held and the
    // archive starting above the topic's retained history.
    let out = verify_against(Some(&url));
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let text = stdout(&out);
    let (key, start, end) = &objects[0];
    assert!(
        text.contains(&format!(
            "descriptor_object_missing: offsets {start}..={end}: the descriptor's object {key} is missing"
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "starts_above_log_start: the first object starts at {}, above the topic's retained history start 0",
            end + 1
        )),
        "{text}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_tribctl"))
        .args(["--admin-url", &url, "--token", TOKEN, "archive", "--bucket"])
        .arg(&bucket_dir)
        .args(["ls", TOPIC, "--compare-broker"])
        .output()
        .unwrap();
    // A disagreement is exit 1 (it was 0), after the listing.
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        format!(
            "error: the bucket and the Raft descriptors of {TOPIC} disagree: 2 disagreement(s)\n"
        )
    );
    let text = stdout(&out);
    let last = &objects[objects.len() - 1].0;
    assert!(
        text.contains(&format!(
            "DISAGREEMENT: descriptor without object: {}",
            objects[0].0
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!("DISAGREEMENT: object without descriptor: {last}")),
        "{text}"
    );
    // Without a topic, or without --admin-url, the comparison is refused
    // (it was skipped without a word, or made with a default address).
    for (args, said) in [
        (
            vec!["--admin-url", url.as_str(), "archive", "--bucket"],
            "--compare-broker compares one topic",
        ),
        (vec!["archive", "--bucket"], "give --admin-url"),
    ] {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_tribctl"));
        cmd.args(&args)
            .arg(&bucket_dir)
            .args(["ls", "--compare-broker"]);
        if args.len() == 2 {
            cmd.arg(TOPIC);
        }
        let out = cmd.env_remove("TRIB_ADMIN_URL").output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(said), "{err}");
        assert!(out.stdout.is_empty(), "{out:?}");
    }
}

/// An S3 bucket without credentials is refused before any request: no
/// fallback to the cloud's instance metadata endpoint (169.254.169.254)
/// unless `--s3-instance-credentials true` asks for it. The endpoint given
/// is a closed local port, so nothing could answer anyway.
#[test]
fn an_s3_bucket_without_credentials_is_refused_naming_the_settings() {
    let mut command = Command::new(env!("CARGO_BIN_EXE_tribctl"));
    command
        .args(["archive", "--bucket", "s3://tributary-none"])
        .args(["--s3-endpoint", "http://127.0.0.1:9", "ls"])
        .env_remove("TRIB_ARCHIVE_BUCKET");
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("AWS_") {
            command.env_remove(name);
        }
    }
    let output = command.output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("S3 bucket tributary-none: no credentials")
            && stderr.contains("--s3-access-key-id")
            && stderr.contains("--s3-instance-credentials true"),
        "{stderr}"
    );
    assert!(output.stdout.is_empty());
}

/// A cron audit must not pass on a typo: `verify` on an empty or missing
/// bucket, under a wrong `--prefix`, or of an unknown topic exits 1 and
/// says what is missing; the good topic beside it still verifies.
#[test]
fn verify_fails_on_a_missing_bucket_a_wrong_prefix_and_an_unknown_topic() {
    let dir = tempfile::tempdir().unwrap();
    let bucket = dir.path().join("bucket");
    build_bucket(dir.path(), &bucket, 300);

    // A topic the bucket does not hold, and an empty offset range, are
    // errors rather than empty output.
    for (args, message) in [
        (
            &["cat", "/plant1/typo"][..],
            "error: the archive has no segment objects of /plant1/typo (check the topic name and --prefix)\n",
        ),
        (
            &["ls", "/plant1/typo"][..],
            "error: the archive has no segment objects of /plant1/typo (check the topic name and --prefix)\n",
        ),
        (
            &["cat", TOPIC, "--from-offset", "10", "--to-offset", "5"],
            "error: --to-offset 5 is before --from-offset 10: no offset is in that range\n",
        ),
        (
            &["cat", TOPIC, "--from-offset", "200000"],
            "error: --from-offset 200000 is past the archived records of /plant/press-7: the archive holds offsets 0..=299 (nothing to read)\n",
        ),
    ] {
        let out = tribctl(&bucket, args);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {out:?}");
        assert_eq!(String::from_utf8_lossy(&out.stderr), message, "{args:?}");
        assert_eq!(stdout(&out), "", "{args:?}");
    }

    // A start after the last record's timestamp (1_750_000_029_900) is a
    // "since" query with nothing new: no output, exit 0, and a note saying
    // why on stderr (it said nothing).
    let out = tribctl(
        &bucket,
        &["cat", TOPIC, "--from-timestamp", "1750000029901"],
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(stdout(&out), "");
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "no record of /plant/press-7 at or after --from-timestamp 2025-06-15T15:07:09.901Z: the latest archived record's timestamp is 2025-06-15T15:07:09.900Z (1750000029900 ms)\n"
    );

    // Out-of-range options are refused by the parser (exit 2), naming
    // the option, before anything is read or written.
    let out_file = dir.path().join("x.parquet");
    let out_path = out_file.to_str().unwrap();
    for (args, says) in [
        (
            vec![
                "export",
                TOPIC,
                "--format",
                "parquet",
                "--out",
                out_path,
                "--zstd-level",
                "0",
            ],
            "invalid value '0' for '--zstd-level <ZSTD_LEVEL>': 0 is not in 1..=22",
        ),
        (
            vec![
                "export",
                TOPIC,
                "--format",
                "parquet",
                "--out",
                out_path,
                "--zstd-level",
                "23",
            ],
            "23 is not in 1..=22",
        ),
        (
            vec![
                "export",
                TOPIC,
                "--format",
                "parquet",
                "--out",
                out_path,
                "--row-group-rows",
                "0",
            ],
            "invalid value '0' for '--row-group-rows <ROW_GROUP_ROWS>': must be at least 1",
        ),
        (
            vec![
                "export",
                TOPIC,
                "--format",
                "parquet",
                "--out",
                out_path,
                "--infer-rows",
                "0",
            ],
            "invalid value '0' for '--infer-rows <INFER_ROWS>': must be at least 1",
        ),
        (
            vec!["cat", TOPIC, "--from-offset", "-1"],
            "invalid value '-1' for '--from-offset <FROM_OFFSET>'",
        ),
    ] {
        let out = tribctl(&bucket, &args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        assert!(!out_file.exists(), "{args:?} wrote the output");
    }

    // A mistyped directory is named, and not created, by any command.
    let missing = dir.path().join("no-such-bucket");
    for args in [&["verify"][..], &["ls"], &["cat", TOPIC]] {
        let out = tribctl(&missing, args);
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        assert_eq!(
            String::from_utf8_lossy(&out.stderr),
            format!(
                "error: invalid configuration: {}: no such bucket directory\n",
                missing.display()
            )
        );
        assert!(!missing.exists(), "{args:?} created the bucket directory");
    }
    // A file given as the bucket is named as not a directory (it read "no
    // such bucket directory").
    let file = dir.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    let out = tribctl(&file, &["ls"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        format!(
            "error: invalid configuration: {}: not a directory: a local bucket is a directory\n",
            file.display()
        )
    );
    let empty = dir.path().join("empty-bucket");
    std::fs::create_dir(&empty).unwrap();
    let out = tribctl(&empty, &["verify"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("no topic has segment objects") && stderr.contains("--prefix"),
        "{stderr}"
    );

    let out = tribctl(&bucket, &["--prefix", "/typo", "verify"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no topic has segment objects"),
        "{out:?}"
    );

    let out = tribctl(
        &bucket,
        &["--output", "json", "verify", TOPIC, "/plant1/typo"],
    );
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let doc: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(doc["topics"][0]["ok"], true, "{doc}");
    assert_eq!(doc["topics"][0]["records"], 300, "{doc}");
    let missing = &doc["topics"][1];
    assert_eq!(missing["topic"], "/plant1/typo");
    assert_eq!(missing["ok"], false);
    assert_eq!(missing["problems"][0]["kind"], "missing", "{doc}");
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "error: 1 topic(s) have no segment objects in the archive (check the topic names and --prefix); nothing found is damaged\n",
    );
    // In text: not found, not "DAMAGED" (nothing is there to be damaged).
    let out = tribctl(&bucket, &["verify", "/plant1/typo"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let text = stdout(&out);
    assert!(
        text.starts_with("/plant1/typo: 0 segments, 0 records verified, 0 bytes: NOT FOUND\n"),
        "{text}"
    );
}

/// `ls` of a bucket names the cluster its prefix's owner object names
/// (JSON `prefix_owner`, a line on stderr), `null` without one, and warns
/// of a damaged one without failing (the tier service refuses to start on
/// it; the records are still listed).
#[test]
fn ls_names_the_cluster_owning_the_prefix() {
    let dir = tempfile::tempdir().unwrap();
    let bucket = dir.path().join("bucket");
    build_bucket(dir.path(), &bucket, 10);
    let ls = || {
        let out = tribctl(&bucket, &["--output", "json", "ls"]);
        assert!(out.status.success(), "{out:?}");
        let doc: Value = serde_json::from_str(&stdout(&out)).unwrap();
        assert_eq!(doc["topics"][0]["topic"], TOPIC, "{doc}");
        (
            doc["prefix_owner"].clone(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    assert_eq!(ls().0, Value::Null);

    let id = "2d2fc714-5faa-48cb-9bdd-b92cd23de3c8";
    let owner = bucket.join("tributary/cluster-owner.json");
    let cluster = tributary_proto::cluster::ClusterId::parse(id).unwrap();
    std::fs::write(&owner, tributary_archive::owner::encode(cluster)).unwrap();
    let (named, stderr) = ls();
    assert_eq!(named, Value::String(id.into()));
    assert!(
        stderr.contains(&format!(
            "prefix owner: cluster {id} (tributary/cluster-owner.json)"
        )),
        "{stderr}"
    );
    let out = tribctl(&bucket, &["ls"]);
    assert!(out.status.success(), "{out:?}");
    assert!(stdout(&out).contains(TOPIC), "{}", stdout(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains(id));

    std::fs::write(&owner, b"{}").unwrap();
    let (named, stderr) = ls();
    assert_eq!(named, Value::Null);
    assert!(
        stderr.contains("warning: tributary/cluster-owner.json is not an owner object"),
        "{stderr}"
    );
}

/// A truncated object is named as possibly truncated: its last 112 bytes
/// are no footer, and the message said only "not a Tributary archive
/// object: footer magic [..]" (the cluster trial's `truncate -s -10`).
#[test]
fn a_truncated_object_is_named_as_possibly_truncated() {
    let dir = tempfile::tempdir().unwrap();
    let bucket = dir.path().join("bucket");
    let objects = build_bucket(dir.path(), &bucket, 300);
    let path = bucket.join(&objects[0].0);
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 10]).unwrap();
    let out = tribctl(&bucket, &["verify"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let text = stdout(&out);
    assert!(
        text.contains("not a Tributary archive object, or truncated or extended"),
        "{text}"
    );
}

/// An object missing between two others: reads that start past it are
/// served (they failed with the gap before), a read across it prints what
/// precedes it and fails naming the missing offsets, and a start past the
/// end is still "past the archived records".
#[test]
fn a_missing_object_blocks_only_the_reads_that_cross_it() {
    let dir = tempfile::tempdir().unwrap();
    let bucket = dir.path().join("bucket");
    let objects = build_bucket(dir.path(), &bucket, 2000);
    assert!(objects.len() >= 3, "{objects:?}");
    let (key, first, last) = objects[1].clone();
    std::fs::remove_file(bucket.join(&key)).unwrap();
    let after = (last + 1).to_string();

    let out = tribctl(&bucket, &["cat", TOPIC, "--from-offset", &after]);
    assert!(out.status.success(), "{out:?}");
    let got = lines(&out);
    assert_eq!(got.len() as u64, 2000 - (last + 1));
    assert_eq!(got[0]["offset"], last + 1);
    assert_eq!(got.last().unwrap()["offset"], 1999);

    let out = tribctl(&bucket, &["cat", TOPIC, "--from-offset", "0"]);
    assert!(!out.status.success(), "{out:?}");
    assert_eq!(lines(&out).len() as u64, first);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("no object for offsets {first}..{}", last + 1)),
        "{stderr}"
    );
    let inside = (first + 1).to_string();
    let out = tribctl(&bucket, &["cat", TOPIC, "--from-offset", &inside]);
    assert!(!out.status.success(), "{out:?}");
    assert!(lines(&out).is_empty(), "{out:?}");

    let out = tribctl(&bucket, &["cat", TOPIC, "--from-offset", "99999"]);
    assert!(!out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("past the archived records"), "{stderr}");
}

/// A stray file among a topic's segment objects is named by `verify` (it
/// said only "foreign: not a segment object") and is not damage.
#[test]
fn verify_names_a_foreign_object_and_does_not_count_it() {
    let dir = tempfile::tempdir().unwrap();
    let bucket = dir.path().join("bucket");
    let objects = build_bucket(dir.path(), &bucket, 200);
    let segments = Path::new(&objects[0].0).parent().unwrap();
    let junk = segments.join("zzz-junk.seg");
    std::fs::write(bucket.join(&junk), b"not an object").unwrap();

    let out = tribctl(&bucket, &["verify", TOPIC]);
    assert!(out.status.success(), "{out:?}");
    let text = stdout(&out);
    assert!(text.contains(": OK"), "{text}");
    assert!(
        text.contains(&format!(
            "not a segment object (ignored, not counted as a problem): {}",
            junk.display()
        )),
        "{text}"
    );
}
