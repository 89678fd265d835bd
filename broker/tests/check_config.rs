//! The real `broker` binary: `check-config` (every problem one line), and
//! the start-up refusals an operator meets first (issue 21): a certificate
//! that is not `broker-{node_id}`, a missing certificate named by its
//! setting, an admin port in use said once, the `TRIB_BROKER_*`
//! environment names with the old ones still read (and warned about).

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use tributary_test_support::ports::{free_tcp, free_udp};
use tributary_test_support::process::wait_exit;

/// Every environment variable the broker reads, old names included: the
/// tests set their own.
const ENV: &[&str] = &[
    "TRIB_BROKER_CONFIG",
    "TRIB_BROKER_NODE_ID",
    "TRIB_BROKER_DATA_DIR",
    "TRIB_BROKER_ADMIN_TOKEN",
    "TRIB_BROKER_ADMIN_TOKEN_FILE",
    "TRIB_NODE_ID",
    "TRIB_DATA_DIR",
    "TRIB_ADMIN_TOKEN",
    "TRIB_ADMIN_TOKEN_FILE",
    "CREDENTIALS_DIRECTORY",
];

fn broker(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_broker"));
    cmd.args(args).env("RUST_LOG", "off");
    for name in ENV {
        cmd.env_remove(name);
    }
    cmd
}

