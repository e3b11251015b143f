//! The chunked backward: per head, the forward again keeping each chunk's start state, then the
//! chunks in reverse, carrying `dS` (the gradient of the state at the chunk's end) back to the
//! chunk's start. Inside a chunk, with the forward's names (module header) and `c_s = exp(γ_C − γ_s)`:
//!
//! - `S₁ = Γ_C·S₀ + Kᵀ·diag(c)·U`: `dU = diag(c)·K·dS₁`, `dK += diag(c)·U·dS₁ᵀ`, `dS₀ = Γ_C·dS₁`;
//! - `O = diag(Γ)·Q·S₀ + P·U`: `dU += Pᵀ·dO`, `dP = dO·Uᵀ`, `dQ = (M∘dP)·K + diag(Γ)·dO·S₀ᵀ`,
//!   `dK += (M∘dP)ᵀ·Q`, `dS₀ += Qᵀ·diag(Γ)·dO` (`M` the decays of `P`);
//! - `(I + A)·U = Y`: `dY = (I + A)⁻ᵀ·dU`, `dA = −dY·Uᵀ` below the diagonal;
//! - `Y = diag(β)·(V − diag(Γ)·K·S₀)`: `dV = diag(β)·dY`, `dW = −diag(Γ)·dV`, `dK += dW·S₀ᵀ`,
//!   `dS₀ += Kᵀ·dW`, `dβ_s = dY_s·(v_s − Γ_s·w_s) + Σ_j dA_sj·A_sj/β_s`;
//! - `A = diag(β)·(M'∘K·Kᵀ)`: `dK += dG·K + dGᵀ·K` with `dG = M'∘(diag(β)·dA)`;
//!
//! and each decay `exp(γ_a − γ_b)` adds its product's gradient to `dγ_a` and takes it from `dγ_b`;
//! `dg` is `dγ` summed from the end of the chunk (`γ_r = Σ_{i≤r} g_i`).
//!
//! The channel gate's chunks differentiate its factorised products the same way (with
//! `K^c = K∘exp(γ_C − γ)` the state's keys): `dK⁺`, `dQ⁺`, `dK⁻` and `dK^c` gathered as products,
//! then `dK = dK⁺∘exp(γ) + dK⁻∘exp(−γ) + dK^c∘exp(γ_C − γ)`, `dQ = dQ⁺∘exp(γ)` and, channel by
//! channel, `dγ = dK⁺∘K⁺ + dQ⁺∘Q⁺ − dK⁻∘K⁻ − dK^c∘K^c` (the last also added to `dγ_C`, with
//! `exp(γ_C)·Σ S₀∘dS₁`). Its chunks that decay too strongly for the products are walked back
//! token by token (the reference's `walk_back`). Those products' backward is `channel`'s.

mod channel;

use std::sync::Mutex;

use rayon::prelude::*;

use channel::chunk_backward_channel;

use super::{Chunk, Head, Rows, CHUNK};
use crate::delta::reference::{add_normalised, normaliser, walk_back, At, HeadGrads};
use crate::delta::{check, DeltaDims, DeltaGrads, DeltaInputs, DeltaParams, Gate};
use crate::error::Result;
use crate::linear::gemm::{gemm, Lhs, Part};
use crate::linear::transpose::transpose;
use crate::simd::Isa;

