//! Steps 1 and 3 of a backward tile (see the parent module's header): the products `S = Q·Kᵀ`,
//! `dP̄ = dO·Vᵀ` and the accumulations `dV += P̄ᵀ·dO`, `dK += dXᵀ·Q`, `dQ += dX·K`, in f32 or, for
//! a job with bfloat16 products ([`Form::bf16`]), on bfloat16 pairs with f32 accumulation as the
//! forward multiplies: `Q·Kᵀ` and `dO·Vᵀ` pair the head dimension (queries and output gradients
//! transposed in pairs, keys and values packed by `pack::pack_dim_pairs`), the three
//! accumulations pair their reduction index — two query rows ([`pair_rows`]) for `dV` and `dK`, two
//! keys of a panel ([`pair_keys`], against `pack::pack_key_pairs`) for `dQ`.

use std::ops::Range;

use super::super::{BwdCtx, BwdJob};
use super::work::{row_chunks, transposes_queries, BwdWork, Form, TileAt, LDB};
use crate::amx::TILE_SLOTS;
use crate::flash::amx_products::{self, on_unit, prepare, prepare_columns};
use crate::flash::block::{head, rows_per_call, with_rows, MAX_ROWS_PER_CALL};
use crate::flash::forward::accumulate::{pv_block, pv_spans};
use crate::flash::key_tiles::Seg;
use crate::flash::micro::{qk_panel, Bf16Pairs, Fma, Product};
use crate::flash::pairs::{pair_keys, pair_rows, transpose_pairs};
use crate::flash::scores::decode_scores;
use crate::prefetch;
use crate::simd::{KvElem, Portable, Simd};

/// Copies `rows` rows (from a multiple of the form's unit), row `r` read as `src(r)` (`d` values),
/// transposed per micro-kernel chunk `(r0, nr)` of [`row_chunks`] for `unit` in the form's slots
/// (pairs of neighbouring values for bfloat16 products, `transpose_pairs`): the chunk is stored
/// `[slots][nr]` at `out[r0·slots..]`, as `qk_panel` reads it. In f32 a value at a time: AVX-512's
/// register transposes made the f32 backward slower, where the pairs' vector rounding made the
/// bfloat16 one faster (see docs/performance-log.md,
/// "attn-kernels/src/flash/backward/tile/products.rs: transpose_chunks").
///
/// # Safety
/// The CPU supports `S`'s instruction set.
#[inline(always)]
pub(super) unsafe fn transpose_chunks<'a, S: Simd>(
    form: Form,
    rows: usize,
    d: usize,
    rq: usize,
    src: impl Fn(usize) -> &'a [f32],
    out: &mut [f32],
) {
    let slots = form.slots(d);
    let mut rs: [&[f32]; MAX_ROWS_PER_CALL] = [&[]; MAX_ROWS_PER_CALL];
    for (r0, nr) in row_chunks(rows, form.unit, rq) {
        for (r, x) in rs[..nr].iter_mut().enumerate() {
            *x = src(r0 + r);
        }
        // The next chunk's lines asked for now arrive while this one is transposed (a whole
        // head's rows are read once, from memory).
        for r in (r0 + nr..rows).take(nr) {
            prefetch::lines::<{ prefetch::L1 }, _>(src(r));
        }
        let chunk = &mut out[r0 * slots..][..nr * slots];
        // SAFETY: the CPU supports `S` (the caller's contract); each row holds `d` values.
        unsafe {
            if form.bf16 {
                transpose_pairs::<S>(&rs[..nr], d, chunk, nr);
            } else {
                Portable::transpose_rows(&rs[..nr], d, chunk, nr);
            }
        }
    }
}

