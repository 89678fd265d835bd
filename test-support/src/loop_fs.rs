//! A small real filesystem for full-disk tests: an image file formatted
//! with `mkfs.ext4`, loop-mounted, that a test fills until the kernel
//! answers `ENOSPC` and frees again.
//!
//! The tests that use it need root, `mkfs.ext4`, `mount -o loop`,
//! `umount`, `losetup` (util-linux, e2fsprogs) and `stat` (coreutils). Without them
//! [`LoopFs::create`] panics, naming what is missing: a full-disk test
//! must fail, never pass silently.
//!
//! ```no_run
//! use tributary_test_support::loop_fs::LoopFs;
//! let dir = std::env::temp_dir().join("my-test");
//! std::fs::create_dir_all(&dir).unwrap();
//! let fs = LoopFs::create(&dir, 16 * 1024 * 1024);
//! let data_dir = fs.path().join("data");
//! // ... write into data_dir ...
//! fs.fill(); // now every allocating write there fails with ENOSPC
//! fs.free(); // and now it succeeds again
//! // Dropping `fs` unmounts it and detaches the loop device.
//! ```

use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Name of the file [`LoopFs::fill`] writes, in the filesystem's root.
pub const FILLER_NAME: &str = "loopfs-filler";

/// A mounted ext4 filesystem on a loop device; unmounted (and its loop
/// device detached) when dropped, also when the test panics.
///
/// Drop it before the directory holding its image is removed (declare it
/// after that directory's guard, e.g. after a `tempfile::TempDir`).
#[derive(Debug)]
pub struct LoopFs {
    image: PathBuf,
    mount: PathBuf,
    /// The loop device, e.g. `/dev/loop3`, once mounted.
    device: Option<String>,
    mounted: bool,
}

