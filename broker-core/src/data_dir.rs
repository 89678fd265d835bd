//! Whose a data directory is: `{data_dir}/identity.json` names the
//! component that owns the directory (`broker` or `edge-agent`) and its
//! identity in the configuration (a broker's `node_id`, an edge agent's
//! `edge_id`), so that a configuration change that would strand or damage
//! the stored data is refused at start instead of running on (layout in
//! `FORMAT.md`, "Data directory identity").
//!
//! [`claim`] (start-up) and [`inspect`] (`check-config`, read-only) decide:
//!
//! | `identity.json` | directory | outcome |
//! |---|---|---|
//! | names this component and id | any | [`Found::Matches`] |
//! | names another component or id | any | refused: [`IdentityError::Mismatch`] |
//! | unreadable, garbled, newer format | any | refused: [`IdentityError::Garbled`], [`IdentityError::Io`]; never rewritten |
//! | missing | holds the other component's layout (`raft/`, `metadata.redb`) | refused: [`IdentityError::ForeignLayout`] |
//! | missing | an edge's, with topics of another namespace | refused: [`IdentityError::OtherNamespace`] |
//! | missing | holds this component's data (from before identity files) | [`Found::Adopted`]: written from the configuration |
//! | missing | missing or holds no data | [`Found::Fresh`]: written from the configuration |
//!
//! The file is written atomically ([`write_file_atomic`]: temporary file,
//! `fdatasync`, rename, directory fsync) and never rewritten once there.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::wal::storage::{FsStorage, read_file, write_file_atomic};

/// File name of the identity file in a data directory.
pub const IDENTITY_FILE: &str = "identity.json";

/// The format version this code writes and reads. Version 1: a JSON object
/// with `format_version`, `component` and `node_id` (broker) or `edge_id`
/// (edge agent).
pub const FORMAT_VERSION: u32 = 1;

/// A larger file is not an identity file (version 1 is under 100 bytes).
const IDENTITY_BYTES_MAX: u64 = 4096;

/// The directory of WALs in both components' data directories
/// (`topics/{ns}/{topic}/`).
const TOPICS_DIR: &str = "topics";

/// What only a broker's data directory holds (its Raft state).
const BROKER_MARKER: &str = "raft";

/// What only an edge agent's data directory holds (its local metadata
/// store).
const EDGE_MARKER: &str = "metadata.redb";

/// The owner of a data directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
    /// A broker, by its Raft `node_id`.
    Broker {
        /// `node_id` (>= 1).
        node_id: u64,
    },
    /// An edge agent, by its `edge_id` (the namespace it writes).
    EdgeAgent {
        /// `edge_id`.
        edge_id: String,
    },
}