/// Runs `cmd` to its end (at most 60 s) and returns its output.
fn run(mut cmd: Command) -> Output {
    let child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn broker");
    let id = child.id();
    let waiter = std::thread::spawn(move || child.wait_with_output());
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !waiter.is_finished() {
        if std::time::Instant::now() > deadline {
            let _ = Command::new("kill")
                .args(["-KILL", &id.to_string()])
                .status();
            panic!("broker did not exit within 60 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    waiter.join().expect("waiter").expect("broker output")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A valid single-node configuration in `dir` (certificates issued there);
/// `edit` rewrites its text.
fn config(dir: &Path, edit: impl Fn(String) -> String) -> std::path::PathBuf {
    let certs = dir.join("certs");
    tributary_test_support::certs::issue(&certs, &[1, 2], &["plant1"]);
    let text = format!(
        r#"node_id = 1
data_dir = "{data}"
raft_listen = "{raft}"
admin_listen = "{admin}"
admin_plain_http = true
ingest_listen = "{ingest}"
admin_token = "check-config-token"
[tls]
cert = "{certs}/broker-1.pem"
key = "{certs}/broker-1.key"
ca = "{certs}/ca.pem"
"#,
        data = dir.join("data").display(),
        raft = free_udp(),
        admin = free_tcp(),
        ingest = free_udp(),
        certs = certs.display(),
    );
    let path = dir.join("broker.toml");
    tributary_test_support::certs::write_private(&path, &edit(text));
    path
}

/// The value of `key = value` in a configuration's text, as written
/// (quoted strings keep their quotes), and its whole line.
fn setting(text: &str, key: &str) -> (String, String) {
    let line = text
        .lines()
        .find(|l| l.starts_with(&format!("{key} = ")))
        .unwrap()
        .to_owned();
    let value = line[key.len() + 3..].to_owned();
    (value, line)
}

fn note_created(dir: &Path) -> String {
    format!(
        "note: data_dir: {} does not exist yet; it will be created ({} is writable)\n",
        dir.join("data").display(),
        dir.display()
    )
}

#[test]
fn check_config_says_ok_or_every_problem_on_its_own_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = config(dir.path(), |t| t);
    let path_arg = path.to_str().unwrap();
    for args in [
        ["check-config", "-c", path_arg],
        ["--check-config", "--config", path_arg],
    ] {
        let out = run(broker(&args));
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        assert_eq!(text(&out.stdout), "ok\n");
        assert_eq!(text(&out.stderr), note_created(dir.path()));
    }
    assert!(
        !dir.path().join("data").exists(),
        "check-config created nothing"
    );

    // Six problems at once: each its own line, in the order checked.
    let file = dir.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    let certs = dir.path().join("certs");
    let bad = config(dir.path(), |t| {
        let t = t.replace("broker-1.key", "missing.key").replace(
            &format!("data_dir = \"{}\"", dir.path().join("data").display()),
            &format!("data_dir = \"{}\"", file.display()),
        );
        let (_, admin_line) = setting(&t, "admin_listen");
        // Member 1 (this node) at its own raft_listen.
        let (raft, _) = setting(&t, "raft_listen");
        t.replace(&admin_line, "admin_listen = \"192.0.2.1:7400\"")
            .replace("admin_plain_http = true\n", "")
            + &format!(
                "[members]\n1 = {raft}\n2 = \"127.0.0.1:99999\"\n[wal]\nsegment_max_age_ms = 0\n[ingest]\nreceive_budget_bytes = 65536\n"
            )
    });
    let out = run(broker(&["check-config", "-c", bad.to_str().unwrap()]));
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(text(&out.stdout), "");
    assert_eq!(
        text(&out.stderr),
        format!(
            "error: members: member 2: \"127.0.0.1:99999\" is not host:port with a port from 1 to 65535\n\
             error: wal.segment_max_age_ms: must be at least 1 (or left out)\n\
             error: ingest.receive_budget_bytes: must be at least 1048576 (1 MiB)\n\
             error: tls.key: {key}: I/O error: No such file or directory (os error 2)\n\
             error: data_dir: {file} is not a directory\n\
             error: admin_listen: 192.0.2.1:7400: 192.0.2.1 is not an address of this host: Cannot assign requested address (os error 99)\n",
            key = certs.join("missing.key").display(),
            file = file.display(),
        )
    );
}

#[test]
fn a_broker_refuses_a_certificate_that_is_not_broker_node_id() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    let expected = |cert: &str, actual: &str| {
        format!(
            "error: invalid setting tls.cert: {} is the certificate of \"{actual}\", not of this \
             broker: node_id 1 needs a certificate for \"broker-1\" (`tribctl certs --broker 1` \
             makes a development one)\n",
            certs.join(cert).display()
        )
    };
    // An edge's certificate, then another broker's.
    for (name, identity) in [("edge-plant1", "plant1"), ("broker-2", "broker-2")] {
        let path = config(dir.path(), |t| t.replace("broker-1.", &format!("{name}.")));
        let out = run(broker(&["--config", path.to_str().unwrap()]));
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        assert_eq!(
            text(&out.stderr),
            expected(&format!("{name}.pem"), identity)
        );
        let out = run(broker(&["check-config", "-c", path.to_str().unwrap()]));
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        assert_eq!(
            text(&out.stderr),
            note_created(dir.path())
                + &expected(&format!("{name}.pem"), identity)
                    .replace("error: invalid setting tls.cert", "error: tls.cert")
        );
    }
    assert!(
        !dir.path().join("data/raft").exists(),
        "refused before Raft started"
    );
}

#[test]
fn a_data_dir_with_topic_wals_but_no_raft_database_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = config(dir.path(), |t| t);
    let data = dir.path().join("data");
    let wal = data.join("topics/plant1/events/00000000000000000000.log");
    std::fs::create_dir_all(wal.parent().unwrap()).unwrap();
    std::fs::write(&wal, b"batches").unwrap();
    let raft = data.join("raft/raft.redb");
    let expected = format!(
        "error: {raft} is missing or empty, but {topics} holds topic WALs: this broker's \
         metadata (topics, owners, tokens, subscriptions) is lost, and starting would initialize \
         a new, empty cluster over the old data; refusing. Restore {raft} from a backup, or move \
         {topics} away to start over\n",
        raft = raft.display(),
        topics = data.join("topics").display(),
    );
    // No database at all, then an empty file where it was.
    for make in [false, true] {
        if make {
            std::fs::create_dir_all(raft.parent().unwrap()).unwrap();
            std::fs::write(&raft, b"").unwrap();
        }
        let out = run(broker(&["-c", path.to_str().unwrap()]));
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        assert_eq!(text(&out.stderr), expected);
        assert_eq!(
            std::fs::metadata(&raft).map(|m| m.len()).ok(),
            make.then_some(0)
        );
        assert_eq!(
            std::fs::read(&wal).unwrap(),
            b"batches",
            "the WAL is untouched"
        );
        assert!(
            !data.join("identity.json").exists(),
            "a refused directory is not claimed"
        );
    }
}

#[test]
fn a_missing_local_archive_directory_is_a_note_as_the_broker_creates_it() {
    let dir = tempfile::tempdir().unwrap();
    let bucket = dir.path().join("archive");
    let path = config(dir.path(), |t| {
        format!("{t}[archive.store]\nurl = \"{}\"\n", bucket.display())
    });
    let out = run(broker(&["check-config", "-c", path.to_str().unwrap()]));
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(text(&out.stdout), "ok\n");
    assert_eq!(
        text(&out.stderr),
        note_created(dir.path())
            + &format!(
                "note: archive.store.url: {} does not exist yet; it will be created ({} is writable)\n",
                bucket.display(),
                dir.path().display()
            )
    );
    // A file where the directory should be is a problem.
    std::fs::write(&bucket, b"").unwrap();
    let out = run(broker(&["check-config", "-c", path.to_str().unwrap()]));
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        text(&out.stderr).contains(&format!(
            "error: archive.store.url: {} is not a directory\n",
            bucket.display()
        )),
        "{out:?}"
    );
}

