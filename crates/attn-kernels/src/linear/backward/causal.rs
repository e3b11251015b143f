//! The causal backward of one head in two passes over its chunks: ascending (the key states
//! `Sᵀ`, `z` of the earlier chunks) for the denominators, `dN`, `r` and `dq`, and the part of `dk`
//! and `dv` each chunk's masked products `P`, `M` give; descending (the query states `U`, `w` of
//! the later chunks) for the rest of `dk` and `dv`, each chunk's features and `dN` made again
//! from the denominators and `r` the first pass kept (no `out` read, no masked product remade).
//! [`ascend`] and [`descend`] run any range of whole chunks: [`causal`] runs them super-chunk by
//! super-chunk (a few chunks, both passes while their rows are in the L2 cache), the segmented
//! path over its segments.

use std::ops::Range;

use super::{key_grads, Acc, GradsMut, Head, Work};
use crate::linear::chunk::{ahead, dot, sum, tril_products};
use crate::linear::gemm::{gemm, Lhs, Part};
use crate::linear::transpose::transpose;
use crate::reference::Real;
use crate::stream;

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

/// Chunks per super-chunk of [`causal`]: 512 rows at the default chunk of 64, whose inputs and
/// gradients (`q`, `k`, `v`, `out`, `dO`, `dk`, `dv`: 7 × 128 KiB at `D = 64`) stay in the L2
/// cache between the ascending pass over them and the descending one.
const SUPER_CHUNKS: usize = 8;

/// The causal backward of one key/value head and its `group` query heads (`head(gi)`: query head
/// `gi` of the group): writes their `dq: [group, L, D]`, and `dk: [L, D]`, `dv: [L, Dv]` summed
/// over them. One pass over the keys makes the key states `(Sᵀ, z)` before each super-chunk of
/// [`SUPER_CHUNKS`] chunks; then super-chunk by super-chunk from the last, each query head in turn runs
/// the ascending pass over it from its key state and the descending pass back over it from the
/// query states `(U, w)` of the rows after it (kept per query head from the super-chunk before),
/// so that the second pass finds the super-chunk's rows in the L2 cache rather than reading the
/// head again from memory. The super-chunk's `dk`, `dv` are summed in scratch and streamed out
/// (non-temporal stores), like `dq`: no gradient line is read from memory.
#[inline(always)]
pub(super) fn causal<'a, T: Real + 'a>(
    head: impl Fn(usize) -> Head<'a, T>,
    group: usize,
    w: &mut Work<T>,
    g: GradsMut<T>,
) {
    let h0 = head(0);
    let (isa, d, c) = (h0.isa, h0.d, w.chunk());
    let (f, fdv, sc) = (d.f, d.f * d.dv, SUPER_CHUNKS * c);
    let (width, supers) = (fdv + d.f, d.lq.div_ceil(sc));
    let span = |s: usize| s * sc..((s + 1) * sc).min(d.lq);
    let [mut snaps, mut run, mut dks, mut dvs, mut stats] =
        [&mut w.snaps, &mut w.run, &mut w.dks, &mut w.dvs, &mut w.stats].map(std::mem::take);
    snaps.resize(supers * width, T::zero());
    run.clear();
    run.resize(group * width, T::zero());
    dks.resize(sc * d.d, T::zero());
    dvs.resize(sc * d.dv, T::zero());
    stats.resize(2 * sc, T::zero());
    // The key states before each super-chunk.
    w.clear_states();
    for (s, snap) in snaps.chunks_exact_mut(width).enumerate() {
        snap[..fdv].copy_from_slice(&w.st);
        snap[fdv..].copy_from_slice(&w.z);
        let rows = if s + 1 < supers { span(s) } else { 0..0 };
        for t0 in rows.clone().step_by(c) {
            let nk = h0.keys.count(t0, c);
            if nk == 0 {
                break;
            }
            h0.keys.features(isa, h0.p.map, t0, nk, &mut w.fk[..nk * f]);
            h0.keys.prefetch(t0 + c, ahead(&rows, t0 + c, c), false);
            w.add_keys(&h0, t0, nk);
            h0.keys.prefetch(t0 + c, ahead(&rows, t0 + c, c), true);
        }
    }
    for s in (0..supers).rev() {
        let rows = span(s);
        let n = rows.len();
        for (gi, state) in run.chunks_exact_mut(width).enumerate() {
            let hd = head(gi);
            let (st, z) = snaps[s * width..][..width].split_at(fdv);
            w.st.copy_from_slice(st);
            w.z.copy_from_slice(z);
            w.u.copy_from_slice(&state[..fdv]);
            w.wsum.copy_from_slice(&state[fdv..]);
            let dq = &mut g.dq[(gi * d.lq + rows.start) * d.d..][..n * d.d];
            let mut acc =
                Acc { dq, dk: &mut dks[..n * d.d], dv: &mut dvs[..n * d.dv], base: rows.start, fresh: gi == 0 };
            ascend(&hd, w, rows.clone(), &mut stats[..2 * n], &mut acc, false);
            acc.fresh = false;
            descend(&hd, w, rows.clone(), &stats[..2 * n], &mut acc);
            state[..fdv].copy_from_slice(&w.u);
            state[fdv..].copy_from_slice(&w.wsum);
        }
        stream::copy(isa, &mut g.dk[rows.start * d.d..][..n * d.d], &dks[..n * d.d]);
        stream::copy(isa, &mut g.dv[rows.start * d.dv..][..n * d.dv], &dvs[..n * d.dv]);
    }
    stream::fence();
    [w.snaps, w.run, w.dks, w.dvs, w.stats] = [snaps, run, dks, dvs, stats];
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
        if nk > 0 {
            key_grads(hd, sizes(t0), true, w, acc);
        }
        acc.prefetch(hd.d, (t0 + c, ahead(&rows, t0 + c, c)));
        if totals {
            w.add_queries(hd, n);
        }
    }
    acc.clear_padded(rows, hd.keys.valid, hd.d);
    stream::fence();
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
        acc.prefetch(hd.d, if t0 >= rows.start + c { (t0 - c, c) } else { (0, 0) });
    }
}
