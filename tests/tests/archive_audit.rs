//! The object store emptied under a running pipeline (issue 16, defect 2),
//! with real processes: broker + edge agent + tier service on moto's S3.
//! Data is tiered and the broker trims its local segments; then every
//! object is deleted from the bucket. The tier service's archive audit
//! notices within one audit interval (metric, log, a Raft mark per lost
//! segment through the broker), and `tribctl archive verify
//! --against-descriptors --admin-url ...` exits 1 naming exactly the range
//! nothing holds (here all of it: the broker trimmed every tiered segment).

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use tributary_archive::{Bucket, StoreConfig};
use tributary_test_support::moto::Moto;
use tributary_test_support::ports::free_tcp;
use tributary_test_support::process::{Proc, bin_path};
use tributary_tests::cluster::{Pair, metric_value, try_scrape};

const BUCKET: &str = "tributary-audit";
const TOKEN: &str = "e2e-test-token";

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(30)))
        .http_status_as_error(false)
        .build()
        .into()
}

fn admin_get(admin: &str, path: &str) -> Value {
    let mut response = agent()
        .get(&format!("http://{admin}/v1{path}"))
        .header("Authorization", &format!("Bearer {TOKEN}"))
        .call()
        .expect("admin GET");
    response.body_mut().read_json().unwrap_or(Value::Null)
}

fn s3_toml(endpoint: &str) -> String {
    format!(
        "url = \"s3://{BUCKET}\"\nendpoint = \"{endpoint}\"\nregion = \"us-east-1\"\npath_style = true\nallow_http = true\naccess_key_id = \"testing\"\nsecret_access_key = \"testing\"\n"
    )
}

