//! The bfloat16 pair operations of the x86 implementations ([`super::Simd::bf16_halves`],
//! [`super::Simd::pack_bf16`]) on 16 lanes (AVX-512F) and 8 lanes (AVX2): integer shifts and masks
//! on each lane's bits, rounding to nearest with ties to even as `half::bf16::from_f32` does, NaN
//! kept a (quiet) NaN. Called only from the implementations in `x86`, whose callers guarantee the
//! instruction set.

use std::arch::x86_64::*;

/// The high half of each lane's bits.
const HIGH: i32 = 0xFFFF_0000u32 as i32;
/// The quiet bit of an f32 NaN.
const QUIET: i32 = 0x0040_0000;

/// `(low half, high half)` of each of 16 lanes as bfloat16 widened to f32.
///
/// # Safety
/// The CPU has AVX-512F.
#[inline(always)]
pub unsafe fn halves512(v: __m512) -> (__m512, __m512) {
    // SAFETY: AVX-512F is present (the caller's contract).
    unsafe {
        let i = _mm512_castps_si512(v);
        let lo = _mm512_slli_epi32::<16>(i);
        let hi = _mm512_and_si512(i, _mm512_set1_epi32(HIGH));
        (_mm512_castsi512_ps(lo), _mm512_castsi512_ps(hi))
    }
}

/// 16 lanes of f32 rounded to bfloat16, left in the high half of each lane (low half unspecified).
///
/// # Safety
/// The CPU has AVX-512F.
#[inline(always)]
unsafe fn round512(x: __m512) -> __m512i {
    // SAFETY: AVX-512F is present (the caller's contract).
    unsafe {
        let i = _mm512_castps_si512(x);
        let odd = _mm512_and_si512(_mm512_srli_epi32::<16>(i), _mm512_set1_epi32(1));
        let rounded = _mm512_add_epi32(_mm512_add_epi32(i, _mm512_set1_epi32(0x7FFF)), odd);
        let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x);
        _mm512_mask_blend_epi32(nan, rounded, _mm512_or_si512(i, _mm512_set1_epi32(QUIET)))
    }
}

/// `lo` and `hi` rounded to bfloat16 and paired, `lo` in the low half of each of 16 lanes.
///
/// # Safety
/// The CPU has AVX-512F.
#[inline(always)]
pub unsafe fn pack512(lo: __m512, hi: __m512) -> __m512 {
    // SAFETY: AVX-512F is present (the caller's contract).
    unsafe {
        let l = _mm512_srli_epi32::<16>(round512(lo));
        let h = _mm512_and_si512(round512(hi), _mm512_set1_epi32(HIGH));
        _mm512_castsi512_ps(_mm512_or_si512(l, h))
    }
}

/// `(low half, high half)` of each of 8 lanes as bfloat16 widened to f32.
///
/// # Safety
/// The CPU has AVX2.
#[inline(always)]
pub unsafe fn halves256(v: __m256) -> (__m256, __m256) {
    // SAFETY: AVX2 is present (the caller's contract).
    unsafe {
        let i = _mm256_castps_si256(v);
        let lo = _mm256_slli_epi32::<16>(i);
        let hi = _mm256_and_si256(i, _mm256_set1_epi32(HIGH));
        (_mm256_castsi256_ps(lo), _mm256_castsi256_ps(hi))
    }
}

/// 8 lanes of f32 rounded to bfloat16, left in the high half of each lane (low half unspecified).
///
/// # Safety
/// The CPU has AVX2.
#[inline(always)]
unsafe fn round256(x: __m256) -> __m256i {
    // SAFETY: AVX2 is present (the caller's contract).
    unsafe {
        let i = _mm256_castps_si256(x);
        let odd = _mm256_and_si256(_mm256_srli_epi32::<16>(i), _mm256_set1_epi32(1));
        let rounded = _mm256_add_epi32(_mm256_add_epi32(i, _mm256_set1_epi32(0x7FFF)), odd);
        let nan = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_UNORD_Q>(x, x));
        let quiet = _mm256_or_si256(i, _mm256_set1_epi32(QUIET));
        _mm256_blendv_epi8(rounded, quiet, nan)
    }
}

/// `lo` and `hi` rounded to bfloat16 and paired, `lo` in the low half of each of 8 lanes.
///
/// # Safety
/// The CPU has AVX2.
#[inline(always)]
pub unsafe fn pack256(lo: __m256, hi: __m256) -> __m256 {
    // SAFETY: AVX2 is present (the caller's contract).
    unsafe {
        let l = _mm256_srli_epi32::<16>(round256(lo));
        let h = _mm256_and_si256(round256(hi), _mm256_set1_epi32(HIGH));
        _mm256_castsi256_ps(_mm256_or_si256(l, h))
    }
}

#[cfg(test)]
mod tests {
    use crate::simd::Isa;
    use crate::simd::{Avx2, Avx512, Avx512Bf16, Portable, Simd};

