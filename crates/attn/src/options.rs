//! Options of one [`sdpa`](fn@crate::sdpa) call: a plain struct with public fields, a `Default` that
//! matches PyTorch's `scaled_dot_product_attention` defaults, and chainable builder methods. The
//! kernels' parameters are made from it in one place, [`SdpaOptions::kernel_params`].

use std::sync::Arc;

use attn_kernels::{Align, BlockMask, Dropout, Kernel, Precision, ScoreMod, Window};
use candle_core::Tensor;

use crate::mask::Mask;

/// Options of one attention call. Every masking option composes: a key is attended to only if
/// all of them allow it. `SdpaOptions::default()` is plain softmax attention with scale `1/√Dk`.
#[derive(Debug, Clone, Default)]
pub struct SdpaOptions {
    /// Multiplier of `q·k`; `None` means `1/√Dk`. Any finite value.
    pub scale: Option<f64>,
    /// Causal masking: query `i` sees keys `j <= i` (top-left) or `j <= i + Lk - Lq` (bottom-right).
    pub causal: bool,
    /// Alignment of the causal diagonal and the window centre when `Lq != Lk`.
    pub align: Align,
    /// Sliding window around the aligned diagonal; `None` on a side is unbounded.
    pub window: Option<Window>,
    /// Boolean mask, rank 1 to 4, broadcast to `[B, Hq, Lq, Lk]` (for 3-D inputs a rank-3 mask
    /// is read as `[B, Lq, Lk]`).
    pub mask: Option<Mask>,
    /// Additive float bias, rank 1 to 4, broadcast like `mask`, added to the (soft-capped) scaled
    /// scores; `-inf` masks its key.
    pub bias: Option<Tensor>,
    /// Valid key count per batch, `[B]`; keys at positions `>= key_lengths[b]` are masked.
    pub key_lengths: Option<Vec<usize>>,
    /// A block-sparse or programmable mask ([`crate::sparse`]), built once for `[Lq, Lk]` and
    /// shared across calls, layers and the backward: the kernels visit only its listed blocks.
    pub block_mask: Option<Arc<BlockMask>>,
    /// Logit soft-capping `cap·tanh(s/cap)` on the scaled scores, `cap > 0`.
    pub softcap: Option<f64>,
    /// Dropout on the weights, `0 <= p < 1`; the keep decision is a pure function of
    /// `(seed, b, h, i, j)`.
    pub dropout: Option<Dropout>,
    /// Learned attention sinks (gpt-oss), a float `[Hq]`: head `h`'s logit `sink_h` joins the
    /// softmax denominator of each of its rows, `p_ij = exp(s_ij) / (Σ_k exp(s_ik) + exp(sink_h))`,
    /// so a row's weights sum to less than 1 (the sink attends to nothing). Differentiable: a
    /// tracked tensor (a `Var`, or computed from one) gets its gradient. The log-sum-exp then
    /// includes the sink; a fully masked row gives 0 with `lse = sink_h`. Entries finite, or `-inf`
    /// for no sink; dropout never drops the sink.
    pub sinks: Option<Tensor>,
    /// A programmable modification of the scaled scores ([`crate::score_mod`]), applied before the
    /// soft-cap, bias and masks, with the table it reads.
    pub score_mod: Option<ScoreModOption>,
    /// Which kernel computes the call.
    pub kernel: Kernel,
    /// How the flash kernel computes `Q·Kᵀ` and `P·V`: f32 (the default), or bfloat16 products
    /// with f32 accumulation ([`Precision::Bf16`], native on AVX512-BF16), for bf16 models.
    pub compute: Precision,
    /// Whether [`sdpa_full`](crate::sdpa_full) returns the weights `[B, Hq, Lq, Lk]`.
    pub return_weights: bool,
}

impl SdpaOptions {
    /// Sets the multiplier of `q·k` (default `1/√Dk`).
    pub fn scale(mut self, scale: f64) -> Self {
        self.scale = Some(scale);
        self
    }

    /// Turns causal masking on or off.
    pub fn causal(mut self, causal: bool) -> Self {
        self.causal = causal;
        self
    }

    /// Sets the alignment of the causal diagonal and the window centre.
    pub fn align(mut self, align: Align) -> Self {
        self.align = align;
        self
    }

