//! The record counter of `tribctl archive export` ([`RecordCount`]).

use std::io::IsTerminal;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressState, ProgressStyle};

/// Counts exported records and shows the count as a spinner on stderr
/// when it is a terminal. The spinner's `{records}` reads the counter at
/// each redraw (every 200 ms), so counting costs one relaxed atomic add per
/// record and no clock read, and the count shown is the count so far.
/// (The bar's own position used to move in steps of 4096 records only, so
/// an export of fewer showed "0 records" until it ended.)
pub struct RecordCount {
    count: Arc<AtomicU64>,
    bar: ProgressBar,
}

impl RecordCount {
    /// A counter shown on stderr when it is a terminal, hidden otherwise.
    pub fn on_stderr(what: &str) -> RecordCount {
        let target = if std::io::stderr().is_terminal() {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        };
        let count = RecordCount::new(what, target);
        count
            .bar
            .enable_steady_tick(std::time::Duration::from_millis(200));
        count
    }

    /// A counter drawn on `target` when its bar ticks.
    fn new(what: &str, target: ProgressDrawTarget) -> RecordCount {
        let count = Arc::new(AtomicU64::new(0));
        let bar = ProgressBar::with_draw_target(None, target);
        let (shown, rated) = (count.clone(), count.clone());
        if let Ok(style) =
            ProgressStyle::with_template("{spinner} {msg}: {records} records ({records_per_sec})")
        {
            bar.set_style(
                style
                    .with_key(
                        "records",
                        move |_: &ProgressState, w: &mut dyn std::fmt::Write| {
                            let _ = write!(w, "{}", shown.load(Ordering::Relaxed));
                        },
                    )
                    .with_key(
                        "records_per_sec",
                        move |state: &ProgressState, w: &mut dyn std::fmt::Write| {
                            let seconds = state.elapsed().as_secs_f64();
                            // Display only: a count far below 2^52 is exact as f64.
                            #[allow(clippy::cast_precision_loss)]
                            let records = rated.load(Ordering::Relaxed) as f64;
                            let rate = if seconds > 0.0 {
                                records / seconds
                            } else {
                                0.0
                            };
                            let _ = write!(w, "{rate:.0}/s");
                        },
                    ),
            );
        }
        bar.set_message(what.to_owned());
        RecordCount { count, bar }
    }

    /// Counts `n` more records.
    pub fn add(&self, n: u64) {
        self.count.fetch_add(n, Ordering::Relaxed);
    }

    /// The records counted so far.
    #[cfg(test)]
    pub fn get(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// Removes the spinner (the caller prints the summary line).
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use indicatif::TermLike;

    use super::*;

    /// A terminal that keeps every line drawn on it.
    #[derive(Debug, Clone, Default)]
    struct Screen(Arc<Mutex<Vec<String>>>);

    impl Screen {
        fn last(&self) -> String {
            let lines = self.0.lock().unwrap();
            lines
                .iter()
                .rev()
                .find(|l| l.contains("records"))
                .cloned()
                .unwrap_or_default()
        }
    }

    impl TermLike for Screen {
        fn width(&self) -> u16 {
            120
        }
        fn move_cursor_up(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_down(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_right(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_left(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn write_line(&self, s: &str) -> std::io::Result<()> {
            self.0.lock().unwrap().push(s.to_owned());
            Ok(())
        }
        fn write_str(&self, s: &str) -> std::io::Result<()> {
            self.write_line(s)
        }
        fn clear_line(&self) -> std::io::Result<()> {
            Ok(())
        }
        fn flush(&self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn the_spinner_shows_every_record_counted_so_far() {
        let screen = Screen::default();
        let count = RecordCount::new(
            "export",
            ProgressDrawTarget::term_like_with_hz(Box::new(screen.clone()), 100),
        );
        for _ in 0..10 {
            count.add(1);
        }
        std::thread::sleep(std::time::Duration::from_millis(30));
        count.bar.tick();
        assert_eq!(count.get(), 10);
        let line = screen.last();
        assert!(line.contains("export: 10 records ("), "{line:?}");
        count.add(1500);
        std::thread::sleep(std::time::Duration::from_millis(30));
        count.bar.tick();
        let line = screen.last();
        assert!(line.contains("export: 1510 records ("), "{line:?}");
        count.finish();
    }
}
