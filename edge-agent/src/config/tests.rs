//! Tests of the edge configuration: every documented example parses, every
//! bad value is refused with the field named.

use std::path::Path;

use super::*;

const DOC: &str = include_str!("../../../docs/edge-agent.md");

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// The first ```toml block of the user guide.
fn documented_example() -> &'static str {
    let start = DOC.find("```toml\n").expect("docs have a toml example") + "```toml\n".len();
    let len = DOC[start..].find("```").expect("the block ends");
    &DOC[start..start + len]
}

fn parse(text: &str) -> Result<FileConfig, ConfigError> {
    parse_file(Path::new("edge.toml"), text)
}

fn resolve(text: &str) -> Result<AgentConfig, ConfigError> {
    AgentConfig::resolve(parse(text)?, &Overrides::default())
}

fn invalid_field(text: &str) -> (String, String) {
    match resolve(text) {
        Err(ConfigError::Invalid { field, reason }) => (field, reason),
        other => panic!("expected an invalid field, got {other:?}"),
    }
}

const MINIMAL: &str = "data_dir = \"/d\"\nedge_id = \"e1\"\n";

#[test]
fn the_documented_example_is_valid() {
    let mut file = parse(documented_example()).unwrap();
    assert_eq!(
        file.tls,
        Some(TlsFileConfig {
            cert: "/etc/tributary/certs/plant1.pem".into(),
            key: "/etc/tributary/certs/plant1.key".into(),
            ca: "/etc/tributary/certs/ca.pem".into(),
            check_interval_ms: None,
        })
    );
    assert_eq!(
        file.brokers,
        ["broker-1.example:7402", "broker-2.example:7402"]
    );
    // The example's certificate paths do not exist here; without [tls]
    // its brokers are refused (replication is mutual TLS only).
    file.tls = None;
    let err = AgentConfig::resolve(file.clone(), &Overrides::default()).unwrap_err();
    assert_eq!(err.field(), Some("brokers"));
    file.brokers.clear();
    let config = AgentConfig::resolve(file, &Overrides::default()).unwrap();
    assert_eq!(config.data_dir, PathBuf::from("/var/lib/tributary-edge"));
    assert_eq!(config.edge_id.as_str(), "plant1");
    assert_eq!(config.local_api, "127.0.0.1:7500".parse().unwrap());
    assert_eq!(config.disk_budget_bytes, Some(8_589_934_592));
    assert_eq!(config.bandwidth_cap_bytes_per_s, Some(250_000));
    assert_eq!(config.congestion_controller, CongestionController::Bbr);
    assert_eq!(config.realtime_ring_records, 10_000);
    assert_eq!(config.limits, Limits::default());
    assert_eq!(config.max_topics, 256);
    assert_eq!(config.checkpoint_interval, Duration::from_secs(1));
    let topics: Vec<_> = config
        .topics
        .iter()
        .map(|t| {
            (
                t.name.as_str(),
                t.intent,
                t.disk_budget_bytes,
                t.full_policy,
                t.realtime_ring_records,
            )
        })
        .collect();
    assert_eq!(
        topics,
        [
            (
                "/plant1/tool-audit",
                StreamIntent::AuditLog,
                Some(1_073_741_824),
                FullPolicy::Refuse,
                None
            ),
            (
                "/plant1/jobs",
                StreamIntent::TaskQueue,
                None,
                FullPolicy::Refuse,
                None
            ),
            (
                "/plant1/events",
                StreamIntent::EventStream,
                Some(2_147_483_648),
                FullPolicy::DropOldest,
                None
            ),
            (
                "/plant1/heartbeat",
                StreamIntent::Realtime,
                None,
                FullPolicy::Refuse,
                Some(1000)
            ),
        ]
    );
}

#[test]
fn defaults_of_a_minimal_file() {
    let config = resolve(MINIMAL).unwrap();
    assert_eq!(
        config,
        AgentConfig::new("/d", NamespaceName::new("e1").unwrap())
    );
    assert_eq!(config.local_api.to_string(), DEFAULT_LOCAL_API);
}

