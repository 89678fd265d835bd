//! Whole directory trees as values, for tests that assert a refusal or a
//! failed operation left stored data untouched byte for byte.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Every regular file under `dir` (recursively) with its bytes, by path.
///
/// # Panics
/// If a directory or file cannot be read.
pub fn files(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut found = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).expect("read a directory") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let bytes = std::fs::read(&path).expect("read a file");
                found.insert(path, bytes);
            }
        }
    }
    found
}
