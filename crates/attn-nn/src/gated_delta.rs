//! Gated DeltaNet (Yang, Kautz & Hatamizadeh 2025), the linear-attention layer of Qwen3-Next and
//! Qwen3.5, with Hugging Face's weight names (`Qwen3NextGatedDeltaNet`), so a checkpoint's layer
//! loads as it is:
//!
//! 1. `in_proj_qkvz` makes per key head `[q | k | v | z]` (`Hv/Hk` value heads of `v` and `z`
//!    per key head), `in_proj_ba` per key head `[b | a]`;
//! 2. `q, k, v` pass a short depthwise causal convolution (`conv1d`, `K` taps, no bias) and SiLU;
//! 3. `β = sigmoid(b)`, the log-decay `g = −exp(A_log)·softplus(a + dt_bias)`;
//! 4. the gated delta rule ([`attn::delta_rule`], differentiable) with `q` and `k` L2-normalised
//!    and scaled by `1/√Dk`;
//! 5. a gated RMSNorm per value head (`norm`, gate `silu(z)`), then `out_proj`.
//!
//! Padding: an `attention_mask` `[B, T]` (1 = token, 0 = padding, transformers' convention)
//! zeroes the padded positions' inputs, as transformers does; left padding leaves the real tokens'
//! outputs exact. Decoding: a [`GatedDeltaCache`] holds the convolution's last `K − 1` inputs and
//! the recurrent state `[B, Hv, Dk, Dv]`, so each new token costs `O(Hv·Dk·Dv)` whatever the
//! length decoded so far.

use candle_core::{DType, Tensor};
use candle_nn::{Init, VarBuilder};

use crate::error::{expect_bld, NnError, Result};
use crate::linear::Linear;
use crate::norm::GatedRmsNorm;
use attn::delta::{delta_rule, DeltaOptions, DeltaParams, Gate};

const MODULE: &str = "GatedDeltaNet";

/// Configuration of [`GatedDeltaNet`]; transformers' `Qwen3NextConfig` names are given per field.
#[derive(Debug, Clone, PartialEq)]
pub struct GatedDeltaNetConfig {
    /// `E`, the width of inputs and outputs (`hidden_size`).
    pub hidden_size: usize,
    /// `Hk`, heads of `q` and `k` (`linear_num_key_heads`).
    pub num_key_heads: usize,
    /// `Hv`, heads of `v` and of the state, a multiple of `Hk` (`linear_num_value_heads`).
    pub num_value_heads: usize,
    /// `Dk` (`linear_key_head_dim`).
    pub key_head_dim: usize,
    /// `Dv` (`linear_value_head_dim`).
    pub value_head_dim: usize,
    /// `K`, the causal convolution's taps (`linear_conv_kernel_dim`, default 4).
    pub conv_kernel_size: usize,
    /// The gated RMSNorm's `eps` (`rms_norm_eps`, default 1e-6).
    pub rms_norm_eps: f64,
}

impl GatedDeltaNetConfig {
    /// A layer of `hidden_size` with `num_key_heads` and `num_value_heads` heads of widths
    /// `key_head_dim` and `value_head_dim`; 4 convolution taps, `eps` 1e-6.
    pub fn new(
        hidden_size: usize,
        num_key_heads: usize,
        num_value_heads: usize,
        key_head_dim: usize,
        value_head_dim: usize,
    ) -> Self {
        Self {
            hidden_size,
            num_key_heads,
            num_value_heads,
            key_head_dim,
            value_head_dim,
            conv_kernel_size: 4,
            rms_norm_eps: 1e-6,
        }
    }

    /// `Hk·Dk`, the width of `q` and of `k`.
    fn key_dim(&self) -> usize {
        self.num_key_heads * self.key_head_dim
    }

    /// `Hv·Dv`, the width of `v`, `z` and the heads' output.
    fn value_dim(&self) -> usize {
        self.num_value_heads * self.value_head_dim
    }

    /// `2·Hk·Dk + Hv·Dv`, the channels of the convolution.
    fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }

    fn check(&self) -> Result<()> {
        let bad = |field, reason: String| Err(NnError::Config { module: MODULE, field, reason });
        for (field, n) in [
            ("hidden_size", self.hidden_size),
            ("num_key_heads", self.num_key_heads),
            ("num_value_heads", self.num_value_heads),
            ("key_head_dim", self.key_head_dim),
            ("value_head_dim", self.value_head_dim),
            ("conv_kernel_size", self.conv_kernel_size),
        ] {
            if n == 0 {
                return bad(field, "0, expected at least 1".into());
            }
        }
        if !self.num_value_heads.is_multiple_of(self.num_key_heads) {
            return bad(
                "num_value_heads",
                format!("{}, expected a multiple of num_key_heads ({})", self.num_value_heads, self.num_key_heads),
            );
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps > 0.0) {
            return bad("rms_norm_eps", format!("{}, expected finite and > 0", self.rms_norm_eps));
        }
        Ok(())
    }
}

