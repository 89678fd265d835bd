//! Certificate enrollment and rotation with the real binaries on
//! 127.0.0.1 (a broker with an HTTPS admin API and `[enroll]`, `tribctl`,
//! `edge-agent enroll` and `edge-agent run`):
//! - a good token enrolls the edge (key 0600 made on the device, the
//!   certificate for that key and the token's edge id), which then
//!   replicates; a used, an expired and an unknown token are refused with
//!   their reason and nothing is written; a bad CSR is refused and leaves
//!   the token usable; of four concurrent uses of one token exactly one
//!   succeeds;
//! - rotation under load: the running agent, revoked, gets a new
//!   certificate from `edge-agent enroll` and picks it up from the changed
//!   files (and again on SIGHUP) without a restart, and the broker holds
//!   every record published throughout exactly once.

use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use broker_core::tls::{TlsIdentity, TlsPaths, load_certs};
use serde_json::Value;
use tributary_test_support::process::wait_until;
use tributary_tests::cluster::read_wal;
use tributary_tests::enroll::{EDGE, EnrollBroker, EnrollingEdge, TOPIC, text};
use tributary_tests::fleet::{edge_get, edge_offsets, ndjson, publish_ndjson, wait_acknowledged};

/// The serial number (hex, as `edge-agent enroll` prints it) of the
/// certificate in `path`.
fn serial(path: &std::path::Path) -> String {
    use x509_parser::prelude::{FromDer, X509Certificate};
    let der = load_certs(path).expect("certificate").remove(0);
    let (_, cert) = X509Certificate::from_der(der.as_ref()).expect("x509");
    cert.raw_serial_as_string().replace(':', "")
}

fn paths(edge: &EnrollingEdge) -> TlsPaths {
    TlsPaths {
        cert: edge.cert.clone(),
        key: edge.key.clone(),
        ca: edge.ca.clone(),
    }
}

