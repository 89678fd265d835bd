//! The WAL's window onto the disk: a small blocking file-system trait, so
//! tests can lie (power cuts that drop unsynced bytes, see `sim`), and its real
//! implementation on `std::fs`.
//!
//! The WAL relies on exactly these durability facts (see `FORMAT.md`):
//! - bytes written to a file survive a power cut once `sync_data` returned;
//! - a created, renamed or removed directory entry survives once `sync_dir`
//!   on its directory returned;
//! - anything else may be lost, and the unsynced tail of a file may come back
//!   torn (any prefix of it, possibly followed by garbage).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// A file opened for appending.
pub trait AppendFile: Send {
    /// Appends all of `buf` at the end of the file.
    fn append(&mut self, buf: &[u8]) -> io::Result<()>;
    /// Appends all of `bufs`, in order, at the end of the file: one group
    /// of batches without first copying them together. Default: one
    /// [`AppendFile::append`] per buffer.
    fn append_vectored(&mut self, bufs: &[&[u8]]) -> io::Result<()> {
        bufs.iter().try_for_each(|buf| self.append(buf))
    }
    /// `fdatasync`: everything appended so far becomes durable.
    fn sync_data(&mut self) -> io::Result<()>;
    /// Cuts the file to `len` bytes (later appends go after it).
    fn truncate(&mut self, len: u64) -> io::Result<()>;
    /// Asks the kernel to start writing `len` bytes at `offset` to the
    /// device without waiting for it (Linux `sync_file_range` with
    /// `SYNC_FILE_RANGE_WRITE`), so that a later `sync_data` has little left
    /// to wait for. Changes no durability promise: only `sync_data` makes
    /// bytes durable. Default (and on other systems): does nothing.
    fn start_writeback(&mut self, offset: u64, len: u64) -> io::Result<()> {
        let _ = (offset, len);
        Ok(())
    }
}

/// A small file rewritten in place (the WAL's sync mark): positioned
/// writes over bytes that are already allocated, so they need no free space.
pub trait OverwriteFile: Send {
    /// Writes all of `buf` at byte `pos`, extending the file if needed.
    fn write_at(&mut self, buf: &[u8], pos: u64) -> io::Result<()>;
    /// `fdatasync`: everything written so far becomes durable.
    fn sync_data(&mut self) -> io::Result<()>;
}

/// A file opened for positioned reads.
pub trait ReadFile: Send + Sync {
    /// Reads exactly `buf.len()` bytes at `pos`.
    fn read_exact_at(&self, buf: &mut [u8], pos: u64) -> io::Result<()>;
    /// Current length in bytes.
    fn size_bytes(&self) -> io::Result<u64>;
}

/// The file-system operations the WAL uses. All calls block.
pub trait Storage: Send + Sync + 'static {
    /// Creates `dir` and its parents.
    fn create_dir_all(&self, dir: &Path) -> io::Result<()>;
    /// Names of the entries of `dir` (not recursive).
    fn list(&self, dir: &Path) -> io::Result<Vec<String>>;
    /// Opens `path` for appending, creating it if missing.
    fn open_append(&self, path: &Path) -> io::Result<Box<dyn AppendFile>>;
    /// Opens `path` for positioned writes, creating it if missing (the
    /// name becomes durable with the next `sync_dir`).
    fn open_overwrite(&self, path: &Path) -> io::Result<Box<dyn OverwriteFile>>;
    /// Opens `path` for reading.
    fn open_read(&self, path: &Path) -> io::Result<Box<dyn ReadFile>>;
    /// Removes the file at `path`.
    fn remove(&self, path: &Path) -> io::Result<()>;
    /// Renames `from` to `to`, replacing `to`.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Makes the entries of `dir` durable (fsync on the directory).
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
}

/// Writes `bytes` to `path` so that after a crash `path` holds either its old
/// content or all of `bytes`: write a temporary file, `fdatasync` it, rename it
/// over `path`, fsync the directory.
///
/// # Errors
/// The first failing I/O operation.
pub fn write_file_atomic(storage: &dyn Storage, path: &Path, bytes: &[u8]) -> io::Result<()> {
    let tmp = tmp_path(path);
    {
        let mut file = storage.open_append(&tmp)?;
        file.truncate(0)?;
        file.append(bytes)?;
        file.sync_data()?;
    }
    storage.rename(&tmp, path)?;
    storage.sync_dir(parent(path))
}

/// Reads the whole file at `path`.
///
/// # Errors
/// The I/O error, or `InvalidData` if the file is larger than `max_bytes`.
pub fn read_file(storage: &dyn Storage, path: &Path, max_bytes: u64) -> io::Result<Vec<u8>> {
    let file = storage.open_read(path)?;
    let len = file.size_bytes()?;
    if len > max_bytes {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} is {len} bytes, more than {max_bytes}", path.display()),
        ));
    }
    let mut buf = vec![0; len as usize];
    file.read_exact_at(&mut buf, 0)?;
    Ok(buf)
}

