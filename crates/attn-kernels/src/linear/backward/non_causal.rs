//! The backward of one non-causal head, through the states of all its keys (`Sᵀ`, `z`; made once
//! per key/value head, [`all_keys`]) and then of all its queries (`U`, `w`): the whole head in
//! one task ([`global`]), or its query rows and its key rows one range at a time
//! ([`global_queries`], [`global_keys`]) for the segmented path.

use std::ops::Range;

use super::{key_grads, Acc, Head, KeyState, KeyTerms, Work};
use crate::linear::chunk::ahead;
use crate::linear::rows::dot;
use crate::linear::transpose::transpose;
use crate::reference::Real;

/// The state of all the keys of a non-causal head's key/value head, `Sᵀ`, `z`, into `w.st`,
/// `w.z`: once per key/value head, for every query head of its group.
#[inline(always)]
pub(super) fn all_keys<T: Real>(hd: &Head<T>, w: &mut Work<T>) {
    let (isa, p, keys, f, c) = (hd.isa, hd.p, &hd.keys, hd.d.f, w.chunk());
    w.clear_states();
    for t0 in (0..keys.valid).step_by(c) {
        let nk = keys.count(t0, c);
        keys.features(isa, p.map, t0, nk, &mut w.fk[..nk * f]);
        w.add_keys(hd, t0, nk);
    }
}

/// One query head, non-causal, from the state of all the keys ([`all_keys`]): writes `acc.dq`,
/// adds to (with [`Acc::fresh`], writes) `acc.dk`, `acc.dv`.
#[inline(always)]
pub(super) fn global<T: Real>(hd: &Head<T>, w: &mut Work<T>, mut acc: Acc<T>) {
    w.u.iter_mut().chain(w.wsum.iter_mut()).for_each(|x| *x = T::zero());
    global_queries(hd, w, 0..hd.d.lq, &mut acc);
    global_keys(hd, w, 0..hd.d.lk, &mut acc);
}

/// The query rows `rows` of a non-causal head from the key states `w.st`, `w.z` of all its keys:
/// `dq` into `acc`, and their `U`, `w` added to `w.u`, `w.wsum`.
#[inline(always)]
pub(super) fn global_queries<T: Real>(hd: &Head<T>, w: &mut Work<T>, rows: Range<usize>, acc: &mut Acc<T>) {
    let (isa, d, p) = (hd.isa, hd.d, hd.p);
    let (f, wd, c) = (d.f, d.dv, w.chunk());
    let eps = T::from_f64(p.eps).expect("finite");
    for t0 in rows.clone().step_by(c) {
        let n = c.min(rows.end - t0);
        let (fq, stats) = (&mut w.fq[..n * f], &mut w.stats[..2 * n]);
        let (dn, r) = (&mut w.dn[..n * wd], &mut w.r[..n]);
        // The next chunk's inputs, one between each two steps.
        let next = |i| hd.prefetch((t0 + c, ahead(&rows, t0 + c, c)), i);
        hd.rows.features(isa, p.map, t0, n, fq);
        next(0);
        for (s, x) in stats.chunks_exact_mut(2).zip(fq.chunks_exact(f)) {
            s[0] = dot(x, &w.z) + eps;
        }
        hd.rows.grads(t0, stats, dn, r);
        next(1);
        w.query_grads(hd, n, KeyState::Running);
        next(2);
        w.add_queries(hd, n);
        w.query_vjp(hd, t0, n, acc);
    }
}

/// The key rows `rows` of a non-causal head from the query states `w.u`, `w.wsum` of all its
/// queries: adds to (with [`Acc::fresh`], writes) `acc.dk`, `acc.dv`.
#[inline(always)]
pub(super) fn global_keys<T: Real>(hd: &Head<T>, w: &mut Work<T>, rows: Range<usize>, acc: &mut Acc<T>) {
    let (isa, p, keys, f, wd, c) = (hd.isa, hd.p, &hd.keys, hd.d.f, hd.d.dv, w.chunk());
    transpose(isa, &w.u, wd, f, wd, &mut w.ut, f);
    for t0 in rows.clone().step_by(c) {
        let nk = keys.count(t0, c.min(rows.end - t0));
        if nk == 0 {
            break;
        }
        keys.features(isa, p.map, t0, nk, &mut w.fk[..nk * f]);
        keys.prefetch(t0 + c, ahead(&rows, t0 + c, c), false);
        key_grads(hd, (t0, 0, nk), KeyTerms { own: false, later: true }, w, acc);
        keys.prefetch(t0 + c, ahead(&rows, t0 + c, c), true);
    }
    acc.clear_padded(rows, keys.valid, hd.d);
}