#[test]
fn enrollment_with_a_good_a_used_an_expired_and_an_unknown_token() {
    let dir = tempfile::tempdir().unwrap();
    let mut broker = EnrollBroker::new(dir.path());
    broker.start();
    let device = EnrollingEdge::new(dir.path(), "device", broker.ingest, "");

    // No token for an id the system keeps (an edge writes to the namespace
    // of its id), nor for one dev certificates refuse (a '.', over 63
    // bytes): one rule for every new edge id.
    let long = "e".repeat(64);
    for bad in ["_system", "default", "a.b", long.as_str()] {
        let out = broker.tribctl(&["edges", "token", bad, "--ttl", "10m"]);
        assert_eq!(out.status.code(), Some(1), "{bad}");
        let stderr = text(&out.stderr);
        assert!(
            stderr.contains("cannot be an edge id") && stderr.contains(bad),
            "{stderr}"
        );
    }
    let longest = "e".repeat(63);
    assert!(broker.mint(&longest, "10m").starts_with("trib-enroll."));

    // A good token: key made on the device, certificate of the token's
    // edge for that key, the CA copied to tls.ca.
    let token = broker.mint(EDGE, "10m");
    assert!(token.starts_with("trib-enroll.plant1."), "{token}");
    let out = device.enroll(broker.admin, &token, &broker.ca());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.starts_with(&format!(
            "enrolled edge plant1: certificate {} (serial {}, valid until ",
            device.cert.display(),
            serial(&device.cert)
        )),
        "{stdout}"
    );
    assert!(
        stdout.ends_with(&format!(
            "), key {}\nCA: {}\n",
            device.key.display(),
            device.ca.display()
        )),
        "{stdout}"
    );
    assert_eq!(device.tls_files(), ["ca.pem", "plant1.key", "plant1.pem"]);
    let mode = std::fs::metadata(&device.key).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    // Loads as the agent loads it: the key is the certificate's.
    let identity = TlsIdentity::load(&paths(&device)).expect("enrolled pair");
    assert_eq!(identity.identity().as_deref(), Some(EDGE));
    assert_eq!(
        std::fs::read(&device.ca).unwrap(),
        std::fs::read(broker.ca()).unwrap()
    );

    // The enrolled edge replicates: 100 records acknowledged by the broker.
    let log = dir.path().join("edge.log");
    let mut agent = device.agent(&log);
    agent.start();
    wait_until("edge API", Duration::from_secs(30), || {
        edge_get(device.api, "/health").is_some()
    });
    assert_eq!(
        publish_ndjson(device.api, TOPIC, ndjson("e", 0, 100)),
        Ok((0, 100))
    );
    wait_acknowledged(device.api, TOPIC, 100, Duration::from_secs(30));

    // Each refusal: exit 1, the broker's reason, nothing written on the
    // second device.
    let refused = |name: &str, token: &str, reason: &str| {
        let other = EnrollingEdge::new(dir.path(), name, broker.ingest, "");
        let out = other.enroll(broker.admin, token, &broker.ca());
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{name}: {stderr}");
        assert!(
            stderr.starts_with(&format!(
                "error: the broker at https://{} refused the enrollment (401): ",
                broker.admin
            )),
            "{name}: {stderr}"
        );
        assert!(stderr.contains(reason), "{name}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(
            other.tls_files().is_empty(),
            "{name}: {:?}",
            other.tls_files()
        );
    };
    refused(
        "used",
        &token,
        "the enrollment token of edge plant1 was already used (at ",
    );
    let short = broker.mint(EDGE, "1s");
    std::thread::sleep(Duration::from_millis(1200));
    refused(
        "expired",
        &short,
        "the enrollment token of edge plant1 expired at ",
    );
    let mut forged = broker.mint(EDGE, "10m");
    let last = if forged.ends_with('0') { "1" } else { "0" };
    forged.replace_range(forged.len() - 1.., last);
    refused(
        "unknown",
        &forged,
        "unknown enrollment token: mint one with",
    );
    // The first device's files are untouched by all that.
    assert_eq!(
        TlsIdentity::load(&paths(&device))
            .unwrap()
            .identity()
            .as_deref(),
        Some(EDGE)
    );

    // A bad CSR is refused (400 invalid_csr) and changes nothing: the same
    // token then enrolls.
    let fresh = broker.mint(EDGE, "10m");
    let agent_https = tributary_test_support::certs::https_agent(&broker.certs);
    let mut response = agent_https
        .post(&format!("https://{}/v1/enroll", broker.admin))
        .header("Authorization", &format!("Bearer {fresh}"))
        .header("Content-Type", "application/json")
        .send(r#"{"csr": "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n"}"#)
        .expect("POST /v1/enroll");
    assert_eq!(response.status().as_u16(), 400);
    let body: Value = response.body_mut().read_json().unwrap();
    assert_eq!(body["kind"], "invalid_csr", "{body}");
    assert_eq!(
        body["error"],
        "csr: not a PEM certificate signing request (-----BEGIN CERTIFICATE REQUEST-----)"
    );
    let second = EnrollingEdge::new(dir.path(), "second", broker.ingest, "");
    let out = second.enroll(broker.admin, &fresh, &broker.ca());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));

    // Four devices race with one token: exactly one certificate.
    let racing = broker.mint(EDGE, "10m");
    let racers: Vec<EnrollingEdge> = (0..4)
        .map(|i| EnrollingEdge::new(dir.path(), &format!("race-{i}"), broker.ingest, ""))
        .collect();
    let outcomes: Vec<std::process::Output> = std::thread::scope(|s| {
        let handles: Vec<_> = racers
            .iter()
            .map(|r| {
                let (admin, ca, token) = (broker.admin, broker.ca(), racing.clone());
                s.spawn(move || r.enroll(admin, &token, &ca))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let winners = outcomes.iter().filter(|o| o.status.success()).count();
    assert_eq!(winners, 1, "{outcomes:?}");
    for (racer, out) in racers.iter().zip(&outcomes) {
        if out.status.success() {
            assert_eq!(racer.tls_files(), ["ca.pem", "plant1.key", "plant1.pem"]);
        } else {
            assert!(
                text(&out.stderr)
                    .contains("(401): the enrollment token of edge plant1 was already used"),
                "{}",
                text(&out.stderr)
            );
            assert!(racer.tls_files().is_empty(), "{:?}", racer.tls_files());
        }
    }

    assert_eq!(agent.terminate(), Some(0));
    assert_eq!(broker.broker.terminate(), Some(0));
    let central = read_wal(&broker.data.join("topics/plant1/readings"));
    assert_eq!(central.len(), 100);
}

/// Whether `log` has a line with every one of `parts`.
fn logged(log: &std::path::Path, parts: &[&str]) -> bool {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .any(|line| parts.iter().all(|p| line.contains(p)))
}

#[test]
fn certificate_rotation_under_load_loses_and_duplicates_no_record() {
    let dir = tempfile::tempdir().unwrap();
    let mut broker = EnrollBroker::new(dir.path());
    broker.start();
    let device = EnrollingEdge::new(dir.path(), "device", broker.ingest, "");
    let out = device.enroll(broker.admin, &broker.mint(EDGE, "10m"), &broker.ca());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let first_serial = serial(&device.cert);
    let log = dir.path().join("edge.log");
    let mut agent = device.agent(&log);
    agent.start();
    let pid = agent.pid().expect("running");
    wait_until("edge API", Duration::from_secs(30), || {
        edge_get(device.api, "/health").is_some()
    });

    // Load: 20 records every 10 ms until told to stop; every publish must
    // succeed, whatever the link does.
    let stop = Arc::new(AtomicBool::new(false));
    let published = Arc::new(AtomicU64::new(0));
    let producer = {
        let (stop, published, api) = (stop.clone(), published.clone(), device.api);
        std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(120);
            let mut next = 0;
            while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                let (base, end) =
                    publish_ndjson(api, TOPIC, ndjson("r", next, 20)).expect("publish");
                assert_eq!(base, next);
                next = end;
                published.store(next, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(10));
            }
            next
        })
    };
    wait_until(
        "replication with the first certificate",
        Duration::from_secs(30),
        || edge_offsets(device.api, TOPIC).is_some_and(|(_, acked)| acked >= 200),
    );

    // Revoked: the broker closes the connection and refuses the first
    // certificate from now on; records pile up on the device.
    let out = broker.tribctl(&["edges", "revoke", EDGE]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    wait_until(
        "the edge sees its revocation",
        Duration::from_secs(15),
        || {
            edge_get(device.api, "/health").is_some_and(|h| {
                h["replication"]["last_error"]
                    .as_str()
                    .is_some_and(|e| e.contains("edge plant1 is revoked"))
            })
        },
    );
    let stalled = edge_offsets(device.api, TOPIC).expect("offsets").1;

    // A new certificate by enrollment, written while the agent runs: the
    // agent loads it from the changed files and reconnects with it.
    let out = device.enroll(broker.admin, &broker.mint(EDGE, "10m"), &broker.ca());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_ne!(serial(&device.cert), first_serial);
    wait_until(
        "the new certificate loaded",
        Duration::from_secs(15),
        || logged(&log, &["TLS certificate reloaded", "file change"]),
    );
    wait_until(
        "replication with the new certificate",
        Duration::from_secs(60),
        || edge_offsets(device.api, TOPIC).is_some_and(|(_, acked)| acked > stalled + 200),
    );
    // SIGHUP reloads too (and does not stop the agent).
    let hup = std::process::Command::new("kill")
        .args(["-HUP", &pid.to_string()])
        .status()
        .expect("kill -HUP");
    assert!(hup.success());
    wait_until("reloaded on SIGHUP", Duration::from_secs(15), || {
        logged(&log, &["TLS certificate reloaded", "SIGHUP"])
    });
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let total = producer.join().expect("producer");
    assert!(total > stalled, "published {total}, stalled at {stalled}");
    wait_acknowledged(device.api, TOPIC, total, Duration::from_secs(60));

    // One agent process all along, one WAL start.
    assert_eq!(agent.pid(), Some(pid));
    let started = std::fs::read_to_string(&log)
        .unwrap()
        .matches("edge agent started")
        .count();
    assert_eq!(started, 1);
    assert!(!logged(&log, &["certificate refused"]), "no refusal logged");
    assert_eq!(agent.terminate(), Some(0));
    assert_eq!(broker.broker.terminate(), Some(0));

    // The broker holds every record once, at its edge offset.
    let central = read_wal(&broker.data.join("topics/plant1/readings"));
    assert_eq!(central.len() as u64, total);
    for (i, (offset, value)) in central.iter().enumerate() {
        assert_eq!(*offset, i as u64);
        assert_eq!(
            value.as_ref(),
            format!("r-{i}").as_bytes(),
            "offset {offset}"
        );
    }
}

/// A file enrolling could not replace (here a directory where the
/// certificate goes) is refused before anything is made or sent: the
/// device's key stays as it was and the token stays unused, so the same
/// token enrolls once the path is fixed. (It was refused after the broker
/// had signed: the token spent and the old key already replaced.)
#[test]
fn an_unreplaceable_certificate_path_is_refused_before_the_token_is_spent() {
    let dir = tempfile::tempdir().unwrap();
    let mut broker = EnrollBroker::new(dir.path());
    broker.start();
    let device = EnrollingEdge::new(dir.path(), "device", broker.ingest, "");
    std::fs::create_dir_all(&device.cert).unwrap();
    std::fs::create_dir_all(device.key.parent().unwrap()).unwrap();
    std::fs::write(&device.key, b"the device's old key").unwrap();
    let token = broker.mint(EDGE, "10m");
    let out = device.enroll(broker.admin, &token, &broker.ca());
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&device.cert.display().to_string())
            && stderr.contains("is a directory, not a file; nothing was sent"),
        "{stderr}"
    );
    assert_eq!(std::fs::read(&device.key).unwrap(), b"the device's old key");
    std::fs::remove_dir(&device.cert).unwrap();
    let out = device.enroll(broker.admin, &token, &broker.ca());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let identity = TlsIdentity::load(&paths(&device)).expect("enrolled pair");
    assert_eq!(identity.identity().as_deref(), Some(EDGE));
}
