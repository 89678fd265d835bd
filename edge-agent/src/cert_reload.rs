//! Certificate rotation of the running agent ([`CertReloader`], [`run`]).
//!
//! The replicator presents its client certificate through a
//! [`SwappableClientCert`]: rustls asks it at every handshake. On SIGHUP,
//! and when the `tls.cert` or `tls.key` file changes (checked every
//! `[tls] check_interval_ms`, default [`DEFAULT_CHECK_INTERVAL_MS`]; a
//! change counts once both files stayed the same for one more check, so a
//! key and a certificate replaced one after the other are loaded
//! together), the pair is loaded again: a pair that loads (readable,
//! not world-readable, the key is the certificate's) and keeps this
//! agent's identity replaces the old one; anything else is refused with a
//! warning naming the file and the old certificate stays in use. Nothing
//! else restarts: WALs, topics and open connections carry on; every new
//! connection presents the new certificate. The CA (`tls.ca`) is not
//! reloaded.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use broker_core::client_cert::SwappableClientCert;
use broker_core::tls::{TlsError, TlsPaths};
use tokio::sync::watch;
use tracing::{info, warn};

/// Default interval between checks of the certificate and key files, ms.
pub const DEFAULT_CHECK_INTERVAL_MS: u64 = 1000;

/// What identifies a file's content without reading it: size, modification
/// time, inode (a rename over it changes the inode).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileStamp {
    len: u64,
    modified_ns: i128,
    inode: u64,
}

fn stamp(path: &Path) -> Option<FileStamp> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).ok()?;
    Some(FileStamp {
        len: meta.len(),
        modified_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
        inode: meta.ino(),
    })
}

/// Both files' stamps.
type Stamps = (Option<FileStamp>, Option<FileStamp>);

/// Why a new certificate was refused (the old one stays in use).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReloadError {
    /// A file is unreadable, malformed, world-readable, or the key is not
    /// the certificate's (the message names the setting and file).
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The certificate is another edge's.
    #[error(
        "tls.cert: {} is the certificate of {}, not of this edge {expected:?}",
        path.display(),
        .found.as_deref().map_or_else(|| "no edge identity".to_owned(), |f| format!("{f:?}"))
    )]
    Identity {
        /// The certificate file.
        path: std::path::PathBuf,
        /// Its identity.
        found: Option<String>,
        /// This agent's edge id.
        expected: String,
    },
}

/// The certificate the replicator presents, and how to load it again.
#[derive(Debug)]
pub struct CertReloader {
    paths: TlsPaths,
    edge_id: String,
    slot: Arc<SwappableClientCert>,
    /// The stamps of the files in use, and those seen at the last check.
    stamps: Mutex<(Stamps, Stamps)>,
    /// Counts the swaps.
    swaps: watch::Sender<u64>,
}

impl CertReloader {
    /// Presents the pair of `paths` (already loaded as `initial`) for edge
    /// `edge_id`.
    ///
    /// # Errors
    /// [`TlsError`] if rustls cannot use `initial` (not expected: it loaded).
    pub fn new(
        paths: TlsPaths,
        edge_id: &str,
        initial: &broker_core::tls::TlsIdentity,
    ) -> Result<CertReloader, TlsError> {
        let now = (stamp(&paths.cert), stamp(&paths.key));
        Ok(CertReloader {
            slot: Arc::new(SwappableClientCert::new(initial.certified_key()?)),
            paths,
            edge_id: edge_id.to_owned(),
            stamps: Mutex::new((now, now)),
            swaps: watch::channel(0).0,
        })
    }

    /// What the replicator's TLS client resolves its certificate from.
    pub fn resolver(&self) -> Arc<SwappableClientCert> {
        self.slot.clone()
    }

    /// The replicator's view: the resolver and the swap counter.
    pub fn client_cert(&self) -> crate::replicator::ClientCert {
        crate::replicator::ClientCert {
            resolver: self.resolver(),
            changes: self.swaps.subscribe(),
        }
    }

    fn stamps(&self) -> std::sync::MutexGuard<'_, (Stamps, Stamps)> {
        self.stamps.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Loads the pair now and presents it from now on; on failure the old
    /// one stays. Returns the new certificate's identity.
    ///
    /// # Errors
    /// [`ReloadError`].
    pub fn reload(&self) -> Result<String, ReloadError> {
        let before = (stamp(&self.paths.cert), stamp(&self.paths.key));
        // Refused or not, these files were looked at: not again until they
        // change.
        *self.stamps() = (before, before);
        let identity = self.paths.load_identity("tls")?;
        let found = identity.identity();
        if found.as_deref() != Some(self.edge_id.as_str()) {
            return Err(ReloadError::Identity {
                path: self.paths.cert.clone(),
                found,
                expected: self.edge_id.clone(),
            });
        }
        // A pair from another CA (or expired) would be presented and
        // refused by every broker at the next connection: keep the old.
        identity.verify_client_chain()?;
        self.slot.replace(identity.certified_key()?);
        self.swaps.send_modify(|n| *n += 1);
        Ok(self.edge_id.clone())
    }

