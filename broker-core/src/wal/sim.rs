//! A simulated disk that keeps live and durable state apart, for power-cut
//! tests. Test-only (`cfg(test)` or the `sim` feature).
//!
//! - File content written but not `sync_data`'d is live only.
//! - Directory entries created, renamed or removed but not `sync_dir`'d are
//!   live only.
//! - [`SimStorage::power_cut`] returns the disk as it would be found after the
//!   power returns: every durable entry with its durable content, followed by
//!   a seeded random prefix of its unsynced appends, whose last bytes may be
//!   garbage (a torn sector).
//! - [`SimStorage::fail_next_write`] and [`SimStorage::fail_next_sync`] make
//!   the next `append` or `sync_data` fail with a given error, as a full or
//!   failing device would. A failed `sync_data` loses the file's unsynced
//!   bytes (live falls back to durable), as Linux may drop dirty pages after
//!   a failed `fdatasync`: nothing of them can be relied on.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use super::storage::{AppendFile, OverwriteFile, ReadFile, Storage};

type Inode = u64;

#[derive(Debug, Default, Clone)]
struct FileData {
    live: Vec<u8>,
    durable: Vec<u8>,
}

#[derive(Debug, Default)]
struct Disk {
    next_inode: Inode,
    inodes: HashMap<Inode, FileData>,
    live_names: BTreeMap<PathBuf, Inode>,
    durable_names: BTreeMap<PathBuf, Inode>,
    dirs: Vec<PathBuf>,
    syncs: u64,
    overwrite_syncs: u64,
    writebacks: Vec<(u64, u64)>,
    /// Returned by the next `append` of any file, which then writes nothing.
    fail_next_append: Option<io::Error>,
    /// Returned by the next `sync_data` of any file, which then drops the
    /// file's unsynced bytes.
    fail_next_sync: Option<io::Error>,
}

/// An in-memory disk with power cuts. Cheap to clone (shared state).
#[derive(Debug, Clone, Default)]
pub struct SimStorage {
    disk: Arc<Mutex<Disk>>,
}

fn not_found(path: &Path) -> io::Error {
    io::Error::new(io::ErrorKind::NotFound, path.display().to_string())
}

impl SimStorage {
    /// An empty disk.
    pub fn new() -> SimStorage {
        SimStorage::default()
    }