/// `out[r][·] = scale · a_r · panels` for `rows` rows (transposed in the chunks of
/// [`row_chunks`] for `unit`: `at`, `d` slots) against the `np` packed panels, multiplied as `P`
/// multiplies; 0 where a panel lies outside every column `band` allows a chunk's rows.
///
/// # Safety
/// CPU supports `S`; `at` holds `rows·d`, `panels` `np` panels of `d·2·W`, `out` `rows·LDB`,
/// `band` `rows` entries.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn panel_product<S: Simd, P: Product>(
    at: &[f32],
    panels: &[f32],
    d: usize,
    rows: usize,
    unit: usize,
    np: usize,
    scale: f32,
    band: &[(usize, usize)],
    out: &mut [f32],
) {
    let (rq, _) = rows_per_call::<S>();
    let pw = 2 * S::W;
    for pi in 0..np {
        let kp = panels[pi * d * pw..].as_ptr();
        for (r0, nr) in row_chunks(rows, unit, rq) {
            let cols = keys_seen(band, r0..r0 + nr);
            if cols.end <= pi * pw || (pi + 1) * pw <= cols.start {
                for r in r0..r0 + nr {
                    out[r * LDB + pi * pw..][..pw].fill(0.0);
                }
                continue;
            }
            let (ap, op) = (at.as_ptr(), out.as_mut_ptr());
            // SAFETY: chunk `r0` holds `nr·d` floats; the panel `d·pw`; the output row block
            // `nr` rows of `LDB >= np·pw` columns.
            unsafe {
                with_rows!(S::QK_ROWS, nr, qk_panel::<S, P; >(ap.add(r0 * d), kp, d, scale, op.add(r0 * LDB + pi * pw), LDB))
            };
        }
    }
}

/// Step 1: the tile's scores `S` into `w.s` and `dP̄ = dO·Vᵀ` into `w.dp`, the queries and output
/// gradients transposed first when the job did not transpose its whole heads.
///
/// # Safety
/// As [`super::tile`].
#[inline(always)]
pub(super) unsafe fn products<S: Simd>(cx: &BwdCtx, job: &BwdJob, w: &mut BwdWork, form: Form, t: TileAt) {
    let d = cx.pb.dims;
    let (b, TileAt { h, i0, nr, j0, n }) = (job.b, t);
    let (rq, _) = rows_per_call::<S>();
    let np = n.div_ceil(2 * S::W);
    let (dks, dvs) = (form.slots(d.dk), form.slots(d.dv));
    let (qt, dot) = if form.whole {
        let x = (h - job.kvh * d.group()) * d.lq + i0;
        (x * dks, x * dvs)
    } else {
        // SAFETY: the CPU supports `S` (the caller's contract).
        unsafe {
            if transposes_queries(cx, form) {
                transpose_chunks::<S>(form, nr, d.dk, rq, |r| cx.q.row(b, h, i0 + r), &mut w.qt);
            }
            transpose_chunks::<S>(form, nr, d.dv, rq, |r| cx.dout.row(b, h, i0 + r), &mut w.dot);
        }
        (0, 0)
    };
    let scale = cx.pb.scale as f32;
    // SAFETY: buffers sized by `run_job`; CPU supports `S`; rows `i0..i0+nr` and keys
    // `j0..j0+n` exist.
    unsafe {
        if cx.decode_scores {
            let (qb, ldq) = head(&cx.q, b, h);
            let (kb, ldk) = head(&cx.k, b, job.kvh);
            let (qb, kb) = (qb.as_ptr().add(i0 * ldq), kb.as_ptr().add(j0 * ldk));
            decode_scores::<S, f32>(qb, ldq, kb, ldk, n, d.dk, scale, nr, w.s.as_mut_ptr(), LDB);
        } else if let (true, Some(unit)) = (form.bf16, cx.tiles) {
            // The forward's tile product on the same pairs: `S` bit for bit as the forward's.
            let tw = &mut w.tiles;
            prepare(tw, nr, |r| cx.q.row(b, h, i0 + r), d.dk);
            let seg = [Seg { col: 0, j0: 0, n }];
            on_unit!(unit, tw.emulated, t => amx_products::qk(t, &tw.q, tw.ldq, &w.kp, &seg, scale, w.s.as_mut_ptr(), LDB, nr, &mut tw.acc));
        } else if form.bf16 {
            panel_product::<S, Bf16Pairs>(&w.qt[qt..], &w.kp, dks, nr, form.unit, np, scale, &w.band, &mut w.s);
        } else {
            panel_product::<S, Fma>(&w.qt[qt..], &w.kp, dks, nr, form.unit, np, scale, &w.band, &mut w.s);
        }
        if form.bf16 {
            // The packed values are bfloat16: dropout's `c` scales the product instead.
            let c = cx.pb.dropout.map_or(1.0, |dr| dr.scale());
            panel_product::<S, Bf16Pairs>(&w.dot[dot..], &w.vp, dvs, nr, form.unit, np, c, &w.band, &mut w.dp);
        } else {
            panel_product::<S, Fma>(&w.dot[dot..], &w.vp, dvs, nr, form.unit, np, 1.0, &w.band, &mut w.dp);
        }
    }
}

