//! Matrix transposes for the chunked products (a chunk's keys or values as the right operand of
//! `X·Yᵀ`, the backward's state `U`): `f32` on AVX2 or AVX-512 CPUs in 8 × 8 blocks of
//! register shuffles, the edges and other types element by element.

use super::gemm::{as_f32, as_f32_mut};
use crate::reference::Real;
#[cfg(target_arch = "x86_64")]
use crate::simd::transpose_blocks8;
use crate::simd::Isa;

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
            let (m8, n8) = (m / 8 * 8, n / 8 * 8);
            // SAFETY: `Isa::Avx512` and `Isa::Avx2` CPUs have AVX (`isa` is available, the
            // caller's choice); the bounds are checked above.
            unsafe { transpose_blocks8(s, lds, m8, n8, d, ldd) };
            scalar(src, lds, (0..m8, n8..n), dst, ldd);
            scalar(src, lds, (m8..m, 0..n), dst, ldd);
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
