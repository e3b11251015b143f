//! One attention call's parameters, and their validation against the input shapes into a
//! `Problem`: every dimension, the head grouping, the resolved masks and the scalar options,
//! checked once so kernels can index without further checks.

use num_traits::Float;

use crate::dropout::Dropout;
use crate::error::{AttnError, Result};
use crate::mask::{Band, ElementMask, MaskSpec};
use crate::score_mod::ScoreFn;

/// Options of one attention call.
#[derive(Debug, Clone, Copy, Default)]
pub struct AttnParams<'a, T> {
    /// Multiplier of `q·k`; `None` means `1/√Dk`. Any finite value, negative included.
    pub scale: Option<f64>,
    /// Masks, all composable.
    pub mask: MaskSpec<'a, T>,
    /// Logit soft-capping `cap·tanh(s/cap)` on the scaled scores, before bias and masking.
    pub softcap: Option<f64>,
    /// Dropout on the attention weights.
    pub dropout: Option<Dropout>,
    /// A programmable modification of the scaled scores, before the soft-cap, bias and masks.
    pub score_mod: Option<ScoreFn<'a>>,
    /// Learned attention sinks (gpt-oss), one logit per query head, `[Hq]`: `sink_h` joins the
    /// softmax denominator of every row of head `h`, `p_ij = exp(s_ij) / (Σ_k exp(s_ik) +
    /// exp(sink_h))`, so a row's weights sum to less than 1 and the missing mass attends to nothing
    /// (the sink has no value). Dropout never drops the sink. The returned `lse` includes it,
    /// `logaddexp(lse_keys, sink_h)`; a row with no allowed key then gives `out = 0`,
    /// `lse = sink_h`. Each entry is finite or −∞ (−∞: that head has no sink, bit for bit as without
    /// `sinks`); NaN and +∞ are refused.
    pub sinks: Option<&'a [T]>,
    /// How the flash kernel computes its products, `Q·Kᵀ` and `P·V` forward and the backward's
    /// five (the reference ignores it).
    pub compute: Precision,
}

/// How the flash kernel computes `Q·Kᵀ` and `P·V` forward, and `Q·Kᵀ`, `dO·Vᵀ`, `P̄ᵀ·dO`, `dSᵀ·Q`
/// and `dS·K` backward. The softmax (running maxima, exponentials, sums), its gradient `dS`, the
/// masks, the output and the gradients stay in f32 either way.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Precision {
    /// f32 products of f32 (or widened f16/bf16) operands: the default.
    #[default]
    F32,
    /// bfloat16 products with f32 accumulation, as FlashAttention computes on bf16 inputs: `q`, `k`,
    /// `v` and, backward, `dO` rounded to bf16 (exact when they are bf16 already), `P` and `dS`
    /// rounded to bf16 for the products they enter. Runs on AVX512-BF16 (`VDPBF16PS`) where the
    /// CPU has it, else the same arithmetic emulated in f32 (slower than [`Precision::F32`]: for
    /// tests and other CPUs). Prefill path only: the decode path (at most
    /// [`DECODE_ROWS`](crate::flash::DECODE_ROWS) stacked query rows per key/value head, keys read
    /// in place, no packing) computes in f32 whatever this asks, bit for bit as [`Precision::F32`],
    /// and so does the backward after it ([`AttnOutput::path`](crate::AttnOutput) says which path
    /// ran); so does the backward of a key/value head holding a non-finite key.
    Bf16,
}

/// Sizes of one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dims {
    /// Batch.
    pub b: usize,
    /// Query heads.
    pub hq: usize,
    /// Key/value heads; `hq % hkv == 0`.
    pub hkv: usize,
    /// Query length.
    pub lq: usize,
    /// Key length.
    pub lk: usize,
    /// Query/key head dimension.
    pub dk: usize,
    /// Value head dimension.
    pub dv: usize,
}

impl Dims {
    /// Query heads per key/value head.
    pub fn group(&self) -> usize {
        self.hq / self.hkv.max(1)
    }
    /// Shape of the output, `[B, Hq, Lq, Dv]`.
    pub fn out_shape(&self) -> [usize; 4] {
        [self.b, self.hq, self.lq, self.dv]
    }
    /// Shape of the log-sum-exp, `[B, Hq, Lq]`.
    pub fn lse_shape(&self) -> [usize; 3] {
        [self.b, self.hq, self.lq]
    }
    /// Shape of the weights, `[B, Hq, Lq, Lk]`.
    pub fn weights_shape(&self) -> [usize; 4] {
        [self.b, self.hq, self.lq, self.lk]
    }
    /// Elements of the output `[B, Hq, Lq, Dv]`.
    pub fn out_len(&self) -> usize {
        self.b * self.hq * self.lq * self.dv
    }
    /// Elements of the log-sum-exp `[B, Hq, Lq]`.
    pub fn lse_len(&self) -> usize {
        self.b * self.hq * self.lq
    }
    /// Elements of the weights `[B, Hq, Lq, Lk]`.
    pub fn weights_len(&self) -> usize {
        self.b * self.hq * self.lq * self.lk
    }
}

