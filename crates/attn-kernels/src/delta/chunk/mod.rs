//! The gated delta rule in chunks (Yang et al. 2024, "Parallelizing Linear Transformers with the
//! Delta Rule over Sequence Length"), `f32`, parallel over (sequence, value head). Inside a chunk of
//! [`CHUNK`] tokens with the state `S₀` at its start and `γ_r` the cumulative log decay from the
//! chunk's start (so `Γ_r = exp(γ_r) ≤ 1`), the corrections `U` of the recurrence solve a unit
//! lower-triangular system,
//!
//! `(I + A)·U = diag(β)·(V − diag(Γ)·K·S₀)`, `A_sj = β_s·exp(γ_s − γ_j)·(k_s·k_j)` for `j < s`,
//!
//! after which `O = diag(Γ)·Q·S₀ + P·U` with `P_rs = exp(γ_r − γ_s)·(q_r·k_s)` for `s ≤ r`, and the
//! next chunk's state is `Γ_C·S₀ + Kᵀ·diag(exp(γ_C − γ_s))·U`. Every decay is a difference of log
//! decays within the chunk, at most 1: nothing overflows however strong the decay. `(I + A)⁻¹` is
//! formed once per chunk (`C³/6` work), so the solve and everything else are products on the linear
//! kernels' register-blocked `gemm`.
//!
//! - `forward`: [`delta_rule`], the outputs and final states.
//! - `backward`: [`delta_rule_backward`], every gradient: the forward again keeping the state at
//!   each chunk's start (`T/C` states per head), then the chunks in reverse, each chunk's quantities
//!   recomputed from its start state and differentiated as products.
//!
//! The channel gate (KDA) runs the recurrence per head in both directions (the chunked form's decays
//! would be per channel and pair of tokens).

mod backward;
mod forward;

pub use backward::delta_rule_backward;
pub use forward::delta_rule;

use super::reference::{prepared, At};
use super::{DeltaDims, DeltaInputs, DeltaParams};
use crate::linear::gemm::{gemm, Lhs, Part};
use crate::linear::transpose::transpose;
use crate::simd::Isa;

/// Tokens per chunk: the inverse's `C³/6` and the products' `C²·D` against the state products'
/// `C·Dk·Dv`.
pub const CHUNK: usize = 64;

/// Rows of one head's inputs for tokens `t0..t0 + n`: `q` (normalised and scaled), `k`
/// (normalised), `v`, `β` and the scalar log decays.
struct Rows {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    beta: Vec<f32>,
    g: Vec<f32>,
}

/// One (sequence, value head) of a call.
#[derive(Clone, Copy)]
struct Head<'a> {
    d: &'a DeltaDims,
    x: &'a DeltaInputs<'a, f32>,
    p: &'a DeltaParams,
    scale: f32,
    /// The sequence.
    n: usize,
    h: usize,
}

impl<'a> Head<'a> {
    fn at(&self) -> At<'a> {
        At::new(self.d, self.x, self.p.gate)
    }

    /// The sequence's tokens.
    fn tokens(&self) -> usize {
        self.at().tokens(self.n)
    }

    /// The head's rows of tokens `t0..t0 + n`.
    fn rows(&self, t0: usize, n: usize) -> Rows {
        let Head { d, x, p, scale, n: b, h } = *self;
        let at = self.at();
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
}

/// `exp(a − b)` in `f32`: the decay between two cumulative log decays.
fn ratio(a: f64, b: f64) -> f32 {
    (a - b).exp() as f32
}

/// A chunk's forward quantities from its rows and start state `S₀`, in buffers kept across the
/// chunks of a head (`n` rows each, leading dimension `n` for the `n × n` ones).
struct Chunk {
    n: usize,
    /// `γ`: cumulative log decays from the chunk's start, summed in `f64` — their differences are
    /// what the decays are made of, and `f32` sums of strong decays lose them.
    gamma: Vec<f64>,
    /// `Kᵀ`, `[Dk, n]`.
    kt: Vec<f32>,
    /// `K·Kᵀ`, `[n, n]`.
    gram: Vec<f32>,
    /// `P` (`Q·Kᵀ` decayed, zero above the diagonal), `[n, n]`.
    p: Vec<f32>,
    /// `A` (zero on and above the diagonal), `[n, n]`.
    a: Vec<f32>,
    /// `(I + A)⁻¹`, unit lower triangular, `[n, n]`.
    inv: Vec<f32>,
    /// `W = K·S₀`, `[n, Dv]`.
    w: Vec<f32>,
    /// `diag(β)·(V − diag(Γ)·W)`, `[n, Dv]`.
    y: Vec<f32>,
    /// `U`, `[n, Dv]`.
    u: Vec<f32>,
}

