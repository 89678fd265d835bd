//! Checks an exposition against what dashboards rely on, the same way for
//! all three daemons: OpenMetrics 1.0 text (`# HELP`, `# TYPE`, samples,
//! `# EOF` last), every family with a HELP that is a sentence (a capital
//! or digit first, a full stop last, at least three words), and no family
//! mixing label sets (an agent-wide sample beside per-topic ones makes
//! `sum()` count twice; a histogram's `le` bucket label aside). [`parse`]
//! returns the families for lookups.

use std::collections::{BTreeMap, BTreeSet};

/// One sample: full sample name (with `_total` for counters), labels in
/// order, value.
pub type Sample = (String, Vec<(String, String)>, f64);

/// One metric family of an exposition.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MetricFamily {
    /// `counter`, `gauge`, ...
    pub kind: String,
    /// The HELP text.
    pub help: String,
    /// Its samples.
    pub samples: Vec<Sample>,
}

impl MetricFamily {
    /// The value of the sample whose labels include every `(name, value)`
    /// of `labels`; `None` when no sample or several match.
    pub fn value(&self, labels: &[(&str, &str)]) -> Option<f64> {
        let mut matching = self.samples.iter().filter(|(_, have, _)| {
            labels
                .iter()
                .all(|(k, v)| have.iter().any(|(hk, hv)| hk == k && hv == v))
        });
        let first = matching.next()?;
        matching.next().is_none().then_some(first.2)
    }

    /// A histogram series' observation count and sum (its `_count` and
    /// `_sum` samples) for the one series whose labels include every
    /// `(name, value)` of `labels`; `None` when the family is no histogram
    /// or no series or several match.
    pub fn histogram(&self, labels: &[(&str, &str)]) -> Option<HistogramSeries> {
        if self.kind != "histogram" {
            return None;
        }
        let one = |suffix: &str| {
            let mut matching = self.samples.iter().filter(|(name, have, _)| {
                name.ends_with(suffix)
                    && labels
                        .iter()
                        .all(|(k, v)| have.iter().any(|(hk, hv)| hk == k && hv == v))
            });
            let first = matching.next()?;
            matching.next().is_none().then_some(first.2)
        };
        Some(HistogramSeries {
            count: one("_count")?,
            sum: one("_sum")?,
        })
    }
}

/// What a histogram series holds in all.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HistogramSeries {
    /// Observations.
    pub count: f64,
    /// Sum of the observed values.
    pub sum: f64,
}

impl HistogramSeries {
    /// The mean observed value (0 without observations).
    pub fn mean(&self) -> f64 {
        if self.count > 0.0 {
            self.sum / self.count
        } else {
            0.0
        }
    }

    /// What was observed since `earlier` (the same series scraped before).
    pub fn since(&self, earlier: &HistogramSeries) -> HistogramSeries {
        HistogramSeries {
            count: self.count - earlier.count,
            sum: self.sum - earlier.sum,
        }
    }
}

/// Parses an OpenMetrics text exposition into its families by name (the
/// name of `# TYPE`, without `_total`), checking it as the module says.
///
/// # Errors
/// Every problem found, one line each.
pub fn parse(text: &str) -> Result<BTreeMap<String, MetricFamily>, String> {
    let mut problems = Vec::new();
    let mut families: BTreeMap<String, MetricFamily> = BTreeMap::new();
    let lines: Vec<&str> = text.lines().collect();
    if lines.last() != Some(&"# EOF") {
        problems.push("the exposition does not end with `# EOF`".to_owned());
    }
    for line in &lines {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            families.entry(name.to_owned()).or_default().help = help.to_owned();
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            families.entry(name.to_owned()).or_default().kind = kind.to_owned();
        } else if line.starts_with('#') {
            if *line != "# EOF" && !line.starts_with("# UNIT ") {
                problems.push(format!("unknown comment line: {line}"));
            }
        } else if !line.is_empty() {
            match sample(line) {
                Some((name, labels, value)) => {
                    let family = family_of(&name, &families);
                    match family.and_then(|f| families.get_mut(&f)) {
                        Some(f) => f.samples.push((name, labels, value)),
                        None => problems.push(format!("sample without a family: {line}")),
                    }
                }
                None => problems.push(format!("not a sample: {line}")),
            }
        }
    }
    for (name, family) in &families {
        if family.kind.is_empty() {
            problems.push(format!("{name}: no # TYPE"));
        }
        if !is_sentence(&family.help) {
            problems.push(format!("{name}: HELP is not a sentence: {:?}", family.help));
        }
        let label_sets: BTreeSet<Vec<&str>> = family
            .samples
            .iter()
            .map(|(_, labels, _)| {
                let mut keys: Vec<&str> = labels
                    .iter()
                    .map(|(k, _)| k.as_str())
                    .filter(|k| family.kind != "histogram" || *k != "le")
                    .collect();
                keys.sort_unstable();
                keys
            })
            .collect();
        if label_sets.len() > 1 {
            problems.push(format!(
                "{name}: samples with different label sets {label_sets:?}"
            ));
        }
    }
    if problems.is_empty() {
        Ok(families)
    } else {
        Err(problems.join("\n"))
    }
}

