//! The validated names ([`TopicName`], [`NamespaceName`],
//! [`SubscriptionName`], [`SubjectName`], [`RoleName`], [`BindingId`],
//! [`PrincipalName`]) and
//! their errors: the rule set in the [`super`] module doc.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::{MAX_NAME_BYTES, PARTITION_INFIX, parse_canonical_u64};

/// The characters allowed in names besides ASCII letters and digits, as
/// named in error messages.
const ALLOWED_DESCRIPTION: &str = "ASCII letters, digits, '-', '_', '.'";

/// Which kind of name (or which part of a topic name) an error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NamePart {
    /// A whole topic name `/{namespace}/{topic}`.
    TopicName,
    /// A namespace, alone or as the first part of a topic name.
    Namespace,
    /// The second part of a topic name.
    Topic,
    /// A subscription name.
    Subscription,
    /// A schema registry subject.
    Subject,
    /// An RBAC role name.
    Role,
    /// An RBAC binding id.
    Binding,
    /// An RBAC principal name (a token holder or a certificate identity).
    Principal,
    /// The storage path prefix, e.g. `/tributary`.
    StoragePrefix,
}

impl fmt::Display for NamePart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NamePart::TopicName => "topic name",
            NamePart::Namespace => "namespace",
            NamePart::Topic => "topic",
            NamePart::Subscription => "subscription name",
            NamePart::Subject => "schema subject",
            NamePart::Role => "role name",
            NamePart::Binding => "binding id",
            NamePart::Principal => "principal name",
            NamePart::StoragePrefix => "storage prefix",
        })
    }
}

/// What is wrong with a name. `part` is the offending part (for a topic name,
/// its namespace or topic part); byte positions `at` count within that part.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NameErrorKind {
    /// The part is empty.
    #[error("{part} is empty")]
    Empty {
        /// The empty part.
        part: NamePart,
    },
    /// A `/`-separated name with an empty component: a trailing `/` or a
    /// `//` (a storage prefix such as `/tributary/`).
    #[error(
        "{part} has an empty component (a trailing '/' or a '//'): write it without, like /tributary"
    )]
    EmptyComponent {
        /// The offending part.
        part: NamePart,
    },
    /// The part is `.` or `..`.
    #[error("{part} must not be '.' or '..'")]
    DotName {
        /// The offending part.
        part: NamePart,
    },
    /// A control character.
    #[error("{part} contains control character {ch:?} at byte {at}")]
    ControlChar {
        /// The offending part.
        part: NamePart,
        /// The character.
        ch: char,
        /// Its byte position within the part.
        at: usize,
    },
    /// A character outside the allowed set.
    #[error("{part} contains {ch:?} at byte {at}; allowed: {ALLOWED_DESCRIPTION}")]
    DisallowedChar {
        /// The offending part.
        part: NamePart,
        /// The character.
        ch: char,
        /// Its byte position within the part.
        at: usize,
    },
    /// Longer than [`MAX_NAME_BYTES`].
    #[error("{part} is {len} bytes long; at most {max}")]
    TooLong {
        /// The offending name.
        part: NamePart,
        /// Its length, bytes.
        len: usize,
        /// The maximum, bytes.
        max: usize,
    },
    /// A topic name or storage prefix that does not start with `/`.
    #[error("{part} must start with '/'")]
    MissingLeadingSlash {
        /// The offending name.
        part: NamePart,
    },
    /// A topic name without exactly two parts.
    #[error("{part} must have exactly {expected} parts separated by '/', found {found}")]
    WrongPartCount {
        /// The offending name.
        part: NamePart,
        /// Parts required.
        expected: usize,
        /// Parts found.
        found: usize,
    },
    /// A name reserved for internal keys (a subject starting with `_`).
    #[error("{part} must not start with '_' (reserved)")]
    Reserved {
        /// The offending name.
        part: NamePart,
    },
}

