//! Linear attention on candle tensors: `out_i = φ(q_i)ᵀ·Σ_j φ(k_j) v_jᵀ / (φ(q_i)ᵀ·Σ_j φ(k_j) + ε)`
//! with a feature map `φ` ([`FeatureMap`]: `elu(x)+1`, ReLU, identity, FAVOR+), non-causal or causal,
//! in time linear in the sequence length (the kernels are `attn_kernels::linear`).
//!
//! `q: [B, Hq, Lq, D]`, `k: [B, Hkv, Lk, D]`, `v: [B, Hkv, Lk, Dv]` → `[B, Hq, Lq, Dv]`, `Hq` a
//! multiple of `Hkv`; causal needs `Lq = Lk`. `φ` sees `q` and `k` as given (no `1/√D` scale).
//! Dtypes: computed in `f64` when `q` is `f64`, in `f32` otherwise (inputs converted); the output
//! has the computing dtype. Differentiable through candle's autograd with respect to `q`, `k`, `v`
//! (`op`, a `CustomOp3` whose backward is the fused backward kernel). [`LinearDecoder`] decodes
//! causally one token at a time through the recurrent state (`recurrent`).
//!
//! The README's example (its text lives in `doc/linear-example.rs`; `tests/readme.rs` checks that
//! README.md quotes it word for word):
//!
#![doc = concat!(
    "```\n",
    "# #![deny(warnings, unused)]\n",
    "# use candle_core::Var;\n",
    "# let var = |seed| -> attn::Result<Var> {\n",
    "#     Ok(Var::from_tensor(&attn::random::uniform(&[1, 4, 1024, 64], -1.0, 1.0, seed)?)?)\n",
    "# };\n",
    "# let (q, k, v) = (var(1)?, var(2)?, var(3)?);\n",
    "# let target = attn::random::uniform(&[1, 4, 1024, 64], -1.0, 1.0, 4)?;\n",
    include_str!("../../doc/linear-example.rs"),
    "# assert_eq!((out.dims(), approx.dims()), (&[1, 4, 1024, 64][..], &[1, 4, 1024, 64][..]));\n",
    "# assert_eq!(grads.get(&k).unwrap().dims(), &[1, 4, 1024, 64]);\n",
    "# // Each row's weights are positive and sum to 1 (up to ε): out[0] of a causal head is v[0].\n",
    "# let first = |t: &candle_core::Tensor| t.narrow(2, 0, 1)?.flatten_all()?.to_vec1::<f32>();\n",
    "# let diff = first(&out)?.iter().zip(first(&v)?).fold(0f32, |m, (a, b)| m.max((a - b).abs()));\n",
    "# assert!(diff < 1e-5, \"{diff}\");\n",
    "# Ok::<(), attn::AttnLibError>(())\n",
    "```",
)]

mod op;
mod recurrent;

use candle_core::{DType, Tensor};

pub use attn_kernels::linear::{FavorFeatures, FeatureMap, LinearState, CHUNK, EPS};
pub use recurrent::LinearDecoder;

use crate::convert::check_input;
use crate::error::{AttnLibError, Result};

/// Options of one linear-attention call, built as `LinearOptions::new(map).causal(true)…`.
#[derive(Debug, Clone, PartialEq)]
pub struct LinearOptions {
    /// The feature map applied to queries and keys.
    pub map: FeatureMap,
    /// Key `j` counts for query `i` only when `j ≤ i` (requires `Lq = Lk`).
    pub causal: bool,
    /// Added to every denominator (default [`EPS`] = 1e-6); finite and `> 0`.
    pub eps: f64,
    /// Valid keys per batch entry, `[B]`: keys at or beyond `key_lengths[b]` are left out (a row
    /// with none gives 0).
    pub key_lengths: Option<Vec<usize>>,
    /// Rows per chunk of the causal chunked form (default [`CHUNK`]).
    pub chunk: usize,
    /// Segments per head of the chunk-parallel path, causal or not (default 0: chosen from the
    /// thread count and the number of heads; 1: the sequential form).
    pub segments: usize,
}

impl LinearOptions {
    /// Non-causal attention with `map`, `ε =` [`EPS`], no padding.
    pub fn new(map: FeatureMap) -> Self {
        Self { map, causal: false, eps: EPS, key_lengths: None, chunk: CHUNK, segments: 0 }
    }

    /// FAVOR+ with `features` random features for head dimension `d`, drawn from `seed`.
    pub fn favor(d: usize, features: usize, seed: u64) -> Result<Self> {
        Ok(Self::new(FeatureMap::Favor(FavorFeatures::new(d, features, seed)?)))
    }

    /// Sets causal masking.
    pub fn causal(mut self, causal: bool) -> Self {
        self.causal = causal;
        self
    }

    /// Sets `ε`.
    pub fn eps(mut self, eps: f64) -> Self {
        self.eps = eps;
        self
    }

    /// Sets the valid key count per batch entry.
    pub fn key_lengths(mut self, lengths: Vec<usize>) -> Self {
        self.key_lengths = Some(lengths);
        self
    }

    /// Sets the chunk length of the causal form.
    pub fn chunk(mut self, chunk: usize) -> Self {
        self.chunk = chunk;
        self
    }

    /// Sets the segments per head of the causal chunk-parallel path (0: the call's choice).
    pub fn segments(mut self, segments: usize) -> Self {
        self.segments = segments;
        self
    }

    /// The kernels' parameters.
    pub fn params(&self) -> attn_kernels::linear::LinearParams<'_> {
        attn_kernels::linear::LinearParams {
            map: &self.map,
            causal: self.causal,
            eps: self.eps,
            key_lens: self.key_lengths.as_deref(),
            chunk: self.chunk,
            segments: self.segments,
        }
    }
}

/// Linear attention of `q: [B, Hq, Lq, D]` over `k: [B, Hkv, Lk, D]`, `v: [B, Hkv, Lk, Dv]`:
/// `[B, Hq, Lq, Dv]`, differentiable (see [the module](self)).
pub fn linear_attention(q: &Tensor, k: &Tensor, v: &Tensor, opts: &LinearOptions) -> Result<Tensor> {
    check_qkv([q, k, v], "rank 4 [B, H, L, D]")?;
    let dtype = if q.dtype() == DType::F64 { DType::F64 } else { DType::F32 };
    let prep = |t: &Tensor| -> Result<Tensor> { Ok(t.to_dtype(dtype)?.contiguous()?) };
    op::forward(&prep(q)?, &prep(k)?, &prep(v)?, opts)
}

/// Refuses `q`, `k`, `v` unless each is a float CPU tensor of rank 4 (`expected` in the error).
fn check_qkv(qkv: [&Tensor; 3], expected: &str) -> Result<()> {
    for (name, t) in ["q", "k", "v"].into_iter().zip(qkv) {
        check_input(name, t)?;
        if t.rank() != 4 {
            return Err(AttnLibError::Shape { tensor: name, found: t.dims().to_vec(), expected: expected.into() });
        }
    }
    Ok(())
}