    /// Sets a sliding window of `left` keys before and `right` keys after the diagonal.
    pub fn window(mut self, left: Option<usize>, right: Option<usize>) -> Self {
        self.window = Some(Window { left, right });
        self
    }

    /// Sets the boolean mask (rank 1 to 4, broadcast to `[B, Hq, Lq, Lk]`).
    pub fn mask(mut self, mask: Mask) -> Self {
        self.mask = Some(mask);
        self
    }

    /// Sets the additive bias (float, rank 1 to 4, broadcast to `[B, Hq, Lq, Lk]`).
    pub fn bias(mut self, bias: Tensor) -> Self {
        self.bias = Some(bias);
        self
    }

    /// Sets the valid key count per batch, `[B]`.
    pub fn key_lengths(mut self, key_lengths: Vec<usize>) -> Self {
        self.key_lengths = Some(key_lengths);
        self
    }

    /// Sets logit soft-capping.
    pub fn softcap(mut self, cap: f64) -> Self {
        self.softcap = Some(cap);
        self
    }

    /// Sets dropout with probability `p` and generator seed `seed`.
    pub fn dropout(mut self, p: f32, seed: u64) -> Self {
        self.dropout = Some(Dropout { p, seed });
        self
    }

    /// Sets the block-sparse mask (e.g. `Pattern::Longformer { .. }.block_mask(l, l)?`).
    pub fn block_mask(mut self, mask: Arc<BlockMask>) -> Self {
        self.block_mask = Some(mask);
        self
    }

    /// Sets learned attention sinks, one logit per query head (float `[Hq]`).
    ///
    /// The README's example (its text lives in `doc/sinks-example.rs`; `tests/readme.rs` checks
    /// that README.md quotes it word for word, and this doctest compiles and runs it):
    ///
    #[doc = concat!(
        "```\n",
        "# #![deny(warnings, unused)]\n",
        "# let uniform = |shape: &[usize], seed| attn::random::uniform(shape, -1.0, 1.0, seed);\n",
        "# let (q, k, v) = (uniform(&[2, 4, 6, 8], 1)?, uniform(&[2, 4, 6, 8], 2)?, uniform(&[2, 4, 6, 8], 3)?);\n",
        include_str!("../doc/sinks-example.rs"),
        "# let sink = sinks.as_tensor().reshape((1, 4, 1))?.broadcast_as(lse.shape())?;\n",
        "# let missing = (w.sum(3)? + (sink - &lse)?.exp()?)?.flatten_all()?.to_vec1::<f32>()?;\n",
        "# assert!(missing.iter().all(|x| (x - 1.0).abs() < 1e-5), \"{missing:?}\");\n",
        "# let dsinks = dsinks.to_vec1::<f32>()?;\n",
        "# assert!(dsinks[3] == 0.0 && dsinks[..3].iter().all(|&x| x != 0.0), \"{dsinks:?}\");\n",
        "# Ok::<(), attn::AttnLibError>(())\n",
        "```",
    )]
    pub fn sinks(mut self, sinks: Tensor) -> Self {
        self.sinks = Some(sinks);
        self
    }

    /// Sets a score modification and, when it reads one, its table (a float tensor of
    /// `m.table_len()` elements, any shape; a tracked tensor gets its gradient).
    pub fn score_mod(mut self, m: Arc<dyn ScoreMod>, table: Option<Tensor>) -> Self {
        self.score_mod = Some(ScoreModOption { m, table });
        self
    }

    /// Chooses the kernel.
    pub fn kernel(mut self, kernel: Kernel) -> Self {
        self.kernel = kernel;
        self
    }

    /// Chooses how the flash kernel computes its products ([`Precision`]).
    pub fn compute(mut self, compute: Precision) -> Self {
        self.compute = compute;
        self
    }

    /// Asks [`sdpa_full`](crate::sdpa_full) for the weights.
    pub fn return_weights(mut self, yes: bool) -> Self {
        self.return_weights = yes;
        self
    }
}

/// A score modification with the table it reads ([`SdpaOptions::score_mod`]).
#[derive(Clone)]
pub struct ScoreModOption {
    /// The modification.
    pub m: Arc<dyn ScoreMod>,
    /// Its table, `m.table_len()` elements (`None` when it reads none).
    pub table: Option<Tensor>,
}

impl std::fmt::Debug for ScoreModOption {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ScoreModOption(table: {:?})", self.table.as_ref().map(|t| t.dims().to_vec()))
    }
}
