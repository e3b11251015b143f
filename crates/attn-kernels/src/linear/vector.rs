//! The feature maps' element-wise work on `f32` rows in vectors, through the flash kernel's SIMD
//! layer and its vector `exp` (on the best instruction set of this CPU): `elu(x) + 1` (the causal
//! benchmark spent half its time in scalar `expf` before) and FAVOR+'s `exp(u − c)·s` (a tenth of
//! a FAVOR+ call's time in scalar `expf`). One dispatch serves both ([`Map`]).

use crate::flash::simd::{exp, Portable, Simd};
use crate::isa::Isa;

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
    // SAFETY: `x` and `out` hold `n` elements each.
    unsafe { on_best(&Elu1, x.as_ptr(), out.as_mut_ptr(), n) };
}

/// `x[c] = exp(x[c] − shift)·scale` for rows of any length.
pub(crate) fn exp_scaled_f32(x: &mut [f32], shift: f32, scale: f32) {
    let p = x.as_mut_ptr();
    // SAFETY: `x` holds `x.len()` elements; each is read before it is written in place.
    unsafe { on_best(&ExpScaled { shift, scale }, p, p, x.len()) };
}

/// `out[c] = map(x[c])` for `c < n` on the best instruction set of this CPU.
///
/// # Safety
/// `x` and `out` point to `n` elements each (the same ones, or ones that do not overlap).
unsafe fn on_best<M: Map>(map: &M, x: *const f32, out: *mut f32, n: usize) {
    // SAFETY: the instruction set is available (`Isa::best`); the pointers as the caller says.
    unsafe {
        match Isa::best() {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => avx512(map, x, out, n),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => avx2(map, x, out, n),
            _ => run::<Portable, M>(map, x, out, n),
        }
    }
}

/// # Safety
/// The CPU supports AVX-512F; the pointers as [`on_best`] says.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn avx512<M: Map>(map: &M, x: *const f32, out: *mut f32, n: usize) {
    // SAFETY: forwarded from the caller.
    unsafe { run::<crate::flash::simd::Avx512, M>(map, x, out, n) }
}

/// # Safety
/// The CPU supports AVX2, FMA and F16C; the pointers as [`on_best`] says.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn avx2<M: Map>(map: &M, x: *const f32, out: *mut f32, n: usize) {
    // SAFETY: forwarded from the caller.
    unsafe { run::<crate::flash::simd::Avx2, M>(map, x, out, n) }
}

/// # Safety
/// The CPU supports `S`'s instruction set; the pointers as [`on_best`] says.
#[inline(always)]
unsafe fn run<S: Simd, M: Map>(map: &M, x: *const f32, out: *mut f32, n: usize) {
    let whole = n / S::W * S::W;
    // SAFETY: the CPU supports `S`; each load and store covers `S::W` elements below `whole`, and
    // each element below `n` is read before it is written.
    unsafe {
        for i in (0..whole).step_by(S::W) {
            S::store(out.add(i), map.vector::<S>(S::load(x.add(i))));
        }
        for i in whole..n {
            *out.add(i) = map.scalar(*x.add(i));
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
