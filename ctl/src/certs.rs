//! `tribctl certs`: a development CA and certificates for brokers and edges
//! (see `broker_core::dev_certs` for the files and their identities). The
//! CA's private key goes to its own directory (`--ca-dir`, default
//! `{out}-ca`), never into `--out`, whose files are what brokers and
//! devices get.

use std::path::PathBuf;

/// Options of `tribctl certs`.
#[derive(Debug, clap::Args)]
pub struct CertsArgs {
    /// Directory for the certificates and keys brokers and edges use, and
    /// the CA certificate `ca.pem` (created if missing; an existing CA is
    /// reused).
    #[arg(long, default_value = "certs")]
    pub out: PathBuf,
    /// Directory for the CA's private key `ca.key` (mode 0700, created if
    /// missing). Default: `{out}-ca` beside `--out`. Keep it off devices;
    /// a broker's `[enroll] ca_key` points at it to sign enrolling edges.
    #[arg(long, value_name = "DIR")]
    pub ca_dir: Option<PathBuf>,
    /// Broker node ids to issue certificates for (repeatable; at least 1,
    /// as a broker's `node_id`).
    #[arg(long = "broker", value_name = "ID", value_parser = clap::value_parser!(u64).range(1..))]
    pub brokers: Vec<u64>,
    /// Edge ids to issue certificates for (repeatable). The edge id is also
    /// the namespace the edge may write to.
    #[arg(long = "edge", value_name = "EDGE_ID")]
    pub edges: Vec<String>,
    /// A DNS name or IP address clients reach the brokers by (repeatable):
    /// every broker certificate issued carries it, besides `localhost` and
    /// `127.0.0.1`, so HTTPS to `https://NAME:port` (enrollment, tribctl,
    /// consumer redirects) verifies.
    #[arg(long = "broker-host", value_name = "NAME_OR_IP")]
    pub broker_hosts: Vec<String>,
}

/// Runs `tribctl certs`; returns what to print: one line per certificate,
/// then the CA certificate and the CA key (and a line when a key of the
/// old layout was moved out of `--out`).
///
/// # Errors
/// An invalid edge id, I/O errors, an unreadable existing CA, half a CA.
pub fn run(args: &CertsArgs) -> anyhow::Result<String> {
    use broker_core::dev_certs;
    if !args.broker_hosts.is_empty() && args.brokers.is_empty() {
        anyhow::bail!("--broker-host names go into broker certificates: give --broker ID too");
    }
    let ca_dir = match &args.ca_dir {
        Some(ca_dir) => ca_dir.clone(),
        None => dev_certs::default_ca_dir(&args.out).ok_or_else(|| {
            anyhow::anyhow!(
                "--out {} has no parent directory for the CA key; give --ca-dir",
                args.out.display()
            )
        })?,
    };
    let issued = dev_certs::issue_for_hosts(
        &args.out,
        &ca_dir,
        &args.brokers,
        &args.broker_hosts,
        &args.edges,
    )?;
    let out = args.out.display();
    let mut text = String::new();
    for id in &args.brokers {
        text.push_str(&format!(
            "broker {id}: {out}/broker-{id}.pem {out}/broker-{id}.key\n"
        ));
    }
    for edge in &args.edges {
        text.push_str(&format!(
            "edge {edge}: {out}/edge-{edge}.pem {out}/edge-{edge}.key\n"
        ));
    }
    text.push_str(&format!("CA: {out}/ca.pem\n"));
    if let Some(old) = &issued.ca_key_moved_from {
        text.push_str(&format!(
            "moved the CA key {} out of {out} (devices get {out})\n",
            old.display()
        ));
    }
    text.push_str(&format!(
        "CA key: {} (keep it off devices; a broker's [enroll] ca_key)\n",
        issued.ca_key.display()
    ));
    Ok(text)
}
