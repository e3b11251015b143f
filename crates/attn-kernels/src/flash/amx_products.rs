//! The bfloat16 products on AMX tiles ([`crate::amx::Tiles`]), in place of the vector
//! micro-kernels when a call runs on tiles (`Ctx::tiles`, `BwdCtx::tiles`): [`qk`]
//! (`S = scale · Q·Kᵀ`, the forward's and the backward's), [`pv`] (`O += P·V`, and the backward's
//! `dQ += dX·K`) and [`reduce_rows`] (the backward's `dV += P̄ᵀ·dO`, `dK += dXᵀ·Q`), each blocked
//! as two tiles of 16 rows × two tiles of 16 columns (four accumulators, two operand tiles of each
//! side per step: [`block`]). The operands are the vector path's
//! packings, read as tiles where they lie: the key pair panels of `pack::pack_head` (a panel row,
//! `2·W = 32` keys, is two tile rows' worth), the value pairs after them, and the probability
//! pairs of `pairs::pair_keys` (a pair's slot index is the same on both sides, which is all a
//! tile product asks). Only the queries are stored anew: row-major bfloat16 pairs ([`prepare`]);
//! for [`reduce_rows`], the backward's `dO` or `Q` rows as columns in pairs of rows
//! ([`prepare_columns`]).
//! Rows run in blocks of 32, the queries' padding rows zero; results pass through a small buffer
//! so that only the block's real rows are written. Needs `Dk` and `Dv` multiples of 32 and
//! `W = 16` ([`fits`]). The two products are never inlined: one copy per tile unit, whatever the
//! kernels that call them (a tile product is thousands of cycles; a call is nothing beside it).

use std::ops::Range;

use super::block::TileWork;
use super::key_tiles::Seg;
use super::pack::pair;
use crate::amx::{Tiles, TILE_ROWS, TILE_SLOTS};
use crate::simd::KvElem;

/// Rows per block: two tiles.
const BLOCK: usize = 2 * TILE_ROWS;
/// Floats of the four accumulators' buffer.
pub(super) const ACC_LEN: usize = 4 * TILE_ROWS * TILE_SLOTS;

/// Whether a call of head dimensions `dk`, `dv` with vector width `w` can run on tiles.
pub(super) fn fits(dk: usize, dv: usize, w: usize) -> bool {
    w == 16 && dk > 0 && dk.is_multiple_of(BLOCK) && dv > 0 && dv.is_multiple_of(BLOCK)
}

/// Runs `$body` with `$t` the tiles of `$unit`: the CPU's, or the software model in `$emulated`
/// (an `Option<Box<Emulated>>`, made on first use).
macro_rules! on_unit {
    ($unit:expr, $emulated:expr, $t:ident => $body:expr) => {
        match $unit {
            $crate::amx::TileUnit::Hardware => {
                let $t = &mut $crate::amx::Hardware;
                $body
            }
            $crate::amx::TileUnit::Emulated => {
                let $t = $emulated.get_or_insert_with(Default::default).as_mut();
                $body
            }
        }
    };
}
pub(super) use on_unit;

/// Readies a block's buffers: the query rows `row(0..rows)` (each `Dk` long) as bfloat16 pairs
/// in `tw.q`, row `r` at `r · Dk/2` (`tw.ldq`), the rows up to the next multiple of 32 zero; the
/// accumulators' buffer.
pub(super) fn prepare<'a>(tw: &mut TileWork, rows: usize, row: impl Fn(usize) -> &'a [f32], dk: usize) {
    let ld = dk / 2;
    tw.ldq = ld;
    tw.acc.resize(ACC_LEN, 0.0);
    let dst = &mut tw.q;
    dst.clear();
    dst.resize(rows.div_ceil(BLOCK) * BLOCK * ld, 0.0);
    for (r, out) in dst.chunks_exact_mut(ld).take(rows).enumerate() {
        let q = row(r);
        for (x, p) in out.iter_mut().zip(q.chunks_exact(2)) {
            *x = pair(p[0].bf16_bits(), p[1].bf16_bits());
        }
    }
}

