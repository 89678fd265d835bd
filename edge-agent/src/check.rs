//! `edge-agent check-config`: every problem of an agent configuration, one
//! line each, without starting anything ([`check`]).
//!
//! Validation ([`AgentConfig::resolve`]) stops at its first error, which
//! is reported; the checks that touch the host (TLS files, the data
//! directory, addresses) run on the merged file and flag values even then,
//! skipping a setting the validation error already names.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use broker_core::catalog::{Catalog, CatalogError, TopicSpec};
use broker_core::check::{Report, Transport};
use broker_core::clock::SystemClock;
use broker_core::data_dir::{self, Found, Owner};
use broker_core::metadata::MetadataError;
use broker_core::metadata::redb::RedbStore;
use broker_core::tls::{TlsError, TlsPaths};

use crate::config::{self, AgentConfig, ConfigError, FileConfig, Overrides};
use crate::manager::OpenError;

/// What the host checks look at: the resolved configuration's values, or,
/// when it does not validate, the file's merged with the flags.
struct Targets {
    data_dir: Option<PathBuf>,
    /// The configured owner of the data directory (only when the
    /// configuration resolves: `edge_id` may come from the certificate).
    owner: Option<Owner>,
    tls: Option<TlsPaths>,
    local_api: SocketAddr,
    brokers: Vec<String>,
    mqtt_listen: Option<SocketAddr>,
    local_api_tls: Option<config::local_api::LocalApiTls>,
}

impl Targets {
    fn resolved(config: &AgentConfig) -> Targets {
        Targets {
            data_dir: Some(config.data_dir.clone()),
            owner: Some(Owner::EdgeAgent {
                edge_id: config.edge_id.as_str().to_owned(),
            }),
            tls: config.tls.clone(),
            local_api: config.local_api,
            brokers: config.brokers.clone(),
            mqtt_listen: config.mqtt.as_ref().map(|m| m.listen),
            local_api_tls: config.local_api_security.tls.clone(),
        }
    }

    fn raw(file: &FileConfig, overrides: &Overrides) -> Targets {
        let tls_file = file.tls.as_ref();
        let cert = overrides
            .tls_cert
            .clone()
            .or_else(|| tls_file.map(|t| t.cert.clone()));
        let key = overrides
            .tls_key
            .clone()
            .or_else(|| tls_file.map(|t| t.key.clone()));
        let ca = overrides
            .tls_ca
            .clone()
            .or_else(|| tls_file.map(|t| t.ca.clone()));
        Targets {
            data_dir: overrides.data_dir.clone().or_else(|| file.data_dir.clone()),
            owner: None,
            tls: match (cert, key, ca) {
                (Some(cert), Some(key), Some(ca)) => Some(TlsPaths { cert, key, ca }),
                _ => None,
            },
            local_api: overrides
                .local_api
                .or(file.local_api)
                .unwrap_or_else(config::default_local_api),
            brokers: if overrides.brokers.is_empty() {
                file.brokers.clone()
            } else {
                overrides.brokers.clone()
            },
            mqtt_listen: None,
            local_api_tls: None,
        }
    }
}

/// Checks the configuration at `path` (if any) with `overrides` as `run`
/// would load it, collecting every problem: the file's syntax, validation,
/// the TLS files, the data directory, its identity file, its metadata
/// store and the intents stored in it, the local API and MQTT addresses
/// and the brokers' addresses. Nothing is bound, created or connected to
/// (the stored intents are read from a copy in `TMPDIR`, removed after).
pub fn check(path: Option<&Path>, overrides: &Overrides) -> Report {
    let mut report = Report::new();
    let file = match path.map(read_file).transpose() {
        Ok(file) => file.unwrap_or_default(),
        Err(e) => {
            // Nothing else can be checked without the file.
            report.problem(e.to_string());
            return report;
        }
    };
    let resolved = AgentConfig::resolve(file.clone(), overrides);
    let targets = match &resolved {
        Ok(config) => Targets::resolved(config),
        Err(e) => {
            report.problem(e.to_string());
            Targets::raw(&file, overrides)
        }
    };
    if let Some(dir) = &targets.data_dir
        && !dir.as_os_str().is_empty()
        && !report.mentions("data_dir")
    {
        report.data_dir("data_dir", dir);
        if let Some(owner) = &targets.owner
            && !report.mentions("data_dir")
        {
            data_dir_identity(&mut report, dir, owner);
        }
        if let Ok(config) = &resolved
            && !report.mentions("data_dir")
        {
            metadata_store(&mut report, config);
        }
    }
    if let Some(paths) = &targets.tls {
        match paths.check("tls") {
            // Brokers refuse a certificate of another CA (or an expired
            // one) in the handshake; say so before deploying.
            Ok(identity) => {
                if let Err(e) = identity.verify_client_chain() {
                    report.problem(format!("tls.cert: {e}"));
                }
            }
            Err(errors) => {
                for e in errors {
                    let named = match &e {
                        TlsError::Setting { setting, .. } => report.mentions(setting),
                        _ => false,
                    };
                    if !named {
                        report.problem(e.to_string());
                    }
                }
            }
        }
    }
    report.listen("local_api", targets.local_api, Transport::Tcp);
    if let Some(tls) = &targets.local_api_tls
        && let Err(e) = crate::api_access::server_config(tls)
    {
        report.problem(e.to_string());
    }
    if let Some(addr) = targets.mqtt_listen {
        if addr == targets.local_api {
            // Both bind at start; the second would fail "in use".
            report.problem(format!(
                "mqtt.listen: {addr} is also local_api; give the MQTT listener another port"
            ));
        }
        report.listen("mqtt.listen", addr, Transport::Tcp);
    }
    for (i, broker) in targets.brokers.iter().enumerate() {
        report.peer(&format!("brokers[{i}]"), broker);
    }
    report
}

