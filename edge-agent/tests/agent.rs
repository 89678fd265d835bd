//! The agent over real files and real HTTP on 127.0.0.1: publishing,
//! reading back, listing, restarts, realtime rings and every refusal.

mod common;

use broker_core::metadata::MetadataStoreExt;
use broker_core::wal::SyncMode;
use bytes::Bytes;
use common::*;
use serde_json::json;
use tributary_edge::Agent;
use tributary_edge::agent::AgentError;
use tributary_edge::manager::OpenError;
use tributary_proto::batch::Record;
use tributary_proto::intent::StreamIntent;
use tributary_proto::keys;

fn rec(ts: i64, key: Option<&[u8]>, headers: &[(&str, &[u8])], value: &[u8]) -> Record {
    Record {
        timestamp_ms: ts,
        key: key.map(Bytes::copy_from_slice),
        headers: headers
            .iter()
            .map(|(n, v)| ((*n).to_owned(), Bytes::copy_from_slice(v)))
            .collect(),
        value: Bytes::copy_from_slice(value),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_one_and_batch_with_exact_offsets_and_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let agent = start(config(dir.path())).await;
    let addr = agent.local_addr();
    let now = NOW_MS as i64;

    let r = post(
        addr,
        "/v1/topics/e1/t/records?key=k1",
        &[
            ("x-trib-h-unit", "celsius"),
            ("X-Trib-H-Site", "north"),
            ("x-other", "no"),
        ],
        b"hello",
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(
        r.body,
        json!({"topic": "/e1/t", "base_offset": 0, "next_offset": 1, "count": 1})
    );

    let body = concat!(
        "{\"value\":\"a\"}\n",
        "{\"value_b64\":\"AAEC/w==\",\"key\":\"k2\",\"headers\":{\"z\":\"1\",\"a\":\"2\"},\"timestamp_ms\":42}\n",
        "\n",
        "{\"value\":\"c\",\"key_b64\":\"/w==\"}\n",
    );
    let r = post(addr, "/v1/topics/e1/t/batch", &[], body.as_bytes()).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(
        r.body,
        json!({"topic": "/e1/t", "base_offset": 1, "next_offset": 4, "count": 3})
    );
    let r = post(addr, "/v1/topics/e1/t/records?timestamp_ms=5", &[], b"").await;
    assert_eq!(
        r.body,
        json!({"topic": "/e1/t", "base_offset": 4, "next_offset": 5, "count": 1})
    );

    let stored = read_wal(&agent, "/e1/t", 0);
    let expected = vec![
        (
            0,
            rec(
                now,
                Some(b"k1"),
                &[("site", b"north"), ("unit", b"celsius")],
                b"hello",
            ),
        ),
        (1, rec(now, None, &[], b"a")),
        (
            2,
            rec(
                42,
                Some(b"k2"),
                &[("z", b"1"), ("a", b"2")],
                &[0, 1, 2, 255],
            ),
        ),
        (3, rec(now, Some(&[255]), &[], b"c")),
        (4, rec(5, None, &[], b"")),
    ];
    // Header order of a single record follows the HTTP header map; compare
    // it as a set there.
    let mut stored = stored;
    stored[0].1.headers.sort();
    assert_eq!(stored, expected);

    // One batch per request, offsets contiguous.
    let topic = agent.topics().topic(&name("/e1/t")).unwrap();
    let wal = topic.wal().unwrap();
    let batches = wal.read(0, 1 << 20).unwrap();
    let ranges: Vec<_> = batches
        .iter()
        .map(|b| (b.base_offset(), b.next_offset()))
        .collect();
    assert_eq!(ranges, [(0, 1), (1, 4), (4, 5)]);
    let bytes_in: u64 = batches.iter().map(|b| b.len() as u64).sum();
    assert_eq!(wal.size_bytes(), bytes_in);
    assert_eq!(wal.config().sync_mode, SyncMode::OsCacheFlush);

    let listed = get(addr, "/v1/topics").await;
    assert_eq!(listed.status, 200);
    let expected_topic = json!({
        "name": "/e1/t",
        "intent": null,
        "delivery": "NonReliable",
        "wal_sync_mode": "os_cache_flush",
        "persistence": "wal",
        "implicit": true,
        "high_water_mark": 5,
        "log_start_offset": 0,
        "acknowledged_offset": 0,
        "archived_offset": 0,
        "retain_until": "archived",
        "backlog_records": 5,
        "backlog_bytes": bytes_in,
        "wal_bytes": bytes_in,
        "disk_used_bytes": bytes_in,
        "disk_budget_bytes": null,
        "full_policy": "refuse",
        "ring_capacity_records": null,
        "records_in": 5,
        "bytes_in": bytes_in,
        "refused_records": 0,
        "dropped_records": 0,
        "dropped_segments": 0,
        "recent_dropped_ranges": [],
        "disk_full_records": 0,
        "wal_reopens": 0,
        "wal_fault": null,
        "damaged_ranges": [],
    });
    assert_eq!(
        listed.body,
        json!({
            "edge_id": "e1",
            "disk_budget_bytes": null,
            "disk_used_bytes": bytes_in,
            "topics": [expected_topic.clone()],
        })
    );
    let one = get(addr, "/v1/topics/e1/t").await;
    assert_eq!(one.body, expected_topic);

    let health = get(addr, "/health").await;
    assert_eq!(health.status, 200);
    assert_eq!(
        health.body,
        json!({"status": "ok", "edge_id": "e1", "topics": 1, "faults": [], "damaged": [],
               "replication": {"state": "not_configured", "connected_broker": null,
                               "last_error": null, "last_error_age_ms": null, "stalled_for_ms": null,
                               "unhealthy_after_ms": null, "stalls": [],
                               "topics": [{"topic": "/e1/t",
                               "high_water_mark": 5, "acknowledged_offset": 0,
                               "lag_records": 5, "stopped": null}],
                               "cluster_id": null}})
    );

    let metrics = get(addr, "/metrics").await;
    assert_eq!(metrics.status, 200);
    for line in [
        "tributary_edge_records_in_total{edge=\"e1\",topic=\"/e1/t\"} 5".to_owned(),
        format!("tributary_edge_bytes_in_total{{edge=\"e1\",topic=\"/e1/t\"}} {bytes_in}"),
        format!("tributary_edge_backlog_bytes{{edge=\"e1\",topic=\"/e1/t\"}} {bytes_in}"),
        "tributary_edge_high_water_mark{edge=\"e1\",topic=\"/e1/t\"} 5".to_owned(),
        "tributary_edge_dropped_records_total{edge=\"e1\",topic=\"/e1/t\",reason=\"drop_oldest\"} 0".to_owned(),
        format!("tributary_edge_disk_used_bytes{{edge=\"e1\"}} {bytes_in}"),
    ] {
        assert!(
            metrics.text.lines().any(|l| l == line),
            "missing {line:?}:\n{}",
            metrics.text
        );
    }

    // The broker acknowledges: the checkpoint rises, the backlog shrinks.
    let outcome = agent
        .topics()
        .on_acknowledged(&name("/e1/t"), 4)
        .await
        .unwrap();
    assert_eq!(outcome.acknowledged_offset, 4);
    assert_eq!(outcome.deleted_segments, []); // everything is in the active segment
    assert_eq!(topic.stats().backlog_records, 1);
    let err = agent
        .topics()
        .on_acknowledged(&name("/e1/t"), 6)
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "topic /e1/t: acknowledged offset 6 is past the high-water mark 5"
    );
    assert_eq!(agent.topics().flush_checkpoints().await.unwrap(), 1);
    assert_eq!(agent.topics().flush_checkpoints().await.unwrap(), 0);
    let stored: Option<u64> = agent
        .topics()
        .store()
        .get_as(&keys::edge::checkpoint(&name("/e1/t")))
        .await
        .unwrap();
    assert_eq!(stored, Some(4));
    drop((topic, wal));
    agent.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_keeps_offsets_settings_and_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.topics = vec![topic("/e1/jobs", StreamIntent::TaskQueue)];
    let agent = start(cfg.clone()).await;
    let addr = agent.local_addr();
    for i in 0..3 {
        let r = post(
            addr,
            "/v1/topics/e1/jobs/records",
            &[],
            format!("job{i}").as_bytes(),
        )
        .await;
        assert_eq!(r.body["base_offset"], json!(i), "{}", r.text);
    }
    let r = post(
        addr,
        "/v1/topics/e1/auto/batch",
        &[],
        b"{\"value\":\"x\"}\n{\"value\":\"y\"}\n",
    )
    .await;
    assert_eq!(r.body["next_offset"], json!(2), "{}", r.text);
    let jobs = agent.topics().topic(&name("/e1/jobs")).unwrap();
    assert_eq!(jobs.wal().unwrap().config().sync_mode, SyncMode::FsyncBatch);
    assert_eq!(
        jobs.settings().intent.as_ref().unwrap().intent,
        StreamIntent::TaskQueue
    );
    agent
        .topics()
        .on_acknowledged(&name("/e1/jobs"), 2)
        .await
        .unwrap();
    drop(jobs);
    agent.shutdown().await.unwrap();

    // The topic is no longer configured: its stored settings still apply.
    let agent = start(config(dir.path())).await;
    let addr = agent.local_addr();
    let jobs = agent
        .topics()
        .topic(&name("/e1/jobs"))
        .expect("reopened from the store");
    assert_eq!(jobs.wal().unwrap().config().sync_mode, SyncMode::FsyncBatch);
    assert_eq!(jobs.acknowledged_offset(), 2);
    assert!(!jobs.is_implicit());
    let auto = agent.topics().topic(&name("/e1/auto")).unwrap();
    assert_eq!(
        auto.wal().unwrap().config().sync_mode,
        SyncMode::OsCacheFlush
    );
    assert!(auto.is_implicit());
    assert_eq!(auto.acknowledged_offset(), 0);
    let r = post(addr, "/v1/topics/e1/jobs/records", &[], b"job3").await;
    assert_eq!(
        r.body,
        json!({"topic": "/e1/jobs", "base_offset": 3, "next_offset": 4, "count": 1})
    );
    let r = post(addr, "/v1/topics/e1/auto/records", &[], b"z").await;
    assert_eq!(r.body["base_offset"], json!(2));
    let values: Vec<_> = read_wal(&agent, "/e1/jobs", 0)
        .into_iter()
        .map(|(o, r)| (o, r.value))
        .collect();
    assert_eq!(
        values,
        [
            (0, Bytes::from_static(b"job0")),
            (1, Bytes::from_static(b"job1")),
            (2, Bytes::from_static(b"job2")),
            (3, Bytes::from_static(b"job3")),
        ]
    );
    let listed = get(addr, "/v1/topics").await;
    let names: Vec<_> = listed.body["topics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["name"].clone(),
                t["intent"].clone(),
                t["wal_sync_mode"].clone(),
            )
        })
        .collect();
    assert_eq!(
        names,
        [
            (json!("/e1/auto"), json!(null), json!("os_cache_flush")),
            (json!("/e1/jobs"), json!("task_queue"), json!("fsync_batch")),
        ]
    );
    drop((jobs, auto));
    agent.shutdown().await.unwrap();

    // A configured intent that contradicts the stored one stops the start.
    let mut conflicting = config(dir.path());
    conflicting.topics = vec![topic("/e1/jobs", StreamIntent::AuditLog)];
    let err = Agent::start(conflicting).await.unwrap_err();
    assert!(
        matches!(
            err,
            AgentError::Open(OpenError::IntentConflict { index: 0, .. })
        ),
        "{err:?}"
    );
    let message = err.to_string();
    assert!(
        message
            .starts_with("topics[0].intent: topic /e1/jobs already exists with different settings"),
        "{message}"
    );
    assert!(
        message.contains("task_queue") && message.contains("audit_log"),
        "{message}"
    );

    // /e1/auto was created by a publish: it has no intent to configure
    // again, and the message says what to do instead.
    let mut late = config(dir.path());
    late.topics = vec![topic("/e1/auto", StreamIntent::EventStream)];
    let message = Agent::start(late).await.unwrap_err().to_string();
    assert!(
        message.starts_with("topics[0].intent: ")
            && message
                .contains("a topic created by a publish has none: leave it out of [[topics]]"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn realtime_ring_drops_oldest_and_counts() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    let mut hb = topic("/e1/hb", StreamIntent::Realtime);
    hb.realtime_ring_records = Some(3);
    cfg.topics = vec![hb];
    let agent = start(cfg.clone()).await;
    let addr = agent.local_addr();
    let body = (0..5)
        .map(|i| format!("{{\"value\":\"v{i}\"}}\n"))
        .collect::<String>();
    let r = post(addr, "/v1/topics/e1/hb/batch", &[], body.as_bytes()).await;
    assert_eq!(
        r.body,
        json!({"topic": "/e1/hb", "base_offset": 0, "next_offset": 5, "count": 5})
    );
    let r = post(addr, "/v1/topics/e1/hb/records", &[], b"v5").await;
    assert_eq!(r.body["base_offset"], json!(5));
    let hb = agent.topics().topic(&name("/e1/hb")).unwrap();
    assert!(hb.wal().is_none());
    let ring = hb.ring().unwrap();
    let read = ring.read(0, 10);
    assert_eq!(read.base_offset, 3);
    let values: Vec<_> = read.records.iter().map(|r| r.value.clone()).collect();
    assert_eq!(
        values,
        ["v3", "v4", "v5"].map(|v| Bytes::from(v.as_bytes()))
    );
    let stats = get(addr, "/v1/topics/e1/hb").await.body;
    for (field, value) in [
        ("intent", json!("realtime")),
        ("persistence", json!("in_memory")),
        ("wal_sync_mode", json!("async")),
        ("high_water_mark", json!(6)),
        ("log_start_offset", json!(3)),
        ("backlog_records", json!(3)),
        ("backlog_bytes", json!(6)),
        ("dropped_records", json!(3)),
        ("ring_capacity_records", json!(3)),
        ("records_in", json!(6)),
        ("full_policy", json!(null)),
        ("disk_used_bytes", json!(0)),
    ] {
        assert_eq!(stats[field], value, "{field}: {stats}");
    }
    let metrics = get(addr, "/metrics").await.text;
    assert!(
        metrics.lines().any(|l| l
            == "tributary_edge_dropped_records_total{edge=\"e1\",topic=\"/e1/hb\",reason=\"ring_full\"} 3"),
        "{metrics}"
    );
    // A ring is never replicated: no replication lag in /health (it showed
    // the ring's records as a lag that never went down).
    let health = get(addr, "/health").await.body;
    assert_eq!(health["replication"]["topics"], json!([]), "{health}");
    // Acknowledged records leave the ring; nothing is written to disk.
    let outcome = agent
        .topics()
        .on_acknowledged(&name("/e1/hb"), 5)
        .await
        .unwrap();
    assert_eq!(outcome.released_records, 2);
    assert_eq!(ring.stats().len_records, 1);
    assert!(
        !dir.path()
            .join("topics/e1/hb/00000000000000000000.log")
            .exists()
    );
    drop(hb);
    agent.shutdown().await.unwrap();

    // A clean restart continues the offsets (ring.json).
    let agent = start(cfg).await;
    let r = post(agent.local_addr(), "/v1/topics/e1/hb/records", &[], b"v6").await;
    assert_eq!(r.body["base_offset"], json!(6), "{}", r.text);
    let hb = agent.topics().topic(&name("/e1/hb")).unwrap();
    assert_eq!(hb.acknowledged_offset(), 5);
    assert_eq!(hb.ring().unwrap().stats().dropped_records, 0);
    drop(hb);
    agent.shutdown().await.unwrap();
}

/// What, path, request headers, body, expected status, expected start of
/// the error message.
type BadInput<'a> = (
    &'a str,
    &'a str,
    Vec<(&'a str, &'a str)>,
    Vec<u8>,
    u16,
    &'a str,
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bad_input_gets_its_status_and_stores_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.limits = small_limits();
    cfg.max_topics = 2;
    let agent = start(cfg).await;
    let addr = agent.local_addr();
    let r = post(addr, "/v1/topics/e1/t/records", &[], b"first").await;
    assert_eq!(r.status, 200);

    let big_value = vec![b'x'; 1000];
    let big_line = format!("{{\"value\":\"{}\"}}\n", "y".repeat(1020));
    let many_lines = (0..10)
        .map(|_| format!("{{\"value\":\"{}\"}}\n", "z".repeat(300)))
        .collect::<String>();
    let huge_body = vec![b' '; 4 * 2048 + 1];
    let cases: Vec<BadInput> = vec![
        (
            "bad topic name",
            "/v1/topics/e1/bad%20name/records",
            vec![],
            b"v".to_vec(),
            400,
            "topic: ",
        ),
        (
            "key that is not UTF-8",
            "/v1/topics/e1/t/records?key=%FF%FE",
            vec![],
            b"v".to_vec(),
            400,
            "key: not valid UTF-8 once percent-decoded",
        ),
        (
            "key that is not UTF-8, its name percent-encoded",
            "/v1/topics/e1/t/records?%6Bey=%FF",
            vec![],
            b"v".to_vec(),
            400,
            "key: not valid UTF-8 once percent-decoded",
        ),
        (
            "wrong namespace",
            "/v1/topics/other/t/records",
            vec![],
            b"v".to_vec(),
            403,
            "topic /other/t is outside this edge's namespace \"e1\": edge \"e1\" may only write to /e1/...",
        ),
        (
            "wrong namespace, batch",
            "/v1/topics/other/t/batch",
            vec![],
            b"{\"value\":\"v\"}".to_vec(),
            403,
            "topic /other/t is outside",
        ),
        (
            "bad JSON line",
            "/v1/topics/e1/t/batch",
            vec![],
            b"{\"value\":\"a\"}\n{\"value\": \n".to_vec(),
            400,
            "line 2: value: EOF while parsing a value (column 10)",
        ),
        (
            "missing value",
            "/v1/topics/e1/t/batch",
            vec![],
            b"{\"key\":\"k\"}".to_vec(),
            400,
            "line 1: value: missing: give `value` (UTF-8 text) or `value_b64` (base64)",
        ),
        (
            "bad base64",
            "/v1/topics/e1/t/batch",
            vec![],
            b"{\"value\":\"ok\"}\n{\"value_b64\":\"%%%\"}".to_vec(),
            400,
            "line 2: value_b64: not valid standard base64",
        ),
        (
            "unknown line field",
            "/v1/topics/e1/t/batch",
            vec![],
            b"{\"value\":\"a\",\"colour\":\"red\"}".to_vec(),
            400,
            "line 1: colour: unknown field `colour`, expected one of `value`, `value_b64`, `key`, `key_b64`, `headers`, `timestamp_ms`, `producer_id`, `sequence` (column 21)",
        ),
        (
            "empty batch",
            "/v1/topics/e1/t/batch",
            vec![],
            b"\n\n".to_vec(),
            400,
            "body: no records",
        ),
        (
            "oversized record",
            "/v1/topics/e1/t/records",
            vec![],
            vec![b'x'; 1025],
            413,
            "max_record_bytes exceeded: the record value is over 1024 bytes",
        ),
        (
            "record over the limit after framing",
            "/v1/topics/e1/t/records?key=kkkkkkkkkkkkkkkkkkkkkkkkkkkkk",
            vec![],
            big_value,
            413,
            "max_record_bytes exceeded: 1035 > 1024",
        ),
        (
            "oversized record in a batch",
            "/v1/topics/e1/t/batch",
            vec![],
            format!("{{\"value\":\"a\"}}\n{big_line}").into_bytes(),
            413,
            "line 2: max_record_bytes exceeded: 1026 > 1024",
        ),
        (
            "batch over max_batch_bytes",
            "/v1/topics/e1/t/batch",
            vec![],
            many_lines.into_bytes(),
            413,
            "max_batch_bytes exceeded",
        ),
        (
            "body over 4 x max_batch_bytes",
            "/v1/topics/e1/t/batch",
            vec![],
            huge_body,
            413,
            "max_batch_bytes exceeded: the request body is over 8192 bytes (4 × max_batch_bytes of 2048)",
        ),
        (
            "unknown query parameter",
            "/v1/topics/e1/t/records?kye=x",
            vec![],
            b"v".to_vec(),
            400,
            "query: Failed to deserialize query string: kye: unknown field `kye`, expected `key` or `timestamp_ms`",
        ),
        (
            "query on a batch",
            "/v1/topics/e1/t/batch?key=x",
            vec![],
            b"{\"value\":\"a\"}".to_vec(),
            400,
            "query: ",
        ),
        (
            "negative timestamp",
            "/v1/topics/e1/t/records?timestamp_ms=-5",
            vec![],
            b"v".to_vec(),
            400,
            "timestamp_ms: must be ms since the Unix epoch, from 0 (1970-01-01) to 253402300799999 (9999-12-31T23:59:59.999Z); got -5",
        ),
        (
            "timestamp past year 9999",
            "/v1/topics/e1/t/records?timestamp_ms=9223372036854775807",
            vec![],
            b"v".to_vec(),
            400,
            "timestamp_ms: must be ms since the Unix epoch, from 0 (1970-01-01) to 253402300799999 (9999-12-31T23:59:59.999Z); got 9223372036854775807",
        ),
        (
            "timestamp not a number",
            "/v1/topics/e1/t/records?timestamp_ms=soon",
            vec![],
            b"v".to_vec(),
            400,
            "query: ",
        ),
        (
            "empty record header name",
            "/v1/topics/e1/t/records",
            vec![("x-trib-h-", "v")],
            b"v".to_vec(),
            400,
            "header x-trib-h-: the record header name after x-trib-h- is empty",
        ),
        (
            "too many topics",
            "/v1/topics/e1/third/records",
            vec![],
            b"v".to_vec(),
            403,
            "topic /e1/third cannot be created: the agent has 2 topics, max_topics = 2",
        ),
    ];
    // A second topic fills max_topics.
    assert_eq!(
        post(addr, "/v1/topics/e1/second/records", &[], b"v")
            .await
            .status,
        200
    );
    for (what, path, headers, body, status, message) in cases {
        let r = post(addr, path, &headers, &body).await;
        assert_eq!(r.status, status, "{what}: {}", r.text);
        assert!(
            r.error().starts_with(message),
            "{what}: {:?} does not start with {message:?}",
            r.error()
        );
    }
    // Details of a few bodies.
    let r = post(
        addr,
        "/v1/topics/e1/t/batch",
        &[],
        b"{\"value\":\"ok\"}\n{\"value_b64\":\"%%%\"}",
    )
    .await;
    assert_eq!(
        (
            r.body["kind"].clone(),
            r.body["line"].clone(),
            r.body["field"].clone()
        ),
        (json!("invalid_input"), json!(2), json!("value_b64"))
    );
    let r = post(addr, "/v1/topics/e1/t/records", &[], &vec![b'x'; 1025]).await;
    assert_eq!(
        (
            r.body["kind"].clone(),
            r.body["limit"].clone(),
            r.body["limit_bytes"].clone()
        ),
        (json!("too_large"), json!("max_record_bytes"), json!(1024))
    );

    for (path, status, message) in [
        ("/v1/topics/e1/nope", 404, "topic /e1/nope does not exist"),
        ("/v1/topics/other/nope", 403, "topic /other/nope is outside"),
        ("/v2/anything", 404, "no route for GET /v2/anything"),
        (
            "/v1/topics/e1/t/records",
            405,
            "method GET is not allowed on /v1/topics/e1/t/records",
        ),
    ] {
        let r = get(addr, path).await;
        assert_eq!(r.status, status, "{path}: {}", r.text);
        assert!(r.error().starts_with(message), "{path}: {}", r.error());
    }

    // Nothing of the refused requests was stored.
    let stored = read_wal(&agent, "/e1/t", 0);
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].1.value, Bytes::from_static(b"first"));
    assert_eq!(agent.topics().topics().len(), 2);
    assert!(!dir.path().join("topics/other").exists());
    assert!(!dir.path().join("topics/e1/third").exists());
    agent.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishing_after_shutdown_began_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let agent = start(config(dir.path())).await;
    let manager = agent.topics().clone();
    manager
        .publish(&name("/e1/t"), vec![record(b"a")])
        .await
        .unwrap();
    agent.shutdown().await.unwrap();
    let err = manager
        .publish(&name("/e1/t"), vec![record(b"b")])
        .await
        .unwrap_err();
    assert_eq!(err.to_string(), "the agent is shutting down");
    let topic = manager.topic(&name("/e1/t")).unwrap();
    let err = topic.publish(vec![record(b"b")]).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "topic /e1/t is closed: the agent is shutting down"
    );
}