impl Owner {
    /// The component's name as the file spells it: `broker`, `edge-agent`.
    pub fn component(&self) -> &'static str {
        match self {
            Owner::Broker { .. } => "broker",
            Owner::EdgeAgent { .. } => "edge-agent",
        }
    }

    /// The file's bytes: pretty JSON and a final newline.
    pub fn encode(&self) -> Vec<u8> {
        let file = FileV1 {
            format_version: FORMAT_VERSION,
            component: self.component().to_owned(),
            node_id: match self {
                Owner::Broker { node_id } => Some(*node_id),
                Owner::EdgeAgent { .. } => None,
            },
            edge_id: match self {
                Owner::EdgeAgent { edge_id } => Some(edge_id.clone()),
                Owner::Broker { .. } => None,
            },
        };
        // A struct of integers and strings always serializes.
        let mut bytes = serde_json::to_vec_pretty(&file).unwrap_or_default();
        bytes.push(b'\n');
        bytes
    }

    /// Parses the file's bytes.
    ///
    /// # Errors
    /// [`DecodeError`]: not JSON, a newer or unknown format version, an
    /// unknown component, a missing, extra or invalid field.
    pub fn decode(bytes: &[u8]) -> Result<Owner, DecodeError> {
        let version: Version =
            serde_json::from_slice(bytes).map_err(|e| DecodeError::Json(e.to_string()))?;
        if version.format_version > FORMAT_VERSION {
            return Err(DecodeError::NewerFormat {
                found: version.format_version,
            });
        }
        if version.format_version != FORMAT_VERSION {
            return Err(DecodeError::Invalid(format!(
                "format_version {} does not exist",
                version.format_version
            )));
        }
        let file: FileV1 =
            serde_json::from_slice(bytes).map_err(|e| DecodeError::Json(e.to_string()))?;
        match (file.component.as_str(), file.node_id, file.edge_id) {
            ("broker", Some(node_id), None) if node_id >= 1 => Ok(Owner::Broker { node_id }),
            ("broker", _, _) => Err(DecodeError::Invalid(
                "a broker's file needs node_id (>= 1) and no edge_id".into(),
            )),
            ("edge-agent", None, Some(edge_id)) if !edge_id.is_empty() => {
                Ok(Owner::EdgeAgent { edge_id })
            }
            ("edge-agent", _, _) => Err(DecodeError::Invalid(
                "an edge agent's file needs a non-empty edge_id and no node_id".into(),
            )),
            (other, _, _) => Err(DecodeError::Invalid(format!(
                "unknown component {other:?} (expected \"broker\" or \"edge-agent\")"
            ))),
        }
    }

    /// The setting that carries the identity: `node_id`, `edge_id`.
    fn setting(&self) -> &'static str {
        match self {
            Owner::Broker { .. } => "node_id",
            Owner::EdgeAgent { .. } => "edge_id",
        }
    }

    /// The identity's value as the configuration writes it.
    fn value(&self) -> String {
        match self {
            Owner::Broker { node_id } => node_id.to_string(),
            Owner::EdgeAgent { edge_id } => format!("{edge_id:?}"),
        }
    }
}

/// `broker node_id 1`, `edge-agent edge_id "plant1"`.
impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} {}",
            self.component(),
            self.setting(),
            self.value()
        )
    }
}

/// The version alone, read first so a newer file is named as such.
#[derive(Deserialize)]
struct Version {
    format_version: u32,
}

/// Version 1 of the file. Frozen: a change is a new format version.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileV1 {
    format_version: u32,
    component: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    node_id: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    edge_id: Option<String>,
}

/// Why an identity file's bytes are not an identity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// Not the JSON object of the format (or not UTF-8).
    #[error("not an identity file: {0}")]
    Json(String),
    /// Written by a newer version of Tributary.
    #[error(
        "format_version {found} is newer than this version of Tributary reads ({FORMAT_VERSION})"
    )]
    NewerFormat {
        /// The file's version.
        found: u32,
    },
    /// Well-formed JSON with values the format does not allow.
    #[error("{0}")]
    Invalid(String),
}

/// What [`inspect`] or [`claim`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    /// The file names the configured owner.
    Matches,
    /// No file, and the directory is missing or holds no data: the file is
    /// written ([`claim`]) before anything else.
    Fresh,
    /// No file, but the directory holds this component's data from before
    /// identity files: the file is written from the configuration
    /// ([`claim`]).
    Adopted,
}

