//! The online-softmax arithmetic of the forward on one score tile: the running maxima and
//! denominators and the rescaling of the output rows they imply ([`softmax_update`], dropout
//! applied to the tile's probabilities), and the normalised weights of the final sweep
//! ([`write_weights`]); both built on the vector row maximum and row exponential. One path: every
//! row runs the same vector loop over the tile's padded width.

use crate::flash::block::{Ctx, Job, Work, LDS};
use crate::simd::{exp, KvElem, Simd};

use crate::flash::key_tiles::{tile_columns, Seg};

/// Online-softmax step for one tile of keys (its segments `segs`): new running maxima, rescaled output rows
/// `o: [rows, Dv]` and denominators, and the tile's probabilities `exp(s − m)` in place of the
/// scores in `w.s` (dropout applied after the denominator is updated).
///
/// # Safety
/// The CPU supports `S`'s instruction set.
#[inline(always)]
pub(super) unsafe fn softmax_update<S: Simd>(
    cx: &Ctx<impl KvElem>,
    job: &Job,
    w: &mut Work,
    o: &mut [f32],
    segs: &[Seg],
) {
    let pb = cx.pb;
    let dv = pb.dims.dv;
    let n = tile_columns(segs);
    let width = n.div_ceil(S::W) * S::W;
    for r in 0..job.rows() {
        let row = &mut w.s[r * LDS..r * LDS + width];
        // SAFETY: the CPU supports `S` (the caller's contract); `row` holds `width`, a multiple
        // of `S::W`.
        let tmax = unsafe { row_max::<S>(row) };
        let mut m_new = w.m[r].max(tmax);
        // The vector maximum skips NaN; a NaN score must still poison its row, as in the reference.
        if w.m[r].is_nan() || (m_new == f32::NEG_INFINITY && row[..n].iter().any(|x| x.is_nan())) {
            m_new = f32::NAN;
        }
        if m_new == f32::NEG_INFINITY {
            row.fill(0.0);
            continue;
        }
        let alpha = if w.m[r] == m_new { 1.0 } else { (w.m[r] - m_new).exp() };
        // SAFETY: as above.
        let sum = unsafe { exp_row::<S>(row, m_new) };
        w.l[r] = w.l[r] * alpha + sum;
        w.m[r] = m_new;
        if alpha != 1.0 {
            o[r * dv..(r + 1) * dv].iter_mut().for_each(|x| *x *= alpha);
        }
        if let Some(dr) = pb.dropout {
            let (h, i) = job.head_query(r);
            let key = dr.row_key(job.b, h, i, [pb.dims.hq, pb.dims.lq]);
            let sc = dr.scale();
            for sg in segs {
                for (c, p) in row[sg.col..sg.col + sg.n].iter_mut().enumerate() {
                    *p = if dr.keeps(key, sg.j0 + c) { *p * sc } else { 0.0 };
                }
            }
        }
    }
}

/// Largest element of `row`.
///
/// # Safety
/// The CPU supports `S`'s instruction set, and `row.len()` is a multiple of `S::W`.
#[inline(always)]
unsafe fn row_max<S: Simd>(row: &[f32]) -> f32 {
    // SAFETY: the CPU supports `S` (the caller's contract); the loop reads whole vectors inside
    // `row`, whose length is a multiple of `S::W`.
    unsafe {
        let mut m = S::splat(f32::NEG_INFINITY);
        for c in (0..row.len()).step_by(S::W) {
            m = S::max(S::load(row.as_ptr().add(c)), m);
        }
        S::reduce_max(m)
    }
}

/// `row[c] = exp(row[c] − m)` in place; returns the sum.
///
/// # Safety
/// The CPU supports `S`'s instruction set, and `row.len()` is a multiple of `S::W`.
#[inline(always)]
pub(in crate::flash) unsafe fn exp_row<S: Simd>(row: &mut [f32], m: f32) -> f32 {
    // SAFETY: the CPU supports `S` (the caller's contract); the loop reads and writes whole
    // vectors inside `row`, whose length is a multiple of `S::W`.
    unsafe {
        let neg = S::splat(-m);
        let mut acc = S::splat(0.0);
        for c in (0..row.len()).step_by(S::W) {
            let p = exp::<S>(S::add(S::load(row.as_ptr().add(c)), neg));
            S::store(row.as_mut_ptr().add(c), p);
            acc = S::add(acc, p);
        }
        S::reduce_sum(acc)
    }
}

/// Writes `exp(s − m) / l` of the tile `segs` (scores in `w.s`, final maxima and denominators in
/// `w.m`, `w.l`) into the weights rows `wt: [rows, lk]`, each segment's columns at its keys;
/// masked keys get 0.
///
/// # Safety
/// The CPU supports `S`'s instruction set.
#[inline(always)]
pub(super) unsafe fn write_weights<S: Simd>(w: &Work, rows: usize, segs: &[Seg], lk: usize, wt: &mut [f32]) {
    let width = tile_columns(segs).div_ceil(S::W) * S::W;
    let mut buf = vec![0.0f32; width];
    for r in 0..rows {
        if w.m[r] == f32::NEG_INFINITY {
            continue;
        }
        buf.copy_from_slice(&w.s[r * LDS..r * LDS + width]);
        // SAFETY: the CPU supports `S` (the caller's contract); `buf` holds `width`, a multiple
        // of `S::W`.
        unsafe { exp_row::<S>(&mut buf, w.m[r]) };
        let l = w.l[r];
        for sg in segs {
            let scores = &w.s[r * LDS + sg.col..];
            let out = &mut wt[r * lk + sg.j0..r * lk + sg.j0 + sg.n];
            for ((x, &p), &s) in out.iter_mut().zip(&buf[sg.col..]).zip(scores) {
                *x = if s == f32::NEG_INFINITY { 0.0 } else { p / l };
            }
        }
    }
}
