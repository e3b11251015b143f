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
//! decays within the chunk, at most 1: nothing overflows however strong the decay (its `exp` is
//! taken once per token, `exp(γ_i)·exp(−γ_j)` in `f64`, where the chunk's decay leaves both in
//! range, else once per pair). `(I + A)⁻¹` is formed once per chunk (`C³/6` work), so the solve
//! and everything else are products on the linear kernels' register-blocked `gemm`.
//!
//! - `forward`: [`delta_rule`], the outputs and final states.
//! - `backward`: [`delta_rule_backward`], every gradient: the forward again keeping the state at
//!   each chunk's start (`T/C` states per head), then the chunks in reverse, each chunk's quantities
//!   recomputed from its start state and differentiated as products.
//!
//! The channel gate (KDA) decays each key channel `c` by its own `γ_{r,c}`, so a pair's decay
//! `exp(γ_{r,c} − γ_{s,c})` differs per channel and cannot multiply a product's entry afterwards.
//! Its forward factorises it instead: with `K⁺ = K∘exp(γ)`, `Q⁺ = Q∘exp(γ)` and `K⁻ = K∘exp(−γ)`,
//! `A_sj = β_s·(K⁺·K⁻ᵀ)_sj`, `P = Q⁺·K⁻ᵀ`, `O = Q⁺·S₀ + P·U`, `Y = diag(β)·(V − K⁺·S₀)` and the
//! next state `diag(exp(γ_C))·S₀ + (K∘exp(γ_C − γ))ᵀ·U`, the same products as the scalar gate's. A
//! chunk in which some channel decays by more than `exp(−CHANNEL_SPREAD)` (where `exp(−γ)` would
//! leave `f32`'s range) runs token by token instead, in the backward too.

mod backward;
mod forward;

pub use backward::delta_rule_backward;
pub use forward::delta_rule;

use super::reference::{normaliser, At};
use super::{DeltaDims, DeltaInputs, DeltaParams, Gate};
use crate::linear::gemm::{gemm, Lhs, Part};
use crate::linear::transpose::transpose;
use crate::simd::Isa;

/// Tokens per chunk: the inverse's `C³/6` and the products' `C²·D` against the state products'
/// `C·Dk·Dv`.
pub const CHUNK: usize = 64;

/// The most a channel's cumulative log decay may fall inside a chunk for the channel gate's
/// factorised products: `exp(±60)` and sums of 2¹⁰ of them stay well inside `f32`'s range.
const CHANNEL_SPREAD: f64 = 60.0;

/// Rows of one head's inputs for tokens `t0..t0 + n`: `q` (normalised and scaled), `k`
/// (normalised), `v`, `β` and the log decays (one per token, or `Dk` per token with the channel
/// gate).
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
        let per_token = if p.gate == Gate::Channel { d.dk } else { 1 };
        let (mut beta, mut g) = (Vec::with_capacity(n), Vec::with_capacity(n * per_token));
        for t in t0..t0 + n {
            // As `prepared`, without a vector per row.
            let (qr, kr) = (&x.q[at.qk(b, t, h)..][..d.dk], &x.k[at.qk(b, t, h)..][..d.dk]);
            let (rq, rk) = (normaliser(qr, p.l2norm_qk), normaliser(kr, p.l2norm_qk));
            q.extend(qr.iter().map(|&v| v * rq * scale));
            k.extend(kr.iter().map(|&v| v * rk));
            v.extend_from_slice(&x.v[at.v(b, t, h)..][..d.dv]);
            beta.push(x.beta[at.beta(b, t, h)]);
            g.extend_from_slice(&x.g[at.g(b, t, h)..][..per_token]);
        }
        Rows { q, k, v, beta, g }
    }
}

/// `exp(γ_i − γ_j)` in `f32` (`i ≥ j`), the decay between two cumulative log decays: as
/// `exp(γ_i)·exp(−γ_j)` from `rise = exp(γ)` and `fall = exp(−γ)` when they are given, by its own
/// `exp` otherwise.
fn pair_decay(gamma: &[f64], rise: &[f64], fall: &[f64], i: usize, j: usize) -> f32 {
    if rise.is_empty() {
        (gamma[i] - gamma[j]).exp() as f32
    } else {
        (rise[i] * fall[j]) as f32
    }
}

/// The most the scalar gate's cumulative log decay may fall inside a chunk for its pair decays to
/// be products of per-token exps: `exp(700)` is still finite in `f64`.
const SCALAR_SPREAD: f64 = 700.0;

