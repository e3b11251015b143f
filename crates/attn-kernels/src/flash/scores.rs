//! The score tile of a block and everything that masks it, shared by every pass that recomputes
//! scores (the forward, and its weights sweep): `S = scale · Q·Kᵀ` for the block's rows against
//! one tile of keys, then the score modification, the soft-cap, the bias, the keep-mask, the block
//! mask and the band, in the reference's order (the scan for masked keys whose values are not
//! finite is [`nonfinite`](super::nonfinite)'s).
//!
//! The product takes one of three paths, chosen by whether the keys were packed and the call runs
//! on tiles: packed panels (prefill, `qk_panel` on queries stored transposed, or with bfloat16
//! products on AMX tiles `amx_products::qk`) or keys in place (decode, `qk_rows`). The
//! soft-cap runs with vectors, the element masks as `row_masks` applies them; band edges are
//! masked only on the tiles that cross them.

use super::amx_products::{on_unit, qk};
use super::block::{qk_chunks, rows_per_call, with_rows, Ctx, Job, Work, LDS};
use super::key_tiles::{tile_columns, Seg};
use super::micro::{qk_panel, qk_rows, Bf16Pairs, Fma};
use super::row_masks::{add_bias, apply_keep, select_kept};
use crate::problem::{Precision, Problem};
use crate::simd::{KvElem, Simd};
use crate::softcap::softcap_row;
use crate::sparse::{BlockMask, TileBlocks, TileSeg, SPARSE_BLOCK};

/// Scaled (and soft-capped, biased) scores of every row of `job` against the keys of the tile
/// `segs` (each segment's keys in its columns), written to `w.s` (`[rows, LDS]`), masked (−∞)
/// where not allowed; columns from the tile's end up to the vector-padded width are −∞:
/// [`qk_tile`] then [`mask_tile`]. Returns whether any key of the tile was masked for any row;
/// then `w.clean` holds, per segment, the columns that no row masks (empty when an element mask
/// masked something; between the rows' band edges otherwise). Reads the queries from `w.q` and the
/// allowed key range of each row from `w.range`, both set up by the caller.
///
/// # Safety
/// As for [`qk_tile`].
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn scores<S: Simd, E: KvElem>(
    cx: &Ctx<E>,
    panels: Option<&[f32]>,
    job: &Job,
    w: &mut Work,
    k: &[E],
    ldk: usize,
    segs: &[Seg],
) -> bool {
    // SAFETY: forwarded from the caller.
    let width = unsafe { qk_tile::<S, E>(cx, panels, job, w, k, ldk, segs) };
    // SAFETY: the CPU supports `S` (the caller's contract); `qk_tile` returned the padded width.
    unsafe { mask_tile::<S>(cx.pb, job, w, segs, width) }
}

/// The raw scores `scale · q·k` of every row of `job` against the keys of the tile `segs`, written
/// to `w.s` (`[rows, LDS]`) from the queries in `w.q`; returns the width written per row, the
/// tile's columns rounded up to whole vectors (to whole panels of `2·W` keys in the prefill path),
/// whose columns beyond the tile's hold unspecified values.
///
/// # Safety
/// The CPU supports `S`'s instruction set; the tile is one of `key_tiles::key_tiles` for
/// `align = 2·S::W`. With `panels`, they are the packing of the job's `(b, kvh)` by `pack_head`
/// for `S::W` and the call's precision (the queries in `w.q` stored to match), and every segment
/// starts at a multiple of `2·S::W`; without, `k` holds the segments' keys of the head at row
/// stride `ldk`, each `Dk` long.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn qk_tile<S: Simd, E: KvElem>(
    cx: &Ctx<E>,
    panels: Option<&[f32]>,
    job: &Job,
    w: &mut Work,
    k: &[E],
    ldk: usize,
    segs: &[Seg],
) -> usize {
    let pb = cx.pb;
    let dk = pb.dims.dk;
    let rows = job.rows();
    let (rq, _) = rows_per_call::<S>();
    let qp = w.q.as_ptr();
    let scale = pb.scale as f32;
    let sp = w.s.as_mut_ptr();
    let n = tile_columns(segs);
    // SAFETY: `w.q` holds `rows·dk`, `w.s` holds `rows·LDS` with `LDS >= n` rounded up to 2·W;
    // panels hold every panel of keys `< Lk`, and `k` the segments' rows. Segments before a tile's
    // last are whole panels (`key_tiles`), so each panel's columns are its keys'.
    unsafe {
        // `cx.tiles` is set only for bfloat16 prefill calls (`flash::tile_unit`).
        match (panels, cx.tiles) {
            (Some(p), Some(unit)) => {
                let tw = &mut w.tiles;
                on_unit!(unit, tw.emulated, t => qk(t, &tw.q, tw.ldq, p, segs, scale, sp, LDS, rows, &mut tw.acc));
                n.div_ceil(2 * S::W) * 2 * S::W
            }
            (Some(p), None) => {
                let pw = 2 * S::W;
                let bf16 = pb.compute == Precision::Bf16;
                let slots = if bf16 { dk.div_ceil(2) } else { dk };
                for sg in segs {
                    for pi in 0..sg.n.div_ceil(pw) {
                        let kp = p.as_ptr().add((sg.j0 / pw + pi) * slots * pw);
                        let col = sg.col + pi * pw;
                        for (r0, nr) in qk_chunks(rows, rq) {
                            // The destination stays an argument expression: bound to a `let` outside
                            // the `with_rows!` arms, it costs the portable build a third more
                            // instructions.
                            if bf16 {
                                with_rows!(S::QK_ROWS, nr, qk_panel::<S, Bf16Pairs; >(qp.add(r0 * dk), kp, slots, scale, sp.add(r0 * LDS + col), LDS));
                            } else {
                                with_rows!(S::QK_ROWS, nr, qk_panel::<S, Fma; >(qp.add(r0 * dk), kp, dk, scale, sp.add(r0 * LDS + col), LDS));
                            }
                        }
                    }
                }
                n.div_ceil(pw) * pw
            }
            (None, _) => {
                for sg in segs {
                    let (kt, st) = (k.as_ptr().add(sg.j0 * ldk), sp.add(sg.col));
                    decode_scores::<S, E>(qp, dk, kt, ldk, sg.n, dk, scale, rows, st, LDS);
                }
                n.div_ceil(S::W) * S::W
            }
        }
    }
}

