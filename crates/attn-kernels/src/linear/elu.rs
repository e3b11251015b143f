//! `elu(x) + 1 = max(x, 0) + exp(min(x, 0))` on `f32` rows in vectors, through the flash kernel's
//! SIMD layer and its vector `exp` (on the best instruction set of this CPU): the feature map the
//! causal benchmark runs spent half its time in scalar `expf` before.

use crate::flash::simd::{exp, Portable, Simd};
use crate::isa::Isa;

/// `out[c] = elu(x[c]) + 1` for rows of any length.
pub(crate) fn elu1_f32(x: &[f32], out: &mut [f32]) {
    match Isa::best() {
        // SAFETY: the instruction set is available (`Isa::best`).
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { elu1_avx512(x, out) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { elu1_avx2(x, out) },
        // SAFETY: portable code runs anywhere.
        _ => unsafe { elu1::<Portable>(x, out) },
    }
}

/// # Safety
/// The CPU supports AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn elu1_avx512(x: &[f32], out: &mut [f32]) {
    // SAFETY: forwarded from the caller.
    unsafe { elu1::<crate::flash::simd::Avx512>(x, out) }
}

/// # Safety
/// The CPU supports AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn elu1_avx2(x: &[f32], out: &mut [f32]) {
    // SAFETY: forwarded from the caller.
    unsafe { elu1::<crate::flash::simd::Avx2>(x, out) }
}

/// # Safety
/// The CPU supports `S`'s instruction set.
#[inline(always)]
unsafe fn elu1<S: Simd>(x: &[f32], out: &mut [f32]) {
    let n = x.len().min(out.len());
    let whole = n / S::W * S::W;
    // SAFETY: the CPU supports `S`; each load and store covers `S::W` elements below `whole`.
    unsafe {
        let zero = S::splat(0.0);
        for i in (0..whole).step_by(S::W) {
            let v = S::load(x.as_ptr().add(i));
            S::store(out.as_mut_ptr().add(i), S::add(S::max(v, zero), exp::<S>(S::min(v, zero))));
        }
    }
    for (o, &v) in out[whole..n].iter_mut().zip(&x[whole..n]) {
        *o = if v > 0.0 { v + 1.0 } else { v.exp() };
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn matches_the_scalar_formula() {
        let x: Vec<f32> = (0..37).map(|i| (i as f32 - 18.0) * 0.7).collect();
        let mut out = vec![0.0; 37];
        super::elu1_f32(&x, &mut out);
        for (&v, &o) in x.iter().zip(&out) {
            let want = if v > 0.0 { v + 1.0 } else { v.exp() };
            assert!((o - want).abs() <= 2.0 * f32::EPSILON * want, "{v}: {o} vs {want}");
        }
    }
}
