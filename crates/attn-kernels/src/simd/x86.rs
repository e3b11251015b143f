//! The x86 implementations of [`Simd`]: [`Avx512`] (AVX-512F, 16 lanes, `scalef` for `ldexp`) and
//! [`Avx2`] (AVX2 with FMA and F16C, 8 lanes), each method one or a few intrinsics (the bfloat16
//! pair operations in `x86_bf16`). [`Avx512Bf16`] is [`Avx512`] with AVX512-BF16's `VDPBF16PS` for
//! [`Simd::dot_bf16`]. Compiled only on x86-64; which one runs is decided by the entry point after
//! `Isa::is_available` (and, for [`Avx512Bf16`], `Isa::has_avx512_bf16`).

use std::arch::x86_64::*;

use half::{bf16, f16};

use super::x86_bf16::{halves256, halves512, pack256, pack512};
use super::x86_transpose::transpose16;
use super::Simd;

/// AVX-512F, 16 lanes; with `NATIVE_BF16`, [`Simd::dot_bf16`] is AVX512-BF16's `VDPBF16PS`.
#[derive(Clone, Copy)]
pub struct Avx512<const NATIVE_BF16: bool = false>;

/// AVX-512F with AVX512-BF16.
pub type Avx512Bf16 = Avx512<true>;

