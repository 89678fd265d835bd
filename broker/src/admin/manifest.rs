//! `apply` manifests (`seeds/000_d502aacc865e81b1.txt`, "Declarative
//! State"): parsing the YAML text ([`parse_manifest`]) and validating the
//! document ([`Manifest::from_value`]), collecting every problem as a
//! [`ManifestIssue`] ([`ManifestErrors`]). Planning and applying a valid
//! manifest is in `apply.rs`.

use std::collections::BTreeMap;

use broker_core::catalog::{CatalogError, MAX_PARTITIONS, TopicSpec};
use serde_json::Value;
use tributary_api::admin::ManifestIssue;
use tributary_proto::intent::StreamIntent;
use tributary_proto::keys::{NamespaceName, TopicName};

/// Every problem found in a manifest; nothing of it was applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("manifest {file}: {}; nothing applied", self.joined())]
pub struct ManifestErrors {
    /// The manifest's file name.
    pub file: String,
    /// The problems, in document order. Never empty.
    pub issues: Vec<ManifestIssue>,
}

impl ManifestErrors {
    /// A single document-level problem (for parsers: YAML syntax errors).
    pub fn document(file: &str, message: impl Into<String>) -> ManifestErrors {
        ManifestErrors {
            file: file.to_owned(),
            issues: vec![ManifestIssue::document(file, message)],
        }
    }

    /// Every issue, without the file name each starts with, `; `-joined.
    fn joined(&self) -> String {
        // Each issue already starts with the file name.
        let prefix = format!("{}: ", self.file);
        self.issues
            .iter()
            .map(|issue| {
                let text = issue.to_string();
                text.strip_prefix(&prefix)
                    .map(str::to_owned)
                    .unwrap_or(text)
            })
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// A validated `apply` manifest (`seeds/000_d502aacc865e81b1.txt`,
/// "Declarative State"): namespaces to exist and intent-backed topics.
///
/// Document shape (any serde format; the admin API parses YAML):
/// ```yaml
/// namespaces:
///   - agents
/// topics:
///   - name: /agents/events
///     intent: agent_event_mesh
///     partitions: 3
/// ```
/// Both keys are optional; `partitions` defaults to 0; `intent` is
/// required. An empty document is an empty manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    file: String,
    namespaces: Vec<NamespaceName>,
    /// Invariant: entry `i` of the document's `topics`.
    topics: Vec<TopicSpec>,
}

const MANIFEST_SECTIONS: [&str; 2] = ["namespaces", "topics"];
const TOPIC_FIELDS: [&str; 3] = ["name", "intent", "partitions"];

impl Manifest {
    /// Validates a parsed manifest document. `file` names the manifest in
    /// every issue.
    ///
    /// Everything is checked before anything is returned: the document
    /// shape, unknown keys, every name, intent and partition count,
    /// duplicate namespaces and topics, and topics named like a partition of
    /// another entry.
    ///
    /// # Errors
    /// [`ManifestErrors`] with one [`ManifestIssue`] per problem (file,
    /// section, index, name, field).
    pub fn from_value(file: &str, document: &Value) -> Result<Manifest, ManifestErrors> {
        let mut issues = Vec::new();
        let mut manifest = Manifest {
            file: file.to_owned(),
            namespaces: Vec::new(),
            topics: Vec::new(),
        };
        let empty = serde_json::Map::new();
        let root = match document {
            Value::Null => &empty,
            Value::Object(map) => map,
            _ => {
                return Err(ManifestErrors::document(
                    file,
                    "the manifest must be a mapping with the keys namespaces and topics",
                ));
            }
        };
        for key in root.keys() {
            if !MANIFEST_SECTIONS.contains(&key.as_str()) {
                issues.push(ManifestIssue {
                    field: Some(key.clone()),
                    ..ManifestIssue::document(
                        file,
                        "unknown top-level key; expected namespaces or topics",
                    )
                });
            }
        }
        let section = |name: &str, issues: &mut Vec<ManifestIssue>| -> Vec<Value> {
            match root.get(name) {
                None | Some(Value::Null) => Vec::new(),
                Some(Value::Array(items)) => items.clone(),
                Some(_) => {
                    issues.push(ManifestIssue {
                        field: Some(name.to_owned()),
                        ..ManifestIssue::document(file, "must be a list")
                    });
                    Vec::new()
                }
            }
        };

        let mut seen_namespaces: BTreeMap<String, usize> = BTreeMap::new();
        for (index, item) in section("namespaces", &mut issues).iter().enumerate() {
            let issue = |name: Option<&str>, message: String| {
                ManifestIssue::entry(file, "namespaces", index, name, Some("name"), message)
            };
            let Some(raw) = item.as_str() else {
                issues.push(issue(None, format!("must be a string, got {item}")));
                continue;
            };
            match NamespaceName::new(raw) {
                Err(e) => issues.push(issue(Some(raw), e.to_string())),
                Ok(ns) => match seen_namespaces.get(raw) {
                    Some(first) => {
                        issues.push(issue(
                            Some(raw),
                            format!("duplicate of namespaces[{first}]"),
                        ));
                    }
                    None => {
                        seen_namespaces.insert(raw.to_owned(), index);
                        manifest.namespaces.push(ns);
                    }
                },
            }
        }

        let topic_items = section("topics", &mut issues);
        let mut seen_topics: BTreeMap<TopicName, usize> = BTreeMap::new();
        let mut valid_topics = true;
        for (index, item) in topic_items.iter().enumerate() {
            match Self::topic_entry(file, index, item, &seen_topics) {
                Ok(spec) => {
                    seen_topics.insert(spec.name().clone(), index);
                    manifest.topics.push(spec);
                }
                Err(mut entry_issues) => {
                    valid_topics = false;
                    issues.append(&mut entry_issues);
                }
            }
        }
        if valid_topics {
            // A topic named like a partition of another entry would share
            // its keys. Indices match entries when every entry is valid.
            for (index, spec) in manifest.topics.iter().enumerate() {
                for (partition, name) in spec.partition_names().iter().enumerate() {
                    if let Some(&other) = seen_topics.get(name) {
                        issues.push(ManifestIssue::entry(
                            file,
                            "topics",
                            other,
                            Some(name.as_str()),
                            Some("name"),
                            format!(
                                "is partition {partition} of topics[{index}] ({})",
                                spec.name()
                            ),
                        ));
                    }
                }
            }
        }
        if issues.is_empty() {
            Ok(manifest)
        } else {
            issues.sort_by_key(|issue| {
                (
                    issue.section.is_some(),
                    issue
                        .section
                        .as_deref()
                        .and_then(|s| MANIFEST_SECTIONS.iter().position(|&x| x == s)),
                    issue.index,
                )
            });
            Err(ManifestErrors {
                file: file.to_owned(),
                issues,
            })
        }
    }