#[test]
fn unknown_fields_are_named_with_their_line() {
    let err = parse("data_dir = \"/d\"\n\n[[topics]]\nname = \"/e1/a\"\nintent = \"events\"\nfull_polcy = \"refuse\"\n")
        .unwrap_err();
    match &err {
        ConfigError::Parse {
            line,
            field,
            message,
            ..
        } => {
            assert_eq!(*line, 6);
            assert_eq!(field, "topics[0].full_polcy");
            assert!(
                message.starts_with("unknown field `full_polcy`"),
                "{message}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(err.field(), Some("topics[0].full_polcy"));
    let err = parse("data_dri = \"/d\"").unwrap_err();
    assert_eq!(err.field(), Some("data_dri"));
    let err =
        parse("[tls]\ncert = \"a\"\nkey = \"b\"\nca = \"c\"\npassword = \"x\"\n").unwrap_err();
    assert_eq!(err.field(), Some("tls.password"));
}

#[test]
fn mistyped_values_are_named() {
    let err = parse("disk_budget_bytes = \"lots\"").unwrap_err();
    assert_eq!(err.field(), Some("disk_budget_bytes"));
    assert!(
        err.to_string()
            .starts_with("edge.toml: line 1: disk_budget_bytes: invalid type"),
        "{err}"
    );
    let err = parse("local_api = \"localhost\"").unwrap_err();
    assert_eq!(err.field(), Some("local_api"));
    let err = parse("[[topics]]\nname = \"/e1/a\"\nintent = \"events\"\nfull_policy = \"drop\"\n")
        .unwrap_err();
    assert_eq!(err.field(), Some("topics[0].full_policy"));
    assert!(
        err.to_string()
            .contains("unknown variant `drop`, expected `refuse` or `drop_oldest`"),
        "{err}"
    );
    let err = parse("congestion_controller = \"reno\"").unwrap_err();
    assert_eq!(err.field(), Some("congestion_controller"));
    assert!(
        err.to_string()
            .contains("unknown variant `reno`, expected one of `cubic`, `bbr`, `declared_rate`"),
        "{err}"
    );
    let err = parse("max_batch_bytes = -1").unwrap_err();
    assert_eq!(err.field(), Some("max_batch_bytes"));
    // Errors of the TOML text: a duplicate key is named, a syntax error
    // points at no field (both were ".").
    let err = parse("data_dir = \"/d\" x").unwrap_err();
    assert_eq!(err.field(), None, "{err}");
    let err = parse("edge_id = \"e1\"\nedge_id = \"e2\"").unwrap_err();
    assert_eq!(err.field(), Some("edge_id"));
    assert_eq!(err.to_string(), "edge.toml: line 2: edge_id: duplicate key");
}

#[test]
fn required_fields() {
    assert_eq!(
        invalid_field("edge_id = \"e1\""),
        (
            "data_dir".into(),
            "not set (config file, --data-dir or TRIB_EDGE_DATA_DIR)".into()
        )
    );
    assert_eq!(
        invalid_field("data_dir = \"/d\""),
        (
            "edge_id".into(),
            "not set and no tls.cert to take it from (config file, --edge-id or TRIB_EDGE_ID)"
                .into()
        )
    );
    let (field, reason) = invalid_field("data_dir = \"/d\"\nedge_id = \"bad/id\"");
    assert_eq!(field, "edge_id");
    assert!(reason.contains("bad/id"), "{reason}");
    // Namespaces the system keeps cannot be edge ids.
    for reserved in ["_system", "_mine", "default"] {
        let (field, reason) =
            invalid_field(&format!("data_dir = \"/d\"\nedge_id = \"{reserved}\""));
        assert_eq!(field, "edge_id");
        assert!(reason.contains("cannot be an edge id"), "{reason}");
    }
}

#[test]
fn edge_id_comes_from_the_certificate() {
    let cert = fixture("edge7.pem");
    let key = fixture("edge7.key");
    let tls = format!(
        "[tls]\ncert = {cert:?}\nkey = {key:?}\nca = {cert:?}\n",
        cert = cert.display().to_string(),
        key = key.display().to_string()
    );
    let config = resolve(&format!("data_dir = \"/d\"\n{tls}")).unwrap();
    assert_eq!(config.edge_id.as_str(), "edge7");
    assert_eq!(
        config.tls,
        Some(TlsPaths {
            cert: cert.clone(),
            key,
            ca: cert.clone()
        })
    );
    // An explicit id must agree with the certificate.
    let (field, reason) = invalid_field(&format!("data_dir = \"/d\"\nedge_id = \"edge8\"\n{tls}"));
    assert_eq!(field, "edge_id");
    assert_eq!(
        reason,
        "\"edge8\" differs from the identity \"edge7\" of tls.cert; the broker only lets \"edge7\" write"
    );
    assert_eq!(
        resolve(&format!("data_dir = \"/d\"\nedge_id = \"edge7\"\n{tls}"))
            .unwrap()
            .edge_id
            .as_str(),
        "edge7"
    );
    // Without a DNS name, the common name.
    assert_eq!(
        certificate_edge_id(&fixture("cn-only.pem")).unwrap(),
        "cnedge"
    );
    // Not a certificate.
    let err = certificate_edge_id(&fixture("edge7.key")).unwrap_err();
    assert_eq!(err.field(), Some("tls.cert"));
}

#[test]
fn tls_needs_all_three_readable_files() {
    let cert = fixture("edge7.pem").display().to_string();
    let overrides = Overrides {
        data_dir: Some("/d".into()),
        tls_cert: Some(cert.clone().into()),
        ..Overrides::default()
    };
    let err = AgentConfig::resolve(FileConfig::default(), &overrides).unwrap_err();
    assert_eq!(err.field(), Some("tls.key"));
    let overrides = Overrides {
        tls_key: Some(cert.clone().into()),
        tls_ca: Some("/nonexistent/ca.pem".into()),
        ..overrides
    };
    let err = AgentConfig::resolve(FileConfig::default(), &overrides).unwrap_err();
    assert_eq!(
        err.to_string(),
        "tls.ca: /nonexistent/ca.pem is not a readable file"
    );
}

#[test]
fn overrides_win_over_the_file() {
    let file = parse(
        "data_dir = \"/file\"\nedge_id = \"e1\"\nlocal_api = \"127.0.0.1:9\"\ndisk_budget_bytes = 100_000_000\n",
    )
    .unwrap();
    let kept = AgentConfig::resolve(file.clone(), &Overrides::default()).unwrap();
    assert_eq!(kept.edge_id.as_str(), "e1");
    let overrides = Overrides {
        data_dir: Some("/flag".into()),
        edge_id: Some("e2".into()),
        local_api: Some("127.0.0.1:10".parse().unwrap()),
        disk_budget_bytes: Some(200_000_000),
        bandwidth_cap_bytes_per_s: Some(1000),
        ..Overrides::default()
    };
    let config = AgentConfig::resolve(file, &overrides).unwrap();
    assert_eq!(config.data_dir, PathBuf::from("/flag"));
    assert_eq!(config.edge_id.as_str(), "e2");
    assert_eq!(config.local_api.port(), 10);
    assert_eq!(config.disk_budget_bytes, Some(200_000_000));
    assert_eq!(config.bandwidth_cap_bytes_per_s, Some(1000));
}

/// A config trial: `brokers` without `[tls]` ran, took records and never
/// replicated one. Refused, naming what to add; `--broker` flags replace
/// the file's list.
#[test]
fn brokers_need_tls_and_the_flags_replace_the_files_list() {
    let tls = format!(
        "[tls]\ncert = \"{cert}\"\nkey = \"{key}\"\nca = \"{cert}\"\n",
        cert = fixture("edge7.pem").display(),
        key = fixture("edge7.key").display(),
    );
    let base = "data_dir = \"/d\"\nbrokers = [\"a:1\"]\n";
    let (field, reason) = invalid_field(&format!("{base}edge_id = \"e1\"\n"));
    assert_eq!(field, "brokers");
    assert!(
        reason.starts_with("replication needs mutual TLS: add a [tls] table"),
        "{reason}"
    );
    let file = parse(&format!("{base}{tls}")).unwrap();
    let kept = AgentConfig::resolve(file.clone(), &Overrides::default()).unwrap();
    assert_eq!(kept.brokers, ["a:1"]);
    assert_eq!(kept.edge_id.as_str(), "edge7");
    let overrides = Overrides {
        brokers: vec!["b:2".into(), "c:3".into()],
        ..Overrides::default()
    };
    let config = AgentConfig::resolve(file.clone(), &overrides).unwrap();
    assert_eq!(config.brokers, ["b:2", "c:3"]);
    // `TRIB_EDGE_BROKERS=` (empty, as in an environment file) is no
    // override: it was one empty broker, refused as not host:port.
    let empty = Overrides {
        brokers: vec![String::new()],
        ..Overrides::default()
    };
    let config = AgentConfig::resolve(file, &empty).unwrap();
    assert_eq!(config.brokers, ["a:1"]);
}

/// A broker's certificate given to an edge is named as such (the trial's
/// message said only that the identities differ).
#[test]
fn a_brokers_certificate_given_to_an_edge_is_named_as_such() {
    let dir = tempfile::tempdir().unwrap();
    broker_core::dev_certs::issue(dir.path(), &[1], &[]).unwrap();
    let (field, reason) = invalid_field(&format!(
        "data_dir = \"/d\"\nedge_id = \"plant1\"\n[tls]\ncert = {cert:?}\nkey = {key:?}\nca = {ca:?}\n",
        cert = dir.path().join("broker-1.pem").display().to_string(),
        key = dir.path().join("broker-1.key").display().to_string(),
        ca = dir.path().join("ca.pem").display().to_string(),
    ));
    assert_eq!(field, "edge_id");
    assert_eq!(
        reason,
        "\"plant1\" differs from the identity \"broker-1\" of tls.cert; the broker only lets \"broker-1\" write (tls.cert is a broker's certificate: give this edge its own, from `edge-agent enroll` or `tribctl certs --edge`)"
    );
}

#[test]
fn bad_scalar_values_name_their_field() {
    let cases = [
        ("brokers = [\"nohost\"]", "brokers[0]"),
        ("brokers = [\"a:1\", \"b:0\"]", "brokers[1]"),
        ("brokers = [\":7\"]", "brokers[0]"),
        ("disk_budget_bytes = 1000", "disk_budget_bytes"),
        ("realtime_ring_records = 0", "realtime_ring_records"),
        ("realtime_ring_records = 20000000", "realtime_ring_records"),
        ("bandwidth_cap_bytes_per_s = 0", "bandwidth_cap_bytes_per_s"),
        ("max_topics = 0", "max_topics"),
        (
            "congestion_controller = \"declared_rate\"",
            "congestion_controller",
        ),
        ("checkpoint_interval_ms = 0", "checkpoint_interval_ms"),
        ("max_batch_bytes = 100000000", "max_batch_bytes"),
        ("max_record_bytes = 9000000", "max_record_bytes"),
        ("max_record_bytes = 2000000", "max_record_bytes"),
        ("max_batch_bytes = 16777216", "max_batch_bytes"),
    ];
    for (line, field) in cases {
        let (got, reason) = invalid_field(&format!("{MINIMAL}{line}\n"));
        assert_eq!(got, field, "{line}: {reason}");
    }
    let (_, reason) = invalid_field(&format!("{MINIMAL}disk_budget_bytes = 1000\n"));
    assert_eq!(reason, "1000 is below 2 × max_batch_bytes = 16777216");
    for (line, field, expected) in [
        (
            "max_record_bytes = 0",
            "max_record_bytes",
            "0 is below 5, the smallest encoded record",
        ),
        (
            "max_batch_bytes = 10",
            "max_batch_bytes",
            "10 cannot hold one record of max_record_bytes (1048576) with the batch's 48-byte header",
        ),
    ] {
        let (got, reason) = invalid_field(&format!("{MINIMAL}{line}\n"));
        assert_eq!((got.as_str(), reason.as_str()), (field, expected), "{line}");
    }
    let (_, reason) = invalid_field(&format!("{MINIMAL}max_record_bytes = 2000000\n"));
    assert_eq!(
        reason,
        "2000000 is above 1048576, the largest record a broker accepts: a larger one would be \
         stored here but never replicated"
    );
}

#[test]
fn declared_rate_takes_its_rate_from_the_bandwidth_cap() {
    let (_, reason) = invalid_field(&format!(
        "{MINIMAL}congestion_controller = \"declared_rate\"\n"
    ));
    assert_eq!(
        reason,
        "\"declared_rate\" needs bandwidth_cap_bytes_per_s, the link's rate"
    );
    let config = resolve(&format!(
        "{MINIMAL}congestion_controller = \"declared_rate\"\nbandwidth_cap_bytes_per_s = 8000\n"
    ))
    .unwrap();
    assert_eq!(
        config.congestion_controller,
        CongestionController::DeclaredRate
    );
    assert_eq!(config.bandwidth_cap_bytes_per_s, Some(8000));
}

#[test]
fn topic_entries_are_checked() {
    let topic = |body: &str| format!("{MINIMAL}[[topics]]\n{body}\n");
    let cases = [
        ("name = \"e1/a\"\nintent = \"events\"", "topics[0].name"),
        ("name = \"/e1/a b\"\nintent = \"events\"", "topics[0].name"),
        ("name = \"/other/a\"\nintent = \"events\"", "topics[0].name"),
        (
            "name = \"/e1/a\"\nintent = \"events-ish\"",
            "topics[0].intent",
        ),
        (
            "name = \"/e1/a\"\nintent = \"realtime\"\nfull_policy = \"drop_oldest\"",
            "topics[0].full_policy",
        ),
        (
            "name = \"/e1/a\"\nintent = \"firehose\"\ndisk_budget_bytes = 100000000",
            "topics[0].disk_budget_bytes",
        ),
        (
            "name = \"/e1/a\"\nintent = \"audit\"\nrealtime_ring_records = 5",
            "topics[0].realtime_ring_records",
        ),
        (
            "name = \"/e1/a\"\nintent = \"telemetry\"\nrealtime_ring_records = 0",
            "topics[0].realtime_ring_records",
        ),
        (
            "name = \"/e1/a\"\nintent = \"tasks\"\ndisk_budget_bytes = 5",
            "topics[0].disk_budget_bytes",
        ),
    ];
    for (body, field) in cases {
        let (got, reason) = invalid_field(&topic(body));
        assert_eq!(got, field, "{body}: {reason}");
    }
    let (_, reason) = invalid_field(&topic("name = \"/other/a\"\nintent = \"events\""));
    assert_eq!(
        reason,
        "/other/a is outside this edge's namespace \"e1\"; an edge writes only to /e1/..."
    );
    let (_, reason) = invalid_field(&topic("name = \"/e1/a\"\nintent = \"events-ish\""));
    assert!(
        reason.starts_with("unknown stream intent \"events-ish\""),
        "{reason}"
    );
    let dup = format!(
        "{MINIMAL}[[topics]]\nname = \"/e1/a\"\nintent = \"events\"\n[[topics]]\nname = \"/e1/a\"\nintent = \"tasks\"\n"
    );
    assert_eq!(
        invalid_field(&dup),
        (
            "topics[1].name".into(),
            "/e1/a is already configured as topics[0]".into()
        )
    );
    let too_many = format!(
        "{MINIMAL}max_topics = 1\n[[topics]]\nname = \"/e1/a\"\nintent = \"events\"\n[[topics]]\nname = \"/e1/b\"\nintent = \"events\"\n"
    );
    assert_eq!(invalid_field(&too_many).0, "topics");
}

#[test]
fn load_reports_unreadable_files() {
    let err = AgentConfig::load(
        Some(Path::new("/nonexistent/edge.toml")),
        &Overrides::default(),
    )
    .unwrap_err();
    assert!(matches!(err, ConfigError::Read { .. }), "{err:?}");
    assert_eq!(err.field(), None);
    assert!(
        err.to_string().starts_with("/nonexistent/edge.toml: "),
        "{err}"
    );
}

#[test]
fn replication_settings_parse_with_a_per_topic_retain_until() {
    let defaults = resolve(MINIMAL).unwrap().replication;
    assert_eq!(defaults.keep_alive, Duration::from_secs(1));
    assert_eq!(defaults.idle_timeout, Duration::from_secs(5));
    assert_eq!(defaults.retain_until, RetainUntil::Archived);
    assert_eq!(defaults.unhealthy_after, Duration::from_secs(120));
    let config = resolve(&format!(
        "{MINIMAL}[replication]\nkeep_alive_ms = 2000\nidle_timeout_ms = 30000\nretain_until = \"acknowledged\"\nunhealthy_after_ms = 1500\n\n\
         [[topics]]\nname = \"/e1/audit\"\nintent = \"audit_log\"\nretain_until = \"archived\"\n\n\
         [[topics]]\nname = \"/e1/events\"\nintent = \"event_stream\"\n"
    ))
    .unwrap();
    assert_eq!(
        config.replication,
        ReplicationSettings {
            keep_alive: Duration::from_secs(2),
            idle_timeout: Duration::from_secs(30),
            retain_until: RetainUntil::Acknowledged,
            unhealthy_after: Duration::from_millis(1500),
        }
    );
    let name = |s: &str| TopicName::new(s).unwrap();
    assert_eq!(
        config.retain_until(&name("/e1/audit")),
        RetainUntil::Archived
    );
    assert_eq!(
        config.retain_until(&name("/e1/events")),
        RetainUntil::Acknowledged
    );
    assert_eq!(
        config.retain_until(&name("/e1/implicit")),
        RetainUntil::Acknowledged
    );
}

#[test]
fn bad_replication_settings_are_refused_naming_the_key() {
    let err = parse("[replication]\nretain_until = \"forever\"\n").unwrap_err();
    assert_eq!(err.field(), Some("replication.retain_until"));
    assert!(
        err.to_string()
            .contains("unknown variant `forever`, expected `archived` or `acknowledged`"),
        "{err}"
    );
    let err = parse("[replication]\nidle_timeout = 5000\n").unwrap_err();
    assert_eq!(err.field(), Some("replication.idle_timeout"));
    let err = parse("[replication]\nkeep_alive_ms = \"1s\"\n").unwrap_err();
    assert_eq!(err.field(), Some("replication.keep_alive_ms"));
    for (text, field, reason) in [
        (
            "keep_alive_ms = 50",
            "replication.keep_alive_ms",
            "50 is below 100 ms",
        ),
        (
            "idle_timeout_ms = 1500",
            "replication.idle_timeout_ms",
            "1500 ms must be at least twice replication.keep_alive_ms (1000 ms)",
        ),
        (
            "idle_timeout_ms = 600001",
            "replication.idle_timeout_ms",
            "600001 is above 600000 ms",
        ),
        (
            "unhealthy_after_ms = 99",
            "replication.unhealthy_after_ms",
            "must be from 100 to 604800000 ms, got 99",
        ),
    ] {
        let (got_field, got_reason) = invalid_field(&format!("{MINIMAL}[replication]\n{text}\n"));
        assert_eq!(got_field, field, "{text}");
        assert!(got_reason.starts_with(reason), "{text}: {got_reason}");
    }
    let (field, reason) = invalid_field(&format!(
        "{MINIMAL}[[topics]]\nname = \"/e1/hb\"\nintent = \"realtime\"\nretain_until = \"archived\"\n"
    ));
    assert_eq!(field, "topics[0].retain_until");
    assert!(
        reason.contains("does not apply to the realtime intent"),
        "{reason}"
    );
}

#[cfg(unix)]
fn secret_file(dir: &Path, name: &str, text: &str, mode: u32) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    path
}

#[cfg(unix)]
#[test]
fn a_lan_local_api_needs_a_token_from_a_private_file() {
    let dir = tempfile::tempdir().unwrap();
    // Loopback: no token needed.
    let config = resolve(&format!("{MINIMAL}local_api = \"127.0.0.1:7500\"\n")).unwrap();
    assert_eq!(
        config.local_api_security,
        local_api::LocalApiSecurity::default()
    );
    // Any other address: refused without a token, naming local_api.
    let (field, reason) = invalid_field(&format!("{MINIMAL}local_api = \"0.0.0.0:7500\"\n"));
    assert_eq!(field, "local_api");
    assert!(
        reason.starts_with("0.0.0.0:7500 is reachable from other hosts, so it needs a bearer token: set local_api_token_file"),
        "{reason}"
    );
    let good = secret_file(dir.path(), "token", "0123456789abcdef0123\n", 0o600);
    let config = resolve(&format!(
        "{MINIMAL}local_api = \"0.0.0.0:7500\"\nlocal_api_token_file = \"{}\"\n",
        good.display()
    ))
    .unwrap();
    let token = config.local_api_security.token.expect("token");
    assert!(token.matches("0123456789abcdef0123"));
    assert!(!token.matches("0123456789abcdef012"));
    assert_eq!(format!("{token:?}"), "ApiToken(<redacted>)");
    let open = secret_file(dir.path(), "open", "0123456789abcdef0123\n", 0o644);
    let (field, reason) = invalid_field(&format!(
        "{MINIMAL}local_api_token_file = \"{}\"\n",
        open.display()
    ));
    assert_eq!(field, "local_api_token_file");
    assert!(
        reason.contains("readable by every user (mode 0644)"),
        "{reason}"
    );
    let short = secret_file(dir.path(), "short", "abc\n", 0o600);
    let (field, reason) = invalid_field(&format!(
        "{MINIMAL}local_api_token_file = \"{}\"\n",
        short.display()
    ));
    assert_eq!(field, "local_api_token_file");
    assert!(reason.contains("fewer than 16 characters"), "{reason}");
    let (field, _) = invalid_field(&format!(
        "{MINIMAL}[local_api_tls]\ncert = \"/nonexistent.pem\"\nkey = \"/nonexistent.key\"\n"
    ));
    assert_eq!(field, "local_api_tls.cert");
}
