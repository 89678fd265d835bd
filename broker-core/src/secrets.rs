//! Files that hold secrets (bearer tokens, TLS private keys, configuration
//! files with a token in them): refused when any user on the host may read
//! them (mode `& 0o004`), with a message naming the file, its mode and the
//! `chmod 600` that fixes it (or `chmod 640` where a service reads it
//! through its group, as the packages install keys: docs/packaging.md);
//! and the systemd credentials directory
//! (`$CREDENTIALS_DIRECTORY`, `LoadCredential=`) where a service may find
//! them instead.

use std::path::{Path, PathBuf};

/// The environment variable systemd sets to the directory of a unit's
/// credentials (`LoadCredential=NAME:PATH` makes `$CREDENTIALS_DIRECTORY/NAME`).
pub const CREDENTIALS_DIRECTORY: &str = "CREDENTIALS_DIRECTORY";

/// Why a secret file is unusable.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SecretFileError {
    /// Every user on the host may read the file.
    #[error(
        "{}: {what} is readable by every user (mode {mode:04o}); run `chmod 600 {}` \
         (or `chmod 640 {}` if a service reads it through the file's group)",
        path.display(),
        path.display(),
        path.display()
    )]
    WorldReadable {
        /// The file.
        path: PathBuf,
        /// What it holds (`admin token`, `TLS private key`, ...).
        what: &'static str,
        /// Its permission bits.
        mode: u32,
    },
    /// The file could not be read.
    #[error("reading {what} {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// What it holds.
        what: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file holds no token (empty or whitespace only).
    #[error("{}: {what} is empty", path.display())]
    Empty {
        /// The file.
        path: PathBuf,
        /// What it should hold.
        what: &'static str,
    },
}

/// Refuses `path` if every user may read it (`mode & 0o004`). A file that
/// cannot be inspected passes here; reading it reports the error.
///
/// # Errors
/// [`SecretFileError::WorldReadable`].
pub fn refuse_world_readable(path: &Path, what: &'static str) -> Result<(), SecretFileError> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if let Ok(meta) = std::fs::metadata(path) {
            let mode = meta.permissions().mode() & 0o7777;
            if mode & 0o004 != 0 {
                return Err(SecretFileError::WorldReadable {
                    path: path.to_path_buf(),
                    what,
                    mode,
                });
            }
        }
    }
    #[cfg(not(unix))]
    let _ = (path, what);
    Ok(())
}

/// Reads a token from `path` (surrounding whitespace and the trailing
/// newline removed) after [`refuse_world_readable`].
///
/// # Errors
/// [`SecretFileError`]: world-readable, unreadable or empty.
pub fn read_token_file(path: &Path, what: &'static str) -> Result<String, SecretFileError> {
    refuse_world_readable(path, what)?;
    let text = std::fs::read_to_string(path).map_err(|source| SecretFileError::Read {
        path: path.to_path_buf(),
        what,
        source,
    })?;
    let token = text.trim();
    if token.is_empty() {
        return Err(SecretFileError::Empty {
            path: path.to_path_buf(),
            what,
        });
    }
    Ok(token.to_owned())
}

/// `$CREDENTIALS_DIRECTORY/{name}` if the variable is set and that file
/// exists.
pub fn credential_path(name: &str) -> Option<PathBuf> {
    let dir = std::env::var_os(CREDENTIALS_DIRECTORY)?;
    let path = Path::new(&dir).join(name);
    path.is_file().then_some(path)
}

/// The token of an `Authorization` header value `Bearer <token>`, or
/// `None` for another scheme or an empty token. The scheme is matched
/// without regard to case (RFC 9110, section 11.1: `bearer` and `BEARER`
/// are `Bearer`); spaces around the token are trimmed.
pub fn bearer_token(authorization: &str) -> Option<&str> {
    authorization
        .trim_start()
        .split_once(' ')
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim())
        .filter(|token| !token.is_empty())
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn world_readable_token_files_are_refused_with_the_chmod_to_run() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "s3cret-token\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = read_token_file(&path, "admin token")
            .unwrap_err()
            .to_string();
        assert!(err.contains("mode 0644"), "{err}");
        assert!(
            err.contains(&format!("chmod 600 {}", path.display())),
            "{err}"
        );
        assert!(
            err.contains(&format!("chmod 640 {}", path.display())),
            "{err}"
        );
        assert!(!err.contains("s3cret"), "{err}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        assert_eq!(
            read_token_file(&path, "admin token").unwrap(),
            "s3cret-token"
        );
        std::fs::write(&path, " \n").unwrap();
        let err = read_token_file(&path, "admin token")
            .unwrap_err()
            .to_string();
        assert!(err.contains("empty"), "{err}");
    }

    #[test]
    fn the_bearer_scheme_is_matched_in_any_case() {
        for value in ["Bearer t1", "bearer t1", "BEARER  t1 ", " Bearer t1"] {
            assert_eq!(super::bearer_token(value), Some("t1"), "{value:?}");
        }
        for value in ["Basic dTpw", "Bearer", "Bearer ", "Bearert1", ""] {
            assert_eq!(super::bearer_token(value), None, "{value:?}");
        }
    }
}
