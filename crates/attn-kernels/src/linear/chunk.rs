//! What the chunked forward and backward share: one head's inputs ([`Keys`]), the masked product
//! of a chunk with itself ([`tril_products`]), and the small vector helpers around the states.

use super::gemm::{gemm, Lhs};
use crate::isa::Isa;
use crate::reference::Real;

/// One key/value head as a query head reads it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Keys<'a, T> {
    /// `φ(K): [Lk, F]`, zero on rows at or beyond `valid`.
    pub fk: &'a [T],
    /// `V` from its first row, row stride `ldv`.
    pub v: &'a [T],
    pub ldv: usize,
    /// Keys of this batch entry that count.
    pub valid: usize,
}

/// `out[i·ldo + j] = a_i·b_j` for `j ≤ i` and `j < nk`, 0 for the other `j < n`: the causal product
/// of `n` rows of `a` (stride `lda`) with the chunk's first `nk` rows of `b` (stride `ldb`), all of
/// width `w`. `bt` is scratch (resized to `w·nk`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn tril_products<T: Real>(
    isa: Isa,
    n: usize,
    nk: usize,
    w: usize,
    a: &[T],
    lda: usize,
    b: &[T],
    ldb: usize,
    bt: &mut Vec<T>,
    out: &mut [T],
    ldo: usize,
) {
    bt.clear();
    bt.resize(w * nk, T::zero());
    for j in 0..nk {
        for (c, &x) in b[j * ldb..j * ldb + w].iter().enumerate() {
            bt[c * nk + j] = x;
        }
    }
    for row in out.chunks_mut(ldo).take(n) {
        row[..n].iter_mut().for_each(|x| *x = T::zero());
    }
    gemm(isa, n, nk, w, Lhs::rows(a, lda), bt, nk, out, ldo);
    for (i, row) in out.chunks_mut(ldo).take(n).enumerate() {
        row[i + 1..n].iter_mut().for_each(|x| *x = T::zero());
    }
}

/// `a·b`.
#[inline]
pub(crate) fn dot<T: Real>(a: &[T], b: &[T]) -> T {
    a.iter().zip(b).fold(T::zero(), |s, (&x, &y)| s + x * y)
}

/// `acc += Σ_i x_i` over the `n` rows of `x` (`[n, w]`, `w = acc.len()`).
pub(crate) fn add_rows<T: Real>(acc: &mut [T], x: &[T], n: usize) {
    for row in x.chunks_exact(acc.len()).take(n) {
        acc.iter_mut().zip(row).for_each(|(a, &b)| *a = *a + b);
    }
}

/// `acc += s·x`.
pub(crate) fn axpy<T: Real>(acc: &mut [T], s: T, x: &[T]) {
    acc.iter_mut().zip(x).for_each(|(a, &b)| *a = *a + s * b);
}
