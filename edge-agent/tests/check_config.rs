//! The real `edge-agent` binary: `check-config` and `run --check-config`
//! (`ok`, or every problem one line), and a local API port in use said
//! once. Issue 21.

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use tributary_test_support::process::{Proc, output_within};

/// Runs `edge-agent ARGS` to its end (at most 60 s) without any
/// `TRIB_EDGE_*` variable from the test's environment.
fn edge_agent(args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_edge-agent"));
    cmd.args(args).env("RUST_LOG", "off");
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("TRIB_EDGE_") {
            cmd.env_remove(name);
        }
    }
    output_within(cmd, Duration::from_secs(60))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// An agent configuration in `dir` with the edge `plant1`'s certificate;
/// `edit` rewrites its text.
fn config(dir: &Path, local_api: &str, edit: impl Fn(String) -> String) -> std::path::PathBuf {
    let certs = dir.join("certs");
    tributary_test_support::certs::issue(&certs, &[1], &["plant1"]);
    let path = dir.join("edge.toml");
    let text = format!(
        r#"data_dir = "{data}"
brokers = ["127.0.0.1:7402"]
local_api = "{local_api}"
[tls]
cert = "{certs}/edge-plant1.pem"
key = "{certs}/edge-plant1.key"
ca = "{certs}/ca.pem"
[[topics]]
name = "/plant1/events"
intent = "event_stream"
"#,
        data = dir.join("data").display(),
        certs = certs.display(),
    );
    std::fs::write(&path, edit(text)).unwrap();
    path
}

