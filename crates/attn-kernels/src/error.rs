//! The kernels' error type: every shape, stride or parameter problem is a typed value, never a panic.

use thiserror::Error;

/// Why an attention call was refused. Each variant names the tensor or field and what was
/// expected versus found, so callers can print it as one clear line.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum AttnError {
    /// A tensor's dimension does not match what the other inputs imply.
    #[error("{tensor}: dimension {dim} is {found}, expected {expected}")]
    DimMismatch { tensor: &'static str, dim: &'static str, expected: usize, found: usize },
    /// A head count is zero, or the query heads are not a multiple of the key/value heads.
    #[error("heads: {0}")]
    Heads(String),
    /// A view's strides or length would read outside its slice, or its last dimension is strided.
    #[error("{tensor}: {reason}")]
    Layout { tensor: &'static str, reason: String },
    /// A mask or bias cannot be broadcast to `[B, Hq, Lq, Lk]`.
    #[error("{tensor}: shape {found:?} does not broadcast to {target:?}")]
    Broadcast { tensor: &'static str, found: Vec<usize>, target: [usize; 4] },
    /// A scalar parameter is out of its range (scale not finite, dropout outside [0, 1), ...).
    #[error("{field}: {reason}")]
    Param { field: &'static str, reason: String },
    /// A buffer sized by the call's shapes (output, weights, gradients, packed keys) cannot be
    /// allocated.
    #[error(transparent)]
    Alloc(#[from] crate::alloc::AllocError),
    /// An output buffer has the wrong length.
    #[error("output {tensor}: length {found}, expected {expected}")]
    Output { tensor: &'static str, expected: usize, found: usize },
}

/// Shorthand for results of this crate.
pub type Result<T> = std::result::Result<T, AttnError>;
