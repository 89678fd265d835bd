//! Text tables of `tribctl archive ls`: every column as wide as its widest
//! cell (header included), left-aligned, two spaces apart, so each cell
//! starts under its header whatever the lengths of topic names and
//! numbers.

use std::io::Write;

/// Space between two columns.
const GAP: &str = "  ";

/// Writes `headers` and `rows` as aligned columns (no trailing spaces). A
/// row with fewer cells than headers ends early; its last cell may run on
/// (a message instead of numbers).
///
/// # Errors
/// Write errors of `out`.
pub fn write(out: &mut dyn Write, headers: &[&str], rows: &[Vec<String>]) -> std::io::Result<()> {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        // The last cell of a short row runs on and does not widen its column.
        let sized = if row.len() < headers.len() {
            row.len().saturating_sub(1)
        } else {
            row.len()
        };
        for (i, cell) in row.iter().take(sized).enumerate() {
            if let Some(width) = widths.get_mut(i) {
                *width = (*width).max(cell.chars().count());
            }
        }
    }
    let line = |cells: &mut dyn Iterator<Item = &str>| -> String {
        let cells: Vec<&str> = cells.collect();
        let mut text = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i > 0 {
                text.push_str(GAP);
            }
            text.push_str(cell);
            if i + 1 < cells.len() {
                let pad = widths.get(i).copied().unwrap_or(0);
                let len = cell.chars().count();
                text.extend(std::iter::repeat_n(' ', pad.saturating_sub(len)));
            }
        }
        text
    };
    writeln!(out, "{}", line(&mut headers.iter().copied()))?;
    for row in rows {
        writeln!(out, "{}", line(&mut row.iter().map(String::as_str)))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_start_under_their_headers() {
        let rows = vec![
            vec![
                "/plant1/a-very-long-topic-name-indeed-longer-than-forty-chars".into(),
                "3".into(),
                "123456789".into(),
            ],
            vec!["/p/b".into(), "12345".into(), "-".into()],
            vec![
                "/p/c".into(),
                "unreadable footer: boom, and more text".into(),
            ],
        ];
        let mut out = Vec::new();
        write(&mut out, &["TOPIC", "SEGMENTS", "BYTES"], &rows).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let long = "/plant1/a-very-long-topic-name-indeed-longer-than-forty-chars";
        assert_eq!(
            lines[0],
            format!("{:<w$}  SEGMENTS  BYTES", "TOPIC", w = long.len())
        );
        assert_eq!(lines[1], format!("{long}  3         123456789"));
        assert_eq!(
            lines[2],
            format!("{:<w$}  12345     -", "/p/b", w = long.len())
        );
        assert_eq!(
            lines[3],
            format!(
                "{:<w$}  unreadable footer: boom, and more text",
                "/p/c",
                w = long.len()
            )
        );
    }
}
