//! `O += P · V` for one tile of the forward: the probabilities of the block's rows times the
//! value rows of the tile's segments (runs of keys gathered side by side, `tiles`), through the
//! `pv` micro-kernel (`R` rows × four or one vectors of `Dv` per call) with a scalar tail for the
//! columns of `Dv` beyond the last whole vector. The path per column run is chosen by
//! `flash::nonfinite::bad_columns`: value rows holding a non-finite number are added one product at
//! a time, skipping the rows that mask them; every other run of columns goes through the
//! micro-kernel. With bfloat16 products ([`accumulate_bf16`]) the tile's probabilities are rounded
//! to bfloat16 pairs and multiplied into the packed value pairs; a tile with such value rows takes
//! the f32 path instead.

use std::ops::Range;

use crate::amx::TileUnit;
use crate::flash::amx_products::{self, on_unit};
use crate::flash::block::{rows_per_call, with_rows, Work, LDS};
use crate::flash::micro::{pv, pv_scalar, Bf16Pairs, Fma, Product};
use crate::flash::nonfinite::BadColumn;
use crate::flash::pairs::pair_keys;
use crate::simd::{KvElem, Simd};

use crate::flash::key_tiles::{tile_columns, Seg};

/// Row stride of the probability pairs in `Work::p2`.
const LDP: usize = LDS / 2;

/// `o: [rows, dv] += P · V` for the tile `segs` with bfloat16 products: `P` the probabilities in
/// `w.s` (columns from the tile's end on are set to 0 here), rounded to bfloat16 pairs in `w.p2`,
/// each segment's times its keys' pairs in `vpairs`, the head's value pairs as `pack::pack_head`
/// lays them out; on `tiles` when given (`amx_products::pv`), else the `pv` micro-kernel.
///
/// # Safety
/// The CPU supports `S`'s instruction set; every segment starts (in keys and in columns) at a
/// multiple of `2·S::W` and every one but the last spans whole multiples of it; `vpairs` holds the
/// pairs of keys `0..j0 + n` rounded up to `2·S::W` keys, `dv` slots each, for each segment's
/// `j0..j0 + n`; `o` holds `rows` rows of `dv`; with `tiles`, they are configured on this thread
/// and the call fits them (`amx_products::fits`).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn accumulate_bf16<S: Simd>(
    w: &mut Work,
    rows: usize,
    vpairs: &[f32],
    segs: &[Seg],
    dv: usize,
    o: &mut [f32],
    tiles: Option<TileUnit>,
) {
    let pw = 2 * S::W;
    let n = tile_columns(segs);
    let width = n.div_ceil(pw) * pw;
    // Tiles read whole blocks of 32 rows (the rows past `rows` only make rows that are dropped).
    let room = if tiles.is_some() { rows.div_ceil(32) * 32 } else { rows } * LDP;
    if w.p2.len() < room {
        w.p2.resize(room, 0.0);
    }
    // SAFETY: the CPU supports `S` (the caller's contract); `w.s` holds `rows` rows of `LDS >=
    // width` floats and `w.p2` `rows` rows of `LDP >= width / 2`.
    unsafe { pair_keys::<S>(w.s.as_mut_ptr(), LDS, rows, n, width, w.p2.as_mut_ptr(), LDP) };
    if let Some(unit) = tiles {
        let tw = &mut w.tiles;
        // SAFETY: the tiles are configured by the caller (`forward::run`); `w.p2` holds `room`
        // rows, `vpairs` and `o` as the caller guarantees, `dv` a multiple of 32 (`fits`).
        unsafe {
            on_unit!(unit, tw.emulated, t => amx_products::pv(t, &w.p2, LDP, vpairs, segs, dv, o, rows, &mut tw.acc))
        };
        return;
    }
    for sg in segs {
        let pairs = sg.n.div_ceil(pw) * pw / 2;
        // SAFETY: the CPU supports `S`; `w.p2` holds `rows` rows of `width / 2` pairs at stride
        // `LDP`, the segment's from `col / 2`; `vpairs` the pairs of keys `j0..j0 + 2·pairs` from
        // slot `j0 / 2 · dv` (the caller's contract).
        unsafe {
            let (p, v) = (w.p2.as_ptr().add(sg.col / 2), vpairs.as_ptr().add(sg.j0 / 2 * dv));
            pv_block::<S, Bf16Pairs, f32>(p, LDP, 1, v, dv, pairs, o.as_mut_ptr(), dv, rows);
        }
    }
}

