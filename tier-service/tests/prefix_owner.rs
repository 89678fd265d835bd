//! The archive prefix's owner (`docs/archive-format.md`, "Prefix owner"),
//! with the real `tier-service` binary against the stand-in broker of
//! `common` (the real admin router over a redb store, real WALs) and a
//! local-directory bucket:
//! - the first start claims the prefix (owner object with the cluster id);
//!   a restart of the same cluster goes on;
//! - an owner object naming another cluster, or a garbled one: the service
//!   refuses to start, and not one byte in the bucket changes;
//! - an archive from before the owner object (objects, no owner object) is
//!   adopted; a broker without a cluster id leaves the prefix unchecked;
//! - `check-config` gives the same verdict, read only.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Output;

use broker_core::metadata::MetadataStore;
use common::{Harness, TOKEN};
use tributary_proto::cluster::ClusterId;
use tributary_proto::keys::{StorageKeys, cluster as cluster_keys};

const OURS: &str = "0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9";
const OTHER: &str = "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d";

/// Gives the stand-in broker's cluster the id `id` (`/cluster/id`).
fn set_cluster_id(h: &Harness, id: &str) {
    h.runtime
        .block_on(h.store.put(&cluster_keys::id(), serde_json::json!(id)))
        .unwrap();
}

fn owner_path(h: &Harness) -> PathBuf {
    h.bucket_dir.join(StorageKeys::default().owner_object())
}

fn owner_bytes(id: &str) -> Vec<u8> {
    tributary_tier::owner::encode(ClusterId::parse(id).unwrap())
}

/// Every file under `dir` with its bytes.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                out.insert(path.clone(), std::fs::read(&path).unwrap());
            }
        }
    }
    out
}

fn run(h: &Harness) -> Output {
    h.tier_command().output().unwrap()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn assert_ok(output: &Output) {
    assert!(
        output.status.success(),
        "tier service failed: {}",
        stderr(output)
    );
}

fn descriptor_count(h: &Harness) -> usize {
    h.topics.iter().map(|t| h.descriptors(t).len()).sum()
}

#[test]
fn first_start_claims_the_prefix_and_a_restart_goes_on() {
    let h = Harness::new(&["/default/jobs"]);
    set_cluster_id(&h, OURS);
    h.write(200, 10);
    assert_ok(&run(&h));
    assert_eq!(std::fs::read(owner_path(&h)).unwrap(), owner_bytes(OURS));
    let first = descriptor_count(&h);
    assert!(first > 0);
    h.write(200, 10);
    assert_ok(&run(&h));
    assert_eq!(std::fs::read(owner_path(&h)).unwrap(), owner_bytes(OURS));
    assert!(descriptor_count(&h) > first, "the restart tiered nothing");
    assert!(h.violations().is_empty(), "{:?}", h.violations());
}

#[test]
fn a_prefix_owned_by_another_cluster_is_refused_untouched() {
    let h = Harness::new(&["/default/jobs"]);
    // The other cluster's archive: its objects and its owner object.
    set_cluster_id(&h, OTHER);
    h.write(200, 10);
    assert_ok(&run(&h));
    assert_eq!(std::fs::read(owner_path(&h)).unwrap(), owner_bytes(OTHER));
    // This cluster, configured with the same bucket and prefix, with
    // sealed segments of its own waiting.
    set_cluster_id(&h, OURS);
    h.write(200, 10);
    let before = snapshot(&h.bucket_dir);
    let descriptors = descriptor_count(&h);
    let output = run(&h);
    assert!(
        !output.status.success(),
        "started on another cluster's prefix"
    );
    let message = stderr(&output);
    for needle in [
        OURS,
        OTHER,
        "cluster-owner.json",
        "prefix /tributary",
        &h.bucket_dir.canonicalize().unwrap().display().to_string(),
        "refusing to start",
        "its own archive",
    ] {
        assert!(message.contains(needle), "{needle:?} not in {message}");
    }
    assert_eq!(snapshot(&h.bucket_dir), before, "the bucket changed");
    assert_eq!(descriptor_count(&h), descriptors, "descriptors changed");
}

#[test]
fn a_garbled_owner_object_is_refused_and_left_as_it_is() {
    let h = Harness::new(&["/default/jobs"]);
    set_cluster_id(&h, OURS);
    h.write(200, 10);
    assert_ok(&run(&h));
    for garbled in [
        &b"{\"format\":1,\"cluster_id\":\"0f1e2d3c"[..],
        b"",
        b"{\"format\":7,\"cluster_id\":\"0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9\"}",
    ] {
        std::fs::write(owner_path(&h), garbled).unwrap();
        h.write(50, 10);
        let before = snapshot(&h.bucket_dir);
        let output = run(&h);
        assert!(
            !output.status.success(),
            "started with a garbled owner object"
        );
        let message = stderr(&output);
        assert!(message.contains("is damaged"), "{message}");
        assert!(message.contains("cluster-owner.json"), "{message}");
        assert_eq!(snapshot(&h.bucket_dir), before, "the bucket changed");
    }
}

#[test]
fn an_archive_from_before_the_owner_object_is_adopted() {
    let h = Harness::new(&["/default/jobs", "/default/other"]);
    // A broker without a cluster id (older, or none committed yet): the
    // prefix is left unchecked and nothing is written there.
    h.write(200, 10);
    assert_ok(&run(&h));
    assert!(!owner_path(&h).exists());
    let before = snapshot(&h.bucket_dir);
    assert!(!before.is_empty());
    // The upgrade: the cluster has an id now; the prefix is claimed and
    // every object stays as it was.
    set_cluster_id(&h, OURS);
    assert_ok(&run(&h));
    assert_eq!(std::fs::read(owner_path(&h)).unwrap(), owner_bytes(OURS));
    let mut after = snapshot(&h.bucket_dir);
    after.remove(&owner_path(&h));
    assert_eq!(after, before, "objects changed on adoption");
}

fn check_config(h: &Harness) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_tier-service"))
        .arg("check-config")
        .arg("--data-dir")
        .arg(&h.data_dir)
        .arg("--bucket")
        .arg(&h.bucket_dir)
        .arg("--broker-url")
        .arg(&h.base_url)
        .arg("--token")
        .arg(TOKEN)
        .arg("--metrics-listen")
        .arg("127.0.0.1:0")
        .env("RUST_LOG", "off")
        .env_remove("TRIB_TIER_CONFIG")
        .env_remove("TRIB_TIER_TOKEN")
        .env_remove("TRIB_ADMIN_TOKEN")
        .output()
        .unwrap()
}

#[test]
fn check_config_reports_the_owner_read_only() {
    let h = Harness::new(&["/default/jobs"]);
    set_cluster_id(&h, OURS);
    h.write(30, 10);
    // Unclaimed: fine, with a note; nothing written.
    let output = check_config(&h);
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("will claim the prefix"),
        "{}",
        stderr(&output)
    );
    assert!(!owner_path(&h).exists());
    // Another cluster's: the refusal.
    std::fs::create_dir_all(owner_path(&h).parent().unwrap()).unwrap();
    std::fs::write(owner_path(&h), owner_bytes(OTHER)).unwrap();
    let output = check_config(&h);
    assert!(!output.status.success());
    let message = stderr(&output);
    assert!(
        message.contains(OTHER) && message.contains(OURS),
        "{message}"
    );
    assert_eq!(std::fs::read(owner_path(&h)).unwrap(), owner_bytes(OTHER));
    // Ours: ok.
    std::fs::write(owner_path(&h), owner_bytes(OURS)).unwrap();
    let output = check_config(&h);
    assert!(output.status.success(), "{}", stderr(&output));
}
