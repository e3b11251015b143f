//! The small dense products the chunked linear-attention kernels are made of, `O += A·B` (or
//! `O = A·B`, [`Lhs::write`]: no clearing pass before it) with `A` read either row-major (`[m, k]`)
//! or transposed (`[k, m]`), where `A` may be triangular (its zeros skipped) or only the lower
//! triangle of `O` wanted ([`Part`]). `f32` on AVX-512F or AVX2 runs the vector micro-kernel
//! (`micro`: 6 rows × up to 64 columns in registers); `f64` and the portable path run plain loops over 4 × 32 register blocks that the compiler vectorises.

use std::any::TypeId;

use super::micro::{gemm_f32, Span};
use crate::reference::Real;
use crate::simd::{Isa, Simd, SimdJob, Target};

/// Rows of `O` per register block.
const R: usize = 4;
/// Columns of `O` per register block.
const W: usize = 32;
/// Products per pass over `B` (its rows kept in cache across the row blocks of `O`).
const KB: usize = 256;

/// Which part of `O += A·B` a call needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Part {
    /// All of it.
    Full,
    /// `A` is lower triangular (`A(i, p) = 0` for `p > i`): row `i` sums over `p ≤ i` only.
    LowerA,
    /// `A` is upper triangular (`A(i, p) = 0` for `p < i`): row `i` sums over `p ≥ i` only.
    UpperA,
    /// Only the columns `c ≤ i` of row `i` are wanted: others up to the block's last row (rounded
    /// up to a vector) may be computed too, and the caller clears them.
    LowerOut,
}

impl Part {
    /// The span of the `rows` rows from `i`, of an `m × n` product over `k`, columns rounded up to
    /// multiples of `lanes` where [`Part::LowerOut`] cuts them.
    fn span(self, i: usize, rows: usize, k: usize, n: usize, lanes: usize) -> Span {
        match self {
            Part::Full => Span { lo: 0, hi: k, n },
            Part::LowerA => Span { lo: 0, hi: k.min(i + rows), n },
            Part::UpperA => Span { lo: i.min(k), hi: k, n },
            Part::LowerOut => Span { lo: 0, hi: k, n: n.min((i + rows).div_ceil(lanes) * lanes) },
        }
    }
}

/// How `A` is laid out: element `(i, p)` of the `m × k` operand is at `a[i·row + p·col]`; which
/// [`Part`] of the product is needed; and whether it is added to `O` or written over it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Lhs<'a, T> {
    pub a: &'a [T],
    pub row: usize,
    pub col: usize,
    pub part: Part,
    /// `O = A·B` rather than `O += A·B`: what `O` held is never read (the entries of the part
    /// computed are all written; those [`Part::LowerOut`] leaves out stay as they were).
    pub write: bool,
}

impl<'a, T> Lhs<'a, T> {
    /// `A` row-major with leading dimension `ld`.
    pub fn rows(a: &'a [T], ld: usize) -> Self {
        Self { a, row: ld, col: 1, part: Part::Full, write: false }
    }

    /// `Aᵀ` stored row-major with leading dimension `ld` (so `A` is read column by column).
    pub fn transposed(a: &'a [T], ld: usize) -> Self {
        Self { a, row: 1, col: ld, part: Part::Full, write: false }
    }

    /// The same operand, with only `part` of the product needed.
    pub fn part(self, part: Part) -> Self {
        Self { part, ..self }
    }

    /// The same operand, the product written over `O` (`write`) or added to it: a product that
    /// starts a result needs no zero fill before it.
    pub fn write(self, write: bool) -> Self {
        Self { write, ..self }
    }
}

/// `o[i·ldo + c] += Σ_{p<k} A(i, p) · b[p·ldb + c]` for `i < m`, `c < n` (within `a.part`; `=`
/// with [`Lhs::write`]).
///
/// # Panics
/// When an operand is shorter than the sizes and strides say.
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
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if a.write {
            o.chunks_mut(ldo).take(m).for_each(|row| row[..n].fill(T::zero()));
        }
        return;
    }
    // Every index the kernels read or write, checked once here.
    assert!(a.a.len() > (m - 1) * a.row + (k - 1) * a.col, "A too short");
    assert!(b.len() >= (k - 1) * ldb + n && o.len() >= (m - 1) * ldo + n, "B or O too short");
    Target::new(isa).run(Gemm { m, n, k, a, b, ldb, o, ldo });
}

/// [`gemm`]'s operands (checked) as a job: `f32` on a vector instruction set runs the micro-kernel
/// ([`f32_body`]: 6 rows × `S::PV_VECTORS` vectors per tile, 24 accumulators of AVX-512's 32
/// registers, 12 of the 16 of AVX2), everything else [`body`]'s loops, compiled for the
/// instruction set.
struct Gemm<'a, T> {
    m: usize,
    n: usize,
    k: usize,
    a: Lhs<'a, T>,
    b: &'a [T],
    ldb: usize,
    o: &'a mut [T],
    ldo: usize,
}