/// The state of one [`GatedDeltaNet`] while decoding (empty until the first call).
#[derive(Debug, Clone, Default)]
pub struct GatedDeltaCache {
    /// The convolution's last `K − 1` inputs `[B, K − 1, 2·Hk·Dk + Hv·Dv]`.
    conv: Option<Tensor>,
    /// The delta rule's state `[B, Hv, Dk, Dv]`.
    state: Option<Tensor>,
    len: usize,
}

impl GatedDeltaCache {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// Tokens folded in so far.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing was folded in.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The recurrent state `[B, Hv, Dk, Dv]` (`None` before the first call).
    pub fn state(&self) -> Option<&Tensor> {
        self.state.as_ref()
    }

    /// Forgets everything (a new sequence).
    pub fn clear(&mut self) {
        *self = Self::default();
    }
}

/// One Gated DeltaNet layer.
///
/// ```
/// use attn_nn::{GatedDeltaCache, GatedDeltaNet, GatedDeltaNetConfig};
/// # fn main() -> attn_nn::Result<()> {
/// let map = candle_nn::VarMap::new();
/// let layer = GatedDeltaNet::new(GatedDeltaNetConfig::new(32, 2, 4, 8, 8), attn_nn::init::seeded(&map, 0))?;
/// let x = attn::random::uniform(&[2, 6, 32], -1.0, 1.0, 1)?; // [B, T, E]
/// let full = layer.forward(&x, None, None)?;
/// let mut cache = GatedDeltaCache::new(); // decoding: a prefix, then one token at a time
/// let mut parts = vec![layer.forward(&x.narrow(1, 0, 3)?, None, Some(&mut cache))?];
/// for i in 3..6 {
///     parts.push(layer.forward(&x.narrow(1, i, 1)?, None, Some(&mut cache))?);
/// }
/// let diff = (candle_core::Tensor::cat(&parts, 1)? - full)?.abs()?.max_all()?.to_scalar::<f32>()?;
/// assert!(diff < 1e-5);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct GatedDeltaNet {
    in_proj_qkvz: Linear,
    in_proj_ba: Linear,
    /// `conv1d.weight` `[C, 1, K]`.
    conv: Tensor,
    /// `[Hv]`.
    dt_bias: Tensor,
    /// `[Hv]`.
    a_log: Tensor,
    norm: GatedRmsNorm,
    out_proj: Linear,
    cfg: GatedDeltaNetConfig,
}

