//! The reference backward: the gradients of attention computed as the derivation reads, one query
//! row at a time, in the caller's precision (`f64` is the oracle of every fast backward).
//!
//! For query row `i` of head `h` (reading key/value head `h / (Hq/Hkv)`), with the scores `s_j`
//! and masks of the forward (masked keys are skipped: their `k_j`, `v_j` are never read and they
//! get no gradient from this row) and `z_j = keep_j / (1 − p)` the dropout factor replayed from
//! `(seed, b, h, i, j)` (1 without dropout):
//! 1. `A_ij = exp(s_j − m_i) / Σ_j exp(s_j − m_i)` with `m_i = max_j s_j` (the softmax, computed
//!    again from the row's scores as the forward did, as PyTorch's math path does), `Ā_ij = z_j ·
//!    A_ij` (what multiplied `v_j`);
//! 2. `dV_j += Ā_ij · dO_i`;
//! 3. `dĀ_ij = dO_i · v_j`, `dA_ij = z_j · dĀ_ij`, plus the weights' own gradient `dW_ij` when
//!    one arrives ([`SideGrads`](crate::SideGrads));
//! 4. `dS_ij = A_ij · (dA_ij − Σ_j A_ij · dA_ij + dlse_i)` — the gradient of the score, and of the
//!    bias (`dlse_i`, the log-sum-exp's gradient when one arrives, else 0);
//! 5. through the soft-cap and the modification: `dX_ij = dS_ij · (1 − tanh²(f(x_ij) / cap)) ·
//!    f'(x_ij)`, `x_ij = scale · q_i·k_j`, and the modification's table entry `e` read at `(i, j)`
//!    gets `dS_ij · (1 − tanh²(f(x_ij) / cap)) · ∂f/∂t_e`;
//! 6. `dQ_i += scale · Σ_j dX_ij · k_j`, `dK_j += scale · dX_ij · q_i`.
//!
//! `dbias` is `dS` summed over the dimensions along which the bias was broadcast. A row with no
//! allowed key (fully masked) contributes nothing.
//!
//! With a sink logit `σ_h` (step 1's softmax then has `exp(σ_h − m)` in its denominator, see the
//! parent module) `A_ij` depends on `σ_h` through the denominator alone, `∂A_ij/∂σ_h = −A_ij ·
//! p_σ` with `p_σ = exp(σ_h − m) / l` the sink's own probability, so
//! 7. `dσ_h += −p_σ · (Σ_j A_ij · dA_ij − dlse_i)`, over every row of head `h` (a fully masked row has no
//!    `A_ij` and adds 0). Steps 2 to 6 are unchanged: the row term `Σ_j A_ij · dA_ij` of step 4 is
//!    the same sum.
//!
//! Why not `A_ij = exp(s_j − lse_i)` from the saved log-sum-exp: `lse_i` rounded to the working
//! precision is off by up to half an ulp of `|lse_i|`, so every `A_ij` of the row is off by that
//! much relative and the row no longer sums to 1. Step 4's `Σ_j dS_ij = 0` then fails by
//! `|lse|·ε·Σ_j A_ij·dA_ij`, which `dQ = Σ_j dS_ij·k_j` and `dbias` do not cancel: with scores in
//! the hundreds that made the `f32` reference's gradients up to 15× less accurate than the plain
//! algorithm's. The saved `lse` is only checked for its shape.

use super::{dot, row_scores, softmax_stats, Real, Score};
use crate::alloc;
use crate::error::Result;
use crate::grad::{AttnGrads, Saved};
use crate::problem::{AttnParams, Problem};
use crate::view::View4;