impl<T: Real> SimdJob for Gemm<'_, T> {
    type Out = ();

    #[inline(always)]
    unsafe fn run<S: Simd>(self) {
        let Gemm { m, n, k, a, b, ldb, o, ldo } = self;
        // A branch on the constant: the portable instance has neither fused multiply-adds nor
        // the micro-kernel.
        if !S::FMA {
            return body::<T, false>(m, n, k, a, b, ldb, o, ldo);
        }
        if let (Some(a32), Some(b32), Some(o32)) = (as_f32(a.a), as_f32(b), as_f32_mut(o)) {
            let a32 = Lhs { a: a32, row: a.row, col: a.col, part: a.part, write: a.write };
            // SAFETY: the CPU has `S` (the caller's contract); `gemm` checked the bounds.
            return unsafe {
                match S::PV_VECTORS {
                    4 => f32_body::<S, 6, 4>(m, n, k, a32, b32, ldb, o32, ldo),
                    _ => f32_body::<S, 6, 2>(m, n, k, a32, b32, ldb, o32, ldo),
                }
            };
        }
        body::<T, true>(m, n, k, a, b, ldb, o, ldo)
    }
}

/// The `f32` micro-kernel on `S`, `RB` rows × `NV` vectors per tile, in passes of [`KB`] products.
///
/// # Safety
/// The CPU has `S`'s instruction set; the operands hold the sizes (as [`gemm`] checks).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn f32_body<S: Simd, const RB: usize, const NV: usize>(
    m: usize,
    n: usize,
    k: usize,
    a: Lhs<f32>,
    b: &[f32],
    ldb: usize,
    o: &mut [f32],
    ldo: usize,
) {
    let span = |i, rows| a.part.span(i, rows, k, n, S::W);
    for p0 in (0..k).step_by(KB) {
        let (ap, bp, op) = ((a.a.as_ptr(), a.row, a.col), (b.as_ptr(), ldb), (o.as_mut_ptr(), ldo));
        // SAFETY: forwarded from the caller; the spans stay within `m × n × k`.
        unsafe { gemm_f32::<S, RB, NV>(m, (p0, KB.min(k - p0)), span, a.write, ap, bp, op) };
    }
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
        let mut i = 0;
        while i < m {
            let rows = R.min(m - i);
            let s = a.part.span(i, rows, k, n, 1);
            let (lo, hi) = (s.lo.max(p0), s.hi.min(p0 + KB));
            // Written in the first pass (the rows it has no product for cleared), added after.
            let write = a.write && p0 == 0;
            if lo < hi {
                let (a, b) = (Lhs { a: &a.a[lo * a.col..], write, ..a }, &b[lo * ldb..]);
                if rows == R {
                    block::<T, FMA, R>(i, s.n, hi - lo, a, b, ldb, o, ldo);
                } else {
                    (i..m).for_each(|r| block::<T, FMA, 1>(r, s.n, hi - lo, a, b, ldb, o, ldo));
                }
            } else if write {
                o[i * ldo..].chunks_mut(ldo).take(rows).for_each(|row| row[..s.n].fill(T::zero()));
            }
            i += rows;
        }
    }
}

/// Rows `i0..i0 + RB` of `O`: full `W`-wide column blocks in registers, then the remaining
/// columns one at a time (added to `O`, or written over it with `a.write`).
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
        if !a.write {
            for (r, x) in acc.iter_mut().enumerate() {
                x.copy_from_slice(&o[(i0 + r) * ldo + c..][..W]);
            }
        }
        // Every index the loop below reads, checked once here.
        assert!(b.len() >= (k - 1) * ldb + c + W && a.a.len() > (i0 + RB - 1) * a.row + (k - 1) * a.col);
        for p in 0..k {
            crate::prefetch::one();
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
            if a.write {
                row.fill(T::zero());
            }
            for p in 0..k {
                let s = a.a[(i0 + r) * a.row + p * a.col];
                for (x, &y) in row.iter_mut().zip(&b[p * ldb + c..p * ldb + n]) {
                    *x = mac::<T, FMA>(s, y, *x);
                }
            }
        }
    }
}

/// `x` as `f32` when `T` is `f32`.
pub(crate) fn as_f32<T: Real>(x: &[T]) -> Option<&[f32]> {
    cast::<T, f32>(x)
}

/// `x` as `[U]` when `T` is `U`.
pub(crate) fn cast<T: 'static, U: 'static>(x: &[T]) -> Option<&[U]> {
    // SAFETY: `T` is `U` (same type id), so the slice's memory holds `U` values.
    (TypeId::of::<T>() == TypeId::of::<U>()).then(|| unsafe { std::slice::from_raw_parts(x.as_ptr().cast(), x.len()) })
}

/// `x` as `f32` when `T` is `f32`.
pub(crate) fn as_f32_mut<T: Real>(x: &mut [T]) -> Option<&mut [f32]> {
    // SAFETY: as in `as_f32`.
    (TypeId::of::<T>() == TypeId::of::<f32>())
        .then(|| unsafe { std::slice::from_raw_parts_mut(x.as_mut_ptr().cast(), x.len()) })
}

#[cfg(test)]
mod tests;
