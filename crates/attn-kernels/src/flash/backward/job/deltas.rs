//! `Δ_i = dO_i·O_i` of a job's rows (the backward's row term), rounded as the form's `dO·Vᵀ`
//! rounds a score, so that a row that sees one key gets `dS = 0` exactly: one multiply-add per
//! slot (f32, or bfloat16 pairs), in order, from 0. The rows are taken `W` at a time, transposed
//! so that each vector lane holds one row ([`lane_dots`]): the lanes' chains of multiply-adds run
//! side by side, where a row at a time waited on one chain per row (its latency, `Dv` multiply-adds
//! in a row), and the rows' loads overlap.
//!
//! A head with a sink takes the products and their sum in `f64` instead: its one-key exactness is
//! gone (`dS = P·dP·p_sink`, not 0), and what is left of `Δ`'s error is `O`'s rounding.

use super::super::{BwdCtx, BwdJob};
use super::work::{BwdWork, Form};
use crate::flash::micro::{Bf16Pairs, Fma, Product};
use crate::flash::pairs::transpose_pairs;
use crate::prefetch;
use crate::simd::Simd;

/// Most lanes of any instruction set's vector.
const MAX_LANES: usize = 16;

/// `Δ_i = dO_i·O_i` of the job's rows into `w.delta` (`[Hq/Hkv, Lq]`), rounded as the form's
/// `dO·Vᵀ` rounds, plus `ω_i − dlse_i` when side gradients arrive.
///
/// # Safety
/// CPU supports `S`.
#[inline(always)]
pub(super) unsafe fn deltas<S: Simd>(cx: &BwdCtx, job: &BwdJob, form: Form, w: &mut BwdWork) {
    let (d, g) = (cx.pb.dims, cx.pb.dims.group());
    let slots = form.slots(d.dv);
    let lanes = S::W;
    assert!(lanes <= MAX_LANES, "{lanes} lanes");
    if w.dt.len() < 2 * slots * lanes {
        w.dt.resize(2 * slots * lanes, 0.0);
    }
    w.delta.clear();
    // Plain loops: a closure would not inherit the target features.
    for h in job.kvh * g..(job.kvh + 1) * g {
        if cx.pb.sink(h).is_some() {
            for i in 0..d.lq {
                let mut delta = 0.0f64;
                for (&x, &y) in cx.dout.row(job.b, h, i).iter().zip(cx.out.row(job.b, h, i)) {
                    delta += x as f64 * y as f64;
                }
                w.delta.push(delta as f32);
            }
            continue;
        }
        for i0 in (0..d.lq).step_by(lanes) {
            let n = lanes.min(d.lq - i0);
            // The next rows' lines asked for now arrive while these are multiplied: read once,
            // often strided (a packed call's `O` rows are `Hq·Dv` apart), they come from memory.
            for i in (i0 + lanes..d.lq).take(lanes) {
                prefetch::lines::<{ prefetch::L1 }, _>(cx.dout.row(job.b, h, i));
                prefetch::lines::<{ prefetch::L1 }, _>(cx.out.row(job.b, h, i));
            }
            let mut a: [&[f32]; MAX_LANES] = [&[]; MAX_LANES];
            let mut b: [&[f32]; MAX_LANES] = [&[]; MAX_LANES];
            for r in 0..n {
                a[r] = cx.dout.row(job.b, h, i0 + r);
                b[r] = cx.out.row(job.b, h, i0 + r);
            }
            let (ta, tb) = w.dt[..2 * slots * lanes].split_at_mut(slots * lanes);
            let mut out = [0.0f32; MAX_LANES];
            // SAFETY: CPU supports `S`; `n ≤ W ≤ 16` rows of `Dv` values each, transposed into
            // `slots` slots `W` apart.
            unsafe {
                if form.bf16 {
                    transpose_pairs::<S>(&a[..n], d.dv, ta, lanes);
                    transpose_pairs::<S>(&b[..n], d.dv, tb, lanes);
                    lane_dots::<S, Bf16Pairs>(ta, tb, slots, &mut out);
                } else {
                    S::transpose_rows(&a[..n], d.dv, ta, lanes);
                    S::transpose_rows(&b[..n], d.dv, tb, lanes);
                    lane_dots::<S, Fma>(ta, tb, slots, &mut out);
                }
            }
            w.delta.extend_from_slice(&out[..n]);
        }
    }
    if cx.side.any() {
        for (x, delta) in w.delta.iter_mut().enumerate() {
            let (h, i) = (job.kvh * g + x / d.lq, x % d.lq);
            *delta = (*delta as f64 + cx.side.row_term([job.b, h, i], d.hq, d.lq)) as f32;
        }
    }
}

/// Lane `r` of `out` = `Σ_k a[k·W + r]·b[k·W + r]` over `slots` slots of rows stored transposed
/// (`[slots][W]`), each lane rounded exactly as `qk_panel::<S, P>` rounds one score (one
/// multiply-add per slot, in order, from 0); lanes `W..` are left as they are.
///
/// # Safety
/// CPU supports `S`; `a` and `b` hold `slots · W` floats.
#[inline(always)]
unsafe fn lane_dots<S: Simd, P: Product>(a: &[f32], b: &[f32], slots: usize, out: &mut [f32; MAX_LANES]) {
    assert!(a.len() >= slots * S::W && b.len() >= slots * S::W);
    // SAFETY: every load lies inside `a` and `b` (asserted); `out` holds 16 ≥ `W` floats; the CPU
    // supports `S`.
    unsafe {
        let mut acc = S::splat(0.0);
        for k in 0..slots {
            acc = P::madd::<S>(S::load(a.as_ptr().add(k * S::W)), S::load(b.as_ptr().add(k * S::W)), acc);
        }
        S::store(out.as_mut_ptr(), acc);
    }
}