/// Reference gradients. `q: [B, Hq, Lq, Dk]`, `k: [B, Hkv, Lk, Dk]`, `v: [B, Hkv, Lk, Dv]` and
/// `params` as given to the forward, `saved` the forward's log-sum-exp and the output's
/// gradient `dO: [B, Hq, Lq, Dv]`. With `want_dbias` and a bias in `params`,
/// also the bias's gradient in its own shape; with sinks, their gradient `dsinks: [Hq]`.
pub fn reference_backward<T: Real>(
    q: &View4<T>,
    k: &View4<T>,
    v: &View4<T>,
    saved: &Saved<T>,
    params: &AttnParams<T>,
    want_dbias: bool,
) -> Result<AttnGrads<T>> {
    let pb = Problem::new(q.dims(), k.dims(), v.dims(), params)?;
    let d = pb.dims;
    saved.check(&d)?;
    let dout = &saved.dout;
    let bias_len = params.mask.bias.filter(|_| want_dbias).map(|b| b.data().len());
    let mut g = AttnGrads::zeros(&d, bias_len, pb.sinks.is_some(), pb.score_mod.map(|f| f.table.len()))?;
    let mut scores: Vec<Option<Score<T>>> = alloc::filled("scores of a row", &[d.lk], None)?;
    // `A_ij`, `dA_ij` and `z_j` of the allowed keys of one row.
    let mut a = alloc::filled("weights of a row", &[d.lk], T::zero())?;
    let mut da = alloc::filled("weight gradients of a row", &[d.lk], T::zero())?;
    for b in 0..d.b {
        for h in 0..d.hq {
            let kvh = h / d.group();
            for i in 0..d.lq {
                let row = (b * d.hq + h) * d.lq + i;
                row_scores(&pb, q, k, [b, h, i], &mut scores);
                let sink = pb.sink(h);
                let Some((m, l)) = softmax_stats(&scores, sink) else { continue };
                let key = pb.dropout.map(|dr| dr.row_key(b, h, i, [d.hq, d.lq]));
                let doi = dout.row(b, h, i);
                let dw = saved.side.dweights.map(|w| w.grad.row(b, h, i));
                let dlse = saved.side.dlse.map_or(T::zero(), |x| x[row]);
                // Steps 1 to 3.
                for (j, sc) in scores.iter().enumerate() {
                    let Some(sc) = sc else { continue };
                    let z = match (pb.dropout, key) {
                        (Some(dr), Some(key)) if dr.keeps(key, j) => T::from_f32(dr.scale()).unwrap(),
                        (Some(_), _) => T::zero(),
                        _ => T::one(),
                    };
                    a[j] = (sc.s - m).exp() / l;
                    da[j] = T::zero();
                    // A dropped weight neither reads `v_j` nor sends it a gradient.
                    if z != T::zero() {
                        let dvj = &mut g.dv[((b * d.hkv + kvh) * d.lk + j) * d.dv..][..d.dv];
                        axpy(z * a[j], doi, dvj);
                        da[j] = z * dot(doi, v.row(b, kvh, j));
                    }
                    if let Some(dw) = dw {
                        da[j] = da[j] + dw[j];
                    }
                }
                // Step 4.
                let rowsum = scores
                    .iter()
                    .enumerate()
                    .filter(|(_, sc)| sc.is_some())
                    .fold(T::zero(), |acc, (j, _)| acc + a[j] * da[j]);
                // Step 7.
                if let (Some(ds), Some(sink)) = (g.dsinks.as_mut(), sink) {
                    ds[h] = ds[h] - (sink - m).exp() / l * (rowsum - dlse);
                }
                let scale = T::from_f64(pb.scale).unwrap();
                for (j, sc) in scores.iter().enumerate() {
                    let Some(sc) = sc else { continue };
                    let ds = a[j] * (da[j] - rowsum + dlse);
                    if let (Some(gb), Some(bias)) = (g.dbias.as_mut(), pb.elem.bias) {
                        let st = bias.strides;
                        let at = b * st[0] + h * st[1] + i * st[2] + j * st[3];
                        gb[at] = gb[at] + ds;
                    }
                    if let (Some(gt), Some(f)) = (g.dtable.as_mut(), pb.score_mod) {
                        let x = sc.x.to_f64().unwrap();
                        if let Some((e, dt)) = f.m.dtable(x, f.table, b, h, i, j) {
                            gt[e] = gt[e] + ds * sc.dcap * T::from_f64(dt).unwrap();
                        }
                    }
                    // Steps 5 and 6.
                    let dx = ds * sc.dcap * sc.dmod * scale;
                    let dqi = &mut g.dq[row * d.dk..][..d.dk];
                    axpy(dx, k.row(b, kvh, j), dqi);
                    let dkj = &mut g.dk[((b * d.hkv + kvh) * d.lk + j) * d.dk..][..d.dk];
                    axpy(dx, q.row(b, h, i), dkj);
                }
            }
        }
    }
    Ok(g)
}

/// `y += alpha · x`.
fn axpy<T: Real>(alpha: T, x: &[T], y: &mut [T]) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y = *y + alpha * x;
    }
}
