//! Tensor files as wholes: reading one into memory after checking, from its metadata, that it is
//! a regular file of at least the format's minimum size (the buffer allocated fallibly); writing
//! one whole or not at all through [`attn::write_file`]; and refusing an output that is one of
//! the command's inputs.

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::Path;

use super::error::{IoError, IoErrorKind};

/// The bytes of `path`; refuses non-regular files and files shorter than `min_len` bytes (the
/// fixed prefix of the format, described by `what`) before reading anything.
pub fn read_checked(path: &Path, min_len: u64, what: &'static str) -> Result<Vec<u8>, IoError> {
    let name = path.display().to_string();
    let fail = |kind| IoError::file(name.clone(), kind);
    let file = File::open(path).map_err(|e| fail(IoErrorKind::Read(e)))?;
    let meta = file.metadata().map_err(|e| fail(IoErrorKind::Read(e)))?;
    if !meta.is_file() {
        return Err(fail(IoErrorKind::NotAFile));
    }
    let len = meta.len();
    if len < min_len {
        return Err(fail(IoErrorKind::TooShort { what, need: min_len, found: len }));
    }
    let cap = usize::try_from(len)
        .map_err(|_| fail(IoErrorKind::Value(format!("file size {len} bytes exceeds the address space"))))?;
    let mut bytes = attn::alloc::with_capacity("file contents", &[cap]).map_err(|e| fail(e.into()))?;
    file.take(len).read_to_end(&mut bytes).map_err(|e| fail(IoErrorKind::Read(e)))?;
    Ok(bytes)
}

/// Writes `path` whole or not at all (see [`attn::write_file`]: a temporary file renamed over
/// `path`, with a plainly created file's mode); a failure names `path`.
pub fn write_file(path: &Path, write: impl FnOnce(&mut dyn Write) -> io::Result<()>) -> Result<(), IoError> {
    attn::write_file::write_atomically(path, write)
        .map_err(|e| IoError::file(path.display().to_string(), IoErrorKind::Write(e.source.to_string())))
}

/// Refuses `output` when it is one of `inputs`: the same path, a link to it or another name of
/// the same file (the same device and inode), so that no command writes over what it reads.
pub fn check_not_an_input<'a>(output: &Path, inputs: impl IntoIterator<Item = &'a Path>) -> Result<(), IoError> {
    for input in inputs {
        if same_file::is_same_file(output, input).unwrap_or(false) {
            let input = input.display().to_string();
            return Err(IoError::file(output.display().to_string(), IoErrorKind::OverwritesInput { input }));
        }
    }
    Ok(())
}
