//! The sinks' gradient, after (and independent of) the fused backward's jobs:
//! `dsink_h = −Σ_{b,i} p_sink · Δ_i` with `p_sink = exp((sink_h − lse) − lse_residue)` from the
//! forward's sink-inclusive log-sum-exp and `Δ_i = dO_i·O_i`, the backward's row term (with dropout
//! too: `O` is built from the kept weights, so `dO·O = Σ_j A_ij·dA_ij`), plus `ω_i − dlse_i` when
//! gradients arrive at the weights or the log-sum-exp ([`SideGrads`](crate::SideGrads)). Each row's terms are
//! taken in `f64` and summed in `f64`, one head per task.

use rayon::prelude::*;

use crate::grad::Saved;
use crate::problem::Dims;

/// Writes `dsinks: [Hq]` for the sinks `[Hq]` of the call of sizes `d` from what its forward
/// saved; a −∞ sink's gradient stays 0.
pub(super) fn sink_grads(sinks: &[f32], saved: &Saved<f32>, d: &Dims, dsinks: &mut [f32]) {
    dsinks.par_iter_mut().zip(sinks).enumerate().for_each(|(h, (ds, &sink))| {
        if sink == f32::NEG_INFINITY {
            return;
        }
        let mut acc = 0.0f64;
        for b in 0..d.b {
            for i in 0..d.lq {
                let r = (b * d.hq + h) * d.lq + i;
                let lo = saved.lse_residue.map_or(0.0, |x| x[r]) as f64;
                let p = ((sink as f64 - saved.lse[r] as f64) - lo).exp();
                let (o, g) = (saved.out.row(b, h, i), saved.dout.row(b, h, i));
                let delta: f64 = o.iter().zip(g).map(|(&x, &y)| x as f64 * y as f64).sum::<f64>()
                    + saved.side.row_term([b, h, i], d.hq, d.lq);
                acc += p * delta;
            }
        }
        *ds = -acc as f32;
    });
}
