//! Topic unload (seal, tier, `state` marker) and cold retention (descriptor
//! first, then object; a crash in between), against the stand-in broker of
//! `common` with the real admin router.

mod common;

use std::os::unix::process::ExitStatusExt;

use broker_core::metadata::MetadataStore;
use common::{Harness, TOKEN, assert_contiguous, record_for};
use serde_json::{Value, json};
use tributary_proto::batch::Codec;
use tributary_proto::keys::StorageKeys;
use tributary_tier::faults::Faults;
use tributary_tier::service;

fn post(h: &Harness, path: &str, body: Option<Value>) -> (u16, Value) {
    h.runtime.block_on(async {
        tributary_archive::install_crypto_provider();
        let mut request = reqwest::Client::new()
            .post(format!("{}/v1{path}", h.base_url))
            .bearer_auth(TOKEN);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    })
}

fn run_once(h: &Harness, config: tributary_tier::TierConfig) -> service::RunReport {
    h.runtime
        .block_on(service::run(
            config,
            Faults::none(),
            true,
            std::future::pending(),
        ))
        .unwrap()
}

#[test]
fn unload_seals_the_active_segment_and_writes_the_state_once_all_is_tiered() {
    let h = Harness::new(&["/ns/move"]);
    let topic = h.topics[0].clone();
    h.write(1000, 20);
    // 37 more records in the active segment, not sealed yet.
    let wal = h.wal(&topic);
    h.runtime.block_on(async {
        let records = (1000..1037)
            .map(|o| record_for(topic.as_str(), o))
            .collect();
        wal.append(records, Codec::None).await.unwrap();
    });
    assert_eq!(wal.sealed_segments().last().unwrap().next_offset, 1000);

    // Sealed, but nothing is tiered yet: 202, no marker.
    let (status, body) = post(&h, "/storage/topics/ns/move/unload", None);
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["outcome"], "sealed");
    assert_eq!(body["sealed_offset"], 1037);
    assert_eq!(body["tiered_offset"], Value::Null);
    assert_eq!(wal.sealed_segments().last().unwrap().next_offset, 1037);
    let state_key = StorageKeys::default().topic_state(&topic);
    assert_eq!(h.runtime.block_on(h.store.get(&state_key)).unwrap(), None);

    // The tier service tiers everything, the unload completes.
    let report = run_once(&h, h.tier_config());
    assert!(!report.has_errors(), "{report:?}");
    assert_contiguous(&topic, &h.descriptors(&topic), 0, 1037);
    let (status, body) = post(&h, "/storage/topics/ns/move/unload", None);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["outcome"], "unloaded");
    let state = h
        .runtime
        .block_on(h.store.get(&state_key))
        .unwrap()
        .unwrap();
    assert_eq!(state["sealed"], true);
    assert_eq!(state["last_committed_offset"], 1036);
    assert_eq!(state["next_offset"], 1037);
    assert_eq!(state["broker_id"], 1);
    assert!(state["timestamp"].as_i64().unwrap() > 1_700_000_000_000);
    assert_eq!(body["state"], state);
    // Every local segment went after its commit.
    assert!(wal.sealed_segments().is_empty());
    assert_eq!(h.violations(), Vec::<String>::new());

    // Unloading again is idempotent; bad input gets a clear error.
    let (status, body) = post(&h, "/storage/topics/ns/move/unload", None);
    assert_eq!(
        (status, body["state"]["next_offset"].clone()),
        (200, json!(1037))
    );
    let (status, body) = post(&h, "/storage/topics/ns/has%20space/unload", None);
    assert_eq!(status, 400, "{body}");
    // A topic with no local WAL and nothing tiered unloads at offset 0.
    let (status, body) = post(&h, "/storage/topics/ns/empty/unload", None);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["state"]["next_offset"], 0);
    assert_eq!(body["state"]["last_committed_offset"], Value::Null);
}

