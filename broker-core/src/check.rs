//! `check-config`, shared by the three daemons: a [`Report`] collects
//! every problem of a configuration (one line each, naming the setting)
//! instead of stopping at the first, with checks that touch the host the
//! way the daemon would at start-up — without changing anything:
//!
//! - TLS files load and the key is the certificate's ([`Report::tls`]);
//! - a data directory is a writable directory, or is missing under a
//!   writable parent, which is only noted: the daemon creates it
//!   ([`Report::data_dir`]; writability is tried with a probe file that is
//!   removed at once);
//! - a listen address is one of this host's addresses (bound on port 0, so
//!   a running instance of the daemon holding the port does not fail the
//!   check) ([`Report::listen`]);
//! - a peer address resolves ([`Report::peer`]).
//!
//! [`Report::finish`] prints `ok` on stdout and returns success, or prints
//! `error: {setting}: {message}` per problem on stderr and returns
//! failure; notes go to stderr as `note: ...` either way.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crate::tls::{TlsIdentity, TlsPaths};

/// The problems and notes of one configuration check.
#[derive(Debug, Default)]
pub struct Report {
    problems: Vec<String>,
    notes: Vec<String>,
}

/// Which transport a listen address is for (QUIC listens on UDP).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// A TCP listener (HTTP APIs, MQTT, metrics).
    Tcp,
    /// A UDP socket (QUIC: Raft, ingest).
    Udp,
}

impl Report {
    /// An empty report.
    pub fn new() -> Report {
        Report::default()
    }

    /// Records a problem; `line` should start with the setting at fault
    /// (`tls.cert: ...`).
    pub fn problem(&mut self, line: impl Into<String>) {
        let line = line.into();
        if !self.problems.contains(&line) {
            self.problems.push(line);
        }
    }

    /// Records a note: not a problem, but worth saying (`data_dir` will be
    /// created).
    pub fn note(&mut self, line: impl Into<String>) {
        self.notes.push(line.into());
    }

    /// The problems so far, in the order found.
    pub fn problems(&self) -> &[String] {
        &self.problems
    }

    /// The notes so far.
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// Whether a problem line mentions `setting` (`tls.cert: ...`), e.g.
    /// to skip a check whose setting already failed validation.
    pub fn mentions(&self, setting: &str) -> bool {
        let prefix = format!("{setting}:");
        self.problems.iter().any(|p| p.starts_with(&prefix))
    }

    /// Loads the TLS files of `paths` (settings `{section}.cert`,
    /// `{section}.key`, `{section}.ca`), recording one problem per unusable
    /// file; the identity when all load.
    pub fn tls(&mut self, paths: &TlsPaths, section: &str) -> Option<TlsIdentity> {
        match paths.check(section) {
            Ok(identity) => Some(identity),
            Err(errors) => {
                for e in errors {
                    self.problem(e.to_string());
                }
                None
            }
        }
    }

