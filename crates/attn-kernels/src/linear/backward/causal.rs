//! The causal backward of one head in two passes over its chunks: ascending (the key states
//! `Sᵀ`, `z` of the earlier chunks) for the denominators, `dN`, `r` and `dq`, and the part of `dk`
//! and `dv` each chunk's masked products `P`, `M` give; descending (the query states `U`, `w` of
//! the later chunks) for the rest of `dk` and `dv`, each chunk's features and `dN` made again
//! from the denominators and `r` the first pass kept (no `out` read, no masked product remade).
//! [`ascend`] and [`descend`] run any range of whole chunks, for the segmented path too.

use std::ops::Range;

use super::{key_grads, Acc, Head, Work};
use crate::linear::chunk::{ahead, dot, sum, tril_products};
use crate::linear::gemm::{gemm, Lhs, Part};
use crate::linear::transpose::transpose;
use crate::reference::Real;

/// The chunk from `t0` (`n` rows, `nk` keys) of a causal head: `φ(Q_c)`, `φ(K_c)`, `P` into
/// `w`, and the denominators `φ(Q_c)·z + rowsum(P) + ε` into the first column of the chunk's
/// statistics `stats: [n, 2]`.
#[inline(always)]
fn chunk_products<T: Real>(hd: &Head<T>, (t0, n, nk): (usize, usize, usize), w: &mut Work<T>, stats: &mut [T]) {
    let (isa, f, c, map) = (hd.isa, hd.d.f, w.chunk(), hd.p.map);
    let (fq, fk) = (&mut w.fq[..n * f], &mut w.fk[..nk * f]);
    hd.rows.features(isa, map, t0, n, fq);
    if nk > 0 {
        hd.keys.features(isa, map, t0, nk, fk);
        tril_products(isa, n, nk, f, fq, f, fk, f, &mut w.bt, &mut w.pm, c);
    }
    let eps = T::from_f64(hd.p.eps).expect("finite");
    for (i, (s, x)) in stats.chunks_exact_mut(2).zip(fq.chunks_exact(f)).enumerate() {
        let masked = if nk > 0 { sum(&w.pm[i * c..][..nk]) } else { T::zero() };
        s[0] = dot(x, &w.z) + masked + eps;
    }
}

/// `dN_c`, `r_c` of the chunk from `t0` into `w.dn`, `w.r` from its statistics `stats: [n, 2]`
/// (`r` written there), and (with keys) the masked `M = tril(dN_c V_cᵀ + r)` into `w.mm`.
#[inline(always)]
fn chunk_grads<T: Real>(hd: &Head<T>, (t0, n, nk): (usize, usize, usize), stats: &mut [T], w: &mut Work<T>) {
    let (wd, c, keys) = (hd.d.dv, w.chunk(), &hd.keys);
    let (dn, r) = (&mut w.dn[..n * wd], &mut w.r[..n]);
    hd.rows.grads(t0, stats, dn, r);
    if nk > 0 {
        tril_products(hd.isa, n, nk, wd, dn, wd, keys.values(t0), keys.ldv, &mut w.bt, &mut w.mm, c);
        for (i, (row, &ri)) in w.mm.chunks_mut(c).zip(r.iter()).enumerate() {
            row[..nk.min(i + 1)].iter_mut().for_each(|x| *x = *x + ri);
        }
    }
}

/// One query head, causal, in two passes over the chunks: writes `acc.dq`, adds to (with
/// [`Acc::fresh`], writes) `acc.dk`, `acc.dv`.
#[inline(always)]
pub(super) fn causal<T: Real>(hd: &Head<T>, w: &mut Work<T>, mut acc: Acc<T>) {
    let l = hd.d.lq;
    let mut stats = std::mem::take(&mut w.stats);
    w.clear_states();
    ascend(hd, w, 0..l, &mut stats, &mut acc, false);
    acc.fresh = false;
    descend(hd, w, 0..l, &stats, &mut acc);
    w.stats = stats;
}

