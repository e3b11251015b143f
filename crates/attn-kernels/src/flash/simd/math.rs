//! The vector functions built on [`Simd`]'s operations, written once for every implementation:
//! the polynomial of `Simd::exp2` ([`exp2_poly`]) and [`tanh`] (soft-capping), with the tests of
//! their accuracy on each instruction set this CPU has. `tanh` takes one of two forms per lane,
//! chosen by the lane's magnitude (see its documentation).

use super::Simd;

/// `tanh(x)` to about 2.5 ulp, NaN staying NaN: `x + x·u·P(u)` with `u = x²` below
/// `|x| = TANH_SMALL`, where `P` is a degree-4 least-squares fit (made for this crate, relative
/// error under 1 ulp there); `(e − 1)/(e + 1)` with `e = exp(2x)` above, where no cancellation
/// occurs; `x` clamped to `[−9, 9]`, beyond which `tanh` rounds to `±1` in f32.
///
/// # Safety
/// The CPU has `S`'s instruction set.
#[inline(always)]
pub unsafe fn tanh<S: Simd>(x: S::V) -> S::V {
    const P: [f32; 5] = [-0.333_333_16, 0.133_325_65, -0.053_850_29, 0.021_064_108, -0.006_264_324];
    // SAFETY: forwarded from the caller.
    unsafe {
        let x = S::min(S::splat(9.0), S::max(S::splat(-9.0), x));
        let u = S::mul(x, x);
        let mut p = S::splat(P[4]);
        for &c in P[..4].iter().rev() {
            p = S::fma(p, u, S::splat(c));
        }
        let small = S::fma(S::mul(x, u), p, x);
        let e = S::exp2(S::mul(x, S::splat(2.0 * std::f32::consts::LOG2_E)));
        let large = S::div(S::add(e, S::splat(-1.0)), S::add(e, S::splat(1.0)));
        S::select_lt(u, S::splat(TANH_SMALL * TANH_SMALL), small, large)
    }
}

/// Where [`tanh`] switches from the polynomial to the exponential form.
const TANH_SMALL: f32 = 0.55;

/// `2^f` for `|f| <= 1/2`: the Taylor series of `e^(f·ln 2)` to degree 7 (truncation below
/// 0.1 ulp).
///
/// # Safety
/// The CPU has `S`'s instruction set.
#[inline(always)]
pub(super) unsafe fn exp2_poly<S: Simd>(f: S::V) -> S::V {
    const C: [f32; 8] = [
        1.0,
        std::f32::consts::LN_2,
        0.240_226_5,
        0.055_504_11,
        0.009_618_129,
        0.001_333_355_8,
        0.000_154_035_3,
        0.000_015_252_734,
    ];
    // SAFETY: forwarded from the caller.
    unsafe {
        let mut p = S::splat(C[7]);
        for &c in C[..7].iter().rev() {
            p = S::fma(p, f, S::splat(c));
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::tanh;
    #[cfg(target_arch = "x86_64")]
    use crate::flash::simd::{Avx2, Avx512};
    use crate::flash::simd::{Portable, Simd};
    use crate::isa::Isa;

    /// Largest error of [`tanh`] in units of the f32 spacing at the true value, over a dense
    /// sweep of `[-12, 12]` and a geometric sweep of tiny magnitudes of both signs.
    ///
    /// # Safety
    /// The CPU has `S`'s instruction set.
    #[inline(always)]
    unsafe fn tanh_max_ulp<S: Simd>() -> f64 {
        let dense = (0..=240_000).map(|i| -12.0 + i as f64 * 1e-4);
        let tiny =
            (0..=600).flat_map(|i| [10f64.powf(-30.0 + i as f64 * 0.05), -(10f64.powf(-30.0 + i as f64 * 0.05))]);
        let xs: Vec<f32> = dense.chain(tiny).map(|x| x as f32).collect();
        let mut worst = 0.0f64;
        let mut out = [0.0f32; 16];
        for chunk in xs.chunks_exact(S::W) {
            // SAFETY: `chunk` and `out` hold at least `S::W` floats; the caller runs on `S`'s CPU.
            unsafe { S::store(out.as_mut_ptr(), tanh::<S>(S::load(chunk.as_ptr()))) };
            for (&x, &y) in chunk.iter().zip(&out) {
                let exact = (x as f64).tanh();
                let spacing = f64::from((exact.abs() as f32).next_up()) - f64::from(exact.abs() as f32);
                worst = worst.max((y as f64 - exact).abs() / spacing);
            }
        }
        worst
    }

    /// Checks the error of `isa`'s `tanh`; `None` (this CPU lacks `isa`) fails: the test is
    /// marked ignored on such a CPU (`build.rs`), so it gets here only from a binary built
    /// elsewhere or when ignored tests were asked for.
    fn check(isa: Isa, worst: Option<f64>) {
        match worst {
            Some(w) => assert!(w <= 3.0, "{isa:?} tanh is off by {w:.2} ulp"),
            None => panic!("this CPU lacks {isa:?}; run `cargo test` on this machine to have the test ignored"),
        }
    }

    #[test]
    fn tanh_within_3_ulp_portable() {
        // SAFETY: the portable implementation runs anywhere.
        check(Isa::Portable, Some(unsafe { tanh_max_ulp::<Portable>() }));
    }

    #[cfg(target_arch = "x86_64")]
    #[cfg_attr(attn_lacks_avx2, ignore = "this CPU lacks AVX2, FMA or F16C")]
    #[test]
    fn tanh_within_3_ulp_avx2() {
        /// # Safety
        /// The CPU has AVX2, FMA and F16C.
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn run() -> f64 {
            // SAFETY: compiled with the features `Avx2` needs; called only where they exist.
            unsafe { tanh_max_ulp::<Avx2>() }
        }
        // SAFETY: `run` is called only where the CPU has the features.
        check(Isa::Avx2, Isa::Avx2.is_available().then(|| unsafe { run() }));
    }

    #[cfg(target_arch = "x86_64")]
    #[cfg_attr(attn_lacks_avx512, ignore = "this CPU lacks AVX-512F")]
    #[test]
    fn tanh_within_3_ulp_avx512() {
        /// # Safety
        /// The CPU has AVX-512F.
        #[target_feature(enable = "avx512f")]
        unsafe fn run() -> f64 {
            // SAFETY: compiled with the features `Avx512` needs; called only where they exist.
            unsafe { tanh_max_ulp::<Avx512>() }
        }
        // SAFETY: `run` is called only where the CPU has the features.
        check(Isa::Avx512, Isa::Avx512.is_available().then(|| unsafe { run() }));
    }

    #[test]
    fn tanh_keeps_nan_and_saturates() {
        let xs = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0];
        let mut v = [0.0f32; 8];
        v[..5].copy_from_slice(&xs);
        // SAFETY: the portable implementation runs anywhere; `v` holds 8 floats.
        let y = unsafe { tanh::<Portable>(Portable::load(v.as_ptr())) };
        assert!(y[0].is_nan());
        assert_eq!(&y[1..5], &[1.0, -1.0, 0.0, 0.0]);
    }
}
