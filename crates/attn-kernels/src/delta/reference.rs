//! The gated delta rule token by token (the module header's recurrence), forward and its exact
//! reverse-mode derivative, in the caller's precision. The backward works head by head
//! ([`head_backward`]): the states at every 64th token kept, each span's states recomputed from
//! them, its tokens walked back ([`walk_back`], which the chunked backward also runs on the channel
//! gate's chunks that decay too strongly for its products).

use super::{check, len, DeltaDims, DeltaGrads, DeltaInputs, DeltaOutput, DeltaParams, Gate, L2NORM_EPS};
use crate::alloc;
use crate::error::Result;
use crate::reference::Real;

/// Where a call's rows sit: the row-major offsets of the module header's layouts, for sequence `n`
/// (a batch row, or a packed sequence) and its token `t`.
pub(super) struct At<'a> {
    pub(super) d: &'a DeltaDims,
    pub(super) gate: Gate,
    pub(super) cu_seqlens: Option<&'a [usize]>,
}

impl<'a> At<'a> {
    pub(super) fn new<T>(d: &'a DeltaDims, x: &DeltaInputs<'a, T>, gate: Gate) -> At<'a> {
        At { d, gate, cu_seqlens: x.cu_seqlens }
    }

    /// Sequence `n`'s tokens.
    pub(super) fn tokens(&self, n: usize) -> usize {
        self.cu_seqlens.map_or(self.d.t, |c| c[n + 1] - c[n])
    }

    /// The token row (of `B·T`) of token `t` of sequence `n`.
    fn row(&self, n: usize, t: usize) -> usize {
        self.cu_seqlens.map_or(n * self.d.t, |c| c[n]) + t
    }

    /// Query/key row of token `t` of sequence `n` for value head `h` (its key head).
    pub(super) fn qk(&self, n: usize, t: usize, h: usize) -> usize {
        let kh = h / (self.d.hv / self.d.hk);
        (self.row(n, t) * self.d.hk + kh) * self.d.dk
    }

    /// Value (and output) row.
    pub(super) fn v(&self, n: usize, t: usize, h: usize) -> usize {
        (self.row(n, t) * self.d.hv + h) * self.d.dv
    }

    /// `beta`'s entry (and a scalar `g`'s).
    pub(super) fn beta(&self, n: usize, t: usize, h: usize) -> usize {
        self.row(n, t) * self.d.hv + h
    }

    /// `g`'s first entry for the token and head.
    pub(super) fn g(&self, n: usize, t: usize, h: usize) -> usize {
        match self.gate {
            Gate::Scalar => self.beta(n, t, h),
            Gate::Channel => self.beta(n, t, h) * self.d.dk,
        }
    }

    /// The state of `(n, h)`.
    pub(super) fn state(&self, n: usize, h: usize) -> usize {
        (n * self.d.hv + h) * self.d.dk * self.d.dv
    }
}

/// `x`, L2-normalised when `norm` (`x / √(Σx² + ε)`), times `scale`; and the normaliser `r`.
pub(super) fn prepared<T: Real>(x: &[T], norm: bool, scale: T) -> (Vec<T>, T) {
    let r = normaliser(x, norm);
    (x.iter().map(|&v| v * r * scale).collect(), r)
}