    /// Validates one entry of `topics`, collecting every problem of it.
    fn topic_entry(
        file: &str,
        index: usize,
        item: &Value,
        seen: &BTreeMap<TopicName, usize>,
    ) -> Result<TopicSpec, Vec<ManifestIssue>> {
        let Some(map) = item.as_object() else {
            return Err(vec![ManifestIssue::entry(
                file,
                "topics",
                index,
                None,
                None,
                format!("must be a mapping with name, intent and partitions, got {item}"),
            )]);
        };
        let raw_name = map.get("name").and_then(Value::as_str);
        let mut issues = Vec::new();
        let mut issue = |field: &str, message: String| {
            issues.push(ManifestIssue::entry(
                file,
                "topics",
                index,
                raw_name,
                Some(field),
                message,
            ));
        };
        for key in map.keys() {
            if !TOPIC_FIELDS.contains(&key.as_str()) {
                issue(
                    key,
                    "unknown field; expected name, intent, partitions".into(),
                );
            }
        }
        let name = match map.get("name") {
            None | Some(Value::Null) => {
                issue("name", "is required".into());
                None
            }
            Some(Value::String(s)) => match TopicName::new(s) {
                Ok(name) => match seen.get(&name) {
                    Some(first) => {
                        issue("name", format!("duplicate of topics[{first}]"));
                        None
                    }
                    None => Some(name),
                },
                Err(e) => {
                    issue("name", e.to_string());
                    None
                }
            },
            Some(other) => {
                issue("name", format!("must be a string, got {other}"));
                None
            }
        };
        let intent = match map.get("intent") {
            None | Some(Value::Null) => {
                issue("intent", "is required".into());
                None
            }
            Some(Value::String(s)) => match StreamIntent::parse(s) {
                Ok(intent) => Some(intent),
                Err(e) => {
                    issue("intent", e.to_string());
                    None
                }
            },
            Some(other) => {
                issue("intent", format!("must be a string, got {other}"));
                None
            }
        };
        let partitions = match map.get("partitions") {
            None | Some(Value::Null) => Some(0),
            Some(value) => match value.as_u64().and_then(|n| u32::try_from(n).ok()) {
                Some(n) if n <= MAX_PARTITIONS => Some(n),
                _ => {
                    issue(
                        "partitions",
                        format!("must be a whole number from 0 to {MAX_PARTITIONS}, got {value}"),
                    );
                    None
                }
            },
        };
        if let (Some(name), Some(intent), Some(partitions)) = (name, intent, partitions)
            && issues.is_empty()
        {
            return TopicSpec::new(name, intent, partitions).map_err(|e| {
                let field = e.field().unwrap_or("name").to_owned();
                let message = match &e {
                    CatalogError::InvalidName { source, .. } => source.to_string(),
                    other => other.to_string(),
                };
                vec![ManifestIssue::entry(
                    file,
                    "topics",
                    index,
                    raw_name,
                    Some(&field),
                    message,
                )]
            });
        }
        Err(issues)
    }