    /// Checks that `path` (setting `setting`) is a directory this process
    /// may create files in; a missing one is a note when its nearest
    /// existing ancestor is a writable directory (the daemon creates it),
    /// a problem otherwise. The directory is not created; writability is
    /// tried with a probe file removed at once.
    pub fn data_dir(&mut self, setting: &str, path: &Path) {
        let shown = path.display();
        match std::fs::metadata(path) {
            Ok(meta) if !meta.is_dir() => {
                self.problem(format!("{setting}: {shown} is not a directory"));
            }
            Ok(_) => {
                if let Err(e) = writable(path) {
                    self.problem(format!("{setting}: {shown} is not writable: {e}"));
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
                ) =>
            {
                match existing_ancestor(path) {
                Some(parent) if parent.is_dir() => match writable(&parent) {
                    Ok(()) => self.note(format!(
                        "{setting}: {shown} does not exist yet; it will be created ({} is writable)",
                        parent.display()
                    )),
                    Err(e) => self.problem(format!(
                        "{setting}: {shown} does not exist and cannot be created: {} is not writable: {e}",
                        parent.display()
                    )),
                },
                Some(parent) => self.problem(format!(
                    "{setting}: {shown} cannot be created: {} is not a directory",
                    parent.display()
                )),
                None => self.problem(format!(
                    "{setting}: {shown} does not exist and no parent directory does"
                )),
                }
            }
            Err(e) => self.problem(format!("{setting}: {shown}: {e}")),
        }
    }

    /// Checks that `addr` (setting `setting`) names an address of this
    /// host: a socket of `transport` binds to its IP on an ephemeral port.
    /// The port itself is not tried (the running daemon may hold it).
    pub fn listen(&mut self, setting: &str, addr: SocketAddr, transport: Transport) {
        let probe = SocketAddr::new(addr.ip(), 0);
        let result = match transport {
            Transport::Tcp => std::net::TcpListener::bind(probe).map(drop),
            Transport::Udp => std::net::UdpSocket::bind(probe).map(drop),
        };
        if let Err(e) = result {
            self.problem(format!(
                "{setting}: {addr}: {} is not an address of this host: {e}",
                addr.ip()
            ));
        }
    }

    /// Checks that the peer `host_port` (setting `setting`) resolves to at
    /// least one address (DNS or a literal). Nothing is connected to.
    pub fn peer(&mut self, setting: &str, host_port: &str) {
        match host_port.to_socket_addrs().map(|mut addrs| addrs.next()) {
            Ok(Some(_)) => {}
            Ok(None) => self.problem(format!("{setting}: {host_port} resolves to no address")),
            Err(e) => self.problem(format!("{setting}: {host_port} does not resolve: {e}")),
        }
    }

    /// Prints the outcome: notes on stderr (`note: ...`), then `ok` on
    /// stdout and success, or every problem on stderr (`error: ...`, one
    /// line each) and failure.
    pub fn finish(&self) -> ExitCode {
        for note in &self.notes {
            eprintln!("note: {note}");
        }
        if self.problems.is_empty() {
            println!("ok");
            ExitCode::SUCCESS
        } else {
            for problem in &self.problems {
                eprintln!("error: {problem}");
            }
            ExitCode::FAILURE
        }
    }
}

/// The nearest ancestor of `path` that exists (`path` itself excluded).
fn existing_ancestor(path: &Path) -> Option<PathBuf> {
    let absolute = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir().ok()?.join(path)
    };
    absolute
        .ancestors()
        .skip(1)
        .find(|p| std::fs::symlink_metadata(p).is_ok())
        .map(Path::to_path_buf)
}

/// Whether this process may create files in the directory `dir`: a probe
/// file is created there with `O_EXCL` and removed at once (the only way to
/// learn it for every cause: permissions, ACLs, read-only mounts).
fn writable(dir: &Path) -> std::io::Result<()> {
    let probe = dir.join(format!(".check-config-{}", std::process::id()));
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)?;
    std::fs::remove_file(&probe)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_data_dir_under_a_writable_parent_is_a_note_and_nothing_is_created() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("a/b");
        let mut report = Report::new();
        report.data_dir("data_dir", &missing);
        assert_eq!(report.problems(), &[] as &[String]);
        assert_eq!(
            report.notes(),
            &[format!(
                "data_dir: {} does not exist yet; it will be created ({} is writable)",
                missing.display(),
                dir.path().display()
            )]
        );
        assert!(!dir.path().join("a").exists());
        report.data_dir("data_dir", dir.path());
        assert_eq!(report.problems(), &[] as &[String]);
    }

    #[test]
    fn a_file_as_data_dir_and_a_foreign_listen_address_are_problems() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, b"x").unwrap();
        let mut report = Report::new();
        report.data_dir("data_dir", &file);
        report.data_dir("data_dir", &file.join("sub"));
        // TEST-NET-1 (RFC 5737) is never an address of this host.
        report.listen(
            "admin_listen",
            "192.0.2.1:7400".parse().unwrap(),
            Transport::Tcp,
        );
        report.listen(
            "raft_listen",
            "127.0.0.1:7401".parse().unwrap(),
            Transport::Udp,
        );
        report.peer("members.2", "127.0.0.1:7411");
        report.peer("members.3", "no-port-here");
        let problems = report.problems();
        assert_eq!(problems.len(), 4, "{problems:?}");
        assert_eq!(
            problems[0],
            format!("data_dir: {} is not a directory", file.display())
        );
        assert_eq!(
            problems[1],
            format!(
                "data_dir: {} cannot be created: {} is not a directory",
                file.join("sub").display(),
                file.display()
            )
        );
        assert!(
            problems[2].starts_with(
                "admin_listen: 192.0.2.1:7400: 192.0.2.1 is not an address of this host: "
            ),
            "{}",
            problems[2]
        );
        assert!(
            problems[3].starts_with("members.3: no-port-here does not resolve: "),
            "{}",
            problems[3]
        );
    }
}
