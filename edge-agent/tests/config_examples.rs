//! The example configurations shipped in `configs/` load and validate with
//! the real parser (only the certificate paths are pointed at fresh
//! development certificates).

use std::path::Path;

use tributary_edge::{AgentConfig, Overrides};

#[test]
fn the_raspberry_pi_example_loads() {
    let dir = tempfile::tempdir().expect("tempdir");
    broker_core::dev_certs::issue(dir.path(), &[], &["plant1".into()]).expect("certs");
    let paths = broker_core::dev_certs::edge_paths(dir.path(), "plant1");
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
}