fn wait_until(what: &str, limit: Duration, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !ok() {
        assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn an_emptied_bucket_is_noticed_by_the_audit_and_verify_names_the_lost_range() {
    let dir = tempfile::tempdir().expect("tempdir");
    let moto = Moto::start();
    let endpoint = moto.endpoint();
    let mut response = agent()
        .put(&format!("{endpoint}/{BUCKET}"))
        .send_empty()
        .expect("create bucket");
    assert!(response.status().is_success(), "create bucket");
    let _ = response.body_mut().read_to_string();

    let mut pair = Pair::new(dir.path(), "event_stream", None);
    let broker_toml = dir.path().join("broker.toml");
    let mut text = std::fs::read_to_string(&broker_toml).expect("broker.toml");
    text.push_str("[wal]\nsegment_max_age_ms = 300\n[archive.store]\n");
    text.push_str(&s3_toml(&endpoint));
    std::fs::write(&broker_toml, text).expect("broker.toml");
    let admin = pair.broker_admin.to_string();
    pair.broker.start();
    pair.edge.start();
    pair.wait_for_edge();

    let tier_metrics = free_tcp();
    let interval_ms = 1000;
    let tier_toml = dir.path().join("tier.toml");
    tributary_test_support::certs::write_private(
        &tier_toml,
        &format!(
            "data_dir = \"{data}\"\npoll_interval_ms = 200\nmetrics_listen = \"{tier_metrics}\"\n[broker]\nurl = \"http://{admin}\"\ntoken = \"{TOKEN}\"\n[audit]\ninterval_ms = {interval_ms}\n[store]\n{s3}",
            data = pair.broker_data.display(),
            s3 = s3_toml(&endpoint),
        ),
    );
    let mut tier_cmd = Command::new(bin_path("tier-service"));
    tier_cmd.arg("--config").arg(&tier_toml).env(
        "RUST_LOG",
        std::env::var("TRIB_TEST_CHILD_LOG").unwrap_or_else(|_| "warn".into()),
    );
    let mut tier = Proc::with_stdio("tier-service", tier_cmd);
    tier.start();

    // Two rounds of 1,000 records: each sealed by age, tiered, trimmed.
    for round in 1..=2u64 {
        let body: String = (0..1000)
            .map(|i| format!("{{\"value\":\"reading {round}-{i}\"}}\n"))
            .collect();
        assert_eq!(
            pair.publish_ndjson(body),
            Ok(((round - 1) * 1000, round * 1000))
        );
        pair.wait_acknowledged(round * 1000, Duration::from_secs(60));
        wait_until("tiered", Duration::from_secs(60), || {
            admin_get(&admin, "/storage/topics/plant1/readings/segments")["tiered_offset"]
                == round * 1000
        });
    }
    let listed = admin_get(&admin, "/storage/topics/plant1/readings/segments");
    let segments: Vec<(u64, u64)> = listed["segments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (
                d["start_offset"].as_u64().unwrap(),
                d["end_offset"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(segments, vec![(0, 999), (1000, 1999)], "{listed}");
    let wal_dir = pair.broker_data.join("topics/plant1/readings");
    wait_until("local segments trimmed", Duration::from_secs(30), || {
        broker_core::wal::list_sealed_segments(&wal_dir).is_ok_and(|s| s.is_empty())
    });

    // The bucket loses every object.
    let store = toml_store(&endpoint);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    tributary_archive::install_crypto_provider();
    let bucket = Bucket::open(&store).expect("bucket");
    let deleted = runtime.block_on(async {
        // The test topic's objects (the broker's audit topic is archived
        // into the same bucket).
        let objects = bucket
            .list("tributary/storage/topics/plant1/readings/")
            .await
            .expect("list");
        for o in &objects {
            bucket.delete(o.location.as_ref()).await.expect("delete");
        }
        objects.len()
    });
    assert_eq!(deleted, 2);
    let emptied = Instant::now();

    // Within one audit interval (plus a pass and the work): both segments
    // marked in Raft, with no local copy, and the gauge says 2.
    wait_until("marked missing", Duration::from_secs(30), || {
        admin_get(&admin, "/storage/topics/plant1/readings/segments")["missing"]
            .as_array()
            .is_some_and(|m| m.len() == 2)
    });
    let noticed = emptied.elapsed();
    eprintln!("archive audit: emptied bucket noticed after {noticed:?}");
    assert!(
        noticed < Duration::from_millis(interval_ms + 3000),
        "noticed after {noticed:?}"
    );
    let listed = admin_get(&admin, "/storage/topics/plant1/readings/segments");
    let marks: Vec<(u64, u64, bool)> = listed["missing"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["start_offset"].as_u64().unwrap(),
                m["end_offset"].as_u64().unwrap(),
                m["local_copy"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(marks, vec![(0, 999, false), (1000, 1999, false)]);
    wait_until("missing gauge", Duration::from_secs(10), || {
        try_scrape(&format!("http://{tier_metrics}/metrics"))
            .is_ok_and(|t| metric_value(&t, "tributary_tier_archive_missing_segments") == Some(2))
    });
    // /health says so (503): an operator must act.
    let mut response = agent()
        .get(&format!("http://{tier_metrics}/health"))
        .call()
        .expect("GET /health");
    let status = response.status().as_u16();
    let health: Value = response.body_mut().read_json().unwrap_or(Value::Null);
    assert_eq!(status, 503, "{health}");
    assert_eq!(health["status"], "archive_data_missing", "{health}");
    assert_eq!(health["archive_missing_segments"], 2, "{health}");

    // tribctl: refused without --admin-url, exit 1 naming the ranges with it.
    let s3_flags = [
        "--bucket",
        &format!("s3://{BUCKET}"),
        "--s3-endpoint",
        &endpoint,
        "--s3-region",
        "us-east-1",
        "--s3-path-style",
        "true",
        "--s3-allow-http",
        "true",
        "--s3-access-key-id",
        "testing",
        "--s3-secret-access-key",
        "testing",
    ]
    .map(str::to_owned);
    let tribctl = |admin_url: Option<&str>| {
        let mut cmd = Command::new(bin_path("tribctl"));
        if let Some(url) = admin_url {
            cmd.args(["--admin-url", url]);
        }
        cmd.args(["--token", TOKEN, "archive"])
            .args(&s3_flags)
            .args(["verify", "--against-descriptors"])
            .env_remove("TRIB_ADMIN_URL")
            .output()
            .expect("tribctl")
    };
    let out = tribctl(None);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let out = tribctl(Some(&format!("http://{admin}")));
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    for range in ["0..=999", "1000..=1999"] {
        assert!(
            text.contains(&format!("descriptor_object_missing: offsets {range}:")),
            "{range} not named:\n{text}"
        );
    }
    assert!(text.contains("starts_above_log_start"), "{text}");

    assert_eq!(tier.terminate(), Some(0), "tier-service exit");
    assert_eq!(pair.edge.terminate(), Some(0), "edge-agent exit");
    assert_eq!(pair.broker.terminate(), Some(0), "broker exit");
}

/// The S3 settings as the test's own client reads them.
fn toml_store(endpoint: &str) -> StoreConfig {
    StoreConfig {
        url: Some(format!("s3://{BUCKET}")),
        endpoint: Some(endpoint.to_owned()),
        region: Some("us-east-1".into()),
        path_style: Some(true),
        allow_http: Some(true),
        access_key_id: Some("testing".into()),
        secret_access_key: Some("testing".into()),
        ..StoreConfig::default()
    }
}
