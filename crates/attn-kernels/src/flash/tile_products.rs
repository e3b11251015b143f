//! The forward's two bfloat16 products on AMX tiles ([`crate::amx::Tiles`]), in place of the
//! vector micro-kernels when a call runs on tiles (`Ctx::tiles`): [`qk`] (`S = scale · Q·Kᵀ`) and
//! [`pv`] (`O += P·V`), each blocked as two tiles of 16 rows × two tiles of 16 columns (four
//! accumulators, two operand tiles of each side per step). The operands are the vector path's
//! packings, read as tiles where they lie: the key pair panels of `pack::pack_head` (a panel row,
//! `2·W = 32` keys, is two tile rows' worth), the value pairs after them, and the probability
//! pairs of `pairs::pair_keys` (a pair's slot index is the same on both sides, which is all a
//! tile product asks). Only the queries are stored anew: row-major bfloat16 pairs ([`prepare`]).
//! Rows run in blocks of 32, the queries' padding rows zero; results pass through a small buffer
//! so that only the block's real rows are written. Needs `Dk` and `Dv` multiples of 32 and
//! `W = 16` ([`fits`]).

use super::block::TileWork;
use super::forward::tiles::Seg;
use super::pack::pair;
use super::simd::KvElem;
use crate::amx::{Tiles, TILE_ROWS, TILE_SLOTS};

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
                // SAFETY: the tiles are configured; the query rows `r0..r0 + 32` and the panel's
                // `ldq` rows of 32 slots exist (the caller's contract and the slice above).
                unsafe {
                    t.zero::<0>();
                    t.zero::<1>();
                    t.zero::<2>();
                    t.zero::<3>();
                    for k0 in (0..ldq).step_by(TILE_SLOTS) {
                        let qa = q.as_ptr().add(r0 * ldq + k0);
                        t.load::<4>(qa, ldq);
                        t.load::<5>(qa.add(TILE_ROWS * ldq), ldq);
                        t.load::<6>(kp.add(k0 * PW), PW);
                        t.load::<7>(kp.add(k0 * PW + TILE_SLOTS), PW);
                        t.dot::<0, 4, 6>();
                        t.dot::<1, 4, 7>();
                        t.dot::<2, 5, 6>();
                        t.dot::<3, 5, 7>();
                    }
                }
                // SAFETY: the tiles are configured; `acc` holds the four accumulators, and `s` the
                // block's real rows at the panel's 32 columns (the caller's contract).
                unsafe {
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
            // SAFETY: the tiles are configured; every row and slot read lies in `p` and `vpairs`
            // (the caller's contract): a segment's slots are its columns' halves, rounded to 16.
            unsafe {
                t.zero::<0>();
                t.zero::<1>();
                t.zero::<2>();
                t.zero::<3>();
                for sg in segs {
                    for g in (0..sg.n.div_ceil(2 * TILE_SLOTS)).map(|g| g * TILE_SLOTS) {
                        let pa = p.as_ptr().add(r0 * ldp + sg.col / 2 + g);
                        let vb = vpairs.as_ptr().add((sg.j0 / 2 + g) * dv + c0);
                        t.load::<4>(pa, ldp);
                        t.load::<5>(pa.add(TILE_ROWS * ldp), ldp);
                        t.load::<6>(vb, dv);
                        t.load::<7>(vb.add(TILE_SLOTS), dv);
                        t.dot::<0, 4, 6>();
                        t.dot::<1, 4, 7>();
                        t.dot::<2, 5, 6>();
                        t.dot::<3, 5, 7>();
                    }
                }
                store_block(t, acc, rows - r0, |r, c, x| o[(r0 + r) * dv + c0 + c] += x);
            }
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
