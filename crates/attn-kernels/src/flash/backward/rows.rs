//! The backward's vector loops over one row of a tile: `dS = P∘(dP − Δ)` ([`grad_scores`]) and
//! `dX = scale·dS·dcap` ([`scale_masked`]), each 0 wherever the score is masked.

use crate::simd::Simd;

/// `dp[c] = factor · P·(dP − Δ)` in place, 0 where the score is masked (−∞) whatever `dP` holds.
///
/// # Safety
/// CPU supports `S`; the three rows have equal lengths, a multiple of `S::W`.
#[inline(always)]
pub(super) unsafe fn grad_scores<S: Simd>(s: &[f32], p: &[f32], dp: &mut [f32], delta: f32, factor: f32) {
    // SAFETY: whole vectors inside the rows.
    unsafe {
        let (nd, f, zero, below) = (S::splat(-delta), S::splat(factor), S::splat(0.0), S::splat(f32::MIN));
        for c in (0..s.len()).step_by(S::W) {
            let pf = S::mul(S::load(p.as_ptr().add(c)), f);
            let ds = S::mul(pf, S::add(S::load(dp.as_ptr().add(c)), nd));
            S::store(dp.as_mut_ptr().add(c), S::select_lt(S::load(s.as_ptr().add(c)), below, zero, ds));
        }
    }
}

/// `x[c] = scale · x[c] · dcap[c]` (`dcap` 1 when absent) in place, 0 where the score is masked:
/// `dX` from `dS` (a masked key's soft-cap derivative may be NaN).
///
/// # Safety
/// CPU supports `S`; the rows have equal lengths, a multiple of `S::W`.
#[inline(always)]
pub(super) unsafe fn scale_masked<S: Simd>(s: &[f32], x: &mut [f32], scale: f32, dcap: Option<&[f32]>) {
    // SAFETY: whole vectors inside the rows.
    unsafe {
        let (sc, zero, below) = (S::splat(scale), S::splat(0.0), S::splat(f32::MIN));
        for c in (0..s.len()).step_by(S::W) {
            let mut v = S::mul(S::load(x.as_ptr().add(c)), sc);
            if let Some(dc) = dcap {
                v = S::mul(v, S::load(dc.as_ptr().add(c)));
            }
            S::store(x.as_mut_ptr().add(c), S::select_lt(S::load(s.as_ptr().add(c)), below, zero, v));
        }
    }
}
