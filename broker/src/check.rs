//! `broker check-config`: every problem of a broker configuration, one
//! line each, without starting anything ([`check`]); and the rule that a
//! broker runs only with its own certificate ([`own_identity`]), which
//! start-up applies too.

use broker_core::check::{Report, Transport};
use broker_core::tls::{TlsIdentity, TlsPaths};

use crate::config::{BrokerConfig, ConfigError};

/// Refuses a certificate whose identity is not `broker-{node_id}` (an
/// edge's certificate, another broker's): the other brokers would refuse
/// its Raft connections, and it would speak to edges as someone else.
///
/// # Errors
/// [`ConfigError::Invalid`] for `tls.cert`, naming both identities.
pub fn own_identity(
    config: &BrokerConfig,
    paths: &TlsPaths,
    identity: &TlsIdentity,
) -> Result<(), ConfigError> {
    let expected = config.expected_identity();
    let actual = identity.identity();
    if actual.as_deref() == Some(expected.as_str()) {
        return Ok(());
    }
    let actual = match actual {
        Some(name) => format!("is the certificate of {name:?}"),
        None => "has no identity (no DNS name, no common name)".to_owned(),
    };
    Err(ConfigError::Invalid {
        field: "tls.cert",
        reason: format!(
            "{} {actual}, not of this broker: node_id {} needs a certificate for {expected:?} \
             (`tribctl certs --broker {}` makes a development one)",
            paths.cert.display(),
            config.node_id,
            config.node_id
        ),
    })
}

/// The line of a problem: `{setting}: {reason}` for an invalid setting
/// (as the other daemons' checks say it), else the error's message.
fn line(error: &ConfigError) -> String {
    match error {
        ConfigError::Invalid { field, reason } => format!("{field}: {reason}"),
        other => other.to_string(),
    }
}

/// The data directory's identity file against `node_id`
/// ([`broker_core::data_dir::inspect`]): a refusal is a `data_dir` problem;
/// a directory from before identity files is a note (start-up writes the
/// file).
fn data_dir_identity(report: &mut Report, config: &BrokerConfig) {
    use broker_core::data_dir::{self, Found, Owner};
    let owner = Owner::Broker {
        node_id: config.node_id,
    };
    match data_dir::inspect(&config.data_dir, &owner) {
        Ok(Found::Matches | Found::Fresh) => {}
        Ok(Found::Adopted) => report.note(format!(
            "data_dir: {} has no identity file yet (written before identity files): start-up \
             writes {} for {owner}",
            config.data_dir.display(),
            data_dir::identity_path(&config.data_dir).display()
        )),
        Err(e) => report.problem(format!("data_dir: {e}")),
    }
}

/// Checks `config` as the broker would at start-up, collecting every
/// problem: secrets (token file), values, the TLS files and the
/// certificate's identity, the data directory and its identity file, the
/// listen addresses, the Raft members' and advertised addresses, the
/// `[enroll]` CA and the `[archive]` bucket.
/// Nothing is bound, created or connected to.
pub fn check(mut config: BrokerConfig) -> Report {
    let mut report = Report::new();
    if let Err(e) = config.resolve_secrets() {
        report.problem(line(&e));
    }
    for e in config.problems() {
        report.problem(line(&e));
    }
    if let Some(paths) = &config.tls
        && let Some(identity) = report.tls(paths, "tls")
        && let Err(e) = own_identity(&config, paths, &identity)
    {
        report.problem(line(&e));
    }
    report.data_dir("data_dir", &config.data_dir);
    if !report.mentions("data_dir") {
        data_dir_identity(&mut report, &config);
    }
    report.listen("raft_listen", config.raft_listen, Transport::Udp);
    report.listen("admin_listen", config.admin_listen, Transport::Tcp);
    report.listen("ingest_listen", config.ingest_listen, Transport::Udp);
    for (id, addr) in &config.members {
        // A malformed one is among the configuration's problems already.
        if crate::config::member_address_ok(addr) {
            report.peer(&format!("members.{id}"), addr);
        }
    }
    if let Some(own) = config.members.get(&config.node_id)
        && let Some(note) = crate::config::own_member_problem(own, config.raft_listen)
    {
        report.note(format!(
            "members.{}: {note} (fine only behind a port mapping)",
            config.node_id
        ));
    }
    if let Some(addr) = &config.cluster.advertised_ingest {
        report.peer("cluster.advertised_ingest", addr);
    }
    if let (Some(enroll), Some(paths)) = (&config.enroll, &config.tls)
        && let Err(e) = crate::enroll::Signer::load(enroll, &paths.ca)
    {
        report.problem(e.to_string());
    }
    if let Some(archive) = &config.archive {
        match archive.store.local_dir() {
            // Opening a local bucket creates a missing directory (the tier
            // service fills it): a note then, as for the data directory.
            Some(dir) => report.data_dir("archive.store.url", &dir),
            None => {
                if let Err(e) = tributary_archive::Bucket::open(&archive.store) {
                    report.problem(format!("archive.store: {e}"));
                }
            }
        }
    }
    report
}
