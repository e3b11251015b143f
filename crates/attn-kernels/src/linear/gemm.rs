//! The small dense products the chunked linear-attention kernels are made of, `O += A·B` with `A`
//! read either row-major (`[m, k]`) or transposed (`[k, m]`), in plain loops over fixed-size
//! register blocks (4 rows × 32 columns) that the compiler vectorises. The same body is compiled
//! three times: for AVX-512F and for AVX2+FMA (entered through `#[target_feature]` functions after
//! [`Isa::is_available`]), with fused multiply-adds, and portably, without them.

use crate::isa::Isa;
use crate::reference::Real;

/// Rows of `O` per register block.
const R: usize = 4;
/// Columns of `O` per register block.
const W: usize = 32;
/// Products per pass over `B` (its rows kept in cache across the row blocks of `O`).
const KB: usize = 256;

/// How `A` is laid out: element `(i, p)` of the `m × k` operand is at `a[i·row + p·col]`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Lhs<'a, T> {
    pub a: &'a [T],
    pub row: usize,
    pub col: usize,
}

impl<'a, T> Lhs<'a, T> {
    /// `A` row-major with leading dimension `ld`.
    pub fn rows(a: &'a [T], ld: usize) -> Self {
        Self { a, row: ld, col: 1 }
    }

    /// `Aᵀ` stored row-major with leading dimension `ld` (so `A` is read column by column).
    pub fn transposed(a: &'a [T], ld: usize) -> Self {
        Self { a, row: 1, col: ld }
    }
}

/// `o[i·ldo + c] += Σ_{p<k} A(i, p) · b[p·ldb + c]` for `i < m`, `c < n`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm<T: Real>(
    isa: Isa,
    m: usize,
    n: usize,
    k: usize,
    a: Lhs<T>,
    b: &[T],
    ldb: usize,
    o: &mut [T],
    ldo: usize,
) {
    if m == 0 || n == 0 || k == 0 {
        return;
    }
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the caller chose `isa` among the available ones (`Isa::is_available`).
        Isa::Avx512 => unsafe { gemm_avx512(m, n, k, a, b, ldb, o, ldo) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Isa::Avx2 => unsafe { gemm_avx2(m, n, k, a, b, ldb, o, ldo) },
        _ => body::<T, false>(m, n, k, a, b, ldb, o, ldo),
    }
}

/// [`body`] compiled for AVX-512F.
///
/// # Safety
/// The CPU has AVX-512F and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_avx512<T: Real>(m: usize, n: usize, k: usize, a: Lhs<T>, b: &[T], ldb: usize, o: &mut [T], ldo: usize) {
    body::<T, true>(m, n, k, a, b, ldb, o, ldo)
}

/// [`body`] compiled for AVX2 with FMA.
///
/// # Safety
/// The CPU has AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_avx2<T: Real>(m: usize, n: usize, k: usize, a: Lhs<T>, b: &[T], ldb: usize, o: &mut [T], ldo: usize) {
    body::<T, true>(m, n, k, a, b, ldb, o, ldo)
}

/// `a·b + c`, fused when `FMA` (only instantiated where the CPU has it: otherwise `mul_add` would
/// be a library call).
#[inline(always)]
fn mac<T: Real, const FMA: bool>(a: T, b: T, c: T) -> T {
    if FMA {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn body<T: Real, const FMA: bool>(
    m: usize,
    n: usize,
    k: usize,
    a: Lhs<T>,
    b: &[T],
    ldb: usize,
    o: &mut [T],
    ldo: usize,
) {
    // Slices of `KB` products: a slice of `B` (`KB` rows) stays in cache while every row block of
    // `O` passes over it.
    for p0 in (0..k).step_by(KB) {
        let kk = KB.min(k - p0);
        let a = Lhs { a: &a.a[p0 * a.col..], ..a };
        let b = &b[p0 * ldb..];
        let mut i = 0;
        while i + R <= m {
            block::<T, FMA, R>(i, n, kk, a, b, ldb, o, ldo);
            i += R;
        }
        while i < m {
            block::<T, FMA, 1>(i, n, kk, a, b, ldb, o, ldo);
            i += 1;
        }
    }
}

/// Rows `i0..i0 + RB` of `O`: full `W`-wide column blocks in registers, then the remaining
/// columns one at a time.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn block<T: Real, const FMA: bool, const RB: usize>(
    i0: usize,
    n: usize,
    k: usize,
    a: Lhs<T>,
    b: &[T],
    ldb: usize,
    o: &mut [T],
    ldo: usize,
) {
    let mut c = 0;
    while c + W <= n {
        let mut acc = [[T::zero(); W]; RB];
        for (r, x) in acc.iter_mut().enumerate() {
            x.copy_from_slice(&o[(i0 + r) * ldo + c..][..W]);
        }
        // Every index the loop below reads, checked once here.
        assert!(b.len() >= (k - 1) * ldb + c + W && a.a.len() > (i0 + RB - 1) * a.row + (k - 1) * a.col);
        for p in 0..k {
            // SAFETY: `p < k` and `c + W <= n`, within the bounds asserted above.
            let bv: &[T; W] = unsafe { &*b.as_ptr().add(p * ldb + c).cast::<[T; W]>() };
            for (r, x) in acc.iter_mut().enumerate() {
                // SAFETY: `r < RB` and `p < k`, within the bounds asserted above.
                let s = unsafe { *a.a.get_unchecked((i0 + r) * a.row + p * a.col) };
                for l in 0..W {
                    x[l] = mac::<T, FMA>(s, bv[l], x[l]);
                }
            }
        }
        for (r, x) in acc.iter().enumerate() {
            o[(i0 + r) * ldo + c..][..W].copy_from_slice(x);
        }
        c += W;
    }
    if c < n {
        for r in 0..RB {
            let row = &mut o[(i0 + r) * ldo..][c..n];
            for p in 0..k {
                let s = a.a[(i0 + r) * a.row + p * a.col];
                for (x, &y) in row.iter_mut().zip(&b[p * ldb + c..p * ldb + n]) {
                    *x = mac::<T, FMA>(s, y, *x);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(m: usize, n: usize, k: usize, a: &[f64], row: usize, col: usize, b: &[f64]) -> Vec<f64> {
        let mut o = vec![0.5; m * n];
        for i in 0..m {
            for c in 0..n {
                o[i * n + c] += (0..k).map(|p| a[i * row + p * col] * b[p * n + c]).sum::<f64>();
            }
        }
        o
    }

    #[test]
    fn every_isa_and_layout_matches_the_naive_product() {
        for isa in [Isa::Avx512, Isa::Avx2, Isa::Portable].into_iter().filter(|i| i.is_available()) {
            for (m, n, k) in [(1, 1, 1), (5, 33, 7), (8, 64, 64), (9, 65, 3), (4, 31, 2), (6, 40, 600)] {
                let a: Vec<f64> = (0..m * k).map(|x| (x as f64 * 0.37).sin()).collect();
                let b: Vec<f64> = (0..k * n).map(|x| (x as f64 * 0.11).cos()).collect();
                for (row, col, lhs) in [(k, 1, Lhs::rows(&a, k)), (1, m, Lhs::transposed(&a, m))] {
                    let mut o = vec![0.5; m * n];
                    gemm(isa, m, n, k, lhs, &b, n, &mut o, n);
                    let want = naive(m, n, k, &a, row, col, &b);
                    let err = o.iter().zip(&want).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
                    assert!(err < 1e-12, "{isa:?} {m}x{n}x{k} row {row}: {err}");
                }
            }
        }
    }
}