    /// The file name given to [`Manifest::from_value`].
    pub fn file(&self) -> &str {
        &self.file
    }

    /// Declared namespaces, in document order.
    pub fn namespaces(&self) -> &[NamespaceName] {
        &self.namespaces
    }

    /// Declared topics, in document order.
    pub fn topics(&self) -> &[TopicSpec] {
        &self.topics
    }
}

/// Deepest flow nesting (`[` and `{` not yet closed) a manifest may have;
/// a manifest's own shape needs 3.
pub const MAX_MANIFEST_DEPTH: usize = 64;

/// The 1-based line where `text` first nests flow collections deeper than
/// [`MAX_MANIFEST_DEPTH`], or `None`. `[`, `{`, `]` and `}` count outside
/// quoted scalars and comments. A quote opens a quoted scalar only where
/// YAML lets one start (after blanks, `[`, `{` or `,`, with the line so far
/// empty, a block indicator or ending in `[`, `{`, `,` or `:`); anywhere
/// else it is part of a plain scalar and brackets after it still count, so
/// a quote cannot hide nesting from this check (at worst a bracket in a
/// string counts, refusing an absurd manifest).
fn too_deep(text: &str) -> Option<usize> {
    let mut depth = 0usize;
    let mut quote: Option<char> = None;
    let mut line = 1usize;
    let mut line_so_far = String::new();
    let mut previous = '\n';
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if let Some(q) = quote {
            match c {
                // An escaped character, whatever it is; a doubled single
                // quote.
                '\\' if q == '"' => line += usize::from(chars.next() == Some('\n')),
                '\'' if q == '\'' && chars.peek() == Some(&'\'') => {
                    chars.next();
                }
                c if c == q => quote = None,
                '\n' => line += 1,
                _ => {}
            }
            previous = c;
            continue;
        }
        match c {
            '\n' => {
                line += 1;
                line_so_far.clear();
                previous = c;
                continue;
            }
            '#' if previous.is_whitespace() => {
                // A comment, to the end of the line.
                for c in chars.by_ref() {
                    if c == '\n' {
                        line += 1;
                        break;
                    }
                }
                line_so_far.clear();
                previous = '\n';
                continue;
            }
            '[' | '{' => {
                depth += 1;
                if depth > MAX_MANIFEST_DEPTH {
                    return Some(line);
                }
            }
            ']' | '}' => depth = depth.saturating_sub(1),
            '\'' | '"' if quote_may_start(previous, &line_so_far) => quote = Some(c),
            _ => {}
        }
        line_so_far.push(c);
        previous = c;
    }
    None
}

/// Whether a quote after `previous`, with `line_so_far` before it on its
/// line, opens a quoted scalar (see [`too_deep`]).
fn quote_may_start(previous: char, line_so_far: &str) -> bool {
    if !(previous.is_whitespace() || matches!(previous, '[' | '{' | ',')) {
        return false;
    }
    let before = line_so_far.trim_end();
    before
        .chars()
        .all(|c| c == '-' || c == '?' || c.is_whitespace())
        || before.ends_with(['[', '{', ',', ':'])
}

