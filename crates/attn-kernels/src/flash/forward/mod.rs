//! The forward pass of one block of query rows through the whole online softmax: the key tiles
//! in the block's range, each scored and masked ([`super::scores`]), exponentiated against the
//! running maxima ([`softmax`]) and multiplied into the output ([`accumulate`](mod@accumulate)),
//! then normalised; and, when weights are asked for, a second sweep that recomputes the scores
//! and writes the normalised probabilities.
//!
//! Scores stay in natural units and are scaled after the dot product, like the formula; the
//! exponential of `s − m` is taken to about 1 ulp (`simd::exp`) and the output divided by the
//! denominator. Tiles outside every row's band are never visited, nor key blocks that a block mask
//! lists for none of the block's rows; the runs of listed blocks are gathered into tiles of
//! several segments ([`tiles`](mod@tiles)). The path is chosen by whether
//! `panels` is given: packed keys (prefill, queries stored transposed per micro-kernel call, tiles
//! aligned to the panel width) or keys read in place (decode). With bfloat16 products (prefill
//! only) the queries are stored as bfloat16 pairs and `P·V` takes `accumulate_bf16`; on AMX tiles
//! (`Ctx::tiles`) the rows are stored row-major for them (`amx_products::prepare`) and the tiles
//! stay configured for the block's run.

pub(super) mod accumulate;
pub(super) mod softmax;

use super::amx_products::prepare;
use super::block::{head, qk_chunks, rows_per_call, tile_keys, Ctx, Job, Outs, Work, MAX_ROWS_PER_CALL};
use super::nonfinite::bad_columns;
use super::pack::values_at;
use super::pairs::transpose_pairs;
use super::scores::scores;
use crate::amx::{Hardware, TileUnit, Tiles};
use crate::flash::key_tiles::{key_tiles, tiles};
use crate::lse::lse_parts;
use crate::prefetch;
use crate::problem::Precision;
use crate::simd::{KvElem, Simd};
use crate::sparse::{BlockMask, SPARSE_BLOCK};
use accumulate::{accumulate, accumulate_bf16};
use softmax::{softmax_update, write_weights};

