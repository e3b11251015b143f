//! The library's error type: every refused call names the tensor or field and what was expected
//! versus found. Kernel refusals ([`attn_kernels::AttnError`]) and candle failures are wrapped.

use candle_core::DType;
use thiserror::Error;

/// Why a call of this library was refused.
#[derive(Debug, Error)]
pub enum AttnLibError {
    /// A tensor has the wrong rank or shape for its role.
    #[error("{tensor}: shape {found:?}, expected {expected}")]
    Shape {
        /// The tensor's role (`q`, `mask`, `token_ids`, ...).
        tensor: &'static str,
        /// Its shape.
        found: Vec<usize>,
        /// What was expected, in words.
        expected: String,
    },
    /// A tensor has a dtype this role does not accept.
    #[error("{tensor}: dtype {found:?}, expected {expected}")]
    DType {
        /// The tensor's role.
        tensor: &'static str,
        /// Its dtype.
        found: DType,
        /// The accepted dtypes, in words.
        expected: &'static str,
    },
    /// An input tensor does not live on the CPU.
    #[error("{tensor}: on device {found}, expected the CPU (copy it with `.to_device(&Device::Cpu)`)")]
    Device {
        /// The tensor's role.
        tensor: &'static str,
        /// The device it lives on.
        found: String,
    },
    /// A value inside a tensor or an option is unusable.
    #[error("{field}: {reason}")]
    Value {
        /// The tensor or option.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The kernel refused the call (mismatched dimensions, bad broadcast, bad parameter).
    #[error(transparent)]
    Kernel(#[from] attn_kernels::AttnError),
    /// A candle operation failed.
    #[error("candle: {0}")]
    Candle(#[from] candle_core::Error),
}

impl From<attn_kernels::AllocError> for AttnLibError {
    /// A buffer too large to allocate, reported like the kernels' own:
    /// `AttnLibError::Kernel(AttnError::Alloc(..))`.
    fn from(e: attn_kernels::AllocError) -> Self {
        AttnLibError::Kernel(e.into())
    }
}

/// Shorthand for results of this crate.
pub type Result<T> = std::result::Result<T, AttnLibError>;