/// The gradients of every input of [`super::delta_rule`] in `f32` given the output's gradient
/// `dout: [B, T, Hv, Dv]` and, when the final state is used, its gradient `dfinal: [N, Hv, Dk, Dv]`;
/// refuses inputs that do not match `d` and `p`, naming the argument. Parallel over (sequence,
/// value head).
pub fn delta_rule_backward(
    d: &DeltaDims,
    x: &DeltaInputs<f32>,
    p: &DeltaParams,
    dout: &[f32],
    dfinal: Option<&[f32]>,
) -> Result<DeltaGrads<f32>> {
    let scale = check(d, x, p)? as f32;
    let g = DeltaGrads::zeroed(d, x, p, dout, dfinal)?;
    let isa = Isa::best();
    let (hv, sl) = (d.hv, d.dk * d.dv);
    let group = hv / d.hk;
    let at = At::new(d, x, p.gate);
    let init = x.initial_state.is_some();
    // Each head's gradients are added into the call's as soon as the heads before it in its group
    // are (value heads of a group share their key head's `dq`, `dk` rows: a fixed order keeps the
    // sums deterministic), so a thread's next head reuses the memory of its last instead of every
    // head's gradients being held to the end.
    let adder = Mutex::new(Ordered { g, next: vec![0; x.sequences(d) * d.hk], waiting: Vec::new() });
    (0..x.sequences(d) * hv).into_par_iter().for_each(|nh| {
        let (n, h) = (nh / hv, nh % hv);
        let hg = Head { d, x, p, scale, n, h }.backward(isa, dout, dfinal.map(|f| &f[nh * sl..][..sl]));
        let mut a = adder.lock().unwrap_or_else(|e| e.into_inner());
        a.waiting.push((nh, hg));
        // Add every waiting head whose turn in its group has come.
        while let Some(i) = a.waiting.iter().position(|&(nh, _)| a.next[nh / group] == nh % group) {
            let (nh, hg) = a.waiting.swap_remove(i);
            a.g.add_head(&at, (nh / hv, nh % hv), &hg, init);
            a.next[nh / group] += 1;
        }
    });
    Ok(adder.into_inner().unwrap_or_else(|e| e.into_inner()).g)
}

/// The call's gradients and the heads not yet added: `next[n·Hk + kh]` is the position in its
/// group of the next value head of key head `kh` to add.
struct Ordered {
    g: DeltaGrads<f32>,
    next: Vec<usize>,
    waiting: Vec<(usize, HeadGrads<f32>)>,
}

/// The buffers of one chunk's backward, kept across the chunks of a head.
struct Scratch {
    /// `dO` rows of the chunk, then `diag(Γ)·dO`, `[n, Dv]`.
    dout: Vec<f32>,
    /// `Uᵀ`, `[Dv, n]`.
    ut: Vec<f32>,
    /// `S₀ᵀ` and `dS₁ᵀ`, `[Dv, Dk]`.
    s0t: Vec<f32>,
    ds1t: Vec<f32>,
    /// `dU`, `dY`, and a product's rows, `[n, Dv]`.
    du: Vec<f32>,
    dy: Vec<f32>,
    tmp: Vec<f32>,
    /// `dP` then `M∘dP`; `dA` then `dG`; `[n, n]`.
    dp: Vec<f32>,
    da: Vec<f32>,
    /// `dγ`, `[n]` (`[n, Dk]` with the channel gate).
    dgamma: Vec<f64>,
    /// The channel gate's `[n, Dk]` rows: `K^c`, `K⁻`, and the gradients of `K⁺`, `K⁻`, `K^c`, `Q⁺`.
    kc: Vec<f32>,
    km: Vec<f32>,
    dkp: Vec<f32>,
    dkm: Vec<f32>,
    dkc: Vec<f32>,
    dqp: Vec<f32>,
}

impl Scratch {
    fn new(dk: usize, dv: usize) -> Scratch {
        let rows = vec![0.0; CHUNK * dv];
        Scratch {
            dout: rows.clone(),
            ut: rows.clone(),
            s0t: vec![0.0; dk * dv],
            ds1t: vec![0.0; dk * dv],
            du: rows.clone(),
            dy: rows.clone(),
            tmp: rows,
            dp: vec![0.0; CHUNK * CHUNK],
            da: vec![0.0; CHUNK * CHUNK],
            dgamma: Vec::with_capacity(CHUNK),
            kc: Vec::new(),
            km: Vec::new(),
            dkp: Vec::new(),
            dkm: Vec::new(),
            dkc: Vec::new(),
            dqp: Vec::new(),
        }
    }
}

/// `Σ a·b` of two rows.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