/// A refused name: what it was meant to be, the input itself, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what} {input:?}: {kind}")]
pub struct NameError {
    /// What the input was parsed as.
    pub what: NamePart,
    /// The refused input, unchanged.
    pub input: String,
    /// The rule it breaks.
    pub kind: NameErrorKind,
}

impl NameError {
    pub(super) fn new(what: NamePart, input: &str, kind: NameErrorKind) -> NameError {
        NameError {
            what,
            input: input.to_owned(),
            kind,
        }
    }
}

/// Checks one part against the rule set (not the length, which the caller
/// checks once for the whole name).
pub(super) fn check_part(part: NamePart, value: &str) -> Result<(), NameErrorKind> {
    if value.is_empty() {
        return Err(NameErrorKind::Empty { part });
    }
    if value == "." || value == ".." {
        return Err(NameErrorKind::DotName { part });
    }
    for (at, ch) in value.char_indices() {
        if ch.is_control() {
            return Err(NameErrorKind::ControlChar { part, ch, at });
        }
        if !(ch.is_ascii_alphanumeric() || matches!(ch, '-' | '_' | '.')) {
            return Err(NameErrorKind::DisallowedChar { part, ch, at });
        }
    }
    Ok(())
}

pub(super) fn check_len(part: NamePart, value: &str) -> Result<(), NameErrorKind> {
    if value.len() > MAX_NAME_BYTES {
        return Err(NameErrorKind::TooLong {
            part,
            len: value.len(),
            max: MAX_NAME_BYTES,
        });
    }
    Ok(())
}

/// Validates a single name of kind `what`.
fn check_single(what: NamePart, value: &str) -> Result<(), NameError> {
    check_len(what, value)
        .and_then(|()| check_part(what, value))
        .and_then(|()| {
            if what == NamePart::Subject && value.starts_with('_') {
                Err(NameErrorKind::Reserved { part: what })
            } else {
                Ok(())
            }
        })
        .map_err(|kind| NameError::new(what, value, kind))
}

// ---------------------------------------------------------------------------
// Single-part names
// ---------------------------------------------------------------------------

macro_rules! single_name {
    ($(#[$doc:meta])* $name:ident, $part:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            /// Validates `name` (see the module doc for the rules).
            ///
            /// # Errors
            /// [`NameError`] naming the broken rule.
            pub fn new(name: &str) -> Result<Self, NameError> {
                check_single($part, name)?;
                Ok($name(name.to_owned()))
            }

            /// The name.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl FromStr for $name {
            type Err = NameError;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                $name::new(s)
            }
        }

        impl TryFrom<String> for $name {
            type Error = NameError;

            fn try_from(s: String) -> Result<Self, Self::Error> {
                check_single($part, &s)?;
                Ok($name(s))
            }
        }

        impl From<$name> for String {
            fn from(name: $name) -> String {
                name.0
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
    };
}

single_name!(
    /// A validated namespace name, the first part of a topic name.
    NamespaceName,
    NamePart::Namespace
);
impl NamespaceName {
    /// Why this namespace cannot be an edge's id, or `None` when it can.
    /// An edge writes only to the namespace named like its id, so an edge
    /// may not take one the system uses: names starting with `_` (the
    /// brokers' `/_system/audit-broker-{id}` topics), `default`
    /// (centrally published topics and their dead-letter copies) and a
    /// broker's certificate identity (see [`reserved_edge_id`]).
    pub fn reserved_for_edges(&self) -> Option<&'static str> {
        reserved_edge_id(&self.0)
    }
}

/// Prefix of every broker certificate's identity (`broker-{node_id}`): the
/// Raft listener serves only certificates whose identity starts with it.
pub const BROKER_IDENTITY_PREFIX: &str = "broker-";

/// DNS name every broker certificate carries and clients verify when
/// connecting to any broker (`broker_core::tls::BROKER_SERVER_NAME`).
pub const BROKER_SERVER_NAME: &str = "tributary-broker";

