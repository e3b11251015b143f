//! The channel gate's (KDA's) chunk backward through its factorised products (the parent
//! module's header states the chain to `dq`, `dk` and `dγ`).

use super::{dot, ChunkGrads, Scratch};
use crate::linear::gemm::{gemm, Lhs, Part};
use crate::linear::transpose::transpose;
use crate::simd::Isa;

/// The gradients of one channel-gate chunk through its factorised products (module header), as
/// [`super::chunk_backward`]; `w.dgamma` is filled per token and channel, `[n, Dk]`.
pub(super) fn chunk_backward_channel(isa: Isa, j: ChunkGrads, w: &mut Scratch, (dk, dv): (usize, usize)) {
    let ChunkGrads { c, r, s0, ds1, dq, dk: dk_, dv: dv_, dbeta, ds0 } = j;
    let n = c.n;
    w.dgamma.clear();
    w.dgamma.resize(n * dk, 0.0);
    for buf in [&mut w.kc, &mut w.km, &mut w.dkp, &mut w.dkm, &mut w.dkc, &mut w.dqp] {
        buf.resize(n * dk, 0.0);
    }
    transpose(isa, &c.u, dv, n, dv, &mut w.ut, n);
    transpose(isa, s0, dv, dk, dv, &mut w.s0t, dk);
    transpose(isa, ds1, dv, dk, dv, &mut w.ds1t, dk);
    // exp(γ_C) per channel; K^c = K∘exp(γ_C)·exp(−γ) and K⁻ = K∘exp(−γ) in rows.
    let end: Vec<f32> = c.gamma_c[(n - 1) * dk..][..dk].iter().map(|g| g.exp() as f32).collect();
    for (i, (&k, &down)) in r.k.iter().zip(&c.down).enumerate() {
        w.kc[i] = k * (end[i % dk] * down);
        w.km[i] = k * down;
    }

    // The state: S₁ = diag(exp(γ_C))·S₀ + K^cᵀ·U.
    gemm(isa, n, dv, dk, Lhs::rows(&w.kc, dk).write(true), ds1, dv, &mut w.du, dv);
    gemm(isa, n, dk, dv, Lhs::rows(&c.u, dv).write(true), &w.ds1t, dk, &mut w.dkc, dk);
    let last = &mut w.dgamma[(n - 1) * dk..][..dk];
    for (ch, ((x, y), s)) in ds0.chunks_exact_mut(dv).zip(ds1.chunks_exact(dv)).zip(s0.chunks_exact(dv)).enumerate() {
        x.iter_mut().zip(y).for_each(|(x, &y)| *x = end[ch] * y);
        last[ch] += f64::from(end[ch] * dot(s, y));
    }

    // The outputs: O = Q⁺·S₀ + P·U, P = Q⁺·K⁻ᵀ on and below the diagonal.
    gemm(isa, n, dv, n, Lhs::transposed(&c.p, n).part(Part::UpperA), &w.dout, dv, &mut w.du, dv);
    gemm(isa, n, n, dv, Lhs::rows(&w.dout, dv).part(Part::LowerOut).write(true), &w.ut, n, &mut w.dp, n);
    for i in 0..n {
        w.dp[i * n + i + 1..(i + 1) * n].fill(0.0);
    }
    gemm(isa, n, dk, dv, Lhs::rows(&w.dout, dv).write(true), &w.s0t, dk, &mut w.dqp, dk);
    gemm(isa, n, dk, n, Lhs::rows(&w.dp, n).part(Part::LowerA), &w.km, dk, &mut w.dqp, dk);
    gemm(isa, n, dk, n, Lhs::transposed(&w.dp, n).part(Part::UpperA).write(true), &c.qplus, dk, &mut w.dkm, dk);
    gemm(isa, dk, dv, n, Lhs::transposed(&c.qplus, dk), &w.dout, dv, ds0, dv);

    // The solve: (I + A)·U = Y.
    gemm(isa, n, dv, n, Lhs::transposed(&c.inv, n).part(Part::UpperA).write(true), &w.du, dv, &mut w.dy, dv);
    gemm(isa, n, n, dv, Lhs::rows(&w.dy, dv).part(Part::LowerOut).write(true), &w.ut, n, &mut w.da, n);
    // Y = diag(β)·(V − W): dV = β·dY, dW = −dV (in tmp); A = diag(β)·(K⁺·K⁻ᵀ below the diagonal):
    // dA = −dY·Uᵀ, dG = diag(β)·dA (in da).
    for s in 0..n {
        let (dy, wr, v) = (&w.dy[s * dv..][..dv], &c.w[s * dv..][..dv], &r.v[s * dv..][..dv]);
        let mut db: f32 = dy.iter().zip(wr).zip(v).map(|((&dy, &w), &v)| dy * (v - w)).sum();
        let dvr = &mut dv_[s * dv..][..dv];
        dvr.iter_mut().zip(dy).for_each(|(x, &y)| *x = r.beta[s] * y);
        w.tmp[s * dv..][..dv].iter_mut().zip(dvr.iter()).for_each(|(x, &y)| *x = -y);
        let (da, gram) = (&mut w.da[s * n..][..n], &c.gram[s * n..][..n]);
        for j in 0..n {
            if j >= s {
                da[j] = 0.0;
                continue;
            }
            let d_a = -da[j];
            db += d_a * gram[j];
            da[j] = r.beta[s] * d_a;
        }
        dbeta[s] = db;
    }
    // W = K⁺·S₀ and the Gram matrix K⁺·K⁻ᵀ.
    gemm(isa, n, dk, dv, Lhs::rows(&w.tmp, dv).write(true), &w.s0t, dk, &mut w.dkp, dk);
    gemm(isa, dk, dv, n, Lhs::transposed(&c.kplus, dk), &w.tmp, dv, ds0, dv);
    gemm(isa, n, dk, n, Lhs::rows(&w.da, n).part(Part::LowerA), &w.km, dk, &mut w.dkp, dk);
    gemm(isa, n, dk, n, Lhs::transposed(&w.da, n).part(Part::UpperA), &c.kplus, dk, &mut w.dkm, dk);

    // Through the factors' decays to q, k and γ.
    for i in 0..n * dk {
        let (up, down) = (c.up[i], c.down[i]);
        dq[i] = w.dqp[i] * up;
        dk_[i] = w.dkp[i] * up + w.dkm[i] * down + w.dkc[i] * (end[i % dk] * down);
        let state = f64::from(w.dkc[i] * w.kc[i]);
        w.dgamma[i] +=
            f64::from(w.dkp[i] * c.kplus[i]) + f64::from(w.dqp[i] * c.qplus[i]) - f64::from(w.dkm[i] * w.km[i]) - state;
        w.dgamma[(n - 1) * dk + i % dk] += state;
    }
}