/// Why a data directory may not be used with this configuration.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IdentityError {
    /// The file names another component or another identity.
    #[error("{}", mismatch(.path, .stored, .configured))]
    Mismatch {
        /// The identity file.
        path: PathBuf,
        /// What the file says.
        stored: Owner,
        /// What the configuration says.
        configured: Owner,
    },
    /// The file cannot be parsed.
    #[error(
        "{path}: {source}; refusing to start and leaving the file as it is. If it was damaged, \
         restore it (the format is in FORMAT.md, \"Data directory identity\"), or remove it to \
         have it written from this configuration ({configured}) at the next start",
        path = .path.display()
    )]
    Garbled {
        /// The identity file.
        path: PathBuf,
        /// What is wrong with it.
        source: DecodeError,
        /// What the configuration says.
        configured: Owner,
    },
    /// The directory has no identity file but holds the other component's
    /// files (from before identity files).
    #[error(
        "{dir} has no {IDENTITY_FILE} but holds {marker}, so it is {whose}: refusing to start \
         {configured} on it. Point data_dir at this {component}'s own directory",
        dir = .dir.display(),
        marker = .marker.display(),
        component = .configured.component(),
    )]
    ForeignLayout {
        /// The data directory.
        dir: PathBuf,
        /// The other component's file or directory found in it.
        marker: PathBuf,
        /// `a broker's data directory`, `an edge agent's data directory`.
        whose: &'static str,
        /// What the configuration says.
        configured: Owner,
    },
    /// An edge's directory has no identity file and holds topics of
    /// namespaces other than the configured `edge_id`: the `edge_id` was
    /// changed, and their backlog would never be replicated.
    #[error(
        "{dir} has no {IDENTITY_FILE} and holds the topics of namespace(s) {namespaces} \
         (under {topics}), not of edge_id {edge_id:?}: edge_id was changed, and their records \
         not yet replicated would never be sent; refusing to start. Set edge_id back to the \
         old value and let the backlog drain, then move {dir} aside to start under a new \
         edge_id",
        dir = .dir.display(),
        topics = .dir.join(TOPICS_DIR).display(),
        namespaces = .namespaces.join(", "),
    )]
    OtherNamespace {
        /// The data directory.
        dir: PathBuf,
        /// The namespaces found under `topics/`.
        namespaces: Vec<String>,
        /// The configured `edge_id`.
        edge_id: String,
    },
    /// Reading the file, or writing it, failed.
    #[error("{path}: {op}: {source}", path = .path.display())]
    Io {
        /// The identity file (or the data directory).
        path: PathBuf,
        /// `read`, `write`, `list`.
        op: &'static str,
        /// The OS error.
        source: io::Error,
    },
}

/// The message of [`IdentityError::Mismatch`]: both values and what the
/// operator can do.
fn mismatch(path: &Path, stored: &Owner, configured: &Owner) -> String {
    let dir = path.parent().unwrap_or(Path::new("."));
    let head = format!(
        "{}: this data directory belongs to {stored}, but the configuration is {configured}",
        path.display()
    );
    let (dir, setting, value) = (dir.display(), stored.setting(), stored.value());
    match (stored, configured) {
        (Owner::Broker { node_id }, Owner::Broker { .. }) => format!(
            "{head}: its Raft state is node {node_id}'s and another node must not run on it; \
             refusing to start. Set {setting} = {value} back, or give this node its own empty \
             data_dir"
        ),
        (Owner::EdgeAgent { edge_id }, Owner::EdgeAgent { .. }) => format!(
            "{head}: the records under {dir}/{TOPICS_DIR}/{edge_id} not yet replicated would \
             never be sent; refusing to start. Set {setting} = {value} back and let the backlog \
             drain, then move {dir} aside to start under the new edge_id"
        ),
        _ => format!(
            "{head}, another component; refusing to start. Point data_dir at this {}'s own \
             directory",
            configured.component()
        ),
    }
}

/// The identity file of `dir`.
pub fn identity_path(dir: &Path) -> PathBuf {
    dir.join(IDENTITY_FILE)
}

/// Reads the identity file of `dir`: `None` if there is none.
///
/// # Errors
/// [`IdentityError::Garbled`] (naming `configured` as the value to write),
/// [`IdentityError::Io`].
pub fn read(dir: &Path, configured: &Owner) -> Result<Option<Owner>, IdentityError> {
    let path = identity_path(dir);
    let bytes = match read_file(&FsStorage, &path, IDENTITY_BYTES_MAX) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.kind() == io::ErrorKind::InvalidData => {
            return Err(IdentityError::Garbled {
                path,
                source: DecodeError::Json(format!("larger than {IDENTITY_BYTES_MAX} bytes")),
                configured: configured.clone(),
            });
        }
        Err(source) => {
            return Err(IdentityError::Io {
                path,
                op: "read",
                source,
            });
        }
    };
    Owner::decode(&bytes)
        .map(Some)
        .map_err(|source| IdentityError::Garbled {
            path,
            source,
            configured: configured.clone(),
        })
}

/// The owner `dir`'s identity file names, for a component that works in
/// another's directory (the tier service in a broker's): `None` without a
/// file, or with one that cannot be read or decoded (its owner refuses
/// that at its own start).
pub fn stored_owner(dir: &Path) -> Option<Owner> {
    let bytes = read_file(&FsStorage, &identity_path(dir), IDENTITY_BYTES_MAX).ok()?;
    Owner::decode(&bytes).ok()
}

