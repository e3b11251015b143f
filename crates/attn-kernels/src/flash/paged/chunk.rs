//! One chunk of a paged task ([`chunk`]): the scores of a block's query rows against a chunk's
//! keys, their online-softmax step and the values' products, reading the pages in place or the
//! rows widened (dequantized) into the worker's buffers; the row widening itself.

use super::{Scratch, CHUNK, ROWS};
use crate::flash::forward::accumulate::pv_block;
use crate::flash::micro::Fma;
use crate::flash::scores::decode_scores;
use crate::paged::{fp8_decode, Pages, Q8_BLOCK};
use crate::simd::{self, KvElem, Simd};

/// Keys per step of the scores and of `P·V` across a chunk's heads (see [`chunk`]): four are a
/// call of the scores' micro-kernel; eight value rows per head keep the output rows' loads and
/// stores a small part of each call.
const QK_STEP: usize = 4;
const PV_STEP: usize = 8;

/// Keys `x0..x0 + n` of a chunk, whose rows (of one head) lie `key_rows` rows apart from `row`
/// on: one call of each micro-kernel per head.
#[derive(Clone, Copy)]
pub(super) struct Run {
    pub(super) x0: usize,
    pub(super) n: usize,
    pub(super) row: usize,
}

/// A chunk's rows as the micro-kernels read them: rows of `d` elements from `base`, head `y`'s row
/// of run `r` at `r.row + y·head_rows`, consecutive keys `key_rows` rows apart.
#[derive(Clone, Copy)]
pub(super) struct Rows<E> {
    pub(super) base: *const E,
    pub(super) d: usize,
    pub(super) key_rows: usize,
    pub(super) head_rows: usize,
}

impl<E> Rows<E> {
    /// Head `y`'s row of `run`'s first key, and the elements between consecutive keys.
    ///
    /// # Safety
    /// The row exists in the memory `base` points into.
    #[inline(always)]
    unsafe fn at(&self, run: &Run, y: usize) -> (*const E, usize) {
        // SAFETY: forwarded from the caller.
        (unsafe { self.base.add((run.row + y * self.head_rows) * self.d) }, self.key_rows * self.d)
    }
}

/// A task's block of query rows and the chunk of keys in flight: what [`chunk`] needs besides
/// the rows it reads.
pub(super) struct Block {
    /// The chunk's first key and its keys.
    pub(super) j0: usize,
    pub(super) n: usize,
    /// The key/value heads the block's rows use.
    pub(super) heads: std::ops::Range<usize>,
    /// The cache's key/value heads.
    pub(super) cache_heads: usize,
    pub(super) dk: usize,
    pub(super) dv: usize,
    /// Columns of a row of scores (`CHUNK` rounded up to whole vectors).
    pub(super) width: usize,
    pub(super) scale: f32,
    pub(super) softcap: Option<f32>,
    /// Query heads per key/value head.
    pub(super) group: usize,
    pub(super) lq: usize,
    /// The block's rows of its sequence, `r0..r0 + nr`.
    pub(super) r0: usize,
    pub(super) nr: usize,
}

impl Block {
    /// The block's rows (counted from `r0`) that key/value head `kvh` serves.
    fn rows_of_head(&self, kvh: usize) -> std::ops::Range<usize> {
        let (a, b) = (kvh * self.group * self.lq, (kvh + 1) * self.group * self.lq);
        a.max(self.r0) - self.r0..b.min(self.r0 + self.nr) - self.r0
    }
}