#[tokio::test]
async fn percent_encoded_utf8_keys_are_stored_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let agent = start(config(dir.path())).await;
    let addr = agent.local_addr();
    // é, then an encoded U+FFFD (valid UTF-8, sent on purpose), then a
    // form-encoded space.
    let r = post(
        addr,
        "/v1/topics/e1/t/records?key=caf%C3%A9%EF%BF%BD+x",
        &[],
        b"v",
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let stored = read_wal(&agent, "/e1/t", 0);
    assert_eq!(stored.len(), 1);
    assert_eq!(
        stored[0].1.key.as_deref(),
        Some("caf\u{e9}\u{FFFD} x".as_bytes())
    );
    agent.shutdown().await.unwrap();
}

/// `Agent::shutdown` returns only once every task that held the topic
/// manager (and so the metadata store and the WALs) has ended, with API
/// connections open (idle keep-alive ones, left to the server to close):
/// nothing holds the manager afterwards and the store opens again at once,
/// round after round. (Under load a restart once failed with
/// `DatabaseAlreadyOpen`: an API connection task still held the manager.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_leaves_no_handle_on_the_store_with_api_connections_open() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.topics = vec![topic("/e1/jobs", StreamIntent::TaskQueue)];
    let store_path = dir.path().join(tributary_edge::agent::METADATA_FILE);
    for round in 0..20u64 {
        let agent = start(cfg.clone()).await;
        let url = format!("http://{}/v1/topics/e1/jobs/records", agent.local_addr());
        // One client, pooling its connections: they stay open after the
        // requests.
        let client = ureq::Agent::new_with_config(
            ureq::Agent::config_builder()
                .http_status_as_error(false)
                .build(),
        );
        let requests: Vec<_> = (0..4)
            .map(|_| {
                let (client, url) = (client.clone(), url.clone());
                tokio::task::spawn_blocking(move || {
                    client
                        .post(&url)
                        .send(&b"job"[..])
                        .map(|r| r.status().as_u16())
                })
            })
            .collect();
        for request in requests {
            assert_eq!(request.await.unwrap().unwrap(), 200);
        }
        // What the server's connection tasks hold, a copy of the router
        // each, holds no strong handle on the manager: whenever those
        // tasks finish dropping it, the store is not theirs to close.
        let holders = std::sync::Arc::strong_count(agent.topics());
        let routers: Vec<_> = (0..3)
            .map(|_| tributary_edge::api::router(agent.topics()))
            .collect();
        assert_eq!(std::sync::Arc::strong_count(agent.topics()), holders);
        let manager = std::sync::Arc::downgrade(agent.topics());
        agent.shutdown().await.unwrap();
        assert_eq!(
            manager.strong_count(),
            0,
            "round {round}: the topic manager is still held after shutdown"
        );
        let store = broker_core::metadata::redb::RedbStore::open(
            &store_path,
            std::sync::Arc::new(broker_core::clock::SystemClock),
        );
        assert!(
            store.is_ok(),
            "round {round}: the metadata store is still open: {:?}",
            store.err()
        );
        drop((client, routers));
    }
}
