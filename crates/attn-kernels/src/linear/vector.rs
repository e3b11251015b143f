//! The feature maps' element-wise work on `f32` rows in vectors, through the flash kernel's SIMD
//! layer and its vector `exp` (on the best instruction set of this CPU): `elu(x) + 1` (the causal
//! benchmark spent half its time in scalar `expf` before) and FAVOR+'s `exp(u − c)·s` (a tenth of
//! a FAVOR+ call's time in scalar `expf`). One dispatch serves both ([`Map`]).

use crate::simd::{exp, Simd, SimdJob, Target};

/// An element-wise map of `f32` vectors, the same for every lane.
trait Map {
    /// The map of the lanes of `v`.
    ///
    /// # Safety
    /// The CPU supports `S`'s instruction set.
    unsafe fn vector<S: Simd>(&self, v: S::V) -> S::V;

    /// The map of one value (the rows' tails), as [`vector`](Self::vector) computes it.
    fn scalar(&self, x: f32) -> f32;
}

/// `elu(x) + 1 = max(x, 0) + exp(min(x, 0))`.
struct Elu1;

impl Map for Elu1 {
    #[inline(always)]
    unsafe fn vector<S: Simd>(&self, v: S::V) -> S::V {
        // SAFETY: forwarded from the caller.
        unsafe {
            let zero = S::splat(0.0);
            S::add(S::max(v, zero), exp::<S>(S::min(v, zero)))
        }
    }

    fn scalar(&self, x: f32) -> f32 {
        if x > 0.0 {
            x + 1.0
        } else {
            x.exp()
        }
    }
}

/// `exp(u − shift)·scale`.
struct ExpScaled {
    shift: f32,
    scale: f32,
}

impl Map for ExpScaled {
    #[inline(always)]
    unsafe fn vector<S: Simd>(&self, v: S::V) -> S::V {
        // SAFETY: forwarded from the caller.
        unsafe { S::mul(exp::<S>(S::add(v, S::splat(-self.shift))), S::splat(self.scale)) }
    }

    fn scalar(&self, x: f32) -> f32 {
        (x - self.shift).exp() * self.scale
    }
}

/// `out[c] = elu(x[c]) + 1` for rows of any length.
pub(crate) fn elu1_f32(x: &[f32], out: &mut [f32]) {
    let n = x.len().min(out.len());
    on_best(&Elu1, Some(&x[..n]), &mut out[..n]);
}

/// `x[c] = exp(x[c] − shift)·scale` for rows of any length.
pub(crate) fn exp_scaled_f32(x: &mut [f32], shift: f32, scale: f32) {
    on_best(&ExpScaled { shift, scale }, None, x);
}

/// `out[c] = map(x[c])` (`x` of `out`'s length, or `None` for `out` in place) on the best
/// instruction set of this CPU.
fn on_best<M: Map>(map: &M, x: Option<&[f32]>, out: &mut [f32]) {
    assert!(x.is_none_or(|x| x.len() == out.len()), "a map's input and output differ in length");
    Target::best().run(Mapped { map, x, out })
}

/// A [`Map`] of `x` into `out` (in place when `x` is `None`) as a job.
struct Mapped<'a, M> {
    map: &'a M,
    x: Option<&'a [f32]>,
    out: &'a mut [f32],
}

impl<M: Map> SimdJob for Mapped<'_, M> {
    type Out = ();

    #[inline(always)]
    unsafe fn run<S: Simd>(self) {
        let n = self.out.len();
        let out = self.out.as_mut_ptr();
        let x = self.x.map_or(out.cast_const(), <[f32]>::as_ptr);
        let whole = n / S::W * S::W;
        // SAFETY: the CPU supports `S` (the caller's contract); `x` and `out` hold `n` elements
        // (`on_best` checks), each load and store covers `S::W` elements below `whole`, and each
        // element below `n` is read before it is written.
        unsafe {
            for i in (0..whole).step_by(S::W) {
                S::store(out.add(i), self.map.vector::<S>(S::load(x.add(i))));
            }
            for i in whole..n {
                *out.add(i) = self.map.scalar(*x.add(i));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn maps_match_their_scalar_formulas() {
        let x: Vec<f32> = (0..37).map(|i| (i as f32 - 18.0) * 0.7).collect();
        let mut out = vec![0.0; 37];
        super::elu1_f32(&x, &mut out);
        for (&v, &o) in x.iter().zip(&out) {
            let want = if v > 0.0 { v + 1.0 } else { v.exp() };
            assert!((o - want).abs() <= 2.0 * f32::EPSILON * want, "{v}: {o} vs {want}");
        }
        let mut y = x.clone();
        super::exp_scaled_f32(&mut y, 3.0, 0.25);
        for (&v, &o) in x.iter().zip(&y) {
            let want = ((v - 3.0) as f64).exp() as f32 * 0.25;
            assert!((o - want).abs() <= 2.0 * f32::EPSILON * want, "{v}: {o} vs {want}");
        }
    }
}
