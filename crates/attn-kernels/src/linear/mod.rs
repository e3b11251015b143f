//! Linear attention (Katharopoulos et al. 2020; Performer, Choromanski et al. 2021): softmax's
//! `exp(q·k)` replaced by a kernel `φ(q)·φ(k)` with a feature map `φ` ([`FeatureMap`]), so that
//! the keys and values fold into a state `S = Σ_j φ(k_j) v_jᵀ`, `z = Σ_j φ(k_j)` and the cost is
//! linear in the sequence length:
//!
//! `out_i = φ(q_i)ᵀ·S_i / (φ(q_i)ᵀ·z_i + ε)`, with the sums over every key (non-causal) or the keys
//! `j ≤ i` (causal, `Lq = Lk`), and keys at or beyond the batch's key length left out.
//! No `1/√D` scale is applied: `φ` sees `q` and `k` as given. `ε` ([`EPS`] unless set, `> 0`) keeps a
//! row with no key (all padding) at output 0, never NaN.
//!
//! - [`linear_attention`] / [`linear_attention_backward`]: the fast kernels (`forward`,
//!   `backward`), returning new buffers; [`linear_attention_into`] /
//!   [`linear_attention_backward_into`] write the same results into the caller's (a training
//!   loop's kept buffers: no fresh pages to map and clear per call; what they held before does not
//!   matter, every element is written). Non-causal through the state, causal in the chunked form
//!   (within a chunk of [`CHUNK`] rows the masked quadratic product, across chunks the running
//!   state), parallel over (batch, head), and over segments of each head's chunks when there are
//!   fewer heads than threads (`segment`: causal, prefix sums of the segments' states), the
//!   features made chunk by chunk; memory beyond the inputs and outputs `O(L)` plus the state and
//!   one chunk's features and products per thread (and `O(threads)` segment states), and in the
//!   causal backward the key states before each chunk, `⌈L/C⌉·(F·Dv + F)` per thread (1.35× one
//!   head's queries at `D = F = Dv = 64`, `C = 48`; 5.4× with 256 FAVOR+ features), made once per
//!   key/value head; past 64 MiB per job, two passes with `O(L)` instead. The products
//!   run through a register-blocked micro-kernel (`gemm`, `micro`) on the flash kernels' vector
//!   layer.
//! - [`linear_reference`] / [`linear_reference_backward`]: the naive `O(L²)` oracle
//!   `(φ(Q)φ(K)ᵀ ∘ mask)·V / rowsum` (`naive`), generic over `f32`/`f64`.
//! - [`LinearState`]: recurrent decoding, one token at a time in `O(F·Dv)` (`recurrent`).
//!
//! Queries `[B, Hq, Lq, D]`, keys `[B, Hkv, Lk, D]`, values `[B, Hkv, Lk, Dv]`; `Hq` a multiple of
//! `Hkv` (grouped-query attention: query head `h` reads key/value head `h / (Hq/Hkv)`).

mod backward;
mod chunk;
mod favor;
mod feature;
mod forward;
pub(crate) mod gemm;
mod micro;
mod naive;
mod recurrent;
mod rows;
mod segment;
pub(crate) mod transpose;
mod vector;

pub use backward::{linear_attention_backward, linear_attention_backward_into, GradsMut};
pub use favor::FavorFeatures;
pub use feature::FeatureMap;
pub use forward::{linear_attention, linear_attention_into};
pub use naive::{linear_reference, linear_reference_backward};
pub use recurrent::LinearState;

use crate::error::{AttnError, Result};
use crate::problem::Dims;
use crate::view::View4;

/// The default `ε` added to every denominator.
pub const EPS: f64 = 1e-6;

/// The default chunk length of the causal chunked form: 48 rows, eight of the micro-kernel's
/// tiles of 6 rows (64 left a block of 4 in every product over a chunk's rows); the fastest of
/// the lengths measured (see docs/performance-log.md, "attn-kernels/src/linear/mod.rs: CHUNK").
pub const CHUNK: usize = 48;

/// Options of one linear-attention call.
#[derive(Debug, Clone)]
pub struct LinearParams<'a> {
    /// The feature map applied to queries and keys.
    pub map: &'a FeatureMap,
    /// Key `j` contributes to query `i` only when `j ≤ i` (requires `Lq = Lk`).
    pub causal: bool,
    /// Added to every denominator; finite and `> 0`.
    pub eps: f64,
    /// Valid keys per batch entry, `[B]`: keys at or beyond `key_lens[b]` are left out.
    pub key_lens: Option<&'a [usize]>,
    /// Rows per chunk of the causal chunked form, and of the blocks the non-causal form maps and
    /// sums in (at least 1).
    pub chunk: usize,
    /// Segments per head of the chunk-parallel path (`segment`, causal or not): `0` lets the
    /// call choose from the thread count and the number of heads (more than one segment only when
    /// there are fewer heads than threads to keep busy), `1` is the sequential form; at most one
    /// per chunk.
    pub segments: usize,
}

