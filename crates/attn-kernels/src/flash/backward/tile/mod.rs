//! One backward job: for each of its key blocks, every tile of [`TILE_ROWS`] query rows that can
//! see the block (by the band, and by a block mask's transposed lists: key blocks no query block
//! lists are skipped whole) goes through
//! 1. `S = scale·Q·Kᵀ` (soft-capped, biased, masked to −∞ like the forward) with the
//!    micro-kernel the forward scored with (`qk_panel` on packed key panels, or `qk_rows` on keys
//!    in place after a decode-path forward), and `dP̄ = dO·Vᵀ` with `qk_panel` on packed values
//!    (scaled by dropout's `c`);
//! 2. `P = exp((S − lse) − lse_residue)`, dropout replayed (`P̄ = z·P`, `dP = keep·dP̄` with `dP̄ = dO·(c·V)`,
//!    `z = keep·c`, `c = 1/(1 − p)`),
//!    `dS = P∘(dP − Δ)` (0 wherever `S` is masked, whatever `dP̄` holds), added into `dbias`,
//!    `dS·(1 − tanh²)` into the score modification's table (`dtable`), and
//!    `dX = scale·dS·(1 − tanh²)·f'` through the soft-cap and the modification;
//! 3. `dV += P̄ᵀ·dO`, `dK += dXᵀ·Q` into the block's accumulators and `dQ += dX·K`, with the
//!    forward's `pv` micro-kernel; key rows holding a non-finite number are added one product
//!    at a time, skipping the rows that mask them.

mod score_grads;

use super::rows::dot_as_panel;
use super::{BwdCtx, BwdJob, KEY_BLOCK, TILE_ROWS};
use crate::flash::block::{head, rows_per_call, with_rows};
use crate::flash::forward::accumulate::pv_block;
use crate::flash::micro::{qk_panel, Fma};
use crate::flash::pack::{pack_keys, panel_len};
use crate::flash::scores::{all_finite, decode_scores};
use crate::flash::simd::{KvElem, Simd};
use crate::sparse::runs;
use score_grads::score_grads;

/// Most bytes of a job's queries and output gradients transposed once for all its key blocks;
/// larger heads are transposed tile by tile.
const TRANSPOSED_BUDGET: usize = 8 << 20;
/// Row stride of the `[TILE_ROWS, KEY_BLOCK]` tiles.
const LDB: usize = KEY_BLOCK;

/// A worker's buffers, reused from job to job.
#[derive(Default)]
pub struct BwdWork {
    /// Packed keys and values of the block, `[D][2·W]` panels.
    kp: Vec<f32>,
    vp: Vec<f32>,
    /// Queries and output gradients transposed per micro-kernel row chunk: of the job's heads
    /// when they fit [`TRANSPOSED_BUDGET`], else of the tile.
    qt: Vec<f32>,
    dot: Vec<f32>,
    /// Scores `S`, probabilities `P` (and `P̄` under dropout), `dP` then `dS` then `dX`, the
    /// score modification's and the soft-cap's derivatives, the scaled products before the
    /// modification: `[TILE_ROWS, LDB]`.
    s: Vec<f32>,
    p: Vec<f32>,
    pd: Vec<f32>,
    dp: Vec<f32>,
    dmod: Vec<f32>,
    dcap: Vec<f32>,
    x: Vec<f32>,
    /// One row's gradient of the modified score, `[LDB]`, and the tile's table gradient.
    g: Vec<f32>,
    dtable: Vec<f32>,
    /// The block's `dK` `[KEY_BLOCK, Dk]` and `dV` `[KEY_BLOCK, Dv]`.
    dk: Vec<f32>,
    dv: Vec<f32>,
    /// `Δ_i = dO_i·O_i` of the job's rows, `[Hq/Hkv, Lq]`.
    delta: Vec<f32>,
    /// Block columns whose key row holds a non-finite number.
    bad_keys: Vec<usize>,
    /// The tiles' spans of the block: `(query head, first row, end row)`.
    spans: Vec<(usize, usize, usize)>,
}

fn grow(v: &mut Vec<f32>, n: usize) {
    if v.len() < n {
        v.resize(n, 0.0);
    }
}

