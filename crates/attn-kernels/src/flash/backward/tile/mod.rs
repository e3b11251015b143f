//! One backward job: for each of its key blocks, every tile of [`TILE_ROWS`] query rows that can
//! see the block (by the band) goes through the steps below; under a block mask, every query block
//! that its transposed list names is one tile of [`SPARSE_TILE_ROWS`] rows (key blocks no query
//! block lists are skipped whole). The micro-kernel row chunks of a tile are its [`row_chunks`]:
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
//! the five products run on the tiles (`tile_products`), configured for the job's run: `S` by the
//! forward's own function (so still bit for bit), `dQ += dX·K` on the same pairs of keys as the
//! vectors', and `dV`, `dK` transposed (`dVᵀ = dOᵀ·P̄`) over every pair of rows that sees a key of
//! the tile. `dP̄ = dO·Vᵀ` stays on the vectors: `Δ` is rounded as they round it, so that a row
//! seeing one key gets `dS = 0` exactly.

mod deltas;
mod products;
mod score_grads;

use super::{BwdCtx, BwdJob, KEY_BLOCK, MAX_TILE_ROWS, SPARSE_TILE_ROWS, TILE_ROWS};
use crate::amx::{Hardware, TileUnit, Tiles};
use crate::flash::block::{qk_chunks, rows_per_call, TileWork};
use crate::flash::nonfinite::all_finite;
use crate::flash::pack::{key_pairs_len, pack_dim_pairs, pack_key_pairs, pack_keys, panel_len};
use crate::lines::Lines;
use crate::problem::Precision;
use crate::simd::Simd;
use crate::sparse::TileBlocks;
use deltas::deltas;
use products::{accumulate_f32, accumulate_pairs, products, transpose_chunks};
use score_grads::score_grads;

/// Most bytes of a job's queries and output gradients transposed once for all its key blocks;
/// larger heads are transposed tile by tile.
const TRANSPOSED_BUDGET: usize = 8 << 20;
/// Row stride of the `[MAX_TILE_ROWS, KEY_BLOCK]` tiles.
const LDB: usize = KEY_BLOCK;

/// A worker's buffers, reused from job to job.
#[derive(Default)]
pub struct BwdWork {
    /// Packed keys and values of the block, `[D][2·W]` panels.
    kp: Lines<f32>,
    vp: Lines<f32>,
    /// Queries and output gradients transposed per micro-kernel row chunk: of the job's heads
    /// when they fit [`TRANSPOSED_BUDGET`], else of the tile.
    qt: Lines<f32>,
    dot: Lines<f32>,
    /// Scores `S`, probabilities `P` (and `P̄` under dropout), `dP` then `dS` then `dX`, the
    /// score modification's and the soft-cap's derivatives, the scaled products before the
    /// modification: `[MAX_TILE_ROWS, LDB]`.
    s: Lines<f32>,
    p: Lines<f32>,
    pd: Lines<f32>,
    dp: Lines<f32>,
    dmod: Lines<f32>,
    dcap: Lines<f32>,
    x: Lines<f32>,
    /// One row's gradient of the modified score, `[LDB]`, and the tile's table gradient.
    g: Lines<f32>,
    dtable: Lines<f32>,
    /// With bfloat16 products: the block's keys in pairs of keys (`pack::pack_key_pairs`), then
    /// per tile `P̄` or `dX` paired two query rows at a time `[⌈MAX_TILE_ROWS/2⌉, LDB]` followed
    /// by the tile's `dO` or `Q` rows paired alike, and `dX` paired per key panel
    /// `[MAX_TILE_ROWS, LDB/2]`.
    kk: Lines<f32>,
    rows2: Lines<f32>,
    keys2: Lines<f32>,
    /// The block's `dK` `[KEY_BLOCK, Dk]` and `dV` `[KEY_BLOCK, Dv]`.
    dk: Lines<f32>,
    dv: Lines<f32>,
    /// `Δ_i = dO_i·O_i` of the job's rows, `[Hq/Hkv, Lq]`.
    delta: Vec<f32>,
    /// `W` rows of `dO` and then of `O` transposed, `2 × [slots][W]` (`deltas`).
    dt: Vec<f32>,
    /// Block columns whose key row holds a non-finite number.
    bad_keys: Vec<usize>,
    /// The tiles' spans of the block: `(query head, first row, end row)`.
    spans: Vec<(usize, usize, usize)>,
    /// Per row of the tile, the block's columns `a..z` its band allows (`a >= z`: none); both
    /// ends grow with the row.
    band: Vec<(usize, usize)>,
    /// A block mask's segments of the tile last masked.
    blocks: TileBlocks,
    /// On tiles: the tile's query rows (or, for `dV` and `dK`, the columns of its `dO` or `Q` rows) as
    /// bfloat16 pairs, the accumulators, the emulated tiles.
    tiles: TileWork,
}