#[test]
fn missing_tls_files_are_named_by_their_setting() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    for (file, setting) in [
        ("broker-1.pem", "tls.cert"),
        ("broker-1.key", "tls.key"),
        ("ca.pem", "tls.ca"),
    ] {
        let path = config(dir.path(), |t| {
            t.replace(&format!("/{file}\""), "/gone.pem\"")
        });
        let out = run(broker(&["-c", path.to_str().unwrap()]));
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        assert_eq!(
            text(&out.stderr),
            format!(
                "error: {setting}: {}: I/O error: No such file or directory (os error 2)\n",
                certs.join("gone.pem").display()
            )
        );
    }
}

/// Starts the broker with the `{setting}` line of its configuration set
/// to `addr` and logging at `warn`; its exit code and stderr.
fn start_with_address(setting: &str, addr: std::net::SocketAddr) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = config(dir.path(), |t| {
        let line = t
            .lines()
            .find(|l| l.starts_with(setting))
            .unwrap()
            .to_owned();
        t.replace(&line, &format!("{setting} = \"{addr}\""))
    });
    let mut child = broker(&["-c", path.to_str().unwrap()])
        .env("RUST_LOG", "warn")
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let code = wait_exit(&mut child, Duration::from_secs(60)).expect("the broker exits");
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    (code, stderr)
}

#[test]
fn an_admin_port_in_use_is_said_once() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    assert_eq!(
        start_with_address("admin_listen", addr),
        (
            Some(1),
            format!("error: admin listener on {addr}: Address already in use (os error 98)\n")
        )
    );
    drop(taken);
}

