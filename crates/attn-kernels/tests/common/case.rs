//! The owned test [`Case`]: the inputs of one attention call plus every option, its sizes and
//! layout, its description for failure messages, its parameters as the kernels take them, and the
//! edits tests make to it (poisoned keys, repeated K/V heads).

use std::sync::Arc;

use attn_kernels::{
    Align, AttnParams, BlockMask, Broadcast, Dims, Dropout, MaskMod, MaskSpec, Precision, ScoreFn, ScoreMod, Window,
};

use super::dense::Dense;
use super::generator::Rng;

/// Sizes `B, Hq, Hkv, Lq, Lk, Dk, Dv`.
pub fn dims(b: usize, hq: usize, hkv: usize, lq: usize, lk: usize, dk: usize, dv: usize) -> Dims {
    Dims { b, hq, hkv, lq, lk, dk, dv }
}

/// One attention call with owned inputs and every option; the fields are set directly
/// (`Case { causal: true, ..Case::new(d, seed) }`).
#[derive(Debug, Clone)]
pub struct Case {
    /// Sizes.
    pub dims: Dims,
    /// `[B, Hq, Lq, Dk]`.
    pub q: Vec<f32>,
    /// `[B, Hkv, Lk, Dk]`.
    pub k: Vec<f32>,
    /// `[B, Hkv, Lk, Dv]`.
    pub v: Vec<f32>,
    /// Score multiplier (`None`: `1/√Dk`).
    pub scale: Option<f64>,
    /// Soft-capping value.
    pub softcap: Option<f64>,
    /// Causal masking.
    pub causal: bool,
    /// Sliding window.
    pub window: Option<Window>,
    /// Alignment of the causal diagonal / window centre.
    pub align: Align,
    /// Valid keys per batch, `[B]`.
    pub key_lengths: Option<Vec<usize>>,
    /// Boolean keep-mask.
    pub keep: Option<Dense<bool>>,
    /// Additive bias.
    pub bias: Option<Dense<f32>>,
    /// Dropout.
    pub dropout: Option<Dropout>,
    /// A block-sparse mask and the predicate it was made from.
    pub sparse: Option<Sparse>,
    /// A score modification and its table.
    pub score: Option<Scored>,
    /// Sink logits per query head, `[Hq]`.
    pub sinks: Option<Vec<f32>>,
    /// How the flash kernel computes its products.
    pub compute: Precision,
}

/// A score modification with its table.
#[derive(Clone)]
pub struct Scored {
    /// The modification.
    pub m: Arc<dyn ScoreMod>,
    /// Its table.
    pub table: Vec<f32>,
    /// A name for failure messages.
    pub name: String,
}

impl std::fmt::Debug for Scored {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (table of {})", self.name, self.table.len())
    }
}

/// A block mask with the element predicate that defines it, which the tests' mask rules read
/// directly (so a block mask that misrepresents its predicate is caught).
#[derive(Clone)]
pub struct Sparse {
    /// `(b, h, i, j) -> may attend`.
    pub keep: Arc<dyn MaskMod>,
    /// The block mask the kernels take.
    pub mask: Arc<BlockMask>,
    /// A name for failure messages.
    pub name: String,
}

impl std::fmt::Debug for Sparse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {:?}", self.name, self.mask)
    }
}

impl Case {
    /// Random inputs for `d` (q, k uniform in `[-1.5, 1.5)`, v in `[-1, 1)`), no options.
    pub fn new(d: Dims, seed: u64) -> Self {
        let mut rng = Rng::new(seed);
        let q = rng.values(d.b * d.hq * d.lq * d.dk, 1.5);
        let k = rng.values(d.b * d.hkv * d.lk * d.dk, 1.5);
        let v = rng.values(d.b * d.hkv * d.lk * d.dv, 1.0);
        Self {
            dims: d,
            q,
            k,
            v,
            scale: None,
            softcap: None,
            causal: false,
            window: None,
            align: Align::TopLeft,
            key_lengths: None,
            keep: None,
            bias: None,
            dropout: None,
            sparse: None,
            score: None,
            sinks: None,
            compute: Precision::F32,
        }
    }

    /// `[B, Hq, Lq, Dk]`.
    pub fn q_dims(&self) -> [usize; 4] {
        let d = self.dims;
        [d.b, d.hq, d.lq, d.dk]
    }

    /// `[B, Hkv, Lk, Dk]`.
    pub fn k_dims(&self) -> [usize; 4] {
        let d = self.dims;
        [d.b, d.hkv, d.lk, d.dk]
    }

    /// `[B, Hkv, Lk, Dv]`.
    pub fn v_dims(&self) -> [usize; 4] {
        let d = self.dims;
        [d.b, d.hkv, d.lk, d.dv]
    }

    /// `[B, Hq, Lq, Lk]`, the target of masks and bias.
    pub fn target(&self) -> [usize; 4] {
        let d = self.dims;
        [d.b, d.hq, d.lq, d.lk]
    }

    /// Flat index of query row `(b, h, i)` (into lse; times `Dv` into out, times `Lk` into weights).
    pub fn row(&self, b: usize, h: usize, i: usize) -> usize {
        (b * self.dims.hq + h) * self.dims.lq + i
    }