/// `s[r][seg.col + c] = scale · q_r · k_{seg.j0 + c}` for every row `r < rows` and every column `c`
/// of each segment's whole panels: `q` the rows of [`prepare`] (stride `ldq`), `panels` the
/// head's key pair panels (`ldq` slots deep, 32 keys wide), `s` at row stride `lds`, `acc` a
/// buffer of [`ACC_LEN`] floats.
///
/// # Safety
/// The tiles are configured on this thread; `q` holds `rows` rounded up to 32 rows; `panels` holds
/// every panel of the segments' keys; `s` holds `rows` rows of `lds` ≥ each segment's columns
/// rounded up to 32.
#[inline(never)]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn qk<T: Tiles>(
    t: &mut T,
    q: &[f32],
    ldq: usize,
    panels: &[f32],
    segs: &[Seg],
    scale: f32,
    s: *mut f32,
    lds: usize,
    rows: usize,
    acc: &mut [f32],
) {
    const PW: usize = 2 * TILE_SLOTS;
    let panel_len = ldq * PW;
    for r0 in (0..rows).step_by(BLOCK) {
        for sg in segs {
            for pi in 0..sg.n.div_ceil(PW) {
                let kp = panels[(sg.j0 / PW + pi) * panel_len..][..panel_len].as_ptr();
                let qa = q[r0 * ldq..].as_ptr();
                // SAFETY: the tiles are configured; the query rows `r0..r0 + 32` and the panel's
                // `ldq` rows of 32 slots exist (the caller's contract and the slices above); `acc`
                // holds the four accumulators, and `s` the block's real rows at the panel's 32
                // columns (the caller's contract).
                unsafe {
                    block(t, (0..ldq).step_by(TILE_SLOTS).map(|k0| (qa.add(k0), ldq, kp.add(k0 * PW), PW)));
                    store_block(t, acc, rows - r0, |r, c, x| *s.add((r0 + r) * lds + sg.col + pi * PW + c) = scale * x)
                };
            }
        }
    }
}

/// `o[r] += P_r · V` over the tile's segments for every row `r < rows`: `p` the probability pairs
/// of `pairs::pair_keys` (row stride `ldp`, the tile's columns from slot 0), `vpairs` the head's
/// value pairs (`dv` slots per pair of keys), `o` at row stride `dv`, `acc` a buffer of
/// [`ACC_LEN`].
///
/// # Safety
/// The tiles are configured on this thread; `p` holds `rows` rounded up to 32 rows of the tile's
/// columns rounded up to 32 (as slots, half that); `vpairs` the pairs of every segment's keys
/// rounded up to 32; `o` `rows` rows of `dv`, a multiple of 32.
#[inline(never)]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn pv<T: Tiles>(
    t: &mut T,
    p: &[f32],
    ldp: usize,
    vpairs: &[f32],
    segs: &[Seg],
    dv: usize,
    o: &mut [f32],
    rows: usize,
    acc: &mut [f32],
) {
    for r0 in (0..rows).step_by(BLOCK) {
        for c0 in (0..dv).step_by(BLOCK) {
            let steps = segs.iter().flat_map(|sg| {
                (0..sg.n.div_ceil(2 * TILE_SLOTS))
                    .map(move |g| (sg.col / 2 + g * TILE_SLOTS, sg.j0 / 2 + g * TILE_SLOTS))
            });
            // SAFETY: the tiles are configured; every row and slot read lies in `p` and `vpairs`
            // (the caller's contract): a segment's slots are its columns' halves, rounded to 16.
            unsafe {
                let (pa, vb) = (p.as_ptr().add(r0 * ldp), vpairs.as_ptr().add(c0));
                block(t, steps.map(|(a, k)| (pa.add(a), ldp, vb.add(k * dv), dv)));
                store_block(t, acc, rows - r0, |r, c, x| o[(r0 + r) * dv + c0 + c] += x);
            }
        }
    }
}

/// `acc[j][i] += Σ_p a[i][p] · b[p][j]` for `i < m`, `j < n`: a reduction over pairs `p` of
/// query rows, as `dV += P̄ᵀ·dO` and `dK += dXᵀ·Q` take it, computed transposed (`dVᵀ = dOᵀ·P̄`)
/// so that both operands are ready-made: `a` the rows' columns in pairs of rows
/// ([`prepare_columns`], stride `lda` slots, a multiple of 16), `b` the pairs of
/// `pairs::pair_rows` (`P̄` or `dX`, stride `ldb`); `acc` at row stride `m`, `buf` a buffer of
/// [`ACC_LEN`].
///
/// # Safety
/// The tiles are configured on this thread; `a` holds `m` (a multiple of 32) rows of `lda` slots;
/// `b` holds `lda` rows (those past the real pairs zero) of `ldb` ≥ `n` rounded up to 32; `acc`
/// holds `n` rows of `m`.
#[inline(never)]
#[allow(clippy::too_many_arguments)]
pub(in crate::flash) unsafe fn reduce_rows<T: Tiles>(
    t: &mut T,
    a: &[f32],
    lda: usize,
    b: *const f32,
    ldb: usize,
    m: usize,
    n: usize,
    acc: &mut [f32],
    buf: &mut [f32],
) {
    for r0 in (0..m).step_by(BLOCK) {
        for c0 in (0..n).step_by(BLOCK) {
            let aa = a[r0 * lda..].as_ptr();
            // SAFETY: the tiles are configured; rows `r0..r0 + 32` of `a` and the `lda` rows of
            // `b` at columns `c0..c0 + 32` exist (the caller's contract).
            unsafe {
                block(t, (0..lda).step_by(TILE_SLOTS).map(|k0| (aa.add(k0), lda, b.add(k0 * ldb + c0), ldb)));
                store_block(t, buf, BLOCK, |r, c, x| {
                    if c0 + c < n {
                        acc[(c0 + c) * m + r0 + r] += x;
                    }
                });
            }
        }
    }
}

