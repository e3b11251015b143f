//! Step 2 of a backward tile (see the parent module's header): the tile's scores masked through
//! the score modification and soft-cap (their derivatives kept), `P` from the saved log-sum-exp,
//! dropout replayed, `dS`, its additions to `dbias` and the modification's table, and `dX`.

use super::super::rows::{grad_scores, scale_masked};
use super::super::{BwdCtx, BwdJob};
use super::work::{BwdWork, TileAt, LDB};
use crate::flash::forward::softmax::exp_row;
use crate::flash::scores::{mask_row, RowDerivs};
use crate::simd::Simd;

/// Step 2: per row, the scores masked, `P = exp((S − lse) − lse_residue)` into `w.p` (`P̄` into
/// `w.pd` under dropout), the weights' gradient added to `dP`, `dS = P∘(dP − Δ)` in place of `dP`,
/// added into `dbias`, then `dX`.
///
/// # Safety
/// As [`super::tile`].
#[inline(always)]
pub(super) unsafe fn score_grads<S: Simd>(cx: &BwdCtx, job: &BwdJob, w: &mut BwdWork, t: TileAt) {
    let pb = cx.pb;
    let d = pb.dims;
    let (b, TileAt { h, i0, nr, j0, n }) = (job.b, t);
    let row0 = (b * d.hq + h) * d.lq + i0;
    // `dS` is needed on its own for `dbias`, and the soft-cap's factor is per element: then `dX`
    // takes a second pass; otherwise `dX = scale·dS` comes out of the first.
    let chain = pb.softcap.is_some() || pb.score_mod.is_some();
    let two_pass = cx.dbias.is_some() || cx.dtable.is_some() || chain;
    for r in 0..nr {
        let i = i0 + r;
        let row = r * LDB..(r + 1) * LDB;
        let s = &mut w.s[row.clone()];
        if cx.dtable.is_some() {
            w.x[row.clone()].copy_from_slice(s);
        }
        let derivs = chain.then(|| RowDerivs { dmod: &mut w.dmod[row.clone()], dcap: &mut w.dcap[row.clone()] });
        // SAFETY: `s` and the derivative rows hold `LDB`, a multiple of `S::W`; CPU supports `S`.
        let m = unsafe { mask_row::<S>(pb, [b, h, i], s, n, j0, pb.key_range(b, i), derivs, &mut w.blocks) };
        let (hi, lo) = (cx.lse[row0 + r], cx.lse_residue.map_or(0.0, |x| x[row0 + r]));
        let p = &mut w.p[r * LDB..(r + 1) * LDB];
        if m.empty || hi == f32::NEG_INFINITY {
            s.fill(f32::NEG_INFINITY);
            p.fill(0.0);
        } else {
            // `exp((s − hi) − lo)`: see `crate::lse`.
            p.iter_mut().zip(s.iter()).for_each(|(p, &s)| *p = s - hi);
            // SAFETY: `p` holds `LDB`, a multiple of `S::W`.
            unsafe { exp_row::<S>(p, lo) };
        }
        let dp = &mut w.dp[r * LDB..(r + 1) * LDB];
        if let Some(dr) = pb.dropout {
            let key = dr.row_key(b, h, i, [d.hq, d.lq]);
            let sc = dr.scale();
            let pd = &mut w.pd[r * LDB..(r + 1) * LDB];
            for c in 0..n {
                let keep = if dr.keeps(key, j0 + c) { 1.0 } else { 0.0 };
                pd[c] = p[c] * (keep * sc);
                dp[c] *= keep;
            }
        }
        if let Some(wg) = cx.side.dweights {
            dp.iter_mut().zip(&wg.grad.row(b, h, i)[j0..j0 + n]).for_each(|(dp, &g)| *dp += g);
        }
        let delta = w.delta[(h - job.kvh * d.group()) * d.lq + i];
        // SAFETY: rows hold `LDB`, a multiple of `S::W`; CPU supports `S`.
        unsafe { grad_scores::<S>(s, p, dp, delta, if two_pass { 1.0 } else { pb.scale as f32 }) };
    }
    if let (Some(dbias), Some(bias)) = (&cx.dbias, pb.elem.bias) {
        let st = bias.strides;
        let mut gb = dbias.lock().unwrap_or_else(|e| e.into_inner());
        for r in 0..nr {
            let base = b * st[0] + h * st[1] + (i0 + r) * st[2];
            for (c, &ds) in w.dp[r * LDB..r * LDB + n].iter().enumerate() {
                gb[base + (j0 + c) * st[3]] += ds;
            }
        }
    }
    if let (Some(dtable), Some(f)) = (&cx.dtable, pb.score_mod) {
        w.dtable.clear();
        w.dtable.resize(f.table.len(), 0.0);
        for r in 0..nr {
            let row = r * LDB..r * LDB + n;
            // The gradient of the modified score: `dS` through the soft-cap.
            for (g, (&ds, &dc)) in w.g.iter_mut().zip(w.dp[row.clone()].iter().zip(&w.dcap[row.clone()])) {
                *g = ds * dc;
            }
            f.m.dtable_row(f.table, [b, h, i0 + r], j0, &w.x[row], &w.g[..n], &mut w.dtable);
        }
        let mut gt = dtable.lock().unwrap_or_else(|e| e.into_inner());
        gt.iter_mut().zip(&w.dtable).for_each(|(a, &x)| *a += x);
    }
    if two_pass {
        for r in 0..nr {
            let row = r * LDB..(r + 1) * LDB;
            if pb.score_mod.is_some() {
                w.dcap[row.clone()].iter_mut().zip(&w.dmod[row.clone()]).for_each(|(c, &m)| *c *= m);
            }
            let dcap = chain.then(|| &w.dcap[row.clone()]);
            // SAFETY: rows hold `LDB`, a multiple of `S::W`; CPU supports `S`.
            unsafe { scale_masked::<S>(&w.s[row.clone()], &mut w.dp[row], pb.scale as f32, dcap) };
        }
    }
}
