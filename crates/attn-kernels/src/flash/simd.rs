//! The vector operations the flash kernel is written in, as one trait with three implementations:
//! AVX-512F (16 lanes), AVX2+FMA+F16C (8 lanes) and a portable one (8 lanes of plain Rust); and the
//! vector functions built on them, written once: `Simd::exp2` and [`tanh`] (for soft-capping).
//!
//! Every method is `#[inline(always)]` and `unsafe`: the x86 implementations may only run on a CPU
//! with their features, which `Isa::is_available` checks before a kernel instantiated with them is
//! entered (the entry points carry `#[target_feature]`, so these bodies are compiled with it).
//! Pointer arguments must be valid for `W` elements.

use half::{bf16, f16};

/// A vector of `W` f32 lanes.
///
/// # Safety
/// Every method may only be called on a CPU with the implementation's instruction set, and
/// pointer arguments must be valid for `W` elements.
#[allow(clippy::missing_safety_doc)] // The trait-level section above covers every method.
pub trait Simd: Copy + Send + Sync + 'static {
    /// Lanes per vector.
    const W: usize;
    /// The register type.
    type V: Copy;
    /// All lanes `x`.
    unsafe fn splat(x: f32) -> Self::V;
    /// Loads `W` floats (unaligned).
    unsafe fn load(p: *const f32) -> Self::V;
    /// Loads `W` halves and widens them.
    unsafe fn load_f16(p: *const f16) -> Self::V;
    /// Loads `W` bfloat16 values and widens them.
    unsafe fn load_bf16(p: *const bf16) -> Self::V;
    /// Stores `W` floats (unaligned).
    unsafe fn store(p: *mut f32, v: Self::V);
    /// `a·b + c`, fused.
    unsafe fn fma(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    /// `a·b`.
    unsafe fn mul(a: Self::V, b: Self::V) -> Self::V;
    /// `a + b`.
    unsafe fn add(a: Self::V, b: Self::V) -> Self::V;
    /// `a / b`.
    unsafe fn div(a: Self::V, b: Self::V) -> Self::V;
    /// Lane-wise `if a < b { x } else { y }` (a NaN comparison takes `y`).
    unsafe fn select_lt(a: Self::V, b: Self::V, x: Self::V, y: Self::V) -> Self::V;
    /// Lane-wise maximum; NaN in `b` is returned as is.
    unsafe fn max(a: Self::V, b: Self::V) -> Self::V;
    /// Lane-wise minimum; NaN in `b` is returned as is.
    unsafe fn min(a: Self::V, b: Self::V) -> Self::V;
    /// Lanes rounded to the nearest integer.
    unsafe fn round(a: Self::V) -> Self::V;
    /// `2^n` for lanes holding integers `n` in `[-127, 127]` (`-127` gives 0).
    unsafe fn pow2i(n: Self::V) -> Self::V;
    /// Largest lane (NaN lanes may be ignored).
    unsafe fn reduce_max(v: Self::V) -> f32;
    /// Sum of the lanes.
    unsafe fn reduce_sum(v: Self::V) -> f32;

    /// Sums of the lanes of four vectors.
    #[inline(always)]
    unsafe fn reduce_sum4(v: [Self::V; 4]) -> [f32; 4] {
        // SAFETY: forwarded from the caller.
        unsafe { [Self::reduce_sum(v[0]), Self::reduce_sum(v[1]), Self::reduce_sum(v[2]), Self::reduce_sum(v[3])] }
    }

    /// `2^x` to about 1 ulp; `x` is clamped to `[-127, 127]` (so `-∞` gives 0) and NaN stays NaN.
    #[inline(always)]
    unsafe fn exp2(x: Self::V) -> Self::V {
        // SAFETY: forwarded from the caller.
        unsafe {
            let x = Self::min(Self::splat(127.0), Self::max(Self::splat(-127.0), x));
            let n = Self::round(x);
            let f = Self::add(x, Self::mul(n, Self::splat(-1.0)));
            Self::mul(exp2_poly::<Self>(f), Self::pow2i(n))
        }
    }
}

/// `tanh(x)` to about 2.5 ulp, NaN staying NaN: `x + x·u·P(u)` with `u = x²` below
/// `|x| = TANH_SMALL`, where `P` is a degree-4 least-squares fit (made for this crate, relative
/// error under 1 ulp there); `(e − 1)/(e + 1)` with `e = exp(2x)` above, where no cancellation
/// occurs; `x` clamped to `[−9, 9]`, beyond which `tanh` rounds to `±1` in f32.
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
#[inline(always)]
unsafe fn exp2_poly<S: Simd>(f: S::V) -> S::V {
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

/// Storage types of keys and values, widened to f32 on load.
///
/// # Safety
/// `load` follows [`Simd`]'s contract: the CPU supports `S`, `p` is valid for `S::W` elements.
#[allow(clippy::missing_safety_doc)] // The trait-level section above covers `load`.
pub trait KvElem: Copy + Send + Sync + 'static {
    /// Loads `S::W` elements as f32.
    unsafe fn load<S: Simd>(p: *const Self) -> S::V;
    /// One element as f32.
    fn to_f32(self) -> f32;
}

