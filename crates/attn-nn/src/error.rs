//! The modules' error type: a refused configuration or input names the module, the field or input
//! and what was expected versus found; a refused state dict names where it came from and the
//! weights at fault. Attention-call refusals ([`attn::AttnLibError`]) and candle failures are
//! wrapped. Every message is one line: a candle error loses the backtrace candle attaches under
//! `RUST_BACKTRACE` ([`attn::error::strip_backtrace`]) and is displayed by
//! [`attn::error::one_line`].

use candle_core::{DType, Tensor};
use thiserror::Error;

/// Why building or running a module was refused.
#[derive(Debug, Error)]
pub enum NnError {
    /// A configuration value is unusable (`num_heads` not dividing `embed_dim`, ...).
    #[error("{module} config: {field}: {reason}")]
    Config {
        /// The module (`MultiHeadAttention`, ...).
        module: &'static str,
        /// The configuration field.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// An input tensor has the wrong rank, shape or width.
    #[error("{module}: input `{input}` has shape {found:?}, expected {expected}")]
    Input {
        /// The module.
        module: &'static str,
        /// The input's name (`query`, `key_padding_mask`, ...).
        input: &'static str,
        /// Its shape.
        found: Vec<usize>,
        /// What was expected, in words.
        expected: String,
    },
    /// An input tensor's dtype differs from the module's weights (an `f64` input to `f32`
    /// weights, ...).
    #[error("{module}: input `{input}` has dtype {found:?}, the module's weights are {expected:?} (convert it with `.to_dtype(DType::{expected:?})`)")]
    DType {
        /// The module.
        module: &'static str,
        /// The input's name.
        input: &'static str,
        /// Its dtype.
        found: DType,
        /// The weights' dtype.
        expected: DType,
    },
    /// A state dict does not fit the module: a weight missing, mis-shaped, or not used by it.
    #[error("{origin}: {reason}")]
    StateDict {
        /// Where the weights came from (a file path, or the name given to a tensor map).
        origin: String,
        /// Which weights are at fault, by name.
        reason: String,
    },
    /// The attention call was refused.
    #[error(transparent)]
    Attn(#[from] attn::AttnLibError),
    /// A candle operation failed (its backtrace dropped).
    #[error("candle: {}", attn::error::one_line(.0))]
    Candle(candle_core::Error),
}

impl From<candle_core::Error> for NnError {
    fn from(e: candle_core::Error) -> Self {
        NnError::Candle(attn::error::strip_backtrace(e))
    }
}

/// Shorthand for results of this crate.
pub type Result<T> = std::result::Result<T, NnError>;

/// Checks that `t` has rank 3, last dimension `width` and dtype `dtype`, naming `module` and
/// `input`.
pub(crate) fn expect_bld(
    module: &'static str,
    input: &'static str,
    t: &Tensor,
    width: usize,
    dtype: DType,
) -> Result<(usize, usize)> {
    match *t.dims() {
        [b, l, d] if d == width => {
            expect_dtype(module, input, t, dtype)?;
            Ok((b, l))
        }
        _ => Err(NnError::Input { module, input, found: t.dims().to_vec(), expected: format!("[B, L, {width}]") }),
    }
}

/// Checks that `t` has dtype `dtype` (the module's weights').
pub(crate) fn expect_dtype(module: &'static str, input: &'static str, t: &Tensor, dtype: DType) -> Result<()> {
    if t.dtype() == dtype {
        Ok(())
    } else {
        Err(NnError::DType { module, input, found: t.dtype(), expected: dtype })
    }
}
