//! Files of named tensors in either format: reading recognises a `.npz` archive by its zip magic
//! bytes or its extension and reads anything else as safetensors, after refusing a single `.npy`
//! array (magic `\x93NUMPY` or extension `.npy`) with a message that says so rather than a
//! safetensors header error; writing picks the format from the output's extension before anything
//! is computed.

use std::collections::BTreeMap;
use std::path::Path;

use super::error::{IoError, IoErrorKind};
use super::file::read_checked;
use super::npy::MAGIC as NPY_MAGIC;
use super::npz::{parse_npz, write_npz};
use super::safetensors::{parse_safetensors, write_safetensors};
use super::tensor::HostTensor;

/// The first bytes of a zip archive with members, and of an empty one.
const ZIP_MAGICS: [&[u8; 4]; 2] = [b"PK\x03\x04", b"PK\x05\x06"];

/// The output extensions [`TensorFormat::for_output`] accepts, for messages.
pub const TENSOR_EXTENSIONS: &str = ".safetensors, .st or .npz";

/// A file format holding several named tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorFormat {
    /// safetensors (`.safetensors`, `.st`).
    Safetensors,
    /// NumPy's zip of `.npy` arrays (`.npz`).
    Npz,
}

impl TensorFormat {
    /// The format to write `path` in, by its extension (any case): `.safetensors` or `.st`, or
    /// `.npz`. A `.npy` path is refused (it holds one array), as is any other extension or none.
    pub fn for_output(path: &Path) -> Result<Self, IoError> {
        let ext = extension(path);
        let problem = match ext.as_deref() {
            Some("safetensors" | "st") => return Ok(Self::Safetensors),
            Some("npz") => return Ok(Self::Npz),
            Some("npy") => {
                format!("a .npy file holds one array and several tensors are written; use {TENSOR_EXTENSIONS}")
            }
            Some(other) => format!("unknown extension '.{other}', expected {TENSOR_EXTENSIONS}"),
            None => format!("no extension, expected {TENSOR_EXTENSIONS}"),
        };
        Err(IoError::file(path.display().to_string(), IoErrorKind::Format(problem)))
    }
}

/// The lowercase extension of `path`.
fn extension(path: &Path) -> Option<String> {
    path.extension().map(|e| e.to_string_lossy().to_ascii_lowercase())
}

/// Every tensor of the file `path`, by name: a `.npz` archive (zip magic or extension `.npz`) or a
/// safetensors file. A `.npy` file is refused with [`IoErrorKind::SingleArray`].
pub fn read_tensors(path: &Path) -> Result<BTreeMap<String, HostTensor>, IoError> {
    let bytes = read_checked(path, 0, "tensor file")?;
    let file = path.display().to_string();
    let ext = extension(path);
    if bytes.starts_with(NPY_MAGIC) || ext.as_deref() == Some("npy") {
        Err(IoError::file(file, IoErrorKind::SingleArray))
    } else if ZIP_MAGICS.iter().any(|m| bytes.starts_with(*m)) || ext.as_deref() == Some("npz") {
        parse_npz(&file, &bytes)
    } else {
        parse_safetensors(&file, &bytes)
    }
}

/// Writes `tensors` (name, tensor; names distinct) to `path` in `format`.
pub fn write_tensors(path: &Path, format: TensorFormat, tensors: &[(&str, &HostTensor)]) -> Result<(), IoError> {
    match format {
        TensorFormat::Safetensors => write_safetensors(path, tensors),
        TensorFormat::Npz => write_npz(path, tensors),
    }
}
