//! The causal backward of one head in two passes over its chunks: ascending (the key states
//! `Sᵀ`, `z` of the earlier chunks) for the denominators, `dN`, `r` and `dq`; descending (the
//! query states `U`, `w` of the later chunks) for `dk` and `dv`, each chunk's features and masked
//! products `P`, `M` made again from the saved denominators. [`ascend`] and [`descend`] run any
//! range of whole chunks, for the segmented path too.

use std::ops::Range;

use super::{key_grads, Acc, Head, Work};
use crate::linear::chunk::{ahead, dot, sum, tril_products};
use crate::linear::gemm::{gemm, Lhs, Part};
use crate::linear::transpose::transpose;
use crate::reference::Real;

/// The chunk from `t0` (`n` rows, `nk` keys) of a causal head: `φ(Q_c)`, `φ(K_c)`, `P` into
/// `w`, and the denominators `φ(Q_c)·z + rowsum(P) + ε` into `den` when given.
#[inline(always)]
fn chunk_products<T: Real>(hd: &Head<T>, (t0, n, nk): (usize, usize, usize), w: &mut Work<T>, den: Option<&mut [T]>) {
    let (isa, f, c, map) = (hd.isa, hd.d.f, w.chunk(), hd.p.map);
    let (fq, fk) = (&mut w.fq[..n * f], &mut w.fk[..nk * f]);
    hd.rows.features(isa, map, t0, n, fq);
    if nk > 0 {
        hd.keys.features(isa, map, t0, nk, fk);
        tril_products(isa, n, nk, f, fq, f, fk, f, &mut w.bt, &mut w.pm, c);
    }
    if let Some(den) = den {
        let eps = T::from_f64(hd.p.eps).expect("finite");
        for (i, (di, x)) in den.iter_mut().zip(fq.chunks_exact(f)).enumerate() {
            let masked = if nk > 0 { sum(&w.pm[i * c..][..nk]) } else { T::zero() };
            *di = dot(x, &w.z) + masked + eps;
        }
    }
}

/// `dN_c`, `r_c` of the chunk from `t0` from its denominators `den: [n]`, and (with keys) the
/// masked `M = tril(dN_c V_cᵀ + r)` into `w.mm`.
#[inline(always)]
fn chunk_grads<T: Real>(hd: &Head<T>, (t0, n, nk): (usize, usize, usize), den: &[T], w: &mut Work<T>) {
    let (wd, c, keys) = (hd.d.dv, w.chunk(), &hd.keys);
    let (dn, r) = (&mut w.dn[..n * wd], &mut w.r[..n]);
    hd.rows.grads(t0, den, dn, r);
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
    let mut den = std::mem::take(&mut w.den);
    w.clear_states();
    ascend(hd, w, 0..l, &mut den, &mut acc, false);
    descend(hd, w, 0..l, &den, &mut acc);
    w.den = den;
}

/// The ascending pass over the rows `rows` (whole chunks from a chunk's start) of a causal head,
/// from the key states `w.st`, `w.z` of the rows before them: their denominators into
/// `den: [rows.len()]`, `dq` into `acc`; with `totals`, also the rows' `U`, `w` added to `w.u`,
/// `w.wsum`.
#[inline(always)]
pub(super) fn ascend<T: Real>(
    hd: &Head<T>,
    w: &mut Work<T>,
    rows: Range<usize>,
    den: &mut [T],
    acc: &mut Acc<T>,
    totals: bool,
) {
    let (f, c) = (hd.d.f, w.chunk());
    let sizes = |t0: usize| (t0, c.min(rows.end - t0), hd.keys.count(t0, c.min(rows.end - t0)));
    for t0 in rows.clone().step_by(c) {
        let (_, n, nk) = sizes(t0);
        let den = &mut den[t0 - rows.start..][..n];
        // The next chunk's inputs, one between each two steps.
        let next = |i| hd.prefetch((t0 + c, ahead(&rows, t0 + c, c)), i);
        chunk_products(hd, sizes(t0), w, Some(den));
        next(0);
        chunk_grads(hd, sizes(t0), den, w);
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
        if totals {
            w.add_queries(hd, n);
        }
    }
}

/// The descending pass over the rows `rows` of a causal head, from the query states `w.u`,
/// `w.wsum` of the rows after them, with their denominators `den: [rows.len()]`: adds to (with
/// [`Acc::fresh`], writes) `acc.dk`, `acc.dv`.
#[inline(always)]
pub(super) fn descend<T: Real>(hd: &Head<T>, w: &mut Work<T>, rows: Range<usize>, den: &[T], acc: &mut Acc<T>) {
    let (f, c) = (hd.d.f, w.chunk());
    let sizes = |t0: usize| (t0, c.min(rows.end - t0), hd.keys.count(t0, c.min(rows.end - t0)));
    for t0 in rows.clone().step_by(c).rev() {
        let (_, n, nk) = sizes(t0);
        // The previous chunk's inputs, one between each two steps.
        let prev = |i| hd.prefetch(if t0 >= rows.start + c { (t0 - c, c) } else { (0, 0) }, i);
        chunk_products(hd, sizes(t0), w, None);
        prev(0);
        chunk_grads(hd, sizes(t0), &den[t0 - rows.start..][..n], w);
        prev(3);
        if nk > 0 {
            transpose(hd.isa, &w.u, hd.d.dv, f, hd.d.dv, &mut w.ut, f);
            prev(1);
            key_grads(hd, sizes(t0), true, w, acc);
        }
        prev(2);
        w.add_queries(hd, n);
        prev(4);
    }
    acc.clear_padded(rows, hd.keys.valid, hd.d);
}
