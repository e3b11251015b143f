//! One backward job: for each of its key blocks, every tile of [`BWD_TILE_ROWS`] query rows that can
//! see the block (by the band) goes through the steps below; under a block mask, every query block
//! that its transposed list names is one tile of [`BWD_SPARSE_TILE_ROWS`] rows (key blocks no query
//! block lists are skipped whole). The micro-kernel row chunks of a tile are its [`row_chunks`](work::row_chunks):
//! the multiples of the rows per call, or under a block mask each query block's own near-equal
//! chunks, so a listed block is neither widened to the call grid nor cut into a full tile and a
//! short one. Each tile goes through
//! 1. `S = scale·Q·Kᵀ` (soft-capped, biased, masked to −∞ like the forward) with the
//!    micro-kernel the forward scored with (`qk_panel` on packed key panels, or `qk_rows` on keys
//!    in place after a decode-path forward), and `dP̄ = dO·Vᵀ` with `qk_panel` on packed values
//!    (scaled by dropout's `c`);
//! 2. `P = exp((S − lse) − lse_residue)`, dropout replayed (`P̄ = z·P`, `dP = keep·dP̄` with `dP̄ = dO·(c·V)`,
//!    `z = keep·c`, `c = 1/(1 − p)`),
//!    `dP += dW` when the weights' gradient arrives, `dS = P∘(dP − Δ)` (0 wherever `S` is masked,
//!    whatever `dP̄` holds; `Δ` with the side gradients' term), added into `dbias`,
//!    `dS·(1 − tanh²)` into the score modification's table (`dtable`), and
//!    `dX = scale·dS·(1 − tanh²)·f'` through the soft-cap and the modification;
//! 3. `dV += P̄ᵀ·dO`, `dK += dXᵀ·Q` into the block's accumulators and `dQ += dX·K`, with the
//!    forward's `pv` micro-kernel; key rows holding a non-finite number are added one product
//!    at a time, skipping the rows that mask them.
//!
//! Where a causal or window band cuts through a tile, the products skip what it hides: in step 1
//! a micro-kernel row chunk's key panels outside the chunk's band (their scores and `dP̄` set to
//! 0, masked in step 2), and in step 3 the rows a group of keys cannot see (`dV`, `dK`; pairs of
//! rows with bfloat16 products) and, in f32, the keys a group of rows cannot see (`dQ`): their
//! terms are `0·x`.
//!
//! The products of steps 1 and 3 ([`products`](mod@products)) are f32, or bfloat16 pairs with
//! f32 accumulation for a job of a call with [`Precision::Bf16`] whose forward took the prefill
//! path (so `S` is rounded bit for bit as the forward's) and whose keys are all finite (a pair of
//! keys would carry a masked key's NaN into its neighbour's `dQ`): its [`Form`]. Step 2 is f32
//! either way. With bfloat16 products on AMX tiles (`BwdCtx::tiles`, as the forward ran), four of
//! the five products run on the tiles (`amx_products`), configured for the job's run: `S` by the
//! forward's own function (so still bit for bit), `dQ += dX·K` on the same pairs of keys as the
//! vectors', and `dV`, `dK` transposed (`dVᵀ = dOᵀ·P̄`) over every pair of rows that sees a key of
//! the tile. `dP̄ = dO·Vᵀ` stays on the vectors: `Δ` is rounded as they round it, so that a row
//! seeing one key gets `dS = 0` exactly.

mod deltas;
mod products;
mod score_grads;
mod work;

use super::{BwdCtx, BwdJob, BWD_MAX_TILE_ROWS, BWD_SPARSE_TILE_ROWS, BWD_TILE_ROWS, KEY_BLOCK};
use crate::amx::{Hardware, TileUnit, Tiles};
use crate::flash::block::rows_per_call;
use crate::flash::nonfinite::all_finite;
use crate::flash::pack::{key_pairs_len, pack_dim_pairs, pack_key_pairs, pack_keys, panel_len};
use crate::problem::Precision;
use crate::simd::Simd;
use deltas::deltas;
use products::{accumulate_f32, accumulate_pairs, products, transpose_chunks};
use score_grads::score_grads;
pub use work::BwdWork;
use work::{grow, transposes_queries, Form, TileAt, LDB};