/// The data directory's identity file against `edge_id`
/// ([`data_dir::inspect`]): a refusal is a `data_dir` problem; a directory
/// from before identity files is a note (start-up writes the file).
fn data_dir_identity(report: &mut Report, dir: &Path, owner: &Owner) {
    match data_dir::inspect(dir, owner) {
        Ok(Found::Matches | Found::Fresh) => {}
        Ok(Found::Adopted) => report.note(format!(
            "data_dir: {} has no identity file yet (written before identity files): start-up \
             writes {} for {owner}",
            dir.display(),
            data_dir::identity_path(dir).display()
        )),
        Err(e) => report.problem(format!("data_dir: {e}")),
    }
}

/// The data directory's metadata store as start-up will open it: a file
/// start-up cannot open (not a regular file, a dangling link, no read or
/// write permission) is a problem; then each configured topic's intent
/// against the settings stored for it: start-up refuses a difference
/// ([`crate::manager::OpenError::IntentConflict`]), so the check says it
/// first, in the same words. The store is read from a copy in the
/// temporary directory (`TMPDIR`; it is not created): the check never
/// writes the agent's file (opening a store left open repairs it) and
/// works while the agent runs (which holds the file's lock). A damaged
/// store is a note: start-up moves it aside and rebuilds it from the
/// configuration, so the configured intents are taken as they are.
fn metadata_store(report: &mut Report, config: &AgentConfig) {
    let file = config.data_dir.join(crate::agent::METADATA_FILE);
    let topics = config.data_dir.join("topics");
    if topics.symlink_metadata().is_ok() && !topics.is_dir() {
        report.problem(format!(
            "data_dir: {} is not a directory (the agent keeps its WALs there)",
            topics.display()
        ));
    }
    match std::fs::symlink_metadata(&file) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
        Err(e) => return report.problem(format!("data_dir: {}: {e}", file.display())),
        Ok(_) => {}
    }
    let unusable = match std::fs::metadata(&file) {
        Err(e) => Some(format!("{e} (a dangling link?)")),
        Ok(m) if !m.is_file() => Some("not a regular file".to_owned()),
        // Start-up opens it for reading and writing.
        Ok(_) => std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&file)
            .err()
            .map(|e| e.to_string()),
    };
    if let Some(reason) = unusable {
        return report.problem(format!(
            "data_dir: the metadata store {} cannot be opened: {reason}",
            file.display()
        ));
    }
    if config.topics.is_empty() {
        return;
    }
    let scratch = std::env::temp_dir().join(format!(
        "tributary-check-config-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    ));
    let outcome = compare_intents(config, &file, &scratch);
    // Best effort: the copy is the check's own.
    let _ = std::fs::remove_dir_all(&scratch);
    match outcome {
        Ok(conflicts) => {
            for conflict in conflicts {
                report.problem(conflict.to_string());
            }
        }
        Err(Unread::Damaged(reason)) => report.note(format!(
            "data_dir: the metadata store {} is damaged ({reason}): start-up moves it aside and \
             rebuilds it from this configuration and the WAL directories, taking the configured \
             intents as they are",
            file.display()
        )),
        Err(Unread::Other(reason)) => report.note(format!(
            "data_dir: the configured intents were not compared with the ones stored in {} \
             ({reason}); start-up refuses an intent that differs",
            file.display()
        )),
    }
}

/// Why the stored intents were not compared.
enum Unread {
    /// The store's copy is damaged (so is the store, unless it was being
    /// written while copied).
    Damaged(String),
    /// The copy could not be made or read.
    Other(String),
}

/// The configured topics whose intent differs from the stored one, read
/// from a copy of `file` made in `scratch`.
fn compare_intents(
    config: &AgentConfig,
    file: &Path,
    scratch: &Path,
) -> Result<Vec<OpenError>, Unread> {
    let other = |e: &dyn std::fmt::Display| Unread::Other(e.to_string());
    std::fs::create_dir(scratch)
        .map_err(|e| Unread::Other(format!("{}: {e}", scratch.display())))?;
    let copy = scratch.join(crate::agent::METADATA_FILE);
    std::fs::copy(file, &copy).map_err(|e| other(&e))?;
    // The copy's path means nothing to the reader: name the store's.
    let named = |e: MetadataError| {
        e.to_string()
            .replace(&copy.display().to_string(), &file.display().to_string())
    };
    let store = RedbStore::open(&copy, Arc::new(SystemClock)).map_err(|e| match e {
        e @ MetadataError::Damaged { .. } => Unread::Damaged(named(e)),
        e => Unread::Other(named(e)),
    })?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .map_err(|e| other(&e))?;
    runtime.block_on(async {
        let catalog = Catalog::new(&store);
        let mut conflicts = Vec::new();
        for (index, topic) in config.topics.iter().enumerate() {
            let spec =
                TopicSpec::new(topic.name.clone(), topic.intent, 0).map_err(|e| other(&e))?;
            let comparison = catalog.compare(&spec).await.map_err(|e| other(&e))?;
            if comparison.existing_partitions().is_some() && !comparison.differences().is_empty() {
                conflicts.push(OpenError::IntentConflict {
                    index,
                    source: CatalogError::TopicConflict {
                        topic: topic.name.clone(),
                        differences: comparison.into_differences(),
                    },
                });
            }
        }
        Ok(conflicts)
    })
}

fn read_file(path: &Path) -> Result<FileConfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    config::parse_file(path, &text)
}