#[test]
fn check_config_says_ok_or_every_problem_on_its_own_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = config(dir.path(), "127.0.0.1:7500", |t| t);
    let path = path.to_str().unwrap();
    let note = format!(
        "note: data_dir: {} does not exist yet; it will be created ({} is writable)\n",
        dir.path().join("data").display(),
        dir.path().display()
    );
    for args in [
        vec!["check-config", "-c", path],
        vec!["run", "--check-config", "--config", path],
    ] {
        let out = edge_agent(&args);
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        assert_eq!(text(&out.stdout), "ok\n");
        assert_eq!(text(&out.stderr), note);
    }
    assert!(
        !dir.path().join("data").exists(),
        "check-config created nothing"
    );

    // Three problems at once: validation (a key that is not there), the
    // local API on an address of another host, a broker without a port
    // that parses.
    let bad = config(dir.path(), "192.0.2.1:7500", |t| {
        t.replace("edge-plant1.key", "missing.key")
            .replace("127.0.0.1:7402", "127.0.0.1:99999")
    });
    let out = edge_agent(&["check-config", "-c", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(text(&out.stdout), "");
    assert_eq!(
        text(&out.stderr),
        format!(
            "{note}\
             error: tls.key: {key} is not a readable file\n\
             error: local_api: 192.0.2.1:7500: 192.0.2.1 is not an address of this host: Cannot assign requested address (os error 99)\n\
             error: brokers[0]: 127.0.0.1:99999 does not resolve: invalid port value\n",
            key = dir.path().join("certs/missing.key").display(),
        )
    );

    // This edge's pair, from another CA than tls.ca (the config trial:
    // `ok`, then every broker refused it with UnknownIssuer).
    let other = dir.path().join("other-ca");
    tributary_test_support::certs::issue(&other, &[], &["plant1"]);
    let foreign = config(dir.path(), "127.0.0.1:7500", |t| {
        t.replace(
            &format!("{}/edge-plant1", dir.path().join("certs").display()),
            &format!("{}/edge-plant1", other.display()),
        )
    });
    let out = edge_agent(&["check-config", "-c", foreign.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("error: tls.cert: ") && stderr.contains("not a valid client certificate"),
        "{stderr}"
    );

    // A file that does not parse: that one problem.
    std::fs::write(&bad, "data_dir = \n").unwrap();
    let out = edge_agent(&["check-config", "-c", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = text(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with(&format!("error: {}: line 1: ", bad.display())),
        "{stderr}"
    );
    // A key given twice is named (it read "line 3: .: duplicate key"); a
    // syntax error that points at no key names none.
    std::fs::write(&bad, "edge_id = \"plant1\"\n\nedge_id = \"plant2\"\n").unwrap();
    let out = edge_agent(&["check-config", "-c", bad.to_str().unwrap()]);
    assert_eq!(
        text(&out.stderr),
        format!("error: {}: line 3: edge_id: duplicate key\n", bad.display())
    );
    std::fs::write(&bad, "edge_id = \"plant1\n").unwrap();
    let out = edge_agent(&["check-config", "-c", bad.to_str().unwrap()]);
    assert_eq!(
        text(&out.stderr),
        format!(
            "error: {}: line 1: invalid basic string, expected `\"`\n",
            bad.display()
        )
    );
}

#[test]
fn a_local_api_port_in_use_is_said_once() {
    let dir = tempfile::tempdir().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let path = config(dir.path(), &addr.to_string(), |t| t);
    let out = edge_agent(&["run", "-c", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(
        text(&out.stderr),
        format!("error: local_api {addr}: Address already in use (os error 98)\n")
    );
    drop(taken);
}

/// A changed intent is refused at start-up (the stored settings are kept
/// for the life of the topic), so `check-config` says so first, in the
/// same words, also while the agent runs and holds its metadata file, and
/// without writing to it.
#[test]
fn a_configured_intent_that_differs_from_the_stored_one_is_a_problem() {
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let stored = config(dir.path(), &port.to_string(), |t| t);
    let changed = dir.path().join("changed.toml");
    std::fs::write(
        &changed,
        std::fs::read_to_string(&stored)
            .unwrap()
            .replace("\"event_stream\"", "\"task_queue\""),
    )
    .unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_edge-agent"));
    command
        .args(["run", "-c", stored.to_str().unwrap()])
        .env("RUST_LOG", "off");
    let mut agent = Proc::new("edge-agent", command);
    agent.start();
    // The local API listens once the configured topics exist.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(port).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "the agent did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let metadata = dir.path().join("data/metadata.redb");
    let expected =
        "error: topics[0].intent: topic /plant1/events already exists with different settings: ";
    let out = edge_agent(&["check-config", "-c", changed.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = text(&out.stderr);
    let problem = stderr
        .lines()
        .find(|l| l.starts_with("error: "))
        .unwrap_or_default()
        .to_owned();
    assert!(problem.starts_with(expected), "{stderr}");
    assert!(problem.contains("task_queue"), "{stderr}");
    assert_eq!(
        stderr.lines().filter(|l| l.starts_with("error: ")).count(),
        1,
        "{stderr}"
    );

    assert_eq!(agent.terminate(), Some(0));
    let before = std::fs::read(&metadata).unwrap();
    let out = edge_agent(&["check-config", "-c", stored.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(text(&out.stdout), "ok\n");
    let out = edge_agent(&["check-config", "-c", changed.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(
        std::fs::read(&metadata).unwrap(),
        before,
        "check-config wrote to the metadata file"
    );
    // What start-up says, word for word.
    let run = edge_agent(&["run", "-c", changed.to_str().unwrap()]);
    assert_eq!(run.status.code(), Some(1), "{run:?}");
    assert_eq!(text(&run.stderr), format!("{problem}\n"));
}

/// The metadata store as start-up opens it: what start-up cannot open
/// (a directory, a dangling link, a FIFO) is a problem, said without
/// blocking on it; a damaged store is a note (start-up rebuilds it from
/// the configuration), naming the store, not the check's copy; a missing
/// `TMPDIR` is not created; a `topics` that is a file is a problem.
#[test]
fn a_metadata_store_start_up_cannot_open_is_a_problem_and_a_damaged_one_a_note() {
    let dir = tempfile::tempdir().unwrap();
    let path = config(dir.path(), "127.0.0.1:7500", |t| t);
    let path = path.to_str().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let store = data.join("metadata.redb");
    let errors = |out: &Output| -> Vec<String> {
        text(&out.stderr)
            .lines()
            .filter(|l| l.starts_with("error: "))
            .map(str::to_owned)
            .collect()
    };
    let cannot_open = |reason: &str| {
        format!(
            "error: data_dir: the metadata store {} cannot be opened: {reason}",
            store.display()
        )
    };

    std::fs::create_dir(&store).unwrap();
    let out = edge_agent(&["check-config", "-c", path]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(errors(&out), [cannot_open("not a regular file")]);
    std::fs::remove_dir(&store).unwrap();

    std::os::unix::fs::symlink(data.join("gone.redb"), &store).unwrap();
    let out = edge_agent(&["check-config", "-c", path]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(
        errors(&out),
        [cannot_open(
            "No such file or directory (os error 2) (a dangling link?)"
        )]
    );
    std::fs::remove_file(&store).unwrap();

    // A FIFO would block a copy (or an open) for ever.
    let status = Command::new("mkfifo").arg(&store).status().unwrap();
    assert!(status.success(), "mkfifo (coreutils) is needed");
    let out = edge_agent(&["check-config", "-c", path]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(errors(&out), [cannot_open("not a regular file")]);
    std::fs::remove_file(&store).unwrap();

    let garbage: Vec<u8> = (0..5000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 7) as u8)
        .collect();
    std::fs::write(&store, &garbage).unwrap();
    let out = edge_agent(&["check-config", "-c", path]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "note: data_dir: the metadata store {} is damaged (",
            store.display()
        )) && stderr.contains("start-up moves it aside and rebuilds it from this configuration")
            && !stderr.contains("tributary-check-config"),
        "{stderr}"
    );

    let missing_tmp = dir.path().join("no-tmp");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_edge-agent"));
    cmd.args(["check-config", "-c", path])
        .env("RUST_LOG", "off")
        .env("TMPDIR", &missing_tmp);
    let out = output_within(cmd, Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(
        text(&out.stderr).contains("the configured intents were not compared"),
        "{out:?}"
    );
    assert!(!missing_tmp.exists(), "check-config created TMPDIR");
    assert_eq!(
        std::fs::read(&store).unwrap(),
        garbage,
        "the store was written"
    );

    std::fs::write(data.join("topics"), b"").unwrap();
    let out = edge_agent(&["check-config", "-c", path]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(
        errors(&out),
        [format!(
            "error: data_dir: {} is not a directory (the agent keeps its WALs there)",
            data.join("topics").display()
        )]
    );
}

/// `run` says what is wrong with a data directory it cannot use, in
/// words a reader acts on: a file where the directory should be is "not
/// a directory" (it said "File exists"), and a damaged path is named once.
#[test]
fn run_names_a_data_dir_that_is_a_file_as_not_a_directory() {
    let dir = tempfile::tempdir().unwrap();
    let path = config(dir.path(), "127.0.0.1:7500", |t| t);
    std::fs::write(dir.path().join("data"), b"").unwrap();
    let out = edge_agent(&["run", "-c", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(
        text(&out.stderr),
        format!(
            "error: data_dir {}: not a directory\n",
            dir.path().join("data").display()
        )
    );
    // The metadata store a directory: its path once.
    std::fs::remove_file(dir.path().join("data")).unwrap();
    std::fs::create_dir_all(dir.path().join("data/metadata.redb")).unwrap();
    let out = edge_agent(&["run", "-c", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = text(&out.stderr);
    let store = dir.path().join("data/metadata.redb").display().to_string();
    assert_eq!(stderr.matches(&store).count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("error: local metadata store "),
        "{stderr}"
    );
}

/// The MQTT listener on the local API's own address is a problem before
/// start (start failed with "Address already in use" on the second bind).
#[test]
fn an_mqtt_listener_on_the_local_apis_address_is_a_problem() {
    let dir = tempfile::tempdir().unwrap();
    let path = config(dir.path(), "127.0.0.1:7500", |t| {
        format!(
            "{t}[mqtt]\nlisten = \"127.0.0.1:7500\"\n[[mqtt.topics]]\nfilter = \"a/#\"\ntopic = \"/plant1/events\"\n"
        )
    });
    let out = edge_agent(&["check-config", "-c", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let errors: Vec<String> = text(&out.stderr)
        .lines()
        .filter(|l| l.starts_with("error: "))
        .map(str::to_owned)
        .collect();
    assert_eq!(
        errors,
        [
            "error: mqtt.listen: 127.0.0.1:7500 is also local_api; give the MQTT listener another port"
        ]
    );
}

/// A negative number for a numeric flag is named with its flag (clap
/// took `-5` for an unknown flag: "unexpected argument '-5' found").
#[test]
fn negative_numbers_are_refused_naming_the_flag() {
    for flag in ["--disk-budget-bytes", "--bandwidth-cap-bytes-per-s"] {
        let out = edge_agent(&["check-config", flag, "-5"]);
        assert_eq!(out.status.code(), Some(2), "{flag}: {out:?}");
        let stderr = text(&out.stderr);
        assert!(
            stderr.starts_with(&format!("error: invalid value '-5' for '{flag} <")),
            "{stderr}"
        );
    }
}

/// `[mqtt] max_packet_bytes` past what MQTT can frame is a problem (it
/// passed: 4,000,000,000).
#[test]
fn an_mqtt_packet_limit_mqtt_cannot_frame_is_a_problem() {
    let dir = tempfile::tempdir().unwrap();
    let path = config(dir.path(), "127.0.0.1:7500", |t| {
        t.replace(
            "[tls]",
            "[mqtt]\nlisten = \"127.0.0.1:1883\"\nmax_packet_bytes = 4000000000\n[tls]",
        )
    });
    let out = edge_agent(&["check-config", "-c", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        text(&out.stderr).contains(
            "error: mqtt.max_packet_bytes: must be from 64 to 268435460 (the largest packet MQTT can frame"
        ),
        "{out:?}"
    );
}