/// True when `name` could be a broker certificate's name: it starts with
/// [`BROKER_IDENTITY_PREFIX`] or is [`BROKER_SERVER_NAME`], ignoring ASCII
/// case. No edge may have such an id ([`reserved_edge_id`]).
pub fn is_broker_identity(name: &str) -> bool {
    name.get(..BROKER_IDENTITY_PREFIX.len())
        .is_some_and(|p| p.eq_ignore_ascii_case(BROKER_IDENTITY_PREFIX))
        || name.eq_ignore_ascii_case(BROKER_SERVER_NAME)
}

/// Why `name` cannot be an edge id although it may be a namespace (see
/// [`NamespaceName::reserved_for_edges`]), or `None`.
///
/// Besides the system's namespaces, an edge id may not be a broker's
/// identity: a certificate signed for edge `broker-2` would be taken for
/// broker 2's by the Raft listener, and one for
/// [`BROKER_SERVER_NAME`] would pass as any broker's server certificate
/// name. Both rules ignore ASCII case (certificate names do).
pub fn reserved_edge_id(name: &str) -> Option<&'static str> {
    if is_broker_identity(name) {
        Some(
            "ids starting with 'broker-' and 'tributary-broker' are the brokers' certificate \
             names (broker-{node_id}); an edge certificate with one would be taken for a broker's",
        )
    } else if name.starts_with('_') {
        Some(
            "namespaces starting with '_' are the system's (the brokers' audit topics live in /_system)",
        )
    } else if name == "default" {
        Some("the namespace 'default' holds centrally published topics")
    } else {
        None
    }
}

/// Why `name` cannot be given to a new edge, or `None`: an edge id is 1 to
/// 63 ASCII letters, digits, '-' or '_' (it names the edge's certificate,
/// its files and its namespace, and fits a DNS label), and not one the
/// system keeps ([`reserved_edge_id`]). Dev certificates and enrollment
/// tokens are issued only for such ids; an existing edge whose id is any
/// valid namespace keeps working.
pub fn new_edge_id_problem(name: &str) -> Option<&'static str> {
    let shape = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if !shape {
        return Some("an edge id is 1 to 63 ASCII letters, digits, '-' or '_'");
    }
    reserved_edge_id(name)
}

single_name!(
    /// A validated subscription name.
    SubscriptionName,
    NamePart::Subscription
);
single_name!(
    /// A validated schema registry subject; must not start with `_`, which
    /// is reserved for `/schemas/_global` and `/schemas/_index`.
    SubjectName,
    NamePart::Subject
);
single_name!(
    /// A validated RBAC role name.
    RoleName,
    NamePart::Role
);
single_name!(
    /// A validated RBAC binding id.
    BindingId,
    NamePart::Binding
);
single_name!(
    /// A validated RBAC principal name: a named token's holder or a client
    /// certificate's identity.
    PrincipalName,
    NamePart::Principal
);

// ---------------------------------------------------------------------------
// Topic names
// ---------------------------------------------------------------------------

/// A validated topic name `/{namespace}/{topic}`.
///
/// Serialized (serde) as its string form; deserializing validates.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct TopicName {
    /// The whole name, `/ns/topic`.
    full: String,
    /// Byte position of the `/` between namespace and topic.
    /// Invariant: `full[1..split]` is the namespace, `full[split + 1..]` the
    /// topic, both valid parts.
    split: usize,
}

impl TopicName {
    /// Parses and validates `/{namespace}/{topic}`.
    ///
    /// # Errors
    /// [`NameError`] with `what = TopicName` naming the broken rule and, for
    /// part rules, which part.
    pub fn new(name: &str) -> Result<TopicName, NameError> {
        Self::check(name)
            .map(|split| TopicName {
                full: name.to_owned(),
                split,
            })
            .map_err(|kind| NameError::new(NamePart::TopicName, name, kind))
    }

