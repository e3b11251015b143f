//! Tensor file readers and writers with validation: every malformed file is refused with an
//! [`IoError`] naming the file, the tensor and what was expected versus found, never a panic, and
//! nothing is allocated from a number in a file before it is checked against the file's size.
//!
//! - [`HostTensor`]: the in-memory tensor both formats read into, convertible to and from candle
//!   tensors for the `attn` library.
//! - safetensors: [`read_safetensors`], [`parse_safetensors`], [`write_safetensors`].
//! - NumPy `.npy`: [`read_npy`], [`parse_npy`], [`write_npy`].
//! - Whole files: [`write_file`] (whole or not at all, every writer goes through it) and
//!   [`check_not_an_input`] (no output over an input).
//! - NumPy `.npz` archives of `.npy` members: [`read_npz`], [`parse_npz`], [`write_npz`].
//! - Either format of named tensors: [`read_tensors`] (by content), [`TensorFormat::for_output`]
//!   and [`write_tensors`] (by extension).

mod candle;
mod error;
mod file;
mod format;
mod npy;
mod npy_header;
mod npz;
mod safetensors;
mod tensor;

pub use candle::tensor_values;
pub use error::{IoError, IoErrorKind};
pub use file::{check_not_an_input, write_file};
pub use format::{read_tensors, write_tensors, TensorFormat, TENSOR_EXTENSIONS};
pub use npy::{parse_npy, read_npy, write_npy};
pub use npy_header::{parse_header as parse_npy_header, NpyHeader};
pub use npz::{npz_bytes, parse_npz, read_npz, write_npz, MAX_DEFLATE_RATIO};
pub use safetensors::{parse_safetensors, read_safetensors, write_safetensors, MAX_HEADER};
pub use tensor::{checked_bytes, checked_numel, DType, HostData, HostTensor};