/// Runs one job (see the module header of `backward`).
///
/// # Safety
/// Must run on a CPU supporting `S`'s instruction set; no other job of the call has the same
/// `(b, kvh, shard)`.
#[inline(always)]
pub unsafe fn run_job<S: Simd, E: KvElem>(cx: &BwdCtx<E>, job: &BwdJob, w: &mut BwdWork) {
    let d = cx.pb.dims;
    let g = d.group();
    for v in [&mut w.s, &mut w.p, &mut w.pd, &mut w.dp, &mut w.dmod, &mut w.dcap, &mut w.x] {
        grow(v, TILE_ROWS * LDB);
    }
    grow(&mut w.g, LDB);
    let (rq, _) = rows_per_call::<S>();
    let whole = cx.whole_heads.unwrap_or(g * d.lq * (d.dk + d.dv) * 4 <= TRANSPOSED_BUDGET);
    let rows = if whole { g * d.lq } else { TILE_ROWS };
    grow(&mut w.qt, rows * d.dk);
    grow(&mut w.dot, rows * d.dv);
    // Plain loops here and in `dot_as_panel`: a closure would not inherit the target features.
    // With a sink the row's one-key exactness is gone (`dS = P·dP·p_sink`, not 0) and what is
    // left of `Δ`'s error is `O`'s rounding plus the dot product's: the latter is removed by
    // taking the products and their sum in `f64`.
    w.delta.clear();
    for h in job.kvh * g..(job.kvh + 1) * g {
        for i in 0..d.lq {
            let (dout, out) = (cx.dout.row(job.b, h, i), cx.out.row(job.b, h, i));
            if cx.pb.sink(h).is_some() {
                let mut delta = 0.0f64;
                for (&x, &y) in dout.iter().zip(out) {
                    delta += x as f64 * y as f64;
                }
                w.delta.push(delta as f32);
            } else {
                // SAFETY: CPU supports `S`.
                w.delta.push(unsafe { dot_as_panel::<S>(dout, out) });
            }
        }
    }
    if whole {
        for x in 0..g {
            let h = job.kvh * g + x;
            if !cx.decode_scores {
                transpose_chunks(d.lq, d.dk, rq, |r| cx.q.row(job.b, h, r), &mut w.qt[x * d.lq * d.dk..]);
            }
            transpose_chunks(d.lq, d.dv, rq, |r| cx.dout.row(job.b, h, r), &mut w.dot[x * d.lq * d.dv..]);
        }
    }
    let unit = job.b * d.hkv + job.kvh;
    let head_dq = g * d.lq * d.dk;
    // SAFETY: this job is the only one with its `(shard, unit)`, which names its `dq` region.
    let dq = unsafe { cx.dq.part((job.shard * d.b * d.hkv + unit) * head_dq, head_dq) };
    for j0 in (job.shard * KEY_BLOCK..d.lk).step_by(cx.shards * KEY_BLOCK) {
        let n = KEY_BLOCK.min(d.lk - j0);
        let (ia, ib) = rows_seeing(cx, job.b, j0, n);
        w.spans.clear();
        for h in job.kvh * g..(job.kvh + 1) * g {
            match cx.pb.elem.block {
                // Tiles start at multiples of `TILE_ROWS` and end at a multiple of `rq` (or `Lq`), so
                // their micro-kernel chunks are those of the whole head; the extra rows see none of
                // the block.
                None if ia < ib => w.spans.push((h, ia / TILE_ROWS * TILE_ROWS, ib.next_multiple_of(rq).min(d.lq))),
                None => {}
                Some(bm) => listed_rows(bm.q_blocks(job.b, h, j0 / KEY_BLOCK).0, ia, ib, rq, d.lq)
                    .for_each(|(a, z)| w.spans.push((h, a, z))),
            }
        }
        if w.spans.is_empty() {
            continue;
        }
        w.kp.resize(panel_len(n, d.dk, S::W), 0.0);
        w.vp.resize(panel_len(n, d.dv, S::W), 0.0);
        // Scored in place after a decode-path forward: no packed keys.
        if !cx.decode_scores {
            pack_keys(&cx.k, job.b, job.kvh, j0..j0 + n, S::W, &mut w.kp);
        }
        pack_keys(&cx.v, job.b, job.kvh, j0..j0 + n, S::W, &mut w.vp);
        // With dropout, `dP = keep·(dO·(c·V))` with `c = 1/(1 − p)` rounded into each value as
        // the forward's `O = Σ (c·P)·V` rounded it: a row that sees one key then gets `dP = Δ`
        // bit for bit and `dS = 0` exactly, as without dropout.
        if let Some(dr) = cx.pb.dropout {
            let c = dr.scale();
            w.vp.iter_mut().for_each(|x| *x *= c);
        }
        w.bad_keys.clear();
        w.bad_keys.extend((0..n).filter(|&c| !all_finite(cx.k.row(job.b, job.kvh, j0 + c))));
        w.dk.clear();
        w.dk.resize(n * d.dk, 0.0);
        w.dv.clear();
        w.dv.resize(n * d.dv, 0.0);
        for x in 0..w.spans.len() {
            let (h, ia, ib) = w.spans[x];
            for i0 in (ia..ib).step_by(TILE_ROWS) {
                let nr = TILE_ROWS.min(ib - i0);
                let dq_rows = &mut dq[((h - job.kvh * g) * d.lq + i0) * d.dk..][..nr * d.dk];
                // SAFETY: forwarded from the caller; rows `i0..i0+nr` and keys `j0..j0+n` exist.
                unsafe { tile::<S, E>(cx, job, w, whole, TileAt { h, i0, nr, j0, n }, dq_rows) };
            }
        }
        let at = (unit * d.lk + j0) * d.dk;
        // SAFETY: keys `j0..j0+n` of head `unit` belong to this job alone (one shard per block).
        unsafe { cx.dk.part(at, n * d.dk) }.copy_from_slice(&w.dk);
        let at = (unit * d.lk + j0) * d.dv;
        // SAFETY: as above.
        unsafe { cx.dv.part(at, n * d.dv) }.copy_from_slice(&w.dv);
    }
}

