//! The real `tier-service` binary: `check-config` (every problem one
//! line), exit status 1 when its metrics port is taken (as the broker and
//! the edge agent), and the `TRIB_TIER_*` environment names with the old
//! ones still read (and warned about). Issue 21.

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use tributary_test_support::process::output_within;

/// Every environment variable the tier service reads, old names included.
const ENV: &[&str] = &[
    "TRIB_TIER_CONFIG",
    "TRIB_TIER_DATA_DIR",
    "TRIB_TIER_BROKER_URL",
    "TRIB_TIER_BROKER_CA",
    "TRIB_TIER_BROKER_CERT",
    "TRIB_TIER_BROKER_KEY",
    "TRIB_TIER_TOKEN_FILE",
    "TRIB_TIER_TOKEN",
    "TRIB_TIER_BUCKET",
    "TRIB_TIER_METRICS_LISTEN",
    "TRIB_TIER_FAULT",
    "TRIB_DATA_DIR",
    "TRIB_ADMIN_URL",
    "TRIB_CA",
    "TRIB_CLIENT_CERT",
    "TRIB_CLIENT_KEY",
    "TRIB_ADMIN_TOKEN_FILE",
    "TRIB_ADMIN_TOKEN",
    "TRIB_ARCHIVE_BUCKET",
    "CREDENTIALS_DIRECTORY",
];

fn tier(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tier-service"));
    cmd.args(args).env("RUST_LOG", "off");
    for name in ENV {
        cmd.env_remove(name);
    }
    cmd
}

/// Runs `cmd` to its end (at most 60 s).
fn run(cmd: Command) -> Output {
    output_within(cmd, Duration::from_secs(60))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// stderr without the note that the archive owner was not checked (these
/// tests run no broker; `prefix_owner.rs` tests the check).
fn stderr(out: &Output) -> String {
    text(&out.stderr)
        .lines()
        .filter(|l| !l.starts_with("note: archive owner not checked: "))
        .map(|l| format!("{l}\n"))
        .collect()
}

/// A configuration in `dir` whose data directory exists and whose bucket
/// directory does not yet; `extra` goes at the top level.
fn config(dir: &Path, metrics: &str, extra: &str) -> std::path::PathBuf {
    std::fs::create_dir_all(dir.join("broker")).unwrap();
    let path = dir.join("tier.toml");
    tributary_test_support::certs::write_private(
        &path,
        &format!(
            r#"data_dir = "{data}"
metrics_listen = "{metrics}"
{extra}
[broker]
url = "http://127.0.0.1:7400"
token = "tier-token"
[store]
url = "{bucket}"
"#,
            data = dir.join("broker").display(),
            bucket = dir.join("bucket").display(),
        ),
    );
    path
}

#[test]
fn check_config_says_ok_or_every_problem_on_its_own_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = config(dir.path(), "127.0.0.1:7600", "");
    let path = path.to_str().unwrap();
    let created = format!(
        "note: store.url: {} does not exist yet; it will be created ({} is writable)\n",
        dir.path().join("bucket").display(),
        dir.path().display()
    );
    for args in [
        ["check-config", "-c", path],
        ["--check-config", "--config", path],
    ] {
        let out = run(tier(&args));
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        assert_eq!(text(&out.stdout), "ok\n");
        assert_eq!(stderr(&out), created);
    }
    assert!(
        !dir.path().join("bucket").exists(),
        "check-config created nothing"
    );

    // Four problems at once.
    let certs = dir.path().join("certs");
    let bad = dir.path().join("bad.toml");
    tributary_test_support::certs::write_private(
        &bad,
        &format!(
            r#"data_dir = "{data}"
metrics_listen = "192.0.2.1:7600"
topic_concurrency = 0
[broker]
url = "https://127.0.0.1:99999"
ca = "{certs}/ca.pem"
token = "tier-token"
[store]
url = "{bucket}"
"#,
            data = dir.path().join("tier.toml").display(),
            certs = certs.display(),
            bucket = dir.path().join("bucket").display(),
        ),
    );
    let out = run(tier(&["check-config", "-c", bad.to_str().unwrap()]));
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(text(&out.stdout), "");
    assert_eq!(
        stderr(&out),
        format!(
            "{created}\
             error: topic_concurrency must be at least 1\n\
             error: broker.ca: {ca}: I/O error: No such file or directory (os error 2)\n\
             error: data_dir: {file} is not a directory\n\
             error: metrics_listen: 192.0.2.1:7600: 192.0.2.1 is not an address of this host: Cannot assign requested address (os error 99)\n\
             error: broker.url: https://127.0.0.1:99999: invalid port number\n",
            ca = certs.join("ca.pem").display(),
            file = dir.path().join("tier.toml").display(),
        )
    );
}

/// A data directory that is some other directory (files, but neither
/// `topics/` nor `raft/`) is refused: the service would tier nothing, for
/// ever, without a word.
#[test]
fn a_data_dir_that_is_not_the_brokers_is_a_problem() {
    let dir = tempfile::tempdir().unwrap();
    let path = config(dir.path(), "127.0.0.1:0", "");
    let data = dir.path().join("broker");
    std::fs::write(data.join("notes.txt"), "not a broker").unwrap();
    let out = run(tier(&["check-config", "-c", path.to_str().unwrap()]));
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "error: data_dir: {} holds neither topics/ nor raft/",
            data.display()
        )),
        "{stderr}"
    );
    // With the broker's layout it passes.
    std::fs::create_dir(data.join("topics")).unwrap();
    let out = run(tier(&["check-config", "-c", path.to_str().unwrap()]));
    assert_eq!(out.status.code(), Some(0), "{out:?}");
}

