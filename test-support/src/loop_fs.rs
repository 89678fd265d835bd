//! A small real ext4 file system on a loop device, for tests of a full
//! disk: an image file, `mkfs.ext4`, `mount -o loop`, a filler file that
//! takes the free space, and `umount` on drop. Needs root and the tools;
//! [`LoopFs::new`] fails (never skips) when they are missing.

use std::io::{self, Write as _};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

static NEXT: AtomicU64 = AtomicU64::new(0);

/// A mounted loop file system; unmounted (and its image removed) on drop.
#[derive(Debug)]
pub struct LoopFs {
    image: PathBuf,
    mount_point: PathBuf,
    /// The mount point was created by [`LoopFs::new`] (removed on drop).
    own_dir: bool,
}

fn run(cmd: &mut Command) -> io::Result<()> {
    let output = cmd
        .output()
        .map_err(|e| io::Error::other(format!("{cmd:?}: {e} (is it installed?)")))?;
    if output.status.success() {
        return Ok(());
    }
    Err(io::Error::other(format!(
        "{cmd:?} failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr).trim()
    )))
}

impl LoopFs {
    /// A fresh ext4 file system of `size_mib` MiB mounted on a new
    /// directory under the system temporary directory.
    ///
    /// # Errors
    /// Creating the image, `mkfs.ext4` or `mount` failed (not root, tools
    /// missing): the test must fail.
    pub fn new(size_mib: u64) -> io::Result<LoopFs> {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("trib-loopfs-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        LoopFs::mount(size_mib, &dir, true)
    }

    /// Like [`LoopFs::new`], mounted on `mount_point` (created if missing,
    /// left in place on drop): e.g. a data directory's `topics/` so that
    /// only the WALs live on the small file system.
    ///
    /// # Errors
    /// As [`LoopFs::new`].
    pub fn new_at(size_mib: u64, mount_point: &Path) -> io::Result<LoopFs> {
        std::fs::create_dir_all(mount_point)?;
        LoopFs::mount(size_mib, mount_point, false)
    }

    fn mount(size_mib: u64, mount_point: &Path, own_dir: bool) -> io::Result<LoopFs> {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let image =
            std::env::temp_dir().join(format!("trib-loopfs-{}-{n}.img", std::process::id()));
        std::fs::File::create(&image)?.set_len(size_mib * 1024 * 1024)?;
        run(Command::new("mkfs.ext4").arg("-q").arg("-F").arg(&image))?;
        run(Command::new("mount")
            .arg("-o")
            .arg("loop")
            .arg(&image)
            .arg(mount_point))?;
        Ok(LoopFs {
            image,
            mount_point: mount_point.to_path_buf(),
            own_dir,
        })
    }

    /// The mount point.
    pub fn path(&self) -> &Path {
        &self.mount_point
    }

    /// Writes a filler file until the file system is full (`ENOSPC`) and
    /// syncs it; returns its path (give it to [`LoopFs::free`]).
    ///
    /// # Errors
    /// An I/O error other than `ENOSPC`.
    pub fn fill(&self) -> io::Result<PathBuf> {
        self.fill_leaving(0)
    }

    /// Like [`LoopFs::fill`], then gives `leave_bytes` back (the filler is
    /// truncated by that much), so the next writer fills the rest itself.
    ///
    /// # Errors
    /// As [`LoopFs::fill`].
    pub fn fill_leaving(&self, leave_bytes: u64) -> io::Result<PathBuf> {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = self.mount_point.join(format!("filler-{n}"));
        let mut file = std::fs::File::create(&path)?;
        let chunk = vec![0xAAu8; 1024 * 1024];
        let mut written = 0u64;
        loop {
            match file.write(&chunk) {
                Ok(0) => break,
                Ok(k) => written += k as u64,
                Err(e) if e.kind() == io::ErrorKind::StorageFull => break,
                Err(e) => return Err(e),
            }
        }
        // Small writes take the last blocks a large one could not.
        loop {
            match file.write(&chunk[..1024]) {
                Ok(0) => break,
                Ok(k) => written += k as u64,
                Err(e) if e.kind() == io::ErrorKind::StorageFull => break,
                Err(e) => return Err(e),
            }
        }
        file.sync_all()?;
        if leave_bytes > 0 {
            file.set_len(written.saturating_sub(leave_bytes))?;
            file.sync_all()?;
        }
        Ok(path)
    }

    /// Removes a filler file made by [`LoopFs::fill`].
    ///
    /// # Errors
    /// Removing it failed.
    pub fn free(&self, filler: PathBuf) -> io::Result<()> {
        std::fs::remove_file(filler)
    }
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        // A process killed a moment ago may still hold files: retry, then
        // detach lazily so the test never leaves a mount behind.
        let mut unmounted = false;
        for _ in 0..20 {
            if run(Command::new("umount").arg(&self.mount_point)).is_ok() {
                unmounted = true;
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        if !unmounted {
            let _ = run(Command::new("umount").arg("-l").arg(&self.mount_point));
        }
        let _ = std::fs::remove_file(&self.image);
        if self.own_dir {
            let _ = std::fs::remove_dir(&self.mount_point);
        }
    }
}