    /// A one-line description for failure messages.
    pub fn describe(&self) -> String {
        let d = self.dims;
        let mut s = format!("B={} Hq={} Hkv={} Lq={} Lk={} Dk={} Dv={}", d.b, d.hq, d.hkv, d.lq, d.lk, d.dk, d.dv);
        if self.causal {
            s += " causal";
        }
        if let Some(w) = self.window {
            s += &format!(" window({:?},{:?})", w.left, w.right);
        }
        if self.causal || self.window.is_some() {
            s += &format!(" {:?}", self.align);
        }
        if let Some(kl) = &self.key_lengths {
            s += &format!(" key_lengths={kl:?}");
        }
        if let Some(m) = &self.keep {
            s += &format!(" keep{:?}", m.shape);
        }
        if let Some(m) = &self.bias {
            s += &format!(" bias{:?}", m.shape);
        }
        if let Some(c) = self.softcap {
            s += &format!(" softcap={c}");
        }
        if let Some(x) = self.scale {
            s += &format!(" scale={x}");
        }
        if let Some(dr) = self.dropout {
            s += &format!(" dropout(p={}, seed={})", dr.p, dr.seed);
        }
        if let Some(sp) = &self.sparse {
            s += &format!(" sparse({sp:?})");
        }
        if let Some(x) = &self.score {
            s += &format!(" score_mod({x:?})");
        }
        if let Some(sinks) = &self.sinks {
            s += &format!(" sinks={sinks:?}");
        }
        if self.compute != Precision::F32 {
            s += &format!(" compute={:?}", self.compute);
        }
        s
    }

    /// The call's parameters in `T`, with the bias and sinks data given already converted to `T`
    /// (each ignored where the case has none).
    pub fn params<'a, T>(&'a self, bias: Option<&'a [T]>, sinks: Option<&'a [T]>) -> AttnParams<'a, T> {
        let keep = self.keep.as_ref().map(|m| Broadcast::new("mask", &m.data, &m.shape).expect("keep-mask layout"));
        let bias =
            self.bias.as_ref().zip(bias).map(|(m, data)| Broadcast::new("bias", data, &m.shape).expect("bias layout"));
        AttnParams {
            scale: self.scale,
            mask: MaskSpec {
                causal: self.causal,
                window: self.window,
                align: self.align,
                key_lengths: self.key_lengths.as_deref(),
                keep,
                bias,
                block: self.sparse.as_ref().map(|s| &*s.mask),
            },
            softcap: self.softcap,
            dropout: self.dropout,
            score_mod: self.score.as_ref().map(|x| ScoreFn { m: &*x.m, table: &x.table }),
            sinks: sinks.filter(|_| self.sinks.is_some()),
            compute: self.compute,
        }
    }

    /// The call's parameters in `f32`, the case's own bias and sinks.
    pub fn params32(&self) -> AttnParams<'_, f32> {
        self.params(self.bias.as_ref().map(|m| &m.data[..]), self.sinks.as_deref())
    }

    /// Every query row `(b, h, i)`.
    pub fn rows(&self) -> impl Iterator<Item = (usize, usize, usize)> {
        let d = self.dims;
        (0..d.b).flat_map(move |b| (0..d.hq).flat_map(move |h| (0..d.lq).map(move |i| (b, h, i))))
    }

    /// The K row `[Dk]` and V row `[Dv]` of key `j` in KV head `g` of batch `b`.
    pub fn kv_rows_mut(&mut self, b: usize, g: usize, j: usize) -> (&mut [f32], &mut [f32]) {
        let d = self.dims;
        let r = (b * d.hkv + g) * d.lk + j;
        (&mut self.k[r * d.dk..(r + 1) * d.dk], &mut self.v[r * d.dv..(r + 1) * d.dv])
    }

    /// Fills key `(b, g, j)`'s K and V rows with NaN, +∞ and −∞ in turn.
    pub fn poison_key(&mut self, b: usize, g: usize, j: usize) {
        const BAD: [f32; 3] = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY];
        let (k, v) = self.kv_rows_mut(b, g, j);
        k.iter_mut().enumerate().for_each(|(e, x)| *x = BAD[e % 3]);
        v.iter_mut().enumerate().for_each(|(e, x)| *x = BAD[(e + 1) % 3]);
    }

    /// The same call with K/V heads repeated to `Hq` (`Hkv = Hq`).
    pub fn repeat_kv(&self) -> Case {
        let d = self.dims;
        let group = d.hq / d.hkv;
        let repeat = |x: &[f32], dd: usize| {
            let mut out = Vec::with_capacity(d.b * d.hq * d.lk * dd);
            for b in 0..d.b {
                for h in 0..d.hq {
                    let at = ((b * d.hkv + h / group) * d.lk) * dd;
                    out.extend_from_slice(&x[at..at + d.lk * dd]);
                }
            }
            out
        };
        Case { dims: Dims { hkv: d.hq, ..d }, k: repeat(&self.k, d.dk), v: repeat(&self.v, d.dv), ..self.clone() }
    }
}