/// Most bytes of a worker's buffers that grow with the call (the job's transposed rows and `Δ`)
/// kept for its next job; beyond, they are dropped.
const KEPT_BYTES: usize = 2 << 20;

impl BwdWork {
    /// Drops the buffers that grew with the call when they hold more than [`KEPT_BYTES`], so
    /// that a worker keeps `O(tile)` plus at most that between calls.
    pub fn trim(&mut self) {
        let grown = self.qt.held_bytes() + self.dot.held_bytes() + self.delta.capacity() * 4;
        if grown > KEPT_BYTES {
            (self.qt, self.dot, self.delta) = Default::default();
        }
    }
}

fn grow(v: &mut Lines<f32>, n: usize) {
    if v.len() < n {
        v.resize(n, 0.0);
    }
}

/// How a job multiplies (see the module header): its products' precision, whether its heads'
/// queries and output gradients are transposed once for all its key blocks (`whole`) or tile by
/// tile, and the rows its tiles start at multiples of (`unit`, see [`row_chunks`]).
#[derive(Debug, Clone, Copy)]
struct Form {
    whole: bool,
    bf16: bool,
    unit: usize,
}

impl Form {
    /// Slots of a row of `d` values: `d`, or `⌈d/2⌉` bfloat16 pairs.
    fn slots(self, d: usize) -> usize {
        if self.bf16 {
            d.div_ceil(2)
        } else {
            d
        }
    }
}

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
        grow(v, MAX_TILE_ROWS * LDB);
    }
    grow(&mut w.g, LDB);
    w.blocks.forget();
    let (rq, _) = rows_per_call::<S>();
    let form = Form {
        whole: cx.whole_heads.unwrap_or(g * d.lq * (d.dk + d.dv) * 4 <= TRANSPOSED_BUDGET),
        bf16: cx.pb.compute == Precision::Bf16
            && !cx.decode_scores
            && (0..d.lk).all(|j| all_finite(cx.k.row(job.b, job.kvh, j))),
        unit: if cx.pb.elem.block.is_some() { SPARSE_TILE_ROWS } else { rq },
    };
    let tile_rows = if cx.pb.elem.block.is_some() { SPARSE_TILE_ROWS } else { TILE_ROWS };
    // SAFETY: a unit is resolved to the hardware only when `amx::status` is ready.
    let _configured =
        unsafe { cx.tiles.filter(|u| form.bf16 && *u == TileUnit::Hardware).and_then(|_| Hardware.configure()) };
    if form.bf16 {
        grow(&mut w.rows2, MAX_TILE_ROWS.div_ceil(2) * (LDB + d.dk.max(d.dv)));
        grow(&mut w.keys2, MAX_TILE_ROWS * LDB / 2);
    }
    let rows = if form.whole { g * d.lq } else { MAX_TILE_ROWS };
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

/// Whether step 1's `S` reads the queries transposed per micro-kernel chunk (`qk_panel`): not
/// after a decode-path forward (`decode_scores` reads them in place) nor on AMX tiles
/// (`tile_products::prepare` stores them row-major).
fn transposes_queries(cx: &BwdCtx, form: Form) -> bool {
    !(cx.decode_scores || (form.bf16 && cx.tiles.is_some()))
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
        .map(move |&qb| (qb as usize * SPARSE_TILE_ROWS, ((qb as usize + 1) * SPARSE_TILE_ROWS).min(lq)))
        .filter(move |&(a, z)| a < ib && ia < z)
}

/// The micro-kernel row chunks `(first row, rows)` of a tile of `rows` rows that starts at a
/// multiple of `unit` (a head's rows from 0 included): each `unit` rows, the last possibly fewer,
/// cut by `qk_chunks` into calls of at most `rq` near-equal rows. With `unit == rq` these are the
/// multiples of `rq`; with a query block as `unit`, a block's chunks are the same in its tile as
/// in its head's transposition (64 rows as 11, 11, 11, 11, 10, 10 for `rq` 12).
fn row_chunks(rows: usize, unit: usize, rq: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..rows).step_by(unit).flat_map(move |u0| qk_chunks(unit.min(rows - u0), rq).map(move |(a, n)| (u0 + a, n)))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trim_drops_only_grown_buffers_past_the_limit() {
        let mut w = BwdWork::default();
        grow(&mut w.qt, 1000);
        grow(&mut w.s, 1000);
        w.trim();
        assert!(w.qt.held_bytes() >= 4000, "a small transposition is kept");
        grow(&mut w.dot, KEPT_BYTES / 4 + 1);
        w.trim();
        assert_eq!(w.qt.held_bytes() + w.dot.held_bytes(), 0, "grown past the limit: dropped");
        assert!(w.s.held_bytes() >= 4000, "tile buffers are kept");
    }
}
