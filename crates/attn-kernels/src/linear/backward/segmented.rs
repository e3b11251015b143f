//! The causal backward in segments of each head's chunks, for calls with fewer (batch, key/value
//! head) jobs than threads (`segment`'s [`Plan`]):
//! 1. and 2. the key states `(S, z)` before each segment ([`key_prefixes`], as in the forward);
//! 3. per (key/value head, segment) in parallel, the group's query heads in turn: the ascending
//!    pass from the prefix state — the row statistics (denominators and `r`, kept), `dq`, the part
//!    of the segment's `dk`, `dv` its chunks' masked products give, and the segment's query-side
//!    totals `U = Σ φ(Q_c)ᵀdN_c`, `w = Σ r_i φ(q_i)`;
//! 4. their exclusive suffix sums over the segments (the states of the rows after each);
//! 5. per (key/value head, segment) in parallel: the descending pass from the suffix states, the
//!    state part of `dk` and `dv` of the segment's rows.
//!
//! Non-causal calls ([`global`]) run the query segments, then the key segments, from states
//! summed over all the keys, then all the queries.
//!
//! Besides the sequential form's scratch per job, memory is the row statistics `[B, Hq, Lq, 2]`
//! and the segment states, `O(threads·group·(F·Dv + F))`.
use rayon::prelude::*;

use super::super::segment::{exclusive_scan, key_prefixes, key_totals, Plan};
use super::non_causal::{global_keys, global_queries};
use super::{ascend, descend, Acc, GradsMut, Head, Inputs, Rows, Work};
use crate::alloc;
use crate::error::Result;
use crate::linear::chunk::{spread_on_isa, Keys};
use crate::linear::transpose::transpose;
use crate::linear::{LinearDims, LinearParams};
use crate::reference::Real;
use crate::simd::Isa;

/// Writes the gradients `g` of a causal call in the segments of `plan`.
pub(super) fn backward<T: Real>(
    isa: Isa,
    d: &LinearDims,
    p: &LinearParams,
    [q, k, v, out, dout]: Inputs<T>,
    plan: &Plan,
    g: GradsMut<T>,
) -> Result<()> {
    let (group, segs, fdv) = (d.group(), plan.segs, d.f * d.dv);
    let width = fdv + d.f;
    let keys = Keys::every(isa, k, &v, p, d);
    let init = key_prefixes(isa, plan, p, d, &keys);
    let head = |kh: usize, gi: usize| {
        let (b, hk) = (kh / d.hkv, kh % d.hkv);
        Head { isa, d, p, rows: Rows { q, out, dout, b, h: hk * group + gi }, keys: keys[kh] }
    };
    // Phase 3: jobs (key/value head, segment), each with its query heads' `dq` and statistics,
    // and its rows of `dk`, `dv` (written by the group's first query head, added to by the others).
    let mut stats = alloc::filled("linear attention row statistics", &[d.b, d.hq, d.lq, 2], T::zero())?;
    let dens = plan.by_job(&mut stats, 2, group);
    let keyed = plan.by_job(&mut *g.dk, d.d, 1).into_iter().zip(plan.by_job(&mut *g.dv, d.dv, 1));
    let totals: Vec<Vec<T>> = plan
        .by_job(g.dq, d.d, group)
        .into_iter()
        .zip(dens)
        .zip(keyed)
        .collect::<Vec<_>>()
        .into_par_iter()
        .enumerate()
        .map_init(
            || Work::new(d, p.chunk),
            |w, (i, ((dqs, dens), (mut dk, mut dv)))| {
                let (kh, s, rows) = (i / segs, i % segs, plan.rows(i % segs));
                let (dk, dv) = (dk.pop().expect("one slice per job"), dv.pop().expect("one slice per job"));
                let mut tot = vec![T::zero(); group * width];
                let mut acc = Acc { dq: &mut [], dk, dv, base: rows.start, fresh: true };
                for (gi, ((dq, den), t)) in dqs.into_iter().zip(dens).zip(tot.chunks_exact_mut(width)).enumerate() {
                    let (st, z) = init[i * width..][..width].split_at(fdv);
                    transpose(isa, st, d.dv, d.f, d.dv, &mut w.st, d.f);
                    w.z.copy_from_slice(z);
                    w.u.iter_mut().chain(w.wsum.iter_mut()).for_each(|x| *x = T::zero());
                    (acc.dq, acc.fresh) = (dq, gi == 0);
                    spread_on_isa(
                        isa,
                        #[inline(always)]
                        || ascend(&head(kh, gi), w, rows.clone(), den, &mut acc, s > 0),
                    );
                    t[..fdv].copy_from_slice(&w.u);
                    t[fdv..].copy_from_slice(&w.wsum);
                }
                tot
            },
        )
        .collect();
    // Phase 4: per query head `[P, F·Dv + F]`, the states of the segments after each.
    let mut after = vec![T::zero(); d.b * d.hq * segs * width];
    for (i, tot) in totals.iter().enumerate() {
        for (gi, t) in tot.chunks_exact(width).enumerate() {
            let h = i / segs * group + gi;
            after[(h * segs + i % segs) * width..][..width].copy_from_slice(t);
        }
    }
    after.chunks_exact_mut(segs * width).for_each(|x| exclusive_scan(x, width, true));
    // Phase 5: jobs (key/value head, segment) again, adding the state part of the segment's `dk`,
    // `dv` rows.
    let dvs = plan.split(g.dv, d.dv);
    plan.split(g.dk, d.d).into_par_iter().zip(dvs).for_each_init(
        || Work::new(d, p.chunk),
        |w, ((kh, s, dk), (_, _, dv))| {
            let rows = plan.rows(s);
            let mut acc = Acc { dq: &mut [], dk, dv, base: rows.start, fresh: false };
            for gi in 0..group {
                let h = kh * group + gi;
                let (u, ws) = after[(h * segs + s) * width..][..width].split_at(fdv);
                w.u.copy_from_slice(u);
                w.wsum.copy_from_slice(ws);
                let kept = &stats[2 * (h * d.lq + rows.start)..][..2 * rows.len()];
                spread_on_isa(
                    isa,
                    #[inline(always)]
                    || descend(&head(kh, gi), w, rows.clone(), kept, &mut acc),
                );
            }
        },
    );
    Ok(())
}

