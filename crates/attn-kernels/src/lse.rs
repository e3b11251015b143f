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