/// Runs one block; `panels` holds the packed keys of the block's head in the prefill path.
/// Writes the block's rows of `outs`: `o: [rows, Dv]`, `lse: [rows]` and, when given,
/// `weights: [rows, Lk]`.
///
/// # Safety
/// Must run on a CPU supporting `S`'s instruction set; `panels`, when given, is the packing of
/// this block's `(b, kvh)` by `pack_head` for `S::W` and the call's precision.
#[inline(always)]
pub unsafe fn run<S: Simd, E: KvElem>(cx: &Ctx<E>, panels: Option<&[f32]>, job: &Job, outs: Outs, w: &mut Work) {
    let pb = cx.pb;
    let d = pb.dims;
    let rows = job.rows();
    let tile = tile_keys(d.dk, panels.is_some());
    w.reset(rows, d.dk);
    let (rq, _) = rows_per_call::<S>();
    let bf16 = pb.compute == Precision::Bf16 && panels.is_some();
    let on_tiles = cx.tiles.filter(|_| bf16);
    // SAFETY: a unit is resolved to the hardware only when `amx::status` is ready.
    let _configured = unsafe { on_tiles.filter(|u| *u == TileUnit::Hardware).and_then(|_| Hardware.configure()) };
    if panels.is_some() {
        // The job's query rows are read once, transposed a column at a time below; their lines
        // asked for all at once arrive together instead of a dozen at a time from memory (see
        // docs/performance-log.md, "attn-kernels/src/flash/forward/mod.rs: run").
        for r in 0..rows {
            let (h, i) = job.head_query(r);
            prefetch::lines::<{ prefetch::L1 }, _>(cx.q.row(job.b, h, i));
        }
        if on_tiles.is_some() {
            let row = |r| {
                let (h, i) = job.head_query(r);
                cx.q.row(job.b, h, i)
            };
            prepare(&mut w.tiles, rows, row, d.dk);
        }
        // Each chunk of rows that one `qk_panel` call takes, stored transposed (not on tiles,
        // which read the rows `prepare` stored).
        for (r0, nr) in qk_chunks(rows, rq).filter(|_| on_tiles.is_none()) {
            let mut src: [&[f32]; MAX_ROWS_PER_CALL] = [&[]; MAX_ROWS_PER_CALL];
            for (r, q) in src[..nr].iter_mut().enumerate() {
                let (h, i) = job.head_query(r0 + r);
                *q = cx.q.row(job.b, h, i);
            }
            // Slot `k` of the chunk's rows is `chunk[k·nr..][..nr]`, written in order (a store per
            // element in a row's order became a scatter).
            let chunk = &mut w.q[r0 * d.dk..][..nr * d.dk];
            // SAFETY: the CPU supports `S`; each row holds `Dk` values.
            unsafe {
                if bf16 {
                    transpose_pairs::<S>(&src[..nr], d.dk, chunk, nr);
                } else {
                    S::transpose_rows(&src[..nr], d.dk, chunk, nr);
                }
            }
        }
    }
    for r in 0..rows {
        let (h, i) = job.head_query(r);
        if panels.is_none() {
            w.q[r * d.dk..(r + 1) * d.dk].copy_from_slice(cx.q.row(job.b, h, i));
        }
        let (lo, hi) = pb.key_range(job.b, i);
        w.range.push((lo.max(job.keys.start), hi.min(job.keys.end)));
    }
    let lo = w.range.iter().filter(|r| r.0 < r.1).map(|r| r.0).min();
    let hi = w.range.iter().map(|r| r.1).max().unwrap_or(0);
    outs.lse.fill(f32::NEG_INFINITY);
    let Some(lo) = lo else { return };
    let start = if panels.is_some() { lo / (2 * S::W) * (2 * S::W) } else { lo };
    let (khead, ldk) = head(&cx.k, job.b, job.kvh);
    let (vhead, ldv) = head(&cx.v, job.b, job.kvh);

    let align = 2 * S::W;
    let segs = key_tiles(start, hi, tile, align, pb.elem.block.map(|bm| job_blocks(bm, job)).as_deref());
    for t in tiles(&segs) {
        // SAFETY: forwarded from the caller; tiles stay within `0..Lk`, aligned as `key_tiles`
        // makes them for `2·S::W`.
        let masked = unsafe { scores::<S, E>(cx, panels, job, w, khead, ldk, t) };
        let listed = cx.bad_values.as_ref().map(|b| &b[job.b * d.hkv + job.kvh][..]);
        let bad = if masked { bad_columns(vhead, ldv, d.dv, t, listed, w, rows) } else { Vec::new() };
        // SAFETY: the CPU supports `S` (forwarded from the caller).
        unsafe { softmax_update::<S>(cx, job, w, outs.o, t) };
        match panels.filter(|_| bf16 && bad.is_empty()) {
            // SAFETY: the CPU supports `S`; segments start at multiples of the panel width and
            // the head's packing holds the value pairs of every key from `values_at` on.
            Some(p) => unsafe { accumulate_bf16::<S>(w, rows, &p[values_at(&d, S::W)..], t, d.dv, outs.o, on_tiles) },
            // SAFETY: as above; the segments' value rows exist, each `Dv` long.
            None => unsafe { accumulate::<S, E>(w, rows, vhead.as_ptr(), ldv, t, d.dv, outs.o, &bad) },
        }
    }
    for r in 0..rows {
        let (m, l) = (w.m[r], w.l[r]);
        if m == f32::NEG_INFINITY {
            continue;
        }
        (outs.lse[r], outs.residue[r]) = lse_parts(m, l);
        // One rounding per element: `x·(1/l)` takes two, and their bias along the row showed in
        // `Δ = dO·O` of the backward (a `[Lk]` bias's gradient, which sums `Δ`'s errors over rows).
        outs.o[r * d.dv..(r + 1) * d.dv].iter_mut().for_each(|x| *x /= l);
    }
    if let Some(wt) = outs.weights {
        for t in tiles(&segs) {
            // SAFETY: as above.
            unsafe {
                scores::<S, E>(cx, panels, job, w, khead, ldk, t);
                write_weights::<S>(w, rows, t, d.lk, wt);
            }
        }
    }
}

/// The key blocks `bm` lists for any row of `job`: its heads × the query blocks its rows fall in.
fn job_blocks(bm: &BlockMask, job: &Job) -> Vec<u32> {
    let qbs = job.i0 / SPARSE_BLOCK..(job.i0 + job.ni).div_ceil(SPARSE_BLOCK);
    let mut all: Vec<u32> = Vec::new();
    let mut lists = 0;
    for h in job.h0..job.h0 + job.nh {
        for qb in qbs.clone() {
            all.extend_from_slice(bm.kv_blocks(job.b, h, qb).0);
            lists += 1;
        }
    }
    if lists > 1 {
        all.sort_unstable();
        all.dedup();
    }
    all
}
