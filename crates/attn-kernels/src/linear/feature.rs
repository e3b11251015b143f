//! The feature maps `φ` of linear attention, applied to the rows of queries and keys, and their
//! exact vector–Jacobian products:
//! - [`FeatureMap::Elu`]: `elu(x) + 1` (Katharopoulos et al. 2020), positive;
//! - [`FeatureMap::Relu`]: `max(x, 0)`;
//! - [`FeatureMap::Identity`]: `x` (denominators may be 0 or negative: the caller's choice);
//! - [`FeatureMap::Favor`]: FAVOR+ positive random features, `φ(x)_r = exp(w_r·x − |x|²/2 − c)/√m`
//!   ([`FavorFeatures`]). The stabiliser `c` is the maximum of `w_r·x − |x|²/2` over the row's `r`
//!   for a query and over every `(key, r)` of the head for keys (Performer's choice; [`Stab`]); a query's `c`
//!   cancels between numerator and denominator, the keys' is common to all of them, so both only
//!   move the result through `ε`. Like Performer's code, the backward treats `c` as a constant.

use super::favor::FavorFeatures;
use super::gemm::{as_f32, as_f32_mut, gemm, Lhs};
use super::rows::{dot, sum};
use super::vector::exp_scaled_f32;
use crate::error::{AttnError, Result};
use crate::reference::Real;
use crate::simd::Isa;
use crate::view::View4;

use super::head;

/// Which `φ` linear attention applies to queries and keys.
#[derive(Debug, Clone, PartialEq)]
pub enum FeatureMap {
    /// `elu(x) + 1`: `x + 1` for `x > 0`, `exp(x)` otherwise.
    Elu,
    /// `max(x, 0)`.
    Relu,
    /// `x`.
    Identity,
    /// FAVOR+ with the given projection (`m` features).
    Favor(FavorFeatures),
}

/// How FAVOR+ stabilises the rows it maps (the other maps ignore it).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Stab<T> {
    /// Each row by its own maximum (queries).
    Row,
    /// Every row by the maximum over all the rows mapped at once (a head's keys).
    Shared,
    /// Every row by this value (a chunk of keys, by [`FeatureMap::key_stab`] of the head's keys).
    Given(T),
}

impl FeatureMap {
    /// The feature dimension `F` for head dimension `d`: `d`, or FAVOR+'s `m`.
    pub fn features(&self, d: usize) -> usize {
        match self {
            FeatureMap::Favor(f) => f.features(),
            _ => d,
        }
    }