/// The normaliser `r = (Σx² + ε)^(−1/2)` of [`prepared`] (1 without `norm`), `Σx²` in eight
/// partial sums (one chain of dependent adds per row cost more than the chunked kernels' products).
pub(super) fn normaliser<T: Real>(x: &[T], norm: bool) -> T {
    if !norm {
        return T::one();
    }
    let mut acc = [T::zero(); 8];
    let rows = x.chunks_exact(8);
    let tail = rows.remainder().iter().fold(T::zero(), |s, &v| s + v * v);
    for row in rows {
        acc.iter_mut().zip(row).for_each(|(a, &v)| *a = *a + v * v);
    }
    let eps = T::from_f64(L2NORM_EPS).expect("a float");
    (acc.iter().fold(tail, |s, &a| s + a) + eps).sqrt().recip()
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

/// The gated delta rule's outputs `o: [B, T, Hv, Dv]` and final states `[N, Hv, Dk, Dv]`;
/// refuses inputs that do not match `d` and `p` (module header), naming the argument.
pub fn delta_rule_reference<T: Real>(d: &DeltaDims, x: &DeltaInputs<T>, p: &DeltaParams) -> Result<DeltaOutput<T>> {
    let scale = T::from_f64(check(d, x, p)?).expect("a float");
    let at = At::new(d, x, p.gate);
    let mut out = alloc::zeroed("delta rule output", &[d.v_len()])?;
    let mut final_state = alloc::zeroed("delta rule final state", &[d.state_len(x.sequences(d))])?;
    let dk = d.dk;
    for n in 0..x.sequences(d) {
        for h in 0..d.hv {
            let s = &mut final_state[at.state(n, h)..][..dk * d.dv];
            if let Some(init) = x.initial_state {
                s.copy_from_slice(&init[at.state(n, h)..][..dk * d.dv]);
            }
            head_forward(&at, x, p, scale, (n, h), s, &mut out);
        }
    }
    Ok(DeltaOutput { out, final_state })
}

/// The tokens of sequence `n` through head `h`'s recurrence: `s` (`[Dk, Dv]`) goes from the
/// initial state to the final one, and token `t`'s output is added into its row of `out`.
fn head_forward<T: Real>(
    at: &At,
    x: &DeltaInputs<T>,
    p: &DeltaParams,
    scale: T,
    (n, h): (usize, usize),
    s: &mut [T],
    out: &mut [T],
) {
    let (dk, dv) = (at.d.dk, at.d.dv);
    for t in 0..at.tokens(n) {
        let (q, _) = prepared(&x.q[at.qk(n, t, h)..][..dk], p.l2norm_qk, scale);
        let (k, _) = prepared(&x.k[at.qk(n, t, h)..][..dk], p.l2norm_qk, T::one());
        let a = decays(x.g, at.g(n, t, h), p.gate, dk);
        step(s, &a, &k, &x.v[at.v(n, t, h)..][..dv], x.beta[at.beta(n, t, h)]);
        let o = &mut out[at.v(n, t, h)..][..dv];
        for (srow, &qi) in s.chunks_exact(dv).zip(&q) {
            o.iter_mut().zip(srow).for_each(|(o, &x)| *o = *o + x * qi);
        }
    }
}

/// The gradients of every input of [`delta_rule_reference`] given the output's gradient
/// `dout: [B, T, Hv, Dv]` and, when the final state is used, its gradient `dfinal: [N, Hv, Dk, Dv]`.
pub fn delta_rule_reference_backward<T: Real>(
    d: &DeltaDims,
    x: &DeltaInputs<T>,
    p: &DeltaParams,
    dout: &[T],
    dfinal: Option<&[T]>,
) -> Result<DeltaGrads<T>> {
    let scale = T::from_f64(check(d, x, p)?).expect("a float");
    let mut g = DeltaGrads::zeroed(d, x, p, dout, dfinal)?;
    let at = At::new(d, x, p.gate);
    for n in 0..x.sequences(d) {
        for h in 0..d.hv {
            let hg = head_backward(&at, x, p, scale, (n, h), dout, dfinal);
            g.add_head(&at, (n, h), &hg, x.initial_state.is_some());
        }
    }
    Ok(g)
}

impl<T: Real> DeltaGrads<T> {
    /// Zeroed gradients of a call, after checking `dout` and `dfinal` against its sizes.
    pub(super) fn zeroed(
        d: &DeltaDims,
        x: &DeltaInputs<T>,
        p: &DeltaParams,
        dout: &[T],
        dfinal: Option<&[T]>,
    ) -> Result<DeltaGrads<T>> {
        len("dout", d.v_len(), dout.len())?;
        let states = d.state_len(x.sequences(d));
        if let Some(f) = dfinal {
            len("dfinal_state", states, f.len())?;
        }
        Ok(DeltaGrads {
            dq: alloc::zeroed("dq", &[d.qk_len()])?,
            dk: alloc::zeroed("dk", &[d.qk_len()])?,
            dv: alloc::zeroed("dv", &[d.v_len()])?,
            dg: alloc::zeroed("dg", &[d.g_len(p.gate)])?,
            dbeta: alloc::zeroed("dbeta", &[d.beta_len()])?,
            dinitial_state: alloc::zeroed("dinitial_state", &[states])?,
        })
    }

    /// Adds head `(n, h)`'s gradients: `dq` and `dk` into the rows of the key head it shares with
    /// the other value heads of its group, the rest copied; the initial state's when `init`.
    pub(super) fn add_head(&mut self, at: &At, (n, h): (usize, usize), hg: &HeadGrads<T>, init: bool) {
        let (dk, dv) = (at.d.dk, at.d.dv);
        let w = hg.dg.len() / at.tokens(n).max(1);
        let add = |acc: &mut [T], src: &[T]| acc.iter_mut().zip(src).for_each(|(a, &s)| *a = *a + s);
        for r in 0..at.tokens(n) {
            let (qi, vi, bi, gi) = (at.qk(n, r, h), at.v(n, r, h), at.beta(n, r, h), at.g(n, r, h));
            add(&mut self.dq[qi..][..dk], &hg.dq[r * dk..][..dk]);
            add(&mut self.dk[qi..][..dk], &hg.dk[r * dk..][..dk]);
            self.dv[vi..][..dv].copy_from_slice(&hg.dv[r * dv..][..dv]);
            self.dg[gi..][..w].copy_from_slice(&hg.dg[r * w..][..w]);
            self.dbeta[bi] = hg.dbeta[r];
        }
        if init {
            self.dinitial_state[at.state(n, h)..][..dk * dv].copy_from_slice(&hg.ds);
        }
    }
}

/// One head's gradients, by the head's own token rows: `dq`, `dk` `[T, Dk]` (of the raw inputs),
/// `dv` `[T, Dv]`, `dg` `[T]` (`[T, Dk]` with the channel gate), `dbeta` `[T]`, and the initial
/// state's `ds` `[Dk, Dv]`.
pub(super) struct HeadGrads<T> {
    pub(super) dq: Vec<T>,
    pub(super) dk: Vec<T>,
    pub(super) dv: Vec<T>,
    pub(super) dg: Vec<T>,
    pub(super) dbeta: Vec<T>,
    pub(super) ds: Vec<T>,
}

/// Tokens between the states [`head_backward`] keeps: it recomputes the states before each token
/// of a span from the one at its start (`T/SPAN + SPAN` states held instead of `T`).
const SPAN: usize = 64;

/// Token `t` of head `(n, h)` applied to the state `s`.
fn token_step<T: Real>(at: &At, x: &DeltaInputs<T>, p: &DeltaParams, (n, h): (usize, usize), s: &mut [T], t: usize) {
    let (dk, dv) = (at.d.dk, at.d.dv);
    let (k, _) = prepared(&x.k[at.qk(n, t, h)..][..dk], p.l2norm_qk, T::one());
    let a = decays(x.g, at.g(n, t, h), p.gate, dk);
    step(s, &a, &k, &x.v[at.v(n, t, h)..][..dv], x.beta[at.beta(n, t, h)]);
}

/// Head `(n, h)`'s gradients by the recurrence's exact reverse: the forward again keeping the
/// state at the start of every [`SPAN`] tokens, then the spans in reverse, each span's states
/// before its tokens recomputed, its tokens walked back.
fn head_backward<T: Real>(
    at: &At,
    x: &DeltaInputs<T>,
    p: &DeltaParams,
    scale: T,
    (n, h): (usize, usize),
    dout: &[T],
    dfinal: Option<&[T]>,
) -> HeadGrads<T> {
    let (dk, dv, tokens) = (at.d.dk, at.d.dv, at.tokens(n));
    let sl = dk * dv;
    let w = if p.gate == Gate::Channel { dk } else { 1 };
    let spans = tokens.div_ceil(SPAN);
    let mut starts = vec![T::zero(); spans * sl];
    let mut s = match x.initial_state {
        Some(init) => init[at.state(n, h)..][..sl].to_vec(),
        None => vec![T::zero(); sl],
    };
    for t in 0..tokens {
        if t % SPAN == 0 {
            starts[t / SPAN * sl..][..sl].copy_from_slice(&s);
        }
        token_step(at, x, p, (n, h), &mut s, t);
    }
    let mut hg = HeadGrads {
        dq: vec![T::zero(); tokens * dk],
        dk: vec![T::zero(); tokens * dk],
        dv: vec![T::zero(); tokens * dv],
        dg: vec![T::zero(); tokens * w],
        dbeta: vec![T::zero(); tokens],
        ds: dfinal.map_or_else(|| vec![T::zero(); sl], |f| f[at.state(n, h)..][..sl].to_vec()),
    };
    let mut before = Vec::new();
    for span in (0..spans).rev() {
        let t0 = span * SPAN;
        let start = &starts[span * sl..][..sl];
        walk_back(at, x, p, scale, (n, h), t0..tokens.min(t0 + SPAN), start, dout, &mut before, &mut hg);
    }
    hg
}

/// Tokens `span` of head `(n, h)` walked back from `start`, the state before the span's first
/// token: the states before each token recomputed (into `before`), then every token's gradients
/// written into its rows of `hg` (those of the raw `q` and `k`, through the scale and the
/// normalisation) while `hg.ds` is carried from the gradient of the span's end state to that of
/// `start`.
#[allow(clippy::too_many_arguments)]
pub(super) fn walk_back<T: Real>(
    at: &At,
    x: &DeltaInputs<T>,
    p: &DeltaParams,
    scale: T,
    (n, h): (usize, usize),
    span: std::ops::Range<usize>,
    start: &[T],
    dout: &[T],
    before: &mut Vec<T>,
    hg: &mut HeadGrads<T>,
) {
    let (dk, dv) = (at.d.dk, at.d.dv);
    let sl = dk * dv;
    let w = if p.gate == Gate::Channel { dk } else { 1 };
    let t0 = span.start;
    before.resize(span.len() * sl, T::zero());
    let mut s = start.to_vec();
    for t in span.clone() {
        before[(t - t0) * sl..][..sl].copy_from_slice(&s);
        token_step(at, x, p, (n, h), &mut s, t);
    }
    let ds = &mut hg.ds;
    for t in span.rev() {
        let prev = &before[(t - t0) * sl..][..sl];
        let (qr, kr) = (&x.q[at.qk(n, t, h)..][..dk], &x.k[at.qk(n, t, h)..][..dk]);
        let (q, rq) = prepared(qr, p.l2norm_qk, scale);
        let (k, rk) = prepared(kr, p.l2norm_qk, T::one());
        let a = decays(x.g, at.g(n, t, h), p.gate, dk);
        let beta = x.beta[at.beta(n, t, h)];
        let v = &x.v[at.v(n, t, h)..][..dv];
        let mut st = prev.to_vec();
        let (u, err) = step(&mut st, &a, &k, v, beta);
        // S' = diag(a)·prev.
        let sp: Vec<T> =
            prev.chunks_exact(dv).zip(&a).flat_map(|(row, &ai)| row.iter().map(move |&x| x * ai)).collect();
        let o_grad = &dout[at.v(n, t, h)..][..dv];
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
        hg.dbeta[t] = du.iter().zip(&err).fold(T::zero(), |acc, (&x, &e)| acc + x * e);
        hg.dv[t * dv..][..dv].iter_mut().zip(&du).for_each(|(o, &x)| *o = beta * x);
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
        let dg = &mut hg.dg[t * w..][..w];
        for i in 0..dk {
            let da = (0..dv).fold(T::zero(), |acc, j| acc + ds[i * dv + j] * prev[i * dv + j]);
            match p.gate {
                Gate::Scalar => dg[0] = dg[0] + da * a[i],
                Gate::Channel => dg[i] = da * a[i],
            }
            (0..dv).for_each(|j| ds[i * dv + j] = ds[i * dv + j] * a[i]);
        }
        // Through the scale and the L2 normalisation to the raw q and k.
        let dqn: Vec<T> = dqs.iter().map(|&x| x * scale).collect();
        add_normalised(&mut hg.dq[t * dk..][..dk], qr, &dqn, rq, p.l2norm_qk);
        add_normalised(&mut hg.dk[t * dk..][..dk], kr, &dkn, rk, p.l2norm_qk);
    }
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