/// Runs a command; `Err` names it with its exit status and stderr.
fn run(program: &str, args: &[&str]) -> Result<Output, String> {
    let output = Command::new(program).args(args).output().map_err(|e| {
        format!(
            "cannot run `{program}` ({e}): the full-disk tests need e2fsprogs (mkfs.ext4) \
                 and util-linux (mount, umount, losetup), and root to loop-mount"
        )
    })?;
    if output.status.success() {
        Ok(output)
    } else {
        Err(format!(
            "`{program} {}` failed ({}): {}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

impl LoopFs {
    /// Creates `dir/loopfs.img` of `size_bytes` (at least 8 MiB is
    /// sensible), formats it as ext4 with no blocks reserved for root (so
    /// "full" means full for every process), and mounts it on
    /// `dir/loopfs.mnt`.
    ///
    /// # Panics
    /// If a tool is missing, the caller is not allowed to loop-mount, or a
    /// step fails; the message names the step. Never skips.
    pub fn create(dir: &Path, size_bytes: u64) -> LoopFs {
        LoopFs::create_at(dir, size_bytes, &dir.join("loopfs.mnt"))
    }

    /// Like [`LoopFs::create`], mounted on `mount` (created if missing):
    /// e.g. a data directory's `topics/`, so that only the WALs live on the
    /// small filesystem. The image is still `dir/loopfs.img`.
    ///
    /// # Panics
    /// As [`LoopFs::create`].
    pub fn create_at(dir: &Path, size_bytes: u64, mount: &Path) -> LoopFs {
        let image = dir.join("loopfs.img");
        let mount = mount.to_path_buf();
        std::fs::create_dir_all(&mount)
            .unwrap_or_else(|e| panic!("loop_fs: cannot create {}: {e}", mount.display()));
        File::create(&image)
            .and_then(|f| f.set_len(size_bytes))
            .unwrap_or_else(|e| panic!("loop_fs: cannot create {}: {e}", image.display()));
        let mut fs = LoopFs {
            image,
            mount,
            device: None,
            mounted: false,
        };
        let image = fs.image.to_string_lossy().into_owned();
        let mount = fs.mount.to_string_lossy().into_owned();
        if let Err(e) = run("mkfs.ext4", &["-q", "-F", "-m", "0", &image]) {
            panic!("loop_fs: {e}");
        }
        // `losetup --find --show` attaches and prints the device, so Drop
        // knows exactly which device to detach.
        match run("losetup", &["--find", "--show", &image]) {
            Ok(out) => {
                fs.device = Some(String::from_utf8_lossy(&out.stdout).trim().to_owned());
            }
            Err(e) => panic!("loop_fs: {e}"),
        }
        let device = fs.device.clone().unwrap_or_default();
        if let Err(e) = run("mount", &[&device, &mount]) {
            panic!("loop_fs: {e}");
        }
        fs.mounted = true;
        fs
    }

    /// The mount point: the root of the small filesystem.
    pub fn path(&self) -> &Path {
        &self.mount
    }

    /// The loop device it is mounted from (`/dev/loopN`).
    pub fn device(&self) -> &str {
        self.device.as_deref().unwrap_or("")
    }

    /// Bytes still available to an unprivileged writer (`statvfs`'s
    /// `f_bavail × f_frsize`, read with `stat -f`).
    ///
    /// # Panics
    /// If `stat -f` fails on the mount point.
    pub fn available_bytes(&self) -> u64 {
        let mount = self.mount.to_string_lossy().into_owned();
        let out =
            run("stat", &["-f", "-c", "%a %S", &mount]).unwrap_or_else(|e| panic!("loop_fs: {e}"));
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let mut fields = text.split_whitespace().map(|f| f.parse::<u64>());
        match (fields.next(), fields.next()) {
            (Some(Ok(blocks)), Some(Ok(block_size))) => blocks.saturating_mul(block_size),
            _ => panic!("loop_fs: unexpected `stat -f` output {text:?}"),
        }
    }

    /// Fills the filesystem: appends to [`FILLER_NAME`] in its root until
    /// writes fail with `ENOSPC` (1 MiB chunks, then 4 KiB, then single
    /// bytes), fsyncs it, and tops up again what the fsync released.
    /// Returns the filler's size in bytes. Call it again after the code
    /// under test freed something, to fill it again.
    ///
    /// # Panics
    /// On any I/O error other than `ENOSPC`.
    pub fn fill(&self) -> u64 {
        let path = self.filler_path();
        let mut file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .unwrap_or_else(|e| panic!("loop_fs: open {}: {e}", path.display()));
        // Delayed allocation may release reservations at fsync: fill, sync,
        // and fill again until a round adds nothing.
        for _ in 0..8 {
            let mut added = 0u64;
            for chunk in [1 << 20, 4096, 1] {
                let buf = vec![0xA5u8; chunk];
                loop {
                    match file.write(&buf) {
                        Ok(0) => break,
                        Ok(n) => added += n as u64,
                        Err(e) if is_enospc(&e) => break,
                        Err(e) => panic!("loop_fs: fill {}: {e}", path.display()),
                    }
                }
            }
            match file.sync_all() {
                Ok(()) => {}
                Err(e) if is_enospc(&e) => {}
                Err(e) => panic!("loop_fs: fsync {}: {e}", path.display()),
            }
            if added == 0 {
                break;
            }
        }
        std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0)
    }

    /// Shrinks the filler by `bytes` (or removes what there is), freeing
    /// that much space, and fsyncs it. Returns the filler's new size.
    ///
    /// # Panics
    /// On an I/O error.
    pub fn free_bytes(&self, bytes: u64) -> u64 {
        let path = self.filler_path();
        let Ok(file) = OpenOptions::new().write(true).open(&path) else {
            return 0;
        };
        let len = file
            .metadata()
            .unwrap_or_else(|e| panic!("loop_fs: stat {}: {e}", path.display()))
            .len();
        let new_len = len.saturating_sub(bytes);
        file.set_len(new_len)
            .and_then(|()| file.sync_all())
            .unwrap_or_else(|e| panic!("loop_fs: truncate {}: {e}", path.display()));
        new_len
    }

    /// Removes the filler: everything [`LoopFs::fill`] took is free again.
    ///
    /// # Panics
    /// On an I/O error other than the filler not existing.
    pub fn free(&self) {
        let path = self.filler_path();
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => panic!("loop_fs: remove {}: {e}", path.display()),
        }
        // Make the freed blocks visible to statvfs and to writers.
        let _ = File::open(&self.mount).and_then(|d| d.sync_all());
    }

    fn filler_path(&self) -> PathBuf {
        self.mount.join(FILLER_NAME)
    }
}

/// Whether `err` is "no space left on device" (or a quota, which looks the
/// same to a writer).
pub fn is_enospc(err: &std::io::Error) -> bool {
    matches!(
        err.kind(),
        ErrorKind::StorageFull | ErrorKind::QuotaExceeded
    )
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        if self.mounted {
            let mount = self.mount.to_string_lossy().into_owned();
            if run("umount", &[&mount]).is_err() {
                // Still busy (a child process not yet reaped): detach it
                // lazily so the test never leaves a mount behind.
                if let Err(e) = run("umount", &["-l", &mount]) {
                    eprintln!("loop_fs: {e}");
                }
            }
        }
        if let Some(device) = &self.device
            && !device.is_empty()
        {
            // Fails harmlessly if the lazy unmount still holds it; the
            // kernel's autoclear then detaches it when released.
            let _ = run("losetup", &["-d", device]);
        }
        let _ = std::fs::remove_file(&self.image);
        let _ = std::fs::remove_dir(&self.mount);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Needs root, mkfs.ext4, mount and losetup: fails (never skips)
    /// without them.
    #[test]
    fn fills_to_enospc_frees_and_unmounts_on_drop() {
        let dir = std::env::temp_dir().join(format!("loopfs-selftest-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fs = LoopFs::create(&dir, 16 * 1024 * 1024);
        let mount = fs.path().to_path_buf();
        let device = fs.device().to_owned();
        let filled = fs.fill();
        assert!(filled > 8 * 1024 * 1024, "filled only {filled} bytes");
        assert_eq!(fs.available_bytes(), 0);
        let probe = mount.join("probe");
        let err = std::fs::write(&probe, vec![1u8; 64 * 1024])
            .and_then(|()| File::open(&probe)?.sync_all())
            .expect_err("a write on a full filesystem must fail");
        assert!(is_enospc(&err), "expected ENOSPC, got {err}");
        fs.free();
        assert!(fs.available_bytes() > 8 * 1024 * 1024);
        std::fs::write(&probe, vec![1u8; 64 * 1024]).unwrap();
        fs.fill();
        assert!(fs.free_bytes(1 << 20) > 0);
        assert!(fs.available_bytes() >= 1 << 20);
        drop(fs);
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
        assert!(
            !mounts.contains(&mount.to_string_lossy().into_owned()),
            "still mounted after drop"
        );
        let attached = run("losetup", &["-a"])
            .map(|o| o.stdout)
            .unwrap_or_default();
        assert!(
            !String::from_utf8_lossy(&attached).contains(&format!("{device}:")),
            "{device} still attached after drop"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