#[test]
fn environment_names_are_trib_broker_and_the_old_ones_still_work_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    tributary_test_support::certs::issue(&certs, &[1, 2], &[]);
    let flags = |cmd: &mut Command| {
        cmd.arg("--tls-cert")
            .arg(certs.join("broker-2.pem"))
            .arg("--tls-key")
            .arg(certs.join("broker-2.key"))
            .arg("--tls-ca")
            .arg(certs.join("ca.pem"))
            .args([
                "--raft-listen",
                "127.0.0.1:0",
                "--ingest-listen",
                "127.0.0.1:0",
            ])
            .args(["--admin-listen", "127.0.0.1:0", "--admin-plain-http"]);
    };
    let data = dir.path().join("data");
    let data_note = note_created(dir.path());
    let token_file = dir.path().join("admin-token");
    tributary_test_support::certs::write_private(&token_file, "long-enough-token");

    // New names: read, no warning.
    let mut cmd = broker(&["check-config"]);
    flags(&mut cmd);
    cmd.env("TRIB_BROKER_DATA_DIR", &data)
        .env("TRIB_BROKER_NODE_ID", "2")
        .env("TRIB_BROKER_ADMIN_TOKEN", "long-enough-token");
    let out = run(cmd);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(text(&out.stdout), "ok\n");
    assert_eq!(text(&out.stderr), data_note);

    // Old names: read too (node 2 matches the broker-2 certificate), each
    // with a warning naming the new name; tribctl's TRIB_ADMIN_TOKEN (the
    // token tribctl sends) is not read, and said so.
    let mut cmd = broker(&["check-config"]);
    flags(&mut cmd);
    cmd.env("TRIB_DATA_DIR", &data)
        .env("TRIB_NODE_ID", "2")
        .env("TRIB_ADMIN_TOKEN", "tribctl-token-not-the-brokers")
        .env("TRIB_BROKER_ADMIN_TOKEN_FILE", &token_file);
    let out = run(cmd);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(text(&out.stdout), "ok\n");
    assert_eq!(
        text(&out.stderr),
        "warning: environment variable TRIB_NODE_ID is deprecated: rename it TRIB_BROKER_NODE_ID (read TRIB_NODE_ID this time)\n\
         warning: environment variable TRIB_DATA_DIR is deprecated: rename it TRIB_BROKER_DATA_DIR (read TRIB_DATA_DIR this time)\n\
         warning: environment variable TRIB_ADMIN_TOKEN is tribctl's and is not read here; set TRIB_BROKER_ADMIN_TOKEN to configure this daemon\n"
            .to_owned()
            + &data_note
    );

    // Both set: the new one wins, the old one is named as ignored.
    let mut cmd = broker(&["check-config"]);
    flags(&mut cmd);
    cmd.env("TRIB_BROKER_DATA_DIR", &data)
        .env("TRIB_DATA_DIR", "/nonexistent-old-name")
        .env("TRIB_BROKER_NODE_ID", "2")
        .env("TRIB_BROKER_ADMIN_TOKEN", "long-enough-token");
    let out = run(cmd);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(
        text(&out.stderr),
        "warning: environment variable TRIB_DATA_DIR is ignored: TRIB_BROKER_DATA_DIR is set (the new name of TRIB_DATA_DIR)\n"
            .to_owned()
            + &data_note
    );
}

#[test]
fn check_config_names_every_problem_of_the_enroll_ca() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    let other = dir.path().join("other");
    tributary_test_support::certs::issue(&other, &[], &[]);
    // A configuration with `[enroll]` of `ca_cert` and `ca_key`, in its own
    // file `name`.
    let with_enroll = |name: &str, ca_cert: &Path, ca_key: Option<&Path>| {
        let path = config(dir.path(), |t| {
            let key = ca_key.map_or(String::new(), |k| format!("ca_key = \"{}\"\n", k.display()));
            format!("{t}[enroll]\nca_cert = \"{}\"\n{key}", ca_cert.display())
        });
        let named = dir.path().join(name);
        std::fs::rename(&path, &named).unwrap();
        named
    };
    let ca_cert = certs.join("ca.pem");
    let ca_key = tributary_test_support::certs::ca_key(&certs);
    let other_key = tributary_test_support::certs::ca_key(&other);
    let check = |path: &Path, credentials: Option<&Path>| {
        let mut cmd = broker(&["check-config", "-c", path.to_str().unwrap()]);
        if let Some(credentials) = credentials {
            cmd.env("CREDENTIALS_DIRECTORY", credentials);
        }
        run(cmd)
    };
    let ok = with_enroll("ok.toml", &ca_cert, Some(&ca_key));
    let out = check(&ok, None);
    assert_eq!(text(&out.stdout), "ok\n", "{out:?}");

    // The key from systemd's credentials directory when ca_key is unset.
    let no_key = with_enroll("no-key.toml", &ca_cert, None);
    let out = check(&no_key, None);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(
        text(&out.stderr),
        note_created(dir.path())
            + "error: enroll.ca_key: not set, and no systemd credential enroll-ca-key \
               ($CREDENTIALS_DIRECTORY/enroll-ca-key)\n"
    );
    let credentials = dir.path().join("credentials");
    std::fs::create_dir_all(&credentials).unwrap();
    std::fs::copy(&ca_key, credentials.join("enroll-ca-key")).unwrap();
    let out = check(&no_key, Some(&credentials));
    assert_eq!(text(&out.stdout), "ok\n", "{out:?}");

    // A key every user may read.
    std::fs::set_permissions(&ca_key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = check(&ok, None);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(
        text(&out.stderr),
        note_created(dir.path())
            + &format!(
                "error: enroll.ca_key: {key}: enrollment CA private key is readable by every \
                 user (mode 0644); run `chmod 600 {key}` (or `chmod 640 {key}` if a service \
                 reads it through the file's group)\n",
                key = ca_key.display()
            )
    );
    std::fs::set_permissions(&ca_key, std::fs::Permissions::from_mode(0o600)).unwrap();

    // A CA the brokers do not trust.
    let foreign = with_enroll("foreign.toml", &other.join("ca.pem"), Some(&other_key));
    let out = check(&foreign, None);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(
        text(&out.stderr),
        note_created(dir.path())
            + &format!(
                "error: enroll.ca_cert: {} is not one of the CA certificates of tls.ca ({}): \
                 the brokers would refuse every certificate it signs\n",
                other.join("ca.pem").display(),
                ca_cert.display()
            )
    );

    // The key of another CA.
    let mismatched = with_enroll("mismatched.toml", &ca_cert, Some(&other_key));
    let out = check(&mismatched, None);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(
        text(&out.stderr),
        note_created(dir.path())
            + &format!(
                "error: enroll.ca_key: {}: not the key of the CA certificate {}\n",
                other_key.display(),
                ca_cert.display()
            )
    );
}

