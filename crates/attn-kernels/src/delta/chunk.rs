//! The gated delta rule in chunks (Yang et al. 2024, "Parallelizing Linear Transformers with the
//! Delta Rule over Sequence Length"), `f32`, parallel over (batch, value head). Inside a chunk of
//! [`CHUNK`] tokens with the state `S₀` at its start and `γ_r` the cumulative log decay from the
//! chunk's start (so `Γ_r = exp(γ_r) ≤ 1`), the corrections `u_s` of the recurrence solve a unit
//! lower-triangular system,
//!
//! `u_s = β_s·(v_s − Γ_s·S₀ᵀk_s − Σ_{j<s} exp(γ_s − γ_j)(k_s·k_j)·u_j)`,
//!
//! after which `o_r = Γ_r·S₀ᵀq_r + Σ_{s≤r} exp(γ_r − γ_s)(q_r·k_s)·u_s` and the next chunk's state
//! is `Γ_C·S₀ + Σ_s exp(γ_C − γ_s)·k_s u_sᵀ`. Every decay is a difference of log decays within the
//! chunk, at most 1: nothing overflows however strong the decay. The products (`K·S₀`, `Q·S₀`,
//! `Q·Kᵀ`, `K·Kᵀ`, `(M∘QKᵀ)·U`, `Kᵀ·U`) run on the linear kernels' register-blocked `gemm`; the
//! triangular solve is `C²·Dv` scalar work per chunk.
//!
//! The channel gate (KDA) runs the recurrence per head (the chunked form's decays would be per
//! channel and pair of tokens).

use rayon::prelude::*;

use super::reference::{head_forward, prepared, At};
use super::{check, DeltaDims, DeltaInputs, DeltaOutput, DeltaParams, Gate};
use crate::alloc;
use crate::error::Result;
use crate::linear::gemm::{gemm, Lhs};
use crate::linear::transpose::transpose;
use crate::simd::Isa;

/// Tokens per chunk: the triangular solve's `C²·Dv` against the products' `C·Dk·Dv`.
pub const CHUNK: usize = 64;

/// The gated delta rule's outputs `o: [B, T, Hv, Dv]` and final states `[B, Hv, Dk, Dv]` in `f32`
/// (module header); refuses inputs that do not match `d` and `p`, naming the argument.
pub fn delta_rule(d: &DeltaDims, x: &DeltaInputs<f32>, p: &DeltaParams) -> Result<DeltaOutput<f32>> {
    let scale = check(d, x, p)? as f32;
    let mut out = alloc::zeroed("delta rule output", &[d.v_len()])?;
    let mut final_state = alloc::zeroed("delta rule final state", &[d.state_len()])?;
    let (dk, dv, hv, t) = (d.dk, d.dv, d.hv, d.t);
    if let Some(init) = x.initial_state {
        final_state.copy_from_slice(init);
    }
    let isa = Isa::best();
    // Each (b, h) owns its state and writes its own output rows (`Dv` apart from those of the
    // other heads of the token): the rows are gathered per head and scattered after.
    let heads: Vec<Vec<f32>> = final_state
        .par_chunks_mut(dk * dv)
        .enumerate()
        .map(|(bh, s)| {
            let (b, h) = (bh / hv, bh % hv);
            let mut o = vec![0.0f32; t * dv];
            let head = Head { d, x, p, scale, b, h };
            match p.gate {
                Gate::Scalar => head.chunked(isa, s, &mut o),
                Gate::Channel => head.recurrent(s, &mut o),
            }
            o
        })
        .collect();
    for (bh, o) in heads.iter().enumerate() {
        let (b, h) = (bh / hv, bh % hv);
        for (r, row) in o.chunks_exact(dv).enumerate() {
            out[((b * t + r) * hv + h) * dv..][..dv].copy_from_slice(row);
        }
    }
    Ok(DeltaOutput { out, final_state })
}

/// Rows of the head's inputs for tokens `t0..t0 + n`: `q` (normalised and scaled), `k`
/// (normalised), `v`, `β` and the scalar log decays.
struct Rows {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    beta: Vec<f32>,
    g: Vec<f32>,
}

/// One (batch, value head) of a call.
struct Head<'a> {
    d: &'a DeltaDims,
    x: &'a DeltaInputs<'a, f32>,
    p: &'a DeltaParams,
    scale: f32,
    b: usize,
    h: usize,
}