/// The ascending pass over the rows `rows` (whole chunks from a chunk's start) of a causal head,
/// from the key states `w.st`, `w.z` of the rows before them: their statistics (denominators
/// and `r`) into `stats: [rows.len(), 2]`, `dq` into `acc`, and each chunk's own part of `dk`,
/// `dv` (from its masked products) added to (with [`Acc::fresh`], written into, padded keys
/// cleared) `acc.dk`, `acc.dv`; with `totals`, also the rows' `U`, `w` added to `w.u`, `w.wsum`.
#[inline(always)]
pub(super) fn ascend<T: Real>(
    hd: &Head<T>,
    w: &mut Work<T>,
    rows: Range<usize>,
    stats: &mut [T],
    acc: &mut Acc<T>,
    totals: bool,
) {
    let (f, c) = (hd.d.f, w.chunk());
    let sizes = |t0: usize| (t0, c.min(rows.end - t0), hd.keys.count(t0, c.min(rows.end - t0)));
    for t0 in rows.clone().step_by(c) {
        let (_, n, nk) = sizes(t0);
        let stats = &mut stats[2 * (t0 - rows.start)..][..2 * n];
        // The next chunk's inputs, one between each two steps.
        let next = |i| hd.prefetch((t0 + c, ahead(&rows, t0 + c, c)), i);
        chunk_products(hd, sizes(t0), w, stats);
        next(0);
        chunk_grads(hd, sizes(t0), stats, w);
        next(3);
        w.query_grads(hd, n);
        next(1);
        if nk > 0 {
            gemm(hd.isa, n, f, nk, Lhs::rows(&w.mm, c).part(Part::LowerA), &w.fk[..nk * f], f, &mut w.dfq, f);
            w.add_keys(hd, t0, nk);
        }
        next(2);
        w.query_vjp(hd, t0, n, acc);
        next(4);
        acc.prefetch(hd.d, (t0 + c, ahead(&rows, t0 + c, c)), false);
        if nk > 0 {
            key_grads(hd, sizes(t0), true, w, acc);
        }
        acc.prefetch(hd.d, (t0 + c, ahead(&rows, t0 + c, c)), true);
        if totals {
            w.add_queries(hd, n);
        }
    }
    acc.clear_padded(rows, hd.keys.valid, hd.d);
}

/// The descending pass over the rows `rows` of a causal head, from the query states `w.u`,
/// `w.wsum` of the rows after them, with the statistics [`ascend`] kept, `stats: [rows.len(), 2]`:
/// adds the state part of `dk`, `dv` to `acc.dk`, `acc.dv`.
#[inline(always)]
pub(super) fn descend<T: Real>(hd: &Head<T>, w: &mut Work<T>, rows: Range<usize>, stats: &[T], acc: &mut Acc<T>) {
    let (isa, map, f, wd, c) = (hd.isa, hd.p.map, hd.d.f, hd.d.dv, w.chunk());
    let sizes = |t0: usize| (t0, c.min(rows.end - t0), hd.keys.count(t0, c.min(rows.end - t0)));
    for t0 in rows.clone().step_by(c).rev() {
        let (_, n, nk) = sizes(t0);
        // The previous chunk's inputs but `out` (`r` is kept), one between each two steps.
        let prev = |i| hd.prefetch(if t0 >= rows.start + c { (t0 - c, c) } else { (0, 0) }, i);
        hd.rows.features(isa, map, t0, n, &mut w.fq[..n * f]);
        prev(0);
        let stats = &stats[2 * (t0 - rows.start)..][..2 * n];
        hd.rows.grads_kept(t0, stats, &mut w.dn[..n * wd], &mut w.r[..n]);
        prev(2);
        if nk > 0 {
            hd.keys.features(isa, map, t0, nk, &mut w.fk[..nk * f]);
            prev(3);
            transpose(isa, &w.u, wd, f, wd, &mut w.ut, f);
            key_grads(hd, sizes(t0), false, w, acc);
        }
        prev(4);
        w.add_queries(hd, n);
        acc.prefetch(hd.d, if t0 >= rows.start + c { (t0 - c, c) } else { (0, 0) }, true);
    }
}