// Every method is only reached from functions compiled with
// `#[target_feature(enable = "avx512f")]` (and `avx512bf16` for `Avx512Bf16`), entered after
// `Isa::Avx512.is_available()` (and `Isa::has_avx512_bf16()`).
impl<const NATIVE_BF16: bool> Simd for Avx512<NATIVE_BF16> {
    const W: usize = 16;
    const QK_ROWS: usize = 12;
    const PV_ROWS: usize = 6;
    const PV_VECTORS: usize = 4;
    const FMA: bool = true;
    type V = __m512;
    #[inline(always)]
    unsafe fn splat(x: f32) -> __m512 {
        // SAFETY: AVX-512F is present (the caller's contract).
        unsafe { _mm512_set1_ps(x) }
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> __m512 {
        // SAFETY: AVX-512F is present and `p` is valid for reading 16 floats
        // (the caller's contract).
        unsafe { _mm512_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn load_f16(p: *const f16) -> __m512 {
        // SAFETY: AVX-512F is present and `p` is valid for reading 16 halves
        // (the caller's contract).
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i)) }
    }
    #[inline(always)]
    unsafe fn load_bf16(p: *const bf16) -> __m512 {
        // SAFETY: AVX-512F is present and `p` is valid for reading 16 bfloat16 values
        // (the caller's contract).
        unsafe {
            let w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(p as *const __m256i));
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(w))
        }
    }
    #[inline(always)]
    unsafe fn load_i8(p: *const i8) -> __m512 {
        // SAFETY: AVX-512F is present and `p` is valid for reading 16 bytes (the caller's
        // contract).
        unsafe { _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p as *const __m128i))) }
    }
    #[inline(always)]
    unsafe fn load_fp8(p: *const u8) -> __m512 {
        // SAFETY: AVX-512F is present and `p` is valid for reading 16 bytes (the caller's
        // contract).
        unsafe {
            let b = _mm512_cvtepu8_epi32(_mm_loadu_si128(p as *const __m128i));
            let em = _mm512_and_si512(b, _mm512_set1_epi32(0x7F));
            let normal = _mm512_add_epi32(_mm512_slli_epi32::<20>(em), _mm512_set1_epi32(120 << 23));
            let sub = _mm512_mul_ps(_mm512_cvtepi32_ps(em), _mm512_set1_ps(1.0 / 512.0));
            let is_sub = _mm512_cmplt_epi32_mask(em, _mm512_set1_epi32(8));
            let mag = _mm512_mask_blend_ps(is_sub, _mm512_castsi512_ps(normal), sub);
            let sign = _mm512_slli_epi32::<24>(_mm512_and_si512(b, _mm512_set1_epi32(0x80)));
            _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(mag), sign))
        }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: __m512) {
        // SAFETY: AVX-512F is present and `p` is valid for writing 16 floats
        // (the caller's contract).
        unsafe { _mm512_storeu_ps(p, v) }
    }
    #[inline(always)]
    unsafe fn fma(a: __m512, b: __m512, c: __m512) -> __m512 {
        // SAFETY: AVX-512F is present (the caller's contract).
        unsafe { _mm512_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn mul(a: __m512, b: __m512) -> __m512 {
        // SAFETY: AVX-512F is present (the caller's contract).
        unsafe { _mm512_mul_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn add(a: __m512, b: __m512) -> __m512 {
        // SAFETY: AVX-512F is present (the caller's contract).
        unsafe { _mm512_add_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn fnma(a: __m512, b: __m512, c: __m512) -> __m512 {
        // SAFETY: AVX-512F is present (the caller's contract).
        unsafe { _mm512_fnmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn div(a: __m512, b: __m512) -> __m512 {
        // SAFETY: AVX-512F is present (the caller's contract).
        unsafe { _mm512_div_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn select_lt(a: __m512, b: __m512, x: __m512, y: __m512) -> __m512 {
        // SAFETY: AVX-512F is present (the caller's contract).
        unsafe { _mm512_mask_blend_ps(_mm512_cmp_ps_mask::<_CMP_LT_OQ>(a, b), y, x) }
    }
    #[inline(always)]
    unsafe fn select_bits(bits: u32, x: __m512, y: __m512) -> __m512 {
        // SAFETY: AVX-512F is present (the caller's contract).
        unsafe { _mm512_mask_blend_ps(bits as __mmask16, y, x) }
    }
    #[inline(always)]
    unsafe fn max(a: __m512, b: __m512) -> __m512 {
        // SAFETY: AVX-512F is present (the caller's contract).
        unsafe { _mm512_max_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn min(a: __m512, b: __m512) -> __m512 {
        // SAFETY: AVX-512F is present (the caller's contract).
        unsafe { _mm512_min_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn round(a: __m512) -> __m512 {
        // SAFETY: AVX-512F is present (the caller's contract).
        unsafe { _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(a) }
    }
    #[inline(always)]
    unsafe fn pow2i(n: __m512) -> __m512 {
        // SAFETY: AVX-512F is present (the caller's contract).
        unsafe {
            let i = _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127));
            _mm512_castsi512_ps(_mm512_slli_epi32::<23>(i))
        }
    }
    #[inline(always)]
    unsafe fn reduce_max(v: __m512) -> f32 {
        // SAFETY: AVX-512F is present (the caller's contract).
        unsafe { _mm512_reduce_max_ps(v) }
    }
    /// Transposing reduction: pairs interleaved, then quadruples, then the four 128-bit lanes.
    #[inline(always)]
    unsafe fn reduce_sum4(v: [__m512; 4]) -> [f32; 4] {
        // SAFETY: AVX-512F is present (the caller's contract).
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
    #[inline(always)]
    unsafe fn ldexp(p: __m512, n: __m512) -> __m512 {
        // SAFETY: AVX-512F is present (the caller's contract).
        unsafe {
            // `n = −127` gives 0, as `pow2i` does; `scalef` alone would give a subnormal.
            let live = _mm512_cmp_ps_mask::<_CMP_NLE_UQ>(n, _mm512_set1_ps(-127.0));
            _mm512_maskz_scalef_ps(live, p, n)
        }
    }
    #[inline(always)]
    unsafe fn reduce_sum(v: __m512) -> f32 {
        // SAFETY: AVX-512F is present (the caller's contract).
        unsafe { _mm512_reduce_add_ps(v) }
    }
    #[inline(always)]
    unsafe fn bf16_halves(v: __m512) -> (__m512, __m512) {
        // SAFETY: AVX-512F is present (the caller's contract).
        unsafe { halves512(v) }
    }
    #[inline(always)]
    unsafe fn pack_bf16(lo: __m512, hi: __m512) -> __m512 {
        // SAFETY: AVX-512F is present (the caller's contract).
        unsafe { pack512(lo, hi) }
    }
    #[inline(always)]
    unsafe fn dot_bf16(acc: __m512, a: __m512, b: __m512) -> __m512 {
        // SAFETY: with `NATIVE_BF16` the CPU has AVX512-BF16 (the caller's contract); a vector of
        // 16 f32 lanes and one of 32 bfloat16 lanes are the same 512 bits.
        unsafe {
            if NATIVE_BF16 {
                let (a, b) = (std::mem::transmute::<__m512, __m512bh>(a), std::mem::transmute::<__m512, __m512bh>(b));
                _mm512_dpbf16_ps(acc, a, b)
            } else {
                super::emulated_dot_bf16::<Self>(acc, a, b)
            }
        }
    }
    #[inline(always)]
    unsafe fn transpose_rows(rows: &[&[f32]], d: usize, out: &mut [f32], ld: usize) {
        let n = rows.len();
        let fits = d == 0 || out.len() >= (d - 1) * ld + n;
        assert!(n <= 16 && n <= ld && fits && rows.iter().all(|r| r.len() >= d), "transpose_rows: sizes");
        let keep = |lanes: usize| if lanes >= 16 { u16::MAX } else { (1u16 << lanes) - 1 };
        // SAFETY: AVX-512F is present (the caller's contract); the masked loads read lanes
        // `k0..k0 + m` of rows holding `d` values, the masked stores lanes `..n` of slots
        // `k0 + c < d`, `ld` apart, of `out` (asserted above).
        unsafe {
            let mut v = [_mm512_setzero_ps(); 16];
            for k0 in (0..d).step_by(16) {
                let m = (d - k0).min(16);
                for (x, row) in v.iter_mut().zip(rows) {
                    *x = _mm512_maskz_loadu_ps(keep(m), row.as_ptr().add(k0));
                }
                let t = transpose16(v);
                for (c, x) in t.iter().enumerate().take(m) {
                    _mm512_mask_storeu_ps(out.as_mut_ptr().add((k0 + c) * ld), keep(n), *x);
                }
            }
        }
    }
}

/// AVX2 with FMA and F16C, 8 lanes.
#[derive(Clone, Copy)]
pub struct Avx2;

// Every method is only reached from functions compiled with
// `#[target_feature(enable = "avx2,fma,f16c")]`, entered after `Isa::Avx2.is_available()`.
impl Simd for Avx2 {
    const W: usize = 8;
    const QK_ROWS: usize = 6;
    const PV_ROWS: usize = 6;
    const PV_VECTORS: usize = 2;
    const FMA: bool = true;
    type V = __m256;
    #[inline(always)]
    unsafe fn splat(x: f32) -> __m256 {
        // SAFETY: AVX2, FMA and F16C are present (the caller's contract).
        unsafe { _mm256_set1_ps(x) }
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> __m256 {
        // SAFETY: AVX2, FMA and F16C are present and `p` is valid for reading 8 floats
        // (the caller's contract).
        unsafe { _mm256_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn load_f16(p: *const f16) -> __m256 {
        // SAFETY: AVX2, FMA and F16C are present and `p` is valid for reading 8 halves
        // (the caller's contract).
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)) }
    }
    #[inline(always)]
    unsafe fn load_bf16(p: *const bf16) -> __m256 {
        // SAFETY: AVX2, FMA and F16C are present and `p` is valid for reading 8 bfloat16 values
        // (the caller's contract).
        unsafe {
            let w = _mm256_cvtepu16_epi32(_mm_loadu_si128(p as *const __m128i));
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(w))
        }
    }
    #[inline(always)]
    unsafe fn load_i8(p: *const i8) -> __m256 {
        // SAFETY: AVX2 is present and `p` is valid for reading 8 bytes (the caller's contract).
        unsafe { _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(p as *const __m128i))) }
    }
    #[inline(always)]
    unsafe fn load_fp8(p: *const u8) -> __m256 {
        // SAFETY: AVX2 is present and `p` is valid for reading 8 bytes (the caller's contract).
        unsafe {
            let b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(p as *const __m128i));
            let em = _mm256_and_si256(b, _mm256_set1_epi32(0x7F));
            let normal = _mm256_add_epi32(_mm256_slli_epi32::<20>(em), _mm256_set1_epi32(120 << 23));
            let sub = _mm256_mul_ps(_mm256_cvtepi32_ps(em), _mm256_set1_ps(1.0 / 512.0));
            let is_sub = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(8), em));
            let mag = _mm256_blendv_ps(_mm256_castsi256_ps(normal), sub, is_sub);
            let sign = _mm256_slli_epi32::<24>(_mm256_and_si256(b, _mm256_set1_epi32(0x80)));
            _mm256_castsi256_ps(_mm256_or_si256(_mm256_castps_si256(mag), sign))
        }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: __m256) {
        // SAFETY: AVX2, FMA and F16C are present and `p` is valid for writing 8 floats
        // (the caller's contract).
        unsafe { _mm256_storeu_ps(p, v) }
    }
    #[inline(always)]
    unsafe fn fma(a: __m256, b: __m256, c: __m256) -> __m256 {
        // SAFETY: AVX2, FMA and F16C are present (the caller's contract).
        unsafe { _mm256_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn mul(a: __m256, b: __m256) -> __m256 {
        // SAFETY: AVX2, FMA and F16C are present (the caller's contract).
        unsafe { _mm256_mul_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn add(a: __m256, b: __m256) -> __m256 {
        // SAFETY: AVX2, FMA and F16C are present (the caller's contract).
        unsafe { _mm256_add_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn fnma(a: __m256, b: __m256, c: __m256) -> __m256 {
        // SAFETY: AVX2, FMA and F16C are present (the caller's contract).
        unsafe { _mm256_fnmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn div(a: __m256, b: __m256) -> __m256 {
        // SAFETY: AVX2, FMA and F16C are present (the caller's contract).
        unsafe { _mm256_div_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn select_lt(a: __m256, b: __m256, x: __m256, y: __m256) -> __m256 {
        // SAFETY: AVX2, FMA and F16C are present (the caller's contract).
        unsafe { _mm256_blendv_ps(y, x, _mm256_cmp_ps::<_CMP_LT_OQ>(a, b)) }
    }
    #[inline(always)]
    unsafe fn select_bits(bits: u32, x: __m256, y: __m256) -> __m256 {
        // SAFETY: AVX2, FMA and F16C are present (the caller's contract).
        unsafe {
            let lane = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
            let set = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(bits as i32), lane), lane);
            _mm256_blendv_ps(y, x, _mm256_castsi256_ps(set))
        }
    }
    #[inline(always)]
    unsafe fn max(a: __m256, b: __m256) -> __m256 {
        // SAFETY: AVX2, FMA and F16C are present (the caller's contract).
        unsafe { _mm256_max_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn min(a: __m256, b: __m256) -> __m256 {
        // SAFETY: AVX2, FMA and F16C are present (the caller's contract).
        unsafe { _mm256_min_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn round(a: __m256) -> __m256 {
        // SAFETY: AVX2, FMA and F16C are present (the caller's contract).
        unsafe { _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(a) }
    }
    #[inline(always)]
    unsafe fn pow2i(n: __m256) -> __m256 {
        // SAFETY: AVX2, FMA and F16C are present (the caller's contract).
        unsafe {
            let i = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
            _mm256_castsi256_ps(_mm256_slli_epi32::<23>(i))
        }
    }
    #[inline(always)]
    unsafe fn reduce_max(v: __m256) -> f32 {
        // SAFETY: AVX2, FMA and F16C are present (the caller's contract).
        unsafe {
            let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
            let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
            let m = _mm_max_ss(m, _mm_shuffle_ps::<1>(m, m));
            _mm_cvtss_f32(m)
        }
    }
    #[inline(always)]
    unsafe fn reduce_sum(v: __m256) -> f32 {
        // SAFETY: AVX2, FMA and F16C are present (the caller's contract).
        unsafe {
            let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_add_ss(s, _mm_shuffle_ps::<1>(s, s));
            _mm_cvtss_f32(s)
        }
    }
    #[inline(always)]
    unsafe fn bf16_halves(v: __m256) -> (__m256, __m256) {
        // SAFETY: AVX2 is present (the caller's contract).
        unsafe { halves256(v) }
    }
    #[inline(always)]
    unsafe fn pack_bf16(lo: __m256, hi: __m256) -> __m256 {
        // SAFETY: AVX2 is present (the caller's contract).
        unsafe { pack256(lo, hi) }
    }
}