    fn lock(&self) -> MutexGuard<'_, Disk> {
        // A panic while holding this lock only happens in a failing test.
        match self.disk.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Number of `sync_data` calls on appended files (segments, atomically
    /// written files) so far; syncs of the WAL's sync mark are not counted.
    pub fn sync_count(&self) -> u64 {
        self.lock().syncs
    }

    /// Number of `sync_data` calls on overwritten files (the sync mark).
    pub fn mark_sync_count(&self) -> u64 {
        self.lock().overwrite_syncs
    }

    /// The `(offset, len)` of every `start_writeback` call so far, in order
    /// (any file). Writeback changes nothing in the simulation: only
    /// `sync_data` makes bytes durable.
    pub fn writeback_ranges(&self) -> Vec<(u64, u64)> {
        self.lock().writebacks.clone()
    }

    /// Makes the next `append` (of any file) fail with `error`, writing
    /// nothing.
    pub fn fail_next_write(&self, error: io::Error) {
        self.lock().fail_next_append = Some(error);
    }

    /// Makes the next `sync_data` (of any file) fail with `error`; that
    /// file's unsynced bytes are lost (its live content falls back to its
    /// durable content) and nothing becomes durable.
    pub fn fail_next_sync(&self, error: io::Error) {
        self.lock().fail_next_sync = Some(error);
    }

    /// The disk after a power cut, as described in the module doc. `seed`
    /// chooses how much of each unsynced tail survives and whether it is torn.
    pub fn power_cut(&self, seed: u64) -> SimStorage {
        let disk = self.lock();
        let mut rng = SplitMix(seed);
        let mut after = Disk {
            next_inode: disk.next_inode,
            dirs: disk.dirs.clone(),
            ..Disk::default()
        };
        for (name, inode) in &disk.durable_names {
            let data = disk.inodes.get(inode).cloned().unwrap_or_default();
            let mut content = data.durable.clone();
            // The unsynced tail: what `live` has beyond the durable prefix,
            // when live still extends durable (appends only).
            if data.live.len() > content.len() && data.live.starts_with(&content) {
                let tail = &data.live[content.len()..];
                let keep = (rng.next() % (tail.len() as u64 + 1)) as usize;
                content.extend_from_slice(&tail[..keep]);
                if keep > 0 && rng.next().is_multiple_of(3) {
                    // A torn sector within what survives of the tail: the
                    // synced bytes before it stay as synced.
                    let garbage = ((rng.next() % 16 + 1) as usize).min(keep);
                    let len = content.len();
                    for byte in &mut content[len - garbage..] {
                        *byte = rng.next() as u8;
                    }
                }
            }
            after.inodes.insert(
                *inode,
                FileData {
                    live: content.clone(),
                    durable: content,
                },
            );
            after.live_names.insert(name.clone(), *inode);
            after.durable_names.insert(name.clone(), *inode);
        }
        SimStorage {
            disk: Arc::new(Mutex::new(after)),
        }
    }

    /// Live content of `path` (for tests that damage bytes).
    pub fn read_live(&self, path: &Path) -> Option<Vec<u8>> {
        let disk = self.lock();
        let inode = disk.live_names.get(path)?;
        disk.inodes.get(inode).map(|d| d.live.clone())
    }

    /// Replaces the content of `path`, live and durable (for tests that damage
    /// bytes on a disk at rest).
    pub fn overwrite(&self, path: &Path, content: Vec<u8>) {
        let mut disk = self.lock();
        if let Some(inode) = disk.live_names.get(path).copied() {
            disk.inodes.insert(
                inode,
                FileData {
                    live: content.clone(),
                    durable: content,
                },
            );
        }
    }
}

struct SimFile {
    disk: Arc<Mutex<Disk>>,
    inode: Inode,
}

impl SimFile {
    fn disk(&self) -> MutexGuard<'_, Disk> {
        match self.disk.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    fn with<R>(&self, f: impl FnOnce(&mut FileData) -> R) -> io::Result<R> {
        let mut disk = self.disk();
        let data = disk
            .inodes
            .get_mut(&self.inode)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "inode gone"))?;
        Ok(f(data))
    }
}

impl AppendFile for SimFile {
    fn append(&mut self, buf: &[u8]) -> io::Result<()> {
        if let Some(error) = self.disk().fail_next_append.take() {
            return Err(error);
        }
        self.with(|d| d.live.extend_from_slice(buf))
    }

    fn sync_data(&mut self) -> io::Result<()> {
        let injected = self.disk().fail_next_sync.take();
        if let Some(error) = injected {
            self.with(|d| d.live = d.durable.clone())?;
            return Err(error);
        }
        self.with(|d| {
            if d.live.starts_with(&d.durable) {
                let from = d.durable.len();
                d.durable.extend_from_slice(&d.live[from..]);
            } else {
                d.durable = d.live.clone();
            }
        })?;
        let mut disk = self.disk();
        disk.syncs += 1;
        Ok(())
    }

    fn truncate(&mut self, len: u64) -> io::Result<()> {
        self.with(|d| d.live.truncate(len as usize))
    }

    fn start_writeback(&mut self, offset: u64, len: u64) -> io::Result<()> {
        let mut disk = self.disk();
        disk.writebacks.push((offset, len));
        Ok(())
    }
}

impl OverwriteFile for SimFile {
    fn write_at(&mut self, buf: &[u8], pos: u64) -> io::Result<()> {
        if let Some(error) = self.disk().fail_next_append.take() {
            return Err(error);
        }
        self.with(|d| {
            let start = pos as usize;
            let end = start + buf.len();
            if d.live.len() < end {
                d.live.resize(end, 0);
            }
            d.live[start..end].copy_from_slice(buf);
        })
    }

    fn sync_data(&mut self) -> io::Result<()> {
        AppendFile::sync_data(self)?;
        // Counted apart: `sync_count` is about data files.
        let mut disk = self.disk();
        disk.syncs -= 1;
        disk.overwrite_syncs += 1;
        Ok(())
    }
}