    /// The map's name: `elu`, `relu`, `identity`, `favor`.
    pub fn name(&self) -> &'static str {
        match self {
            FeatureMap::Elu => "elu",
            FeatureMap::Relu => "relu",
            FeatureMap::Identity => "identity",
            FeatureMap::Favor(_) => "favor",
        }
    }

    /// Checks that a FAVOR+ projection was drawn for head dimension `d`.
    pub(crate) fn check(&self, d: usize) -> Result<()> {
        match self {
            FeatureMap::Favor(f) if f.dim() != d => {
                Err(AttnError::DimMismatch { tensor: "favor features", dim: "D", expected: d, found: f.dim() })
            }
            _ => Ok(()),
        }
    }

    /// `out[i·F + ·] = φ(x_i)` for the `n` rows `x_i = x[i·ldx ..][..d]`; FAVOR+ stabilises them
    /// as `stab` says.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn apply<T: Real>(
        &self,
        isa: Isa,
        n: usize,
        d: usize,
        x: &[T],
        ldx: usize,
        out: &mut [T],
        stab: Stab<T>,
    ) {
        let rows = || (0..n).map(|i| &x[i * ldx..i * ldx + d]);
        match self {
            FeatureMap::Elu if ldx == d && as_f32(x).is_some() => {
                // Contiguous rows: one vector pass over all of them.
                let (x, o) = (as_f32(&x[..n * d]), as_f32_mut(&mut out[..n * d]));
                super::vector::elu1_f32(x.expect("f32"), o.expect("f32"));
            }
            FeatureMap::Elu => {
                for (xi, o) in rows().zip(out.chunks_exact_mut(d)) {
                    match (as_f32(xi), as_f32_mut(o)) {
                        (Some(xi), Some(o)) => super::vector::elu1_f32(xi, o),
                        _ => o
                            .iter_mut()
                            .zip(xi)
                            .for_each(|(o, &v)| *o = if v > T::zero() { v + T::one() } else { v.exp() }),
                    }
                }
            }
            FeatureMap::Relu => {
                for (xi, o) in rows().zip(out.chunks_exact_mut(d)) {
                    o.iter_mut().zip(xi).for_each(|(o, &v)| *o = v.max(T::zero()));
                }
            }
            FeatureMap::Identity => {
                for (xi, o) in rows().zip(out.chunks_exact_mut(d)) {
                    o.copy_from_slice(xi);
                }
            }
            FeatureMap::Favor(f) => {
                let m = f.features();
                let out = &mut out[..n * m];
                favor_logits(isa, f, n, x, ldx, out);
                let scale = T::from_f64(1.0 / (m as f64).sqrt()).expect("finite");
                let all = match stab {
                    Stab::Row => None,
                    Stab::Shared => Some(out.iter().fold(T::neg_infinity(), |a, &b| a.max(b))),
                    Stab::Given(c) => Some(c),
                };
                for o in out.chunks_exact_mut(m) {
                    let c = all.unwrap_or_else(|| o.iter().fold(T::neg_infinity(), |a, &b| a.max(b)));
                    match as_f32_mut(o) {
                        Some(o) => exp_scaled_f32(o, c.to_f32().expect("f32"), scale.to_f32().expect("f32")),
                        None => o.iter_mut().for_each(|u| *u = (*u - c).exp() * scale),
                    }
                }
            }
        }
    }

    /// `out[i·F + ·] = φ(x_{t0 + i})` for the `n` rows from `t0` of head `(b, h)` of `x` (see
    /// [`apply`](Self::apply)).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn apply_rows<T: Real>(
        &self,
        isa: Isa,
        x: &View4<T>,
        (b, h): (usize, usize),
        t0: usize,
        n: usize,
        out: &mut [T],
        stab: Stab<T>,
    ) {
        if n > 0 {
            let (rows, ld) = head(x, b, h);
            self.apply(isa, n, x.dims()[3], &rows[t0 * ld..], ld, out, stab);
        }
    }

    /// How to stabilise the first `n` rows of head `(b, h)` of `x` (keys) chunk by chunk as
    /// [`Stab::Shared`] does all at once: FAVOR+'s maximum of `w_r·x − |x|²/2` over every row and
    /// feature, computed in blocks of rows; [`Stab::Row`] for the other maps (which ignore it).
    pub(crate) fn key_stab<T: Real>(&self, isa: Isa, x: &View4<T>, (b, h): (usize, usize), n: usize) -> Stab<T> {
        let FeatureMap::Favor(f) = self else { return Stab::Row };
        const ROWS: usize = 64;
        let (rows, ld) = head(x, b, h);
        let mut logits = vec![T::zero(); ROWS * f.features()];
        let mut c = T::neg_infinity();
        for t0 in (0..n).step_by(ROWS) {
            let r = ROWS.min(n - t0);
            favor_logits(isa, f, r, &rows[t0 * ld..], ld, &mut logits);
            c = logits[..r * f.features()].iter().fold(c, |a, &x| a.max(x));
        }
        Stab::Given(c)
    }

    /// `dx_i = (∂φ/∂x)(x_i)ᵀ · g_i` for the `n` rows, given `phi_i = φ(x_i)` (as [`apply`](Self::apply)
    /// returned it) and `g_i = ∂L/∂φ_i` (`[n, F]`, overwritten for FAVOR+); `dx: [n, d]` is
    /// overwritten.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn vjp<T: Real>(
        &self,
        isa: Isa,
        n: usize,
        d: usize,
        x: &[T],
        ldx: usize,
        phi: &[T],
        g: &mut [T],
        dx: &mut [T],
    ) {
        let rows = (0..n).map(|i| &x[i * ldx..i * ldx + d]);
        match self {
            FeatureMap::Elu => {
                for (((xi, p), gi), o) in
                    rows.zip(phi.chunks_exact(d)).zip(g.chunks_exact(d)).zip(dx.chunks_exact_mut(d))
                {
                    let each = o.iter_mut().zip(xi).zip(gi).zip(p);
                    each.for_each(|(((o, &x), &g), &p)| *o = if x > T::zero() { g } else { g * p });
                }
            }
            FeatureMap::Relu => {
                for ((xi, gi), o) in rows.zip(g.chunks_exact(d)).zip(dx.chunks_exact_mut(d)) {
                    o.iter_mut()
                        .zip(xi)
                        .zip(gi)
                        .for_each(|((o, &x), &g)| *o = if x > T::zero() { g } else { T::zero() });
                }
            }
            FeatureMap::Identity => dx[..n * d].copy_from_slice(&g[..n * d]),
            FeatureMap::Favor(f) => {
                // dx = Σ_r g_r φ_r (w_r − x) = W·(g∘φ) − x·Σ_r g_r φ_r.
                let (m, (w, _)) = (f.features(), f.projection::<T>());
                let mut sums = Vec::with_capacity(n);
                for (gi, p) in g.chunks_exact_mut(m).zip(phi.chunks_exact(m)).take(n) {
                    gi.iter_mut().zip(p).for_each(|(a, &b)| *a = *a * b);
                    sums.push(sum(gi));
                }
                gemm(isa, n, d, m, Lhs::rows(g, m).write(true), w, d, dx, d);
                for ((o, xi), s) in dx.chunks_exact_mut(d).zip(rows).zip(sums) {
                    o.iter_mut().zip(xi).for_each(|(o, &v)| *o = *o - v * s);
                }
            }
        }
    }
}

/// `out[i·m + r] = w_r·x_i − |x_i|²/2` for the `n` rows of `x` (row stride `ldx`).
#[inline(always)]
pub(crate) fn favor_logits<T: Real>(isa: Isa, f: &FavorFeatures, n: usize, x: &[T], ldx: usize, out: &mut [T]) {
    let (d, m, (_, wt)) = (f.dim(), f.features(), f.projection::<T>());
    gemm(isa, n, m, d, Lhs::rows(x, ldx).write(true), wt, m, out, m);
    let half = T::from_f64(0.5).expect("finite");
    for (i, o) in out.chunks_exact_mut(m).take(n).enumerate() {
        let row = &x[i * ldx..i * ldx + d];
        let sq = dot(row, row) * half;
        for u in o.iter_mut() {
            *u = *u - sq;
        }
    }
}