impl Head<'_> {
    /// The head's gradients given `dout` (the whole call's) and the final state's gradient.
    fn backward(&self, isa: Isa, dout: &[f32], dfinal: Option<&[f32]>) -> HeadGrads<f32> {
        let (d, at) = (self.d, self.at());
        let (dk, dv, t) = (d.dk, d.dv, self.tokens());
        let channel = self.p.gate == Gate::Channel;
        let mut c = Chunk::new(dk, dv);
        // The forward again, keeping the state at each chunk's start and which chunks the channel
        // gate's products could take (the others ran token by token).
        let starts: Vec<usize> = (0..t).step_by(CHUNK).collect();
        let mut states = vec![0.0f32; starts.len() * dk * dv];
        let mut factorised = vec![true; starts.len()];
        let mut s = match self.x.initial_state {
            Some(init) => init[at.state(self.n, self.h)..][..dk * dv].to_vec(),
            None => vec![0.0; dk * dv],
        };
        let mut o = Vec::new();
        for (i, &t0) in starts.iter().enumerate() {
            states[i * dk * dv..][..dk * dv].copy_from_slice(&s);
            let n = CHUNK.min(t - t0);
            let r = self.rows(t0, n);
            if !channel {
                c.fill(isa, &r, &s, (dk, dv), false);
                c.advance(isa, &r, &mut s, (dk, dv));
            } else if c.fill_channel(isa, &r, &s, (dk, dv), false) {
                c.advance_channel(isa, &r, &mut s, (dk, dv));
            } else {
                factorised[i] = false;
                o.clear();
                o.resize(n * dv, 0.0);
                self.tokens_one_by_one(t0, n, None, &mut s, &mut o);
            }
        }
        let per_token = if channel { dk } else { 1 };
        let mut hg = HeadGrads {
            dq: vec![0.0; t * dk],
            dk: vec![0.0; t * dk],
            dv: vec![0.0; t * dv],
            dg: vec![0.0; t * per_token],
            dbeta: vec![0.0; t],
            ds: dfinal.map_or_else(|| vec![0.0; dk * dv], <[f32]>::to_vec),
        };
        let mut ds0 = vec![0.0f32; dk * dv];
        let mut w = Scratch::new(dk, dv);
        let mut before = Vec::new();
        for (i, &t0) in starts.iter().enumerate().rev() {
            let n = CHUNK.min(t - t0);
            let s0 = &states[i * dk * dv..][..dk * dv];
            if !factorised[i] {
                walk_back(
                    &at,
                    self.x,
                    self.p,
                    self.scale,
                    (self.n, self.h),
                    t0..t0 + n,
                    s0,
                    dout,
                    &mut before,
                    &mut hg,
                );
                continue;
            }
            let r = self.rows(t0, n);
            for row in 0..n {
                w.dout[row * dv..][..dv].copy_from_slice(&dout[at.v(self.n, t0 + row, self.h)..][..dv]);
            }
            if channel {
                c.fill_channel(isa, &r, s0, (dk, dv), true);
            } else {
                c.fill(isa, &r, s0, (dk, dv), true);
            }
            let job = ChunkGrads {
                c: &c,
                r: &r,
                s0,
                ds1: &hg.ds,
                dq: &mut hg.dq[t0 * dk..][..n * dk],
                dk: &mut hg.dk[t0 * dk..][..n * dk],
                dv: &mut hg.dv[t0 * dv..][..n * dv],
                dbeta: &mut hg.dbeta[t0..][..n],
                ds0: &mut ds0,
            };
            if channel {
                chunk_backward_channel(isa, job, &mut w, (dk, dv));
            } else {
                chunk_backward(isa, job, &mut w, (dk, dv));
            }
            // dg_i = Σ_{r ≥ i} dγ_r, channel by channel.
            let dg = &mut hg.dg[t0 * per_token..][..n * per_token];
            for ch in 0..per_token {
                let mut acc = 0.0f64;
                for row in (0..n).rev() {
                    acc += w.dgamma[row * per_token + ch];
                    dg[row * per_token + ch] = acc as f32;
                }
            }
            std::mem::swap(&mut hg.ds, &mut ds0);
        }
        // Through the scale and the L2 normalisation to the raw q and k (the chunks walked back
        // token by token have theirs already).
        for row in (0..t).filter(|row| factorised[row / CHUNK]) {
            let i = at.qk(self.n, row, self.h);
            let (qr, kr) = (&self.x.q[i..][..dk], &self.x.k[i..][..dk]);
            let rq = normaliser(qr, self.p.l2norm_qk);
            let rk = normaliser(kr, self.p.l2norm_qk);
            let dqn: Vec<f32> = hg.dq[row * dk..][..dk].iter().map(|&x| x * self.scale).collect();
            let dkn = hg.dk[row * dk..][..dk].to_vec();
            let (dq, dkk) = (&mut hg.dq[row * dk..][..dk], &mut hg.dk[row * dk..][..dk]);
            dq.fill(0.0);
            dkk.fill(0.0);
            add_normalised(dq, qr, &dqn, rq, self.p.l2norm_qk);
            add_normalised(dkk, kr, &dkn, rk, self.p.l2norm_qk);
        }
        hg
    }
}