impl KvElem for f32 {
    #[inline(always)]
    unsafe fn load<S: Simd>(p: *const Self) -> S::V {
        S::load(p)
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
}

impl KvElem for f16 {
    #[inline(always)]
    unsafe fn load<S: Simd>(p: *const Self) -> S::V {
        S::load_f16(p)
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
}

impl KvElem for bf16 {
    #[inline(always)]
    unsafe fn load<S: Simd>(p: *const Self) -> S::V {
        S::load_bf16(p)
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
}

/// Plain Rust lanes; LLVM vectorises what it can for the baseline target.
#[derive(Clone, Copy)]
pub struct Portable;

impl Simd for Portable {
    const W: usize = 8;
    type V = [f32; 8];
    #[inline(always)]
    unsafe fn splat(x: f32) -> Self::V {
        [x; 8]
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self::V {
        // SAFETY: the caller guarantees `p` is valid for 8 floats.
        unsafe { std::ptr::read_unaligned(p as *const [f32; 8]) }
    }
    #[inline(always)]
    unsafe fn load_f16(p: *const f16) -> Self::V {
        // SAFETY: the caller guarantees `p` is valid for 8 halves.
        let h = unsafe { std::ptr::read_unaligned(p as *const [f16; 8]) };
        h.map(f16::to_f32)
    }
    #[inline(always)]
    unsafe fn load_bf16(p: *const bf16) -> Self::V {
        // SAFETY: the caller guarantees `p` is valid for 8 bfloat16 values.
        let h = unsafe { std::ptr::read_unaligned(p as *const [bf16; 8]) };
        h.map(bf16::to_f32)
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: Self::V) {
        // SAFETY: the caller guarantees `p` is valid for 8 floats.
        unsafe { std::ptr::write_unaligned(p as *mut [f32; 8], v) }
    }
    /// Multiply then add, rounded twice: `f32::mul_add` is a library call on CPUs without FMA,
    /// which is exactly where this implementation runs.
    #[inline(always)]
    unsafe fn fma(a: Self::V, b: Self::V, c: Self::V) -> Self::V {
        std::array::from_fn(|i| a[i] * b[i] + c[i])
    }
    #[inline(always)]
    unsafe fn mul(a: Self::V, b: Self::V) -> Self::V {
        std::array::from_fn(|i| a[i] * b[i])
    }
    #[inline(always)]
    unsafe fn add(a: Self::V, b: Self::V) -> Self::V {
        std::array::from_fn(|i| a[i] + b[i])
    }
    #[inline(always)]
    unsafe fn div(a: Self::V, b: Self::V) -> Self::V {
        std::array::from_fn(|i| a[i] / b[i])
    }
    #[inline(always)]
    unsafe fn select_lt(a: Self::V, b: Self::V, x: Self::V, y: Self::V) -> Self::V {
        std::array::from_fn(|i| if a[i] < b[i] { x[i] } else { y[i] })
    }
    #[inline(always)]
    unsafe fn max(a: Self::V, b: Self::V) -> Self::V {
        std::array::from_fn(|i| if a[i] > b[i] { a[i] } else { b[i] })
    }
    #[inline(always)]
    unsafe fn min(a: Self::V, b: Self::V) -> Self::V {
        std::array::from_fn(|i| if a[i] < b[i] { a[i] } else { b[i] })
    }
    #[inline(always)]
    unsafe fn round(a: Self::V) -> Self::V {
        a.map(f32::round_ties_even)
    }
    #[inline(always)]
    unsafe fn pow2i(n: Self::V) -> Self::V {
        n.map(|n| f32::from_bits((((n as i32) + 127) as u32) << 23))
    }
    #[inline(always)]
    unsafe fn reduce_max(v: Self::V) -> f32 {
        v.into_iter().fold(f32::NEG_INFINITY, f32::max)
    }
    #[inline(always)]
    unsafe fn reduce_sum(v: Self::V) -> f32 {
        let s: [f32; 4] = std::array::from_fn(|i| v[i] + v[i + 4]);
        (s[0] + s[2]) + (s[1] + s[3])
    }
}

#[cfg(target_arch = "x86_64")]
pub use x86::{Avx2, Avx512};

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::Simd;
    use half::{bf16, f16};
    use std::arch::x86_64::*;