impl ReadFile for SimFile {
    fn read_exact_at(&self, buf: &mut [u8], pos: u64) -> io::Result<()> {
        self.with(|d| {
            let start = pos as usize;
            let end = start + buf.len();
            if end > d.live.len() {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "read past end",
                ));
            }
            buf.copy_from_slice(&d.live[start..end]);
            Ok(())
        })?
    }

    fn size_bytes(&self) -> io::Result<u64> {
        self.with(|d| d.live.len() as u64)
    }
}

impl SimStorage {
    /// The file at `path`, created (live only) if missing.
    fn open_or_create(&self, path: &Path) -> SimFile {
        let mut disk = self.lock();
        let inode = match disk.live_names.get(path) {
            Some(inode) => *inode,
            None => {
                let inode = disk.next_inode;
                disk.next_inode += 1;
                disk.inodes.insert(inode, FileData::default());
                disk.live_names.insert(path.to_path_buf(), inode);
                inode
            }
        };
        SimFile {
            disk: self.disk.clone(),
            inode,
        }
    }
}

impl Storage for SimStorage {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        let mut disk = self.lock();
        if !disk.dirs.iter().any(|d| d == dir) {
            disk.dirs.push(dir.to_path_buf());
        }
        Ok(())
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let disk = self.lock();
        Ok(disk
            .live_names
            .keys()
            .filter(|p| p.parent() == Some(dir))
            .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .collect())
    }

    fn open_append(&self, path: &Path) -> io::Result<Box<dyn AppendFile>> {
        Ok(Box::new(self.open_or_create(path)))
    }

    fn open_overwrite(&self, path: &Path) -> io::Result<Box<dyn OverwriteFile>> {
        Ok(Box::new(self.open_or_create(path)))
    }

    fn open_read(&self, path: &Path) -> io::Result<Box<dyn ReadFile>> {
        let disk = self.lock();
        let inode = *disk.live_names.get(path).ok_or_else(|| not_found(path))?;
        Ok(Box::new(SimFile {
            disk: self.disk.clone(),
            inode,
        }))
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        let mut disk = self.lock();
        disk.live_names
            .remove(path)
            .map(|_| ())
            .ok_or_else(|| not_found(path))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut disk = self.lock();
        let inode = disk
            .live_names
            .remove(from)
            .ok_or_else(|| not_found(from))?;
        disk.live_names.insert(to.to_path_buf(), inode);
        Ok(())
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let mut disk = self.lock();
        let live: Vec<(PathBuf, Inode)> = disk
            .live_names
            .iter()
            .filter(|(p, _)| p.parent() == Some(dir))
            .map(|(p, i)| (p.clone(), *i))
            .collect();
        disk.durable_names.retain(|p, _| p.parent() != Some(dir));
        disk.durable_names.extend(live);
        Ok(())
    }
}

/// SplitMix64: a tiny seeded generator, enough to choose cut points.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A torn sector is garbage at the end of what survives of the
    /// unsynced tail; the synced bytes before it are never touched, even
    /// when less survives of the tail than a torn sector's size.
    #[test]
    fn a_power_cut_tears_only_the_unsynced_tail_and_keeps_every_synced_byte() {
        let storage = SimStorage::new();
        let dir = Path::new("/d");
        let path = dir.join("segment");
        storage.create_dir_all(dir).unwrap();
        let mut file = storage.open_append(&path).unwrap();
        storage.sync_dir(dir).unwrap();
        file.append(&[7; 100]).unwrap();
        file.sync_data().unwrap();
        // Shorter than a torn sector (up to 16 bytes here).
        file.append(&[9; 5]).unwrap();
        let mut torn = 0;
        for seed in 0..2_000 {
            let content = storage.power_cut(seed).read_live(&path).unwrap();
            assert!(content.len() <= 105, "seed {seed}: {} bytes", content.len());
            assert_eq!(
                content[..100],
                [7; 100],
                "seed {seed}: synced bytes changed"
            );
            torn += usize::from(content[100..].iter().any(|&b| b != 9));
        }
        assert!(torn > 0, "no seed tore the tail");
    }
}