/// Query rows per `qk_rows` call.
const DECODE_ROWS_PER_CALL: usize = 4;

/// The decode path's scores `scale · q·k` of `rows` query rows (row stride `ldq`) against `n` keys
/// read in place (`k`, row stride `ldk`), all of length `d`, into `s` (row stride `lds`). Also the
/// backward's after a decode-path forward, so that its scores are the forward's bit for bit. (Two
/// keys at a time instead of four on AVX2, to keep the accumulators in its 16 registers, was
/// slower on the memory-bound decode; see docs/performance-log.md,
/// "attn-kernels/src/flash/scores.rs: decode_scores".)
///
/// # Safety
/// The CPU supports `S`'s instruction set; `q` valid for `rows` rows of `d` floats, `k` for `n`
/// rows of `d` elements, `s` for `rows` rows of `n`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(in crate::flash) unsafe fn decode_scores<S: Simd, E: KvElem>(
    q: *const f32,
    ldq: usize,
    k: *const E,
    ldk: usize,
    n: usize,
    d: usize,
    scale: f32,
    rows: usize,
    s: *mut f32,
    lds: usize,
) {
    let mut r0 = 0;
    while r0 < rows {
        let m = DECODE_ROWS_PER_CALL.min(rows - r0);
        let (q, s) = (q.wrapping_add(r0 * ldq), s.wrapping_add(r0 * lds));
        // SAFETY: forwarded from the caller; rows `r0..r0+m` exist.
        unsafe {
            with_rows!(DECODE_ROWS_PER_CALL, m, qk_rows::<S, E; >(q, ldq, k, ldk, n, d, scale, s, lds));
        }
        r0 += m;
    }
}