/// `o: [rows, dv] += P · V` for the tile `segs`: `P` the probabilities `[rows, columns]` in
/// `w.s`, `V` each segment's value rows in the head at `v` (row stride `ldv`); the columns listed
/// in `bad` (non-finite value rows, with the block rows masking each, in column order) are added
/// one product at a time, skipping the rows that mask them.
///
/// # Safety
/// The CPU supports `S`'s instruction set; `v` is valid for the segments' rows of `dv` elements
/// at stride `ldv`; `o` holds `rows` rows of `dv`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn accumulate<S: Simd, E: KvElem>(
    w: &Work,
    rows: usize,
    v: *const E,
    ldv: usize,
    segs: &[Seg],
    dv: usize,
    o: &mut [f32],
    bad: &[BadColumn],
) {
    let p = w.s.as_ptr();
    let op = o.as_mut_ptr();
    let mut skip = bad.iter().map(|b| b.0).peekable();
    for sg in segs {
        let (mut c, end) = (sg.col, sg.col + sg.n);
        while c < end {
            let run_end = skip.next_if(|&x| x < end).unwrap_or(end);
            if run_end > c {
                // SAFETY: the CPU supports `S` and `o` holds `rows` rows of `dv` (the caller's
                // contract); columns `c..run_end` of P (`rows` rows at stride `LDS`) and the
                // segment's value rows from `j0 + c − col` exist.
                unsafe {
                    let vr = v.add((sg.j0 + c - sg.col) * ldv);
                    pv_block::<S, Fma, E>(p.add(c), LDS, 1, vr, ldv, run_end - c, op, dv, rows);
                }
            }
            c = run_end + 1;
        }
    }
    for (c, j, masked) in bad {
        // SAFETY: value row `j` exists with `dv` elements (the caller's contract).
        let vrow = unsafe { std::slice::from_raw_parts(v.add(j * ldv), dv) };
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
/// micro-kernel and a scalar column tail, multiplied as `P` multiplies. The keys go chunk by
/// chunk of [`value_chunk`] keys, every row group over a chunk before the next ([`pv_spans`]
/// for each), so that a chunk's value rows stay in L1 for all the rows, where a whole tile of them
/// read once per row group came from L2 every time; the sums per output element still run over
/// `j` in ascending order. The forward's products and the backward's bfloat16 `dQ` use it.
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
    let kc = value_chunk::<E>(ldv.max(dv));
    for j0 in (0..n).step_by(kc) {
        let m = kc.min(n - j0);
        // SAFETY: forwarded; the chunk's keys `j0..j0 + m` lie within `0..n`.
        unsafe { pv_spans::<S, P, E>(p.add(j0 * ldj), ldp, ldj, v.add(j0 * ldv), ldv, o, dv, rows, |_, _| 0..m) }
    }
}

/// [`pv_block`] where each call's rows `r0..r0 + nr` (at most the pv rows per call) reduce over
/// `span(r0, nr)` only, a part of `0..n` outside which their `p` is 0: the backward skips the
/// keys (or query rows) a causal or window band hides from a tile's rows. Skipping `0·v` leaves
/// every sum as it was (up to the sign of a zero), for finite `v`.
///
/// The calls go row group by row group over the whole span, each over the columns of `V` in
/// blocks of four vectors on AVX-512 (two on 8-lane ISAs), then single vectors, then a scalar
/// tail. (The backward's products, at most a tile of 64 keys or 48 rows each, run here
/// directly: cutting them into chunks as [`pv_block`] does, with the chunk loop outside or
/// inside the row groups, made the backward slower; see docs/performance-log.md,
/// "attn-kernels/src/flash/forward/accumulate.rs: pv_spans".)
///
/// # Safety
/// As [`pv_block`], for every `j` of every span.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(in crate::flash) unsafe fn pv_spans<S: Simd, P: Product, E: KvElem>(
    p: *const f32,
    ldp: usize,
    ldj: usize,
    v: *const E,
    ldv: usize,
    o: *mut f32,
    dv: usize,
    rows: usize,
    span: impl Fn(usize, usize) -> Range<usize>,
) {
    let (_, rp) = rows_per_call::<S>();
    let mut r0 = 0;
    // SAFETY: the CPU supports `S` (the caller's contract); every call stays within `rows` rows,
    // `dv` columns and its span of `j`, which the caller guarantees valid.
    unsafe {
        while r0 < rows {
            let nr = rp.min(rows - r0);
            let js = span(r0, nr);
            let (n, or) = (js.len(), o.add(r0 * dv));
            if n == 0 {
                r0 += nr;
                continue;
            }
            let (pr, v) = (p.add(r0 * ldp + js.start * ldj), v.add(js.start * ldv));
            let mut c0 = 0;
            // Blocks of `PV_VECTORS` vectors of columns, then single vectors (see `rows_per_call`).
            match S::PV_VECTORS {
                4 => pv_columns::<S, P, E, 4>(pr, ldp, ldj, v, ldv, n, or, dv, nr, &mut c0),
                2 => pv_columns::<S, P, E, 2>(pr, ldp, ldj, v, ldv, n, or, dv, nr, &mut c0),
                _ => unreachable!("pv blocks are 2 or 4 vectors"),
            }
            pv_columns::<S, P, E, 1>(pr, ldp, ldj, v, ldv, n, or, dv, nr, &mut c0);
            if c0 < dv {
                pv_scalar::<P, E>(pr, ldp, ldj, v, ldv, n, or, dv, nr, c0..dv);
            }
            r0 += nr;
        }
    }
}

