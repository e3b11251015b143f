//! The `f32` register-blocked micro-kernel of [`gemm`](super::gemm::gemm), written over the SIMD
//! layer ([`Simd`]): a tile of `O` of `RB` rows × up to `NV` vectors stays in
//! registers while the products run over `k` (each step one load per vector of `B`, one broadcast
//! of `A` per row: on AVX-512F 6 rows × 4 vectors, 24 fused multiply-adds for 10 loads; on AVX2
//! 6 × 2), then the next tile; the rows left over go in a block of 4, then one at a time, and the
//! columns left over after whole vectors through scalar fused multiply-adds. Six rows rather than
//! four, where four rows left the loads the limit (see docs/performance-log.md,
//! "attn-kernels/src/linear/micro.rs: module doc").

use crate::simd::Simd;

/// Rows of the block that takes what is left after the tiles of `RB` rows.
const R: usize = 4;

/// The products `lo .. hi` and the columns `0 .. n` one block of rows computes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Span {
    pub lo: usize,
    pub hi: usize,
    pub n: usize,
}

/// `O[i, c] += Σ_p A(i, p)·B[p, c]` over the rows of `spans` (`span(i0, rows)` gives, for a block of
/// rows, the range of `p` and the number of columns it needs), for `p` in `p0 .. p0 + kb`; with
/// `write` and `p0 = 0`, `=` (a block of rows without products in this pass cleared).
/// `A(i, p) = a[i·ar + p·ac]`, `B[p, c] = b[p·ldb + c]`, `O[i, c] = o[i·ldo + c]`. At most `NV`
/// vectors and `RB` rows per tile (so that `RB·NV` accumulators, `NV` operands and a broadcast fit
/// in the registers).
///
/// # Safety
/// The CPU has `S`'s instruction set; every index reached (`i < m`, `p < p0 + kb` within the
/// spans, `c <` the span's columns) is within `a`, `b` and `o`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn gemm_f32<S: Simd, const RB: usize, const NV: usize>(
    m: usize,
    (p0, kb): (usize, usize),
    span: impl Fn(usize, usize) -> Span,
    write: bool,
    (a, ar, ac): (*const f32, usize, usize),
    (b, ldb): (*const f32, usize),
    (o, ldo): (*mut f32, usize),
) {
    let mut i = 0;
    while i < m {
        let rows = [RB, R].into_iter().find(|&r| r <= m - i).unwrap_or(1);
        let s = span(i, rows);
        let (lo, hi) = (s.lo.max(p0), s.hi.min(p0 + kb));
        let write = write && p0 == 0;
        if lo < hi {
            // SAFETY: the rows `i .. i + rows`, products `lo .. hi` and columns `< s.n` are within
            // the operands (the caller's contract).
            unsafe {
                let (a, b, o) = (a.add(i * ar + lo * ac), b.add(lo * ldb), o.add(i * ldo));
                let op = Op { a, ar, ac, b, ldb, o, ldo, k: hi - lo, write };
                if rows == RB {
                    row_block::<S, RB, NV>(op, s.n);
                } else if rows == R {
                    row_block::<S, R, NV>(op, s.n);
                } else {
                    row_block::<S, 1, NV>(op, s.n);
                }
            }
        } else if write {
            for r in i..i + rows {
                // SAFETY: row `r < m` and its first `s.n` columns are within `o` (the caller's
                // contract).
                unsafe { std::ptr::write_bytes(o.add(r * ldo), 0, s.n) };
            }
        }
        i += rows;
    }
}

/// One block of `RB` rows and `k` products, pointers at its first row and product; `write`:
/// `O = A·B` rather than `+=`.
#[derive(Clone, Copy)]
struct Op {
    a: *const f32,
    ar: usize,
    ac: usize,
    b: *const f32,
    ldb: usize,
    o: *mut f32,
    ldo: usize,
    k: usize,
    write: bool,
}

/// The `n` columns of one block of `RB` rows: tiles of up to `NV` vectors, then scalars.
///
/// # Safety
/// As for [`gemm_f32`], for this block.
#[inline(always)]
unsafe fn row_block<S: Simd, const RB: usize, const NV: usize>(op: Op, n: usize) {
    let mut c = 0;
    // SAFETY: every tile covers columns `c .. c + v·W <= n` (the caller's contract).
    unsafe {
        while c + S::W <= n {
            let v = ((n - c) / S::W).min(NV);
            let op = Op { b: op.b.add(c), o: op.o.add(c), ..op };
            match v {
                4 => tile::<S, RB, 4>(op),
                3 => tile::<S, RB, 3>(op),
                2 => tile::<S, RB, 2>(op),
                _ => tile::<S, RB, 1>(op),
            }
            c += v * S::W;
        }
        for r in 0..RB {
            if op.write {
                std::ptr::write_bytes(op.o.add(r * op.ldo + c), 0, n - c);
            }
            for p in 0..op.k {
                let s = *op.a.add(r * op.ar + p * op.ac);
                for j in c..n {
                    let x = op.o.add(r * op.ldo + j);
                    *x = s.mul_add(*op.b.add(p * op.ldb + j), *x);
                }
            }
        }
    }
}

/// `RB` rows × `V` vectors of `O`, accumulated in registers over the `k` products.
///
/// # Safety
/// As for [`gemm_f32`], for this tile.
#[inline(always)]
unsafe fn tile<S: Simd, const RB: usize, const V: usize>(op: Op) {
    // SAFETY: the tile's rows, products and `V·W` columns are within the operands (the caller's
    // contract); the CPU has `S`'s instruction set.
    unsafe {
        let mut acc = [[S::splat(0.0); V]; RB];
        if !op.write {
            for (r, row) in acc.iter_mut().enumerate() {
                for (v, x) in row.iter_mut().enumerate() {
                    *x = S::load(op.o.add(r * op.ldo + v * S::W));
                }
            }
        }
        for p in 0..op.k {
            crate::prefetch::one();
            let bp = op.b.add(p * op.ldb);
            let mut bv = [S::splat(0.0); V];
            for (v, x) in bv.iter_mut().enumerate() {
                *x = S::load(bp.add(v * S::W));
            }
            for (r, row) in acc.iter_mut().enumerate() {
                let s = S::splat(*op.a.add(r * op.ar + p * op.ac));
                for (x, &y) in row.iter_mut().zip(&bv) {
                    *x = S::fma(s, y, *x);
                }
            }
        }
        for (r, row) in acc.iter().enumerate() {
            for (v, &x) in row.iter().enumerate() {
                S::store(op.o.add(r * op.ldo + v * S::W), x);
            }
        }
    }
}