/// An edge agent's data directory (its `identity.json` says so) is
/// refused by check-config and at start, before anything is written in it
/// (both accepted it: an edge's directory has `topics/` too; README,
/// "identities that keep data with its owner"); a broker's passes.
#[test]
fn an_edge_agents_data_dir_is_refused_at_start_and_by_check_config() {
    let dir = tempfile::tempdir().unwrap();
    let path = config(dir.path(), "127.0.0.1:0", "");
    let data = dir.path().join("broker");
    std::fs::create_dir(data.join("topics")).unwrap();
    let identity = data.join("identity.json");
    std::fs::write(
        &identity,
        r#"{"format_version":1,"component":"edge-agent","edge_id":"plant1"}"#,
    )
    .unwrap();
    let expected = format!(
        "error: data_dir: {} belongs to edge-agent edge_id \"plant1\" ({}); the tier service \
         works in a broker's data directory (the broker's data_dir); nothing was touched\n",
        data.display(),
        identity.display()
    );
    let out = run(tier(&["check-config", "-c", path.to_str().unwrap()]));
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let errors: String = stderr(&out)
        .lines()
        .filter(|l| l.starts_with("error: "))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(errors, expected);
    let out = run(tier(&["--config", path.to_str().unwrap()]));
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(
        stderr(&out),
        expected.replace("error: ", "error: invalid configuration: ")
    );
    assert!(
        !data.join("tier-service.lock").exists() && !dir.path().join("bucket").exists(),
        "nothing was touched"
    );
    std::fs::write(
        &identity,
        r#"{"format_version":1,"component":"broker","node_id":1}"#,
    )
    .unwrap();
    let out = run(tier(&["check-config", "-c", path.to_str().unwrap()]));
    assert_eq!(out.status.code(), Some(0), "{out:?}");
}

#[test]
fn a_metrics_port_in_use_stops_the_service_with_status_1() {
    let dir = tempfile::tempdir().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let path = config(dir.path(), &addr.to_string(), "");
    let out = run(tier(&["--config", path.to_str().unwrap()]));
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(
        stderr(&out),
        format!(
            "error: metrics listener on {addr} (metrics_listen): Address already in use (os error 98)\n"
        )
    );
    assert!(
        !dir.path().join("broker").join("tier-service.lock").exists(),
        "stopped before taking the data directory's lock"
    );
    drop(taken);
}

#[test]
fn environment_names_are_trib_tier_and_the_old_ones_still_work_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("broker");
    std::fs::create_dir_all(&data).unwrap();
    let bucket = dir.path().join("bucket");
    let note = format!(
        "note: store.url: {} does not exist yet; it will be created ({} is writable)\n",
        bucket.display(),
        dir.path().display()
    );

    // New names: read, no warning.
    let mut cmd = tier(&["check-config", "--metrics-listen", "127.0.0.1:0"]);
    cmd.env("TRIB_TIER_DATA_DIR", &data)
        .env("TRIB_TIER_BROKER_URL", "http://127.0.0.1:7400")
        .env("TRIB_TIER_BUCKET", &bucket)
        .env("TRIB_TIER_TOKEN", "tier-token");
    let out = run(cmd);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(text(&out.stdout), "ok\n");
    assert_eq!(stderr(&out), note);

    // Old names: read too, each with a warning naming the new name;
    // tribctl's variables (the broker tribctl talks to, its token) are not
    // read, and said so: a shell set up for tribctl does not configure the
    // daemon.
    let mut cmd = tier(&["check-config", "--metrics-listen", "127.0.0.1:0"]);
    cmd.env("TRIB_DATA_DIR", &data)
        .env("TRIB_ADMIN_URL", "http://127.0.0.1:7999")
        .env("TRIB_TIER_BROKER_URL", "http://127.0.0.1:7400")
        .env("TRIB_ARCHIVE_BUCKET", "/tribctl-bucket")
        .env("TRIB_TIER_BUCKET", &bucket)
        .env("TRIB_ADMIN_TOKEN", "tribctl-token")
        .env("TRIB_TIER_TOKEN", "tier-token");
    let out = run(cmd);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(text(&out.stdout), "ok\n");
    assert_eq!(
        stderr(&out),
        "warning: environment variable TRIB_DATA_DIR is deprecated: rename it TRIB_TIER_DATA_DIR (read TRIB_DATA_DIR this time)\n"
            .to_owned()
            + &note
    );
    let mut cmd = tier(&["check-config", "--metrics-listen", "127.0.0.1:0"]);
    cmd.env("TRIB_TIER_DATA_DIR", &data)
        .env("TRIB_TIER_BUCKET", &bucket)
        .env("TRIB_ADMIN_URL", "http://127.0.0.1:7400")
        .env("TRIB_ADMIN_TOKEN", "tribctl-token");
    let out = run(cmd);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(
        stderr(&out),
        "warning: environment variable TRIB_ADMIN_URL is tribctl's and is not read here; set TRIB_TIER_BROKER_URL to configure this daemon\n\
         warning: environment variable TRIB_ADMIN_TOKEN is tribctl's and is not read here; set TRIB_TIER_TOKEN to configure this daemon\n"
            .to_owned()
            + &note
            + "error: broker.url is https://: set broker.ca to the cluster CA that signed the broker's certificate\n"
    );

    // An old name that is not read would leave the default https:// URL
    // without a CA: a problem naming broker.ca.
    let mut cmd = tier(&["check-config", "--metrics-listen", "127.0.0.1:0"]);
    cmd.env("TRIB_TIER_DATA_DIR", &data)
        .env("TRIB_TIER_BUCKET", &bucket);
    let out = run(cmd);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(
        stderr(&out),
        note + "error: broker.url is https://: set broker.ca to the cluster CA that signed the broker's certificate\n"
    );
}
