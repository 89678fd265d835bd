//! JSON logs carry plain values: no `tracing` field of the daemons' and
//! libraries' production code is recorded with `?` (its `Debug` form),
//! which turns an `Option<&str>` into `"Some(\"event_stream\")"` and a list
//! into Rust syntax in `--log-format json` lines. Pass the value itself (an
//! `Option` of a plain value is recorded plainly, or left out when `None`),
//! `%` for a `Display`, or a joined string for a list.
//!
//! Scans every `src/` file of the workspace's crates (test modules and
//! `*tests.rs` files aside) for `trace!`/`debug!`/`info!`/`warn!`/`error!`
//! invocations with a `?field` or `field = ?value`.

use std::path::{Path, PathBuf};

/// Crates whose production code logs (the test harness crates aside).
const CRATES: &[&str] = &[
    "proto",
    "broker-core",
    "api",
    "archive",
    "lakehouse",
    "edge-agent",
    "broker",
    "tier-service",
    "ctl",
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if name != "tests.rs" && !name.ends_with("_tests.rs") {
                out.push(path);
            }
        }
    }
}

/// The text of `source` without string literals' contents (so a `?` in a
/// message does not count) and without a trailing `#[cfg(test)] mod tests`.
fn code_only(source: &str) -> String {
    let source = match source.find("\n#[cfg(test)]\nmod tests {") {
        Some(at) => &source[..at],
        None => source,
    };
    let mut out = String::with_capacity(source.len());
    let mut chars = source.chars().peekable();
    let mut in_string = false;
    while let Some(c) = chars.next() {
        if in_string {
            match c {
                '\\' => {
                    chars.next();
                }
                '"' => {
                    in_string = false;
                    out.push('"');
                }
                '\n' => out.push('\n'),
                _ => {}
            }
        } else {
            // A char literal '"' is not a string start.
            if c == '\'' && chars.peek() == Some(&'"') {
                out.push_str("'\"");
                chars.next();
                continue;
            }
            if c == '"' {
                in_string = true;
            }
            out.push(c);
        }
    }
    out
}

/// `(line, invocation)` of every logging macro call in `code` with a
/// `Debug`-formatted field.
fn debug_fields(code: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for name in ["trace!(", "debug!(", "info!(", "warn!(", "error!("] {
        let mut from = 0;
        while let Some(at) = code[from..].find(name) {
            let start = from + at;
            from = start + name.len();
            let before = code[..start].chars().next_back().unwrap_or(' ');
            if before.is_alphanumeric() || before == '_' {
                continue; // e.g. `try_info!(`
            }
            let mut depth = 1usize;
            let mut end = from;
            for (i, c) in code[from..].char_indices() {
                match c {
                    '(' | '[' | '{' => depth += 1,
                    ')' | ']' | '}' => {
                        depth -= 1;
                        if depth == 0 {
                            end = from + i;
                            break;
                        }
                    }
                    _ => {}
                }
            }
            let args = &code[from..end];
            let bytes = args.as_bytes();
            let debug = bytes.iter().enumerate().any(|(i, &b)| {
                if b != b'?' {
                    return false;
                }
                // `expr?` (error propagation) follows an identifier or `)`.
                let prev = args[..i].trim_end().chars().next_back().unwrap_or(',');
                let next = args[i + 1..].trim_start().chars().next().unwrap_or(' ');
                matches!(prev, ',' | '(' | '=')
                    && (next.is_alphabetic() || next == '_' || next == '&')
            });
            if debug {
                let line = code[..start].matches('\n').count() + 1;
                found.push((line, args.split_whitespace().collect::<Vec<_>>().join(" ")));
            }
        }
    }
    found
}

#[test]
fn no_log_field_is_recorded_in_its_debug_form() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    for krate in CRATES {
        rust_files(&root.join(krate).join("src"), &mut files);
    }
    assert!(files.len() > 100, "found only {} source files", files.len());
    let mut offenders = Vec::new();
    for file in &files {
        let source = std::fs::read_to_string(file).expect("read source");
        for (line, call) in debug_fields(&code_only(&source)) {
            offenders.push(format!("{}:{line}: {call}", file.display()));
        }
    }
    assert!(
        offenders.is_empty(),
        "log fields in Debug form (`?field`): pass the value, `%value` or a joined string\n{}",
        offenders.join("\n")
    );
}

#[test]
fn the_scanner_finds_debug_fields_and_nothing_else() {
    let code = code_only(
        r#"
        info!(%topic, intent = ?settings.map(|s| s.intent), "opened");
        warn!(?delay, "retrying {x:?}?");
        debug!(topic, offset = next?, "plain");
        tracing::error!(a = b, "fine ?c");
        "#,
    );
    let found = debug_fields(&code);
    assert_eq!(found.len(), 2, "{found:?}");
    assert_eq!(found[0].0, 2);
    assert_eq!(found[1].0, 3);
}