/// Step 3 in f32: `dV += P̄ᵀ·dO` and `dK += dXᵀ·Q` into the block's accumulators, `dQ += dX·K`
/// into `dq` (`[nr, Dk]`), key rows holding a non-finite number one product at a time.
///
/// # Safety
/// As [`super::tile`].
#[inline(always)]
pub(super) unsafe fn accumulate_f32<S: Simd>(cx: &BwdCtx, job: &BwdJob, w: &mut BwdWork, t: TileAt, dq: &mut [f32]) {
    let d = cx.pb.dims;
    let (b, TileAt { nr, j0, n, .. }) = (job.b, t);
    let [pd, (qb, ldq), (ob, ldo)] = tile_rows(cx, w, b, t);
    let (kb, ldk) = head(&cx.k, b, job.kvh);
    let kb = kb[j0 * ldk..].as_ptr();
    let band = &w.band[..nr];
    let rows_of_keys = |c0: usize, m: usize| rows_seeing(band, c0..c0 + m);
    // The keys of `c..e` (as columns from `c`) that rows `r0..r0 + m` see.
    let keys_of_rows = |c: usize, e: usize| {
        move |r0: usize, m: usize| {
            let cols = keys_seen(band, r0..r0 + m);
            let (a, z) = (cols.start.clamp(c, e), cols.end.clamp(c, e));
            a - c..z.max(a) - c
        }
    };
    // SAFETY: `P̄` and `dX` hold `nr` rows of `n` at stride `LDB`, read transposed for `dV`, `dK`,
    // and are 0 outside the band; Q and dO rows `i0..i0+nr` and K rows `j0..j0+n` exist; the
    // accumulators hold `n` rows, `dq` `nr` rows; every span lies in its product's range.
    unsafe {
        pv_spans::<S, Fma, f32>(pd.0, 1, LDB, ob, ldo, w.dv.as_mut_ptr(), d.dv, n, rows_of_keys);
        pv_spans::<S, Fma, f32>(w.dp.as_ptr(), 1, LDB, qb, ldq, w.dk.as_mut_ptr(), d.dk, n, rows_of_keys);
        let mut c = 0;
        for run_end in w.bad_keys.iter().copied().chain(std::iter::once(n)) {
            if run_end > c {
                let (dx, k) = (w.dp.as_ptr().add(c), kb.add(c * ldk));
                pv_spans::<S, Fma, f32>(dx, LDB, 1, k, ldk, dq.as_mut_ptr(), d.dk, nr, keys_of_rows(c, run_end));
            }
            c = run_end + 1;
        }
    }
    for &c in &w.bad_keys {
        let krow = cx.k.row(b, job.kvh, j0 + c);
        for r in (0..nr).filter(|&r| w.s[r * LDB + c] != f32::NEG_INFINITY) {
            let dx = w.dp[r * LDB + c];
            for (x, y) in dq[r * d.dk..(r + 1) * d.dk].iter_mut().zip(krow) {
                *x += dx * y.to_f32();
            }
        }
    }
}

/// The tile rows whose `band` (ends growing with the row) reaches a column of `cols`.
fn rows_seeing(band: &[(usize, usize)], cols: Range<usize>) -> Range<usize> {
    let first = band.partition_point(|&(_, z)| z <= cols.start);
    first..band.partition_point(|&(a, _)| a < cols.end).max(first)
}

/// The columns that tile `rows` (non-empty) see at most: both ends of the `band` grow with the row,
/// so from the first row's start to the last row's end (empty when they cross).
fn keys_seen(band: &[(usize, usize)], rows: Range<usize>) -> Range<usize> {
    band[rows.start].0..band[rows.end - 1].1
}

/// What both forms of step 3 read first, as pointers with their row strides: `P̄` (`P` without
/// dropout; stride `LDB`), and the tile's first query and output-gradient rows (`Q`, `dO` row
/// `i0` of head `h`).
fn tile_rows(cx: &BwdCtx, w: &BwdWork, b: usize, t: TileAt) -> [(*const f32, usize); 3] {
    let pd = if cx.pb.dropout.is_some() { &w.pd } else { &w.p };
    let [(qb, ldq), (ob, ldo)] = [head(&cx.q, b, t.h), head(&cx.dout, b, t.h)];
    [(pd.as_ptr(), LDB), (qb[t.i0 * ldq..].as_ptr(), ldq), (ob[t.i0 * ldo..].as_ptr(), ldo)]
}