/// Writes the gradients `g` of a non-causal call, its queries and keys cut by
/// `(queries, key_plan)`: the state of all the keys (summed over the key segments), then per
/// (key/value head, query segment) in parallel `dq` and the segments' query-side states, summed
/// per query head, then per (key/value head, key segment) `dk` and `dv`.
pub(super) fn global<T: Real>(
    isa: Isa,
    d: &LinearDims,
    p: &LinearParams,
    [q, k, v, out, dout]: Inputs<T>,
    (queries, key_plan): (Plan, Plan),
    g: GradsMut<T>,
) {
    let (group, segs, fdv) = (d.group(), queries.segs, d.f * d.dv);
    let width = fdv + d.f;
    let keys = Keys::every(isa, k, &v, p, d);
    let total = key_totals(isa, &key_plan, p, d, &keys);
    let head = |kh: usize, gi: usize| {
        let (b, hk) = (kh / d.hkv, kh % d.hkv);
        Head { isa, d, p, rows: Rows { q, out, dout, b, h: hk * group + gi }, keys: keys[kh] }
    };
    let parts: Vec<Vec<T>> = queries
        .by_job(g.dq, d.d, group)
        .into_par_iter()
        .enumerate()
        .map_init(
            || Work::new(d, p.chunk),
            |w, (i, dqs)| {
                let (kh, rows) = (i / segs, queries.rows(i % segs));
                let mut tot = vec![T::zero(); group * width];
                for (gi, (dq, t)) in dqs.into_iter().zip(tot.chunks_exact_mut(width)).enumerate() {
                    let (st, z) = total[kh * width..][..width].split_at(fdv);
                    transpose(isa, st, d.dv, d.f, d.dv, &mut w.st, d.f);
                    w.z.copy_from_slice(z);
                    w.u.iter_mut().chain(w.wsum.iter_mut()).for_each(|x| *x = T::zero());
                    let mut acc = Acc { dq, dk: &mut [], dv: &mut [], base: rows.start, fresh: false };
                    spread_on_isa(
                        isa,
                        #[inline(always)]
                        || global_queries(&head(kh, gi), w, rows.clone(), &mut acc),
                    );
                    t[..fdv].copy_from_slice(&w.u);
                    t[fdv..].copy_from_slice(&w.wsum);
                }
                tot
            },
        )
        .collect();
    // Per query head, `U` and `w` summed over the query segments.
    let mut sums = vec![T::zero(); d.b * d.hq * width];
    for (i, tot) in parts.iter().enumerate() {
        for (gi, t) in tot.chunks_exact(width).enumerate() {
            let h = i / segs * group + gi;
            sums[h * width..][..width].iter_mut().zip(t).for_each(|(a, &x)| *a = *a + x);
        }
    }
    let dvs = key_plan.split(g.dv, d.dv);
    key_plan.split(g.dk, d.d).into_par_iter().zip(dvs).for_each_init(
        || Work::new(d, p.chunk),
        |w, ((kh, s, dk), (_, _, dv))| {
            let rows = key_plan.rows(s);
            let mut acc = Acc { dq: &mut [], dk, dv, base: rows.start, fresh: true };
            for gi in 0..group {
                acc.fresh = gi == 0;
                let (u, ws) = sums[(kh * group + gi) * width..][..width].split_at(fdv);
                w.u.copy_from_slice(u);
                w.wsum.copy_from_slice(ws);
                spread_on_isa(
                    isa,
                    #[inline(always)]
                    || global_keys(&head(kh, gi), w, rows.clone(), &mut acc),
                );
            }
        },
    );
}