/// A chunk's forward quantities from its rows and start state `S₀`, in buffers kept across the
/// chunks of a head (`n` rows each, leading dimension `n` for the `n × n` ones).
struct Chunk {
    n: usize,
    /// `γ`: cumulative log decays from the chunk's start, summed in `f64` — their differences are
    /// what the decays are made of, and `f32` sums of strong decays lose them.
    gamma: Vec<f64>,
    /// `exp(γ)` and `exp(−γ)` per token when the chunk's decay stays within [`SCALAR_SPREAD`]
    /// (two exps per token instead of one per pair), else empty.
    rise: Vec<f64>,
    fall: Vec<f64>,
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
    /// The channel gate's: `γ` per token and channel, `[n, Dk]` (`f64`, as `gamma`).
    gamma_c: Vec<f64>,
    /// The channel gate's `K⁺ = K∘exp(γ)` (then, in [`Chunk::advance_channel`], `K∘exp(γ_C − γ)`)
    /// and `Q⁺ = Q∘exp(γ)`, `[n, Dk]`, and `K⁻ = K∘exp(−γ)` transposed, `[Dk, n]`.
    kplus: Vec<f32>,
    qplus: Vec<f32>,
    kminus_t: Vec<f32>,
    /// The channel gate's `exp(γ)` and `exp(−γ)`, `[n, Dk]`.
    up: Vec<f32>,
    down: Vec<f32>,
}

