//! Row arithmetic of the linear kernels, in any [`Real`]: dot products and sums in independent
//! partial sums (so the additions do not wait on each other), sums of rows kept in registers, and
//! `axpy`; written as plain loops that the compiler vectorises for the instruction set of the
//! function they are inlined into (`chunk::spread_on_isa`).

use crate::reference::Real;

/// Independent partial sums of [`dot`] and [`sum`]: a vector's worth, so that the compiler can
/// keep them in one register and the additions do not wait on each other.
const LANES: usize = 8;

/// `a·b`, in [`LANES`] partial sums.
#[inline(always)]
pub(crate) fn dot<T: Real>(a: &[T], b: &[T]) -> T {
    let n = a.len().min(b.len());
    let mut acc = [T::zero(); LANES];
    for (x, y) in a[..n].chunks_exact(LANES).zip(b[..n].chunks_exact(LANES)) {
        for l in 0..LANES {
            acc[l] = acc[l] + x[l] * y[l];
        }
    }
    let whole = n / LANES * LANES;
    let tail = a[whole..n].iter().zip(&b[whole..n]).fold(T::zero(), |s, (&x, &y)| s + x * y);
    acc.iter().fold(tail, |s, &x| s + x)
}

/// `Σ x`, in [`LANES`] partial sums.
#[inline(always)]
pub(crate) fn sum<T: Real>(x: &[T]) -> T {
    let mut acc = [T::zero(); LANES];
    for c in x.chunks_exact(LANES) {
        for l in 0..LANES {
            acc[l] = acc[l] + c[l];
        }
    }
    let tail = x.chunks_exact(LANES).remainder().iter().fold(T::zero(), |s, &v| s + v);
    acc.iter().fold(tail, |s, &v| s + v)
}

/// Columns [`add_rows`] sums at once, kept in registers over all the rows (four AVX-512 vectors
/// of `f32`): adding each row into `acc` in memory made every row wait for the previous row's
/// stores.
const SUM_COLS: usize = 64;

/// `acc += Σ_i x_i` over the `n` rows of `x` (`[n, w]`, `w = acc.len()`).
#[inline(always)]
pub(crate) fn add_rows<T: Real>(acc: &mut [T], x: &[T], n: usize) {
    let w = acc.len();
    for (c0, part) in acc.chunks_mut(SUM_COLS).enumerate().map(|(i, a)| (i * SUM_COLS, a)) {
        let cols = c0..c0 + part.len();
        let rows = x.chunks_exact(w).take(n).map(|row| &row[cols.clone()]);
        if let Ok(part) = <&mut [T; SUM_COLS]>::try_from(&mut *part) {
            let mut sum = *part;
            for row in rows {
                sum.iter_mut().zip(row).for_each(|(a, &b)| *a = *a + b);
            }
            *part = sum;
        } else {
            for row in rows {
                part.iter_mut().zip(row).for_each(|(a, &b)| *a = *a + b);
            }
        }
    }
}

/// `acc += s·x`.
#[inline(always)]
pub(crate) fn axpy<T: Real>(acc: &mut [T], s: T, x: &[T]) {
    acc.iter_mut().zip(x).for_each(|(a, &b)| *a = *a + s * b);
}