impl<'a> LinearParams<'a> {
    /// Non-causal, `ε =` [`EPS`], no padding, chunks of [`CHUNK`], segments chosen by the call.
    pub fn new(map: &'a FeatureMap) -> Self {
        Self { map, causal: false, eps: EPS, key_lens: None, chunk: CHUNK, segments: 0 }
    }
}

/// The sizes of a validated call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LinearDims {
    pub b: usize,
    pub hq: usize,
    pub hkv: usize,
    pub lq: usize,
    pub lk: usize,
    pub d: usize,
    pub dv: usize,
    /// Feature dimension `F`.
    pub f: usize,
}

impl LinearDims {
    /// Query heads per key/value head.
    pub fn group(&self) -> usize {
        self.hq / self.hkv
    }

    /// Whether the call has no work (every output and gradient is 0 or empty).
    pub fn is_empty(&self) -> bool {
        [self.b, self.hq, self.lq, self.lk, self.d, self.dv].contains(&0)
    }

    /// `[B, Hq, Lq, Dv]`.
    pub fn out_shape(&self) -> [usize; 4] {
        [self.b, self.hq, self.lq, self.dv]
    }

    /// The same sizes as softmax attention's.
    pub fn attn(&self) -> Dims {
        Dims { b: self.b, hq: self.hq, hkv: self.hkv, lq: self.lq, lk: self.lk, dk: self.d, dv: self.dv }
    }

    /// Valid keys of batch entry `b`.
    pub fn valid(&self, p: &LinearParams, b: usize) -> usize {
        p.key_lens.map_or(self.lk, |l| l[b])
    }
}

/// Checks the shapes and options of a call and returns its sizes.
pub(crate) fn validate<T>(q: &View4<T>, k: &View4<T>, v: &View4<T>, p: &LinearParams) -> Result<LinearDims> {
    let ([b, hq, lq, d], [bk, hkv, lk, dk], [bv, hv, lv, dv]) = (q.dims(), k.dims(), v.dims());
    let same = |tensor, dim, expected, found| {
        if expected == found {
            Ok(())
        } else {
            Err(AttnError::DimMismatch { tensor, dim, expected, found })
        }
    };
    same("k", "B", b, bk)?;
    same("v", "B", b, bv)?;
    same("k", "D", d, dk)?;
    same("v", "H", hkv, hv)?;
    same("v", "L", lk, lv)?;
    if hq == 0 || hkv == 0 || hq % hkv != 0 {
        return Err(AttnError::Heads(format!("q has {hq} heads and k/v {hkv}: expected a positive multiple")));
    }
    if p.causal {
        same("k", "L (causal needs Lk = Lq)", lq, lk)?;
    }
    if !(p.eps.is_finite() && p.eps > 0.0) {
        return Err(AttnError::Param { field: "eps", reason: format!("{}, expected finite and > 0", p.eps) });
    }
    if p.chunk == 0 {
        return Err(AttnError::Param { field: "chunk", reason: "0, expected at least 1".into() });
    }
    if let Some(lens) = p.key_lens {
        same("key_lens", "B", b, lens.len())?;
        if let Some((i, &l)) = lens.iter().enumerate().find(|(_, &l)| l > lk) {
            return Err(AttnError::Param { field: "key_lens", reason: format!("entry {i} is {l}, beyond Lk = {lk}") });
        }
    }
    p.map.check(d)?;
    Ok(LinearDims { b, hq, hkv, lq, lk, d, dv, f: p.map.features(d) })
}

/// Checks that `x` (the forward's output or its gradient) has the output's shape `[B, Hq, Lq, Dv]`.
pub(crate) fn check_out<T>(name: &'static str, x: &View4<T>, d: &LinearDims) -> Result<()> {
    let want = d.out_shape();
    if x.dims() == want {
        Ok(())
    } else {
        Err(AttnError::Layout {
            tensor: name,
            reason: format!("shape {:?}, expected [B, Hq, Lq, Dv] = {want:?}", x.dims()),
        })
    }
}

/// Checks that the caller's buffer `x` holds the elements of `shape`: else
/// [`AttnError::Output`] naming it.
pub(crate) fn check_len<T>(name: &'static str, x: &[T], shape: &[usize]) -> Result<()> {
    let expected = shape.iter().fold(1, |a: usize, &n| a.saturating_mul(n));
    if x.len() == expected {
        Ok(())
    } else {
        Err(AttnError::Output { tensor: name, expected, found: x.len() })
    }
}

/// The rows of head `(b, h)` of `x`: the slice from its first row, and the row stride.
pub(crate) fn head<'a, T>(x: &View4<'a, T>, b: usize, h: usize) -> (&'a [T], usize) {
    let s = x.strides();
    (&x.data()[b * s[0] + h * s[1]..], s[2])
}
