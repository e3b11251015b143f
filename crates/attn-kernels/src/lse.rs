//! A row's log-sum-exp as its value rounded to the working precision plus the rounding's residue,
//! `lse ≈ hi + lo` (Knuth's two-sum of the row maximum `m` and `ln l`, `l = Σ_j exp(s_j − m)`).
//!
//! Why the residue: a backward that rebuilds the probabilities as `exp(s − lse)` from a rounded
//! `lse` scales every probability of the row by `exp(−δ)`, `δ` up to half an ulp of `|lse|` — with
//! scores in the hundreds, a few hundred ulps of `P`, which `dV = Pᵀ·dO` shows directly. The
//! kernels return `lo` beside `lse` ([`AttnOutput::lse_residue`](crate::AttnOutput)) and the fast
//! backward computes `exp((s − hi) − lo)`: `s − hi` is exact where `P` matters (`s` near `hi`), and
//! what remains is `ln l`'s own rounding, a few ulps at most.

use num_traits::Float;

/// `(hi, lo)` with `hi = m + ln l` rounded and `lo` its exact rounding error (up to `ln l`'s own
/// rounding); `lo = 0` when `hi` is not finite.
pub(crate) fn lse_parts<T: Float>(m: T, l: T) -> (T, T) {
    let big = l.ln();
    let hi = m + big;
    if !hi.is_finite() {
        return (hi, T::zero());
    }
    let b = hi - m;
    (hi, (m - (hi - b)) + (big - b))
}

/// Joins a sink logit to a row's log-sum-exp `hi + lo` (as [`lse_parts`] splits it): returns
/// `(hi', lo', keep)` with `hi' + lo' = logaddexp(hi + lo, sink)` and `keep = exp((hi + lo) −
/// (hi' + lo'))`, the factor that turns the keys' probabilities and the output of the row into
/// theirs with the sink in the denominator. Computed in `f64`, where `hi + lo` is exact to about
/// `2⁻⁵³` relative, so the two parts stay as accurate as the kernel's. A row without keys
/// (`hi = −∞`) gives `(sink, 0, 0)`; NaN propagates; `lo' = 0` where `hi'` is not finite.
pub(crate) fn join_sink(hi: f32, lo: f32, sink: f32) -> (f32, f32, f32) {
    if hi == f32::NEG_INFINITY {
        return (sink, 0.0, 0.0);
    }
    let (x, s) = (hi as f64 + lo as f64, sink as f64);
    // NaN in `x` fails the comparison and reaches every result through `x − m`.
    let m = if x > s { x } else { s };
    let keys = (x - m).exp();
    let l = keys + (s - m).exp();
    let total = m + l.ln();
    let hi = total as f32;
    let lo = if hi.is_finite() { (total - hi as f64) as f32 } else { 0.0 };
    (hi, lo, (keys / l) as f32)
}