impl Chunk {
    fn new(dk: usize, dv: usize) -> Chunk {
        let sq = CHUNK * CHUNK;
        Chunk {
            n: 0,
            gamma: Vec::with_capacity(CHUNK),
            kt: vec![0.0; dk * CHUNK],
            gram: vec![0.0; sq],
            p: vec![0.0; sq],
            a: vec![0.0; sq],
            inv: vec![0.0; sq],
            w: vec![0.0; CHUNK * dv],
            y: vec![0.0; CHUNK * dv],
            u: vec![0.0; CHUNK * dv],
        }
    }

    /// Fills every quantity of the chunk of rows `r` starting from state `s` (`[Dk, Dv]`); `P` only
    /// when `outputs` (the state alone needs `U`).
    fn fill(&mut self, isa: Isa, r: &Rows, s: &[f32], (dk, dv): (usize, usize), outputs: bool) {
        let n = r.beta.len();
        self.n = n;
        self.gamma.clear();
        self.gamma.extend(r.g.iter().scan(0.0f64, |acc, &g| {
            *acc += f64::from(g);
            Some(*acc)
        }));
        let gamma = &self.gamma;
        gemm(isa, n, dv, dk, Lhs::rows(&r.k, dk).write(true), s, dv, &mut self.w, dv);
        transpose(isa, &r.k, dk, n, dk, &mut self.kt, n);
        gemm(isa, n, n, dk, Lhs::rows(&r.k, dk).part(Part::LowerOut).write(true), &self.kt, n, &mut self.gram, n);
        if outputs {
            gemm(isa, n, n, dk, Lhs::rows(&r.q, dk).part(Part::LowerOut).write(true), &self.kt, n, &mut self.p, n);
            for i in 0..n {
                let row = &mut self.p[i * n..][..n];
                row.iter_mut()
                    .enumerate()
                    .for_each(|(j, x)| *x = if j <= i { ratio(gamma[i], gamma[j]) * *x } else { 0.0 });
            }
        }
        for i in 0..n {
            let (gram, a) = (&self.gram[i * n..][..n], &mut self.a[i * n..][..n]);
            for (j, x) in a.iter_mut().enumerate() {
                *x = if j < i { r.beta[i] * ratio(gamma[i], gamma[j]) * gram[j] } else { 0.0 };
            }
        }
        // (I + A)⁻¹ row by row: row i = e_i − Σ_{j<i} A_ij·row j (row j is zero past column j).
        for i in 0..n {
            let (done, rest) = self.inv.split_at_mut(i * n);
            let row = &mut rest[..n];
            row.fill(0.0);
            for (j, prev) in done.chunks_exact(n).enumerate() {
                let c = self.a[i * n + j];
                row[..=j].iter_mut().zip(&prev[..=j]).for_each(|(x, &y)| *x -= c * y);
            }
            row[i] = 1.0;
        }
        for (i, g) in gamma.iter().enumerate() {
            let decay = g.exp() as f32;
            let (y, w, v) = (&mut self.y[i * dv..][..dv], &self.w[i * dv..][..dv], &r.v[i * dv..][..dv]);
            y.iter_mut().zip(w).zip(v).for_each(|((y, &w), &v)| *y = r.beta[i] * (v - decay * w));
        }
        gemm(isa, n, dv, n, Lhs::rows(&self.inv, n).part(Part::LowerA).write(true), &self.y, dv, &mut self.u, dv);
    }

    /// The next chunk's state in `s`: `Γ_C·S₀ + Kᵀ·diag(exp(γ_C − γ_s))·U` (consumes `U`).
    fn advance(&mut self, isa: Isa, r: &Rows, s: &mut [f32], (dk, dv): (usize, usize)) {
        let n = self.n;
        if n == 0 {
            return;
        }
        let last = self.gamma[n - 1];
        s.iter_mut().for_each(|x| *x *= last.exp() as f32);
        for i in 0..n {
            let c = ratio(last, self.gamma[i]);
            self.u[i * dv..][..dv].iter_mut().for_each(|x| *x *= c);
        }
        gemm(isa, dk, dv, n, Lhs::transposed(&r.k, dk), &self.u, dv, s, dv);
    }
}