/// Decides, without changing anything, whether `configured` may run on
/// `dir` (see the module's table). `check-config` calls it.
///
/// # Errors
/// Every [`IdentityError`] but a write failure.
pub fn inspect(dir: &Path, configured: &Owner) -> Result<Found, IdentityError> {
    match read(dir, configured)? {
        Some(stored) if &stored == configured => Ok(Found::Matches),
        Some(stored) => Err(IdentityError::Mismatch {
            path: identity_path(dir),
            stored,
            configured: configured.clone(),
        }),
        None => inspect_legacy(dir, configured),
    }
}

/// As [`inspect`], then writes the file when it is missing
/// ([`Found::Fresh`], [`Found::Adopted`]), creating `dir` if needed. Start-up
/// calls it before opening anything else in `dir`.
///
/// # Errors
/// Every [`IdentityError`].
pub fn claim(dir: &Path, configured: &Owner) -> Result<Found, IdentityError> {
    let found = inspect(dir, configured)?;
    if found != Found::Matches {
        let path = identity_path(dir);
        let write = |source| IdentityError::Io {
            path: path.clone(),
            op: "write",
            source,
        };
        std::fs::create_dir_all(dir).map_err(write)?;
        write_file_atomic(&FsStorage, &path, &configured.encode()).map_err(write)?;
    }
    Ok(found)
}

/// No identity file: whose the directory's files say it is.
fn inspect_legacy(dir: &Path, configured: &Owner) -> Result<Found, IdentityError> {
    let (own, foreign, whose) = match configured {
        Owner::Broker { .. } => (BROKER_MARKER, EDGE_MARKER, "an edge agent's data directory"),
        Owner::EdgeAgent { .. } => (EDGE_MARKER, BROKER_MARKER, "a broker's data directory"),
    };
    let foreign = dir.join(foreign);
    if exists(&foreign)? {
        return Err(IdentityError::ForeignLayout {
            dir: dir.to_path_buf(),
            marker: foreign,
            whose,
            configured: configured.clone(),
        });
    }
    let namespaces = namespaces(&dir.join(TOPICS_DIR))?;
    if let Owner::EdgeAgent { edge_id } = configured {
        let others: Vec<String> = namespaces
            .iter()
            .filter(|ns| *ns != edge_id)
            .cloned()
            .collect();
        if !others.is_empty() {
            return Err(IdentityError::OtherNamespace {
                dir: dir.to_path_buf(),
                namespaces: others,
                edge_id: edge_id.clone(),
            });
        }
    }
    if exists(&dir.join(own))? || !namespaces.is_empty() {
        Ok(Found::Adopted)
    } else {
        Ok(Found::Fresh)
    }
}

/// Whether `path` exists; an error other than "not found" is an error (a
/// directory that cannot be looked into is not taken as empty).
fn exists(path: &Path) -> Result<bool, IdentityError> {
    match std::fs::symlink_metadata(path) {
        Ok(_) => Ok(true),
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
            ) =>
        {
            Ok(false)
        }
        Err(source) => Err(IdentityError::Io {
            path: path.to_path_buf(),
            op: "look up",
            source,
        }),
    }
}

/// The namespaces under `topics` (`{ns}/` holding at least one entry),
/// sorted; none when it does not exist.
fn namespaces(topics: &Path) -> Result<Vec<String>, IdentityError> {
    let list = |source| IdentityError::Io {
        path: topics.to_path_buf(),
        op: "list",
        source,
    };
    let entries = match std::fs::read_dir(topics) {
        Ok(entries) => entries,
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
            ) =>
        {
            return Ok(Vec::new());
        }
        Err(e) => return Err(list(e)),
    };
    let mut found = Vec::new();
    for entry in entries {
        let path = entry.map_err(list)?.path();
        let holds_topics = std::fs::read_dir(&path).is_ok_and(|mut e| e.next().is_some());
        if holds_topics {
            found.push(
                path.file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
            );
        }
    }
    found.sort();
    Ok(found)
}

#[cfg(test)]
mod tests;