/// Masks the raw score tile `segs` in `w.s` (`width` columns per row, as [`qk_tile`] returned)
/// in the reference's order (see [`mask_row`]), a piece of a segment at a time (so the rows share
/// its block mask's lookup), each row's band taken from `w.range`; columns from the tile's end to
/// `width` become −∞. A segment's pieces are its runs of blocks that need no mask (see
/// [`kept_run`]) and the runs between them: only the latter are masked row by row. Returns what
/// [`scores`] returns, with `w.clean` set.
///
/// # Safety
/// The CPU supports `S`'s instruction set; `width` is a multiple of `S::W` of at most [`LDS`], and
/// every segment but the last spans whole vectors.
#[inline(always)]
pub(super) unsafe fn mask_tile<S: Simd>(
    pb: &Problem<f32>,
    job: &Job,
    w: &mut Work,
    segs: &[Seg],
    width: usize,
) -> bool {
    let mut masked = false;
    w.clean.clear();
    let band = w.range.iter().fold((0, usize::MAX), |(a, z), r| (a.max(r.0), z.min(r.1)));
    let single = job.nh == 1 && job.ni > 0 && job.i0 / SPARSE_BLOCK == (job.i0 + job.ni - 1) / SPARSE_BLOCK;
    let plain = pb.score_mod.is_none() && pb.softcap.is_none() && pb.elem.bias.is_none() && pb.elem.keep.is_none();
    let skippable = pb.elem.block.filter(|_| plain && single);
    for (x, sg) in segs.iter().enumerate() {
        // The last segment's last piece runs to the padded width, masking the padding.
        let end = if x + 1 == segs.len() { width } else { sg.col + sg.n };
        let mut clean = 0..sg.n;
        let mut at = 0;
        while at < sg.n {
            let (len, kept) = match skippable {
                Some(bm) => kept_run(bm, job, band, sg.j0 + at, sg.n - at),
                None => (sg.n, false),
            };
            let stop = if at + len == sg.n { end } else { sg.col + at + len };
            if kept {
                for r in 0..job.rows() {
                    w.s[r * LDS + sg.col + at + len..r * LDS + stop].fill(f32::NEG_INFINITY);
                }
            } else if let Some(bm) = skippable.filter(|_| listed_only(band, sg.j0 + at, len)) {
                // SAFETY: the CPU supports `S` (the caller's contract); the piece starts on a block
                // edge inside every row's band, its columns up to `stop` whole vectors.
                if unsafe { select_listed::<S>(bm, job, w, (sg.col + at, sg.j0 + at, len), stop) } {
                    (masked, clean) = (true, 0..0);
                }
            } else {
                for r in 0..job.rows() {
                    let (h, i) = job.head_query(r);
                    let row = &mut w.s[r * LDS + sg.col + at..r * LDS + stop];
                    // SAFETY: the CPU supports `S` (the caller's contract); `row` starts and ends on
                    // vector edges (whole-vector segments cut at block edges, `width` a multiple of
                    // `S::W`).
                    let m = unsafe {
                        mask_row::<S>(pb, [job.b, h, i], row, len, sg.j0 + at, w.range[r], None, &mut w.blocks)
                    };
                    if m.elementwise {
                        (masked, clean) = (true, 0..0);
                    }
                    if m.a > 0 || m.z < len || m.empty {
                        masked = true;
                        clean = if m.empty { 0..0 } else { clean.start.max(at + m.a)..clean.end.min(at + m.z) };
                    }
                }
            }
            at += len;
        }
        w.clean.push(clean.start..clean.end.max(clean.start));
    }
    masked
}

/// Whether [`select_listed`] may mask the piece of keys `j0..j0 + len` (the job's rows needing
/// nothing but the block mask): it starts on a block edge and lies inside every row's band.
fn listed_only(band: (usize, usize), j0: usize, len: usize) -> bool {
    j0.is_multiple_of(SPARSE_BLOCK) && band.0 <= j0 && j0 + len <= band.1
}

/// [`mask_row`] on every row of a job inside one query block, for a piece of keys `j0..j0 + len`
/// (scored in the tile's columns `col..`) where the call has no mask but the block mask and the
/// piece passes [`listed_only`]: the piece's blocks found once for all rows
/// ([`BlockMask::segments`]), then per row nothing for a full block, and for a partial (or empty)
/// one a vector select per `W` columns straight from the row's word of the block; the columns
/// from the piece's end to `stop` become −∞. The same scores as `mask_row` (its band and element
/// masks do nothing here), without its per-row search and assembly of the tile's words, which
/// held a measurable share of a Longformer forward's tile time (see docs/performance-log.md,
/// "attn-kernels/src/flash/scores.rs: select_listed"). Returns whether a key of the piece was
/// masked.
///
/// # Safety
/// The CPU supports `S`'s instruction set; the piece's columns from `col` to `stop` are whole
/// vectors of `w.s` (every piece of a tile but its last ends on a block edge; the last runs to the
/// padded width).
#[inline(always)]
unsafe fn select_listed<S: Simd>(
    bm: &BlockMask,
    job: &Job,
    w: &mut Work,
    (col, j0, len): (usize, usize, usize),
    stop: usize,
) -> bool {
    let segs = bm.segments(job.b, job.h0, job.i0 / SPARSE_BLOCK, j0, len, &mut w.blocks);
    // Every vector the selects below touch lies in each row's `stop − col` columns.
    assert!(segs.iter().all(|&(at, n, _)| at + n.next_multiple_of(S::W) <= stop - col), "select_listed: piece");
    let mut masked = false;
    for r in 0..job.rows() {
        // [keys]: the row's columns from the piece's start to `stop`.
        let row = &mut w.s[r * LDS + col..r * LDS + stop];
        for &(at, n, seg) in segs {
            let word = match seg {
                TileSeg::Full => continue,
                TileSeg::Empty => 0,
                TileSeg::Partial(entry) => bm.block_word(entry, job.i0 + r),
            };
            // SAFETY: the CPU supports `S`; the segment's vectors lie in `row` (asserted above),
            // and a segment lies in one block, so its bits are the first word's.
            masked |= unsafe { select_kept::<S>(&mut row[at..], &[word, 0, 0, 0], n) };
        }
        row[len..].fill(f32::NEG_INFINITY);
    }
    masked
}