    /// AVX-512F, 16 lanes.
    #[derive(Clone, Copy)]
    pub struct Avx512;

    // SAFETY (every method below): only reached from functions compiled with
    // `#[target_feature(enable = "avx512f")]` after `Isa::Avx512.is_available()`; pointers are
    // valid for 16 elements as the trait requires.
    impl Simd for Avx512 {
        const W: usize = 16;
        type V = __m512;
        #[inline(always)]
        unsafe fn splat(x: f32) -> __m512 {
            unsafe { _mm512_set1_ps(x) }
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> __m512 {
            unsafe { _mm512_loadu_ps(p) }
        }
        #[inline(always)]
        unsafe fn load_f16(p: *const f16) -> __m512 {
            unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i)) }
        }
        #[inline(always)]
        unsafe fn load_bf16(p: *const bf16) -> __m512 {
            unsafe {
                let w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(p as *const __m256i));
                _mm512_castsi512_ps(_mm512_slli_epi32::<16>(w))
            }
        }
        #[inline(always)]
        unsafe fn store(p: *mut f32, v: __m512) {
            unsafe { _mm512_storeu_ps(p, v) }
        }
        #[inline(always)]
        unsafe fn fma(a: __m512, b: __m512, c: __m512) -> __m512 {
            unsafe { _mm512_fmadd_ps(a, b, c) }
        }
        #[inline(always)]
        unsafe fn mul(a: __m512, b: __m512) -> __m512 {
            unsafe { _mm512_mul_ps(a, b) }
        }
        #[inline(always)]
        unsafe fn add(a: __m512, b: __m512) -> __m512 {
            unsafe { _mm512_add_ps(a, b) }
        }
        #[inline(always)]
        unsafe fn div(a: __m512, b: __m512) -> __m512 {
            unsafe { _mm512_div_ps(a, b) }
        }
        #[inline(always)]
        unsafe fn select_lt(a: __m512, b: __m512, x: __m512, y: __m512) -> __m512 {
            unsafe { _mm512_mask_blend_ps(_mm512_cmp_ps_mask::<_CMP_LT_OQ>(a, b), y, x) }
        }
        #[inline(always)]
        unsafe fn max(a: __m512, b: __m512) -> __m512 {
            unsafe { _mm512_max_ps(a, b) }
        }
        #[inline(always)]
        unsafe fn min(a: __m512, b: __m512) -> __m512 {
            unsafe { _mm512_min_ps(a, b) }
        }
        #[inline(always)]
        unsafe fn round(a: __m512) -> __m512 {
            unsafe { _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(a) }
        }
        #[inline(always)]
        unsafe fn pow2i(n: __m512) -> __m512 {
            unsafe {
                let i = _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127));
                _mm512_castsi512_ps(_mm512_slli_epi32::<23>(i))
            }
        }
        #[inline(always)]
        unsafe fn reduce_max(v: __m512) -> f32 {
            unsafe { _mm512_reduce_max_ps(v) }
        }
        /// Transposing reduction: pairs interleaved, then quadruples, then the four 128-bit lanes.
        #[inline(always)]
        unsafe fn reduce_sum4(v: [__m512; 4]) -> [f32; 4] {
            unsafe {
                let ab = _mm512_add_ps(_mm512_unpacklo_ps(v[0], v[1]), _mm512_unpackhi_ps(v[0], v[1]));
                let cd = _mm512_add_ps(_mm512_unpacklo_ps(v[2], v[3]), _mm512_unpackhi_ps(v[2], v[3]));
                let abcd = _mm512_add_ps(_mm512_shuffle_ps::<0x44>(ab, cd), _mm512_shuffle_ps::<0xEE>(ab, cd));
                let h = _mm256_add_ps(_mm512_castps512_ps256(abcd), _mm512_extractf32x8_ps::<1>(abcd));
                let q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps::<1>(h));
                let mut out = [0.0f32; 4];
                _mm_storeu_ps(out.as_mut_ptr(), q);
                out
            }
        }
        /// `2^x` as `p(f)·2^n` with `scalef`, which also does the range handling: `x` is clamped
        /// below at −160 so `−∞` gives exactly 0, and large `x` overflows to `+∞`.
        #[inline(always)]
        unsafe fn exp2(x: __m512) -> __m512 {
            unsafe {
                let x = _mm512_max_ps(_mm512_set1_ps(-160.0), x);
                let n = Self::round(x);
                let p = super::exp2_poly::<Self>(_mm512_sub_ps(x, n));
                _mm512_scalef_ps(p, n)
            }
        }
        #[inline(always)]
        unsafe fn reduce_sum(v: __m512) -> f32 {
            unsafe { _mm512_reduce_add_ps(v) }
        }
    }

    /// AVX2 with FMA and F16C, 8 lanes.
    #[derive(Clone, Copy)]
    pub struct Avx2;

    // SAFETY (every method below): only reached from functions compiled with
    // `#[target_feature(enable = "avx2,fma,f16c")]` after `Isa::Avx2.is_available()`; pointers
    // are valid for 8 elements as the trait requires.
    impl Simd for Avx2 {
        const W: usize = 8;
        type V = __m256;
        #[inline(always)]
        unsafe fn splat(x: f32) -> __m256 {
            unsafe { _mm256_set1_ps(x) }
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> __m256 {
            unsafe { _mm256_loadu_ps(p) }
        }
        #[inline(always)]
        unsafe fn load_f16(p: *const f16) -> __m256 {
            unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)) }
        }
        #[inline(always)]
        unsafe fn load_bf16(p: *const bf16) -> __m256 {
            unsafe {
                let w = _mm256_cvtepu16_epi32(_mm_loadu_si128(p as *const __m128i));
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(w))
            }
        }
        #[inline(always)]
        unsafe fn store(p: *mut f32, v: __m256) {
            unsafe { _mm256_storeu_ps(p, v) }
        }
        #[inline(always)]
        unsafe fn fma(a: __m256, b: __m256, c: __m256) -> __m256 {
            unsafe { _mm256_fmadd_ps(a, b, c) }
        }
        #[inline(always)]
        unsafe fn mul(a: __m256, b: __m256) -> __m256 {
            unsafe { _mm256_mul_ps(a, b) }
        }
        #[inline(always)]
        unsafe fn add(a: __m256, b: __m256) -> __m256 {
            unsafe { _mm256_add_ps(a, b) }
        }
        #[inline(always)]
        unsafe fn div(a: __m256, b: __m256) -> __m256 {
            unsafe { _mm256_div_ps(a, b) }
        }
        #[inline(always)]
        unsafe fn select_lt(a: __m256, b: __m256, x: __m256, y: __m256) -> __m256 {
            unsafe { _mm256_blendv_ps(y, x, _mm256_cmp_ps::<_CMP_LT_OQ>(a, b)) }
        }
        #[inline(always)]
        unsafe fn max(a: __m256, b: __m256) -> __m256 {
            unsafe { _mm256_max_ps(a, b) }
        }
        #[inline(always)]
        unsafe fn min(a: __m256, b: __m256) -> __m256 {
            unsafe { _mm256_min_ps(a, b) }
        }
        #[inline(always)]
        unsafe fn round(a: __m256) -> __m256 {
            unsafe { _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(a) }
        }
        #[inline(always)]
        unsafe fn pow2i(n: __m256) -> __m256 {
            unsafe {
                let i = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
                _mm256_castsi256_ps(_mm256_slli_epi32::<23>(i))
            }
        }
        #[inline(always)]
        unsafe fn reduce_max(v: __m256) -> f32 {
            unsafe {
                let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
                let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
                let m = _mm_max_ss(m, _mm_shuffle_ps::<1>(m, m));
                _mm_cvtss_f32(m)
            }
        }
        #[inline(always)]
        unsafe fn reduce_sum(v: __m256) -> f32 {
            unsafe {
                let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
                let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
                let s = _mm_add_ss(s, _mm_shuffle_ps::<1>(s, s));
                _mm_cvtss_f32(s)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::isa::Isa;

    /// Largest error of [`tanh`] in units of the f32 spacing at the true value, over a dense
    /// sweep of `[-12, 12]` and a geometric sweep of tiny magnitudes of both signs.
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

    fn check(isa: Isa, worst: Option<f64>) {
        match worst {
            Some(w) => assert!(w <= 3.0, "{isa:?} tanh is off by {w:.2} ulp"),
            None => eprintln!("skipped: this CPU lacks {isa:?}"),
        }
    }

    #[test]
    fn tanh_within_3_ulp_portable() {
        // SAFETY: the portable implementation runs anywhere.
        check(Isa::Portable, Some(unsafe { tanh_max_ulp::<Portable>() }));
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn tanh_within_3_ulp_avx2() {
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn run() -> f64 {
            // SAFETY: compiled with the features `Avx2` needs; called only where they exist.
            unsafe { tanh_max_ulp::<Avx2>() }
        }
        // SAFETY: `run` is called only where the CPU has the features.
        check(Isa::Avx2, Isa::Avx2.is_available().then(|| unsafe { run() }));
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn tanh_within_3_ulp_avx512() {
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
