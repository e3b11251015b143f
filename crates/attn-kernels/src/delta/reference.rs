//! The gated delta rule token by token (the module header's recurrence), forward and its exact
//! reverse-mode derivative, in the caller's precision. The backward keeps each head's states
//! before every token (`T·Dk·Dv` values of one head at a time) and walks the tokens back.

use super::{check, len, DeltaDims, DeltaGrads, DeltaInputs, DeltaOutput, DeltaParams, Gate, L2NORM_EPS};
use crate::alloc;
use crate::error::Result;
use crate::reference::Real;

/// Where a call's rows sit: the row-major offsets of the module header's layouts.
pub(super) struct At<'a> {
    pub(super) d: &'a DeltaDims,
    pub(super) gate: Gate,
}

impl At<'_> {
    /// Query/key row of token `t` of batch `b` for value head `h` (its key head).
    pub(super) fn qk(&self, b: usize, t: usize, h: usize) -> usize {
        let kh = h / (self.d.hv / self.d.hk);
        ((b * self.d.t + t) * self.d.hk + kh) * self.d.dk
    }

    /// Value (and output) row.
    pub(super) fn v(&self, b: usize, t: usize, h: usize) -> usize {
        ((b * self.d.t + t) * self.d.hv + h) * self.d.dv
    }

    /// `beta`'s entry (and a scalar `g`'s).
    pub(super) fn beta(&self, b: usize, t: usize, h: usize) -> usize {
        (b * self.d.t + t) * self.d.hv + h
    }

    /// `g`'s first entry for the token and head.
    pub(super) fn g(&self, b: usize, t: usize, h: usize) -> usize {
        match self.gate {
            Gate::Scalar => self.beta(b, t, h),
            Gate::Channel => self.beta(b, t, h) * self.d.dk,
        }
    }

    /// The state of `(b, h)`.
    pub(super) fn state(&self, b: usize, h: usize) -> usize {
        (b * self.d.hv + h) * self.d.dk * self.d.dv
    }
}

/// `x`, L2-normalised when `norm` (`x / √(Σx² + ε)`), times `scale`; and the normaliser `r`.
pub(super) fn prepared<T: Real>(x: &[T], norm: bool, scale: T) -> (Vec<T>, T) {
    let r = if norm {
        let eps = T::from_f64(L2NORM_EPS).expect("a float");
        (x.iter().fold(T::zero(), |s, &v| s + v * v) + eps).sqrt().recip()
    } else {
        T::one()
    };
    (x.iter().map(|&v| v * r * scale).collect(), r)
}

/// The decay of each state row of one token: `exp(g)` for every row, or `exp(g_i)` for row `i`.
pub(super) fn decays<T: Real>(g: &[T], at: usize, gate: Gate, dk: usize) -> Vec<T> {
    match gate {
        Gate::Scalar => vec![g[at].exp(); dk],
        Gate::Channel => g[at..at + dk].iter().map(|x| x.exp()).collect(),
    }
}

/// One token's step on `s` (`[Dk, Dv]`, in place): decay, read `pred = S'ᵀk`, write `k uᵀ` with
/// `u = β(v − pred)`; returns `u` and `v − pred`.
pub(super) fn step<T: Real>(s: &mut [T], a: &[T], k: &[T], v: &[T], beta: T) -> (Vec<T>, Vec<T>) {
    let dv = v.len();
    for (row, &ai) in s.chunks_exact_mut(dv).zip(a) {
        row.iter_mut().for_each(|x| *x = *x * ai);
    }
    let mut err = v.to_vec();
    for (row, &ki) in s.chunks_exact(dv).zip(k) {
        err.iter_mut().zip(row).for_each(|(e, &x)| *e = *e - x * ki);
    }
    let u: Vec<T> = err.iter().map(|&e| beta * e).collect();
    for (row, &ki) in s.chunks_exact_mut(dv).zip(k) {
        row.iter_mut().zip(&u).for_each(|(x, &uj)| *x = *x + ki * uj);
    }
    (u, err)
}

/// The gated delta rule's outputs `o: [B, T, Hv, Dv]` and final states `[B, Hv, Dk, Dv]`;
/// refuses inputs that do not match `d` and `p` (module header), naming the argument.
pub fn delta_rule_reference<T: Real>(d: &DeltaDims, x: &DeltaInputs<T>, p: &DeltaParams) -> Result<DeltaOutput<T>> {
    let scale = T::from_f64(check(d, x, p)?).expect("a float");
    let at = At { d, gate: p.gate };
    let mut out = alloc::zeroed("delta rule output", &[d.v_len()])?;
    let mut final_state = alloc::zeroed("delta rule final state", &[d.state_len()])?;
    let dk = d.dk;
    for b in 0..d.b {
        for h in 0..d.hv {
            let s = &mut final_state[at.state(b, h)..][..dk * d.dv];
            if let Some(init) = x.initial_state {
                s.copy_from_slice(&init[at.state(b, h)..][..dk * d.dv]);
            }
            head_forward(&at, x, p, scale, (b, h), s, &mut out, |t| at.v(b, t, h));
        }
    }
    Ok(DeltaOutput { out, final_state })
}

