//! The tier service's example configurations in `configs/` parse and
//! validate with the real parser.

use std::path::Path;

use tributary_tier::TierConfig;

#[test]
fn the_example_configs_parse_and_validate() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if !name.starts_with("tier-") || !name.ends_with(".toml") {
            continue;
        }
        let config = TierConfig::from_file(&path).unwrap_or_else(|e| panic!("{e}"));
        config.validate().unwrap_or_else(|e| panic!("{name}: {e}"));
        seen += 1;
    }
    assert_eq!(seen, 2, "tier-local.toml and tier-s3.toml");
}
