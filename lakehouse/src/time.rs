//! Record timestamps (ms since the Unix epoch, UTC) as RFC 3339 text and
//! as the `date=YYYY-MM-DD` of a Hive-style partition, and back.

use chrono::{DateTime, SecondsFormat, Utc};

/// `ms` as RFC 3339 in UTC with milliseconds (`2006-12-16T17:24:00.000Z`);
/// `None` outside chrono's range (about ±262,000 years).
pub fn rfc3339_ms(ms: i64) -> Option<String> {
    DateTime::<Utc>::from_timestamp_millis(ms)
        .map(|t| t.to_rfc3339_opts(SecondsFormat::Millis, true))
}

/// The UTC date of `ms` as `YYYY-MM-DD` (the partition value); a timestamp
/// outside chrono's range gets `1970-01-01`, so every record has a partition.
pub fn utc_date(ms: i64) -> String {
    DateTime::<Utc>::from_timestamp_millis(ms)
        .unwrap_or_default()
        .format("%Y-%m-%d")
        .to_string()
}

/// Parses an RFC 3339 timestamp (any offset) to ms since the Unix epoch.
///
/// # Errors
/// The parser's message when `s` is not RFC 3339.
pub fn parse_rfc3339_ms(s: &str) -> Result<i64, String> {
    DateTime::parse_from_rfc3339(s.trim())
        .map(|t| t.timestamp_millis())
        .map_err(|e| format!("`{s}` is not an RFC 3339 timestamp: {e}"))
}

/// A timestamp given by a user: an integer of ms since the Unix epoch, or
/// RFC 3339 (`2006-12-16T17:24:00Z`, `2006-12-16T18:24:00+01:00`).
///
/// # Errors
/// A message naming both accepted forms.
pub fn parse_timestamp_arg(s: &str) -> Result<i64, String> {
    if let Ok(ms) = s.trim().parse::<i64>() {
        return Ok(ms);
    }
    parse_rfc3339_ms(s).map_err(|_| {
        format!("`{s}` is neither ms since the Unix epoch nor an RFC 3339 timestamp (2006-12-16T17:24:00Z)")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_round_trip_and_bad_text_is_named() {
        assert_eq!(
            rfc3339_ms(1_166_289_840_123).as_deref(),
            Some("2006-12-16T17:24:00.123Z")
        );
        assert_eq!(utc_date(1_166_289_840_123), "2006-12-16");
        assert_eq!(utc_date(-1), "1969-12-31");
        assert_eq!(parse_timestamp_arg("1166289840123"), Ok(1_166_289_840_123));
        assert_eq!(
            parse_timestamp_arg("2006-12-16T18:24:00.123+01:00"),
            Ok(1_166_289_840_123)
        );
        let err = parse_timestamp_arg("yesterday").expect_err("bad");
        assert!(
            err.contains("`yesterday`") && err.contains("RFC 3339"),
            "{err}"
        );
    }
}