/// Head `(b, h)`'s tokens through the recurrence: `s` (`[Dk, Dv]`) goes from the initial state to
/// the final one, and token `t`'s output is added into `out[row(t)..][..Dv]`.
#[allow(clippy::too_many_arguments)]
pub(super) fn head_forward<T: Real>(
    at: &At,
    x: &DeltaInputs<T>,
    p: &DeltaParams,
    scale: T,
    (b, h): (usize, usize),
    s: &mut [T],
    out: &mut [T],
    row: impl Fn(usize) -> usize,
) {
    let (dk, dv) = (at.d.dk, at.d.dv);
    for t in 0..at.d.t {
        let (q, _) = prepared(&x.q[at.qk(b, t, h)..][..dk], p.l2norm_qk, scale);
        let (k, _) = prepared(&x.k[at.qk(b, t, h)..][..dk], p.l2norm_qk, T::one());
        let a = decays(x.g, at.g(b, t, h), p.gate, dk);
        step(s, &a, &k, &x.v[at.v(b, t, h)..][..dv], x.beta[at.beta(b, t, h)]);
        let o = &mut out[row(t)..][..dv];
        for (srow, &qi) in s.chunks_exact(dv).zip(&q) {
            o.iter_mut().zip(srow).for_each(|(o, &x)| *o = *o + x * qi);
        }
    }
}