    /// Inputs for rounding: ties (to even, both ways), the largest finite value and what rounds up
    /// to +∞, ±0, ±∞, quiet and signalling NaN, subnormals, and a spread of ordinary values.
    fn inputs() -> Vec<f32> {
        let bits = [
            0x3F80_8000u32,
            0x3F81_8000,
            0x7F7F_FFFF,
            0x7F7F_8000,
            0x8000_0000,
            0x7F80_0001,
            0x7FC0_0000,
            0x0000_8001,
            0xFF80_0000,
        ];
        let special = bits.map(f32::from_bits).into_iter().chain([0.0, f32::INFINITY, -1.5e-40, 3.0e38]);
        let spread = (0..2000).map(|i| ((i as f32) * 0.7311).sin() * 10f32.powi(i % 9 - 4));
        special
            .chain(spread)
            .collect::<Vec<_>>()
            .chunks(16)
            .flat_map(|c| {
                let mut v = c.to_vec();
                v.resize(16, 1.0);
                v
            })
            .collect()
    }

    /// `pack_bf16` of the inputs (as `lo`) and of them reversed (as `hi`), and `bf16_halves` of
    /// the result, each as bits in input order.
    ///
    /// # Safety
    /// The CPU has `S`'s instruction set.
    unsafe fn round_trip<S: Simd>() -> [Vec<u32>; 3] {
        let (x, rev): (Vec<f32>, Vec<f32>) = (inputs(), inputs().into_iter().rev().collect());
        let mut out = [Vec::new(), Vec::new(), Vec::new()];
        let mut buf = [[0.0f32; 16]; 3];
        for (a, b) in x.chunks_exact(S::W).zip(rev.chunks_exact(S::W)) {
            // SAFETY: the chunks and buffers hold `S::W` floats; the caller runs on `S`'s CPU.
            unsafe {
                let p = S::pack_bf16(S::load(a.as_ptr()), S::load(b.as_ptr()));
                let (lo, hi) = S::bf16_halves(p);
                S::store(buf[0].as_mut_ptr(), p);
                S::store(buf[1].as_mut_ptr(), lo);
                S::store(buf[2].as_mut_ptr(), hi);
            }
            for (o, r) in out.iter_mut().zip(&buf) {
                o.extend(r[..S::W].iter().map(|x| x.to_bits()));
            }
        }
        out
    }

    #[test]
    fn scalar_rounding_is_halfs() {
        use crate::simd::KvElem;
        for x in inputs() {
            assert_eq!(x.bf16_bits(), half::bf16::from_f32(x).to_bits(), "{x:e} ({:#010x})", x.to_bits());
        }
    }

    #[test]
    fn vector_pairs_round_as_half_does() {
        // SAFETY: the portable implementation runs on any CPU.
        let portable = unsafe { round_trip::<Portable>() };
        let lo: Vec<u32> = inputs().iter().map(|&x| u32::from(half::bf16::from_f32(x).to_bits())).collect();
        assert_eq!(
            portable[0].iter().map(|w| w & 0xFFFF).collect::<Vec<_>>(),
            lo,
            "portable pairs are not half's rounding"
        );
        assert_eq!(portable[1], lo.iter().map(|w| w << 16).collect::<Vec<_>>(), "portable low halves");
        if Isa::Avx2.is_available() {
            // SAFETY: AVX2 is present (checked).
            let avx2 = unsafe { round_trip::<Avx2>() };
            assert_eq!(avx2, portable, "AVX2 bfloat16 pairs differ from half's rounding");
        }
        if Isa::Avx512.is_available() {
            // SAFETY: AVX-512F is present (checked).
            let avx512 = unsafe { round_trip::<Avx512>() };
            assert_eq!(avx512, portable, "AVX-512 bfloat16 pairs differ from half's rounding");
        }
    }

    #[test]
    #[cfg_attr(attn_lacks_avx512_bf16, ignore = "this CPU lacks AVX-512F with AVX512-BF16")]
    fn native_dot_matches_the_emulation() {
        assert!(Isa::has_avx512_bf16(), "this CPU lacks AVX512-BF16");
        let x: Vec<f32> =
            inputs().into_iter().filter(|x| x.is_finite() && x.abs() <= 10.0 && x.abs() >= 1e-2).collect();
        for c in x.chunks_exact(64) {
            let (mut native, mut emulated) = ([0.0f32; 16], [0.0f32; 16]);
            // SAFETY: AVX-512F and AVX512-BF16 are present (checked); each chunk holds 64 floats.
            unsafe {
                let v = |i: usize| {
                    <Avx512>::pack_bf16(<Avx512>::load(c.as_ptr().add(i)), <Avx512>::load(c.as_ptr().add(i + 16)))
                };
                let (a, b, acc) = (v(0), v(32), <Avx512>::load(c.as_ptr().add(16)));
                <Avx512>::store(native.as_mut_ptr(), Avx512Bf16::dot_bf16(acc, a, b));
                <Avx512>::store(emulated.as_mut_ptr(), <Avx512>::dot_bf16(acc, a, b));
            }
            for (n, e) in native.iter().zip(&emulated) {
                // Two products of at most 100 each and `|acc| <= 10`: a few roundings of that size.
                assert!((n - e).abs() <= 4.0 * f32::EPSILON * 210.0, "VDPBF16PS {n}, emulated {e}");
            }
        }
    }
}
