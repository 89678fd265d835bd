//! The example configurations shipped in `configs/` load and validate with
//! the real parser (only the certificate paths are pointed at fresh
//! development certificates).

use std::path::Path;

use tributary_edge::{AgentConfig, Overrides};

#[test]
fn the_raspberry_pi_example_loads() {
    let dir = tempfile::tempdir().expect("tempdir");
    let certs = dir.path().join("certs");
    broker_core::dev_certs::issue(&certs, &[], &["plant1".into()]).expect("certs");
    let paths = broker_core::dev_certs::edge_paths(&certs, "plant1");
    let overrides = Overrides {
        data_dir: Some(dir.path().join("data")),
        tls_cert: Some(paths.cert),
        tls_key: Some(paths.key),
        tls_ca: Some(paths.ca),
        ..Overrides::default()
    };
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/edge-raspberry-pi.toml");
    let config = AgentConfig::load(Some(&file), &overrides).expect("example config is valid");
    assert_eq!(config.edge_id.as_str(), "plant1");
    assert_eq!(config.topics.len(), 3);
    assert_eq!(config.bandwidth_cap_bytes_per_s, Some(65_536));
    let mqtt = config.mqtt.expect("[mqtt]");
    assert_eq!(mqtt.max_connections, 64);
    assert_eq!(mqtt.rules.len(), 2);
    assert!(mqtt.rules[0].filter.matches("plant/press-4/audit"));
}

#[test]
fn mqtt_config_errors_name_the_field() {
    let text = "data_dir = \"/tmp/x\"\nedge_id = \"plant1\"\n[mqtt]\n[[mqtt.topics]]\nfilter = \"a/#/b\"\ntopic = \"/plant1/t\"\n";
    let file = tributary_edge::config::parse_file(Path::new("edge.toml"), text).expect("parses");
    let err = AgentConfig::resolve(file, &Overrides::default()).expect_err("bad filter");
    assert_eq!(err.field(), Some("mqtt.topics[0].filter"), "{err}");
    let text = "data_dir = \"/tmp/x\"\nedge_id = \"plant1\"\n[mqtt]\n[[mqtt.topics]]\nfilter = \"a/#\"\ntopic = \"/plant2/t\"\n";
    let file = tributary_edge::config::parse_file(Path::new("edge.toml"), text).expect("parses");
    let err = AgentConfig::resolve(file, &Overrides::default()).expect_err("foreign namespace");
    assert_eq!(err.field(), Some("mqtt.topics[0].topic"), "{err}");
    let text = "data_dir = \"/tmp/x\"\nedge_id = \"plant1\"\n[mqtt]\nlisten = \"127.0.0.1:1883\"\n";
    let file = tributary_edge::config::parse_file(Path::new("edge.toml"), text).expect("parses");
    let err = AgentConfig::resolve(file, &Overrides::default()).expect_err("no rules");
    assert_eq!(err.field(), Some("mqtt.topics"), "{err}");
    // Off loopback without passwords (it ran, open to the network).
    let text = "data_dir = \"/tmp/x\"\nedge_id = \"plant1\"\n[mqtt]\nlisten = \"0.0.0.0:1883\"\n[[mqtt.topics]]\nfilter = \"a/#\"\ntopic = \"/plant1/t\"\n";
    let file = tributary_edge::config::parse_file(Path::new("edge.toml"), text).expect("parses");
    let err = AgentConfig::resolve(file, &Overrides::default()).expect_err("open listener");
    assert_eq!(err.field(), Some("mqtt.listen"), "{err}");
    assert!(
        err.to_string().contains("needs passwords") && err.to_string().contains("password_file"),
        "{err}"
    );
}