#[test]
fn cold_retention_removes_descriptor_then_object_and_survives_a_crash_between() {
    let h = Harness::new(&["/ns/cold"]);
    let topic = h.topics[0].clone();
    h.write(2500, 20);
    // Tier everything first, keeping the archive.
    assert!(!run_once(&h, h.tier_config()).has_errors());
    let descriptors = h.descriptors(&topic);
    assert!(descriptors.len() >= 5, "{}", descriptors.len());
    let total: u64 = descriptors.iter().map(|d| d.size).sum();

    // Record timestamps are from 2023: one day of age keeps only the
    // newest segment. A crash right after the first descriptor is removed:
    // its object is left, below the low mark, and no descriptor points at
    // a missing object.
    let config_path = h.data_dir.join("tier.toml");
    std::fs::write(
        &config_path,
        format!(
            "data_dir = {:?}\n[cold_retention]\nmax_age_ms = 86400000\n",
            h.data_dir.display().to_string()
        ),
    )
    .unwrap();
    let output = h
        .tier_command()
        .arg("--config")
        .arg(&config_path)
        .env("TRIB_TIER_FAULT", "retention_after_descriptor_delete")
        .output()
        .unwrap();
    assert!(output.status.signal().is_some(), "{output:?}");
    let after_crash = h.descriptors(&topic);
    assert_eq!(after_crash, descriptors[1..].to_vec());
    let objects = h.objects(&topic);
    assert!(
        objects.contains_key(&descriptors[0].object_id),
        "left behind"
    );
    for d in &after_crash {
        assert_eq!(objects.get(&d.object_id), Some(&d.size));
    }
    let retired_key = StorageKeys::default().retired(&topic);
    assert_eq!(
        h.runtime.block_on(h.store.get(&retired_key)).unwrap(),
        Some(json!({"below_offset": descriptors[0].next_offset()}))
    );
    // The leftover object can never be committed again.
    let (status, body) = post(
        &h,
        "/storage/descriptors",
        Some(json!({"topic": topic, "descriptor": descriptors[0]})),
    );
    assert_eq!(
        (status, body["kind"].as_str()),
        (409, Some("retired")),
        "{body}"
    );

    // The rerun: reconciliation deletes the leftover, retention removes
    // everything but the newest segment, descriptor and object together.
    let output = h
        .tier_command()
        .arg("--config")
        .arg(&config_path)
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let last = descriptors.last().unwrap();
    assert_eq!(h.descriptors(&topic), vec![last.clone()]);
    assert_eq!(
        h.objects(&topic).into_iter().collect::<Vec<_>>(),
        vec![(last.object_id.clone(), last.size)]
    );
    assert_eq!(
        h.runtime.block_on(h.store.get(&retired_key)).unwrap(),
        Some(json!({"below_offset": last.start_offset}))
    );
    // The newest segment is never removed, and only the oldest may be.
    let (status, body) = h.runtime.block_on(async {
        let response = reqwest::Client::new()
            .delete(format!(
                "{}/v1/storage/topics/ns/cold/segments/{}",
                h.base_url, last.start_offset
            ))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap();
        (
            response.status().as_u16(),
            response.json::<Value>().await.unwrap(),
        )
    });
    assert_eq!(
        (status, body["kind"].as_str()),
        (409, Some("is_cur")),
        "{body}"
    );
    assert!(total > last.size);
}

#[test]
fn cold_retention_by_size_keeps_the_newest_segments_within_the_limit() {
    let h = Harness::new(&["/ns/sized", "/ns/kept"]);
    h.write(2500, 20);
    let mut config = h.tier_config();
    // 300 KB for /ns/sized only; /ns/kept has no limit.
    config.cold_retention = toml::from_str("[topics.\"/ns/sized\"]\nmax_bytes = 300000\n").unwrap();
    let report = run_once(&h, config);
    assert!(!report.has_errors(), "{report:?}");
    let sized = &h.topics[0];
    let kept = &h.topics[1];
    let left = h.descriptors(sized);
    let bytes: u64 = left.iter().map(|d| d.size).sum();
    assert!(bytes <= 300_000, "{bytes}");
    assert!(!left.is_empty());
    assert_eq!(left.last().unwrap().next_offset(), 2500);
    assert_contiguous(sized, &left, left[0].start_offset, 2500);
    assert_eq!(
        report.passes[0].retired.len(),
        h.objects(kept).len() - h.objects(sized).len()
    );
    assert_contiguous(kept, &h.descriptors(kept), 0, 2500);
}