impl Chunk {
    fn new(dk: usize, dv: usize) -> Chunk {
        let sq = CHUNK * CHUNK;
        Chunk {
            n: 0,
            gamma: Vec::with_capacity(CHUNK),
            rise: Vec::with_capacity(CHUNK),
            fall: Vec::with_capacity(CHUNK),
            kt: vec![0.0; dk * CHUNK],
            gram: vec![0.0; sq],
            p: vec![0.0; sq],
            a: vec![0.0; sq],
            inv: vec![0.0; sq],
            w: vec![0.0; CHUNK * dv],
            y: vec![0.0; CHUNK * dv],
            u: vec![0.0; CHUNK * dv],
            gamma_c: Vec::new(),
            kplus: Vec::new(),
            qplus: Vec::new(),
            kminus_t: Vec::new(),
            up: Vec::new(),
            down: Vec::new(),
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
        self.rise.clear();
        self.fall.clear();
        if self.gamma.last().is_some_and(|&g| g >= -SCALAR_SPREAD) {
            self.rise.extend(self.gamma.iter().map(|g| g.exp()));
            self.fall.extend(self.rise.iter().map(|e| e.recip()));
        }
        let pair = |i: usize, j: usize| pair_decay(&self.gamma, &self.rise, &self.fall, i, j);
        gemm(isa, n, dv, dk, Lhs::rows(&r.k, dk).write(true), s, dv, &mut self.w, dv);
        transpose(isa, &r.k, dk, n, dk, &mut self.kt, n);
        gemm(isa, n, n, dk, Lhs::rows(&r.k, dk).part(Part::LowerOut).write(true), &self.kt, n, &mut self.gram, n);
        if outputs {
            gemm(isa, n, n, dk, Lhs::rows(&r.q, dk).part(Part::LowerOut).write(true), &self.kt, n, &mut self.p, n);
            for i in 0..n {
                let row = &mut self.p[i * n..][..n];
                row.iter_mut().enumerate().for_each(|(j, x)| *x = if j <= i { pair(i, j) * *x } else { 0.0 });
            }
        }
        for i in 0..n {
            let (gram, a) = (&self.gram[i * n..][..n], &mut self.a[i * n..][..n]);
            for (j, x) in a.iter_mut().enumerate() {
                *x = if j < i { r.beta[i] * pair(i, j) * gram[j] } else { 0.0 };
            }
        }
        self.solve(isa, r, dv, true);
    }

    /// `exp(γ_i − γ_j)` of the chunk last filled (`i ≥ j`).
    fn pair(&self, i: usize, j: usize) -> f32 {
        pair_decay(&self.gamma, &self.rise, &self.fall, i, j)
    }

    /// The channel gate's [`Chunk::fill`] through the factorised products (module header); `false`,
    /// with nothing usable filled, when a channel decays by more than [`CHANNEL_SPREAD`] over the
    /// chunk.
    fn fill_channel(&mut self, isa: Isa, r: &Rows, s: &[f32], (dk, dv): (usize, usize), outputs: bool) -> bool {
        let n = r.beta.len();
        self.n = n;
        self.gamma_c.resize(n * dk, 0.0);
        for c in 0..dk {
            let mut acc = 0.0f64;
            for i in 0..n {
                acc += f64::from(r.g[i * dk + c]);
                self.gamma_c[i * dk + c] = acc;
            }
        }
        if self.gamma_c[(n - 1) * dk..].iter().any(|&g| g < -CHANNEL_SPREAD) {
            return false;
        }
        for buf in [&mut self.kplus, &mut self.qplus, &mut self.kminus_t, &mut self.up, &mut self.down] {
            buf.resize(n * dk, 0.0);
        }
        // One `exp` per entry: `exp(−γ)` is its reciprocal. `K⁻` is written transposed.
        for (i, gamma) in self.gamma_c.iter().enumerate() {
            let up = gamma.exp();
            let (down, up) = (up.recip() as f32, up as f32);
            self.kplus[i] = r.k[i] * up;
            self.qplus[i] = r.q[i] * up;
            self.kminus_t[i % dk * n + i / dk] = r.k[i] * down;
            self.up[i] = up;
            self.down[i] = down;
        }
        gemm(isa, n, dv, dk, Lhs::rows(&self.kplus, dk).write(true), s, dv, &mut self.w, dv);
        let lower = |lhs: &[f32], out: &mut [f32]| {
            gemm(isa, n, n, dk, Lhs::rows(lhs, dk).part(Part::LowerOut).write(true), &self.kminus_t, n, out, n);
            for i in 0..n {
                out[i * n + i + 1..(i + 1) * n].fill(0.0);
            }
        };
        lower(&self.kplus, &mut self.gram);
        if outputs {
            lower(&self.qplus, &mut self.p);
        }
        for i in 0..n {
            let (gram, a) = (&self.gram[i * n..][..n], &mut self.a[i * n..][..n]);
            for (j, x) in a.iter_mut().enumerate() {
                *x = if j < i { r.beta[i] * gram[j] } else { 0.0 };
            }
        }
        self.solve(isa, r, dv, false);
        true
    }

    /// `(I + A)⁻¹`, `Y` and `U = (I + A)⁻¹·Y` from `A` and `W`; `Y = diag(β)·(V − diag(Γ)·W)`
    /// with the scalar gate's `Γ` when `decay_w`, `diag(β)·(V − W)` otherwise (the channel gate's
    /// `W` is decayed already).
    fn solve(&mut self, isa: Isa, r: &Rows, dv: usize, decay_w: bool) {
        let n = self.n;
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
        for i in 0..n {
            let decay = if decay_w { self.gamma[i].exp() as f32 } else { 1.0 };
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
            let c = self.pair(n - 1, i);
            self.u[i * dv..][..dv].iter_mut().for_each(|x| *x *= c);
        }
        gemm(isa, dk, dv, n, Lhs::transposed(&r.k, dk), &self.u, dv, s, dv);
    }

    /// The channel gate's [`Chunk::advance`]: `diag(exp(γ_C))·S₀ + (K∘exp(γ_C − γ))ᵀ·U`, the
    /// decayed keys written over `K⁺` (`exp(γ_C − γ)` as `exp(γ_C)·exp(−γ)`: both within
    /// [`CHANNEL_SPREAD`], their product at most 1).
    fn advance_channel(&mut self, isa: Isa, r: &Rows, s: &mut [f32], (dk, dv): (usize, usize)) {
        let n = self.n;
        let last: Vec<f32> = self.gamma_c[(n - 1) * dk..][..dk].iter().map(|g| g.exp() as f32).collect();
        for (row, &decay) in s.chunks_exact_mut(dv).zip(&last) {
            row.iter_mut().for_each(|x| *x *= decay);
        }
        for (i, kd) in self.kplus.chunks_exact_mut(dk).enumerate() {
            let (k, down) = (&r.k[i * dk..][..dk], &self.down[i * dk..][..dk]);
            for (((x, &k), &up), &down) in kd.iter_mut().zip(k).zip(&last).zip(down) {
                *x = k * (up * down);
            }
        }
        gemm(isa, dk, dv, n, Lhs::transposed(&self.kplus, dk), &self.u, dv, s, dv);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The channel gate's factorised products are taken while every channel's decay over the
    /// chunk stays within `exp(−CHANNEL_SPREAD)`, and refused (token by token instead) past it.
    #[test]
    fn the_factorised_channel_chunk_is_refused_only_past_the_spread() {
        let (n, dk, dv) = (CHUNK, 4, 3);
        let rows = |g: f32| Rows {
            q: vec![0.5; n * dk],
            k: vec![0.5; n * dk],
            v: vec![1.0; n * dv],
            beta: vec![0.5; n],
            g: vec![g; n * dk],
        };
        let s = vec![0.0; dk * dv];
        let mut c = Chunk::new(dk, dv);
        let per_token = (CHANNEL_SPREAD / n as f64) as f32;
        assert!(c.fill_channel(Isa::best(), &rows(-0.9 * per_token), &s, (dk, dv), true));
        assert!(c.u.iter().all(|x| x.is_finite()));
        assert!(!c.fill_channel(Isa::best(), &rows(-1.1 * per_token), &s, (dk, dv), true));
    }
}