/// Parses manifest text (YAML, and so also JSON) into a validated
/// [`Manifest`]; `file` names it in every issue.
///
/// # Errors
/// [`ManifestErrors`]: text that is not UTF-8, nested deeper than
/// [`MAX_MANIFEST_DEPTH`], or not YAML (with line and column), or every
/// validation issue.
pub fn parse_manifest(file: &str, text: &[u8]) -> Result<Manifest, ManifestErrors> {
    let text = std::str::from_utf8(text)
        .map_err(|e| ManifestErrors::document(file, format!("not UTF-8 text: {e}")))?;
    // Before the YAML parser sees it: its time grows faster than linearly
    // with the nesting (20 KB of `[` took 13 s).
    if let Some(line) = too_deep(text) {
        return Err(ManifestErrors::document(
            file,
            format!(
                "nesting deeper than {MAX_MANIFEST_DEPTH} levels of '[' / '{{' (line {line}); \
                 a manifest needs 3"
            ),
        ));
    }
    let document: Value = if text.trim().is_empty() {
        Value::Null
    } else {
        // Through YAML's own value first: it refuses duplicate keys, which
        // a JSON map would silently collapse to the last one.
        let invalid = |message: String| ManifestErrors::document(file, message);
        let yaml: serde_yaml_ng::Value =
            serde_yaml_ng::from_str(text).map_err(|e| invalid(format!("not valid YAML: {e}")))?;
        serde_json::to_value(&yaml).map_err(|e| invalid(format!("not a manifest document: {e}")))?
    };
    Manifest::from_value(file, &document)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn manifest_validation_reports_every_entry_and_field() {
        let doc = json!({
            "namespaces": ["agents", "agents", "bad ns", 7],
            "topics": [
                {"name": "/agents/ok", "intent": "task_queue"},
                {"name": "/agents/x", "intent": "nope"},
                {"name": "agents/y", "intent": "tasks"},
                {"name": "/agents/z", "intent": "tasks", "partitions": -1},
                {"name": "/agents/ok", "intent": "tasks"},
                {"name": "/agents/w", "intent": "tasks", "partitons": 2},
                {"name": "/agents/big", "intent": "tasks", "partitions": 100000},
                {"name": "/agents/f", "intent": "tasks", "partitions": 1.5},
                {"intent": 3},
                "nope"
            ],
            "extra": 1
        });
        let errors = Manifest::from_value("topology.yaml", &doc).unwrap_err();
        let lines: Vec<String> = errors.issues.iter().map(ToString::to_string).collect();
        let unknown = tributary_proto::intent::valid_intent_names();
        assert_eq!(
            lines,
            [
                "topology.yaml: extra: unknown top-level key; expected namespaces or topics"
                    .to_owned(),
                "topology.yaml: namespaces[1] (agents): name: duplicate of namespaces[0]".into(),
                "topology.yaml: namespaces[2] (bad ns): name: invalid namespace \"bad ns\": \
                 namespace contains ' ' at byte 3; allowed: ASCII letters, digits, '-', '_', '.'"
                    .into(),
                "topology.yaml: namespaces[3]: name: must be a string, got 7".into(),
                format!(
                    "topology.yaml: topics[1] (/agents/x): intent: unknown stream intent \
                     \"nope\"; valid intents: {unknown}"
                ),
                "topology.yaml: topics[2] (agents/y): name: invalid topic name \"agents/y\": \
                 topic name must start with '/'"
                    .into(),
                "topology.yaml: topics[3] (/agents/z): partitions: must be a whole number \
                 from 0 to 256, got -1"
                    .into(),
                "topology.yaml: topics[4] (/agents/ok): name: duplicate of topics[0]".into(),
                "topology.yaml: topics[5] (/agents/w): partitons: unknown field; expected \
                 name, intent, partitions"
                    .into(),
                "topology.yaml: topics[6] (/agents/big): partitions: must be a whole number \
                 from 0 to 256, got 100000"
                    .into(),
                "topology.yaml: topics[7] (/agents/f): partitions: must be a whole number \
                 from 0 to 256, got 1.5"
                    .into(),
                "topology.yaml: topics[8]: name: is required".into(),
                "topology.yaml: topics[8]: intent: must be a string, got 3".into(),
                "topology.yaml: topics[9]: must be a mapping with name, intent and \
                 partitions, got \"nope\""
                    .into(),
            ]
        );
        assert_eq!(
            serde_json::to_value(&errors.issues[4]).unwrap(),
            json!({
                "file": "topology.yaml", "section": "topics", "index": 1,
                "name": "/agents/x", "field": "intent",
                "message": format!("unknown stream intent \"nope\"; valid intents: {unknown}")
            })
        );
        assert!(
            errors
                .to_string()
                .starts_with("manifest topology.yaml: extra: unknown top-level key"),
            "{errors}"
        );
        assert!(
            errors.to_string().ends_with("; nothing applied"),
            "{errors}"
        );

        let collision = json!({"topics": [
            {"name": "/a/x", "intent": "tasks", "partitions": 2},
            {"name": "/a/x-part-1", "intent": "tasks"}
        ]});
        let errors = Manifest::from_value("m.yaml", &collision).unwrap_err();
        assert_eq!(
            errors
                .issues
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>(),
            ["m.yaml: topics[1] (/a/x-part-1): name: is partition 1 of topics[0] (/a/x)"]
        );
        for bad in [
            json!([]),
            json!("text"),
            json!({"topics": {"name": "/a/b"}}),
        ] {
            assert!(Manifest::from_value("m.yaml", &bad).is_err(), "{bad}");
        }
        let empty = Manifest::from_value("m.yaml", &Value::Null).unwrap();
        assert!(empty.topics().is_empty() && empty.namespaces().is_empty());
    }

    #[test]
    fn deep_nesting_is_refused_before_parsing_and_quotes_do_not_hide_it() {
        let deep = format!("topics: {}{}", "[".repeat(10_000), "]".repeat(10_000));
        let err = parse_manifest("m.yaml", deep.as_bytes()).unwrap_err();
        assert_eq!(err.issues.len(), 1);
        let text = err.to_string();
        assert!(text.contains("deeper than 64 levels"), "{text}");
        // 64 levels pass the check (and then fail validation as a shape).
        let ok = format!("topics: {}{}", "[".repeat(64), "]".repeat(64));
        assert_eq!(too_deep(&ok), None);
        assert_eq!(too_deep(&format!("x: [{}", "{".repeat(64))), Some(1));
        // Brackets in quoted scalars and comments do not count.
        let quoted = format!(
            "a: '{0}'\nb: \"{0}\\\"{0}\"\n# {0}\nc: ['x''{0}', \"{0}\"]",
            "[".repeat(100)
        );
        assert_eq!(too_deep(&quoted), None, "{quoted}");
        // A quote inside a plain scalar opens nothing: what follows counts.
        for hide in ["[a', ", "[a - 'b, ", "- x'y ", "key: a'b "] {
            let text = format!("{hide}{}", "[".repeat(100));
            assert_eq!(too_deep(&text), Some(1), "{text}");
        }
        let text = format!("x: 1 # it's\n{}", "[".repeat(100));
        assert_eq!(too_deep(&text), Some(2));
    }

    #[test]
    fn manifests_parse_from_yaml() {
        let text = "namespaces:\n  - agents\ntopics:\n  - name: /agents/events\n    \
                    intent: agent_event_mesh\n    partitions: 3\n";
        let manifest = parse_manifest("t.yaml", text.as_bytes()).unwrap();
        assert_eq!(manifest.namespaces().len(), 1);
        assert_eq!(manifest.topics()[0].partitions(), 3);
        assert_eq!(manifest.topics()[0].intent(), StreamIntent::EventStream);
        assert!(parse_manifest("t.yaml", b"").unwrap().topics().is_empty());
        let err = parse_manifest("t.yaml", b"topics: [\n").unwrap_err();
        assert!(
            err.to_string()
                .starts_with("manifest t.yaml: not valid YAML: "),
            "{err}"
        );
        let err = parse_manifest("t.yaml", b"topics: []\ntopics: []\n").unwrap_err();
        assert_eq!(
            err.to_string(),
            "manifest t.yaml: not valid YAML: duplicate entry with key \"topics\"; nothing applied"
        );
        let err = parse_manifest("t.yaml", b"{1: x}").unwrap_err();
        assert_eq!(
            err.to_string(),
            "manifest t.yaml: 1: unknown top-level key; expected namespaces or topics; \
             nothing applied"
        );
        let err = parse_manifest("t.yaml", b"\xff").unwrap_err();
        assert!(err.to_string().contains("not UTF-8"), "{err}");
    }
}
