//! Writing a file whole or not at all, the one way every writer of the workspace's files goes
//! (pictures here, tensor files in `attn-cli`): [`write_atomically`] writes into a temporary file
//! beside the destination, flushes it to disk and only then renames it over the destination, so a
//! failure or an interruption never leaves a half-written or truncated destination, and a failed
//! write removes its temporary file.
//!
//! The file gets the mode a plainly created file would get: a new one `0o666` less the umask (the
//! temporary file is opened with mode `0o666`, which the system reduces by the umask, so the
//! umask is never read or changed), an existing one keeps its own. A destination that is a
//! symbolic link is written through to the file it points at. Errors name the destination as the
//! caller gave it, never the temporary file.

use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use thiserror::Error;

/// A file that could not be written: the destination as given, and why.
#[derive(Debug, Error)]
#[error("{}: cannot write: {source}", path.display())]
pub struct WriteError {
    /// The destination as the caller named it.
    pub path: PathBuf,
    /// What the system said.
    pub source: io::Error,
}

/// Writes `dest` whole or not at all: `write` fills a buffered writer over a temporary file in
/// `dest`'s folder, which then replaces `dest` (see the module header for the mode). An error of
/// `write` (an [`io::Error`]; wrap other errors with [`io::Error::other`]) is returned as the
/// [`WriteError`] of `dest`, with `dest` untouched.
pub fn write_atomically(dest: &Path, write: impl FnOnce(&mut dyn Write) -> io::Result<()>) -> Result<(), WriteError> {
    let fail = |source| WriteError { path: dest.to_path_buf(), source };
    let target = link_target(dest);
    let existing = std::fs::metadata(&target).ok();
    if existing.as_ref().is_some_and(|m| m.is_dir()) {
        return Err(fail(io::Error::new(io::ErrorKind::IsADirectory, "is a folder")));
    }
    let dir = target.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = target.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .suffix(".tmp")
        .make_in(dir, create_plain)
        .map_err(fail)?;
    let file = tmp.as_file();
    if let Some(meta) = &existing {
        file.set_permissions(meta.permissions()).map_err(fail)?;
    }
    let mut w = BufWriter::with_capacity(1 << 20, file);
    write(&mut w).and_then(|()| w.flush()).map_err(fail)?;
    drop(w);
    file.sync_all().map_err(fail)?;
    tmp.persist(&target).map_err(|e| fail(e.error))?;
    Ok(())
}

/// Opens a new file at `path` with the permissions a plainly created file gets (on Unix, mode
/// `0o666` reduced by the umask).
fn create_plain(path: &Path) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o666);
    options.open(path)
}

/// The file `path` names: what it points at when it is a symbolic link that resolves, else
/// `path` itself.
fn link_target(path: &Path) -> PathBuf {
    let is_link = std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink());
    if is_link {
        if let Ok(resolved) = std::fs::canonicalize(path) {
            return resolved;
        }
    }
    path.to_path_buf()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(dir: &Path) -> Vec<String> {
        let mut n: Vec<String> =
            std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        n.sort();
        n
    }

    #[test]
    fn writes_the_whole_file_with_a_plain_files_mode() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("out.bin");
        write_atomically(&dest, |w| w.write_all(b"hello")).unwrap();
        assert_eq!(std::fs::read(&dest).unwrap(), b"hello");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let plain = dir.path().join("plain");
            File::create(&plain).unwrap();
            let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode();
            assert_eq!(mode(&dest), mode(&plain));
        }
        assert_eq!(names(dir.path()), ["out.bin", "plain"]);
    }

    #[test]
    fn a_failed_write_leaves_the_destination_and_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("out.bin");
        std::fs::write(&dest, b"old").unwrap();
        let e = write_atomically(&dest, |w| {
            w.write_all(b"half")?;
            Err(io::Error::other("the encoder gave up"))
        })
        .unwrap_err();
        assert_eq!(e.to_string(), format!("{}: cannot write: the encoder gave up", dest.display()));
        assert_eq!(std::fs::read(&dest).unwrap(), b"old");
        assert_eq!(names(dir.path()), ["out.bin"]);
    }

    #[test]
    fn errors_name_the_destination() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("missing").join("out.bin");
        let e = write_atomically(&dest, |w| w.write_all(b"x")).unwrap_err().to_string();
        // Only the system's reason follows the destination: no temporary file's path.
        let reason = e.strip_prefix(&format!("{}: cannot write: ", dest.display()));
        assert!(reason.is_some_and(|r| !r.contains('/')), "{e}");
        let e = write_atomically(dir.path(), |w| w.write_all(b"x")).unwrap_err().to_string();
        assert_eq!(e, format!("{}: cannot write: is a folder", dir.path().display()));
    }

    #[cfg(unix)]
    #[test]
    fn a_link_is_written_through_and_an_existing_mode_kept() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real.bin");
        std::fs::write(&real, b"old").unwrap();
        std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o640)).unwrap();
        let link = dir.path().join("link.bin");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        write_atomically(&link, |w| w.write_all(b"new")).unwrap();
        assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
        assert_eq!(std::fs::read(&real).unwrap(), b"new");
        assert_eq!(std::fs::metadata(&real).unwrap().permissions().mode() & 0o777, 0o640);
    }
}
