//! Additive (Bahdanau) attention: `score(q, k) = w_vᵀ·tanh(W_q·q + W_k·k)`, masked, softmax over
//! the keys, weights applied to the values. Unlike the dot-product modules it builds its scores
//! explicitly (`[B, Lq, Lk, hidden]` features), so it costs `O(Lq·Lk·hidden)` memory.
//! Weights (d2l's names): `w_q.weight [hidden, query_dim]`, `w_k.weight [hidden, key_dim]`,
//! `w_v.weight [1, hidden]`, no biases.

use attn::{Mask, SdpaOptions};
use candle_core::{Tensor, D};
use candle_nn::VarBuilder;

use crate::linear::Linear;

use crate::dropout::{Dropout, Mode};
use crate::error::{expect_bld, expect_dtype, NnError, Result};
use crate::masks::AttnMasks;

const MODULE: &str = "AdditiveAttention";

/// Configuration of [`AdditiveAttention`].
#[derive(Debug, Clone)]
pub struct AdditiveAttentionConfig {
    /// Query width.
    pub query_dim: usize,
    /// Key width.
    pub key_dim: usize,
    /// Width of the hidden features.
    pub hidden: usize,
    /// Dropout on the weights in training.
    pub dropout: f32,
    /// Seed of the dropout stream.
    pub seed: u64,
}

impl AdditiveAttentionConfig {
    /// No dropout.
    pub fn new(query_dim: usize, key_dim: usize, hidden: usize) -> Self {
        Self { query_dim, key_dim, hidden, dropout: 0.0, seed: 0 }
    }
}

/// What one call returns.
#[derive(Debug, Clone)]
pub struct AdditiveOutput {
    /// `[B, Lq, Dv]`.
    pub out: Tensor,
    /// `[B, Lq, Lk]`, before dropout; differentiable.
    pub weights: Tensor,
}

/// Additive attention.
///
/// ```
/// use attn_nn::{AdditiveAttention, AdditiveAttentionConfig, AttnMasks};
/// # fn main() -> attn_nn::Result<()> {
/// let map = candle_nn::VarMap::new();
/// let m = AdditiveAttention::new(AdditiveAttentionConfig::new(20, 2, 8), attn_nn::init::seeded(&map, 0))?;
/// let q = attn::random::uniform(&[2, 1, 20], -1.0, 1.0, 1)?; // [B, Lq, query_dim]
/// let k = attn::random::uniform(&[2, 10, 2], -1.0, 1.0, 2)?; // [B, Lk, key_dim]
/// let v = attn::random::uniform(&[2, 10, 4], -1.0, 1.0, 3)?; // [B, Lk, Dv]
/// let pad = attn::Mask::keep(candle_core::Tensor::new(&[[1u8; 10], [1, 1, 1, 1, 1, 1, 0, 0, 0, 0]], q.device())?);
/// let o = m.forward(&q, &k, &v, &AttnMasks::default().key_padding(pad), attn_nn::Mode::Eval)?;
/// assert_eq!(o.out.dims(), [2, 1, 4]);
/// assert_eq!(o.weights.dims(), [2, 1, 10]);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct AdditiveAttention {
    w_q: Linear,
    w_k: Linear,
    w_v: Linear,
    cfg: AdditiveAttentionConfig,
    dropout: Dropout,
}

impl AdditiveAttention {
    /// Loads (or creates) the weights under `vb`.
    pub fn new(cfg: AdditiveAttentionConfig, vb: VarBuilder) -> Result<Self> {
        if !(0.0..1.0).contains(&cfg.dropout) {
            return Err(NnError::Config {
                module: MODULE,
                field: "dropout",
                reason: format!("{} is outside [0, 1)", cfg.dropout),
            });
        }
        Ok(Self {
            w_q: Linear::load_no_bias(cfg.query_dim, cfg.hidden, vb.pp("w_q"))?,
            w_k: Linear::load_no_bias(cfg.key_dim, cfg.hidden, vb.pp("w_k"))?,
            w_v: Linear::load_no_bias(cfg.hidden, 1, vb.pp("w_v"))?,
            dropout: Dropout::new(cfg.dropout, cfg.seed, &vb.prefix()),
            cfg,
        })
    }

