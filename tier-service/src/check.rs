//! `tier-service check-config`: every problem of a tier service
//! configuration, one line each, without starting anything ([`check`]).

use broker_core::check::{Report, Transport};
use broker_core::tls::{TlsError, https_client_config, load_certs, load_key, load_roots};

use crate::config::TierConfig;
use crate::error::TierError;

/// The line of a problem: a configuration error's message as it is (it
/// names the setting), other errors as displayed.
fn line(error: TierError) -> String {
    match error {
        TierError::Config(message) => message,
        other => other.to_string(),
    }
}

/// Checks `config` as the tier service would at start-up, collecting
/// every problem: values, the broker token, the `[broker]` TLS files, the
/// data directory (the broker's, which the service locks and reads), the
/// metrics address, the broker URL's host and the bucket (a local bucket
/// directory must be writable or creatable). Nothing is bound, created or
/// connected to.
pub fn check(config: &TierConfig) -> Report {
    let mut report = Report::new();
    for e in config.problems() {
        report.problem(line(e));
    }
    if let Err(e) = config.broker.resolve_token() {
        report.problem(line(e));
    }
    check_broker_tls(config, &mut report);
    report.data_dir("data_dir", &config.data_dir);
    if let Some(why) = not_a_broker_data_dir(&config.data_dir) {
        report.problem(why);
    }
    report.listen("metrics_listen", config.metrics_listen, Transport::Tcp);
    match reqwest::Url::parse(&config.broker.url) {
        Ok(url) => match (url.host_str(), url.port_or_known_default()) {
            (Some(host), Some(port)) => {
                let host = host.trim_start_matches('[').trim_end_matches(']');
                let peer = if host.contains(':') {
                    format!("[{host}]:{port}")
                } else {
                    format!("{host}:{port}")
                };
                report.peer("broker.url", &peer);
            }
            _ => report.problem(format!(
                "broker.url: {} has no host and port",
                config.broker.url
            )),
        },
        Err(e) => report.problem(format!("broker.url: {}: {e}", config.broker.url)),
    }
    match config.store.local_dir() {
        Some(dir) => report.data_dir("store.url", &dir),
        None if config.store.url.is_some() => {
            if let Err(e) = tributary_archive::Bucket::open(&config.store) {
                report.problem(format!("store: {e}"));
            }
        }
        // Reported by problems().
        None => {}
    }
    report
}

/// Why `dir` is clearly not a broker's data directory: it holds files but
/// neither `topics/` (the WALs the service tiers) nor `raft/`. A missing or
/// empty directory passes: the broker may not have run yet.
fn not_a_broker_data_dir(dir: &std::path::Path) -> Option<String> {
    let mut entries = std::fs::read_dir(dir).ok()?;
    if entries.next().is_none() || dir.join("topics").is_dir() || dir.join("raft").is_dir() {
        return None;
    }
    Some(format!(
        "data_dir: {} holds neither topics/ nor raft/: it is not a broker's data directory \
         (the tier service tiers the WALs in {{data_dir}}/topics)",
        dir.display()
    ))
}

/// The `[broker]` CA, client certificate and key, each named by its
/// setting; a key that is not the certificate's is a `broker.key` problem.
fn check_broker_tls(config: &TierConfig, report: &mut Report) {
    let broker = &config.broker;
    let mut say = |setting: &str, e: TlsError| report.problem(e.for_setting(setting).to_string());
    let ca_ok = match &broker.ca {
        Some(ca) => load_roots(ca).map_err(|e| say("broker.ca", e)).is_ok(),
        None => false,
    };
    let (Some(cert), Some(key)) = (&broker.cert, &broker.key) else {
        return;
    };
    let cert_ok = load_certs(cert).map_err(|e| say("broker.cert", e)).is_ok();
    let key_ok = load_key(key).map_err(|e| say("broker.key", e)).is_ok();
    if let (true, true, true, Some(ca)) = (ca_ok, cert_ok, key_ok, &broker.ca)
        && let Err(e) = https_client_config(ca, Some((cert, key)))
    {
        say("broker.key", e);
    }
}
