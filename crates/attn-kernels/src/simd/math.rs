//! The vector functions built on [`Simd`]'s operations, written once for every implementation:
//! [`exp`] (softmax) and [`tanh`] (soft-capping), with the tests of their accuracy on each
//! instruction set this CPU has. `tanh` takes one of two forms per lane,
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
        let e = exp::<S>(S::add(x, x));
        let large = S::div(S::add(e, S::splat(-1.0)), S::add(e, S::splat(1.0)));
        S::select_lt(u, S::splat(TANH_SMALL * TANH_SMALL), small, large)
    }
}

/// Where [`tanh`] switches from the polynomial to the exponential form.
const TANH_SMALL: f32 = 0.55;

/// The part of `log2 e` that `LOG2_E` as an `f32` leaves out.
const LOG2_E_LO: f32 = 1.925_963e-8;

/// `e^x` to about 1 ulp, NaN staying NaN; `x` is clamped to `[−88, 88]`, so `−∞` gives exactly 0
/// and results below `2^−126.5` flush to 0. With `n = round(x·log2 e)`, the reduced argument
/// `g = n − x·log2 e` is taken by two fused multiply-adds (`log2 e` in two parts), so it is
/// rounded once relative to `|g| ≤ 1/2` instead of relative to `x·log2 e` (a plain product costs
/// up to `|x|/2` ulp, 5 ulp at `x = −10`); then `e^x = 2^n · 2^(−g)`.
///
/// # Safety
/// The CPU has `S`'s instruction set.
#[inline(always)]
pub unsafe fn exp<S: Simd>(x: S::V) -> S::V {
    // SAFETY: forwarded from the caller.
    unsafe {
        let x = S::min(S::splat(88.0), S::max(S::splat(-88.0), x));
        let n = S::round(S::mul(x, S::splat(std::f32::consts::LOG2_E)));
        let g = S::fnma(x, S::splat(std::f32::consts::LOG2_E), n);
        let g = S::fnma(x, S::splat(LOG2_E_LO), g);
        S::ldexp(exp2_neg_poly::<S>(g), n)
    }
}