    /// `query: [B, Lq, query_dim]`, `key: [B, Lk, key_dim]`, `value: [B, Lk, Dv]` →
    /// `out: [B, Lq, Dv]`, `weights: [B, Lq, Lk]`. A query whose keys are all masked gets zero
    /// weights and output; masked keys' values never reach the output.
    pub fn forward(
        &self,
        query: &Tensor,
        key: &Tensor,
        value: &Tensor,
        masks: &AttnMasks,
        mode: Mode,
    ) -> Result<AdditiveOutput> {
        let dtype = self.w_v.weight().dtype();
        let (b, lq) = expect_bld(MODULE, "query", query, self.cfg.query_dim, dtype)?;
        let (kb, lk) = expect_bld(MODULE, "key", key, self.cfg.key_dim, dtype)?;
        expect_dtype(MODULE, "value", value, dtype)?;
        let (vb, lv, _) = value.dims3().map_err(|_| NnError::Input {
            module: MODULE,
            input: "value",
            found: value.dims().to_vec(),
            expected: "[B, Lk, Dv]".into(),
        })?;
        if kb != b || vb != b || lv != lk {
            return Err(NnError::Input {
                module: MODULE,
                input: "key/value",
                found: [key.dims(), value.dims()].concat(),
                expected: format!("batch {b} like query and equal key/value lengths"),
            });
        }
        let fq = self.w_q.forward(query)?.unsqueeze(2)?; // [B, Lq, 1, h]
        let fk = self.w_k.forward(key)?.unsqueeze(1)?; // [B, 1, Lk, h]
        let features = fq.broadcast_add(&fk)?.tanh()?; // [B, Lq, Lk, h]
        let scores = self.w_v.forward(&features)?.squeeze(D::Minus1)?; // [B, Lq, Lk]

        let opts = masks.options(MODULE, SdpaOptions::default(), [b, 1, lq, lk], false, 0)?;
        let causal = if masks.causal { Some(Mask::causal(lq, lk)?) } else { None };
        let keep = [opts.mask, causal].into_iter().flatten().try_fold(None::<Mask>, |acc, m| -> Result<_> {
            Ok(Some(match acc {
                None => m,
                Some(a) => a.and(&m)?,
            }))
        })?;
        let scores = match opts.bias {
            Some(bias) => scores.broadcast_add(&squeeze_head(&bias.to_dtype(scores.dtype())?)?)?,
            None => scores,
        };
        let (scores, value) = match &keep {
            Some(m) => {
                let keep = squeeze_head(&m.to_keep_tensor()?)?.broadcast_as((b, lq, lk))?.contiguous()?; // [B, Lq, Lk]
                let neg_inf =
                    Tensor::full(f32::NEG_INFINITY, (b, lq, lk), scores.device())?.to_dtype(scores.dtype())?;
                (keep.where_cond(&scores, &neg_inf)?, zero_unreachable(value, &keep)?)
            }
            None => (scores, value.clone()),
        };
        let weights = softmax_last(&scores)?;
        let dropped = self.dropout.forward(&weights, mode)?;
        Ok(AdditiveOutput { out: dropped.matmul(&value.contiguous()?)?, weights })
    }
}

/// `[B|1, 1, Lq|1, Lk]` (or rank < 4) → the same without the head dimension.
fn squeeze_head(t: &Tensor) -> Result<Tensor> {
    Ok(if t.rank() == 4 { t.squeeze(1)? } else { t.clone() })
}

/// `value: [B, Lk, Dv]` with the rows of keys no query may attend (in `keep: [B, Lq, Lk]`)
/// replaced by zeros, so a NaN there cannot reach the output through a zero weight.
fn zero_unreachable(value: &Tensor, keep: &Tensor) -> Result<Tensor> {
    let reachable = keep.max_keepdim(1)?.transpose(1, 2)?.broadcast_as(value.shape())?.contiguous()?; // [B, Lk, Dv]
    let zeros = value.zeros_like()?;
    Ok(reachable.where_cond(value, &zeros)?)
}

/// Softmax over the last dimension from differentiable candle ops (candle-nn's
/// `softmax_last_dim` has no backward and would cut gradients silently). A row of `-inf` gives
/// zeros, not NaN. `x: [.., N]` → `[.., N]`.
fn softmax_last(x: &Tensor) -> Result<Tensor> {
    let max = x.max_keepdim(D::Minus1)?.maximum(f32::MIN as f64)?.detach();
    let e = x.broadcast_sub(&max)?.exp()?;
    let sum = e.sum_keepdim(D::Minus1)?.maximum(f32::MIN_POSITIVE as f64)?;
    Ok(e.broadcast_div(&sum)?)
}
