//! The library's error type: every refused call names the tensor or field and what was expected
//! versus found. Kernel refusals ([`attn_kernels::AttnError`]) and candle failures are wrapped.
//!
//! Every message is one line. candle attaches a backtrace to its errors when `RUST_BACKTRACE` is
//! set (`candle_core::Error::WithBacktrace`, displayed after the message) and joins context with
//! line breaks; [`strip_backtrace`] drops the former when a candle error is wrapped and
//! [`one_line`] renders the rest on one line.

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
    /// A candle operation failed (its backtrace dropped, see [`strip_backtrace`]).
    #[error("candle: {}", one_line(.0))]
    Candle(candle_core::Error),
}

impl From<candle_core::Error> for AttnLibError {
    fn from(e: candle_core::Error) -> Self {
        AttnLibError::Candle(strip_backtrace(e))
    }
}

/// `e` without the backtraces candle captures when `RUST_BACKTRACE` is set, at any depth.
pub fn strip_backtrace(e: candle_core::Error) -> candle_core::Error {
    use candle_core::Error as E;
    match e {
        E::WithBacktrace { inner, .. } => strip_backtrace(*inner),
        E::Context { inner, context } => E::Context { inner: Box::new(strip_backtrace(*inner)), context },
        E::WithPath { inner, path } => E::WithPath { inner: Box::new(strip_backtrace(*inner)), path },
        other => other,
    }
}

/// candle's message for `e` on one line: backtraces left out, context and path joined with `: `,
/// any other line break replaced by `; `.
pub fn one_line(e: &candle_core::Error) -> String {
    use candle_core::Error as E;
    match e {
        E::WithBacktrace { inner, .. } => one_line(inner),
        E::Context { inner, context } => format!("{}: {}", join_lines(&context.to_string()), one_line(inner)),
        E::WithPath { inner, path } => format!("{}: {}", path.display(), one_line(inner)),
        other => join_lines(&other.to_string()),
    }
}

/// The non-empty lines of `text`, trimmed, joined with `; `.
fn join_lines(text: &str) -> String {
    text.lines().map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join("; ")
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
