//! `ring.json`: where a realtime topic's ring resumes its offsets after a
//! restart (written at a graceful stop, atomically).

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{OpenError, RING_STATE_FILE};

/// `ring.json`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RingState {
    next_offset: u64,
}

/// The saved next offset in `path`, `None` when there is no file.
///
/// # Errors
/// [`OpenError::RingState`] for an unreadable or malformed file.
pub(super) fn read_ring_state(path: &Path) -> Result<Option<u64>, OpenError> {
    let bad = |reason: String| OpenError::RingState {
        path: path.to_path_buf(),
        reason,
    };
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice::<RingState>(&bytes)
            .map(|s| Some(s.next_offset))
            .map_err(|e| bad(e.to_string())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(bad(e.to_string())),
    }
}

/// Writes `ring.json` atomically (temporary file, fsync, rename, fsync of
/// the directory).
pub(super) fn write_ring_state(dir: &Path, next_offset: u64) -> Result<(), OpenError> {
    use std::io::Write as _;
    let path = dir.join(RING_STATE_FILE);
    let bad = |e: std::io::Error| OpenError::RingState {
        path: path.clone(),
        reason: e.to_string(),
    };
    std::fs::create_dir_all(dir).map_err(bad)?;
    let tmp = dir.join(format!("{RING_STATE_FILE}.tmp"));
    let json = serde_json::to_vec(&RingState { next_offset })
        .map_err(|e| bad(std::io::Error::other(e)))?;
    let mut file = std::fs::File::create(&tmp).map_err(bad)?;
    file.write_all(&json).map_err(bad)?;
    file.sync_all().map_err(bad)?;
    std::fs::rename(&tmp, &path).map_err(bad)?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(bad)?;
    Ok(())
}
