//! The reference kernel: attention computed exactly as the formula reads, one query row at a
//! time, in the caller's precision (`f64` is the test oracle; `f32` is the "naive32" baseline of
//! the tolerance rule). No tiling, no tricks; clarity over speed.
//!
//! For each query row `i` of head `h` (reading key/value head `h / (Hq/Hkv)`):
//! 1. `s_j = scale · q_i·k_j`, then `s_j = f(s_j)` with a score modification, then
//!    `s_j = cap·tanh(s_j/cap)` with soft-capping, then `s_j += bias_ij`;
//! 2. keys outside the band, beyond the key length, forbidden by the block mask (evaluated per
//!    element), with `keep = false` or bias −∞ are masked and
//!    their `k_j`, `v_j` are never read;
//! 3. `m = max_j s_j`, `l = Σ_j exp(s_j − m)`, `lse_i = m + ln l`, `w_ij = exp(s_j − m) / l`; with
//!    a sink logit `σ_h` (gpt-oss) it joins the maximum and the denominator, `m = max(max_j s_j, σ_h)`,
//!    `l = Σ_j exp(s_j − m) + exp(σ_h − m)`, so the weights sum to `1 − exp(σ_h − lse_i)`;
//! 4. dropout: `w_ij ← keep(seed,b,h,i,j) · w_ij / (1 − p)`;
//! 5. `o_i = Σ_j w_ij · v_j`.
//!
//! This module holds what both directions share — the element types ([`Real`]) and steps 1 and 2 (`row_scores`, the one place the reference masks a key); the
//! forward ([`reference()`], steps 3 to 5) is in `forward`, the backward ([`backward`]) follows the
//! derivation beside it. There is one path: every row is computed the same way.
//!
//! A row with no allowed key (or whose scores are all −∞) gets `o_i = 0`, `w_i· = 0` and
//! `lse_i = −∞`, or `lse_i = σ_h` with a sink.

use num_traits::{Float, FromPrimitive};

use crate::alloc::{Elem, ZeroBits};
use crate::problem::Problem;
use crate::view::View4;

pub mod backward;
mod forward;

pub use backward::reference_backward;
pub use forward::reference;

/// Element types the reference runs in.
pub trait Real: Float + FromPrimitive + Default + Elem + ZeroBits + Send + Sync + std::fmt::Debug + 'static {}
impl Real for f32 {}
impl Real for f64 {}

impl<T: Real> Elem for Option<Score<T>> {
    const NAME: &'static str = "score";
}

/// A score of an allowed key: `s` after scaling, modification, soft-capping and bias; the scaled
/// dot product `x`; `dmod = ∂f/∂x` of the score modification (1 without one) and `dcap`, the
/// soft-cap's derivative at the modified score `f(x)` (`1 − tanh²(f(x)/cap)`; 1 without one).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Score<T> {
    pub s: T,
    pub x: T,
    pub dmod: T,
    pub dcap: T,
}

/// Steps 1 and 2 for query row `(b, h, i)`: `scores[j]` is the score of key `j`, `None` where the
/// key is masked (its `k_j` is then never read).
pub(crate) fn row_scores<T: Real>(
    pb: &Problem<T>,
    q: &View4<T>,
    k: &View4<T>,
    [b, h, i]: [usize; 3],
    scores: &mut [Option<Score<T>>],
) {
    let scale = T::from_f64(pb.scale).unwrap();
    let cap = pb.softcap.map(|c| T::from_f64(c).unwrap());
    let qi = q.row(b, h, i);
    let kvh = h / pb.dims.group();
    let (lo, hi) = pb.key_range(b, i);
    for (j, s) in scores.iter_mut().enumerate() {
        *s = None;
        let blocked = pb.elem.block.is_some_and(|m| !m.allows(b, h, i, j));
        if j < lo || j >= hi || blocked || pb.elem.keep.is_some_and(|m| !m.at(b, h, i, j)) {
            continue;
        }
        let bias = pb.elem.bias.map(|m| m.at(b, h, i, j));
        if bias == Some(T::neg_infinity()) {
            continue;
        }
        let x = scale * dot(qi, k.row(b, kvh, j));
        let (m, dmod) = match pb.score_mod {
            Some(f) => {
                let x64 = x.to_f64().unwrap();
                let at = |v: f64| T::from_f64(v).unwrap();
                (at(f.m.score(x64, f.table, b, h, i, j)), at(f.m.dscore(x64, f.table, b, h, i, j)))
            }
            None => (x, T::one()),
        };
        let (capped, dcap) = match cap {
            Some(c) => {
                let t = (m / c).tanh();
                (c * t, T::one() - t * t)
            }
            None => (m, T::one()),
        };
        *s = Some(Score { s: capped + bias.unwrap_or_else(T::zero), x, dmod, dcap });
    }
}

/// Step 3's statistics of a row's scores and its head's `sink`: `m = max(max_j s_j, sink)` (NaN
/// wins, so it reaches the output) and `l = Σ_j exp(s_j − m) + exp(sink − m)`; `None` when no key is
/// allowed or every score is −∞, and there is no sink.
pub(crate) fn softmax_stats<T: Real>(scores: &[Option<Score<T>>], sink: Option<T>) -> Option<(T, T)> {
    let logits = scores.iter().flatten().map(|sc| sc.s).chain(sink);
    let m = logits.clone().fold(T::neg_infinity(), |m, s| if s > m || s.is_nan() { s } else { m });
    if m == T::neg_infinity() {
        return None;
    }
    Some((m, logits.fold(T::zero(), |l, s| l + (s - m).exp())))
}

/// `a · b`.
pub(crate) fn dot<T: Real>(a: &[T], b: &[T]) -> T {
    a.iter().zip(b).fold(T::zero(), |acc, (&x, &y)| acc + x * y)
}