/// The gradients of every input of [`delta_rule_reference`] given the output's gradient
/// `dout: [B, T, Hv, Dv]` and, when the final state is used, its gradient `dfinal: [B, Hv, Dk, Dv]`.
pub fn delta_rule_reference_backward<T: Real>(
    d: &DeltaDims,
    x: &DeltaInputs<T>,
    p: &DeltaParams,
    dout: &[T],
    dfinal: Option<&[T]>,
) -> Result<DeltaGrads<T>> {
    let scale = T::from_f64(check(d, x, p)?).expect("a float");
    len("dout", d.v_len(), dout.len())?;
    if let Some(f) = dfinal {
        len("dfinal_state", d.state_len(), f.len())?;
    }
    let at = At { d, gate: p.gate };
    let (dk, dv) = (d.dk, d.dv);
    let mut g = DeltaGrads {
        dq: alloc::zeroed("dq", &[d.qk_len()])?,
        dk: alloc::zeroed("dk", &[d.qk_len()])?,
        dv: alloc::zeroed("dv", &[d.v_len()])?,
        dg: alloc::zeroed("dg", &[d.g_len(p.gate)])?,
        dbeta: alloc::zeroed("dbeta", &[d.beta_len()])?,
        dinitial_state: alloc::zeroed("dinitial_state", &[d.state_len()])?,
    };
    let mut before = alloc::zeroed::<T>("delta rule states", &[d.t, dk * dv])?;
    for b in 0..d.b {
        for h in 0..d.hv {
            // The forward again, keeping the state before each token.
            let mut s = match x.initial_state {
                Some(init) => init[at.state(b, h)..][..dk * dv].to_vec(),
                None => vec![T::zero(); dk * dv],
            };
            for t in 0..d.t {
                before[t * dk * dv..][..dk * dv].copy_from_slice(&s);
                let (k, _) = prepared(&x.k[at.qk(b, t, h)..][..dk], p.l2norm_qk, T::one());
                let a = decays(x.g, at.g(b, t, h), p.gate, dk);
                step(&mut s, &a, &k, &x.v[at.v(b, t, h)..][..dv], x.beta[at.beta(b, t, h)]);
            }
            let mut ds = match dfinal {
                Some(f) => f[at.state(b, h)..][..dk * dv].to_vec(),
                None => vec![T::zero(); dk * dv],
            };
            for t in (0..d.t).rev() {
                let prev = &before[t * dk * dv..][..dk * dv];
                let (qr, kr) = (&x.q[at.qk(b, t, h)..][..dk], &x.k[at.qk(b, t, h)..][..dk]);
                let (q, rq) = prepared(qr, p.l2norm_qk, scale);
                let (k, rk) = prepared(kr, p.l2norm_qk, T::one());
                let a = decays(x.g, at.g(b, t, h), p.gate, dk);
                let beta = x.beta[at.beta(b, t, h)];
                let v = &x.v[at.v(b, t, h)..][..dv];
                let mut st = prev.to_vec();
                let (u, err) = step(&mut st, &a, &k, v, beta);
                // S' = diag(a)·prev.
                let sp: Vec<T> =
                    prev.chunks_exact(dv).zip(&a).flat_map(|(row, &ai)| row.iter().map(move |&x| x * ai)).collect();
                let o_grad = &dout[at.v(b, t, h)..][..dv];
                // o = S_tᵀ q: dq = S_t do, dS += q doᵀ.
                let mut dqs = vec![T::zero(); dk];
                for i in 0..dk {
                    let row = &st[i * dv..][..dv];
                    dqs[i] = row.iter().zip(o_grad).fold(T::zero(), |acc, (&x, &y)| acc + x * y);
                    for j in 0..dv {
                        ds[i * dv + j] = ds[i * dv + j] + q[i] * o_grad[j];
                    }
                }
                // S_t = S' + k uᵀ: dk += dS u, du = dSᵀ k.
                let mut dkn = vec![T::zero(); dk];
                let mut du = vec![T::zero(); dv];
                for i in 0..dk {
                    let row = &ds[i * dv..][..dv];
                    dkn[i] = row.iter().zip(&u).fold(T::zero(), |acc, (&x, &y)| acc + x * y);
                    du.iter_mut().zip(row).for_each(|(du, &x)| *du = *du + x * k[i]);
                }
                // u = β(v − S'ᵀk).
                let db = du.iter().zip(&err).fold(T::zero(), |acc, (&x, &e)| acc + x * e);
                g.dbeta[at.beta(b, t, h)] = db;
                let dvr = &mut g.dv[at.v(b, t, h)..][..dv];
                dvr.iter_mut().zip(&du).for_each(|(o, &x)| *o = beta * x);
                let dpred: Vec<T> = du.iter().map(|&x| -(beta * x)).collect();
                // pred = S'ᵀk: dS' += k dpredᵀ, dk += S' dpred.
                for i in 0..dk {
                    let row = &sp[i * dv..][..dv];
                    dkn[i] = dkn[i] + row.iter().zip(&dpred).fold(T::zero(), |acc, (&x, &y)| acc + x * y);
                    for j in 0..dv {
                        ds[i * dv + j] = ds[i * dv + j] + k[i] * dpred[j];
                    }
                }
                // S' = diag(a)·prev: dprev = diag(a)·dS', da_i = Σ_j dS'_ij prev_ij, dg = da·a.
                let gi = at.g(b, t, h);
                for i in 0..dk {
                    let da = (0..dv).fold(T::zero(), |acc, j| acc + ds[i * dv + j] * prev[i * dv + j]);
                    match p.gate {
                        Gate::Scalar => g.dg[gi] = g.dg[gi] + da * a[i],
                        Gate::Channel => g.dg[gi + i] = da * a[i],
                    }
                    (0..dv).for_each(|j| ds[i * dv + j] = ds[i * dv + j] * a[i]);
                }
                // Through the scale and the L2 normalisation to the raw q and k (summed over the
                // value heads that share the key head).
                let qi = at.qk(b, t, h);
                let dqn: Vec<T> = dqs.iter().map(|&x| x * scale).collect();
                add_normalised(&mut g.dq[qi..][..dk], qr, &dqn, rq, p.l2norm_qk);
                add_normalised(&mut g.dk[qi..][..dk], kr, &dkn, rk, p.l2norm_qk);
            }
            if x.initial_state.is_some() {
                g.dinitial_state[at.state(b, h)..][..dk * dv].copy_from_slice(&ds);
            }
        }
    }
    Ok(g)
}

/// `acc += ∂(x·r)/∂x · dn` for the normalised `n = x·r`, `r = (Σx² + ε)^(−1/2)`: `r·(dn − (n·dn)·n)`;
/// `acc += dn` without the normalisation.
pub(super) fn add_normalised<T: Real>(acc: &mut [T], x: &[T], dn: &[T], r: T, norm: bool) {
    if !norm {
        acc.iter_mut().zip(dn).for_each(|(a, &g)| *a = *a + g);
        return;
    }
    let n_dot = x.iter().zip(dn).fold(T::zero(), |s, (&xi, &g)| s + xi * r * g);
    for ((a, &xi), &g) in acc.iter_mut().zip(x).zip(dn) {
        *a = *a + r * (g - n_dot * xi * r);
    }
}