/// Step 3 on bfloat16 pairs: `P̄`, `dX` and the tile's `dO` and `Q` rows paired two
/// query rows at a time (an odd last row with a row of zeros), `dX` also paired per key panel
/// against the block's keys packed in pairs of keys (`w.kk`).
///
/// # Safety
/// As [`super::tile`]; the job's keys are all finite (the form's rule).
#[inline(always)]
pub(super) unsafe fn accumulate_pairs<S: Simd>(cx: &BwdCtx, job: &BwdJob, w: &mut BwdWork, t: TileAt, dq: &mut [f32]) {
    let d = cx.pb.dims;
    let (TileAt { nr, n, .. }, half, width) = (t, t.nr.div_ceil(2), t.n.div_ceil(2 * S::W) * 2 * S::W);
    let [pd, (qb, ldq), (ob, ldo)] = tile_rows(cx, w, job.b, t);
    let band = &w.band[..nr];
    // The pairs of rows `(2p, 2p + 1)` that see a key of `c0..c0 + m`.
    let pairs_seeing = |c0: usize, m: usize| {
        let r = rows_seeing(band, c0..c0 + m);
        r.start / 2..r.end.div_ceil(2)
    };
    // SAFETY: `P̄` and `dX` hold `nr` rows of `LDB >= width` at stride `LDB` (0 outside the band,
    // and so are their pairs outside `pairs_seeing`); Q and dO rows
    // `i0..i0+nr` exist; `w.rows2` holds `⌈BWD_MAX_TILE_ROWS/2⌉` rows of `max(LDB, Dk, Dv)`, `w.keys2`
    // `BWD_MAX_TILE_ROWS` rows of `LDB/2`, `w.kk` the block's keys in pairs (`width/2` rows of `Dk`); the
    // accumulators hold `n` rows, `dq` `nr` rows.
    unsafe {
        // The pairs of `P̄` or `dX` in `rows2`'s first rows, up to the next 16 (zero for the tiles;
        // `BWD_MAX_TILE_ROWS / 2` is a multiple of 16), the vectors' pairs of `dO` or `Q` after them.
        let padded = half.div_ceil(TILE_SLOTS) * TILE_SLOTS;
        let (pairs, values) = w.rows2.split_at_mut(padded * LDB);
        if cx.tiles.is_some() {
            pairs[half * LDB..].fill(0.0);
        }
        let (tw, seeing) = (&mut w.tiles, pairs_seeing(0, n));
        // `dV += P̄ᵀ·dO`, then `dK += dXᵀ·Q`, the reduction over pairs of rows.
        for (x, (rows, ld), dim, acc) in
            [(pd.0, (ob, ldo), d.dv, &mut w.dv), (w.dp.as_ptr(), (qb, ldq), d.dk, &mut w.dk)]
        {
            pair_rows::<S>(x, LDB, nr, n, pairs.as_mut_ptr(), LDB);
            match cx.tiles {
                Some(unit) => {
                    let row = |r: usize| std::slice::from_raw_parts(rows.add(r * ld), dim);
                    let lda = prepare_columns(&mut tw.q, nr, row, dim, seeing.clone());
                    on_unit!(unit, tw.emulated, t => amx_products::reduce_rows(t, &tw.q, lda, pairs.as_ptr(), LDB, dim, n, acc, &mut tw.acc));
                }
                None => {
                    pair_rows::<S>(rows, ld, nr, dim, values.as_mut_ptr(), dim);
                    let (p, v) = (pairs.as_ptr(), values.as_ptr());
                    pv_spans::<S, Bf16Pairs, f32>(p, 1, LDB, v, dim, acc.as_mut_ptr(), dim, n, pairs_seeing);
                }
            }
        }
        pair_keys::<S>(w.dp.as_mut_ptr(), LDB, nr, n, width, w.keys2.as_mut_ptr(), LDB / 2);
        match cx.tiles {
            // `keys2` holds `BWD_MAX_TILE_ROWS` (a multiple of 32) rows: the padding rows the tiles read.
            Some(unit) => {
                let seg = [Seg { col: 0, j0: 0, n }];
                on_unit!(unit, tw.emulated, t => amx_products::pv(t, &w.keys2, LDB / 2, &w.kk, &seg, d.dk, dq, nr, &mut tw.acc));
            }
            None => pv_block::<S, Bf16Pairs, f32>(
                w.keys2.as_ptr(),
                LDB / 2,
                1,
                w.kk.as_ptr(),
                d.dk,
                width / 2,
                dq.as_mut_ptr(),
                d.dk,
                nr,
            ),
        }
    }
}
