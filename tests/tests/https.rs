//! `tribctl` and the consumer client against a real `broker` binary that
//! serves its admin and consumer API over HTTPS (the default):
//! - with `--ca` (the cluster CA) tribctl lists namespaces and topics;
//! - without `--ca`, an `https://` URL is refused with the flag to pass;
//! - with another CA as `--ca` the handshake fails;
//! - `ConsumerClient::new_with_tls` reads the broker's topics over HTTPS.

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use tributary_api::client::ClientTls;
use tributary_api::consumer_client::ConsumerClient;
use tributary_test_support::ports::{free_tcp, free_udp};
use tributary_test_support::process::{Proc, bin_path, wait_until};

const TOKEN: &str = "https-test-token";

fn tribctl(args: &[&str]) -> Output {
    Command::new(bin_path("tribctl"))
        .args(args)
        .env_remove("TRIB_ADMIN_URL")
        .env_remove("TRIB_ADMIN_TOKEN")
        .env_remove("TRIB_CA")
        .env_remove("TRIB_CLIENT_CERT")
        .env_remove("TRIB_CLIENT_KEY")
        .output()
        .expect("run tribctl")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn write_config(dir: &Path, certs: &Path, admin: std::net::SocketAddr) -> std::path::PathBuf {
    let path = dir.join("broker.toml");
    tributary_tests::solo::write_single_node_https_config(
        &path,
        &dir.join("broker"),
        admin,
        free_udp(),
        certs,
        TOKEN,
        "",
    );
    path
}

#[test]
fn tribctl_with_the_cluster_ca_talks_https_and_without_it_says_to_pass_ca() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    tributary_test_support::certs::issue(&certs, &[1], &[]);
    let admin = free_tcp();
    let config = write_config(dir.path(), &certs, admin);
    let mut command = Command::new(bin_path("broker"));
    command.arg("--config").arg(&config).env("RUST_LOG", "warn");
    let mut broker = Proc::new("broker", command);
    broker.start();
    let url = format!("https://{admin}");
    let ca = certs.join("ca.pem");
    let ca = ca.to_str().unwrap();

    let mut listed = None;
    wait_until(
        "tribctl namespaces list over HTTPS",
        Duration::from_secs(60),
        || {
            let out = tribctl(&[
                "--admin-url",
                &url,
                "--ca",
                ca,
                "--token",
                TOKEN,
                "--output",
                "json",
                "namespaces",
                "list",
            ]);
            let ok = out.status.success();
            listed = Some(out);
            ok
        },
    );
    let listed = listed.unwrap();
    assert!(
        text(&listed.stdout).contains("\"namespaces\""),
        "{}",
        text(&listed.stdout)
    );
    let topics = tribctl(&[
        "--admin-url",
        &url,
        "--ca",
        ca,
        "--token",
        TOKEN,
        "topics",
        "list",
    ]);
    assert!(topics.status.success(), "{}", text(&topics.stderr));

    // No --ca: refused before any request, naming the flag.
    let no_ca = tribctl(&["--admin-url", &url, "--token", TOKEN, "topics", "list"]);
    assert_eq!(no_ca.status.code(), Some(1));
    let stderr = text(&no_ca.stderr);
    assert!(stderr.contains("is HTTPS"), "{stderr}");
    assert!(stderr.contains("--ca"), "{stderr}");

    // Another CA: the broker's certificate is not trusted.
    let other = dir.path().join("other");
    tributary_test_support::certs::issue(&other, &[1], &[]);
    let other_ca = other.join("ca.pem");
    let wrong = tribctl(&[
        "--admin-url",
        &url,
        "--ca",
        other_ca.to_str().unwrap(),
        "--token",
        TOKEN,
        "topics",
        "list",
    ]);
    assert_eq!(wrong.status.code(), Some(1));
    let stderr = text(&wrong.stderr);
    assert!(stderr.contains("invalid peer certificate"), "{stderr}");

    // The consumer client over HTTPS.
    let client = ConsumerClient::new_with_tls(
        &url,
        TOKEN,
        &ClientTls {
            ca: certs.join("ca.pem"),
            client_cert: None,
        },
    )
    .expect("client");
    let topics: serde_json::Value = client
        .get("/v1/topics", &[])
        .expect("GET /v1/topics over HTTPS");
    assert!(topics.get("topics").is_some(), "{topics}");
    broker.kill();
}
