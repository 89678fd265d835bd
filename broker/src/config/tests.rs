//! Tests of the broker configuration: parsing, validation, and the
//! example files in `configs/`.

use super::*;

#[test]
fn parses_the_documented_example() {
    let text = r#"
node_id = 2
data_dir = "/var/lib/tributary-broker"
raft_listen = "127.0.0.1:7411"
admin_listen = "127.0.0.1:7410"
admin_token = "change-me"
[tls]
cert = "b.pem"
key = "b.key"
ca = "ca.pem"
[members]
1 = "10.0.0.1:7401"
2 = "10.0.0.2:7401"
"#;
    let config: BrokerConfig = toml::from_str(text).unwrap();
    assert_eq!(config.node_id, 2);
    assert_eq!(config.members.len(), 2);
    assert_eq!(config.validate().map_err(|e| e.to_string()), Ok(()));
}

#[test]
fn the_ingest_receive_budget_defaults_to_1_gib_and_the_example_parses() {
    let base =
        "data_dir = \"x\"\nadmin_token = \"long-enough\"\n[tls]\ncert=\"a\"\nkey=\"b\"\nca=\"c\"\n";
    let config: BrokerConfig = toml::from_str(base).unwrap();
    assert_eq!(config.ingest.receive_budget(), 1 << 30);
    // The example in configs/broker-single.toml, uncommented.
    let example: String = include_str!("../../../configs/broker-single.toml")
        .lines()
        .skip_while(|l| !l.starts_with("# [ingest]"))
        .take_while(|l| l.starts_with("# "))
        .map(|l| l.trim_start_matches("# "))
        .collect::<Vec<_>>()
        .join("\n");
    let config: BrokerConfig = toml::from_str(&format!("{base}{example}")).unwrap();
    assert_eq!(config.ingest.receive_budget_bytes, Some(1 << 30));
    let err = toml::from_str::<BrokerConfig>(&format!("{base}[ingest]\nbudget = 1\n"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("budget"), "{err}");
}

#[test]
fn archive_section_parses_with_defaults_and_bad_ones_are_refused() {
    let base =
        "data_dir = \"x\"\nadmin_token = \"long-enough\"\n[tls]\ncert=\"a\"\nkey=\"b\"\nca=\"c\"\n";
    let config: BrokerConfig = toml::from_str(base).unwrap();
    assert_eq!(config.archive, None);
    let config: BrokerConfig =
        toml::from_str(&format!("{base}[archive.store]\nurl = \"/srv/archive\"\n")).unwrap();
    let archive = config.archive.clone().unwrap();
    assert_eq!(archive.prefix, "/tributary");
    assert_eq!(archive.store.url.as_deref(), Some("/srv/archive"));
    assert_eq!(config.validate().map_err(|e| e.to_string()), Ok(()));
    // The example in configs/broker-single.toml, uncommented.
    let example: String = include_str!("../../../configs/broker-single.toml")
        .lines()
        .skip_while(|l| !l.starts_with("# [archive]"))
        .map(|l| l.trim_start_matches("# "))
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n");
    let config: BrokerConfig = toml::from_str(&format!("{base}{example}")).unwrap();
    let archive = config.archive.unwrap();
    assert_eq!(
        archive.store.endpoint.as_deref(),
        Some("http://127.0.0.1:9000")
    );
    let config: BrokerConfig = toml::from_str(&format!(
        "{base}[archive]\nprefix = \"/t\"\n[archive.store]\n"
    ))
    .unwrap();
    let err = config.validate().unwrap_err().to_string();
    assert!(err.contains("archive.store.url"), "{err}");
    let config: BrokerConfig = toml::from_str(&format!(
        "{base}[archive]\nprefix = \"no-slash\"\n[archive.store]\nurl = \"/a\"\n"
    ))
    .unwrap();
    let err = config.validate().unwrap_err().to_string();
    assert!(err.contains("archive.prefix"), "{err}");
    let err = toml::from_str::<BrokerConfig>(&format!("{base}[archive]\nbucket = \"/a\"\n"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("bucket"), "{err}");
    let config: BrokerConfig =
        toml::from_str(&format!("{base}[retention]\ninterval_ms = 60000\n")).unwrap();
    assert_eq!(config.retention.interval_ms, Some(60_000));
    assert_eq!(config.retention.max_age_ms, None);
    let config: BrokerConfig =
        toml::from_str(&format!("{base}[retention]\ninterval_ms = 0\n")).unwrap();
    let err = config.validate().unwrap_err().to_string();
    assert!(err.contains("retention.interval_ms"), "{err}");
}

#[test]
fn unknown_keys_and_bad_values_are_refused() {
    assert!(toml::from_str::<BrokerConfig>("data_dir = \"x\"\nnode_idd = 1").is_err());
    let config: BrokerConfig = toml::from_str("data_dir = \"x\"\nnode_id = 0").unwrap();
    let err = config.validate().unwrap_err().to_string();
    assert!(err.contains("node_id"), "{err}");
    let config: BrokerConfig = toml::from_str(
        "data_dir = \"x\"\nadmin_token = \"long-enough\"\n[tls]\ncert=\"a\"\nkey=\"b\"\nca=\"c\"\n[members]\n2 = \"h:1\"",
    )
    .unwrap();
    let err = config.validate().unwrap_err().to_string();
    assert!(err.contains("members"), "{err}");
    // Two members at one address.
    let config: BrokerConfig = toml::from_str(
        "data_dir = \"x\"\nnode_id = 1\n[members]\n1 = \"127.0.0.1:7401\"\n2 = \"127.0.0.1:7401\"",
    )
    .unwrap();
    let problems: Vec<String> = config.problems().iter().map(|p| p.to_string()).collect();
    assert!(
        problems
            .iter()
            .any(|p| p.contains("members 1 and 2 share the address 127.0.0.1:7401")),
        "{problems:?}"
    );
    // This node's own address on another port or IP than raft_listen (a
    // note of check-config); a host name or a wildcard listen is fine.
    let listen: SocketAddr = "127.0.0.1:7401".parse().unwrap();
    let note = |own: &str, listen: SocketAddr| own_member_problem(own, listen);
    assert!(note("127.0.0.1:7411", listen).is_some_and(|n| n.contains("has port 7411")));
    assert!(note("127.0.0.2:7401", listen).is_some_and(|n| n.contains("is not where")));
    assert_eq!(note("broker-1.plant:7401", listen), None);
    assert_eq!(note("10.0.0.2:7401", "0.0.0.0:7401".parse().unwrap()), None);
    // Inside [tls] too (the same table serves the edge agent and the
    // tier service).
    let err = toml::from_str::<BrokerConfig>(
        "data_dir = \"x\"\n[tls]\ncert=\"a\"\nkey=\"b\"\nca=\"c\"\nbogus = 1\n",
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("unknown field `bogus`"), "{err}");
}

#[test]
fn raft_timings_that_openraft_refuses_are_named_by_their_setting() {
    let base =
        "data_dir = \"x\"\nadmin_token = \"long-enough\"\n[tls]\ncert=\"a\"\nkey=\"b\"\nca=\"c\"\n";
    let cases = [
        (
            "heartbeat_ms = 0",
            "invalid setting raft.heartbeat_ms: must be at least 1",
        ),
        (
            "heartbeat_ms = 1000",
            "invalid setting raft.election_timeout_min_ms: must exceed raft.heartbeat_ms \
             (1000 ms), or followers start elections between heartbeats",
        ),
        (
            "election_timeout_min_ms = 5000\nelection_timeout_max_ms = 10",
            "invalid setting raft.election_timeout_max_ms: must exceed \
             raft.election_timeout_min_ms (5000 ms)",
        ),
    ];
    for (raft, expected) in cases {
        let config: BrokerConfig = toml::from_str(&format!("{base}[raft]\n{raft}\n")).unwrap();
        let err = config.validate().unwrap_err().to_string();
        assert_eq!(err, expected, "{raft}");
    }
}

#[test]
fn wal_segment_age_parses_and_zero_is_refused() {
    let base =
        "data_dir = \"x\"\nadmin_token = \"long-enough\"\n[tls]\ncert=\"a\"\nkey=\"b\"\nca=\"c\"\n";
    let config: BrokerConfig =
        toml::from_str(&format!("{base}[wal]\nsegment_max_age_ms = 2000\n")).unwrap();
    assert_eq!(config.wal.segment_max_age_ms, Some(2000));
    assert_eq!(config.validate().map_err(|e| e.to_string()), Ok(()));
    let config: BrokerConfig = toml::from_str(base).unwrap();
    assert_eq!(config.wal.segment_max_age_ms, None);
    let config: BrokerConfig =
        toml::from_str(&format!("{base}[wal]\nsegment_max_age_ms = 0\n")).unwrap();
    let err = config.validate().unwrap_err().to_string();
    assert!(err.contains("wal.segment_max_age_ms"), "{err}");
    assert!(toml::from_str::<BrokerConfig>(&format!("{base}[wal]\nsegment_age = 1\n")).is_err());
    // Local retention beside a tier service deleted segments never archived.
    let config: BrokerConfig = toml::from_str(&format!(
        "{base}[retention]\ninterval_ms = 60000\nmax_age_ms = 1000\n[archive.store]\nurl = \"/srv/archive\"\n"
    ))
    .unwrap();
    let err = config.validate().unwrap_err().to_string();
    assert!(err.contains("retention"), "{err}");
    // The config trial: 0 passed check-config, then panicked the damage
    // check's timer in the running broker.
    let config: BrokerConfig =
        toml::from_str(&format!("{base}[wal]\ndamage_check_interval_ms = 0\n")).unwrap();
    let err = config.validate().unwrap_err().to_string();
    assert!(err.contains("wal.damage_check_interval_ms"), "{err}");
    // The config trial: unarchived_bytes = 0 refused every batch for good.
    for (budget, field) in [
        (
            "unarchived_bytes = 0\n",
            "budget.unarchived_bytes: must be at least 1",
        ),
        ("refresh_ms = 0\n", "budget.refresh_ms: must be at least 1"),
        (
            "[budget.topics]\n\"/a/t\" = 0\n",
            "budget.topics: /a/t: must be at least 1",
        ),
        (
            "[budget.topics]\n\"no-slash\" = 10\n",
            "budget.topics: \"no-slash\"",
        ),
    ] {
        let config: BrokerConfig = toml::from_str(&format!("{base}[budget]\n{budget}")).unwrap();
        let err = config.validate().unwrap_err().to_string();
        assert!(err.contains(field), "{budget}: {err}");
    }
    let config: BrokerConfig = toml::from_str(&format!(
        "{base}[budget]\nunarchived_bytes = 1\n[budget.topics]\n\"/a/t\" = 1\n"
    ))
    .unwrap();
    assert_eq!(config.validate().map_err(|e| e.to_string()), Ok(()));
}

#[test]
fn plain_http_only_on_loopback_and_the_token_never_in_debug_output() {
    let base = "data_dir = \"x\"\nadmin_token = \"long-enough-s3cret\"\n[tls]\ncert=\"a\"\nkey=\"b\"\nca=\"c\"\n";
    let config: BrokerConfig = toml::from_str(base).unwrap();
    assert!(!config.admin_plain_http, "HTTPS is the default");
    assert!(!format!("{config:?}").contains("s3cret"), "{config:?}");
    let config: BrokerConfig = toml::from_str(&format!("admin_plain_http = true\n{base}")).unwrap();
    assert_eq!(config.validate().map_err(|e| e.to_string()), Ok(()));
    let config: BrokerConfig = toml::from_str(&format!(
        "admin_plain_http = true\nadmin_listen = \"0.0.0.0:7400\"\n{base}"
    ))
    .unwrap();
    let err = config.validate().unwrap_err().to_string();
    assert!(err.contains("admin_plain_http"), "{err}");
    assert!(err.contains("0.0.0.0:7400"), "{err}");
    let mut both: BrokerConfig =
        toml::from_str(&format!("admin_token_file = \"/t\"\n{base}")).unwrap();
    let err = both.resolve_secrets().unwrap_err().to_string();
    assert!(err.contains("admin_token_file"), "{err}");
}

#[test]
fn enroll_section_parses_with_defaults_and_unknown_keys_are_refused() {
    let base =
        "data_dir = \"x\"\nadmin_token = \"long-enough\"\n[tls]\ncert=\"a\"\nkey=\"b\"\nca=\"c\"\n";
    let config: BrokerConfig = toml::from_str(base).unwrap();
    assert_eq!(config.enroll, None);
    let config: BrokerConfig =
        toml::from_str(&format!("{base}[enroll]\nca_cert = \"c\"\n")).unwrap();
    let enroll = config.enroll.unwrap();
    assert_eq!(enroll.ca_cert, PathBuf::from("c"));
    assert_eq!(enroll.ca_key, None);
    assert_eq!(enroll.cert_validity_days, 365);
    let err =
        toml::from_str::<BrokerConfig>(&format!("{base}[enroll]\nca_cert = \"c\"\nkey = \"k\"\n"))
            .unwrap_err()
            .to_string();
    assert!(err.contains("unknown field `key`"), "{err}");
}

#[test]
fn member_flags_parse() {
    assert_eq!(
        parse_member("3=10.0.0.3:7401"),
        Ok((3, "10.0.0.3:7401".into()))
    );
    assert!(parse_member("3").is_err());
    assert!(parse_member("x=h:1").is_err());
    assert!(parse_member("3=h").is_err());
    assert!(parse_member("3=:7401").is_err());
}

mod example_tests {
    use super::*;

    #[test]
    fn the_example_configs_in_configs_parse_and_validate() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs");
        let mut seen = 0;
        for entry in std::fs::read_dir(&dir).expect("configs/") {
            let path = entry.expect("entry").path();
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default();
            if !name.starts_with("broker-") || !name.ends_with(".toml") {
                continue;
            }
            let config = BrokerConfig::from_file(&path).unwrap_or_else(|e| panic!("{e}"));
            config.validate().unwrap_or_else(|e| panic!("{name}: {e}"));
            seen += 1;
        }
        assert_eq!(seen, 4, "broker-single.toml and three cluster nodes");
    }
}