#[test]
fn this_nodes_member_address_on_another_port_than_raft_listen_is_a_note() {
    let dir = tempfile::tempdir().unwrap();
    let path = config(dir.path(), |t| {
        t + "[members]\n1 = \"127.0.0.1:1\"\n2 = \"127.0.0.1:2\"\n"
    });
    let out = run(broker(&["check-config", "-c", path.to_str().unwrap()]));
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(text(&out.stdout), "ok\n");
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(
            "note: members.1: this node's address 127.0.0.1:1 has port 1, but raft_listen is"
        ) && stderr.contains("(fine only behind a port mapping)"),
        "{stderr}"
    );
}

/// A negative number for a numeric flag is named with its flag (clap
/// took `-1` for an unknown flag: "unexpected argument '-1' found").
#[test]
fn a_negative_node_id_is_refused_naming_the_flag() {
    let out = run(broker(&["check-config", "--node-id", "-1"]));
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with("error: invalid value '-1' for '--node-id <NODE_ID>'"),
        "{stderr}"
    );
}

/// An ingest port in use is the start's one error line, also with
/// warnings and errors logged: it was found only after Raft had started,
/// whose shutdown logged two openraft errors before it.
#[test]
fn an_ingest_port_in_use_is_said_once() {
    let taken = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    assert_eq!(
        start_with_address("ingest_listen", addr),
        (
            Some(1),
            format!(
                "error: ingest: QUIC endpoint on {addr}: Address already in use (os error 98)\n"
            )
        )
    );
    drop(taken);
}

/// Start-up and `check-config` refuse alike: raft_listen and ingest_listen
/// on one UDP port (check-config said ok, start-up failed with "Address
/// already in use" without naming its own Raft socket), and a member
/// address whose port no socket can have (start-up called it for ever).
#[test]
fn one_quic_port_for_raft_and_ingest_and_a_member_port_out_of_range_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = config(dir.path(), |t| {
        let (raft, _) = setting(&t, "raft_listen");
        let (_, ingest_line) = setting(&t, "ingest_listen");
        t.replace(&ingest_line, &format!("ingest_listen = {raft}"))
            + &format!("[members]\n1 = {raft}\n2 = \"10.0.0.2:99999\"\n")
    });
    let (raft, _) = setting(&std::fs::read_to_string(&path).unwrap(), "raft_listen");
    let raft = raft.trim_matches('"');
    let expected = format!(
        "error: ingest_listen: {raft} and raft_listen {raft} are both QUIC (UDP) on one port: each needs its own\n\
         error: members: member 2: \"10.0.0.2:99999\" is not host:port with a port from 1 to 65535\n"
    );
    let out = run(broker(&["check-config", "-c", path.to_str().unwrap()]));
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        text(&out.stderr).contains(&expected),
        "{}",
        text(&out.stderr)
    );
    // Start-up names the first problem and starts nothing.
    let out = run(broker(&["-c", path.to_str().unwrap()]));
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(
        text(&out.stderr),
        format!(
            "error: invalid setting ingest_listen: {raft} and raft_listen {raft} are both QUIC (UDP) on one port: each needs its own\n"
        )
    );
    assert!(!dir.path().join("data").exists());
}