/// The `pv` calls of `nr` rows over columns `c0..` in blocks of `NV` vectors while a whole block
/// fits in `dv`, advancing `c0` past them.
///
/// # Safety
/// As [`pv_spans`], for these rows.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn pv_columns<S: Simd, P: Product, E: KvElem, const NV: usize>(
    p: *const f32,
    ldp: usize,
    ldj: usize,
    v: *const E,
    ldv: usize,
    n: usize,
    o: *mut f32,
    dv: usize,
    nr: usize,
    c0: &mut usize,
) {
    while *c0 + NV * S::W <= dv {
        // SAFETY: forwarded from the caller; the block's columns end within `dv`.
        unsafe { with_rows!(S::PV_ROWS, nr, pv::<S, P, E; { NV }>(p, ldp, ldj, v, ldv, n, o, dv, *c0)) };
        *c0 += NV * S::W;
    }
}

/// Keys per chunk of [`pv_block`]: as many value rows of `row` elements (the row stride, or the
/// row when the rows are packed tighter) as fill half of this CPU's L1 data cache, at least 16.
/// Half, so that the chunk's rows, wherever their stride puts them in the cache's sets, leave
/// ways for the probabilities and output rows: such chunks were faster than whole tiles per row
/// group, a quarter of L1 less so (see docs/performance-log.md,
/// "attn-kernels/src/flash/forward/accumulate.rs: value_chunk").
fn value_chunk<E>(row: usize) -> usize {
    (crate::flash::cache::caches().l1d / 2 / (row * std::mem::size_of::<E>()).max(1)).max(16)
}
