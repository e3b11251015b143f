//! `O += P · V` for one tile of the forward: the probabilities of the block's rows times the
//! tile's value rows, through the `pv` micro-kernel (`R` rows × four or one vectors of `Dv` per
//! call) with a scalar tail for the columns of `Dv` beyond the last whole vector. The path per
//! column run is chosen by `flash::scores::bad_columns`: value rows holding a non-finite
//! number are added one product at a time, skipping the rows that mask them; every other run of
//! columns goes through the micro-kernel.

use crate::flash::block::{rows_per_call, with_rows, Work, LDS};
use crate::flash::micro::{pv, pv_scalar};
use crate::flash::simd::{KvElem, Simd};

/// `o: [rows, dv] += P · V` for the tile: `P` the probabilities `[rows, n]` in `w.s`, `V` the
/// `n` value rows at `v` (stride `ldv`); the value rows listed in `bad` (non-finite, with the
/// block rows masking each) are added one product at a time, skipping the rows that mask them.
///
/// # Safety
/// The CPU supports `S`'s instruction set; `v` is valid for `n` rows of `dv` elements at stride
/// `ldv`; `o` holds `rows` rows of `dv`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn accumulate<S: Simd, E: KvElem>(
    w: &Work,
    rows: usize,
    v: *const E,
    ldv: usize,
    n: usize,
    dv: usize,
    o: &mut [f32],
    bad: &[(usize, Vec<bool>)],
) {
    let p = w.s.as_ptr();
    let op = o.as_mut_ptr();
    let mut c = 0;
    for run_end in bad.iter().map(|b| b.0).chain(std::iter::once(n)) {
        if run_end > c {
            // SAFETY: the CPU supports `S` and `o` holds `rows` rows of `dv` (the caller's
            // contract); columns `c..run_end` of P (`rows` rows at stride `LDS`) and rows
            // `c..run_end` of V exist.
            unsafe { pv_block::<S, E>(p.add(c), LDS, 1, v.add(c * ldv), ldv, run_end - c, op, dv, rows) };
        }
        c = run_end + 1;
    }
    for (c, masked) in bad {
        // SAFETY: row `c` of V exists with `dv` elements (the caller's contract).
        let vrow = unsafe { std::slice::from_raw_parts(v.add(c * ldv), dv) };
        for r in (0..rows).filter(|&r| !masked[r]) {
            let pr = w.s[r * LDS + c];
            for (x, y) in o[r * dv..(r + 1) * dv].iter_mut().zip(vrow) {
                *x += pr * y.to_f32();
            }
        }
    }
}

/// `o[rows, dv] += p[rows, n] · v[n, dv]` (`p[r][j]` at `p[r·ldp + j·ldj]`, so `P` is read
/// row-major or, with `ldp = 1`, transposed; row strides `ldv`, `dv`) with the vector
/// micro-kernel and a scalar column tail. The backward's three products use it too.
///
/// # Safety
/// The CPU supports `S`'s instruction set; `p` valid for `rows` rows of `n` at those strides, `v`
/// for `n` rows of `dv` at stride `ldv`, `o` for `rows` rows of `dv`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(in crate::flash) unsafe fn pv_block<S: Simd, E: KvElem>(
    p: *const f32,
    ldp: usize,
    ldj: usize,
    v: *const E,
    ldv: usize,
    n: usize,
    o: *mut f32,
    dv: usize,
    rows: usize,
) {
    let (_, rp) = rows_per_call::<S>();
    let mut r0 = 0;
    // SAFETY: the CPU supports `S` (the caller's contract); every call stays within `rows` rows
    // and `dv` columns, which the caller guarantees valid.
    unsafe {
        while r0 < rows {
            let nr = rp.min(rows - r0);
            let (pr, or) = (p.add(r0 * ldp), o.add(r0 * dv));
            let mut c0 = 0;
            // Column blocks of 4 vectors on AVX-512, 2 on 8-lane ISAs (see `rows_per_call`).
            while S::W == 16 && c0 + 4 * S::W <= dv {
                with_rows!(nr, pv::<S, E; 4>(pr, ldp, ldj, v, ldv, n, or, dv, c0));
                c0 += 4 * S::W;
            }
            while S::W != 16 && c0 + 2 * S::W <= dv {
                with_rows!(nr, pv::<S, E; 2>(pr, ldp, ldj, v, ldv, n, or, dv, c0));
                c0 += 2 * S::W;
            }
            while c0 + S::W <= dv {
                with_rows!(nr, pv::<S, E; 1>(pr, ldp, ldj, v, ldv, n, or, dv, c0));
                c0 += S::W;
            }
            if c0 < dv {
                pv_scalar(pr, ldp, ldj, v, ldv, n, or, dv, nr, c0..dv);
            }
            r0 += nr;
        }
    }
}
