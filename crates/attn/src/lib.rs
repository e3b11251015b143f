//! Attention for Transformers on candle: scaled dot-product attention with PyTorch semantics on
//! CPU tensors, typed masks with explicit polarity, and heatmaps of attention weights.
//!
//! - [`sdpa`](fn@sdpa) / [`sdpa_full`]: attention on `[B, H, L, D]` (or single-head `[B, L, D]`) tensors,
//!   configured by [`SdpaOptions`]; [`sdpa_full`] also returns the log-sum-exp and the weights.
//! - [`SdpaOptions::kernel_params`]: the same options as `attn_kernels` parameters, for calling the
//!   kernels directly.
//! - [`Mask`], [`padding_mask`], [`key_lengths_from_tokens`]: building masks.
//! - [`heatmap`]: drawing weights as pictures.
//! - [`random`]: seeded random tensors for examples.
//! - [`write_file`]: writing a file whole or not at all, with a plainly created file's mode.
//!
//! Errors are [`AttnLibError`] values (wrapping candle's and the kernels' errors); bad shapes,
//! dtypes or devices never panic.
//!
//! ```
//! use attn::{sdpa, SdpaOptions};
//! let q = attn::random::uniform(&[1, 2, 4, 8], -1.0, 1.0, 1)?;
//! let out = sdpa(&q, &q, &q, &SdpaOptions::default().causal(true))?;
//! assert_eq!(out.dims(), &[1, 2, 4, 8]);
//! # Ok::<(), attn::AttnLibError>(())
//! ```

mod autograd;
pub mod chart;
mod convert;
pub mod error;
pub mod heatmap;
pub mod mask;
pub mod options;
mod params;
mod picture;
pub mod random;
pub mod sdpa;
pub mod write_file;

pub use attn_kernels::{Align, Dropout, Kernel, Window};
pub use error::{AttnLibError, Result};
pub use mask::{key_lengths_from_tokens, padding_mask, Mask, Polarity};
pub use options::SdpaOptions;
pub use params::KernelParams;
pub use sdpa::{sdpa, sdpa_full, SdpaOutput};
