//! Single-head self-attention with learned projections, the seed texts' first module:
//! `softmax((x·W_Qᵀ)(x·W_Kᵀ)ᵀ/√d_k + masks)·(x·W_Vᵀ)`, computed by the fused kernel.
//! Weights: `w_q.weight [d_k, d_model]`, `w_k.weight [d_k, d_model]`, `w_v.weight [d_v, d_model]`
//! and, with `bias`, `w_q.bias`, `w_k.bias`, `w_v.bias`.

use attn::{Kernel, SdpaOptions};
use candle_core::Tensor;
use candle_nn::VarBuilder;

use crate::linear::Linear;

use crate::error::{expect_bld, Result};
use crate::masks::AttnMasks;

const MODULE: &str = "SelfAttention";

/// Configuration of [`SelfAttention`].
#[derive(Debug, Clone)]
pub struct SelfAttentionConfig {
    /// Input width.
    pub d_model: usize,
    /// Query/key width.
    pub d_k: usize,
    /// Value (and output) width.
    pub d_v: usize,
    /// Whether the projections have biases.
    pub bias: bool,
    /// The attention kernel.
    pub kernel: Kernel,
}

impl SelfAttentionConfig {
    /// Projections without bias.
    pub fn new(d_model: usize, d_k: usize, d_v: usize) -> Self {
        Self { d_model, d_k, d_v, bias: false, kernel: Kernel::Auto }
    }
}

/// What one call returns.
#[derive(Debug, Clone)]
pub struct SelfAttentionOutput {
    /// `[B, L, d_v]`.
    pub out: Tensor,
    /// `[B, L, L]` when asked (differentiable, like `out`).
    pub weights: Option<Tensor>,
}

/// One attention head over its own input.
/// ```
/// use attn_nn::{AttnMasks, SelfAttention, SelfAttentionConfig};
/// # fn main() -> attn_nn::Result<()> {
/// let map = candle_nn::VarMap::new();
/// let head = SelfAttention::new(SelfAttentionConfig::new(4, 3, 3), attn_nn::init::seeded(&map, 0))?;
/// let x = attn::random::uniform(&[1, 3, 4], -1.0, 1.0, 1)?; // [B, L, d_model]
/// let o = head.forward(&x, &AttnMasks::default(), true)?;
/// assert_eq!(o.out.dims(), [1, 3, 3]); // [B, L, d_v]
/// assert_eq!(o.weights.unwrap().dims(), [1, 3, 3]); // [B, L, L]
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct SelfAttention {
    w_q: Linear,
    w_k: Linear,
    w_v: Linear,
    cfg: SelfAttentionConfig,
}

impl SelfAttention {
    /// Loads (or creates) `w_q`, `w_k`, `w_v` under `vb`.
    pub fn new(cfg: SelfAttentionConfig, vb: VarBuilder) -> Result<Self> {
        let proj = |out, name| -> Result<Linear> {
            let vb = vb.pp(name);
            Ok(if cfg.bias { Linear::load(cfg.d_model, out, vb)? } else { Linear::load_no_bias(cfg.d_model, out, vb)? })
        };
        Ok(Self { w_q: proj(cfg.d_k, "w_q")?, w_k: proj(cfg.d_k, "w_k")?, w_v: proj(cfg.d_v, "w_v")?, cfg })
    }

    /// `x: [B, L, d_model]` → `out: [B, L, d_v]` and, when `need_weights`, `[B, L, L]`.
    pub fn forward(&self, x: &Tensor, masks: &AttnMasks, need_weights: bool) -> Result<SelfAttentionOutput> {
        let (b, l) = expect_bld(MODULE, "x", x, self.cfg.d_model, self.w_q.weight().dtype())?;
        let head = |p: &Linear| -> Result<Tensor> { Ok(p.forward(x)?.unsqueeze(1)?) }; // [B, 1, L, d]
        let opts = SdpaOptions::default().kernel(self.cfg.kernel).return_weights(need_weights);
        let opts = masks.options(MODULE, opts, [b, 1, l, l], false, 0)?;
        let res = attn::sdpa_full(&head(&self.w_q)?, &head(&self.w_k)?, &head(&self.w_v)?, &opts)?;
        Ok(SelfAttentionOutput { out: res.out.squeeze(1)?, weights: res.weights.map(|w| w.squeeze(1)).transpose()? })
    }
}
