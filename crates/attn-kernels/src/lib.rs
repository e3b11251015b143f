//! Scaled dot-product attention kernels on plain slices, with no framework dependency.
//!
//! - [`attention`]: the `f32` entry point; [`Kernel`] chooses the kernel.
//! - [`reference`](mod@reference): the readable oracle, generic over `f32`/`f64`.
//! - [`flash`]: the fast tiled kernel, with micro-kernels per instruction set ([`Isa`], whose
//!   availability on this CPU is checked in one place, [`Isa::is_available`]).
//! - [`alloc`]: fallible allocation of every buffer sized by the caller's shapes ([`AllocError`]).
//! - [`score_mod`]: programmable score modifications ([`ScoreMod`]) with their derivatives.
//! - [`sparse`]: programmable masks ([`MaskMod`]) and their block-sparse description ([`BlockMask`]).
//! - [`linear`]: linear attention (kernel feature maps, causal chunked and recurrent), forward and
//!   backward, with its naive oracle.
//! - [`delta`]: the gated delta rule (Gated DeltaNet, KDA) of current hybrid models: the
//!   token-by-token recurrence and its exact backward.
//! - [`paged`]: attention over a paged KV cache (FlashAttention's `block_table`), stored as
//!   f32/f16/bf16 or quantized (q8_0, fp8 e4m3), many sequences of their own lengths per call.
//! - [`bf16_weights`]: a linear layer's weights as bfloat16 and their products with f32 rows
//!   (AVX512-BF16's `VDPBF16PS` where the CPU has it).
//! - [`activation`]: the exact (erf) GELU and its derivative, vectorised.
//! - [`rows`]: dot products of weight rows with a few input rows (a linear layer's decode step
//!   for a small batch).
//! - [`varlen`]: packed variable-length sequences (FlashAttention's `flash_attn_varlen_func`),
//!   forward and backward, on the same kernels.
//! - Shared semantics: [`View4`] inputs `[B, H, L, D]`, [`MaskSpec`] masks, [`Dropout`], validated
//!   into a [`Problem`] by every kernel.

pub mod activation;
pub mod alloc;
pub mod amx;
pub mod bf16_weights;
pub mod delta;
mod disjoint;
pub mod dispatch;
pub mod dropout;
pub mod error;
pub mod flash;
pub mod grad;
pub mod linear;
mod lines;
mod lse;
pub mod mask;
pub mod merge;
mod output;
pub mod paged;
mod prefetch;
pub mod problem;
pub mod reference;
pub mod rows;
pub mod score_mod;
mod simd;
mod softcap;
pub mod sparse;
// A workspace utility, not part of the kernels' interface: dropout keys its rows with
// `splitmix64`; the other crates reach the generator as `attn::random::SplitMix64`.
#[doc(hidden)]
pub mod rng;
pub mod varlen;
pub mod view;

pub use alloc::AllocError;
pub use dispatch::{attention, attention_backward, attention_backward_tuned, attention_tuned, Kernel, KvView};
pub use dropout::Dropout;
pub use error::{AttnError, Result};
pub use flash::{BackwardTuning, Tuning};
pub use grad::{AttnGrads, Saved, SideGrads, WeightsGrad};
pub use mask::{Align, MaskSpec, Window};
pub use merge::{fold_sinks, merge_partials, Partial};
pub use output::{AttnOutput, Path};
pub use problem::{AttnParams, Dims, Precision, Problem};
pub use reference::{reference, reference_backward, Real};
pub use score_mod::{ScoreFn, ScoreMod};
pub use simd::Isa;
pub use sparse::{BlockClass, BlockMask, BlockShape, MaskMod, MaskModExt, SPARSE_BLOCK};
pub use varlen::{attention_varlen, attention_varlen_backward, CuSeqlens, Packed, PackedKv, VarlenOutput, VarlenSaved};
pub use view::{Broadcast, View4};
