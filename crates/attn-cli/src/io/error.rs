//! The error of every tensor file operation: which file, which tensor (when known) and what was
//! expected versus found, displayed as one line such as
//! `x.npy: header length 99999 exceeds file size 120`.

use thiserror::Error;

/// A refused or failed tensor file operation.
#[derive(Debug, Error)]
#[error("{file}: {}{kind}", tensor_prefix(.tensor))]
pub struct IoError {
    /// The file as the user named it.
    pub file: String,
    /// The tensor concerned, when the problem belongs to one.
    pub tensor: Option<String>,
    /// What is wrong.
    pub kind: IoErrorKind,
}

impl IoError {
    /// An error about the whole file.
    pub fn file(file: impl Into<String>, kind: IoErrorKind) -> Self {
        Self { file: file.into(), tensor: None, kind }
    }

    /// An error about one tensor of the file.
    pub fn tensor(file: impl Into<String>, tensor: impl Into<String>, kind: IoErrorKind) -> Self {
        Self { file: file.into(), tensor: Some(tensor.into()), kind }
    }
}

fn tensor_prefix(tensor: &Option<String>) -> String {
    tensor.as_ref().map(|t| format!("tensor '{t}': ")).unwrap_or_default()
}

/// What is wrong with a file or one of its tensors.
#[derive(Debug, Error)]
pub enum IoErrorKind {
    /// The operating system refused to read the file.
    #[error("cannot read: {0}")]
    Read(std::io::Error),
    /// The file could not be written.
    #[error("cannot write: {0}")]
    Write(String),
    /// The path is a directory, device or pipe.
    #[error("not a regular file")]
    NotAFile,
    /// The file ends before a fixed-size part of its format.
    #[error("file is {found} bytes, too short for the {what} ({need} bytes)")]
    TooShort { what: &'static str, need: u64, found: u64 },
    /// The declared header length runs past the end of the file.
    #[error("header length {len} exceeds file size {file_size}")]
    HeaderLength { len: u64, file_size: u64 },
    /// The declared header length is beyond any sensible header.
    #[error("header length {len} exceeds the limit of {max} bytes")]
    HeaderTooLarge { len: u64, max: u64 },
    /// The header is not valid text, not valid JSON / Python literal, or misses a field.
    #[error("malformed header: {0}")]
    Header(String),
    /// The file does not start with the `.npy` magic bytes.
    #[error("not a .npy file: magic bytes {found}, expected \\x93NUMPY")]
    Magic { found: String },
    /// A `.npy` format version this reader does not know.
    #[error("unsupported .npy version {major}.{minor}, expected 1.0, 2.0 or 3.0")]
    Version { major: u8, minor: u8 },
    /// An element type that is unknown or not accepted here.
    #[error("dtype {found}, expected {expected}")]
    Dtype { found: String, expected: String },
    /// The product of the shape (or its byte size) does not fit in memory addresses.
    #[error("shape {shape:?} overflows")]
    ShapeOverflow { shape: Vec<usize> },
    /// The stored byte count does not match shape and element type.
    #[error("shape {shape:?} of {dtype} needs {expected} bytes, found {found}")]
    DataLength { shape: Vec<usize>, dtype: &'static str, expected: usize, found: usize },
    /// Tensor byte ranges overlap, leave gaps, or run past the data section.
    #[error("data offsets {0}")]
    Offsets(String),
    /// An element value that the type does not allow (a boolean byte of 2, a negative length).
    #[error("{0}")]
    Value(String),
    /// A tensor whose rank or shape does not fit its role.
    #[error("shape {found:?}, expected {expected}")]
    Shape { found: Vec<usize>, expected: String },
    /// A required tensor is absent.
    #[error("missing; found {found}")]
    Missing { found: String },
    /// A buffer sized by a tensor's shape cannot be allocated.
    #[error(transparent)]
    Alloc(#[from] attn::AllocError),
    /// The output would replace an input of the same command.
    #[error("is the input file {input}; choose another --output")]
    OverwritesInput { input: String },
    /// A tensor name the command does not accept.
    #[error("unknown tensor name, accepted names are {accepted}")]
    Unknown { accepted: String },
    /// A `.npy` file (one unnamed array) where a file of named tensors is expected.
    #[error("a .npy file holds one unnamed array, expected a safetensors or .npz file of named tensors")]
    SingleArray,
    /// A `.npz` archive whose zip structure or members are unusable.
    #[error("malformed .npz archive: {0}")]
    Archive(String),
    /// An output path whose extension names no format the command writes.
    #[error("{0}")]
    Format(String),
}
