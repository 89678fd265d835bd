//! `tribctl`: Tributary's admin CLI and archive browser.

use clap::Parser;

/// Tributary admin CLI: topics, failure policies, declarative apply, archive.
#[derive(Debug, Parser)]
#[command(name = "tribctl", version, about)]
struct Cli {}

fn main() -> anyhow::Result<()> {
    let _cli = Cli::parse();
    anyhow::bail!("tribctl has no commands yet")
}
