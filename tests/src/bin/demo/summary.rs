//! What the demo reports: per-topic counts along the way, the summary it
//! prints (and writes as JSON), and the check that every count agrees.

use std::io::Write as _;

use serde::Serialize;
use tributary_tests::demo::TallyReport;

/// Counts of one topic along the way.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TopicCounts {
    pub topic: String,
    pub published: u64,
    pub acknowledged_at_edge: u64,
    pub central: u64,
    pub archive_verified: u64,
    pub archive_segments: u64,
    pub archive_ok: bool,
    pub read_back: TallyReport,
}

/// What the demo prints (and writes with `--summary-json`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Summary {
    pub rows_read: u64,
    pub csv_bytes: u64,
    pub value_bytes: u64,
    pub readings: TopicCounts,
    pub daily: TopicCounts,
    pub edge_batch_bytes: u64,
    pub replication_raw_bytes: u64,
    pub wire_bytes: u64,
    pub broker_outage_ms: u64,
    pub published_during_outage: u64,
    pub backlog_at_restart: u64,
    pub reconnects: u64,
    pub exit_codes: Vec<(String, Option<i32>)>,
    pub replay_s: f64,
    pub wall_s: f64,
    pub records_per_s: f64,
    pub problems: Vec<String>,
    pub ok: bool,
}

pub fn fmt_count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

pub fn fmt_bytes(n: u64) -> String {
    format!("{:.1} MB", n as f64 / 1e6)
}

pub fn check(summary: &mut Summary) {
    let mut problems = Vec::new();
    for counts in [&summary.readings, &summary.daily] {
        let t = &counts.topic;
        let n = counts.published;
        for (what, value) in [
            ("acknowledged at the edge", counts.acknowledged_at_edge),
            ("in the central topic", counts.central),
            (
                "in the archive (tribctl archive verify)",
                counts.archive_verified,
            ),
            ("read back from the archive", counts.read_back.records),
        ] {
            if value != n {
                problems.push(format!(
                    "{t}: {} {what}, {} published",
                    fmt_count(value),
                    fmt_count(n)
                ));
            }
        }
        if !counts.archive_ok {
            problems.push(format!("{t}: tribctl archive verify reported problems"));
        }
        let r = &counts.read_back;
        for (what, value) in [
            ("duplicates", r.duplicates),
            ("gaps", r.gaps),
            ("unexpected records", r.unexpected),
            ("altered values", r.altered),
            ("breaks in the offset sequence", r.offset_jumps),
        ] {
            if value != 0 {
                problems.push(format!("{t}: {value} {what}"));
            }
        }
    }
    if summary.readings.published != summary.rows_read {
        problems.push("not every row read was published".into());
    }
    for (name, code) in &summary.exit_codes {
        if *code != Some(0) {
            problems.push(format!("{name} exited with {code:?} after SIGTERM, not 0"));
        }
    }
    summary.ok = problems.is_empty();
    summary.problems = problems;
}

pub fn print_summary(s: &Summary) {
    let mut out = std::io::stdout().lock();
    let r = &s.readings;
    let d = &s.daily;
    let row = |label: &str, a: u64, b: u64| {
        format!("{label:<34}{:>14}{:>10}", fmt_count(a), fmt_count(b))
    };
    let lines = [
        "Tributary demo: UCI household electric power consumption (Hebrail & Berard,".to_string(),
        "UCI Machine Learning Repository), edge plant1 -> broker -> tier service -> archive"
            .to_string(),
        String::new(),
        format!("{:<34}{:>14}{:>10}", "", "readings", "daily"),
        format!(
            "{:<34}{:>14}",
            "rows read from the CSV",
            fmt_count(s.rows_read)
        ),
        row("records published", r.published, d.published),
        row(
            "records acknowledged at the edge",
            r.acknowledged_at_edge,
            d.acknowledged_at_edge,
        ),
        row("records in the central topic", r.central, d.central),
        row(
            "records in the archive (verify)",
            r.archive_verified,
            d.archive_verified,
        ),
        row(
            "records read back from the archive",
            r.read_back.records,
            d.read_back.records,
        ),
        row("duplicates", r.read_back.duplicates, d.read_back.duplicates),
        row("gaps", r.read_back.gaps, d.read_back.gaps),
        row("altered values", r.read_back.altered, d.read_back.altered),
        row("archive segments", r.archive_segments, d.archive_segments),
        String::new(),
        format!(
            "bytes raw: CSV {}, JSON values {}, record batches {}",
            fmt_bytes(s.csv_bytes),
            fmt_bytes(s.value_bytes),
            fmt_bytes(s.edge_batch_bytes)
        ),
        format!(
            "bytes on the wire (edge -> broker): {} ({:.2} of the batches sent, {:.2} of the CSV)",
            fmt_bytes(s.wire_bytes),
            s.wire_bytes as f64 / s.replication_raw_bytes.max(1) as f64,
            s.wire_bytes as f64 / s.csv_bytes.max(1) as f64
        ),
        format!(
            "broker outage: {:.1} s, {} records published meanwhile, edge backlog {} at restart, {} reconnects",
            s.broker_outage_ms as f64 / 1000.0,
            fmt_count(s.published_during_outage),
            fmt_count(s.backlog_at_restart),
            s.reconnects
        ),
        format!(
            "wall time: {:.1} s (replay {:.1} s), {:.0} records/s",
            s.wall_s, s.replay_s, s.records_per_s
        ),
        format!(
            "graceful stops: {}",
            s.exit_codes
                .iter()
                .map(|(n, c)| format!("{n} exit {}", c.map_or("none".into(), |c| c.to_string())))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    ];
    for line in lines {
        let _ = writeln!(out, "{line}");
    }
    if s.ok {
        let _ = writeln!(out, "result: OK (every count agrees, 0 duplicates, 0 gaps)");
    } else {
        let _ = writeln!(out, "result: FAILED");
        for p in &s.problems {
            let _ = writeln!(out, "  - {p}");
        }
    }
}
