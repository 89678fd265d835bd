//! `tier-service check-config`: every problem of a tier service
//! configuration, one line each, without starting anything ([`check`]),
//! then, if it has none and the broker answers, the archive prefix's owner
//! ([`check_owner`], read only).

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
    if let Some(why) = crate::service::foreign_data_dir(&config.data_dir)
        .or_else(|| not_a_broker_data_dir(&config.data_dir))
    {
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

/// How long `check-config` waits for the broker's cluster id.
const OWNER_CHECK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The archive prefix's owner, as the service would judge it at start-up
/// ([`crate::owner`]), read only: another cluster's or a damaged owner
/// object is a problem; an unreachable broker or bucket, an older broker
/// or an unclaimed prefix is a note. Nothing is written. Call it on a
/// configuration without problems (it builds the bucket and the client).
pub async fn check_owner(config: &TierConfig, report: &mut Report) {
    use crate::owner::{OwnerObjectState, read_owner};
    let setup = || -> Result<_, TierError> {
        let keys = tributary_proto::keys::StorageKeys::new(&config.prefix)?;
        let token = config.broker.resolve_token()?;
        let broker = crate::broker_api::BrokerClient::from_config(&config.broker, &token, &keys)?;
        Ok((keys, broker))
    };
    let (keys, broker) = match setup() {
        Ok(parts) => parts,
        Err(e) => return report.problem(line(e)),
    };
    let skipped = |why: String| format!("archive owner not checked: {why}");
    let ours = match tokio::time::timeout(OWNER_CHECK_TIMEOUT, broker.cluster_id()).await {
        Ok(Ok(Some(id))) => id,
        Ok(Ok(None)) => {
            return report.note(skipped(format!(
                "the broker at {} gives no cluster id (an older broker, or no id committed yet)",
                config.broker.url
            )));
        }
        Ok(Err(e)) => {
            return report.note(skipped(format!(
                "the broker at {} did not give its cluster id: {e}",
                config.broker.url
            )));
        }
        Err(_) => {
            return report.note(skipped(format!(
                "the broker at {} did not answer within {}s",
                config.broker.url,
                OWNER_CHECK_TIMEOUT.as_secs()
            )));
        }
    };
    // Read only: a local bucket directory that does not exist yet is not
    // created (then there is no owner object either).
    let bucket = match tributary_archive::Bucket::open_existing(&config.store) {
        Ok(bucket) => bucket,
        Err(e) => {
            return report.note(format!(
                "archive owner: the bucket cannot be opened read only ({e}); the service will \
                 claim the prefix for cluster {ours} if it holds no owner object"
            ));
        }
    };
    let key = keys.owner_object();
    let refusal = |found| crate::owner::refusal(found, ours, &bucket, &keys);
    match read_owner(&bucket, &keys).await {
        Ok(OwnerObjectState::Absent) => report.note(format!(
            "archive owner: {key} in {} is absent; the service will claim the prefix for cluster {ours}",
            bucket.description()
        )),
        Ok(found) => {
            if let Some(e) = refusal(found) {
                report.problem(line(e));
            }
        }
        Err(e) => report.note(skipped(format!("reading {key}: {e}"))),
    }
}