impl Head<'_> {
    /// The head's rows of tokens `t0..t0 + n`.
    fn rows(&self, t0: usize, n: usize) -> Rows {
        let Head { d, x, p, scale, b, h } = *self;
        let at = At { d, gate: p.gate };
        let (mut q, mut k, mut v) =
            (Vec::with_capacity(n * d.dk), Vec::with_capacity(n * d.dk), Vec::with_capacity(n * d.dv));
        let (mut beta, mut g) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for t in t0..t0 + n {
            q.extend(prepared(&x.q[at.qk(b, t, h)..][..d.dk], p.l2norm_qk, scale).0);
            k.extend(prepared(&x.k[at.qk(b, t, h)..][..d.dk], p.l2norm_qk, 1.0).0);
            v.extend_from_slice(&x.v[at.v(b, t, h)..][..d.dv]);
            beta.push(x.beta[at.beta(b, t, h)]);
            g.push(x.g[at.g(b, t, h)]);
        }
        Rows { q, k, v, beta, g }
    }

    /// The head in chunks: `s` (`[Dk, Dv]`) holds the initial state and is left holding the final
    /// one; `o` (`[T, Dv]`) receives the outputs.
    fn chunked(&self, isa: Isa, s: &mut [f32], o: &mut [f32]) {
        let d = self.d;
        let (dk, dv) = (d.dk, d.dv);
        let mut kt = vec![0.0f32; dk * CHUNK];
        let mut gram = vec![0.0f32; CHUNK * CHUNK];
        let mut qk = vec![0.0f32; CHUNK * CHUNK];
        let mut u = vec![0.0f32; CHUNK * dv];
        for t0 in (0..d.t).step_by(CHUNK) {
            let n = CHUNK.min(d.t - t0);
            let r = self.rows(t0, n);
            // Cumulative log decays from the chunk's start, summed in f64: their differences are
            // what the decays are made of, and f32 sums of strong decays lose them.
            let mut gamma: Vec<f64> = r.g.iter().map(|&g| f64::from(g)).collect();
            for i in 1..n {
                gamma[i] += gamma[i - 1];
            }
            let ratio = |a: f64, b: f64| (a - b).exp() as f32;
            // u = K·S₀ first (then each row is turned into its correction).
            gemm(isa, n, dv, dk, Lhs::rows(&r.k, dk).write(true), s, dv, &mut u, dv);
            transpose(isa, &r.k, dk, n, dk, &mut kt, n);
            gemm(isa, n, n, dk, Lhs::rows(&r.k, dk).write(true), &kt, n, &mut gram, n);
            gemm(isa, n, n, dk, Lhs::rows(&r.q, dk).write(true), &kt, n, &mut qk, n);
            // The triangular solve, row by row: u_s = β_s(v_s − Γ_s·(K S₀)_s − Σ_{j<s} G_sj u_j).
            for i in 0..n {
                let decay = gamma[i].exp() as f32;
                let (done, rest) = u.split_at_mut(i * dv);
                let row = &mut rest[..dv];
                for (x, &v) in row.iter_mut().zip(&r.v[i * dv..][..dv]) {
                    *x = v - decay * *x;
                }
                for (j, prev) in done.chunks_exact(dv).enumerate() {
                    let c = ratio(gamma[i], gamma[j]) * gram[i * n + j];
                    row.iter_mut().zip(prev).for_each(|(x, &y)| *x -= c * y);
                }
                row.iter_mut().for_each(|x| *x *= r.beta[i]);
            }
            // o = diag(Γ)·Q·S₀ + (M∘QKᵀ)·U, M_rs = exp(γ_r − γ_s) for s ≤ r.
            let out = &mut o[t0 * dv..][..n * dv];
            gemm(isa, n, dv, dk, Lhs::rows(&r.q, dk).write(true), s, dv, out, dv);
            for i in 0..n {
                let decay = gamma[i].exp() as f32;
                out[i * dv..][..dv].iter_mut().for_each(|x| *x *= decay);
                for j in 0..n {
                    qk[i * n + j] = if j <= i { ratio(gamma[i], gamma[j]) * qk[i * n + j] } else { 0.0 };
                }
            }
            gemm(isa, n, dv, n, Lhs::rows(&qk, n), &u, dv, out, dv);
            // S = Γ_C·S₀ + Kᵀ·diag(exp(γ_C − γ_s))·U.
            let last = gamma[n - 1];
            s.iter_mut().for_each(|x| *x *= last.exp() as f32);
            for i in 0..n {
                let c = ratio(last, gamma[i]);
                u[i * dv..][..dv].iter_mut().for_each(|x| *x *= c);
            }
            gemm(isa, dk, dv, n, Lhs::transposed(&r.k, dk), &u, dv, s, dv);
        }
    }

    /// The head token by token (the reference's recurrence in `f32`), `s` and `o` as in
    /// [`Head::chunked`].
    fn recurrent(&self, s: &mut [f32], o: &mut [f32]) {
        let at = At { d: self.d, gate: self.p.gate };
        head_forward(&at, self.x, self.p, self.scale, (self.b, self.h), s, o, |t| t * self.d.dv);
    }
}