/// The run of keys from `j0` (at most `n`) that [`mask_tile`] masks as one piece, and whether it
/// needs no mask: whole blocks listed full by `bm` for the job's one query block and inside every
/// row's `band`, with no element mask or score step in the call (the caller's `skippable`), or
/// the blocks up to the next such block. Cut at block edges.
#[inline(always)]
fn kept_run(bm: &BlockMask, job: &Job, band: (usize, usize), j0: usize, n: usize) -> (usize, bool) {
    let block_at = |j: usize| {
        let len = ((j / SPARSE_BLOCK + 1) * SPARSE_BLOCK).min(j0 + n) - j;
        let kept = band.0 <= j && j + len <= band.1 && bm.full_over(job.b, job.h0, job.i0 / SPARSE_BLOCK, j, len);
        (len, kept)
    };
    let (mut len, kept) = block_at(j0);
    while len < n {
        let (next, k) = block_at(j0 + len);
        if k != kept {
            break;
        }
        len += next;
    }
    (len, kept)
}

/// What [`mask_row`] did to one row of a tile of keys `j0..j0+n`.
pub(in crate::flash) struct RowMasked {
    /// Whether the bias, the keep-mask or the block mask masked a key of the tile.
    pub elementwise: bool,
    /// The row's band within the tile, `a..z` (tile columns).
    pub a: usize,
    pub z: usize,
    /// Whether the row's band is empty (every key masked).
    pub empty: bool,
}

/// The derivatives the backward's chain rule needs from [`mask_row`], per column of the row:
/// the score modification's `∂f/∂x` at the scaled dot product `x` (`dmod`) and the soft-cap's
/// `1 − tanh²` at the modified score (`dcap`), each 1 without its step.
pub(in crate::flash) struct RowDerivs<'r> {
    pub dmod: &'r mut [f32],
    pub dcap: &'r mut [f32],
}

/// Masks one row of raw scores of keys `j0..j0+n` (`row` padded to whole vectors) in the
/// reference's order: score modification, soft-cap, bias, keep-mask, block mask, then the row's
/// band `lo..hi`; columns from `n` on become −∞. With `derivs`, also writes there the
/// modification's and the soft-cap's derivatives (the backward's chain rule). Forward and
/// backward mask through this one function.
///
/// # Safety
/// The CPU supports `S`'s instruction set; `row.len()` is a multiple of `S::W`, `>= n`, and so are
/// the derivative rows.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(in crate::flash) unsafe fn mask_row<S: Simd>(
    pb: &Problem<f32>,
    [b, h, i]: [usize; 3],
    row: &mut [f32],
    n: usize,
    j0: usize,
    (lo, hi): (usize, usize),
    mut derivs: Option<RowDerivs>,
    tiles: &mut TileBlocks,
) -> RowMasked {
    match (pb.score_mod, derivs.as_mut()) {
        (Some(f), d) => f.m.score_row(f.table, [b, h, i], j0, &mut row[..n], d.map(|d| &mut d.dmod[..n])),
        (None, Some(d)) => d.dmod.fill(1.0),
        (None, None) => {}
    }
    if let Some(cap) = pb.softcap {
        // SAFETY: the CPU supports `S` (the caller's contract); `row` is whole vectors.
        unsafe { softcap_row::<S>(row, cap as f32, derivs.map(|d| d.dcap)) };
    } else if let Some(d) = derivs {
        d.dcap.fill(1.0);
    }
    row[n..].fill(f32::NEG_INFINITY);
    let mut elementwise = false;
    if let Some(bias) = pb.elem.bias {
        let (bv, st) = bias.row(b, h, i);
        // SAFETY: the CPU supports `S` (the caller's contract).
        elementwise |= unsafe { add_bias::<S>(&mut row[..n], bv, st, j0) };
    }
    if let Some(keep) = pb.elem.keep {
        let (kv, st) = keep.row(b, h, i);
        elementwise |= apply_keep(&mut row[..n], kv, st, j0);
    }
    if let Some(bm) = pb.elem.block {
        let words = bm.keep_bits(b, h, i, j0, n, tiles);
        // SAFETY: the CPU supports `S` (the caller's contract); `row` is whole vectors, `>= n`.
        elementwise |= unsafe { select_kept::<S>(row, &words, n) };
    }
    let row = &mut row[..n];
    let (a, z) = (lo.clamp(j0, j0 + n) - j0, hi.clamp(j0, j0 + n) - j0);
    let empty = lo >= hi;
    if empty {
        row.fill(f32::NEG_INFINITY);
    } else {
        row[..a].fill(f32::NEG_INFINITY);
        row[z..].fill(f32::NEG_INFINITY);
    }
    RowMasked { elementwise, a, z, empty }
}
