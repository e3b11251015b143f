//! `O += P · V` for one tile of the forward: the probabilities of the block's rows times the
//! tile's value rows, through the `pv` micro-kernel (`R` rows × four or one vectors of `Dv` per
//! call) with a scalar tail for the columns of `Dv` beyond the last whole vector. The path per
//! column run is chosen by `flash::scores::bad_columns`: value rows holding a non-finite
//! number are added one product at a time, skipping the rows that mask them; every other run of
//! columns goes through the micro-kernel. With bfloat16 products ([`accumulate_bf16`]) the tile's
//! probabilities are rounded to bfloat16 pairs and multiplied into the packed value pairs; a tile
//! with such value rows takes the f32 path instead.

use crate::flash::block::{rows_per_call, with_rows, Work, LDS};
use crate::flash::micro::{pv, pv_scalar, Bf16Pairs, Fma, Product};
use crate::flash::pairs::pair_keys;
use crate::flash::simd::{KvElem, Simd};

/// Row stride of the probability pairs in `Work::p2`.
const LDP: usize = LDS / 2;

/// `o: [rows, dv] += P · V` for the tile of keys `j0..j0+n` with bfloat16 products: `P` the
/// probabilities in `w.s` (columns from `n` on are set to 0 here), rounded to bfloat16 pairs in
/// `w.p2`, times `vpairs`, the head's value pairs as `pack::pack_head` lays them out.
///
/// # Safety
/// The CPU supports `S`'s instruction set; `j0` is a multiple of `2·S::W`; `vpairs` holds the pairs
/// of keys `0..j0 + n` rounded up to `2·S::W` keys, `dv` slots each; `o` holds `rows` rows of `dv`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn accumulate_bf16<S: Simd>(
    w: &mut Work,
    rows: usize,
    vpairs: &[f32],
    j0: usize,
    n: usize,
    dv: usize,
    o: &mut [f32],
) {
    let pw = 2 * S::W;
    let width = n.div_ceil(pw) * pw;
    if w.p2.len() < rows * LDP {
        w.p2.resize(rows * LDP, 0.0);
    }
    // SAFETY: the CPU supports `S` (the caller's contract); `w.s` holds `rows` rows of `LDS >=
    // width` floats and `w.p2` `rows` rows of `LDP >= width / 2`.
    unsafe { pair_keys::<S>(w.s.as_mut_ptr(), LDS, rows, n, width, w.p2.as_mut_ptr(), LDP) };
    // SAFETY: the CPU supports `S`; `w.p2` holds `rows` rows of `width / 2` pairs at stride `LDP`,
    // `vpairs` the pairs of keys `j0..j0 + width` from slot `j0 / 2 · dv` (the caller's contract).
    unsafe {
        let v = vpairs.as_ptr().add(j0 / 2 * dv);
        pv_block::<S, Bf16Pairs, f32>(w.p2.as_ptr(), LDP, 1, v, dv, width / 2, o.as_mut_ptr(), dv, rows);
    }
}

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
            unsafe { pv_block::<S, Fma, E>(p.add(c), LDS, 1, v.add(c * ldv), ldv, run_end - c, op, dv, rows) };
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
/// micro-kernel and a scalar column tail, multiplied as `P` multiplies. The backward's three
/// products use it too.
///
/// # Safety
/// The CPU supports `S`'s instruction set; `p` valid for `rows` rows of `n` at those strides, `v`
/// for `n` rows of `dv` at stride `ldv`, `o` for `rows` rows of `dv`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(in crate::flash) unsafe fn pv_block<S: Simd, P: Product, E: KvElem>(
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
                with_rows!(nr, pv::<S, P, E; 4>(pr, ldp, ldj, v, ldv, n, or, dv, c0));
                c0 += 4 * S::W;
            }
            while S::W != 16 && c0 + 2 * S::W <= dv {
                with_rows!(nr, pv::<S, P, E; 2>(pr, ldp, ldj, v, ldv, n, or, dv, c0));
                c0 += 2 * S::W;
            }
            while c0 + S::W <= dv {
                with_rows!(nr, pv::<S, P, E; 1>(pr, ldp, ldj, v, ldv, n, or, dv, c0));
                c0 += S::W;
            }
            if c0 < dv {
                pv_scalar::<P, E>(pr, ldp, ldj, v, ldv, n, or, dv, nr, c0..dv);
            }
            r0 += nr;
        }
    }
}