fn tmp_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".tmp");
    path.with_file_name(name)
}

fn parent(path: &Path) -> &Path {
    path.parent().unwrap_or(Path::new("."))
}

/// The real file system.
#[derive(Debug, Default, Clone, Copy)]
pub struct FsStorage;

struct FsAppend(File);

/// Buffers per `writev` call (Linux's `IOV_MAX` is 1024).
const MAX_IO_SLICES: usize = 1024;

impl AppendFile for FsAppend {
    fn append(&mut self, buf: &[u8]) -> io::Result<()> {
        self.0.write_all(buf)
    }

    fn append_vectored(&mut self, bufs: &[&[u8]]) -> io::Result<()> {
        for group in bufs.chunks(MAX_IO_SLICES) {
            let mut slices: Vec<io::IoSlice<'_>> =
                group.iter().map(|buf| io::IoSlice::new(buf)).collect();
            let mut rest = &mut slices[..];
            // Skip empty buffers up front: a write of only those returns 0.
            io::IoSlice::advance_slices(&mut rest, 0);
            while !rest.is_empty() {
                match self.0.write_vectored(rest) {
                    Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                    Ok(n) => io::IoSlice::advance_slices(&mut rest, n),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(())
    }

    fn sync_data(&mut self) -> io::Result<()> {
        self.0.sync_data()
    }

    #[cfg(target_os = "linux")]
    #[allow(unsafe_code)]
    fn start_writeback(&mut self, offset: u64, len: u64) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        // `off_t` or `off64_t`, depending on the C library: both i64.
        let too_far = |_| io::Error::other("writeback range past i64");
        let offset = offset.try_into().map_err(too_far)?;
        let len = len.try_into().map_err(too_far)?;
        // SAFETY: the descriptor belongs to `self.0`, open for the whole
        // call; the call reads no memory of ours, it only queues writeback.
        let rc = unsafe {
            libc::sync_file_range(self.0.as_raw_fd(), offset, len, libc::SYNC_FILE_RANGE_WRITE)
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    fn truncate(&mut self, len: u64) -> io::Result<()> {
        // The file is opened in append mode: writes always go to the end,
        // so cutting it is all that is needed.
        self.0.set_len(len)
    }
}

struct FsOverwrite(File);

impl OverwriteFile for FsOverwrite {
    fn write_at(&mut self, buf: &[u8], pos: u64) -> io::Result<()> {
        FileExt::write_all_at(&self.0, buf, pos)
    }

    fn sync_data(&mut self) -> io::Result<()> {
        self.0.sync_data()
    }
}

struct FsRead(File);

impl ReadFile for FsRead {
    fn read_exact_at(&self, buf: &mut [u8], pos: u64) -> io::Result<()> {
        FileExt::read_exact_at(&self.0, buf, pos)
    }

    fn size_bytes(&self) -> io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }
}

impl Storage for FsStorage {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        fs::create_dir_all(dir)
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in fs::read_dir(dir)? {
            names.push(entry?.file_name().to_string_lossy().into_owned());
        }
        Ok(names)
    }

    fn open_append(&self, path: &Path) -> io::Result<Box<dyn AppendFile>> {
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        Ok(Box::new(FsAppend(file)))
    }

    fn open_overwrite(&self, path: &Path) -> io::Result<Box<dyn OverwriteFile>> {
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(path)?;
        Ok(Box::new(FsOverwrite(file)))
    }

    fn open_read(&self, path: &Path) -> io::Result<Box<dyn ReadFile>> {
        Ok(Box::new(FsRead(File::open(path)?)))
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        fs::remove_file(path)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::rename(from, to)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vectored_append_of_more_buffers_than_one_writev_takes_writes_them_all_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("segment.log");
        let mut file = FsStorage.open_append(&path).unwrap();
        file.append(b"head:").unwrap();
        // 2,500 buffers (more than IOV_MAX), some empty, of varied sizes.
        let owned: Vec<Vec<u8>> = (0..2500u32)
            .map(|i| vec![(i % 251) as u8; (i % 7) as usize * 100])
            .collect();
        let bufs: Vec<&[u8]> = owned.iter().map(Vec::as_slice).collect();
        file.append_vectored(&bufs).unwrap();
        file.append_vectored(&[]).unwrap();
        file.sync_data().unwrap();
        let mut expected = b"head:".to_vec();
        for buf in &owned {
            expected.extend_from_slice(buf);
        }
        assert_eq!(fs::read(&path).unwrap(), expected);
    }
}
