//! Edge revocation in a three-broker cluster with the real binaries on
//! 127.0.0.1: after `tribctl edges revoke plant1` through broker 1, the
//! replicating edge's connection is closed with the reason, which its
//! `/health` shows as `last_error`; nothing more is acknowledged; and each
//! of the three brokers closes a new connection made with plant1's
//! certificate right after the handshake, with application error code 2
//! and the same reason, within seconds. A broker without `[enroll]`
//! answers an enrollment `503 enrollment_disabled`.

use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use broker_core::tls::{ALPN_REPLICATION, BROKER_SERVER_NAME, TlsIdentity};
use tributary_test_support::process::{bin_path, wait_until};
use tributary_tests::fleet::{
    Fleet, TOKEN, edge_get, edge_offsets, ndjson, publish_ndjson, wait_acknowledged,
};

const TOPIC: &str = "/plant1/readings";

/// What the brokers send a revoked plant1.
const REASON: &str = "edge plant1 is revoked: this certificate was issued before `tribctl edges \
                      revoke plant1`; enroll again with a new token (`tribctl edges token \
                      plant1`, then `edge-agent enroll`)";

/// Connects to `ingest` as `identity` and waits (at most `wait`) for the
/// broker to close the connection: its error code and reason, or `None`
/// if it stayed open.
fn closed_by(ingest: SocketAddr, identity: &TlsIdentity, wait: Duration) -> Option<(u64, String)> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let endpoint = broker_core::tls::client_endpoint(SocketAddr::from(([127, 0, 0, 1], 0)))
            .expect("endpoint");
        let config = identity
            .quic_client(ALPN_REPLICATION)
            .expect("client config");
        let conn = endpoint
            .connect_with(config, ingest, BROKER_SERVER_NAME)
            .expect("connect")
            .await
            .expect("the handshake completes (the refusal comes right after it)");
        let closed = tokio::time::timeout(wait, conn.closed()).await.ok();
        conn.close(0u32.into(), b"test done");
        endpoint.wait_idle().await;
        match closed? {
            quinn::ConnectionError::ApplicationClosed(close) => Some((
                close.error_code.into_inner(),
                String::from_utf8_lossy(&close.reason).into_owned(),
            )),
            other => Some((u64::MAX, other.to_string())),
        }
    })
}

#[test]
fn a_revoked_edge_is_refused_by_all_three_brokers_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let mut fleet = Fleet::new(dir.path(), &[(TOPIC, "event_stream")], "", "");
    fleet.start_all();
    assert_eq!(
        publish_ndjson(fleet.edge_api, TOPIC, ndjson("v", 0, 50)),
        Ok((0, 50))
    );
    wait_acknowledged(fleet.edge_api, TOPIC, 50, Duration::from_secs(90));
    let plant1 = tributary_test_support::certs::edge_identity(&fleet.certs, "plant1");
    // Before the revocation a broker keeps plant1's connection open.
    assert_eq!(
        closed_by(fleet.nodes[2].ingest, &plant1, Duration::from_millis(500)),
        None
    );

    let revoke = Command::new(bin_path("tribctl"))
        .args(["--admin-url", &fleet.nodes[0].url(), "--token", TOKEN])
        .args(["edges", "revoke", "plant1"])
        .env_remove("TRIB_CA")
        .output()
        .expect("tribctl");
    let stdout = String::from_utf8_lossy(&revoke.stdout);
    assert!(
        revoke.status.success(),
        "{}",
        String::from_utf8_lossy(&revoke.stderr)
    );
    assert!(
        stdout.starts_with(
            "revoked edge plant1: every broker refuses its certificates issued up to "
        ),
        "{stdout}"
    );
    let revoked_at = Instant::now();

    // The edge's connection is closed; /health says why.
    wait_until(
        "the edge shows its revocation",
        Duration::from_secs(10),
        || {
            edge_get(fleet.edge_api, "/health").is_some_and(|h| {
                h["replication"]["last_error"]
                    .as_str()
                    .is_some_and(|e| e.contains(REASON))
            })
        },
    );

    // Every broker closes plant1's new connections with code 2 and the
    // reason, within seconds of the revocation.
    for node in &fleet.nodes {
        let refusal = closed_by(node.ingest, &plant1, Duration::from_secs(5));
        assert_eq!(refusal, Some((2, REASON.to_owned())), "broker {}", node.id);
    }
    assert!(revoked_at.elapsed() < Duration::from_secs(20));

    // What the edge publishes now stays on the edge.
    assert_eq!(
        publish_ndjson(fleet.edge_api, TOPIC, ndjson("v", 50, 10)),
        Ok((50, 60))
    );
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(edge_offsets(fleet.edge_api, TOPIC), Some((60, 50)));
    let health = edge_get(fleet.edge_api, "/health").expect("health");
    assert_eq!(health["replication"]["state"], "disconnected", "{health}");
    // The refusal is the last error, seconds old at most (the agent keeps
    // retrying with backoff).
    let replication = &health["replication"];
    assert!(
        replication["last_error"]
            .as_str()
            .is_some_and(|e| e.contains(REASON)),
        "{health}"
    );
    assert!(
        replication["last_error_age_ms"]
            .as_u64()
            .is_some_and(|age| age <= revoked_at.elapsed().as_millis() as u64),
        "{health}"
    );

    // These brokers have no [enroll] CA: they mint and revoke, but sign
    // nothing.
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let mut response = agent
        .post(&format!("{}/v1/enroll", fleet.nodes[1].url()))
        .header(
            "Authorization",
            &format!("Bearer trib-enroll.plant1.{}", "0".repeat(64)),
        )
        .send(r#"{"csr": ""}"#)
        .expect("POST /v1/enroll");
    assert_eq!(response.status().as_u16(), 503);
    let body: serde_json::Value = response.body_mut().read_json().expect("json");
    assert_eq!(body["kind"], "enrollment_disabled", "{body}");
}
