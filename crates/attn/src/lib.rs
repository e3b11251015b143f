//! Attention for Transformers on candle: scaled dot-product attention with PyTorch semantics on
//! CPU tensors, typed masks with explicit polarity, and heatmaps of attention weights.
//!
//! - [`sdpa`](fn@sdpa) / [`sdpa_full`]: attention on `[B, H, L, D]` (or single-head `[B, L, D]`) tensors,
//!   configured by [`SdpaOptions`]; [`sdpa_full`] also returns the log-sum-exp and the weights.
//! - [`sdpa_varlen`] / [`sdpa_varlen_full`]: attention over packed variable-length sequences
//!   (`[total, H, D]` cut by `cu_seqlens`, FlashAttention's `flash_attn_varlen_func`), built from
//!   lengths with [`cu_seqlens`].
//! - [`SdpaOptions::kernel_params`]: the same options as `attn_kernels` parameters, for calling the
//!   kernels directly.
//! - [`linear_attention`](fn@linear_attention) with [`LinearOptions`]: linear attention (kernel
//!   feature maps, causal and not, FAVOR+), differentiable.
//! - [`Mask`], [`padding_mask`], [`key_lengths_from_tokens`]: building masks.
//! - `heatmap`: drawing weights as pictures; `picture::PictureFormat`: the format a path names;
//!   `chart`: line charts — with the feature `pictures` (plotters, image and a font; off by
//!   default, so computing attention compiles none of them).
//! - [`cache`]: a paged KV cache for serving ([`cache::PagedCache`]: pages allocated as
//!   sequences grow, forks sharing pages copy-on-write, f32/f16/bf16/int8/fp8 storage quantized on
//!   write), attended by the kernels' paged attention, many sequences per call.
//! - [`random`]: seeded random tensors for examples, and the seeded generator behind them.
//! - [`alloc`]: fallible allocation sized by shapes (the kernels' own, re-exported).
//! - [`write_file`]: writing a file whole or not at all, with a plainly created file's mode.
//!
//! Errors are [`AttnLibError`] values (wrapping candle's and the kernels' errors, on one line);
//! bad shapes, dtypes or devices never panic.
//!
//! [`candle_core`] is re-exported, so a crate using attn can name candle's types in the version
//! attn is built with (`attn::candle_core::Tensor`) without a `candle-core` entry of its own.
//!
//! ```
//! use attn::{sdpa, SdpaOptions};
//! let q = attn::random::uniform(&[1, 2, 4, 8], -1.0, 1.0, 1)?;
//! let out = sdpa(&q, &q, &q, &SdpaOptions::default().causal(true))?;
//! assert_eq!(out.dims(), &[1, 2, 4, 8]);
//! # Ok::<(), attn::AttnLibError>(())
//! ```
//!
//! The README's library example, on a padded batch of two token rows (the example's text lives
//! in `doc/library-example.rs`; `tests/readme.rs` checks that README.md quotes it word for word,
//! and this doctest compiles it with warnings, unused code included, denied):
//!
#![doc = concat!(
    "```\n",
    "# #![deny(warnings, unused)]\n",
    "# use candle_core::{Device, Tensor};\n",
    "# let uniform = |shape: &[usize], seed| attn::random::uniform(shape, -1.0, 1.0, seed);\n",
    "# let (q, k, v) = (uniform(&[2, 4, 6, 8], 1)?, uniform(&[2, 4, 6, 8], 2)?, uniform(&[2, 4, 6, 8], 3)?);\n",
    "# let token_ids = Tensor::new(&[[5u32, 7, 9, 0, 0, 0], [3, 4, 0, 0, 0, 0]], &Device::Cpu)?;\n",
    include_str!("../doc/library-example.rs"),
    "# assert_eq!((out.dims(), o.dims(), lse.dims()), (&[2, 4, 6, 8][..], &[2, 4, 6, 8][..], &[2, 4, 6][..]));\n",
    "# // Padded keys (token id 0) get weight 0: three in row 0, four in row 1.\n",
    "# let padded = w.eq(0f32)?.to_dtype(candle_core::DType::F32)?.sum_all()?.to_scalar::<f32>()?;\n",
    "# assert_eq!(padded, (4 * 6 * (3 + 4)) as f32);\n",
    "# Ok::<(), attn::AttnLibError>(())\n",
    "```",
)]
//!
//! The README's block-sparse examples (`doc/sparse-mask-mod.rs`, a mask given as a predicate,
//! `doc/sparse-patterns.rs`, the named patterns, and `doc/sparse-score-mod.rs`, score
//! modifications, each in a block of its own), checked the same way:
//!
#![doc = concat!(
    "```\n",
    "# #![deny(warnings, unused)]\n",
    "# let x = |seed| attn::random::uniform(&[1, 4, 512, 64], -1.0, 1.0, seed);\n",
    "# let (q, k, v) = (x(1)?, x(2)?, x(3)?);\n",
    "# {\n",
    include_str!("../doc/sparse-mask-mod.rs"),
    "# assert_eq!(out.dims(), &[1, 4, 512, 64]);\n",
    "# // Diagonal segments (2 blocks each, full) and the first key block (partial): 4·4 + 6 blocks of 64.\n",
    "# assert_eq!(mask.density(), 22.0 / 64.0);\n",
    "# }\n",
    "# {\n",
    include_str!("../doc/sparse-patterns.rs"),
    "# }\n",
    "# {\n",
    include_str!("../doc/sparse-score-mod.rs"),
    "# assert_eq!(out.dims(), &[1, 4, 512, 64]);\n",
    "# assert_eq!(dtable.map(|d| d.dims().to_vec()), Some(vec![4, 32]));\n",
    "# }\n",
    "# Ok::<(), attn::AttnLibError>(())\n",
    "```",
)]

mod autograd;
pub mod cache;
#[cfg(feature = "pictures")]
pub mod chart;
mod convert;
pub mod delta;
pub mod error;
#[cfg(feature = "pictures")]
pub mod heatmap;
pub mod linear;
pub mod mask;
mod op;
pub mod options;
mod params;
#[cfg(feature = "pictures")]
pub mod picture;
pub mod random;
pub mod sdpa;
pub mod varlen;
pub mod write_file;

/// Fallible allocation of buffers sized by the caller's shapes ([`AllocError`] instead of an
/// abort), as the kernels allocate; [`alloc::human_bytes`] prints byte counts.
pub use attn_kernels::alloc;
/// Programmable score modifications: [`score_mod::ScoreMod`] and the built-ins.
pub use attn_kernels::score_mod;
/// Block-sparse and programmable masks: [`sparse::MaskMod`], [`sparse::BlockMask`], the named
/// [`sparse::Pattern`]s.
pub use attn_kernels::sparse;
pub use attn_kernels::{Align, AllocError, AttnError, Dropout, Kernel, Precision, Window};
pub use candle_core;
pub use delta::{delta_rule, DeltaOptions, DeltaResult};
pub use error::{AttnLibError, Result};
pub use linear::{linear_attention, LinearOptions};
pub use mask::{key_lengths_from_tokens, padding_mask, Mask, Polarity};
pub use options::{ScoreModOption, SdpaOptions};
pub use params::KernelParams;
pub use sdpa::{sdpa, sdpa_full, SdpaOutput};
pub use varlen::{cu_seqlens, sdpa_varlen, sdpa_varlen_full, SdpaVarlenOutput};