/// One chunk of a task: the scores of the block's rows against the chunk's keys (`k`, a call per
/// run of `w.runs` and head), their online-softmax step into `w.m`, `w.l` and `o: [nr, Dv]`, and
/// the probabilities times the values (`v`) of the heads whose rows saw a key. With `widen`, the
/// keys and then those values are first widened from the pages into `w.k` and `w.v`, which `k`
/// and `v` then read.
///
/// # Safety
/// The CPU has `S`'s instruction set; `k` and `v` hold every run's rows of the block's heads
/// (once widened, with `widen`); `w` is sized for the block as the task's setup makes it.
#[inline(always)]
pub(super) unsafe fn chunk<S: Simd, E: KvElem>(
    blk: &Block,
    w: &mut Scratch,
    o: &mut [f32],
    k: Rows<E>,
    v: Rows<E>,
    widen: Option<(&Pages, &Pages)>,
) {
    let (j0, n, width, h0) = (blk.j0, blk.n, blk.width, blk.heads.start);
    let (dk, dv, nh) = (blk.dk, blk.dv, blk.heads.len());
    if let Some((kp, _)) = widen {
        // Keys of every head the block uses gathered slot by slot: each slot's heads are one run
        // of memory, so the reads stream.
        for (x, &r) in w.slots.iter().enumerate() {
            for y in 0..nh {
                // SAFETY: the CPU has `S` (the caller's contract); rows were checked in bounds.
                unsafe { widen_row::<S>(kp, r + h0 + y, blk.cache_heads, dk, &mut w.k[(y * CHUNK + x) * dk..][..dk]) };
            }
        }
    }
    // Keys a few at a time across every head before the next few: a slot's heads are one run of
    // memory, so the reads go forward through the pages, as the hardware prefetchers follow.
    for run in &w.runs {
        for x in (0..run.n).step_by(QK_STEP) {
            let m = QK_STEP.min(run.n - x);
            for kvh in blk.heads.clone() {
                let rows = blk.rows_of_head(kvh);
                let (qh, sh) = (w.q[rows.start * dk..].as_ptr(), w.s[rows.start * width + run.x0 + x..].as_mut_ptr());
                // SAFETY: the CPU has `S`; `w.q` holds the head's rows of `dk`, `k` the run's
                // rows from `x` to `x + m`, `w.s` the head's rows of `width ≥ x0 + x + m` columns.
                unsafe {
                    let (kr, ld) = k.at(run, kvh - h0);
                    decode_scores::<S, E>(qh, dk, kr.add(x * ld), ld, m, dk, blk.scale, rows.len(), sh, width)
                };
            }
        }
    }
    let mut seen = [false; ROWS];
    for kvh in blk.heads.clone() {
        for r in blk.rows_of_head(kvh) {
            let srow = &mut w.s[r * width..][..width];
            let (lo, hi) = w.range[r];
            let (a, b) = (lo.clamp(j0, j0 + n) - j0, hi.clamp(j0, j0 + n) - j0);
            srow[..a].fill(f32::NEG_INFINITY);
            srow[b.max(a)..].fill(f32::NEG_INFINITY);
            seen[kvh - h0] |= a < b;
            // SAFETY: the CPU has `S`; the row holds `width`, a multiple of `S::W`, floats.
            unsafe {
                softmax_row::<S>(srow, a..b.max(a), blk.softcap, &mut w.m[r], &mut w.l[r], &mut o[r * dv..][..dv])
            };
        }
    }
    if let Some((_, vp)) = widen {
        for (x, &r) in w.slots.iter().enumerate() {
            for y in (0..nh).filter(|&y| seen[y]) {
                // SAFETY: as for the keys.
                unsafe { widen_row::<S>(vp, r + h0 + y, blk.cache_heads, dv, &mut w.v[(y * CHUNK + x) * dv..][..dv]) };
            }
        }
    }
    for run in &w.runs {
        for x in (0..run.n).step_by(PV_STEP) {
            let m = PV_STEP.min(run.n - x);
            for kvh in blk.heads.clone().filter(|&h| seen[h - h0]) {
                let rows = blk.rows_of_head(kvh);
                let oh = o[rows.start * dv..].as_mut_ptr();
                // SAFETY: the CPU has `S`; `w.s` holds the head's rows of probabilities at stride
                // `width` from column `x0 + x`, `v` the run's rows from `x` to `x + m`, `o` the
                // head's rows of `dv`.
                unsafe {
                    let (vr, ld) = v.at(run, kvh - h0);
                    let ph = w.s[rows.start * width + run.x0 + x..].as_ptr();
                    pv_block::<S, Fma, E>(ph, width, 1, vr.add(x * ld), ld, m, oh, dv, rows.len())
                };
            }
        }
    }
}

