//! Crash injection for tests: `TRIB_TIER_FAULT=<point>[:<n>]` makes the
//! process abort (no cleanup, like SIGKILL) the `n`-th time (default 1st)
//! it reaches `<point>`. Several points may be given, comma-separated.
//!
//! | point | where |
//! |---|---|
//! | `before_upload` | segment picked up, nothing stored |
//! | `mid_upload` | a multipart upload has sent its first part, not completed |
//! | `after_upload` | object stored, not verified |
//! | `after_verify` | object verified, descriptor not committed |
//! | `after_commit` | descriptor committed, trim not requested |
//! | `after_trim` | the broker applied retention |
//! | `reconcile_after_adopt` | reconciliation committed an orphan's descriptor |
//! | `retention_after_descriptor_delete` | cold retention removed a descriptor, not yet its object |
//! | `lakehouse_after_put` | the lakehouse writer stored one Parquet file of a segment |
//! | `lakehouse_before_progress` | a segment's Parquet files stored, progress not recorded |

use std::collections::HashMap;
use std::sync::Mutex;

/// Environment variable holding the fault points.
pub const FAULT_ENV: &str = "TRIB_TIER_FAULT";

/// Every known fault point.
pub const FAULT_POINTS: [&str; 10] = [
    "before_upload",
    "mid_upload",
    "after_upload",
    "after_verify",
    "after_commit",
    "after_trim",
    "reconcile_after_adopt",
    "retention_after_descriptor_delete",
    "lakehouse_after_put",
    "lakehouse_before_progress",
];

/// Armed fault points and how often each was reached.
#[derive(Debug, Default)]
pub struct Faults {
    /// point → (crash at this hit, hits so far)
    armed: Mutex<HashMap<String, (u32, u32)>>,
}

impl Faults {
    /// No faults.
    pub fn none() -> Faults {
        Faults::default()
    }

    /// Parses `point[:n],...`.
    ///
    /// # Errors
    /// A message naming an unknown point or a bad count.
    pub fn parse(spec: &str) -> Result<Faults, String> {
        let mut armed = HashMap::new();
        for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (point, nth) = match item.split_once(':') {
                Some((p, n)) => (
                    p,
                    n.parse::<u32>()
                        .ok()
                        .filter(|&n| n >= 1)
                        .ok_or_else(|| format!("{FAULT_ENV}: bad count in {item:?}"))?,
                ),
                None => (item, 1),
            };
            if !FAULT_POINTS.contains(&point) {
                return Err(format!(
                    "{FAULT_ENV}: unknown point {point:?}; known: {}",
                    FAULT_POINTS.join(", ")
                ));
            }
            armed.insert(point.to_owned(), (nth, 0));
        }
        Ok(Faults {
            armed: Mutex::new(armed),
        })
    }

    /// From [`FAULT_ENV`] (none if unset).
    ///
    /// # Errors
    /// As [`Faults::parse`].
    pub fn from_env() -> Result<Faults, String> {
        match std::env::var(FAULT_ENV) {
            Ok(spec) => Faults::parse(&spec),
            Err(_) => Ok(Faults::none()),
        }
    }

    /// Marks that `point` was reached; aborts the process if armed for this
    /// hit.
    pub fn hit(&self, point: &'static str) {
        debug_assert!(FAULT_POINTS.contains(&point), "unknown fault point {point}");
        let mut armed = self.armed.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((nth, hits)) = armed.get_mut(point) {
            *hits += 1;
            if *hits == *nth {
                eprintln!("tier-service: fault injected at {point} (hit {hits}); aborting");
                std::process::abort();
            }
        }
    }
}
