//! The causal backward of one head. The sequential path ([`causal`]) runs one descending pass over
//! the chunks from the key states before each chunk, which [`key_states`] keeps once per
//! key/value head: each chunk's features, denominators, `dN`, `r` and masked products `P`, `M`
//! are made once, and its `dq`, `dk`, `dv` written whole (the key gradients from the chunk's own
//! queries and from the query states `U`, `w` of the later chunks together). The segmented path
//! runs two passes over any range of whole chunks: [`ascend`] (the running key states `Sᵀ`, `z`)
//! for the denominators, `dN`, `r`, `dq` and the chunks' own part of `dk`, `dv`; [`descend`] (the
//! query states of the later chunks) for the rest, each chunk's features and `dN` made again from
//! the denominators and `r` the first pass kept.

use std::ops::Range;

use super::{key_grads, Acc, Head, KeyState, KeyTerms, Work};
use crate::linear::chunk::{ahead, prefetch_rows, tril_products};
use crate::linear::gemm::{gemm, Lhs, Part};
use crate::linear::rows::{dot, sum};
use crate::linear::transpose::transpose;
use crate::reference::Real;

/// The chunk from `t0` (`n` rows, `nk` keys) of a causal head: `φ(Q_c)`, `φ(K_c)`, `P` into
/// `w`, and the denominators `φ(Q_c)·z + rowsum(P) + ε` (`z` of the key states `at` names) into
/// the first column of the chunk's statistics `stats: [n, 2]`.
#[inline(always)]
fn chunk_products<T: Real>(
    hd: &Head<T>,
    (t0, n, nk): (usize, usize, usize),
    at: KeyState,
    w: &mut Work<T>,
    stats: &mut [T],
) {
    let (isa, f, c, map) = (hd.isa, hd.d.f, w.chunk(), hd.p.map);
    let (fq, fk) = (&mut w.fq[..n * f], &mut w.fk[..nk * f]);
    hd.rows.features(isa, map, t0, n, fq);
    if nk > 0 {
        hd.keys.features(isa, map, t0, nk, fk);
        tril_products(isa, n, nk, f, fq, f, fk, f, &mut w.bt, &mut w.pm, c);
    }
    let eps = T::from_f64(hd.p.eps).expect("finite");
    let (_, z) = at.of(hd.d, &w.st, &w.z, &w.states);
    for (i, (s, x)) in stats.chunks_exact_mut(2).zip(fq.chunks_exact(f)).enumerate() {
        let masked = if nk > 0 { sum(&w.pm[i * c..][..nk]) } else { T::zero() };
        s[0] = dot(x, z) + masked + eps;
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

/// The key states before each chunk of a causal head's keys, `Sᵀ_{<c}` then `z_{<c}`, into
/// `w.states` (`[⌈L/C⌉, Dv·F + F]`, sized by the caller): one ascending pass over the keys and
/// values, which every query head of the group then reads.
#[inline(always)]
pub(super) fn key_states<T: Real>(hd: &Head<T>, w: &mut Work<T>) {
    let (isa, keys, f, c, l) = (hd.isa, &hd.keys, hd.d.f, w.chunk(), hd.d.lq);
    let fdv = f * hd.d.dv;
    w.clear_states();
    for (i, t0) in (0..l).step_by(c).enumerate() {
        let state = &mut w.states[i * (fdv + f)..][..fdv + f];
        state[..fdv].copy_from_slice(&w.st);
        state[fdv..].copy_from_slice(&w.z);
        let nk = keys.count(t0, c.min(l - t0));
        if nk > 0 {
            keys.prefetch(t0 + c, ahead(&(0..l), t0 + c, c), false);
            keys.features(isa, hd.p.map, t0, nk, &mut w.fk[..nk * f]);
            keys.prefetch(t0 + c, ahead(&(0..l), t0 + c, c), true);
            w.add_keys(hd, t0, nk);
        }
    }
}

/// One query head, causal, in one descending pass over its chunks from the key states
/// [`key_states`] kept: writes `acc.dq`, adds to (with [`Acc::fresh`], writes) `acc.dk`, `acc.dv`.
#[inline(always)]
pub(super) fn causal<T: Real>(hd: &Head<T>, w: &mut Work<T>, mut acc: Acc<T>) {
    let (isa, f, wd, c, l) = (hd.isa, hd.d.f, hd.d.dv, w.chunk(), hd.d.lq);
    let chunks = l.div_ceil(c);
    let mut stats = std::mem::take(&mut w.stats);
    w.u.iter_mut().chain(w.wsum.iter_mut()).for_each(|x| *x = T::zero());
    for i in (0..chunks).rev() {
        let t0 = i * c;
        let (n, at) = (c.min(l - t0), KeyState::Kept(i));
        let sizes = (t0, n, hd.keys.count(t0, n));
        let stats = &mut stats[..2 * n];
        // The previous chunk's inputs and key states, one between each two steps.
        let before = if i > 0 { (t0 - c, c) } else { (0, 0) };
        let prev = |j| hd.prefetch(before, j);
        chunk_products(hd, sizes, at, w, stats);
        prev(0);
        chunk_grads(hd, sizes, stats, w);
        prev(3);
        prefetch_rows(&w.states, f * wd + f, f * wd + f, i.saturating_sub(1), usize::from(i > 0));
        w.query_grads(hd, n, at);
        prev(1);
        if sizes.2 > 0 {
            gemm(isa, n, f, sizes.2, Lhs::rows(&w.mm, c).part(Part::LowerA), &w.fk[..sizes.2 * f], f, &mut w.dfq, f);
        }
        prev(2);
        w.query_vjp(hd, t0, n, &mut acc);
        prev(4);
        acc.prefetch(hd.d, before, false);
        if sizes.2 > 0 {
            key_grads(hd, sizes, KeyTerms { own: true, later: i + 1 < chunks }, w, &mut acc);
        }
        acc.prefetch(hd.d, before, true);
        w.add_queries(hd, n);
        transpose(isa, &w.u, wd, f, wd, &mut w.ut, f);
    }
    acc.clear_padded(0..l, hd.keys.valid, hd.d);
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
        chunk_products(hd, sizes(t0), KeyState::Running, w, stats);
        next(0);
        chunk_grads(hd, sizes(t0), stats, w);
        next(3);
        w.query_grads(hd, n, KeyState::Running);
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
            key_grads(hd, sizes(t0), KeyTerms { own: true, later: false }, w, acc);
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
            key_grads(hd, sizes(t0), KeyTerms { own: false, later: true }, w, acc);
        }
        prev(4);
        w.add_queries(hd, n);
        acc.prefetch(hd.d, if t0 >= rows.start + c { (t0 - c, c) } else { (0, 0) }, true);
    }
}
