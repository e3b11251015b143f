//! The modules' error type: a refused configuration or input names the module, the field or input
//! and what was expected versus found. Attention-call refusals ([`attn::AttnLibError`]) and candle
//! failures (among them a missing or mis-shaped weight, which candle names by its full path) are
//! wrapped.

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
    /// The attention call was refused.
    #[error(transparent)]
    Attn(#[from] attn::AttnLibError),
    /// A candle operation failed, or a weight is missing or mis-shaped in the `VarBuilder`.
    #[error("candle: {0}")]
    Candle(#[from] candle_core::Error),
}

/// Shorthand for results of this crate.
pub type Result<T> = std::result::Result<T, NnError>;

/// Checks that `t` has rank 3 and last dimension `width`, naming `module` and `input`.
pub(crate) fn expect_bld(
    module: &'static str,
    input: &'static str,
    t: &candle_core::Tensor,
    width: usize,
) -> Result<(usize, usize)> {
    match *t.dims() {
        [b, l, d] if d == width => Ok((b, l)),
        _ => Err(NnError::Input { module, input, found: t.dims().to_vec(), expected: format!("[B, L, {width}]") }),
    }
}
