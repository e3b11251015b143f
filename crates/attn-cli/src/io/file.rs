//! Reading a whole tensor file into memory after checking, from its metadata, that it is a
//! regular file of at least the format's minimum size.

use std::fs::File;
use std::io::Read;
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
    let mut bytes = Vec::with_capacity(cap);
    file.take(len).read_to_end(&mut bytes).map_err(|e| fail(IoErrorKind::Read(e)))?;
    Ok(bytes)
}