/// One chunk's backward: what it reads (the chunk's forward quantities `c`, its rows `r`, its start
/// state `s0` and the gradient `ds1` of its end state) and what it writes (`dq`, `dk` of the
/// normalised, scaled rows, `dv`, `dbeta`, and `ds0`, the gradient of `s0`).
struct ChunkGrads<'a> {
    c: &'a Chunk,
    r: &'a Rows,
    s0: &'a [f32],
    ds1: &'a [f32],
    dq: &'a mut [f32],
    dk: &'a mut [f32],
    dv: &'a mut [f32],
    dbeta: &'a mut [f32],
    ds0: &'a mut [f32],
}

/// The gradients of one chunk (module header) into `j`'s outputs, `w.dgamma` filled.
fn chunk_backward(isa: Isa, j: ChunkGrads, w: &mut Scratch, (dk, dv): (usize, usize)) {
    let ChunkGrads { c, r, s0, ds1, dq, dk: dk_, dv: dv_, dbeta, ds0 } = j;
    let (n, gamma) = (c.n, &c.gamma);
    let last = gamma[n - 1];
    w.dgamma.clear();
    w.dgamma.resize(n, 0.0);
    let dgamma = &mut w.dgamma;
    transpose(isa, &c.u, dv, n, dv, &mut w.ut, n);
    transpose(isa, s0, dv, dk, dv, &mut w.s0t, dk);
    transpose(isa, ds1, dv, dk, dv, &mut w.ds1t, dk);

    // The state: S₁ = Γ_C·S₀ + Kᵀ·diag(c)·U.
    gemm(isa, n, dv, dk, Lhs::rows(&r.k, dk).write(true), ds1, dv, &mut w.tmp, dv);
    for s in 0..n {
        let cs = c.pair(n - 1, s);
        let (kds, u) = (&w.tmp[s * dv..][..dv], &c.u[s * dv..][..dv]);
        let dc = f64::from(cs * dot(kds, u));
        dgamma[n - 1] += dc;
        dgamma[s] -= dc;
        w.du[s * dv..][..dv].iter_mut().zip(kds).for_each(|(x, &y)| *x = cs * y);
        // diag(c)·U, for dK below.
        w.dy[s * dv..][..dv].iter_mut().zip(u).for_each(|(x, &y)| *x = cs * y);
    }
    gemm(isa, n, dk, dv, Lhs::rows(&w.dy, dv).write(true), &w.ds1t, dk, dk_, dk);
    let decay_c = last.exp() as f32;
    dgamma[n - 1] += f64::from(decay_c * dot(s0, ds1));
    ds0.iter_mut().zip(ds1).for_each(|(x, &y)| *x = decay_c * y);

    // The outputs: O = diag(Γ)·Q·S₀ + P·U.
    gemm(isa, n, dv, n, Lhs::transposed(&c.p, n).part(Part::UpperA), &w.dout, dv, &mut w.du, dv);
    gemm(isa, n, n, dv, Lhs::rows(&w.dout, dv).part(Part::LowerOut).write(true), &w.ut, n, &mut w.dp, n);
    for i in 0..n {
        let (dp, p) = (&mut w.dp[i * n..][..n], &c.p[i * n..][..n]);
        for j in 0..n {
            if j > i {
                dp[j] = 0.0;
                continue;
            }
            let e = f64::from(dp[j] * p[j]);
            dgamma[i] += e;
            dgamma[j] -= e;
            dp[j] *= c.pair(i, j);
        }
    }
    gemm(isa, n, dk, n, Lhs::rows(&w.dp, n).part(Part::LowerA).write(true), &r.k, dk, dq, dk);
    gemm(isa, n, dk, n, Lhs::transposed(&w.dp, n).part(Part::UpperA), &r.q, dk, dk_, dk);
    gemm(isa, n, dv, dk, Lhs::rows(&r.q, dk).write(true), s0, dv, &mut w.tmp, dv);
    for (i, &g) in gamma.iter().enumerate() {
        let decay = g.exp() as f32;
        let row = &mut w.dout[i * dv..][..dv];
        dgamma[i] += f64::from(decay * dot(&w.tmp[i * dv..][..dv], row));
        row.iter_mut().for_each(|x| *x *= decay);
    }
    gemm(isa, n, dk, dv, Lhs::rows(&w.dout, dv), &w.s0t, dk, dq, dk);
    gemm(isa, dk, dv, n, Lhs::transposed(&r.q, dk), &w.dout, dv, ds0, dv);

    // The solve: (I + A)·U = Y.
    gemm(isa, n, dv, n, Lhs::transposed(&c.inv, n).part(Part::UpperA).write(true), &w.du, dv, &mut w.dy, dv);
    gemm(isa, n, n, dv, Lhs::rows(&w.dy, dv).part(Part::LowerOut).write(true), &w.ut, n, &mut w.da, n);
    // Y = diag(β)·(V − diag(Γ)·W): dV = β·dY, dW = −Γ·dV (in tmp).
    for s in 0..n {
        let decay = gamma[s].exp() as f32;
        let (dy, wr, v) = (&w.dy[s * dv..][..dv], &c.w[s * dv..][..dv], &r.v[s * dv..][..dv]);
        let mut db = 0.0f32;
        for j in 0..dv {
            db += dy[j] * (v[j] - decay * wr[j]);
        }
        let dvr = &mut dv_[s * dv..][..dv];
        dvr.iter_mut().zip(dy).for_each(|(x, &y)| *x = r.beta[s] * y);
        dgamma[s] -= f64::from(decay * dot(wr, dvr));
        w.tmp[s * dv..][..dv].iter_mut().zip(dvr.iter()).for_each(|(x, &y)| *x = -decay * y);
        // A = diag(β)·(M'∘K·Kᵀ), dA = −dY·Uᵀ below the diagonal; dG = M'∘(diag(β)·dA) in da.
        let (da, a, gram) = (&mut w.da[s * n..][..n], &c.a[s * n..][..n], &c.gram[s * n..][..n]);
        for j in 0..n {
            if j >= s {
                da[j] = 0.0;
                continue;
            }
            let m = c.pair(s, j);
            let d_a = -da[j];
            db += d_a * m * gram[j];
            let f = f64::from(d_a * a[j]);
            dgamma[s] += f;
            dgamma[j] -= f;
            da[j] = r.beta[s] * d_a * m;
        }
        dbeta[s] = db;
    }
    gemm(isa, n, dk, dv, Lhs::rows(&w.tmp, dv), &w.s0t, dk, dk_, dk);
    gemm(isa, dk, dv, n, Lhs::transposed(&r.k, dk), &w.tmp, dv, ds0, dv);
    gemm(isa, n, dk, n, Lhs::rows(&w.da, n).part(Part::LowerA), &r.k, dk, dk_, dk);
    gemm(isa, n, dk, n, Lhs::transposed(&w.da, n).part(Part::UpperA), &r.k, dk, dk_, dk);
}