/// A HELP text that reads as a sentence.
pub fn is_sentence(help: &str) -> bool {
    let starts = help
        .chars()
        .next()
        .is_some_and(|c| c.is_uppercase() || c.is_ascii_digit());
    starts && help.ends_with('.') && help.split_whitespace().count() >= 3
}

/// The family a sample belongs to: its name, or its name without a
/// counter's `_total` (or a histogram's suffixes).
fn family_of(sample: &str, families: &BTreeMap<String, MetricFamily>) -> Option<String> {
    if families.contains_key(sample) {
        return Some(sample.to_owned());
    }
    ["_total", "_created", "_bucket", "_count", "_sum"]
        .iter()
        .find_map(|suffix| {
            let base = sample.strip_suffix(suffix)?;
            families.contains_key(base).then(|| base.to_owned())
        })
}

fn sample(line: &str) -> Option<Sample> {
    let (series, value) = line.rsplit_once(' ')?;
    let value: f64 = value.parse().ok()?;
    let Some((name, rest)) = series.split_once('{') else {
        return Some((series.to_owned(), Vec::new(), value));
    };
    let body = rest.strip_suffix('}')?;
    let mut labels = Vec::new();
    let mut chars = body.chars().peekable();
    while chars.peek().is_some() {
        let key: String = chars.by_ref().take_while(|&c| c != '=').collect();
        if chars.next() != Some('"') {
            return None;
        }
        let mut value = String::new();
        loop {
            match chars.next()? {
                '\\' => match chars.next()? {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                '"' => break,
                c => value.push(c),
            }
        }
        labels.push((key, value));
        if chars.peek() == Some(&',') {
            chars.next();
        }
    }
    Some((name.to_owned(), labels, value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_good_exposition_parses_into_families() {
        let text = "# HELP a_total_x Records published to the topic.\n# TYPE a_total_x counter\n\
                    a_total_x_total{edge=\"e1\",topic=\"/e1/a\"} 10\n\
                    a_total_x_total{edge=\"e1\",topic=\"/e1/\\\"b\"} 2\n\
                    # HELP g Bytes held now by the agent.\n# TYPE g gauge\ng{edge=\"e1\"} 1.5\n# EOF\n";
        let families = parse(text).expect("valid");
        assert_eq!(
            families["a_total_x"].value(&[("topic", "/e1/\"b")]),
            Some(2.0)
        );
        assert_eq!(families["g"].value(&[]), Some(1.5));
        assert_eq!(
            families["a_total_x"].value(&[("edge", "e1")]),
            None,
            "two match"
        );
    }

    #[test]
    fn a_histogram_parses_into_series_with_count_and_sum() {
        let text = "# HELP h_seconds Seconds spent in each stage.\n# TYPE h_seconds histogram\n\
                    h_seconds_sum{edge=\"e1\",stage=\"read\"} 1.5\n\
                    h_seconds_count{edge=\"e1\",stage=\"read\"} 3\n\
                    h_seconds_bucket{le=\"0.1\",edge=\"e1\",stage=\"read\"} 1\n\
                    h_seconds_bucket{le=\"+Inf\",edge=\"e1\",stage=\"read\"} 3\n\
                    h_seconds_sum{edge=\"e1\",stage=\"ack\"} 0.0\n\
                    h_seconds_count{edge=\"e1\",stage=\"ack\"} 0\n\
                    h_seconds_bucket{le=\"+Inf\",edge=\"e1\",stage=\"ack\"} 0\n# EOF\n";
        let families = parse(text).expect("valid: `le` is no second label set");
        let h = &families["h_seconds"];
        let read = h.histogram(&[("stage", "read")]).expect("read");
        assert_eq!(
            read,
            HistogramSeries {
                count: 3.0,
                sum: 1.5
            }
        );
        assert_eq!(read.mean(), 0.5);
        let ack = h.histogram(&[("stage", "ack")]).expect("ack");
        assert_eq!(ack.mean(), 0.0);
        assert_eq!(read.since(&ack), read);
        assert_eq!(h.histogram(&[("edge", "e1")]), None, "two series match");
        assert_eq!(h.histogram(&[("stage", "send")]), None);
    }

    #[test]
    fn a_le_label_outside_a_histogram_is_a_second_label_set() {
        let text = "# HELP g Bytes held now by the agent.\n# TYPE g gauge\n\
                    g{edge=\"e1\"} 1\ng{edge=\"e1\",le=\"1\"} 2\n# EOF\n";
        let err = parse(text).unwrap_err();
        assert!(
            err.contains("g: samples with different label sets"),
            "{err}"
        );
    }

    #[test]
    fn mixed_label_sets_fragments_and_a_missing_eof_are_reported() {
        let text = "# HELP d bytes used\n# TYPE d gauge\nd 10\nd{topic=\"/e1/a\"} 4\n";
        let err = parse(text).unwrap_err();
        assert!(err.contains("does not end with `# EOF`"), "{err}");
        assert!(err.contains("d: HELP is not a sentence"), "{err}");
        assert!(
            err.contains("d: samples with different label sets"),
            "{err}"
        );
    }
}