/// A validated call: sizes, scale, band, element masks and options.
#[derive(Debug, Clone, Copy)]
pub struct Problem<'a, T> {
    /// Sizes.
    pub dims: Dims,
    /// Score multiplier.
    pub scale: f64,
    /// Soft-capping value.
    pub softcap: Option<f64>,
    /// Causal / window band.
    pub band: Band,
    /// Per-batch key lengths (`[B]`), if any.
    pub key_lengths: Option<&'a [usize]>,
    /// Boolean mask and bias.
    pub elem: ElementMask<'a, T>,
    /// Dropout, `None` when absent or `p == 0` (so `p = 0` is bit-identical to no dropout).
    pub dropout: Option<Dropout>,
    /// Score modification, its table checked against its length.
    pub score_mod: Option<ScoreFn<'a>>,
    /// Sink logits per query head, `[Hq]`, each finite or −∞ (see [`AttnParams::sinks`]).
    pub sinks: Option<&'a [T]>,
    /// How the flash kernel computes its products.
    pub compute: Precision,
}

impl<'a, T: Float> Problem<'a, T> {
    /// Checks the input shapes `q: [B, Hq, Lq, Dk]`, `k: [B, Hkv, Lk, Dk]`, `v: [B, Hkv, Lk, Dv]` and the
    /// options against each other.
    pub fn new(q: [usize; 4], k: [usize; 4], v: [usize; 4], p: &AttnParams<'a, T>) -> Result<Self> {
        let [b, hq, lq, dk] = q;
        let [kb, hkv, lk, kd] = k;
        let [vb, vh, vl, dv] = v;
        let expect = |tensor, dim, expected, found| {
            if expected == found {
                Ok(())
            } else {
                Err(AttnError::DimMismatch { tensor, dim, expected, found })
            }
        };
        expect("k", "batch", b, kb)?;
        expect("v", "batch", b, vb)?;
        expect("k", "head_dim", dk, kd)?;
        expect("v", "heads", hkv, vh)?;
        expect("v", "length", lk, vl)?;
        // No heads at all is an empty call, as in PyTorch; heads on one side only cannot be grouped.
        if (hq == 0) != (hkv == 0) {
            return Err(AttnError::Heads(format!("q has {hq} heads and k/v have {hkv}; both must be at least 1")));
        }
        if hkv > 0 && hq % hkv != 0 {
            return Err(AttnError::Heads(format!("q has {hq} heads, not a multiple of the {hkv} key/value heads")));
        }
        let dims = Dims { b, hq, hkv, lq, lk, dk, dv };
        let scale = p.scale.unwrap_or(1.0 / (dk.max(1) as f64).sqrt());
        if !scale.is_finite() {
            return Err(AttnError::Param { field: "scale", reason: format!("{scale} is not finite") });
        }
        if let Some(c) = p.softcap {
            if !(c.is_finite() && c > 0.0) {
                return Err(AttnError::Param { field: "softcap", reason: format!("{c}, expected a finite value > 0") });
            }
        }
        if let Some(d) = &p.dropout {
            d.validate()?;
        }
        if let Some(kl) = p.mask.key_lengths {
            expect("key_lengths", "batch", b, kl.len())?;
            if let Some((at, &n)) = kl.iter().enumerate().find(|(_, &n)| n > lk) {
                return Err(AttnError::Param {
                    field: "key_lengths",
                    reason: format!("entry {at} is {n}, more than the {lk} keys"),
                });
            }
        }
        if let Some(sinks) = p.sinks {
            expect("sinks", "heads", hq, sinks.len())?;
            if let Some((h, x)) = sinks.iter().enumerate().find(|(_, x)| x.is_nan() || **x == T::infinity()) {
                let x = if x.is_nan() { "NaN" } else { "+inf" };
                return Err(AttnError::Param {
                    field: "sinks",
                    reason: format!("entry {h} is {x}; expected a finite logit, or -inf for no sink"),
                });
            }
        }
        let target = [b, hq, lq, lk];
        let keep = match &p.mask.keep {
            Some(m) => Some(crate::view::Resolved { data: m.data(), strides: m.strides_for("mask", target)? }),
            None => None,
        };
        let bias = match &p.mask.bias {
            Some(m) => Some(crate::view::Resolved { data: m.data(), strides: m.strides_for("bias", target)? }),
            None => None,
        };
        if let Some(f) = p.score_mod {
            expect("score_table", "length", f.m.table_len(), f.table.len())?;
        }
        if let Some(bm) = p.mask.block {
            bm.check(b, hq, lq, lk)?;
        }
        Ok(Self {
            dims,
            scale,
            softcap: p.softcap,
            band: Band::new(p.mask.causal, p.mask.window, p.mask.align, lq, lk),
            key_lengths: p.mask.key_lengths,
            elem: ElementMask { keep, bias, block: p.mask.block },
            dropout: p.dropout.filter(|d| d.p > 0.0),
            score_mod: p.score_mod,
            sinks: p.sinks,
            compute: p.compute,
        })
    }

    /// The sink logit of query head `h`; `None` without sinks or where it is −∞ (no sink).
    #[inline]
    pub fn sink(&self, h: usize) -> Option<T> {
        self.sinks.map(|s| s[h]).filter(|&x| x != T::neg_infinity())
    }

    /// Allowed key range `lo..hi` of query row `i` in batch `b` from the band and key length.
    #[inline]
    pub fn key_range(&self, b: usize, i: usize) -> (usize, usize) {
        let kl = self.key_lengths.map_or(self.dims.lk, |k| k[b]);
        self.band.keys(i, kl)
    }
}