/// Most bytes of a job's queries and output gradients transposed once for all its key blocks;
/// larger heads are transposed tile by tile.
const TRANSPOSED_BUDGET: usize = 8 << 20;
/// Runs one job (see the module header of `backward`).
///
/// # Safety
/// Must run on a CPU supporting `S`'s instruction set; no other job of the call has the same
/// `(b, kvh, shard)`.
#[inline(always)]
pub unsafe fn run_job<S: Simd>(cx: &BwdCtx, job: &BwdJob, w: &mut BwdWork) {
    let d = cx.pb.dims;
    let g = d.group();
    for v in [&mut w.s, &mut w.p, &mut w.pd, &mut w.dp, &mut w.dmod, &mut w.dcap, &mut w.x] {
        grow(v, BWD_MAX_TILE_ROWS * LDB);
    }
    grow(&mut w.g, LDB);
    w.blocks.forget();
    let (rq, _) = rows_per_call::<S>();
    let form = Form {
        whole: cx.whole_heads.unwrap_or(g * d.lq * (d.dk + d.dv) * 4 <= TRANSPOSED_BUDGET),
        bf16: cx.pb.compute == Precision::Bf16
            && !cx.decode_scores
            && (0..d.lk).all(|j| all_finite(cx.k.row(job.b, job.kvh, j))),
        unit: if cx.pb.elem.block.is_some() { BWD_SPARSE_TILE_ROWS } else { rq },
    };
    let tile_rows = if cx.pb.elem.block.is_some() { BWD_SPARSE_TILE_ROWS } else { BWD_TILE_ROWS };
    // SAFETY: a unit is resolved to the hardware only when `amx::status` is ready.
    let _configured =
        unsafe { cx.tiles.filter(|u| form.bf16 && *u == TileUnit::Hardware).and_then(|_| Hardware.configure()) };
    if form.bf16 {
        grow(&mut w.rows2, BWD_MAX_TILE_ROWS.div_ceil(2) * (LDB + d.dk.max(d.dv)));
        grow(&mut w.keys2, BWD_MAX_TILE_ROWS * LDB / 2);
    }
    let rows = if form.whole { g * d.lq } else { BWD_MAX_TILE_ROWS };
    grow(&mut w.qt, rows * form.slots(d.dk));
    grow(&mut w.dot, rows * form.slots(d.dv));
    // SAFETY: CPU supports `S`.
    unsafe { deltas::<S>(cx, job, form, w) };
    if form.whole {
        let (dks, dvs) = (form.slots(d.dk), form.slots(d.dv));
        for x in 0..g {
            let h = job.kvh * g + x;
            // SAFETY: the CPU supports `S` (the caller's contract).
            unsafe {
                if transposes_queries(cx, form) {
                    transpose_chunks::<S>(form, d.lq, d.dk, rq, |r| cx.q.row(job.b, h, r), &mut w.qt[x * d.lq * dks..]);
                }
                transpose_chunks::<S>(form, d.lq, d.dv, rq, |r| cx.dout.row(job.b, h, r), &mut w.dot[x * d.lq * dvs..]);
            }
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
                // Tiles start and end at multiples of `rq` (or `Lq`), so their micro-kernel chunks
                // are those of the whole head; the extra rows see none of the block.
                None if ia < ib => w.spans.push((h, ia / rq * rq, ib.next_multiple_of(rq).min(d.lq))),
                None => {}
                Some(bm) => listed_tiles(bm.q_blocks(job.b, h, j0 / KEY_BLOCK).0, ia, ib, d.lq)
                    .for_each(|(a, z)| w.spans.push((h, a, z))),
            }
        }
        if w.spans.is_empty() {
            continue;
        }
        pack_block(cx, job, w, form, j0, n, S::W);
        w.dk.clear();
        w.dk.resize(n * d.dk, 0.0);
        w.dv.clear();
        w.dv.resize(n * d.dv, 0.0);
        for x in 0..w.spans.len() {
            let (h, ia, ib) = w.spans[x];
            for i0 in (ia..ib).step_by(tile_rows) {
                let nr = tile_rows.min(ib - i0);
                let dq_rows = &mut dq[((h - job.kvh * g) * d.lq + i0) * d.dk..][..nr * d.dk];
                // SAFETY: forwarded from the caller; rows `i0..i0+nr` and keys `j0..j0+n` exist.
                unsafe { tile::<S>(cx, job, w, form, TileAt { h, i0, nr, j0, n }, dq_rows) };
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

/// Packs keys `j0..j0+n` of the job's head for vector width `lanes`: keys (unless scored in
/// place after a decode-path forward) and values in panels, the values scaled by dropout's `c`;
/// or, with bfloat16 products, both in pairs along the row and the keys in pairs of keys too.
/// Lists the block's keys that hold a non-finite number.
fn pack_block(cx: &BwdCtx, job: &BwdJob, w: &mut BwdWork, form: Form, j0: usize, n: usize, lanes: usize) {
    let d = cx.pb.dims;
    let (b, h, keys) = (job.b, job.kvh, j0..j0 + n);
    w.kp.resize(panel_len(n, form.slots(d.dk), lanes), 0.0);
    w.vp.resize(panel_len(n, form.slots(d.dv), lanes), 0.0);
    w.bad_keys.clear();
    if form.bf16 {
        pack_dim_pairs(&cx.k, b, h, keys.clone(), lanes, &mut w.kp);
        pack_dim_pairs(&cx.v, b, h, keys.clone(), lanes, &mut w.vp);
        w.kk.resize(key_pairs_len(n, d.dk, lanes), 0.0);
        pack_key_pairs(&cx.k, b, h, keys, lanes, &mut w.kk);
        return;
    }
    if !cx.decode_scores {
        pack_keys(&cx.k, b, h, keys.clone(), lanes, &mut w.kp);
    }
    pack_keys(&cx.v, b, h, keys, lanes, &mut w.vp);
    // With dropout, `dP = keep·(dO·(c·V))` with `c = 1/(1 − p)` rounded into each value as
    // the forward's `O = Σ (c·P)·V` rounded it: a row that sees one key then gets `dP = Δ`
    // bit for bit and `dS = 0` exactly, as without dropout.
    if let Some(dr) = cx.pb.dropout {
        let c = dr.scale();
        w.vp.iter_mut().for_each(|x| *x *= c);
    }
    w.bad_keys.extend((0..n).filter(|&c| !all_finite(cx.k.row(b, h, j0 + c))));
}

/// Query rows `ia..ib` of batch `b` whose band reaches keys `j0..j0+n` (the band's bounds only
/// grow with the row, so both ends are found by binary search).
fn rows_seeing(cx: &BwdCtx, b: usize, j0: usize, n: usize) -> (usize, usize) {
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

/// The rows of each query block in `listed` (sorted) that holds a row of the band's `ia..ib`:
/// whole blocks (the last clamped to `Lq`), one tile each; their rows outside the band are masked
/// like any other.
fn listed_tiles(listed: &[u32], ia: usize, ib: usize, lq: usize) -> impl Iterator<Item = (usize, usize)> + '_ {
    listed
        .iter()
        .map(move |&qb| (qb as usize * BWD_SPARSE_TILE_ROWS, ((qb as usize + 1) * BWD_SPARSE_TILE_ROWS).min(lq)))
        .filter(move |&(a, z)| a < ib && ia < z)
}

/// One tile through the module header's steps 1 to 3.
///
/// # Safety
/// CPU supports `S`; the rows and keys exist; `w`'s buffers are sized by [`run_job`].
#[inline(always)]
unsafe fn tile<S: Simd>(cx: &BwdCtx, job: &BwdJob, w: &mut BwdWork, form: Form, t: TileAt, dq: &mut [f32]) {
    let band = (t.i0..t.i0 + t.nr).map(|i| {
        let (lo, hi) = cx.pb.key_range(job.b, i);
        (lo.clamp(t.j0, t.j0 + t.n) - t.j0, hi.clamp(t.j0, t.j0 + t.n) - t.j0)
    });
    w.band.clear();
    w.band.extend(band);
    // SAFETY: forwarded from the caller.
    unsafe {
        products::<S>(cx, job, w, form, t);
        score_grads::<S>(cx, job, w, t);
        if form.bf16 {
            accumulate_pairs::<S>(cx, job, w, t, dq)
        } else {
            accumulate_f32::<S>(cx, job, w, t, dq)
        }
    }
}