    /// Builds `/{namespace}/{topic}` from a namespace and a topic part.
    ///
    /// # Errors
    /// [`NameError`] when `topic` breaks a rule or the whole name is longer
    /// than [`MAX_NAME_BYTES`].
    pub fn from_parts(namespace: &NamespaceName, topic: &str) -> Result<TopicName, NameError> {
        TopicName::new(&format!("/{namespace}/{topic}"))
    }

    /// Returns the position of the middle `/`.
    fn check(name: &str) -> Result<usize, NameErrorKind> {
        check_len(NamePart::TopicName, name)?;
        let Some(rest) = name.strip_prefix('/') else {
            return Err(if name.is_empty() {
                NameErrorKind::Empty {
                    part: NamePart::TopicName,
                }
            } else {
                NameErrorKind::MissingLeadingSlash {
                    part: NamePart::TopicName,
                }
            });
        };
        let mut parts = rest.split('/');
        let (Some(namespace), Some(topic), None) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(NameErrorKind::WrongPartCount {
                part: NamePart::TopicName,
                expected: 2,
                found: rest.split('/').count(),
            });
        };
        check_part(NamePart::Namespace, namespace)?;
        check_part(NamePart::Topic, topic)?;
        Ok(1 + namespace.len())
    }

    /// The whole name, `/{namespace}/{topic}`.
    pub fn as_str(&self) -> &str {
        &self.full
    }

    /// The namespace part.
    pub fn namespace(&self) -> &str {
        &self.full[1..self.split]
    }

    /// The namespace part as a [`NamespaceName`].
    pub fn namespace_name(&self) -> NamespaceName {
        // Valid by the struct invariant, and shorter than the whole name.
        NamespaceName(self.namespace().to_owned())
    }

    /// The topic part (after the namespace).
    pub fn topic(&self) -> &str {
        &self.full[self.split + 1..]
    }

    /// This topic with `suffix` appended to its topic part, e.g. the
    /// dead-letter topic `/{ns}/{topic}-dlq` for suffix `-dlq`.
    ///
    /// # Errors
    /// [`NameError`] when the suffix adds a `/` (wrong part count) or a
    /// disallowed character, or the result is longer than [`MAX_NAME_BYTES`].
    pub fn with_suffix(&self, suffix: &str) -> Result<TopicName, NameError> {
        TopicName::new(&format!("{}{suffix}", self.full))
    }

    /// Partition `index` of this topic: `/{ns}/{topic}-part-{index}`.
    ///
    /// # Errors
    /// [`NameError`] ([`NameErrorKind::TooLong`]) when the partition name is
    /// longer than [`MAX_NAME_BYTES`].
    pub fn partition(&self, index: u32) -> Result<TopicName, NameError> {
        self.with_suffix(&format!("{PARTITION_INFIX}{index}"))
    }

    /// Splits a partition name into its base topic and index; `None` when
    /// the topic part does not end in `-part-{n}` with a canonical decimal
    /// `u32` and a non-empty, valid base. The last `-part-` counts, so
    /// partitions of a topic whose own name contains `-part-` parse back.
    pub fn partition_of(&self) -> Option<(TopicName, u32)> {
        let topic = self.topic();
        let at = topic.rfind(PARTITION_INFIX)?;
        let index = parse_canonical_u64(&topic[at + PARTITION_INFIX.len()..])?;
        let index = u32::try_from(index).ok()?;
        let base = TopicName::new(&self.full[..self.split + 1 + at]).ok()?;
        Some((base, index))
    }
}

impl fmt::Display for TopicName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.full)
    }
}

impl FromStr for TopicName {
    type Err = NameError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        TopicName::new(s)
    }
}

impl TryFrom<String> for TopicName {
    type Error = NameError;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        match TopicName::check(&s) {
            Ok(split) => Ok(TopicName { full: s, split }),
            Err(kind) => Err(NameError::new(NamePart::TopicName, &s, kind)),
        }
    }
}

impl From<TopicName> for String {
    fn from(name: TopicName) -> String {
        name.full
    }
}

impl AsRef<str> for TopicName {
    fn as_ref(&self) -> &str {
        &self.full
    }
}
