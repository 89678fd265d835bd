//! `tribctl certs`: a development CA and certificates for brokers and edges
//! (see `broker_core::dev_certs` for the files and their identities).

use std::path::PathBuf;

/// Options of `tribctl certs`.
#[derive(Debug, clap::Args)]
pub struct CertsArgs {
    /// Directory for the PEM files (created if missing; an existing CA there
    /// is reused).
    #[arg(long, default_value = "certs")]
    pub out: PathBuf,
    /// Broker node ids to issue certificates for (repeatable).
    #[arg(long = "broker", value_name = "ID")]
    pub brokers: Vec<u64>,
    /// Edge ids to issue certificates for (repeatable). The edge id is also
    /// the namespace the edge may write to.
    #[arg(long = "edge", value_name = "EDGE_ID")]
    pub edges: Vec<String>,
}

/// Runs `tribctl certs`.
///
/// # Errors
/// An invalid edge id, I/O errors, an unreadable existing CA.
pub fn run(args: &CertsArgs) -> anyhow::Result<()> {
    broker_core::dev_certs::issue(&args.out, &args.brokers, &args.edges)?;
    let out = args.out.display();
    for id in &args.brokers {
        println!("broker {id}: {out}/broker-{id}.pem {out}/broker-{id}.key");
    }
    for edge in &args.edges {
        println!("edge {edge}: {out}/edge-{edge}.pem {out}/edge-{edge}.key");
    }
    println!("CA: {out}/ca.pem");
    Ok(())
}