impl GatedDeltaNet {
    /// Loads the weights under `vb` by transformers' names (`in_proj_qkvz.weight`,
    /// `in_proj_ba.weight`, `conv1d.weight`, `dt_bias`, `A_log`, `norm.weight`,
    /// `out_proj.weight`), or creates them from a `VarMap` as transformers initialises them:
    /// the projections as `nn.Linear`, the convolution's taps uniform within `±1/√K`, `dt_bias`
    /// ones, `A_log` uniform in `[0, ln 16]`, the norm's weight ones.
    pub fn new(cfg: GatedDeltaNetConfig, vb: VarBuilder) -> Result<Self> {
        cfg.check()?;
        let (e, hv, c, k) = (cfg.hidden_size, cfg.num_value_heads, cfg.conv_dim(), cfg.conv_kernel_size);
        let bound = 1.0 / (k as f64).sqrt();
        Ok(Self {
            in_proj_qkvz: Linear::load_no_bias(e, 2 * cfg.key_dim() + 2 * cfg.value_dim(), vb.pp("in_proj_qkvz"))?,
            in_proj_ba: Linear::load_no_bias(e, 2 * hv, vb.pp("in_proj_ba"))?,
            conv: vb.pp("conv1d").get_with_hints((c, 1, k), "weight", Init::Uniform { lo: -bound, up: bound })?,
            dt_bias: vb.get_with_hints(hv, "dt_bias", Init::Const(1.0))?,
            a_log: vb.get_with_hints(hv, "A_log", Init::Uniform { lo: 0.0, up: 16f64.ln() })?,
            norm: GatedRmsNorm::new(cfg.value_head_dim, cfg.rms_norm_eps, vb.pp("norm"))?,
            out_proj: Linear::load_no_bias(cfg.value_dim(), e, vb.pp("out_proj"))?,
            cfg,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &GatedDeltaNetConfig {
        &self.cfg
    }

    /// `x: [B, T, E]` → `[B, T, E]`. `attention_mask: [B, T]` (any dtype; 1 = token, 0 =
    /// padding) zeroes padded inputs. With a `cache`, `x` continues the sequence the cache holds
    /// (empty: a new one) and the cache is updated.
    pub fn forward(
        &self,
        x: &Tensor,
        attention_mask: Option<&Tensor>,
        cache: Option<&mut GatedDeltaCache>,
    ) -> Result<Tensor> {
        let cfg = &self.cfg;
        let dtype = self.out_proj.weight().dtype();
        let (b, t) = expect_bld(MODULE, "x", x, cfg.hidden_size, dtype)?;
        let x = match attention_mask {
            Some(m) if m.dims() != [b, t] => {
                return Err(NnError::Input {
                    module: MODULE,
                    input: "attention_mask",
                    found: m.dims().to_vec(),
                    expected: format!("[{b}, {t}] (x's batch and length)"),
                })
            }
            Some(m) => x.broadcast_mul(&m.to_dtype(dtype)?.unsqueeze(2)?)?,
            None => x.clone(),
        };
        if let Some(c) = cache.as_deref() {
            check_cache_batch(c, &x)?;
        }
        let (hk, hv, dk, dv) = (cfg.num_key_heads, cfg.num_value_heads, cfg.key_head_dim, cfg.value_head_dim);
        let r = hv / hk;
        let qkvz = self.in_proj_qkvz.forward(&x)?.reshape((b, t, hk, 2 * dk + 2 * r * dv))?;
        let ba = self.in_proj_ba.forward(&x)?.reshape((b, t, hk, 2 * r))?;
        let part = |at: usize, width: usize| qkvz.narrow(3, at, width)?.reshape((b, t, hk * width));
        let mixed = Tensor::cat(&[part(0, dk)?, part(dk, dk)?, part(2 * dk, r * dv)?], 2)?;
        let z = qkvz.narrow(3, 2 * dk + r * dv, r * dv)?.reshape((b, t, hv, dv))?;
        let (conv_in, state_in) = cache.as_deref().map_or((None, None), |c| (c.conv.as_ref(), c.state.as_ref()));
        let (mixed, conv_out) = self.causal_conv(&mixed, conv_in)?;
        let q = mixed.narrow(2, 0, cfg.key_dim())?.reshape((b, t, hk, dk))?;
        let k = mixed.narrow(2, cfg.key_dim(), cfg.key_dim())?.reshape((b, t, hk, dk))?;
        let v = mixed.narrow(2, 2 * cfg.key_dim(), cfg.value_dim())?.reshape((b, t, hv, dv))?;
        let wide = if dtype == DType::F64 { DType::F64 } else { DType::F32 };
        let gate_in = |at: usize| -> Result<Tensor> { Ok(ba.narrow(3, at, r)?.reshape((b, t, hv))?.to_dtype(wide)?) };
        let beta = candle_nn::ops::sigmoid(&gate_in(0)?)?;
        let decay = self.a_log.to_dtype(wide)?.exp()?;
        let g = softplus(&gate_in(r)?.broadcast_add(&self.dt_bias.to_dtype(wide)?)?)?.broadcast_mul(&decay)?.neg()?;
        let opts = DeltaOptions {
            params: DeltaParams { l2norm_qk: true, gate: Gate::Scalar, ..DeltaParams::default() },
            cu_seqlens: None,
        };
        let res = delta_rule(&q, &k, &v, &g, &beta, state_in, &opts)?;
        if let Some(c) = cache {
            c.conv = Some(conv_out.detach());
            c.state = Some(res.final_state.detach());
            c.len += t;
        }
        let heads = self.norm.forward(&res.out, &z.to_dtype(res.out.dtype())?)?;
        self.out_proj.forward(&heads.reshape((b, t, cfg.value_dim()))?.to_dtype(dtype)?)
    }

    /// The depthwise causal convolution of `mixed: [B, T, C]` over `prefix` (the previous
    /// `K − 1` inputs, zeros when `None`), then SiLU; returns it and the last `K − 1` inputs.
    fn causal_conv(&self, mixed: &Tensor, prefix: Option<&Tensor>) -> Result<(Tensor, Tensor)> {
        let (b, t, c) = mixed.dims3()?;
        let k = self.cfg.conv_kernel_size;
        let prefix = match prefix {
            Some(p) => p.clone(),
            None => Tensor::zeros((b, k - 1, c), mixed.dtype(), mixed.device())?,
        };
        let padded = Tensor::cat(&[&prefix, mixed], 1)?;
        let taps = self.conv.reshape((c, k))?.t()?;
        let mut sum = padded.narrow(1, 0, t)?.broadcast_mul(&taps.get(0)?)?;
        for j in 1..k {
            sum = (sum + padded.narrow(1, j, t)?.broadcast_mul(&taps.get(j)?)?)?;
        }
        Ok((sum.silu()?, padded.narrow(1, t, k - 1)?))
    }
}

/// `ln(1 + eˣ)` without overflow: `max(x, 0) + ln(1 + e^(−|x|))`.
fn softplus(x: &Tensor) -> Result<Tensor> {
    Ok((x.relu()? + (x.abs()?.neg()?.exp()? + 1.0)?.log()?)?)
}

/// A cache continues the batch it was filled with.
fn check_cache_batch(cache: &GatedDeltaCache, x: &Tensor) -> Result<()> {
    match &cache.state {
        Some(s) if s.dim(0)? != x.dim(0)? => Err(NnError::Input {
            module: MODULE,
            input: "x",
            found: x.dims().to_vec(),
            expected: format!("batch {} (the cache's)", s.dim(0)?),
        }),
        _ => Ok(()),
    }
}