/// Query rows `ia..ib` of batch `b` whose band reaches keys `j0..j0+n` (the band's bounds only
/// grow with the row, so both ends are found by binary search).
fn rows_seeing<E>(cx: &BwdCtx<E>, b: usize, j0: usize, n: usize) -> (usize, usize) {
    let lq = cx.pb.dims.lq;
    let first = |pred: &dyn Fn(usize) -> bool| {
        let (mut lo, mut hi) = (0, lq);
        while lo < hi {
            let mid = (lo + hi) / 2;
            if pred(mid) {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        lo
    };
    let ia = first(&|i| cx.pb.key_range(b, i).1 > j0);
    let ib = first(&|i| cx.pb.key_range(b, i).0 >= j0 + n);
    (ia, ib.max(ia))
}

/// The query rows, within the band's `ia..ib`, of the runs of consecutive query blocks `listed`
/// (sorted), each widened to multiples of `rq` (or `Lq`) so that the micro-kernel chunks of its
/// tiles are those of the whole head; runs are a block apart, so widened spans never overlap.
fn listed_rows(
    listed: &[u32],
    ia: usize,
    ib: usize,
    rq: usize,
    lq: usize,
) -> impl Iterator<Item = (usize, usize)> + '_ {
    runs(listed, ia..ib).map(move |r| (r.start / rq * rq, r.end.next_multiple_of(rq).min(lq)))
}

/// Copies rows `r` of `src(r)` (each `d` long) transposed per micro-kernel chunk of `rq` rows:
/// chunk `r0` is stored `[d][nr]` at `out[r0·d..]`, as `qk_panel` reads it.
fn transpose_chunks<'a>(rows: usize, d: usize, rq: usize, src: impl Fn(usize) -> &'a [f32], out: &mut [f32]) {
    for r in 0..rows {
        let r0 = r / rq * rq;
        let nr = rq.min(rows - r0);
        for (k, &x) in src(r).iter().enumerate() {
            out[r0 * d + k * nr + r - r0] = x;
        }
    }
}

/// `out[r][·] = scale · a_r · panels` for `rows` rows (transposed chunks `at`, length `d`) against
/// the `np` packed panels.
///
/// # Safety
/// CPU supports `S`; `at` holds `rows·d`, `panels` `np` panels of `d·2·W`, `out` `rows·LDB`.
#[inline(always)]
unsafe fn panel_product<S: Simd>(
    at: &[f32],
    panels: &[f32],
    d: usize,
    rows: usize,
    np: usize,
    scale: f32,
    out: &mut [f32],
) {
    let (rq, _) = rows_per_call::<S>();
    let pw = 2 * S::W;
    let (ap, op) = (at.as_ptr(), out.as_mut_ptr());
    for pi in 0..np {
        let kp = panels[pi * d * pw..].as_ptr();
        let mut r0 = 0;
        while r0 < rows {
            let nr = rq.min(rows - r0);
            // SAFETY: chunk `r0` holds `nr·d` floats; the panel `d·pw`; the output row block
            // `nr` rows of `LDB >= np·pw` columns.
            unsafe {
                with_rows!(nr, qk_panel::<S, Fma; >(ap.add(r0 * d), kp, d, scale, op.add(r0 * LDB + pi * pw), LDB))
            };
            r0 += nr;
        }
    }
}

