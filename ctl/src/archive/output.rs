//! Where `export` writes: the output paths, checked before anything is
//! read, and files staged as `{path}.partial` and renamed into place only
//! when every output of the export is complete.
//!
//! An output path is refused when it lies inside the local bucket
//! directory (an export must never overwrite an archive object), when it
//! exists and `--force` is not given, when it is a directory, or when two
//! outputs are the same file. The checks compare canonical paths: the
//! output's parent directory canonicalized, joined with its file name.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write as _};
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};

/// An output file whose write errors name it (`{path}: No space left on
/// device`): the kernel's error alone does not say which output failed.
#[derive(Debug)]
pub struct NamedFile {
    file: File,
    path: PathBuf,
}

impl NamedFile {
    /// `file`, opened at `path`.
    pub fn new(file: File, path: PathBuf) -> NamedFile {
        NamedFile { file, path }
    }

    fn named(&self, e: std::io::Error) -> std::io::Error {
        std::io::Error::new(e.kind(), format!("writing {}: {e}", self.path.display()))
    }
}

impl std::io::Write for NamedFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.file.write(buf).map_err(|e| self.named(e))
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush().map_err(|e| self.named(e))
    }
}

/// A staged output's writer.
pub type OutFile = BufWriter<NamedFile>;

/// One output file of an export: the flag that named it, as given.
#[derive(Debug, Clone, Copy)]
pub struct Output<'a> {
    /// The option naming it (`--out`, `--rejected`), for messages.
    pub flag: &'static str,
    /// The path as given.
    pub path: &'a Path,
}

/// `path` with its parent directory canonicalized (the file itself need
/// not exist).
///
/// # Errors
/// A path without a file name, a parent directory that does not exist.
fn resolve(output: Output<'_>) -> anyhow::Result<PathBuf> {
    let Output { flag, path } = output;
    let Some(name) = path.file_name() else {
        bail!("{flag} {}: not a file name", path.display());
    };
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let parent = parent
        .canonicalize()
        .with_context(|| format!("{flag} {}: directory {}", path.display(), parent.display()))?;
    Ok(parent.join(name))
}

/// Checks the outputs of one export before anything is written (module
/// doc); `bucket_root` is the local bucket directory, canonical (`None`
/// for S3).
///
/// # Errors
/// An output inside the bucket, an existing output without `force`, a
/// directory, two outputs that are the same file.
pub fn check(
    outputs: &[Output<'_>],
    bucket_root: Option<&Path>,
    force: bool,
) -> anyhow::Result<()> {
    let mut resolved: Vec<(Output<'_>, PathBuf)> = Vec::new();
    for &output in outputs {
        let path = resolve(output)?;
        let shown = output.path.display();
        let flag = output.flag;
        if let Some(root) = bucket_root
            && path.starts_with(root)
        {
            bail!(
                "{flag} {shown} is inside the bucket directory {}: an export never writes into the archive it reads (choose a path outside {})",
                root.display(),
                root.display()
            );
        }
        if let Ok(meta) = std::fs::symlink_metadata(&path) {
            if meta.is_dir() {
                bail!("{flag} {shown} is a directory: give a file path");
            }
            // A device or socket (/dev/null) would be replaced by the
            // final rename: never, not even with --force.
            if !meta.is_file() && !meta.file_type().is_symlink() {
                bail!("{flag} {shown} is not a regular file: give a file path");
            }
            if !force {
                bail!("{flag} {shown} exists: give --force to replace it");
            }
        }
        if let Some((other, _)) = resolved.iter().find(|(_, p)| *p == path) {
            bail!(
                "{} {} and {flag} {shown} are the same file: give two different files",
                other.flag,
                other.path.display()
            );
        }
        resolved.push((output, path));
    }
    Ok(())
}

/// A file written as `{path}.partial` and renamed into place by
/// [`commit`]; the partial file is removed if dropped before.
pub struct Staged {
    path: PathBuf,
    partial: PathBuf,
    done: bool,
}

impl Staged {
    /// Creates `{path}.partial`, which must not exist unless `force` (a
    /// stale one from an interrupted export is then replaced).
    ///
    /// # Errors
    /// The partial file exists (without `force`) or cannot be created.
    pub fn create(path: &Path, force: bool) -> anyhow::Result<(Staged, OutFile)> {
        let mut partial = path.as_os_str().to_owned();
        partial.push(".partial");
        let partial = PathBuf::from(partial);
        if force {
            match std::fs::remove_file(&partial) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(e).with_context(|| format!("remove {}", partial.display()));
                }
            }
        }
        // `create_new`: never truncates a file (or a link's target) that is
        // already there.
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&partial)
            .with_context(|| {
                format!(
                    "create {} (an export still running, or one interrupted? remove it or give --force)",
                    partial.display()
                )
            })?;
        let writer = BufWriter::new(NamedFile::new(file, partial.clone()));
        let staged = Staged {
            path: path.to_owned(),
            partial,
            done: false,
        };
        Ok((staged, writer))
    }

    /// Flushes `writer` and syncs the partial file to disk.
    ///
    /// # Errors
    /// The flush or sync fails.
    pub fn sync(&self, writer: OutFile) -> anyhow::Result<()> {
        let mut named = writer.into_inner().map_err(|e| e.into_error())?;
        named.flush()?;
        named
            .file
            .sync_all()
            .with_context(|| format!("sync {}", self.partial.display()))
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if !self.done {
            let _ = std::fs::remove_file(&self.partial);
        }
    }
}

/// Renames every synced staged file into place, in order. If one rename
/// fails, the outputs already renamed are removed again and the rest
/// dropped: an export leaves all its outputs or none.
///
/// # Errors
/// The first rename that fails.
pub fn commit(staged: Vec<Staged>) -> anyhow::Result<()> {
    let mut renamed: Vec<PathBuf> = Vec::new();
    for mut s in staged {
        if let Err(e) = std::fs::rename(&s.partial, &s.path) {
            for path in &renamed {
                let _ = std::fs::remove_file(path);
            }
            return Err(e).with_context(|| {
                format!("rename {} to {}", s.partial.display(), s.path.display())
            });
        }
        s.done = true;
        renamed.push(s.path.clone());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use super::*;

    /// `/dev/full` answers every write with ENOSPC: the error names the
    /// file (a full disk said only "No space left on device").
    #[test]
    fn a_write_error_names_the_file() {
        let file = OpenOptions::new().write(true).open("/dev/full").unwrap();
        let mut writer = BufWriter::new(NamedFile::new(file, PathBuf::from("/dev/full")));
        writer.write_all(&[0; 16]).unwrap();
        let err = writer.flush().unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::StorageFull);
        assert!(
            err.to_string()
                .starts_with("writing /dev/full: No space left on device"),
            "{err}"
        );
    }
}
