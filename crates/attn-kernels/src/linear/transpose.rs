//! Matrix transposes for the chunked products (a chunk's keys or values as the right operand of
//! `X·Yᵀ`, the backward's state `U`): `f32` on AVX2 or AVX-512 CPUs in 8 × 8 blocks of
//! register shuffles, the edges and other types element by element.

use super::gemm::{as_f32, as_f32_mut};
use crate::isa::Isa;
use crate::reference::Real;

/// `dst[j·ldd + i] = src[i·lds + j]` for `i < m`, `j < n`: `[m, n]` to `[n, m]`.
///
/// # Panics
/// When `src` or `dst` is shorter than the sizes and strides say.
pub(crate) fn transpose<T: Real>(isa: Isa, src: &[T], lds: usize, m: usize, n: usize, dst: &mut [T], ldd: usize) {
    if m == 0 || n == 0 {
        return;
    }
    assert!(src.len() >= (m - 1) * lds + n && dst.len() >= (n - 1) * ldd + m, "transpose operands too short");
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Portable {
        if let (Some(s), Some(d)) = (as_f32(src), as_f32_mut(dst)) {
            // SAFETY: `Isa::Avx512` and `Isa::Avx2` CPUs have AVX (`isa` is available, the
            // caller's choice); the bounds are checked above.
            unsafe { blocks_avx(s, lds, m, n, d, ldd) };
            return;
        }
    }
    let _ = isa;
    scalar(src, lds, (0..m, 0..n), dst, ldd);
}

/// The elements `rows × cols` of `src` transposed into `dst`.
fn scalar<T: Copy>(
    src: &[T],
    lds: usize,
    (rows, cols): (std::ops::Range<usize>, std::ops::Range<usize>),
    dst: &mut [T],
    ldd: usize,
) {
    for i in rows {
        for j in cols.clone() {
            dst[j * ldd + i] = src[i * lds + j];
        }
    }
}

/// [`transpose`] in 8 × 8 blocks, the edges element by element.
///
/// # Safety
/// The CPU has AVX; `src` holds `[m, n]` with stride `lds`, `dst` `[n, m]` with stride `ldd`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn blocks_avx(src: &[f32], lds: usize, m: usize, n: usize, dst: &mut [f32], ldd: usize) {
    let (m8, n8) = (m / 8 * 8, n / 8 * 8);
    for i in (0..m8).step_by(8) {
        for j in (0..n8).step_by(8) {
            // SAFETY: rows `i .. i + 8` and columns `j .. j + 8` are within both (the caller's contract).
            unsafe { block8(src.as_ptr().add(i * lds + j), lds, dst.as_mut_ptr().add(j * ldd + i), ldd) };
        }
    }
    scalar(src, lds, (0..m8, n8..n), dst, ldd);
    scalar(src, lds, (m8..m, 0..n), dst, ldd);
}

/// One 8 × 8 block: eight rows loaded, interleaved in pairs, then in fours, then halves swapped.
///
/// # Safety
/// The CPU has AVX; `s` is valid for 8 rows of 8 floats at stride `lds`, `d` likewise at `ldd`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx")]
unsafe fn block8(s: *const f32, lds: usize, d: *mut f32, ldd: usize) {
    use std::arch::x86_64::*;
    // SAFETY: the loads and stores stay within the 8 × 8 blocks (the caller's contract).
    unsafe {
        let mut r = [_mm256_setzero_ps(); 8];
        for (k, x) in r.iter_mut().enumerate() {
            *x = _mm256_loadu_ps(s.add(k * lds));
        }
        // Pairs: t[0] = a0 b0 a1 b1 | a4 b4 a5 b5, t[1] = a2 b2 a3 b3 | a6 b6 a7 b7, ...
        let mut t = [_mm256_setzero_ps(); 8];
        for p in 0..4 {
            t[2 * p] = _mm256_unpacklo_ps(r[2 * p], r[2 * p + 1]);
            t[2 * p + 1] = _mm256_unpackhi_ps(r[2 * p], r[2 * p + 1]);
        }
        // Fours: q[c] holds column c of rows 0–3 (low half) and column c + 4 (high half); q[4 + c]
        // the same for rows 4–7.
        let mut q = [_mm256_setzero_ps(); 8];
        for h in 0..2 {
            let (x, y) = (4 * h, 4 * h + 2);
            q[4 * h] = _mm256_shuffle_ps::<0x44>(t[x], t[y]);
            q[4 * h + 1] = _mm256_shuffle_ps::<0xEE>(t[x], t[y]);
            q[4 * h + 2] = _mm256_shuffle_ps::<0x44>(t[x + 1], t[y + 1]);
            q[4 * h + 3] = _mm256_shuffle_ps::<0xEE>(t[x + 1], t[y + 1]);
        }
        for c in 0..4 {
            _mm256_storeu_ps(d.add(c * ldd), _mm256_permute2f128_ps::<0x20>(q[c], q[4 + c]));
            _mm256_storeu_ps(d.add((c + 4) * ldd), _mm256_permute2f128_ps::<0x31>(q[c], q[4 + c]));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_isa_matches_the_definition_at_block_edges() {
        for isa in [Isa::Avx512, Isa::Avx2, Isa::Portable].into_iter().filter(|i| i.is_available()) {
            for (m, n) in [(1, 1), (8, 8), (9, 17), (64, 64), (7, 40), (33, 5)] {
                let (lds, ldd) = (n + 3, m + 2);
                let src: Vec<f32> = (0..m * lds).map(|x| x as f32).collect();
                let mut dst = vec![-1.0f32; n * ldd];
                transpose(isa, &src, lds, m, n, &mut dst, ldd);
                for i in 0..m {
                    for j in 0..n {
                        assert_eq!(dst[j * ldd + i], src[i * lds + j], "{isa:?} {m}x{n} at ({i}, {j})");
                    }
                }
                // The padding between rows is left alone.
                assert!((0..n).all(|j| dst[j * ldd + m..j * ldd + ldd].iter().all(|&x| x == -1.0)));
            }
        }
    }
}