/// One row's online-softmax step over a chunk: the scores `s` (their allowed columns `cols`, the
/// rest already −∞) soft-capped, the running maximum `m` raised, the denominator `l` and the
/// output row `o` rescaled, and `s` replaced by the probabilities against the new maximum.
///
/// # Safety
/// The CPU has `S`'s instruction set; `s.len()` is a multiple of `S::W`.
#[inline(always)]
unsafe fn softmax_row<S: Simd>(
    s: &mut [f32],
    cols: std::ops::Range<usize>,
    cap: Option<f32>,
    m: &mut f32,
    l: &mut f32,
    o: &mut [f32],
) {
    if let Some(cap) = cap {
        // Only the allowed columns: the others stay −∞ (tanh would make them −cap).
        for x in &mut s[cols.clone()] {
            *x = cap * (*x / cap).tanh();
        }
    }
    let mx = s[cols].iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    let new = m.max(mx);
    if new == f32::NEG_INFINITY {
        s.fill(0.0);
        return;
    }
    if *m != new {
        let corr = (*m - new).exp();
        *l *= corr;
        o.iter_mut().for_each(|x| *x *= corr);
        *m = new;
    }
    // SAFETY: the CPU has `S`; whole vectors of `s` (its length is a multiple of `S::W`).
    unsafe {
        let mut sum = S::splat(0.0);
        let (nv, one) = (S::splat(new), S::splat(1.0));
        for c in (0..s.len()).step_by(S::W) {
            let p = s.as_mut_ptr().add(c);
            let e = simd::exp::<S>(S::fnma(one, nv, S::load(p)));
            S::store(p, e);
            sum = S::add(sum, e);
        }
        *l += S::reduce_sum(sum);
    }
}

/// Row `r` of `pages` (`d` elements) as f32 in `out`: f32/f16/bf16 widened and q8_0/e4m3
/// decoded with `S`'s vectors (to the values `Pages::widen_row` gives, which the oracle reads).
///
/// # Safety
/// The CPU has `S`'s instruction set; row `r` exists in `pages` (`PagedKv::check`).
#[inline(always)]
unsafe fn widen_row<S: Simd>(pages: &Pages, r: usize, heads: usize, d: usize, out: &mut [f32]) {
    // SAFETY: the CPU has `S`; the row's `d` elements exist and `out` holds `d`.
    unsafe {
        match pages {
            Pages::F32(x) => out.copy_from_slice(&x[r * d..][..d]),
            Pages::F16(x) => widen_elems::<S, _>(&x[r * d..][..d], out),
            Pages::Bf16(x) => widen_elems::<S, _>(&x[r * d..][..d], out),
            Pages::Q8 { values, scales } => {
                // `d` is a multiple of the block (`PagedKv::check`), and the block of every `S::W`.
                let nb = d / Q8_BLOCK;
                for (b, scale) in scales[r * nb..][..nb].iter().enumerate() {
                    let (src, dst) = (values[r * d + b * Q8_BLOCK..].as_ptr(), out[b * Q8_BLOCK..].as_mut_ptr());
                    let sv = S::splat(scale.to_f32());
                    for c in (0..Q8_BLOCK).step_by(S::W) {
                        S::store(dst.add(c), S::mul(S::load_i8(src.add(c)), sv));
                    }
                }
            }
            Pages::Fp8 { values, scales } => {
                let (src, scale) = (&values[r * d..][..d], scales[r % heads]);
                let (whole, sv) = (d / S::W * S::W, S::splat(scale));
                for c in (0..whole).step_by(S::W) {
                    S::store(out.as_mut_ptr().add(c), S::mul(S::load_fp8(src.as_ptr().add(c)), sv));
                }
                for (o, &b) in out[whole..].iter_mut().zip(&src[whole..]) {
                    *o = fp8_decode(b) * scale;
                }
            }
        }
    }
}

/// `out = src` widened, a vector at a time, then a scalar tail.
///
/// # Safety
/// The CPU has `S`'s instruction set; `out` holds `src.len()` floats.
#[inline(always)]
unsafe fn widen_elems<S: Simd, E: KvElem>(src: &[E], out: &mut [f32]) {
    let whole = src.len() / S::W * S::W;
    // SAFETY: vectors stop at `whole ≤ len` (the caller's contract for `S`).
    unsafe {
        for c in (0..whole).step_by(S::W) {
            S::store(out.as_mut_ptr().add(c), E::load::<S>(src.as_ptr().add(c)));
        }
    }
    for (o, x) in out[whole..].iter_mut().zip(&src[whole..]) {
        *o = x.to_f32();
    }
}