/// `2^(−g)` for `|g| <= 1/2` (and a little beyond): the Taylor series of `e^(−g·ln 2)` to degree 7
/// (truncation below 0.1 ulp).
///
/// # Safety
/// The CPU has `S`'s instruction set.
#[inline(always)]
unsafe fn exp2_neg_poly<S: Simd>(g: S::V) -> S::V {
    const C: [f32; 8] = [
        1.0,
        -std::f32::consts::LN_2,
        0.240_226_5,
        -0.055_504_11,
        0.009_618_129,
        -0.001_333_355_8,
        0.000_154_035_3,
        -0.000_015_252_734,
    ];
    // SAFETY: forwarded from the caller.
    unsafe {
        let mut p = S::splat(C[7]);
        for &c in C[..7].iter().rev() {
            p = S::fma(p, g, S::splat(c));
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::{exp, tanh};
    use crate::simd::Isa;
    #[cfg(target_arch = "x86_64")]
    use crate::simd::{Avx2, Avx512};
    use crate::simd::{Portable, Simd};

    /// The functions under test.
    #[derive(Clone, Copy, Debug)]
    enum Func {
        Exp,
        Tanh,
    }

    /// Most ulp each function may be off by.
    const BOUND: [(Func, f64); 2] = [(Func::Exp, 1.1), (Func::Tanh, 3.0)];

    impl Func {
        /// Dense sweeps of the range where the result is a normal number (`[-87, 88]` for `exp`,
        /// `[-12, 12]` for `tanh`), and geometric sweeps of tiny magnitudes of both signs.
        fn inputs(self) -> Vec<f32> {
            let (lo, hi) = match self {
                Func::Exp => (-87.0, 88.0),
                Func::Tanh => (-12.0, 12.0),
            };
            let dense = (0..=240_000).map(|i| lo + (hi - lo) * i as f64 / 240_000.0);
            let tiny =
                (0..=600).flat_map(|i| [10f64.powf(-30.0 + i as f64 * 0.05), -(10f64.powf(-30.0 + i as f64 * 0.05))]);
            dense.chain(tiny).map(|x| x as f32).collect()
        }

        fn exact(self, x: f64) -> f64 {
            match self {
                Func::Exp => x.exp(),
                Func::Tanh => x.tanh(),
            }
        }
    }

    /// Largest error of `f` in units of the f32 spacing at the true value over its inputs.
    ///
    /// # Safety
    /// The CPU has `S`'s instruction set.
    #[inline(always)]
    unsafe fn max_ulp<S: Simd>(f: Func) -> f64 {
        let mut worst = 0.0f64;
        let mut out = [0.0f32; 16];
        for chunk in f.inputs().chunks_exact(S::W) {
            // SAFETY: `chunk` and `out` hold at least `S::W` floats; the caller runs on `S`'s CPU.
            unsafe {
                let x = S::load(chunk.as_ptr());
                S::store(out.as_mut_ptr(), if let Func::Exp = f { exp::<S>(x) } else { tanh::<S>(x) });
            }
            for (&x, &y) in chunk.iter().zip(&out) {
                let exact = f.exact(x as f64);
                let spacing = f64::from((exact.abs() as f32).next_up()) - f64::from(exact.abs() as f32);
                worst = worst.max((y as f64 - exact).abs() / spacing);
            }
        }
        worst
    }

    /// Special inputs: NaN, ±∞, ±0 and −100.
    const SPECIAL: [f32; 6] = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0, -100.0];

    /// What the tests look at on one instruction set: each function's error and bound, and
    /// `tanh`, `exp` of [`SPECIAL`].
    struct Report {
        errors: Vec<(Func, f64, f64)>,
        special: [[f32; 6]; 2],
    }

    /// The report of `S`.
    ///
    /// # Safety
    /// The CPU has `S`'s instruction set.
    #[inline(always)]
    unsafe fn report<S: Simd>() -> Report {
        let mut v = [0.0f32; 16];
        v[..6].copy_from_slice(&SPECIAL);
        let (mut t, mut e) = ([0.0f32; 16], [0.0f32; 16]);
        // SAFETY: forwarded from the caller; the arrays hold 16 >= `S::W` floats, and the six
        // special values fit in the first vector (`S::W >= 8`).
        unsafe {
            let x = S::load(v.as_ptr());
            S::store(t.as_mut_ptr(), tanh::<S>(x));
            S::store(e.as_mut_ptr(), exp::<S>(x));
        }
        let special = [t, e].map(|r| std::array::from_fn(|i| r[i]));
        // SAFETY: forwarded from the caller.
        let errors = BOUND.iter().map(|&(f, bound)| (f, unsafe { max_ulp::<S>(f) }, bound)).collect();
        Report { errors, special }
    }

    /// Checks `isa`'s report; `None` (this CPU lacks `isa`) fails: the test is marked ignored on
    /// such a CPU (`build.rs`), so it gets here only from a binary built elsewhere or when ignored
    /// tests were asked for. NaN stays NaN, `tanh` saturates to ±1 and is 0 at ±0, `exp` gives
    /// exactly 0 at −∞ (a masked key's weight) and at −100 (below the normal range).
    fn check(isa: Isa, report: Option<Report>) {
        let Some(Report { errors, special: [t, e] }) = report else {
            panic!("this CPU lacks {isa:?}; run `cargo test` on this machine to have the test ignored")
        };
        for (f, worst, bound) in errors {
            assert!(worst <= bound, "{isa:?} {f:?} is off by {worst:.2} ulp, more than {bound}");
        }
        assert!(t[0].is_nan() && e[0].is_nan(), "{isa:?}: tanh, exp of NaN: {}, {}", t[0], e[0]);
        assert_eq!(&t[1..5], &[1.0, -1.0, 0.0, 0.0], "{isa:?}: tanh of ±∞, ±0");
        assert_eq!(&e[2..6], &[0.0, 1.0, 1.0, 0.0], "{isa:?}: exp of −∞, ±0, −100");
    }

    #[test]
    fn within_ulp_portable() {
        // SAFETY: the portable implementation runs anywhere.
        check(Isa::Portable, Some(unsafe { report::<Portable>() }));
    }

    #[cfg(target_arch = "x86_64")]
    #[cfg_attr(attn_lacks_avx2, ignore = "this CPU lacks AVX2, FMA or F16C")]
    #[test]
    fn within_ulp_avx2() {
        /// # Safety
        /// The CPU has AVX2, FMA and F16C.
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn run() -> Report {
            // SAFETY: compiled with the features `Avx2` needs; called only where they exist.
            unsafe { report::<Avx2>() }
        }
        // SAFETY: `run` is called only where the CPU has the features.
        check(Isa::Avx2, Isa::Avx2.is_available().then(|| unsafe { run() }));
    }

    #[cfg(target_arch = "x86_64")]
    #[cfg_attr(attn_lacks_avx512, ignore = "this CPU lacks AVX-512F")]
    #[test]
    fn within_ulp_avx512() {
        /// # Safety
        /// The CPU has AVX-512F.
        #[target_feature(enable = "avx512f")]
        unsafe fn run() -> Report {
            // SAFETY: compiled with the features `Avx512` needs; called only where they exist.
            unsafe { report::<Avx512>() }
        }
        // SAFETY: `run` is called only where the CPU has the features.
        check(Isa::Avx512, Isa::Avx512.is_available().then(|| unsafe { run() }));
    }
}