    /// One check of the files: `None` when nothing changed (or a change is
    /// not yet settled), else the outcome of [`CertReloader::reload`].
    pub fn check(&self) -> Option<Result<String, ReloadError>> {
        let now = (stamp(&self.paths.cert), stamp(&self.paths.key));
        {
            let mut stamps = self.stamps();
            let (in_use, last_seen) = *stamps;
            if now == in_use {
                stamps.1 = now;
                return None;
            }
            if now != last_seen {
                // Changed since the last check: wait for it to settle.
                stamps.1 = now;
                return None;
            }
        }
        Some(self.reload())
    }
}

/// Logs the outcome of a reload triggered by `trigger`.
fn report(trigger: &str, outcome: &Result<String, ReloadError>, paths: &TlsPaths) {
    match outcome {
        Ok(edge) => info!(
            trigger,
            edge = %edge,
            cert = %paths.cert.display(),
            "TLS certificate reloaded: new connections to brokers present it"
        ),
        Err(error) => warn!(
            trigger,
            %error,
            "new TLS certificate refused; the previous certificate stays in use"
        ),
    }
}

/// Reloads on SIGHUP and, with `interval`, when the files change, until
/// `shutdown` turns true.
pub async fn run(
    reloader: Arc<CertReloader>,
    interval: Option<Duration>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut hangup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        Ok(signal) => Some(signal),
        Err(error) => {
            warn!(%error, "no SIGHUP handler: the certificate reloads only when its files change");
            None
        }
    };
    loop {
        let tick = async {
            match interval {
                Some(interval) => tokio::time::sleep(interval).await,
                None => std::future::pending().await,
            }
        };
        let hup = async {
            match &mut hangup {
                Some(signal) => signal.recv().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = shutdown.wait_for(|&stop| stop) => return,
            received = hup => {
                if received.is_none() {
                    hangup = None;
                    continue;
                }
                report("SIGHUP", &reloader.reload(), &reloader.paths);
            }
            () = tick => {
                if let Some(outcome) = reloader.check() {
                    report("file change", &outcome, &reloader.paths);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use broker_core::dev_certs;
    use broker_core::tls::{TlsIdentity, certificate_identity};

    fn presented(reloader: &CertReloader) -> Vec<u8> {
        reloader.resolver().current().cert[0].as_ref().to_vec()
    }

    #[test]
    fn a_changed_pair_is_loaded_once_settled_and_a_bad_one_keeps_the_old() {
        let dir = tempfile::tempdir().unwrap();
        let certs = dir.path().join("certs");
        dev_certs::issue(&certs, &[], &["e1".into(), "e2".into()]).unwrap();
        let paths = dev_certs::edge_paths(&certs, "e1");
        let first = TlsIdentity::load(&paths).unwrap();
        let reloader = CertReloader::new(paths.clone(), "e1", &first).unwrap();
        let original = presented(&reloader);
        assert!(reloader.check().is_none(), "nothing changed");

        // A new pair for the same edge (same CA).
        let fresh = dir.path().join("fresh");
        std::fs::create_dir_all(&fresh).unwrap();
        std::fs::copy(certs.join("ca.pem"), fresh.join("ca.pem")).unwrap();
        let ca_dir = dev_certs::default_ca_dir(&certs).unwrap();
        dev_certs::issue_with_ca_dir(&fresh, &ca_dir, &[], &["e1".into()]).unwrap();
        let new = dev_certs::edge_paths(&fresh, "e1");
        std::fs::rename(&new.key, &paths.key).unwrap();
        assert!(reloader.check().is_none(), "just changed: wait one check");
        std::fs::rename(&new.cert, &paths.cert).unwrap();
        assert!(reloader.check().is_none(), "changed again: wait");
        let outcome = reloader.check().expect("settled: reloaded");
        assert_eq!(outcome.unwrap(), "e1");
        let rotated = presented(&reloader);
        assert_ne!(rotated, original);
        assert!(reloader.check().is_none(), "loaded once");

        // Garbage in the certificate file: refused, naming it; the rotated
        // certificate stays.
        std::fs::write(&paths.cert, "not a certificate").unwrap();
        assert!(reloader.check().is_none());
        let err = reloader.check().expect("settled").unwrap_err().to_string();
        assert!(err.contains("tls.cert"), "{err}");
        assert_eq!(presented(&reloader), rotated);
        assert!(reloader.check().is_none(), "a refused file is not retried");

        // Another edge's pair: refused by identity.
        let e2 = dev_certs::edge_paths(&certs, "e2");
        std::fs::copy(&e2.cert, &paths.cert).unwrap();
        std::fs::copy(&e2.key, &paths.key).unwrap();
        let err = reloader.reload().unwrap_err().to_string();
        assert!(
            err.contains("is the certificate of \"e2\", not of this edge \"e1\""),
            "{err}"
        );
        assert_eq!(presented(&reloader), rotated);

        // A pair for this edge from another CA (the config trial: it was
        // swapped in, then every broker refused it): refused, the rotated
        // certificate stays.
        let other = dir.path().join("other-ca");
        dev_certs::issue(&other, &[], &["e1".into()]).unwrap();
        let foreign = dev_certs::edge_paths(&other, "e1");
        std::fs::copy(&foreign.cert, &paths.cert).unwrap();
        std::fs::copy(&foreign.key, &paths.key).unwrap();
        let err = reloader.reload().unwrap_err().to_string();
        assert!(err.contains("not a valid client certificate"), "{err}");
        let key = reloader.resolver().current();
        assert_eq!(certificate_identity(&key.cert[0]).as_deref(), Some("e1"));
        assert_eq!(presented(&reloader), rotated);
    }
}