/// `a[c][p]` = the pair of rows `2p`, `2p + 1` of `row(·)` at column `c < dim` (the second 0 past
/// `rows`), for the pairs `seeing` (a range of `0..⌈rows/2⌉`), 0 for the others and up to the
/// returned stride: `⌈rows/2⌉` rounded up to 16 slots. [`reduce_rows`]'s left operand.
pub(in crate::flash) fn prepare_columns<'a>(
    a: &mut Vec<f32>,
    rows: usize,
    row: impl Fn(usize) -> &'a [f32],
    dim: usize,
    seeing: Range<usize>,
) -> usize {
    let ld = rows.div_ceil(2).div_ceil(TILE_SLOTS) * TILE_SLOTS;
    a.clear();
    a.resize(dim * ld, 0.0);
    for p in seeing {
        let (lo, hi) = (row(2 * p), (2 * p + 1 < rows).then(|| row(2 * p + 1)));
        for (c, &x) in lo[..dim].iter().enumerate() {
            a[c * ld + p] = pair(x.bf16_bits(), hi.map_or(0, |h| h[c].bf16_bits()));
        }
    }
    ld
}

/// Tiles 0–3 (the accumulators of a 32 × 32 block, as [`store_block`] reads them) =
/// `Σ A·B` over `steps`, each `(a, lda, b, ldb)`: `A` 32 rows of 16 slots at `a` (stride `lda`),
/// `B` 16 rows of 32 slots at `b` (stride `ldb`).
///
/// # Safety
/// The tiles are configured on this thread; every step's rows lie in memory.
#[inline(always)]
unsafe fn block<T: Tiles>(t: &mut T, steps: impl Iterator<Item = (*const f32, usize, *const f32, usize)>) {
    // SAFETY: configured, and each step's tiles readable (the caller's contract).
    unsafe {
        t.zero::<0>();
        t.zero::<1>();
        t.zero::<2>();
        t.zero::<3>();
        for (a, lda, b, ldb) in steps {
            t.load::<4>(a, lda);
            t.load::<5>(a.add(TILE_ROWS * lda), lda);
            t.load::<6>(b, ldb);
            t.load::<7>(b.add(TILE_SLOTS), ldb);
            t.dot::<0, 4, 6>();
            t.dot::<1, 4, 7>();
            t.dot::<2, 5, 6>();
            t.dot::<3, 5, 7>();
        }
    }
}

/// The four accumulators (tiles 0–3: rows `0..16` × columns `0..16`, `0..16` × `16..32`,
/// `16..32` × `0..16`, `16..32` × `16..32`) stored to `acc`, then `put(r, c, x)` for each of the
/// block's first `real` rows (at most 32) and its 32 columns.
///
/// # Safety
/// The tiles are configured on this thread.
#[inline(always)]
unsafe fn store_block<T: Tiles>(t: &mut T, acc: &mut [f32], real: usize, mut put: impl FnMut(usize, usize, f32)) {
    assert_eq!(acc.len(), ACC_LEN, "the accumulators' buffer");
    let a = acc.as_mut_ptr();
    let tile = TILE_ROWS * TILE_SLOTS;
    // SAFETY: configured (the caller's contract); `acc` holds four tiles of 16 × 16 (asserted).
    unsafe {
        t.store::<0>(a, TILE_SLOTS);
        t.store::<1>(a.add(tile), TILE_SLOTS);
        t.store::<2>(a.add(2 * tile), TILE_SLOTS);
        t.store::<3>(a.add(3 * tile), TILE_SLOTS);
    }
    for r in 0..real.min(BLOCK) {
        for c in 0..BLOCK {
            let which = (r / TILE_ROWS) * 2 + c / TILE_SLOTS;
            put(r, c, acc[which * tile + (r % TILE_ROWS) * TILE_SLOTS + c % TILE_SLOTS]);
        }
    }
}
