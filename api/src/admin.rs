//! JSON shapes of the broker's admin HTTP API (`docs/admin-api.md`) that
//! more than one crate reads: the broker writes them, `tribctl` and the
//! tests parse them.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Where a subscription's failure policy comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PolicySource {
    /// Stored at `/topics/{ns}/{topic}/subscriptions/{sub}/failure_policy`
    /// (inherited on an earlier attach, or set by an operator).
    Stored,
    /// Derived from the topic's `/intent`.
    Intent,
    /// The broker fallback of implicit topics.
    BrokerFallback,
}

/// One problem of a manifest: where (file, entry, field) and what.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestIssue {
    /// The manifest's file name as given by the caller.
    pub file: String,
    /// `namespaces` or `topics`; `None` for the document as a whole.
    pub section: Option<String>,
    /// Position of the entry in its section, from 0.
    pub index: Option<usize>,
    /// The entry's name as written, when it has one.
    pub name: Option<String>,
    /// The offending field of the entry (or top-level key).
    pub field: Option<String>,
    /// What is wrong.
    pub message: String,
}

impl ManifestIssue {
    /// An issue with the document as a whole (syntax, size).
    pub fn document(file: &str, message: impl Into<String>) -> ManifestIssue {
        ManifestIssue {
            file: file.to_owned(),
            section: None,
            index: None,
            name: None,
            field: None,
            message: message.into(),
        }
    }

    /// An issue with entry `index` of `section`.
    pub fn entry(
        file: &str,
        section: &str,
        index: usize,
        name: Option<&str>,
        field: Option<&str>,
        message: impl Into<String>,
    ) -> ManifestIssue {
        ManifestIssue {
            file: file.to_owned(),
            section: Some(section.to_owned()),
            index: Some(index),
            name: name.map(str::to_owned),
            field: field.map(str::to_owned),
            message: message.into(),
        }
    }
}

impl fmt::Display for ManifestIssue {
    /// `{file}: {section}[{index}] ({name}): {field}: {message}`, leaving out
    /// the parts that are unknown.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let entry = match (&self.section, self.index, &self.name) {
            (Some(section), Some(index), Some(name)) => {
                Some(format!("{section}[{index}] ({name})"))
            }
            (Some(section), Some(index), None) => Some(format!("{section}[{index}]")),
            (Some(section), None, _) => Some(section.clone()),
            (None, ..) => None,
        };
        let parts: Vec<&str> = std::iter::once(self.file.as_str())
            .chain(entry.as_deref())
            .chain(self.field.as_deref())
            .chain(std::iter::once(self.message.as_str()))
            .collect();
        f.write_str(&parts.join(": "))
    }
}