/// Where one tile sits: query rows `i0..i0+nr` of head `h` against keys `j0..j0+n` of the job's
/// block.
#[derive(Debug, Clone, Copy)]
struct TileAt {
    h: usize,
    i0: usize,
    nr: usize,
    j0: usize,
    n: usize,
}

/// One tile through the module header's steps 1 to 3.
///
/// # Safety
/// CPU supports `S`; the rows and keys exist; `w`'s buffers are sized by [`run_job`].
#[inline(always)]
unsafe fn tile<S: Simd, E: KvElem>(
    cx: &BwdCtx<E>,
    job: &BwdJob,
    w: &mut BwdWork,
    whole: bool,
    t: TileAt,
    dq: &mut [f32],
) {
    // SAFETY: forwarded from the caller.
    unsafe {
        products::<S, E>(cx, job, w, whole, t);
        score_grads::<S>(cx, job, w, t);
        accumulate::<S, E>(cx, job, w, t, dq);
    }
}

/// Step 1: the tile's scores `S` into `w.s` and `dP̄ = dO·Vᵀ` into `w.dp`, the queries and output
/// gradients transposed first when the job did not transpose its whole heads.
///
/// # Safety
/// As [`tile`].
#[inline(always)]
unsafe fn products<S: Simd, E: KvElem>(cx: &BwdCtx<E>, job: &BwdJob, w: &mut BwdWork, whole: bool, t: TileAt) {
    let d = cx.pb.dims;
    let (b, TileAt { h, i0, nr, j0, n }) = (job.b, t);
    let (rq, _) = rows_per_call::<S>();
    let np = n.div_ceil(2 * S::W);
    let (qt, dot) = if whole {
        let x = (h - job.kvh * d.group()) * d.lq + i0;
        (x * d.dk, x * d.dv)
    } else {
        if !cx.decode_scores {
            transpose_chunks(nr, d.dk, rq, |r| cx.q.row(b, h, i0 + r), &mut w.qt);
        }
        transpose_chunks(nr, d.dv, rq, |r| cx.dout.row(b, h, i0 + r), &mut w.dot);
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
            decode_scores::<S, E>(qb, ldq, kb, ldk, n, d.dk, scale, nr, w.s.as_mut_ptr(), LDB);
        } else {
            panel_product::<S>(&w.qt[qt..], &w.kp, d.dk, nr, np, scale, &mut w.s);
        }
        panel_product::<S>(&w.dot[dot..], &w.vp, d.dv, nr, np, 1.0, &mut w.dp);
    }
}

/// Step 3: `dV += P̄ᵀ·dO` and `dK += dXᵀ·Q` into the block's accumulators, `dQ += dX·K` into `dq`
/// (`[nr, Dk]`), key rows holding a non-finite number one product at a time.
///
/// # Safety
/// As [`tile`].
#[inline(always)]
unsafe fn accumulate<S: Simd, E: KvElem>(cx: &BwdCtx<E>, job: &BwdJob, w: &mut BwdWork, t: TileAt, dq: &mut [f32]) {
    let d = cx.pb.dims;
    let (b, TileAt { h, i0, nr, j0, n }) = (job.b, t);
    let pd = if cx.pb.dropout.is_some() { &w.pd } else { &w.p };
    let (qb, ldq) = head(&cx.q, b, h);
    let (ob, ldo) = head(&cx.dout, b, h);
    let (kb, ldk) = head(&cx.k, b, job.kvh);
    let (qb, ob, kb) = (qb.as_ptr(), ob.as_ptr(), kb.as_ptr());
    // SAFETY: `P̄` and `dX` hold `nr` rows of `n` at stride `LDB`, read transposed for `dV`, `dK`;
    // Q and dO rows `i0..i0+nr` and K rows `j0..j0+n` exist; the accumulators hold `n` rows,
    // `dq` `nr` rows.
    unsafe {
        let (qb, ob, kb) = (qb.add(i0 * ldq), ob.add(i0 * ldo), kb.add(j0 * ldk));
        pv_block::<S, Fma, f32>(pd.as_ptr(), 1, LDB, ob, ldo, nr, w.dv.as_mut_ptr(), d.dv, n);
        pv_block::<S, Fma, f32>(w.dp.as_ptr(), 1, LDB, qb, ldq, nr, w.dk.as_mut_ptr(), d.dk, n);
        let mut c = 0;
        for run_end in w.bad_keys.iter().copied().chain(std::iter::once(n)) {
            if run_end > c {
                let (dx, k) = (w.dp.as_ptr().add(c), kb.add(c * ldk));
                pv_block::<S, Fma, E>(dx, LDB, 1, k, ldk, run_end - c, dq.as_mut_ptr(), d.dk, nr);
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
